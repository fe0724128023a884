//! The shape of one sequence's new tokens in one step: a prefill chunk, a chain, or a token tree.
//!
//! A tree of `n` nodes is a **parent array in topological order**: node 0 is the root (the first
//! new token, usually the last sampled token whose K/V is not yet cached) and every other node `i`
//! has a parent `p < i`. A chain (or a prefill chunk) is the tree where `parent(i) = i - 1`.
//!
//! From the parent array we derive, once:
//! - `depth(i)`: 0 for the root, `depth(parent) + 1` otherwise; the RoPE position of node `i` is
//!   `prefix_len + depth(i)`;
//! - the **ancestor bitmask** of every node: bit `j` of node `i` is set iff `j` is an ancestor of
//!   `i` or `i` itself, i.e. iff node `i` may attend to node `j`. Rows are `words_per_node()`
//!   `u64`s (one word up to 64 nodes, more beyond), built as `anc[i] = anc[parent(i)] | bit(i)`;
//! - children lists in CSR form, children in increasing index order.
//!
//! The prefix (tokens already in the KV cache) is visible to every node and is not part of the
//! tree; masks are therefore only `n × n` bits, never `n × (prefix + n)`.

use crate::error::{KernelError, Result};

/// Bits in one ancestor-mask word.
pub const MASK_WORD_BITS: usize = 64;

/// A validated token tree (or chain) of `len()` nodes with derived depths, ancestor masks and
/// children lists. Immutable once built; cheap to clone for small trees.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TreeTopology {
    parents: Vec<Option<usize>>,
    depths: Vec<usize>,
    words_per_node: usize,
    ancestor_words: Vec<u64>,
    child_offsets: Vec<usize>,
    child_nodes: Vec<usize>,
}

impl TreeTopology {
    /// Builds a tree from a parent array: `parents[0]` must be `None` (the root) and, for
    /// `i > 0`, `parents[i]` must be `Some(p)` with `p < i`. An empty array gives the empty tree.
    ///
    /// # Errors
    /// [`KernelError::InvalidTree`] naming the first node that breaks the rule.
    pub fn from_parents(parents: &[Option<usize>]) -> Result<Self> {
        for (node, parent) in parents.iter().enumerate() {
            match (node, parent) {
                (0, None) => {}
                (0, Some(p)) => {
                    return Err(KernelError::InvalidTree {
                        node,
                        reason: format!("the root must have no parent, found parent {p}"),
                    })
                }
                (_, None) => {
                    return Err(KernelError::InvalidTree {
                        node,
                        reason: "only node 0 may be a root".to_string(),
                    })
                }
                (_, Some(p)) if *p >= node => {
                    return Err(KernelError::InvalidTree {
                        node,
                        reason: format!("parent {p} does not precede the node (topological order)"),
                    })
                }
                _ => {}
            }
        }
        let len = parents.len();
        let words_per_node = len.div_ceil(MASK_WORD_BITS).max(1);
        let mut depths = vec![0usize; len];
        let mut ancestor_words = vec![0u64; len * words_per_node];
        for node in 0..len {
            if let Some(parent) = parents[node] {
                depths[node] = depths[parent] + 1;
                let (before, from_node) = ancestor_words.split_at_mut(node * words_per_node);
                let parent_row = &before[parent * words_per_node..(parent + 1) * words_per_node];
                from_node[..words_per_node].copy_from_slice(parent_row);
            }
            ancestor_words[node * words_per_node + node / MASK_WORD_BITS] |=
                1u64 << (node % MASK_WORD_BITS);
        }
        let mut child_counts = vec![0usize; len + 1];
        for parent in parents.iter().flatten() {
            child_counts[*parent + 1] += 1;
        }
        let mut child_offsets = child_counts;
        for i in 1..child_offsets.len() {
            child_offsets[i] += child_offsets[i - 1];
        }
        let mut fill = child_offsets.clone();
        let mut child_nodes = vec![0usize; len.saturating_sub(1)];
        for (node, parent) in parents.iter().enumerate() {
            if let Some(parent) = parent {
                child_nodes[fill[*parent]] = node;
                fill[*parent] += 1;
            }
        }
        Ok(Self {
            parents: parents.to_vec(),
            depths,
            words_per_node,
            ancestor_words,
            child_offsets,
            child_nodes,
        })
    }

    /// A chain of `len` nodes (`parent(i) = i - 1`): the shape of a prefill chunk or a linear draft.
    pub fn chain(len: usize) -> Self {
        let parents: Vec<Option<usize>> = (0..len).map(|i| i.checked_sub(1)).collect();
        Self::from_parents(&parents).expect("a chain is always a valid tree")
    }

    /// Number of nodes.
    pub fn len(&self) -> usize {
        self.parents.len()
    }

    /// True for the tree with no nodes.
    pub fn is_empty(&self) -> bool {
        self.parents.is_empty()
    }

    /// The parent array this tree was built from.
    pub fn parents(&self) -> &[Option<usize>] {
        &self.parents
    }

    /// Parent of `node` (`None` for the root). Panics if `node >= len()`.
    pub fn parent(&self, node: usize) -> Option<usize> {
        self.parents[node]
    }

