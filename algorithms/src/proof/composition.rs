//! Exact enumeration of real compositions: any [`Drafter`] × paired verifier × speculation
//! policy (with an optional fallback drafter), on a toy target.
//!
//! [`Composition::exact`] enumerates every random branch of every round with exact rational
//! probabilities ([`enumerate`]); after each branch the policy observes that branch's outcome
//! (so dynamic K, gates and cost models change the drafts along the way), and the exploration
//! goes on from there until `n_tokens` tokens are out. Policies are boxed prototypes
//! ([`FallbackPolicy::fork`]): the policy of a branch is a fresh fork that has observed the
//! branch's history, so no policy needs to be `Clone`. The result must equal the target's own
//! distribution ([`target_distribution`], computed by the independent oracle) exactly.

use std::collections::BTreeSet;

use super::distribution::Distribution;
use super::enumerate::enumerate;
use super::feature_head::toy_features;
use super::sd_loop::target_distribution;
use crate::drafters::{DraftFeedback, DraftRequest, Drafter};
use crate::error::Result;
use crate::policy::{Budget, DrafterChoice, FallbackPolicy, StepOutcome, StepTiming};
use crate::verify::PairedVerifier;
use specdec_kernels::sampling::{prepare_probs, BigRational, Decisions, SamplingParams};
use specdec_kernels::verification::{DraftTree, VerifyInput};
use specdec_kernels::TreeTopology;
use specdec_models::toy::ToyModel;

type Q = BigRational;

/// A drafter with the verifier it is paired with.
pub struct Drafting<'a> {
    /// The drafter.
    pub drafter: &'a mut dyn Drafter<Q>,
    /// Its verifier (the pairing rule checked when it was built).
    pub verifier: PairedVerifier<Q>,
}

/// One composition on a toy target (see the module docs).
#[derive(Debug, Clone)]
pub struct Composition {
    /// The target.
    pub target: ToyModel,
    /// Sampling applied to the target's rows (drafters prepare their own `q` likewise).
    pub params: SamplingParams,
    /// The context before generation (non-empty).
    pub prompt: Vec<u32>,
    /// How many tokens to generate.
    pub n_tokens: usize,
}

/// What [`Composition::exact`] found.
#[derive(Debug, Clone)]
pub struct Explored {
    /// The exact distribution of the first `n_tokens` tokens.
    pub distribution: Distribution<Vec<u32>, Q>,
    /// Every budget the policies chose (`Chain(2)`, `Tree(3 nodes)`, `fallback Chain(1)`, …),
    /// to check that dynamic policies really moved.
    pub budgets: BTreeSet<String>,
}

/// One enumerated round: emitted tokens, the tree's parents, the accepted path.
type RoundResult = (Vec<u32>, Vec<Option<usize>>, Vec<usize>);

impl Composition {
    /// The target's own distribution of the next `n_tokens` tokens (the oracle's).
    ///
    /// # Errors
    /// The oracle's errors (an inexact temperature).
    pub fn target(&self) -> Result<Distribution<Vec<u32>, Q>> {
        target_distribution(&self.target, &self.params, &self.prompt, self.n_tokens)
    }

