//! Hugging Face model folders: a directory with `config.json`, `tokenizer.json` (and optionally
//! `tokenizer_config.json`) and the weights in `*.safetensors` shards (listed by
//! `model.safetensors.index.json` when present), for `LlamaForCausalLM` and
//! `Qwen2ForCausalLM` in F32, F16 or BF16.
//!
//! Weights stay in the memory-mapped shards in their stored type ([`WeightMatrix`] F32 / F16 /
//! BF16). Hugging Face stores Q/K unpermuted for half-split (rotate-half) RoPE, so a folder's
//! configuration says [`RopeLayout::HalfSplit`] for Llama too, where a GGUF llama file stores
//! them permuted for interleaved pairs; [`export`] writes a folder from a GGUF file, undoing
//! that permutation.

mod config;
pub mod export;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Deserialize;

pub use config::{architecture_name, config_json, HfConfig};
pub use export::{export_gguf, parse_dtype, ExportSummary, EXPORT_DTYPES};

use crate::error::{ModelError, Result};
use crate::llama::{
    LayerWeights, LlamaConfig, ModelWeights, RopeLayout, SpecialTokens, WeightMatrix,
};
use crate::safetensors_file::SafetensorsFile;
use crate::tokenizer::{HfTokenizerSettings, Tokenizer};

/// The file naming the shard of every tensor, when the weights are split.
pub const INDEX_FILE: &str = "model.safetensors.index.json";

/// The Hugging Face name of every tensor of block `layer` paired with its GGUF name, in the
/// order [`read_weights`](HfFolder::read_weights) reads them (biases only where the
/// architecture has them: see [`LlamaConfig::qkv_bias`]).
pub fn layer_tensor_names(layer: usize, qkv_bias: bool) -> Vec<(String, String)> {
    let mut names = vec![
        ("input_layernorm.weight", "attn_norm.weight"),
        ("self_attn.q_proj.weight", "attn_q.weight"),
        ("self_attn.k_proj.weight", "attn_k.weight"),
        ("self_attn.v_proj.weight", "attn_v.weight"),
        ("self_attn.o_proj.weight", "attn_output.weight"),
        ("post_attention_layernorm.weight", "ffn_norm.weight"),
        ("mlp.gate_proj.weight", "ffn_gate.weight"),
        ("mlp.up_proj.weight", "ffn_up.weight"),
        ("mlp.down_proj.weight", "ffn_down.weight"),
    ];
    if qkv_bias {
        names.extend([
            ("self_attn.q_proj.bias", "attn_q.bias"),
            ("self_attn.k_proj.bias", "attn_k.bias"),
            ("self_attn.v_proj.bias", "attn_v.bias"),
        ]);
    }
    names
        .into_iter()
        .map(|(hf, gguf)| {
            (
                format!("model.layers.{layer}.{hf}"),
                format!("blk.{layer}.{gguf}"),
            )
        })
        .collect()
}

/// The Hugging Face names of the tensors outside the blocks paired with their GGUF names:
/// embedding, final norm and (untied) LM head.
pub const GLOBAL_TENSOR_NAMES: [(&str, &str); 3] = [
    ("model.embed_tokens.weight", "token_embd.weight"),
    ("model.norm.weight", "output_norm.weight"),
    ("lm_head.weight", "output.weight"),
];

/// An opened Hugging Face model folder: its configuration, special tokens and shards (the
/// tokenizer is read on demand, [`HfFolder::tokenizer`]).
pub struct HfFolder {
    dir: PathBuf,
    config: LlamaConfig,
    special: SpecialTokens,
    shards: Vec<Arc<SafetensorsFile>>,
    /// Tensor name → index into `shards`.
    by_name: HashMap<String, usize>,
}

impl std::fmt::Debug for HfFolder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HfFolder")
            .field("dir", &self.dir)
            .field("config", &self.config)
            .field("shards", &self.shards.len())
            .finish_non_exhaustive()
    }
}

#[derive(Deserialize)]
struct ShardIndex {
    weight_map: HashMap<String, String>,
}

fn read_text(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).map_err(|source| ModelError::Io {
        path: path.display().to_string(),
        source,
    })
}

fn in_folder(dir: &Path, what: ModelError) -> ModelError {
    match what {
        ModelError::Config(msg) => ModelError::Config(format!("{}: {msg}", dir.display())),
        other => other,
    }
}

