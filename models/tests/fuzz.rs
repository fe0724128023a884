//! Property fuzzing of the model loader (GGUF metadata → hyperparameters → tensor table → a
//! forward pass) and the tokenizer construction, from mutations of valid synthetic files.
//!
//! Seeds are pinned, so every run tries the same cases. CI runs `SPECDEC_FUZZ_CASES` cases per
//! property (default 64); `scripts/fuzz.sh` runs 10^5. A mutation must give a clear error or a
//! model whose logits are finite: never a panic, an abort or silent garbage. (The GGUF byte
//! parser's own fuzz is in `tests/gguf.rs`.)

use std::sync::Arc;

use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed};
use specdec_kernels::TreeTopology;
use specdec_models::gguf::{GgufFile, GgufWriter, Metadata, Value};
use specdec_models::llama::synthetic::synthetic;
use specdec_models::llama::{read_config, read_weights, Architecture, LlamaModel, LlamaOptions};
use specdec_models::tokenizer::Tokenizer;
use specdec_models::{LanguageModel, SequenceStep};

/// Cases per property: `$SPECDEC_FUZZ_CASES`, else 64 (CI-sized).
fn config() -> Config {
    let cases = std::env::var("SPECDEC_FUZZ_CASES")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(64);
    Config {
        cases,
        rng_seed: RngSeed::Fixed(0x5eed_0019),
        failure_persistence: None,
        ..Config::default()
    }
}

/// The hyperparameter keys of a synthetic model of `prefix`.
fn hyper_keys(prefix: &str) -> Vec<String> {
    [
        "block_count",
        "embedding_length",
        "feed_forward_length",
        "attention.head_count",
        "attention.head_count_kv",
        "attention.key_length",
        "attention.layer_norm_rms_epsilon",
        "rope.freq_base",
        "context_length",
    ]
    .iter()
    .map(|k| format!("{prefix}.{k}"))
    .chain([
        "general.architecture".to_string(),
        "tokenizer.ggml.eos_token_id".to_string(),
    ])
    .collect()
}

/// What a mutation does to one metadata key.
#[derive(Debug, Clone)]
enum Mutation {
    /// Remove it.
    Remove,
    /// Set it to this value.
    Set(Value),
}

fn value() -> impl Strategy<Value = Value> {
    prop_oneof![
        any::<u32>().prop_map(Value::U32),
        (0u32..4096).prop_map(Value::U32),
        prop_oneof![Just(0u32), Just(1), Just(u32::MAX), Just(1 << 31)].prop_map(Value::U32),
        any::<f32>().prop_map(Value::F32),
        prop_oneof![
            Just(f32::NAN),
            Just(f32::INFINITY),
            Just(-1.0f32),
            Just(0.0),
            Just(1e-30)
        ]
        .prop_map(Value::F32),
        any::<u64>().prop_map(Value::U64),
        any::<i32>().prop_map(Value::I32),
        "[a-z0-9]{0,8}".prop_map(Value::String),
        any::<bool>().prop_map(Value::Bool),
    ]
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        1 => Just(Mutation::Remove),
        6 => value().prop_map(Mutation::Set),
    ]
}

/// `file` rewritten with its metadata mutated (`edits`: key index, mutation), tensors kept.
fn rewritten(
    file: &GgufFile,
    keys: &[String],
    edits: &[(prop::sample::Index, Mutation)],
) -> Vec<u8> {
    let mut entries: Vec<(String, Value)> = file.metadata().entries().to_vec();
    for (at, m) in edits {
        let key = at.get(keys).clone();
        entries.retain(|(k, _)| *k != key);
        if let Mutation::Set(v) = m {
            entries.push((key, v.clone()));
        }
    }
    let mut w = GgufWriter::new();
    for (k, v) in entries {
        if k != "general.alignment" {
            w.metadata(&k, v);
        }
    }
    for t in file.tensors() {
        w.tensor(
            &t.name,
            &t.shape,
            t.quant_type.ggml_id(),
            file.bytes()[t.offset..t.offset + t.n_bytes].to_vec(),
        );
    }
    w.to_bytes()
}

