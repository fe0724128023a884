//! Synthetic draft heads for tests (of this crate and of the crates above it): a valid
//! [`HeadFile`] of either kind for a given target, with deterministic random weights scaled so
//! that every layer keeps its input's magnitude (outputs finite and far from degenerate).

use std::collections::BTreeMap;

use specdec_kernels::sampling::mix64;

use super::file::{
    EagleShape, HeadFile, HeadKind, HeadMeta, HeadTarget, HeadTensor, TrainingInfo,
    HEAD_FORMAT_VERSION,
};
use crate::error::{ModelError, Result};
use crate::llama::synthetic::uniform;
use crate::llama::LlamaConfig;

/// Number of heads `K` of a synthetic Medusa file.
pub const SYNTHETIC_MEDUSA_HEADS: usize = 3;

/// A head of `kind` for a target of `config` (the file named `target_name`, SHA-256
/// `target_sha256`), with a draft vocabulary of `draft_vocab` distinct target ids in a
/// seeded order, reading the target's last block. EAGLE: the target's attention geometry
/// ([`EagleShape::for_target`]) and FFN width. Medusa: [`SYNTHETIC_MEDUSA_HEADS`] heads.
///
/// Weights (all exact in bfloat16, so a BF16 file stores them losslessly) depend only on
/// `seed` and the tensor: each `[rows, cols]` matrix uniform in `±g·sqrt(3 / cols)` (unit gain
/// `g = 1`, the LM head `g = 2` for a spread of logits), norm gains in `[0.8, 1.2)`, biases in
/// `[-0.1, 0.1)`.
///
/// # Errors
/// [`ModelError::Config`] when `draft_vocab` is not in `1..=config.vocab_size`.
pub fn random_head(
    kind: HeadKind,
    config: &LlamaConfig,
    target_name: &str,
    target_sha256: &str,
    draft_vocab: usize,
    seed: u64,
) -> Result<HeadFile> {
    if draft_vocab == 0 || draft_vocab > config.vocab_size {
        return Err(ModelError::Config(format!(
            "synthetic head: draft vocabulary {draft_vocab} must be in 1..={}",
            config.vocab_size
        )));
    }
    let meta = HeadMeta {
        format_version: HEAD_FORMAT_VERSION,
        kind,
        target: HeadTarget::for_target(config, target_name, target_sha256),
        feature_blocks: vec![config.n_layers - 1],
        draft_vocab,
        eagle: (kind == HeadKind::Eagle).then(|| EagleShape::for_target(config, config.ffn)),
        medusa_heads: if kind == HeadKind::Medusa {
            SYNTHETIC_MEDUSA_HEADS
        } else {
            0
        },
        training: TrainingInfo {
            seed,
            extra: BTreeMap::from([("synthetic".to_string(), "random weights".to_string())]),
            ..TrainingInfo::default()
        },
    };
    let mut tensors = BTreeMap::new();
    for (index, (name, shape)) in meta.tensor_shapes()?.into_iter().enumerate() {
        let salt = seed.wrapping_mul(0x1000_0000_01b3) ^ (index as u64 + 1);
        let (lo, hi) = match shape.as_slice() {
            [_, cols] => {
                let gain = if name == "lm_head" { 2.0 } else { 1.0 };
                let bound = gain * (3.0 / *cols as f32).sqrt();
                (-bound, bound)
            }
            _ if name.ends_with("norm") => (0.8, 1.2),
            _ => (-0.1, 0.1),
        };
        tensors.insert(name, random_tensor(shape, salt, lo, hi)?);
    }
    let mut ids: Vec<u32> = (0..config.vocab_size as u32).collect();
    ids.sort_by_key(|&id| mix64(seed ^ (u64::from(id) << 20)));
    ids.truncate(draft_vocab);
    let head = HeadFile {
        meta,
        d2t: ids,
        tensors,
    };
    head.validate()?;
    Ok(head)
}

/// `head` (EAGLE) with input norms ([`EagleShape::input_norms`]): gains `embed_norm` and
/// `feature_norm` drawn as [`random_head`] draws norm gains, from `seed`.
///
/// # Errors
/// [`ModelError::Config`] for a Medusa head or one that already has input norms.
pub fn with_input_norms(mut head: HeadFile, seed: u64) -> Result<HeadFile> {
    let shape = match &mut head.meta.eagle {
        Some(shape) if !shape.input_norms => shape,
        _ => {
            return Err(ModelError::Config(
                "synthetic input norms: an EAGLE head without them is needed".into(),
            ))
        }
    };
    shape.input_norms = true;
    let widths = [
        ("embed_norm", head.meta.target.hidden),
        ("feature_norm", head.meta.feature_dim()),
    ];
    for (index, (name, n)) in widths.into_iter().enumerate() {
        let salt = seed.wrapping_mul(0x1000_0000_01b3) ^ !(index as u64);
        head.tensors
            .insert(name.to_string(), random_tensor(vec![n], salt, 0.8, 1.2)?);
    }
    head.validate()?;
    Ok(head)
}

/// A tensor of `shape` whose values are drawn uniformly from `[lo, hi)` by `salt`, rounded to
/// BF16 (as a head file stores them).
fn random_tensor(shape: Vec<usize>, salt: u64, lo: f32, hi: f32) -> Result<HeadTensor> {
    let n: usize = shape.iter().product();
    let data = (0..n as u64)
        .map(|i| half::bf16::from_f32(uniform(salt, i, lo, hi)).to_f32())
        .collect();
    HeadTensor::new(shape, data)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::heads::StoredDtype;
    use crate::llama::synthetic::synthetic;
    use crate::llama::{read_config, Architecture};

    #[test]
    fn synthetic_heads_are_valid_deterministic_and_bf16_exact() {
        let dir =
            std::env::temp_dir().join(format!("specdec-synthetic-head-{}", std::process::id()));
        for arch in [Architecture::Llama, Architecture::Qwen2] {
            let config = read_config(&synthetic(arch, 3)).unwrap();
            for kind in [HeadKind::Eagle, HeadKind::Medusa] {
                let head = random_head(kind, &config, "t.gguf", &"ab".repeat(32), 40, 9).unwrap();
                assert_eq!(
                    head,
                    random_head(kind, &config, "t.gguf", &"ab".repeat(32), 40, 9).unwrap()
                );
                assert_ne!(
                    head,
                    random_head(kind, &config, "t.gguf", &"ab".repeat(32), 40, 10).unwrap()
                );
                assert_eq!(head.d2t.len(), 40);
                assert_ne!(head.d2t, (0..40).collect::<Vec<u32>>(), "a shuffled subset");
                assert_eq!(head.meta.target.architecture, arch.key_prefix());
                assert_eq!(
                    head.meta.eagle.as_ref().map(|e| e.qkv_bias),
                    (kind == HeadKind::Eagle).then_some(config.qkv_bias)
                );
                let path = dir.join(format!("{}-{arch:?}.safetensors", kind.name()));
                head.save(&path, StoredDtype::Bf16).unwrap();
                assert_eq!(HeadFile::load(&path).unwrap(), head, "BF16 loses nothing");
            }
        }
        let config = read_config(&synthetic(Architecture::Llama, 3)).unwrap();
        let err = random_head(HeadKind::Eagle, &config, "t", "ab", 65, 1).unwrap_err();
        assert!(err.to_string().contains("1..=64"), "{err}");
        let _ = std::fs::remove_dir_all(dir);
    }
}
