//! # specdec-harness
//!
//! The engine loop that runs speculative decoding end to end, its metrics, experiment configs and
//! reports.
//!
//! - [`bench`](mod@bench): `specdec bench`, end-to-end model and kernel benchmarks;
//! - [`config`]: experiment configs (TOML), validated, unknown keys refused;
//! - [`metrics`]: per-step / per-request records and per-configuration aggregates;
//! - [`report`]: JSONL, CSV, markdown and SVG outputs with provenance;
//! - [`simulation`]: an injected acceptance process and cost model in place of models;
//! - [`methods`]: the method registry — every drafter, verifier and policy, by name, and how
//!   each is built;
//! - [`runner`]: runs an experiment on a [`runner::Backend`] with a progress bar;
//! - [`repro`]: paper reproductions that need no models;
//! - [`cli`]: the work behind the `specdec` subcommands.

pub mod bench;
pub mod cli;
pub mod config;
pub mod engine;
pub mod error;
pub mod generate;
pub mod methods;
pub mod metrics;
pub mod prove;
pub mod report;
pub mod repro;
pub mod runner;
pub mod simulation;

pub use error::{HarnessError, Result};