/// Loads a model from `bytes` all the way to one forward pass; `Ok` only with finite logits.
fn load_and_run(bytes: Vec<u8>) -> Result<(), String> {
    let file = Arc::new(GgufFile::from_bytes(bytes).map_err(|e| e.to_string())?);
    let config = read_config(&file).map_err(|e| e.to_string())?;
    read_weights(&file, &config).map_err(|e| e.to_string())?;
    let options = LlamaOptions {
        kv_capacity_tokens: 64,
        ..LlamaOptions::default()
    };
    let mut model = LlamaModel::from_gguf(&file, options).map_err(|e| e.to_string())?;
    let seq = model.new_sequence().map_err(|e| e.to_string())?;
    let tree = TreeTopology::chain(2);
    let logits = model
        .forward(&[SequenceStep::chain(seq, &[1, 2], &tree)])
        .map_err(|e| e.to_string())?;
    if logits[0].as_slice().iter().all(|x| x.is_finite()) {
        Ok(())
    } else {
        Err(format!("non-finite logits from {config:?}"))
    }
}

proptest! {
    #![proptest_config(config())]

    /// Mutated hyperparameters give an error or a model with finite logits, never a panic.
    #[test]
    fn mutated_hyperparameters_are_refused_or_run_finite(
        qwen in any::<bool>(),
        edits in proptest::collection::vec((any::<prop::sample::Index>(), mutation()), 1..4),
    ) {
        let (arch, prefix) = if qwen { (Architecture::Qwen2, "qwen2") } else { (Architecture::Llama, "llama") };
        let file = synthetic(arch, 7);
        let bytes = rewritten(&file, &hyper_keys(prefix), &edits);
        if let Err(e) = load_and_run(bytes) {
            prop_assert!(!e.starts_with("non-finite"), "{}", e);
        }
    }

    /// A tensor table with one tensor's shape or type changed is refused (the span checks),
    /// or loads a model with finite logits.
    #[test]
    fn mutated_tensor_tables_are_refused_or_run_finite(
        which in any::<prop::sample::Index>(),
        new_type in prop_oneof![Just(0u32), Just(1), Just(2), Just(3), Just(6), Just(7), Just(8), Just(12), Just(14), Just(30), any::<u32>()],
        dim in prop_oneof![Just(None), (1usize..1024).prop_map(Some)],
    ) {
        let file = synthetic(Architecture::Llama, 3);
        let target = which.index(file.tensors().len());
        let mut w = GgufWriter::new();
        for (k, v) in file.metadata().entries() {
            w.metadata(k, v.clone());
        }
        for (i, t) in file.tensors().iter().enumerate() {
            let data = file.bytes()[t.offset..t.offset + t.n_bytes].to_vec();
            let (mut shape, mut ty) = (t.shape.clone(), t.quant_type.ggml_id());
            if i == target {
                ty = new_type;
                if let Some(d) = dim {
                    shape[0] = d;
                }
            }
            w.tensor(&t.name, &shape, ty, data);
        }
        if let Err(e) = load_and_run(w.to_bytes()) {
            prop_assert!(!e.starts_with("non-finite"), "{}", e);
        }
    }

    /// Tokenizer metadata with tokens, merges and ids mutated is refused or builds a tokenizer
    /// that encodes and decodes, never panics.
    #[test]
    fn mutated_tokenizer_metadata_is_refused_or_works(
        tokens in proptest::collection::vec("[a-zĠ]{1,3}", 0..12),
        merges in proptest::collection::vec("[a-zĠ]{0,3} ?[a-zĠ]{0,3}", 0..8),
        types in proptest::option::of(proptest::collection::vec(-2i32..8, 0..12)),
        eos in proptest::option::of(any::<u32>()),
        bos in proptest::option::of(0u32..16),
        model in prop_oneof![Just("gpt2".to_string()), "[a-z]{0,5}"],
        text in "[a-z ]{0,12}",
    ) {
        let mut entries = vec![
            ("tokenizer.ggml.model".to_string(), Value::String(model)),
            ("tokenizer.ggml.tokens".to_string(), Value::from(tokens)),
            ("tokenizer.ggml.merges".to_string(), Value::from(merges)),
        ];
        if let Some(types) = types {
            entries.push(("tokenizer.ggml.token_type".to_string(), Value::from(types)));
        }
        if let Some(eos) = eos {
            entries.push(("tokenizer.ggml.eos_token_id".to_string(), Value::U32(eos)));
        }
        if let Some(bos) = bos {
            entries.push(("tokenizer.ggml.bos_token_id".to_string(), Value::U32(bos)));
        }
        let Ok(metadata) = Metadata::new("<fuzz>", entries) else { return Ok(()); };
        if let Ok(tokenizer) = Tokenizer::from_metadata(&metadata) {
            if let Ok(ids) = tokenizer.encode(&text) {
                let _ = tokenizer.decode_skip_special(&ids);
            }
        }
    }
}
