//! Tiny synthetic Llama-family models written as GGUF in memory, for tests that need a real
//! decoder but no model file (the GPU bundle, which travels without weights, uses them): a
//! Llama (tied head, GQA 4:1, interleaved RoPE) and a Qwen2-style model (QKV bias, untied head,
//! 2 KV heads, half-split RoPE), both with `head_dim` 64, hidden 256, 4 query heads, FFN 512,
//! 2 blocks, a vocabulary of 64 (`t0 .. t63`, EOS 63), and a mix of GGUF storage types
//! (Q8_0, Q4_K, Q6_K, F16, Q5_0, Q4_1, Q5_K, F32) with weights of about ±0.15.

use std::sync::Arc;

use specdec_kernels::quant::{dequantize_row_to_vec, f32_to_f16, QuantType};
use specdec_kernels::sampling::mix64;

use crate::gguf::{GgufFile, GgufWriter};
use crate::llama::Architecture;

/// Deterministic values in `[lo, hi)` from `(seed, index)`.
pub(crate) fn uniform(seed: u64, i: u64, lo: f32, hi: f32) -> f32 {
    lo + (hi - lo) * ((mix64(seed.wrapping_mul(0x9e37_79b9) ^ i) >> 40) as f32 / 16_777_216.0)
}

/// GGUF bytes of a `[rows × cols]` matrix of `ty`: random quants with scales keeping weights
/// within about ±0.15.
fn matrix_bytes(ty: QuantType, rows: usize, cols: usize, seed: u64) -> Vec<u8> {
    let n = rows * cols;
    if ty == QuantType::F32 {
        return (0..n as u64)
            .flat_map(|i| uniform(seed, i, -0.1, 0.1).to_le_bytes())
            .collect();
    }
    if ty == QuantType::F16 {
        return (0..n as u64)
            .flat_map(|i| f32_to_f16(uniform(seed, i, -0.1, 0.1)).to_le_bytes())
            .collect();
    }
    let bytes_per_block = ty.block_bytes();
    let blocks = n / ty.block_len();
    let mut out: Vec<u8> = (0..(blocks * bytes_per_block) as u64)
        .map(|i| mix64(seed ^ (i << 8)) as u8)
        .collect();
    let scales: &[(usize, f32)] = match ty {
        QuantType::Q8_0 => &[(0, 0.0008)],
        QuantType::Q5_0 => &[(0, 0.005)],
        QuantType::Q4_1 => &[(0, 0.01), (2, -0.075)],
        // K-quants subtract dmin · m: dmin = mean(q) · d keeps the weights about zero-mean.
        QuantType::Q4_K => &[(0, 0.0002), (2, 0.0015)],
        QuantType::Q5_K => &[(0, 0.0001), (2, 0.00155)],
        QuantType::Q6_K => &[(208, 0.00005)],
        other => panic!("matrix_bytes: {other} not used by these tests"),
    };
    for block in out.chunks_mut(bytes_per_block) {
        for &(at, v) in scales {
            block[at..at + 2].copy_from_slice(&f32_to_f16(v).to_le_bytes());
        }
    }
    out
}

/// Storage types of one synthetic model's matrices.
struct Types {
    embd: QuantType,
    qkv: QuantType,
    wo: QuantType,
    gate_up: QuantType,
    down: QuantType,
    output: Option<QuantType>,
}

/// A tiny synthetic model of `arch` as a parsed GGUF file (module docs); `seed` picks the
/// weights, so two seeds give two different models of the same shape and vocabulary.
pub fn synthetic(arch: Architecture, seed: u64) -> Arc<GgufFile> {
    synthetic_with(arch, seed, false)
}

/// [`synthetic`], with every matrix rounded to BF16 storage when `bf16` is set (the weights the
/// GPU multiplies with, for CPU runs).
pub fn synthetic_with(arch: Architecture, seed: u64, bf16: bool) -> Arc<GgufFile> {
    synthetic_custom(
        arch,
        seed,
        &SyntheticOptions {
            bf16,
            ..SyntheticOptions::default()
        },
    )
}

/// What [`synthetic_custom`] may change of the synthetic models.
#[derive(Debug, Clone, PartialEq)]
pub struct SyntheticOptions {
    /// Every matrix rounded to BF16 storage (as [`synthetic_with`]).
    pub bf16: bool,
    /// The `context_length` written to the metadata [default: 512].
    pub context_length: u32,
    /// More metadata entries (full keys, e.g. `llama.rope.scaling.type`), written after the
    /// standard ones [default: none].
    pub metadata: Vec<(String, crate::gguf::Value)>,
}

impl Default for SyntheticOptions {
    fn default() -> Self {
        Self {
            bf16: false,
            context_length: 512,
            metadata: Vec::new(),
        }
    }
}

