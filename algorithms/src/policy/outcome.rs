//! What a policy decides ([`Budget`]) and what it is told afterwards ([`StepOutcome`]).

use std::sync::Arc;

use specdec_kernels::TreeTopology;

use crate::error::{AlgorithmError, Result};
use crate::trees::TreeShape;

/// The speculation budget of one sequence for one step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Budget {
    /// No drafts: plain decoding (one target pass, one new token). "Budget 0".
    Plain,
    /// A chain of `k` drafts (`k ≥ 1`; `Chain(0)` means the same as [`Budget::Plain`]).
    Chain(usize),
    /// A draft tree of at most this many draft nodes (root excluded); the drafter picks the shape
    /// (top-k expansion, dynamic tree). `TreeNodes(0)` means [`Budget::Plain`].
    TreeNodes(usize),
    /// A draft tree of exactly this shape (static, Sequoia, k-ary), to be filled by the drafter.
    Tree(Arc<TreeShape>),
}

impl Budget {
    /// A chain budget, normalised: `k = 0` gives [`Budget::Plain`].
    pub fn chain(k: usize) -> Self {
        if k == 0 {
            Self::Plain
        } else {
            Self::Chain(k)
        }
    }

    /// Most draft tokens this budget allows (0 for plain decoding).
    pub fn max_drafts(&self) -> usize {
        match self {
            Self::Plain => 0,
            Self::Chain(k) | Self::TreeNodes(k) => *k,
            Self::Tree(shape) => shape.drafts(),
        }
    }

    /// True if this budget means plain decoding.
    pub fn is_plain(&self) -> bool {
        self.max_drafts() == 0
    }
}

/// What was tried at one depth along the accepted path: the candidate children of the path node
/// at that depth, identified by rank, and which one (if any) the verifier accepted.
///
/// Convention: candidates are considered in increasing rank order, so every candidate ranked
/// below the accepted one was tried and rejected, and candidates ranked above it were not tried.
/// When none was accepted, all were tried and rejected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DepthTrial {
    /// Ranks of the candidate children present at this depth, strictly increasing, non-empty.
    pub candidate_ranks: Vec<usize>,
    /// The accepted candidate's rank (one of `candidate_ranks`), or `None` if all were rejected.
    pub accepted_rank: Option<usize>,
}

/// The outcome of one step of one sequence, as a policy sees it.
///
/// Invariants (checked by the constructors and [`StepOutcome::validate`]):
/// `accepted ≤ proposed`; `trials[d]` for `d < accepted` has an accepted rank; `trials.len()` is
/// `accepted` (the accepted path ended at a leaf: nothing more was tried, the next position is
/// **censored**) or `accepted + 1` (the last entry has no accepted rank: a rejection ended it).
/// A plain step has `proposed = accepted = 0` and no trials.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct StepOutcome {
    /// Draft tokens proposed this step (draft nodes of the tree, root excluded).
    pub proposed: usize,
    /// Draft tokens accepted (length of the accepted path, root and bonus token excluded).
    pub accepted: usize,
    /// Per depth along the accepted path, what was tried there (see the type's invariants).
    pub trials: Vec<DepthTrial>,
}

impl StepOutcome {
    /// A plain-decoding step: nothing proposed.
    pub fn plain() -> Self {
        Self::default()
    }

    /// A chain of `proposed` drafts of which the first `accepted` were accepted.
    ///
    /// # Errors
    /// [`AlgorithmError::InvalidOutcome`] if `accepted > proposed`.
    pub fn chain(proposed: usize, accepted: usize) -> Result<Self> {
        if accepted > proposed {
            return Err(AlgorithmError::InvalidOutcome {
                reason: format!("{accepted} drafts accepted out of {proposed} proposed"),
            });
        }
        let mut trials = vec![
            DepthTrial {
                candidate_ranks: vec![0],
                accepted_rank: Some(0),
            };
            accepted
        ];
        if accepted < proposed {
            trials.push(DepthTrial {
                candidate_ranks: vec![0],
                accepted_rank: None,
            });
        }
        Ok(Self {
            proposed,
            accepted,
            trials,
        })
    }

