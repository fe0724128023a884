//! Checking a method's config against the registry, and building it for a backend.

use specdec_algorithms::policy::{Budget, FixedPolicy, SpeculationPolicy};
use specdec_algorithms::verify::PairedVerifier;

use super::drafters::{DraftContext, DraftSetup, Plain};
use super::policies::{PolicyContext, PolicyCosts};
use super::verifiers::Pairing;
use super::{DrafterEntry, SpecError};
use specdec_models::{LanguageModel, VocabRanking};

use crate::config::MethodConfig;
use crate::engine::{Engine, EngineOptions};
use crate::error::{HarnessError, Result};

/// What is wrong with a method's config: the field (relative to the method, e.g. `.drafter`,
/// `.fallback.policy`), the problem, and whether it is a parse error (an unknown kind or key).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MethodProblem {
    /// The field at fault, relative to the method.
    pub field: String,
    /// What is wrong.
    pub problem: String,
    /// True when the entry did not parse (rather than held a bad value).
    pub is_parse: bool,
}

/// The problem of `field` (a bad value, or a [`SpecError`] with its parse flag).
fn problem<E: Into<SpecError>>(field: &str) -> impl Fn(E) -> MethodProblem + '_ {
    move |error| {
        let error = error.into();
        MethodProblem {
            field: field.to_string(),
            problem: error.message,
            is_parse: error.is_parse,
        }
    }
}

impl From<String> for SpecError {
    /// A bad value.
    fn from(message: String) -> Self {
        SpecError {
            message,
            is_parse: false,
        }
    }
}

/// Checks every kind and parameter of `method` (its fallback's too) against the registry and
/// rewrites aliases to the canonical names.
///
/// # Errors
/// The first [`MethodProblem`]: an unknown kind or key, a bad value, a policy on plain decoding
/// or none on a drafting method, `draft_vocab` on a drafter without a model, a fallback that
/// does not draft or on the baseline.
pub fn validate_method(method: &mut MethodConfig) -> std::result::Result<(), MethodProblem> {
    let name = method.name.clone();
    let drafter = method.drafter.canonical().map_err(problem(".drafter"))?;
    method.verifier.canonical().map_err(problem(".verifier"))?;
    let is_plain = method.drafter.is::<Plain>();
    match &mut method.policy {
        Some(_) if is_plain => {
            return Err(problem::<String>(".policy")(format!(
                "method `{name}` is plain decoding (drafter plain) and takes no policy"
            )))
        }
        None if !is_plain => {
            return Err(problem::<String>(".policy")(format!(
                "method `{name}` drafts and needs a policy, e.g. policy = {{ kind = \"fixed\", k = 4 }}"
            )))
        }
        None => {}
        Some(policy) => {
            let entry = policy.canonical().map_err(problem(".policy"))?;
            let params = method.drafter.params();
            entry
                .check_for(policy.params(), drafter.is_chain(params), drafter.name())
                .map_err(problem::<String>(".policy"))?;
        }
    }
    check_draft_vocab(method, drafter).map_err(problem::<String>(".draft_vocab"))?;
    if let Some(fallback) = &mut method.fallback {
        if fallback.drafter.is::<Plain>() || is_plain {
            return Err(problem::<String>(".fallback")(format!(
                "method `{name}`: a fallback drafter drafts where the method's own drafter steps \
                 aside; it must draft (not kind \"plain\") and the method must have a drafter"
            )));
        }
        let drafter = fallback
            .drafter
            .canonical()
            .map_err(problem(".fallback.drafter"))?;
        fallback
            .verifier
            .canonical()
            .map_err(problem(".fallback.verifier"))?;
        let entry = fallback
            .policy
            .canonical()
            .map_err(problem(".fallback.policy"))?;
        entry
            .check_for(
                fallback.policy.params(),
                drafter.is_chain(fallback.drafter.params()),
                drafter.name(),
            )
            .map_err(problem::<String>(".fallback.policy"))?;
    }
    Ok(())
}

/// Refuses `draft_vocab = 0`, `draft_vocab` on a drafter that runs no model (a vocabulary
/// past the model's is refused when the model is opened), and `draft_vocab_ranking` without
/// `draft_vocab` or naming a file that is not a ranking ([`read_ranking`]).
fn check_draft_vocab(
    method: &MethodConfig,
    drafter: &dyn DrafterEntry,
) -> std::result::Result<(), String> {
    if method.draft_vocab == Some(0) {
        return Err(format!(
            "method `{}`: draft_vocab must be at least 1 (leave it out for the whole vocabulary)",
            method.name
        ));
    }
    if method.draft_vocab.is_some() && !drafter.uses_model(method.drafter.params()) {
        return Err(format!(
            "method `{}`: draft_vocab applies to drafters with a model, not to {}",
            method.name,
            drafter.name()
        ));
    }
    if method.draft_vocab_ranking.is_some() {
        if method.draft_vocab.is_none() {
            return Err(format!(
                "method `{}`: draft_vocab_ranking orders the ids draft_vocab keeps; set \
                 draft_vocab too (e.g. 32768)",
                method.name
            ));
        }
        read_ranking(method)?;
    }
    Ok(())
}

/// The method's `draft_vocab_ranking`, read and checked, if it has one.
///
/// # Errors
/// The file's fault, naming the method.
fn read_ranking(method: &MethodConfig) -> std::result::Result<Option<VocabRanking>, String> {
    method
        .draft_vocab_ranking
        .as_deref()
        .map(VocabRanking::read)
        .transpose()
        .map_err(|err| format!("method `{}`: draft_vocab_ranking: {err}", method.name))
}

