//! History lookup: prompt lookup ([`super::ngram`]) that also searches the text of earlier
//! requests, their prompts and outputs, as SuffixDecoding (Oliaro et al., 2024) does with suffix
//! trees over a global cache of outputs. Requests to one model repeat each other (boilerplate
//! code, chat-template text, the shapes of answers), so the tokens that follow a request's
//! recent tokens have often followed them in another request already.
//!
//! [`TokenHistory`] keeps the tokens of finished sequences (at most `capacity`, the oldest
//! sequences dropped first) with an index from every n-gram of `min_n..=max_n` tokens to its
//! occurrences, most recent first: hash chains, as LZ77 compressors keep them (`latest[hash]`
//! is the newest start with that hash, `previous[start]` the next older one). A lookup probes a
//! few chains instead of scanning the history. Memory: per token held, 4 bytes and one 4-byte
//! chain link per n-gram length, plus at most one hash entry (about 20 bytes, up to twice that
//! while a table grows) per length: at most about 180 bytes per token at `max_n = 4`.
//!
//! [`HistoryDrafter`] ranks, for each suffix length from `max_n` down to `min_n`, the context's
//! own occurrences first ([`find_matches`]), then the history's, most recent first; a chain is
//! the best continuation, a tree merges up to `max_matches` continuations into a trie
//! ([`merge_continuations`]). Its drafts are deterministic ([`DraftKind::Deterministic`]), so
//! greedy and target-only verification keep the target's output exact whatever the history
//! holds. A sequence enters the history when it finishes ([`Drafter::finished`]); a request's
//! drafts may therefore depend on which requests finished before it, never its output.

use std::collections::{HashMap, VecDeque};

use specdec_kernels::sampling::{Decisions, Prob};
use specdec_kernels::verification::{DraftKind, DraftTree};

use crate::drafters::ngram::{deterministic_tree, find_matches, lookup_tree};
use crate::drafters::{DraftRequest, Drafter, NgramConfig, TokenTree};
use crate::error::{ensure_param, Result};
use crate::policy::Budget;

/// Marks the end of a sequence in [`TokenHistory`]'s buffer: no token id equals it, so no
/// n-gram or continuation crosses from one sequence into the next.
const END: u32 = u32::MAX;

/// "No older occurrence" in a hash chain.
const NONE: u32 = u32::MAX;

/// Most occurrences of one n-gram a lookup inspects (a frequent unigram has thousands).
const MAX_PROBES: usize = 64;

/// The tokens of finished sequences, indexed by n-gram (see the module docs).
///
/// Invariants: `tokens` is the retained sequences in finishing order, each followed by [`END`];
/// `tokens.len() ≤ capacity + sequences.len()`; `previous[i]` has one entry per token, and
/// every chain visits starts in decreasing order.
#[derive(Debug, Clone)]
pub struct TokenHistory {
    config: NgramConfig,
    capacity: usize,
    tokens: Vec<u32>,
    /// Length of every retained sequence (its [`END`] excluded), oldest first.
    sequences: VecDeque<usize>,
    /// Per n-gram length `min_n + i`: the newest start of each hash.
    latest: Vec<HashMap<u64, u32>>,
    /// Per n-gram length `min_n + i`: the next older start with the same hash ([`NONE`]: none).
    previous: Vec<Vec<u32>>,
}

/// The hash of n-gram `gram` (its length mixed in).
fn hash(gram: &[u32]) -> u64 {
    gram.iter().fold(gram.len() as u64, |h, &t| {
        (h ^ u64::from(t))
            .wrapping_mul(0x9E37_79B9_7F4A_7C15)
            .rotate_left(29)
    })
}

