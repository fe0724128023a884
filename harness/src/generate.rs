//! `specdec generate`: one prompt through the engine, text streamed as tokens are accepted, then
//! a one-line summary (tokens, tokens/s, acceptance rate, mean accepted length τ).

use std::io::Write;

use specdec_kernels::sampling::SamplingParams;

use specdec_models::llama::parse_device;

use crate::config::{DrafterConfig, FallbackConfig, MethodConfig, PolicyConfig, VerifierConfig};
use crate::engine::{Generation, Request};
use crate::error::{HarnessError, Result};
use crate::runner::EngineBackend;

/// The method names `generate` accepts, with what they mean.
pub const GENERATE_METHODS: &[(&str, &str)] = &[
    ("plain", "no drafts (the baseline)"),
    (
        "linear",
        "the draft model drafts a chain of K tokens (needs --draft)",
    ),
    (
        "tree",
        "the draft model drafts a tree: 4 children at the root, then 2, 1, 1 (needs --draft)",
    ),
    (
        "ngram",
        "prompt lookup: continue the longest earlier match of the recent tokens",
    ),
    (
        "layer-skip",
        "the target with about a quarter of its blocks skipped drafts a chain",
    ),
    (
        "staged",
        "n-gram proposes, the draft model (or layer-skip) checks and extends",
    ),
    (
        "auto",
        "cost-model policy over the draft model's chains, n-gram lookup where they step aside \
         (n-gram alone without --draft)",
    ),
];

/// What to generate.
#[derive(Debug, Clone)]
pub struct GenerateOptions {
    /// Target model: registry name or GGUF path.
    pub target: String,
    /// Draft model: registry name or GGUF path.
    pub draft: Option<String>,
    /// One of [`GENERATE_METHODS`].
    pub method: String,
    /// Drafts per step (chain length, or tree node budget).
    pub k: usize,
    /// The prompt text.
    pub prompt: String,
    /// Softmax temperature (0 = greedy).
    pub temperature: f64,
    /// Most tokens to generate.
    pub max_tokens: usize,
    /// Wrap the prompt in the model's chat template.
    pub chat: bool,
    /// Seed of the random draws.
    pub seed: u64,
    /// Where the models run: `cpu`, `cuda` or `cuda:N`.
    pub device: String,
}

/// The summary of one generation.
#[derive(Debug, Clone, PartialEq)]
pub struct GenerateSummary {
    /// Tokens generated.
    pub tokens: usize,
    /// Seconds from admission (prefill included) to the last token.
    pub elapsed_s: f64,
    /// Accepted drafts / proposed drafts (`None` when nothing was proposed).
    pub acceptance: Option<f64>,
    /// Mean accepted length τ: (accepted drafts + 1) per target pass.
    pub tau: f64,
    /// Target passes.
    pub passes: usize,
}

impl GenerateSummary {
    /// Summarises an engine [`Generation`].
    pub fn of(g: &Generation) -> Self {
        let proposed: usize = g.steps.iter().map(|s| s.proposed).sum();
        let accepted: usize = g.steps.iter().map(|s| s.accepted).sum();
        let passes = g.steps.len();
        Self {
            tokens: g.tokens.len(),
            elapsed_s: g.elapsed_s,
            acceptance: (proposed > 0).then(|| accepted as f64 / proposed as f64),
            tau: if passes == 0 {
                0.0
            } else {
                (accepted + passes) as f64 / passes as f64
            },
            passes,
        }
    }

    /// One line: `N tokens in S s (R tokens/s), acceptance A, τ T over P target passes`.
    pub fn line(&self) -> String {
        let acceptance = self
            .acceptance
            .map_or("n/a".to_string(), |a| format!("{:.1}%", 100.0 * a));
        format!(
            "{} tokens in {:.2} s ({:.1} tokens/s), acceptance {acceptance}, mean accepted \
             length τ {:.2} over {} target passes",
            self.tokens,
            self.elapsed_s,
            self.tokens as f64 / self.elapsed_s.max(1e-9),
            self.tau,
            self.passes
        )
    }
}

