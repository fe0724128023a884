//! `specdec generate`: one prompt through the engine, text streamed as tokens are accepted, then
//! a one-line summary (tokens, tokens/s, acceptance rate, mean accepted length τ).

use std::io::Write;

use specdec_kernels::sampling::SamplingParams;

use specdec_models::llama::parse_device;

use crate::config::{DrafterConfig, FallbackConfig, MethodConfig, PolicyConfig, VerifierConfig};
use crate::engine::{check_fits_context, Generation, Request};
use crate::error::{HarnessError, Result};
use crate::methods::kinds::{Chain, CostOptimal, Fixed, Ngram, Plain, Staged};
use crate::methods::{lookup, normalise, DrafterRole, DRAFTERS};
use crate::runner::{EngineBackend, KvMemory};

/// The method `generate --method auto` stands for: the cost-model policy over the draft
/// model's chains, with n-gram lookup where they step aside (n-gram alone without `--draft`).
pub const AUTO_METHOD: &str = "auto";

/// The methods `generate --method` accepts, in `--help` order: every registry drafter that can
/// run from flags alone (its name, with its aliases, and its help), then `auto`.
pub fn generate_methods() -> Vec<(String, String)> {
    let mut methods: Vec<(String, String)> = DRAFTERS
        .iter()
        .filter(|e| e.generate_params(Some("draft")).is_some())
        .map(|e| {
            let name = match e.aliases() {
                [] => e.name().to_string(),
                aliases => format!("{} ({})", e.name(), aliases.join(", ")),
            };
            (name, e.summary().to_string())
        })
        .collect();
    methods.push((
        AUTO_METHOD.into(),
        "cost-model policy over the draft model's chains, n-gram lookup where they step aside \
         (n-gram alone without --draft)"
            .into(),
    ));
    methods
}

/// `--method`'s long help: every method [`generate_methods`] lists, one per line.
pub fn generate_method_help() -> String {
    let mut help = String::from(
        "How to draft: a drafter with a fixed budget of --k drafts per step, or auto:\n",
    );
    for (name, summary) in generate_methods() {
        help.push_str(&format!("  {name}: {summary}\n"));
    }
    help
}

