//! What a decoder block's forward is shaped by, on every device: the widths of a block
//! ([`BlockShape`]), the sequences of a batch ([`BlockSeq`]), a rank's tensor-parallel group
//! ([`TensorParallel`]), and the speculative KV bookkeeping around the blocks
//! ([`SpeculativeCache`]), shared by the target's forward ([`super::LlamaModel`]) and the EAGLE
//! draft head ([`crate::heads::EagleHead`]). The block's arithmetic is
//! [`super::forward::run_block`].

use std::collections::HashMap;

use specdec_kernels::kv::{KvDtype, KvLayout, PagedKvCache};
use specdec_kernels::ops::RopeLayout;
use specdec_kernels::TreeTopology;

use super::forward::KvPool;
use super::step_checks::check_commit_path;
use crate::error::{ModelError, Result};
use crate::model::{SeqId, SequenceStep};
use crate::shard::{Communicator, ShardPlan};

/// The widths and constants of a block as one rank runs it (its share of the heads and FFN
/// rows; everything for a single rank).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct BlockShape {
    /// Residual width.
    pub(crate) hidden: usize,
    /// Width of one attention head.
    pub(crate) head_dim: usize,
    /// Query heads of this rank.
    pub(crate) q_heads: usize,
    /// KV heads of this rank (divides `q_heads`).
    pub(crate) kv_heads: usize,
    /// SwiGLU rows of this rank.
    pub(crate) ffn: usize,
    /// RMSNorm epsilon of the block's two norms.
    pub(crate) rms_eps: f32,
    /// How RoPE pairs the dimensions of a head.
    pub(crate) rope_layout: RopeLayout,
}

impl BlockShape {
    /// Width of this rank's queries (`q_heads · head_dim`).
    pub(crate) fn q_width(&self) -> usize {
        self.q_heads * self.head_dim
    }

    /// The attention's multiplier of `q · k`: `1 / sqrt(head_dim)`.
    pub(crate) fn attention_scale(&self) -> f32 {
        1.0 / (self.head_dim as f32).sqrt()
    }

    /// Width of this rank's keys and values (`kv_heads · head_dim`).
    pub(crate) fn kv_width(&self) -> usize {
        self.kv_heads * self.head_dim
    }
}

/// One sequence of a block's batch: its new rows are `tree.len()` consecutive rows of `x`, in
/// batch order, at positions `committed_len + depth`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct BlockSeq<'a> {
    /// The sequence (in the cache the block writes).
    pub(crate) seq: SeqId,
    /// The shape of its new rows.
    pub(crate) tree: &'a TreeTopology,
}

impl<'a> BlockSeq<'a> {
    /// The sequences of a forward's steps, in step order.
    pub(crate) fn of_steps(steps: &[SequenceStep<'a>]) -> Vec<Self> {
        steps
            .iter()
            .map(|step| BlockSeq {
                seq: step.seq,
                tree: step.tree,
            })
            .collect()
    }
}

/// The tensor-parallel group a rank's block combines its partial products over.
#[derive(Clone, Copy)]
pub(crate) struct TensorParallel<'a> {
    /// The group.
    pub(crate) comm: &'a dyn Communicator,
    /// This rank's share.
    pub(crate) plan: &'a ShardPlan,
    /// The query width of all ranks together (the row width of a gathered attention output).
    pub(crate) q_dim: usize,
}

impl TensorParallel<'_> {
    /// The columns `plan.o_cols` of every token's full attention output, gathered from all
    /// ranks' `attn` (`[n, own query width]`): the input of an output projection split off the
    /// head boundaries (`plan.gather_attention`).
    ///
    /// # Errors
    /// Communicator errors.
    pub(crate) fn gathered_attention(&self, attn: &[f32], n: usize) -> Result<Vec<f32>> {
        let full = interleave(&self.comm.all_gather(attn)?, n);
        let cols = self.plan.o_cols.clone();
        Ok(full
            .chunks(self.q_dim)
            .flat_map(|row| row[cols.clone()].iter().copied())
            .collect())
    }
}

/// `x += y` element-wise.
pub(crate) fn add(x: &mut [f32], y: &[f32]) {
    for (a, b) in x.iter_mut().zip(y) {
        *a += b;
    }
}

/// Joins per-rank `[n, width_r]` row-major parts into `[n, Σ width_r]`, rank after rank in
/// each row.
pub(crate) fn interleave(parts: &[Vec<f32>], n: usize) -> Vec<f32> {
    let total: usize = parts.iter().map(Vec::len).sum();
    let mut out = Vec::with_capacity(total);
    for t in 0..n {
        for part in parts {
            let w = part.len() / n;
            out.extend_from_slice(&part[t * w..(t + 1) * w]);
        }
    }
    out
}

/// Runs `work` on a rayon worker thread: a forward run there starts its parallel products from
/// a pool thread instead of handing off from, and waking, an outside caller each time (the
/// caller already on the pool runs it in place). Not for ranks of a tensor-parallel group, which
/// block in collectives and must not hold pool threads the other ranks' products need.
pub(crate) fn on_pool<R: Send>(work: impl FnOnce() -> R + Send) -> R {
    if rayon::current_thread_index().is_none() {
        return rayon::scope(|_| work());
    }
    work()
}

