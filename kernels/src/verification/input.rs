//! What one sequence brings to verification, and what verification returns.

use super::draft_tree::DraftTree;
use crate::error::{KernelError, Result};
use crate::sampling::{check_distribution, DrawKey, Prob, Purpose};

/// One sequence's verification input: its draft tree and the target distribution `p` at every
/// tree node (after temperature / top-k / top-p), plus the identifiers that key its decisions.
#[derive(Debug, Clone, Copy)]
pub struct VerifyInput<'a, N> {
    /// Stable sequence (request) id: keys the sequence's random decisions.
    pub sequence: u64,
    /// The sequence's decoding step: keys the decisions of this round.
    pub step: u64,
    /// The draft tree.
    pub tree: &'a DraftTree<N>,
    /// `target_probs[node]`: the target's next-token distribution after the path to `node`
    /// (for the root: after the current output). One row per tree node, each of vocabulary size.
    pub target_probs: &'a [Vec<N>],
}

impl<N: Prob> VerifyInput<'_, N> {
    /// The vocabulary size (length of the target rows).
    pub fn vocab(&self) -> usize {
        self.target_probs.first().map_or(0, Vec::len)
    }

    /// The key for `purpose` at `node` in this sequence's step.
    pub fn key(&self, node: usize, purpose: Purpose) -> DrawKey {
        DrawKey::new(self.sequence, self.step, node, purpose)
    }

    /// Checks that the target rows fit the tree and are distributions.
    ///
    /// # Errors
    /// [`KernelError::ShapeMismatch`] or [`KernelError::InvalidDistribution`] naming the node.
    pub fn validate(&self) -> Result<()> {
        if self.target_probs.len() != self.tree.len() {
            return Err(KernelError::ShapeMismatch {
                what: format!("target rows of sequence {}", self.sequence),
                expected: self.tree.len(),
                actual: self.target_probs.len(),
            });
        }
        let vocab = self.vocab();
        for (node, row) in self.target_probs.iter().enumerate() {
            if row.len() != vocab {
                return Err(KernelError::ShapeMismatch {
                    what: format!("target row at node {node}"),
                    expected: vocab,
                    actual: row.len(),
                });
            }
            check_distribution(&format!("target distribution at node {node}"), row)?;
        }
        self.tree.check_vocab(vocab)
    }
}

impl<N> DraftTree<N> {
    /// Checks that the tree fits a vocabulary of `vocab`: every draft distribution has `vocab`
    /// entries and every drafted token (the root's is already output) is below `vocab`.
    ///
    /// # Errors
    /// [`KernelError::ShapeMismatch`] or [`KernelError::InvalidDraftTree`] naming the node.
    pub fn check_vocab(&self, vocab: usize) -> Result<()> {
        for node in 0..self.len() {
            if let Some(q) = self.draft_probs(node) {
                if q.len() != vocab {
                    return Err(KernelError::ShapeMismatch {
                        what: format!("draft distribution at node {node}"),
                        expected: vocab,
                        actual: q.len(),
                    });
                }
            }
            if node > 0 && self.token(node) as usize >= vocab {
                return Err(KernelError::InvalidDraftTree {
                    reason: format!(
                        "token {} at node {node} is outside the vocabulary of {vocab}",
                        self.token(node)
                    ),
                });
            }
        }
        Ok(())
    }
}

/// The outcome of verifying one sequence.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Verdict {
    /// Accepted drafted nodes from the root's child down (the root itself is not listed).
    pub accepted_path: Vec<usize>,
    /// `accepted_path.len()`: drafts accepted this round.
    pub accepted_len: usize,
    /// The token emitted after the accepted path: the correction (after a rejection) or the bonus
    /// (after an accepted leaf).
    pub next_token: u32,
}

/// Walks down a tree from the root: `step(node)` returns `Ok(child)` to accept `child` and
/// continue there, or `Err(token)` to stop with `token` as the next token.
pub fn walk_tree(mut step: impl FnMut(usize) -> std::result::Result<usize, u32>) -> Verdict {
    let mut node = 0;
    let mut path = Vec::new();
    loop {
        match step(node) {
            Ok(child) => {
                path.push(child);
                node = child;
            }
            Err(next_token) => return Verdict::new(path, next_token),
        }
    }
}

impl<N> DraftTree<N> {
    /// The first child of `node` (lowest index) carrying `token`.
    pub fn child_with_token(&self, node: usize, token: u32) -> Option<usize> {
        self.topology()
            .children(node)
            .iter()
            .copied()
            .find(|&c| self.token(c) == token)
    }
}

impl Verdict {
    /// A verdict from an accepted path and the next token.
    pub fn new(accepted_path: Vec<usize>, next_token: u32) -> Self {
        Self {
            accepted_len: accepted_path.len(),
            accepted_path,
            next_token,
        }
    }

    /// The last accepted node (the root when nothing was accepted).
    pub fn last_node(&self) -> usize {
        self.accepted_path.last().copied().unwrap_or(0)
    }

    /// The tokens this round emits: the accepted drafts' tokens, then the next token
    /// (`accepted_len + 1` tokens).
    pub fn emitted_tokens<N>(&self, tree: &DraftTree<N>) -> Vec<u32> {
        self.accepted_path
            .iter()
            .map(|&n| tree.token(n))
            .chain(std::iter::once(self.next_token))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tree::TreeTopology;
    use crate::verification::DraftKind;

    #[test]
    fn validate_refuses_drafts_outside_the_target_vocabulary() {
        // A deterministic tree records no q, so only the target rows bound its tokens; the
        // root's token is already output and is not checked.
        let chain = TreeTopology::chain(2);
        let rows = vec![vec![0.5f32, 0.5]; 2];
        let tree = |tokens: Vec<u32>| {
            DraftTree::<f32>::new(
                chain.clone(),
                tokens,
                vec![None; 2],
                DraftKind::Deterministic,
            )
            .unwrap()
        };
        let (outside, inside) = (tree(vec![0, 2]), tree(vec![9, 1]));
        let input = VerifyInput {
            sequence: 3,
            step: 0,
            tree: &outside,
            target_probs: &rows,
        };
        assert_eq!(input.vocab(), 2);
        let err = input.validate().unwrap_err().to_string();
        assert!(err.contains("token 2 at node 1 is outside"), "{err}");
        let input = VerifyInput {
            tree: &inside,
            ..input
        };
        assert!(input.validate().is_ok());
    }

    #[test]
    fn verdicts_name_their_last_node_and_emitted_tokens() {
        let tree = DraftTree::<f32>::new(
            TreeTopology::chain(4),
            vec![8, 1, 2, 3],
            vec![None; 4],
            DraftKind::Deterministic,
        )
        .unwrap();
        let verdict = Verdict::new(vec![1, 2], 0);
        assert_eq!((verdict.accepted_len, verdict.last_node()), (2, 2));
        assert_eq!(verdict.emitted_tokens(&tree), vec![1, 2, 0]);
        let none = Verdict::new(vec![], 5);
        assert_eq!((none.accepted_len, none.last_node()), (0, 0));
        assert_eq!(none.emitted_tokens(&tree), vec![5]);
    }
}