impl HfFolder {
    /// Opens the folder `dir`: parses `config.json`, maps the shards and checks their tensor
    /// tables (no tensor in two shards; with an index, every listed tensor in its shard).
    /// Tensor shapes are checked by [`HfFolder::read_weights`].
    ///
    /// # Errors
    /// [`ModelError::Io`] naming a missing or unreadable file; [`ModelError::Config`] naming
    /// the folder and the fault: a bad or unsupported `config.json` ([`HfConfig::to_llama`]),
    /// no `*.safetensors` shard, a bad index, a shard name outside the folder, a tensor in two
    /// shards, a shard that is not valid safetensors (truncated, bad header).
    pub fn open(dir: impl AsRef<Path>) -> Result<Self> {
        let dir = dir.as_ref().to_path_buf();
        let hf = HfConfig::parse(&read_text(&dir.join("config.json"))?)
            .map_err(|e| in_folder(&dir, e))?;
        let shard_names = shard_names(&dir)?;
        let mut shards = Vec::new();
        let mut by_name = HashMap::new();
        for name in &shard_names {
            let shard = Arc::new(SafetensorsFile::open(dir.join(name))?);
            for tensor in shard.names() {
                if by_name.insert(tensor.to_string(), shards.len()).is_some() {
                    return Err(ModelError::Config(format!(
                        "{}: tensor `{tensor}` is in two shards",
                        dir.display()
                    )));
                }
            }
            shards.push(shard);
        }
        if let Some(index) = read_index(&dir)? {
            for (tensor, file) in &index.weight_map {
                let found = by_name.get(tensor).map(|&i| &shard_names[i]);
                if found != Some(file) {
                    return Err(ModelError::Config(format!(
                        "{}: {INDEX_FILE} puts `{tensor}` in {file}, but it is not there",
                        dir.display()
                    )));
                }
            }
        }
        let config = hf
            .to_llama(by_name.contains_key("lm_head.weight"))
            .map_err(|e| in_folder(&dir, e))?;
        let special = hf.special_tokens().map_err(|e| in_folder(&dir, e))?;
        Ok(Self {
            dir,
            config,
            special,
            shards,
            by_name,
        })
    }

    /// The folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The decoder's configuration (RoPE layout half-split).
    pub fn config(&self) -> &LlamaConfig {
        &self.config
    }

    /// BOS and EOS ids from `config.json`.
    pub fn special_tokens(&self) -> &SpecialTokens {
        &self.special
    }

    /// The paths of the weight shards, in the order they were opened.
    pub fn shard_paths(&self) -> Vec<&Path> {
        self.shards.iter().map(|s| s.path()).collect()
    }

    fn shard_of(&self, name: &str) -> Result<&Arc<SafetensorsFile>> {
        self.by_name
            .get(name)
            .map(|&i| &self.shards[i])
            .ok_or_else(|| ModelError::MissingTensor {
                path: self.dir.display().to_string(),
                name: name.to_string(),
            })
    }

    fn matrix(&self, name: &str, rows: usize, cols: usize) -> Result<WeightMatrix> {
        let m = WeightMatrix::from_safetensors(self.shard_of(name)?, name)?;
        if (m.rows(), m.cols()) != (rows, cols) {
            return Err(ModelError::Shape {
                what: format!("{}: {name}", self.dir.display()),
                reason: format!(
                    "expected [{rows}, {cols}] for config.json, found [{}, {}]",
                    m.rows(),
                    m.cols()
                ),
            });
        }
        Ok(m)
    }

    fn vector(&self, name: &str, len: usize) -> Result<Vec<f32>> {
        let shard = self.shard_of(name)?;
        let shape = &shard.entry(name).expect("indexed").shape;
        if shape[..] != [len] {
            return Err(ModelError::Shape {
                what: format!("{}: {name}", self.dir.display()),
                reason: format!("expected [{len}] for config.json, found {shape:?}"),
            });
        }
        shard.to_f32(name)
    }

