//! One Llama decoder block over a paged KV cache ([`BlockPass::run`]), and the speculative KV
//! bookkeeping around it ([`SpeculativeCache`]): shared by the target's forward
//! ([`super::LlamaModel`]) and the EAGLE draft head ([`crate::heads::EagleHead`]), so both run
//! the same arithmetic in the same order.
//!
//! A block, for the `n` new rows `x` of a ragged batch: `h = rmsnorm(x)`, `q, k, v = h·Wᵀ (+b)`
//! (one fused call where the 8-bit path allows), RoPE on `q` and `k`, K/V written to the
//! sequences' speculative slots, tree attention over the paged cache, `x += o·Woᵀ`,
//! `h = rmsnorm(x)`, `x += (silu(h·Wgᵀ) ⊙ h·Wuᵀ)·Wdᵀ`. As a rank of a tensor-parallel group the
//! block multiplies its share and all-reduces the two residual updates (all-gathering the
//! attention output first when the plan says so).

use std::collections::HashMap;

use specdec_kernels::attention::{tree_attention_into, AttentionParams, AttentionSeq};
use specdec_kernels::kv::{KvDtype, KvLayout, PagedKvCache};
use specdec_kernels::ops::{apply_rope, rms_norm, swiglu, RopeAngles, RopeLayout};
use specdec_kernels::TreeTopology;

use super::model::MatmulPath;
use super::product::ProductInput;
use super::step_checks::check_commit_path;
use super::weights::LayerWeights;
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
    fn q_width(&self) -> usize {
        self.q_heads * self.head_dim
    }

    /// Width of this rank's keys and values (`kv_heads · head_dim`).
    fn kv_width(&self) -> usize {
        self.kv_heads * self.head_dim
    }
}

/// The working buffers of one forward's blocks for `n` rows, allocated once per forward and
/// reused by every block. After [`BlockPass::run`], `h` holds nothing of use and may serve as
/// the output of the final norm.
pub(crate) struct BlockScratch {
    /// Normed input `[n, hidden]`.
    pub(crate) h: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    attn: Vec<f32>,
    o: Vec<f32>,
    gate: Vec<f32>,
    up: Vec<f32>,
    act: Vec<f32>,
}

impl BlockScratch {
    /// Buffers for `n` rows of blocks of `shape`.
    pub(crate) fn new(n: usize, shape: &BlockShape) -> Self {
        let (q_w, kv_w) = (shape.q_width(), shape.kv_width());
        Self {
            h: vec![0.0; n * shape.hidden],
            q: vec![0.0; n * q_w],
            k: vec![0.0; n * kv_w],
            v: vec![0.0; n * kv_w],
            attn: vec![0.0; n * q_w],
            o: vec![0.0; n * shape.hidden],
            gate: vec![0.0; n * shape.ffn],
            up: vec![0.0; n * shape.ffn],
            act: vec![0.0; n * shape.ffn],
        }
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

/// What every block of one forward shares: the shape, the batch, the RoPE angles of its rows
/// and the matmul path.
pub(crate) struct BlockPass<'a> {
    /// The blocks' shape.
    pub(crate) shape: BlockShape,
    /// The sequences of the batch, in row order.
    pub(crate) seqs: &'a [BlockSeq<'a>],
    /// Angles of every row (`committed_len + depth` of its sequence).
    pub(crate) angles: &'a RopeAngles,
    /// How the products run.
    pub(crate) path: MatmulPath,
    /// The group of a sharded model; `None` for a single rank with nothing to combine.
    pub(crate) parallel: Option<TensorParallel<'a>>,
}

