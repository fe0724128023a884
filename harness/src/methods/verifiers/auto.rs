//! `auto`: the lossless verifier that pairs with the drafter's trees.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use specdec_algorithms::verify::Verifier;
use specdec_kernels::verification::{DraftKind, VerifyMethod};

use super::{Pairing, VerifierKind};
use crate::error::Result;
use crate::methods::Kind;

/// The default: the lossless verifier for the drafter's trees at the run's temperature
/// ([`auto_method`]).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Auto {}

impl Kind for Auto {
    const NAME: &'static str = "auto";
    const SUMMARY: &'static str = "greedy at T = 0; above, the lossless sampler for the drafter's \
                                   trees (chain_rejection, multi_round, recursive_rejection or \
                                   target_only)";
}

/// The verifier `auto` picks: greedy for deterministic drafts at T = 0 and target-only above;
/// chain rejection for i.i.d. chains, multi-round for i.i.d. trees; recursive rejection for
/// children drawn without replacement.
pub fn auto_method(pairing: &Pairing) -> VerifyMethod {
    match pairing.kind {
        DraftKind::Deterministic if pairing.temperature == 0.0 => VerifyMethod::Greedy,
        DraftKind::Deterministic => VerifyMethod::TargetOnly,
        DraftKind::Iid if pairing.is_chain => VerifyMethod::ChainRejection,
        DraftKind::Iid => VerifyMethod::MultiRound,
        DraftKind::WithoutReplacement => VerifyMethod::RecursiveRejection,
    }
}

impl VerifierKind for Auto {
    fn build(&self, pairing: &Pairing) -> Result<Arc<dyn Verifier<f32>>> {
        Ok(Arc::new(auto_method(pairing)))
    }
}
