//! Reading a Llama-family decoder (configuration and quantised weights) from a GGUF file.

use std::sync::Arc;

use specdec_kernels::quant::{dequantize_row_to_vec, QuantType};

use super::config::{rope_scaling_from, Architecture, LlamaConfig};
use super::weights::{LayerWeights, ModelWeights, WeightMatrix};
use crate::error::{ModelError, Result};
use crate::gguf::{FromValue, GgufFile};

/// Special token ids read from the file.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SpecialTokens {
    /// `tokenizer.ggml.bos_token_id`.
    pub bos: Option<u32>,
    /// The ids that end a generation: `tokenizer.ggml.eos_token_id`, then
    /// `tokenizer.ggml.eot_token_id`, then every control token named in [`END_OF_GENERATION`]
    /// (each id once, in that order).
    pub eos: Vec<u32>,
}

/// Texts of control tokens that end a generation whatever `eos_token_id` says (llama.cpp's
/// end-of-generation set does the same). An instruct GGUF names its end of turn
/// (`<|im_end|>`) as EOS, but a plain completion ends with the end of text (`<|endoftext|>`),
/// after which the model writes unrelated text.
pub const END_OF_GENERATION: [&str; 9] = [
    "<|endoftext|>",
    "<|im_end|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|end_of_text|>",
    "<|end|>",
    "<end_of_turn>",
    "<EOT>",
    "<\u{ff5c}end\u{2581}of\u{2581}sentence\u{ff5c}>",
];

/// `tokenizer.ggml.token_type` of a control token.
const CONTROL_TOKEN: i64 = 3;

/// The configuration of the decoder in `file`.
///
/// # Errors
/// [`ModelError::Config`] for an unsupported architecture or a missing/bad hyper-parameter.
pub fn read_config(file: &GgufFile) -> Result<LlamaConfig> {
    let arch = Architecture::parse(file.architecture()?)?;
    let md = file.metadata();
    let vocab_size = md.get_str_array("tokenizer.ggml.tokens")?.len();
    let lookup = |key: &str| {
        let value = md.get(key)?;
        value
            .as_integer()
            .map(|v| v as f64)
            .or_else(|| f64::from_value(value))
    };
    let mut config =
        LlamaConfig::from_metadata(arch, lookup, vocab_size, file.has_tensor("output.weight"))?;
    let kind_key = format!("{}.rope.scaling.type", arch.key_prefix());
    let kind: Option<&str> = md.get_opt(&kind_key)?;
    config.rope_scaling = rope_scaling_from(arch, kind, lookup)?;
    Ok(config)
}

/// The special tokens of `file` (absent keys give `None` / an empty list).
pub fn read_special_tokens(file: &GgufFile) -> SpecialTokens {
    let md = file.metadata();
    let id = |key: &str| md.get_opt::<u32>(key).ok().flatten();
    let mut eos: Vec<u32> = id("tokenizer.ggml.eos_token_id").into_iter().collect();
    eos.extend(id("tokenizer.ggml.eot_token_id"));
    // Control tokens by name: without a token-type list no token is known to be one.
    let tokens = md
        .get_str_array("tokenizer.ggml.tokens")
        .unwrap_or_default();
    let types = md
        .get_opt::<Vec<i64>>("tokenizer.ggml.token_type")
        .ok()
        .flatten()
        .unwrap_or_default();
    for (id, (token, _)) in tokens
        .iter()
        .zip(&types)
        .enumerate()
        .filter(|(_, (_, &ty))| ty == CONTROL_TOKEN)
    {
        if END_OF_GENERATION.contains(&token.as_str()) {
            eos.push(id as u32);
        }
    }
    let mut seen = std::collections::HashSet::new();
    eos.retain(|id| seen.insert(*id));
    SpecialTokens {
        bos: id("tokenizer.ggml.bos_token_id"),
        eos,
    }
}

fn matrix(file: &Arc<GgufFile>, name: &str, rows: usize, cols: usize) -> Result<WeightMatrix> {
    let m = WeightMatrix::from_gguf(file, name)?;
    if (m.rows(), m.cols()) != (rows, cols) {
        return Err(ModelError::Shape {
            what: name.to_string(),
            reason: format!(
                "expected [{rows} x {cols}], found [{} x {}]",
                m.rows(),
                m.cols()
            ),
        });
    }
    Ok(m)
}

