//! Shared pieces of the training tests: synthetic targets (no model file), token sequences the
//! target generates greedily (structure a head can learn), their feature caches, small configs.

#![allow(dead_code)]

use std::path::PathBuf;

use specdec_models::llama::Architecture;
use specdec_train::synthetic::{self, synthetic_cache, synthetic_key, synthetic_target};
use specdec_train::{
    FeatureCache, FeatureCacheKey, FrozenTarget, KindArg, TrainConfig, TrainHeadOptions,
};

/// The synthetic target of `arch` seeded `seed` ([`synthetic_target`]).
pub fn target(arch: Architecture, seed: u64) -> FrozenTarget {
    synthetic_target(arch, seed).unwrap()
}

/// `n` sequences of `prompt` random tokens continued greedily ([`synthetic::greedy_sequences`]).
pub fn greedy_sequences(
    target: &FrozenTarget,
    n: usize,
    prompt: usize,
    generated: usize,
    seed: u64,
) -> Vec<Vec<u32>> {
    synthetic::greedy_sequences(target, n, prompt, generated, seed).unwrap()
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
    synthetic_key(target, sequences)
}

/// The feature cache of `sequences` in `dir`.
pub fn cache(target: &FrozenTarget, sequences: &[Vec<u32>], dir: &std::path::Path) -> FeatureCache {
    synthetic_cache(target, sequences, dir).unwrap()
}

/// The command line's configuration of `kind` with its defaults, then `edit` applied to the
/// options (as a user would set flags).
pub fn config(kind: KindArg, edit: impl FnOnce(&mut TrainHeadOptions)) -> TrainConfig {
    let mut options = TrainHeadOptions::new("synthetic", kind);
    edit(&mut options);
    options.train_config().unwrap()
}
