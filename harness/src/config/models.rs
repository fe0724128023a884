//! Which target and draft models an experiment uses, and how a model name resolves.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// The `[models]` table. Each entry is a known model name (see [`KnownModel`]), a path to a GGUF
/// file or to a Hugging Face model folder, `"toy"` (the toy probability-table models) or `"simulated"` (no model: the
/// `[simulation]` table stands in for it).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelsConfig {
    /// The target model whose distribution the output must follow.
    #[serde(default = "simulated")]
    pub target: String,
    /// The draft model used by model drafters (`chain`, `tree`, ...); absent for plain decoding,
    /// n-gram and self-drafting methods. `layer_skip` makes the target with some blocks skipped
    /// the draft model of every model drafter.
    #[serde(default)]
    pub draft: Option<String>,
    /// Where target and draft models run: `cpu` (the default), `cuda` (GPU 0) or `cuda:N`. On a
    /// GPU the runner works in its batch-invariant mode (greedy speculative output equals plain
    /// output) and layer-skip drafting is not available.
    #[serde(default = "cpu")]
    pub device: String,
    /// The KV memory budget of the target's and one drafter's paged KV pools together, e.g.
    /// `"8GiB"` (units as `KvMemory::parse`) [default: a quarter of the machine's memory].
    /// Requests are admitted while their prompt and `max_tokens` fit; the others wait.
    #[serde(default)]
    pub kv_memory: Option<String>,
    /// The element type of every KV pool: `"f32"` (the default), `"bf16"` or `"f16"` (half the
    /// bytes per token: twice the tokens in `kv_memory`; values rounded when stored, attention
    /// in f32). CPU only: the CUDA runner reads f32 pools.
    #[serde(default)]
    pub kv_dtype: Option<String>,
    /// Tensor-parallel ranks of the target (≥ 1, [default: 1]): the target's weights and KV
    /// heads split among that many ranks, joined by an all-reduce after each block's attention
    /// and MLP: CPU ranks on threads of one process, or with a GPU `device` one rank per GPU
    /// (CUDA devices `0..N`, NCCL; fewer GPUs than ranks is a clear error at load). The draft
    /// stays whole on rank 0's thread and device. The ranks must divide the KV heads' and
    /// quantisation blocks' split (a clear error otherwise).
    #[serde(default)]
    pub tensor_parallel: Option<usize>,
}

fn cpu() -> String {
    "cpu".to_string()
}

fn simulated() -> String {
    "simulated".to_string()
}

impl Default for ModelsConfig {
    fn default() -> Self {
        ModelsConfig {
            target: simulated(),
            draft: None,
            device: cpu(),
            kv_memory: None,
            kv_dtype: None,
            tensor_parallel: None,
        }
    }
}

/// A model the fetch script (`scripts/fetch-models.sh`) knows by name; its GGUF lives under
/// `~/.cache/specdec`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum KnownModel {
    /// SmolLM2 135M (a tiny Llama-family draft).
    Smollm2_135m,
    /// Qwen2.5-Coder 0.5B (the draft of the Qwen pair).
    QwenCoder0_5b,
    /// Qwen2.5-Coder 1.5B (the target of the Qwen pair).
    QwenCoder1_5b,
}

impl KnownModel {
    /// Every known model, in the order help texts list them.
    pub const ALL: [KnownModel; 3] = [
        KnownModel::Smollm2_135m,
        KnownModel::QwenCoder0_5b,
        KnownModel::QwenCoder1_5b,
    ];

    /// The name used in configs and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            KnownModel::Smollm2_135m => "smollm2-135m",
            KnownModel::QwenCoder0_5b => "qwen2.5-coder-0.5b",
            KnownModel::QwenCoder1_5b => "qwen2.5-coder-1.5b",
        }
    }
}

/// What a model entry resolves to.
#[derive(Debug, Clone, PartialEq)]
pub enum ModelSource {
    /// A model known by name (resolved through the fetch cache by the model runner).
    Named(KnownModel),
    /// A GGUF file given by path.
    Gguf(PathBuf),
    /// A Hugging Face model folder given by path (a directory with `config.json`,
    /// `tokenizer.json` and `*.safetensors`).
    HfFolder(PathBuf),
    /// The toy probability-table models.
    Toy,
    /// No model: the simulation's acceptance process and cost model stand in.
    Simulated,
}

impl ModelSource {
    /// Resolves a config entry. Errors with a message listing the accepted forms when `text` is
    /// neither a known name, `toy`, `simulated`, a path ending in `.gguf`, nor an existing
    /// directory (a Hugging Face model folder; its files are checked when it is opened).
    pub fn parse(text: &str) -> Result<ModelSource, String> {
        if text == "toy" {
            return Ok(ModelSource::Toy);
        }
        if text == "simulated" {
            return Ok(ModelSource::Simulated);
        }
        if let Some(known) = KnownModel::ALL.iter().find(|m| m.name() == text) {
            return Ok(ModelSource::Named(*known));
        }
        if text.to_ascii_lowercase().ends_with(".gguf") {
            return Ok(ModelSource::Gguf(PathBuf::from(text)));
        }
        if std::path::Path::new(text).is_dir() {
            return Ok(ModelSource::HfFolder(PathBuf::from(text)));
        }
        let names: Vec<&str> = KnownModel::ALL.iter().map(|m| m.name()).collect();
        Err(format!(
            "unknown model `{text}`: use one of {}, `toy`, `simulated`, a path to a .gguf file, or a Hugging Face model folder",
            names.join(", ")
        ))
    }

    /// Whether running this model needs the real model runner (the engine backend).
    pub fn needs_model_runner(&self) -> bool {
        matches!(
            self,
            ModelSource::Named(_) | ModelSource::Gguf(_) | ModelSource::HfFolder(_)
        )
    }
}