    /// The outcome of verifying a tree of this `shape`, given the accepted path as node indices
    /// from the root (`accepted_path[0] == 0`) down to the last accepted draft node.
    ///
    /// # Errors
    /// [`AlgorithmError::InvalidOutcome`] if the path does not start at the root or is not a
    /// parent-to-child walk of the shape.
    pub fn tree(shape: &TreeShape, accepted_path: &[usize]) -> Result<Self> {
        if accepted_path.first() != Some(&0) {
            return Err(AlgorithmError::InvalidOutcome {
                reason: "the accepted path must start at the root (node 0)".to_string(),
            });
        }
        Self::walk(shape.topology(), &accepted_path[1..], |node| {
            shape.rank(node)
        })
    }

    /// The outcome of a verifier's verdict on a draft tree: `accepted_path` lists the accepted
    /// draft nodes from the root's child down, root excluded (as in
    /// `specdec_kernels::verification::Verdict::accepted_path`). A node's rank is its position
    /// among its siblings in index order, the order verifiers try them.
    ///
    /// # Errors
    /// [`AlgorithmError::InvalidOutcome`] if the path is not a parent-to-child walk from the root.
    pub fn from_verdict(topology: &TreeTopology, accepted_path: &[usize]) -> Result<Self> {
        Self::walk(topology, accepted_path, |node| {
            let parent = topology.parent(node).unwrap_or(0);
            topology
                .children(parent)
                .iter()
                .position(|&c| c == node)
                .unwrap_or(0)
        })
    }

    fn walk(
        topology: &TreeTopology,
        below_root: &[usize],
        rank: impl Fn(usize) -> usize,
    ) -> Result<Self> {
        let bad = |reason: String| Err(AlgorithmError::InvalidOutcome { reason });
        let mut trials = Vec::with_capacity(below_root.len() + 1);
        let mut node = 0;
        for step in 0..=below_root.len() {
            if node >= topology.len() {
                return bad(format!(
                    "path node {node} is outside a tree of {} nodes",
                    topology.len()
                ));
            }
            let children = topology.children(node);
            let next = below_root.get(step).copied();
            if children.is_empty() {
                if next.is_some() {
                    return bad(format!("path continues below leaf node {node}"));
                }
                break;
            }
            let mut candidate_ranks: Vec<usize> = children.iter().map(|&c| rank(c)).collect();
            candidate_ranks.sort_unstable();
            let accepted_rank = match next {
                Some(child) if child < topology.len() && topology.parent(child) == Some(node) => {
                    Some(rank(child))
                }
                Some(child) => {
                    return bad(format!("path node {child} is not a child of node {node}"))
                }
                None => None,
            };
            trials.push(DepthTrial {
                candidate_ranks,
                accepted_rank,
            });
            if let Some(child) = next {
                node = child;
            }
        }
        let outcome = Self {
            proposed: topology.len().saturating_sub(1),
            accepted: below_root.len(),
            trials,
        };
        outcome.validate()?;
        Ok(outcome)
    }

