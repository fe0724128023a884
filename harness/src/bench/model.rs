//! End-to-end model benchmarks over any [`LanguageModel`]: prompt processing, decode, and the
//! verify-cost curve (the time of one forward of K new tokens after a fixed prefix, relative to
//! one token — the curve that decides how much speculation pays).

use serde::{Deserialize, Serialize};
use specdec_kernels::TreeTopology;
use specdec_models::{LanguageModel, SeqId, SequenceStep};

use super::stats::{median, timed, token_stream};
use crate::error::{HarnessError, Result};

/// The most timed repetitions of a measure (`repeats`, `--reps`): 1000 (medians settle long
/// before; more only makes the benchmark run for hours).
pub const MAX_REPEATS: usize = 1000;

/// What to measure and how often.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelBenchConfig {
    /// Prompt length of the prompt-processing run: one forward of this many tokens into an
    /// empty sequence (llama-bench `-p N`).
    pub prompt_tokens: usize,
    /// Tokens generated one forward at a time from an empty sequence, each committed, the next
    /// input being the argmax of the last logits (llama-bench `-n N`).
    pub decode_tokens: usize,
    /// Committed tokens before each verify forward (llama-bench `-d N` with `-p K -n 0`).
    pub verify_prefix: usize,
    /// The K values of the verify-cost curve; 1 is always measured as the reference.
    pub verify_ks: Vec<usize>,
    /// Timed repetitions of every measure (after one untimed warm-up); medians are reported.
    pub repeats: usize,
    /// Seed of the fixed token stream used as prompt and draft tokens.
    pub seed: u64,
}

impl Default for ModelBenchConfig {
    /// llama-bench's defaults as used in `scripts/bench-vs-llamacpp.sh`: 64 prompt tokens, 64
    /// decode tokens, K = 1, 2, 4, 8, 16 after 64 tokens, 5 repetitions.
    fn default() -> Self {
        Self {
            prompt_tokens: 64,
            decode_tokens: 64,
            verify_prefix: 64,
            verify_ks: vec![1, 2, 4, 8, 16],
            repeats: 5,
            seed: 0x5eed,
        }
    }
}

impl ModelBenchConfig {
    /// Checks the sizes against a model's context.
    ///
    /// # Errors
    /// [`HarnessError::Bench`] naming the field: zero tokens, zero repeats, an empty or zero K,
    /// or a length beyond `max_context`.
    pub fn validate(&self, max_context: usize) -> Result<()> {
        let bad = |what: &str| Err(HarnessError::Bench(what.to_string()));
        if self.prompt_tokens == 0 {
            return bad("prompt_tokens must be at least 1");
        }
        if self.decode_tokens == 0 {
            return bad("decode_tokens must be at least 1");
        }
        if !(1..=MAX_REPEATS).contains(&self.repeats) {
            return Err(HarnessError::Bench(format!(
                "repeats {} is not in 1..={MAX_REPEATS}",
                self.repeats
            )));
        }
        if self.verify_ks.contains(&0) {
            return bad("verify K values must be at least 1");
        }
        let longest = self.prompt_tokens.max(self.decode_tokens).max(
            self.verify_prefix
                .saturating_add(self.ks().last().copied().unwrap_or(1)),
        );
        if longest > max_context {
            return Err(HarnessError::Bench(format!(
                "the benchmark needs {longest} positions but the model's context is {max_context}"
            )));
        }
        Ok(())
    }

    /// The K values measured: `verify_ks` with 1 added, sorted, without duplicates.
    pub fn ks(&self) -> Vec<usize> {
        let mut ks = self.verify_ks.clone();
        ks.push(1);
        ks.sort_unstable();
        ks.dedup();
        ks
    }
}

/// One point of the verify-cost curve.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VerifyCost {
    /// New tokens in the forward.
    pub k: usize,
    /// Median wall time of the forward, seconds.
    pub median_s: f64,
    /// `median_s` divided by the K = 1 median.
    pub relative: f64,
}

/// Everything [`bench_model`] measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelBenchResult {
    /// The configuration used.
    pub config: ModelBenchConfig,
    /// Prompt processing: `prompt_tokens` / median time of the prefill forward, tokens/s.
    pub prompt_tokens_per_s: f64,
    /// Decode: `decode_tokens` / median time of the whole decode run, tokens/s.
    pub decode_tokens_per_s: f64,
    /// The verify-cost curve, by increasing K (K = 1 first, relative 1).
    pub verify: Vec<VerifyCost>,
}

impl ModelBenchResult {
    /// The relative cost at `k`, if measured.
    pub fn relative_cost(&self, k: usize) -> Option<f64> {
        self.verify.iter().find(|v| v.k == k).map(|v| v.relative)
    }
}

