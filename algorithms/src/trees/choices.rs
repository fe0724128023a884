//! Static tree shapes: from a list of rank paths (the Medusa / EAGLE "choices" format) and k-ary
//! trees.

use crate::error::{AlgorithmError, Result};
use crate::trees::TreeShape;

impl TreeShape {
    /// Builds a shape from rank paths, the Medusa/EAGLE "choices" format: each path lists, from
    /// the root down, which candidate is taken at each depth, e.g. `[[0], [0, 0], [1], [0, 1]]`
    /// is the root's top-1 and top-2 candidates, and the top-1 and top-2 children of the first.
    ///
    /// Every proper prefix of a path must itself be listed (the empty path is the root, implied).
    /// Nodes are numbered breadth first: by depth, then by the path in lexicographic order, so
    /// node `i + 1` is the `i`-th path of the sorted list.
    ///
    /// # Errors
    /// [`AlgorithmError::InvalidTreeShape`] for an empty or duplicated path or a missing prefix.
    pub fn from_choices(paths: &[Vec<usize>]) -> Result<Self> {
        let mut sorted: Vec<&Vec<usize>> = paths.iter().collect();
        sorted.sort_by(|a, b| a.len().cmp(&b.len()).then_with(|| a.cmp(b)));
        let mut parents = vec![None];
        let mut ranks = vec![0];
        for (i, path) in sorted.iter().enumerate() {
            if path.is_empty() {
                return Err(AlgorithmError::InvalidTreeShape {
                    reason: "an empty path (the root is implied, do not list it)".to_string(),
                });
            }
            if i > 0 && sorted[i - 1] == *path {
                return Err(AlgorithmError::InvalidTreeShape {
                    reason: format!("path {path:?} is listed twice"),
                });
            }
            let prefix = &path[..path.len() - 1];
            let parent = if prefix.is_empty() {
                0
            } else {
                // Prefixes are shorter, hence earlier in the sorted order.
                match sorted[..i].binary_search_by(|p| {
                    p.len()
                        .cmp(&prefix.len())
                        .then_with(|| p.as_slice().cmp(prefix))
                }) {
                    Ok(j) => j + 1,
                    Err(_) => {
                        return Err(AlgorithmError::InvalidTreeShape {
                            reason: format!(
                                "path {path:?} is listed but its prefix {prefix:?} is not"
                            ),
                        })
                    }
                }
            };
            parents.push(Some(parent));
            ranks.push(path[path.len() - 1]);
        }
        Self::new(&parents, &ranks)
    }

    /// A tree whose nodes at depth `d` (root = depth 0) each have `branching[d]` children of ranks
    /// `0..branching[d]`; depth `branching.len()` nodes are leaves. Numbered breadth first.
    /// `branching = [k; depth]` is the full k-ary tree; `[1; K]` is a chain of K.
    pub fn from_branching(branching: &[usize]) -> Self {
        let mut parents = vec![None];
        let mut ranks = vec![0];
        let mut level: Vec<usize> = vec![0];
        for &k in branching {
            let mut next = Vec::with_capacity(level.len() * k);
            for &node in &level {
                for rank in 0..k {
                    next.push(parents.len());
                    parents.push(Some(node));
                    ranks.push(rank);
                }
            }
            level = next;
        }
        Self::new(&parents, &ranks).expect("breadth-first construction is a valid tree")
    }

    /// The full `k`-ary tree of the given depth (`k^1 + … + k^depth` draft nodes).
    pub fn k_ary(k: usize, depth: usize) -> Self {
        Self::from_branching(&vec![k; depth])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn choices_round_trip() {
        let paths = vec![
            vec![0],
            vec![0, 0],
            vec![1],
            vec![0, 1],
            vec![1, 0],
            vec![0, 0, 0],
        ];
        let shape = TreeShape::from_choices(&paths).unwrap();
        assert_eq!(shape.drafts(), 6);
        assert_eq!(
            shape.topology().parents(),
            &[None, Some(0), Some(0), Some(1), Some(1), Some(2), Some(3)]
        );
        assert_eq!(shape.ranks(), &[0, 0, 1, 0, 1, 0, 0]);
        let mut back = shape.rank_paths()[1..].to_vec();
        let mut expected = paths.clone();
        back.sort();
        expected.sort();
        assert_eq!(back, expected);
    }

    #[test]
    fn choices_errors() {
        let err = TreeShape::from_choices(&[vec![0, 1]]).unwrap_err();
        assert!(err.to_string().contains("prefix [0]"), "{err}");
        assert!(TreeShape::from_choices(&[vec![0], vec![0]]).is_err());
        assert!(TreeShape::from_choices(&[vec![]]).is_err());
        assert_eq!(TreeShape::from_choices(&[]).unwrap().drafts(), 0);
    }

    #[test]
    fn k_ary_sizes() {
        let t = TreeShape::k_ary(3, 2);
        assert_eq!(t.drafts(), 3 + 9);
        assert_eq!(t.max_depth(), 2);
        assert_eq!(t.topology().children(0).len(), 3);
        assert_eq!(TreeShape::from_branching(&[1, 1, 1]), TreeShape::chain(3));
        assert_eq!(TreeShape::from_branching(&[2, 1]).drafts(), 4);
        // Same shape as from choices in breadth-first order.
        let c = TreeShape::from_choices(&[vec![0], vec![1], vec![0, 0], vec![1, 0]]).unwrap();
        assert_eq!(c, TreeShape::from_branching(&[2, 1]));
    }
}
