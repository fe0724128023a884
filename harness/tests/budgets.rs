//! Bounded budgets: every size a config or flag sets is held to a stated limit at validation,
//! before any model is opened or any step runs. The cases are the ones seen to abort, be killed
//! for memory or hang before the limits existed (issue 19), and their neighbours.

use specdec_harness::config::{ExperimentConfig, MethodConfig, MAX_TOKENS_LIMIT};
use specdec_harness::methods::kinds::*;
use specdec_harness::methods::limits::MAX_DRAFTS;
use specdec_harness::methods::{DrafterConfig, PolicyConfig};
use specdec_harness::runner::{Backend, RequestSpec, ToyBackend};
use specdec_harness::HarnessError;

/// A toy config with one extra method (`METHOD` replaced by its TOML lines).
const TOY: &str = r#"
name = "budgets"
max_tokens = 16

[models]
target = "toy"
draft = "toy"

[prompts]
source = "inline"
texts = ["ab"]

[[methods]]
name = "m"
METHOD
"#;

fn with_method(method: &str) -> String {
    TOY.replace("METHOD", method)
}

/// Each `(config, field, words)`: refused as invalid, naming `field` and every word.
fn assert_refused(cases: &[(String, &str, &[&str])]) {
    for (text, field, words) in cases {
        let err = ExperimentConfig::from_toml(text, "budgets.toml").unwrap_err();
        assert!(
            matches!(err, HarnessError::ConfigInvalid { .. }),
            "not a value error: {err}\n{text}"
        );
        let msg = err.to_string();
        assert!(msg.contains(field), "`{field}` not named: {msg}");
        for word in *words {
            assert!(msg.contains(word), "`{word}` not in: {msg}");
        }
    }
}

#[test]
fn tree_sizes_past_the_draft_limit_are_refused_at_validation() {
    let fixed = "policy = { kind = \"fixed\", k = 8 }";
    let cases: Vec<(String, &str, &[&str])> = vec![
        // tried to allocate 125 GB of ancestor mask and aborted
        (
            with_method(&format!(
                "drafter = {{ kind = \"tree\", branching = [1000, 1000] }}\n{fixed}"
            )),
            "methods[0].drafter",
            &["tree.branching", "1024"],
        ),
        // overflows usize when multiplied out
        (
            with_method(&format!(
                "drafter = {{ kind = \"tree\", branching = [4294967296, 4294967296, 4294967296] }}\n{fixed}"
            )),
            "methods[0].drafter",
            &["tree.branching", "1024"],
        ),
        // hung (1e5) and was killed at 23.6 GB (1e9)
        (
            with_method(&format!(
                "drafter = {{ kind = \"dynamic_tree\", nodes = 100000, top_k = 4 }}\n{fixed}"
            )),
            "methods[0].drafter",
            &["dynamic_tree.nodes", "100000", "1024"],
        ),
        (
            with_method(&format!(
                "drafter = {{ kind = \"dynamic_tree\", nodes = 1000000000, top_k = 4 }}\n{fixed}"
            )),
            "methods[0].drafter",
            &["1000000000", "1024"],
        ),
        (
            with_method(&format!(
                "drafter = {{ kind = \"dynamic_tree\", nodes = 16, top_k = 1000000 }}\n{fixed}"
            )),
            "methods[0].drafter",
            &["dynamic_tree.top_k", "64"],
        ),
        (
            with_method(&format!(
                "drafter = {{ kind = \"sequoia\", nodes = 100000 }}\n{fixed}"
            )),
            "methods[0].drafter",
            &["sequoia.nodes", "1024"],
        ),
        (
            with_method(&format!(
                "drafter = {{ kind = \"sequoia\", nodes = 1000000000 }}\n{fixed}"
            )),
            "methods[0].drafter",
            &["sequoia.nodes", "1024"],
        ),
        (
            with_method(&format!(
                "drafter = {{ kind = \"eagle\", nodes = 100000 }}\n{fixed}"
            )),
            "methods[0].drafter",
            &["eagle.nodes", "1024"],
        ),
        (
            with_method(&format!(
                "drafter = {{ kind = \"eagle\", branching = [64, 64] }}\n{fixed}"
            )),
            "methods[0].drafter",
            &["eagle.branching", "1024"],
        ),
        (
            with_method(&format!(
                "drafter = {{ kind = \"medusa\", branching = [100, 100, 100] }}\n{fixed}"
            )),
            "methods[0].drafter",
            &["medusa.branching", "1024"],
        ),
        (
            with_method(&format!(
                "drafter = {{ kind = \"ngram\", n = 1000000000000 }}\n{fixed}"
            )),
            "methods[0].drafter",
            &["ngram.n", "64"],
        ),
        (
            with_method(&format!(
                "drafter = {{ kind = \"history\", n = 65 }}\n{fixed}"
            )),
            "methods[0].drafter",
            &["history.n", "65", "64"],
        ),
        (
            with_method(&format!(
                "drafter = {{ kind = \"history\", n = 4, history_tokens = 1000000000000 }}\n{fixed}"
            )),
            "methods[0].drafter",
            &["history.history_tokens", "67108864"],
        ),
        (
            with_method(&format!(
                "drafter = {{ kind = \"history\", n = 64, history_tokens = 67108864 }}\n{fixed}"
            )),
            "methods[0].drafter",
            &["history.n = 64", "index entries", "268435456"],
        ),
        (
            with_method(&format!(
                "drafter = {{ kind = \"history\", n = 4, spec_factor = -1.0 }}\n{fixed}"
            )),
            "methods[0].drafter",
            &["history.spec_factor", "positive"],
        ),
        (
            with_method(&format!(
                "drafter = {{ kind = \"staged\", levels = [\"toy\", \"toy\"] }}\n{fixed}"
            )),
            "methods[0].drafter",
            &["staged.levels", "2 model levels", "exactly one"],
        ),
    ];
    assert_refused(&cases);
}

