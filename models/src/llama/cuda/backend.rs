//! [`CudaBackend`]: the forward's device boundary ([`DeviceBackend`]) on one GPU: `CudaSlice<f32>`
//! buffers, [`DeviceMatrix`] products in the chosen [`GpuMatmul`] mode, the f32 KV pool
//! ([`CudaKvPool`]) written by `kv::cuda::append` and moved by `kv::cuda::move_slots`, and one
//! [`AttentionPlan`] (block tables and ancestor masks uploaded once) for every layer of the
//! forward. Nothing crosses to the host inside a forward, except on a tensor-parallel rank
//! whose plan splits the attention output projection off the head boundaries (the attention
//! output is gathered through the host there); a rank's all-reduces stay on the device.

use std::sync::Arc;

use cudarc::driver::CudaSlice;
use specdec_kernels::attention::cuda::AttentionPlan;
use specdec_kernels::cuda::Gpu;
use specdec_kernels::kv::cuda::{append, move_slots, KvShape};
use specdec_kernels::kv::SlotMoves;
use specdec_kernels::ops::cuda::{add_broadcast_cuda, rms_norm_cuda, rope_cuda, swiglu_cuda};

use super::device_error;
use super::matmul::{product, GpuMatmul};
use super::weights::{upload_f32, DeviceLayer, DeviceMatrix, DeviceWeights};
use crate::error::Result;
use crate::llama::block::{BlockShape, TensorParallel};
use crate::llama::forward::{BlockWeights, DecoderWeights, DeviceBackend, KvPool};
use crate::shard::{NcclCommunicator, ShardPlan};

/// A runner's KV pool on the GPU: f32 blocks in `KvLayout` order
/// (`[layer][K|V][kv_head][slot][head_dim]` per block), `data.len()` a whole number of blocks of
/// `shape`. Its block tables are kept on the host (`KvMirror`); it only holds and moves data.
pub(crate) struct CudaKvPool {
    /// The device holding the pool.
    pub(crate) gpu: Arc<Gpu>,
    /// The pool's elements.
    pub(crate) data: CudaSlice<f32>,
    /// The pool's shape.
    pub(crate) shape: KvShape,
}

impl KvPool for CudaKvPool {
    /// `kv::cuda::move_slots` (gather every source, then scatter; nothing to launch for no
    /// moves).
    fn move_kv(&mut self, moves: &SlotMoves) -> Result<()> {
        if moves.is_empty() {
            return Ok(());
        }
        Ok(move_slots(
            &self.gpu,
            &mut self.data,
            &self.shape,
            &moves.src,
            &moves.dst,
        )?)
    }
}

/// The tensor-parallel group a GPU rank's block combines its partial products over.
pub(crate) struct GpuTensorParallel<'a> {
    /// The group, this rank on `CudaBackend::gpu`.
    pub(crate) comm: &'a NcclCommunicator,
    /// This rank's share.
    pub(crate) plan: &'a ShardPlan,
    /// The query width of all ranks together.
    pub(crate) q_dim: usize,
}

/// One GPU as one forward sees it: the product mode, the KV pool, the physical slot of every
/// new row, the forward's attention plan and its rows' RoPE tables, and the rank's group when
/// the model is split.
pub(crate) struct CudaBackend<'a> {
    /// The device.
    pub(crate) gpu: &'a Gpu,
    /// The tensor-parallel group; `None` for the whole model.
    pub(crate) parallel: Option<GpuTensorParallel<'a>>,
    /// How the products run.
    pub(crate) mode: GpuMatmul,
    /// The KV pool the blocks write.
    pub(crate) kv: &'a mut CudaKvPool,
    /// The pool slot of every new row, in row order.
    pub(crate) slots: Vec<u32>,
    /// Block tables and masks of the batch, for every layer.
    pub(crate) plan: AttentionPlan,
    /// RoPE cosines of every row (`[n × head_dim/2]`).
    pub(crate) cos: CudaSlice<f32>,
    /// RoPE sines of every row.
    pub(crate) sin: CudaSlice<f32>,
}

impl KvPool for CudaBackend<'_> {
    fn move_kv(&mut self, moves: &SlotMoves) -> Result<()> {
        self.kv.move_kv(moves)
    }
}

