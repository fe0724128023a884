//! Writing a Hugging Face model folder from a GGUF file (no hub, no PyTorch): every tensor
//! dequantised and stored as F32, F16 or BF16 under its Hugging Face name, llama Q/K rows
//! un-permuted from GGUF's interleaved-pair order back to rotate-half order, with
//! `config.json`, `tokenizer.json` (the tokenizer built from the GGUF metadata, serialised) and
//! `tokenizer_config.json` (BOS/EOS strings, `add_bos_token`, the chat template).

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use safetensors::Dtype;
use serde_json::json;

use super::config::config_json;
use super::{layer_tensor_names, GLOBAL_TENSOR_NAMES};
use crate::error::{ModelError, Result};
use crate::gguf::GgufFile;
use crate::llama::{read_config, read_special_tokens, Architecture, LlamaConfig};
use crate::safetensors_file::{encode_f32, write_safetensors, OwnedTensor};
use crate::tokenizer::Tokenizer;

/// What [`export_gguf`] wrote.
#[derive(Debug, Clone, PartialEq)]
pub struct ExportSummary {
    /// The folder.
    pub dir: PathBuf,
    /// The decoder's configuration as the GGUF file gives it (interleaved RoPE for llama).
    pub config: LlamaConfig,
    /// Tensors written to `model.safetensors`.
    pub tensors: usize,
    /// Bytes of tensor data written.
    pub bytes: usize,
}

/// The names [`parse_dtype`] takes.
pub const EXPORT_DTYPES: [&str; 3] = ["f32", "f16", "bf16"];

/// The dtype `f32`, `f16` or `bf16` names.
///
/// # Errors
/// [`ModelError::Config`] naming the text and the accepted names.
pub fn parse_dtype(text: &str) -> Result<Dtype> {
    match text {
        "f32" => Ok(Dtype::F32),
        "f16" => Ok(Dtype::F16),
        "bf16" => Ok(Dtype::BF16),
        other => Err(ModelError::Config(format!(
            "dtype `{other}` is not one of {}",
            EXPORT_DTYPES.join(", ")
        ))),
    }
}

/// The `torch_dtype` name of a float dtype, or `None` for another dtype.
pub fn torch_dtype_name(dtype: Dtype) -> Option<&'static str> {
    match dtype {
        Dtype::F32 => Some("float32"),
        Dtype::F16 => Some("float16"),
        Dtype::BF16 => Some("bfloat16"),
        _ => None,
    }
}

/// Rows of a `[heads · head_dim, cols]` matrix (or a bias, `cols = 1`) reordered from GGUF's
/// llama layout, where each head's rows pair dimensions `(2p, 2p + 1)` for RoPE, to Hugging
/// Face's, where they pair `(p, p + head_dim / 2)`: HF row `j · half + p` is GGUF row `2p + j`
/// within each head. (The inverse of the permutation `convert_hf_to_gguf.py` applies.)
pub fn unpermute_rope_rows(values: &[f32], heads: usize, head_dim: usize, cols: usize) -> Vec<f32> {
    let half = head_dim / 2;
    let mut out = vec![0.0; values.len()];
    for h in 0..heads {
        for j in 0..2 {
            for p in 0..half {
                let to = (h * head_dim + j * half + p) * cols;
                let from = (h * head_dim + 2 * p + j) * cols;
                out[to..to + cols].copy_from_slice(&values[from..from + cols]);
            }
        }
    }
    out
}

