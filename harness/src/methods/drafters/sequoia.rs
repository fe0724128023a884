//! `sequoia`: a Sequoia-style tree, DP-optimal for an acceptance vector.

use serde::{Deserialize, Serialize};
use specdec_algorithms::trees::sequoia_tree;

use super::{shape_over, BuiltDrafter, DraftContext, DraftSetup, DrafterKind};
use crate::error::Result;
use crate::methods::limits::check_drafts;
use crate::methods::Kind;

/// The acceptance-by-rank vector the `sequoia` drafter plans its tree from.
pub const SEQUOIA_ALPHAS: [f64; 7] = [0.7, 0.15, 0.07, 0.04, 0.02, 0.01, 0.01];

/// The depth limit of the `sequoia` drafter's tree.
pub const SEQUOIA_MAX_DEPTH: usize = 8;

/// The draft model fills the Sequoia tree of `nodes` nodes planned for [`SEQUOIA_ALPHAS`]
/// (depth ≤ [`SEQUOIA_MAX_DEPTH`]), filled as a static `tree`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Sequoia {
    /// Node budget (≥ 1, at most [`MAX_DRAFTS`](crate::methods::limits::MAX_DRAFTS)).
    pub nodes: usize,
}

impl Kind for Sequoia {
    const NAME: &'static str = "sequoia";
    const SUMMARY: &'static str =
        "the draft model fills a Sequoia tree of `nodes` nodes (needs a draft model)";

    fn check(&self) -> std::result::Result<(), String> {
        if self.nodes == 0 {
            return Err("sequoia needs nodes ≥ 1".into());
        }
        check_drafts("sequoia.nodes", self.nodes)
    }
}

impl DrafterKind for Sequoia {
    fn is_chain(&self) -> bool {
        false
    }
    fn needs_draft_model(&self) -> bool {
        true
    }
    fn build(&self, ctx: &mut dyn DraftContext, setup: &DraftSetup<'_>) -> Result<BuiltDrafter> {
        let shape = sequoia_tree(&SEQUOIA_ALPHAS, self.nodes, SEQUOIA_MAX_DEPTH)?.shape;
        shape_over(ctx, setup, Self::NAME, shape)
    }
}
