//! Drafters: what proposes the draft tree a verifier checks.
//!
//! A [`Drafter`] turns a sequence's context (prompt + output so far; its last token is the tree's
//! root) and a [`Budget`] into a [`DraftTree`]: tokens at every node, the draft distribution `q`
//! at every expanded node, and the [`DraftKind`] saying how children were drawn (the pairing rule
//! matches it with the verifiers that are lossless for it). All randomness goes through a
//! [`Decisions`] (keys: the request's sequence and step, the new node's index,
//! [`Purpose::Draft`]), so drafters are proven by the exact enumerator and replayed in production
//! unchanged.
//!
//! Drafters here:
//! - [`ChainDrafter`]: K tokens from a [`DraftModel`], sampled from `q` or argmax;
//! - [`ShapeDrafter`]: fills a tree shape (static "choices", k-ary top-k expansion, Sequoia) from
//!   a draft model — top-ranked tokens, or children sampled i.i.d. or without replacement;
//! - [`DynamicTreeDrafter`]: EAGLE-2-style dynamic tree (expand by cumulative draft probability,
//!   keep the best N nodes);
//! - [`NgramDrafter`]: prompt lookup ([`ngram`]), deterministic;
//! - [`HistoryDrafter`]: prompt lookup over the context and finished sequences ([`history`]),
//!   deterministic;
//! - [`StagedDrafter`]: multi-level speculation — level 0 proposes, level 1 verifies it losslessly
//!   against its own `q1` and extends it by sampling from `q1`; the result is a chain drawn from
//!   `q1` for the target to verify.
//!
//! # Adding a drafter
//!
//! A drafter implements three methods. This one always proposes the same token `k` times, a
//! deterministic chain (no `q` needed: deterministic drafts pair with greedy or target-only
//! verification):
//!
//! ```
//! use specdec_algorithms::drafters::{DraftRequest, Drafter, TreeBuilder};
//! use specdec_algorithms::policy::Budget;
//! use specdec_kernels::sampling::Decisions;
//! use specdec_kernels::verification::{DraftKind, DraftTree};
//!
//! struct Repeat { token: u32 }
//!
//! impl Drafter<f64> for Repeat {
//!     fn name(&self) -> String { format!("repeat({})", self.token) }
//!     fn kind(&self) -> DraftKind { DraftKind::Deterministic }
//!     fn propose(
//!         &mut self,
//!         request: &DraftRequest<'_>,
//!         _decisions: &mut dyn Decisions<f64>,
//!     ) -> specdec_algorithms::Result<DraftTree<f64>> {
//!         let mut tree = TreeBuilder::new(request.root()?);
//!         let mut node = 0;
//!         for _ in 0..request.budget.max_drafts() {
//!             node = tree.push(node, self.token);
//!         }
//!         tree.finish(self.kind())
//!     }
//! }
//!
//! let context = [4, 2];
//! let request = DraftRequest { sequence: 0, step: 0, context: &context, budget: &Budget::Chain(3) };
//! let mut decisions = specdec_kernels::sampling::Replay::production(1);
//! let tree = Repeat { token: 7 }.propose(&request, &mut decisions).unwrap();
//! assert_eq!(tree.tokens(), &[2, 7, 7, 7]);
//! assert!(tree.topology().is_chain());
//! ```

/// The [`Drafter`] feedback methods of a drafter over one [`DraftModel`] in field `$model`:
/// forwarded to the model, which keeps whatever per-sequence state there is.
macro_rules! feedback_to_model {
    ($model:ident) => {
        fn wants_features(&self) -> bool {
            $crate::drafters::DraftModel::<N>::wants_features(&self.$model)
        }

        fn observe(
            &mut self,
            feedback: &$crate::drafters::DraftFeedback<'_>,
        ) -> $crate::error::Result<()> {
            $crate::drafters::DraftModel::<N>::observe(&mut self.$model, feedback)
        }

        fn release(&mut self, sequence: u64) -> $crate::error::Result<()> {
            $crate::drafters::DraftModel::<N>::release(&mut self.$model, sequence)
        }
    };
}

