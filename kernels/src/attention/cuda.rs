//! CUDA launcher for tree attention (`tree_attention.cu`): the contract of
//! [`tree_attention`](super::tree_attention) on an f32 KV pool resident on the GPU.
//!
//! Numerics: the GPU reduces every query over the same logical key order as the CPU (prefix, then
//! the root-to-node path), so it is batch-invariant by itself (bit-identical alone, in a chain, a
//! tree or a batch), but it groups keys differently (chunks of 256 over 4 warps, per-key online
//! softmax, FMA) from the CPU's chunks of [`KEY_CHUNK`](super::KEY_CHUNK): CPU and GPU agree
//! within `1e-5` relative (plus `1e-6` absolute) on unit-scale inputs, not bit for bit.
//! Supported: `head_dim` 64 or 128, at most 8 query heads per KV head.

use cudarc::driver::{CudaSlice, DevicePtr, DeviceRepr, LaunchConfig, PushKernelArg};

use super::cpu::{check_batch, check_heads, AttentionParams, AttentionSeq};
use crate::cuda::nvrtc::cuda_error;
use crate::cuda::{sources, Gpu};
use crate::error::{KernelError, Result};
use crate::kv::BlockId;
use crate::kv::KvLayout;
use crate::tree::TreeTopology;

/// Keys per split-K chunk of the CUDA kernel (`TA_CHUNK`).
pub const GPU_KEY_CHUNK: usize = 256;
/// Most query heads per KV head the kernel serves (`TA_MAXG`).
pub const GPU_MAX_GROUP: usize = 8;

#[repr(C)]
#[derive(Clone, Copy)]
struct TaParams {
    q: u64,
    pool: u64,
    q_seq: u64,
    q_node: u64,
    prefix_len: u64,
    new_len: u64,
    table_offsets: u64,
    block_tables: u64,
    mask_offsets: u64,
    masks: u64,
    partial_o: u64,
    partial_ml: u64,
    scale: f32,
    q_heads: u32,
    kv_heads: u32,
    layer: u32,
    block_size: u32,
    max_chunks: u32,
    block_elems: u64,
}

// SAFETY: plain `repr(C)` integers and a float, matching the kernel's by-value `TaParams`.
unsafe impl DeviceRepr for TaParams {}

/// One sequence of a ragged batch as [`AttentionPlan`] needs it: [`AttentionSeq`] without the
/// queries (which stay on the device).
#[derive(Debug, Clone, Copy)]
pub struct PlannedSeq<'a> {
    /// Physical blocks of the sequence, covering at least `prefix_len + tree.len()` slots.
    pub block_table: &'a [BlockId],
    /// Cached tokens before the new ones.
    pub prefix_len: usize,
    /// Shape of the new tokens.
    pub tree: &'a TreeTopology,
}

/// The device metadata of one ragged batch (query → sequence and node, prefix lengths, block
/// tables, ancestor masks) and its split-K scratch, uploaded once per forward and reused by every
/// layer's [`AttentionPlan::run`], whose queries and output stay on the device.
pub struct AttentionPlan {
    total_q: usize,
    num_q_heads: usize,
    kv_heads: usize,
    dim: usize,
    num_layers: usize,
    pool_len: usize,
    block_size: usize,
    block_elems: usize,
    max_chunks: usize,
    q_seq: CudaSlice<u32>,
    q_node: CudaSlice<u32>,
    prefix_len: CudaSlice<u32>,
    new_len: CudaSlice<u32>,
    table_offsets: CudaSlice<u32>,
    tables: CudaSlice<u32>,
    mask_offsets: CudaSlice<u32>,
    masks: CudaSlice<u64>,
    partial_o: CudaSlice<f32>,
    partial_ml: CudaSlice<f32>,
}

