//! Training data without a download, for tests and demonstrations: a synthetic target
//! ([`synthetic_target`]) and token sequences it continues greedily ([`greedy_sequences`]), so
//! that the continuation — and the target's features along it — is a function of the context a
//! head can learn; and the feature cache of such sequences ([`synthetic_cache`]).

use std::path::Path;
use std::sync::Arc;

use specdec_kernels::sampling::mix64;
use specdec_kernels::TreeTopology;
use specdec_models::llama::synthetic::synthetic;
use specdec_models::llama::{Architecture, LlamaModel, LlamaOptions};
use specdec_models::{LanguageModel, SequenceStep};

use crate::error::{ModelContext, Result};
use crate::features::{FeatureCache, FeatureCacheKey};
use crate::target::{sha256_of_bytes, FrozenTarget};

/// The synthetic target of `arch` (`specdec_models::llama::synthetic`: vocabulary 64, hidden
/// 256, 2 blocks) seeded `seed`, named `synthetic-<arch>.gguf`, identified by the SHA-256 of its
/// GGUF bytes.
///
/// # Errors
/// As [`FrozenTarget::from_gguf`].
pub fn synthetic_target(arch: Architecture, seed: u64) -> Result<FrozenTarget> {
    let file = synthetic(arch, seed);
    let sha = sha256_of_bytes(file.bytes());
    let name = format!("synthetic-{}", arch.key_prefix());
    FrozenTarget::from_gguf(Arc::clone(&file), &format!("{name}.gguf"), &name, sha)
}

/// `n` sequences of `prompt` seeded random tokens followed by `generated` tokens the target
/// picks greedily.
///
/// # Errors
/// The target's errors.
pub fn greedy_sequences(
    target: &FrozenTarget,
    n: usize,
    prompt: usize,
    generated: usize,
    seed: u64,
) -> Result<Vec<Vec<u32>>> {
    let context = || "greedy sequences".to_string();
    let mut model =
        LlamaModel::from_gguf(target.file(), LlamaOptions::default()).model_context(context)?;
    let vocab = target.config().vocab_size as u64;
    (0..n)
        .map(|s| {
            let mut tokens: Vec<u32> = (0..prompt)
                .map(|i| (mix64(seed ^ mix64((s * 1000 + i) as u64)) % vocab) as u32)
                .collect();
            let seq = model.new_sequence().model_context(context)?;
            let mut input = tokens.clone();
            for _ in 0..generated {
                let chain = TreeTopology::chain(input.len());
                let logits = model
                    .forward(&[SequenceStep::chain(seq, &input, &chain)])
                    .model_context(context)?;
                model
                    .commit(seq, &(0..input.len()).collect::<Vec<_>>())
                    .model_context(context)?;
                let next = logits[0].argmax(input.len() - 1);
                tokens.push(next);
                input = vec![next];
            }
            model.release(seq).model_context(context)?;
            Ok(tokens)
        })
        .collect()
}

/// The cache key of `sequences` (their bytes hashed as the data).
pub fn synthetic_key(target: &FrozenTarget, sequences: &[Vec<u32>]) -> FeatureCacheKey {
    let bytes: Vec<u8> = sequences
        .iter()
        .flat_map(|s| s.iter().flat_map(|t| t.to_le_bytes()).chain([0xff; 4]))
        .collect();
    FeatureCacheKey {
        target_sha256: target.identity().sha256.clone(),
        data_sha256: sha256_of_bytes(&bytes),
        max_len: sequences.iter().map(Vec::len).max().unwrap_or(0),
        count: sequences.len(),
        data_seed: 0,
    }
}

/// The feature cache of `sequences` in `dir` (built, or reused when it is there).
///
/// # Errors
/// As [`FeatureCache::build`].
pub fn synthetic_cache(
    target: &FrozenTarget,
    sequences: &[Vec<u32>],
    dir: &Path,
) -> Result<FeatureCache> {
    Ok(FeatureCache::build(
        dir,
        &synthetic_key(target, sequences),
        target,
        sequences,
        false,
    )?
    .0)
}