impl TokenHistory {
    /// An empty history indexing n-grams of `config.min_n..=config.max_n` tokens, keeping at
    /// most `capacity` tokens (≥ 1, < 2^31).
    ///
    /// # Errors
    /// [`crate::AlgorithmError::InvalidParameter`] for a bad `config` or `capacity`.
    pub fn new(config: NgramConfig, capacity: usize) -> Result<Self> {
        config.validate()?;
        ensure_param(
            (1..1 << 31).contains(&capacity),
            "capacity",
            format!("must be in 1..2^31 tokens, got {capacity}"),
        )?;
        let lengths = config.max_n - config.min_n + 1;
        Ok(Self {
            config,
            capacity,
            tokens: Vec::new(),
            sequences: VecDeque::new(),
            latest: vec![HashMap::new(); lengths],
            previous: vec![Vec::new(); lengths],
        })
    }

    /// Tokens held (sequence ends excluded).
    pub fn len(&self) -> usize {
        self.sequences.iter().sum()
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.sequences.is_empty()
    }

    /// Sequences held.
    pub fn sequences(&self) -> usize {
        self.sequences.len()
    }

    /// Adds a finished sequence (its last `capacity` tokens when longer). When the history then
    /// holds more than `capacity` tokens, the oldest sequences are dropped until it holds at
    /// most three quarters of it, and the index is rebuilt (amortised over a quarter of the
    /// capacity).
    pub fn push(&mut self, sequence: &[u32]) {
        let sequence = &sequence[sequence.len().saturating_sub(self.capacity)..];
        if sequence.is_empty() {
            return;
        }
        let mut held = self.len() + sequence.len();
        if held > self.capacity {
            while held > self.capacity - self.capacity / 4 {
                match self.sequences.pop_front() {
                    Some(oldest) => held -= oldest,
                    None => break,
                }
            }
            self.rebuild();
        }
        self.index(sequence);
    }

    /// Re-indexes the retained sequences (the newest `self.sequences`, at the buffer's end).
    fn rebuild(&mut self) {
        let kept: usize = self.sequences.iter().map(|len| len + 1).sum();
        let tokens = self.tokens.split_off(self.tokens.len() - kept);
        let lengths = std::mem::take(&mut self.sequences);
        self.tokens.clear();
        self.latest.iter_mut().for_each(HashMap::clear);
        self.previous.iter_mut().for_each(Vec::clear);
        let mut at = 0;
        for len in lengths {
            self.index(&tokens[at..at + len]);
            at += len + 1;
        }
    }

    /// Appends `sequence` and its [`END`], indexing every n-gram inside it.
    fn index(&mut self, sequence: &[u32]) {
        let base = self.tokens.len();
        self.tokens.extend_from_slice(sequence);
        self.tokens.push(END);
        self.sequences.push_back(sequence.len());
        for (i, n) in (self.config.min_n..=self.config.max_n).enumerate() {
            let (latest, previous) = (&mut self.latest[i], &mut self.previous[i]);
            previous.resize(self.tokens.len(), NONE);
            for start in 0..sequence.len().saturating_sub(n - 1) {
                let at = (base + start) as u32;
                let older = latest.insert(hash(&sequence[start..start + n]), at);
                previous[at as usize] = older.unwrap_or(NONE);
            }
        }
    }

    /// Appends to `found` the continuations (each 1..=`max_len` tokens, within its sequence)
    /// of the occurrences of `gram` (`min_n..=max_n` tokens), most recent first, that `found`
    /// does not hold yet, until it holds `limit`. Inspects at most [`MAX_PROBES`] occurrences.
    pub fn continuations(
        &self,
        gram: &[u32],
        max_len: usize,
        limit: usize,
        found: &mut Vec<Vec<u32>>,
    ) {
        let n = gram.len();
        if n < self.config.min_n || n > self.config.max_n || max_len == 0 {
            return;
        }
        let i = n - self.config.min_n;
        let mut at = self.latest[i].get(&hash(gram)).copied().unwrap_or(NONE);
        for _ in 0..MAX_PROBES {
            if at == NONE || found.len() >= limit {
                return;
            }
            let start = at as usize;
            if &self.tokens[start..start + n] == gram {
                let rest = &self.tokens[start + n..];
                let end = rest.iter().take(max_len).position(|&t| t == END);
                let continuation = &rest[..end.unwrap_or(max_len.min(rest.len()))];
                if !continuation.is_empty() && !found.iter().any(|c| c == continuation) {
                    found.push(continuation.to_vec());
                }
            }
            at = self.previous[i][start];
        }
    }
}

