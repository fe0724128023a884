//! # The method registry: one home for drafters, verifiers and policies
//!
//! A *method* is a drafter, a verifier and a speculation policy (and optionally a fallback
//! drafter with its own verifier and policy). Each of the three is an **entry** of this
//! registry: one file holding a parameter struct (what a config writes after `kind`), its name,
//! aliases and help, and how it is built — plus one line in [`DRAFTERS`], [`VERIFIERS`] or
//! [`POLICIES`]. Experiment configs (`drafter = { kind = "tree", branching = [3, 2, 1] }`),
//! `specdec generate --method`, and the toy, simulation and engine backends all build from here
//! ([`build_method`], [`method_policy`]); nothing else maps names to objects.
//!
//! | role | entries (aliases) |
//! |---|---|
//! | drafter | `plain` (none, baseline), `chain` (linear), `tree` (static_tree), `dynamic_tree`, `sequoia`, `ngram` (prompt_lookup), `staged` (multi_level), `layer_skip` (self_draft) |
//! | verifier | `auto`, `greedy`, `chain_rejection` (rejection), `multi_round` (specinfer), `recursive_rejection` (without_replacement, recursive), `target_only`, `typical` |
//! | policy | `fixed`, `aimd`, `pid`, `cost_optimal` (cost_model), `threshold` (gate) |
//!
//! Names are matched case-blind with `-` and `_` alike; config validation rewrites aliases to
//! the canonical name.
//!
//! ## Adding a drafter
//!
//! 1. `methods/drafters/my_drafter.rs`: a `#[derive(Serialize, Deserialize)]
//!    #[serde(deny_unknown_fields)]` struct of its parameters implementing [`Kind`] (name,
//!    aliases, one line of help, a value check) and [`DrafterKind`] (chain or tree, whether it
//!    needs the run's draft model, `build`: the [`specdec_algorithms::drafters::Drafter`] from
//!    what the backend lends through [`DraftContext`]; [`model_drafter_setup`] does the common
//!    set-up of a drafter over a draft model);
//! 2. one line in [`DRAFTERS`] (and its `mod` / `pub use` in `drafters/mod.rs`).
//!
//! Verifiers ([`VerifierKind`]) and policies ([`PolicyKind`]) are added the same way.

mod build;
pub mod drafters;
pub mod limits;
pub mod policies;
mod spec;
pub mod verifiers;

pub use build::{build_method, method_policy, validate_method, BuiltMethod, MethodProblem};
pub use drafters::{
    model_drafter_setup, BuiltDrafter, DeviceModel, DraftContext, DraftSetup, DrafterEntry,
    DrafterKind, DrafterRole, DRAFTERS,
};
pub use policies::{PolicyContext, PolicyCosts, PolicyEntry, PolicyKind, PolicyRole, POLICIES};
pub use spec::{
    lookup, names_with_aliases, normalise, Entry, Kind, Registered, Role, Spec, SpecError,
};
pub use verifiers::{Pairing, VerifierEntry, VerifierKind, VerifierRole, VERIFIERS};

/// Every entry's parameter type, for code that writes methods (`DrafterConfig::of(Tree {
/// branching: vec![3, 2, 1] })`).
pub mod kinds {
    pub use super::drafters::{
        Chain, DynamicTree, History, LayerSkip, Ngram, Plain, Sequoia, Staged, Tree,
    };
    pub use super::policies::{Aimd, CostOptimal, Fixed, Pid, Threshold};
    pub use super::verifiers::{
        Auto, ChainRejection, Greedy, MultiRound, RecursiveRejection, TargetOnly, Typical,
    };
}

/// A method's drafter as written in a config: `{ kind = "...", ... }` ([`DRAFTERS`]).
pub type DrafterConfig = Spec<DrafterRole>;
/// A method's verifier as written in a config ([`VERIFIERS`]; default `auto`).
pub type VerifierConfig = Spec<VerifierRole>;
/// A method's policy as written in a config ([`POLICIES`]).
pub type PolicyConfig = Spec<PolicyRole>;

impl Default for Spec<VerifierRole> {
    /// `auto`.
    fn default() -> Self {
        Spec::of(verifiers::Auto {})
    }
}

/// Every entry of every role with its aliases and help, one per line (for `--help` and the
/// docs).
pub fn registry_help() -> String {
    fn section<R: Role>(out: &mut String) {
        out.push_str(&format!("{}s:\n", R::WHAT));
        for e in R::entries() {
            let aliases = match e.aliases() {
                [] => String::new(),
                a => format!(" (also {})", a.join(", ")),
            };
            out.push_str(&format!("  {}{aliases}: {}\n", e.name(), e.summary()));
        }
    }
    let mut out = String::new();
    section::<DrafterRole>(&mut out);
    section::<VerifierRole>(&mut out);
    section::<PolicyRole>(&mut out);
    out
}
