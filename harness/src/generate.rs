//! `specdec generate`: one prompt through the engine, text streamed as tokens are accepted, then
//! a one-line summary (tokens, prefill and decode times, acceptance rate, mean accepted length
//! τ), or one JSON object ([`GenerateSummary`]).

use std::io::Write;
use std::path::{Path, PathBuf};

use specdec_kernels::sampling::SamplingParams;

use specdec_models::llama::parse_device;

use crate::config::{
    check_max_tokens, DrafterConfig, FallbackConfig, MethodConfig, PolicyConfig, VerifierConfig,
};
use crate::engine::{check_fits_context, Generation, Penalties, RecordedDecisions, Request};
use crate::error::{HarnessError, Result};
use crate::methods::kinds::{Chain, CostOptimal, Fixed, History, Plain, Staged};
use crate::methods::{lookup, normalise, validate_method, DrafterRole, DRAFTERS};
use crate::metrics::RequestRecord;
use crate::report::write_jsonl;
use crate::runner::{EngineBackend, KvMemory};

/// The method `generate --method auto` stands for: the cost-model policy over the draft
/// model's chains, with history lookup where they step aside (history lookup alone without
/// `--draft`).
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
        "cost-model policy over the draft model's chains, history lookup where they step aside \
         (history lookup alone without --draft)"
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
    /// Keep only the `top_k` most probable tokens (≥ 1).
    pub top_k: Option<usize>,
    /// Nucleus mass in (0, 1].
    pub top_p: Option<f64>,
    /// min-p in [0, 1]: drop tokens below this share of the most probable one's probability.
    pub min_p: Option<f64>,
    /// Repetition / frequency / presence penalties on the target's and the drafts' logits.
    pub penalties: Penalties,
    /// Most tokens to generate.
    pub max_tokens: usize,
    /// Wrap the prompt in the model's chat template: `Some(true)` / `Some(false)` as asked,
    /// `None` when the model has one.
    pub chat: Option<bool>,
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
    /// The KV element type, `f32`, `bf16` or `f16` ([`crate::runner::parse_kv_dtype`])
    /// [default: f32].
    pub kv_dtype: Option<String>,
    /// Tensor-parallel CPU ranks of the target (1: one runner;
    /// [`EngineBackend::tensor_parallel`]).
    pub tensor_parallel: usize,
    /// Write the step records (with each step's policy decision) here as JSON Lines.
    pub steps_out: Option<PathBuf>,
    /// Take the speculation decisions from a `steps_out` file of an earlier run instead of the
    /// policy ([`RecordedDecisions`]): the same text again at T > 0.
    pub replay: Option<PathBuf>,
}

/// The summary of one generation (also `generate --json`'s object).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct GenerateSummary {
    /// The generated text (special tokens skipped).
    pub text: String,
    /// Tokens generated.
    pub tokens: usize,
    /// Prompt length in tokens.
    pub prompt_tokens: usize,
    /// Seconds from admission (prefill included) to the last token.
    pub elapsed_s: f64,
    /// Seconds of the prompt prefill.
    pub prefill_s: f64,
    /// Time to first token (prefill + the first step), seconds.
    pub ttft_s: f64,
    /// Time per output token after the first, seconds (`None` under 2 tokens).
    pub tpot_s: Option<f64>,
    /// Tokens per decode second (prefill excluded).
    pub decode_tokens_per_s: Option<f64>,
    /// Accepted drafts / proposed drafts (`None` when nothing was proposed).
    pub acceptance: Option<f64>,
    /// Mean accepted length τ: (accepted drafts + 1) per target pass.
    pub tau: f64,
    /// Target passes.
    pub passes: usize,
}

impl GenerateSummary {
    /// Summarises an engine [`Generation`] whose decoded text is `text`.
    pub fn of(g: &Generation, text: String) -> Self {
        let proposed: usize = g.steps.iter().map(|s| s.proposed).sum();
        let accepted: usize = g.steps.iter().map(|s| s.accepted).sum();
        let passes = g.steps.len();
        let record = RequestRecord::from_steps("", 0, "", g.prompt_tokens, g.elapsed_s, &g.steps);
        Self {
            text,
            tokens: g.tokens.len(),
            prompt_tokens: g.prompt_tokens,
            elapsed_s: g.elapsed_s,
            prefill_s: record.prefill_s,
            ttft_s: record.ttft_s,
            tpot_s: record.tpot_s(),
            decode_tokens_per_s: record.tokens_per_s(),
            acceptance: (proposed > 0).then(|| accepted as f64 / proposed as f64),
            tau: if passes == 0 {
                0.0
            } else {
                (accepted + passes) as f64 / passes as f64
            },
            passes,
        }
    }

