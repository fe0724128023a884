//! Exact proofs of distribution preservation, by enumeration; negative controls; statistics.
//!
//! - [`enumerate`](mod@enumerate): the enumerating [`specdec_kernels::sampling::Decisions`]
//!   ([`Enumerator`]) and [`enumerate()`], which runs code once per random branch and returns the
//!   exact [`Distribution`] of its results, merging equal outcomes;
//! - [`drafters`]: toy chain / tree drafters ([`ToyDrafter`]) for the proofs;
//! - [`feature_head`]: a toy EAGLE-style head ([`ToyFeatureHead`]) and the toy target's features;
//! - [`sd_loop`]: the whole draft → verify → bonus → next-round loop on toy models
//!   ([`SpecLoop`]): its exact output distribution, the target's own, the accepted-length law;
//! - [`controls`]: deliberately broken chain verifiers ([`BrokenChain`]) that must be caught;
//! - [`matrix`]: every verifier × tree kind and the controls, as the table `specdec prove` prints;
//! - [`stats`]: the G-test for sampled runs, with its detectable total-variation distance.
//!
//! To check a verifier of your own: implement [`crate::verify::Verifier`], pair it with a
//! [`ToyDrafter`] of a kind it declares, and compare [`SpecLoop::exact_distribution`] with
//! [`SpecLoop::target_distribution`] (or add a [`matrix::case`] to the table).

pub mod controls;
pub mod distribution;
pub mod drafters;
pub mod enumerate;
pub mod feature_head;
pub mod matrix;
pub mod sd_loop;
pub mod stats;

pub use controls::{BrokenChain, ChainFlaw};
pub use distribution::Distribution;
pub use drafters::ToyDrafter;
pub use enumerate::{enumerate, Enumerator};
pub use feature_head::{toy_features, ToyFeatureHead, TOY_FEATURE_DIM};
pub use matrix::{prove, render_table, run_case, standard_cases, Expectation, ProofCase, ProofRow};
pub use sd_loop::{target_distribution, Round, SpecLoop};
pub use stats::{detectable_tv, g_test, g_test_samples, GTest};