impl AttentionPlan {
    /// Checks `seqs` against `layout` and a pool of `pool_len` f32 values (the CPU reference's
    /// checks), and uploads their metadata.
    ///
    /// # Errors
    /// [`KernelError::InvalidConfig`] / [`KernelError::OutOfRange`] as the CPU reference (query
    /// heads not a multiple of the KV heads, a block table too short or past the pool);
    /// [`KernelError::InvalidParameter`] for a head size or GQA group the kernel does not
    /// support; [`KernelError::Cuda`] on CUDA errors.
    pub fn new(
        gpu: &Gpu,
        layout: &KvLayout,
        pool_len: usize,
        num_q_heads: usize,
        seqs: &[PlannedSeq<'_>],
    ) -> Result<Self> {
        let (dim, kv_heads) = (layout.head_dim(), layout.num_kv_heads());
        let (group, _) = check_heads(layout, num_q_heads, 0)?;
        let num_blocks = pool_len / layout.block_elems();
        for seq in seqs {
            layout.check_block_table(
                num_blocks,
                seq.block_table,
                seq.prefix_len + seq.tree.len(),
            )?;
        }
        if dim != 64 && dim != 128 {
            return Err(KernelError::InvalidParameter {
                what: "head_dim",
                reason: format!("the CUDA kernel supports 64 and 128, not {dim}"),
            });
        }
        if group > GPU_MAX_GROUP {
            return Err(KernelError::InvalidParameter {
                what: "GQA group",
                reason: format!("{group} query heads per KV head > {GPU_MAX_GROUP}"),
            });
        }
        let (mut q_seq, mut q_node) = (Vec::new(), Vec::new());
        let (mut prefix_len, mut new_len) = (Vec::new(), Vec::new());
        let (mut table_offsets, mut tables) = (Vec::new(), Vec::new());
        let (mut mask_offsets, mut masks) = (Vec::new(), Vec::new());
        let mut max_visible = 1;
        for (index, seq) in seqs.iter().enumerate() {
            let n = seq.tree.len();
            let needed = layout.blocks_for(seq.prefix_len + n);
            for node in 0..n {
                q_seq.push(index as u32);
                q_node.push(node as u32);
                max_visible = max_visible.max(seq.prefix_len + seq.tree.depth(node) + 1);
            }
            prefix_len.push(seq.prefix_len as u32);
            new_len.push(n as u32);
            table_offsets.push(tables.len() as u32);
            tables.extend_from_slice(&seq.block_table[..needed]);
            mask_offsets.push(masks.len() as u32);
            // The kernel reads ceil(n / 64) words per node: the topology's own row width.
            debug_assert_eq!(seq.tree.words_per_node(), n.div_ceil(64).max(1));
            masks.extend_from_slice(seq.tree.ancestor_words());
        }
        let total_q = q_node.len();
        // empty device buffers are not allowed: one placeholder each where nothing is listed
        for list in [
            &mut q_seq,
            &mut q_node,
            &mut prefix_len,
            &mut new_len,
            &mut tables,
            &mut table_offsets,
            &mut mask_offsets,
        ] {
            if list.is_empty() {
                list.push(0);
            }
        }
        if masks.is_empty() {
            masks.push(0);
        }
        let max_chunks = max_visible.div_ceil(GPU_KEY_CHUNK);
        let stream = gpu.stream();
        let up = |what: &str, e| cuda_error(&format!("upload {what}"), e);
        let alloc = |what: &str, e| cuda_error(&format!("alloc {what}"), e);
        let rows = total_q.max(1) * num_q_heads * max_chunks;
        Ok(Self {
            total_q,
            num_q_heads,
            kv_heads,
            dim,
            num_layers: layout.num_layers(),
            pool_len,
            block_size: layout.block_size(),
            block_elems: layout.block_elems(),
            max_chunks,
            q_seq: stream.clone_htod(&q_seq).map_err(|e| up("q_seq", e))?,
            q_node: stream.clone_htod(&q_node).map_err(|e| up("q_node", e))?,
            prefix_len: stream
                .clone_htod(&prefix_len)
                .map_err(|e| up("prefix_len", e))?,
            new_len: stream.clone_htod(&new_len).map_err(|e| up("new_len", e))?,
            table_offsets: stream
                .clone_htod(&table_offsets)
                .map_err(|e| up("table offsets", e))?,
            tables: stream
                .clone_htod(&tables)
                .map_err(|e| up("block tables", e))?,
            mask_offsets: stream
                .clone_htod(&mask_offsets)
                .map_err(|e| up("mask offsets", e))?,
            masks: stream.clone_htod(&masks).map_err(|e| up("masks", e))?,
            partial_o: stream
                .alloc_zeros(rows * dim)
                .map_err(|e| alloc("partials", e))?,
            partial_ml: stream
                .alloc_zeros(rows * 2)
                .map_err(|e| alloc("partials", e))?,
        })
    }

    /// Queries of the batch (`Σ tree.len()`).
    pub fn queries(&self) -> usize {
        self.total_q
    }

    /// Values per query row of `q` and `out` (`num_q_heads × head_dim`).
    pub fn token_width(&self) -> usize {
        self.num_q_heads * self.dim
    }

    /// Attention of layer `layer` over `pool` for the device queries `q`
    /// (`[queries][num_q_heads][head_dim]`, RoPE applied), into `out` (the same shape), with the
    /// new tokens' K/V already written at positions `prefix_len + node`.
    ///
    /// # Errors
    /// [`KernelError::OutOfRange`] for a layer past the layout's; [`KernelError::ShapeMismatch`]
    /// for `q`, `out` or a pool other than the planned one's size; [`KernelError::Cuda`].
    pub fn run(
        &mut self,
        gpu: &Gpu,
        pool: &CudaSlice<f32>,
        layer: usize,
        scale: f32,
        q: &CudaSlice<f32>,
        out: &mut CudaSlice<f32>,
    ) -> Result<()> {
        if layer >= self.num_layers {
            return Err(KernelError::OutOfRange {
                what: "attention layer".to_string(),
                index: layer,
                limit: self.num_layers,
            });
        }
        let width = self.token_width();
        for (what, len) in [("queries", q.len()), ("attention output", out.len())] {
            if len != self.total_q * width {
                return Err(KernelError::ShapeMismatch {
                    what: format!("{what} [queries x q_heads x head_dim]"),
                    expected: self.total_q * width,
                    actual: len,
                });
            }
        }
        if pool.len() != self.pool_len {
            return Err(KernelError::ShapeMismatch {
                what: "KV pool (the planned one)".into(),
                expected: self.pool_len,
                actual: pool.len(),
            });
        }
        if self.total_q == 0 {
            return Ok(());
        }
        let stream = gpu.stream();
        {
            let (qp, _g0) = q.device_ptr(stream);
            let (pp, _g1) = pool.device_ptr(stream);
            let (qs, _g2) = self.q_seq.device_ptr(stream);
            let (qn, _g3) = self.q_node.device_ptr(stream);
            let (pl, _g4) = self.prefix_len.device_ptr(stream);
            let (nl, _g5) = self.new_len.device_ptr(stream);
            let (to, _g6) = self.table_offsets.device_ptr(stream);
            let (bt, _g7) = self.tables.device_ptr(stream);
            let (mo, _g8) = self.mask_offsets.device_ptr(stream);
            let (mk, _g9) = self.masks.device_ptr(stream);
            let (po, _g10) = self.partial_o.device_ptr(stream);
            let (pm, _g11) = self.partial_ml.device_ptr(stream);
            let prm = TaParams {
                q: qp,
                pool: pp,
                q_seq: qs,
                q_node: qn,
                prefix_len: pl,
                new_len: nl,
                table_offsets: to,
                block_tables: bt,
                mask_offsets: mo,
                masks: mk,
                partial_o: po,
                partial_ml: pm,
                scale,
                q_heads: self.num_q_heads as u32,
                kv_heads: self.kv_heads as u32,
                layer: layer as u32,
                block_size: self.block_size as u32,
                max_chunks: self.max_chunks as u32,
                block_elems: self.block_elems as u64,
            };
            let f = gpu.function(
                &sources::TREE_ATTENTION,
                &format!("tree_attention_partial_f32_d{}", self.dim),
            )?;
            let mut launch = stream.launch_builder(&f);
            launch.arg(&prm);
            let cfg = LaunchConfig {
                grid_dim: (
                    self.total_q as u32,
                    self.kv_heads as u32,
                    self.max_chunks as u32,
                ),
                block_dim: (128, 1, 1),
                shared_mem_bytes: 0,
            };
            // SAFETY: `prm` matches the kernel's struct; tables and masks were checked and
            // flattened by `new`, q holds total_q rows (checked above), the partials hold
            // total_q x q_heads x max_chunks rows, and the guards keep every pointer valid past
            // the launch.
            unsafe { launch.launch(cfg) }
                .map_err(|e| cuda_error("launch tree_attention_partial", e))?;
        }
        let merge = gpu.function(
            &sources::TREE_ATTENTION,
            &format!("tree_attention_merge_d{}", self.dim),
        )?;
        let (qh, mc) = (self.num_q_heads as u32, self.max_chunks as u32);
        let mut launch = stream.launch_builder(&merge);
        launch
            .arg(&self.partial_o)
            .arg(&self.partial_ml)
            .arg(&self.q_seq)
            .arg(&self.q_node)
            .arg(&self.prefix_len)
            .arg(&self.new_len)
            .arg(&self.mask_offsets)
            .arg(&self.masks)
            .arg(&mut *out)
            .arg(&qh)
            .arg(&mc);
        let cfg = LaunchConfig {
            grid_dim: (self.total_q as u32, qh, 1),
            block_dim: (self.dim as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: argument order and types match `tree_attention_merge_d{dim}`; out holds
        // total_q x q_heads x head_dim (checked above).
        unsafe { launch.launch(cfg) }.map_err(|e| cuda_error("launch tree_attention_merge", e))?;
        Ok(())
    }
}

/// Tree attention for a ragged batch on the GPU from host queries; returns
/// `[Σ tree.len()][num_q_heads][head_dim]` like the CPU reference. `pool` holds the f32 KV
/// blocks in [`KvLayout`] order, with the new tokens' K/V already written at positions
/// `prefix_len + node`. (The model forward plans once and keeps queries on the device:
/// [`AttentionPlan`].)
///
/// # Errors
/// The CPU reference's errors for the same inputs ([`KernelError::InvalidConfig`],
/// [`KernelError::OutOfRange`], [`KernelError::ShapeMismatch`]), [`KernelError::InvalidParameter`]
/// for a head size or GQA group the kernel does not support, [`KernelError::Cuda`] on CUDA errors.
pub fn tree_attention_cuda(
    gpu: &Gpu,
    pool: &CudaSlice<f32>,
    layout: &KvLayout,
    params: &AttentionParams,
    batch: &[AttentionSeq<'_>],
) -> Result<Vec<f32>> {
    let num_blocks = pool.len() / layout.block_elems();
    let checked = check_batch(layout, num_blocks, params, batch)?;
    let seqs: Vec<PlannedSeq<'_>> = batch
        .iter()
        .map(|s| PlannedSeq {
            block_table: s.block_table,
            prefix_len: s.prefix_len,
            tree: s.tree,
        })
        .collect();
    let mut plan = AttentionPlan::new(gpu, layout, pool.len(), params.num_q_heads, &seqs)?;
    if plan.queries() == 0 {
        return Ok(Vec::new());
    }
    let stream = gpu.stream();
    let q: Vec<f32> = batch
        .iter()
        .flat_map(|s| s.queries.iter().copied())
        .collect();
    let q_d = stream
        .clone_htod(&q)
        .map_err(|e| cuda_error("upload queries", e))?;
    let mut out: CudaSlice<f32> = stream
        .alloc_zeros(plan.queries() * checked.token_out)
        .map_err(|e| cuda_error("alloc attention output", e))?;
    plan.run(gpu, pool, params.layer, params.scale, &q_d, &mut out)?;
    stream
        .clone_dtoh(&out)
        .map_err(|e| cuda_error("download attention output", e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attention::tree_attention;
    use crate::cuda::testing::gpu_for_test;
    use crate::kv::KvPages;
    use crate::sampling::mix64;
    use crate::tree::TreeTopology;

    fn values(n: usize, salt: u64) -> Vec<f32> {
        (0..n)
            .map(|i| ((mix64(salt ^ i as u64) >> 40) as f32 / 8_388_608.0) - 1.0)
            .collect()
    }

    fn close(a: &[f32], b: &[f32]) {
        assert_eq!(a.len(), b.len());
        for (i, (x, y)) in a.iter().zip(b).enumerate() {
            assert!(
                (x - y).abs() <= 1e-6 + 1e-5 * y.abs(),
                "element {i}: gpu {x} vs cpu {y}"
            );
        }
    }

    #[test]
    #[ignore = "needs a GPU"]
    fn matches_cpu_on_ragged_trees_and_is_batch_invariant() {
        let Some(gpu) = gpu_for_test("attention::cuda::matches_cpu") else {
            return;
        };
        for (dim, kv_heads, q_heads, block_size) in [(128, 2, 12, 16), (64, 3, 3, 7)] {
            let layout = KvLayout::new(2, kv_heads, dim, block_size).unwrap();
            let blocks = 400;
            let data = values(blocks * layout.block_elems(), dim as u64);
            let pages = KvPages::new(layout, &data).unwrap();
            let pool = gpu.stream().clone_htod(&data).unwrap();
            // Ragged: empty prefix, a chain over a short prefix, a tree over a prefix crossing
            // several chunks, and a 70-node tree (two mask words).
            let shapes: Vec<(usize, TreeTopology)> = vec![
                (0, TreeTopology::chain(5)),
                (37, TreeTopology::chain(3)),
                (
                    777,
                    TreeTopology::from_parents(&[
                        None,
                        Some(0),
                        Some(0),
                        Some(1),
                        Some(2),
                        Some(1),
                    ])
                    .unwrap(),
                ),
                (
                    1500,
                    TreeTopology::from_parents(
                        &(0..70)
                            .map(|i| if i == 0 { None } else { Some((i - 1) / 2) })
                            .collect::<Vec<_>>(),
                    )
                    .unwrap(),
                ),
            ];
            let tables: Vec<Vec<u32>> = shapes
                .iter()
                .enumerate()
                .map(|(s, (prefix, tree))| {
                    (0..layout.blocks_for(prefix + tree.len()))
                        .map(|b| ((b * 7 + s * 101) % blocks) as u32)
                        .collect()
                })
                .collect();
            let queries: Vec<Vec<f32>> = shapes
                .iter()
                .enumerate()
                .map(|(s, (_, t))| values(t.len() * q_heads * dim, 99 + s as u64))
                .collect();
            let batch: Vec<AttentionSeq<'_>> = shapes
                .iter()
                .zip(&tables)
                .zip(&queries)
                .map(|(((prefix, tree), table), q)| AttentionSeq {
                    queries: q,
                    block_table: table,
                    prefix_len: *prefix,
                    tree,
                })
                .collect();
            let params = AttentionParams {
                layer: 1,
                num_q_heads: q_heads,
                scale: 1.0 / (dim as f32).sqrt(),
            };
            let cpu = tree_attention(&pages, &params, &batch).unwrap();
            let gpu_out = tree_attention_cuda(&gpu, &pool, &layout, &params, &batch).unwrap();
            close(&gpu_out, &cpu);
            // Batch invariance on the GPU: each sequence alone gives the same bits.
            let mut at = 0;
            for seq in &batch {
                let alone =
                    tree_attention_cuda(&gpu, &pool, &layout, &params, std::slice::from_ref(seq))
                        .unwrap();
                assert_eq!(
                    alone,
                    gpu_out[at..at + alone.len()].to_vec(),
                    "batch invariance"
                );
                at += alone.len();
            }
        }
    }

    #[test]
    #[ignore = "needs a GPU"]
    fn refuses_unsupported_shapes() {
        let Some(gpu) = gpu_for_test("attention::cuda::refuses_unsupported_shapes") else {
            return;
        };
        let layout = KvLayout::new(1, 1, 32, 4).unwrap();
        let pool = gpu
            .stream()
            .clone_htod(&vec![0.0f32; layout.block_elems()])
            .unwrap();
        let tree = TreeTopology::chain(1);
        let q = vec![0.0f32; 32];
        let seq = AttentionSeq {
            queries: &q,
            block_table: &[0],
            prefix_len: 0,
            tree: &tree,
        };
        let params = AttentionParams {
            layer: 0,
            num_q_heads: 1,
            scale: 1.0,
        };
        assert!(tree_attention_cuda(&gpu, &pool, &layout, &params, &[seq]).is_err());
    }
}
