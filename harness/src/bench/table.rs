//! Plain-text tables of benchmark results.

use std::fmt::Write;

use super::kernels::{AttentionTiming, MatmulTiming, OpSplit, GROUPS};
use super::BenchReport;

/// The end-to-end table of one report: header line, pp and decode tokens/s, peak memory, and
/// the verify-cost curve.
pub fn render_model(report: &BenchReport) -> String {
    let r = &report.result;
    let c = &r.config;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "specdec bench {}  ({}, {:.1} MiB file, {} threads, loaded in {:.2} s)",
        report.model,
        report.path,
        report.file_bytes as f64 / MIB,
        report.threads,
        report.load_s
    );
    let _ = writeln!(
        s,
        "  prompt processing  pp{:<4} {:>10.1} tokens/s",
        c.prompt_tokens, r.prompt_tokens_per_s
    );
    let _ = writeln!(
        s,
        "  decode             tg{:<4} {:>10.1} tokens/s",
        c.decode_tokens, r.decode_tokens_per_s
    );
    let peak = report
        .peak_rss_bytes
        .map_or("n/a".to_string(), |b| format!("{:.1}", b as f64 / MIB));
    let _ = writeln!(s, "  peak RSS (VmHWM)   {peak:>16} MiB");
    if let Some(cpu) = report.cpu {
        let _ = writeln!(
            s,
            "  CPU {:.1} s, waiting for a CPU {:.1} s, over {:.1} s wall (load from other work)",
            cpu.on_cpu_s, cpu.runqueue_wait_s, report.bench_wall_s
        );
    }
    let _ = writeln!(
        s,
        "  verify cost after {} tokens (median of {}):",
        c.verify_prefix, c.repeats
    );
    let _ = writeln!(
        s,
        "  {:>4} {:>12} {:>10} {:>12}",
        "K", "ms", "x K=1", "ms/token"
    );
    for v in &r.verify {
        let _ = writeln!(
            s,
            "  {:>4} {:>12.3} {:>10.2} {:>12.3}",
            v.k,
            v.median_s * 1e3,
            v.relative,
            v.median_s * 1e3 / v.k as f64
        );
    }
    s
}

/// The split of one forward into matmul groups, attention and the rest, per K: `forward_ms`
/// per K comes from the verify curve of `report`, the matmuls from `matmuls` (see
/// [`super::kernels::bench_matmuls`]), attention from `attention`
/// ([`super::kernels::bench_attention`]; its column is left out when empty); K values missing
/// from the matmuls are skipped, and a K missing from a non-empty `attention` too.
pub fn render_split(
    report: &BenchReport,
    matmuls: &[MatmulTiming],
    attention: &[AttentionTiming],
) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "forward split, {} ({} threads): matmul time per group over all layers, ms (GB/s of weights){}",
        report.model,
        report.threads,
        if attention.is_empty() {
            String::new()
        } else {
            format!(
                "; attention over all layers, ms, after {} tokens",
                report.result.config.verify_prefix
            )
        }
    );
    let mut header = format!("  {:>4} {:>10}", "K", "forward");
    for g in GROUPS {
        let _ = write!(header, " {g:>17}");
    }
    let _ = write!(header, " {:>10}", "matmuls");
    if !attention.is_empty() {
        let _ = write!(header, " {:>10}", "attention");
    }
    let _ = write!(header, " {:>10} {:>7}", "rest", "mm %");
    let _ = writeln!(s, "{header}");
    for v in &report.result.verify {
        let row: Vec<&MatmulTiming> = matmuls.iter().filter(|m| m.k == v.k).collect();
        let attention_ms = attention
            .iter()
            .find(|a| a.k == v.k)
            .map(|a| a.median_s * 1e3);
        if row.len() != GROUPS.len() || (!attention.is_empty() && attention_ms.is_none()) {
            continue;
        }
        let forward_ms = v.median_s * 1e3;
        let mm_ms: f64 = row.iter().map(|m| m.median_s * 1e3).sum();
        let _ = write!(s, "  {:>4} {:>10.3}", v.k, forward_ms);
        for m in &row {
            let _ = write!(s, " {:>9.3} ({:>5.1})", m.median_s * 1e3, m.gb_per_s());
        }
        let _ = write!(s, " {mm_ms:>10.3}");
        if let Some(a) = attention_ms {
            let _ = write!(s, " {a:>10.3}");
        }
        let _ = writeln!(
            s,
            " {:>10.3} {:>6.0}%",
            forward_ms - mm_ms - attention_ms.unwrap_or(0.0),
            100.0 * mm_ms / forward_ms
        );
    }
    s
}

/// The forward split into its ops (timed inside it; [`super::kernels::bench_ops`]): one row per
/// op, one column per K, milliseconds per forward; then their sum and the verify curve's
/// forward time for each K.
pub fn render_ops(report: &BenchReport, splits: &[OpSplit]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "forward ops, {} ({} threads), timed inside the forward: ms per forward after {} tokens",
        report.model, report.threads, report.result.config.verify_prefix
    );
    let mut header = format!("  {:>10}", "op \\ K");
    for split in splits {
        let _ = write!(header, " {:>9}", split.k);
    }
    let _ = writeln!(s, "{header}");
    let mut ops: Vec<&str> = Vec::new();
    for op in splits.iter().flat_map(|split| &split.ops) {
        if !ops.contains(&op.op.as_str()) {
            ops.push(&op.op);
        }
    }
    let ms = |split: &OpSplit, op: &str| {
        split
            .ops
            .iter()
            .find(|o| o.op == op)
            .map_or(0.0, |o| o.ms_per_forward)
    };
    for op in &ops {
        let _ = write!(s, "  {op:>10}");
        for split in splits {
            let _ = write!(s, " {:>9.3}", ms(split, op));
        }
        let _ = writeln!(s);
    }
    let _ = write!(s, "  {:>10}", "sum");
    for split in splits {
        let _ = write!(
            s,
            " {:>9.3}",
            ops.iter().map(|op| ms(split, op)).sum::<f64>()
        );
    }
    let _ = writeln!(s);
    let _ = write!(s, "  {:>10}", "forward");
    for split in splits {
        match report.result.verify.iter().find(|v| v.k == split.k) {
            Some(v) => {
                let _ = write!(s, " {:>9.3}", v.median_s * 1e3);
            }
            None => {
                let _ = write!(s, " {:>9}", "-");
            }
        }
    }
    let _ = writeln!(s);
    s
}

const MIB: f64 = 1024.0 * 1024.0;
