//! The draft model abstraction drafters are written against, and small helpers.

use specdec_kernels::sampling::{Decisions, DrawKey, Prob};

use crate::drafters::DraftFeedback;
use crate::error::Result;

/// Anything that gives a next-token distribution for a token sequence: toy tables in tests, a
/// real draft model, the target with layers skipped, a head drafting from the target's features.
///
/// Queries name the `sequence` they draft for ([`crate::drafters::DraftRequest::sequence`]): a
/// model keeping per-sequence state (a KV cache, the target's features) serves each from its
/// own, told what the target committed through [`DraftModel::observe`].
pub trait DraftModel<N> {
    /// Vocabulary size: the length of every returned distribution.
    fn vocab(&self) -> usize;
    /// The next-token distribution for `sequence` after `tokens` (the sequence's context
    /// followed by the draft path), after temperature / top-k / top-p; `vocab()` entries summing
    /// to 1.
    ///
    /// # Errors
    /// Whatever the model reports (e.g. a context longer than it supports).
    fn next_probs(&mut self, sequence: u64, tokens: &[u32]) -> Result<Vec<N>>;

    /// The sequence's state after admission or a step ([`DraftFeedback`]). Default: ignore.
    ///
    /// # Errors
    /// The model's errors.
    fn observe(&mut self, feedback: &DraftFeedback<'_>) -> Result<()> {
        let _ = feedback;
        Ok(())
    }

    /// The sequence retired. Default: nothing kept.
    ///
    /// # Errors
    /// The model's errors.
    fn release(&mut self, sequence: u64) -> Result<()> {
        let _ = sequence;
        Ok(())
    }

    /// Whether the model reads the target's features ([`DraftFeedback::features`]).
    fn wants_features(&self) -> bool {
        false
    }

    /// The next-token distributions after each of the last `count` prefixes of `tokens`: row
    /// `i` (of `count`) is `next_probs(sequence, &tokens[..tokens.len() - count + 1 + i])`, the last row
    /// the distribution after all of `tokens`. A drafter checking a whole chain (the staged
    /// drafter's level 1) asks for its rows at once, and a model that forwards a chain in one
    /// pass answers with one pass instead of `count` (the rows must be the ones `next_probs`
    /// gives, which batch-invariant models guarantee). The default calls
    /// [`DraftModel::next_probs`] per prefix.
    ///
    /// # Errors
    /// [`AlgorithmError::InvalidParameter`](crate::AlgorithmError::InvalidParameter) when
    /// `count` is 0 or exceeds `tokens.len()`; whatever the model reports.
    fn next_probs_along(
        &mut self,
        sequence: u64,
        tokens: &[u32],
        count: usize,
    ) -> Result<Vec<Vec<N>>> {
        check_along(tokens, count)?;
        let first = tokens.len() + 1 - count;
        (first..=tokens.len())
            .map(|end| self.next_probs(sequence, &tokens[..end]))
            .collect()
    }

    /// The next-token distributions of several sequences at once: row `i` is
    /// `next_probs(queries[i].0, queries[i].1)`. The sequences must differ. A drafter drafting
    /// for a whole batch asks for one depth of every sequence's draft at once, and a model that
    /// forwards several sequences in one pass answers with one pass instead of one per sequence
    /// (the rows must be the ones `next_probs` gives, which batch-invariant models guarantee).
    /// The default calls [`DraftModel::next_probs`] per query.
    ///
    /// # Errors
    /// [`AlgorithmError::InvalidParameter`](crate::AlgorithmError::InvalidParameter) when a
    /// sequence appears twice ([`check_distinct`]); whatever the model reports.
    fn next_probs_batch(&mut self, queries: &[(u64, &[u32])]) -> Result<Vec<Vec<N>>> {
        check_distinct(queries.iter().map(|(sequence, _)| *sequence))?;
        queries
            .iter()
            .map(|(sequence, tokens)| self.next_probs(*sequence, tokens))
            .collect()
    }

    /// The next-token distributions after `context` followed by each of `paths`: row `i` is
    /// `next_probs(sequence, context ++ paths[i])` (an empty path: after the context itself). A drafter
    /// growing a tree asks for a whole depth of it at once, and a model that forwards a token
    /// tree in one pass answers with one pass instead of one per path (the rows must be the
    /// ones `next_probs` gives, which batch-invariant models guarantee). The default calls
    /// [`DraftModel::next_probs`] per path.
    ///
    /// # Errors
    /// Whatever the model reports (e.g. an empty context, a context longer than it supports).
    fn next_probs_paths(
        &mut self,
        sequence: u64,
        context: &[u32],
        paths: &[Vec<u32>],
    ) -> Result<Vec<Vec<N>>> {
        paths
            .iter()
            .map(|path| {
                let mut tokens = context.to_vec();
                tokens.extend_from_slice(path);
                self.next_probs(sequence, &tokens)
            })
            .collect()
    }

