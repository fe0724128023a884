//! A real language model as a [`DraftModel`]: the bridge from drafters to LLMs.
//!
//! Drafters ask for the next-token distribution after a whole token path
//! ([`DraftModel::next_probs`]) for one sequence. Recomputing the path each time would cost a
//! full prefill per draft token, so [`LmDraftModel`] keeps one KV sequence per drafted-for
//! sequence, holding a prefix of its context and of the path drafted last: a query rewinds it to
//! where the query's tokens leave it (within this step's draft path) and forwards only the rest
//! (usually one token). The engine's verdict after every step ([`DraftModel::observe`]) rewinds
//! it to the tokens the target committed, so the next step reuses everything up to the first
//! rejected draft; a retired sequence's KV is freed ([`DraftModel::release`]). At most
//! `sequences` are kept; beyond that the least recently used is dropped (and re-prefilled if it
//! comes back). The rows along a whole path ([`DraftModel::next_probs_along`], how the
//! staged drafter's level 1 checks a level-0 chain) come from one forward over the path's
//! uncached part, not one forward per row; the uncached tokens before the rows asked for (a
//! catch-up on a prompt or on plain steps) go through [`LanguageModel::prefill`] first, which
//! skips the LM head. The distributions after several paths below one context
//! ([`DraftModel::next_probs_paths`], how tree drafters ask for a whole depth) come from one
//! forward of the paths' token tree.
//!
//! Distributions are the model's logits, penalised like the target's ([`Penalties`], with each
//! row's own generated history: the tokens after the prompt, as the verdicts report its
//! length), then prepared with the drafter's [`SamplingParams`] (temperature, top-k, top-p,
//! min-p), in f32; over the ids the model computes ([`LanguageModel::logit_ids`], a limited
//! draft vocabulary), zero elsewhere. So a draft that is the target itself proposes exactly the
//! target's distribution whatever the penalties. Before a sequence's first verdict its prompt
//! length is unknown and its rows are not penalised (still lossless: only `q` changes).

use std::collections::HashMap;

use specdec_algorithms::drafters::{
    check_along, check_distinct, DraftFeedback, DraftModel, PathsQuery,
};
use specdec_algorithms::AlgorithmError;
use specdec_kernels::sampling::{prepare_logits, SamplingParams};
use specdec_kernels::TreeTopology;
use specdec_models::{LanguageModel, SeqId, SequenceStep};

use super::Penalties;

/// The most uncached tokens of one sequence a batched query forwards with the batch (a catch-up
/// of a full acceptance is two); more go through [`LanguageModel::prefill`] first, which skips
/// the LM head.
const BATCH_CATCH_UP: usize = 4;

/// The KV sequence kept for one drafted-for sequence: the tokens whose K/V it holds, and the
/// logits after the last one.
struct CachedPath {
    seq: SeqId,
    /// Tokens committed in the model's KV for this sequence.
    tokens: Vec<u32>,
    /// Logits after `tokens` (None until at least one token was forwarded).
    last_logits: Option<Vec<f32>>,
    last_used: u64,
}

/// A [`LanguageModel`] serving next-token distributions for arbitrary paths, with prefix reuse
/// per sequence (see the module docs).
pub struct LmDraftModel<M: LanguageModel> {
    model: M,
    params: SamplingParams,
    penalties: Penalties,
    /// Prompt length by drafted-for sequence, from its verdicts (where penalties start).
    prompt_lens: HashMap<u64, usize>,
    /// By drafted-for sequence ([`DraftRequest::sequence`](specdec_algorithms::drafters::DraftRequest)).
    entries: HashMap<u64, CachedPath>,
    max_sequences: usize,
    clock: u64,
    forwarded_tokens: u64,
}

impl<M: LanguageModel> LmDraftModel<M> {
    /// Wraps `model`, preparing its distributions with `params`; keeps the KV of at most
    /// `max_sequences` (≥ 1) sequences at once.
    pub fn new(model: M, params: SamplingParams, max_sequences: usize) -> Self {
        Self {
            model,
            params,
            penalties: Penalties::default(),
            prompt_lens: HashMap::new(),
            entries: HashMap::new(),
            max_sequences: max_sequences.max(1),
            clock: 0,
            forwarded_tokens: 0,
        }
    }

    /// Applies `penalties` (the target's) to every row's logits before preparing them.
    pub fn with_penalties(mut self, penalties: Penalties) -> Self {
        self.penalties = penalties;
        self
    }

