//! The toy backend: the harness's engine loop ([`crate::engine::Engine`]: continuous batching,
//! the kernels' verifiers, production randomness) over a seeded pair of toy probability-table
//! language models. No download, no weights. Methods are built through the registry with the
//! toy draft as every draft model; drafters needing the target's blocks (layer skip) and the
//! cost-model policy (no measured costs) are refused by name.
//!
//! Times are the engine's wall time on toy tables: they say nothing about real models; the
//! acceptance statistics, which follow from the tables exactly, are the point.

use std::time::Instant;

use specdec_kernels::sampling::{prepare_probs, SamplingParams};
use specdec_models::toy::{ToyLanguageModel, ToyPair, ToyStyle};
use specdec_models::LanguageModel;

use super::{Backend, MethodOutcome, RequestOutcome, RequestSpec};
use crate::config::{ExperimentConfig, MethodConfig, ToyConfig};
use crate::engine::{EngineOptions, Penalties, Request, StopRule};
use crate::error::{HarnessError, Result};
use crate::methods::{build_method, DeviceModel, DraftContext};

/// Runs plain decoding and chain methods through the engine on a toy pair.
#[derive(Debug, Clone)]
pub struct ToyBackend {
    pair: ToyPair,
    params: SamplingParams,
    penalties: Penalties,
    max_tokens: usize,
    seed: u64,
    batch_size: usize,
}

impl ToyBackend {
    /// The backend for a config whose target is `toy` (its `[toy]` table, or the defaults).
    pub fn new(config: &ExperimentConfig) -> Result<Self> {
        let toy = config.toy.clone().unwrap_or_default();
        Ok(ToyBackend {
            pair: toy_pair(&toy)?,
            params: config.sampling.params(),
            penalties: config.sampling.penalties(),
            max_tokens: config.max_tokens,
            seed: config.sampling.seed,
            batch_size: config.batch_size,
        })
    }

    /// Σ min(p, q) over the prepared rows after `context`: the exact acceptance probability of one
    /// chain-rejection draft there (for an order-0 pair, at every position).
    pub fn alpha_after(&self, context: &[u32]) -> Result<f64> {
        let p = prepare_probs(
            &self.pair.target.next_probs_as::<f64>(context),
            &self.params,
        )?;
        let q = prepare_probs(&self.pair.draft.next_probs_as::<f64>(context), &self.params)?;
        Ok(p.iter().zip(&q).map(|(a, b)| a.min(*b)).sum())
    }
}

/// The seeded toy pair a `[toy]` table describes.
pub fn toy_pair(toy: &ToyConfig) -> Result<ToyPair> {
    let style = if toy.dense {
        ToyStyle::DENSE
    } else {
        ToyStyle::default()
    };
    Ok(ToyPair::seeded(toy.seed, toy.vocab, toy.order, style)?)
}

/// Maps prompt text onto toy tokens (bytes modulo the vocabulary); an empty prompt becomes the
/// one token `request mod vocab`.
fn toy_tokens(text: &str, request: usize, vocab: usize) -> Vec<u32> {
    if text.is_empty() {
        return vec![(request % vocab) as u32];
    }
    text.bytes().map(|b| (b as usize % vocab) as u32).collect()
}

/// What the toy backend lends the registry: the toy draft as every draft model.
struct ToyContext<'a> {
    pair: &'a ToyPair,
    params: SamplingParams,
    batch_size: usize,
    max_context: usize,
}

impl DraftContext for ToyContext<'_> {
    fn sampling(&self) -> SamplingParams {
        self.params
    }

    fn batch_size(&self) -> usize {
        self.batch_size
    }

    fn default_draft(&self) -> Option<String> {
        Some("toy".into())
    }

    /// The toy draft, whatever the name.
    fn draft_model(&mut self, _name: &str) -> Result<DeviceModel> {
        Ok(Box::new(ToyLanguageModel::new(
            self.pair.draft.clone(),
            self.max_context,
            vec![],
        )))
    }

    fn layer_skip(&mut self, _keep: Option<&[usize]>, _tune: bool) -> Result<DeviceModel> {
        Err(HarnessError::NotYetAvailable(
            "the toy backend's target is a probability table and has no blocks to skip (layer \
             skip runs on real models)"
                .into(),
        ))
    }

    fn measures_costs(&self) -> bool {
        false
    }

    fn time_draft_pass(&mut self, _model: &mut dyn LanguageModel) -> Result<f64> {
        Err(HarnessError::NotYetAvailable(
            "the toy backend measures no costs".into(),
        ))
    }

    fn verify_curve(&mut self, _tokens: usize) -> Result<Vec<(usize, f64)>> {
        Err(HarnessError::NotYetAvailable(
            "the toy backend measures no costs".into(),
        ))
    }
}

impl Backend for ToyBackend {
    fn name(&self) -> &str {
        "toy"
    }

    fn run_method(
        &mut self,
        method: &MethodConfig,
        requests: &[RequestSpec<'_>],
        on_request_done: &mut dyn FnMut(usize),
    ) -> Result<MethodOutcome> {
        let vocab = self.pair.target.vocab();
        let engine_requests: Vec<Request> = requests
            .iter()
            .map(|spec| Request {
                id: spec.index as u64,
                seed: None,
                workload: None,
                prompt: toy_tokens(&spec.prompt.text, spec.index, vocab),
                stop: StopRule::new(self.max_tokens, &[]),
            })
            .collect();
        let longest = engine_requests
            .iter()
            .map(|r| r.prompt.len())
            .max()
            .unwrap_or(1);
        let max_context = longest + self.max_tokens + 64;
        let mut target = ToyLanguageModel::new(self.pair.target.clone(), max_context, vec![]);
        let mut built = build_method(
            method,
            &mut ToyContext {
                pair: &self.pair,
                params: self.params,
                batch_size: self.batch_size,
                max_context,
            },
        )?;
        let options = EngineOptions {
            method: method.name.clone(),
            sampling: self.params,
            penalties: self.penalties,
            seed: self.seed,
            batch_size: self.batch_size,
            replay: None,
            op_split: false,
        };
        let started = Instant::now();
        let generations = built
            .engine(&mut target, options)?
            .run(&engine_requests, &mut |i| {
                on_request_done(requests[i].index)
            })?;
        let elapsed_s = started.elapsed().as_secs_f64().max(f64::MIN_POSITIVE);
        let outcomes = generations
            .into_iter()
            .zip(requests)
            .map(|(g, spec)| {
                let text: Vec<String> = g.tokens.iter().map(u32::to_string).collect();
                let mut steps = g.steps;
                for s in &mut steps {
                    s.request = spec.index;
                }
                RequestOutcome {
                    request: spec.index,
                    prompt_tokens: g.prompt_tokens,
                    elapsed_s: g.elapsed_s,
                    steps,
                    text: Some(text.join(" ")),
                }
            })
            .collect();
        Ok(MethodOutcome {
            elapsed_s,
            setup_s: 0.0,
            requests: outcomes,
        })
    }
}
