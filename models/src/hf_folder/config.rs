//! `config.json` of a Hugging Face Llama / Qwen2 checkpoint, to and from [`LlamaConfig`].
//!
//! Read: `architectures` (`LlamaForCausalLM` or `Qwen2ForCausalLM`), `hidden_size`,
//! `num_hidden_layers`, `num_attention_heads`, `num_key_value_heads` [= heads],
//! `intermediate_size`, `head_dim` [= hidden / heads], `rms_norm_eps`, `rope_theta` [10 000],
//! `rope_scaling` (or transformers 5's `rope_parameters`), `vocab_size`,
//! `tie_word_embeddings` [whether `lm_head.weight` is absent], `max_position_embeddings`,
//! `torch_dtype` (or `dtype`), `bos_token_id`, `eos_token_id` (an id or a list). Keys that would
//! change the forward pass in a way the runner does not implement are refused by name:
//! `hidden_act` other than `silu`, `attention_bias` or `mlp_bias` true (Llama), and
//! `use_sliding_window` true (Qwen2). Other keys (training settings such as `initializer_range`,
//! `use_cache`, `attention_dropout`) do not affect inference and are not read.

use serde::de::DeserializeOwned;
use serde_json::{json, Value};

use crate::error::{ModelError, Result};
use crate::llama::{Architecture, LlamaConfig, RopeLayout, RopeScaling, SpecialTokens};

/// The `architectures` entry of `arch`.
pub fn architecture_name(arch: Architecture) -> &'static str {
    match arch {
        Architecture::Llama => "LlamaForCausalLM",
        Architecture::Qwen2 => "Qwen2ForCausalLM",
    }
}

/// A `config.json` as far as it is read (see the module docs).
#[derive(Debug, Clone, PartialEq)]
pub struct HfConfig {
    /// The model class; exactly one entry.
    pub architectures: Vec<String>,
    /// Residual width.
    pub hidden_size: usize,
    /// Decoder blocks.
    pub num_hidden_layers: usize,
    /// Query heads.
    pub num_attention_heads: usize,
    /// Key/value heads [default: `num_attention_heads`].
    pub num_key_value_heads: Option<usize>,
    /// SwiGLU inner width.
    pub intermediate_size: usize,
    /// Width of one head [default: `hidden_size / num_attention_heads`].
    pub head_dim: Option<usize>,
    /// RMSNorm epsilon.
    pub rms_norm_eps: f64,
    /// RoPE base [default: 10 000, or `rope_parameters.rope_theta`].
    pub rope_theta: Option<f64>,
    /// RoPE scaling (transformers 4), `null` for none.
    pub rope_scaling: Option<Value>,
    /// RoPE settings (transformers 5): `rope_theta`, `rope_type` and the scaling keys.
    pub rope_parameters: Option<Value>,
    /// Vocabulary size (rows of the embedding).
    pub vocab_size: usize,
    /// Whether the LM head is the embedding [default: no `lm_head.weight` in the shards].
    pub tie_word_embeddings: Option<bool>,
    /// Longest context.
    pub max_position_embeddings: usize,
    /// The checkpoint's float type (`float32`, `float16`, `bfloat16`).
    pub torch_dtype: Option<String>,
    /// transformers 5's name for `torch_dtype`.
    pub dtype: Option<String>,
    /// The MLP activation [default: `silu`].
    pub hidden_act: Option<String>,
    /// Llama: biases on Q/K/V/O [default: false].
    pub attention_bias: Option<bool>,
    /// Llama: biases on the MLP [default: false].
    pub mlp_bias: Option<bool>,
    /// Qwen2: sliding-window attention [default: false].
    pub use_sliding_window: Option<bool>,
    /// The BOS id.
    pub bos_token_id: Option<u32>,
    /// The EOS id, or several.
    pub eos_token_id: Option<Value>,
}

fn refuse(key: &str, reason: String) -> ModelError {
    ModelError::Config(format!("config.json: `{key}` {reason}"))
}

