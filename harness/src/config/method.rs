//! One method configuration: a drafter, a verifier and a speculation policy.

use serde::{Deserialize, Serialize};

/// One `[[methods]]` entry. `name` labels its rows in every table and plot and must be unique.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MethodConfig {
    /// Unique label of this configuration.
    pub name: String,
    /// How drafts are proposed (`kind = "none"` is plain decoding, the baseline).
    pub drafter: DrafterConfig,
    /// How drafts are verified; `auto` (the default) is greedy at temperature 0 and chain
    /// rejection sampling above.
    #[serde(default)]
    pub verifier: VerifierConfig,
    /// How the draft budget is chosen each step; required for every drafter but `none`.
    #[serde(default)]
    pub policy: Option<PolicyConfig>,
    /// Model drafters only: the draft model computes the logits of token ids `0..draft_vocab`
    /// alone, so its distribution `q` is zero past them (exact verification is unaffected).
    /// Byte-level BPE ids follow merge order, so low ids are the frequent tokens: e.g. 32768 of
    /// Qwen2.5's 151936 cuts the 0.5B draft's LM head, 37% of the bytes it reads per token, to
    /// a fifth. Absent: the whole vocabulary.
    #[serde(default)]
    pub draft_vocab: Option<usize>,
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
            verifier: VerifierConfig::Auto,
            policy,
            draft_vocab: None,
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
        MethodConfig::new("baseline", DrafterConfig::None, None)
    }

    /// Whether this is plain decoding (no drafts).
    pub fn is_baseline(&self) -> bool {
        matches!(self.drafter, DrafterConfig::None)
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

/// The drafter of a method, tagged by `kind`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum DrafterConfig {
    /// No drafting: plain autoregressive decoding (the baseline).
    None,
    /// The draft model proposes a chain of K tokens (K from the policy).
    Chain,
    /// The draft model expands a static tree: `branching[d]` children per node at depth d.
    Tree {
        /// Children per node at each depth (length = tree depth), each ≥ 1.
        branching: Vec<usize>,
    },
    /// EAGLE-2-style dynamic tree: expand the `top_k` children of the most probable nodes by
    /// cumulative draft probability until `nodes` nodes.
    DynamicTree {
        /// Node budget (≥ 1).
        nodes: usize,
        /// Children considered per expanded node (≥ 1).
        top_k: usize,
    },
    /// Sequoia-style tree, DP-optimal for an acceptance vector, with `nodes` nodes.
    Sequoia {
        /// Node budget (≥ 1).
        nodes: usize,
    },
    /// Prompt-lookup / n-gram drafting: match the last `n` tokens in the context.
    Ngram {
        /// Match length (≥ 1).
        n: usize,
    },
    /// Multi-level speculation: an n-gram level 0, then `levels` draft models, smallest first,
    /// each verified by the next (today one model level: the last entry).
    Staged {
        /// Model names, smallest first (each a known name, a .gguf path, or `layer_skip` for the
        /// target with the default blocks skipped).
        levels: Vec<String>,
    },
    /// Layer-skip self-drafting: the target running only some of its blocks (shared weights)
    /// drafts a chain.
    LayerSkip {
        /// Blocks kept, strictly increasing [default: first and last quarter, every other block
        /// of the middle half].
        #[serde(default)]
        keep: Option<Vec<usize>>,
        /// When `keep` is not given: pick the kept blocks on the first prompt of the run by
        /// measuring a few candidate subsets (greedy agreement with the target on the prompt
        /// prefill × prefill cost; see `runner::layer_skip_tune`). Its time counts in the run.
        #[serde(default)]
        tune: bool,
    },
}

impl DrafterConfig {
    /// The `kind` string as written in configs.
    pub fn kind(&self) -> &'static str {
        match self {
            DrafterConfig::None => "none",
            DrafterConfig::Chain => "chain",
            DrafterConfig::Tree { .. } => "tree",
            DrafterConfig::DynamicTree { .. } => "dynamic_tree",
            DrafterConfig::Sequoia { .. } => "sequoia",
            DrafterConfig::Ngram { .. } => "ngram",
            DrafterConfig::Staged { .. } => "staged",
            DrafterConfig::LayerSkip { .. } => "layer_skip",
        }
    }

    /// Whether the drafter proposes a linear chain (K from the policy).
    pub fn is_linear(&self) -> bool {
        matches!(
            self,
            DrafterConfig::Chain
                | DrafterConfig::Ngram { .. }
                | DrafterConfig::Staged { .. }
                | DrafterConfig::LayerSkip { .. }
        )
    }
}