    /// The summary as one line of JSON (`generate --json`).
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"))
    }

    /// One line: `N tokens in S s (prefill P s, then R tokens/s), acceptance A, τ T over P
    /// target passes`.
    pub fn line(&self) -> String {
        let acceptance = self
            .acceptance
            .map_or("n/a".to_string(), |a| format!("{:.1}%", 100.0 * a));
        format!(
            "{} tokens in {:.2} s (prefill of {} prompt tokens {:.2} s, TTFT {:.2} s, then {:.1} \
             tokens/s), acceptance {acceptance}, mean accepted length τ {:.2} over {} target \
             passes",
            self.tokens,
            self.elapsed_s,
            self.prompt_tokens,
            self.prefill_s,
            self.ttft_s,
            self.decode_tokens_per_s.unwrap_or(0.0),
            self.tau,
            self.passes
        )
    }
}

/// `auto`'s free drafter: history lookup over the last 4 tokens with its default history and
/// spec factor. Under the cost-model policy it beat n-gram lookup on SmolLM2 (1.44× against
/// 1.28× plain decoding on HumanEval, 1.10× against 1.13× on MT-Bench, T = 0, CPU;
/// `experiments/history/README.md`), and a server's history grows with every request it serves.
fn auto_lookup() -> History {
    History {
        n: 4,
        history_tokens: None,
        spec_factor: None,
    }
}

/// The method configuration a `generate` method name stands for: the registry drafter of that
/// name (or alias) with its flag-only parameters ([`DrafterKind::for_generate`]) under a fixed
/// budget of `k`, or [`AUTO_METHOD`]. `draft` is the `--draft` model (staged's level 1; without
/// one, layer skip).
///
/// # Errors
/// [`HarnessError::InvalidEngine`] for an unknown name (listing the known ones), a drafter that
/// needs a config, or `k = 0` with a drafting method; a `k` past the method's limits
/// ([`crate::methods::limits`]), as [`validate_method`] refuses it.
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
            Some(_) => DrafterConfig::of(Chain::default()),
            None => DrafterConfig::of(auto_lookup()),
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
        // where the draft model's chains do not pay, free history lookup may
        method.fallback = Some(FallbackConfig {
            drafter: DrafterConfig::of(auto_lookup()),
            verifier: VerifierConfig::default(),
            policy: auto,
        });
    }
    validate_method(&mut method).map_err(|p| {
        HarnessError::InvalidEngine(format!("--method {name} --k {k}: {}", p.problem))
    })?;
    Ok(method)
}

