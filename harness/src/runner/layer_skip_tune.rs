//! Picking the layer-skip drafter's kept blocks on a prompt: a cheap calibration.
//!
//! A layer-skip draft is the target running a subset of its blocks. Which subset pays depends on
//! the model: skipping more makes a draft pass cheaper but agree less. [`tune_layer_skip`]
//! measures a handful of candidate subsets ([`skip_candidates`]) on one prompt, at the cost of
//! one prefill of the prompt per candidate (plus one for the target):
//!
//! - **agreement α**: at every prompt position, does the candidate's argmax equal the target's?
//!   (the greedy acceptance of a first draft with the right context);
//! - **cost c**: blocks kept / blocks (the pass cost relative to the target's, leaving out the
//!   shared embedding and LM head, so it understates the cost; structural rather than timed,
//!   because the prefill times of a loaded machine vary more than the candidates differ);
//! - **verify slope s**: the target's prefill time per token over one single-token step (what one
//!   more token in a verify pass costs, relative to a plain step).
//!
//! Each candidate is scored by its best predicted speed over chain lengths K ≤ 6:
//! `E(α, K) / (1 + K·s + K·c)`, with `E` the expected tokens per pass at constant acceptance
//! ([`expected_tokens_constant`]); the highest score wins (a score below 1 means no layer-skip
//! chain pays on this machine: the cost-model policy will then decode plainly).

use std::time::Instant;

use specdec_algorithms::policy::expected_tokens_constant;
use specdec_kernels::TreeTopology;
use specdec_models::llama::{LlamaModel, LlamaOptions};
use specdec_models::{LanguageModel, SequenceStep};

use crate::error::{HarnessError, Result};

/// One candidate subset and what it measured.
#[derive(Debug, Clone, PartialEq)]
pub struct SkipCandidate {
    /// How the subset was built, e.g. `"spread 3/4"` or `"prefix 1/2"`.
    pub label: String,
    /// Kept blocks, strictly increasing.
    pub keep: Vec<usize>,
    /// Fraction of prompt positions where its argmax equals the target's.
    pub agreement: f64,
    /// Blocks kept / blocks.
    pub cost: f64,
    /// Best predicted speed over plain decoding (see the module docs), and the K reaching it.
    pub score: f64,
    /// The chain length of `score`.
    pub best_k: usize,
}

/// Candidate kept-block sets of an `n_layers` model: for the kept fractions 1/2, 5/8, 3/4 and
/// 7/8, a **spread** set (first and last block kept, the others evenly spaced between) and a
/// **prefix** set (the first blocks: early exit). Duplicates and the full model are left out.
pub fn skip_candidates(n_layers: usize) -> Vec<(String, Vec<usize>)> {
    let mut out: Vec<(String, Vec<usize>)> = Vec::new();
    for (num, den) in [(1usize, 2usize), (5, 8), (3, 4), (7, 8)] {
        let kept = (n_layers * num).div_ceil(den).clamp(1, n_layers);
        if kept == n_layers {
            continue;
        }
        let spread: Vec<usize> = if kept == 1 {
            vec![0]
        } else {
            let mut v: Vec<usize> = (0..kept)
                .map(|i| (i * (n_layers - 1) + (kept - 1) / 2) / (kept - 1))
                .collect();
            v.dedup();
            v
        };
        let prefix: Vec<usize> = (0..kept).collect();
        for (kind, keep) in [("spread", spread), ("prefix", prefix)] {
            if !out.iter().any(|(_, k)| *k == keep) {
                out.push((format!("{kind} {num}/{den}"), keep));
            }
        }
    }
    out
}

/// The best predicted speed over plain decoding of a chain drafter with acceptance `alpha`, pass
/// cost `cost` and verify slope `slope` (see the module docs), with its K (1..=6).
pub fn skip_score(alpha: f64, cost: f64, slope: f64) -> (f64, usize) {
    (1..=6)
        .map(|k| {
            let kf = k as f64;
            (
                expected_tokens_constant(alpha, k) / (1.0 + kf * slope + kf * cost),
                k,
            )
        })
        .fold((0.0, 1), |best, c| if c.0 > best.0 { c } else { best })
}

