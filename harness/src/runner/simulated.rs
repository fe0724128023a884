//! The simulation backend.

use super::{Backend, MethodOutcome, RequestOutcome, RequestSpec};
use crate::config::MethodConfig;
use crate::error::{HarnessError, Result};
use crate::methods::drafters::Plain;
use crate::methods::policies::CostOptimal;
use crate::methods::{method_policy, PolicyCosts};
use crate::simulation::{simulate_request, SimulationConfig, SplitMix64};

/// Runs methods on the injected acceptance process and cost model, one request at a time. Every
/// method sees the same random stream per request (common random numbers), so differences between
/// methods are not sampling noise of the acceptance draws alone.
#[derive(Debug, Clone)]
pub struct SimulationBackend {
    sim: SimulationConfig,
    max_tokens: usize,
    seed: u64,
}

impl SimulationBackend {
    /// A backend generating `max_tokens` per request with random streams from `seed`.
    pub fn new(sim: SimulationConfig, max_tokens: usize, seed: u64) -> Self {
        SimulationBackend {
            sim,
            max_tokens,
            seed,
        }
    }
}

impl Backend for SimulationBackend {
    fn name(&self) -> &str {
        "simulation"
    }

    fn run_method(
        &mut self,
        method: &MethodConfig,
        requests: &[RequestSpec<'_>],
        on_request_done: &mut dyn FnMut(usize),
    ) -> Result<MethodOutcome> {
        require_chain_method(method, "the simulation")?;
        let costs = match method
            .policy
            .as_ref()
            .and_then(|p| p.as_kind::<CostOptimal>())
        {
            Some(policy) => Some(self.sim.cost.policy_costs(policy.k_max)?),
            None => None,
        };
        let costs = match &costs {
            Some(costs) => PolicyCosts::Given(costs),
            None => PolicyCosts::Unknown,
        };
        let template = method_policy(method, costs)?;
        let mut elapsed_s = 0.0;
        let mut outcomes = Vec::with_capacity(requests.len());
        for spec in requests {
            let mut policy = template.fork();
            let mut rng = SplitMix64::stream(self.seed, spec.index as u64);
            let prompt_tokens = spec.prompt.nominal_tokens.unwrap_or(0);
            let acceptance = self.sim.acceptance.for_request(spec.index);
            let r = simulate_request(
                &method.name,
                spec.index,
                prompt_tokens,
                self.max_tokens,
                &acceptance,
                &self.sim.cost,
                policy.as_mut(),
                &mut rng,
            )?;
            elapsed_s += r.elapsed_s;
            outcomes.push(RequestOutcome {
                request: spec.index,
                prompt_tokens,
                elapsed_s: r.elapsed_s,
                steps: r.steps,
                text: None,
            });
            on_request_done(spec.index);
        }
        Ok(MethodOutcome {
            elapsed_s,
            setup_s: 0.0,
            requests: outcomes,
        })
    }
}

/// Refuses a method whose drafter is not plain decoding or a chain drafted by one model, or that
/// has a fallback drafter ([`HarnessError::NotYetAvailable`], naming `who`): what an injected
/// acceptance process can stand for.
pub fn require_chain_method(method: &MethodConfig, who: &str) -> Result<()> {
    if method.fallback.is_some() {
        return Err(HarnessError::NotYetAvailable(format!(
            "{who} runs one drafter per method; method `{}` has a fallback drafter (the engine \
             backend, on real models, runs it)",
            method.name
        )));
    }
    if method.drafter.is::<Plain>() || method.drafter.is::<crate::methods::drafters::Chain>() {
        Ok(())
    } else {
        Err(HarnessError::NotYetAvailable(format!(
            "{who} runs chains only; method `{}` uses drafter `{}`",
            method.name,
            method.drafter.kind()
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{DrafterConfig, FallbackConfig, PolicyConfig, VerifierConfig};
    use crate::methods::drafters::{Chain, Ngram, Tree};
    use crate::methods::policies::Fixed;

    #[test]
    fn one_drafter_backends_refuse_trees_and_fallbacks_by_name() {
        let fixed = Some(PolicyConfig::of(Fixed { k: 2 }));
        let chain = MethodConfig::new("k2", DrafterConfig::of(Chain::default()), fixed.clone());
        assert!(require_chain_method(&chain, "the simulation").is_ok());
        let tree = MethodConfig::new(
            "small-tree",
            DrafterConfig::of(Tree { branching: vec![2] }),
            fixed.clone(),
        );
        let err = require_chain_method(&tree, "the simulation").unwrap_err();
        let err = err.to_string();
        assert!(
            err.contains("chains only") && err.contains("`small-tree`"),
            "{err}"
        );
        let mut with_fallback = chain.clone();
        with_fallback.fallback = Some(FallbackConfig {
            drafter: DrafterConfig::of(Ngram { n: 3 }),
            verifier: VerifierConfig::default(),
            policy: PolicyConfig::of(Fixed { k: 2 }),
        });
        let err = require_chain_method(&with_fallback, "the toy backend").unwrap_err();
        let err = err.to_string();
        assert!(
            err.contains("fallback") && err.contains("`k2`") && err.contains("the toy backend"),
            "{err}"
        );
    }
}
