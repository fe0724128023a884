//! Sampling: randomness as decisions, the rejection-sampling math, and sampling preparation.
//!
//! - [`decisions`]: the [`Decisions`] trait and the [`DrawKey`] that names each decision;
//! - [`counter`]: the seeded counter-based generator ([`CounterRng`]);
//! - [`replay`]: the kernels' exact decision rules ([`Replay`], [`Production`]) — the contract
//!   the CUDA twin must match bit for bit (uniform indexing, 32-bit fixed point);
//! - [`rules`]: the accept and categorical rules themselves, generic over the uniform's
//!   representation (float, fixed point, exact, or the enumerator's symbolic interval);
//! - [`number`]: the number types ([`Prob`] for `f32`/`f64`/`BigRational`, [`KernelFloat`]);
//! - [`rejection`]: accept / residual / bonus;
//! - [`prepare`]: temperature, top-k, top-p, min-p;
//! - [`penalties`]: repetition / frequency / presence penalties on logits, with a row's own
//!   history.

pub mod counter;
pub mod cuda;
pub mod decisions;
pub mod number;
pub mod penalties;
pub mod prepare;
pub mod rejection;
pub mod replay;
pub mod rules;

pub use counter::{mix64, CounterRng, SeededSequences, UniformSource};
pub use decisions::{Decisions, DrawKey, Purpose};
pub use num_rational::BigRational;
pub use number::{ratio, KernelFloat, Mass, Prob, FIXED_POINT_ONE};
pub use penalties::Penalties;
pub use prepare::{check_distribution, prepare_logits, prepare_probs, SamplingParams};
pub use rejection::{
    argmax, normalize, normalize_in_place, residual, sample_bonus, sample_or, sample_residual,
};
pub use replay::{GivenUniforms, Production, Recording, Replay};
pub use rules::{accept_rule, categorical_rule, ExactUniform, Uniform24, Uniform64, UniformDraw};
