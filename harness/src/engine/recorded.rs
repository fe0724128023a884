//! Recorded speculation decisions, replayed: what makes a run whose policy follows measured
//! timings (`auto`, every cost-model policy) reproducible at T > 0.
//!
//! With a fixed seed every random draw of a step is keyed by (seed, request, step, node,
//! purpose), so a run's text depends on nothing but its inputs and the budgets its policy
//! chose. A cost-model policy chooses from this machine's timings as they are now, so two runs
//! can draft differently and, at T > 0, sample different (equally distributed) texts. Every step
//! record carries the policy's decision ([`PolicyDecision`]); replaying those decisions in place
//! of the policy repeats the run draw for draw. Each replayed step is checked against its record
//! (drafter, drafts proposed and accepted, tokens emitted), so a replay that cannot reproduce the recorded run
//! — another model, prompt, seed or sampling setting — stops with an error naming the first step
//! that differs, never with a silently different text.
//!
//! Why a replay and not a drafter-invariant coupling: a coupling under which the output does not
//! depend on the drafts at all exists for greedy decoding (the output is the target's argmax
//! path), but at T > 0 the lossless verifiers consume their uniforms per drafted node, and no
//! verifier here draws the emitted token from a stream independent of the drafts; building one
//! would change every verifier and its exact proof. Replaying the decisions leaves the verifiers
//! and their proofs as they are.

use std::collections::HashMap;
use std::path::Path;

use specdec_algorithms::policy::{Budget, DrafterChoice};

use crate::error::{HarnessError, Result};
use crate::metrics::{PolicyDecision, StepRecord};
use crate::report::read_jsonl;

/// One recorded step: the decision and what came of it.
#[derive(Debug, Clone, PartialEq)]
struct RecordedStep {
    decision: PolicyDecision,
    drafter: String,
    proposed: usize,
    accepted: usize,
    tokens: Vec<u32>,
}

/// The decisions of one recorded run, by request id and step (see the module docs).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RecordedDecisions {
    steps: HashMap<u64, Vec<RecordedStep>>,
}

impl RecordedDecisions {
    /// The decisions of `records`, one request's steps keyed by the record's `request` (the
    /// request id of the run that replays them: `generate` runs request 0, `specdec run` keys
    /// requests by prompt index).
    ///
    /// # Errors
    /// [`HarnessError::InvalidEngine`] for a record without a decision, two records of one
    /// step (a `steps.jsonl` of several methods or repeats), or a request whose steps do not
    /// run 0, 1, 2, … without a gap.
    pub fn from_records(records: &[StepRecord]) -> Result<Self> {
        let mut steps: HashMap<u64, Vec<(usize, RecordedStep)>> = HashMap::new();
        for record in records {
            let decision = record.decision.clone().ok_or_else(|| {
                HarnessError::InvalidEngine(format!(
                    "request {} step {}: the record has no policy decision (written by an \
                     older specdec or by a simulation)",
                    record.request, record.step
                ))
            })?;
            steps.entry(record.request as u64).or_default().push((
                record.step,
                RecordedStep {
                    decision,
                    drafter: record.drafter.clone(),
                    proposed: record.proposed,
                    accepted: record.accepted,
                    tokens: record.tokens.clone(),
                },
            ));
        }
        let mut by_request = HashMap::with_capacity(steps.len());
        for (request, mut recorded) in steps {
            recorded.sort_by_key(|(step, _)| *step);
            for (expected, (step, _)) in recorded.iter().enumerate() {
                if *step != expected {
                    let problem = if *step < expected {
                        "is recorded twice (records of several methods or repeats: keep one \
                         run's)"
                    } else {
                        "is missing"
                    };
                    return Err(HarnessError::InvalidEngine(format!(
                        "request {request} step {}: {problem}",
                        step.min(&expected)
                    )));
                }
            }
            by_request.insert(request, recorded.into_iter().map(|(_, s)| s).collect());
        }
        Ok(Self { steps: by_request })
    }

