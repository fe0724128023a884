//! One method configuration: a drafter, a verifier and a speculation policy, each an entry of
//! the method registry ([`crate::methods`]).

use serde::{Deserialize, Serialize};

use crate::methods::drafters::Plain;
use crate::methods::policies::CostOptimal;
pub use crate::methods::{DrafterConfig, PolicyConfig, VerifierConfig};

/// One `[[methods]]` entry. `name` labels its rows in every table and plot and must be unique.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MethodConfig {
    /// Unique label of this configuration.
    pub name: String,
    /// How drafts are proposed (`kind = "plain"` is plain decoding, the baseline).
    pub drafter: DrafterConfig,
    /// How drafts are verified; `auto` (the default) is greedy at temperature 0 and, above, the
    /// lossless sampler for the drafter's trees.
    #[serde(default)]
    pub verifier: VerifierConfig,
    /// How the draft budget is chosen each step; required for every drafter but `none`.
    #[serde(default)]
    pub policy: Option<PolicyConfig>,
    /// Model drafters only: the draft model's LM head computes the logits of `draft_vocab`
    /// token ids alone, so its distribution `q` is zero outside them (exact verification is
    /// unaffected): the ids `0..draft_vocab`, or the first `draft_vocab` of
    /// `draft_vocab_ranking`. Byte-level BPE ids follow merge order, so low ids are frequent
    /// tokens: e.g. 32768 of Qwen2.5's 151936 cuts the LM head, 27% of the 0.5B draft's
    /// weights, to a fifth. Absent: the whole vocabulary.
    #[serde(default)]
    pub draft_vocab: Option<usize>,
    /// With `draft_vocab`: a vocabulary ranking file (`specdec rank-vocab`: ids by their
    /// frequency in data, most frequent first) whose first `draft_vocab` ids the LM head keeps
    /// instead of the lowest ids (FR-Spec). Absent: the lowest ids.
    #[serde(default)]
    pub draft_vocab_ranking: Option<std::path::PathBuf>,
    /// A second drafter that drafts on the steps where `policy` chooses plain decoding and its
    /// own policy does not, e.g. free n-gram lookup behind a model drafter under the cost-model
    /// policy. Each step is verified with the verifier paired with the drafter that drafted it,
    /// so the method stays lossless. Absent: none.
    #[serde(default)]
    pub fallback: Option<FallbackConfig>,
}

/// A method's fallback drafter (`fallback = { drafter = { kind = "ngram", n = 3 }, policy = {
/// kind = "cost_optimal", k_max = 8 } }`): its drafter, verifier (default `auto`) and policy,
/// as for a method. The fallback of a fallback is not supported.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FallbackConfig {
    /// How the fallback drafts (not `none`).
    pub drafter: DrafterConfig,
    /// How its drafts are verified.
    #[serde(default)]
    pub verifier: VerifierConfig,
    /// How its budget is chosen.
    pub policy: PolicyConfig,
}

impl MethodConfig {
    /// A method named `name`: `drafter` under `policy`, the `auto` verifier, the whole
    /// vocabulary.
    pub fn new(
        name: impl Into<String>,
        drafter: DrafterConfig,
        policy: Option<PolicyConfig>,
    ) -> Self {
        MethodConfig {
            name: name.into(),
            drafter,
            verifier: VerifierConfig::default(),
            policy,
            draft_vocab: None,
            draft_vocab_ranking: None,
            fallback: None,
        }
    }

    /// The method its fallback drafter forms on its own (named `<name>/fallback`), if any.
    pub fn fallback_method(&self) -> Option<MethodConfig> {
        let fallback = self.fallback.as_ref()?;
        Some(MethodConfig {
            verifier: fallback.verifier.clone(),
            ..MethodConfig::new(
                format!("{}/fallback", self.name),
                fallback.drafter.clone(),
                Some(fallback.policy.clone()),
            )
        })
    }

    /// The plain-decoding baseline method, named `baseline`.
    pub fn baseline() -> MethodConfig {
        MethodConfig::new("baseline", DrafterConfig::of(Plain {}), None)
    }

    /// Whether this is plain decoding (no drafts).
    pub fn is_baseline(&self) -> bool {
        self.drafter.is::<Plain>()
    }

    /// Whether it (or its fallback) drafts with the run's draft model (`models.draft`).
    pub fn needs_draft_model(&self) -> bool {
        std::iter::once(&self.drafter)
            .chain(self.fallback.as_ref().map(|f| &f.drafter))
            .any(|d| d.entry().is_ok_and(|e| e.needs_draft_model(d.params())))
    }

    /// For the method's drafter, then its fallback's: whether that level's policy prices each
    /// of its drafter's offers (a lookup drafter, which runs no model, under `cost_optimal`:
    /// see [`specdec_algorithms::policy::CostModelPolicy`]).
    pub fn levels_pricing_offers(&self) -> Vec<bool> {
        let prices = |drafter: &DrafterConfig, policy: Option<&PolicyConfig>| {
            let lookup = drafter
                .entry()
                .is_ok_and(|entry| !entry.uses_model(drafter.params()));
            lookup && !drafter.is::<Plain>() && policy.is_some_and(|p| p.is::<CostOptimal>())
        };
        std::iter::once(prices(&self.drafter, self.policy.as_ref()))
            .chain(
                self.fallback
                    .as_ref()
                    .map(|f| prices(&f.drafter, Some(&f.policy))),
            )
            .collect()
    }

    /// A short human description, e.g. `chain / auto / fixed k=4`, with ` else ngram / auto /
    /// cost_optimal k<=8` for a fallback drafter.
    pub fn describe(&self) -> String {
        let policy = match &self.policy {
            None => "-".to_string(),
            Some(p) => p.describe(),
        };
        let own = format!(
            "{} / {} / {}",
            self.drafter.kind(),
            self.verifier.kind(),
            policy
        );
        match self.fallback_method() {
            Some(fallback) => format!("{own} else {}", fallback.describe()),
            None => own,
        }
    }
}
