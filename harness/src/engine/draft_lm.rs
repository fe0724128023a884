//! A real language model as a [`DraftModel`]: the bridge from drafters to LLMs.
//!
//! Drafters ask for the next-token distribution after a whole token path
//! ([`DraftModel::next_probs`]). Recomputing the path each time would cost a full prefill per
//! draft token, so [`LmDraftModel`] keeps a small pool of KV sequences and, for each query, picks
//! the one sharing the **longest common prefix** with the path, rewinds it to that prefix and
//! forwards only the rest (usually one token). A chain drafter therefore costs one forward of one
//! token per draft, the next round reuses everything up to the first rejected draft, and a batch
//! of sequences keeps one pooled KV sequence each. The pool is bounded; the least recently used
//! entry is evicted. The rows along a whole path ([`DraftModel::next_probs_along`], how the
//! staged drafter's level 1 checks a level-0 chain) come from one forward over the path's
//! uncached part, not one forward per row; the uncached tokens before the rows asked for (a
//! catch-up on a prompt or on plain steps) go through [`LanguageModel::prefill`] first, which
//! skips the LM head.
//!
//! Distributions are the model's logits prepared with the drafter's [`SamplingParams`]
//! (temperature, top-k, top-p), in f32; over the ids the model computes
//! ([`LanguageModel::logit_rows`], a limited draft vocabulary), zero elsewhere.

use specdec_algorithms::drafters::{check_along, DraftModel};
use specdec_algorithms::AlgorithmError;
use specdec_kernels::sampling::{prepare_logits, SamplingParams};
use specdec_kernels::TreeTopology;
use specdec_models::{LanguageModel, SeqId, SequenceStep};

/// One pooled KV sequence: the tokens whose K/V it holds, and the logits after the last one.
struct CachedPath {
    seq: SeqId,
    /// Tokens committed in the model's KV for this sequence.
    tokens: Vec<u32>,
    /// Logits after `tokens` (None until at least one token was forwarded).
    last_logits: Option<Vec<f32>>,
    last_used: u64,
}

/// A [`LanguageModel`] serving next-token distributions for arbitrary paths, with prefix reuse
/// (see the module docs).
pub struct LmDraftModel<M: LanguageModel> {
    model: M,
    params: SamplingParams,
    pool: Vec<CachedPath>,
    pool_limit: usize,
    clock: u64,
    forwarded_tokens: u64,
}

impl<M: LanguageModel> LmDraftModel<M> {
    /// Wraps `model`, preparing its distributions with `params`; keeps at most `pool_limit`
    /// (≥ 1) KV sequences.
    pub fn new(model: M, params: SamplingParams, pool_limit: usize) -> Self {
        Self {
            model,
            params,
            pool: Vec::new(),
            pool_limit: pool_limit.max(1),
            clock: 0,
            forwarded_tokens: 0,
        }
    }

    /// The wrapped model.
    pub fn model(&self) -> &M {
        &self.model
    }

    /// [`LanguageModel::limit_logits`] on the wrapped model: from now on `q` is zero past the
    /// first `rows` ids. Cached logits are dropped (they were computed under the old limit).
    ///
    /// # Errors
    /// As the model's `limit_logits`.
    pub fn limit_logits(&mut self, rows: usize) -> Result<(), specdec_models::ModelError> {
        self.model.limit_logits(rows)?;
        for entry in &mut self.pool {
            entry.last_logits = None;
        }
        Ok(())
    }

    /// Tokens forwarded so far (a measure of drafting work; prefix reuse keeps it low).
    pub fn forwarded_tokens(&self) -> u64 {
        self.forwarded_tokens
    }

