//! The OpenAI request bodies `specdec serve` accepts, checked field by field.
//!
//! A body is parsed as JSON first (malformed JSON is a 400 saying where), then every field is
//! read by name: the fields specdec honours (`model`, `prompt` / `messages`, `max_tokens`,
//! `temperature`, `top_p`, `top_k`, `min_p`, `seed`, `stop`, `stream`, `stream_options`, and
//! specdec's own `workload`), the fields real
//! clients send with neutral values (`n = 1`, zero penalties, `logprobs` false, `user`, …), which
//! are accepted only with those values, and nothing else: any other field or value is a 400
//! naming it, never silently ignored.

use serde_json::{Map, Value};
use specdec_kernels::sampling::SamplingParams;
use specdec_models::tokenizer::ChatMessage;

use crate::error::ApiError;

/// The most tokens one request may ask for (`max_tokens`); the model's context may refuse fewer.
pub const MAX_TOKENS_LIMIT: usize = 1 << 16;
/// Stop strings per request, at most (OpenAI's limit).
pub const MAX_STOP_STRINGS: usize = 4;
/// Default `max_tokens` when a request gives none.
pub const DEFAULT_MAX_TOKENS: usize = 256;
/// Longest `workload` name, in bytes.
pub const MAX_WORKLOAD_NAME: usize = 64;

/// What is to be continued.
#[derive(Debug, Clone, PartialEq)]
pub enum Input {
    /// `/v1/completions`: raw text.
    Text(String),
    /// `/v1/chat/completions`: a conversation, rendered with the model's chat template.
    Chat(Vec<ChatMessage>),
}

impl Input {
    /// The workload its request joins ([`specdec_harness::engine::Request::workload`]) when
    /// the request names none: `completion` or `chat`, whose drafts are accepted at different
    /// rates (code completion against prose), so that a speculative policy learns each one's
    /// acceptance apart.
    pub fn default_workload(&self) -> &'static str {
        match self {
            Input::Text(_) => "completion",
            Input::Chat(_) => "chat",
        }
    }
}

/// A checked request.
#[derive(Debug, Clone, PartialEq)]
pub struct Generate {
    /// The prompt(s): one per choice of the response (`prompt` may be a list).
    pub inputs: Vec<Input>,
    /// Most new tokens per choice.
    pub max_tokens: usize,
    /// Temperature, top-k, top-p.
    pub sampling: SamplingParams,
    /// Seed of the run (`None`: the server's).
    pub seed: Option<u64>,
    /// Stop strings: the text is cut before the first occurrence of any.
    pub stop: Vec<String>,
    /// Server-sent events instead of one JSON body.
    pub stream: bool,
    /// `stream_options.include_usage`: a last chunk with the usage.
    pub include_usage: bool,
    /// `workload` (a specdec extension): the traffic the request belongs to, whose acceptance
    /// a speculative policy learns apart from other workloads'; `None`:
    /// [`Input::default_workload`]. 1 to [`MAX_WORKLOAD_NAME`] bytes of ASCII letters, digits,
    /// `-`, `_`, `.` or `:`; the engine keeps at most
    /// [`specdec_harness::engine::MAX_WORKLOADS`] names and refuses requests naming more.
    pub workload: Option<String>,
}

/// Which endpoint a body came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    /// `/v1/completions`.
    Completions,
    /// `/v1/chat/completions`.
    Chat,
}

/// Whether a field's value is its neutral one.
type IsNeutral = fn(&Value) -> bool;

/// Fields accepted only with a neutral value, and the check of that value.
const NEUTRAL: &[(&str, IsNeutral)] = &[
    ("n", |v| v.as_u64() == Some(1)),
    ("best_of", |v| v.as_u64() == Some(1)),
    ("presence_penalty", |v| v.as_f64() == Some(0.0)),
    ("frequency_penalty", |v| v.as_f64() == Some(0.0)),
    ("logprobs", |v| v.is_null() || v.as_bool() == Some(false)),
    ("top_logprobs", |v| v.is_null() || v.as_u64() == Some(0)),
    ("echo", |v| v.as_bool() == Some(false)),
    ("suffix", Value::is_null),
    ("logit_bias", |v| {
        v.is_null() || v.as_object().is_some_and(Map::is_empty)
    }),
    ("user", Value::is_string),
    ("parallel_tool_calls", |v| v.is_null() || v.is_boolean()),
];