    /// [`DraftModel::next_probs_paths`] for several sequences at once: answer `i` is
    /// `next_probs_paths(queries[i].sequence, queries[i].context, queries[i].paths)`. The
    /// sequences must differ. Tree drafters drafting for a whole batch ask for one depth of
    /// every sequence's tree at once, and a model that forwards several token trees in one pass
    /// answers with one pass (the rows must be the ones `next_probs_paths` gives, which
    /// batch-invariant models guarantee). The default answers one query after another.
    ///
    /// # Errors
    /// A sequence appearing twice ([`check_distinct`]); as [`DraftModel::next_probs_paths`].
    fn next_probs_paths_batch(&mut self, queries: &[PathsQuery<'_>]) -> Result<Vec<Vec<Vec<N>>>> {
        check_distinct(queries.iter().map(|q| q.sequence))?;
        queries
            .iter()
            .map(|q| self.next_probs_paths(q.sequence, q.context, q.paths))
            .collect()
    }
}

/// One sequence's query of [`DraftModel::next_probs_paths_batch`]: the distributions after
/// `context ++ path` for each of `paths`.
#[derive(Debug, Clone, Copy)]
pub struct PathsQuery<'a> {
    /// The drafted-for sequence.
    pub sequence: u64,
    /// Its context (non-empty).
    pub context: &'a [u32],
    /// The paths below the context's last token.
    pub paths: &'a [Vec<u32>],
}

/// The precondition of a batched query ([`DraftModel::next_probs_batch`],
/// [`Drafter::propose_batch`](crate::drafters::Drafter::propose_batch)): every sequence at most
/// once, since one pass holds one path per sequence.
///
/// # Errors
/// [`AlgorithmError::InvalidParameter`](crate::AlgorithmError::InvalidParameter) naming the
/// repeated sequence.
pub fn check_distinct(sequences: impl IntoIterator<Item = u64>) -> Result<()> {
    let mut seen = std::collections::HashSet::new();
    for sequence in sequences {
        if !seen.insert(sequence) {
            return Err(crate::AlgorithmError::InvalidParameter {
                name: "sequence",
                reason: format!("sequence {sequence} appears twice in one batched draft"),
            });
        }
    }
    Ok(())
}

/// The preconditions of [`DraftModel::next_probs_along`]: `1 ≤ count ≤ tokens.len()`.
///
/// # Errors
/// [`AlgorithmError::InvalidParameter`](crate::AlgorithmError::InvalidParameter) naming `count`.
pub fn check_along(tokens: &[u32], count: usize) -> Result<()> {
    if count == 0 || count > tokens.len() {
        return Err(crate::AlgorithmError::InvalidParameter {
            name: "count",
            reason: format!(
                "rows along a path of {} tokens: between 1 and the path length, got {count}",
                tokens.len()
            ),
        });
    }
    Ok(())
}

/// A stateless [`DraftModel`] from a closure of the context (handy for toy tables:
/// `|ctx| toy.next_probs_as(ctx)`); the sequence does not matter to it.
pub struct FnModel<F> {
    vocab: usize,
    f: F,
}

impl<F> FnModel<F> {
    /// A model of `vocab` tokens whose distributions `f` computes.
    pub fn new(vocab: usize, f: F) -> Self {
        Self { vocab, f }
    }
}

impl<N, F: FnMut(&[u32]) -> Vec<N>> DraftModel<N> for FnModel<F> {
    fn vocab(&self) -> usize {
        self.vocab
    }

    fn next_probs(&mut self, _sequence: u64, tokens: &[u32]) -> Result<Vec<N>> {
        Ok((self.f)(tokens))
    }
}

impl<N, M: DraftModel<N> + ?Sized> DraftModel<N> for &mut M {
    fn vocab(&self) -> usize {
        (**self).vocab()
    }

    fn next_probs(&mut self, sequence: u64, tokens: &[u32]) -> Result<Vec<N>> {
        (**self).next_probs(sequence, tokens)
    }

    fn next_probs_along(
        &mut self,
        sequence: u64,
        tokens: &[u32],
        count: usize,
    ) -> Result<Vec<Vec<N>>> {
        (**self).next_probs_along(sequence, tokens, count)
    }

    fn next_probs_paths(
        &mut self,
        sequence: u64,
        context: &[u32],
        paths: &[Vec<u32>],
    ) -> Result<Vec<Vec<N>>> {
        (**self).next_probs_paths(sequence, context, paths)
    }

    fn next_probs_batch(&mut self, queries: &[(u64, &[u32])]) -> Result<Vec<Vec<N>>> {
        (**self).next_probs_batch(queries)
    }