/// Writes the decoder of `file` as a Hugging Face model folder `dir` (created; it must not
/// exist or be empty) with tensors stored as `dtype` (F32 exact to the dequantised values,
/// F16 / BF16 rounded to nearest). The folder is written under a temporary name and renamed into
/// place, so it is whole or absent.
///
/// # Errors
/// [`ModelError::Config`] for a dtype other than F32 / F16 / BF16, a non-empty `dir`, or a GGUF
/// tensor without a Hugging Face name; the GGUF file's configuration, tensor and tokenizer
/// errors; I/O errors naming the path.
pub fn export_gguf(file: &GgufFile, dir: &Path, dtype: Dtype) -> Result<ExportSummary> {
    let torch_dtype = torch_dtype_name(dtype).ok_or_else(|| {
        ModelError::Config(format!(
            "export dtype {dtype:?} is not supported (F32, F16, BF16)"
        ))
    })?;
    let io = |path: &Path| {
        let path = path.display().to_string();
        move |source| ModelError::Io {
            path: path.clone(),
            source,
        }
    };
    if dir.exists() {
        let mut entries = std::fs::read_dir(dir).map_err(io(dir))?;
        if entries.next().is_some() {
            return Err(ModelError::Config(format!(
                "{} already exists and is not empty: choose a new folder",
                dir.display()
            )));
        }
    }
    let config = read_config(file)?;
    let special = read_special_tokens(file);
    let tokenizer = Tokenizer::from_gguf(file)?;
    let mut names: Vec<(String, String)> = GLOBAL_TENSOR_NAMES
        .iter()
        .filter(|(_, gguf)| !(config.tied_head && *gguf == "output.weight"))
        .map(|(hf, gguf)| (hf.to_string(), gguf.to_string()))
        .collect();
    for layer in 0..config.n_layers {
        names.extend(layer_tensor_names(layer, config.qkv_bias));
    }
    let wanted: HashSet<&str> = names.iter().map(|(_, g)| g.as_str()).collect();
    if let Some(extra) = file
        .tensors()
        .iter()
        .find(|t| !wanted.contains(t.name.as_str()))
    {
        return Err(ModelError::Config(format!(
            "{}: tensor `{}` has no Hugging Face counterpart in a {} checkpoint",
            file.path(),
            extra.name,
            super::architecture_name(config.arch)
        )));
    }
    let mut tensors: Vec<OwnedTensor> = Vec::with_capacity(names.len());
    for (hf, gguf) in &names {
        let tensor = file.tensor(gguf)?;
        let mut values = tensor.to_f32_vec()?;
        // GGUF shapes are innermost first: [cols, rows] → HF [rows, cols]
        let shape: Vec<usize> = tensor.shape().iter().rev().copied().collect();
        let cols = if shape.len() == 2 { shape[1] } else { 1 };
        if config.arch == Architecture::Llama {
            let heads = if gguf.contains("attn_q.") {
                Some(config.n_heads)
            } else if gguf.contains("attn_k.") {
                Some(config.n_kv_heads)
            } else {
                None
            };
            if let Some(heads) = heads {
                if values.len() != heads * config.head_dim * cols {
                    return Err(ModelError::Shape {
                        what: gguf.clone(),
                        reason: format!(
                            "{} values are not {heads} heads of {} rows",
                            values.len(),
                            config.head_dim
                        ),
                    });
                }
                values = unpermute_rope_rows(&values, heads, config.head_dim, cols);
            }
        }
        let bytes = encode_f32(&values, dtype).expect("a float dtype");
        tensors.push((hf.clone(), dtype, shape, bytes));
    }
    let bytes = tensors.iter().map(|t| t.3.len()).sum();
    let count = tensors.len();

    let parent = dir
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let leaf = dir
        .file_name()
        .ok_or_else(|| ModelError::Config(format!("{} is not a folder name", dir.display())))?;
    let partial = parent.join(format!(
        ".{}.partial-{}",
        leaf.to_string_lossy(),
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&partial);
    std::fs::create_dir_all(&partial).map_err(io(&partial))?;
    write_safetensors(
        &partial.join("model.safetensors"),
        &tensors,
        Some(HashMap::from([("format".to_string(), "pt".to_string())])),
    )?;
    drop(tensors);
    let write = |name: &str, text: String| {
        let path = partial.join(name);
        std::fs::write(&path, text).map_err(io(&path))
    };
    let pretty = |v: &serde_json::Value| serde_json::to_string_pretty(v).expect("JSON values");
    write(
        "config.json",
        pretty(&config_json(&config, &special, torch_dtype)),
    )?;
    write("tokenizer.json", tokenizer.to_hf_json()?)?;
    let md = file.metadata();
    let token_text = |id: Option<u32>| id.and_then(|i| tokenizer.token_str(i));
    let mut tokenizer_config = json!({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "add_bos_token": tokenizer.adds_bos(),
        "bos_token": token_text(special.bos),
        "eos_token": token_text(special.eos.first().copied()),
    });
    if let Some(template) = md.get_opt::<&str>("tokenizer.chat_template")? {
        tokenizer_config["chat_template"] = json!(template);
    }
    write("tokenizer_config.json", pretty(&tokenizer_config))?;
    if dir.exists() {
        std::fs::remove_dir(dir).map_err(io(dir))?;
    }
    std::fs::rename(&partial, dir).map_err(io(dir))?;
    Ok(ExportSummary {
        dir: dir.to_path_buf(),
        config,
        tensors: count,
        bytes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The permutation `convert_hf_to_gguf.py` applies to llama Q/K (numpy's
    /// `reshape(heads, 2, half, cols).swapaxes(1, 2)`), written out.
    fn permute_like_llama_cpp(hf: &[f32], heads: usize, head_dim: usize, cols: usize) -> Vec<f32> {
        let half = head_dim / 2;
        let mut out = vec![0.0; hf.len()];
        for h in 0..heads {
            for p in 0..half {
                for j in 0..2 {
                    let to = (h * head_dim + 2 * p + j) * cols;
                    let from = (h * head_dim + j * half + p) * cols;
                    out[to..to + cols].copy_from_slice(&hf[from..from + cols]);
                }
            }
        }
        out
    }

    #[test]
    fn unpermute_inverts_the_gguf_permutation() {
        let (heads, head_dim, cols) = (3, 8, 5);
        let hf: Vec<f32> = (0..heads * head_dim * cols).map(|i| i as f32).collect();
        let gguf = permute_like_llama_cpp(&hf, heads, head_dim, cols);
        assert_ne!(gguf, hf);
        assert_eq!(unpermute_rope_rows(&gguf, heads, head_dim, cols), hf);
        // head 0, GGUF rows 0 and 1 (one interleaved pair) are HF rows 0 and half
        assert_eq!(gguf[cols], hf[4 * cols]);
    }
}
