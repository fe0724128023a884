//! Hugging Face model folders (`specdec_models::hf_folder`): written from GGUF files by
//! `export_gguf`, loaded back through `safetensors` and `tokenizers`, against the GGUF model
//! (synthetic Llama and Qwen2), against the outside reference logits (SmolLM2, raw prompt
//! `def fibonacci(n):`, ../shared/MODELS.md), and hostile folders refused naming the fault.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use common::{gguf, load, max_abs, max_abs_gap, prefill, small_options, top_k};
use specdec_kernels::quant::QuantType;
use specdec_models::gguf::{GgufFile, Value};
use specdec_models::hf_folder::{export_gguf, HfFolder};
use specdec_models::llama::synthetic::{synthetic_custom, SyntheticOptions};
use specdec_models::llama::{Architecture, LlamaModel, MatmulPath, RopeLayout};
use specdec_models::safetensors_file::{write_safetensors, Dtype, OwnedTensor, SafetensorsFile};
use specdec_models::tokenizer::Tokenizer;
use specdec_models::{registry, Checkpoint, LanguageModel, ModelError};

/// A fresh, absent folder path under the temp dir for `label`.
fn scratch(label: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("specdec-hf-{label}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// A synthetic model with the tokenizer keys export needs (a 64-token BPE without merges).
fn synthetic_gguf(arch: Architecture) -> Arc<GgufFile> {
    let options = SyntheticOptions {
        metadata: vec![
            ("tokenizer.ggml.model".into(), Value::from("gpt2")),
            (
                "tokenizer.ggml.merges".into(),
                Value::from(Vec::<String>::new()),
            ),
        ],
        ..SyntheticOptions::default()
    };
    synthetic_custom(arch, 5, &options)
}

fn folder_model(dir: &Path) -> LlamaModel {
    Checkpoint::open(dir)
        .unwrap()
        .load(small_options(MatmulPath::Exact))
        .unwrap()
}

const TOKENS: [u32; 9] = [1, 5, 9, 2, 7, 3, 60, 33, 12];

/// Max |logit gap| over every position of [`TOKENS`], and the largest |logit| of the GGUF model.
fn gap_to_gguf(file: &Arc<GgufFile>, folder: &mut dyn LanguageModel) -> (f32, f32) {
    let want = prefill(&mut load(file), &TOKENS);
    let got = prefill(folder, &TOKENS);
    let (mut gap, mut scale) = (0.0f32, 0.0f32);
    for r in 0..TOKENS.len() {
        gap = gap.max(max_abs_gap(got.row(r), want.row(r)));
        scale = scale.max(max_abs(want.row(r)));
    }
    (gap, scale)
}

/// Export → load gives the GGUF model's logits at every position, for both architectures:
/// in F32 the weights are the dequantised values exactly, so only summation order differs
/// (and, for llama, the RoPE pairing: half-split over un-permuted rows instead of interleaved
/// over permuted ones, the same arithmetic per pair). Bound 1e-4 · max |logit| (measured here:
/// Llama 1.3e-6, Qwen2 0 absolute, max |logit| ≈ 3); BF16 rounds every weight by ≤ 2^-9
/// relative: bound 5e-2 · max |logit| (measured 2.9e-2 and 2.1e-2 absolute, about 1%); F16
/// by ≤ 2^-12: bound 1e-2 · max |logit|.
#[test]
fn synthetic_folders_give_the_gguf_logits_in_every_dtype() {
    for arch in [Architecture::Llama, Architecture::Qwen2] {
        let file = synthetic_gguf(arch);
        for (dtype, rel_tol) in [
            (Dtype::F32, 1e-4f32),
            (Dtype::F16, 1e-2),
            (Dtype::BF16, 5e-2),
        ] {
            let dir = scratch(&format!("synthetic-{arch:?}-{dtype:?}"));
            let summary = export_gguf(&file, &dir, dtype).unwrap();
            let folder = HfFolder::open(&dir).unwrap();
            let mut expected = summary.config.clone();
            expected.rope_layout = RopeLayout::HalfSplit;
            assert_eq!(folder.config(), &expected, "{arch:?}");
            let weights = folder.read_weights().unwrap();
            let stored = match dtype {
                Dtype::F32 => QuantType::F32,
                Dtype::F16 => QuantType::F16,
                _ => QuantType::BF16,
            };
            assert_eq!(weights.layers[0].wq.quant_type(), stored);
            let mut model = folder_model(&dir);
            let (gap, scale) = gap_to_gguf(&file, &mut model);
            eprintln!("{arch:?} {dtype:?}: max |Δlogit| {gap:.2e} (max |logit| {scale:.2})");
            assert!(
                gap <= rel_tol * scale,
                "{arch:?} {dtype:?}: {gap} vs {scale}"
            );
            std::fs::remove_dir_all(&dir).unwrap();
        }
    }
}

/// The folder's llama weights are un-permuted: run with GGUF's interleaved pairing they give
/// other logits (so the half-split mapping, not luck, makes the test above pass).
#[test]
fn a_llama_folder_needs_the_half_split_layout() {
    let file = synthetic_gguf(Architecture::Llama);
    let dir = scratch("layout");
    export_gguf(&file, &dir, Dtype::F32).unwrap();
    let folder = HfFolder::open(&dir).unwrap();
    let mut config = folder.config().clone();
    config.rope_layout = RopeLayout::Interleaved;
    let weights = folder.read_weights().unwrap();
    let special = folder.special_tokens().clone();
    let mut wrong =
        LlamaModel::from_weights(config, weights, special, small_options(MatmulPath::Exact))
            .unwrap();
    let (gap, scale) = gap_to_gguf(&file, &mut wrong);
    assert!(gap > 1e-2 * scale, "{gap} vs {scale}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A folder whose tensors are split over two shards named by `model.safetensors.index.json`
/// loads to the same model as the single file.
#[test]
fn sharded_folders_load_like_one_file() {
    let file = synthetic_gguf(Architecture::Qwen2);
    let dir = scratch("sharded");
    export_gguf(&file, &dir, Dtype::F32).unwrap();
    let single = prefill(&mut folder_model(&dir), &TOKENS);
    let whole = SafetensorsFile::open(dir.join("model.safetensors")).unwrap();
    let mut shards: [Vec<OwnedTensor>; 2] = [Vec::new(), Vec::new()];
    let mut weight_map = serde_json::Map::new();
    for (i, name) in whole.names().into_iter().enumerate() {
        let e = whole.entry(name).unwrap();
        let shard = format!("model-{:05}-of-00002.safetensors", i % 2 + 1);
        weight_map.insert(name.to_string(), serde_json::json!(shard));
        shards[i % 2].push((
            name.to_string(),
            e.dtype,
            e.shape.clone(),
            whole.data(e).to_vec(),
        ));
    }
    drop(whole);
    std::fs::remove_file(dir.join("model.safetensors")).unwrap();
    for (i, tensors) in shards.iter().enumerate() {
        let path = dir.join(format!("model-{:05}-of-00002.safetensors", i + 1));
        write_safetensors(&path, tensors, None).unwrap();
    }
    let index = serde_json::json!({"metadata": {}, "weight_map": weight_map});
    std::fs::write(dir.join("model.safetensors.index.json"), index.to_string()).unwrap();
    let folder = HfFolder::open(&dir).unwrap();
    assert_eq!(folder.shard_paths().len(), 2);
    let split = prefill(&mut folder_model(&dir), &TOKENS);
    for r in 0..TOKENS.len() {
        assert_eq!(common::bits(split.row(r)), common::bits(single.row(r)));
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Reads every tensor of `dir/model.safetensors`, lets `change` edit the list, writes it back.
fn rewrite_tensors(dir: &Path, change: impl FnOnce(&mut Vec<OwnedTensor>)) {
    let path = dir.join("model.safetensors");
    let file = SafetensorsFile::open(&path).unwrap();
    let mut tensors: Vec<OwnedTensor> = file
        .names()
        .into_iter()
        .map(|n| {
            let e = file.entry(n).unwrap();
            (
                n.to_string(),
                e.dtype,
                e.shape.clone(),
                file.data(e).to_vec(),
            )
        })
        .collect();
    drop(file);
    change(&mut tensors);
    write_safetensors(&path, &tensors, None).unwrap();
}

fn edit_config(dir: &Path, change: impl FnOnce(&mut serde_json::Value)) {
    let path = dir.join("config.json");
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    change(&mut config);
    std::fs::write(&path, config.to_string()).unwrap();
}

/// Every way a folder can be broken is an error naming the fault, before any forward.
#[test]
fn hostile_folders_are_refused_naming_the_fault() {
    let file = synthetic_gguf(Architecture::Qwen2);
    let good = scratch("hostile-good");
    export_gguf(&file, &good, Dtype::BF16).unwrap();
    type Break = Box<dyn Fn(&Path)>;
    let cases: Vec<(&str, Break, &str)> = vec![
        (
            "no config.json",
            Box::new(|d| std::fs::remove_file(d.join("config.json")).unwrap()),
            "config.json",
        ),
        (
            "config.json not JSON",
            Box::new(|d| std::fs::write(d.join("config.json"), "{").unwrap()),
            "config.json",
        ),
        (
            "unknown architecture",
            Box::new(|d| edit_config(d, |c| c["architectures"] = serde_json::json!(["GPT2"]))),
            "`architectures`",
        ),
        (
            "unsupported rope scaling",
            Box::new(|d| {
                edit_config(d, |c| {
                    c["rope_scaling"] = serde_json::json!({"rope_type": "longrope", "factor": 2})
                })
            }),
            "rope_scaling.rope_type",
        ),
        (
            "config sizes not the tensors'",
            Box::new(|d| edit_config(d, |c| c["vocab_size"] = serde_json::json!(65))),
            "model.embed_tokens.weight",
        ),
        (
            "no shard",
            Box::new(|d| std::fs::remove_file(d.join("model.safetensors")).unwrap()),
            "no *.safetensors",
        ),
        (
            "truncated shard",
            Box::new(|d| {
                let path = d.join("model.safetensors");
                let bytes = std::fs::read(&path).unwrap();
                std::fs::write(&path, &bytes[..bytes.len() - 100]).unwrap();
            }),
            "model.safetensors: safetensors",
        ),
        (
            "garbage shard",
            Box::new(|d| std::fs::write(d.join("model.safetensors"), [0xffu8; 64]).unwrap()),
            "model.safetensors: safetensors",
        ),
        (
            "missing tensor",
            Box::new(|d| rewrite_tensors(d, |t| t.retain(|x| x.0 != "model.norm.weight"))),
            "model.norm.weight",
        ),
        (
            "wrong shape",
            Box::new(|d| {
                rewrite_tensors(d, |t| {
                    let q = t
                        .iter_mut()
                        .find(|x| x.0 == "model.layers.1.self_attn.k_proj.weight")
                        .unwrap();
                    q.2 = vec![q.2[1], q.2[0]];
                })
            }),
            "model.layers.1.self_attn.k_proj.weight",
        ),
        (
            "wrong dtype",
            Box::new(|d| {
                rewrite_tensors(d, |t| {
                    let k = t
                        .iter_mut()
                        .find(|x| x.0 == "model.layers.0.mlp.up_proj.weight")
                        .unwrap();
                    k.1 = Dtype::I16;
                })
            }),
            "I16",
        ),
        (
            "tensor in two shards",
            Box::new(|d| {
                std::fs::copy(d.join("model.safetensors"), d.join("extra.safetensors")).unwrap();
            }),
            "in two shards",
        ),
        (
            "index naming a shard outside the folder",
            Box::new(|d| {
                let index =
                    serde_json::json!({"weight_map": {"model.norm.weight": "../x.safetensors"}});
                std::fs::write(d.join("model.safetensors.index.json"), index.to_string()).unwrap();
            }),
            "not a file in the folder",
        ),
        (
            "index naming the wrong shard",
            Box::new(|d| {
                std::fs::copy(d.join("model.safetensors"), d.join("b.safetensors")).unwrap();
                std::fs::remove_file(d.join("model.safetensors")).unwrap();
                let index = serde_json::json!({"weight_map": {"model.norm.weight": "b.safetensors", "lm_head.weight": "c.safetensors"}});
                std::fs::write(d.join("model.safetensors.index.json"), index.to_string()).unwrap();
            }),
            "c.safetensors",
        ),
        (
            "no tokenizer.json",
            Box::new(|d| std::fs::remove_file(d.join("tokenizer.json")).unwrap()),
            "tokenizer.json",
        ),
        (
            "tokenizer.json not a tokenizer",
            Box::new(|d| std::fs::write(d.join("tokenizer.json"), "{\"model\": 3}").unwrap()),
            "tokenizer.json",
        ),
    ];
    for (label, breaks, needle) in cases {
        let dir = scratch("hostile");
        std::fs::create_dir_all(&dir).unwrap();
        for entry in std::fs::read_dir(&good).unwrap() {
            let entry = entry.unwrap();
            std::fs::copy(entry.path(), dir.join(entry.file_name())).unwrap();
        }
        breaks(&dir);
        let err = Checkpoint::open(&dir)
            .and_then(|c| {
                c.tokenizer()?;
                c.load(small_options(MatmulPath::Exact))
            })
            .map(drop)
            .expect_err(label)
            .to_string();
        assert!(err.contains(needle), "{label}: `{needle}` not in: {err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
    // export refuses to write into a folder holding files
    let err = export_gguf(&file, &good, Dtype::F32)
        .unwrap_err()
        .to_string();
    assert!(err.contains("not empty"), "{err}");
    // a directory without config.json is not taken for a model
    let empty = scratch("hostile-empty");
    std::fs::create_dir_all(&empty).unwrap();
    let err = registry::resolve(empty.to_str().unwrap()).unwrap_err();
    assert!(
        matches!(&err, ModelError::ModelNotFound(m) if m.contains("without config.json")),
        "{err}"
    );
    assert!(registry::resolve(good.to_str().unwrap()).is_ok());
    std::fs::remove_dir_all(&empty).unwrap();
    std::fs::remove_dir_all(&good).unwrap();
}

/// The SmolLM2 prompt of ../shared/MODELS.md and its reference (transformers on the GGUF
/// dequantised to f32).
const FIB_IDS: [u32; 6] = [1604, 3987, 46477, 24, 94, 727];
const REF_TOP5_IDS: [u32; 5] = [472, 198, 3805, 1004, 16390];
const REF_TOP5_LOGITS: [f32; 5] = [30.8428, 26.7989, 26.1031, 25.7934, 25.6094];

/// SmolLM2 exported to a folder in F32 and BF16 and loaded back: the tokenizer from
/// `tokenizer.json` gives the GGUF tokenizer's ids (the reference ids among them), and the
/// next-token logits after `def fibonacci(n):` match the outside reference. F32 holds the
/// dequantised weights exactly, so the bound is the GGUF runner's own (llama_reference.rs:
/// 5e-4 absolute on the fixture's 4-decimal top-5). BF16 rounds each weight by up to 2^-9
/// relative, a perturbation of the model rather than arithmetic noise: top-5 ids must still
/// match and logits stay within 0.1 (measured here on the CPU: F32 5.9e-5, BF16 3.2e-2).
#[test]
fn smollm2_folder_matches_the_reference_logits_and_tokenizer() {
    let Some(file) = gguf("smollm2-135m") else {
        return;
    };
    let gguf_tokenizer = Tokenizer::from_gguf(&file).unwrap();
    for (dtype, tol) in [(Dtype::F32, 5e-4f32), (Dtype::BF16, 0.1)] {
        let dir = scratch(&format!("smollm2-{dtype:?}"));
        export_gguf(&file, &dir, dtype).unwrap();
        let checkpoint = Checkpoint::open(&dir).unwrap();
        let tokenizer = checkpoint.tokenizer().unwrap();
        let text = "def fibonacci(n):";
        assert_eq!(tokenizer.encode_prompt(text).unwrap(), FIB_IDS);
        for text in [
            "Hello world",
            "<|im_start|>user\nWhat is 12345 + 6789?<|im_end|>\n",
            "  déjà vu\t\n\nfn main() { println!(\"ü\"); }",
        ] {
            let ids = tokenizer.encode_prompt(text).unwrap();
            assert_eq!(ids, gguf_tokenizer.encode_prompt(text).unwrap(), "{text:?}");
            assert_eq!(tokenizer.decode(&ids).unwrap(), text);
        }
        assert_eq!(tokenizer.vocab_size(), gguf_tokenizer.vocab_size());
        assert_eq!(tokenizer.eos_id(), gguf_tokenizer.eos_id());
        let messages = [specdec_models::tokenizer::ChatMessage::user("Hi")];
        assert_eq!(
            tokenizer.apply_chat_template(&messages, true).unwrap(),
            gguf_tokenizer.apply_chat_template(&messages, true).unwrap()
        );
        let mut model = checkpoint.load(small_options(MatmulPath::Exact)).unwrap();
        let out = prefill(&mut model, &FIB_IDS);
        let top = top_k(out.row(out.rows() - 1), 5);
        let ids: Vec<u32> = top.iter().map(|t| t.0).collect();
        assert_eq!(ids, REF_TOP5_IDS, "{dtype:?}: {top:?}");
        let worst = top
            .iter()
            .zip(REF_TOP5_LOGITS)
            .map(|((_, got), want)| (got - want).abs())
            .fold(0.0f32, f32::max);
        eprintln!("smollm2 folder {dtype:?}: top-5 {top:?}, max |Δ| vs reference {worst:.2e}");
        assert!(worst <= tol, "{dtype:?}: {worst} > {tol}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
