//! `fixed`: the same budget every step.

use serde::{Deserialize, Serialize};
use specdec_algorithms::policy::{FixedPolicy, SpeculationPolicy};

use super::{PolicyContext, PolicyKind};
use crate::error::Result;
use crate::methods::limits::check_drafts;
use crate::methods::Kind;

/// Always K drafts (`FixedPolicy`): a chain of K, or K tree nodes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Fixed {
    /// Drafts per step (1..=[`MAX_DRAFTS`](crate::methods::limits::MAX_DRAFTS)).
    pub k: usize,
}

impl Kind for Fixed {
    const NAME: &'static str = "fixed";
    const SUMMARY: &'static str = "always K drafts (a chain of K, or K tree nodes)";

    fn check(&self) -> std::result::Result<(), String> {
        check_drafts("fixed.k", self.k)
    }

    fn describe(&self) -> String {
        format!("fixed k={}", self.k)
    }
}

impl PolicyKind for Fixed {
    fn check_for(&self, is_chain: bool, drafter: &str) -> std::result::Result<(), String> {
        match (self.k, is_chain) {
            (0, true) => Err(format!(
                "K = 0 for the linear method `{drafter}`: a chain needs K ≥ 1 (use drafter kind \
                 = \"plain\" for plain decoding)"
            )),
            (0, false) => Err("K = 0: a drafting method needs a budget ≥ 1".into()),
            _ => Ok(()),
        }
    }

    fn build(&self, ctx: &PolicyContext<'_>) -> Result<Box<dyn SpeculationPolicy>> {
        Ok(Box::new(FixedPolicy::new(ctx.budget_of(self.k))))
    }
}