mod builder;
mod chain;
mod dynamic;
pub mod feature;
mod heads;
pub mod history;
mod model;
pub mod ngram;
mod shaped;
mod staged;

pub use builder::TreeBuilder;
pub use chain::{ChainDrafter, ChainMode};
pub use dynamic::DynamicTreeDrafter;
pub use feature::{FeatureDraftModel, FeatureHead, FeatureOutput};
pub use heads::{EagleFeatureHead, MedusaDraftModel};
pub use history::{HistoryDrafter, TokenHistory};
pub use model::{
    check_along, check_distinct, ranked_tokens, DraftModel, FnModel, Namespaced, PathsQuery,
};
pub use ngram::{
    find_matches, merge_continuations, ngram_chain, ngram_tree, NgramConfig, NgramDrafter,
    NgramMatch, TokenTree,
};
pub use shaped::{ShapeDrafter, TreeFill};
pub use staged::{StagedDrafter, LEVEL0_NAMESPACE, LEVEL1_NAMESPACE};

use specdec_kernels::sampling::Decisions;
#[allow(unused_imports)] // named in the module docs
use specdec_kernels::sampling::Purpose;
use specdec_kernels::verification::{DraftKind, DraftTree};
use specdec_models::Features;

use crate::error::{ensure_param, Result};
use crate::policy::Budget;

/// One drafting call: whose draft, which step, the context and the budget.
#[derive(Debug, Clone, Copy)]
pub struct DraftRequest<'a> {
    /// Stable sequence id: keys the drafter's random decisions.
    pub sequence: u64,
    /// The sequence's decoding step: keys this round's decisions.
    pub step: u64,
    /// Prompt + output so far, non-empty; the last token is the draft tree's root.
    pub context: &'a [u32],
    /// How much to draft. [`Budget::Plain`] gives a root-only tree.
    pub budget: &'a Budget,
}

impl DraftRequest<'_> {
    /// The root token (the context's last token).
    ///
    /// # Errors
    /// [`crate::AlgorithmError::InvalidParameter`] if the context is empty.
    pub fn root(&self) -> Result<u32> {
        ensure_param(
            !self.context.is_empty(),
            "context",
            "drafting needs at least one context token",
        )?;
        Ok(self.context[self.context.len() - 1])
    }
}

/// What a drafter (and its draft model) is told about a sequence after the target has spoken:
/// after its prompt is admitted, and after every step (whichever drafter drafted it, or none).
///
/// Invariant: the target's KV cache holds `context[..committed]`, `committed = context.len() -
/// 1`; the last token is the next step's root. The drafted path a drafter forwarded agrees with
/// `context` on its first `committed` tokens at most, so a draft model keeping the K/V of
/// `context[..committed]` (and dropping the rest) needs no prefix comparison.
#[derive(Debug, Clone, Copy)]
pub struct DraftFeedback<'a> {
    /// The sequence ([`DraftRequest::sequence`]).
    pub sequence: u64,
    /// Prompt + output after the step; the last token is the new root.
    pub context: &'a [u32],
    /// Tokens of `context` that are the request's prompt: the generated history, which the
    /// repetition / frequency / presence penalties count, is `context[prompt_len..]`.
    pub prompt_len: usize,
    /// Tokens of `context` in the target's KV cache (`context.len() - 1`).
    pub committed: usize,
    /// Drafts the verifier accepted this step (0 at admission and on plain steps).
    pub accepted: usize,
    /// When the drafter [`Drafter::wants_features`]: the target's features of the tokens that
    /// entered its KV cache with this feedback, `context[committed - rows..committed]` (the
    /// prompt but its last token at admission; the old root and the accepted drafts after a
    /// step). `None` otherwise.
    pub features: Option<&'a Features>,
}

