//! Hyper-parameters of a Llama-family model, read from GGUF metadata.

pub use specdec_kernels::ops::{RopeLayout, RopeScaling};

use crate::error::{ModelError, Result};

/// The architectures the runner implements (GGUF `general.architecture`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Architecture {
    /// `llama` (Llama, SmolLM2, …): no QKV bias; GGUF stores Q/K permuted for interleaved-pair RoPE.
    Llama,
    /// `qwen2`: QKV bias, half-split (NEOX) RoPE.
    Qwen2,
}

impl Architecture {
    /// Parses a GGUF `general.architecture` value.
    ///
    /// # Errors
    /// [`ModelError::Config`] for any other architecture.
    pub fn parse(name: &str) -> Result<Self> {
        match name {
            "llama" => Ok(Self::Llama),
            "qwen2" => Ok(Self::Qwen2),
            other => Err(ModelError::Config(format!(
                "architecture {other:?} is not supported (llama, qwen2)"
            ))),
        }
    }

    /// The prefix of this architecture's metadata keys (`{arch}.block_count`, …).
    pub fn key_prefix(self) -> &'static str {
        match self {
            Self::Llama => "llama",
            Self::Qwen2 => "qwen2",
        }
    }

    /// How this architecture's GGUF weights pair the dimensions RoPE rotates.
    pub fn rope_layout(self) -> RopeLayout {
        match self {
            Self::Llama => RopeLayout::Interleaved,
            Self::Qwen2 => RopeLayout::HalfSplit,
        }
    }
}

/// The shape and constants of a Llama-family decoder.
#[derive(Debug, Clone, PartialEq)]
pub struct LlamaConfig {
    /// Architecture (decides QKV bias and RoPE layout).
    pub arch: Architecture,
    /// Number of decoder blocks (`{arch}.block_count`).
    pub n_layers: usize,
    /// Residual width (`{arch}.embedding_length`).
    pub hidden: usize,
    /// SwiGLU inner width (`{arch}.feed_forward_length`).
    pub ffn: usize,
    /// Query heads (`{arch}.attention.head_count`).
    pub n_heads: usize,
    /// Key/value heads (`{arch}.attention.head_count_kv`); divides `n_heads`.
    pub n_kv_heads: usize,
    /// Width of one head (`{arch}.attention.key_length`, else `hidden / n_heads`).
    pub head_dim: usize,
    /// RMSNorm epsilon (`{arch}.attention.layer_norm_rms_epsilon`).
    pub rms_eps: f32,
    /// RoPE base frequency (`{arch}.rope.freq_base`, 10 000 when absent).
    pub rope_base: f32,
    /// RoPE layout of the stored Q/K weights.
    pub rope_layout: RopeLayout,
    /// How RoPE angles are stretched (`{arch}.rope.scaling.*`, see [`rope_scaling_from`]; none
    /// when absent).
    pub rope_scaling: RopeScaling,
    /// Longest context (`{arch}.context_length`).
    pub context_length: usize,
    /// Vocabulary size (length of `tokenizer.ggml.tokens`).
    pub vocab_size: usize,
    /// True when Q, K and V projections carry a bias (qwen2).
    pub qkv_bias: bool,
    /// True when there is no `output.weight` and the LM head reuses the token embedding.
    pub tied_head: bool,
}

impl LlamaConfig {
    /// Builds the configuration of `arch` from a numeric metadata lookup (`key` → value, `None`
    /// when absent), the vocabulary size, and whether the file has a separate `output.weight`.
    ///
    /// # Errors
    /// [`ModelError::Config`] naming a missing key or an inconsistent value (zero sizes, query
    /// heads not a multiple of KV heads, an odd head width).
    pub fn from_metadata(
        arch: Architecture,
        lookup: impl Fn(&str) -> Option<f64>,
        vocab_size: usize,
        has_output_weight: bool,
    ) -> Result<Self> {
        let prefix = arch.key_prefix();
        let get = |suffix: &str| -> Result<f64> {
            let key = format!("{prefix}.{suffix}");
            lookup(&key).ok_or_else(|| ModelError::Config(format!("missing metadata key {key}")))
        };
        let count = |suffix: &str| -> Result<usize> {
            let v = get(suffix)?;
            if v.is_finite() && v >= 1.0 && v.fract() == 0.0 {
                Ok(v as usize)
            } else {
                Err(ModelError::Config(format!(
                    "{prefix}.{suffix} = {v} is not a positive integer"
                )))
            }
        };
        let n_heads = count("attention.head_count")?;
        let hidden = count("embedding_length")?;
        let head_dim = match lookup(&format!("{prefix}.attention.key_length")) {
            Some(_) => count("attention.key_length")?,
            None => hidden / n_heads,
        };
        let config = Self {
            arch,
            n_layers: count("block_count")?,
            hidden,
            ffn: count("feed_forward_length")?,
            n_heads,
            n_kv_heads: count("attention.head_count_kv")?,
            head_dim,
            rms_eps: get("attention.layer_norm_rms_epsilon")? as f32,
            rope_base: lookup(&format!("{prefix}.rope.freq_base")).unwrap_or(10_000.0) as f32,
            rope_layout: arch.rope_layout(),
            rope_scaling: RopeScaling::None,
            context_length: count("context_length")?,
            vocab_size,
            qkv_bias: arch == Architecture::Qwen2,
            tied_head: !has_output_weight,
        };
        config.validate()?;
        Ok(config)
    }

