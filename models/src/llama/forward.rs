//! The Llama / Qwen2 forward, written once over a device backend ([`DeviceBackend`]): the CPU
//! runner ([`super::LlamaModel`]), the CUDA runner ([`super::cuda::CudaLlamaModel`]) and the
//! EAGLE draft head ([`crate::heads::EagleHead`]) all run these functions, so every device
//! computes the same arithmetic in the same order and differs only in its kernels.
//!
//! A block, for the `n` new rows `x` of a ragged batch ([`run_block`]): `h = rmsnorm(x)`,
//! `q, k, v = h·Wᵀ (+b)`, RoPE on `q` and `k`, K/V written to the sequences' speculative slots,
//! tree attention over the paged cache, `x += o·Woᵀ`, `h = rmsnorm(x)`,
//! `x += (silu(h·Wgᵀ) ⊙ h·Wuᵀ)·Wdᵀ`. The decoder: the token embedding and the blocks
//! ([`run_blocks`]), then the final norm and the LM head ([`DecoderRows::logits`]).
//!
//! The boundary is a trait with associated buffer and matrix types rather than one buffer enum
//! matched at every kernel (as candle's storage does): the forward is monomorphised per device,
//! so the CPU's tuned kernels run with no dispatch in the way, and handing a host buffer to a
//! CUDA kernel is a compile error instead of a run-time one.

use specdec_kernels::kv::SlotMoves;

use super::block::BlockShape;
use crate::error::Result;

/// The data half of the KV family on a device: the pool holding a cache's K/V applies the slot
/// moves that the host bookkeeping decided ([`specdec_kernels::kv::PagedKvCache::reserve_blocks`]
/// for a copy-on-write, [`specdec_kernels::kv::PagedKvCache::commit_blocks`] for a tree-path
/// commit). The bookkeeping is one piece of code for every device; only this move differs: the
/// host pool ([`specdec_kernels::kv::PagedKvCache`] itself) copies rows, a GPU pool runs
/// `kv::cuda::move_slots`. Rewind, fork and release move no data and stay bookkeeping.
///
/// A pool lives as long as its runner, across forwards; a [`DeviceBackend`] (one forward's view
/// of the device) exposes its pool's entry point too.
pub(crate) trait KvPool {
    /// Moves the K/V of every slot `moves.src[i]` to `moves.dst[i]` (all layers, K and V, all
    /// KV heads), all reads before all writes. Must run before the next reserve can reuse a
    /// block the bookkeeping released.
    ///
    /// # Errors
    /// As [`SlotMoves::check`] against the pool (nothing moved); device failures.
    fn move_kv(&mut self, moves: &SlotMoves) -> Result<()>;
}

/// What one forward needs from a device: f32 activation buffers, weight matrices as the device
/// stores them, and one entry point per kernel family (embedding, norm, products, RoPE, KV
/// append, KV move ([`KvPool::move_kv`], a supertrait), tree attention, SwiGLU, the residual
/// add). A value of it is the device *as one forward sees it*: besides the device it holds that
/// forward's KV cache, the batch's sequences, and their rows' RoPE angles, so the KV and
/// attention entry points take no per-call metadata.
///
/// Every buffer is `[rows × width]` f32, row-major, the batch's sequences' new rows
/// concatenated in step order. Entry points check their shapes and fail with an error naming
/// the mismatch; none panics.
pub(crate) trait DeviceBackend: KvPool {
    /// f32 values on the device: activations, norm gains and biases.
    type Buffer;
    /// A `[rows × cols]` weight matrix as the device keeps it.
    type Matrix;

    /// The rows of `m` (its output width).
    fn rows_of(&self, m: &Self::Matrix) -> usize;

    /// `len` zeros; `what` names the buffer in an allocation failure.
    ///
    /// # Errors
    /// An allocation failure.
    fn zeros(&self, what: &str, len: usize) -> Result<Self::Buffer>;