impl HfConfig {
    /// Parses `config.json` text.
    ///
    /// # Errors
    /// [`ModelError::Config`] for text that is not a JSON object, or naming the missing or
    /// mistyped key.
    pub fn parse(text: &str) -> Result<Self> {
        let value: Value = serde_json::from_str(text)
            .map_err(|e| ModelError::Config(format!("config.json: {e}")))?;
        let Value::Object(map) = value else {
            return Err(ModelError::Config(
                "config.json: not a JSON object".to_string(),
            ));
        };
        // each key read on its own, so that a type error names the key
        let optional = |key: &str| map.get(key).filter(|v| !v.is_null()).cloned();
        fn typed<T: DeserializeOwned>(key: &str, value: Option<Value>) -> Result<Option<T>> {
            value
                .map(|v| {
                    serde_json::from_value(v).map_err(|e| refuse(key, format!("is invalid: {e}")))
                })
                .transpose()
        }
        macro_rules! get {
            ($key:literal) => {
                typed($key, optional($key))?
            };
        }
        macro_rules! need {
            ($key:literal) => {
                typed($key, optional($key))?
                    .ok_or_else(|| refuse($key, "is missing".to_string()))?
            };
        }
        Ok(Self {
            architectures: need!("architectures"),
            hidden_size: need!("hidden_size"),
            num_hidden_layers: need!("num_hidden_layers"),
            num_attention_heads: need!("num_attention_heads"),
            num_key_value_heads: get!("num_key_value_heads"),
            intermediate_size: need!("intermediate_size"),
            head_dim: get!("head_dim"),
            rms_norm_eps: need!("rms_norm_eps"),
            rope_theta: get!("rope_theta"),
            rope_scaling: optional("rope_scaling"),
            rope_parameters: optional("rope_parameters"),
            vocab_size: need!("vocab_size"),
            tie_word_embeddings: get!("tie_word_embeddings"),
            max_position_embeddings: need!("max_position_embeddings"),
            torch_dtype: get!("torch_dtype"),
            dtype: get!("dtype"),
            hidden_act: get!("hidden_act"),
            attention_bias: get!("attention_bias"),
            mlp_bias: get!("mlp_bias"),
            use_sliding_window: get!("use_sliding_window"),
            bos_token_id: get!("bos_token_id"),
            eos_token_id: optional("eos_token_id"),
        })
    }

    /// The architecture `architectures` names.
    ///
    /// # Errors
    /// [`ModelError::Config`] for another class or not exactly one entry.
    pub fn architecture(&self) -> Result<Architecture> {
        match self.architectures.as_slice() {
            [one] if one == "LlamaForCausalLM" => Ok(Architecture::Llama),
            [one] if one == "Qwen2ForCausalLM" => Ok(Architecture::Qwen2),
            other => Err(refuse(
                "architectures",
                format!(
                    "is {other:?}; supported: [\"LlamaForCausalLM\"] or [\"Qwen2ForCausalLM\"]"
                ),
            )),
        }
    }

    /// The runner's configuration: Hugging Face weights pair RoPE dimensions half-split
    /// (rotate-half) for both architectures, Q/K unpermuted. `has_lm_head` says whether the
    /// shards hold `lm_head.weight` (the default of `tie_word_embeddings`).
    ///
    /// # Errors
    /// [`ModelError::Config`] naming the key: an unsupported architecture, activation, bias,
    /// sliding window, float type or RoPE scaling; or sizes [`LlamaConfig::validate`] refuses.
    pub fn to_llama(&self, has_lm_head: bool) -> Result<LlamaConfig> {
        let arch = self.architecture()?;
        if let Some(act) = self.hidden_act.as_deref().filter(|a| *a != "silu") {
            return Err(refuse(
                "hidden_act",
                format!("`{act}` is not supported (silu)"),
            ));
        }
        for (key, on) in [
            ("attention_bias", self.attention_bias),
            ("mlp_bias", self.mlp_bias),
            ("use_sliding_window", self.use_sliding_window),
        ] {
            if on == Some(true) {
                return Err(refuse(
                    key,
                    "is true, which the runner does not implement".into(),
                ));
            }
        }
        for (key, dtype) in [("torch_dtype", &self.torch_dtype), ("dtype", &self.dtype)] {
            if let Some(d) = dtype.as_deref() {
                if !matches!(d, "float32" | "float16" | "bfloat16") {
                    return Err(refuse(
                        key,
                        format!("`{d}` is not supported (float32, float16, bfloat16)"),
                    ));
                }
            }
        }
        for (key, n) in [
            ("num_attention_heads", self.num_attention_heads),
            ("max_position_embeddings", self.max_position_embeddings),
        ] {
            if n == 0 {
                return Err(refuse(key, "is 0".into()));
            }
        }
        let (rope_base, rope_scaling) = self.rope()?;
        let config = LlamaConfig {
            arch,
            n_layers: self.num_hidden_layers,
            hidden: self.hidden_size,
            ffn: self.intermediate_size,
            n_heads: self.num_attention_heads,
            n_kv_heads: self.num_key_value_heads.unwrap_or(self.num_attention_heads),
            head_dim: self
                .head_dim
                .unwrap_or(self.hidden_size / self.num_attention_heads),
            rms_eps: self.rms_norm_eps as f32,
            rope_base,
            rope_layout: RopeLayout::HalfSplit,
            rope_scaling,
            context_length: self.max_position_embeddings,
            vocab_size: self.vocab_size,
            qkv_bias: arch == Architecture::Qwen2,
            tied_head: self.tie_word_embeddings.unwrap_or(!has_lm_head),
        };
        config
            .validate()
            .map_err(|e| ModelError::Config(format!("config.json: {e}")))?;
        Ok(config)
    }

