//! The target a head is trained for: its identity (the file and its SHA-256), its shape, and the
//! frozen pieces a head reuses (token embedding, final norm, LM head rows), read from the GGUF
//! through the models crate's quantised matrices, dequantised row by row on demand.

use std::sync::Arc;

use sha2::{Digest, Sha256};
use specdec_kernels::ops::embed_rows;
use specdec_models::gguf::GgufFile;
use specdec_models::heads::HeadTarget;
use specdec_models::llama::{read_config, read_weights, LlamaConfig, ModelWeights};
use specdec_models::registry;

use crate::error::{ModelContext, Result};

/// A target model opened for training a head against it. Cheap to keep around: the weights stay
/// in the (memory-mapped) GGUF's quantised blocks.
pub struct FrozenTarget {
    identity: HeadTarget,
    short_name: String,
    config: LlamaConfig,
    file: Arc<GgufFile>,
    weights: ModelWeights,
}

impl std::fmt::Debug for FrozenTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FrozenTarget")
            .field("identity", &self.identity)
            .finish_non_exhaustive()
    }
}

impl FrozenTarget {
    /// Opens `name_or_path`: a registry name (`smollm2-135m`, …; its identity is the pinned
    /// SHA-256 of `models/registry.toml`) or a path to a GGUF file (hashed), as
    /// [`registry::identify`] resolves it.
    ///
    /// # Errors
    /// [`crate::TrainError::Model`] when the registry file is not cached (naming the fetch
    /// command), the path does not exist or cannot be hashed, or the GGUF is not a supported
    /// decoder.
    pub fn open(name_or_path: &str) -> Result<Self> {
        let id = registry::identify(name_or_path)
            .model_context(|| format!("target `{name_or_path}`"))?;
        let file =
            GgufFile::open(&id.path).model_context(|| format!("target {}", id.path.display()))?;
        Self::from_gguf(Arc::new(file), &id.file_name, &id.short_name, id.sha256)
    }

    /// A target over a parsed GGUF (e.g. a synthetic test model): `name` is its file name (for
    /// messages and the head's metadata), `short_name` the stem of default output names, and
    /// `sha256` its identity.
    ///
    /// # Errors
    /// [`crate::TrainError::Model`] for an unsupported architecture or missing/misshapen tensors.
    pub fn from_gguf(
        file: Arc<GgufFile>,
        name: &str,
        short_name: &str,
        sha256: String,
    ) -> Result<Self> {
        let context = || format!("target {name}");
        let config = read_config(&file).model_context(context)?;
        let weights = read_weights(&file, &config).model_context(context)?;
        Ok(Self {
            identity: HeadTarget::for_target(&config, name, &sha256),
            short_name: short_name.to_string(),
            config,
            file,
            weights,
        })
    }

    /// What a head file records about this target.
    pub fn identity(&self) -> &HeadTarget {
        &self.identity
    }

    /// The registry name, or the GGUF file stem: the `<target-name>` of default output paths.
    pub fn short_name(&self) -> &str {
        &self.short_name
    }

    /// The decoder's hyper-parameters.
    pub fn config(&self) -> &LlamaConfig {
        &self.config
    }

    /// The parsed GGUF file (shared with a [`specdec_models::llama::LlamaModel`] built on it).
    pub fn file(&self) -> &Arc<GgufFile> {
        &self.file
    }

    /// The final RMSNorm gain, `[hidden]`.
    pub fn output_norm(&self) -> &[f32] {
        &self.weights.output_norm
    }

    /// Token embedding rows of `ids`, dequantised: `[ids.len() × hidden]` row-major.
    ///
    /// # Errors
    /// [`crate::TrainError::Model`] naming the first id outside the vocabulary.
    pub fn embedding_rows(&self, ids: &[u32]) -> Result<Vec<f32>> {
        rows_of(&self.weights.token_embd, ids, "token embedding")
    }

    /// LM head rows of `ids` (`output.weight`, or the token embedding for a tied head),
    /// dequantised: `[ids.len() × hidden]` row-major.
    ///
    /// # Errors
    /// As [`FrozenTarget::embedding_rows`].
    pub fn lm_head_rows(&self, ids: &[u32]) -> Result<Vec<f32>> {
        rows_of(&self.weights.output, ids, "LM head")
    }
}

/// Rows `ids` of `matrix`, dequantised by the kernels' embedding gather.
fn rows_of(
    matrix: &specdec_models::llama::WeightMatrix,
    ids: &[u32],
    what: &str,
) -> Result<Vec<f32>> {
    let mut out = vec![0.0; ids.len() * matrix.cols()];
    embed_rows(&matrix.view(), ids, &mut out).model_context(|| format!("{what} rows"))?;
    Ok(out)
}

/// SHA-256 of `bytes`, lower-case hex.
pub fn sha256_of_bytes(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

fn hex(digest: &[u8]) -> String {
    digest.iter().map(|b| format!("{b:02x}")).collect()
}
