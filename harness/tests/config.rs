//! Experiment config parsing and validation.

use specdec_harness::config::{
    DrafterConfig, ExperimentConfig, ModelSource, PolicyConfig, PromptSet, VerifierConfig,
};
use specdec_harness::methods::kinds::*;
use specdec_harness::HarnessError;

const GOOD: &str = r#"
name = "pair"
description = "Qwen pair on two prompts"
max_tokens = 32
batch_size = 2

[models]
target = "qwen2.5-coder-1.5b"
draft = "qwen2.5-coder-0.5b"

[prompts]
source = "inline"
texts = ["def add(a, b):", "class Stack:"]

[sampling]
temperature = 0.7
top_k = 50
top_p = 0.9
seed = 42

[[methods]]
name = "plain"
drafter = { kind = "none" }

[[methods]]
name = "linear-k4"
drafter = { kind = "chain" }
verifier = { kind = "rejection" }
policy = { kind = "fixed", k = 4 }

[[methods]]
name = "tree"
drafter = { kind = "tree", branching = [3, 2, 1] }
verifier = { kind = "multi_round" }
policy = { kind = "aimd", k_min = 1, k_max = 8, decrease = 0.5 }
"#;

fn parse(text: &str) -> Result<ExperimentConfig, HarnessError> {
    ExperimentConfig::from_toml(text, "test.toml").map(|l| l.config)
}

fn error_of(text: &str) -> String {
    parse(text).unwrap_err().to_string()
}

#[test]
fn a_full_config_parses() {
    let c = parse(GOOD).unwrap();
    assert_eq!(c.name, "pair");
    assert_eq!(c.max_tokens, 32);
    assert_eq!(c.batch_size, 2);
    assert_eq!(c.sampling.temperature, 0.7);
    assert_eq!(c.sampling.top_k, Some(50));
    assert_eq!(c.sampling.seed, 42);
    assert_eq!(
        ModelSource::parse(&c.models.target).unwrap(),
        ModelSource::Named(specdec_harness::config::KnownModel::QwenCoder1_5b)
    );
    assert!(matches!(c.prompts, PromptSet::Inline { ref texts, .. } if texts.len() == 2));
    assert_eq!(c.methods.len(), 3);
    assert!(c.methods[0].is_baseline());
    assert_eq!(c.methods[1].policy, Some(PolicyConfig::of(Fixed { k: 4 })));
    assert_eq!(c.methods[1].verifier, VerifierConfig::of(ChainRejection {}));
    assert_eq!(
        c.methods[2].drafter,
        DrafterConfig::of(Tree {
            branching: vec![3, 2, 1]
        })
    );
}

