//! `specdec bench serve` end to end on 127.0.0.1 with SmolLM2-135M, CI-sized: 3 requests per
//! point, rates 0.5× and 1× of plain's capacity (in blocks of 2 and 1 requests), 1 and 2
//! closed-loop clients, 8 tokens each.
//! Checks that the results folder has its files, that every request completed in both modes,
//! that the counts add up across requests.jsonl, phases.jsonl and summary.csv, that the ratios
//! are finite, that greedy speculation gives plain's text, and that a second run beside the
//! first does not overwrite it.
//!
//! Needs the SmolLM2 GGUF, MT-Bench and HumanEval in the cache (`scripts/fetch-models.sh`);
//! skipped without them unless `SPECDEC_REQUIRE_MODELS` names them (scripts/test.sh sets it).

use std::collections::BTreeSet;

use serde_json::Value;
use specdec_models::registry;
use specdec_server::bench::report::{Load, Mode};
use specdec_server::bench::{run, ServeBenchArgs};

const MODEL: &str = "smollm2-135m";

#[test]
fn a_tiny_bench_serve_run_writes_complete_consistent_results() {
    if ["smollm2-135m", "mtbench", "humaneval"]
        .iter()
        .any(|name| registry::cached_for_test(name).is_none())
    {
        return;
    }
    let out = std::env::temp_dir().join(format!("specdec-bench-serve-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let args = ServeBenchArgs {
        method: "ngram".into(),
        k: 3,
        batch_size: 2,
        max_tokens: 8,
        requests: 3,
        rates: vec![0.5, 1.0],
        clients: vec![1, 2],
        block: 2,
        out: Some(out.clone()),
        ..ServeBenchArgs::new(MODEL)
    };
    let outcome = run(&args).expect("the benchmark runs");
    assert_eq!(outcome.dir, out);
    assert!(outcome.capacity_rps.is_finite() && outcome.capacity_rps > 0.0);
    for file in [
        "provenance.json",
        "requests.jsonl",
        "phases.jsonl",
        "summary.csv",
        "summary.md",
        "tpot_by_rate.svg",
        "throughput_by_rate.svg",
        "tpot_by_clients.svg",
        "throughput_by_clients.svg",
    ] {
        let path = out.join(file);
        let bytes = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
        assert!(bytes > 0, "{} is missing or empty", path.display());
    }

    // every request completed, with its tokens and times
    let lines = std::fs::read_to_string(out.join("requests.jsonl")).unwrap();
    let requests: Vec<Value> = lines
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    // 4 points × 3 requests × 2 modes
    assert_eq!(requests.len(), 4 * 3 * 2);
    assert_eq!(requests.len(), outcome.requests.len());
    for r in &outcome.requests {
        assert_eq!(r.error, None, "{r:?}");
        assert!((1..=8).contains(&r.completion_tokens), "{r:?}");
        assert!(r.prompt_tokens > 0);
        let ttft = r.ttft_s.expect("a first chunk");
        assert!(ttft > 0.0 && ttft <= r.e2e_s, "{r:?}");
        if r.completion_tokens > 1 {
            assert!(r.tpot_s.is_some_and(|t| t.is_finite() && t >= 0.0), "{r:?}");
        }
        if r.mode == Mode::Plain {
            assert_eq!(
                (r.accepted, r.rejected),
                (0, 0),
                "plain decoding drafts nothing"
            );
        }
    }
    // both modes saw the same prompts at every point
    for mode in [Mode::Plain, Mode::Speculative] {
        let prompts: BTreeSet<(String, usize)> = outcome
            .requests
            .iter()
            .filter(|r| r.mode == mode)
            .map(|r| (r.prompt_id.clone(), r.index))
            .collect();
        assert_eq!(prompts.len(), 3, "{mode:?}: indices 0..3, one prompt each");
    }

    // phases and rows add up to the requests: a rate point is two blocks (2 + 1 requests),
    // the second in the other order; a closed-loop point is one
    let phases = std::fs::read_to_string(out.join("phases.jsonl")).unwrap();
    let phases: Vec<Value> = phases
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(phases.len(), 2 * 2 * 2 + 2 * 2);
    let shape: Vec<(&str, u64, u64)> = phases[..4]
        .iter()
        .map(|p| {
            let mode = p["mode"].as_str().unwrap();
            (
                mode,
                p["block"].as_u64().unwrap(),
                p["requests"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        shape,
        [
            ("plain", 0, 2),
            ("speculative", 0, 2),
            ("speculative", 1, 1),
            ("plain", 1, 1)
        ]
    );
    assert_eq!(outcome.rows.len(), 4 * 2);
    let mut plain_passes = 0.0;
    for row in &outcome.rows {
        assert_eq!((row.requests, row.failed), (3, 0), "{row:?}");
        assert!(row.throughput_tps.is_finite() && row.throughput_tps > 0.0);
        assert!(row.tpot_p50_s.is_some() && row.ttft_p99_s >= row.ttft_p50_s);
        let share = row.spec_share.expect("target passes were counted");
        assert!((0.0..=1.0).contains(&share));
        match row.mode {
            Mode::Plain => {
                assert_eq!(share, 0.0, "the plain server never speculates");
                plain_passes += 1.0;
                assert_eq!(row.tpot_ratio, None);
            }
            Mode::Speculative => {
                let (t, q) = (row.tpot_ratio.unwrap(), row.throughput_ratio.unwrap());
                assert!(
                    t.is_finite() && t > 0.0 && q.is_finite() && q > 0.0,
                    "{row:?}"
                );
                // greedy: speculation gives plain decoding's text
                assert_eq!(row.same_text, Some(3), "{row:?}");
                // greedy twins have as many tokens: each request with a TPOT is paired
                let timed = outcome
                    .requests
                    .iter()
                    .filter(|r| r.mode == row.mode && r.load == row.load && r.tpot_s.is_some())
                    .count();
                let paired = row.tpot_paired.expect("the requests are paired");
                assert_eq!(paired.n, timed, "{row:?}");
                assert!(
                    paired.lo <= paired.mean && paired.mean <= paired.hi,
                    "{row:?}"
                );
            }
        }
    }
    assert_eq!(plain_passes, 4.0);
    let loads: Vec<Load> = outcome.rows.iter().map(|r| r.load).collect();
    assert!(matches!(loads[0], Load::Rate { multiplier, .. } if multiplier == 0.5));
    assert!(matches!(loads[7], Load::Clients { clients: 2 }));
    let csv = std::fs::read_to_string(out.join("summary.csv")).unwrap();
    assert_eq!(csv.lines().count(), 1 + 8);
    let md = std::fs::read_to_string(out.join("summary.md")).unwrap();
    assert!(md.contains("| speculative | 2 clients | 3 | 0 |"), "{md}");
    assert!(md.contains("lowest rate (0.5×"), "{md}");
    let provenance: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("provenance.json")).unwrap())
            .unwrap();
    assert_eq!(provenance["complete"], true);

    // a second run does not overwrite the first: it refuses bad input first, then writes
    // beside it
    let bad = ServeBenchArgs {
        rates: Vec::new(),
        ..args.clone()
    };
    assert!(run(&bad).unwrap_err().to_string().contains("--rates"));
    let again = ServeBenchArgs {
        rates: vec![1.0],
        clients: vec![1],
        requests: 1,
        ..args
    };
    let second = run(&again).expect("the second run");
    let expected = out.with_file_name(format!("{}-2", out.file_name().unwrap().to_string_lossy()));
    assert_eq!(second.dir, expected);
    let first_lines = std::fs::read_to_string(out.join("requests.jsonl")).unwrap();
    assert_eq!(first_lines, lines, "the first run's records are kept");
    let _ = std::fs::remove_dir_all(&out);
    let _ = std::fs::remove_dir_all(&expected);
}