    /// Checks the invariants the runner relies on.
    ///
    /// # Errors
    /// [`ModelError::Config`] naming the first broken one.
    pub fn validate(&self) -> Result<()> {
        let fail = |msg: String| Err(ModelError::Config(msg));
        if self.n_layers == 0 || self.hidden == 0 || self.ffn == 0 || self.vocab_size == 0 {
            return fail(format!("zero size in {self:?}"));
        }
        if self.n_kv_heads == 0 || !self.n_heads.is_multiple_of(self.n_kv_heads) {
            return fail(format!(
                "{} query heads are not a multiple of {} KV heads",
                self.n_heads, self.n_kv_heads
            ));
        }
        if self.head_dim == 0 || !self.head_dim.is_multiple_of(2) {
            return fail(format!("head width {} is not even", self.head_dim));
        }
        if !(self.rms_eps > 0.0 && self.rope_base > 0.0) {
            return fail(format!(
                "rms epsilon {} and rope base {} must be positive",
                self.rms_eps, self.rope_base
            ));
        }
        Ok(())
    }

    /// Query heads sharing one KV head.
    pub fn group_size(&self) -> usize {
        self.n_heads / self.n_kv_heads
    }

    /// Width of all query heads together (`n_heads * head_dim`).
    pub fn q_dim(&self) -> usize {
        self.n_heads * self.head_dim
    }

    /// Width of all KV heads together (`n_kv_heads * head_dim`).
    pub fn kv_dim(&self) -> usize {
        self.n_kv_heads * self.head_dim
    }
}