#[test]
fn unknown_keys_are_refused_with_the_key_and_file_named() {
    // At the top level, in a table, in a tagged enum, and in an array of tables.
    let cases = [
        (
            GOOD.replace("max_tokens = 32", "max_tokens = 32\nmax_tokns = 3"),
            "max_tokns",
        ),
        (GOOD.replace("seed = 42", "seed = 42\nsede = 1"), "sede"),
        (
            GOOD.replace(
                "policy = { kind = \"fixed\", k = 4 }",
                "policy = { kind = \"fixed\", k = 4, kk = 2 }",
            ),
            "kk",
        ),
        (
            GOOD.replace("texts = [", "extra_prompts = 1\ntexts = ["),
            "extra_prompts",
        ),
        (
            GOOD.replace(
                "name = \"linear-k4\"",
                "name = \"linear-k4\"\ncolour = \"red\"",
            ),
            "colour",
        ),
        // in the drafter and verifier sub-tables (issue 19: `k` was dropped)
        (
            GOOD.replace(
                "drafter = { kind = \"chain\" }",
                "drafter = { kind = \"chain\", k = 8 }",
            ),
            "unknown field `k`",
        ),
        (
            GOOD.replace("branching = [3, 2, 1]", "branching = [3, 2, 1], depth = 3"),
            "unknown field `depth`",
        ),
        (
            GOOD.replace(
                "kind = \"rejection\"",
                "kind = \"rejection\", epsilon = 0.1",
            ),
            "unknown field `epsilon`",
        ),
        (
            GOOD.replace("decrease = 0.5", "decrease = 0.5, gain = 2"),
            "unknown field `gain`",
        ),
        (GOOD.replace("texts = [", "count = 3\ntexts = ["), "count"),
        (
            GOOD.replace("seed = 42", "seed = 42\n[toy]\nvocab = 8\nsize = 3"),
            "size",
        ),
        (
            GOOD.replace(
                "draft = \"qwen2.5-coder-0.5b\"",
                "draft = \"qwen2.5-coder-0.5b\"\ndraft_model = \"x\"",
            ),
            "draft_model",
        ),
    ];
    for (text, key) in cases {
        let e = parse(&text).unwrap_err();
        assert!(matches!(e, HarnessError::ConfigParse { .. }), "{e}");
        let msg = e.to_string();
        assert!(msg.contains(key), "error does not name `{key}`: {msg}");
        assert!(
            msg.contains("test.toml"),
            "error does not name the file: {msg}"
        );
    }
}

#[test]
fn unknown_kinds_are_refused() {
    let e = error_of(&GOOD.replace("kind = \"chain\"", "kind = \"chainz\""));
    assert!(e.contains("chainz"), "{e}");
}

#[test]
fn bad_values_name_the_field() {
    let cases = [
        (
            GOOD.replace("temperature = 0.7", "temperature = -0.1"),
            "sampling.temperature",
        ),
        (GOOD.replace("top_p = 0.9", "top_p = 1.5"), "sampling.top_p"),
        (
            GOOD.replace("top_p = 0.9", "top_p = 0.9\nmin_p = 1.5"),
            "sampling.min_p",
        ),
        (GOOD.replace("top_k = 50", "top_k = 0"), "sampling.top_k"),
        (
            GOOD.replace("max_tokens = 32", "max_tokens = 0"),
            "max_tokens",
        ),
        (
            GOOD.replace("batch_size = 2", "batch_size = 0"),
            "batch_size",
        ),
        // the op split times one request's forward at a time, of a real model
        (
            GOOD.replace("batch_size = 2", "batch_size = 2\nop_split = true"),
            "op_split",
        ),
        (
            GOOD.replace("batch_size = 2", "batch_size = 1\nop_split = true")
                .replace("target = \"qwen2.5-coder-1.5b\"", "target = \"toy\""),
            "op_split",
        ),
        (
            GOOD.replace("kind = \"fixed\", k = 4", "kind = \"fixed\", k = 0"),
            "methods[1].policy",
        ),
        (
            GOOD.replace("branching = [3, 2, 1]", "branching = [3, 0]"),
            "methods[2].drafter",
        ),
        (
            GOOD.replace("decrease = 0.5", "decrease = 1.5"),
            "methods[2].policy",
        ),
        (
            GOOD.replace("name = \"tree\"", "name = \"plain\""),
            "methods[2].name",
        ),
        (
            GOOD.replace("target = \"qwen2.5-coder-1.5b\"", "target = \"gpt-5\""),
            "models.target",
        ),
        // typical acceptance's thresholds (issue 19: ε = −1 and NaN were accepted)
        (
            GOOD.replace(
                "verifier = { kind = \"rejection\" }",
                "verifier = { kind = \"typical\", epsilon = -1.0, delta = 0.5 }",
            ),
            "typical.epsilon -1",
        ),
        (
            GOOD.replace(
                "verifier = { kind = \"rejection\" }",
                "verifier = { kind = \"typical\", epsilon = nan, delta = 0.5 }",
            ),
            "typical.epsilon NaN",
        ),
        (
            GOOD.replace(
                "verifier = { kind = \"rejection\" }",
                "verifier = { kind = \"typical\", epsilon = 0.3, delta = inf }",
            ),
            "typical.delta inf",
        ),
    ];
    assert_each_is_invalid_naming(&cases);
}

