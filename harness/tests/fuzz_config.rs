//! Property fuzzing of the experiment-config parser and validator: byte-mutated configs and
//! configs with random sizes and values are refused with an error, or validate to a config
//! whose every size is within its stated limit; never a panic.
//!
//! Seeds are pinned. CI runs `SPECDEC_FUZZ_CASES` cases per property (default 64);
//! `scripts/fuzz.sh` runs 10^5.

use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed};
use specdec_harness::config::{
    ExperimentConfig, PromptSet, MAX_BATCH_SIZE, MAX_SYNTHETIC_PROMPTS, MAX_TOKENS_LIMIT,
};
use specdec_harness::methods::kinds::*;
use specdec_harness::methods::limits::MAX_DRAFTS;

fn config() -> Config {
    let cases = std::env::var("SPECDEC_FUZZ_CASES")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(64);
    Config {
        cases,
        rng_seed: RngSeed::Fixed(0x5eed_0019),
        failure_persistence: None,
        ..Config::default()
    }
}

const BASE: &str = r#"
name = "fuzz"
max_tokens = MAX_TOKENS
batch_size = BATCH
[models]
target = "toy"
draft = "toy"
[prompts]
source = "synthetic"
count = COUNT
[sampling]
temperature = TEMP
[[methods]]
name = "m"
DRAFTER
POLICY
"#;

/// Every size of a validated config is within its limit.
fn within_limits(c: &ExperimentConfig) -> Result<(), TestCaseError> {
    prop_assert!((1..=MAX_TOKENS_LIMIT).contains(&c.max_tokens));
    prop_assert!((1..=MAX_BATCH_SIZE).contains(&c.batch_size));
    if let PromptSet::Synthetic { count, .. } = c.prompts {
        prop_assert!((1..=MAX_SYNTHETIC_PROMPTS).contains(&count));
    }
    for m in &c.methods {
        if let Some(t) = m.drafter.as_kind::<Tree>() {
            let nodes = specdec_harness::methods::limits::branching_drafts("b", &t.branching);
            prop_assert!(nodes.is_ok_and(|n| n <= MAX_DRAFTS));
        }
        for n in [
            m.drafter.as_kind::<DynamicTree>().map(|d| d.nodes),
            m.drafter.as_kind::<Sequoia>().map(|d| d.nodes),
        ]
        .into_iter()
        .flatten()
        {
            prop_assert!(n <= MAX_DRAFTS);
        }
        if let Some(p) = &m.policy {
            for k in [
                p.as_kind::<Fixed>().map(|p| p.k),
                p.as_kind::<Aimd>().map(|p| p.k_max),
                p.as_kind::<CostOptimal>().map(|p| p.k_max),
                p.as_kind::<Threshold>().map(|p| p.k),
            ]
            .into_iter()
            .flatten()
            {
                prop_assert!(k <= MAX_DRAFTS);
            }
        }
    }
    Ok(())
}

fn size() -> impl Strategy<Value = String> {
    prop_oneof![
        (0u64..2048).prop_map(|n| n.to_string()),
        any::<i64>().prop_map(|n| n.to_string()),
        prop_oneof![
            Just("0"),
            Just("-1"),
            Just("9223372036854775807"),
            Just("1.5"),
            Just("\"8\"")
        ]
        .prop_map(str::to_string),
    ]
}

fn drafter() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("drafter = { kind = \"chain\" }".to_string()),
        (size(), size())
            .prop_map(|(a, b)| format!("drafter = {{ kind = \"tree\", branching = [{a}, {b}] }}")),
        (size(), size()).prop_map(|(n, k)| format!(
            "drafter = {{ kind = \"dynamic_tree\", nodes = {n}, top_k = {k} }}"
        )),
        size().prop_map(|n| format!("drafter = {{ kind = \"sequoia\", nodes = {n} }}")),
        size().prop_map(|n| format!("drafter = {{ kind = \"ngram\", n = {n} }}")),
        size().prop_map(|k| format!("drafter = {{ kind = \"chain\", k = {k} }}")),
        Just("drafter = { kind = \"staged\", levels = [\"toy\", \"toy\"] }".to_string()),
    ]
}

fn policy() -> impl Strategy<Value = String> {
    prop_oneof![
        size().prop_map(|k| format!("policy = {{ kind = \"fixed\", k = {k} }}")),
        (size(), size()).prop_map(|(a, b)| format!(
            "policy = {{ kind = \"aimd\", k_min = {a}, k_max = {b}, decrease = 0.5 }}"
        )),
        (size(), size()).prop_map(|(k, p)| format!(
            "policy = {{ kind = \"cost_optimal\", k_max = {k}, probe_every = {p} }}"
        )),
        (
            size(),
            prop_oneof![Just("0.3"), Just("nan"), Just("-1.0"), Just("inf")]
        )
            .prop_map(|(k, a)| format!(
            "policy = {{ kind = \"threshold\", k = {k}, min_acceptance = {a}, probe_every = 4 }}"
        )),
    ]
}

proptest! {
    #![proptest_config(config())]

    /// Random sizes and values: refused, or valid with every size within its limit.
    #[test]
    fn random_sizes_are_refused_or_within_limits(
        max_tokens in size(),
        batch in size(),
        count in size(),
        temp in prop_oneof![Just("0.0"), Just("0.7"), Just("-1.0"), Just("nan"), Just("inf")],
        drafter in drafter(),
        policy in policy(),
    ) {
        let text = BASE
            .replace("MAX_TOKENS", &max_tokens)
            .replace("BATCH", &batch)
            .replace("COUNT", &count)
            .replace("TEMP", temp)
            .replace("DRAFTER", &drafter)
            .replace("POLICY", &policy);
        if let Ok(loaded) = ExperimentConfig::from_toml(&text, "fuzz.toml") {
            within_limits(&loaded.config)?;
        }
    }

    /// A valid config with a few bytes overwritten, inserted or cut: parsed or refused, never a
    /// panic; what validates is within the limits.
    #[test]
    fn byte_mutated_configs_never_panic(
        edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>(), 0u8..3), 1..6),
    ) {
        let good = BASE
            .replace("MAX_TOKENS", "16")
            .replace("BATCH", "2")
            .replace("COUNT", "3")
            .replace("TEMP", "0.5")
            .replace("DRAFTER", "drafter = { kind = \"tree\", branching = [3, 2] }")
            .replace("POLICY", "policy = { kind = \"fixed\", k = 4 }");
        let mut bytes = good.into_bytes();
        for (at, byte, op) in edits {
            let i = at.index(bytes.len().max(1)).min(bytes.len().saturating_sub(1));
            match op {
                0 => bytes[i] = byte,
                1 => bytes.insert(i, byte),
                _ => {
                    bytes.remove(i);
                }
            }
        }
        let text = String::from_utf8_lossy(&bytes);
        if let Ok(loaded) = ExperimentConfig::from_toml(&text, "fuzz.toml") {
            within_limits(&loaded.config)?;
        }
    }
}