    /// Logits after each of the last `rows` prefixes of `tokens` (`1 ≤ rows ≤ tokens.len()`),
    /// reusing the pooled sequence with the longest common prefix: it is rewound to at most
    /// `tokens.len() - rows` tokens, the uncached tokens before the last `rows` are prefilled
    /// (no LM head), and the last `rows` forwarded as one chain.
    fn logits_along(
        &mut self,
        tokens: &[u32],
        rows: usize,
    ) -> specdec_models::Result<Vec<Vec<f32>>> {
        self.clock += 1;
        let best = self
            .pool
            .iter()
            .enumerate()
            .map(|(i, c)| (common_prefix(&c.tokens, tokens), c.last_used, i))
            .max();
        let index = match best {
            Some((shared, _, i)) if shared > 0 => i,
            _ if self.pool.len() < self.pool_limit => {
                let seq = self.model.new_sequence()?;
                self.pool.push(CachedPath {
                    seq,
                    tokens: Vec::new(),
                    last_logits: None,
                    last_used: 0,
                });
                self.pool.len() - 1
            }
            // A full pool and no shared prefix: reuse the least recently used entry.
            _ => self
                .pool
                .iter()
                .enumerate()
                .min_by_key(|(_, c)| c.last_used)
                .map_or(0, |(i, _)| i),
        };
        let clock = self.clock;
        let entry = &mut self.pool[index];
        entry.last_used = clock;
        let mut shared = common_prefix(&entry.tokens, tokens);
        if rows == 1 && shared == tokens.len() && shared == entry.tokens.len() {
            if let Some(logits) = &entry.last_logits {
                return Ok(vec![logits.clone()]);
            }
        }
        // Forward at least the last `rows` tokens: the logits after a prefix come from its last
        // token.
        shared = shared.min(tokens.len() - rows);
        let drop = entry.tokens.len() - shared;
        if drop > 0 {
            self.model.rewind(entry.seq, drop)?;
            entry.tokens.truncate(shared);
        }
        // the tokens before the last `rows`: K/V only, no LM head (a catch-up after plain steps
        // is mostly these; the rows' logits are the same as from one pass, by batch invariance)
        let head_from = tokens.len() - rows;
        if head_from > shared {
            self.model.prefill(entry.seq, &tokens[shared..head_from])?;
            self.forwarded_tokens += (head_from - shared) as u64;
            entry.tokens.extend_from_slice(&tokens[shared..head_from]);
            shared = head_from;
        }
        let new_tokens = &tokens[shared..];
        let chain = TreeTopology::chain(new_tokens.len());
        let step = SequenceStep::chain(entry.seq, new_tokens, &chain);
        let logits = self.model.forward(&[step])?;
        let path: Vec<usize> = (0..new_tokens.len()).collect();
        self.model.commit(entry.seq, &path)?;
        self.forwarded_tokens += new_tokens.len() as u64;
        entry.tokens.extend_from_slice(new_tokens);
        let along: Vec<Vec<f32>> = (new_tokens.len() - rows..new_tokens.len())
            .map(|r| logits[0].row(r).to_vec())
            .collect();
        entry.last_logits = along.last().cloned();
        Ok(along)
    }
}

fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

impl<M: LanguageModel> DraftModel<f32> for LmDraftModel<M> {
    fn vocab(&self) -> usize {
        self.model.vocab_size()
    }

    fn next_probs(&mut self, tokens: &[u32]) -> specdec_algorithms::Result<Vec<f32>> {
        if tokens.is_empty() {
            return Err(AlgorithmError::InvalidParameter {
                name: "tokens",
                reason: "a draft model needs at least one context token".into(),
            });
        }
        let mut rows = self.next_probs_along(tokens, 1)?;
        Ok(rows.pop().expect("one row asked for"))
    }

    /// One forward over the uncached part of `tokens` for all `count` rows (see
    /// [`DraftModel::next_probs_along`]).
    fn next_probs_along(
        &mut self,
        tokens: &[u32],
        count: usize,
    ) -> specdec_algorithms::Result<Vec<Vec<f32>>> {
        check_along(tokens, count)?;
        // a model computing only the first ids' logits: q is zero past them
        let computed = self.model.logit_rows();
        let vocab = self.model.vocab_size();
        self.logits_along(tokens, count)?
            .iter()
            .map(|logits| {
                let mut probs = prepare_logits(&logits[..computed], &self.params)?;
                probs.resize(vocab, 0.0);
                Ok(probs)
            })
            .collect()
    }
}
