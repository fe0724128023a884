//! Cost of one forward of K new tokens (a chain) after a committed prefix, for K = 1, 2, 4, 8,
//! 16: the curve that decides how much speculation pays (K = 1 is plain decoding, so
//! `1 / time(K=1)` is the decode rate in tokens/s).
//!
//! Runs on SmolLM2-135M; set `SPECDEC_BENCH_MODELS` to a space-separated list of registry names
//! (e.g. `"smollm2-135m qwen2.5-coder-0.5b qwen2.5-coder-1.5b"`) to choose. A model missing from
//! the cache is skipped with a message naming `scripts/fetch-models.sh`. `SPECDEC_BENCH_MATMUL`
//! chooses the matmul path: `int8` (the default, [`MatmulPath::Int8`]), `exact`, or `both`.

use std::hint::black_box;
use std::sync::Arc;

use criterion::{criterion_main, BenchmarkId, Criterion, Throughput};
use specdec_kernels::TreeTopology;
use specdec_models::gguf::GgufFile;
use specdec_models::llama::{LlamaModel, LlamaOptions, MatmulPath};
use specdec_models::{registry, LanguageModel, SequenceStep};

/// Committed tokens before the measured forward.
const PREFIX: usize = 64;

fn forward_k(c: &mut Criterion) {
    let names = std::env::var("SPECDEC_BENCH_MODELS").unwrap_or_else(|_| "smollm2-135m".into());
    let paths: &[(MatmulPath, &str)] = match std::env::var("SPECDEC_BENCH_MATMUL").as_deref() {
        Ok("exact") => &[(MatmulPath::Exact, "exact")],
        Ok("both") => &[(MatmulPath::Exact, "exact"), (MatmulPath::Int8, "int8")],
        _ => &[(MatmulPath::Int8, "int8")],
    };
    for name in names.split_whitespace() {
        for &(path, label) in paths {
            bench_model(c, name, path, label);
        }
    }
}

/// The K-curve of registry model `name` on matmul path `matmul` (group `forward/{name}/{label}`).
fn bench_model(c: &mut Criterion, name: &str, matmul: MatmulPath, label: &str) {
    let Some(entry) = registry::entry(name) else {
        eprintln!("forward bench: `{name}` is not a registered model");
        return;
    };
    let path = match entry.locate() {
        Ok(path) => path,
        Err(err) => {
            eprintln!("forward bench: skipping {name}: {err}");
            return;
        }
    };
    let file = Arc::new(GgufFile::open(path).expect("a readable GGUF file"));
    let mut model = LlamaModel::from_gguf(&file, LlamaOptions::with_matmul(matmul)).expect("loads");
    let seq = model.new_sequence().unwrap();
    // Any in-vocabulary ids do: the cost does not depend on the values.
    let prefix: Vec<u32> = (0..PREFIX as u32).map(|i| 100 + 7 * i).collect();
    let chain = TreeTopology::chain(PREFIX);
    model
        .forward(&[SequenceStep {
            seq,
            tokens: &prefix,
            tree: &chain,
        }])
        .unwrap();
    model.commit(seq, &(0..PREFIX).collect::<Vec<_>>()).unwrap();
    let mut group = c.benchmark_group(format!("forward/{name}/{label}"));
    group.sample_size(10);
    for k in [1usize, 2, 4, 8, 16] {
        let tokens: Vec<u32> = (0..k as u32).map(|i| 200 + i).collect();
        let tree = TreeTopology::chain(k);
        group.throughput(Throughput::Elements(k as u64));
        group.bench_with_input(BenchmarkId::from_parameter(k), &k, |b, _| {
            // Each forward discards the previous one's uncommitted entries.
            b.iter(|| {
                black_box(
                    model
                        .forward(&[SequenceStep {
                            seq,
                            tokens: &tokens,
                            tree: &tree,
                        }])
                        .unwrap(),
                )
            })
        });
    }
    group.finish();
}

// `criterion_group!` defines an undocumented public function.
#[allow(missing_docs)]
mod group {
    criterion::criterion_group!(benches, super::forward_k);
}
use group::benches;
criterion_main!(benches);