    /// The decoder's weights: matrices over the mapped shards in their stored type, norm gains
    /// and biases converted to f32.
    ///
    /// # Errors
    /// [`ModelError::MissingTensor`] naming an absent tensor; [`ModelError::Shape`] naming a
    /// tensor whose shape does not match `config.json` or whose dtype is not F32 / F16 / BF16.
    pub fn read_weights(&self) -> Result<ModelWeights> {
        let c = &self.config;
        debug_assert_eq!(c.rope_layout, RopeLayout::HalfSplit);
        let (h, q, kv, f) = (c.hidden, c.q_dim(), c.kv_dim(), c.ffn);
        let layers = (0..c.n_layers)
            .map(|i| {
                let name = |t: &str| format!("model.layers.{i}.{t}");
                let bias = |t: &str, len| {
                    if c.qkv_bias {
                        self.vector(&name(t), len).map(Some)
                    } else {
                        Ok(None)
                    }
                };
                Ok(LayerWeights {
                    attn_norm: self.vector(&name("input_layernorm.weight"), h)?,
                    wq: self.matrix(&name("self_attn.q_proj.weight"), q, h)?,
                    wk: self.matrix(&name("self_attn.k_proj.weight"), kv, h)?,
                    wv: self.matrix(&name("self_attn.v_proj.weight"), kv, h)?,
                    bq: bias("self_attn.q_proj.bias", q)?,
                    bk: bias("self_attn.k_proj.bias", kv)?,
                    bv: bias("self_attn.v_proj.bias", kv)?,
                    wo: self.matrix(&name("self_attn.o_proj.weight"), h, q)?,
                    ffn_norm: self.vector(&name("post_attention_layernorm.weight"), h)?,
                    w_gate: self.matrix(&name("mlp.gate_proj.weight"), f, h)?,
                    w_up: self.matrix(&name("mlp.up_proj.weight"), f, h)?,
                    w_down: self.matrix(&name("mlp.down_proj.weight"), h, f)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let token_embd = self.matrix("model.embed_tokens.weight", c.vocab_size, h)?;
        let output = if c.tied_head {
            token_embd.clone()
        } else {
            self.matrix("lm_head.weight", c.vocab_size, h)?
        };
        Ok(ModelWeights {
            token_embd,
            layers,
            output_norm: self.vector("model.norm.weight", h)?,
            output,
        })
    }

    /// The tokenizer: `tokenizer.json` read by the `tokenizers` crate, BOS / EOS from
    /// `config.json` (else `bos_token` / `eos_token` of `tokenizer_config.json`), and
    /// `add_bos_token` and `chat_template` from `tokenizer_config.json` when present.
    ///
    /// # Errors
    /// [`ModelError::Io`] when `tokenizer.json` (or a present `tokenizer_config.json`) cannot be
    /// read; [`ModelError::Tokenizer`] / [`ModelError::ChatTemplate`] as
    /// [`Tokenizer::from_hf_json`], and for a `tokenizer_config.json` that is not JSON.
    pub fn tokenizer(&self) -> Result<Tokenizer> {
        let json_path = self.dir.join("tokenizer.json");
        let json = std::fs::read(&json_path).map_err(|source| ModelError::Io {
            path: json_path.display().to_string(),
            source,
        })?;
        let config_path = self.dir.join("tokenizer_config.json");
        let config: serde_json::Value = if config_path.is_file() {
            serde_json::from_str(&read_text(&config_path)?)
                .map_err(|e| ModelError::Tokenizer(format!("{}: {e}", config_path.display())))?
        } else {
            serde_json::Value::Null
        };
        // `bos_token` is a string or an added-token object {"content": ...}
        let token_text = |key: &str| {
            let v = config.get(key)?;
            v.as_str()
                .or_else(|| v.get("content").and_then(|c| c.as_str()))
                .map(str::to_owned)
        };
        let mut settings = HfTokenizerSettings {
            bos_id: self.special.bos,
            eos_id: self.special.eos.first().copied(),
            add_bos: config
                .get("add_bos_token")
                .and_then(|v| v.as_bool())
                .unwrap_or(false),
            chat_template: config
                .get("chat_template")
                .and_then(|v| v.as_str())
                .map(str::to_owned),
        };
        if settings.bos_id.is_none() || settings.eos_id.is_none() {
            let probe = Tokenizer::from_hf_json(&json, &HfTokenizerSettings::default())?;
            let id_of = |key: &str| token_text(key).and_then(|t| probe.token_id(&t));
            settings.bos_id = settings.bos_id.or_else(|| id_of("bos_token"));
            settings.eos_id = settings.eos_id.or_else(|| id_of("eos_token"));
        }
        Tokenizer::from_hf_json(&json, &settings).map_err(|e| match e {
            ModelError::Tokenizer(msg) => {
                ModelError::Tokenizer(format!("{}: {msg}", json_path.display()))
            }
            other => other,
        })
    }
}

/// The shard file names: the index's (sorted, distinct) when there is one, else every
/// `*.safetensors` file in `dir`, sorted.
fn shard_names(dir: &Path) -> Result<Vec<String>> {
    if let Some(index) = read_index(dir)? {
        let mut names: Vec<String> = index.weight_map.values().cloned().collect();
        names.sort();
        names.dedup();
        if let Some(bad) = names
            .iter()
            .find(|n| n.contains(['/', '\\']) || n.starts_with('.') || n.is_empty())
        {
            return Err(ModelError::Config(format!(
                "{}: {INDEX_FILE} names shard `{bad}`, which is not a file in the folder",
                dir.display()
            )));
        }
        return Ok(names);
    }
    let entries = std::fs::read_dir(dir).map_err(|source| ModelError::Io {
        path: dir.display().to_string(),
        source,
    })?;
    let mut names: Vec<String> = entries
        .filter_map(|e| e.ok())
        .filter(|e| e.path().is_file())
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| n.ends_with(".safetensors"))
        .collect();
    names.sort();
    if names.is_empty() {
        return Err(ModelError::Config(format!(
            "{}: no *.safetensors weight file in the folder",
            dir.display()
        )));
    }
    Ok(names)
}

fn read_index(dir: &Path) -> Result<Option<ShardIndex>> {
    let path = dir.join(INDEX_FILE);
    if !path.is_file() {
        return Ok(None);
    }
    serde_json::from_str(&read_text(&path)?)
        .map(Some)
        .map_err(|e| ModelError::Config(format!("{}: {e}", path.display())))
}

/// Whether `path` looks like a Hugging Face model folder (a directory with a `config.json`).
pub fn is_hf_folder(path: &Path) -> bool {
    path.is_dir() && path.join("config.json").is_file()
}
