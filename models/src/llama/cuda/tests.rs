//! Tests of the CUDA runner. The GPU tests (`#[ignore = "needs a GPU"]`) need no model file:
//! they write a tiny synthetic Llama (tied head, GQA 4:1, interleaved RoPE) and a tiny
//! Qwen2-style model (QKV bias, untied head, GQA 2 KV heads, half-split RoPE), both with
//! `head_dim` 64 and a mix of GGUF storage types, as GGUF bytes in memory, and compare
//! [`CudaLlamaModel`] with the CPU runner's exact f32 path on the same file.
//!
//! # Tolerance (against the CPU's exact f32 path)
//! The GPU rounds every weight to bf16 (relative error ≤ 2⁻⁹) and, in the fast mode, every
//! product input too. A `k`-term dot product of such terms with independent rounding errors is
//! off by about `2⁻⁹ · √k · rms(term)` per rounded operand, a few tenths of a per cent of its
//! own scale; two decoder blocks and the LM head compound a handful of those. Measured on the
//! CPU (`bf16_weights_stay_within_the_gpu_tolerance_on_the_cpu`: the exact path with every matrix
//! rounded to bf16), weight rounding alone moves these models' logits by 0.4–0.8% of the row's
//! largest |logit|. Bounds: `2%` of the row's largest |logit| plus `1e-3` in the batch-invariant
//! mode (bf16 weights, f32 activations: ~2.5× the measured error), `3%` in the fast mode (bf16
//! activations too: about twice the error variance). Both are far below the spread of the
//! logits, so a wrong layout, head, bias or RoPE pairing (errors of the order of the logits)
//! fails them. Greedy tokens are compared wherever the CPU's top-two margin exceeds twice the
//! bound.

use std::sync::Arc;

use specdec_kernels::cuda::probe::cuda_device_count;
use specdec_kernels::cuda::testing::gpu_for_test;
use specdec_kernels::quant::QuantType;
use specdec_kernels::TreeTopology;

use super::*;
use crate::gguf::GgufFile;
use crate::llama::synthetic::{synthetic, synthetic_with};
use crate::llama::{read_config, Architecture, LlamaModel, LlamaOptions, MatmulPath};
use crate::model::{LanguageModel, Logits, SeqId, SequenceStep};

fn cpu_model(file: &Arc<GgufFile>) -> LlamaModel {
    let options = LlamaOptions {
        kv_capacity_tokens: 512,
        kv_block_size: 16,
        kv_dtype: specdec_kernels::kv::KvDtype::F32,
        matmul: MatmulPath::Exact,
    };
    LlamaModel::from_gguf(file, options).expect("the CPU model loads")
}

fn gpu_model(file: &Arc<GgufFile>, matmul: GpuMatmul) -> CudaLlamaModel {
    let options = CudaLlamaOptions {
        kv_capacity_tokens: 512,
        kv_block_size: 16,
        matmul,
        device: 0,
    };
    CudaLlamaModel::from_gguf(file, options).expect("the CUDA model loads")
}

fn forward(
    model: &mut dyn LanguageModel,
    seq: SeqId,
    tokens: &[u32],
    tree: &TreeTopology,
) -> Logits {
    model
        .forward(&[SequenceStep { seq, tokens, tree }])
        .expect("forward")
        .remove(0)
}

/// Forwards `tokens` as a chain on `seq` and commits them all.
fn extend(model: &mut dyn LanguageModel, seq: SeqId, tokens: &[u32]) -> Logits {
    let logits = forward(model, seq, tokens, &TreeTopology::chain(tokens.len()));
    model
        .commit(seq, &(0..tokens.len()).collect::<Vec<_>>())
        .expect("commit");
    logits
}

/// The bound of the module docs for one row of CPU logits in `mode`.
fn tolerance(cpu_row: &[f32], mode: GpuMatmul) -> f32 {
    let share = match mode {
        GpuMatmul::BatchInvariant => 0.02,
        GpuMatmul::Fast => 0.03,
    };
    share * cpu_row.iter().fold(0.0f32, |m, v| m.max(v.abs())) + 1e-3
}

