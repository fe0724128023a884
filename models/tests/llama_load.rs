//! Loading a decoder from GGUF: a synthetic qwen2 model written with the GGUF writer loads
//! into the same logits as the weights it was written from; missing tensors and bad metadata
//! are refused by name. Needs no downloaded model.

mod common;

use std::sync::Arc;

use common::{prefill, synthetic_qwen2};
use specdec_models::gguf::{GgufFile, GgufWriter};
use specdec_models::llama::{
    LlamaConfig, LlamaModel, LlamaOptions, MatmulPath, ModelWeights, SpecialTokens, WeightMatrix,
};
use specdec_models::LanguageModel;

const OPTIONS: LlamaOptions = LlamaOptions {
    kv_capacity_tokens: 256,
    kv_block_size: 16,
    kv_dtype: specdec_kernels::kv::KvDtype::F32,
    matmul: MatmulPath::Exact,
};

/// Writes `weights` as a qwen2 GGUF file, leaving out tensor `skip` (when given) and recording
/// `head_count` query heads.
fn write(
    config: &LlamaConfig,
    weights: &ModelWeights,
    skip: Option<&str>,
    head_count: u32,
) -> Vec<u8> {
    let mut w = GgufWriter::new();
    let tokens: Vec<String> = (0..config.vocab_size).map(|i| format!("t{i}")).collect();
    w.metadata("general.architecture", "qwen2")
        .metadata("qwen2.block_count", config.n_layers as u32)
        .metadata("qwen2.embedding_length", config.hidden as u32)
        .metadata("qwen2.feed_forward_length", config.ffn as u32)
        .metadata("qwen2.attention.head_count", head_count)
        .metadata("qwen2.attention.head_count_kv", config.n_kv_heads as u32)
        .metadata("qwen2.attention.key_length", config.head_dim as u32)
        .metadata("qwen2.attention.layer_norm_rms_epsilon", config.rms_eps)
        .metadata("qwen2.rope.freq_base", config.rope_base)
        .metadata("qwen2.context_length", config.context_length as u32)
        .metadata("tokenizer.ggml.tokens", tokens)
        .metadata("tokenizer.ggml.eos_token_id", 5u32);
    let mut tensors: Vec<(String, &WeightMatrix)> = vec![
        ("token_embd.weight".into(), &weights.token_embd),
        ("output.weight".into(), &weights.output),
    ];
    let mut vectors: Vec<(String, &Vec<f32>)> =
        vec![("output_norm.weight".into(), &weights.output_norm)];
    for (i, l) in weights.layers.iter().enumerate() {
        for (name, m) in [
            ("attn_q", &l.wq),
            ("attn_k", &l.wk),
            ("attn_v", &l.wv),
            ("attn_output", &l.wo),
            ("ffn_gate", &l.w_gate),
            ("ffn_up", &l.w_up),
            ("ffn_down", &l.w_down),
        ] {
            tensors.push((format!("blk.{i}.{name}.weight"), m));
        }
        vectors.push((format!("blk.{i}.attn_norm.weight"), &l.attn_norm));
        vectors.push((format!("blk.{i}.ffn_norm.weight"), &l.ffn_norm));
        for (name, b) in [("attn_q", &l.bq), ("attn_k", &l.bk), ("attn_v", &l.bv)] {
            vectors.push((format!("blk.{i}.{name}.bias"), b.as_ref().unwrap()));
        }
    }
    for (name, m) in tensors {
        if skip != Some(name.as_str()) {
            w.tensor(
                &name,
                &[m.cols(), m.rows()],
                m.quant_type().ggml_id(),
                m.bytes().to_vec(),
            );
        }
    }
    for (name, v) in vectors {
        if skip != Some(name.as_str()) {
            w.tensor_f32(&name, &[v.len()], v);
        }
    }
    w.to_bytes()
}

fn open(bytes: Vec<u8>) -> Arc<GgufFile> {
    Arc::new(GgufFile::from_bytes(bytes).unwrap())
}

#[test]
fn gguf_round_trip_gives_the_same_logits() {
    let (config, weights) = synthetic_qwen2(11);
    let file = open(write(&config, &weights, None, config.n_heads as u32));
    let mut loaded = LlamaModel::from_gguf(&file, OPTIONS).unwrap();
    assert_eq!(loaded.config(), &config);
    assert_eq!(loaded.eos_ids(), &[5]);
    let mut direct =
        LlamaModel::from_weights(config, weights, SpecialTokens::default(), OPTIONS).unwrap();
    let prompt = [1u32, 2, 3, 50, 95];
    assert_eq!(prefill(&mut loaded, &prompt), prefill(&mut direct, &prompt));
}

#[test]
fn missing_tensors_and_bad_metadata_are_named() {
    let (config, weights) = synthetic_qwen2(12);
    let file = open(write(
        &config,
        &weights,
        Some("blk.1.attn_k.bias"),
        config.n_heads as u32,
    ));
    let err = LlamaModel::from_gguf(&file, OPTIONS)
        .unwrap_err()
        .to_string();
    assert!(err.contains("blk.1.attn_k.bias"), "{err}");
    let file = open(write(&config, &weights, None, 5));
    let err = LlamaModel::from_gguf(&file, OPTIONS)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("5 query heads are not a multiple of 2 KV heads"),
        "{err}"
    );
}
