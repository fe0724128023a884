//! The simulated reproductions at their `--quick` size (no models): every output file is
//! written, and the tables say what the simulation must say.

use std::path::PathBuf;

use specdec_harness::repro::{batching, tree_scaling};

fn temp_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("specdec-repro-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn json(dir: &std::path::Path, name: &str) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join(name)).unwrap()).unwrap()
}

#[test]
fn tree_scaling_quick_writes_every_file() {
    let dir = temp_dir("tree");
    let p = tree_scaling::TreeScalingParams::quick();
    let out = tree_scaling::run(&dir, &p).unwrap();
    let names: Vec<String> = out
        .files
        .iter()
        .map(|f| f.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    for want in [
        "tree_scaling.md",
        "tree_scaling.json",
        "tree_scaling_tau.svg",
        "tree_scaling_speedup_cpu.svg",
        "tree_scaling_speedup_gpu.svg",
    ] {
        assert!(names.iter().any(|n| n == want), "{want} missing: {names:?}");
    }
    for f in &out.files {
        assert!(std::fs::metadata(f).unwrap().len() > 0, "{}", f.display());
    }
    let v = json(&dir, "tree_scaling.json");
    let rows = v["rows"].as_array().unwrap();
    assert_eq!(rows.len(), p.budgets.len() * 5);
    for budget in &p.budgets {
        let of: Vec<&serde_json::Value> = rows
            .iter()
            .filter(|r| r["budget"].as_u64() == Some(*budget as u64))
            .collect();
        let mut best_static = 0.0f64;
        for r in &of {
            let sim = r["tau_sim"]["mean"].as_f64().unwrap();
            assert!(r["nodes"].as_f64().unwrap() <= *budget as f64 + 1e-9);
            if let Some(exact) = r["tau_analytic"].as_f64() {
                // 2 000 steps, per-step sd ≤ 3: the mean's sd ≤ 0.07; allow 5 sd.
                assert!((sim - exact).abs() < 0.35, "{r}");
                best_static = best_static.max(exact);
            }
        }
        // The dynamic tree sees each step's node probabilities: on the same worlds it accepts
        // at least about as much as the best static tree.
        let dynamic = of
            .iter()
            .find(|r| r["tau_analytic"].is_null())
            .expect("a dynamic row");
        assert!(
            dynamic["tau_sim"]["mean"].as_f64().unwrap() > best_static - 0.15,
            "{dynamic}"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn batching_quick_writes_every_file_and_finds_the_crossover() {
    let dir = temp_dir("batch");
    let p = batching::BatchingParams::quick();
    let out = batching::run(&dir, &p).unwrap();
    assert_eq!(out.files.len(), 6);
    for f in &out.files {
        assert!(std::fs::metadata(f).unwrap().len() > 0, "{}", f.display());
    }
    let v = json(&dir, "batching.json");
    let rows = v["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 2 * p.batches.len() * 5);
    let speedup = |cost: &str, batch: u64, method: &str| -> f64 {
        rows.iter()
            .find(|r| {
                r["cost"].as_str().unwrap().starts_with(cost)
                    && r["batch"].as_u64() == Some(batch)
                    && r["method"].as_str().unwrap().starts_with(method)
            })
            .unwrap_or_else(|| panic!("{cost} {batch} {method}"))["speedup"]
            .as_f64()
            .unwrap()
    };
    for b in &p.batches {
        assert_eq!(speedup("GPU", *b as u64, "plain"), 1.0);
    }
    // On the roofline, fixed K pays alone and stops paying once the batch crosses the knee.
    assert!(speedup("GPU", 1, "fixed") > 1.2);
    assert!(speedup("GPU", 16, "fixed") < 0.9);
    // The batch-aware cost model steps aside there; with batch-1 costs it does not.
    assert!(speedup("GPU", 16, "cost model, batch-aware") > speedup("GPU", 16, "fixed") + 0.1);
    assert!(
        speedup("GPU", 16, "cost model, batch-aware")
            > speedup("GPU", 16, "cost model, batch-1") + 0.1
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
