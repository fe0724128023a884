//! [`TreeBuilder`]: grows a draft tree node by node, parents first.

use specdec_kernels::verification::{DraftKind, DraftTree};
use specdec_kernels::TreeTopology;

use crate::error::Result;

/// Accumulates a draft tree in topological order: the root first, then every node after its
/// parent; children of a node in the order they were drawn (the order verifiers try them).
#[derive(Debug, Clone)]
pub struct TreeBuilder<N> {
    parents: Vec<Option<usize>>,
    tokens: Vec<u32>,
    draft_probs: Vec<Option<Vec<N>>>,
}

impl<N> TreeBuilder<N> {
    /// A tree holding the root (the context's last token) only.
    pub fn new(root: u32) -> Self {
        Self {
            parents: vec![None],
            tokens: vec![root],
            draft_probs: vec![None],
        }
    }

    /// Adds a child of `parent` carrying `token`; returns its node index. Panics if `parent` is
    /// not a node yet.
    pub fn push(&mut self, parent: usize, token: u32) -> usize {
        assert!(
            parent < self.tokens.len(),
            "parent {parent} does not exist yet"
        );
        self.parents.push(Some(parent));
        self.tokens.push(token);
        self.draft_probs.push(None);
        self.tokens.len() - 1
    }

    /// Records the distribution `node`'s children are drawn from.
    pub fn set_draft_probs(&mut self, node: usize, q: Vec<N>) {
        self.draft_probs[node] = Some(q);
    }

    /// Number of nodes so far, root included.
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    /// Always false (the root is always there).
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// Draft nodes so far (`len() - 1`).
    pub fn drafts(&self) -> usize {
        self.tokens.len() - 1
    }

    /// Tokens from the root's child down to `node` (empty for the root).
    pub fn path_tokens(&self, node: usize) -> Vec<u32> {
        let mut path = Vec::new();
        let mut current = node;
        while let Some(parent) = self.parents[current] {
            path.push(self.tokens[current]);
            current = parent;
        }
        path.reverse();
        path
    }

    /// Validates and returns the draft tree. Distributions recorded at nodes that ended up
    /// without children are dropped (they describe nothing drawn).
    ///
    /// # Errors
    /// [`crate::AlgorithmError::Kernel`] if the tree is invalid for `kind` (e.g. a sampled kind
    /// without `q` at an expanded node).
    pub fn finish(mut self, kind: DraftKind) -> Result<DraftTree<N>>
    where
        N: specdec_kernels::sampling::Prob,
    {
        let topology = TreeTopology::from_parents(&self.parents)?;
        for node in 0..topology.len() {
            if topology.children(node).is_empty() {
                self.draft_probs[node] = None;
            }
        }
        Ok(DraftTree::new(
            topology,
            self.tokens,
            self.draft_probs,
            kind,
        )?)
    }
}
