//! The verifier entries: one file each, one line each in [`VERIFIERS`].
//!
//! A verifier entry is a parameter struct implementing [`VerifierKind`]: its name, aliases and
//! help ([`Kind`]) and [`VerifierKind::build`], which gives the [`Verifier`] for a drafter's
//! [`Pairing`] (the kind of trees it draws, at the run's temperature). The method builder binds
//! it to the drafter's kind ([`specdec_algorithms::verify::PairedVerifier`]), refusing a pair
//! that is not lossless by construction. A new algorithm is a [`Verifier`] implementation
//! (`specdec_algorithms::verify`, or a kernel method) plus an entry here.

mod auto;
mod kernel;
mod typical;

pub use auto::{auto_method, Auto};
pub use kernel::{ChainRejection, Greedy, MultiRound, RecursiveRejection, TargetOnly};
pub use typical::Typical;

use std::sync::Arc;

use specdec_algorithms::verify::Verifier;
use specdec_kernels::verification::DraftKind;

use super::spec::{Entry, Kind, Registered, Role};
use crate::error::{HarnessError, Result};

/// Every verifier, in the order `--help` lists them.
pub static VERIFIERS: &[&dyn VerifierEntry] = &[
    &Registered::<Auto>::ENTRY,
    &Registered::<Greedy>::ENTRY,
    &Registered::<ChainRejection>::ENTRY,
    &Registered::<MultiRound>::ENTRY,
    &Registered::<RecursiveRejection>::ENTRY,
    &Registered::<TargetOnly>::ENTRY,
    &Registered::<Typical>::ENTRY,
];

/// The verifier role of [`super::Spec`].
pub enum VerifierRole {}

impl Role for VerifierRole {
    const WHAT: &'static str = "verifier";
    type Entry = dyn VerifierEntry;
    fn entries() -> &'static [&'static dyn VerifierEntry] {
        VERIFIERS
    }
}

/// What a verifier is chosen for: the drafter's trees and the run's temperature.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Pairing {
    /// How the drafter's trees are drawn.
    pub kind: DraftKind,
    /// Whether they are chains.
    pub is_chain: bool,
    /// The sampling temperature (0 = greedy).
    pub temperature: f64,
}

/// A verifier's parameters: [`Kind`] plus how it is built.
pub trait VerifierKind: Kind {
    /// The verifier for `pairing` (the method builder checks that it pairs with the kind).
    ///
    /// # Errors
    /// Invalid parameters.
    fn build(&self, pairing: &Pairing) -> Result<Arc<dyn Verifier<f32>>>;
}

/// The object-safe face of a verifier entry (see [`VerifierKind`]).
pub trait VerifierEntry: Entry {
    /// Parses `params`, checks their values ([`Kind::check`]) and builds the verifier for
    /// `pairing`.
    ///
    /// # Errors
    /// The parse error, as [`VerifierKind::build`].
    fn build(&self, params: &toml::Table, pairing: &Pairing) -> Result<Arc<dyn Verifier<f32>>>;
}

impl<K: VerifierKind> VerifierEntry for Registered<K> {
    fn build(&self, params: &toml::Table, pairing: &Pairing) -> Result<Arc<dyn Verifier<f32>>> {
        let kind = Self::parse(params).map_err(HarnessError::InvalidEngine)?;
        kind.check().map_err(HarnessError::InvalidEngine)?;
        kind.build(pairing)
    }
}