impl Generate {
    /// Reads a request body for `endpoint`; `model` is the id this server serves.
    ///
    /// # Errors
    /// [`ApiError::BadRequest`] naming the first field that is missing, of the wrong type, out
    /// of range, unknown, or set to a value specdec cannot honour.
    pub fn parse(body: &[u8], endpoint: Endpoint, model: &str) -> Result<Self, ApiError> {
        let value: Value = serde_json::from_slice(body)
            .map_err(|e| ApiError::BadRequest(format!("the body is not valid JSON: {e}")))?;
        let Value::Object(fields) = value else {
            return Err(ApiError::BadRequest(
                "the body must be a JSON object".into(),
            ));
        };
        let input_field = match endpoint {
            Endpoint::Completions => "prompt",
            Endpoint::Chat => "messages",
        };
        for (name, value) in &fields {
            let known = matches!(
                name.as_str(),
                "model"
                    | "max_tokens"
                    | "max_completion_tokens"
                    | "temperature"
                    | "top_p"
                    | "top_k"
                    | "min_p"
                    | "seed"
                    | "stop"
                    | "stream"
                    | "stream_options"
                    | "workload"
            ) || name == input_field;
            if known {
                continue;
            }
            match NEUTRAL.iter().find(|(n, _)| n == name) {
                Some((_, neutral)) if neutral(value) => {}
                Some(_) => {
                    return Err(ApiError::BadRequest(format!(
                        "`{name}` = {value} is not supported (only its neutral value is)"
                    )))
                }
                None => {
                    return Err(ApiError::BadRequest(format!(
                        "unknown field `{name}` for {input_field} requests"
                    )))
                }
            }
        }
        match fields.get("model") {
            Some(Value::String(m)) if m == model => {}
            Some(Value::String(m)) => {
                return Err(ApiError::NotFound(format!(
                    "model `{m}` is not served here (this server serves `{model}`)"
                )))
            }
            Some(_) => return Err(field_type("model", "a string")),
            None => return Err(ApiError::BadRequest("`model` is required".into())),
        }
        let inputs = match endpoint {
            Endpoint::Completions => prompts(fields.get("prompt"))?,
            Endpoint::Chat => vec![Input::Chat(messages(fields.get("messages"))?)],
        };
        let max_tokens = match fields
            .get("max_completion_tokens")
            .or(fields.get("max_tokens"))
        {
            None | Some(Value::Null) => DEFAULT_MAX_TOKENS,
            Some(v) => {
                let n = v
                    .as_u64()
                    .ok_or_else(|| field_type("max_tokens", "a non-negative integer"))?;
                if n > MAX_TOKENS_LIMIT as u64 {
                    return Err(ApiError::BadRequest(format!(
                        "`max_tokens` = {n} exceeds this server's limit of {MAX_TOKENS_LIMIT}"
                    )));
                }
                n as usize
            }
        };
        let temperature = number(&fields, "temperature", 1.0)?;
        if !(0.0..=2.0).contains(&temperature) {
            return Err(ApiError::BadRequest(format!(
                "`temperature` = {temperature} must be in [0, 2]"
            )));
        }
        let top_p = number(&fields, "top_p", 1.0)?;
        if !(top_p > 0.0 && top_p <= 1.0) {
            return Err(ApiError::BadRequest(format!(
                "`top_p` = {top_p} must be in (0, 1]"
            )));
        }
        let min_p = number(&fields, "min_p", 0.0)?;
        if !(0.0..=1.0).contains(&min_p) {
            return Err(ApiError::BadRequest(format!(
                "`min_p` = {min_p} must be in [0, 1]"
            )));
        }
        let top_k = match fields.get("top_k") {
            None | Some(Value::Null) => None,
            Some(v) => match v.as_i64() {
                Some(-1) | Some(0) => None,
                Some(k) if k > 0 => Some(k as usize),
                _ => {
                    return Err(field_type(
                        "top_k",
                        "a positive integer (or -1 / 0 for none)",
                    ))
                }
            },
        };
        let seed = match fields.get("seed") {
            None | Some(Value::Null) => None,
            Some(v) => Some(
                v.as_u64()
                    .ok_or_else(|| field_type("seed", "a non-negative integer"))?,
            ),
        };
        let stop = match fields.get("stop") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::String(s)) => vec![s.clone()],
            Some(Value::Array(items)) => items
                .iter()
                .map(|v| v.as_str().map(str::to_string))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| field_type("stop", "a string or a list of strings"))?,
            Some(_) => return Err(field_type("stop", "a string or a list of strings")),
        };
        if stop.len() > MAX_STOP_STRINGS || stop.iter().any(String::is_empty) {
            return Err(ApiError::BadRequest(format!(
                "`stop`: at most {MAX_STOP_STRINGS} non-empty strings"
            )));
        }
        let stream = match fields.get("stream") {
            None | Some(Value::Null) => false,
            Some(Value::Bool(b)) => *b,
            Some(_) => return Err(field_type("stream", "a boolean")),
        };
        let include_usage = match fields.get("stream_options") {
            None | Some(Value::Null) => false,
            Some(Value::Object(o)) => {
                if let Some(extra) = o.keys().find(|k| *k != "include_usage") {
                    return Err(ApiError::BadRequest(format!(
                        "unknown field `stream_options.{extra}`"
                    )));
                }
                match o.get("include_usage") {
                    None | Some(Value::Null) => false,
                    Some(Value::Bool(b)) => *b,
                    Some(_) => return Err(field_type("stream_options.include_usage", "a boolean")),
                }
            }
            Some(_) => return Err(field_type("stream_options", "an object")),
        };
        if include_usage && !stream {
            return Err(ApiError::BadRequest(
                "`stream_options` is only allowed with `stream` = true".into(),
            ));
        }
        let workload = match fields.get("workload") {
            None | Some(Value::Null) => None,
            Some(Value::String(name))
                if (1..=MAX_WORKLOAD_NAME).contains(&name.len())
                    && name
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b"-_.:".contains(&b)) =>
            {
                Some(name.clone())
            }
            Some(_) => {
                return Err(field_type(
                    "workload",
                    &format!(
                        "a name of 1 to {MAX_WORKLOAD_NAME} ASCII letters, digits, `-`, `_`, `.` or `:`"
                    ),
                ))
            }
        };
        Ok(Self {
            inputs,
            max_tokens,
            sampling: SamplingParams {
                temperature,
                top_k,
                top_p: (top_p < 1.0).then_some(top_p),
                min_p: (min_p > 0.0).then_some(min_p),
            },
            seed,
            stop,
            stream,
            include_usage,
            workload,
        })
    }
}