/// Proposes a draft tree for one sequence within a budget (see the module docs for an example).
///
/// Contract: the returned tree's root token is the context's last token; it has at most
/// `budget.max_drafts()` draft nodes (a [`Budget::Tree`] shape is followed where the drafter
/// fills shapes, else its node count is the limit); `q` is recorded at every expanded node
/// unless the kind is [`DraftKind::Deterministic`]; the tree's kind is [`Drafter::kind`].
/// The engine tells the drafter each sequence's verdicts ([`Drafter::observe`]) and retirement
/// ([`Drafter::release`]); a stateless drafter ignores both.
pub trait Drafter<N> {
    /// A short name with the configuration, for reports.
    fn name(&self) -> String;
    /// How this drafter's trees are drawn (what verifiers it pairs with).
    fn kind(&self) -> DraftKind;
    /// Proposes the draft tree for `request`, drawing randomness only from `decisions`.
    ///
    /// # Errors
    /// An empty context, a draft model error, or a malformed model distribution.
    fn propose(
        &mut self,
        request: &DraftRequest<'_>,
        decisions: &mut dyn Decisions<N>,
    ) -> Result<DraftTree<N>>;

    /// Proposes the draft trees of several sequences at once (a batch's step): tree `i` is the
    /// one `propose(&requests[i], ..)` gives, so batching never changes a draft. Drafters over a
    /// model that forwards many sequences in one pass override it to draft depth by depth for
    /// the whole batch ([`DraftModel::next_probs_batch`]); the default proposes one request
    /// after another.
    ///
    /// # Errors
    /// As [`Drafter::propose`]; a sequence appearing twice ([`check_distinct`]).
    fn propose_batch(
        &mut self,
        requests: &[DraftRequest<'_>],
        decisions: &mut dyn Decisions<N>,
    ) -> Result<Vec<DraftTree<N>>> {
        check_distinct(requests.iter().map(|r| r.sequence))?;
        requests
            .iter()
            .map(|request| self.propose(request, decisions))
            .collect()
    }

    /// Whether this drafter reads the target's hidden features ([`DraftFeedback::features`]);
    /// the engine then hands them over (the target must tap them).
    fn wants_features(&self) -> bool {
        false
    }

    /// The sequence's state after admission or a step (see [`DraftFeedback`]). Default: ignore.
    ///
    /// # Errors
    /// A draft model's errors (e.g. rewinding its KV cache).
    fn observe(&mut self, feedback: &DraftFeedback<'_>) -> Result<()> {
        let _ = feedback;
        Ok(())
    }

    /// The sequence finished (or was cancelled) with `context`, its prompt and output, as its
    /// final text; [`Drafter::release`] follows. Drafters that learn from finished text (the
    /// history drafter) read it here. Default: ignore.
    ///
    /// # Errors
    /// The drafter's errors.
    fn finished(&mut self, sequence: u64, context: &[u32]) -> Result<()> {
        let _ = (sequence, context);
        Ok(())
    }

    /// The sequence retired: drop whatever is kept for it. Default: nothing kept.
    ///
    /// # Errors
    /// A draft model's errors (e.g. freeing its KV cache).
    fn release(&mut self, sequence: u64) -> Result<()> {
        let _ = sequence;
        Ok(())
    }
}

/// [`Drafter::propose`] of a drafter that drafts batches depth by depth: its
/// [`Drafter::propose_batch`] of the one request, so a request drafts the same tree alone and
/// in a batch.
///
/// # Errors
/// As the drafter's `propose_batch`.
pub(crate) fn propose_alone<N, D: Drafter<N> + ?Sized>(
    drafter: &mut D,
    request: &DraftRequest<'_>,
    decisions: &mut dyn Decisions<N>,
) -> Result<DraftTree<N>> {
    let mut trees = drafter.propose_batch(std::slice::from_ref(request), decisions)?;
    Ok(trees.pop().expect("one tree per request"))
}

#[cfg(test)]
mod tests;
