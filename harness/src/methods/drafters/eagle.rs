//! `eagle`: a trained EAGLE-style head drafting from the target's own features.

use serde::{Deserialize, Serialize};
use specdec_algorithms::drafters::{
    DynamicTreeDrafter, EagleFeatureHead, FeatureDraftModel, ShapeDrafter,
};
use specdec_algorithms::trees::TreeShape;
use std::time::Instant;

use specdec_kernels::TreeTopology;
use specdec_models::heads::{DraftHead, EagleHead, HeadPrecision, HeadStep};

use super::dynamic_tree::{check_depth, check_top_k};
use super::{
    check_min_confidence, confident_chain, tree_fill, BuiltDrafter, DraftContext, DraftSetup,
    DrafterKind,
};
use crate::error::{HarnessError, Result};
use crate::methods::limits::{branching_drafts, check_drafts};
use crate::methods::Kind;

/// A trained EAGLE-style head (`specdec train-head --kind eagle`): one decoder layer over the
/// pairs (target feature, token), its own KV cache, the draft vocabulary of its file. Drafts a
/// chain of K (argmax at T = 0, sampled above; with `min_confidence` stopped where the head's
/// probability of the chain falls below it), or with `nodes` an EAGLE-2 dynamic tree
/// (deterministic: greedy / target-only verification; `top_k` children per expanded node,
/// `depth` layers), or with `branching` a static tree
/// (top-ranked at T = 0, sampled without replacement above: recursive rejection).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Eagle {
    /// The head file [default: `<cache>/heads/<target>-eagle.safetensors`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub head: Option<String>,
    /// EAGLE-2 dynamic tree of this many nodes (≥ 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nodes: Option<usize>,
    /// Children considered per expanded node of the dynamic tree [default: 4].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_k: Option<usize>,
    /// Deepest layer of the dynamic tree (1..=`nodes`), one head pass per layer [default:
    /// `nodes`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub depth: Option<usize>,
    /// A static tree instead: children per node at each depth.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub branching: Option<Vec<usize>>,
    /// `int8` (Q8_0 matrices, the fast path; default), `int4` (Q4_0 matrices: half the bytes
    /// per depth step, a coarser head) or `bf16` (exact products).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub precision: Option<String>,
    /// Chains only: stop a chain before K once the head's probability of it falls below this,
    /// as `chain`'s key of the same name [default: draft all K].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_confidence: Option<f64>,
}

/// `precision` as the models crate names it.
pub(super) fn head_precision(
    precision: Option<&str>,
) -> std::result::Result<HeadPrecision, String> {
    match precision {
        None | Some("int8") => Ok(HeadPrecision::Int8),
        Some("int4") => Ok(HeadPrecision::Int4),
        Some("bf16") => Ok(HeadPrecision::Bf16),
        Some(other) => Err(format!("precision `{other}`: use int8, int4 or bf16")),
    }
}

/// What both trained-head drafters check first: no `draft_vocab` (a head has its own draft
/// vocabulary), and the precision.
///
/// # Errors
/// [`HarnessError::InvalidEngine`] for either.
pub(super) fn head_setup(
    kind: &str,
    setup: &DraftSetup<'_>,
    precision: Option<&str>,
) -> Result<HeadPrecision> {
    if setup.draft_vocab.is_some() {
        return Err(HarnessError::InvalidEngine(format!(
            "method `{}`: a {kind} head has its own draft vocabulary (draft_vocab does not apply)",
            setup.method
        )));
    }
    head_precision(precision).map_err(HarnessError::InvalidEngine)
}

impl Kind for Eagle {
    const NAME: &'static str = "eagle";
    const SUMMARY: &'static str =
        "a trained EAGLE head drafts from the target's features: a chain, \
                                   or an EAGLE-2 dynamic tree with `nodes` (specdec train-head)";