fn assert_close(gpu: &Logits, cpu: &Logits, mode: GpuMatmul, what: &str) {
    assert_eq!(gpu.rows(), cpu.rows(), "{what}: rows");
    for r in 0..cpu.rows() {
        let (g, c) = (gpu.row(r), cpu.row(r));
        let tol = tolerance(c, mode);
        let gap = g
            .iter()
            .zip(c)
            .fold(0.0f32, |m, (a, b)| m.max((a - b).abs()));
        assert!(gap <= tol, "{what}: row {r} differs by {gap} > {tol}");
        assert!(
            tol > 0.002,
            "{what}: row {r} has degenerate logits (largest |logit| below 0.05)"
        );
    }
}

fn bits(row: &[f32]) -> Vec<u32> {
    row.iter().map(|v| v.to_bits()).collect()
}

/// The top-two margin of a row.
fn margin(row: &[f32]) -> f32 {
    let mut v = row.to_vec();
    v.sort_by(|a, b| b.total_cmp(a));
    v[0] - v[1]
}

const PROMPT: [u32; 11] = [1, 17, 5, 42, 9, 33, 60, 2, 28, 11, 50];

#[test]
fn loading_without_a_gpu_names_the_problem() {
    let file = synthetic(Architecture::Qwen2, 1);
    match CudaLlamaModel::from_gguf(&file, CudaLlamaOptions::default()) {
        Err(e) => {
            assert_eq!(
                cuda_device_count(),
                0,
                "a GPU is present but loading failed: {e}"
            );
            let msg = e.to_string();
            assert!(msg.contains("needs a GPU") && msg.contains("CUDA"), "{msg}");
        }
        Ok(model) => assert!(cuda_device_count() > 0, "loaded {model:?} without a GPU"),
    }
    let err = CudaLlamaModel::load("/nonexistent/model.gguf", CudaLlamaOptions::default())
        .unwrap_err()
        .to_string();
    // Without a GPU the GPU is named first; with one, the missing file is.
    assert!(
        err.contains("GPU") || err.contains("/nonexistent/model.gguf"),
        "{err}"
    );
}

#[test]
fn weight_layouts_and_device_bytes() {
    assert_eq!(
        DeviceLayout::for_type(QuantType::BF16),
        DeviceLayout::Bf16Verbatim
    );
    assert_eq!(
        DeviceLayout::for_type(QuantType::F32),
        DeviceLayout::Bf16HostRound
    );
    assert_eq!(
        DeviceLayout::for_type(QuantType::F16),
        DeviceLayout::Bf16DeviceDequant
    );
    for ty in [
        QuantType::Q4_K,
        QuantType::Q6_K,
        QuantType::Q8_0,
        QuantType::Q5_0,
        QuantType::Q4_1,
    ] {
        assert_eq!(DeviceLayout::for_type(ty), DeviceLayout::Blocks, "{ty}");
    }
    for arch in [Architecture::Llama, Architecture::Qwen2] {
        let file = synthetic(arch, 2);
        let config = read_config(&file).unwrap();
        let weights = crate::llama::read_weights(&file, &config).unwrap();
        // Block matrices at their file bytes, float ones at 2 bytes per value (the tied head
        // once), vectors at 4.
        let matrix = |m: &crate::llama::weights::WeightMatrix| match DeviceLayout::for_type(
            m.quant_type(),
        ) {
            DeviceLayout::Blocks => m.bytes().len(),
            _ => 2 * m.rows() * m.cols(),
        };
        let mut want = matrix(&weights.token_embd) + 4 * weights.output_norm.len();
        if !config.tied_head {
            want += matrix(&weights.output);
        }
        let mut blocks = 0;
        for l in &weights.layers {
            for m in [&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down] {
                want += matrix(m);
                blocks +=
                    usize::from(DeviceLayout::for_type(m.quant_type()) == DeviceLayout::Blocks);
            }
            want += 4 * (l.attn_norm.len() + l.ffn_norm.len());
            for b in [&l.bq, &l.bk, &l.bv].into_iter().flatten() {
                want += 4 * b.len();
            }
        }
        assert!(
            blocks > 0,
            "{arch:?}: the synthetic model has block matrices"
        );
        assert_eq!(
            device_weight_bytes(&config, &weights).unwrap(),
            want,
            "{arch:?}"
        );
        assert_eq!(config.tied_head, arch == Architecture::Llama);
        assert_eq!(config.qkv_bias, arch == Architecture::Qwen2);
    }
}

