//! The `LanguageModel` abstraction: what speculative decoding needs from a model.
//!
//! A model owns the KV cache of its sequences. One call to [`LanguageModel::forward`] takes a
//! ragged batch of [`SequenceStep`]s — for each sequence, its new tokens and their shape (a
//! [`TreeTopology`](specdec_kernels::TreeTopology): a chain for a prefill chunk or plain decoding, a tree for verifying a draft
//! tree) — and returns f32 logits `[n_new, vocab]` per sequence. The K/V of the new tokens are
//! written to the cache as **speculative** entries: they are visible to later forwards of the same
//! sequence only once [`LanguageModel::commit`] has kept a root-to-node path of them. New token
//! `i` of a sequence sits at position `prefix_len + depth(i)`, where `prefix_len` is the number of
//! committed tokens of the sequence.
//!
//! The life of a sequence: [`LanguageModel::new_sequence`] → `forward` (prefill chain) →
//! `commit` of the whole chain → repeated `forward` (a chain of one token, or a draft tree) and
//! `commit` of the accepted path → [`LanguageModel::release`]. [`LanguageModel::rewind`] drops
//! committed tokens from the end, [`LanguageModel::fork`] shares a committed prefix.

mod step;
mod verify;

pub use step::{Features, Logits, SeqId, SequenceStep};
pub use verify::{
    check_request, forward_then_verify_host, verify_host, verify_rows, VerifiedBatch, VerifyRequest,
};

use crate::error::Result;

/// Most tokens one forward of a prompt prefill takes ([`LanguageModel::prefill`] forwards a
/// longer prompt in chunks of this many, committing each): the forward's working buffers stay
/// bounded whatever the prompt's length. With a batch-invariant model the K/V written, and so
/// every later logit, are bit-identical to one forward of the whole prompt.
pub const PREFILL_CHUNK: usize = 512;

/// The size and use of a model's paged KV pool, for admitting requests by free blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvRoom {
    /// Token slots per block (≥ 1).
    pub block_size: usize,
    /// Blocks in the pool.
    pub total_blocks: usize,
    /// Blocks free now.
    pub free_blocks: usize,
}

impl KvRoom {
    /// The room of `cache`'s pool.
    pub fn of(cache: &specdec_kernels::kv::PagedKvCache) -> Self {
        Self {
            block_size: cache.layout().block_size(),
            total_blocks: cache.allocator().num_blocks(),
            free_blocks: cache.allocator().free_blocks(),
        }
    }

    /// Blocks that hold `tokens` slots of one sequence: `ceil(tokens / block_size)`.
    pub fn blocks_for(&self, tokens: usize) -> usize {
        tokens.div_ceil(self.block_size)
    }

    /// Token slots of the whole pool.
    pub fn total_tokens(&self) -> usize {
        self.total_blocks * self.block_size
    }
}

/// A causal language model over a paged KV cache, forwarding ragged batches of token trees.
///
/// Implementations must be **batch-invariant**: the logits of a new token depend only on its
/// sequence's committed prefix and its ancestors in its tree, bit for bit — not on how many other
/// tokens or sequences share the call. This makes greedy speculative output equal greedy plain
/// output.
pub trait LanguageModel: Send {
    /// Number of rows of the output logits (the vocabulary size, padding ids included).
    fn vocab_size(&self) -> usize;

    /// The ids whose logits are computed, in the order of the LM head's rows, when the head is
    /// limited ([`LanguageModel::limit_logits`]); every other logit of a row is `-inf`. `None`:
    /// the whole vocabulary (the default).
    fn logit_ids(&self) -> Option<&[u32]> {
        None
    }

