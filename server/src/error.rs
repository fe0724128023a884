//! Errors: [`ServerError`] for starting the server, [`ApiError`] for one request (each maps to
//! an HTTP status and an OpenAI-style JSON error body).

use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};

/// Why the server could not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// The models or the method could not be loaded or built.
    #[error(transparent)]
    Harness(#[from] specdec_harness::HarnessError),
    /// The address could not be bound, or the listener failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The cause.
        source: std::io::Error,
    },
    /// An option out of range.
    #[error("invalid option: {0}")]
    InvalidOption(String),
    /// The engine thread stopped.
    #[error("the engine thread stopped: {0}")]
    Engine(String),
}

/// Why one request failed; each is an HTTP status with a JSON body naming the problem.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ApiError {
    /// 400: a field missing, of the wrong type, out of range or not supported.
    #[error("{0}")]
    BadRequest(String),
    /// 401: no or a wrong API key.
    #[error("{0}")]
    Unauthorized(String),
    /// 404: an unknown model.
    #[error("{0}")]
    NotFound(String),
    /// 503 with `Retry-After`: the queue is full, or the models are still loading.
    #[error("{0}")]
    Unavailable(String),
    /// 500: the engine failed on this request.
    #[error("{0}")]
    Internal(String),
}

impl ApiError {
    /// The HTTP status.
    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::BadRequest(_) => StatusCode::BAD_REQUEST,
            ApiError::Unauthorized(_) => StatusCode::UNAUTHORIZED,
            ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The OpenAI error object: `{"error": {"message", "type", "code"}}`.
    pub fn body(&self) -> serde_json::Value {
        let kind = match self {
            ApiError::BadRequest(_) => "invalid_request_error",
            ApiError::Unauthorized(_) => "authentication_error",
            ApiError::NotFound(_) => "not_found_error",
            ApiError::Unavailable(_) => "overloaded_error",
            ApiError::Internal(_) => "server_error",
        };
        serde_json::json!({
            "error": {"message": self.to_string(), "type": kind, "code": self.status().as_u16()}
        })
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        let mut response = (status, axum::Json(self.body())).into_response();
        if status == StatusCode::SERVICE_UNAVAILABLE {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
        }
        response
    }
}

/// This crate's results.
pub type Result<T> = std::result::Result<T, ServerError>;