#[test]
fn the_device_is_a_run_time_choice() {
    use crate::llama::{load_on_device, parse_device, DeviceModelOptions};
    use specdec_kernels::cuda::Device;
    assert_eq!(parse_device("cpu").unwrap(), Device::Cpu);
    assert_eq!(parse_device("cuda:1").unwrap(), Device::Cuda(1));
    let err = parse_device("tpu").unwrap_err().to_string();
    assert!(
        err.contains("unknown device `tpu`") && err.contains("cuda:N"),
        "{err}"
    );
    let file = synthetic(Architecture::Llama, 3);
    let options = DeviceModelOptions {
        kv_capacity_tokens: 64,
        ..DeviceModelOptions::default()
    };
    let mut cpu = load_on_device(&file, options).unwrap();
    let s = cpu.new_sequence().unwrap();
    assert_eq!(extend(cpu.as_mut(), s, &PROMPT).rows(), PROMPT.len());
    let on_gpu = load_on_device(
        &file,
        DeviceModelOptions {
            device: Device::Cuda(0),
            ..options
        },
    );
    assert_eq!(
        on_gpu.is_ok(),
        cuda_device_count() > 0,
        "{:?}",
        on_gpu.err()
    );
}

/// GPU ranks are checked before anything is uploaded: more ranks than visible GPUs is refused
/// naming both counts, and a group must start at device 0 (NCCL puts rank `r` on GPU `r`).
#[test]
fn gpu_ranks_beyond_the_gpus_are_refused_naming_both_counts() {
    use crate::llama::DeviceModelOptions;
    use crate::Checkpoint;
    use specdec_kernels::cuda::Device;
    let file = synthetic(Architecture::Qwen2, 3);
    let refusal = |device: Device, world: usize| {
        let options = DeviceModelOptions {
            device,
            kv_capacity_tokens: 64,
            ..DeviceModelOptions::default()
        };
        match Checkpoint::Gguf(file.clone()).load_sharded_on_device(options, world) {
            Ok(_) => panic!("{world} ranks on {device:?} loaded"),
            Err(e) => e.to_string(),
        }
    };
    let visible = cuda_device_count();
    let world = (visible + 1).max(2);
    let err = refusal(Device::Cuda(0), world);
    assert!(
        err.contains(&format!(
            "{world} ranks need {world} GPUs, {visible} visible"
        )),
        "{err}"
    );
    let err = refusal(Device::Cuda(1), 2);
    assert!(err.contains("cannot start at cuda:1"), "{err}");
}

#[test]
fn bf16_weights_stay_within_the_gpu_tolerance_on_the_cpu() {
    // The premise of the tolerance, checked where it can be: the CPU's exact path with every
    // matrix rounded to bf16 (what the batch-invariant GPU mode multiplies with) against the
    // original weights, over a prefill and a few decode steps.
    for arch in [Architecture::Llama, Architecture::Qwen2] {
        let mut exact = cpu_model(&synthetic(arch, 7));
        let mut rounded = cpu_model(&synthetic_with(arch, 7, true));
        let (a, b) = (
            exact.new_sequence().unwrap(),
            rounded.new_sequence().unwrap(),
        );
        let mut worst = 0.0f32;
        let mut tokens = PROMPT.to_vec();
        let mut checked = 0;
        for _ in 0..13 {
            let (e, r) = (
                extend(&mut exact, a, &tokens),
                extend(&mut rounded, b, &tokens),
            );
            let mode = GpuMatmul::BatchInvariant;
            assert_close(&r, &e, mode, &format!("{arch:?} bf16 weights on the CPU"));
            for row in 0..e.rows() {
                let gap = e
                    .row(row)
                    .iter()
                    .zip(r.row(row))
                    .fold(0.0f32, |m, (x, y)| m.max((x - y).abs()));
                worst = worst.max(gap / tolerance(e.row(row), GpuMatmul::BatchInvariant));
            }
            let last = e.rows() - 1;
            if margin(e.row(last)) > 2.0 * tolerance(e.row(last), GpuMatmul::Fast) {
                assert_eq!(r.argmax(last), e.argmax(last), "{arch:?}: greedy token");
                checked += 1;
            }
            tokens = vec![e.argmax(last)];
        }
        eprintln!(
            "{arch:?}: bf16 weights use {:.0}% of the tolerance; greedy tokens compared at \
             {checked} of 13 steps",
            100.0 * worst
        );
        assert!(checked > 0, "{arch:?}: no step had a clear top token");
        assert!(
            worst > 0.0,
            "{arch:?}: rounding changed nothing: the check is vacuous"
        );
    }
}

