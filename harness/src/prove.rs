//! `specdec prove`: the exact proof matrix plus every drafter and policy of the method registry.
//!
//! The matrix of [`specdec_algorithms::proof::standard_cases`] proves the verifiers on toy
//! drafters. This module adds, for **every entry** of [`DRAFTERS`] and [`POLICIES`], exact
//! compositions ([`Composition`]) on a seeded toy pair, with the verifier the registry's `auto`
//! picks ([`auto_method`]) and the chain mode / tree fill the registry uses at the run's
//! temperature ([`chain_mode`], [`tree_fill`]):
//!
//! - each policy is **built by the registry** ([`crate::methods::PolicyEntry::build`], with the
//!   parameters of [`policy_params`] and a given cost model), then driven through the
//!   enumeration with a sampled chain and, where it takes trees, a tree drafter;
//! - each drafter entry is the same algorithm the registry builds, over rational toy draft
//!   models (the registry's own builders produce `f32` drafters over real models, which cannot
//!   be enumerated): chain, static tree (3 children at the root), dynamic tree, Sequoia tree,
//!   n-gram, staged (n-gram, sampled chain and sampled tree as level 0), layer skip (a chain over
//!   a second toy model standing for the target with blocks skipped) and EAGLE (the feature
//!   drafting pipeline over a toy feature head). Medusa's heads exist in `f32` only and have no
//!   exact row ([`NOT_ENUMERATED`]).
//!
//! An entry with no row here makes [`registry_cases`] fail, so a new registry entry cannot be
//! added without its proof.

use std::sync::Arc;
use std::time::Instant;

use specdec_algorithms::drafters::{
    ChainDrafter, DraftModel, Drafter, DynamicTreeDrafter, FeatureDraftModel, FnModel,
    HistoryDrafter, NgramConfig, NgramDrafter, ShapeDrafter, StagedDrafter, TreeFill,
};
use specdec_algorithms::policy::{CostCurve, CostModel, FallbackPolicy};
use specdec_algorithms::proof::matrix::describe_params;
use specdec_algorithms::proof::{
    render_table, run_case, standard_cases, Composition, Drafting, Expectation, ProofRow,
    ToyFeatureHead,
};
use specdec_algorithms::trees::{sequoia_tree, TreeShape};
use specdec_algorithms::verify::PairedVerifier;
use specdec_kernels::sampling::{prepare_probs, BigRational, SamplingParams};
use specdec_models::toy::{ToyModel, ToyPair, ToyStyle};

use crate::error::{HarnessError, Result};
use crate::methods::drafters::{
    chain_mode, confident_chain, tree_fill, SEQUOIA_ALPHAS, SEQUOIA_MAX_DEPTH,
};
use crate::methods::verifiers::auto_method;
use crate::methods::{Pairing, PolicyContext, PolicyCosts, DRAFTERS, POLICIES};

type Q = BigRational;

/// Registry drafters without an exact row, with the reason.
pub const NOT_ENUMERATED: &[(&str, &str)] = &[(
    "medusa",
    "Medusa heads exist in f32 only (no toy head of that kind)",
)];

/// The parameters each registry policy is proven with (a config's `policy = { kind, ... }`):
/// chains of K = 2 (so N = 3 reaches the bonus token), trees of 4 nodes (so the static tree's
/// three root children are all drafted).
pub fn policy_params(name: &str, is_chain: bool) -> Option<toml::Table> {
    let k = if is_chain { 2 } else { 4 };
    let text = match name {
        "fixed" => format!("k = {k}"),
        "aimd" => "k_min = 1\nk_max = 3\ndecrease = 0.5".into(),
        "pid" => "target_acceptance = 0.6\nk_min = 1\nk_max = 3".into(),
        "cost_optimal" => format!("k_max = {}\nprobe_every = 2", k + 1),
        "threshold" => format!("k = {k}\nmin_acceptance = 0.5\nprobe_every = 1"),
        _ => return None,
    };
    toml::from_str(&text).ok()
}

/// A toy model's rows prepared with `params`, as a rational draft model.
fn toy_model(toy: &ToyModel, params: SamplingParams) -> impl DraftModel<Q> + 'static {
    let toy = toy.clone();
    FnModel::new(toy.vocab(), move |ctx: &[u32]| {
        prepare_probs(&toy.next_probs_as::<Q>(ctx), &params).expect("toy rows prepare")
    })
}

