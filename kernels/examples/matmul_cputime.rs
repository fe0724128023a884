//! Cost of the quantised matmul at Qwen2.5-Coder-1.5B's FFN shape (`[8960 x 1536]`, Q4_K and
//! Q6_K), measured in **process CPU time** as well as wall time, so figures stay meaningful on a
//! shared, busy machine (criterion's wall-clock numbers in `benches/quant_matmul.rs` do not).
//!
//! `RAYON_NUM_THREADS=1 cargo run --release -p specdec-kernels --example matmul_cputime [int8|f32]`
//!
//! Prints, per path and n_tokens: CPU ms per call, wall ms per call, GB/s of weights per CPU
//! second, and the cost relative to one token. Synthetic weights (speed does not depend on them).

use specdec_kernels::quant::{
    quant_matmul, quant_matmul_int8, synthetic_weights, Q8Activations, QuantMatrix, QuantType,
};
use std::time::Instant;

/// User + system CPU seconds of this process (from /proc/self/stat; Linux only).
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let fields: Vec<&str> = stat
        .rsplit(')')
        .next()
        .unwrap_or("")
        .split_whitespace()
        .collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (ticks(11) + ticks(12)) / 100.0
}

fn main() {
    let (rows, cols) = (8960usize, 1536usize);
    let only = std::env::args().nth(1).unwrap_or_default();
    for ty in [QuantType::Q4_K, QuantType::Q6_K] {
        let data = synthetic_weights(ty, rows, cols, 1).expect("cols is a multiple of 256");
        let w = QuantMatrix::new(ty, rows, cols, &data).expect("consistent shape");
        for path in ["int8", "f32"] {
            if !only.is_empty() && path != only {
                continue;
            }
            let mut one_token = 0.0;
            for n in [1usize, 2, 4, 8, 16] {
                let x: Vec<f32> = (0..n * cols)
                    .map(|i| ((i * 37 % 101) as f32 - 50.0) / 50.0)
                    .collect();
                let mut out = vec![0.0; n * rows];
                let mut run = || {
                    if path == "int8" {
                        let acts = Q8Activations::quantize(&x, n, cols).expect("finite input");
                        quant_matmul_int8(&w, &acts, &mut out).expect("consistent shapes");
                    } else {
                        quant_matmul(&w, &x, n, &mut out).expect("consistent shapes");
                    }
                };
                run();
                let (cpu0, wall0) = (cpu_seconds(), Instant::now());
                let mut iters = 0u32;
                while cpu_seconds() - cpu0 < 1.0 && wall0.elapsed().as_secs_f64() < 10.0 {
                    run();
                    iters += 1;
                }
                let cpu = (cpu_seconds() - cpu0) / f64::from(iters);
                let wall = wall0.elapsed().as_secs_f64() / f64::from(iters);
                if n == 1 {
                    one_token = cpu;
                }
                println!(
                    "{ty} {path:4} n={n:2}: cpu {:7.3} ms  wall {:7.3} ms  {:5.1} GB/s per cpu-s  x{:.2} of n=1",
                    cpu * 1e3,
                    wall * 1e3,
                    data.len() as f64 / cpu / 1e9,
                    cpu / one_token
                );
            }
        }
    }
}
