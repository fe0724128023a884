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

pub use step::{Logits, SeqId, SequenceStep};

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

/// A boxed model is a model: what [`crate::llama::load_on_device`] returns can drive the engine
/// and the drafters, which take any `M: LanguageModel`.
impl<M: LanguageModel + ?Sized> LanguageModel for Box<M> {
    fn vocab_size(&self) -> usize {
        (**self).vocab_size()
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
    fn commit(&mut self, seq: SeqId, path: &[usize]) -> Result<()> {
        (**self).commit(seq, path)
    }
    fn rewind(&mut self, seq: SeqId, n: usize) -> Result<()> {
        (**self).rewind(seq, n)
    }
}