/// The RoPE scaling of a model of `arch` from its GGUF metadata: `kind` is
/// `{arch}.rope.scaling.type` (`none`, `linear` or `yarn`), `lookup` the numeric keys:
/// `rope.scaling.factor` (or the older `rope.scale_linear`), `rope.scaling.original_context_length`
/// (YaRN), `rope.scaling.attn_factor` (default 1), `rope.scaling.yarn_beta_fast` (default 32) and
/// `rope.scaling.yarn_beta_slow` (default 1). No type and no `rope.scale_linear` means none.
///
/// # Errors
/// [`ModelError::Config`] for another type (named with the supported ones), a missing factor or
/// original context, or values [`RopeScaling::validate`] refuses.
pub fn rope_scaling_from(
    arch: Architecture,
    kind: Option<&str>,
    lookup: impl Fn(&str) -> Option<f64>,
) -> Result<RopeScaling> {
    let prefix = arch.key_prefix();
    let key = |suffix: &str| format!("{prefix}.rope.{suffix}");
    let num = |suffix: &str| lookup(&key(suffix));
    let need = |suffix: &str| {
        num(suffix).ok_or_else(|| {
            ModelError::Config(format!(
                "{} is `{}` but {} is missing",
                key("scaling.type"),
                kind.unwrap_or_default(),
                key(suffix)
            ))
        })
    };
    let scaling = match kind {
        None => match num("scale_linear") {
            Some(factor) => RopeScaling::Linear {
                factor: factor as f32,
            },
            None => RopeScaling::None,
        },
        Some("none") => RopeScaling::None,
        Some("linear") => {
            let factor = match num("scaling.factor").or_else(|| num("scale_linear")) {
                Some(factor) => factor,
                None => need("scaling.factor")?,
            };
            RopeScaling::Linear {
                factor: factor as f32,
            }
        }
        Some("yarn") => {
            let original = need("scaling.original_context_length")?;
            if !(original.is_finite() && original >= 1.0 && original.fract() == 0.0) {
                return Err(ModelError::Config(format!(
                    "{} = {original} is not a positive integer",
                    key("scaling.original_context_length")
                )));
            }
            RopeScaling::Yarn {
                factor: need("scaling.factor")? as f32,
                original_context: original as usize,
                beta_fast: num("scaling.yarn_beta_fast").unwrap_or(32.0) as f32,
                beta_slow: num("scaling.yarn_beta_slow").unwrap_or(1.0) as f32,
                attn_factor: num("scaling.attn_factor").unwrap_or(1.0) as f32,
            }
        }
        Some(other) => {
            return Err(ModelError::Config(format!(
                "{} `{other}` is not supported (none, linear or yarn)",
                key("scaling.type")
            )))
        }
    };
    scaling
        .validate()
        .map_err(|e| ModelError::Config(format!("{}: {e}", key("scaling"))))?;
    Ok(scaling)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn smollm_like() -> HashMap<String, f64> {
        [
            ("llama.block_count", 30.0),
            ("llama.embedding_length", 576.0),
            ("llama.feed_forward_length", 1536.0),
            ("llama.attention.head_count", 9.0),
            ("llama.attention.head_count_kv", 3.0),
            ("llama.attention.layer_norm_rms_epsilon", 1e-5),
            ("llama.rope.freq_base", 100_000.0),
            ("llama.context_length", 8192.0),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }

    #[test]
    fn reads_llama_keys() {
        let meta = smollm_like();
        let c =
            LlamaConfig::from_metadata(Architecture::Llama, |k| meta.get(k).copied(), 49152, false)
                .unwrap();
        assert_eq!((c.n_layers, c.hidden, c.ffn), (30, 576, 1536));
        assert_eq!((c.n_heads, c.n_kv_heads, c.head_dim), (9, 3, 64));
        assert_eq!(c.group_size(), 3);
        assert!(c.tied_head && !c.qkv_bias);
        assert_eq!(c.rope_layout, RopeLayout::Interleaved);
        assert_eq!(c.rope_base, 100_000.0);
    }

    #[test]
    fn missing_and_bad_keys_are_named() {
        let mut meta = smollm_like();
        meta.remove("llama.block_count");
        let err =
            LlamaConfig::from_metadata(Architecture::Llama, |k| meta.get(k).copied(), 10, true)
                .unwrap_err()
                .to_string();
        assert!(err.contains("llama.block_count"), "{err}");
        let mut meta = smollm_like();
        meta.insert("llama.attention.head_count_kv".into(), 4.0);
        let err =
            LlamaConfig::from_metadata(Architecture::Llama, |k| meta.get(k).copied(), 10, true)
                .unwrap_err()
                .to_string();
        assert!(err.contains("not a multiple of 4 KV heads"), "{err}");
        assert!(Architecture::parse("gpt2").is_err());
        assert_eq!(
            Architecture::parse("qwen2").unwrap().rope_layout(),
            RopeLayout::HalfSplit
        );
    }

    #[test]
    fn rope_scaling_is_read_from_the_metadata_and_used() {
        use crate::gguf::Value;
        use crate::llama::synthetic::{synthetic_custom, SyntheticOptions};
        use crate::llama::{read_config, LlamaModel, LlamaOptions};
        use crate::{LanguageModel, SequenceStep};
        use specdec_kernels::TreeTopology;

        let with = |entries: &[(&str, Value)]| {
            let options = SyntheticOptions {
                metadata: entries
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.clone()))
                    .collect(),
                ..SyntheticOptions::default()
            };
            synthetic_custom(Architecture::Llama, 3, &options)
        };
        let linear = with(&[
            ("llama.rope.scaling.type", Value::from("linear")),
            ("llama.rope.scaling.factor", Value::from(4.0f32)),
        ]);
        let config = read_config(&linear).unwrap();
        assert_eq!(config.rope_scaling, RopeScaling::Linear { factor: 4.0 });
        let yarn = with(&[
            ("llama.rope.scaling.type", Value::from("yarn")),
            ("llama.rope.scaling.factor", Value::from(4.0f32)),
            (
                "llama.rope.scaling.original_context_length",
                Value::from(128u32),
            ),
        ]);
        assert_eq!(
            read_config(&yarn).unwrap().rope_scaling,
            RopeScaling::Yarn {
                factor: 4.0,
                original_context: 128,
                beta_fast: 32.0,
                beta_slow: 1.0,
                attn_factor: 1.0
            }
        );
        let plain = with(&[]);
        assert_eq!(read_config(&plain).unwrap().rope_scaling, RopeScaling::None);
        // the forward uses it: the same weights give other logits past position 0
        let last_logits = |file| {
            let mut m = LlamaModel::from_gguf(file, LlamaOptions::default()).unwrap();
            let seq = m.new_sequence().unwrap();
            let tokens = [1, 5, 9, 2, 7, 3];
            let chain = TreeTopology::chain(tokens.len());
            let logits = m
                .forward(&[SequenceStep::chain(seq, &tokens, &chain)])
                .unwrap();
            (logits[0].row(0).to_vec(), logits[0].row(5).to_vec())
        };
        let (scaled_first, scaled_last) = last_logits(&linear);
        let (plain_first, plain_last) = last_logits(&plain);
        assert_eq!(
            scaled_first, plain_first,
            "position 0 has angle 0 either way"
        );
        assert_ne!(
            scaled_last, plain_last,
            "the scaling changes later positions"
        );
        // refused: another type, a missing factor, a bad value
        for (entries, needle) in [
            (
                vec![("llama.rope.scaling.type", Value::from("longrope"))],
                "longrope",
            ),
            (
                vec![("llama.rope.scaling.type", Value::from("linear"))],
                "scaling.factor is missing",
            ),
            (
                vec![
                    ("llama.rope.scaling.type", Value::from("yarn")),
                    ("llama.rope.scaling.factor", Value::from(4.0f32)),
                ],
                "original_context_length is missing",
            ),
            (
                vec![
                    ("llama.rope.scaling.type", Value::from("linear")),
                    ("llama.rope.scaling.factor", Value::from(-2.0f32)),
                ],
                "-2",
            ),
        ] {
            let err = read_config(&with(&entries)).unwrap_err().to_string();
            assert!(err.contains(needle), "{needle}: {err}");
        }
    }
}