    /// The wrapped model.
    pub fn model(&self) -> &M {
        &self.model
    }

    /// [`LanguageModel::limit_logits`] on the wrapped model: from now on `q` is zero outside
    /// `ids`. Cached logits are dropped (they were computed under the old limit).
    ///
    /// # Errors
    /// As the model's `limit_logits`.
    pub fn limit_logits(&mut self, ids: &[u32]) -> Result<(), specdec_models::ModelError> {
        self.model.limit_logits(ids)?;
        for entry in self.entries.values_mut() {
            entry.last_logits = None;
        }
        Ok(())
    }

    /// Tokens forwarded so far (a measure of drafting work; prefix reuse keeps it low).
    pub fn forwarded_tokens(&self) -> u64 {
        self.forwarded_tokens
    }

    /// The kept KV sequence of `sequence`, opened (empty) when there is none, after dropping
    /// the least recently used one if `max_sequences` are kept; marked used now.
    fn entry_for(&mut self, sequence: u64) -> specdec_models::Result<()> {
        self.clock += 1;
        if !self.entries.contains_key(&sequence) {
            if self.entries.len() >= self.max_sequences {
                let oldest = self
                    .entries
                    .iter()
                    .min_by_key(|(_, c)| c.last_used)
                    .map(|(&s, _)| s);
                if let Some(oldest) = oldest {
                    self.drop_entry(oldest)?;
                }
            }
            let seq = self.model.new_sequence()?;
            self.entries.insert(
                sequence,
                CachedPath {
                    seq,
                    tokens: Vec::new(),
                    last_logits: None,
                    last_used: 0,
                },
            );
        }
        if let Some(entry) = self.entries.get_mut(&sequence) {
            entry.last_used = self.clock;
        }
        Ok(())
    }

    /// Frees the KV sequence kept for `sequence`, if any.
    fn drop_entry(&mut self, sequence: u64) -> specdec_models::Result<()> {
        match self.entries.remove(&sequence) {
            Some(entry) => self.model.release(entry.seq),
            None => Ok(()),
        }
    }

    /// Makes the KV sequence of `sequence` hold exactly `tokens[..keep]`: rewound to where
    /// `tokens` leave this step's draft path (at most `keep` tokens), then the rest up to
    /// `keep` prefilled (K/V only, no LM head: a catch-up after plain steps is mostly this).
    fn hold_prefix(
        &mut self,
        sequence: u64,
        tokens: &[u32],
        keep: usize,
    ) -> specdec_models::Result<()> {
        self.entry_for(sequence)?;
        let entry = self.entries.get_mut(&sequence).expect("opened above");
        let shared = common_prefix(&entry.tokens, tokens).min(keep);
        let drop = entry.tokens.len() - shared;
        if drop > 0 {
            self.model.rewind(entry.seq, drop)?;
            entry.tokens.truncate(shared);
            entry.last_logits = None;
        }
        if keep > shared {
            self.model.prefill(entry.seq, &tokens[shared..keep])?;
            entry.tokens.extend_from_slice(&tokens[shared..keep]);
            entry.last_logits = None;
            self.forwarded_tokens += (keep - shared) as u64;
        }
        Ok(())
    }

    /// The cached logits after `tokens` for `sequence`, if its KV holds exactly `tokens`.
    fn cached_logits(&self, sequence: u64, tokens: &[u32]) -> Option<Vec<f32>> {
        let entry = self.entries.get(&sequence)?;
        (entry.tokens == tokens)
            .then(|| entry.last_logits.clone())
            .flatten()
    }

    /// Forwards each `(sequence, tokens)` as a chain appended to what the sequence's KV holds,
    /// all in one pass, and commits them; each sequence's cached logits become its chain's last
    /// row. Returns the logits of every chain's tokens.
    fn forward_chains(
        &mut self,
        chains: &[(u64, &[u32])],
    ) -> specdec_models::Result<Vec<specdec_models::Logits>> {
        let topologies: Vec<TreeTopology> = chains
            .iter()
            .map(|(_, tokens)| TreeTopology::chain(tokens.len()))
            .collect();
        let steps: Vec<SequenceStep<'_>> = chains
            .iter()
            .zip(&topologies)
            .map(|(&(sequence, tokens), chain)| {
                SequenceStep::chain(self.entries[&sequence].seq, tokens, chain)
            })
            .collect();
        let logits = self.model.forward(&steps)?;
        for (&(sequence, tokens), rows) in chains.iter().zip(&logits) {
            let entry = self.entries.get_mut(&sequence).expect("held by the caller");
            let path: Vec<usize> = (0..tokens.len()).collect();
            self.model.commit(entry.seq, &path)?;
            self.forwarded_tokens += tokens.len() as u64;
            entry.tokens.extend_from_slice(tokens);
            entry.last_logits = Some(rows.row(tokens.len() - 1).to_vec());
        }
        Ok(logits)
    }