    /// `out[t] = table[tokens[t]]` (`out`: `[tokens.len() × table.cols]`).
    ///
    /// # Errors
    /// An id past the last row; shapes.
    fn embed(&self, table: &Self::Matrix, tokens: &[u32], out: &mut Self::Buffer) -> Result<()>;

    /// Row-wise RMSNorm of `x` times `gain` (`[width]`) into `out`.
    ///
    /// # Errors
    /// Shapes.
    fn rms_norm(
        &self,
        x: &Self::Buffer,
        gain: &Self::Buffer,
        eps: f32,
        out: &mut Self::Buffer,
    ) -> Result<()>;

    /// `out = x · wᵀ` for every `(w, out)` pair (`x`: `[n × cols]`, `out`: `[n × w.rows]`): the
    /// matrices that read one input, so a device may share work between them (the CPU's 8-bit
    /// path quantises `x` once).
    ///
    /// # Errors
    /// Shapes; kernel failures.
    fn products(
        &self,
        x: &Self::Buffer,
        n: usize,
        pairs: &mut [(&Self::Matrix, &mut Self::Buffer)],
    ) -> Result<()>;

    /// `x += y`, `y` repeated over `x` (its length divides `x`'s): the residual add (`y` as
    /// long as `x`) and a bias (`y` one row).
    ///
    /// # Errors
    /// A `y` whose length does not divide `x`'s.
    fn add(&self, x: &mut Self::Buffer, y: &Self::Buffer) -> Result<()>;

    /// RoPE in place on `x` (`[n × heads·head_dim]`) at this forward's rows' positions.
    ///
    /// # Errors
    /// Shapes.
    fn rope(&self, x: &mut Self::Buffer, heads: usize, shape: &BlockShape) -> Result<()>;

    /// Writes the new rows' keys and values (`[n × kv_heads·head_dim]` each) into their
    /// reserved slots of KV layer `layer`.
    ///
    /// # Errors
    /// Shapes; cache errors.
    fn write_kv(&mut self, layer: usize, k: &Self::Buffer, v: &Self::Buffer) -> Result<()>;

    /// Tree attention of the new rows' queries `q` over KV layer `layer` (each sequence's
    /// committed prefix, then its tree ancestors) into `out` (`q`'s shape).
    ///
    /// # Errors
    /// Shapes; cache errors.
    fn attention(
        &mut self,
        layer: usize,
        shape: &BlockShape,
        q: &Self::Buffer,
        out: &mut Self::Buffer,
    ) -> Result<()>;

    /// `out = silu(gate) ⊙ up`.
    ///
    /// # Errors
    /// Shapes.
    fn swiglu(&self, gate: &Self::Buffer, up: &Self::Buffer, out: &mut Self::Buffer) -> Result<()>;

    /// `out = attn · woᵀ`: the attention output projection. A rank of a tensor-parallel group
    /// whose plan splits the output projection unevenly gathers the attention output first.
    ///
    /// # Errors
    /// As [`DeviceBackend::products`]; communicator errors.
    fn attention_projection(
        &self,
        attn: &Self::Buffer,
        n: usize,
        wo: &Self::Matrix,
        out: &mut Self::Buffer,
    ) -> Result<()> {
        self.products(attn, n, &mut [(wo, out)])
    }

    /// Sums a rank's partial residual update over its tensor-parallel group (nothing on a
    /// single rank).
    ///
    /// # Errors
    /// Communicator errors.
    fn all_reduce(&self, partial: &mut Self::Buffer) -> Result<()> {
        let _ = partial;
        Ok(())
    }

    /// Ends the op that ran since the previous mark, naming it `op`, for a profile of the
    /// forward ([`super::op_times`]); nothing unless the backend times its ops.
    fn mark(&self, op: &'static str) {
        let _ = op;
    }
}