    /// The RoPE base and scaling from `rope_theta` / `rope_scaling` or `rope_parameters`.
    fn rope(&self) -> Result<(f32, RopeScaling)> {
        let (key, params) = match (&self.rope_parameters, &self.rope_scaling) {
            (Some(p), _) if !p.is_null() => ("rope_parameters", Some(p)),
            (_, Some(s)) if !s.is_null() => ("rope_scaling", Some(s)),
            _ => ("rope_scaling", None),
        };
        let number = |name: &str| params.and_then(|p| p.get(name)).and_then(Value::as_f64);
        let base = self
            .rope_theta
            .or_else(|| number("rope_theta"))
            .unwrap_or(10_000.0);
        let Some(params) = params else {
            return Ok((base as f32, RopeScaling::None));
        };
        let kind = params
            .get("rope_type")
            .or_else(|| params.get("type"))
            .and_then(Value::as_str)
            .unwrap_or("default");
        let need = |name: &str| {
            number(name).ok_or_else(|| {
                refuse(
                    &format!("{key}.{name}"),
                    format!("is missing (needed by rope_type `{kind}`)"),
                )
            })
        };
        let scaling = match kind {
            "default" => RopeScaling::None,
            "linear" => RopeScaling::Linear {
                factor: need("factor")? as f32,
            },
            "yarn" => {
                let factor = need("factor")?;
                let original = need("original_max_position_embeddings")?;
                if !(original >= 1.0 && original.fract() == 0.0) {
                    return Err(refuse(
                        &format!("{key}.original_max_position_embeddings"),
                        format!("= {original} is not a positive integer"),
                    ));
                }
                // transformers multiplies cos/sin by `attention_factor` when given, else by
                // 1 + 0.1 ln(factor); the runner by attn_factor · (1 + 0.1 ln factor).
                let attn_factor = match number("attention_factor") {
                    Some(a) => a / (1.0 + 0.1 * factor.ln()),
                    None => 1.0,
                };
                RopeScaling::Yarn {
                    factor: factor as f32,
                    original_context: original as usize,
                    beta_fast: number("beta_fast").unwrap_or(32.0) as f32,
                    beta_slow: number("beta_slow").unwrap_or(1.0) as f32,
                    attn_factor: attn_factor as f32,
                }
            }
            other => {
                return Err(refuse(
                    &format!("{key}.rope_type"),
                    format!("`{other}` is not supported (default, linear, yarn)"),
                ))
            }
        };
        scaling
            .validate()
            .map_err(|e| refuse(key, format!("is invalid: {e}")))?;
        Ok((base as f32, scaling))
    }

    /// The special tokens: `bos_token_id`, and `eos_token_id` as one id or a list.
    ///
    /// # Errors
    /// [`ModelError::Config`] when `eos_token_id` is neither an id nor a list of ids.
    pub fn special_tokens(&self) -> Result<SpecialTokens> {
        let id = |v: &Value| v.as_u64().and_then(|i| u32::try_from(i).ok());
        let eos =
            match &self.eos_token_id {
                None | Some(Value::Null) => Vec::new(),
                Some(Value::Array(ids)) => ids
                    .iter()
                    .map(id)
                    .collect::<Option<Vec<u32>>>()
                    .ok_or_else(|| {
                        refuse(
                            "eos_token_id",
                            format!("{ids:?} is not a list of token ids"),
                        )
                    })?,
                Some(v) => vec![id(v)
                    .ok_or_else(|| refuse("eos_token_id", format!("{v} is not a token id")))?],
            };
        Ok(SpecialTokens {
            bos: self.bos_token_id,
            eos,
        })
    }
}