/// A paged KV cache whose sequences take new rows as speculative entries, with the tree of each
/// sequence's last forward kept for [`SpeculativeCache::commit`]: the life cycle of
/// [`crate::LanguageModel`] (reserve, commit a root-to-node path, rewind, release).
#[derive(Debug)]
pub(crate) struct SpeculativeCache {
    cache: PagedKvCache,
    last_trees: HashMap<SeqId, TreeTopology>,
}

impl SpeculativeCache {
    /// A cache of `layout` with room for `capacity_tokens` slots (rounded up to whole blocks)
    /// of `dtype` elements.
    ///
    /// # Errors
    /// Kernel errors for an empty pool.
    pub(crate) fn new(layout: KvLayout, capacity_tokens: usize, dtype: KvDtype) -> Result<Self> {
        let blocks = capacity_tokens.div_ceil(layout.block_size());
        Ok(Self {
            cache: PagedKvCache::with_dtype(layout, blocks, dtype)?,
            last_trees: HashMap::new(),
        })
    }

    /// The cache.
    pub(crate) fn cache(&self) -> &PagedKvCache {
        &self.cache
    }

    /// The cache, writable (for the blocks' K/V).
    pub(crate) fn cache_mut(&mut self) -> &mut PagedKvCache {
        &mut self.cache
    }

    /// Committed length of `seq`.
    ///
    /// # Errors
    /// An unknown sequence.
    pub(crate) fn len(&self, seq: SeqId) -> Result<usize> {
        Ok(self.cache.len(seq)?)
    }

    /// Opens an empty sequence.
    pub(crate) fn create_sequence(&mut self) -> SeqId {
        self.cache.create_sequence()
    }

    /// Opens a sequence sharing the committed tokens of `seq`.
    ///
    /// # Errors
    /// As [`PagedKvCache::fork`].
    pub(crate) fn fork(&mut self, seq: SeqId) -> Result<SeqId> {
        Ok(self.cache.fork(seq)?)
    }

    /// Closes `seq`.
    ///
    /// # Errors
    /// An unknown sequence.
    pub(crate) fn release(&mut self, seq: SeqId) -> Result<()> {
        self.cache.free_sequence(seq)?;
        self.last_trees.remove(&seq);
        Ok(())
    }

    /// Discards every sequence's stale speculative entries and reserves slots for its new rows,
    /// all or nothing; `capacity_option` names the option to raise in the message of a full
    /// cache. A copy-on-write is bookkeeping ([`PagedKvCache::reserve_blocks`]) then the host
    /// pool's move ([`KvPool::move_kv`]), as on the CUDA runner.
    ///
    /// # Errors
    /// [`ModelError::InvalidStep`] when the blocks needed exceed the free ones; cache errors.
    pub(crate) fn reserve(&mut self, seqs: &[BlockSeq<'_>], capacity_option: &str) -> Result<()> {
        let mut needed = 0;
        for s in seqs {
            self.cache.rewind(s.seq, 0)?;
            self.last_trees.remove(&s.seq);
            needed += self.cache.blocks_needed(s.seq, s.tree.len())?;
        }
        let free = self.cache.allocator().free_blocks();
        if needed > free {
            return Err(ModelError::InvalidStep {
                seq: seqs[0].seq.0,
                reason: format!(
                    "the batch needs {needed} KV blocks but {free} are free \
                     (raise {capacity_option})"
                ),
            });
        }
        for s in seqs {
            let (_, copy_on_write) = self.cache.reserve_blocks(s.seq, s.tree.len())?;
            self.cache.move_kv(&copy_on_write)?;
        }
        Ok(())
    }

    /// Remembers `tree` as the last forward of `seq` (what a commit path refers to).
    pub(crate) fn record_tree(&mut self, seq: SeqId, tree: &TreeTopology) {
        self.last_trees.insert(seq, tree.clone());
    }

    /// Keeps `path` (a root-to-node path of the last forward of `seq`, or empty) as committed
    /// rows and discards the other speculative entries: the device-independent bookkeeping
    /// ([`PagedKvCache::commit_blocks`], as the CUDA runner's mirror does it), then the host
    /// pool's data move ([`KvPool::move_kv`]).
    ///
    /// # Errors
    /// An unknown sequence; [`ModelError::InvalidStep`] for a path that is not one.
    pub(crate) fn commit(&mut self, seq: SeqId, path: &[usize]) -> Result<()> {
        self.cache.len(seq)?;
        check_commit_path(seq, path, self.last_trees.get(&seq))?;
        let (_, moves) = self.cache.commit_blocks(seq, path)?;
        self.cache.move_kv(&moves)?;
        self.last_trees.remove(&seq);
        Ok(())
    }

    /// Drops the last `n` committed rows of `seq` and any speculative entries (bookkeeping
    /// only: no data moves).
    ///
    /// # Errors
    /// An unknown sequence, or fewer than `n` committed rows.
    pub(crate) fn rewind(&mut self, seq: SeqId, n: usize) -> Result<()> {
        self.cache.rewind(seq, n)?;
        self.last_trees.remove(&seq);
        Ok(())
    }
}