/// Argmax at every row of a forward's logits (ties to the lowest id).
fn argmaxes(model: &mut LlamaModel, tokens: &[u32]) -> Result<(Vec<u32>, f64)> {
    let seq = model.new_sequence()?;
    let chain = TreeTopology::chain(tokens.len());
    let t0 = Instant::now();
    let result = model.forward(&[SequenceStep::chain(seq, tokens, &chain)]);
    let seconds = t0.elapsed().as_secs_f64();
    model.release(seq)?;
    let logits = result?;
    let rows = (0..tokens.len())
        .map(|i| {
            let row = logits[0].row(i);
            let mut best = 0;
            for (j, &v) in row.iter().enumerate() {
                if v > row[best] {
                    best = j;
                }
            }
            best as u32
        })
        .collect();
    Ok((rows, seconds))
}

/// Measures every [`skip_candidates`] subset of `target` on `prompt` (at least 8 tokens) and
/// returns them best score first (see the module docs). `options` sizes the candidates' KV.
///
/// # Errors
/// [`HarnessError::InvalidEngine`] for a prompt shorter than 8 tokens; model errors.
pub fn tune_layer_skip(
    target: &mut LlamaModel,
    prompt: &[u32],
    options: LlamaOptions,
) -> Result<Vec<SkipCandidate>> {
    if prompt.len() < 8 {
        return Err(HarnessError::InvalidEngine(format!(
            "layer-skip tuning needs a prompt of at least 8 tokens, got {}",
            prompt.len()
        )));
    }
    let n_layers = target.active_layers();
    let (want, target_s) = argmaxes(target, prompt)?;
    // One single-token step, for the verify slope.
    let (_, step_s) = argmaxes(target, &prompt[..1])?;
    let slope = target_s / prompt.len() as f64 / step_s.max(f64::MIN_POSITIVE);
    let mut out = Vec::new();
    for (label, keep) in skip_candidates(n_layers) {
        let mut draft = target.layer_skip(&keep, options)?;
        let (got, _) = argmaxes(&mut draft, prompt)?;
        let agree = want.iter().zip(&got).filter(|(a, b)| a == b).count();
        let agreement = agree as f64 / want.len() as f64;
        let cost = keep.len() as f64 / n_layers as f64;
        let (score, best_k) = skip_score(agreement, cost, slope);
        out.push(SkipCandidate {
            label,
            keep,
            agreement,
            cost,
            score,
            best_k,
        });
    }
    out.sort_by(|a, b| b.score.total_cmp(&a.score));
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn candidates_are_valid_distinct_subsets() {
        for n in [1, 2, 5, 24, 28, 30] {
            let cands = skip_candidates(n);
            for (label, keep) in &cands {
                assert!(!keep.is_empty() && keep.len() < n, "{n} {label} {keep:?}");
                assert!(keep.windows(2).all(|w| w[0] < w[1]), "{label} {keep:?}");
                assert!(*keep.last().unwrap() < n);
                if label.starts_with("spread") && keep.len() > 1 {
                    assert_eq!((keep[0], *keep.last().unwrap()), (0, n - 1), "{label}");
                }
            }
            for (i, a) in cands.iter().enumerate() {
                assert!(cands[i + 1..].iter().all(|b| b.1 != a.1));
            }
        }
        let thirty = skip_candidates(30);
        assert_eq!(thirty.len(), 8);
        assert_eq!(thirty[0].1.len(), 15);
    }

    #[test]
    fn score_prefers_agreement_per_cost() {
        // Free, perfect drafts with free verification: the longest chain, K + 1 tokens per pass.
        assert_eq!(skip_score(1.0, 0.0, 0.0), (7.0, 6));
        // A draft as costly as the target never pays.
        assert!(skip_score(0.9, 1.0, 0.3).0 < 1.0);
        // Cheaper and as accurate beats costlier.
        assert!(skip_score(0.7, 0.4, 0.2).0 > skip_score(0.7, 0.6, 0.2).0);
    }
}