    fn next_probs_paths_batch(&mut self, queries: &[PathsQuery<'_>]) -> Result<Vec<Vec<Vec<N>>>> {
        (**self).next_probs_paths_batch(queries)
    }

    fn observe(&mut self, feedback: &DraftFeedback<'_>) -> Result<()> {
        (**self).observe(feedback)
    }

    fn release(&mut self, sequence: u64) -> Result<()> {
        (**self).release(sequence)
    }

    fn wants_features(&self) -> bool {
        (**self).wants_features()
    }
}

/// The first `count` token ids by decreasing probability, ties to the lower id, zero-probability
/// tokens after the others (in id order); all of them when the vocabulary is smaller. One pass
/// over `q` keeping the best `count` so far: a drafter expanding a node into a few children pays
/// O(vocabulary), not a sort of the whole vocabulary, per node.
pub fn ranked_tokens<N: Prob>(q: &[N], count: usize) -> Vec<u32> {
    let above = |a: &N, b: &N| a.partial_cmp(b) == Some(std::cmp::Ordering::Greater);
    let mut top: Vec<u32> = Vec::with_capacity(count + 1);
    for (id, p) in q.iter().enumerate() {
        // ids come in increasing order, so an equal probability never moves ahead
        if top.len() == count && top.last().is_none_or(|&last| !above(p, &q[last as usize])) {
            continue;
        }
        let at = top
            .iter()
            .position(|&t| above(p, &q[t as usize]))
            .unwrap_or(top.len());
        top.insert(at, id as u32);
        top.truncate(count);
    }
    top
}

/// Bit position of the namespace in [`DrawKey::draw`].
const NAMESPACE_SHIFT: u32 = 20;

/// A [`Decisions`] view that moves every key into namespace `ns` (`draw + ns · 2^20`), so that
/// several stages deciding about the same node in the same step (a staged drafter's levels and
/// the target's verifier) draw independent randomness. Namespace 0 is the identity.
pub struct Namespaced<'a, N> {
    inner: &'a mut dyn Decisions<N>,
    namespace: u32,
}

impl<'a, N> Namespaced<'a, N> {
    /// Wraps `inner`, moving keys into `namespace` (`< 16`, so that draws stay below `2^24`).
    pub fn new(inner: &'a mut dyn Decisions<N>, namespace: u32) -> Self {
        assert!(namespace < 16, "namespace {namespace} must be < 16");
        Self { inner, namespace }
    }

    fn key(&self, key: DrawKey) -> DrawKey {
        DrawKey {
            draw: key.draw + (self.namespace << NAMESPACE_SHIFT),
            ..key
        }
    }
}

impl<N> Decisions<N> for Namespaced<'_, N> {
    fn accept(&mut self, key: DrawKey, p_target: &N, q_draft: &N) -> bool {
        let key = self.key(key);
        self.inner.accept(key, p_target, q_draft)
    }

    fn categorical(&mut self, key: DrawKey, weights: &[N]) -> Option<usize> {
        let key = self.key(key);
        self.inner.categorical(key, weights)
    }

    fn uniform(&mut self, key: DrawKey) -> f64 {
        let key = self.key(key);
        self.inner.uniform(key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranking_ties_and_zeros() {
        assert_eq!(ranked_tokens(&[0.25, 0.0, 0.5, 0.25], 4), vec![2, 0, 3, 1]);
        assert_eq!(ranked_tokens(&[0.25, 0.0, 0.5, 0.25], 9), vec![2, 0, 3, 1]);
        assert_eq!(ranked_tokens(&[0.25, 0.0, 0.5, 0.25], 2), vec![2, 0]);
        assert_eq!(ranked_tokens(&[0.25, 0.0, 0.5, 0.25], 0), Vec::<u32>::new());
        assert_eq!(ranked_tokens::<f64>(&[], 3), Vec::<u32>::new());
    }

    #[test]
    fn ranking_is_the_prefix_of_the_full_sort() {
        // small integer weights: many ties, some zeros
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        for len in [1usize, 5, 17, 64] {
            for _ in 0..50 {
                let q: Vec<f64> = (0..len)
                    .map(|_| {
                        state ^= state << 13;
                        state ^= state >> 7;
                        state ^= state << 17;
                        (state % 4) as f64 / 8.0
                    })
                    .collect();
                let mut sorted: Vec<u32> = (0..len as u32).collect();
                sorted.sort_by(|&a, &b| {
                    q[b as usize]
                        .partial_cmp(&q[a as usize])
                        .unwrap()
                        .then(a.cmp(&b))
                });
                for count in [0, 1, 2, 3, len, len + 2] {
                    assert_eq!(
                        ranked_tokens(&q, count),
                        sorted[..count.min(len)].to_vec(),
                        "{q:?}, count {count}"
                    );
                }
            }
        }
    }
}
