//! Exact proofs of distribution preservation, by enumeration; negative controls; statistics.
//!
//! - [`enumerate`]: the enumerating [`specdec_kernels::sampling::Decisions`] ([`Enumerator`]) and
//!   [`enumerate()`](enumerate::enumerate), which returns the exact [`Distribution`] of a run;
//! - [`drafters`]: toy chain / tree drafters ([`ToyDrafter`]);
//! - [`sd_loop`]: the whole draft → verify → bonus loop on toy models ([`SpecLoop`]), its exact
//!   output distribution and the target's own.

pub mod distribution;
pub mod drafters;
pub mod enumerate;
pub mod sd_loop;

pub use distribution::Distribution;
pub use drafters::ToyDrafter;
pub use enumerate::{enumerate, Enumerator};
pub use sd_loop::{target_distribution, Round, SpecLoop};
pub mod controls;
pub use controls::{BrokenChain, ChainFlaw};
pub mod stats;
pub use stats::{detectable_tv, g_test, g_test_samples, GTest};
pub mod matrix;
pub use matrix::{prove, render_table, run_case, standard_cases, Expectation, ProofCase, ProofRow};