/// Runs `body` with the GPU models of both synthetic architectures, or returns when this
/// machine has no GPU (a failure under `SPECDEC_REQUIRE_GPU=1`).
fn with_models(test: &str, body: impl Fn(Architecture, &Arc<GgufFile>)) {
    if gpu_for_test(test).is_none() {
        return;
    }
    for arch in [Architecture::Llama, Architecture::Qwen2] {
        body(arch, &synthetic(arch, 7));
    }
}

#[test]
#[ignore = "needs a GPU"]
fn logits_and_greedy_tokens_match_the_cpu() {
    with_models(
        "llama::cuda::logits_and_greedy_tokens_match_the_cpu",
        |arch, file| {
            let mut cpu = cpu_model(file);
            for mode in [GpuMatmul::Fast, GpuMatmul::BatchInvariant] {
                let mut gpu = gpu_model(file, mode);
                let what = format!("{arch:?} {mode:?}");
                let (cs, gs) = (cpu.new_sequence().unwrap(), gpu.new_sequence().unwrap());
                let (c, g) = (extend(&mut cpu, cs, &PROMPT), extend(&mut gpu, gs, &PROMPT));
                assert_close(&g, &c, mode, &format!("{what} prefill"));
                // Greedy continuation, the CPU's token fed to both (teacher forcing).
                let mut next = c.argmax(c.rows() - 1);
                let mut checked = 0;
                for step in 0..12 {
                    let (c, g) = (extend(&mut cpu, cs, &[next]), extend(&mut gpu, gs, &[next]));
                    assert_close(&g, &c, mode, &format!("{what} decode step {step}"));
                    if margin(c.row(0)) > 2.0 * tolerance(c.row(0), mode) {
                        assert_eq!(
                            g.argmax(0),
                            c.argmax(0),
                            "{what}: greedy token at step {step}"
                        );
                        checked += 1;
                    }
                    next = c.argmax(0);
                }
                eprintln!("{what}: greedy tokens compared at {checked} of 12 steps");
                assert!(checked > 0, "{what}: no decode step had a clear top token");
                cpu.release(cs).unwrap();
                gpu.release(gs).unwrap();
            }
        },
    );
}

/// A 7-node tree under the root `PROMPT[last]`.
fn tree() -> (TreeTopology, Vec<u32>) {
    let parents = [None, Some(0), Some(0), Some(1), Some(1), Some(2), Some(4)];
    (
        TreeTopology::from_parents(&parents).unwrap(),
        vec![PROMPT[10], 3, 44, 20, 7, 58, 31],
    )
}

#[test]
#[ignore = "needs a GPU"]
fn tree_forward_equals_per_path_chains() {
    with_models(
        "llama::cuda::tree_forward_equals_per_path_chains",
        |arch, file| {
            let mut cpu = cpu_model(file);
            let mut gpu = gpu_model(file, GpuMatmul::BatchInvariant);
            let (tree, tokens) = tree();
            let (cs, gs) = (cpu.new_sequence().unwrap(), gpu.new_sequence().unwrap());
            extend(&mut cpu, cs, &PROMPT[..10]);
            extend(&mut gpu, gs, &PROMPT[..10]);
            let in_tree = forward(&mut gpu, gs, &tokens, &tree);
            assert_close(
                &in_tree,
                &forward(&mut cpu, cs, &tokens, &tree),
                GpuMatmul::BatchInvariant,
                &format!("{arch:?} tree"),
            );
            for node in 0..tree.len() {
                let path: Vec<u32> = tree.path_to(node).iter().map(|&i| tokens[i]).collect();
                let chain = forward(&mut gpu, gs, &path, &TreeTopology::chain(path.len()));
                assert_eq!(
                    bits(in_tree.row(node)),
                    bits(chain.row(path.len() - 1)),
                    "{arch:?}: node {node} differs between the tree and its chain"
                );
            }
        },
    );
}

