//! Tests of the model benchmark on a toy model (no model file needed).

use specdec_models::toy::{ToyLanguageModel, ToyModel, ToyStyle};
use specdec_models::{LanguageModel, Logits, SeqId, SequenceStep};

use super::table::{render_model, render_ops, render_split};
use super::*;

/// A toy model that records `(committed length, new tokens)` of every forward.
struct Recording {
    inner: ToyLanguageModel,
    forwards: Vec<(usize, usize)>,
}

impl LanguageModel for Recording {
    fn vocab_size(&self) -> usize {
        self.inner.vocab_size()
    }
    fn bos_id(&self) -> Option<u32> {
        self.inner.bos_id()
    }
    fn eos_ids(&self) -> &[u32] {
        self.inner.eos_ids()
    }
    fn max_context(&self) -> usize {
        self.inner.max_context()
    }
    fn new_sequence(&mut self) -> specdec_models::Result<SeqId> {
        self.inner.new_sequence()
    }
    fn fork(&mut self, seq: SeqId) -> specdec_models::Result<SeqId> {
        self.inner.fork(seq)
    }
    fn release(&mut self, seq: SeqId) -> specdec_models::Result<()> {
        self.inner.release(seq)
    }
    fn seq_len(&self, seq: SeqId) -> specdec_models::Result<usize> {
        self.inner.seq_len(seq)
    }
    fn forward(&mut self, steps: &[SequenceStep<'_>]) -> specdec_models::Result<Vec<Logits>> {
        for s in steps {
            self.forwards
                .push((self.inner.seq_len(s.seq)?, s.tokens.len()));
        }
        self.inner.forward(steps)
    }
    fn commit(&mut self, seq: SeqId, path: &[usize]) -> specdec_models::Result<()> {
        self.inner.commit(seq, path)
    }
    fn rewind(&mut self, seq: SeqId, n: usize) -> specdec_models::Result<()> {
        self.inner.rewind(seq, n)
    }
}

fn toy(max_context: usize) -> Recording {
    let table = ToyModel::seeded(11, 5, 2, ToyStyle::default()).unwrap();
    Recording {
        inner: ToyLanguageModel::new(table, max_context, vec![]),
        forwards: Vec::new(),
    }
}

fn small_config() -> ModelBenchConfig {
    ModelBenchConfig {
        prompt_tokens: 6,
        decode_tokens: 4,
        verify_prefix: 5,
        verify_ks: vec![4, 2, 2],
        repeats: 3,
        seed: 1,
    }
}

#[test]
fn forwards_exactly_the_planned_steps_and_releases_everything() {
    let mut model = toy(64);
    let config = small_config();
    let result = bench_model(&mut model, &config).unwrap();
    let reps = config.repeats;
    let mut expected = Vec::new();
    // Prompt processing: a warm-up and `reps` prefills into empty sequences.
    expected.extend(std::iter::repeat_n((0, 6), reps + 1));
    // Decode: a one-token warm-up, then `reps` runs of 4 committed tokens.
    expected.push((0, 1));
    for _ in 0..reps {
        expected.extend((0..4).map(|i| (i, 1)));
    }
    // Verify: the prefix, then K = 1, 2, 4 interleaved, each after exactly the prefix.
    expected.push((0, 5));
    for _ in 0..=reps {
        expected.extend([(5, 1), (5, 2), (5, 4)]);
    }
    assert_eq!(model.forwards, expected);
    let total: usize = expected.iter().map(|f| f.1).sum();
    assert_eq!(model.inner.forwarded_tokens(), total as u64);
    // Every sequence opened was released.
    for id in 0..8 {
        assert!(model.seq_len(SeqId(id)).is_err(), "sequence {id} left open");
    }
    let ks: Vec<usize> = result.verify.iter().map(|v| v.k).collect();
    assert_eq!(ks, vec![1, 2, 4]);
    assert_eq!(result.relative_cost(1), Some(1.0));
    assert!(result.relative_cost(8).is_none());
    assert!(result.prompt_tokens_per_s > 0.0 && result.decode_tokens_per_s > 0.0);
    for v in &result.verify {
        assert!(v.median_s > 0.0);
        assert!((v.relative - v.median_s / result.verify[0].median_s).abs() < 1e-12);
    }
}

#[test]
fn invalid_configs_are_refused_with_the_field_named() {
    let mut model = toy(16);
    let cases = [
        (
            ModelBenchConfig {
                prompt_tokens: 0,
                ..small_config()
            },
            "prompt_tokens",
        ),
        (
            ModelBenchConfig {
                decode_tokens: 0,
                ..small_config()
            },
            "decode_tokens",
        ),
        (
            ModelBenchConfig {
                repeats: 0,
                ..small_config()
            },
            "repeats",
        ),
        (
            ModelBenchConfig {
                verify_ks: vec![0, 2],
                ..small_config()
            },
            "K values",
        ),
        (
            ModelBenchConfig {
                verify_prefix: 10,
                verify_ks: vec![8],
                ..small_config()
            },
            "18 positions",
        ),
        (
            ModelBenchConfig {
                repeats: 1_000_000_000,
                ..small_config()
            },
            "repeats 1000000000 is not in 1..=1000",
        ),
        (
            // `--ks 1000000` once sized a KV cache for a million tokens before any check
            ModelBenchConfig {
                verify_ks: vec![1_000_000],
                ..small_config()
            },
            "1000",
        ),
        (
            ModelBenchConfig {
                verify_prefix: usize::MAX,
                ..small_config()
            },
            "positions but the model's context is 16",
        ),
    ];
    for (config, needle) in cases {
        let err = bench_model(&mut model, &config).unwrap_err().to_string();
        assert!(err.contains(needle), "{err} should name {needle}");
    }
    assert!(
        model.forwards.is_empty(),
        "nothing forwarded on a refused config"
    );
}

fn report() -> BenchReport {
    let mut model = toy(64);
    let result = bench_model(&mut model, &small_config()).unwrap();
    BenchReport {
        model: "toy".into(),
        path: "/nowhere/toy.gguf".into(),
        file_bytes: 3 << 20,
        threads: 2,
        load_s: 0.5,
        bench_wall_s: 4.0,
        cpu: Some(CpuTimes {
            on_cpu_s: 6.0,
            runqueue_wait_s: 1.5,
        }),
        peak_rss_bytes: Some(100 << 20),
        result,
        matmuls: None,
        attention: None,
        ops: None,
    }
}

#[test]
fn table_lists_every_k_and_the_memory() {
    let report = report();
    let text = render_model(&report);
    assert!(text.contains("specdec bench toy"), "{text}");
    assert!(text.contains("3.0 MiB file, 2 threads"), "{text}");
    assert!(text.contains("100.0 MiB"), "{text}");
    assert!(text.contains("pp6") && text.contains("tg4"), "{text}");
    assert!(
        text.contains("CPU 6.0 s, waiting for a CPU 1.5 s, over 4.0 s wall"),
        "{text}"
    );
    // Header + one line per K after the "verify cost" line.
    let after: Vec<&str> = text
        .lines()
        .skip_while(|l| !l.contains("verify cost"))
        .collect();
    assert_eq!(after.len(), 2 + report.result.verify.len(), "{text}");
    assert!(after[2].trim_start().starts_with("1 "), "{text}");
}

#[test]
fn split_table_subtracts_matmuls_from_the_forward() {
    let report = report();
    let matmuls: Vec<MatmulTiming> = kernels::GROUPS
        .iter()
        .map(|g| MatmulTiming {
            group: g.to_string(),
            k: 2,
            median_s: report.result.verify[1].median_s / 10.0,
            weight_bytes: 1000,
        })
        .collect();
    let text = render_split(&report, &matmuls, &[]);
    // Only K = 2 has matmul timings: header lines + one row; five groups of a tenth = 50 %.
    assert_eq!(text.lines().count(), 3, "{text}");
    assert!(!text.contains("attention"), "{text}");
    assert!(
        text.lines().last().unwrap().trim_end().ends_with("50%"),
        "{text}"
    );
    let forward_ms = report.result.verify[1].median_s * 1e3;
    let rest = |line: &str| -> f64 {
        let fields: Vec<&str> = line.split_whitespace().collect();
        fields[fields.len() - 2].parse().unwrap()
    };
    assert!((rest(text.lines().last().unwrap()) - forward_ms / 2.0).abs() < 2e-3);

    // with attention: its own column, taken from the rest; a K it lacks is skipped
    let attention = [
        AttentionTiming {
            k: 2,
            median_s: report.result.verify[1].median_s / 4.0,
        },
        AttentionTiming {
            k: 7,
            median_s: 1.0,
        },
    ];
    let text = render_split(&report, &matmuls, &attention);
    assert!(
        text.lines()
            .next()
            .unwrap()
            .contains("attention over all layers"),
        "{text}"
    );
    assert!(text.lines().nth(1).unwrap().contains("attention"), "{text}");
    assert_eq!(text.lines().count(), 3, "{text}");
    let last = text.lines().last().unwrap();
    assert!((rest(last) - forward_ms / 4.0).abs() < 2e-3, "{text}");
    assert!(last.trim_end().ends_with("50%"), "{text}");
    let without_k2 = render_split(&report, &matmuls, &attention[1..]);
    assert_eq!(without_k2.lines().count(), 2, "{without_k2}");
}

#[test]
fn ops_table_has_a_row_per_op_a_column_per_k_and_their_sum() {
    let report = report();
    let share = |op: &str, ms: f64| OpShare {
        op: op.to_string(),
        ms_per_forward: ms,
    };
    let splits = [
        OpSplit {
            k: 1,
            ops: vec![share("qkv", 1.0), share("attention", 0.5)],
        },
        OpSplit {
            k: 99,
            ops: vec![share("qkv", 2.0), share("lm_head", 0.25)],
        },
    ];
    let text = render_ops(&report, &splits);
    let lines: Vec<&str> = text.lines().collect();
    // title, header, three ops (in first-seen order), sum, forward
    assert_eq!(lines.len(), 7, "{text}");
    let cells = |line: &str| {
        line.split_whitespace()
            .map(str::to_string)
            .collect::<Vec<_>>()
    };
    assert_eq!(cells(lines[2]), ["qkv", "1.000", "2.000"]);
    assert_eq!(cells(lines[3]), ["attention", "0.500", "0.000"]);
    assert_eq!(cells(lines[4]), ["lm_head", "0.000", "0.250"]);
    assert_eq!(cells(lines[5]), ["sum", "1.500", "2.250"]);
    let forward = cells(lines[6]);
    assert_eq!(forward[0], "forward");
    let k1_ms: f64 = forward[1].parse().unwrap();
    assert!(
        (k1_ms - report.result.verify[0].median_s * 1e3).abs() < 1e-3,
        "{text}"
    );
    assert_eq!(forward[2], "-", "K = 99 has no verify time");
}

#[test]
fn report_round_trips_through_json() {
    let report = report();
    let json = serde_json::to_string(&report).unwrap();
    assert!(!json.contains("matmuls"), "absent matmuls are not written");
    assert!(
        !json.contains("attention"),
        "absent attention timings are not written"
    );
    let back: BenchReport = serde_json::from_str(&json).unwrap();
    // serde_json's float parsing may differ from the printed value in the last bit.
    let close = |a: f64, b: f64| (a - b).abs() <= 1e-12 * a.abs().max(b.abs());
    assert_eq!(back.result.config, report.result.config);
    assert_eq!(
        (back.model.as_str(), back.file_bytes, back.peak_rss_bytes),
        (
            report.model.as_str(),
            report.file_bytes,
            report.peak_rss_bytes
        )
    );
    assert!(close(
        back.result.decode_tokens_per_s,
        report.result.decode_tokens_per_s
    ));
    assert_eq!(back.result.verify.len(), report.result.verify.len());
    for (a, b) in back.result.verify.iter().zip(&report.result.verify) {
        assert_eq!(a.k, b.k);
        assert!(close(a.median_s, b.median_s) && close(a.relative, b.relative));
    }
}
