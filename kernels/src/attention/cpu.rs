//! CPU reference of tree attention over the paged KV cache.
//!
//! For every sequence of a ragged batch, the queries are its `n = tree.len()` new tokens and the
//! keys are its `prefix_len` cached tokens (logical positions `0..prefix_len`, all visible) plus
//! the new tokens, stored at positions `prefix_len + node` (node order, as reserved by
//! [`crate::kv::PagedKvCache::reserve`]). Node `i` sees node `j` iff `j` is an ancestor of `i` or
//! `i` itself (a chain gives the causal mask). Positions for RoPE are `prefix_len + depth`; RoPE is
//! already applied to the stored keys and to the queries.
//!
//! # Batch invariance
//! Query `(node i, head h)` reduces over the **logical key sequence**
//! `prefix 0..prefix_len, then the root-to-i path by depth`, numbered `0..prefix_len + depth(i) + 1`
//! and split into chunks at multiples of [`KEY_CHUNK`]. Per chunk: scores `dot(q, k) * scale`, chunk
//! maximum, one rescale of the running `(max, sum, acc)` state, then weights `exp(s - max)` (a fixed polynomial, `simd::exp_nonpositive`) added
//! to `sum` and `weight · v` to `acc`, keys in order. That
//! sequence of operations depends only on the query, its visible keys and their logical order —
//! never on the block size, the physical blocks, the rest of the tree or the batch. So a token's
//! output is bit-identical alone (its path committed as prefix), in a chain, in a tree or in a batch.
//!
//! Work is split into rayon tasks of (sequence, KV head, up to [`ROW_TILE`] query rows); the
//! query rows of one KV head are its `group = num_q_heads / num_kv_heads` query heads (GQA:
//! query head `h` reads KV head `h / group`).

use std::ops::Range;

use rayon::prelude::*;

use crate::attention::simd;
use crate::error::{KernelError, Result};
use crate::kv::{BlockId, KvDtype, KvLayout, KvPages, KvPart};
use crate::quant::SimdLevel;
use crate::tree::{TreeTopology, MASK_WORD_BITS};

/// Logical keys per online-softmax chunk. Part of the numerical contract (batch invariance, and
/// the CUDA twin's reduction order): changing it changes results in the last bits.
pub const KEY_CHUNK: usize = 64;

/// The most query rows (node × query head of one KV head) per rayon task. Does not affect
/// results.
pub const ROW_TILE: usize = 16;

/// Query rows per task for a batch whose sequences have `rows_per_kv_head` query rows each
/// (nodes × query heads of one KV head) on `kv_heads` KV heads, on `threads` threads.
/// [`ROW_TILE`] when its tasks already share out evenly over the threads (their number a
/// multiple of `threads`: Qwen2.5's 2 KV heads on 2 threads). Otherwise smaller tiles, aiming at
/// four tasks per thread, down to one row: a decode step of SmolLM2 (3 KV heads × 3 query heads)
/// would make three tasks, two threads sharing them two to one. Smaller tiles read a KV head's
/// rows once per tile (memory traffic), which is why balanced batches keep the large tile.
pub(crate) fn row_tile(
    rows_per_kv_head: impl Iterator<Item = usize> + Clone,
    kv_heads: usize,
    threads: usize,
) -> usize {
    let threads = threads.max(1);
    let tasks: usize = rows_per_kv_head
        .clone()
        .map(|r| kv_heads * r.div_ceil(ROW_TILE))
        .sum();
    if tasks.is_multiple_of(threads) {
        return ROW_TILE;
    }
    let rows: usize = rows_per_kv_head.sum::<usize>() * kv_heads;
    rows.div_ceil(4 * threads).clamp(1, ROW_TILE)
}

/// One sequence of a ragged attention batch.
#[derive(Debug, Clone, Copy)]
pub struct AttentionSeq<'a> {
    /// Queries of the new tokens, `[tree.len()][num_q_heads][head_dim]` row-major, RoPE applied.
    pub queries: &'a [f32],
    /// Physical blocks of the sequence, covering at least `prefix_len + tree.len()` slots.
    pub block_table: &'a [BlockId],
    /// Cached tokens before the new ones (the committed length of the sequence).
    pub prefix_len: usize,
    /// Shape of the new tokens: a chain (causal) or a tree (ancestor masks).
    pub tree: &'a TreeTopology,
}