/// One block's weights as a device keeps them, borrowed for a forward.
pub(crate) struct BlockWeights<'w, B: DeviceBackend> {
    /// RMSNorm gain before attention `[hidden]`.
    pub(crate) attn_norm: &'w B::Buffer,
    /// Query projection.
    pub(crate) wq: &'w B::Matrix,
    /// Key projection.
    pub(crate) wk: &'w B::Matrix,
    /// Value projection.
    pub(crate) wv: &'w B::Matrix,
    /// Query, key and value biases (Qwen2), each one row.
    pub(crate) bias: [Option<&'w B::Buffer>; 3],
    /// Attention output projection.
    pub(crate) wo: &'w B::Matrix,
    /// RMSNorm gain before the MLP `[hidden]`.
    pub(crate) ffn_norm: &'w B::Buffer,
    /// SwiGLU gate.
    pub(crate) w_gate: &'w B::Matrix,
    /// SwiGLU up.
    pub(crate) w_up: &'w B::Matrix,
    /// SwiGLU down.
    pub(crate) w_down: &'w B::Matrix,
}

/// The working buffers of one forward's blocks for `n` rows, allocated once per forward and
/// reused by every block. After [`run_block`], `h` holds nothing of use and may serve as the
/// output of the final norm.
pub(crate) struct BlockScratch<B: DeviceBackend> {
    /// Normed input `[n, hidden]`.
    pub(crate) h: B::Buffer,
    q: B::Buffer,
    k: B::Buffer,
    v: B::Buffer,
    attn: B::Buffer,
    o: B::Buffer,
    gate: B::Buffer,
    up: B::Buffer,
    act: B::Buffer,
}

impl<B: DeviceBackend> BlockScratch<B> {
    /// Buffers for `n` rows of blocks of `shape` on `dev`.
    ///
    /// # Errors
    /// An allocation failure.
    pub(crate) fn new(dev: &B, n: usize, shape: &BlockShape) -> Result<Self> {
        let (q_w, kv_w) = (shape.q_width(), shape.kv_width());
        Ok(Self {
            h: dev.zeros("normed", n * shape.hidden)?,
            q: dev.zeros("queries", n * q_w)?,
            k: dev.zeros("keys", n * kv_w)?,
            v: dev.zeros("values", n * kv_w)?,
            attn: dev.zeros("attention output", n * q_w)?,
            o: dev.zeros("projection", n * shape.hidden)?,
            gate: dev.zeros("gate", n * shape.ffn)?,
            up: dev.zeros("up", n * shape.ffn)?,
            act: dev.zeros("activation", n * shape.ffn)?,
        })
    }
}

/// Runs block `w` on the `n` residual rows `x` (`[n, hidden]`, updated in place), writing the
/// new rows' K/V into KV layer `layer` of `dev`'s cache and attending over each sequence's
/// committed prefix and tree ancestors.
///
/// # Errors
/// Kernel errors (shapes, cache), communicator errors.
pub(crate) fn run_block<B: DeviceBackend>(
    dev: &mut B,
    shape: &BlockShape,
    w: &BlockWeights<'_, B>,
    layer: usize,
    n: usize,
    x: &mut B::Buffer,
    s: &mut BlockScratch<B>,
) -> Result<()> {
    dev.rms_norm(x, w.attn_norm, shape.rms_eps, &mut s.h)?;
    dev.mark("norms");
    dev.products(
        &s.h,
        n,
        &mut [(w.wq, &mut s.q), (w.wk, &mut s.k), (w.wv, &mut s.v)],
    )?;
    for (buf, bias) in [&mut s.q, &mut s.k, &mut s.v].into_iter().zip(w.bias) {
        if let Some(bias) = bias {
            dev.add(buf, bias)?;
        }
    }
    dev.mark("qkv");
    dev.rope(&mut s.q, shape.q_heads, shape)?;
    dev.rope(&mut s.k, shape.kv_heads, shape)?;
    dev.mark("rope");
    dev.write_kv(layer, &s.k, &s.v)?;
    dev.mark("write_kv");
    dev.attention(layer, shape, &s.q, &mut s.attn)?;
    dev.mark("attention");
    dev.attention_projection(&s.attn, n, w.wo, &mut s.o)?;
    dev.mark("attn_out");
    dev.all_reduce(&mut s.o)?;
    dev.add(x, &s.o)?;
    dev.mark("residual");
    dev.rms_norm(x, w.ffn_norm, shape.rms_eps, &mut s.h)?;
    dev.mark("norms");
    dev.products(&s.h, n, &mut [(w.w_gate, &mut s.gate), (w.w_up, &mut s.up)])?;
    dev.mark("gate_up");
    dev.swiglu(&s.gate, &s.up, &mut s.act)?;
    dev.mark("swiglu");
    dev.products(&s.act, n, &mut [(w.w_down, &mut s.o)])?;
    dev.mark("down");
    dev.all_reduce(&mut s.o)?;
    dev.add(x, &s.o)?;
    dev.mark("residual");
    Ok(())
}

