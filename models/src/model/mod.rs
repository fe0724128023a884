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

pub use step::{Features, Logits, SeqId, SequenceStep};

use crate::error::Result;

/// A causal language model over a paged KV cache, forwarding ragged batches of token trees.
///
/// Implementations must be **batch-invariant**: the logits of a new token depend only on its
/// sequence's committed prefix and its ancestors in its tree, bit for bit — not on how many other
/// tokens or sequences share the call. This makes greedy speculative output equal greedy plain
/// output.
pub trait LanguageModel: Send {
    /// Number of rows of the output logits (the vocabulary size, padding ids included).
    fn vocab_size(&self) -> usize;

    /// How many logits per row are computed: the ids `0..logit_rows()`; the rest of each row is
    /// `-inf`. The whole vocabulary unless [`LanguageModel::limit_logits`] was called.
    fn logit_rows(&self) -> usize {
        self.vocab_size()
    }

    /// From now on computes only the logits of token ids `0..rows` (the rest of each row is
    /// `-inf`): for a draft model, whose distribution may be anything the verifier is told
    /// (rejection sampling stays exact when `q` is zero outside a subset), a cheaper LM head.
    /// With byte-level BPE vocabularies, whose ids follow merge order, low ids are the frequent
    /// tokens (the idea of FR-Spec, Zhao et al. 2025). `rows = vocab_size()` lifts the limit.
    ///
    /// # Errors
    /// `rows` outside `1..=vocab_size()`; a model that cannot limit its head (the default).
    fn limit_logits(&mut self, rows: usize) -> Result<()> {
        Err(crate::error::ModelError::Config(format!(
            "this model computes the whole vocabulary (asked to limit it to {rows} logits)"
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

    /// Forwards `tokens` after the committed ones of `seq` as a chain and commits them all,
    /// returning no logits: a prompt prefill, whose logits nobody reads, so a model may skip
    /// its LM head (the default forwards and drops them). Later logits are the same either way
    /// (the K/V written do not depend on the head). Returns the tokens' tapped features when
    /// the model taps any ([`LanguageModel::tap_features`]), the same rows a forward gives.
    ///
    /// # Errors
    /// As [`LanguageModel::forward`] and [`LanguageModel::commit`]; an empty `tokens` is an
    /// error of `forward`'s.
    fn prefill(&mut self, seq: SeqId, tokens: &[u32]) -> Result<Option<Features>> {
        let chain = specdec_kernels::TreeTopology::chain(tokens.len());
        let mut logits = self.forward(&[SequenceStep::chain(seq, tokens, &chain)])?;
        self.commit(seq, &(0..tokens.len()).collect::<Vec<_>>())?;
        Ok(logits.pop().and_then(|mut l| l.take_features()))
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

    /// Blocks of the paged KV cache in use now, over all open sequences (speculative entries
    /// included); `None` for a model without a paged cache (the default).
    fn kv_blocks_in_use(&self) -> Option<usize> {
        None
    }
}

/// A boxed model is a model: what [`crate::llama::load_on_device`] returns can drive the engine
/// and the drafters, which take any `M: LanguageModel`.
impl<M: LanguageModel + ?Sized> LanguageModel for Box<M> {
    fn vocab_size(&self) -> usize {
        (**self).vocab_size()
    }
    fn logit_rows(&self) -> usize {
        (**self).logit_rows()
    }
    fn limit_logits(&mut self, rows: usize) -> Result<()> {
        (**self).limit_logits(rows)
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
    fn prefill(&mut self, seq: SeqId, tokens: &[u32]) -> Result<Option<Features>> {
        (**self).prefill(seq, tokens)
    }
    fn kv_blocks_in_use(&self) -> Option<usize> {
        (**self).kv_blocks_in_use()
    }
    fn commit(&mut self, seq: SeqId, path: &[usize]) -> Result<()> {
        (**self).commit(seq, path)
    }
    fn rewind(&mut self, seq: SeqId, n: usize) -> Result<()> {
        (**self).rewind(seq, n)
    }
}