/// The `config.json` of a checkpoint of `config` stored as `torch_dtype` (`float32`, …) with
/// special tokens `special`: what [`HfConfig::to_llama`] reads back to `config` with the
/// half-split RoPE layout.
pub fn config_json(config: &LlamaConfig, special: &SpecialTokens, torch_dtype: &str) -> Value {
    let model_type = config.arch.key_prefix();
    let rope_scaling = match config.rope_scaling {
        RopeScaling::None => Value::Null,
        RopeScaling::Linear { factor } => json!({"rope_type": "linear", "factor": factor}),
        RopeScaling::Yarn {
            factor,
            original_context,
            beta_fast,
            beta_slow,
            attn_factor,
        } => json!({
            "rope_type": "yarn",
            "factor": factor,
            "original_max_position_embeddings": original_context,
            "beta_fast": beta_fast,
            "beta_slow": beta_slow,
            "attention_factor": f64::from(attn_factor) * (1.0 + 0.1 * f64::from(factor).ln()),
        }),
    };
    let eos = match special.eos.as_slice() {
        [] => Value::Null,
        [one] => json!(one),
        many => json!(many),
    };
    json!({
        "architectures": [architecture_name(config.arch)],
        "model_type": model_type,
        "hidden_size": config.hidden,
        "num_hidden_layers": config.n_layers,
        "num_attention_heads": config.n_heads,
        "num_key_value_heads": config.n_kv_heads,
        "head_dim": config.head_dim,
        "intermediate_size": config.ffn,
        "hidden_act": "silu",
        "rms_norm_eps": config.rms_eps,
        "rope_theta": config.rope_base,
        "rope_scaling": rope_scaling,
        "vocab_size": config.vocab_size,
        "tie_word_embeddings": config.tied_head,
        "max_position_embeddings": config.context_length,
        "torch_dtype": torch_dtype,
        "bos_token_id": special.bos,
        "eos_token_id": eos,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn smollm_json() -> Value {
        json!({
            "architectures": ["LlamaForCausalLM"],
            "hidden_size": 576, "num_hidden_layers": 30, "num_attention_heads": 9,
            "num_key_value_heads": 3, "intermediate_size": 1536, "rms_norm_eps": 1e-5,
            "rope_theta": 100000.0, "vocab_size": 49152, "tie_word_embeddings": true,
            "max_position_embeddings": 8192, "torch_dtype": "bfloat16",
            "bos_token_id": 1, "eos_token_id": 2, "initializer_range": 0.02
        })
    }

    fn parse(v: &Value) -> Result<LlamaConfig> {
        HfConfig::parse(&v.to_string())?.to_llama(false)
    }

    #[test]
    fn reads_a_llama_config_with_half_split_rope() {
        let c = parse(&smollm_json()).unwrap();
        assert_eq!((c.n_layers, c.hidden, c.ffn), (30, 576, 1536));
        assert_eq!((c.n_heads, c.n_kv_heads, c.head_dim), (9, 3, 64));
        assert_eq!(c.rope_layout, RopeLayout::HalfSplit);
        assert!(c.tied_head && !c.qkv_bias);
        assert_eq!((c.rope_base, c.rms_eps), (100_000.0, 1e-5));
        let written = config_json(
            &c,
            &SpecialTokens {
                bos: Some(1),
                eos: vec![2, 7],
            },
            "float32",
        );
        let back = HfConfig::parse(&written.to_string()).unwrap();
        assert_eq!(back.to_llama(false).unwrap(), c);
        assert_eq!(back.special_tokens().unwrap().eos, [2, 7]);
    }

    #[test]
    fn rope_scaling_is_read_or_refused_by_key() {
        let with = |key: &str, v: Value| {
            let mut j = smollm_json();
            j[key] = v;
            parse(&j)
        };
        let linear = with("rope_scaling", json!({"type": "linear", "factor": 4.0})).unwrap();
        assert_eq!(linear.rope_scaling, RopeScaling::Linear { factor: 4.0 });
        let yarn = with(
            "rope_scaling",
            json!({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}),
        )
        .unwrap();
        assert!(matches!(
            yarn.rope_scaling,
            RopeScaling::Yarn { original_context: 32768, attn_factor, .. } if attn_factor == 1.0
        ));
        let v5 = with(
            "rope_parameters",
            json!({"rope_type": "default", "rope_theta": 5.0}),
        );
        let mut j = smollm_json();
        j.as_object_mut().unwrap().remove("rope_theta");
        j["rope_parameters"] = json!({"rope_type": "default", "rope_theta": 5.0});
        assert_eq!(parse(&j).unwrap().rope_base, 5.0);
        assert!(v5.is_ok());
        for (key, v, needle) in [
            (
                "rope_scaling",
                json!({"rope_type": "llama3", "factor": 8.0}),
                "rope_scaling.rope_type",
            ),
            (
                "rope_scaling",
                json!({"rope_type": "linear"}),
                "rope_scaling.factor",
            ),
            (
                "rope_scaling",
                json!({"rope_type": "yarn", "factor": 2.0}),
                "original_max_position_embeddings",
            ),
            (
                "architectures",
                json!(["MistralForCausalLM"]),
                "architectures",
            ),
            ("hidden_act", json!("gelu"), "hidden_act"),
            ("attention_bias", json!(true), "attention_bias"),
            ("torch_dtype", json!("float8_e4m3fn"), "torch_dtype"),
            (
                "num_key_value_heads",
                json!(4),
                "not a multiple of 4 KV heads",
            ),
            ("hidden_size", json!("wide"), "hidden_size"),
        ] {
            let err = with(key, v).unwrap_err().to_string();
            assert!(err.contains(needle), "{needle}: {err}");
        }
        let mut j = smollm_json();
        j.as_object_mut().unwrap().remove("rms_norm_eps");
        assert!(parse(&j).unwrap_err().to_string().contains("rms_norm_eps"));
    }
}
