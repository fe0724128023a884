//! `dynamic_tree`: an EAGLE-2-style dynamic tree.

use serde::{Deserialize, Serialize};
use specdec_algorithms::drafters::DynamicTreeDrafter;
use specdec_algorithms::trees::TreeShape;

use super::{
    model_drafter_setup, run_draft_model, BuiltDrafter, DraftContext, DraftSetup, DrafterKind,
};
use crate::error::Result;
use crate::methods::Kind;

/// EAGLE-2-style dynamic tree (deterministic): expand the `top_k` children of the most probable
/// nodes by cumulative draft probability, keep the best `nodes` nodes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DynamicTree {
    /// Node budget (≥ 1).
    pub nodes: usize,
    /// Children considered per expanded node (≥ 1).
    pub top_k: usize,
}

impl Kind for DynamicTree {
    const NAME: &'static str = "dynamic_tree";
    const SUMMARY: &'static str = "the draft model grows an EAGLE-2-style dynamic tree of `nodes` \
                                   nodes, `top_k` children per node (needs a draft model)";

    fn check(&self) -> std::result::Result<(), String> {
        if self.nodes == 0 || self.top_k == 0 {
            return Err("dynamic_tree needs nodes ≥ 1 and top_k ≥ 1".into());
        }
        Ok(())
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
                lm, self.nodes, self.top_k, self.top_k,
            )?),
            is_chain: false,
            shape: Some(TreeShape::chain(self.nodes)),
            draft_pass_s,
        })
    }
}
