//! Shared pieces of the training tests: synthetic targets (no model file), token sequences the
//! target generates greedily (structure a head can learn), their feature caches, small configs.

#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::Arc;

use specdec_kernels::sampling::mix64;
use specdec_kernels::TreeTopology;
use specdec_models::llama::synthetic::synthetic;
use specdec_models::llama::{Architecture, LlamaModel, LlamaOptions};
use specdec_models::{LanguageModel, SequenceStep};
use specdec_train::target::sha256_of_bytes;
use specdec_train::{
    FeatureCache, FeatureCacheKey, FrozenTarget, KindArg, TrainConfig, TrainHeadOptions,
};

/// The synthetic target of `arch` (vocabulary 64, hidden 256, 2 blocks) seeded `seed`, named
/// `synthetic-<arch>.gguf`, identified by the SHA-256 of its GGUF bytes.
pub fn target(arch: Architecture, seed: u64) -> FrozenTarget {
    let file = synthetic(arch, seed);
    let sha = sha256_of_bytes(file.bytes());
    let name = format!("synthetic-{}", arch.key_prefix());
    FrozenTarget::from_gguf(Arc::clone(&file), &format!("{name}.gguf"), &name, sha).unwrap()
}

/// `n` sequences of `prompt` seeded random tokens followed by `generated` tokens the target
/// picks greedily.
pub fn greedy_sequences(
    target: &FrozenTarget,
    n: usize,
    prompt: usize,
    generated: usize,
    seed: u64,
) -> Vec<Vec<u32>> {
    let mut model = LlamaModel::from_gguf(target.file(), LlamaOptions::default()).unwrap();
    let vocab = target.config().vocab_size as u64;
    (0..n)
        .map(|s| {
            let mut tokens: Vec<u32> = (0..prompt)
                .map(|i| (mix64(seed ^ mix64((s * 1000 + i) as u64)) % vocab) as u32)
                .collect();
            let seq = model.new_sequence().unwrap();
            let mut input = tokens.clone();
            for _ in 0..generated {
                let chain = TreeTopology::chain(input.len());
                let logits = model
                    .forward(&[SequenceStep::chain(seq, &input, &chain)])
                    .unwrap();
                model
                    .commit(seq, &(0..input.len()).collect::<Vec<_>>())
                    .unwrap();
                let next = logits[0].argmax(input.len() - 1);
                tokens.push(next);
                input = vec![next];
            }
            model.release(seq).unwrap();
            tokens
        })
        .collect()
}

/// A fresh, empty folder for test `name`.
pub fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("specdec-train-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The key of a test cache over `sequences`.
pub fn key(target: &FrozenTarget, sequences: &[Vec<u32>]) -> FeatureCacheKey {
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

/// The feature cache of `sequences` in `dir`.
pub fn cache(target: &FrozenTarget, sequences: &[Vec<u32>], dir: &std::path::Path) -> FeatureCache {
    FeatureCache::build(dir, &key(target, sequences), target, sequences, false)
        .unwrap()
        .0
}

/// The command line's configuration of `kind` with its defaults, then `edit` applied to the
/// options (as a user would set flags).
pub fn config(kind: KindArg, edit: impl FnOnce(&mut TrainHeadOptions)) -> TrainConfig {
    let mut options = TrainHeadOptions::new("synthetic", kind);
    edit(&mut options);
    options.train_config().unwrap()
}