/// The sampling a top-ranked drafter's `q` is prepared with: the run's, at T = 1 where the run
/// is greedy (as [`crate::methods::drafters::model_drafter_setup`] does).
fn ranked(params: SamplingParams) -> SamplingParams {
    match params.temperature == 0.0 {
        true => SamplingParams {
            temperature: 1.0,
            ..params
        },
        false => params,
    }
}

/// One drafter of a registry entry, ready for the enumeration.
struct ToyDrafting {
    label: String,
    drafter: Box<dyn Drafter<Q>>,
    is_chain: bool,
    shape: Option<TreeShape>,
}

fn drafting<D: Drafter<Q> + 'static>(
    label: &str,
    drafter: D,
    shape: Option<TreeShape>,
) -> ToyDrafting {
    ToyDrafting {
        label: label.to_string(),
        drafter: Box::new(drafter),
        is_chain: shape.is_none(),
        shape,
    }
}

/// The drafters of registry entry `name` over the toy pair (see the module docs); `None` for an
/// entry this module does not know.
fn toy_drafters(
    name: &str,
    pair: &ToyPair,
    params: SamplingParams,
) -> Result<Option<Vec<ToyDrafting>>> {
    let vocab = pair.draft.vocab();
    let draft = || toy_model(&pair.draft, params);
    let other_table = ToyModel::seeded(77, vocab, 1, ToyStyle::default())?;
    let other = || toy_model(&other_table, params);
    let head = ToyFeatureHead::new(
        ToyModel::seeded(48, vocab, 3, ToyStyle::default())?,
        vec![0, 2],
    );
    let ngram = || NgramDrafter::new(NgramConfig::default(), 16);
    let mode = chain_mode(&params);
    Ok(Some(match name {
        "plain" => vec![drafting("plain", crate::engine::NoDrafter, None)],
        "chain" => vec![
            drafting("chain", ChainDrafter::new(draft(), mode), None),
            drafting(
                "chain min_confidence=0.3",
                // as the registry builds it: at T = 0 the confidence reads the plain softmax
                confident_chain(toy_model(&pair.draft, ranked(params)), &params, Some(0.3))?,
                None,
            ),
        ],
        "tree" => {
            let shape = TreeShape::from_branching(&[3, 1]);
            vec![drafting(
                "tree [3, 1]",
                ShapeDrafter::new(draft(), tree_fill(&params), shape.clone()),
                Some(shape),
            )]
        }
        "dynamic_tree" => vec![drafting(
            "dynamic_tree nodes=3 top_k=2",
            DynamicTreeDrafter::new(draft(), 3, 2, 2)?,
            Some(TreeShape::chain(3)),
        )],
        "sequoia" => {
            let shape = sequoia_tree(&SEQUOIA_ALPHAS, 3, SEQUOIA_MAX_DEPTH)?.shape;
            vec![drafting(
                "sequoia nodes=3",
                ShapeDrafter::new(draft(), tree_fill(&params), shape.clone()),
                Some(shape),
            )]
        }
        "ngram" => vec![drafting("ngram", ngram()?, None)],
        "history" => {
            // two finished requests' text: the prompt's suffix `1 2 0 1` occurs in the first
            // only, so the first step drafts from the history
            let mut history =
                HistoryDrafter::new(NgramConfig::default(), 16, 64)?.with_spec_factor(Some(1.0))?;
            Drafter::<Q>::finished(&mut history, 0, &[1, 2, 0, 1, 2, 2, 0])?;
            Drafter::<Q>::finished(&mut history, 1, &[0, 2, 2, 1, 0, 0, 2])?;
            vec![drafting("history (two finished requests)", history, None)]
        }
        "staged" => vec![
            drafting(
                "staged ngram -> model",
                StagedDrafter::new(ngram()?, draft()),
                None,
            ),
            drafting(
                "staged chain -> model",
                StagedDrafter::new(ChainDrafter::new(other(), mode), draft()),
                None,
            ),
            drafting(
                "staged tree [2] -> model",
                StagedDrafter::new(
                    ShapeDrafter::new(
                        other(),
                        TreeFill::WithoutReplacement,
                        TreeShape::from_branching(&[2]),
                    ),
                    draft(),
                ),
                None,
            ),
        ],
        "layer_skip" => vec![drafting(
            "layer_skip (second toy model)",
            ChainDrafter::new(other(), mode),
            None,
        )],
        "eagle" => vec![
            drafting(
                "eagle chain (toy feature head)",
                ChainDrafter::new(FeatureDraftModel::new(head.clone()), mode),
                None,
            ),
            drafting(
                "eagle nodes=3 (toy feature head)",
                DynamicTreeDrafter::new(FeatureDraftModel::new(head), 3, 2, 2)?,
                Some(TreeShape::chain(3)),
            ),
        ],
        _ => return Ok(None),
    }))
}