/// Each `(config text, field)`: the config is refused as invalid, with an error naming `field`.
fn assert_each_is_invalid_naming(cases: &[(String, &str)]) {
    for (text, field) in cases {
        let e = parse(text).unwrap_err();
        assert!(matches!(e, HarnessError::ConfigInvalid { .. }), "{e}");
        let msg = e.to_string();
        assert!(msg.contains(field), "error does not name `{field}`: {msg}");
    }
}

#[test]
fn k_zero_on_a_linear_method_says_so() {
    let e = error_of(&GOOD.replace("kind = \"fixed\", k = 4", "kind = \"fixed\", k = 0"));
    assert!(e.contains("K = 0") && e.contains("linear"), "{e}");
}

#[test]
fn a_drafting_method_needs_a_policy_and_the_baseline_none() {
    let e = error_of(&GOOD.replace("policy = { kind = \"fixed\", k = 4 }\n", ""));
    assert!(e.contains("needs a policy"), "{e}");
    let e = error_of(&GOOD.replace(
        "drafter = { kind = \"none\" }",
        "drafter = { kind = \"none\" }\npolicy = { kind = \"fixed\", k = 2 }",
    ));
    assert!(e.contains("takes no policy"), "{e}");
}

#[test]
fn a_fallback_drafter_parses_and_is_checked() {
    let fallback = "fallback = { drafter = { kind = \"ngram\", n = 3 }, policy = { kind = \"cost_optimal\", k_max = 8 } }\n";
    let with = GOOD.replace(
        "policy = { kind = \"fixed\", k = 4 }\n",
        &format!("policy = {{ kind = \"fixed\", k = 4 }}\n{fallback}"),
    );
    let c = parse(&with).unwrap();
    let method = &c.methods[1];
    let own = method.fallback_method().unwrap();
    assert_eq!(own.name, "linear-k4/fallback");
    assert_eq!(own.drafter, DrafterConfig::of(Ngram { n: 3 }));
    assert_eq!(own.verifier, VerifierConfig::of(Auto {}));
    assert!(matches!(
        own.policy.as_ref().and_then(|p| p.as_kind::<CostOptimal>()),
        Some(CostOptimal { k_max: 8, .. })
    ));
    assert!(method
        .describe()
        .ends_with("else ngram / auto / cost_optimal k<=8"));
    assert!(c.methods[2].fallback_method().is_none());

    let cases = [
        (
            with.replace("kind = \"ngram\", n = 3", "kind = \"none\""),
            "methods[1].fallback",
        ),
        (
            with.replace("k_max = 8", "k_max = 0"),
            "methods[1].fallback.policy",
        ),
        (
            GOOD.replace(
                "drafter = { kind = \"none\" }\n",
                &format!("drafter = {{ kind = \"none\" }}\n{fallback}"),
            ),
            "methods[0].fallback",
        ),
    ];
    assert_each_is_invalid_naming(&cases);
    let e = error_of(&with.replace("n = 3 }, policy", "n = 3, m = 2 }, policy"));
    assert!(e.contains("`m`"), "{e}");
}

#[test]
fn the_baseline_is_added_or_required() {
    let without = GOOD.replace(
        "[[methods]]\nname = \"plain\"\ndrafter = { kind = \"none\" }\n",
        "",
    );
    let loaded = ExperimentConfig::from_toml(&without, "test.toml").unwrap();
    assert_eq!(loaded.config.methods.len(), 3);
    assert!(loaded.config.methods[0].is_baseline());
    assert_eq!(loaded.config.methods[0].name, "baseline");
    assert!(loaded.notes.iter().any(|n| n.contains("added")));

    let required = format!("baseline = \"require\"\n{without}");
    let e = error_of(&required);
    assert!(e.contains("require") && e.contains("baseline"), "{e}");

    let two = GOOD.replace(
        "[[methods]]\nname = \"linear-k4\"",
        "[[methods]]\nname = \"plain2\"\ndrafter = { kind = \"none\" }\n\n[[methods]]\nname = \"linear-k4\"",
    );
    assert!(error_of(&two).contains("2 plain-decoding baselines"));
}