    /// Logits after each of the last `rows` prefixes of `tokens` (`1 ≤ rows ≤ tokens.len()`)
    /// for `sequence`: its KV sequence is made to hold `tokens.len() - rows` tokens
    /// ([`LmDraftModel::hold_prefix`]) and the last `rows` are forwarded as one chain (their
    /// rows are the same as from one pass, by batch invariance).
    fn logits_along(
        &mut self,
        sequence: u64,
        tokens: &[u32],
        rows: usize,
    ) -> specdec_models::Result<Vec<Vec<f32>>> {
        self.entry_for(sequence)?;
        if rows == 1 {
            if let Some(logits) = self.cached_logits(sequence, tokens) {
                return Ok(vec![logits]);
            }
        }
        // Forward at least the last `rows` tokens: the logits after a prefix come from its last
        // token.
        let head_from = tokens.len() - rows;
        self.hold_prefix(sequence, tokens, head_from)?;
        let logits = self.forward_chains(&[(sequence, &tokens[head_from..])])?;
        Ok((0..rows).map(|r| logits[0].row(r).to_vec()).collect())
    }

    /// Logits after each of `queries` (distinct sequences, non-empty tokens) from one forward:
    /// each sequence's KV is made to hold all but the last [`BATCH_CATCH_UP`] uncached tokens
    /// of its query ([`LmDraftModel::hold_prefix`]; usually nothing to do), and the rest of every
    /// query goes through the model as one batch of chains, of which each chain's last row is
    /// the answer (the same row as from a pass of its own, by batch invariance). A query whose
    /// logits are cached is answered from the cache.
    fn logits_batch(&mut self, queries: &[(u64, &[u32])]) -> specdec_models::Result<Vec<Vec<f32>>> {
        let mut answers: Vec<Option<Vec<f32>>> = vec![None; queries.len()];
        // (query, the part of its tokens forwarded now)
        let mut forwarded: Vec<(usize, (u64, &[u32]))> = Vec::new();
        for (i, &(sequence, tokens)) in queries.iter().enumerate() {
            self.entry_for(sequence)?;
            if let Some(logits) = self.cached_logits(sequence, tokens) {
                answers[i] = Some(logits);
                continue;
            }
            let shared = common_prefix(&self.entries[&sequence].tokens, tokens);
            let start = shared
                .min(tokens.len() - 1)
                .max(tokens.len().saturating_sub(BATCH_CATCH_UP));
            self.hold_prefix(sequence, tokens, start)?;
            forwarded.push((i, (sequence, &tokens[start..])));
        }
        if !forwarded.is_empty() {
            let chains: Vec<(u64, &[u32])> = forwarded.iter().map(|&(_, chain)| chain).collect();
            let logits = self.forward_chains(&chains)?;
            for ((i, (_, tokens)), rows) in forwarded.into_iter().zip(&logits) {
                answers[i] = Some(rows.row(tokens.len() - 1).to_vec());
            }
        }
        Ok(answers
            .into_iter()
            .map(|a| a.expect("every query is cached or forwarded"))
            .collect())
    }