    /// From now on computes only the logits of token `ids` ([`check_logit_ids`]: distinct, each
    /// below `vocab_size()`), the rest of each row `-inf`: for a draft model, whose distribution
    /// may be anything the verifier is told (rejection sampling stays exact when `q` is zero
    /// outside a subset), a cheaper LM head. The frequent tokens keep most of the acceptance
    /// (FR-Spec, Zhao et al. 2025): with byte-level BPE vocabularies, whose ids follow merge
    /// order, the lowest ids; better, ids ranked by their frequency in text like the workload's.
    /// The whole vocabulary (in any order) lifts the limit.
    ///
    /// # Errors
    /// `ids` refused by [`check_logit_ids`]; a model that cannot limit its head (the default).
    fn limit_logits(&mut self, ids: &[u32]) -> Result<()> {
        Err(crate::error::ModelError::Config(format!(
            "this model computes the whole vocabulary (asked to limit it to {} logits)",
            ids.len()
        )))
    }

    /// From now on every forward also hands back, next to the logits, the hidden states of the
    /// new tokens after each of `blocks` (indices into the model's decoder blocks; the last
    /// block's output is the state before the final norm, what EAGLE-style heads draft from),
    /// side by side in this order ([`Logits::features`]); [`LanguageModel::prefill`] returns
    /// them too. An empty list stops tapping. Tapping changes no logits, and features are
    /// batch-invariant like the logits; a forward without taps pays nothing.
    ///
    /// # Errors
    /// A block index out of range, or a model that cannot tap features (the default).
    fn tap_features(&mut self, blocks: &[usize]) -> Result<()> {
        if blocks.is_empty() {
            return Ok(());
        }
        Err(crate::error::ModelError::Config(format!(
            "this model cannot hand back hidden features (asked for blocks {blocks:?})"
        )))
    }

    /// The blocks tapped by [`LanguageModel::tap_features`] (empty: none).
    fn tapped_features(&self) -> &[usize] {
        &[]
    }

    /// The beginning-of-sequence token id, if the model has one.
    fn bos_id(&self) -> Option<u32>;

    /// The end-of-sequence token ids: generation stops after sampling any of them. May be empty.
    fn eos_ids(&self) -> &[u32];

    /// The longest sequence (committed plus new tokens) the model supports.
    fn max_context(&self) -> usize;

    /// Opens an empty sequence and returns its id.
    ///
    /// # Errors
    /// When the KV cache cannot hold another sequence.
    fn new_sequence(&mut self) -> Result<SeqId>;

    /// Opens a new sequence sharing the committed tokens of `seq` (copy on write where the cache
    /// pages are shared).
    ///
    /// # Errors
    /// When `seq` is unknown, has uncommitted speculative entries (commit or `rewind(seq, 0)`
    /// first), or the cache is full.
    fn fork(&mut self, seq: SeqId) -> Result<SeqId>;

    /// Closes `seq`, freeing its cache entries.
    ///
    /// # Errors
    /// When `seq` is unknown.
    fn release(&mut self, seq: SeqId) -> Result<()>;

    /// Number of committed tokens of `seq` (its prefix length for the next forward).
    ///
    /// # Errors
    /// When `seq` is unknown.
    fn seq_len(&self, seq: SeqId) -> Result<usize>;

