//! `typical`: typical acceptance (lossy).

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use specdec_algorithms::verify::Verifier;
use specdec_kernels::verification::VerifyMethod;

use super::{Pairing, VerifierKind};
use crate::error::Result;
use crate::methods::Kind;

/// Typical acceptance (Medusa; **lossy**): accept a draft token when
/// `p(x) ≥ min(epsilon, delta · exp(−H(p)))`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Typical {
    /// Hard threshold ε in (0, 1].
    pub epsilon: f64,
    /// Entropy factor δ in (0, 1].
    pub delta: f64,
}

impl Kind for Typical {
    const NAME: &'static str = "typical";
    const SUMMARY: &'static str =
        "typical acceptance, p(x) ≥ min(epsilon, delta·exp(−H(p))) (lossy)";

    fn check(&self) -> std::result::Result<(), String> {
        for (name, value) in [("epsilon", self.epsilon), ("delta", self.delta)] {
            if !(value > 0.0 && value <= 1.0) {
                return Err(format!("typical.{name} {value} is not in (0, 1]"));
            }
        }
        Ok(())
    }
}

impl VerifierKind for Typical {
    fn build(&self, _pairing: &Pairing) -> Result<Arc<dyn Verifier<f32>>> {
        Ok(Arc::new(VerifyMethod::Typical {
            epsilon: self.epsilon,
            delta: self.delta,
        }))
    }
}