impl DeviceBackend for CudaBackend<'_> {
    type Buffer = CudaSlice<f32>;
    type Matrix = DeviceMatrix;

    fn rows_of(&self, m: &DeviceMatrix) -> usize {
        m.rows()
    }

    fn zeros(&self, what: &str, len: usize) -> Result<CudaSlice<f32>> {
        self.gpu
            .stream()
            .alloc_zeros::<f32>(len)
            .map_err(|e| device_error(&format!("alloc {what} ({len} f32)"), e))
    }

    fn embed(&self, table: &DeviceMatrix, tokens: &[u32], out: &mut CudaSlice<f32>) -> Result<()> {
        table.gather_rows(self.gpu, tokens, out)
    }

    fn rms_norm(
        &self,
        x: &CudaSlice<f32>,
        gain: &CudaSlice<f32>,
        eps: f32,
        out: &mut CudaSlice<f32>,
    ) -> Result<()> {
        Ok(rms_norm_cuda(self.gpu, x, gain, eps, out)?)
    }

    fn products(
        &self,
        x: &CudaSlice<f32>,
        n: usize,
        pairs: &mut [(&DeviceMatrix, &mut CudaSlice<f32>)],
    ) -> Result<()> {
        for (w, out) in pairs.iter_mut() {
            product(self.gpu, self.mode, x, n, w, out)?;
        }
        Ok(())
    }

    fn add(&self, x: &mut CudaSlice<f32>, y: &CudaSlice<f32>) -> Result<()> {
        Ok(add_broadcast_cuda(self.gpu, x, y)?)
    }

    fn rope(&self, x: &mut CudaSlice<f32>, heads: usize, shape: &BlockShape) -> Result<()> {
        Ok(rope_cuda(
            self.gpu,
            x,
            heads,
            shape.head_dim,
            &self.cos,
            &self.sin,
            shape.rope_layout,
        )?)
    }

    fn write_kv(&mut self, layer: usize, k: &CudaSlice<f32>, v: &CudaSlice<f32>) -> Result<()> {
        Ok(append(
            self.gpu,
            &mut self.kv.data,
            &self.kv.shape,
            layer,
            k,
            v,
            &self.slots,
        )?)
    }

    fn attention(
        &mut self,
        layer: usize,
        shape: &BlockShape,
        q: &CudaSlice<f32>,
        out: &mut CudaSlice<f32>,
    ) -> Result<()> {
        let scale = shape.attention_scale();
        Ok(self
            .plan
            .run(self.gpu, &self.kv.data, layer, scale, q, out)?)
    }

    /// A rank whose plan gathers the attention output downloads its rows, gathers every rank's
    /// through the communicator and multiplies the uploaded block-aligned columns.
    fn attention_projection(
        &self,
        attn: &CudaSlice<f32>,
        n: usize,
        wo: &DeviceMatrix,
        out: &mut CudaSlice<f32>,
    ) -> Result<()> {
        match &self.parallel {
            Some(tp) if tp.plan.gather_attention => {
                let own = self
                    .gpu
                    .stream()
                    .clone_dtoh(attn)
                    .map_err(|e| device_error("download attention output", e))?;
                let group = TensorParallel {
                    comm: tp.comm,
                    plan: tp.plan,
                    q_dim: tp.q_dim,
                };
                let selected = upload_f32(
                    self.gpu,
                    "gathered attention output",
                    &group.gathered_attention(&own, n)?,
                )?;
                self.products(&selected, n, &mut [(wo, out)])
            }
            _ => self.products(attn, n, &mut [(wo, out)]),
        }
    }

    /// The device all-reduce of the rank's group (rank-order sums, no host copy).
    fn all_reduce(&self, partial: &mut CudaSlice<f32>) -> Result<()> {
        match &self.parallel {
            Some(tp) => tp.comm.all_reduce_sum_device(self.gpu, partial),
            None => Ok(()),
        }
    }

    fn swiglu(
        &self,
        gate: &CudaSlice<f32>,
        up: &CudaSlice<f32>,
        out: &mut CudaSlice<f32>,
    ) -> Result<()> {
        Ok(swiglu_cuda(self.gpu, gate, up, out)?)
    }
}

impl DeviceLayer {
    /// This block's weights as the CUDA forward reads them.
    pub(crate) fn on_gpu<'w, 'a>(&'w self) -> BlockWeights<'w, CudaBackend<'a>> {
        let [bq, bk, bv] = match &self.bias {
            Some([q, k, v]) => [Some(q), Some(k), Some(v)],
            None => [None, None, None],
        };
        BlockWeights {
            attn_norm: &self.attn_norm,
            wq: &self.wq,
            wk: &self.wk,
            wv: &self.wv,
            bias: [bq, bk, bv],
            wo: &self.wo,
            ffn_norm: &self.ffn_norm,
            w_gate: &self.w_gate,
            w_up: &self.w_up,
            w_down: &self.w_down,
        }
    }
}

impl DeviceWeights {
    /// The decoder as the CUDA forward reads it: every block, in order.
    pub(crate) fn on_gpu<'w, 'a>(&'w self) -> DecoderWeights<'w, CudaBackend<'a>> {
        DecoderWeights {
            token_embd: &self.token_embd,
            blocks: self.layers.iter().map(DeviceLayer::on_gpu).collect(),
            output_norm: &self.output_norm,
            head: self.output(),
        }
    }
}
