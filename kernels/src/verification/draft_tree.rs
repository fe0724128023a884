//! The draft tree: what a drafter hands to a verifier.
//!
//! A [`DraftTree`] is a [`TreeTopology`] whose node 0 is the **root** — the last sampled token,
//! already part of the output, not a draft — and whose nodes `1..` are drafted tokens, plus:
//! - the token at every node (`tokens[0]` is the root's token);
//! - the draft distribution `q` at every **expanded** node (a node with children): the
//!   distribution (after temperature / top-k / top-p) the node's children were drawn from —
//!   required for the sampled kinds, optional for deterministic trees, and optional (but allowed)
//!   at leaves, where a drafter may record the draft's next-token distribution too;
//! - how the children were drawn ([`DraftKind`]).
//!
//! Children of one node are kept in increasing index order, which is the order they were drawn
//! in and the order verifiers try them. Target distributions are not part of the tree: they come
//! with the [`super::VerifyInput`].

use crate::error::{KernelError, Result};
use crate::sampling::{check_distribution, Prob};
use crate::tree::TreeTopology;

/// How the children of every expanded node were drawn. Verifiers are lossless only for the kinds
/// they declare (the pairing rule, enforced in `specdec-algorithms`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DraftKind {
    /// Each child drawn independently from `q` (a chain drawn from `q` is this kind too).
    Iid,
    /// Children drawn one after another from `q` without replacement: the `k`-th from `q`
    /// restricted to tokens not yet drawn among its siblings, renormalised.
    WithoutReplacement,
    /// Children chosen deterministically (e.g. the top-k tokens of `q`); `q` may be recorded but
    /// the tokens were not sampled from it.
    Deterministic,
}

impl DraftKind {
    /// All kinds, in declaration order.
    pub const ALL: [DraftKind; 3] = [
        DraftKind::Iid,
        DraftKind::WithoutReplacement,
        DraftKind::Deterministic,
    ];

    /// A short lower-case name: `iid`, `without-replacement`, `deterministic`.
    pub fn name(self) -> &'static str {
        match self {
            DraftKind::Iid => "iid",
            DraftKind::WithoutReplacement => "without-replacement",
            DraftKind::Deterministic => "deterministic",
        }
    }
}

impl std::fmt::Display for DraftKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A validated draft tree over a vocabulary of `vocab()` tokens (see the module docs).
#[derive(Debug, Clone, PartialEq)]
pub struct DraftTree<N> {
    topology: TreeTopology,
    tokens: Vec<u32>,
    draft_probs: Vec<Option<Vec<N>>>,
    kind: DraftKind,
}

fn invalid(reason: String) -> KernelError {
    KernelError::InvalidDraftTree { reason }
}

impl<N: Prob> DraftTree<N> {
    /// Builds a draft tree. `tokens` and `draft_probs` are indexed by node.
    ///
    /// # Errors
    /// [`KernelError::InvalidDraftTree`] when: the tree is empty; `tokens` or `draft_probs` do
    /// not have one entry per node; a sampled kind (`Iid`, `WithoutReplacement`) lacks `q` at an
    /// expanded node; the recorded `q`s differ in length or are not distributions; a drafted
    /// token is outside the vocabulary; siblings repeat a token in a `WithoutReplacement` tree.
    pub fn new(
        topology: TreeTopology,
        tokens: Vec<u32>,
        draft_probs: Vec<Option<Vec<N>>>,
        kind: DraftKind,
    ) -> Result<Self> {
        let len = topology.len();
        if len == 0 {
            return Err(invalid(
                "the tree is empty: it needs at least the root".into(),
            ));
        }
        if tokens.len() != len || draft_probs.len() != len {
            return Err(invalid(format!(
                "{len} nodes but {} tokens and {} draft distributions",
                tokens.len(),
                draft_probs.len()
            )));
        }
        let mut vocab = None;
        for (node, q) in draft_probs.iter().enumerate() {
            let expanded = !topology.children(node).is_empty();
            match q {
                None if expanded && kind != DraftKind::Deterministic => {
                    return Err(invalid(format!(
                        "node {node} has children drawn {kind} but no draft distribution q"
                    )))
                }
                None => {}
                Some(q) => {
                    check_distribution(&format!("draft distribution q at node {node}"), q)
                        .map_err(|e| invalid(e.to_string()))?;
                    if *vocab.get_or_insert(q.len()) != q.len() {
                        return Err(invalid(format!(
                            "q at node {node} has {} entries, earlier ones {}",
                            q.len(),
                            vocab.unwrap_or(0)
                        )));
                    }
                }
            }
        }
        if let Some(vocab) = vocab {
            if let Some(node) = (1..len).find(|&n| tokens[n] as usize >= vocab) {
                return Err(invalid(format!(
                    "token {} at node {node} is outside the vocabulary of {vocab}",
                    tokens[node]
                )));
            }
        }
        if kind == DraftKind::WithoutReplacement {
            for node in 0..len {
                let children = topology.children(node);
                for (i, &a) in children.iter().enumerate() {
                    if children[..i].iter().any(|&b| tokens[b] == tokens[a]) {
                        return Err(invalid(format!(
                            "node {a} repeats token {} among the children of node {node}, \
                             which were drawn without replacement",
                            tokens[a]
                        )));
                    }
                }
            }
        }
        Ok(Self {
            topology,
            tokens,
            draft_probs,
            kind,
        })
    }