    /// The decisions in a JSONL file of step records (`generate --steps`, or one method's
    /// records of a run's `steps.jsonl`).
    ///
    /// # Errors
    /// As [`read_jsonl`] and [`RecordedDecisions::from_records`], the file named.
    pub fn read(path: &Path) -> Result<Self> {
        let records: Vec<StepRecord> = read_jsonl(path)?;
        Self::from_records(&records).map_err(|e| match e {
            HarnessError::InvalidEngine(reason) => {
                HarnessError::InvalidEngine(format!("--replay {}: {reason}", path.display()))
            }
            other => other,
        })
    }

    /// Steps recorded for `request` (0 if none).
    pub fn steps_of(&self, request: u64) -> usize {
        self.steps.get(&request).map_or(0, Vec::len)
    }

    fn recorded(&self, request: u64, step: u64) -> Result<&RecordedStep> {
        self.steps
            .get(&request)
            .and_then(|steps| steps.get(step as usize))
            .ok_or_else(|| {
                diverged(
                    request,
                    step,
                    format!(
                        "the recorded run ended this request after {} steps",
                        self.steps_of(request)
                    ),
                )
            })
    }

    /// The recorded drafter choice and budget of `request`'s step `step`; `has_fallback` says
    /// whether the replaying method has a fallback drafter.
    ///
    /// # Errors
    /// [`HarnessError::InvalidEngine`] when no such step was recorded, or it drafted with a
    /// fallback drafter this method lacks.
    pub fn decision(
        &self,
        request: u64,
        step: u64,
        has_fallback: bool,
    ) -> Result<(DrafterChoice, Budget)> {
        let recorded = self.recorded(request, step)?;
        if recorded.decision.fallback && !has_fallback {
            return Err(diverged(
                request,
                step,
                "the recorded step drafted with a fallback drafter; this method has none".into(),
            ));
        }
        let choice = match recorded.decision.fallback {
            true => DrafterChoice::Fallback,
            false => DrafterChoice::Primary,
        };
        Ok((choice, recorded.decision.budget()?))
    }

    /// Checks a replayed step against its record: the same drafter, drafts `(proposed,
    /// accepted)` and emitted `tokens` (when the record has them).
    ///
    /// # Errors
    /// [`HarnessError::InvalidEngine`] naming the step and both values of the first that
    /// differs.
    pub fn check(
        &self,
        request: u64,
        step: u64,
        drafter: &str,
        (proposed, accepted): (usize, usize),
        tokens: &[u32],
    ) -> Result<()> {
        let recorded = self.recorded(request, step)?;
        let differ = |what: &str, then: String, now: String| {
            Err(diverged(
                request,
                step,
                format!("{what} {then} in the recorded run, {now} now"),
            ))
        };
        if recorded.drafter != drafter {
            return differ(
                "drafter",
                format!("`{}`", recorded.drafter),
                format!("`{drafter}`"),
            );
        }
        if recorded.proposed != proposed {
            return differ(
                "drafts proposed",
                recorded.proposed.to_string(),
                proposed.to_string(),
            );
        }
        if recorded.accepted != accepted {
            return differ(
                "drafts accepted",
                recorded.accepted.to_string(),
                accepted.to_string(),
            );
        }
        if !recorded.tokens.is_empty() && recorded.tokens != tokens {
            return differ(
                "tokens",
                format!("{:?}", recorded.tokens),
                format!("{tokens:?}"),
            );
        }
        Ok(())
    }

    /// Checks that `request` retired after as many steps as it was recorded with.
    ///
    /// # Errors
    /// [`HarnessError::InvalidEngine`] when the recorded run took more steps.
    pub fn check_finished(&self, request: u64, steps: u64) -> Result<()> {
        let recorded = self.steps_of(request);
        if recorded as u64 != steps {
            return Err(diverged(
                request,
                steps,
                format!("finished after {steps} steps; the recorded run took {recorded}"),
            ));
        }
        Ok(())
    }
}

fn diverged(request: u64, step: u64, reason: String) -> HarnessError {
    HarnessError::InvalidEngine(format!(
        "replay diverged at request {request} step {step}: {reason} (replay with the recorded \
         run's models, prompt, seed and sampling settings)"
    ))
}