    /// Logits after `context ++ path` for each of `paths` (`context` non-empty) for each
    /// query's sequence (distinct), from one forward of every query's token tree: the tree's
    /// root is the context's last token and its other nodes the trie of the paths (shared
    /// prefixes forwarded once). Each KV sequence holds its context but the root before
    /// ([`LmDraftModel::hold_prefix`]) and the whole context after (the root committed, the
    /// branches discarded), with the logits after the context cached.
    fn logits_trees(
        &mut self,
        queries: &[PathsQuery<'_>],
    ) -> specdec_models::Result<Vec<Vec<Vec<f32>>>> {
        struct Trie {
            tokens: Vec<u32>,
            tree: TreeTopology,
            ends: Vec<usize>,
        }
        let mut tries = Vec::with_capacity(queries.len());
        for q in queries {
            let root_at = q.context.len() - 1;
            self.hold_prefix(q.sequence, q.context, root_at)?;
            let mut tokens = vec![q.context[root_at]];
            let mut parents = vec![None];
            let mut child_of: HashMap<(usize, u32), usize> = HashMap::new();
            let ends: Vec<usize> = q
                .paths
                .iter()
                .map(|path| {
                    path.iter().fold(0, |parent, &token| {
                        *child_of.entry((parent, token)).or_insert_with(|| {
                            tokens.push(token);
                            parents.push(Some(parent));
                            tokens.len() - 1
                        })
                    })
                })
                .collect();
            let tree = TreeTopology::from_parents(&parents)?;
            tries.push(Trie { tokens, tree, ends });
        }
        let steps: Vec<SequenceStep<'_>> = queries
            .iter()
            .zip(&tries)
            .map(|(q, trie)| SequenceStep {
                seq: self.entries[&q.sequence].seq,
                tokens: &trie.tokens,
                tree: &trie.tree,
            })
            .collect();
        let logits = self.model.forward(&steps)?;
        let mut answers = Vec::with_capacity(queries.len());
        for ((q, trie), rows) in queries.iter().zip(&tries).zip(&logits) {
            let entry = self.entries.get_mut(&q.sequence).expect("held above");
            self.model.commit(entry.seq, &[0])?;
            self.forwarded_tokens += trie.tokens.len() as u64;
            entry.tokens.push(trie.tokens[0]);
            entry.last_logits = Some(rows.row(0).to_vec());
            answers.push(
                trie.ends
                    .iter()
                    .map(|&node| rows.row(node).to_vec())
                    .collect(),
            );
        }
        Ok(answers)
    }

    /// `q` after `tokens ++ path` (the sequence's context and draft path) from the logits
    /// after them: penalised with the generated history (the tokens past the prompt), then
    /// prepared with the sampling parameters over the ids the model computes, zero elsewhere.
    fn probs(
        &self,
        sequence: u64,
        tokens: &[u32],
        path: &[u32],
        logits: &[f32],
    ) -> specdec_algorithms::Result<Vec<f32>> {
        // the logits computed, in the head's order (a limited head leaves -inf elsewhere)
        let ids = self.model.logit_ids();
        let mut row: Vec<f32> = match ids {
            Some(ids) => ids.iter().map(|&id| logits[id as usize]).collect(),
            None => logits.to_vec(),
        };
        if let Some(&prompt_len) = self.prompt_lens.get(&sequence) {
            if !self.penalties.is_off() {
                let generated = &tokens[prompt_len.min(tokens.len())..];
                let history = generated.iter().chain(path).copied();
                let slot: HashMap<u32, usize> = match ids {
                    Some(ids) => ids.iter().enumerate().map(|(j, &id)| (id, j)).collect(),
                    None => HashMap::new(),
                };
                self.penalties
                    .apply_mapped(history, &mut row, |t| match ids {
                        Some(_) => slot.get(&t).copied(),
                        None => Some(t as usize),
                    });
            }
        }
        let computed = prepare_logits(&row, &self.params)?;
        Ok(match ids {
            Some(ids) => {
                let mut probs = vec![0.0; self.model.vocab_size()];
                for (&id, p) in ids.iter().zip(computed) {
                    probs[id as usize] = p;
                }
                probs
            }
            None => computed,
        })
    }
}

fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

impl<M: LanguageModel> DraftModel<f32> for LmDraftModel<M> {
    fn vocab(&self) -> usize {
        self.model.vocab_size()
    }

    fn next_probs(
        &mut self,
        sequence: u64,
        tokens: &[u32],
    ) -> specdec_algorithms::Result<Vec<f32>> {
        if tokens.is_empty() {
            return Err(empty_context());
        }
        let mut rows = self.next_probs_along(sequence, tokens, 1)?;
        Ok(rows.pop().expect("one row asked for"))
    }

    /// One forward over the uncached part of `tokens` for all `count` rows (see
    /// [`DraftModel::next_probs_along`]).
    fn next_probs_along(
        &mut self,
        sequence: u64,
        tokens: &[u32],
        count: usize,
    ) -> specdec_algorithms::Result<Vec<Vec<f32>>> {
        check_along(tokens, count)?;
        let first = tokens.len() - count + 1;
        self.logits_along(sequence, tokens, count)?
            .iter()
            .enumerate()
            .map(|(row, logits)| self.probs(sequence, &tokens[..first + row], &[], logits))
            .collect()
    }