#[test]
fn simulation_configs_parse_and_validate() {
    let sim = r#"
name = "sim"
max_tokens = 16
[prompts]
source = "synthetic"
count = 3
[simulation]
acceptance = { kind = "by_depth", alphas = [0.9, 0.8] }
[simulation.cost]
draft_ms_per_token = 1.0
target = { kind = "points", tokens = [1, 4], ms = [10.0, 12.0] }
[[methods]]
name = "k3"
drafter = { kind = "chain" }
policy = { kind = "fixed", k = 3 }
"#;
    let c = parse(sim).unwrap();
    assert!(c.simulation.is_some());
    assert_eq!(c.methods.len(), 2);
    let e = error_of(&sim.replace("alphas = [0.9, 0.8]", "alphas = [0.9, 1.8]"));
    assert!(e.contains("simulation") && e.contains("1.8"), "{e}");
    let e = error_of(&sim.replace("tokens = [1, 4]", "tokens = [4, 1]"));
    assert!(e.contains("increasing"), "{e}");
    let e = error_of(&sim.replace(
        "draft_ms_per_token = 1.0",
        "draft_ms_per_token = 1.0\nlatency = 2",
    ));
    assert!(e.contains("latency"), "{e}");
    // Without [simulation] and without a model, the config says what is missing.
    let i = sim.find("[simulation]").unwrap();
    let j = sim.find("[[methods]]").unwrap();
    let no_sim = format!("{}{}", &sim[..i], &sim[j..]);
    assert!(error_of(&no_sim).contains("[simulation]"));
}

