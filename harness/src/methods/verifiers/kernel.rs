//! The kernels' parameterless lossless verifiers (`specdec_kernels::verification`), one entry
//! each: `greedy`, `chain_rejection`, `multi_round`, `recursive_rejection`, `target_only`.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use specdec_algorithms::verify::Verifier;
use specdec_kernels::verification::VerifyMethod;

use super::{Pairing, VerifierKind};
use crate::error::Result;
use crate::methods::Kind;

/// One parameterless kernel method as a verifier entry.
macro_rules! kernel_verifier {
    ($(#[$doc:meta])* $ty:ident, $name:literal, [$($alias:literal),*], $summary:literal) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
        #[serde(deny_unknown_fields)]
        pub struct $ty {}

        impl Kind for $ty {
            const NAME: &'static str = $name;
            const ALIASES: &'static [&'static str] = &[$($alias),*];
            const SUMMARY: &'static str = $summary;
        }

        impl VerifierKind for $ty {
            fn build(&self, _pairing: &Pairing) -> Result<Arc<dyn Verifier<f32>>> {
                Ok(Arc::new(VerifyMethod::$ty))
            }
        }
    };
}

kernel_verifier!(
    /// [`VerifyMethod::Greedy`]: lossless with respect to greedy decoding, for every tree kind.
    Greedy,
    "greedy",
    [],
    "accept while the draft token is the target's argmax (T = 0)"
);
kernel_verifier!(
    /// [`VerifyMethod::ChainRejection`], for chains of i.i.d. draws from `q`.
    ChainRejection,
    "chain_rejection",
    ["rejection"],
    "chain rejection sampling (Leviathan et al. / Chen et al.) for sampled chains"
);
kernel_verifier!(
    /// [`VerifyMethod::MultiRound`], for trees whose children are i.i.d. draws from `q`.
    MultiRound,
    "multi_round",
    ["specinfer"],
    "SpecInfer-style multi-round sampling with the true q, for trees of i.i.d. children"
);
kernel_verifier!(
    /// [`VerifyMethod::RecursiveRejection`], for children drawn from `q` without replacement.
    RecursiveRejection,
    "recursive_rejection",
    ["without_replacement", "recursive"],
    "recursive rejection sampling, for children drawn from q without replacement"
);
kernel_verifier!(
    /// [`VerifyMethod::TargetOnly`], for deterministic drafts (every tree kind).
    TargetOnly,
    "target_only",
    [],
    "sample from the target and follow a matching child, for deterministic drafts"
);
