//! The Llama / Qwen2 runner on a CUDA GPU: [`CudaLlamaModel`], a [`LanguageModel`](crate::LanguageModel) with the CPU
//! runner's contract, loaded from the same GGUF files by the same loader.
//!
//! # Contract
//! Exactly [`LanguageModel`](crate::LanguageModel)'s: a forward takes a ragged batch of token trees (prefill chunks,
//! chains, draft trees) over a paged KV cache and returns f32 logits `[n_new, vocab]` per
//! sequence on the host; new tokens' K/V are speculative until [`commit`](crate::LanguageModel::commit) keeps a
//! root-to-node path; `rewind`, `fork` and `release` behave as on the CPU. Steps and commit paths
//! are checked by the same code as the CPU runner's (same errors). A model is the whole decoder
//! on one GPU, or one rank of a tensor-parallel group ([`CudaLlamaModel::rank_of`]: the CPU
//! ranks' [`ShardPlan`](crate::shard::ShardPlan), one rank per GPU, all-reduces on the device
//! over NCCL). Without a usable GPU every constructor returns
//! [`ModelError::Config`](crate::ModelError::Config) naming the problem (the probe never panics).
//!
//! The forward's arithmetic is not written here: it is the CPU runner's, the block and decoder
//! functions of `llama::forward`, run over this device's kernels by `backend::CudaBackend`.
//!
//! # Memory layout (device)
//! - Weight matrices in GGUF block types (Q4_K, Q6_K, Q8_0, Q5_0, Q4_1, …) stay as their blocks
//!   ([`DeviceLayout::Blocks`]): the products decode each weight in registers, so the device
//!   holds about the file's bytes ([`device_weight_bytes`]; ≈1.1 GB for Qwen2.5-1.5B Q4_K_M
//!   against ≈3.1 GB as bf16). F32 / BF16 / F16 matrices are bf16 `[rows × cols]` row-major (F32
//!   rounded on the host, F16 on the device). A tied LM head is the embedding itself (stored
//!   once), gathered row by row from its blocks.
//! - Norm gains and QKV biases: f32. Activations: f32 `[tokens × width]` row-major, every
//!   sequence's new tokens concatenated in step order.
//! - KV cache: one f32 pool of blocks in [`KvLayout`](specdec_kernels::kv::KvLayout) order
//!   (`[layer][K|V][kv_head][slot][head_dim]` per block), `kv_capacity_tokens × layers × 2 ×
//!   kv_dim × 4` bytes. Its block tables are kept on the host by [`KvMirror`] (the CPU cache's
//!   bookkeeping, reused); reserve copy-on-write and commit compaction become slot moves run by
//!   `kv::cuda::move_slots`, whole-block remaps move nothing.
//!
//! # Precision
//! Block weights are decoded exactly (the f32 value the CPU reader gives); float weights are
//! rounded once to bf16 (relative error ≤ 2⁻⁹ per weight). In the default [`GpuMatmul::Fast`]
//! mode, products of up to [`BLOCK_PRODUCT_MAX_TOKENS`] tokens (decode, verification) read the
//! blocks in f32; larger ones (prefill) dequantise the matrix to a bf16 scratch and round the
//! activations to bf16 for a cuBLAS product (tensor cores, f32 accumulation and output). Norms,
//! RoPE, attention, SwiGLU and the residual stream stay f32. Logits therefore differ from the
//! CPU's exact f32 path by a few per mille of the logit scale at most (the GPU tests bound it),
//! and greedy tokens agree wherever the top two logits are not within that noise.
//!
//! # Batch-invariant mode
//! [`GpuMatmul::BatchInvariant`] uses one fixed-order product for every number of tokens (one
//! in-order FMA chain per output, f32 activations; the block weights decoded in registers by
//! `qmatmul_cuda`, bf16 ones widened by `matmul_invariant_cuda`); every other kernel of the forward is
//! batch-invariant already (one block per row for RMSNorm, elementwise ops, tree attention over
//! a fixed key order). A token's logits are then bit-identical alone, in a chain, in a tree or in
//! a batch, as the trait asks. Cost: decode steps (few rows) are bound by reading the weights and
//! cost about the same as the fast mode; long prefills run at CUDA-core FMA rate, several times
//! slower than tensor cores.
//!
//! # Choosing the device at run time
//! [`crate::llama::load_on_device`] builds the CPU or the CUDA runner from the same GGUF file
//! behind a `Box<dyn LanguageModel>`; [`crate::llama::parse_device`] reads `cpu`, `cuda` or
//! `cuda:N` (anything else is a configuration error naming the accepted forms).
//!
//! # Known costs
//! Inside a forward, Q/K/V and the attention output stay on the device (one
//! [`AttentionPlan`](specdec_kernels::attention::cuda::AttentionPlan) per forward uploads the
//! block tables and masks once for every layer); the f32 logits `[tokens × vocab]` are still
//! downloaded at the end, and the engine prepares and verifies on the host. The kernels crate's
//! [`VerifyBackend`](specdec_kernels::verification::VerifyBackend) for
//! [`Gpu`](specdec_kernels::cuda::Gpu) verifies a batch over rows left on the device
//! (`CudaSlice<f32>`, this runner's buffer type), for a caller that keeps the logits here.

mod backend;
mod kv_mirror;
mod matmul;
mod model;
mod weights;

#[cfg(test)]
mod tests;

pub use kv_mirror::{physical_slots, KvMirror, SlotMoves};
pub use matmul::{gemm_dims, product, GpuMatmul, BLOCK_PRODUCT_MAX_TOKENS};
pub use model::{CudaLlamaModel, CudaLlamaOptions};
pub use weights::{
    device_weight_bytes, DeviceLayer, DeviceLayout, DeviceMatrix, DeviceStorage, DeviceWeights,
};

/// A CUDA failure as the crate's error: the call that failed and the driver's message (an
/// out-of-memory shows as `CUDA_ERROR_OUT_OF_MEMORY`).
pub(crate) fn device_error(call: &str, e: impl std::fmt::Display) -> crate::ModelError {
    crate::ModelError::Kernel(specdec_kernels::KernelError::Cuda {
        call: call.to_string(),
        message: e.to_string(),
    })
}
