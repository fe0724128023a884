//! Builds `specdec_algorithms` speculation policies from method configs.

use specdec_algorithms::policy::{
    AimdPolicy, Budget, CostModel, CostModelPolicy, DisableGate, FixedPolicy, PidPolicy,
    SpeculationPolicy, TreeSearch,
};

use crate::config::{DrafterConfig, MethodConfig, PolicyConfig};
use crate::error::{HarnessError, Result};

/// The policy a config asks for, fresh for one sequence (use `fork` for more). `costs` is the
/// cost model the `cost_optimal` kind optimises (relative to one plain step); without it that
/// kind answers [`HarnessError::NotYetAvailable`]. Bad parameters give the algorithms crate's
/// error naming the parameter.
pub fn policy_for(
    config: &PolicyConfig,
    costs: Option<&CostModel>,
) -> Result<Box<dyn SpeculationPolicy>> {
    Ok(match config {
        PolicyConfig::Fixed { k } => Box::new(FixedPolicy::chain(*k)),
        PolicyConfig::Aimd {
            k_min,
            k_max,
            start_k,
            increase,
            decrease,
        } => Box::new(AimdPolicy::new(
            start_k.unwrap_or(*k_min),
            *k_min,
            *k_max,
            *increase,
            *decrease,
        )?),
        PolicyConfig::Pid {
            target_acceptance,
            k_min,
            k_max,
            base_k,
            gains,
        } => Box::new(PidPolicy::new(
            *target_acceptance,
            base_k.unwrap_or((*k_min + *k_max) as f64 / 2.0),
            *gains,
            *k_min,
            *k_max,
        )?),
        PolicyConfig::CostOptimal {
            k_max,
            min_gain,
            probe_every,
        } => {
            let costs = costs.ok_or_else(|| {
                HarnessError::NotYetAvailable(
                    "policy cost_optimal needs a cost model: the simulation's, or on real models \
                     the engine backend's measured mode (CostModelPolicy::measured)"
                        .into(),
                )
            })?;
            Box::new(
                CostModelPolicy::new(costs.clone(), TreeSearch::Chain { max_k: *k_max })?
                    .with_min_gain(*min_gain, *probe_every)?,
            )
        }
        PolicyConfig::Threshold {
            k,
            min_acceptance,
            probe_every,
        } => Box::new(
            DisableGate::new(FixedPolicy::chain(*k))
                .with_threshold(*min_acceptance)?
                .with_probe(*probe_every, Budget::Chain(1))?,
        ),
    })
}

/// The policy of a method: plain decoding (no policy) is a fixed plain budget.
pub fn method_policy(
    method: &MethodConfig,
    costs: Option<&CostModel>,
) -> Result<Box<dyn SpeculationPolicy>> {
    match &method.policy {
        None => Ok(Box::new(FixedPolicy::new(Budget::Plain))),
        Some(p) => policy_for(p, costs),
    }
}

/// The next chain length the policy asks for (0 for plain decoding). `who` names the caller in
/// the error a tree budget gets ([`HarnessError::NotYetAvailable`]: it runs chains only).
pub fn next_chain_len(policy: &mut dyn SpeculationPolicy, who: &str) -> Result<usize> {
    match policy.next_budget() {
        Budget::Plain => Ok(0),
        Budget::Chain(k) => Ok(k),
        other => Err(HarnessError::NotYetAvailable(format!(
            "policy `{}` asked for {other:?}; {who} runs chains only",
            policy.name()
        ))),
    }
}

/// Refuses a method whose drafter is not plain decoding or a chain, or that has a fallback
/// drafter ([`HarnessError::NotYetAvailable`], naming `who`).
pub fn require_chain_method(method: &MethodConfig, who: &str) -> Result<()> {
    if method.fallback.is_some() {
        return Err(HarnessError::NotYetAvailable(format!(
            "{who} runs one drafter per method; method `{}` has a fallback drafter (the engine \
             backend, on real models, runs it)",
            method.name
        )));
    }
    if matches!(method.drafter, DrafterConfig::None | DrafterConfig::Chain) {
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
    use crate::config::{FallbackConfig, VerifierConfig};

    #[test]
    fn one_drafter_backends_refuse_trees_and_fallbacks_by_name() {
        let fixed = Some(PolicyConfig::Fixed { k: 2 });
        let chain = MethodConfig::new("k2", DrafterConfig::Chain, fixed.clone());
        assert!(require_chain_method(&chain, "the simulation").is_ok());
        let tree = MethodConfig::new(
            "small-tree",
            DrafterConfig::Tree { branching: vec![2] },
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
            drafter: DrafterConfig::Ngram { n: 3 },
            verifier: VerifierConfig::Auto,
            policy: PolicyConfig::Fixed { k: 2 },
        });
        let err = require_chain_method(&with_fallback, "the toy backend").unwrap_err();
        let err = err.to_string();
        assert!(
            err.contains("fallback") && err.contains("`k2`") && err.contains("the toy backend"),
            "{err}"
        );
    }
}