    fn check(&self) -> std::result::Result<(), String> {
        head_precision(self.precision.as_deref())?;
        if self.nodes.is_some() && self.branching.is_some() {
            return Err(
                "eagle: give `nodes` (dynamic tree) or `branching` (static), not both".into(),
            );
        }
        if self.nodes.is_none() {
            if let Some(key) = [("top_k", self.top_k), ("depth", self.depth)]
                .iter()
                .find_map(|(key, value)| value.map(|_| key))
            {
                return Err(format!(
                    "eagle: `{key}` belongs to a dynamic tree; give `nodes` too"
                ));
            }
        }
        if self.min_confidence.is_some() && !self.is_chain() {
            return Err(
                "eagle: `min_confidence` stops a chain; a tree (`nodes` or `branching`) has no \
                 use for it"
                    .into(),
            );
        }
        check_min_confidence("eagle.min_confidence", self.min_confidence)?;
        if self.nodes == Some(0) || self.top_k == Some(0) {
            return Err("eagle: nodes and top_k must be at least 1".into());
        }
        if let Some(nodes) = self.nodes {
            check_drafts("eagle.nodes", nodes)?;
            check_depth("eagle.depth", self.depth, nodes)?;
        }
        if let Some(top_k) = self.top_k {
            check_top_k("eagle.top_k", top_k)?;
        }
        if let Some(branching) = &self.branching {
            branching_drafts("eagle.branching", branching)?;
        }
        Ok(())
    }
}

impl DrafterKind for Eagle {
    fn is_chain(&self) -> bool {
        self.nodes.is_none() && self.branching.is_none()
    }
    fn uses_model(&self) -> bool {
        true
    }
    fn for_generate(_draft: Option<&str>) -> Option<Self> {
        Some(Eagle::default())
    }
    fn build(&self, ctx: &mut dyn DraftContext, setup: &DraftSetup<'_>) -> Result<BuiltDrafter> {
        let precision = head_setup(Self::NAME, setup, self.precision.as_deref())?;
        let mut head = ctx.eagle_head(self.head.as_deref(), precision)?;
        let draft_pass_s = match setup.time_passes {
            true => Some(time_head_pass(&mut head)?),
            false => None,
        };
        let mut sampling = ctx.sampling();
        // siblings, or a chain's confidence, by the plain softmax at T = 0; greedy
        // verification reads no q
        let ranked = !self.is_chain() || self.min_confidence.is_some();
        if ranked && sampling.temperature == 0.0 {
            sampling.temperature = 1.0;
        }
        let head = EagleFeatureHead::new(head, sampling)?.with_penalties(ctx.penalties());
        let model = FeatureDraftModel::new(head);
        Ok(match (&self.nodes, &self.branching) {
            (Some(nodes), _) => {
                let top_k = self.top_k.unwrap_or(4);
                BuiltDrafter {
                    drafter: Box::new(DynamicTreeDrafter::new(
                        model,
                        self.depth.unwrap_or(*nodes),
                        top_k,
                        top_k,
                    )?),
                    is_chain: false,
                    shape: Some(TreeShape::chain(*nodes)),
                    draft_pass_s,
                }
            }
            (None, Some(branching)) => {
                let shape = TreeShape::from_branching(branching);
                BuiltDrafter {
                    drafter: Box::new(ShapeDrafter::new(
                        model,
                        tree_fill(&ctx.sampling()),
                        shape.clone(),
                    )),
                    is_chain: false,
                    shape: Some(shape),
                    draft_pass_s,
                }
            }
            (None, None) => BuiltDrafter {
                drafter: Box::new(confident_chain(
                    model,
                    &ctx.sampling(),
                    self.min_confidence,
                )?),
                is_chain: true,
                shape: None,
                draft_pass_s,
            },
        })
    }
}

/// Seconds of one head pass of one pair on an empty sequence, best of two (the cost-model
/// policy's prior for a draft pass).
pub(super) fn time_head_pass(head: &mut EagleHead) -> Result<f64> {
    let features = vec![0.0; head.feature_dim()];
    let tree = TreeTopology::chain(1);
    let mut best = f64::INFINITY;
    for _ in 0..2 {
        let seq = head.new_sequence()?;
        let t0 = Instant::now();
        let pass = head.forward(&[HeadStep {
            seq,
            tokens: &[0],
            features: &features,
            tree: &tree,
        }]);
        best = best.min(t0.elapsed().as_secs_f64());
        head.release(seq)?;
        pass?;
    }
    Ok(best)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_precision_key_names_each_head_precision_and_refuses_others() {
        assert_eq!(head_precision(None), Ok(HeadPrecision::Int8));
        assert_eq!(head_precision(Some("int8")), Ok(HeadPrecision::Int8));
        assert_eq!(head_precision(Some("int4")), Ok(HeadPrecision::Int4));
        assert_eq!(head_precision(Some("bf16")), Ok(HeadPrecision::Bf16));
        let err = head_precision(Some("q4_0")).unwrap_err();
        assert!(err.contains("`q4_0`") && err.contains("int4"), "{err}");
    }
}