#[test]
fn a_file_of_prompts_loads_relative_to_the_config() {
    let dir = std::env::temp_dir().join(format!("specdec-prompts-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("p.txt"), "first\nline two\n---\nsecond\n---\n\n").unwrap();
    std::fs::write(
        dir.join("p.jsonl"),
        "\"a\"\n{\"prompt\": \"b\", \"task_id\": 1}\n",
    )
    .unwrap();
    let text = |file: &str| {
        format!(
            "name = \"f\"\nmax_tokens = 4\nmethods = []\n[prompts]\nsource = \"file\"\npath = \"{file}\"\n\
             [simulation]\nacceptance = {{ kind = \"fixed\", alpha = 0.5 }}\n\
             [simulation.cost]\ndraft_ms_per_token = 1.0\n\
             target = {{ kind = \"affine\", base_ms = 10.0, per_token_ms = 0.0 }}\n"
        )
    };
    std::fs::write(dir.join("a.toml"), text("p.txt")).unwrap();
    std::fs::write(dir.join("b.toml"), text("p.jsonl")).unwrap();
    let a = ExperimentConfig::load(&dir.join("a.toml")).unwrap();
    let prompts = a.config.prompts.load(&a.base_dir()).unwrap();
    let texts: Vec<&str> = prompts.iter().map(|p| p.text.as_str()).collect();
    assert_eq!(texts, ["first\nline two", "second"]);
    let b = ExperimentConfig::load(&dir.join("b.toml")).unwrap();
    let prompts = b.config.prompts.load(&b.base_dir()).unwrap();
    let texts: Vec<&str> = prompts.iter().map(|p| p.text.as_str()).collect();
    assert_eq!(texts, ["a", "b"]);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// HumanEval prompts come from the fetch cache (skipped, with the fetch command printed, when it
/// is not there).
#[test]
fn humaneval_prompts_load_from_the_cache() {
    if specdec_models::registry::cached_for_test("humaneval").is_none() {
        return;
    }
    let set = PromptSet::Humaneval {
        count: Some(3),
        chat: None,
    };
    let prompts = set.load(std::path::Path::new(".")).unwrap();
    assert_eq!(prompts.len(), 3);
    assert_eq!(prompts[2].id, "humaneval/2");
    assert!(
        prompts.iter().all(|p| p.text.contains("def ")),
        "{prompts:?}"
    );
    let all = PromptSet::Humaneval {
        count: None,
        chat: None,
    }
    .load(std::path::Path::new("."))
    .unwrap();
    assert_eq!(all.len(), 164);
}

#[test]
fn the_device_is_a_checked_run_time_choice() {
    let on =
        |device: &str| GOOD.replace("[prompts]", &format!("device = \"{device}\"\n\n[prompts]"));
    assert_eq!(parse(GOOD).unwrap().models.device, "cpu");
    for good in ["cpu", "cuda", "cuda:1"] {
        assert_eq!(parse(&on(good)).unwrap().models.device, good);
    }
    let err = error_of(&on("tpu"));
    assert!(
        err.contains("models.device") && err.contains("tpu") && err.contains("cuda:N"),
        "{err}"
    );
}

#[test]
fn a_model_folder_is_a_model_source() {
    let dir = std::env::temp_dir().join(format!("specdec-config-hf-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let text = dir.to_str().unwrap();
    let source = ModelSource::parse(text).unwrap();
    assert_eq!(source, ModelSource::HfFolder(dir.clone()));
    assert!(source.needs_model_runner());
    std::fs::remove_dir_all(&dir).unwrap();
    // a path that is neither a .gguf file nor a folder is refused, naming both forms
    let err = ModelSource::parse(text).unwrap_err();
    assert!(
        err.contains(".gguf") && err.contains("model folder"),
        "{err}"
    );
}

#[test]
fn min_p_reaches_the_sampling_parameters() {
    let c = parse(&GOOD.replace("top_p = 0.9", "top_p = 0.9\nmin_p = 0.05")).unwrap();
    assert_eq!(c.sampling.params().min_p, Some(0.05));
    assert_eq!(parse(GOOD).unwrap().sampling.params().min_p, None);
}

#[test]
fn a_dynamic_tree_depth_is_bounded_by_its_nodes_and_belongs_to_a_dynamic_tree() {
    let with = |drafter: &str| {
        GOOD.replace(
            "drafter = { kind = \"tree\", branching = [3, 2, 1] }\nverifier = { kind = \"multi_round\" }",
            &format!("drafter = {drafter}\nverifier = {{ kind = \"greedy\" }}"),
        )
        .replace("temperature = 0.7", "temperature = 0.0")
    };
    let good = with("{ kind = \"dynamic_tree\", nodes = 6, top_k = 3, depth = 3 }");
    let config = parse(&good).unwrap();
    assert!(
        format!("{:?}", config.methods[2].drafter).contains("depth = 3"),
        "{:?}",
        config.methods[2].drafter
    );
    for (drafter, named) in [
        (
            "{ kind = \"dynamic_tree\", nodes = 6, top_k = 3, depth = 7 }",
            &["dynamic_tree.depth = 7", "1..=6"][..],
        ),
        (
            "{ kind = \"dynamic_tree\", nodes = 6, top_k = 3, depth = 0 }",
            &["dynamic_tree.depth = 0"][..],
        ),
        (
            "{ kind = \"eagle\", nodes = 6, top_k = 3, depth = 9 }",
            &["eagle.depth = 9", "1..=6"][..],
        ),
        (
            "{ kind = \"eagle\", depth = 2 }",
            &["`depth` belongs to a dynamic tree"][..],
        ),
    ] {
        let msg = error_of(&with(drafter));
        for part in named {
            assert!(msg.contains(part), "`{drafter}`: no `{part}` in {msg}");
        }
    }
}

#[test]
fn a_draft_vocabulary_ranking_is_read_when_the_config_is_checked() {
    use specdec_models::VocabRanking;
    let dir = std::env::temp_dir().join(format!("specdec-config-ranking-{}", std::process::id()));
    let ranking_path = dir.join("ranking.json");
    VocabRanking::from_counts(&[3, 1, 2, 0], &[3], "test counts".into())
        .unwrap()
        .write(&ranking_path)
        .unwrap();
    let with = |keys: &str| {
        GOOD.replace(
            "verifier = { kind = \"rejection\" }",
            &format!("verifier = {{ kind = \"rejection\" }}\n{keys}"),
        )
    };
    let shown = ranking_path.display();
    let good = parse(&with(&format!(
        "draft_vocab = 2\ndraft_vocab_ranking = \"{shown}\""
    )))
    .unwrap();
    assert_eq!(good.methods[1].draft_vocab, Some(2));
    assert_eq!(
        good.methods[1].draft_vocab_ranking.as_deref(),
        Some(ranking_path.as_path())
    );
    std::fs::write(dir.join("bad.json"), "{}").unwrap();
    for (keys, named) in [
        (
            format!("draft_vocab_ranking = \"{shown}\""),
            &["linear-k4", "set draft_vocab too"][..],
        ),
        (
            format!(
                "draft_vocab = 2\ndraft_vocab_ranking = \"{}\"",
                dir.join("none.json").display()
            ),
            &["draft_vocab_ranking", "none.json"][..],
        ),
        (
            format!(
                "draft_vocab = 2\ndraft_vocab_ranking = \"{}\"",
                dir.join("bad.json").display()
            ),
            &["bad.json", "not a vocabulary ranking"][..],
        ),
    ] {
        let msg = error_of(&with(&keys));
        for part in named {
            assert!(msg.contains(part), "`{keys}`: no `{part}` in {msg}");
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_minimum_confidence_is_in_range_and_belongs_to_a_chain() {
    let with = |drafter: &str| {
        GOOD.replace(
            "drafter = { kind = \"tree\", branching = [3, 2, 1] }\nverifier = { kind = \"multi_round\" }",
            &format!("drafter = {drafter}\nverifier = {{ kind = \"greedy\" }}"),
        )
        .replace("temperature = 0.7", "temperature = 0.0")
    };
    for good in [
        "{ kind = \"chain\", min_confidence = 0.3 }",
        "{ kind = \"layer_skip\", min_confidence = 1.0 }",
        "{ kind = \"eagle\", min_confidence = 0.25 }",
    ] {
        let config = parse(&with(good)).unwrap();
        assert!(
            format!("{:?}", config.methods[2].drafter).contains("min_confidence"),
            "{good}: {:?}",
            config.methods[2].drafter
        );
    }
    for (drafter, named) in [
        (
            "{ kind = \"chain\", min_confidence = 0.0 }",
            &["chain.min_confidence = 0", "(0, 1]"][..],
        ),
        (
            "{ kind = \"layer_skip\", min_confidence = 1.5 }",
            &["layer_skip.min_confidence = 1.5"][..],
        ),
        (
            "{ kind = \"eagle\", min_confidence = -1.0 }",
            &["eagle.min_confidence = -1"][..],
        ),
        (
            "{ kind = \"eagle\", nodes = 6, min_confidence = 0.3 }",
            &["`min_confidence` stops a chain"][..],
        ),
        (
            "{ kind = \"dynamic_tree\", nodes = 6, top_k = 3, min_confidence = 0.3 }",
            &["unknown field `min_confidence`"][..],
        ),
    ] {
        let msg = error_of(&with(drafter));
        for part in named {
            assert!(msg.contains(part), "`{drafter}`: no `{part}` in {msg}");
        }
    }
}
