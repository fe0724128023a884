//! The simulation backend.

use super::{Backend, MethodOutcome, RequestOutcome, RequestSpec};
use crate::config::{MethodConfig, PolicyConfig};
use crate::error::Result;
use crate::policies::{method_policy, require_chain_method};
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
        let costs = match &method.policy {
            Some(PolicyConfig::CostOptimal { k_max, .. }) => {
                Some(self.sim.cost.policy_costs(*k_max)?)
            }
            _ => None,
        };
        let template = method_policy(method, costs.as_ref())?;
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
