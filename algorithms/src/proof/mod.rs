//! Exact proofs of distribution preservation, by enumeration; negative controls; statistics.
//!
//! - [`enumerate`](mod@enumerate): the enumerating [`specdec_kernels::sampling::Decisions`]
//!   ([`Enumerator`]) and [`enumerate()`], which runs code once per random branch and returns the
//!   exact [`Distribution`] of its results, merging equal outcomes;
//! - [`drafters`]: toy chain / tree drafters ([`ToyDrafter`]) for the proofs;
//! - [`feature_head`]: a toy EAGLE-style head ([`ToyFeatureHead`]) and the toy target's features;
//! - [`sd_loop`]: the whole draft → verify → bonus → next-round loop on toy models
//!   ([`SpecLoop`]): its exact output distribution, the target's own, the accepted-length law;
//! - [`oracle`]: sampling preparation written a second time, in exact arithmetic: the
//!   target's reference distribution in every exact comparison;
//! - [`composition`]: real drafter × verifier × policy compositions ([`Composition`]),
//!   enumerated exactly with the policy observing every branch;
//! - [`controls`]: deliberately broken chain verifiers ([`BrokenChain`]) that must be caught;
//! - [`matrix`]: every verifier × tree kind and the controls, the core of the table
//!   `specdec prove` prints (`specdec_harness::prove` adds the registry's drafters and policies);
//! - [`stats`]: the G-test for sampled runs, with its detectable total-variation distance.
//!
//! To check a verifier of your own: implement [`crate::verify::Verifier`], pair it with a
//! [`ToyDrafter`] of a kind it declares, and compare [`SpecLoop::exact_distribution`] with
//! [`SpecLoop::target_distribution`] (or add a [`matrix::case`] to the table).

pub mod composition;
pub mod controls;
pub mod distribution;
pub mod drafters;
pub mod enumerate;
pub mod feature_head;
pub mod matrix;
pub mod oracle;
pub mod sd_loop;
pub mod stats;

pub use composition::{Composition, Drafting, Explored};
pub use controls::{BrokenChain, ChainFlaw};
pub use distribution::Distribution;
pub use drafters::ToyDrafter;
pub use enumerate::{enumerate, Enumerator};
pub use feature_head::{toy_features, ToyFeatureHead, TOY_FEATURE_DIM};
pub use matrix::{render_table, run_case, standard_cases, Expectation, ProofCase, ProofRow};
pub use oracle::reference_probs;
pub use sd_loop::{target_distribution, Round, SpecLoop};
pub use stats::{detectable_tv, g_test, g_test_samples, GTest};