    /// The tree with the root only (no drafts): verification then just samples the next token.
    pub fn root_only(root_token: u32, kind: DraftKind) -> Self {
        Self {
            topology: TreeTopology::chain(1),
            tokens: vec![root_token],
            draft_probs: vec![None],
            kind,
        }
    }
}

impl<N> DraftTree<N> {
    /// The tree's shape.
    pub fn topology(&self) -> &TreeTopology {
        &self.topology
    }

    /// Number of nodes, root included.
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    /// Always false: a draft tree has at least its root.
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// Number of drafted tokens (`len() - 1`).
    pub fn draft_count(&self) -> usize {
        self.tokens.len() - 1
    }

    /// Token at every node (`[0]` is the root's token).
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// Token at `node`.
    pub fn token(&self, node: usize) -> u32 {
        self.tokens[node]
    }

    /// The draft distribution the children of `node` were drawn from, if recorded.
    pub fn draft_probs(&self, node: usize) -> Option<&[N]> {
        self.draft_probs[node].as_deref()
    }

    /// How the children were drawn.
    pub fn kind(&self) -> DraftKind {
        self.kind
    }

    /// The chain's root and its first `drafts` drafts (their recorded `q`s kept): a shorter
    /// draft of the same tokens. Verifying a prefix is lossless only where the verifier's
    /// correctness does not depend on how many drafts were drawn, as for
    /// [`DraftKind::Deterministic`] drafts verified against the target alone; for sampled
    /// drafts a length chosen after drawing them biases the output.
    ///
    /// # Errors
    /// [`KernelError::InvalidDraftTree`] if the tree is not a chain or has fewer than `drafts`
    /// drafts.
    pub fn chain_prefix(mut self, drafts: usize) -> Result<Self> {
        if !self.topology.is_chain() {
            return Err(invalid(format!(
                "a prefix of {drafts} drafts asked of a tree that is not a chain ({} nodes)",
                self.len()
            )));
        }
        if drafts > self.draft_count() {
            return Err(invalid(format!(
                "a prefix of {drafts} drafts asked of a chain of {}",
                self.draft_count()
            )));
        }
        self.topology = TreeTopology::chain(drafts + 1);
        self.tokens.truncate(drafts + 1);
        self.draft_probs.truncate(drafts + 1);
        Ok(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chain_prefix_keeps_the_first_drafts_and_refuses_a_tree_or_a_longer_prefix() {
        let chain = DraftTree::<f64>::new(
            TreeTopology::chain(4),
            vec![7, 1, 0, 1],
            vec![None, None, None, None],
            DraftKind::Deterministic,
        )
        .unwrap();
        let prefix = chain.clone().chain_prefix(2).unwrap();
        assert_eq!(prefix.tokens(), &[7, 1, 0]);
        assert_eq!(prefix.topology(), &TreeTopology::chain(3));
        assert_eq!(prefix.kind(), DraftKind::Deterministic);
        assert_eq!(chain.clone().chain_prefix(0).unwrap().tokens(), &[7]);
        let longer = chain.chain_prefix(4).unwrap_err().to_string();
        assert!(
            longer.contains("4 drafts") && longer.contains("chain of 3"),
            "{longer}"
        );
        let fork = DraftTree::<f64>::new(
            TreeTopology::from_parents(&[None, Some(0), Some(0)]).unwrap(),
            vec![7, 1, 0],
            vec![None, None, None],
            DraftKind::Deterministic,
        )
        .unwrap();
        assert!(fork
            .chain_prefix(1)
            .unwrap_err()
            .to_string()
            .contains("not a chain"));
    }

    fn q() -> Option<Vec<f64>> {
        Some(vec![0.5, 0.5])
    }

    #[test]
    fn sampled_trees_need_q_at_expanded_nodes() {
        let chain = TreeTopology::chain(2);
        let err =
            DraftTree::<f64>::new(chain.clone(), vec![0, 1], vec![None, None], DraftKind::Iid);
        assert!(err
            .unwrap_err()
            .to_string()
            .contains("no draft distribution"));
        assert!(DraftTree::<f64>::new(
            chain.clone(),
            vec![0, 1],
            vec![None, None],
            DraftKind::Deterministic
        )
        .is_ok());
        assert!(DraftTree::new(chain, vec![0, 1], vec![q(), None], DraftKind::Iid).is_ok());
    }

    #[test]
    fn kinds_print_their_documented_names() {
        let names: Vec<String> = DraftKind::ALL.iter().map(|k| k.to_string()).collect();
        assert_eq!(names, ["iid", "without-replacement", "deterministic"]);
        for kind in DraftKind::ALL {
            assert_eq!(kind.to_string(), kind.name());
        }
    }

    #[test]
    fn accessors_describe_the_tree() {
        let fork = TreeTopology::from_parents(&[None, Some(0), Some(0), Some(1)]).unwrap();
        let tree = DraftTree::new(
            fork,
            vec![3, 0, 1, 1],
            vec![q(), q(), None, None],
            DraftKind::Iid,
        )
        .unwrap();
        assert_eq!((tree.len(), tree.draft_count()), (4, 3));
        assert!(!tree.is_empty());
        assert_eq!(tree.tokens(), &[3, 0, 1, 1]);
        assert_eq!(tree.token(2), 1);
        assert_eq!(tree.draft_probs(1), Some(&[0.5, 0.5][..]));
        assert_eq!(tree.draft_probs(2), None);
        assert_eq!(tree.kind(), DraftKind::Iid);
        let root = DraftTree::<f64>::root_only(5, DraftKind::Deterministic);
        assert_eq!(
            (root.len(), root.draft_count(), root.tokens()),
            (1, 0, &[5][..])
        );
        assert!(!root.is_empty());
        assert_eq!(root.kind(), DraftKind::Deterministic);
    }

    #[test]
    fn bad_trees_are_refused_with_a_reason() {
        let fork = TreeTopology::from_parents(&[None, Some(0), Some(0)]).unwrap();
        let dup = DraftTree::new(
            fork.clone(),
            vec![0, 1, 1],
            vec![q(), None, None],
            DraftKind::WithoutReplacement,
        );
        assert!(dup.unwrap_err().to_string().contains("repeats token 1"));
        assert!(DraftTree::new(
            fork.clone(),
            vec![0, 1, 1],
            vec![q(), None, None],
            DraftKind::Iid
        )
        .is_ok());
        let oov = DraftTree::new(
            fork.clone(),
            vec![0, 1, 5],
            vec![q(), None, None],
            DraftKind::Iid,
        );
        assert!(oov
            .unwrap_err()
            .to_string()
            .contains("outside the vocabulary"));
        let short = DraftTree::new(fork, vec![0, 1], vec![q(), None, None], DraftKind::Iid);
        assert!(short.is_err());
        let empty = TreeTopology::from_parents(&[]).unwrap();
        assert!(DraftTree::<f64>::new(empty, vec![], vec![], DraftKind::Iid).is_err());
    }
}
