//! `dynamic_tree`: an EAGLE-2-style dynamic tree.

use serde::{Deserialize, Serialize};
use specdec_algorithms::drafters::DynamicTreeDrafter;
use specdec_algorithms::trees::TreeShape;

use super::{
    model_drafter_setup, run_draft_model, BuiltDrafter, DraftContext, DraftSetup, DrafterKind,
};
use crate::error::Result;
use crate::methods::limits::check_drafts;
use crate::methods::Kind;

/// The most children a dynamic tree considers per expanded node (`top_k`): 64. Each expanded
/// node ranks its `top_k` best tokens of `q` and every one becomes a candidate scored for the
/// kept set, so candidates grow as nodes × `top_k`; past a few dozen the extra candidates sit far
/// below the kept nodes' cumulative probability and are never kept.
pub const DYNAMIC_TREE_MAX_TOP_K: usize = 64;

/// EAGLE-2-style dynamic tree (deterministic): expand the `top_k` children of the most probable
/// nodes by cumulative draft probability, layer by layer down to `depth`, keep the best `nodes`
/// nodes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DynamicTree {
    /// Node budget (≥ 1, at most [`MAX_DRAFTS`](crate::methods::limits::MAX_DRAFTS)).
    pub nodes: usize,
    /// Children considered per expanded node (1..=[`DYNAMIC_TREE_MAX_TOP_K`]).
    pub top_k: usize,
    /// Deepest layer expanded (1..=`nodes`), one draft-model pass per layer [default: `nodes`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub depth: Option<usize>,
}

impl Kind for DynamicTree {
    const NAME: &'static str = "dynamic_tree";
    const SUMMARY: &'static str = "the draft model grows an EAGLE-2-style dynamic tree of `nodes` \
                                   nodes, `top_k` children per node (needs a draft model)";

    fn check(&self) -> std::result::Result<(), String> {
        if self.nodes == 0 || self.top_k == 0 {
            return Err("dynamic_tree needs nodes ≥ 1 and top_k ≥ 1".into());
        }
        check_drafts("dynamic_tree.nodes", self.nodes)?;
        check_top_k("dynamic_tree.top_k", self.top_k)?;
        check_depth("dynamic_tree.depth", self.depth, self.nodes)
    }
}

impl DrafterKind for DynamicTree {
    fn is_chain(&self) -> bool {
        false
    }
    fn needs_draft_model(&self) -> bool {
        true
    }
    fn build(&self, ctx: &mut dyn DraftContext, setup: &DraftSetup<'_>) -> Result<BuiltDrafter> {
        let model = run_draft_model(ctx, setup, Self::NAME)?;
        let (lm, draft_pass_s) = model_drafter_setup(ctx, setup, model, true)?;
        Ok(BuiltDrafter {
            drafter: Box::new(DynamicTreeDrafter::new(
                lm,
                self.depth.unwrap_or(self.nodes),
                self.top_k,
                self.top_k,
            )?),
            is_chain: false,
            shape: Some(TreeShape::chain(self.nodes)),
            draft_pass_s,
        })
    }
}

/// Checks a dynamic tree's `top_k` against [`DYNAMIC_TREE_MAX_TOP_K`] (also for `eagle`).
///
/// # Errors
/// The message names `field`, the value and the limit.
pub(super) fn check_top_k(field: &str, top_k: usize) -> std::result::Result<(), String> {
    if top_k > DYNAMIC_TREE_MAX_TOP_K {
        return Err(format!(
            "{field} = {top_k} is over the limit of {DYNAMIC_TREE_MAX_TOP_K} children per \
             expanded node"
        ));
    }
    Ok(())
}

/// Checks a dynamic tree's `depth` (also for `eagle`): absent, or 1..=`nodes` (a tree of
/// `nodes` nodes is never deeper than `nodes`, so a larger depth would only cost passes).
///
/// # Errors
/// The message names `field`, the value and the bound.
pub(super) fn check_depth(
    field: &str,
    depth: Option<usize>,
    nodes: usize,
) -> std::result::Result<(), String> {
    match depth {
        Some(depth) if depth == 0 || depth > nodes => Err(format!(
            "{field} = {depth}: must be in 1..={nodes} (the tree's nodes; each layer costs one \
             draft pass)"
        )),
        _ => Ok(()),
    }
}
