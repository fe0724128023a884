//! The injected acceptance process.

use serde::{Deserialize, Serialize};

use crate::error::{HarnessError, Result};

/// Whether the draft at each depth is accepted, given that every shallower one was: a Bernoulli
/// draw with probability α (fixed) or α_d (by depth; depths beyond the list use its last value).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum AcceptanceProcess {
    /// The same α at every depth (the Leviathan et al. model).
    Fixed {
        /// Acceptance probability in [0, 1].
        alpha: f64,
    },
    /// α_d for depth d = 1, 2, ...; the last value repeats.
    ByDepth {
        /// Acceptance probabilities, each in [0, 1], at least one.
        alphas: Vec<f64>,
    },
    /// A fixed α per request: request i uses `alphas[i % len]` (prompts of varied difficulty,
    /// where per-sequence adaptive policies can pay).
    PerRequest {
        /// Acceptance probabilities, each in [0, 1], at least one.
        alphas: Vec<f64>,
    },
}

impl AcceptanceProcess {
    /// Checks every α is in [0, 1] and the list is not empty.
    pub fn validate(&self) -> Result<()> {
        let alphas: &[f64] = match self {
            AcceptanceProcess::Fixed { alpha } => std::slice::from_ref(alpha),
            AcceptanceProcess::ByDepth { alphas } | AcceptanceProcess::PerRequest { alphas } => {
                alphas
            }
        };
        if alphas.is_empty() {
            return Err(HarnessError::Simulation(
                "acceptance.alphas is empty".to_string(),
            ));
        }
        if let Some(a) = alphas.iter().find(|a| !(0.0..=1.0).contains(*a)) {
            return Err(HarnessError::Simulation(format!(
                "acceptance probability {a} is not in [0, 1]"
            )));
        }
        Ok(())
    }

    /// The process one request sees: `PerRequest` resolves to its request's fixed α, the others
    /// are the same for every request.
    pub fn for_request(&self, request: usize) -> AcceptanceProcess {
        match self {
            AcceptanceProcess::PerRequest { alphas } if !alphas.is_empty() => {
                AcceptanceProcess::Fixed {
                    alpha: alphas[request % alphas.len()],
                }
            }
            other => other.clone(),
        }
    }

    /// α at depth `depth` (1-based; depth 0 is treated as 1). For `PerRequest` this is the mean
    /// over requests (use [`AcceptanceProcess::for_request`] to simulate one).
    pub fn alpha_at(&self, depth: usize) -> f64 {
        match self {
            AcceptanceProcess::Fixed { alpha } => *alpha,
            AcceptanceProcess::ByDepth { alphas } => {
                let i = depth.max(1) - 1;
                alphas
                    .get(i.min(alphas.len().saturating_sub(1)))
                    .copied()
                    .unwrap_or(0.0)
            }
            AcceptanceProcess::PerRequest { alphas } => {
                alphas.iter().sum::<f64>() / alphas.len().max(1) as f64
            }
        }
    }

    /// Draws the accepted length of a chain of `k` drafts from uniforms: depth d is accepted iff
    /// `uniform() < α_d` and every shallower depth was.
    pub fn draw_accepted(&self, k: usize, mut uniform: impl FnMut() -> f64) -> usize {
        for d in 1..=k {
            if uniform() >= self.alpha_at(d) {
                return d - 1;
            }
        }
        k
    }
}