/// What is shared by every sequence of one attention call.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttentionParams {
    /// Layer whose K/V are read from the cache.
    pub layer: usize,
    /// Query heads: a positive multiple of the cache's KV heads.
    pub num_q_heads: usize,
    /// Multiplier of `q · k`, usually `1 / sqrt(head_dim)`.
    pub scale: f32,
}

/// Tree attention for a ragged batch; returns `[Σ tree.len()][num_q_heads][head_dim]`, the
/// sequences' outputs concatenated in batch order.
///
/// # Errors
/// As [`tree_attention_into`].
pub fn tree_attention(
    pages: &KvPages<'_>,
    params: &AttentionParams,
    batch: &[AttentionSeq<'_>],
) -> Result<Vec<f32>> {
    let row = params.num_q_heads * pages.layout().head_dim();
    let total: usize = batch.iter().map(|s| s.tree.len()).sum();
    let mut out = vec![0.0; total * row];
    tree_attention_into(pages, params, batch, &mut out)?;
    Ok(out)
}

/// Tree attention for a ragged batch into `out`, `[Σ tree.len()][num_q_heads][head_dim]`.
///
/// # Errors
/// [`KernelError::InvalidConfig`] if `num_q_heads` is not a positive multiple of the KV heads;
/// [`KernelError::OutOfRange`] for a bad layer or a block id outside the pool;
/// [`KernelError::ShapeMismatch`] for queries, block tables or `out` of the wrong size.
/// Nothing is written on error.
pub fn tree_attention_into(
    pages: &KvPages<'_>,
    params: &AttentionParams,
    batch: &[AttentionSeq<'_>],
    out: &mut [f32],
) -> Result<()> {
    tree_attention_into_with(pages, params, batch, out, SimdLevel::detect())
}

/// [`tree_attention_into`] with its inner loops at an explicit [`SimdLevel`] (for tests and
/// benchmarks); every level gives the same bits. The loops have a portable and an AVX2 build:
/// [`SimdLevel::Avx512`] runs the AVX2 one.
///
/// # Errors
/// As [`tree_attention_into`], and [`KernelError::InvalidParameter`] when `level` is not
/// available on this CPU.
pub fn tree_attention_into_with(
    pages: &KvPages<'_>,
    params: &AttentionParams,
    batch: &[AttentionSeq<'_>],
    out: &mut [f32],
    level: SimdLevel,
) -> Result<()> {
    level.ensure_available()?;
    let layout = pages.layout();
    let dim = layout.head_dim();
    let kv_heads = layout.num_kv_heads();
    let checked = check_batch(layout, pages.num_blocks(), params, batch)?;
    let (group, offsets, total) = (checked.group, checked.offsets, checked.total);
    if out.len() != total {
        return Err(KernelError::ShapeMismatch {
            what: "attention output [Σ n_new, num_q_heads, head_dim]".to_string(),
            expected: total,
            actual: out.len(),
        });
    }

    let tile = row_tile(
        batch.iter().map(|s| s.tree.len() * group),
        kv_heads,
        rayon::current_num_threads(),
    );
    let tasks: Vec<Task> = batch
        .iter()
        .enumerate()
        .flat_map(|(seq, s)| {
            let rows = s.tree.len() * group;
            (0..kv_heads).flat_map(move |kv_head| {
                (0..rows).step_by(tile).map(move |start| Task {
                    seq,
                    kv_head,
                    rows: start..(start + tile).min(rows),
                })
            })
        })
        .collect();
    let ctx = Context {
        pages,
        params,
        group,
        level,
    };
    let results: Vec<Vec<f32>> = tasks
        .par_iter()
        .map(|task| run_task(&ctx, &batch[task.seq], task))
        .collect();
    for (task, result) in tasks.iter().zip(results) {
        for (r, values) in task.rows.clone().zip(result.chunks_exact(dim)) {
            let (node, g) = (r / group, r % group);
            let q_head = task.kv_head * group + g;
            let at = offsets[task.seq] + (node * params.num_q_heads + q_head) * dim;
            out[at..at + dim].copy_from_slice(values);
        }
    }
    Ok(())
}

/// Query rows `rows` (row `r` = node `r / group`, query head `kv_head * group + r % group`) of
/// one sequence.
#[derive(Debug, Clone)]
struct Task {
    seq: usize,
    kv_head: usize,
    rows: Range<usize>,
}

struct Context<'p, 'a> {
    pages: &'p KvPages<'a>,
    params: &'p AttentionParams,
    group: usize,
    /// Instruction set of the inner loops (the bits do not depend on it).
    level: SimdLevel,
}

/// What [`check_batch`] derives from a valid batch.
pub(crate) struct CheckedBatch {
    /// Query heads per KV head.
    pub group: usize,
    /// Floats per token of output: `num_q_heads * head_dim`.
    pub token_out: usize,
    /// Start of each sequence's rows in the output.
    pub offsets: Vec<usize>,
    /// Output length: `Σ n_new * token_out`.
    pub total: usize,
}

/// The input checks of tree attention, shared by the CPU reference and the CUDA launcher: GQA
/// heads, layer, query sizes and block tables (against a pool of `num_blocks` blocks).
///
/// # Errors
/// As [`tree_attention_into`] (all but the `out` size).
/// `(group, token_out)`: query heads per KV head and values per query row, after checking that
/// `num_q_heads` is a positive multiple of the KV heads and `layer` one of the layout's.
pub(crate) fn check_heads(
    layout: &KvLayout,
    num_q_heads: usize,
    layer: usize,
) -> Result<(usize, usize)> {
    let kv_heads = layout.num_kv_heads();
    if num_q_heads == 0 || !num_q_heads.is_multiple_of(kv_heads) {
        return Err(KernelError::InvalidConfig {
            reason: format!(
                "attention: {num_q_heads} query heads is not a positive multiple of {kv_heads} KV heads"
            ),
        });
    }
    if layer >= layout.num_layers() {
        return Err(KernelError::OutOfRange {
            what: "attention layer".to_string(),
            index: layer,
            limit: layout.num_layers(),
        });
    }
    Ok((num_q_heads / kv_heads, num_q_heads * layout.head_dim()))
}

pub(crate) fn check_batch(
    layout: &KvLayout,
    num_blocks: usize,
    params: &AttentionParams,
    batch: &[AttentionSeq<'_>],
) -> Result<CheckedBatch> {
    let (group, token_out) = check_heads(layout, params.num_q_heads, params.layer)?;
    let mut offsets = Vec::with_capacity(batch.len());
    let mut total = 0;
    for (index, seq) in batch.iter().enumerate() {
        let n = seq.tree.len();
        if seq.queries.len() != n * token_out {
            return Err(KernelError::ShapeMismatch {
                what: format!("queries of batch entry {index} [n_new, num_q_heads, head_dim]"),
                expected: n * token_out,
                actual: seq.queries.len(),
            });
        }
        layout.check_block_table(num_blocks, seq.block_table, seq.prefix_len + n)?;
        offsets.push(total);
        total += n * token_out;
    }
    Ok(CheckedBatch {
        group,
        token_out,
        offsets,
        total,
    })
}

fn run_task(ctx: &Context<'_, '_>, seq: &AttentionSeq<'_>, task: &Task) -> Vec<f32> {
    #[cfg(target_arch = "x86_64")]
    if ctx.level != SimdLevel::Portable {
        if let Some(avx2) = simd::Avx2::detect() {
            // SAFETY: `avx2` exists only if the CPU supports AVX2.
            return unsafe { run_task_avx2(ctx, seq, task, avx2) };
        }
    }
    run_task_body(ctx, seq, task, simd::Portable)
}

/// The same code as [`run_task_body`], compiled for AVX2 (results are bit-identical: see
/// [`simd`]).
///
/// # Safety
/// The CPU must support AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn run_task_avx2(
    ctx: &Context<'_, '_>,
    seq: &AttentionSeq<'_>,
    task: &Task,
    avx2: simd::Avx2,
) -> Vec<f32> {
    run_task_body(ctx, seq, task, avx2)
}

/// Hands attention the K and V rows of up to [`KEY_CHUNK`] logical positions of one sequence
/// and KV head as f32: borrowed from an f32 pool, widened (exactly) into scratch rows from a
/// 16-bit one, so the arithmetic that follows is the same for every element type.
struct ChunkLoader<'p, 'a> {
    pages: &'p KvPages<'a>,
    table: &'p [BlockId],
    layer: usize,
    kv_head: usize,
    /// `[K, V][KEY_CHUNK][head_dim]` widened rows (empty for an f32 pool).
    scratch: Vec<f32>,
}

/// The K and V rows of one chunk of logical positions (at most [`KEY_CHUNK`]), in order, as
/// [`ChunkLoader::load`] hands them out.
struct ChunkRows<'s> {
    keys: [&'s [f32]; KEY_CHUNK],
    values: [&'s [f32]; KEY_CHUNK],
    n: usize,
}

impl<'s> ChunkRows<'s> {
    fn keys(&self) -> &[&'s [f32]] {
        &self.keys[..self.n]
    }

    fn values(&self) -> &[&'s [f32]] {
        &self.values[..self.n]
    }
}

impl ChunkLoader<'_, '_> {
    /// The K and V rows of `positions` (at most [`KEY_CHUNK`]), in order. Returned rather than
    /// handed to a callback, so that the arithmetic on them stays in the caller's function and
    /// is compiled with its target features (a closure is compiled without them).
    #[inline(always)]
    fn load(&mut self, positions: impl Iterator<Item = usize>) -> ChunkRows<'_> {
        let layout = self.pages.layout();
        let (dim, bs) = (layout.head_dim(), layout.block_size());
        let (layer, kv_head, table) = (self.layer, self.kv_head, self.table);
        let offset =
            |pos: usize, part| layout.row_offset(table[pos / bs], layer, part, kv_head, pos % bs);
        let mut rows = ChunkRows {
            keys: [&[]; KEY_CHUNK],
            values: [&[]; KEY_CHUNK],
            n: 0,
        };
        if let Some(data) = self.pages.data().as_f32() {
            for pos in positions {
                let (k, v) = (offset(pos, KvPart::Key), offset(pos, KvPart::Value));
                rows.keys[rows.n] = &data[k..k + dim];
                rows.values[rows.n] = &data[v..v + dim];
                rows.n += 1;
            }
            return rows;
        }
        let data = self.pages.data();
        let (key_rows, value_rows) = self.scratch.split_at_mut(KEY_CHUNK * dim);
        let mut chunk = [0usize; KEY_CHUNK];
        let mut n = 0;
        for pos in positions {
            chunk[n] = pos;
            n += 1;
        }
        // consecutive positions in one block are consecutive rows of its tile: widened at once
        let mut i = 0;
        while i < n {
            let mut run = 1;
            while i + run < n && chunk[i + run] == chunk[i] + run && (chunk[i] + run) % bs != 0 {
                run += 1;
            }
            let span = i * dim..(i + run) * dim;
            data.widen_into(offset(chunk[i], KvPart::Key), &mut key_rows[span.clone()]);
            data.widen_into(offset(chunk[i], KvPart::Value), &mut value_rows[span]);
            i += run;
        }
        for (i, (k, v)) in key_rows
            .chunks_exact(dim)
            .zip(value_rows.chunks_exact(dim))
            .take(n)
            .enumerate()
        {
            rows.keys[i] = k;
            rows.values[i] = v;
        }
        rows.n = n;
        rows
    }
}

/// Running online-softmax state of one query row.
struct RowState<'o> {
    max: f32,
    sum: f32,
    acc: &'o mut [f32],
}

impl RowState<'_> {
    /// Adds one chunk of keys (in logical order) to the state of query `q`.
    #[inline(always)]
    fn absorb<D: simd::Dot>(
        &mut self,
        kernel: D,
        q: &[f32],
        keys: &[&[f32]],
        values: &[&[f32]],
        scale: f32,
        scores: &mut [f32],
    ) {
        let scores = &mut scores[..keys.len()];
        let mut chunk_max = f32::NEG_INFINITY;
        for (s, k) in scores.iter_mut().zip(keys) {
            *s = kernel.dot(q, k) * scale;
            chunk_max = chunk_max.max(*s);
        }
        let new_max = self.max.max(chunk_max);
        if new_max > self.max {
            if self.max != f32::NEG_INFINITY {
                let alpha = simd::exp_nonpositive(self.max - new_max);
                self.sum *= alpha;
                simd::scale(self.acc, alpha);
            }
            self.max = new_max;
        }
        for s in scores.iter_mut() {
            *s = simd::exp_nonpositive(*s - new_max);
        }
        for p in scores.iter() {
            self.sum += p;
        }
        simd::accumulate(self.acc, scores, values);
    }
}

/// The query of row `r` of a task on `kv_head` (node `r / group`, query head
/// `kv_head * group + r % group`).
#[inline(always)]
fn query<'q>(seq: &AttentionSeq<'q>, ctx: &Context<'_, '_>, kv_head: usize, r: usize) -> &'q [f32] {
    let dim = ctx.pages.layout().head_dim();
    let (node, g) = (r / ctx.group, r % ctx.group);
    let at = (node * ctx.params.num_q_heads + kv_head * ctx.group + g) * dim;
    &seq.queries[at..at + dim]
}

