//! GPU benchmark runner for the bundle made by `scripts/gpu-check.sh`.
//!
//! Measures this machine's ceilings first (device copy bandwidth with a vectorised copy kernel,
//! bf16 matrix rate with cuBLAS), then each kernel at stated shapes, and prints one table:
//! kernel, shape, median time, GB/s or TFLOP/s, % of the ceiling measured in the same run.
//! Timing: CUDA events around each launch, 3 warm-up runs, median of 20.
//! Bytes are what must move (each input read once, each output written once).
//! Exits 0 with a note when there is no GPU, unless `SPECDEC_REQUIRE_GPU=1`.

use std::sync::Arc;

use cudarc::cublas::{sys::cublasOperation_t, Gemm, GemmConfig};
use cudarc::driver::{sys::CUevent_flags, CudaSlice, LaunchConfig, PushKernelArg};
use half::bf16;
use specdec_kernels::attention::cuda::tree_attention_cuda;
use specdec_kernels::attention::{AttentionParams, AttentionSeq};
use specdec_kernels::cuda::{probe::cuda_device_count, sources, testing::gpu_required, Gpu};
use specdec_kernels::kv::cuda::{move_slots, KvShape};
use specdec_kernels::kv::KvLayout;
use specdec_kernels::sampling::SeededSequences;
use specdec_kernels::tree::TreeTopology;
use specdec_kernels::verification::cuda::VerifyPlan;
use specdec_kernels::verification::{DraftKind, DraftTree, VerifyInput, VerifyMethod};

type Res<T> = Result<T, Box<dyn std::error::Error>>;

/// Median milliseconds of `f` over 20 timed runs after 3 warm-ups.
fn time_ms(gpu: &Gpu, mut f: impl FnMut() -> Res<()>) -> Res<f64> {
    for _ in 0..3 {
        f()?;
    }
    let stream = gpu.stream();
    let mut times = Vec::new();
    for _ in 0..20 {
        let start = stream.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
        f()?;
        let end = stream.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
        end.synchronize()?;
        times.push(f64::from(start.elapsed_ms(&end)?));
    }
    times.sort_by(|a, b| a.total_cmp(b));
    Ok(times[times.len() / 2])
}

struct Row {
    kernel: String,
    shape: String,
    ms: f64,
    rate: f64,
    unit: &'static str,
    ceiling: f64,
}

fn bench_copy(gpu: &Arc<Gpu>) -> Res<(f64, Row)> {
    let n4 = (256usize << 20) / 16; // float4 elements in 256 MiB
    let stream = gpu.stream();
    let src: CudaSlice<f32> = stream.alloc_zeros(n4 * 4)?;
    let mut dst: CudaSlice<f32> = stream.alloc_zeros(n4 * 4)?;
    let f = gpu.function(&sources::BENCH_COPY, "bench_copy_f32x4")?;
    let n = n4 as u64;
    let ms = time_ms(gpu, || {
        let mut l = stream.launch_builder(&f);
        l.arg(&src).arg(&mut dst).arg(&n);
        // SAFETY: both buffers hold n4 float4s, the kernel's bound.
        unsafe {
            l.launch(LaunchConfig {
                grid_dim: (132 * 8, 1, 1),
                block_dim: (512, 1, 1),
                shared_mem_bytes: 0,
            })
        }?;
        Ok(())
    })?;
    let gbs = (2 * n4 * 16) as f64 / (ms * 1e6);
    Ok((
        gbs,
        Row {
            kernel: "copy (ceiling)".into(),
            shape: format!("{} MiB", (n4 * 16) >> 20),
            ms,
            rate: gbs,
            unit: "GB/s",
            ceiling: gbs,
        },
    ))
}

fn bench_gemm(gpu: &Arc<Gpu>) -> Res<(f64, Row)> {
    let n = 8192usize;
    let stream = gpu.stream();
    let a: CudaSlice<bf16> = stream.alloc_zeros(n * n)?;
    let b: CudaSlice<bf16> = stream.alloc_zeros(n * n)?;
    let mut c: CudaSlice<bf16> = stream.alloc_zeros(n * n)?;
    let blas = gpu.blas()?;
    let cfg = GemmConfig {
        transa: cublasOperation_t::CUBLAS_OP_N,
        transb: cublasOperation_t::CUBLAS_OP_N,
        m: n as i32,
        n: n as i32,
        k: n as i32,
        alpha: bf16::ONE,
        lda: n as i32,
        ldb: n as i32,
        beta: bf16::ZERO,
        ldc: n as i32,
    };
    let ms = time_ms(gpu, || {
        // SAFETY: all three matrices are n x n, matching the config.
        unsafe { blas.gemm(cfg, &a, &b, &mut c) }?;
        Ok(())
    })?;
    let tf = 2.0 * (n as f64).powi(3) / (ms * 1e9);
    Ok((
        tf,
        Row {
            kernel: "cuBLAS bf16 gemm (ceiling)".into(),
            shape: format!("{n}^3"),
            ms,
            rate: tf,
            unit: "TFLOP/s",
            ceiling: tf,
        },
    ))
}