/// What to generate.
#[derive(Debug, Clone)]
pub struct GenerateOptions {
    /// Target model: registry name or GGUF path.
    pub target: String,
    /// Draft model: registry name or GGUF path.
    pub draft: Option<String>,
    /// One of [`generate_methods`].
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
    /// A trained head file for `eagle` / `medusa` / `staged` with an `eagle` level (default: the
    /// cache's head for the target).
    pub head: Option<String>,
    /// The KV memory budget, e.g. `"8GiB"` (`KvMemory::parse`) [default: a quarter of the
    /// machine's memory].
    pub kv_memory: Option<String>,
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

/// The method configuration a `generate` method name stands for: the registry drafter of that
/// name (or alias) with its flag-only parameters ([`DrafterKind::for_generate`]) under a fixed
/// budget of `k`, or [`AUTO_METHOD`]. `draft` is the `--draft` model (staged's level 1; without
/// one, layer skip).
///
/// # Errors
/// [`HarnessError::InvalidEngine`] for an unknown name (listing the known ones), a drafter that
/// needs a config, or `k = 0` with a drafting method.
///
/// [`DrafterKind::for_generate`]: crate::methods::DrafterKind::for_generate
pub fn method_for(name: &str, k: usize, draft: Option<&str>) -> Result<MethodConfig> {
    let known = || {
        generate_methods()
            .into_iter()
            .map(|(n, _)| n)
            .collect::<Vec<_>>()
            .join(", ")
    };
    let auto = PolicyConfig::of(CostOptimal::up_to(k.max(1)));
    let fixed = Some(PolicyConfig::of(Fixed { k }));
    let (drafter, policy) = if normalise(name) == AUTO_METHOD {
        let drafter = match draft {
            Some(_) => DrafterConfig::of(Chain {}),
            None => DrafterConfig::of(Ngram { n: 3 }),
        };
        (drafter, Some(auto.clone()))
    } else {
        let entry = lookup::<DrafterRole>(name).map_err(|_| {
            HarnessError::InvalidEngine(format!("unknown method `{name}`: use one of {}", known()))
        })?;
        let params = entry.generate_params(draft).ok_or_else(|| {
            HarnessError::InvalidEngine(format!(
                "drafter `{}` needs parameters only a config gives (specdec run; see \
                 experiments/README.md); generate runs {}",
                entry.name(),
                known()
            ))
        })?;
        let drafter = DrafterConfig::new(entry.name(), params);
        let policy = if drafter.is::<Plain>() { None } else { fixed };
        (drafter, policy)
    };
    if policy.is_some() && k == 0 {
        return Err(HarnessError::InvalidEngine(format!(
            "method `{name}` drafts: --k must be at least 1 (or use --method plain)"
        )));
    }
    let mut method = MethodConfig::new(name, drafter, policy);
    if normalise(name) == AUTO_METHOD && draft.is_some() {
        // where the draft model's chains do not pay, free n-gram lookup may
        method.fallback = Some(FallbackConfig {
            drafter: DrafterConfig::of(Ngram { n: 3 }),
            verifier: VerifierConfig::default(),
            policy: auto,
        });
    }
    Ok(method)
}

/// `drafter` with its `head` parameter set to `head`.
///
/// # Errors
/// [`HarnessError::InvalidEngine`] when the drafter reads no head file (only `eagle`, `medusa`
/// and `staged` with an `eagle` level do).
pub fn with_head(drafter: &DrafterConfig, head: &str) -> Result<DrafterConfig> {
    let mut params = drafter.params().clone();
    params.insert("head".into(), toml::Value::String(head.to_string()));
    let with = DrafterConfig::new(drafter.kind(), params);
    let entry = with.entry().map_err(HarnessError::InvalidEngine)?;
    entry.check(with.params()).map_err(|_| {
        HarnessError::InvalidEngine(format!(
            "--head is for the trained-head drafters (eagle, medusa, staged with --draft eagle), \
             not for `{}`",
            drafter.kind()
        ))
    })?;
    Ok(with)
}

/// Runs one prompt, writing the text to `out` as it is generated, and returns the summary (the
/// caller prints [`GenerateSummary::line`]).
///
/// # Errors
/// Model loading (a missing model names `scripts/fetch-models.sh`), a draft with another
/// tokenizer, an unknown method, a prompt and `max_tokens` past the model's context (refused
/// before any work), engine errors; writing to `out`.
pub fn generate(options: &GenerateOptions, out: &mut dyn Write) -> Result<GenerateSummary> {
    let mut method = method_for(&options.method, options.k, options.draft.as_deref())?;
    if let Some(head) = &options.head {
        method.drafter = with_head(&method.drafter, head)?;
    }
    let sampling = SamplingParams {
        temperature: options.temperature,
        top_k: None,
        top_p: None,
    };
    let device = parse_device(&options.device)?;
    // staged's `--draft layer_skip` / `eagle` levels run on the target: no model to load
    let draft_model = options
        .draft
        .as_deref()
        .filter(|d| !method.drafter.is::<Staged>() || Staged::level_is_model(d));
    let kv_memory = match &options.kv_memory {
        Some(text) => KvMemory::parse(text)?,
        None => KvMemory::machine_default(),
    };
    let mut backend = EngineBackend::open_with(
        kv_memory,
        &options.target,
        draft_model,
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
    // refused before any method is built or token generated
    check_fits_context(&request, backend.target_mut().max_context())?;
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
        for (listed, _) in generate_methods() {
            let name = listed.split(' ').next().unwrap();
            let m = method_for(name, 4, Some("qwen2.5-coder-0.5b")).unwrap();
            assert_eq!(m.is_baseline(), name == "plain");
        }
        // aliases and either spelling name the same drafter
        for (alias, kind) in [
            ("linear", "chain"),
            ("layer-skip", "layer_skip"),
            ("none", "plain"),
        ] {
            assert_eq!(method_for(alias, 4, None).unwrap().drafter.kind(), kind);
        }
        let eagle = method_for("eagle", 4, None).unwrap();
        let with = with_head(&eagle.drafter, "h.safetensors").unwrap();
        assert_eq!(with.params()["head"].as_str(), Some("h.safetensors"));
        let ngram = method_for("ngram", 4, None).unwrap();
        let err = with_head(&ngram.drafter, "h.safetensors")
            .unwrap_err()
            .to_string();
        assert!(err.contains("--head") && err.contains("ngram"), "{err}");
        let err = method_for("hydra", 4, None).unwrap_err().to_string();
        assert!(err.contains("hydra") && err.contains("ngram"), "{err}");
        assert!(method_for("ngram", 0, None).is_err());
        assert!(method_for("plain", 0, None).is_ok());
    }
}