#[inline(always)]
fn run_task_body<D: simd::Dot>(
    ctx: &Context<'_, '_>,
    seq: &AttentionSeq<'_>,
    task: &Task,
    kernel: D,
) -> Vec<f32> {
    let pages = ctx.pages;
    let layout = pages.layout();
    let dim = layout.head_dim();
    let (layer, scale) = (ctx.params.layer, ctx.params.scale);
    let kv_head = task.kv_head;
    let mut loader = ChunkLoader {
        pages,
        table: seq.block_table,
        layer,
        kv_head,
        scratch: match pages.dtype() {
            KvDtype::F32 => Vec::new(),
            _ => vec![0.0; 2 * KEY_CHUNK * dim],
        },
    };

    let mut out = vec![0.0f32; task.rows.len() * dim];
    let mut states: Vec<RowState<'_>> = out
        .chunks_exact_mut(dim)
        .map(|acc| RowState {
            max: f32::NEG_INFINITY,
            sum: 0.0,
            acc,
        })
        .collect();
    let mut scores = vec![0.0f32; KEY_CHUNK];

    // Whole chunks of the prefix: the same keys for every row.
    let prefix = seq.prefix_len;
    let whole_chunks = prefix / KEY_CHUNK;
    for chunk in 0..whole_chunks {
        let rows = loader.load(chunk * KEY_CHUNK..(chunk + 1) * KEY_CHUNK);
        for (r, state) in task.rows.clone().zip(states.iter_mut()) {
            let q = query(seq, ctx, kv_head, r);
            state.absorb(kernel, q, rows.keys(), rows.values(), scale, &mut scores);
        }
    }

    // The rest: prefix tail, then the node's root-to-node path, chunked from a chunk boundary.
    let tail_start = whole_chunks * KEY_CHUNK;
    let is_chain = seq.tree.is_chain();
    let mut positions: Vec<usize> = Vec::new();
    let mut positions_node = usize::MAX;
    for (r, state) in task.rows.clone().zip(states.iter_mut()) {
        let node = r / ctx.group;
        if node != positions_node {
            positions.clear();
            positions.extend(tail_start..prefix);
            if is_chain {
                positions.extend(prefix..=prefix + node);
            } else {
                for (w, &word) in seq.tree.ancestor_mask(node).iter().enumerate() {
                    let mut bits = word;
                    while bits != 0 {
                        let ancestor = w * MASK_WORD_BITS + bits.trailing_zeros() as usize;
                        positions.push(prefix + ancestor);
                        bits &= bits - 1;
                    }
                }
            }
            positions_node = node;
        }
        let q = query(seq, ctx, kv_head, r);
        for chunk in positions.chunks(KEY_CHUNK) {
            let rows = loader.load(chunk.iter().copied());
            state.absorb(kernel, q, rows.keys(), rows.values(), scale, &mut scores);
        }
    }

    for state in &mut states {
        let sum = state.sum;
        for a in state.acc.iter_mut() {
            *a /= sum;
        }
    }
    drop(states);
    out
}