    /// Checks the invariants stated on the type.
    ///
    /// # Errors
    /// [`AlgorithmError::InvalidOutcome`] naming the first broken invariant.
    pub fn validate(&self) -> Result<()> {
        let bad = |reason: String| Err(AlgorithmError::InvalidOutcome { reason });
        if self.accepted > self.proposed {
            return bad(format!(
                "{} drafts accepted out of {} proposed",
                self.accepted, self.proposed
            ));
        }
        if self.trials.len() != self.accepted && self.trials.len() != self.accepted + 1 {
            return bad(format!(
                "{} depth trials for {} accepted drafts (expected {} or {})",
                self.trials.len(),
                self.accepted,
                self.accepted,
                self.accepted + 1
            ));
        }
        for (depth, trial) in self.trials.iter().enumerate() {
            if trial.candidate_ranks.is_empty()
                || trial.candidate_ranks.windows(2).any(|w| w[0] >= w[1])
            {
                return bad(format!(
                    "candidate ranks at depth {depth} must be non-empty and strictly increasing"
                ));
            }
            let should_accept = depth < self.accepted;
            match trial.accepted_rank {
                Some(r) if !should_accept => {
                    return bad(format!(
                        "depth {depth} accepted rank {r} beyond the accepted length"
                    ))
                }
                None if should_accept => {
                    return bad(format!(
                        "depth {depth} is within the accepted length but accepted nothing"
                    ))
                }
                Some(r) if !trial.candidate_ranks.contains(&r) => {
                    return bad(format!(
                        "depth {depth} accepted rank {r} that was not a candidate"
                    ))
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// True if every proposed draft along the accepted path was accepted and the path reached a
    /// leaf (for a chain: all `proposed` drafts accepted). False for a plain step.
    pub fn fully_accepted(&self) -> bool {
        self.proposed > 0 && self.trials.len() == self.accepted
    }

    /// Accepted drafts / proposed drafts for this step (`None` for a plain step).
    pub fn acceptance_rate(&self) -> Option<f64> {
        (self.proposed > 0).then(|| self.accepted as f64 / self.proposed as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chain_outcomes_censor_after_rejection() {
        let o = StepOutcome::chain(4, 2).unwrap();
        assert_eq!(o.trials.len(), 3);
        assert_eq!(o.trials[2].accepted_rank, None);
        assert!(!o.fully_accepted());
        let full = StepOutcome::chain(3, 3).unwrap();
        assert_eq!(full.trials.len(), 3);
        assert!(full.fully_accepted());
        assert!(StepOutcome::chain(2, 3).is_err());
        assert!(!StepOutcome::plain().fully_accepted());
        assert_eq!(StepOutcome::plain().acceptance_rate(), None);
    }

    #[test]
    fn tree_outcome_from_path() {
        // root 0 with children 1 (rank 0), 2 (rank 1); node 2 has child 3 (rank 0).
        let shape = TreeShape::new(&[None, Some(0), Some(0), Some(2)], &[0, 0, 1, 0]).unwrap();
        let o = StepOutcome::tree(&shape, &[0, 2, 3]).unwrap();
        assert_eq!((o.proposed, o.accepted), (3, 2));
        assert!(o.fully_accepted());
        assert_eq!(o.trials[0].candidate_ranks, vec![0, 1]);
        assert_eq!(o.trials[0].accepted_rank, Some(1));
        let o = StepOutcome::tree(&shape, &[0]).unwrap();
        assert_eq!(o.trials.len(), 1);
        assert_eq!(o.trials[0].accepted_rank, None);
        assert!(StepOutcome::tree(&shape, &[0, 3]).is_err());
        assert!(StepOutcome::tree(&shape, &[1]).is_err());
        assert!(StepOutcome::tree(&shape, &[0, 1, 2]).is_err());
        // From a verdict: ranks are sibling positions, which match the shape's here.
        let v = StepOutcome::from_verdict(shape.topology(), &[2, 3]).unwrap();
        assert_eq!(v, StepOutcome::tree(&shape, &[0, 2, 3]).unwrap());
        assert!(StepOutcome::from_verdict(shape.topology(), &[3]).is_err());
        assert!(StepOutcome::from_verdict(shape.topology(), &[9]).is_err());
    }

    #[test]
    fn validate_catches_contradictions() {
        let mut o = StepOutcome::chain(3, 1).unwrap();
        o.accepted = 2;
        assert!(o.validate().is_err());
        let mut o = StepOutcome::chain(3, 1).unwrap();
        o.trials[1].accepted_rank = Some(0);
        assert!(o.validate().is_err());
        let mut o = StepOutcome::chain(3, 1).unwrap();
        o.trials[0].accepted_rank = Some(4);
        assert!(o.validate().is_err());
    }

    #[test]
    fn budget_normalises_zero() {
        assert_eq!(Budget::chain(0), Budget::Plain);
        assert!(Budget::Chain(0).is_plain());
        assert_eq!(Budget::chain(3).max_drafts(), 3);
    }
}