    /// Depth of `node`: 0 for the root. Its RoPE position is `prefix_len + depth(node)`.
    pub fn depth(&self, node: usize) -> usize {
        self.depths[node]
    }

    /// Depths of all nodes, indexed by node.
    pub fn depths(&self) -> &[usize] {
        &self.depths
    }

    /// Largest depth (0 for a single node or the empty tree).
    pub fn max_depth(&self) -> usize {
        self.depths.iter().copied().max().unwrap_or(0)
    }

    /// Children of `node` in increasing index order.
    pub fn children(&self, node: usize) -> &[usize] {
        &self.child_nodes[self.child_offsets[node]..self.child_offsets[node + 1]]
    }

    /// True if every node has at most one child (a chain, or a prefill chunk).
    pub fn is_chain(&self) -> bool {
        self.parents
            .iter()
            .enumerate()
            .all(|(node, parent)| node == 0 || *parent == Some(node - 1))
    }

    /// `u64` words in one ancestor-mask row: `ceil(len / 64)`, at least 1.
    pub fn words_per_node(&self) -> usize {
        self.words_per_node
    }

    /// Ancestor mask of `node` (bit `j` set iff `j` is an ancestor of `node` or `node` itself).
    pub fn ancestor_mask(&self, node: usize) -> &[u64] {
        &self.ancestor_words[node * self.words_per_node..(node + 1) * self.words_per_node]
    }

    /// All ancestor masks, row-major `[len × words_per_node]`: the layout kernels consume.
    pub fn ancestor_words(&self) -> &[u64] {
        &self.ancestor_words
    }

    /// True iff `node` may attend to `other`: `other` is an ancestor of `node` or `node` itself.
    pub fn sees(&self, node: usize, other: usize) -> bool {
        self.ancestor_mask(node)[other / MASK_WORD_BITS] >> (other % MASK_WORD_BITS) & 1 == 1
    }

    /// Nodes from the root down to `node`, inclusive (length `depth(node) + 1`).
    pub fn path_to(&self, node: usize) -> Vec<usize> {
        let mut path = Vec::with_capacity(self.depths[node] + 1);
        let mut current = Some(node);
        while let Some(n) = current {
            path.push(n);
            current = self.parents[n];
        }
        path.reverse();
        path
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Random valid parent arrays of 0..=n nodes.
    fn parent_arrays(max_len: usize) -> impl Strategy<Value = Vec<Option<usize>>> {
        (0..=max_len).prop_flat_map(|len| {
            let choices: Vec<BoxedStrategy<Option<usize>>> = (0..len)
                .map(|i| {
                    if i == 0 {
                        Just(None).boxed()
                    } else {
                        (0..i).prop_map(Some).boxed()
                    }
                })
                .collect();
            choices
        })
    }

    #[test]
    fn chain_is_causal() {
        let chain = TreeTopology::chain(5);
        assert!(chain.is_chain());
        for i in 0..5 {
            assert_eq!(chain.depth(i), i);
            for j in 0..5 {
                assert_eq!(chain.sees(i, j), j <= i, "node {i} vs {j}");
            }
        }
        assert_eq!(chain.children(2), &[3]);
        assert!(chain.children(4).is_empty());
    }

    #[test]
    fn rejects_bad_parent_arrays() {
        let err = TreeTopology::from_parents(&[None, Some(1)]).unwrap_err();
        assert!(
            matches!(err, KernelError::InvalidTree { node: 1, .. }),
            "{err}"
        );
        let err = TreeTopology::from_parents(&[Some(0)]).unwrap_err();
        assert!(
            matches!(err, KernelError::InvalidTree { node: 0, .. })
                && err.to_string().contains("the root must have no parent"),
            "{err}"
        );
        let err = TreeTopology::from_parents(&[None, Some(0), None]).unwrap_err();
        assert!(
            matches!(err, KernelError::InvalidTree { node: 2, .. }),
            "{err}"
        );
    }

    #[test]
    fn empty_tree() {
        let empty = TreeTopology::from_parents(&[]).unwrap();
        assert!(empty.is_empty());
        assert_eq!(empty.max_depth(), 0);
        assert_eq!(empty.words_per_node(), 1);
    }

    #[test]
    fn masks_span_several_words_beyond_64_nodes() {
        let chain = TreeTopology::chain(130);
        assert_eq!(chain.words_per_node(), 3);
        assert!(chain.sees(129, 0) && chain.sees(129, 64) && chain.sees(129, 128));
        assert!(!chain.sees(64, 65));
    }

    proptest! {
        #[test]
        fn masks_match_parent_walks(parents in parent_arrays(80)) {
            let tree = TreeTopology::from_parents(&parents).unwrap();
            for node in 0..tree.len() {
                let path = tree.path_to(node);
                prop_assert_eq!(path.len(), tree.depth(node) + 1);
                prop_assert_eq!(path[0], 0);
                for other in 0..tree.len() {
                    prop_assert_eq!(tree.sees(node, other), path.contains(&other));
                }
                for &child in tree.children(node) {
                    prop_assert_eq!(tree.parent(child), Some(node));
                }
            }
            let child_total: usize = (0..tree.len()).map(|n| tree.children(n).len()).sum();
            prop_assert_eq!(child_total, tree.len().saturating_sub(1));
        }
    }
}