#[test]
#[ignore = "needs a GPU"]
fn commit_rewind_fork_then_continue() {
    with_models(
        "llama::cuda::commit_rewind_fork_then_continue",
        |arch, file| {
            let mut gpu = gpu_model(file, GpuMatmul::BatchInvariant);
            let mut cpu = cpu_model(file);
            let (tree, tokens) = tree();
            // The reference: a fresh sequence forwarding `history` as one chain; its last row.
            let fresh = |gpu: &mut CudaLlamaModel, history: &[u32]| -> Vec<u32> {
                let s = gpu.new_sequence().unwrap();
                let l = forward(gpu, s, history, &TreeTopology::chain(history.len()));
                gpu.release(s).unwrap();
                bits(l.row(history.len() - 1))
            };
            let (a, ca) = (gpu.new_sequence().unwrap(), cpu.new_sequence().unwrap());
            extend(&mut gpu, a, &PROMPT[..10]);
            extend(&mut cpu, ca, &PROMPT[..10]);
            // Verify the tree, commit the path to node 6 (0 → 1 → 4 → 6: slot copies), continue.
            forward(&mut gpu, a, &tokens, &tree);
            forward(&mut cpu, ca, &tokens, &tree);
            let path = tree.path_to(6);
            gpu.commit(a, &path).unwrap();
            cpu.commit(ca, &path).unwrap();
            let mut history: Vec<u32> = PROMPT[..10].to_vec();
            history.extend(path.iter().map(|&i| tokens[i]));
            assert_eq!(gpu.seq_len(a).unwrap(), history.len());
            let g = extend(&mut gpu, a, &[9]);
            assert_close(
                &g,
                &extend(&mut cpu, ca, &[9]),
                GpuMatmul::BatchInvariant,
                &format!("{arch:?} after commit"),
            );
            history.push(9);
            assert_eq!(
                bits(g.row(0)),
                fresh(&mut gpu, &history),
                "{arch:?}: after commit"
            );
            // Fork mid-block; both branches continue differently (copy-on-write of the shared block).
            let b = gpu.fork(a).unwrap();
            let gb = extend(&mut gpu, b, &[12, 13]);
            let ga = extend(&mut gpu, a, &[14]);
            let mut hb = history.clone();
            hb.extend([12, 13]);
            history.push(14);
            assert_eq!(
                bits(gb.row(1)),
                fresh(&mut gpu, &hb),
                "{arch:?}: forked branch"
            );
            assert_eq!(
                bits(ga.row(0)),
                fresh(&mut gpu, &history),
                "{arch:?}: original branch"
            );
            // Rewind 5 (into an earlier block), then continue.
            gpu.rewind(a, 5).unwrap();
            history.truncate(history.len() - 5);
            let gr = extend(&mut gpu, a, &[21, 22]);
            history.extend([21, 22]);
            assert_eq!(
                bits(gr.row(1)),
                fresh(&mut gpu, &history),
                "{arch:?}: after rewind"
            );
            // A discarded speculative forward changes nothing.
            forward(&mut gpu, b, &tokens, &tree);
            gpu.rewind(b, 0).unwrap();
            let gb2 = extend(&mut gpu, b, &[30]);
            hb.push(30);
            assert_eq!(
                bits(gb2.row(0)),
                fresh(&mut gpu, &hb),
                "{arch:?}: after a discarded tree"
            );
            // Bad paths are refused as on the CPU.
            forward(&mut gpu, b, &tokens, &tree);
            assert!(gpu.commit(b, &[0, 3]).is_err(), "3 is not a child of 0");
        },
    );
}