#[test]
fn policy_budgets_past_the_draft_limit_are_refused_at_validation() {
    let chain = "drafter = { kind = \"layer_skip\" }";
    let cases: Vec<(String, &str, &[&str])> = vec![
        // failed only after 34–160 s
        (
            with_method(&format!("{chain}\npolicy = {{ kind = \"fixed\", k = 100000 }}")),
            "methods[0].policy",
            &["fixed.k", "100000", "1024"],
        ),
        (
            with_method(&format!(
                "{chain}\npolicy = {{ kind = \"aimd\", k_min = 1, k_max = 1000000, decrease = 0.5 }}"
            )),
            "methods[0].policy",
            &["aimd.k_max", "1024"],
        ),
        (
            with_method(&format!(
                "{chain}\npolicy = {{ kind = \"aimd\", k_min = 1, k_max = 8, decrease = 0.5, increase = 9223372036854775807 }}"
            )),
            "methods[0].policy",
            &["aimd.increase", "1024"],
        ),
        (
            with_method(&format!(
                "{chain}\npolicy = {{ kind = \"pid\", target_acceptance = 0.7, k_min = 1, k_max = 5000 }}"
            )),
            "methods[0].policy",
            &["pid.k_max", "1024"],
        ),
        (
            with_method(&format!(
                "{chain}\npolicy = {{ kind = \"cost_optimal\", k_max = 100000 }}"
            )),
            "methods[0].policy",
            &["cost_optimal.k_max", "1024"],
        ),
        (
            with_method(&format!(
                "{chain}\npolicy = {{ kind = \"cost_optimal\", k_max = 8, probe_every = 9223372036854775807 }}"
            )),
            "methods[0].policy",
            &["cost_optimal.probe_every", "1000000"],
        ),
        (
            with_method(&format!(
                "{chain}\npolicy = {{ kind = \"threshold\", k = 2000, min_acceptance = 0.3, probe_every = 8 }}"
            )),
            "methods[0].policy",
            &["threshold.k", "1024"],
        ),
    ];
    assert_refused(&cases);
    // the limit itself is allowed
    let at_limit = with_method(&format!(
        "{chain}\npolicy = {{ kind = \"fixed\", k = {MAX_DRAFTS} }}"
    ));
    ExperimentConfig::from_toml(&at_limit, "budgets.toml").unwrap();
}

#[test]
fn run_sizes_past_their_limits_are_refused_at_validation() {
    let plain = "drafter = { kind = \"plain\" }";
    let cases: Vec<(String, &str, &[&str])> = vec![
        // a toy run that never ended
        (
            with_method(plain).replace("max_tokens = 16", "max_tokens = 9223372036854775000"),
            "max_tokens",
            &["9223372036854775000", "1048576"],
        ),
        (
            with_method(plain).replace("max_tokens = 16", "max_tokens = 1048577"),
            "max_tokens",
            &["1048576"],
        ),
        (
            with_method(plain).replace("max_tokens = 16", "max_tokens = 16\nbatch_size = 100000"),
            "batch_size",
            &["100000", "256"],
        ),
        (
            with_method(plain).replace(
                "source = \"inline\"\ntexts = [\"ab\"]",
                "source = \"synthetic\"\ncount = 1000000000",
            ),
            "prompts.count",
            &["100000"],
        ),
    ];
    assert_refused(&cases);
    let ok = with_method(plain).replace(
        "max_tokens = 16",
        &format!("max_tokens = {MAX_TOKENS_LIMIT}"),
    );
    ExperimentConfig::from_toml(&ok, "budgets.toml").unwrap();
}

#[test]
fn a_method_built_without_validation_is_refused_by_its_builder() {
    // code that builds methods itself (the reproductions, tests) meets the same limits
    let loaded = ExperimentConfig::from_toml(
        &with_method("drafter = { kind = \"plain\" }"),
        "budgets.toml",
    )
    .unwrap();
    let mut backend = ToyBackend::new(&loaded.config).unwrap();
    let prompts = loaded
        .config
        .prompts
        .load(std::path::Path::new("."))
        .unwrap();
    let specs = [RequestSpec {
        index: 0,
        prompt: &prompts[0],
    }];
    let methods = [
        MethodConfig::new(
            "wide",
            DrafterConfig::of(Tree {
                branching: vec![1000, 1000],
            }),
            Some(PolicyConfig::of(Fixed { k: 8 })),
        ),
        MethodConfig::new(
            "long",
            DrafterConfig::of(Chain::default()),
            Some(PolicyConfig::of(Fixed { k: 100_000 })),
        ),
    ];
    for method in methods {
        let err = backend
            .run_method(&method, &specs, &mut |_| {})
            .err()
            .unwrap_or_else(|| panic!("{} ran", method.name))
            .to_string();
        assert!(err.contains("1024"), "{}: {err}", method.name);
    }
}