/// Measures `model` as `config` says. Every sequence it opens is released again, so the model's
/// cache is left as it was found.
///
/// # Errors
/// An invalid config ([`ModelBenchConfig::validate`]), a model error (e.g. a KV cache too small
/// for the lengths asked for), or a non-positive median time.
pub fn bench_model<M: LanguageModel + ?Sized>(
    model: &mut M,
    config: &ModelBenchConfig,
) -> Result<ModelBenchResult> {
    config.validate(model.max_context())?;
    let vocab = u32::try_from(model.vocab_size()).unwrap_or(u32::MAX);
    let ks = config.ks();
    let max_k = ks.last().copied().unwrap_or(1);
    let tokens = token_stream(
        config.seed,
        config.prompt_tokens.max(config.verify_prefix + max_k),
        vocab,
    );

    // Prompt processing: one forward of `prompt_tokens` into an empty sequence.
    let prompt = &tokens[..config.prompt_tokens];
    let prompt_tree = TreeTopology::chain(prompt.len());
    let mut pp_times = Vec::with_capacity(config.repeats);
    for rep in 0..=config.repeats {
        let seq = model.new_sequence()?;
        let (out, secs) =
            timed(|| model.forward(&[SequenceStep::chain(seq, prompt, &prompt_tree)]));
        model.release(seq)?;
        out?;
        if rep > 0 {
            pp_times.push(secs);
        }
    }

    // Decode: one token per forward, committed, from an empty sequence.
    let first = model.bos_id().unwrap_or(tokens[0]);
    let mut decode_times = Vec::with_capacity(config.repeats);
    for rep in 0..=config.repeats {
        let seq = model.new_sequence()?;
        let steps = if rep == 0 { 1 } else { config.decode_tokens };
        let (out, secs) = timed(|| decode(model, seq, first, steps));
        model.release(seq)?;
        out?;
        if rep > 0 {
            decode_times.push(secs);
        }
    }

    // Verify-cost curve: K new tokens after a committed prefix, K values interleaved within each
    // repetition so that a change of machine load affects every K alike.
    let seq = model.new_sequence()?;
    let curve = verify_curve(model, seq, &tokens, config, &ks);
    model.release(seq)?;
    let per_k = curve?;

    let positive = |what: &str, v: Option<f64>| match v {
        Some(v) if v > 0.0 => Ok(v),
        _ => Err(HarnessError::Bench(format!(
            "no positive {what} time measured"
        ))),
    };
    let pp = positive("prompt-processing", median(&pp_times))?;
    let dec = positive("decode", median(&decode_times))?;
    let medians = per_k
        .iter()
        .map(|t| positive("verify", median(t)))
        .collect::<Result<Vec<_>>>()?;
    let one = medians[0];
    Ok(ModelBenchResult {
        config: config.clone(),
        prompt_tokens_per_s: config.prompt_tokens as f64 / pp,
        decode_tokens_per_s: config.decode_tokens as f64 / dec,
        verify: ks
            .iter()
            .zip(&medians)
            .map(|(&k, &m)| VerifyCost {
                k,
                median_s: m,
                relative: m / one,
            })
            .collect(),
    })
}

/// Greedy decode of `steps` tokens into `seq`, starting from `first`.
fn decode<M: LanguageModel + ?Sized>(
    model: &mut M,
    seq: SeqId,
    first: u32,
    steps: usize,
) -> Result<()> {
    let one = TreeTopology::chain(1);
    let mut token = first;
    for _ in 0..steps {
        let logits = model.forward(&[SequenceStep::chain(seq, &[token], &one)])?;
        model.commit(seq, &[0])?;
        token = logits[0].argmax(0);
    }
    Ok(())
}

/// Forwards `prefix` into the empty `seq` in one chain and commits it all (nothing for an
/// empty prefix): the committed tokens a verify forward attends to.
pub(super) fn commit_prefix<M: LanguageModel + ?Sized>(
    model: &mut M,
    seq: SeqId,
    prefix: &[u32],
) -> Result<()> {
    if !prefix.is_empty() {
        let tree = TreeTopology::chain(prefix.len());
        model.forward(&[SequenceStep::chain(seq, prefix, &tree)])?;
        let path: Vec<usize> = (0..prefix.len()).collect();
        model.commit(seq, &path)?;
    }
    Ok(())
}

/// Per K (in `ks` order), the timed forward durations; `seq` is empty on entry.
fn verify_curve<M: LanguageModel + ?Sized>(
    model: &mut M,
    seq: SeqId,
    tokens: &[u32],
    config: &ModelBenchConfig,
    ks: &[usize],
) -> Result<Vec<Vec<f64>>> {
    commit_prefix(model, seq, &tokens[..config.verify_prefix])?;
    let trees: Vec<TreeTopology> = ks.iter().map(|&k| TreeTopology::chain(k)).collect();
    let drafts = &tokens[config.verify_prefix..];
    let mut times = vec![Vec::with_capacity(config.repeats); ks.len()];
    for rep in 0..=config.repeats {
        for (i, (&k, tree)) in ks.iter().zip(&trees).enumerate() {
            let step = SequenceStep::chain(seq, &drafts[..k], tree);
            let (out, secs) = timed(|| model.forward(&[step]));
            out?;
            // Drop the speculative entries: the next forward starts from the same prefix.
            model.rewind(seq, 0)?;
            if rep > 0 {
                times[i].push(secs);
            }
        }
    }
    if model.seq_len(seq)? != config.verify_prefix {
        return Err(HarnessError::Bench(
            "the verify forwards changed the committed prefix".into(),
        ));
    }
    Ok(times)
}
