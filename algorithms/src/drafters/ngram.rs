//! N-gram / prompt-lookup drafting: propose what followed the most recent earlier occurrence of
//! the context's longest matching suffix.
//!
//! The context is prompt + output so far. For `n` from `max_n` down to `min_n`, the last `n`
//! tokens are searched for earlier in the context (most recent occurrence first); the tokens that
//! followed an occurrence are its *continuation*. A chain draft is the continuation of the best
//! match; a tree draft merges the continuations of several matches into a trie (earlier-found
//! matches get the lower ranks). Everything is deterministic: the draft tokens are not sampled,
//! so they pair with verifiers for deterministic drafts (greedy, target-only).

use specdec_kernels::sampling::{Decisions, Prob};
use specdec_kernels::verification::{DraftKind, DraftTree};

use crate::drafters::{DraftRequest, Drafter};
use crate::error::{ensure_param, Result};
use crate::policy::Budget;
use crate::trees::TreeShape;

/// Matching parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NgramConfig {
    /// Longest suffix tried (`≥ min_n`).
    pub max_n: usize,
    /// Shortest suffix accepted as a match (`≥ 1`).
    pub min_n: usize,
    /// Most occurrences merged into a tree draft (`≥ 1`).
    pub max_matches: usize,
}

impl Default for NgramConfig {
    /// `max_n = 4`, `min_n = 1`, `max_matches = 4`.
    fn default() -> Self {
        Self {
            max_n: 4,
            min_n: 1,
            max_matches: 4,
        }
    }
}

impl NgramConfig {
    /// Checks `1 ≤ min_n ≤ max_n` and `max_matches ≥ 1`.
    ///
    /// # Errors
    /// [`crate::AlgorithmError::InvalidParameter`] naming the bad field.
    pub fn validate(&self) -> Result<()> {
        ensure_param(
            1 <= self.min_n && self.min_n <= self.max_n,
            "min_n/max_n",
            format!(
                "need 1 ≤ min_n ≤ max_n, got {} and {}",
                self.min_n, self.max_n
            ),
        )?;
        ensure_param(self.max_matches >= 1, "max_matches", "must be at least 1")
    }
}

/// One occurrence of the context's suffix and what followed it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NgramMatch {
    /// Length of the matched suffix.
    pub n: usize,
    /// Index in the context where the occurrence starts.
    pub start: usize,
    /// The tokens that followed the occurrence (at most the requested length, at least 1).
    pub continuation: Vec<u32>,
}

/// Finds up to `cfg.max_matches` occurrences of the context's suffix, longest suffix first, then
/// most recent first, each with up to `max_len` continuation tokens. Occurrences whose
/// continuation repeats an earlier match's continuation exactly are skipped. Empty if
/// `max_len == 0` or nothing matches.
pub fn find_matches(context: &[u32], cfg: &NgramConfig, max_len: usize) -> Vec<NgramMatch> {
    let mut matches: Vec<NgramMatch> = Vec::new();
    let len = context.len();
    if max_len == 0 {
        return matches;
    }
    for n in (cfg.min_n..=cfg.max_n).rev() {
        if n >= len {
            continue;
        }
        let suffix = &context[len - n..];
        // Occurrences must end before the last token so at least one token follows them.
        for start in (0..len - n).rev() {
            if &context[start..start + n] != suffix {
                continue;
            }
            let from = start + n;
            let continuation = context[from..(from + max_len).min(len)].to_vec();
            if matches.iter().any(|m| m.continuation == continuation) {
                continue;
            }
            matches.push(NgramMatch {
                n,
                start,
                continuation,
            });
            if matches.len() >= cfg.max_matches {
                return matches;
            }
        }
    }
    matches
}

/// The chain draft: the continuation (at most `k` tokens) of the best match — longest suffix,
/// most recent occurrence. Empty if nothing matches.
pub fn ngram_chain(context: &[u32], cfg: &NgramConfig, k: usize) -> Vec<u32> {
    let one = NgramConfig {
        max_matches: 1,
        ..*cfg
    };
    find_matches(context, &one, k)
        .into_iter()
        .next()
        .map(|m| m.continuation)
        .unwrap_or_default()
}

/// A deterministic draft tree: its shape and the token at every node (`tokens[0]` is the root,
/// the context's last token).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenTree {
    /// The shape (ranks: order in which a node's children were first proposed).
    pub shape: TreeShape,
    /// Token at every node, indexed by node.
    pub tokens: Vec<u32>,
}

/// The tree draft: the continuations of up to `cfg.max_matches` matches (each at most
/// `max_depth` tokens) merged into a trie in match order ([`merge_continuations`]), stopping at
/// `max_nodes` draft nodes. A root-only tree if nothing matches or the context is empty (root
/// token 0 then).
pub fn ngram_tree(
    context: &[u32],
    cfg: &NgramConfig,
    max_nodes: usize,
    max_depth: usize,
) -> TokenTree {
    let root = context.last().copied().unwrap_or(0);
    let matches = find_matches(context, cfg, max_depth);
    merge_continuations(root, matches.iter().map(|m| &m.continuation[..]), max_nodes)
}