#[test]
#[ignore = "needs a GPU"]
fn batch_invariant_mode_is_bit_identical_alone_in_a_batch_and_in_a_tree() {
    with_models("llama::cuda::batch_invariant_mode", |arch, file| {
        let mut gpu = gpu_model(file, GpuMatmul::BatchInvariant);
        let last = PROMPT.len() - 1;
        // Reference: the whole prompt as one chain; the last token's row.
        let a = gpu.new_sequence().unwrap();
        let chain = forward(&mut gpu, a, &PROMPT, &TreeTopology::chain(PROMPT.len()));
        let reference = bits(chain.row(last));
        // Alone, after the committed prefix.
        let b = gpu.new_sequence().unwrap();
        extend(&mut gpu, b, &PROMPT[..last]);
        let alone = forward(&mut gpu, b, &PROMPT[last..], &TreeTopology::chain(1));
        assert_eq!(bits(alone.row(0)), reference, "{arch:?}: alone vs chain");
        // As the root of a tree.
        let (tree, tokens) = tree();
        let in_tree = forward(&mut gpu, b, &tokens, &tree);
        assert_eq!(
            bits(in_tree.row(0)),
            reference,
            "{arch:?}: tree root vs chain"
        );
        // In a batch of 3 sequences, between two others of different lengths.
        let (c, d, e) = (
            gpu.new_sequence().unwrap(),
            gpu.new_sequence().unwrap(),
            gpu.new_sequence().unwrap(),
        );
        let other: Vec<u32> = (0..23).map(|i| (i * 7 + 3) % 64).collect();
        let (t_other, t_prompt, t_two) = (
            TreeTopology::chain(other.len()),
            TreeTopology::chain(PROMPT.len()),
            TreeTopology::chain(2),
        );
        let out = gpu
            .forward(&[
                SequenceStep {
                    seq: c,
                    tokens: &other,
                    tree: &t_other,
                },
                SequenceStep {
                    seq: d,
                    tokens: &PROMPT,
                    tree: &t_prompt,
                },
                SequenceStep {
                    seq: e,
                    tokens: &other[..2],
                    tree: &t_two,
                },
            ])
            .unwrap();
        assert_eq!(
            bits(out[1].row(last)),
            reference,
            "{arch:?}: in a batch vs alone"
        );
        assert_ne!(
            bits(out[0].row(0)),
            bits(out[1].row(0)),
            "neighbours differ"
        );
    });
}

#[test]
#[ignore = "needs a GPU"]
fn verifying_on_the_device_gives_the_host_verdicts_and_commits_them() {
    use crate::model::{forward_then_verify_host, VerifyRequest};
    use specdec_kernels::sampling::{SamplingParams, SeededSequences};
    use specdec_kernels::verification::{DraftKind, DraftTree, VerifyMethod, VerifySequence};
    with_models("llama::cuda::verifying_on_the_device", |arch, file| {
        let mut gpu = gpu_model(file, GpuMatmul::BatchInvariant);
        let (a, b) = (gpu.new_sequence().unwrap(), gpu.new_sequence().unwrap());
        extend(&mut gpu, a, &PROMPT[..10]);
        extend(&mut gpu, b, &PROMPT[..6]);
        // greedy drafts of the model itself for sequence a (all accepted), a tree for b
        let mut drafted = vec![PROMPT[10]];
        let probe = gpu.new_sequence().unwrap();
        extend(&mut gpu, probe, &PROMPT[..10]);
        for _ in 0..3 {
            let logits = extend(&mut gpu, probe, &drafted[drafted.len() - 1..]);
            drafted.push(logits.argmax(0));
        }
        gpu.release(probe).unwrap();
        let deterministic = |tokens: Vec<u32>, topology: TreeTopology| {
            let nodes = tokens.len();
            DraftTree::<f32>::new(
                topology,
                tokens,
                vec![None; nodes],
                DraftKind::Deterministic,
            )
            .unwrap()
        };
        let (shape, mut tokens) = tree();
        tokens[0] = PROMPT[6];
        let trees = [
            deterministic(drafted.clone(), TreeTopology::chain(drafted.len())),
            deterministic(tokens, shape),
        ];
        let sequences: Vec<VerifySequence<'_>> = trees
            .iter()
            .enumerate()
            .map(|(i, tree)| VerifySequence {
                sequence: i as u64,
                step: 1,
                tree,
            })
            .collect();
        let steps = [
            SequenceStep::chain(a, trees[0].tokens(), trees[0].topology()),
            SequenceStep::chain(b, trees[1].tokens(), trees[1].topology()),
        ];
        let (greedy, seeds) = (SamplingParams::greedy(), SeededSequences::new(5));
        for method in [VerifyMethod::Greedy, VerifyMethod::TargetOnly] {
            let request = VerifyRequest {
                method,
                sequences: &sequences,
                sampling: &greedy,
                seeds: &seeds,
            };
            let host = forward_then_verify_host(&steps, &request, |s| gpu.forward(s)).unwrap();
            let device = gpu.forward_verify(&steps, &request).unwrap();
            assert_eq!(device.verdicts, host.verdicts, "{arch:?} {method:?}");
            assert_eq!(
                device.verdicts[0].accepted_len, 3,
                "{arch:?}: the model's own greedy chain"
            );
        }
        // the device pass recorded its trees: the verdicts commit
        for (seq, verdict) in [a, b].into_iter().zip(
            gpu.forward_verify(
                &steps,
                &VerifyRequest {
                    method: VerifyMethod::Greedy,
                    sequences: &sequences,
                    sampling: &greedy,
                    seeds: &seeds,
                },
            )
            .unwrap()
            .verdicts,
        ) {
            let before = gpu.seq_len(seq).unwrap();
            let path: Vec<usize> = std::iter::once(0).chain(verdict.accepted_path).collect();
            gpu.commit(seq, &path).unwrap();
            assert_eq!(gpu.seq_len(seq).unwrap(), before + path.len());
        }
    });
}