/// Runs the model code on `threads` CPU threads (rayon's global pool), before any model loads.
///
/// # Errors
/// [`HarnessError::InvalidEngine`] for 0 threads, or when the pool was already started.
pub fn use_threads(threads: usize) -> Result<()> {
    if threads == 0 {
        return Err(HarnessError::InvalidEngine(
            "--threads must be at least 1".into(),
        ));
    }
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build_global()
        .map_err(|e| HarnessError::InvalidEngine(format!("--threads {threads}: {e}")))
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
/// caller prints [`GenerateSummary::line`]). `--max-tokens 0` writes nothing and returns an
/// empty summary without loading a model. `on_loading` is told what is being loaded first.
///
/// # Errors
/// Invalid sampling settings, penalties or `max_tokens` (before any model loads); model loading
/// (a missing model names `scripts/fetch-models.sh`), a draft with another tokenizer, an unknown
/// method, `--chat` with a model without a chat template, a prompt and `max_tokens` past the
/// model's context (refused before any work), engine errors; writing to `out`.
pub fn generate(
    options: &GenerateOptions,
    out: &mut dyn Write,
    on_loading: &mut dyn FnMut(&str),
) -> Result<GenerateSummary> {
    // --max-tokens 0 asks for nothing (answered below, without a model); above, the limit holds
    if options.max_tokens > 0 {
        check_max_tokens("--max-tokens", options.max_tokens)
            .map_err(HarnessError::InvalidEngine)?;
    }
    let mut method = method_for(&options.method, options.k, options.draft.as_deref())?;
    if let Some(head) = &options.head {
        method.drafter = with_head(&method.drafter, head)?;
    }
    let sampling = SamplingParams {
        temperature: options.temperature,
        top_k: options.top_k,
        top_p: options.top_p,
        min_p: options.min_p,
    };
    sampling.validate()?;
    options.penalties.validate()?;
    let device = parse_device(&options.device)?;
    let replay = options
        .replay
        .as_deref()
        .map(RecordedDecisions::read)
        .transpose()?;
    if let Some(path) = &options.steps_out {
        check_output_file("--steps", path)?;
    }
    if options.max_tokens == 0 {
        return Ok(GenerateSummary {
            text: String::new(),
            tokens: 0,
            prompt_tokens: 0,
            elapsed_s: 0.0,
            prefill_s: 0.0,
            ttft_s: 0.0,
            tpot_s: None,
            decode_tokens_per_s: None,
            acceptance: None,
            tau: 0.0,
            passes: 0,
        });
    }
    // staged's `--draft layer_skip` / `eagle` levels run on the target: no model to load
    let draft_model = options
        .draft
        .as_deref()
        .filter(|d| !method.drafter.is::<Staged>() || Staged::level_is_model(d));
    crate::runner::check_tensor_parallel(options.tensor_parallel)?;
    let kv_memory = KvMemory::configured(
        options.kv_memory.as_deref(),
        options.kv_dtype.as_deref(),
        &options.device,
    )?;
    on_loading(&match &options.draft {
        Some(draft) => format!(
            "loading {} and {draft} on {}…",
            options.target, options.device
        ),
        None => format!("loading {} on {}…", options.target, options.device),
    });
    let mut backend = EngineBackend::open_with(
        kv_memory,
        &options.target,
        draft_model,
        sampling,
        options.seed,
        options.max_tokens,
        1,
    )?
    .with_penalties(options.penalties)?
    .place(device, options.tensor_parallel)?;
    if let Some(recorded) = replay {
        backend = backend.with_replay(recorded);
    }
    let chat = options
        .chat
        .unwrap_or_else(|| backend.tokenizer().chat_template().is_some());
    let request = Request {
        id: 0,
        seed: None,
        workload: None,
        prompt: backend.encode(&options.prompt, chat)?,
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
    if let Some(path) = &options.steps_out {
        write_jsonl(path, &generations[0].steps)?;
    }
    let text = tokenizer.decode_skip_special(&generations[0].tokens)?;
    Ok(GenerateSummary::of(&generations[0], text))
}

/// Checks, before any work, that `path` (given by `flag`) can be written: its folder exists and
/// it is not itself a folder.
///
/// # Errors
/// [`HarnessError::InvalidEngine`] naming the flag and the path.
fn check_output_file(flag: &str, path: &Path) -> Result<()> {
    let folder = match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    };
    let problem = if path.is_dir() {
        "is a folder"
    } else if !folder.is_dir() {
        "is in a folder that does not exist"
    } else {
        return Ok(());
    };
    Err(HarnessError::InvalidEngine(format!(
        "{flag} {}: {problem}",
        path.display()
    )))
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
        // the draft limit holds for flags too, before any model is opened
        for name in ["layer_skip", "chain", "tree", "auto"] {
            let err = method_for(name, 100_000, Some("d"))
                .unwrap_err()
                .to_string();
            assert!(
                err.contains("100000") && err.contains("1024"),
                "{name}: {err}"
            );
        }
        assert!(method_for("plain", 0, None).is_ok());
    }

    #[test]
    fn the_default_gate_spares_only_a_lookup_drafter_whose_offers_are_priced() {
        use crate::runner::{MinAcceptance, DEFAULT_MIN_ACCEPTANCE};
        let levels = |name: &str, draft: Option<&str>| {
            method_for(name, 4, draft).unwrap().levels_pricing_offers()
        };
        // auto: history lookup under the cost model; with a draft model, that is the fallback
        assert_eq!(levels("auto", None), [true]);
        assert_eq!(levels("auto", Some("qwen2.5-coder-0.5b")), [false, true]);
        // a fixed K prices nothing, a model drafter is not a lookup
        assert_eq!(levels("history", None), [false]);
        assert_eq!(levels("chain", Some("qwen2.5-coder-0.5b")), [false]);
        assert_eq!(levels("plain", None), [false]);
        let default = MinAcceptance::Default;
        assert_eq!(default.threshold(true), None);
        assert_eq!(default.threshold(false), Some(DEFAULT_MIN_ACCEPTANCE));
        // a threshold given applies to every level; 0 to none
        assert_eq!(MinAcceptance::Every(0.4).threshold(true), Some(0.4));
        assert_eq!(MinAcceptance::Every(0.0).threshold(false), None);
    }
}