/// A method ready for the engine.
pub struct BuiltMethod {
    /// Proposes the draft trees.
    pub drafter: Box<dyn specdec_algorithms::drafters::Drafter<f32>>,
    /// Verifies them (paired with the drafter's kind).
    pub verifier: PairedVerifier<f32>,
    /// Chooses each step's budget (a prototype, forked per request).
    pub policy: Box<dyn SpeculationPolicy>,
    /// The method's fallback drafter, verifier and policy (`MethodConfig::fallback`), if any.
    pub fallback: Option<Box<BuiltMethod>>,
}

impl BuiltMethod {
    /// An engine over `target` running this method (its policy prototypes forked, so the
    /// method can run again).
    ///
    /// # Errors
    /// As [`Engine::new`] and [`Engine::with_fallback`].
    pub fn engine<'a>(
        &'a mut self,
        target: &'a mut dyn LanguageModel,
        options: EngineOptions,
    ) -> Result<Engine<'a>> {
        let mut engine = Engine::new(
            target,
            self.drafter.as_mut(),
            self.verifier.clone(),
            self.policy.fork(),
            options,
        )?;
        if let Some(fallback) = self.fallback.as_mut() {
            engine = engine.with_fallback(
                fallback.drafter.as_mut(),
                fallback.verifier.clone(),
                fallback.policy.fork(),
            )?;
        }
        Ok(engine)
    }
}

/// Builds the drafter, verifier and policy of `method` (and its fallback's) from what `ctx`
/// lends: the drafter entry builds the drafter, the verifier entry the verifier for the
/// drafter's [`Pairing`] (refused unless lossless by construction for its trees, or declared
/// lossy), the policy entry the policy with the costs the backend measures.
///
/// # Errors
/// An unknown kind or bad parameters; what the backend cannot lend (a draft model, block
/// subsets, costs); a verifier that does not pair with the drafter's kind.
pub fn build_method(method: &MethodConfig, ctx: &mut dyn DraftContext) -> Result<BuiltMethod> {
    let invalid =
        |what: String| HarnessError::InvalidEngine(format!("method `{}`: {what}", method.name));
    let drafter_entry = method.drafter.entry().map_err(invalid)?;
    check_draft_vocab(method, drafter_entry).map_err(HarnessError::InvalidEngine)?;
    let ranking = read_ranking(method).map_err(HarnessError::InvalidEngine)?;
    let policy_entry = match &method.policy {
        Some(policy) => Some(policy.entry().map_err(invalid)?),
        None => None,
    };
    let measured = ctx.measures_costs();
    let prices_drafts = measured
        && policy_entry
            .zip(method.policy.as_ref())
            .is_some_and(|(e, p)| e.prices_drafts(p.params()));
    let setup = DraftSetup {
        method: &method.name,
        draft_vocab: method.draft_vocab,
        draft_vocab_ranking: ranking.as_ref(),
        time_passes: prices_drafts,
    };
    let built = drafter_entry.build(method.drafter.params(), ctx, &setup)?;
    let pairing = Pairing {
        kind: built.drafter.kind(),
        is_chain: built.is_chain,
        temperature: ctx.sampling().temperature,
    };
    let verifier_entry = method.verifier.entry().map_err(invalid)?;
    let verifier = PairedVerifier::new(
        verifier_entry.build(method.verifier.params(), &pairing)?,
        pairing.kind,
    )?;
    let policy = match (policy_entry, &method.policy) {
        (Some(entry), Some(config)) => {
            let verify_curve = match entry.verify_tokens(config.params()) {
                Some(tokens) if measured => Some(ctx.verify_curve(tokens)?),
                _ => None,
            };
            let costs = match measured {
                true => PolicyCosts::Measured {
                    draft_pass_s: built.draft_pass_s,
                    verify_curve: verify_curve.as_deref(),
                },
                false => PolicyCosts::Unknown,
            };
            let policy_ctx = PolicyContext {
                method: &method.name,
                drafter: drafter_entry.name(),
                is_chain: built.is_chain,
                shape: built.shape.as_ref(),
                costs,
            };
            entry.build(config.params(), &policy_ctx)?
        }
        _ => Box::new(FixedPolicy::new(Budget::Plain)) as Box<dyn SpeculationPolicy>,
    };
    let fallback = match method.fallback_method() {
        Some(fallback) => Some(Box::new(build_method(&fallback, ctx)?)),
        None => None,
    };
    Ok(BuiltMethod {
        drafter: built.drafter,
        verifier,
        policy,
        fallback,
    })
}

/// The policy of a chain method for a backend that drafts nothing itself (the simulation):
/// plain decoding (no policy) is a fixed plain budget.
///
/// # Errors
/// An unknown kind or bad parameters; costs the policy needs and `costs` lacks.
pub fn method_policy(
    method: &MethodConfig,
    costs: PolicyCosts<'_>,
) -> Result<Box<dyn SpeculationPolicy>> {
    let Some(policy) = &method.policy else {
        return Ok(Box::new(FixedPolicy::new(Budget::Plain)));
    };
    let entry = policy.entry().map_err(HarnessError::InvalidEngine)?;
    let ctx = PolicyContext {
        method: &method.name,
        drafter: method.drafter.kind(),
        is_chain: true,
        shape: None,
        costs,
    };
    entry.build(policy.params(), &ctx)
}
