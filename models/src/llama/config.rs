//! Hyper-parameters of a Llama-family model, read from GGUF metadata.

pub use specdec_kernels::ops::RopeLayout;

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
}