/// The verifier of a method, tagged by `kind`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum VerifierConfig {
    /// Greedy at temperature 0, chain rejection sampling otherwise.
    #[default]
    Auto,
    /// Accept while the draft token is the target's argmax.
    Greedy,
    /// Chain rejection sampling (Leviathan et al. / Chen et al.).
    Rejection,
    /// Multi-draft tree sampling, SpecInfer-style multi-round with the true q.
    MultiRound,
    /// Recursive rejection sampling without replacement.
    WithoutReplacement,
    /// Target-only tree sampling for deterministic drafts.
    TargetOnly,
    /// Typical acceptance (lossy): accept when p(x) ≥ min(epsilon, delta · exp(−H(p))).
    Typical {
        /// Hard threshold ε in (0, 1].
        epsilon: f64,
        /// Entropy factor δ in (0, 1].
        delta: f64,
    },
}

impl VerifierConfig {
    /// The `kind` string as written in configs.
    pub fn kind(&self) -> &'static str {
        match self {
            VerifierConfig::Auto => "auto",
            VerifierConfig::Greedy => "greedy",
            VerifierConfig::Rejection => "rejection",
            VerifierConfig::MultiRound => "multi_round",
            VerifierConfig::WithoutReplacement => "without_replacement",
            VerifierConfig::TargetOnly => "target_only",
            VerifierConfig::Typical { .. } => "typical",
        }
    }
}

/// The speculation policy of a method, tagged by `kind`: how many drafts to propose next, per
/// sequence. Each kind builds the `specdec_algorithms::policy` policy of the same name (see
/// [`crate::policies::policy_for`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum PolicyConfig {
    /// Always K drafts (`FixedPolicy`).
    Fixed {
        /// Drafts per step (≥ 1 for a linear method).
        k: usize,
    },
    /// Additive increase after a fully accepted step, multiplicative decrease after a rejection,
    /// within [k_min, k_max] (`AimdPolicy`).
    Aimd {
        /// Smallest K (≥ 1).
        k_min: usize,
        /// Largest K (≥ k_min).
        k_max: usize,
        /// First K [default: k_min].
        #[serde(default)]
        start_k: Option<usize>,
        /// Drafts added after a fully accepted step [default: 1].
        #[serde(default = "one")]
        increase: usize,
        /// Factor in (0, 1) applied after a rejection.
        decrease: f64,
    },
    /// PID controller steering the acceptance rate to `target_acceptance` by changing K
    /// (`PidPolicy`).
    Pid {
        /// Acceptance rate to hold, in (0, 1).
        target_acceptance: f64,
        /// Smallest K (≥ 1).
        k_min: usize,
        /// Largest K (≥ k_min).
        k_max: usize,
        /// K at zero error [default: the middle of the range].
        #[serde(default)]
        base_k: Option<f64>,
        /// Gains [kp, ki, kd], drafts per unit of acceptance error [default: [2.0, 0.5, 0.0]].
        #[serde(default = "default_gains")]
        gains: [f64; 3],
    },
    /// argmax_K E\[tokens\](α̂, K) / (draft_cost(K) + verify_cost(K)), α̂ estimated online
    /// (`CostModelPolicy` over chains). Needs a cost model: the `[simulation]` one in simulation
    /// mode, measured costs from the engine otherwise.
    CostOptimal {
        /// Largest K considered (≥ 1).
        k_max: usize,
        /// Predicted gain over plain decoding needed to speculate [default: 0.02].
        #[serde(default = "default_min_gain")]
        min_gain: f64,
        /// Plain steps between 1-draft probes while not speculating [default: 16].
        #[serde(default = "sixteen")]
        probe_every: usize,
    },
    /// Fixed K, switched off (plain decoding) when the acceptance estimate falls below
    /// `min_acceptance`, probing with one draft every `probe_every` plain steps
    /// (`DisableGate` around `FixedPolicy`).
    Threshold {
        /// K while speculating (≥ 1).
        k: usize,
        /// Acceptance below which speculation stops, in [0, 1].
        min_acceptance: f64,
        /// Plain steps between probes while off (≥ 1).
        probe_every: usize,
    },
}

fn one() -> usize {
    1
}
fn sixteen() -> usize {
    16
}
fn default_gains() -> [f64; 3] {
    [2.0, 0.5, 0.0]
}
fn default_min_gain() -> f64 {
    0.02
}

impl PolicyConfig {
    /// A short description, e.g. `fixed k=4`.
    pub fn describe(&self) -> String {
        match self {
            PolicyConfig::Fixed { k } => format!("fixed k={k}"),
            PolicyConfig::Aimd { k_min, k_max, .. } => format!("aimd k={k_min}..{k_max}"),
            PolicyConfig::Pid {
                target_acceptance, ..
            } => format!("pid target={target_acceptance}"),
            PolicyConfig::CostOptimal { k_max, .. } => format!("cost_optimal k<={k_max}"),
            PolicyConfig::Threshold {
                k, min_acceptance, ..
            } => format!("threshold k={k} off<{min_acceptance}"),
        }
    }
}
