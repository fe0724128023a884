//! # specdec-harness
//!
//! The engine loop that runs speculative decoding end to end, its metrics, experiment configs and
//! reports.

pub mod error;

pub use error::{HarnessError, Result};