    /// The exact distribution under `primary` (and `fallback`, where the policy steps aside to
    /// it) with the policy prototype `policy`.
    ///
    /// # Errors
    /// Drafting, verification, enumeration (including two decisions of a step sharing a key)
    /// and policy errors; a drafter that exceeds its budget.
    pub fn exact(
        &self,
        primary: &mut Drafting<'_>,
        mut fallback: Option<&mut Drafting<'_>>,
        policy: &FallbackPolicy,
    ) -> Result<Explored> {
        let mut explored = Explored {
            distribution: Distribution::new(),
            budgets: BTreeSet::new(),
        };
        let mut stack: Vec<(Vec<u32>, Q, Vec<StepOutcome>)> =
            vec![(Vec::new(), num_traits::One::one(), Vec::new())];
        while let Some((generated, prob, history)) = stack.pop() {
            let mut now = policy.fork();
            for outcome in &history {
                now.next_budget();
                now.observe_measured(outcome, &StepTiming::default());
            }
            let (choice, budget) = now.next_budget();
            let label = match &budget {
                Budget::Tree(shape) => format!("Tree({} nodes)", shape.drafts()),
                other => format!("{other:?}"),
            };
            let (drafter, verifier): (&mut dyn Drafter<Q>, &PairedVerifier<Q>) =
                match (choice, fallback.as_deref_mut()) {
                    (DrafterChoice::Fallback, Some(drafting)) => {
                        explored.budgets.insert(format!("fallback {label}"));
                        (&mut *drafting.drafter, &drafting.verifier)
                    }
                    _ => {
                        explored.budgets.insert(label);
                        (&mut *primary.drafter, &primary.verifier)
                    }
                };
            let step = history.len() as u64;
            let branches =
                enumerate(|e| self.round(drafter, verifier, &budget, &generated, step, e))?;
            for ((emitted, parents, path), p) in branches.iter() {
                let mut next = generated.clone();
                next.extend(emitted);
                next.truncate(self.n_tokens);
                let mass = prob.clone() * p.clone();
                if next.len() >= self.n_tokens {
                    explored.distribution.add(next, mass);
                    continue;
                }
                let topology = TreeTopology::from_parents(parents)?;
                let mut longer = history.clone();
                longer.push(StepOutcome::from_verdict(&topology, path)?);
                stack.push((next, mass, longer));
            }
        }
        Ok(explored)
    }

    fn round(
        &self,
        drafter: &mut dyn Drafter<Q>,
        verifier: &PairedVerifier<Q>,
        budget: &Budget,
        generated: &[u32],
        step: u64,
        decisions: &mut dyn Decisions<Q>,
    ) -> Result<RoundResult> {
        let mut context = self.prompt.clone();
        context.extend_from_slice(generated);
        tell_features(drafter, &context)?;
        let request = DraftRequest {
            sequence: 0,
            step,
            context: &context,
            budget,
        };
        let tree: DraftTree<Q> = drafter.propose(&request, decisions)?;
        if tree.draft_count() > budget.max_drafts() {
            return Err(crate::AlgorithmError::Enumeration {
                reason: format!(
                    "{} drafted {} tokens for a budget of {}",
                    drafter.name(),
                    tree.draft_count(),
                    budget.max_drafts()
                ),
            });
        }
        let rows = (0..tree.len())
            .map(|node| {
                let mut ctx = context.clone();
                ctx.extend(
                    tree.topology().path_to(node)[1..]
                        .iter()
                        .map(|&n| tree.token(n)),
                );
                prepare_probs(&self.target.next_probs_as::<Q>(&ctx), &self.params)
            })
            .collect::<specdec_kernels::Result<Vec<_>>>()?;
        let input = VerifyInput {
            sequence: 0,
            step,
            tree: &tree,
            target_probs: &rows,
        };
        let verdict = verifier.verify(&input, decisions)?;
        Ok((
            verdict.emitted_tokens(&tree),
            tree.topology().parents().to_vec(),
            verdict.accepted_path,
        ))
    }
}

/// Tells a feature drafter the toy target's features of `context` as one admission: each
/// enumerated branch has its own context, so the drafter starts afresh every round (drafting
/// after incremental verdicts equals drafting afresh: `drafters::feature`'s tests).
fn tell_features(drafter: &mut dyn Drafter<Q>, context: &[u32]) -> Result<()> {
    if !drafter.wants_features() {
        return Ok(());
    }
    drafter.release(0)?;
    let committed = context.len() - 1;
    let features = toy_features(context, 0..committed);
    drafter.observe(&DraftFeedback {
        sequence: 0,
        context,
        prompt_len: 0,
        committed,
        accepted: 0,
        features: Some(&features),
    })
}