/// The method configuration a `generate` method name stands for (`draft`: the `--draft` model,
/// used by `staged`; without one, staged's level 1 is layer skip).
///
/// # Errors
/// [`HarnessError::InvalidEngine`] for an unknown name (listing the known ones) or `k = 0` with a
/// drafting method.
pub fn method_for(name: &str, k: usize, draft: Option<&str>) -> Result<MethodConfig> {
    let fixed = Some(PolicyConfig::Fixed { k });
    let auto = PolicyConfig::CostOptimal {
        k_max: k.max(1),
        min_gain: 0.02,
        probe_every: 16,
    };
    let (drafter, policy) = match name {
        "plain" | "baseline" => (DrafterConfig::None, None),
        "linear" | "chain" => (DrafterConfig::Chain, fixed),
        "tree" => (
            DrafterConfig::Tree {
                branching: vec![3, 2, 1, 1],
            },
            fixed,
        ),
        "ngram" => (DrafterConfig::Ngram { n: 3 }, fixed),
        "layer-skip" | "layer_skip" => (
            DrafterConfig::LayerSkip {
                keep: None,
                tune: false,
            },
            fixed,
        ),
        "staged" | "multi-level" => (
            DrafterConfig::Staged {
                levels: vec![draft.unwrap_or("layer_skip").to_string()],
            },
            fixed,
        ),
        "auto" => (
            if draft.is_some() {
                DrafterConfig::Chain
            } else {
                DrafterConfig::Ngram { n: 3 }
            },
            Some(auto.clone()),
        ),
        other => {
            let known: Vec<&str> = GENERATE_METHODS.iter().map(|(n, _)| *n).collect();
            return Err(HarnessError::InvalidEngine(format!(
                "unknown method `{other}`: use one of {}",
                known.join(", ")
            )));
        }
    };
    if policy.is_some() && k == 0 {
        return Err(HarnessError::InvalidEngine(format!(
            "method `{name}` drafts: --k must be at least 1 (or use --method plain)"
        )));
    }
    let mut method = MethodConfig::new(name, drafter, policy);
    if name == "auto" && draft.is_some() {
        // where the draft model's chains do not pay, free n-gram lookup may
        method.fallback = Some(FallbackConfig {
            drafter: DrafterConfig::Ngram { n: 3 },
            verifier: VerifierConfig::Auto,
            policy: auto,
        });
    }
    Ok(method)
}

/// Runs one prompt, writing the text to `out` as it is generated, and returns the summary (the
/// caller prints [`GenerateSummary::line`]).
///
/// # Errors
/// Model loading (a missing model names `scripts/fetch-models.sh`), a draft with another
/// tokenizer, an unknown method, engine errors; writing to `out`.
pub fn generate(options: &GenerateOptions, out: &mut dyn Write) -> Result<GenerateSummary> {
    let method = method_for(&options.method, options.k, options.draft.as_deref())?;
    let sampling = SamplingParams {
        temperature: options.temperature,
        top_k: None,
        top_p: None,
    };
    let device = parse_device(&options.device)?;
    let mut backend = EngineBackend::open(
        &options.target,
        options.draft.as_deref(),
        sampling,
        options.seed,
        options.max_tokens,
        1,
    )?
    .on_device(device)?;
    let request = Request {
        id: 0,
        prompt: backend.encode(&options.prompt, options.chat)?,
        stop: backend.stop_rule(options.max_tokens),
    };
    let tokenizer = backend.tokenizer().clone();
    let mut emitted: Vec<u32> = Vec::new();
    let mut printed = 0usize;
    let mut write_error = None;
    let generations = backend.run_requests(
        &method,
        std::slice::from_ref(&request),
        &mut |_, tokens| {
            emitted.extend_from_slice(tokens);
            let Ok(text) = tokenizer.decode_skip_special(&emitted) else {
                return;
            };
            // Hold back a trailing partial character until its last byte arrives.
            let stable = text.trim_end_matches('\u{FFFD}');
            if stable.len() > printed && text.is_char_boundary(printed) {
                if let Err(e) = out
                    .write_all(&stable.as_bytes()[printed..])
                    .and_then(|()| out.flush())
                {
                    write_error.get_or_insert(e);
                }
                printed = stable.len();
            }
        },
        &mut |_| {},
    )?;
    if let Some(e) = write_error {
        return Err(HarnessError::io("<stdout>", e));
    }
    writeln!(out).map_err(|e| HarnessError::io("<stdout>", e))?;
    Ok(GenerateSummary::of(&generations[0]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_listed_method_builds_and_unknown_is_refused() {
        for (name, _) in GENERATE_METHODS {
            let m = method_for(name, 4, Some("qwen2.5-coder-0.5b")).unwrap();
            assert_eq!(m.is_baseline(), *name == "plain");
        }
        let err = method_for("medusa", 4, None).unwrap_err().to_string();
        assert!(err.contains("medusa") && err.contains("ngram"), "{err}");
        assert!(method_for("ngram", 0, None).is_err());
        assert!(method_for("plain", 0, None).is_ok());
    }
}
