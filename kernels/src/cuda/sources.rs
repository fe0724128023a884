//! Every kernel source of the crate, embedded at build time with `include_str!`.
//!
//! Each `.cu` file lives in its family's folder beside the CPU reference and the launcher; this
//! table is the one list the launchers, the compile-check test and the GPU bundle use.

/// The shared device prelude prepended to every source (see `prelude.cuh`).
pub const PRELUDE: &str = include_str!("prelude.cuh");

/// One `.cu` translation unit and the entry points it must export.
#[derive(Debug)]
pub struct KernelSource {
    /// File name, e.g. `tree_attention.cu` (also the NVRTC program name).
    pub name: &'static str,
    /// The family folder it lives in (`attention`, `verification`, …).
    pub family: &'static str,
    /// The source text.
    pub code: &'static str,
    /// The `extern "C"` kernels it defines; the compile check requires ptxas to report each one.
    pub entries: &'static [&'static str],
    /// Whether it uses Hopper-only instructions (wgmma, setmaxnreg): then it is compiled for
    /// `sm_90a` instead of `sm_90`, and not for `sm_80`.
    pub needs_sm90a: bool,
}

/// Tree attention over the paged KV cache (split-K partials + fixed-order merge).
pub static TREE_ATTENTION: KernelSource = KernelSource {
    name: "tree_attention.cu",
    family: "attention",
    code: include_str!("../attention/tree_attention.cu"),
    entries: &[
        "tree_attention_partial_f32_d64",
        "tree_attention_partial_f32_d128",
        "tree_attention_partial_bf16_d64",
        "tree_attention_partial_bf16_d128",
        "tree_attention_partial_f16_d64",
        "tree_attention_partial_f16_d128",
        "tree_attention_merge_d64",
        "tree_attention_merge_d128",
    ],
    needs_sm90a: false,
};

/// Batched verification: greedy, chain rejection sampling, multi-draft tree sampling.
pub static VERIFY: KernelSource = KernelSource {
    name: "verify.cu",
    family: "verification",
    code: include_str!("../verification/verify.cu"),
    entries: &["verify_tree"],
    needs_sm90a: false,
};

/// Sampling preparation: temperature, top-k, top-p to probabilities, without a vocabulary sort.
pub static SAMPLING_PREPARE: KernelSource = KernelSource {
    name: "prepare.cu",
    family: "sampling",
    code: include_str!("../sampling/prepare.cu"),
    entries: &["sampling_prepare"],
    needs_sm90a: false,
};

/// Paged KV append, tree-path commit (compaction) and rewind.
pub static KV_CACHE: KernelSource = KernelSource {
    name: "kv_cache.cu",
    family: "kv",
    code: include_str!("../kv/kv_cache.cu"),
    entries: &[
        "kv_append_f32",
        "kv_append_bf16",
        "kv_append_f16",
        "kv_gather_slots_f32",
        "kv_gather_slots_bf16",
        "kv_gather_slots_f16",
        "kv_scatter_slots_f32",
        "kv_scatter_slots_bf16",
        "kv_scatter_slots_f16",
        "kv_clear_slots_f32",
        "kv_clear_slots_bf16",
        "kv_clear_slots_f16",
    ],
    needs_sm90a: false,
};

/// Model-forward elementwise and row operations.
pub static OPS: KernelSource = KernelSource {
    name: "ops.cu",
    family: "ops",
    code: include_str!("../ops/ops.cu"),
    entries: &[
        "embedding_gather_f32",
        "embedding_gather_bf16",
        "embedding_gather_f16",
        "rms_norm_f32",
        "rope_f32",
        "swiglu_f32",
        "cast_f32_bf16",
        "add_broadcast_f32",
    ],
    needs_sm90a: false,
};

/// The fixed-reduction-order matrix product of the batch-invariant mode.
pub static MATMUL_INVARIANT: KernelSource = KernelSource {
    name: "matmul_invariant.cu",
    family: "ops",
    code: concat!(
        include_str!("../ops/fma_tile.cuh"),
        include_str!("../ops/matmul_invariant.cu")
    ),
    entries: &[
        "matmul_invariant_f32",
        "matmul_invariant_bf16",
        "matmul_invariant_f16",
    ],
    needs_sm90a: false,
};

/// Dequantisation of GGUF block formats to bf16 / f16 / f32.
pub static DEQUANT: KernelSource = KernelSource {
    name: "dequant.cu",
    family: "quant",
    code: concat!(
        include_str!("../quant/blocks.cuh"),
        include_str!("../quant/dequant.cu")
    ),
    entries: &[
        "dequant_q8_0_bf16",
        "dequant_q8_0_f16",
        "dequant_q8_0_f32",
        "dequant_q4_0_bf16",
        "dequant_q4_0_f16",
        "dequant_q4_0_f32",
        "dequant_q4_1_bf16",
        "dequant_q4_1_f16",
        "dequant_q4_1_f32",
        "dequant_q5_0_bf16",
        "dequant_q5_0_f16",
        "dequant_q5_0_f32",
        "dequant_q4_k_bf16",
        "dequant_q4_k_f16",
        "dequant_q4_k_f32",
        "dequant_q5_k_bf16",
        "dequant_q5_k_f16",
        "dequant_q5_k_f32",
        "dequant_q6_k_bf16",
        "dequant_q6_k_f16",
        "dequant_q6_k_f32",
        "dequant_f16_bf16",
        "dequant_bf16_f16",
        "dequant_f16_f32",
        "dequant_bf16_f32",
    ],
    needs_sm90a: false,
};

/// Products (batch-invariant, fixed order) and embedding gathers that read GGUF blocks directly.
pub static QMATMUL: KernelSource = KernelSource {
    name: "qmatmul.cu",
    family: "quant",
    code: concat!(
        include_str!("../quant/blocks.cuh"),
        include_str!("../ops/fma_tile.cuh"),
        include_str!("../quant/qmatmul.cu")
    ),
    entries: &[
        "qmatmul_q8_0",
        "qmatmul_q4_0",
        "qmatmul_q4_1",
        "qmatmul_q5_0",
        "qmatmul_q4_k",
        "qmatmul_q5_k",
        "qmatmul_q6_k",
        "qgather_q8_0",
        "qgather_q4_0",
        "qgather_q4_1",
        "qgather_q5_0",
        "qgather_q4_k",
        "qgather_q5_k",
        "qgather_q6_k",
    ],
    needs_sm90a: false,
};

/// Device bandwidth probe used by the GPU bundle (a plain vectorised copy).
pub static BENCH_COPY: KernelSource = KernelSource {
    name: "copy.cu",
    family: "cuda",
    code: include_str!("copy.cu"),
    entries: &["bench_copy_f32x4"],
    needs_sm90a: false,
};

/// All sources, in family order.
pub static ALL: &[&KernelSource] = &[
    &TREE_ATTENTION,
    &VERIFY,
    &SAMPLING_PREPARE,
    &KV_CACHE,
    &OPS,
    &MATMUL_INVARIANT,
    &DEQUANT,
    &QMATMUL,
    &BENCH_COPY,
];