/// One registry composition: a drafter of an entry under a policy built by the registry.
pub struct RegistryCase {
    /// What is composed: `drafter × policy`.
    pub label: String,
    /// The toy target and sampling.
    pub composition: Composition,
    drafter: ToyDrafting,
    verifier: PairedVerifier<Q>,
    policy: FallbackPolicy,
}

impl std::fmt::Debug for RegistryCase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegistryCase")
            .field("label", &self.label)
            .finish_non_exhaustive()
    }
}

impl RegistryCase {
    /// Enumerates the case and compares it with the target's own distribution.
    ///
    /// # Errors
    /// Enumeration errors (two decisions of a step sharing a key among them).
    pub fn run(&mut self) -> Result<ProofRow> {
        let start = Instant::now();
        let verifier_name = self.verifier.verifier().name();
        let mut primary = Drafting {
            drafter: self.drafter.drafter.as_mut(),
            verifier: self.verifier.clone(),
        };
        let explored = self.composition.exact(&mut primary, None, &self.policy)?;
        let target = self.composition.target()?;
        let total_variation = explored.distribution.total_variation(&target);
        let worst = explored
            .distribution
            .worst_outcome(&target)
            .map(|(outcome, a, b)| (outcome.clone(), a, b));
        let c = &self.composition;
        Ok(ProofRow {
            verifier: verifier_name,
            tree: self.label.clone(),
            size: format!(
                "V={} order={} N={} {}",
                c.target.vocab(),
                c.target.order(),
                c.n_tokens,
                describe_params(&c.params)
            ),
            total_variation,
            expectation: Expectation::Lossless,
            worst,
            elapsed: start.elapsed(),
        })
    }
}

/// The sampling settings registry compositions run at: T = 1, T = 1/2 with top-k 2 and
/// top-p 7/8, and T = 0 (argmax chains, top-ranked trees, greedy verification).
fn registry_params() -> [SamplingParams; 3] {
    [
        SamplingParams::default(),
        SamplingParams::greedy(),
        SamplingParams {
            temperature: 0.5,
            top_k: Some(2),
            top_p: Some(0.875),
            min_p: None,
        },
    ]
}

fn policy_for(
    name: &str,
    drafter: &ToyDrafting,
    costs: &CostModel,
) -> Result<Option<FallbackPolicy>> {
    let entry = POLICIES
        .iter()
        .find(|e| e.name() == name)
        .ok_or_else(|| HarnessError::InvalidEngine(format!("no policy `{name}`")))?;
    let params = policy_params(name, drafter.is_chain).ok_or_else(|| {
        HarnessError::InvalidEngine(format!(
            "registry policy `{name}` has no exact proof row: add its parameters to \
             harness::prove::policy_params"
        ))
    })?;
    let ctx = PolicyContext {
        method: "prove",
        drafter: &drafter.label,
        is_chain: drafter.is_chain,
        shape: drafter.shape.as_ref(),
        costs: PolicyCosts::Given(costs),
    };
    match entry.build(&params, &ctx) {
        Ok(policy) => Ok(Some(FallbackPolicy::new(policy, None))),
        // A chain-only policy refuses a tree drafter: no composition to prove.
        Err(_) if !drafter.is_chain => Ok(None),
        Err(e) => Err(e),
    }
}

