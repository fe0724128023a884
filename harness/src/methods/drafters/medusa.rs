//! `medusa`: trained Medusa heads drafting a static tree from the target's last feature.

use std::time::Instant;

use serde::{Deserialize, Serialize};
use specdec_algorithms::drafters::{MedusaDraftModel, ShapeDrafter};
use specdec_algorithms::trees::TreeShape;
use specdec_models::heads::DraftHead;

use super::eagle::{head_precision, head_setup};
use super::{tree_fill, BuiltDrafter, DraftContext, DraftSetup, DrafterKind};
use crate::error::{HarnessError, Result};
use crate::methods::limits::{branching_drafts, check_drafts};
use crate::methods::Kind;

/// Trained Medusa heads (`specdec train-head --kind medusa`): head k predicts the token k + 1
/// past the root from the target's feature of the last committed token. Drafts the static tree
/// of `choices` (Medusa's paths of ranks, e.g. `[[0], [0, 0], [1]]`) or `branching`, top-ranked
/// at T = 0 (greedy / target-only verification), sampled without replacement above (recursive
/// rejection with the heads' true q). Default: `branching = [4, 2, 1]` cut to the heads' depth.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Medusa {
    /// The head file [default: `<cache>/heads/<target>-medusa.safetensors`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub head: Option<String>,
    /// Medusa "choices": each a path of sibling ranks from the root.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub choices: Option<Vec<Vec<usize>>>,
    /// Children per node at each depth (instead of `choices`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub branching: Option<Vec<usize>>,
    /// `int8` (default), `int4` or `bf16`, as [`super::eagle::Eagle::precision`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub precision: Option<String>,
}

/// The default tree's children per depth.
const DEFAULT_BRANCHING: [usize; 3] = [4, 2, 1];

impl Kind for Medusa {
    const NAME: &'static str = "medusa";
    const SUMMARY: &'static str =
        "trained Medusa heads draft a static tree (`choices` or `branching`) from the target's last feature";

    fn check(&self) -> std::result::Result<(), String> {
        head_precision(self.precision.as_deref())?;
        if self.choices.is_some() && self.branching.is_some() {
            return Err("medusa: give `choices` or `branching`, not both".into());
        }
        if let Some(branching) = &self.branching {
            branching_drafts("medusa.branching", branching)?;
        }
        if let Some(choices) = &self.choices {
            check_drafts("medusa.choices (one draft node each)", choices.len())?;
            TreeShape::from_choices(choices).map_err(|e| format!("medusa.choices: {e}"))?;
        }
        Ok(())
    }
}

impl DrafterKind for Medusa {
    fn is_chain(&self) -> bool {
        false
    }
    fn uses_model(&self) -> bool {
        true
    }
    fn for_generate(_draft: Option<&str>) -> Option<Self> {
        Some(Medusa::default())
    }
    fn build(&self, ctx: &mut dyn DraftContext, setup: &DraftSetup<'_>) -> Result<BuiltDrafter> {
        let precision = head_setup(Self::NAME, setup, self.precision.as_deref())?;
        let heads = ctx.medusa_heads(self.head.as_deref(), precision)?;
        let depth = heads.heads();
        let shape = match (&self.choices, &self.branching) {
            (Some(choices), _) => TreeShape::from_choices(choices)?,
            (None, Some(branching)) => TreeShape::from_branching(branching),
            (None, None) => TreeShape::from_branching(&DEFAULT_BRANCHING[..depth.min(3)]),
        };
        if shape.topology().max_depth() > depth {
            return Err(HarnessError::InvalidEngine(format!(
                "method `{}`: the medusa tree is {} deep but the file has {depth} heads",
                setup.method,
                shape.topology().max_depth()
            )));
        }
        let draft_pass_s = match setup.time_passes {
            true => {
                let t0 = Instant::now();
                heads.forward(&vec![0.0; heads.hidden()], 1)?;
                Some(t0.elapsed().as_secs_f64())
            }
            false => None,
        };
        let mut sampling = ctx.sampling();
        if sampling.temperature == 0.0 {
            // siblings by the plain softmax; greedy verification reads no q
            sampling.temperature = 1.0;
        }
        let model = MedusaDraftModel::new(heads, sampling).with_penalties(ctx.penalties());
        Ok(BuiltDrafter {
            drafter: Box::new(ShapeDrafter::new(
                model,
                tree_fill(&ctx.sampling()),
                shape.clone(),
            )),
            is_chain: false,
            shape: Some(shape),
            draft_pass_s,
        })
    }
}