fn field_type(name: &str, want: &str) -> ApiError {
    ApiError::BadRequest(format!("`{name}` must be {want}"))
}

fn number(fields: &Map<String, Value>, name: &str, default: f64) -> Result<f64, ApiError> {
    match fields.get(name) {
        None | Some(Value::Null) => Ok(default),
        Some(v) => v
            .as_f64()
            .filter(|x| x.is_finite())
            .ok_or_else(|| field_type(name, "a finite number")),
    }
}

fn prompts(value: Option<&Value>) -> Result<Vec<Input>, ApiError> {
    let texts = match value {
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(items)) if !items.is_empty() => items
            .iter()
            .map(|v| v.as_str().map(str::to_string))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| field_type("prompt", "a string or a non-empty list of strings"))?,
        None => return Err(ApiError::BadRequest("`prompt` is required".into())),
        Some(_) => {
            return Err(field_type(
                "prompt",
                "a string or a non-empty list of strings",
            ))
        }
    };
    if texts.len() > 64 {
        return Err(ApiError::BadRequest(format!(
            "`prompt`: {} prompts in one request; at most 64",
            texts.len()
        )));
    }
    Ok(texts.into_iter().map(Input::Text).collect())
}

fn messages(value: Option<&Value>) -> Result<Vec<ChatMessage>, ApiError> {
    let items = match value {
        Some(Value::Array(items)) if !items.is_empty() => items,
        Some(Value::Array(_)) => {
            return Err(ApiError::BadRequest("`messages` is empty".into()));
        }
        None => return Err(ApiError::BadRequest("`messages` is required".into())),
        Some(_) => return Err(field_type("messages", "a list of {role, content} objects")),
    };
    items
        .iter()
        .enumerate()
        .map(|(i, item)| {
            let Value::Object(m) = item else {
                return Err(field_type(&format!("messages[{i}]"), "an object"));
            };
            if let Some(extra) = m
                .keys()
                .find(|k| !matches!(k.as_str(), "role" | "content" | "name"))
            {
                return Err(ApiError::BadRequest(format!(
                    "unknown field `messages[{i}].{extra}`"
                )));
            }
            let role = match m.get("role").and_then(Value::as_str) {
                Some(r @ ("system" | "user" | "assistant" | "developer")) => {
                    if r == "developer" {
                        "system"
                    } else {
                        r
                    }
                }
                Some(other) => {
                    return Err(ApiError::BadRequest(format!(
                        "`messages[{i}].role` = `{other}`: use system, user or assistant"
                    )))
                }
                None => return Err(field_type(&format!("messages[{i}].role"), "a string")),
            };
            let content = match m.get("content") {
                Some(Value::String(s)) => s.clone(),
                Some(Value::Array(parts)) => parts
                    .iter()
                    .map(
                        |p| match (p.get("type").and_then(Value::as_str), p.get("text")) {
                            (Some("text"), Some(Value::String(t))) => Some(t.as_str()),
                            _ => None,
                        },
                    )
                    .collect::<Option<Vec<_>>>()
                    .ok_or_else(|| {
                        field_type(&format!("messages[{i}].content"), "text (or text parts)")
                    })?
                    .concat(),
                _ => return Err(field_type(&format!("messages[{i}].content"), "a string")),
            };
            Ok(ChatMessage::new(role, &content))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(body: &str, endpoint: Endpoint) -> Result<Generate, String> {
        Generate::parse(body.as_bytes(), endpoint, "m").map_err(|e| e.to_string())
    }

    #[test]
    fn a_plain_completion_and_a_chat_are_read() {
        let g = parse(
            r#"{"model":"m","prompt":"hi","max_tokens":5,"temperature":0,"stop":"\n","n":1,"user":"u"}"#,
            Endpoint::Completions,
        )
        .unwrap();
        assert_eq!(g.inputs, vec![Input::Text("hi".into())]);
        assert_eq!((g.max_tokens, g.sampling.temperature), (5, 0.0));
        assert_eq!(g.stop, vec!["\n".to_string()]);
        assert_eq!(g.workload, None);
        assert_eq!(g.inputs[0].default_workload(), "completion");
        let c = parse(
            r#"{"model":"m","messages":[{"role":"system","content":"s"},{"role":"user","content":[{"type":"text","text":"q"}]}],"stream":true,"stream_options":{"include_usage":true}}"#,
            Endpoint::Chat,
        )
        .unwrap();
        assert!(c.stream && c.include_usage);
        assert_eq!(c.inputs[0].default_workload(), "chat");
        let named = parse(
            r#"{"model":"m","prompt":"def f():","workload":"code:python"}"#,
            Endpoint::Completions,
        )
        .unwrap();
        assert_eq!(named.workload.as_deref(), Some("code:python"));
        assert_eq!(
            c.inputs,
            vec![Input::Chat(vec![
                ChatMessage::new("system", "s"),
                ChatMessage::new("user", "q")
            ])]
        );
    }

    #[test]
    fn bad_fields_are_refused_by_name() {
        let cases = [
            ("{", "not valid JSON"),
            ("[1]", "JSON object"),
            (r#"{"prompt":"x"}"#, "`model` is required"),
            (r#"{"model":"m"}"#, "`prompt` is required"),
            (r#"{"model":"m","prompt":5}"#, "`prompt` must be"),
            (
                r#"{"model":"m","prompt":"x","max_tokens":"5"}"#,
                "`max_tokens` must be",
            ),
            (
                r#"{"model":"m","prompt":"x","max_tokens":99999999}"#,
                "exceeds",
            ),
            (
                r#"{"model":"m","prompt":"x","temperature":-1}"#,
                "`temperature`",
            ),
            (r#"{"model":"m","prompt":"x","top_p":0}"#, "`top_p`"),
            (r#"{"model":"m","prompt":"x","min_p":1.5}"#, "`min_p`"),
            (r#"{"model":"m","prompt":"x","n":2}"#, "`n` = 2"),
            (
                r#"{"model":"m","prompt":"x","frequency_penalty":0.5}"#,
                "frequency_penalty",
            ),
            (
                r#"{"model":"m","prompt":"x","wat":1}"#,
                "unknown field `wat`",
            ),
            (
                r#"{"model":"m","prompt":"x","stop":["a","b","c","d","e"]}"#,
                "`stop`",
            ),
            (
                r#"{"model":"m","prompt":"x","stream_options":{"include_usage":true}}"#,
                "only allowed",
            ),
            (r#"{"model":"m","prompt":"x","workload":""}"#, "`workload`"),
            (
                r#"{"model":"m","prompt":"x","workload":"a b"}"#,
                "`workload`",
            ),
            (r#"{"model":"m","prompt":"x","workload":7}"#, "`workload`"),
        ];
        for (body, want) in cases {
            let err = parse(body, Endpoint::Completions).unwrap_err();
            assert!(err.contains(want), "{body}: {err}");
        }
        let chat = [
            (r#"{"model":"m","messages":[]}"#, "`messages` is empty"),
            (
                r#"{"model":"m","messages":[{"role":"robot","content":"x"}]}"#,
                "robot",
            ),
            (r#"{"model":"m","messages":[{"role":"user"}]}"#, "content"),
            (
                r#"{"model":"m","prompt":"x","messages":[{"role":"user","content":"x"}]}"#,
                "`prompt`",
            ),
        ];
        for (body, want) in chat {
            let err = parse(body, Endpoint::Chat).unwrap_err();
            assert!(err.contains(want), "{body}: {err}");
        }
        let other = Generate::parse(br#"{"model":"x","prompt":"p"}"#, Endpoint::Completions, "m")
            .unwrap_err();
        assert!(matches!(other, ApiError::NotFound(_)), "{other}");
    }
}
