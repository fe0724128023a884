//! The toy backend: real speculative decoding (the kernels' verifiers, production randomness) on
//! a seeded pair of toy probability-table models, chains only. No download, no weights.
//!
//! Each round is timed as a whole (wall time) and recorded as `overhead_s`: the toy loop does not
//! separate drafting, the target pass and verification, and its times say nothing about real
//! models. Its value is the acceptance statistics, which follow from the tables exactly.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use specdec_algorithms::policy::StepOutcome;
use specdec_algorithms::proof::{SpecLoop, ToyDrafter};
use specdec_algorithms::verify::PairedVerifier;
use specdec_kernels::sampling::{prepare_probs, Production, SamplingParams};
use specdec_kernels::verification::{DraftKind, VerifyMethod};
use specdec_models::toy::{ToyPair, ToyStyle};

use super::{Backend, MethodOutcome, RequestOutcome, RequestSpec};
use crate::config::{ExperimentConfig, MethodConfig, ToyConfig, VerifierConfig};
use crate::error::{HarnessError, Result};
use crate::metrics::StepRecord;
use crate::policies::{method_policy, next_chain_len, require_chain_method};

/// KV block size assumed for the toy backend's block count (no cache exists).
const TOY_BLOCK_TOKENS: usize = 16;

/// Runs chain methods on a toy pair, one request at a time.
#[derive(Debug, Clone)]
pub struct ToyBackend {
    pair: ToyPair,
    params: SamplingParams,
    max_tokens: usize,
    seed: u64,
}

impl ToyBackend {
    /// The backend for a config whose target is `toy` (its `[toy]` table, or the defaults).
    pub fn new(config: &ExperimentConfig) -> Result<Self> {
        let toy = config.toy.clone().unwrap_or_default();
        Ok(ToyBackend {
            pair: toy_pair(&toy)?,
            params: SamplingParams {
                temperature: config.sampling.temperature,
                top_k: config.sampling.top_k,
                top_p: config.sampling.top_p,
            },
            max_tokens: config.max_tokens,
            seed: config.sampling.seed,
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

fn verify_method(method: &MethodConfig, temperature: f64) -> Result<VerifyMethod> {
    Ok(match method.verifier {
        VerifierConfig::Auto if temperature == 0.0 => VerifyMethod::Greedy,
        VerifierConfig::Auto | VerifierConfig::Rejection => VerifyMethod::ChainRejection,
        VerifierConfig::Greedy => VerifyMethod::Greedy,
        ref other => {
            return Err(HarnessError::NotYetAvailable(format!(
                "the toy backend runs chains; verifier `{}` of method `{}` needs tree drafting",
                other.kind(),
                method.name
            )))
        }
    })
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
        require_chain_method(method, "the toy backend")?;
        let verifier = Arc::new(verify_method(method, self.params.temperature)?);
        let template = method_policy(method, None)?;
        let vocab = self.pair.target.vocab();
        let started = Instant::now();
        let mut outcomes = Vec::with_capacity(requests.len());
        for spec in requests {
            let prompt = toy_tokens(&spec.prompt.text, spec.index, vocab);
            let mut policy = template.fork();
            let mut decisions = Production::production(self.seed);
            let mut loops: HashMap<usize, SpecLoop<f64>> = HashMap::new();
            let mut generated: Vec<u32> = Vec::new();
            let mut steps = Vec::new();
            let request_start = Instant::now();
            while generated.len() < self.max_tokens {
                let k = next_chain_len(policy.as_mut(), "the toy backend")?;
                let spec_loop = match loops.entry(k) {
                    std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
                    std::collections::hash_map::Entry::Vacant(e) => e.insert(SpecLoop::new(
                        self.pair.clone(),
                        ToyDrafter::Chain { k },
                        PairedVerifier::new(verifier.clone(), DraftKind::Iid)?,
                        self.params,
                        prompt.clone(),
                        self.max_tokens,
                    )?),
                };
                let t0 = Instant::now();
                let round = spec_loop.round(
                    &generated,
                    spec.index as u64,
                    steps.len() as u64,
                    &mut decisions,
                )?;
                let round_s = t0.elapsed().as_secs_f64();
                let accepted = round.verdict.accepted_len;
                policy.observe(&StepOutcome::chain(k, accepted)?);
                let emitted = round.emitted.len().min(self.max_tokens - generated.len());
                generated.extend(&round.emitted[..emitted]);
                steps.push(StepRecord {
                    method: method.name.clone(),
                    request: spec.index,
                    step: steps.len(),
                    proposed: k,
                    draft_depth: k,
                    accepted,
                    emitted,
                    draft_s: 0.0,
                    target_s: 0.0,
                    verify_s: 0.0,
                    commit_s: 0.0,
                    overhead_s: round_s,
                    kv_blocks: (prompt.len() + generated.len()).div_ceil(TOY_BLOCK_TOKENS),
                    batch: 1,
                });
            }
            let text: Vec<String> = generated.iter().map(u32::to_string).collect();
            outcomes.push(RequestOutcome {
                request: spec.index,
                prompt_tokens: prompt.len(),
                elapsed_s: request_start.elapsed().as_secs_f64(),
                steps,
                text: Some(text.join(" ")),
            });
            on_request_done(spec.index);
        }
        Ok(MethodOutcome {
            elapsed_s: started.elapsed().as_secs_f64().max(f64::MIN_POSITIVE),
            requests: outcomes,
        })
    }
}