impl BlockPass<'_> {
    /// Runs block `w` on the residual rows `x` (`[n, hidden]`, updated in place), writing the
    /// new rows' K/V into `layer` of `cache` (whose slots [`SpeculativeCache::reserve`]
    /// reserved) and attending over each sequence's committed prefix and tree ancestors.
    ///
    /// # Errors
    /// Kernel errors (shapes, cache), communicator errors.
    pub(crate) fn run(
        &self,
        w: &LayerWeights,
        layer: usize,
        cache: &mut PagedKvCache,
        x: &mut [f32],
        s: &mut BlockScratch,
    ) -> Result<()> {
        let shape = &self.shape;
        let (q_w, kv_w) = (shape.q_width(), shape.kv_width());
        let n = x.len() / shape.hidden;
        let path = self.path;
        rms_norm(x, &w.attn_norm, shape.rms_eps, &mut s.h)?;
        ProductInput::new(&s.h, n, path).products(&mut [
            (&w.wq, &mut s.q),
            (&w.wk, &mut s.k),
            (&w.wv, &mut s.v),
        ])?;
        for (buf, bias, width) in [
            (&mut s.q, &w.bq, q_w),
            (&mut s.k, &w.bk, kv_w),
            (&mut s.v, &w.bv, kv_w),
        ] {
            if let Some(bias) = bias {
                for row in buf.chunks_mut(width) {
                    add(row, bias);
                }
            }
        }
        apply_rope(&mut s.q, shape.q_heads, self.angles, shape.rope_layout)?;
        apply_rope(&mut s.k, shape.kv_heads, self.angles, shape.rope_layout)?;
        let mut first = 0;
        for seq in self.seqs {
            let r = first * kv_w..(first + seq.tree.len()) * kv_w;
            cache.write_kv(seq.seq, layer, 0, &s.k[r.clone()], &s.v[r])?;
            first += seq.tree.len();
        }
        let mut batch = Vec::with_capacity(self.seqs.len());
        let mut first = 0;
        for seq in self.seqs {
            let rows = seq.tree.len();
            batch.push(AttentionSeq {
                queries: &s.q[first * q_w..(first + rows) * q_w],
                block_table: cache.block_table(seq.seq)?,
                prefix_len: cache.len(seq.seq)?,
                tree: seq.tree,
            });
            first += rows;
        }
        let params = AttentionParams {
            layer,
            num_q_heads: shape.q_heads,
            scale: 1.0 / (shape.head_dim as f32).sqrt(),
        };
        tree_attention_into(&cache.pages(), &params, &batch, &mut s.attn)?;
        match self.parallel {
            Some(tp) if tp.plan.gather_attention => {
                let full = interleave(&tp.comm.all_gather(&s.attn)?, n);
                let cols = tp.plan.o_cols.clone();
                let selected: Vec<f32> = full
                    .chunks(tp.q_dim)
                    .flat_map(|row| row[cols.clone()].iter().copied())
                    .collect();
                ProductInput::new(&selected, n, path).product(&w.wo, &mut s.o)?;
            }
            _ => ProductInput::new(&s.attn, n, path).product(&w.wo, &mut s.o)?,
        }
        self.all_reduce(&mut s.o)?;
        add(x, &s.o);
        rms_norm(x, &w.ffn_norm, shape.rms_eps, &mut s.h)?;
        ProductInput::new(&s.h, n, path)
            .products(&mut [(&w.w_gate, &mut s.gate), (&w.w_up, &mut s.up)])?;
        swiglu(&s.gate, &s.up, &mut s.act)?;
        ProductInput::new(&s.act, n, path).product(&w.w_down, &mut s.o)?;
        self.all_reduce(&mut s.o)?;
        add(x, &s.o);
        Ok(())
    }

    /// Sums `partial` over the group (nothing for a single rank).
    fn all_reduce(&self, partial: &mut [f32]) -> Result<()> {
        match self.parallel {
            Some(tp) => tp.comm.all_reduce_sum(partial),
            None => Ok(()),
        }
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
    /// cache.
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
            self.cache.reserve(s.seq, s.tree.len())?;
        }
        Ok(())
    }

    /// Remembers `tree` as the last forward of `seq` (what a commit path refers to).
    pub(crate) fn record_tree(&mut self, seq: SeqId, tree: &TreeTopology) {
        self.last_trees.insert(seq, tree.clone());
    }

    /// Keeps `path` (a root-to-node path of the last forward of `seq`, or empty) as committed
    /// rows and discards the other speculative entries.
    ///
    /// # Errors
    /// An unknown sequence; [`ModelError::InvalidStep`] for a path that is not one.
    pub(crate) fn commit(&mut self, seq: SeqId, path: &[usize]) -> Result<()> {
        self.cache.len(seq)?;
        check_commit_path(seq, path, self.last_trees.get(&seq))?;
        self.cache.commit(seq, path)?;
        self.last_trees.remove(&seq);
        Ok(())
    }

    /// Drops the last `n` committed rows of `seq` and any speculative entries.
    ///
    /// # Errors
    /// An unknown sequence, or fewer than `n` committed rows.
    pub(crate) fn rewind(&mut self, seq: SeqId, n: usize) -> Result<()> {
        self.cache.rewind(seq, n)?;
        self.last_trees.remove(&seq);
        Ok(())
    }
}