/// The history-lookup drafter (see the module docs): deterministic drafts from the context and
/// from finished sequences ([`DraftKind::Deterministic`], no `q`; pair it with greedy or
/// target-only verification).
///
/// Budget as [`super::NgramDrafter`]: [`Budget::Chain`]`(k)` the best continuation (≤ `k`
/// tokens); [`Budget::TreeNodes`]`(n)` a trie of up to `max_matches` continuations, ≤ `n` nodes
/// and depth ≤ `max_depth`; [`Budget::Tree`] the shape's node count and depth. With no match the
/// tree is the root only (the step becomes plain decoding).
#[derive(Debug, Clone)]
pub struct HistoryDrafter {
    config: NgramConfig,
    max_depth: usize,
    history: TokenHistory,
    spec_factor: Option<f64>,
}

impl HistoryDrafter {
    /// A drafter matching suffixes of `config.min_n..=config.max_n` tokens, merging up to
    /// `config.max_matches` into a tree of depth ≤ `max_depth`, over a history of at most
    /// `capacity` tokens.
    ///
    /// # Errors
    /// [`crate::AlgorithmError::InvalidParameter`] for a bad config, `max_depth = 0` or a bad
    /// capacity ([`TokenHistory::new`]).
    pub fn new(config: NgramConfig, max_depth: usize, capacity: usize) -> Result<Self> {
        ensure_param(max_depth >= 1, "max_depth", "must be at least 1")?;
        Ok(Self {
            config,
            max_depth,
            history: TokenHistory::new(config, capacity)?,
            spec_factor: None,
        })
    }

    /// Caps every continuation found by matching `n` tokens at `max(1, ⌊factor · n⌋)` tokens
    /// (SuffixDecoding's `max_spec_factor`): a short match drafts few tokens, whose rejection
    /// would cost verification work. `None` (the default): no cap beyond the budget.
    ///
    /// # Errors
    /// [`crate::AlgorithmError::InvalidParameter`] unless `factor` is finite and positive.
    pub fn with_spec_factor(mut self, factor: Option<f64>) -> Result<Self> {
        if let Some(factor) = factor {
            ensure_param(
                factor.is_finite() && factor > 0.0,
                "spec_factor",
                format!("must be finite and positive, got {factor}"),
            )?;
        }
        self.spec_factor = factor;
        Ok(self)
    }

    /// The most tokens a continuation of an `n`-token match may have, within `max_len`.
    fn cap(&self, n: usize, max_len: usize) -> usize {
        match self.spec_factor {
            Some(factor) => max_len.min(((factor * n as f64) as usize).max(1)),
            None => max_len,
        }
    }

    /// The finished sequences it looks up.
    pub fn history(&self) -> &TokenHistory {
        &self.history
    }

    /// Up to `limit` continuations (each ≤ `max_len` tokens, and capped by the spec factor) for
    /// `context`, best first: for each suffix length from `max_n` down to `min_n`, the context's
    /// occurrences, then the history's, most recent first; each distinct continuation once.
    pub fn continuations(&self, context: &[u32], max_len: usize, limit: usize) -> Vec<Vec<u32>> {
        let mut found: Vec<Vec<u32>> = Vec::new();
        let longest = self.config.max_n.min(context.len());
        for n in (self.config.min_n..=longest).rev() {
            if found.len() >= limit {
                break;
            }
            let exactly_n = NgramConfig {
                max_n: n,
                min_n: n,
                max_matches: limit - found.len(),
            };
            let max_len = self.cap(n, max_len);
            for m in find_matches(context, &exactly_n, max_len) {
                if !found.contains(&m.continuation) {
                    found.push(m.continuation);
                }
            }
            let gram = &context[context.len() - n..];
            self.history.continuations(gram, max_len, limit, &mut found);
        }
        found.truncate(limit);
        found
    }