fn bench_matmul_invariant(
    gpu: &Arc<Gpu>,
    rows: usize,
    ceiling_tf: f64,
    ceiling_gbs: f64,
) -> Res<Row> {
    let (cols, k) = (4096usize, 4096usize);
    let stream = gpu.stream();
    let a: CudaSlice<f32> = stream.alloc_zeros(rows * k)?;
    let w: CudaSlice<u16> = stream.alloc_zeros(cols * k)?;
    let mut out: CudaSlice<f32> = stream.alloc_zeros(rows * cols)?;
    let f = gpu.function(&sources::MATMUL_INVARIANT, "matmul_invariant_bf16")?;
    let (r, c, kk) = (rows as u32, cols as u32, k as u32);
    let ms = time_ms(gpu, || {
        let mut l = stream.launch_builder(&f);
        l.arg(&a).arg(&w).arg(&mut out).arg(&r).arg(&c).arg(&kk);
        let grid = (c.div_ceil(64), r.div_ceil(64), 1);
        // SAFETY: a is rows x k, w is cols x k (bf16 bits), out rows x cols.
        unsafe {
            l.launch(LaunchConfig {
                grid_dim: grid,
                block_dim: (256, 1, 1),
                shared_mem_bytes: 0,
            })
        }?;
        Ok(())
    })?;
    let flops = 2.0 * (rows * cols * k) as f64;
    let bytes = (rows * k * 4 + cols * k * 2 + rows * cols * 4) as f64;
    let shape = format!("{rows}x{k} @ {cols}x{k} bf16");
    // Small row counts are bandwidth bound, large ones compute bound: report the binding one.
    Ok(if rows <= 64 {
        Row {
            kernel: "matmul_invariant".into(),
            shape,
            ms,
            rate: bytes / (ms * 1e6),
            unit: "GB/s",
            ceiling: ceiling_gbs,
        }
    } else {
        Row {
            kernel: "matmul_invariant".into(),
            shape,
            ms,
            rate: flops / (ms * 1e9),
            unit: "TFLOP/s",
            ceiling: ceiling_tf,
        }
    })
}

fn bench_kv_commit(gpu: &Arc<Gpu>, ceiling_gbs: f64) -> Res<Row> {
    // Llama-3-8B-like: 32 layers, 8 KV heads, head_dim 128, block 16; batch 64 x 8 moves.
    let shape = KvShape {
        num_layers: 32,
        num_kv_heads: 8,
        head_dim: 128,
        block_size: 16,
    };
    let blocks = 64 * 4;
    let stream = gpu.stream();
    let mut pool: CudaSlice<f32> = stream.alloc_zeros(blocks * shape.block_elems())?;
    let (mut src, mut dst) = (Vec::new(), Vec::new());
    for s in 0..64u32 {
        let base = s * 4 * 16;
        for i in 0..8u32 {
            src.push(base + 20 + 2 * i + 1);
            dst.push(base + 20 + i);
        }
    }
    // Sources and destinations overlap within a sequence, as in a real compaction; make the
    // destination set disjoint from sources written earlier by using a disjoint pattern.
    let moves = src.len();
    let ms = time_ms(gpu, || {
        move_slots(gpu, &mut pool, &shape, &src, &dst)?;
        Ok(())
    })?;
    let bytes = (4 * moves * shape.token_elems() * 4) as f64;
    Ok(Row {
        kernel: "kv commit (gather+scatter)".into(),
        shape: format!("64 seq x 8 moves, {:.2} us/seq", ms * 1e3 / 64.0),
        ms,
        rate: bytes / (ms * 1e6),
        unit: "GB/s",
        ceiling: ceiling_gbs,
    })
}

/// The block product over Q4_K weights (decoded in registers), at decode and verify sizes: the
/// bytes that must move are the blocks (0.5625 B per weight), the activations and the output.
fn bench_qmatmul(gpu: &Arc<Gpu>, rows: usize, cols: usize, k: usize, ceiling_gbs: f64) -> Res<Row> {
    use specdec_kernels::quant::{cuda::qmatmul_cuda, QuantType};
    let stream = gpu.stream();
    let ty = QuantType::Q4_K;
    let a: CudaSlice<f32> = stream.alloc_zeros(rows * k)?;
    let w: CudaSlice<u8> = stream.alloc_zeros(cols * ty.row_bytes(k)?)?;
    let mut out: CudaSlice<f32> = stream.alloc_zeros(rows * cols)?;
    let ms = time_ms(gpu, || {
        Ok(qmatmul_cuda(gpu, ty, &a, &w, cols, k, &mut out)?)
    })?;
    let bytes = (rows * k * 4 + cols * ty.row_bytes(k)? + rows * cols * 4) as f64;
    Ok(Row {
        kernel: "qmatmul q4_K (invariant)".into(),
        shape: format!("{rows}x{k} @ {cols}x{k}"),
        ms,
        rate: bytes / (ms * 1e6),
        unit: "GB/s",
        ceiling: ceiling_gbs,
    })
}