/// [`synthetic`] with `options` (module docs for the shape, which does not change).
pub fn synthetic_custom(
    arch: Architecture,
    seed: u64,
    options: &SyntheticOptions,
) -> Arc<GgufFile> {
    let bf16 = options.bf16;
    let (prefix, kv_heads, types) = match arch {
        Architecture::Llama => (
            "llama",
            1usize,
            Types {
                embd: QuantType::Q8_0,
                qkv: QuantType::Q4_K,
                wo: QuantType::F16,
                gate_up: QuantType::Q8_0,
                down: QuantType::Q6_K,
                output: None,
            },
        ),
        Architecture::Qwen2 => (
            "qwen2",
            2usize,
            Types {
                embd: QuantType::F16,
                qkv: QuantType::Q8_0,
                wo: QuantType::Q5_0,
                gate_up: QuantType::Q4_1,
                down: QuantType::Q5_K,
                output: Some(QuantType::F32),
            },
        ),
    };
    let (hidden, heads, head_dim, ffn, layers, vocab) = (256usize, 4usize, 64usize, 512, 2, 64);
    let (q, kv) = (heads * head_dim, kv_heads * head_dim);
    let mut w = GgufWriter::new();
    let tokens: Vec<String> = (0..vocab).map(|i| format!("t{i}")).collect();
    w.metadata("general.architecture", prefix)
        .metadata(&format!("{prefix}.block_count"), layers as u32)
        .metadata(&format!("{prefix}.embedding_length"), hidden as u32)
        .metadata(&format!("{prefix}.feed_forward_length"), ffn as u32)
        .metadata(&format!("{prefix}.attention.head_count"), heads as u32)
        .metadata(
            &format!("{prefix}.attention.head_count_kv"),
            kv_heads as u32,
        )
        .metadata(&format!("{prefix}.attention.key_length"), head_dim as u32)
        .metadata(
            &format!("{prefix}.attention.layer_norm_rms_epsilon"),
            1e-5f32,
        )
        .metadata(&format!("{prefix}.rope.freq_base"), 10_000.0f32)
        .metadata(&format!("{prefix}.context_length"), options.context_length)
        .metadata("tokenizer.ggml.tokens", tokens)
        .metadata("tokenizer.ggml.eos_token_id", 63u32);
    for (key, value) in &options.metadata {
        w.metadata(key, value.clone());
    }
    let mut salt = seed;
    let mut mat = |w: &mut GgufWriter, name: &str, ty: QuantType, rows: usize, cols: usize| {
        salt += 1;
        let bytes = matrix_bytes(ty, rows, cols, salt);
        if bf16 {
            let values = dequantize_row_to_vec(ty, &bytes, rows * cols).unwrap();
            let rounded = values
                .iter()
                .flat_map(|&v| half::bf16::from_f32(v).to_bits().to_le_bytes())
                .collect();
            w.tensor(name, &[cols, rows], QuantType::BF16.ggml_id(), rounded);
        } else {
            w.tensor(name, &[cols, rows], ty.ggml_id(), bytes);
        }
    };
    mat(&mut w, "token_embd.weight", types.embd, vocab, hidden);
    if let Some(ty) = types.output {
        mat(&mut w, "output.weight", ty, vocab, hidden);
    }
    for l in 0..layers {
        let name = |t: &str| format!("blk.{l}.{t}.weight");
        mat(&mut w, &name("attn_q"), types.qkv, q, hidden);
        mat(&mut w, &name("attn_k"), types.qkv, kv, hidden);
        mat(&mut w, &name("attn_v"), types.qkv, kv, hidden);
        mat(&mut w, &name("attn_output"), types.wo, hidden, q);
        mat(&mut w, &name("ffn_gate"), types.gate_up, ffn, hidden);
        mat(&mut w, &name("ffn_up"), types.gate_up, ffn, hidden);
        mat(&mut w, &name("ffn_down"), types.down, hidden, ffn);
    }
    let vector = |n: usize, s: u64, lo: f32, hi: f32| -> Vec<f32> {
        (0..n as u64)
            .map(|i| uniform(seed ^ s, i, lo, hi))
            .collect()
    };
    w.tensor_f32(
        "output_norm.weight",
        &[hidden],
        &vector(hidden, 1, 0.8, 1.2),
    );
    for l in 0..layers as u64 {
        for (t, s) in [("attn_norm", 10), ("ffn_norm", 20)] {
            let v = vector(hidden, s + l, 0.8, 1.2);
            w.tensor_f32(&format!("blk.{l}.{t}.weight"), &[hidden], &v);
        }
        if arch == Architecture::Qwen2 {
            for (t, n, s) in [("attn_q", q, 30), ("attn_k", kv, 40), ("attn_v", kv, 50)] {
                let v = vector(n, s + l, -0.5, 0.5);
                w.tensor_f32(&format!("blk.{l}.{t}.bias"), &[n], &v);
            }
        }
    }
    Arc::new(GgufFile::from_bytes(w.to_bytes()).expect("a valid synthetic GGUF"))
}