    /// The deterministic token tree for `context` under `budget`.
    pub fn token_tree(&self, context: &[u32], budget: &Budget) -> TokenTree {
        let root = context.last().copied().unwrap_or(0);
        let matches = self.config.max_matches;
        lookup_tree(root, budget, self.max_depth, matches, |max_len, count| {
            self.continuations(context, max_len, count)
        })
    }
}

impl<N: Prob> Drafter<N> for HistoryDrafter {
    fn name(&self) -> String {
        let cap = match self.spec_factor {
            Some(factor) => format!(", ≤ {factor}·m drafts"),
            None => String::new(),
        };
        format!(
            "history(n∈[{},{}], {} matches, {} tokens{cap})",
            self.config.min_n, self.config.max_n, self.config.max_matches, self.history.capacity
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

    /// Adds the finished sequence's prompt and output to the history.
    fn finished(&mut self, sequence: u64, context: &[u32]) -> Result<()> {
        let _ = sequence;
        self.history.push(context);
        Ok(())
    }
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

    fn drafter(capacity: usize) -> HistoryDrafter {
        HistoryDrafter::new(CFG, 8, capacity).unwrap()
    }

    #[test]
    fn a_finished_sequence_continues_another_requests_suffix() {
        let mut d = drafter(100);
        let context = [9, 1, 2];
        assert!(d.continuations(&context, 4, 3).is_empty(), "nothing yet");
        Drafter::<f32>::finished(&mut d, 7, &[5, 1, 2, 3, 4]).unwrap();
        assert_eq!(d.continuations(&context, 4, 1), vec![vec![3, 4]]);
        let tree = d.token_tree(&context, &Budget::Chain(4));
        assert_eq!(tree.tokens, vec![2, 3, 4]);
        assert!(tree.shape.topology().is_chain());
    }

    #[test]
    fn the_context_comes_first_then_the_newest_history_and_longer_suffixes_first() {
        let mut d = drafter(100);
        Drafter::<f32>::finished(&mut d, 0, &[1, 2, 7]).unwrap();
        Drafter::<f32>::finished(&mut d, 1, &[1, 2, 8]).unwrap();
        Drafter::<f32>::finished(&mut d, 2, &[0, 1, 2, 6]).unwrap();
        // n = 3 "0 1 2" occurs only in sequence 2; n = 2 "1 2": the context's own occurrence
        // (→ 5), then the history's newest first (6 was seen already, 8, 7)
        let context = [1, 2, 5, 0, 1, 2];
        assert_eq!(
            d.continuations(&context, 1, 4),
            vec![vec![6], vec![5], vec![8], vec![7]]
        );
        let tree = d.token_tree(&context, &Budget::TreeNodes(8));
        // depth 8: the context's continuation runs to its end
        assert_eq!(tree.tokens, vec![2, 6, 5, 0, 1, 2, 8]);
    }

    #[test]
    fn continuations_stop_at_the_end_of_their_sequence() {
        let mut d = drafter(100);
        Drafter::<f32>::finished(&mut d, 0, &[4, 5]).unwrap();
        Drafter::<f32>::finished(&mut d, 1, &[6, 7, 8]).unwrap();
        // "5" ends sequence 0: nothing follows it there, and "6" must not be proposed
        assert!(d.continuations(&[3, 5], 4, 3).is_empty());
        assert_eq!(d.continuations(&[4], 4, 3), vec![vec![5]]);
    }

    #[test]
    fn the_oldest_sequences_leave_first_and_the_capacity_holds() {
        let mut d = drafter(10);
        for s in 0..6u32 {
            Drafter::<f32>::finished(&mut d, u64::from(s), &[100 + s, 1, 2, 3]).unwrap();
            assert!(d.history().len() <= 10, "{}", d.history().len());
        }
        let starts: Vec<Vec<u32>> = (0..6).map(|s| vec![100 + s]).collect();
        // the newest sequence is always held; the oldest is gone
        assert_eq!(d.continuations(&starts[5], 1, 1), vec![vec![1]]);
        assert!(d.continuations(&starts[0], 1, 1).is_empty());
        // a sequence longer than the capacity keeps its last tokens
        Drafter::<f32>::finished(&mut d, 9, &(0..25).collect::<Vec<_>>()).unwrap();
        assert_eq!(d.history().len(), 10);
        assert_eq!(d.continuations(&[20], 2, 1), vec![vec![21, 22]]);
        assert!(d.continuations(&[3], 2, 1).is_empty());
    }

    #[test]
    fn the_spec_factor_caps_drafts_by_match_length() {
        let mut d = drafter(100).with_spec_factor(Some(1.0)).unwrap();
        Drafter::<f32>::finished(&mut d, 0, &[1, 2, 3, 4, 5, 6, 7]).unwrap();
        // a 3-token match drafts 3, a 1-token match 1
        assert_eq!(d.continuations(&[1, 2, 3], 8, 1), vec![vec![4, 5, 6]]);
        assert_eq!(d.continuations(&[9, 3], 8, 1), vec![vec![4]]);
        let d = d.with_spec_factor(Some(0.5)).unwrap();
        assert_eq!(d.continuations(&[1, 2, 3], 8, 1), vec![vec![4]]);
        for bad in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            let err = drafter(10)
                .with_spec_factor(Some(bad))
                .unwrap_err()
                .to_string();
            assert!(err.contains("spec_factor"), "{err}");
        }
    }

    #[test]
    fn bad_parameters_are_refused_by_name() {
        let err = HistoryDrafter::new(CFG, 8, 0).unwrap_err().to_string();
        assert!(err.contains("capacity"), "{err}");
        let err = HistoryDrafter::new(CFG, 0, 10).unwrap_err().to_string();
        assert!(err.contains("max_depth"), "{err}");
        let bad = NgramConfig { min_n: 0, ..CFG };
        assert!(HistoryDrafter::new(bad, 8, 10).is_err());
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        /// Every continuation follows a real occurrence of a context suffix, in the context or
        /// inside one held sequence; the chain is empty only when no suffix occurs anywhere
        /// with a token after it; the tree keeps the budget.
        #[test]
        fn continuations_are_real(
            finished in proptest::collection::vec(proptest::collection::vec(0u32..4, 0..12), 0..5),
            context in proptest::collection::vec(0u32..4, 1..16),
            k in 1usize..5,
        ) {
            let mut d = drafter(30);
            for (s, seq) in finished.iter().enumerate() {
                Drafter::<f32>::finished(&mut d, s as u64, seq).unwrap();
            }
            let nonempty: Vec<&[u32]> =
                finished.iter().filter(|s| !s.is_empty()).map(Vec::as_slice).collect();
            let mut texts: Vec<&[u32]> =
                nonempty.iter().rev().take(d.history().sequences()).copied().collect();
            texts.push(&context);
            let suffix = |n: usize| &context[context.len() - n..];
            // starts of `suffix(n)` in `text` with at least one token after them in `text`
            let starts = |text: &[u32], n: usize| -> Vec<usize> {
                (0..text.len()).filter(|&s| s + n < text.len() && text[s..s + n] == *suffix(n)).collect()
            };
            let lengths = CFG.min_n..=CFG.max_n.min(context.len());
            for c in d.continuations(&context, k, 6) {
                prop_assert!(!c.is_empty() && c.len() <= k);
                let real = lengths.clone().any(|n| texts.iter().any(|t| {
                    starts(t, n).into_iter().any(|s| t[s + n..].starts_with(&c))
                }));
                prop_assert!(real, "{:?}", c);
            }
            let any = lengths.clone().any(|n| texts.iter().any(|t| !starts(t, n).is_empty()));
            let chain = d.token_tree(&context, &Budget::Chain(k));
            prop_assert_eq!(chain.shape.drafts() == 0, !any);
            let tree = d.token_tree(&context, &Budget::TreeNodes(5));
            prop_assert!(tree.shape.drafts() <= 5 && tree.shape.max_depth() <= 8);
        }
    }
}