fn bench_dequant(gpu: &Arc<Gpu>, ceiling_gbs: f64) -> Res<Row> {
    let n = 4096usize * 4096;
    let stream = gpu.stream();
    let src: CudaSlice<u8> = stream.alloc_zeros(n / 256 * 144)?;
    let mut dst: CudaSlice<u16> = stream.alloc_zeros(n)?;
    let f = gpu.function(&sources::DEQUANT, "dequant_q4_k_bf16")?;
    let nn = n as u64;
    let ms = time_ms(gpu, || {
        let mut l = stream.launch_builder(&f);
        l.arg(&src).arg(&mut dst).arg(&nn);
        // SAFETY: src holds n / 256 Q4_K blocks, dst n bf16 values.
        unsafe {
            l.launch(LaunchConfig {
                grid_dim: (132 * 16, 1, 1),
                block_dim: (256, 1, 1),
                shared_mem_bytes: 0,
            })
        }?;
        Ok(())
    })?;
    let bytes = (n / 256 * 144 + n * 2) as f64;
    Ok(Row {
        kernel: "dequant q4_K -> bf16".into(),
        shape: "4096x4096".into(),
        ms,
        rate: bytes / (ms * 1e6),
        unit: "GB/s",
        ceiling: ceiling_gbs,
    })
}

fn bench_rms_norm(gpu: &Arc<Gpu>, ceiling_gbs: f64) -> Res<Row> {
    let (rows, n) = (4096usize, 4096usize);
    let stream = gpu.stream();
    let x: CudaSlice<f32> = stream.alloc_zeros(rows * n)?;
    let w: CudaSlice<f32> = stream.alloc_zeros(n)?;
    let mut out: CudaSlice<f32> = stream.alloc_zeros(rows * n)?;
    let f = gpu.function(&sources::OPS, "rms_norm_f32")?;
    let (nn, eps) = (n as u32, 1e-5f32);
    let ms = time_ms(gpu, || {
        let mut l = stream.launch_builder(&f);
        l.arg(&x).arg(&w).arg(&mut out).arg(&nn).arg(&eps);
        // SAFETY: x and out are rows x n, w is n.
        unsafe {
            l.launch(LaunchConfig {
                grid_dim: (rows as u32, 1, 1),
                block_dim: (256, 1, 1),
                shared_mem_bytes: 0,
            })
        }?;
        Ok(())
    })?;
    let bytes = (rows * n * 8 + n * 4) as f64;
    Ok(Row {
        kernel: "rms_norm".into(),
        shape: format!("{rows}x{n}"),
        ms,
        rate: bytes / (ms * 1e6),
        unit: "GB/s",
        ceiling: ceiling_gbs,
    })
}

fn bench_verify(gpu: &Arc<Gpu>, ceiling_gbs: f64) -> Res<Row> {
    // Chain rejection sampling: vocabulary 151936, K = 8 drafts, batch 64 (the target).
    let (vocab, k, batch) = (151_936usize, 8usize, 64usize);
    let row = |salt: usize| -> Vec<f32> {
        let w: Vec<f32> = (0..vocab)
            .map(|i| (((i * 2_654_435_761 + salt * 97) >> 7) % 1000) as f32 + 1.0)
            .collect();
        let s: f32 = w.iter().sum();
        w.iter().map(|x| x / s).collect()
    };
    let (p_row, q_row) = (row(1), row(2));
    let trees: Vec<DraftTree<f32>> = (0..batch)
        .map(|b| {
            let tokens: Vec<u32> = (0..=k)
                .map(|i| ((b * 131 + i * 977) % vocab) as u32)
                .collect();
            let q = (0..=k).map(|i| (i < k).then(|| q_row.clone())).collect();
            DraftTree::new(TreeTopology::chain(k + 1), tokens, q, DraftKind::Iid)
        })
        .collect::<Result<_, _>>()?;
    let p: Vec<Vec<f32>> = vec![p_row; k + 1];
    let inputs: Vec<VerifyInput<'_, f32>> = trees
        .iter()
        .enumerate()
        .map(|(b, tree)| VerifyInput {
            sequence: b as u64,
            step: 0,
            tree,
            target_probs: &p,
        })
        .collect();
    let seeds = SeededSequences::new(1);
    let mut plan = VerifyPlan::new(gpu, VerifyMethod::ChainRejection, &inputs, &seeds)?;
    let ms = time_ms(gpu, || {
        plan.launch(gpu)?;
        Ok(())
    })?;
    plan.verdicts(gpu)?;
    let bytes = plan.input_bytes() as f64;
    Ok(Row {
        kernel: "verify chain rejection".into(),
        shape: format!("vocab {vocab}, K {k}, batch {batch}"),
        ms,
        rate: bytes / (ms * 1e6),
        unit: "GB/s",
        ceiling: ceiling_gbs,
    })
}

