//! [`TreeShape`]: a draft-tree shape (the shared [`TreeTopology`]) plus, for every draft node,
//! which candidate of its parent it is (its *rank*).

use specdec_kernels::TreeTopology;

use crate::error::{AlgorithmError, Result};

/// The shape of a draft tree before any token is drawn.
///
/// Node 0 is the root (the last sampled token, not a draft); nodes `1..len()` are draft slots in
/// topological order (parent index < child index). `rank(i)` says which candidate of its parent
/// node `i` is: rank 0 is the parent's most probable draft token, rank 1 the next, and so on.
/// Invariant: siblings have distinct ranks. The root's rank is 0 by convention and means nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TreeShape {
    topology: TreeTopology,
    ranks: Vec<usize>,
}

impl TreeShape {
    /// Builds a shape from a parent array (see [`TreeTopology::from_parents`]) and one rank per
    /// node (`ranks.len() == parents.len()`, `ranks[0]` ignored).
    ///
    /// # Errors
    /// [`AlgorithmError::Kernel`] for a bad parent array; [`AlgorithmError::InvalidTreeShape`]
    /// for an empty tree, a length mismatch, or two siblings with the same rank.
    pub fn new(parents: &[Option<usize>], ranks: &[usize]) -> Result<Self> {
        let topology = TreeTopology::from_parents(parents)?;
        Self::from_topology(topology, ranks)
    }

    /// Builds a shape from an already validated topology and one rank per node.
    ///
    /// # Errors
    /// As [`TreeShape::new`].
    pub fn from_topology(topology: TreeTopology, ranks: &[usize]) -> Result<Self> {
        if topology.is_empty() {
            return Err(AlgorithmError::InvalidTreeShape {
                reason: "a draft tree needs at least its root node".to_string(),
            });
        }
        if ranks.len() != topology.len() {
            return Err(AlgorithmError::InvalidTreeShape {
                reason: format!(
                    "{} ranks given for a tree of {} nodes",
                    ranks.len(),
                    topology.len()
                ),
            });
        }
        for node in 0..topology.len() {
            let children = topology.children(node);
            for (i, &a) in children.iter().enumerate() {
                if let Some(&b) = children[i + 1..].iter().find(|&&b| ranks[b] == ranks[a]) {
                    return Err(AlgorithmError::InvalidTreeShape {
                        reason: format!(
                            "nodes {a} and {b} are both rank {} children of node {node}",
                            ranks[a]
                        ),
                    });
                }
            }
        }
        let mut ranks = ranks.to_vec();
        ranks[0] = 0;
        Ok(Self { topology, ranks })
    }

    /// A chain of `drafts` draft nodes below the root, every one the rank-0 candidate.
    pub fn chain(drafts: usize) -> Self {
        Self {
            topology: TreeTopology::chain(drafts + 1),
            ranks: vec![0; drafts + 1],
        }
    }

    /// The topology (parent array, depths, masks, children).
    pub fn topology(&self) -> &TreeTopology {
        &self.topology
    }

    /// Number of nodes, root included (`drafts() + 1`).
    pub fn len(&self) -> usize {
        self.topology.len()
    }

    /// Always false: a shape has at least its root. Present for clippy's `len_without_is_empty`.
    pub fn is_empty(&self) -> bool {
        self.topology.is_empty()
    }

    /// Number of draft nodes (`len() - 1`).
    pub fn drafts(&self) -> usize {
        self.topology.len() - 1
    }

    /// Rank of `node` among its parent's candidates (0 for the root). Panics if out of range.
    pub fn rank(&self, node: usize) -> usize {
        self.ranks[node]
    }

    /// Ranks of all nodes, indexed by node.
    pub fn ranks(&self) -> &[usize] {
        &self.ranks
    }

    /// Depth of the deepest draft node (0 for a root-only tree): the number of draft forward
    /// passes a level-by-level drafter needs.
    pub fn max_depth(&self) -> usize {
        self.topology.max_depth()
    }

    /// The path of each node as ranks from the root (the root's path is empty): the inverse of
    /// [`TreeShape::from_choices`](crate::trees::TreeShape::from_choices).
    pub fn rank_paths(&self) -> Vec<Vec<usize>> {
        (0..self.len())
            .map(|node| {
                self.topology
                    .path_to(node)
                    .into_iter()
                    .skip(1)
                    .map(|n| self.ranks[n])
                    .collect()
            })
            .collect()
    }

    /// The child of `node` with rank `rank`, if the shape has one.
    pub fn child_with_rank(&self, node: usize, rank: usize) -> Option<usize> {
        self.topology
            .children(node)
            .iter()
            .copied()
            .find(|&c| self.ranks[c] == rank)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_duplicate_sibling_ranks_and_mismatches() {
        let err = TreeShape::new(&[None, Some(0), Some(0)], &[0, 1, 1]).unwrap_err();
        assert!(err.to_string().contains("rank 1"), "{err}");
        let err = TreeShape::new(&[None, Some(0)], &[0]).unwrap_err();
        assert!(err.to_string().contains("1 ranks"), "{err}");
        assert!(TreeShape::new(&[], &[]).is_err());
        assert!(TreeShape::new(&[None, Some(1)], &[0, 0]).is_err());
    }

    #[test]
    fn chain_shape() {
        let chain = TreeShape::chain(3);
        assert_eq!(chain.drafts(), 3);
        assert_eq!(chain.max_depth(), 3);
        assert_eq!(chain.rank_paths()[3], vec![0, 0, 0]);
        assert_eq!(chain.child_with_rank(1, 0), Some(2));
        assert_eq!(chain.child_with_rank(1, 1), None);
    }
}