/// Tensor parallelism on GPUs: a group of one rank per visible GPU (at most 2, the synthetic
/// Qwen2's KV heads) through [`crate::shard::ShardedModel::on_gpus`], NCCL and the device
/// all-reduce, against the whole model on GPU 0, both batch-invariant. One rank must give the
/// whole model's bits (the same products; the sum over one rank is the identity); two ranks
/// split every product, so they are held to the module's tolerance, with greedy tokens compared
/// where the top two are clear of it. A machine with one GPU runs the one-rank group;
/// multi-GPU groups are exercised only where several GPUs are visible.
#[test]
#[ignore = "needs a GPU"]
fn gpu_ranks_equal_the_whole_model() {
    use crate::llama::{read_special_tokens, read_weights};
    use crate::shard::ShardedModel;
    with_models(
        "llama::cuda::gpu_ranks_equal_the_whole_model",
        |arch, file| {
            let config = read_config(file).unwrap();
            let world = cuda_device_count().clamp(1, 2).min(config.n_kv_heads);
            let weights = read_weights(file, &config).unwrap();
            let options = CudaLlamaOptions {
                kv_capacity_tokens: 512,
                kv_block_size: 16,
                matmul: GpuMatmul::BatchInvariant,
                device: 0,
            };
            let mut ranks = ShardedModel::on_gpus(
                &config,
                &weights,
                &read_special_tokens(file),
                options,
                world,
            )
            .expect("the GPU ranks load");
            let mut whole = gpu_model(file, GpuMatmul::BatchInvariant);
            let what = format!("{arch:?}, {world} GPU rank(s)");
            let (rs, ws) = (ranks.new_sequence().unwrap(), whole.new_sequence().unwrap());
            let (r, w) = (
                extend(&mut ranks, rs, &PROMPT),
                extend(&mut whole, ws, &PROMPT),
            );
            let check = |r: &Logits, w: &Logits, at: &str| {
                if world == 1 {
                    for row in 0..w.rows() {
                        assert_eq!(bits(r.row(row)), bits(w.row(row)), "{what} {at}, row {row}");
                    }
                } else {
                    assert_close(r, w, GpuMatmul::BatchInvariant, &format!("{what} {at}"));
                }
            };
            check(&r, &w, "prefill");
            let mut next = w.argmax(w.rows() - 1);
            for step in 0..8 {
                let (r, w) = (
                    extend(&mut ranks, rs, &[next]),
                    extend(&mut whole, ws, &[next]),
                );
                check(&r, &w, &format!("decode step {step}"));
                if margin(w.row(0)) > 2.0 * tolerance(w.row(0), GpuMatmul::BatchInvariant) {
                    assert_eq!(
                        r.argmax(0),
                        w.argmax(0),
                        "{what}: greedy token at step {step}"
                    );
                }
                next = w.argmax(0);
            }
            // a draft tree forwarded, then rewound: the group's caches agree with the whole model's
            let (tree, tokens) = tree();
            let (r, w) = (
                forward(&mut ranks, rs, &tokens, &tree),
                forward(&mut whole, ws, &tokens, &tree),
            );
            check(&r, &w, "tree");
            ranks.rewind(rs, 0).unwrap();
            ranks.release(rs).unwrap();
            let room = ranks.kv_room().expect("rank 0's pool");
            assert_eq!(room.free_blocks, room.total_blocks, "{what}: blocks leaked");
        },
    );
}