fn vector(file: &GgufFile, name: &str, len: usize) -> Result<Vec<f32>> {
    let t = file.tensor(name)?;
    if t.info.n_elements() != len {
        return Err(ModelError::Shape {
            what: name.to_string(),
            reason: format!("expected {len} values, found {}", t.info.n_elements()),
        });
    }
    let ty = QuantType::from_ggml_id(t.quant_type().ggml_id())?;
    if ty != QuantType::F32 {
        return Err(ModelError::Shape {
            what: name.to_string(),
            reason: format!(
                "a norm gain or bias is stored as F32 (GGUF writers keep every 1-D tensor in \
                 F32), found {}: the file's tensor table is corrupt",
                ty.name()
            ),
        });
    }
    Ok(dequantize_row_to_vec(ty, t.data, len)?)
}

/// The weights of the decoder `config` describes, from `file`. Matrices stay in the file's
/// (memory-mapped) blocks; norm gains and biases must be F32 (the type every GGUF writer gives
/// 1-D tensors).
///
/// # Errors
/// A missing tensor, or [`ModelError::Shape`] naming a tensor of the wrong shape, or a norm
/// gain or bias not stored as F32.
pub fn read_weights(file: &Arc<GgufFile>, config: &LlamaConfig) -> Result<ModelWeights> {
    let (h, q, kv, f) = (config.hidden, config.q_dim(), config.kv_dim(), config.ffn);
    let layers = (0..config.n_layers)
        .map(|i| {
            let name = |t: &str| format!("blk.{i}.{t}");
            let bias = |t: &str, len| {
                if config.qkv_bias {
                    vector(file, &name(t), len).map(Some)
                } else {
                    Ok(None)
                }
            };
            Ok(LayerWeights {
                attn_norm: vector(file, &name("attn_norm.weight"), h)?,
                wq: matrix(file, &name("attn_q.weight"), q, h)?,
                wk: matrix(file, &name("attn_k.weight"), kv, h)?,
                wv: matrix(file, &name("attn_v.weight"), kv, h)?,
                bq: bias("attn_q.bias", q)?,
                bk: bias("attn_k.bias", kv)?,
                bv: bias("attn_v.bias", kv)?,
                wo: matrix(file, &name("attn_output.weight"), h, q)?,
                ffn_norm: vector(file, &name("ffn_norm.weight"), h)?,
                w_gate: matrix(file, &name("ffn_gate.weight"), f, h)?,
                w_up: matrix(file, &name("ffn_up.weight"), f, h)?,
                w_down: matrix(file, &name("ffn_down.weight"), h, f)?,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let token_embd = matrix(file, "token_embd.weight", config.vocab_size, h)?;
    let output = if config.tied_head {
        token_embd.clone()
    } else {
        matrix(file, "output.weight", config.vocab_size, h)?
    };
    Ok(ModelWeights {
        token_embd,
        layers,
        output_norm: vector(file, "output_norm.weight", h)?,
        output,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::GgufWriter;

    #[test]
    fn a_norm_gain_must_be_f32() {
        let mut w = GgufWriter::new();
        w.tensor_f32("good.weight", &[4], &[1.0, 2.0, 3.0, 4.0]);
        // the same four gains as F16 (1, 2, 3, 4): a consistent file, the wrong type for a norm
        w.tensor("half.weight", &[4], 1, vec![0, 60, 0, 64, 0, 66, 0, 68]);
        let file = GgufFile::from_bytes(w.to_bytes()).unwrap();
        assert_eq!(
            vector(&file, "good.weight", 4).unwrap(),
            [1.0, 2.0, 3.0, 4.0]
        );
        let err = vector(&file, "half.weight", 4).unwrap_err().to_string();
        assert!(
            err.contains("half.weight") && err.contains("F32") && err.contains("F16"),
            "{err}"
        );
    }

    #[test]
    fn generation_ends_at_eos_eot_and_end_of_text_control_tokens() {
        let tokens: Vec<String> = [
            "<|endoftext|>",
            "a",
            "<|im_end|>",
            "<|eot_id|>",
            "<|endoftext|>x",
        ]
        .map(String::from)
        .to_vec();
        let mut w = GgufWriter::new();
        w.metadata("tokenizer.ggml.tokens", tokens)
            // <|eot_id|> (3) is spelled right but a normal token: not an end
            .metadata("tokenizer.ggml.token_type", vec![3i32, 1, 3, 1, 3])
            .metadata("tokenizer.ggml.eos_token_id", 2u32)
            .metadata("tokenizer.ggml.eot_token_id", 2u32);
        let file = GgufFile::from_bytes(w.to_bytes()).unwrap();
        let special = read_special_tokens(&file);
        assert_eq!(special.eos, [2, 0], "eos first, each id once");
        // without token types nothing is known to be a control token
        let mut w = GgufWriter::new();
        w.metadata("tokenizer.ggml.tokens", vec!["<|endoftext|>".to_string()]);
        let file = GgufFile::from_bytes(w.to_bytes()).unwrap();
        assert!(read_special_tokens(&file).eos.is_empty());
    }
}
