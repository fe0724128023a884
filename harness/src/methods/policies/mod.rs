//! The speculation-policy entries: one file each, one line each in [`POLICIES`].
//!
//! A policy entry is a parameter struct implementing [`PolicyKind`]: its name, aliases and help
//! ([`Kind`]) and [`PolicyKind::build`], which gives the [`SpeculationPolicy`] (a prototype,
//! forked per request) for the method's drafter and the costs the backend knows
//! ([`PolicyContext`]). For a chain drafter the policy's K is the chain length; for a tree
//! drafter it is a node budget within the drafter's tree ([`budget_of`]).

mod aimd;
mod cost_optimal;
mod fixed;
mod pid;
mod threshold;

pub use aimd::Aimd;
pub use cost_optimal::CostOptimal;
pub use fixed::Fixed;
pub use pid::Pid;
pub use threshold::Threshold;

use std::sync::Arc;

use specdec_algorithms::policy::{Budget, CostModel, SpeculationPolicy};
use specdec_algorithms::trees::TreeShape;

use super::spec::{Entry, Kind, Registered, Role};
use crate::error::{HarnessError, Result};

/// Every policy, in the order `--help` lists them.
pub static POLICIES: &[&dyn PolicyEntry] = &[
    &Registered::<Fixed>::ENTRY,
    &Registered::<Aimd>::ENTRY,
    &Registered::<Pid>::ENTRY,
    &Registered::<CostOptimal>::ENTRY,
    &Registered::<Threshold>::ENTRY,
];

/// The policy role of [`super::Spec`].
pub enum PolicyRole {}

impl Role for PolicyRole {
    const WHAT: &'static str = "policy";
    type Entry = dyn PolicyEntry;
    fn entries() -> &'static [&'static dyn PolicyEntry] {
        POLICIES
    }
}

/// What costs a backend knows for the cost-model policy.
#[derive(Debug, Clone, Copy)]
pub enum PolicyCosts<'a> {
    /// None (the toy backend): `cost_optimal` is refused.
    Unknown,
    /// A given cost model, relative to one plain step (the simulation's).
    Given(&'a CostModel),
    /// Costs measured while decoding (the engine), with priors timed at set-up: one draft pass
    /// (seconds) and the target's relative forward costs `t(n) / t(1)`.
    Measured {
        /// Seconds of one draft pass.
        draft_pass_s: Option<f64>,
        /// `(n, t(n) / t(1))`, sizes ascending from 1.
        verify_curve: Option<&'a [(usize, f64)]>,
    },
}

/// What a policy is built for.
#[derive(Debug, Clone, Copy)]
pub struct PolicyContext<'a> {
    /// The method's name (for messages).
    pub method: &'a str,
    /// The drafter's kind (for messages).
    pub drafter: &'a str,
    /// Whether the drafter drafts chains (else trees).
    pub is_chain: bool,
    /// The drafter's largest tree, for tree drafters.
    pub shape: Option<&'a TreeShape>,
    /// The costs the backend knows.
    pub costs: PolicyCosts<'a>,
}

impl PolicyContext<'_> {
    /// A context for checking a policy's parameters alone: a chain drafter, no costs.
    pub fn for_check() -> PolicyContext<'static> {
        PolicyContext {
            method: "",
            drafter: "chain",
            is_chain: true,
            shape: None,
            costs: PolicyCosts::Unknown,
        }
    }

    /// The budget of `k` drafts for this drafter: a chain of `k`, or up to `k` tree nodes
    /// (the whole tree when `k` covers it).
    pub fn budget_of(&self, k: usize) -> Budget {
        budget_of(k, self.is_chain, self.shape)
    }
}

/// The budget of `k` for a drafter: a chain of `k`, or up to `k` tree nodes (within `shape`).
pub fn budget_of(k: usize, is_chain: bool, shape: Option<&TreeShape>) -> Budget {
    match (is_chain, shape) {
        (true, _) => Budget::chain(k),
        (false, Some(shape)) if k >= shape.drafts() => Budget::Tree(Arc::new(shape.clone())),
        (false, _) if k == 0 => Budget::Plain,
        (false, _) => Budget::TreeNodes(k),
    }
}