/// The trie of `continuations` below `root`, merged in the order given (a node's children are
/// ranked by when they were first proposed), stopping at `max_nodes` draft nodes. Sibling
/// tokens are distinct.
pub fn merge_continuations<'c>(
    root: u32,
    continuations: impl IntoIterator<Item = &'c [u32]>,
    max_nodes: usize,
) -> TokenTree {
    let mut parents: Vec<Option<usize>> = vec![None];
    let mut ranks = vec![0usize];
    let mut tokens = vec![root];
    let mut child_count = vec![0usize];
    'continuations: for continuation in continuations {
        let mut node = 0;
        for &token in continuation {
            let existing =
                (node + 1..tokens.len()).find(|&c| parents[c] == Some(node) && tokens[c] == token);
            node = match existing {
                Some(c) => c,
                None => {
                    if tokens.len() > max_nodes {
                        break 'continuations;
                    }
                    parents.push(Some(node));
                    ranks.push(child_count[node]);
                    child_count[node] += 1;
                    child_count.push(0);
                    tokens.push(token);
                    tokens.len() - 1
                }
            };
        }
    }
    // Nodes were appended after their parents, so the order is topological.
    let shape =
        TreeShape::new(&parents, &ranks).expect("a trie built parent-first is a valid tree");
    TokenTree { shape, tokens }
}

/// The deterministic draft for `budget` of a lookup drafter whose `continuations(max_len,
/// max_matches)` lists up to `max_matches` continuations of at most `max_len` tokens, best
/// first: [`Budget::Chain`]`(k)` the best one (≤ `k` tokens); [`Budget::TreeNodes`]`(n)` the
/// trie of up to `tree_matches` of depth ≤ `max_depth`, at most `n` nodes; [`Budget::Tree`] the
/// shape's node count and depth (not its exact shape); [`Budget::Plain`] the root alone.
pub(crate) fn lookup_tree(
    root: u32,
    budget: &Budget,
    max_depth: usize,
    tree_matches: usize,
    mut continuations: impl FnMut(usize, usize) -> Vec<Vec<u32>>,
) -> TokenTree {
    let (max_nodes, max_len, count) = match budget {
        Budget::Plain => (0, 0, 0),
        Budget::Chain(k) => (*k, *k, 1),
        Budget::TreeNodes(n) => (*n, max_depth, tree_matches),
        Budget::Tree(shape) => (shape.drafts(), shape.max_depth(), tree_matches),
    };
    let found = match max_len.min(count) {
        0 => Vec::new(),
        _ => continuations(max_len, count),
    };
    merge_continuations(root, found.iter().map(Vec::as_slice), max_nodes)
}