    /// Forwards the new tokens of every step and returns their logits, in step order.
    ///
    /// Each step's tokens and tree must have the same length; a sequence may appear at most once
    /// per call. Speculative entries of an earlier forward of the same sequence that were not
    /// committed are discarded first.
    ///
    /// # Errors
    /// Unknown or repeated sequence ids, token ids outside the vocabulary, a token/tree length
    /// mismatch, a context overflow or a full KV cache. On error no committed token has changed
    /// (uncommitted speculative entries of the batch's sequences may have been discarded).
    fn forward(&mut self, steps: &[SequenceStep<'_>]) -> Result<Vec<Logits>>;

    /// Forwards `steps` as [`LanguageModel::forward`] does and verifies every step's draft
    /// tree by `request` where the logits are (see [`VerifyRequest`]), handing back only the
    /// verdicts and the tapped features: the engine's target pass and verify stage in one call.
    /// A model that keeps its logits on a device verifies there in one batched launch
    /// ([`verify_rows`]); the default forwards to the host and verifies there
    /// ([`forward_then_verify_host`]). Both give the same verdicts over the same prepared rows.
    ///
    /// # Errors
    /// A `request` that does not describe `steps` ([`check_request`], before the forward);
    /// `forward`'s errors; a row that is no distribution ([`crate::ModelError::TargetRow`] on
    /// the host, the batch row on a device); the verifier's.
    fn forward_verify(
        &mut self,
        steps: &[SequenceStep<'_>],
        request: &VerifyRequest<'_>,
    ) -> Result<VerifiedBatch> {
        forward_then_verify_host(steps, request, |steps| self.forward(steps))
    }

    /// Forwards `tokens` after the committed ones of `seq` as a chain and commits them all,
    /// returning no logits: a prompt prefill, whose logits nobody reads, so a model may skip
    /// its LM head (the default forwards and drops them). Later logits are the same either way
    /// (the K/V written do not depend on the head). Returns the tokens' tapped features when
    /// the model taps any ([`LanguageModel::tap_features`]), the same rows a forward gives.
    ///
    /// # Errors
    /// As [`LanguageModel::forward`] and [`LanguageModel::commit`]; an empty `tokens` is an
    /// error of `forward`'s.
    ///
    /// A prompt longer than [`PREFILL_CHUNK`] is forwarded in chunks of that many tokens, each
    /// committed before the next (features concatenated in order); on error the chunks already
    /// committed stay.
    fn prefill(&mut self, seq: SeqId, tokens: &[u32]) -> Result<Option<Features>> {
        prefill_in_chunks(tokens, |chunk| {
            let chain = specdec_kernels::TreeTopology::chain(chunk.len());
            let mut logits = self.forward(&[SequenceStep::chain(seq, chunk, &chain)])?;
            self.commit(seq, &(0..chunk.len()).collect::<Vec<_>>())?;
            Ok(logits.pop().and_then(|mut l| l.take_features()))
        })
    }

    /// The model's KV pool, when it has a bounded one: what the engine admits requests by.
    /// `None` (the default) for models without one (toy tables).
    fn kv_room(&self) -> Option<KvRoom> {
        None
    }

    /// Starts (`on`) or stops timing every op of each forward ([`crate::llama::OpTime`]);
    /// returns whether this model can: the CPU Llama / Qwen2 forward can (one rank), the
    /// default (every other model) cannot and times nothing.
    fn set_op_clock(&mut self, on: bool) -> bool {
        let _ = on;
        false
    }

    /// The op times of the forwards since the last call (or since timing started), then
    /// cleared; empty when not timing.
    fn take_op_times(&mut self) -> Vec<crate::llama::OpTime> {
        Vec::new()
    }

    /// Keeps the new tokens on `path` of the last forward of `seq` as committed tokens, in path
    /// order, and discards its other speculative entries. `path` lists node indices of that
    /// forward's tree, starting at the root (node 0), each node the parent of the next — or is
    /// empty, which keeps none. A chain is committed whole with `path = 0..n`.
    ///
    /// # Errors
    /// When `seq` is unknown, or `path` is not a root-to-node path of its last forward.
    fn commit(&mut self, seq: SeqId, path: &[usize]) -> Result<()>;

    /// Drops the last `n` committed tokens of `seq` (and any speculative entries).
    ///
    /// # Errors
    /// When `seq` is unknown or has fewer than `n` committed tokens.
    fn rewind(&mut self, seq: SeqId, n: usize) -> Result<()>;
}

/// Runs `forward_chunk` over `tokens` in chunks of at most [`PREFILL_CHUNK`] (an empty `tokens`
/// is one empty chunk, for the model to refuse), concatenating the features the chunks return.
///
/// # Errors
/// The first chunk's error; [`crate::ModelError::Shape`] if chunks return features of
/// different widths.
pub fn prefill_in_chunks(
    tokens: &[u32],
    mut forward_chunk: impl FnMut(&[u32]) -> Result<Option<Features>>,
) -> Result<Option<Features>> {
    if tokens.len() <= PREFILL_CHUNK {
        return forward_chunk(tokens);
    }
    let mut joined: Option<(usize, Vec<f32>)> = None;
    for chunk in tokens.chunks(PREFILL_CHUNK) {
        if let Some(f) = forward_chunk(chunk)? {
            let (dim, rows) = joined.get_or_insert_with(|| (f.dim(), Vec::new()));
            if *dim != f.dim() {
                return Err(crate::error::ModelError::Shape {
                    what: "prefill features".into(),
                    reason: format!("chunks of width {dim} and {}", f.dim()),
                });
            }
            rows.extend_from_slice(f.as_slice());
        }
    }
    joined
        .map(|(dim, rows)| Features::new(dim, rows))
        .transpose()
}

/// Checks a limited vocabulary for [`LanguageModel::limit_logits`] of a model of `vocab` ids:
/// non-empty, every id below `vocab`, none twice. Returns whether it is the whole vocabulary
/// (no limit).
///
/// # Errors
/// [`ModelError::Config`](crate::error::ModelError::Config) naming the first offending id.
pub fn check_logit_ids(ids: &[u32], vocab: usize) -> Result<bool> {
    let refuse = |reason: String| {
        Err(crate::error::ModelError::Config(format!(
            "limited vocabulary of {} ids: {reason}",
            ids.len()
        )))
    };
    if ids.is_empty() {
        return refuse("it is empty".into());
    }
    let mut seen = vec![false; vocab];
    for (at, &id) in ids.iter().enumerate() {
        match seen.get_mut(id as usize) {
            None => return refuse(format!("id {id} (at {at}) is outside the {vocab} ids")),
            Some(true) => return refuse(format!("id {id} occurs twice (again at {at})")),
            Some(slot) => *slot = true,
        }
    }
    Ok(ids.len() == vocab)
}

/// A boxed model is a model: what [`crate::llama::load_on_device`] returns can drive the engine
/// and the drafters, which take any `M: LanguageModel`.
impl<M: LanguageModel + ?Sized> LanguageModel for Box<M> {
    fn vocab_size(&self) -> usize {
        (**self).vocab_size()
    }
    fn logit_ids(&self) -> Option<&[u32]> {
        (**self).logit_ids()
    }
    fn limit_logits(&mut self, ids: &[u32]) -> Result<()> {
        (**self).limit_logits(ids)
    }
    fn tap_features(&mut self, blocks: &[usize]) -> Result<()> {
        (**self).tap_features(blocks)
    }
    fn tapped_features(&self) -> &[usize] {
        (**self).tapped_features()
    }
    fn bos_id(&self) -> Option<u32> {
        (**self).bos_id()
    }
    fn eos_ids(&self) -> &[u32] {
        (**self).eos_ids()
    }
    fn max_context(&self) -> usize {
        (**self).max_context()
    }
    fn new_sequence(&mut self) -> Result<SeqId> {
        (**self).new_sequence()
    }
    fn fork(&mut self, seq: SeqId) -> Result<SeqId> {
        (**self).fork(seq)
    }
    fn release(&mut self, seq: SeqId) -> Result<()> {
        (**self).release(seq)
    }
    fn seq_len(&self, seq: SeqId) -> Result<usize> {
        (**self).seq_len(seq)
    }
    fn forward(&mut self, steps: &[SequenceStep<'_>]) -> Result<Vec<Logits>> {
        (**self).forward(steps)
    }
    fn forward_verify(
        &mut self,
        steps: &[SequenceStep<'_>],
        request: &VerifyRequest<'_>,
    ) -> Result<VerifiedBatch> {
        (**self).forward_verify(steps, request)
    }
    fn prefill(&mut self, seq: SeqId, tokens: &[u32]) -> Result<Option<Features>> {
        (**self).prefill(seq, tokens)
    }
    fn kv_room(&self) -> Option<KvRoom> {
        (**self).kv_room()
    }
    fn set_op_clock(&mut self, on: bool) -> bool {
        (**self).set_op_clock(on)
    }
    fn take_op_times(&mut self) -> Vec<crate::llama::OpTime> {
        (**self).take_op_times()
    }
    fn commit(&mut self, seq: SeqId, path: &[usize]) -> Result<()> {
        (**self).commit(seq, path)
    }
    fn rewind(&mut self, seq: SeqId, n: usize) -> Result<()> {
        (**self).rewind(seq, n)
    }
}