/// A policy's parameters: [`Kind`] plus how it is built.
pub trait PolicyKind: Kind {
    /// Checks the parameters against the drafter (chain or tree).
    ///
    /// # Errors
    /// What is wrong, naming the parameter.
    fn check_for(&self, is_chain: bool, drafter: &str) -> std::result::Result<(), String> {
        let _ = (is_chain, drafter);
        Ok(())
    }
    /// Whether it prices draft passes (the method builder times one).
    fn prices_drafts(&self) -> bool {
        false
    }
    /// The longest target pass it may ask for, when it wants the target's verify-cost curve up
    /// to there.
    fn verify_tokens(&self) -> Option<usize> {
        None
    }
    /// The policy prototype.
    ///
    /// # Errors
    /// Invalid parameters, a drafter it cannot steer, costs it needs and the backend lacks.
    fn build(&self, ctx: &PolicyContext<'_>) -> Result<Box<dyn SpeculationPolicy>>;
}

/// The object-safe face of a policy entry (see [`PolicyKind`]).
pub trait PolicyEntry: Entry {
    /// [`PolicyKind::check_for`] of `params`.
    ///
    /// # Errors
    /// The parse error, or what is wrong.
    fn check_for(
        &self,
        params: &toml::Table,
        is_chain: bool,
        drafter: &str,
    ) -> std::result::Result<(), String>;
    /// [`PolicyKind::prices_drafts`] of `params`.
    fn prices_drafts(&self, params: &toml::Table) -> bool;
    /// [`PolicyKind::verify_tokens`] of `params`.
    fn verify_tokens(&self, params: &toml::Table) -> Option<usize>;
    /// Parses `params`, checks their values ([`Kind::check`]) and builds the policy.
    ///
    /// # Errors
    /// The parse error, as [`PolicyKind::build`].
    fn build(
        &self,
        params: &toml::Table,
        ctx: &PolicyContext<'_>,
    ) -> Result<Box<dyn SpeculationPolicy>>;
}

impl<K: PolicyKind> PolicyEntry for Registered<K> {
    fn check_for(
        &self,
        params: &toml::Table,
        is_chain: bool,
        drafter: &str,
    ) -> std::result::Result<(), String> {
        Self::parse(params)?.check_for(is_chain, drafter)
    }
    fn prices_drafts(&self, params: &toml::Table) -> bool {
        Self::parse(params).is_ok_and(|k| k.prices_drafts())
    }
    fn verify_tokens(&self, params: &toml::Table) -> Option<usize> {
        Self::parse(params).ok()?.verify_tokens()
    }
    fn build(
        &self,
        params: &toml::Table,
        ctx: &PolicyContext<'_>,
    ) -> Result<Box<dyn SpeculationPolicy>> {
        let kind = Self::parse(params).map_err(HarnessError::InvalidEngine)?;
        kind.check().map_err(HarnessError::InvalidEngine)?;
        kind.build(ctx)
    }
}

/// [`Kind::check`] for policies whose parameters the algorithms crate checks when it builds
/// them: build one for a chain drafter and report its error.
fn check_by_building<K: PolicyKind>(kind: &K) -> std::result::Result<(), String> {
    kind.build(&PolicyContext::for_check())
        .map(|_| ())
        .map_err(|e| e.to_string())
}

/// The most plain steps a policy waits between probes (`probe_every`): 1,000,000. Past it a
/// gated policy never probes within any run, and the cost-model policy's back-off (16 ×
/// `probe_every`) stays far from overflow.
pub const MAX_PROBE_EVERY: usize = 1_000_000;

/// Checks a policy's `probe_every` against [`MAX_PROBE_EVERY`].
///
/// # Errors
/// The message names `field`, its value and the limit.
fn check_probe_every(field: &str, probe_every: usize) -> std::result::Result<(), String> {
    if probe_every > MAX_PROBE_EVERY {
        return Err(format!(
            "{field} = {probe_every} is over the limit of {MAX_PROBE_EVERY} steps"
        ));
    }
    Ok(())
}

/// The error of a chain-length policy asked to steer a tree drafter.
fn chains_only(ctx: &PolicyContext<'_>, policy: &str) -> HarnessError {
    HarnessError::InvalidEngine(format!(
        "method `{}`: the {policy} policy steers a chain length; drafter `{}` drafts trees (use \
         fixed, threshold or cost_optimal)",
        ctx.method, ctx.drafter
    ))
}
