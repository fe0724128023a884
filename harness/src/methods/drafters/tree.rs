//! `tree`: the draft model fills a static k-ary tree.

use serde::{Deserialize, Serialize};
use specdec_algorithms::trees::TreeShape;

use super::{shape_over, BuiltDrafter, DraftContext, DraftSetup, DrafterKind};
use crate::error::Result;
use crate::methods::limits::branching_drafts;
use crate::methods::Kind;

/// The draft model expands a static tree, `branching[d]` children per node at depth d:
/// top-ranked tokens at T = 0 (greedy verification), children sampled without replacement
/// from `q` above (recursive rejection sampling). The policy's K is a node budget within it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Tree {
    /// Children per node at each depth (length = tree depth), each ≥ 1, at most
    /// [`MAX_DRAFTS`](crate::methods::limits::MAX_DRAFTS) nodes in all.
    pub branching: Vec<usize>,
}

impl Kind for Tree {
    const NAME: &'static str = "tree";
    const ALIASES: &'static [&'static str] = &["static_tree"];
    const SUMMARY: &'static str =
        "the draft model fills a static tree, `branching` children per depth (needs a draft model)";

    fn check(&self) -> std::result::Result<(), String> {
        branching_drafts("tree.branching", &self.branching).map(|_| ())
    }
}

impl DrafterKind for Tree {
    fn is_chain(&self) -> bool {
        false
    }
    fn needs_draft_model(&self) -> bool {
        true
    }
    /// 3 children at the root, then 2, 1, 1.
    fn for_generate(_draft: Option<&str>) -> Option<Self> {
        Some(Tree {
            branching: vec![3, 2, 1, 1],
        })
    }
    fn build(&self, ctx: &mut dyn DraftContext, setup: &DraftSetup<'_>) -> Result<BuiltDrafter> {
        shape_over(
            ctx,
            setup,
            Self::NAME,
            TreeShape::from_branching(&self.branching),
        )
    }
}