    /// One forward for the whole batch (see [`LmDraftModel::logits_batch`]); a single query is
    /// served like [`DraftModel::next_probs`].
    fn next_probs_batch(
        &mut self,
        queries: &[(u64, &[u32])],
    ) -> specdec_algorithms::Result<Vec<Vec<f32>>> {
        check_distinct(queries.iter().map(|(sequence, _)| *sequence))?;
        if queries.iter().any(|(_, tokens)| tokens.is_empty()) {
            return Err(empty_context());
        }
        // every sequence of the batch must stay open while it drafts
        if queries.len() <= 1 || queries.len() > self.max_sequences {
            return queries
                .iter()
                .map(|(sequence, tokens)| self.next_probs(*sequence, tokens))
                .collect();
        }
        self.logits_batch(queries)?
            .iter()
            .zip(queries)
            .map(|(logits, &(sequence, tokens))| self.probs(sequence, tokens, &[], logits))
            .collect()
    }

    /// One forward of the paths' token tree below the context's last token (see
    /// [`DraftModel::next_probs_paths`]); only the context's own row, when every path is
    /// empty, is served like [`DraftModel::next_probs`] (from the cache when it can).
    fn next_probs_paths(
        &mut self,
        sequence: u64,
        context: &[u32],
        paths: &[Vec<u32>],
    ) -> specdec_algorithms::Result<Vec<Vec<f32>>> {
        if context.is_empty() {
            return Err(empty_context());
        }
        if paths.iter().all(Vec::is_empty) {
            let probs = self.next_probs(sequence, context)?;
            return Ok(vec![probs; paths.len()]);
        }
        let query = PathsQuery {
            sequence,
            context,
            paths,
        };
        let mut answers = self.next_probs_paths_batch(std::slice::from_ref(&query))?;
        Ok(answers.pop().expect("one query"))
    }

    /// One forward of every query's token tree (see [`LmDraftModel::logits_trees`]); a batch
    /// larger than the sequences kept at once, or one whose paths are all empty, is served one
    /// query at a time.
    fn next_probs_paths_batch(
        &mut self,
        queries: &[PathsQuery<'_>],
    ) -> specdec_algorithms::Result<Vec<Vec<Vec<f32>>>> {
        check_distinct(queries.iter().map(|q| q.sequence))?;
        if queries.iter().any(|q| q.context.is_empty()) {
            return Err(empty_context());
        }
        // every sequence of the batch must stay open while it drafts
        if queries.len() > self.max_sequences
            || queries.iter().all(|q| q.paths.iter().all(Vec::is_empty))
        {
            return queries
                .iter()
                .map(|q| self.next_probs_paths(q.sequence, q.context, q.paths))
                .collect();
        }
        let logits = self.logits_trees(queries)?;
        queries
            .iter()
            .zip(logits)
            .map(|(q, rows)| {
                rows.iter()
                    .zip(q.paths)
                    .map(|(logits, path)| self.probs(q.sequence, q.context, path, logits))
                    .collect()
            })
            .collect()
    }

    /// Keeps the K/V of at most the tokens the target committed and drops the rest. What was
    /// forwarded agrees with the new context up to the first rejected draft — unless the
    /// drafter forwarded tokens off its final draft (the staged drafter's level 1 reads the
    /// level-0 proposal), so the kept part is cut where it stops agreeing.
    fn observe(&mut self, feedback: &DraftFeedback<'_>) -> specdec_algorithms::Result<()> {
        self.prompt_lens
            .insert(feedback.sequence, feedback.prompt_len);
        let Some(entry) = self.entries.get_mut(&feedback.sequence) else {
            return Ok(());
        };
        let bound = entry.tokens.len().min(feedback.committed);
        let keep = common_prefix(&entry.tokens[..bound], &feedback.context[..bound]);
        let drop = entry.tokens.len() - keep;
        if drop > 0 {
            self.model
                .rewind(entry.seq, drop)
                .map_err(AlgorithmError::from)?;
            entry.tokens.truncate(keep);
            entry.last_logits = None;
        }
        Ok(())
    }

    fn release(&mut self, sequence: u64) -> specdec_algorithms::Result<()> {
        self.prompt_lens.remove(&sequence);
        Ok(self.drop_entry(sequence)?)
    }
}

/// The error of a query with no context token.
fn empty_context() -> AlgorithmError {
    AlgorithmError::InvalidParameter {
        name: "tokens",
        reason: "a draft model needs at least one context token".into(),
    }
}