/// A decoder's weights as a device keeps them, borrowed for a forward: the blocks in the
/// order they run (block `i` of `blocks` writes KV layer `i`).
pub(crate) struct DecoderWeights<'w, B: DeviceBackend> {
    /// Token embedding `[vocab, hidden]`.
    pub(crate) token_embd: &'w B::Matrix,
    /// The blocks run, in order.
    pub(crate) blocks: Vec<BlockWeights<'w, B>>,
    /// Final RMSNorm gain `[hidden]`.
    pub(crate) output_norm: &'w B::Buffer,
    /// The LM head (`[rows, hidden]`: the vocabulary, or the first rows of it).
    pub(crate) head: &'w B::Matrix,
}

/// The residual rows after a decoder's last block, with the scratch they were computed in.
pub(crate) struct DecoderRows<B: DeviceBackend> {
    /// The residual rows `[n, hidden]`.
    pub(crate) x: B::Buffer,
    scratch: BlockScratch<B>,
    n: usize,
}

/// The decoder's blocks over the new rows `tokens` (each sequence's, concatenated in step
/// order): the embedding, then every block of `weights.blocks` in order; `after_block(i, x)`
/// sees the residual rows after block `i` (for feature taps). A prefill that only writes K/V
/// stops here; [`DecoderRows::logits`] runs the head.
///
/// # Errors
/// As [`run_block`]; errors of `after_block`.
pub(crate) fn run_blocks<B: DeviceBackend>(
    dev: &mut B,
    shape: &BlockShape,
    weights: &DecoderWeights<'_, B>,
    tokens: &[u32],
    after_block: &mut dyn FnMut(usize, &B::Buffer) -> Result<()>,
) -> Result<DecoderRows<B>> {
    let n = tokens.len();
    let mut x = dev.zeros("residual", n * shape.hidden)?;
    dev.embed(weights.token_embd, tokens, &mut x)?;
    let mut scratch = BlockScratch::new(dev, n, shape)?;
    dev.mark("embed");
    for (layer, w) in weights.blocks.iter().enumerate() {
        run_block(dev, shape, w, layer, n, &mut x, &mut scratch)?;
        after_block(layer, &x)?;
        dev.mark("taps");
    }
    Ok(DecoderRows { x, scratch, n })
}

impl<B: DeviceBackend> DecoderRows<B> {
    /// The final norm and the LM head: `[n, head.rows]` logits.
    ///
    /// # Errors
    /// Kernel errors.
    pub(crate) fn logits(
        mut self,
        dev: &B,
        shape: &BlockShape,
        weights: &DecoderWeights<'_, B>,
    ) -> Result<B::Buffer> {
        let h = &mut self.scratch.h;
        dev.rms_norm(&self.x, weights.output_norm, shape.rms_eps, h)?;
        dev.mark("norms");
        let mut logits = dev.zeros("logits", self.n * dev.rows_of(weights.head))?;
        dev.products(h, self.n, &mut [(weights.head, &mut logits)])?;
        dev.mark("lm_head");
        Ok(logits)
    }
}