/// A lookup drafter's [`DraftTree`] of `tokens` (no `q`: the draft is deterministic).
///
/// # Errors
/// As [`DraftTree::new`].
pub(crate) fn deterministic_tree<N: Prob>(tree: TokenTree) -> Result<DraftTree<N>> {
    let TokenTree { shape, tokens } = tree;
    let probs = vec![None; tokens.len()];
    Ok(DraftTree::new(
        shape.topology().clone(),
        tokens,
        probs,
        DraftKind::Deterministic,
    )?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const CFG: NgramConfig = NgramConfig {
        max_n: 3,
        min_n: 1,
        max_matches: 3,
    };

    #[test]
    fn longest_suffix_most_recent_occurrence() {
        // "a b c d | a b c e | x b c" → suffix "b c" (n=2) occurs at 5 (→ e) and 1 (→ d).
        let ctx = [1, 2, 3, 4, 1, 2, 3, 5, 9, 2, 3];
        let m = find_matches(&ctx, &CFG, 2);
        assert_eq!(
            m[0],
            NgramMatch {
                n: 2,
                start: 5,
                continuation: vec![5, 9]
            }
        );
        assert_eq!(
            m[1],
            NgramMatch {
                n: 2,
                start: 1,
                continuation: vec![4, 1]
            }
        );
        assert_eq!(m.len(), 2); // "3" alone occurs at 6 and 2, repeating those continuations
        assert_eq!(ngram_chain(&ctx, &CFG, 4), vec![5, 9, 2, 3]);
        assert!(ngram_chain(&[1, 2, 3], &CFG, 4).is_empty());
        assert!(ngram_chain(&[], &CFG, 4).is_empty());
        assert!(ngram_chain(&ctx, &CFG, 0).is_empty());
    }

    #[test]
    fn repetition_runs_into_the_suffix() {
        // A run "7 7 7": the suffix "7 7" occurs at 0 and its continuation is "7".
        assert_eq!(ngram_chain(&[7, 7, 7], &CFG, 5), vec![7]);
    }

    #[test]
    fn tree_merges_shared_prefixes() {
        // suffix "1 2" (n=2) followed by "3 4" at 0, "3 5" at 5, "6" at 10.
        let ctx = [1, 2, 3, 4, 0, 1, 2, 3, 5, 0, 1, 2, 6, 0, 1, 2];
        let tree = ngram_tree(&ctx, &CFG, 16, 2);
        // Matches (most recent first): [6,0], [3,5], [3,4].
        // Nodes are numbered in insertion order (match by match).
        assert_eq!(tree.tokens, vec![2, 6, 0, 3, 5, 4]);
        assert_eq!(
            tree.shape.topology().parents(),
            &[None, Some(0), Some(1), Some(0), Some(3), Some(3)]
        );
        assert_eq!(tree.shape.ranks(), &[0, 0, 0, 1, 0, 1]);
        let small = ngram_tree(&ctx, &CFG, 3, 2);
        assert_eq!(small.shape.drafts(), 3);
        let none = ngram_tree(&[1, 2, 3], &CFG, 8, 4);
        assert_eq!(none.shape.drafts(), 0);
        assert_eq!(none.tokens, vec![3]);
    }

    #[test]
    fn config_validation() {
        assert!(NgramConfig::default().validate().is_ok());
        assert!(NgramConfig { min_n: 0, ..CFG }.validate().is_err());
        assert!(NgramConfig { min_n: 4, ..CFG }.validate().is_err());
        assert!(NgramConfig {
            max_matches: 0,
            ..CFG
        }
        .validate()
        .is_err());
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        /// Every proposed continuation really follows an occurrence of the suffix, and the chain
        /// uses the longest suffix that occurs.
        #[test]
        fn matches_are_real(ctx in proptest::collection::vec(0u32..4, 0..40), k in 1usize..6) {
            for m in find_matches(&ctx, &CFG, k) {
                let n = m.n;
                prop_assert_eq!(&ctx[m.start..m.start + n], &ctx[ctx.len() - n..]);
                prop_assert!(!m.continuation.is_empty() && m.continuation.len() <= k);
                prop_assert_eq!(&ctx[m.start + n..m.start + n + m.continuation.len()], &m.continuation[..]);
            }
            let chain = ngram_chain(&ctx, &CFG, k);
            let longest = (CFG.min_n..=CFG.max_n).rev().find(|&n| {
                n < ctx.len() && (0..ctx.len() - n).any(|s| ctx[s..s + n] == ctx[ctx.len() - n..])
            });
            prop_assert_eq!(chain.is_empty(), longest.is_none());
            let tree = ngram_tree(&ctx, &CFG, 12, k);
            prop_assert!(tree.shape.drafts() <= 12 && tree.shape.max_depth() <= k);
            for node in 0..tree.shape.len() {
                let kids = tree.shape.topology().children(node);
                for (i, &a) in kids.iter().enumerate() {
                    prop_assert!(kids[..i].iter().all(|&b| tree.tokens[b] != tree.tokens[a]));
                }
            }
        }
    }
}

/// The n-gram / prompt-lookup drafter: deterministic drafts from the context itself
/// ([`DraftKind::Deterministic`], no `q`; pair it with greedy or target-only verification).
///
/// Budget: [`Budget::Chain`]`(k)` proposes the best match's continuation (≤ `k` tokens);
/// [`Budget::TreeNodes`]`(n)` merges several matches into a trie of ≤ `n` nodes and depth
/// ≤ `max_depth`; [`Budget::Tree`] uses the shape's node count and depth (not its exact shape).
/// With no match the tree is the root only (the step becomes plain decoding).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NgramDrafter {
    config: NgramConfig,
    max_depth: usize,
}

impl NgramDrafter {
    /// A drafter with matching parameters `config` and tree depth limit `max_depth`.
    ///
    /// # Errors
    /// [`crate::AlgorithmError::InvalidParameter`] for a bad config or `max_depth = 0`.
    pub fn new(config: NgramConfig, max_depth: usize) -> Result<Self> {
        config.validate()?;
        ensure_param(max_depth >= 1, "max_depth", "must be at least 1")?;
        Ok(Self { config, max_depth })
    }

    /// The deterministic token tree for `context` under `budget` ([`lookup_tree`] over
    /// [`find_matches`]).
    pub fn token_tree(&self, context: &[u32], budget: &Budget) -> TokenTree {
        let root = context.last().copied().unwrap_or(0);
        let matches = self.config.max_matches;
        lookup_tree(root, budget, self.max_depth, matches, |max_len, count| {
            let config = NgramConfig {
                max_matches: count,
                ..self.config
            };
            find_matches(context, &config, max_len)
                .into_iter()
                .map(|m| m.continuation)
                .collect()
        })
    }
}

impl<N: Prob> Drafter<N> for NgramDrafter {
    fn name(&self) -> String {
        format!(
            "ngram(n∈[{},{}], {} matches)",
            self.config.min_n, self.config.max_n, self.config.max_matches
        )
    }

    fn kind(&self) -> DraftKind {
        DraftKind::Deterministic
    }

    fn propose(
        &mut self,
        request: &DraftRequest<'_>,
        _decisions: &mut dyn Decisions<N>,
    ) -> Result<DraftTree<N>> {
        request.root()?;
        deterministic_tree(self.token_tree(request.context, request.budget))
    }
}
