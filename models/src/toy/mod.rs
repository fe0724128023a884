//! Toy models for exact tests: conditional probability tables with rational entries.
//!
//! [`ToyModel`] (order-0/1/2… Markov tables), [`ToyPair`] (target + draft). With the `proptest`
//! feature of `specdec-models`, `strategies` builds them for property tests (other crates
//! enable it in their `[dev-dependencies]`; it is off in normal builds so the library does not
//! compile proptest).

pub mod language_model;
#[cfg(feature = "proptest")]
pub mod strategies;
pub mod table;

pub use language_model::ToyLanguageModel;
pub use table::{ToyModel, ToyPair, ToyStyle};