/// Every registry composition `prove` enumerates: every drafter entry under `fixed`, and every
/// policy entry with the sampled chain and the static tree drafter (where it takes trees), at
/// each of [`registry_params`].
///
/// # Errors
/// A registry entry without a row (see the module docs); construction errors.
pub fn registry_cases() -> Result<Vec<RegistryCase>> {
    let pair = ToyPair::seeded(31, 3, 1, ToyStyle::default())?;
    let costs = CostModel::new(CostCurve::linear(0.2)?, 0.1, 0.0)?;
    let mut cases = Vec::new();
    for params in registry_params() {
        let composition = Composition {
            target: pair.target.clone(),
            params,
            prompt: vec![0, 1, 2, 0, 1],
            n_tokens: 3,
        };
        let mut push = |drafter: ToyDrafting, policy_name: &str| -> Result<()> {
            let Some(policy) = policy_for(policy_name, &drafter, &costs)? else {
                return Ok(());
            };
            let pairing = Pairing {
                kind: drafter.drafter.kind(),
                is_chain: drafter.is_chain,
                temperature: params.temperature,
            };
            let verifier = PairedVerifier::new(Arc::new(auto_method(&pairing)), pairing.kind)?;
            cases.push(RegistryCase {
                label: format!("{} × {}", drafter.label, policy.name()),
                composition: composition.clone(),
                drafter,
                verifier,
                policy,
            });
            Ok(())
        };
        for entry in DRAFTERS {
            let name = entry.name();
            if NOT_ENUMERATED.iter().any(|(n, _)| *n == name) {
                continue;
            }
            let drafters = toy_drafters(name, &pair, params)?.ok_or_else(|| {
                HarnessError::InvalidEngine(format!(
                    "registry drafter `{name}` has no exact proof row: add it to \
                     harness::prove::toy_drafters"
                ))
            })?;
            for drafter in drafters {
                push(drafter, "fixed")?;
            }
        }
        for entry in POLICIES {
            for drafter in ["chain", "tree"] {
                for d in toy_drafters(drafter, &pair, params)?.unwrap_or_default() {
                    push(d, entry.name())?;
                }
            }
        }
    }
    Ok(cases)
}

/// Runs the standard matrix and the registry compositions and writes one table; returns the
/// rows.
///
/// # Errors
/// Enumeration errors, a registry entry without a row, write errors.
pub fn prove(out: &mut dyn std::io::Write) -> Result<Vec<ProofRow>> {
    let mut rows = standard_cases()?
        .iter()
        .map(run_case)
        .collect::<specdec_algorithms::Result<Vec<_>>>()?;
    let matrix_rows = rows.len();
    for mut case in registry_cases()? {
        rows.push(case.run()?);
    }
    let failed = rows.iter().filter(|r| !r.passed()).count();
    let skipped: Vec<String> = NOT_ENUMERATED
        .iter()
        .map(|(name, why)| format!("{name} ({why})"))
        .collect();
    let text = format!(
        "Exact enumeration: distribution of the next N tokens through draft -> verify -> bonus -> \
         next round,\ncompared with the target's own distribution (rational arithmetic; the \
         production decision rules\nintegrated over the uniform; the target's reference from an \
         independent oracle).\n{matrix_rows} matrix rows, then {} registry compositions (every \
         drafter and policy entry; not enumerated: {}).\n\n{}\n{} rows, {} failed.\n",
        rows.len() - matrix_rows,
        skipped.join(", "),
        render_table(&rows),
        rows.len(),
        failed
    );
    out.write_all(text.as_bytes())
        .map_err(|e| HarnessError::InvalidEngine(format!("writing the proof table: {e}")))?;
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_registry_entry_has_a_proof_row_or_a_reason() {
        let cases = registry_cases().unwrap();
        for entry in DRAFTERS {
            let name = entry.name();
            let covered = cases.iter().any(|c| c.label.starts_with(name))
                || NOT_ENUMERATED.iter().any(|(n, _)| *n == name);
            assert!(covered, "drafter {name}");
        }
        for entry in POLICIES {
            assert!(
                policy_params(entry.name(), true).is_some(),
                "policy {}",
                entry.name()
            );
        }
        let tree_policies = cases.iter().filter(|c| c.label.starts_with("tree")).count();
        assert!(tree_policies >= 2, "some policies take trees");
    }

    #[test]
    fn registry_compositions_are_lossless() {
        for mut case in registry_cases().unwrap() {
            let row = case.run().unwrap();
            assert!(
                specdec_kernels::sampling::Prob::is_zero(&row.total_variation),
                "{}: {}",
                row.tree,
                row.total_variation
            );
        }
    }
}