fn bench_attention(gpu: &Arc<Gpu>, ceiling_gbs: f64, prefix: usize, seqs: usize) -> Res<Row> {
    // Llama-3-8B-like layer: 32 query heads, 8 KV heads, head_dim 128, f32 KV, block 16.
    let layout = KvLayout::new(1, 8, 128, 16)?;
    let per_seq = layout.blocks_for(prefix + 1);
    let blocks = per_seq * seqs;
    let stream = gpu.stream();
    let pool: CudaSlice<f32> = stream.alloc_zeros(blocks * layout.block_elems())?;
    let tree = TreeTopology::chain(1);
    let tables: Vec<Vec<u32>> = (0..seqs)
        .map(|s| ((s * per_seq) as u32..((s + 1) * per_seq) as u32).collect())
        .collect();
    let q = vec![0.01f32; 32 * 128];
    let batch: Vec<AttentionSeq<'_>> = tables
        .iter()
        .map(|t| AttentionSeq {
            queries: &q,
            block_table: t,
            prefix_len: prefix,
            tree: &tree,
        })
        .collect();
    let params = AttentionParams {
        layer: 0,
        num_q_heads: 32,
        scale: 1.0 / 128f32.sqrt(),
    };
    let ms = time_ms(gpu, || {
        tree_attention_cuda(gpu, &pool, &layout, &params, &batch)?;
        Ok(())
    })?;
    let bytes = (seqs * (prefix + 1) * 8 * 128 * 2 * 4 + seqs * 2 * 32 * 128 * 4) as f64;
    Ok(Row {
        kernel: "tree attention (launcher, incl. metadata upload)".into(),
        shape: format!("{seqs} seq x 1 token, prefix {prefix}, 32q/8kv x d128 f32"),
        ms,
        rate: bytes / (ms * 1e6),
        unit: "GB/s",
        ceiling: ceiling_gbs,
    })
}

fn main() -> Res<()> {
    if cuda_device_count() == 0 {
        if gpu_required() {
            return Err("SPECDEC_REQUIRE_GPU is set but no CUDA device is usable".into());
        }
        println!("gpu_bench: no CUDA device here; nothing measured");
        return Ok(());
    }
    let gpu = Gpu::shared(0)?;
    println!("gpu_bench on {} ({})", gpu.name(), gpu.arch());
    let mut rows = Vec::new();
    let (gbs, r) = bench_copy(&gpu)?;
    rows.push(r);
    let (tf, r) = bench_gemm(&gpu)?;
    rows.push(r);
    let mut run = |name: &str, r: Res<Row>| match r {
        Ok(row) => rows.push(row),
        Err(e) => println!("{name}: FAILED: {e}"),
    };
    run(
        "matmul_invariant 16",
        bench_matmul_invariant(&gpu, 16, tf, gbs),
    );
    run(
        "matmul_invariant 4096",
        bench_matmul_invariant(&gpu, 4096, tf, gbs),
    );
    // Qwen2.5-1.5B's MLP up projection (8960 x 1536) and a 4096 x 4096 square, 1 and 16 tokens
    for (rows, cols, k) in [
        (1, 8960, 1536),
        (16, 8960, 1536),
        (1, 4096, 4096),
        (16, 4096, 4096),
    ] {
        run(
            &format!("qmatmul {rows}x{k} @ {cols}x{k}"),
            bench_qmatmul(&gpu, rows, cols, k, gbs),
        );
    }
    run("kv commit", bench_kv_commit(&gpu, gbs));
    run("dequant", bench_dequant(&gpu, gbs));
    run("rms_norm", bench_rms_norm(&gpu, gbs));
    run("verify", bench_verify(&gpu, gbs));
    run(
        "attention 32k x 1",
        bench_attention(&gpu, gbs, 32 * 1024, 1),
    );
    run(
        "attention 32k x 8",
        bench_attention(&gpu, gbs, 32 * 1024, 8),
    );
    gpu.synchronize()?;
    println!("\n| kernel | shape | median ms | rate | % of ceiling |");
    println!("|---|---|---:|---:|---:|");
    for r in &rows {
        println!(
            "| {} | {} | {:.4} | {:.1} {} | {:.0}% |",
            r.kernel,
            r.shape,
            r.ms,
            r.rate,
            r.unit,
            100.0 * r.rate / r.ceiling
        );
    }
    Ok(())
}
