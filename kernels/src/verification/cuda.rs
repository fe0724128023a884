//! CUDA launcher for batched verification (`verify.cu`): the same contract as [`verify_batch`]
//! with production decisions drawn from [`SeededSequences`] (the run's seed, and a seed of its own
//! for any sequence that has one): given the same inputs and seeds, the GPU returns exactly the
//! CPU's verdicts (accepted paths and next tokens).
//!
//! One launch verifies the whole batch, one block per sequence; each sequence carries its
//! `(seed, key sequence)` pair ([`SeededSequences::key_of`]), so seeded and unseeded sequences
//! share a launch. Supported methods: greedy, chain rejection, multi-round (i.i.d.), recursive
//! rejection, target-only; typical acceptance stays on the CPU ([`KernelError::InvalidParameter`]).
//! [`Gpu`] implements [`VerifyBackend`] over target rows already on the device.

use cudarc::driver::{CudaSlice, DevicePtr, DeviceRepr, LaunchConfig, PushKernelArg};

use super::backend::{batch_vocab, check_rows, VerifyBackend, VerifySequence};
use super::input::{Verdict, VerifyInput};
use super::{verify_batch, VerifyMethod};
use crate::cuda::nvrtc::cuda_error;
use crate::cuda::{sources, Device, Gpu};
use crate::error::{KernelError, Result};
use crate::sampling::cuda::prepare_logits_cuda;
use crate::sampling::{Replay, SamplingParams, SeededSequences};

/// Kernel parameters, laid out as `VerifyParams` in `verify.cu` (device pointers as `u64`).
#[repr(C)]
#[derive(Clone, Copy)]
struct VerifyParams {
    p: u64,
    q: u64,
    q_row: u64,
    tokens: u64,
    node_offsets: u64,
    child_offsets: u64,
    child_nodes: u64,
    key_seeds: u64,
    key_sequences: u64,
    steps: u64,
    scratch: u64,
    accepted_path: u64,
    accepted_len: u64,
    next_token: u64,
    status: u64,
    vocab: u32,
    method: u32,
    max_path: u32,
}

// SAFETY: plain `repr(C)` data of integers, matching the kernel's by-value struct parameter.
unsafe impl DeviceRepr for VerifyParams {}

fn method_code(method: VerifyMethod, batch: &[VerifySequence<'_>]) -> Result<u32> {
    Ok(match method {
        VerifyMethod::Greedy => 0,
        VerifyMethod::ChainRejection => {
            if let Some(s) = batch.iter().find(|s| !s.tree.topology().is_chain()) {
                return Err(KernelError::InvalidDraftTree {
                    reason: format!(
                        "chain rejection sampling needs a chain, sequence {} has a branching tree",
                        s.sequence
                    ),
                });
            }
            1
        }
        VerifyMethod::MultiRound => 1,
        VerifyMethod::RecursiveRejection => 2,
        VerifyMethod::TargetOnly => 3,
        VerifyMethod::Typical { .. } => {
            return Err(KernelError::InvalidParameter {
                what: "verification method",
                reason: "typical acceptance has no CUDA kernel; run it on the CPU".into(),
            })
        }
    })
}

/// Verifies a batch on `device` with production decisions for the run seed `seed` (no sequence
/// seeded on its own): the CPU reference ([`verify_batch`]) or the CUDA kernel, with identical
/// results.
///
/// # Errors
/// As [`verify_batch`]; on CUDA also [`KernelError::CudaUnavailable`] / [`KernelError::Cuda`].
pub fn verify_batch_on(
    device: Device,
    method: VerifyMethod,
    inputs: &[VerifyInput<'_, f32>],
    seed: u64,
) -> Result<Vec<Verdict>> {
    let seeds = SeededSequences::new(seed);
    match device {
        Device::Cpu => verify_batch(method, inputs, &mut Replay::new(seeds)),
        Device::Cuda(ordinal) => verify_batch_cuda(&*Gpu::shared(ordinal)?, method, inputs, &seeds),
    }
}

/// Verifies a batch of host inputs with the CUDA kernel, decisions drawn from `seeds` (inputs
/// are validated on the host first, as the CPU reference does, so NaN, negative or massless
/// rows are refused with the same errors).
///
/// # Errors
/// As [`verify_batch`]; [`KernelError::Cuda`] when a CUDA call fails.
pub fn verify_batch_cuda(
    gpu: &Gpu,
    method: VerifyMethod,
    inputs: &[VerifyInput<'_, f32>],
    seeds: &SeededSequences,
) -> Result<Vec<Verdict>> {
    if inputs.is_empty() {
        return Ok(Vec::new());
    }
    let mut plan = VerifyPlan::new(gpu, method, inputs, seeds)?;
    plan.launch(gpu)?;
    plan.verdicts(gpu)
}

/// Verifies a batch whose target rows are already on the device: the CUDA half of
/// [`VerifyBackend`] (see [`super::backend`] for the contract). The trees are checked on the
/// host; the kernel flags NaN, infinite and negative probabilities on the rows it reads
/// ([`KernelError::InvalidDistribution`]) but, unlike the CPU, does not re-check that each row
/// sums to one.
impl VerifyBackend for Gpu {
    type Rows = CudaSlice<f32>;

    /// `sampling_prepare` ([`prepare_logits_cuda`]) into a new buffer that replaces `rows` on
    /// success.
    fn prepare(
        &self,
        rows: &mut CudaSlice<f32>,
        vocab: usize,
        params: &SamplingParams,
    ) -> Result<()> {
        check_rows(rows.len(), vocab)?;
        params.validate()?;
        if rows.is_empty() {
            return Ok(());
        }
        let mut out = self
            .stream()
            .alloc_zeros::<f32>(rows.len())
            .map_err(|e| cuda_error("alloc prepared rows", e))?;
        prepare_logits_cuda(self, rows, vocab, params, &mut out)?;
        *rows = out;
        Ok(())
    }

    fn verify(
        &self,
        method: VerifyMethod,
        batch: &[VerifySequence<'_>],
        target_probs: &CudaSlice<f32>,
        seeds: &SeededSequences,
    ) -> Result<Vec<Verdict>> {
        if batch.is_empty() {
            return Ok(Vec::new());
        }
        let vocab = batch_vocab(batch, target_probs.len())?;
        for s in batch {
            s.tree.check_vocab(vocab)?;
        }
        let mut plan = VerifyPlan::for_trees(self, method, batch, vocab, seeds)?;
        plan.launch_over(self, target_probs)?;
        plan.verdicts(self)
    }
}

/// A batch's trees and keys uploaded to the GPU once (and its target rows, when they came from
/// the host), verified by [`VerifyPlan::launch`] as often as wanted (the benchmark runner times
/// launches alone).
pub struct VerifyPlan {
    /// Target rows uploaded from host inputs (`None`: the caller's device rows at launch).
    p: Option<CudaSlice<f32>>,
    q: CudaSlice<f32>,
    q_row: CudaSlice<i32>,
    tokens: CudaSlice<u32>,
    node_offsets: CudaSlice<u32>,
    child_offsets: CudaSlice<u32>,
    child_nodes: CudaSlice<u32>,
    key_seeds: CudaSlice<u64>,
    key_sequences: CudaSlice<u64>,
    steps: CudaSlice<u64>,
    scratch: CudaSlice<f32>,
    path: CudaSlice<u32>,
    len: CudaSlice<u32>,
    next: CudaSlice<u32>,
    status: CudaSlice<u32>,
    sequences: Vec<u64>,
    total_nodes: usize,
    code: u32,
    vocab: usize,
    max_path: usize,
}

impl VerifyPlan {
    /// Validates `inputs` (as the CPU does) and uploads them, target rows included, with each
    /// sequence's keys from `seeds`.
    ///
    /// # Errors
    /// As [`verify_batch`]; [`KernelError::Cuda`] when an upload fails.
    pub fn new(
        gpu: &Gpu,
        method: VerifyMethod,
        inputs: &[VerifyInput<'_, f32>],
        seeds: &SeededSequences,
    ) -> Result<Self> {
        for input in inputs {
            input.validate()?;
        }
        let vocab = inputs.first().map_or(1, |i| i.vocab());
        if let Some(i) = inputs.iter().find(|i| i.vocab() != vocab) {
            return Err(KernelError::ShapeMismatch {
                what: format!("vocabulary of sequence {}", i.sequence),
                expected: vocab,
                actual: i.vocab(),
            });
        }
        let batch: Vec<VerifySequence<'_>> = inputs.iter().map(VerifySequence::of).collect();
        let mut plan = Self::for_trees(gpu, method, &batch, vocab, seeds)?;
        let mut p: Vec<f32> = inputs
            .iter()
            .flat_map(|i| i.target_probs.iter().flatten().copied())
            .collect();
        if p.is_empty() {
            p.push(0.0);
        }
        plan.p = Some(
            gpu.stream()
                .clone_htod(&p)
                .map_err(|e| cuda_error("upload p", e))?,
        );
        Ok(plan)
    }

    /// Uploads the trees (tokens, children, draft rows) and keys of `batch` for target rows of
    /// `vocab` entries (the trees already checked against `vocab`), without target rows.
    fn for_trees(
        gpu: &Gpu,
        method: VerifyMethod,
        batch: &[VerifySequence<'_>],
        vocab: usize,
        seeds: &SeededSequences,
    ) -> Result<Self> {
        let code = method_code(method, batch)?;
        // Flatten the ragged batch.
        let mut q = Vec::new();
        let (mut q_row, mut tokens, mut node_offsets) = (Vec::new(), Vec::new(), vec![0u32]);
        let (mut child_offsets, mut child_nodes) = (vec![0u32], Vec::new());
        let mut max_path = 1usize;
        for s in batch {
            let tree = s.tree;
            let topo = tree.topology();
            max_path = max_path.max(topo.max_depth());
            for node in 0..tree.len() {
                match tree.draft_probs(node) {
                    Some(row) => {
                        q_row.push((q.len() / vocab) as i32);
                        q.extend_from_slice(row);
                    }
                    None => {
                        if code != 0 && code != 3 && !topo.children(node).is_empty() {
                            return Err(KernelError::InvalidDraftTree {
                                reason: format!(
                                    "verification with q needs the draft distribution at node {node}"
                                ),
                            });
                        }
                        q_row.push(-1);
                    }
                }
                tokens.push(tree.token(node));
                child_nodes.extend(topo.children(node).iter().map(|&c| c as u32));
                child_offsets.push(child_nodes.len() as u32);
            }
            node_offsets.push(tokens.len() as u32);
        }
        let total_nodes = tokens.len();
        if q.is_empty() {
            q.push(0.0);
        }
        for v in [&mut tokens, &mut child_nodes] {
            if v.is_empty() {
                v.push(0);
            }
        }
        if q_row.is_empty() {
            q_row.push(-1);
        }
        let batch_len = batch.len().max(1);
        let sequences: Vec<u64> = batch.iter().map(|s| s.sequence).collect();
        let (mut key_seeds, mut key_sequences): (Vec<u64>, Vec<u64>) =
            sequences.iter().map(|&s| seeds.key_of(s)).unzip();
        let mut steps: Vec<u64> = batch.iter().map(|s| s.step).collect();
        for v in [&mut key_seeds, &mut key_sequences, &mut steps] {
            v.resize(batch_len, 0);
        }
        let stream = gpu.stream();
        let up = |what: &str, e| cuda_error(&format!("upload {what}"), e);
        let alloc = |what: &str, e| cuda_error(&format!("alloc {what}"), e);
        Ok(Self {
            p: None,
            q: stream.clone_htod(&q).map_err(|e| up("q", e))?,
            q_row: stream.clone_htod(&q_row).map_err(|e| up("q rows", e))?,
            tokens: stream.clone_htod(&tokens).map_err(|e| up("tokens", e))?,
            node_offsets: stream
                .clone_htod(&node_offsets)
                .map_err(|e| up("node offsets", e))?,
            child_offsets: stream
                .clone_htod(&child_offsets)
                .map_err(|e| up("child offsets", e))?,
            child_nodes: stream
                .clone_htod(&child_nodes)
                .map_err(|e| up("children", e))?,
            key_seeds: stream
                .clone_htod(&key_seeds)
                .map_err(|e| up("key seeds", e))?,
            key_sequences: stream
                .clone_htod(&key_sequences)
                .map_err(|e| up("key sequences", e))?,
            steps: stream.clone_htod(&steps).map_err(|e| up("steps", e))?,
            scratch: stream
                .alloc_zeros(if code == 1 || code == 2 {
                    batch_len * 2 * vocab
                } else {
                    1
                })
                .map_err(|e| alloc("scratch", e))?,
            path: stream
                .alloc_zeros(batch_len * max_path)
                .map_err(|e| alloc("paths", e))?,
            len: stream
                .alloc_zeros(batch_len)
                .map_err(|e| alloc("lengths", e))?,
            next: stream
                .alloc_zeros(batch_len)
                .map_err(|e| alloc("next tokens", e))?,
            status: stream
                .alloc_zeros(batch_len)
                .map_err(|e| alloc("status", e))?,
            sequences,
            total_nodes,
            code,
            vocab,
            max_path,
        })
    }

    /// Bytes a launch must move at least: every target and draft row once (an upper bound on
    /// what one verification reads, a lower bound on the benchmark's honest denominator).
    pub fn input_bytes(&self) -> usize {
        (self.total_nodes * self.vocab + self.q.len()) * 4
    }

    /// Enqueues the verification of the whole batch (one block per sequence) over the target
    /// rows uploaded by [`VerifyPlan::new`].
    ///
    /// # Errors
    /// [`KernelError::InvalidParameter`] for a plan made without target rows;
    /// [`KernelError::Cuda`] when the launch fails.
    pub fn launch(&mut self, gpu: &Gpu) -> Result<()> {
        let p = self.p.take().ok_or_else(|| KernelError::InvalidParameter {
            what: "verify plan",
            reason: "made without target rows: launch it over device rows".into(),
        })?;
        let launched = self.launch_over(gpu, &p);
        self.p = Some(p);
        launched
    }

    /// Enqueues the verification of the whole batch over `p`, the batch's target rows on the
    /// device (`[total nodes × vocab]`, sequences in batch order).
    fn launch_over(&mut self, gpu: &Gpu, p: &CudaSlice<f32>) -> Result<()> {
        if self.sequences.is_empty() {
            return Ok(());
        }
        if p.len() != self.total_nodes * self.vocab {
            return Err(KernelError::ShapeMismatch {
                what: format!("target rows [{} nodes x {}]", self.total_nodes, self.vocab),
                expected: self.total_nodes * self.vocab,
                actual: p.len(),
            });
        }
        let stream = gpu.stream();
        let (pp, _g0) = p.device_ptr(stream);
        let (qp, _g1) = self.q.device_ptr(stream);
        let (qr, _g2) = self.q_row.device_ptr(stream);
        let (tk, _g3) = self.tokens.device_ptr(stream);
        let (no, _g4) = self.node_offsets.device_ptr(stream);
        let (co, _g5) = self.child_offsets.device_ptr(stream);
        let (cn, _g6) = self.child_nodes.device_ptr(stream);
        let (ks, _g7) = self.key_seeds.device_ptr(stream);
        let (kq, _g8) = self.key_sequences.device_ptr(stream);
        let (st, _g9) = self.steps.device_ptr(stream);
        let (sc, _g10) = self.scratch.device_ptr(stream);
        let (ap, _g11) = self.path.device_ptr(stream);
        let (al, _g12) = self.len.device_ptr(stream);
        let (nt, _g13) = self.next.device_ptr(stream);
        let (ss, _g14) = self.status.device_ptr(stream);
        let params = VerifyParams {
            p: pp,
            q: qp,
            q_row: qr,
            tokens: tk,
            node_offsets: no,
            child_offsets: co,
            child_nodes: cn,
            key_seeds: ks,
            key_sequences: kq,
            steps: st,
            scratch: sc,
            accepted_path: ap,
            accepted_len: al,
            next_token: nt,
            status: ss,
            vocab: self.vocab as u32,
            method: self.code,
            max_path: self.max_path as u32,
        };
        let f = gpu.function(&sources::VERIFY, "verify_tree")?;
        let mut launch = stream.launch_builder(&f);
        launch.arg(&params);
        let cfg = LaunchConfig {
            grid_dim: (self.sequences.len() as u32, 1, 1),
            block_dim: (512, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: `params` matches the kernel's struct; `p` holds total nodes x vocab floats
        // (checked above) and every other buffer was sized from the flattened batch in
        // `for_trees` (q rows, keys and steps per sequence, scratch 2 x vocab per sequence,
        // outputs per sequence x max_path); the guards keep the pointers valid until after the
        // launch.
        unsafe { launch.launch(cfg) }.map_err(|e| cuda_error("launch verify_tree", e))?;
        Ok(())
    }

    /// Waits for the last launch and returns its verdicts, in input order.
    ///
    /// # Errors
    /// [`KernelError::InvalidDistribution`] when the kernel flagged a row;
    /// [`KernelError::Cuda`] when a download fails.
    pub fn verdicts(&self, gpu: &Gpu) -> Result<Vec<Verdict>> {
        let stream = gpu.stream();
        let down = |what: &str, e| cuda_error(&format!("download {what}"), e);
        let status = stream
            .clone_dtoh(&self.status)
            .map_err(|e| down("status", e))?;
        let lens = stream
            .clone_dtoh(&self.len)
            .map_err(|e| down("lengths", e))?;
        let nexts = stream
            .clone_dtoh(&self.next)
            .map_err(|e| down("next tokens", e))?;
        let paths = stream
            .clone_dtoh(&self.path)
            .map_err(|e| down("paths", e))?;
        let mp = self.max_path;
        (0..self.sequences.len())
            .map(|b| {
                if status[b] != 0 {
                    return Err(KernelError::InvalidDistribution {
                        what: format!("sequence {} on the GPU", self.sequences[b]),
                        reason: format!("verify_tree status {}", status[b]),
                    });
                }
                let path = paths[b * mp..b * mp + lens[b] as usize]
                    .iter()
                    .map(|&n| n as usize)
                    .collect();
                Ok(Verdict::new(path, nexts[b]))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampling::{mix64, Production};
    use crate::tree::TreeTopology;
    use crate::verification::test_inputs::{
        batch_of, mixed_seeds, random_batch, random_input, GPU_METHODS,
    };
    use crate::verification::{CpuVerifier, DraftKind, DraftTree};

    fn check_method(
        device: Device,
        method: VerifyMethod,
        kind: DraftKind,
        chain: bool,
        vocab: usize,
        batch: usize,
    ) {
        let owned: Vec<_> = (0..batch as u64)
            .map(|s| random_input(s + 1, 1 + (mix64(s) % 11) as usize, vocab, kind, chain))
            .collect();
        let inputs: Vec<VerifyInput<'_, f32>> = owned
            .iter()
            .enumerate()
            .map(|(i, (tree, p))| VerifyInput {
                sequence: 100 + i as u64,
                step: 3,
                tree,
                target_probs: p,
            })
            .collect();
        let want = verify_batch(method, &inputs, &mut Production::production(42)).unwrap();
        let got = verify_batch_on(device, method, &inputs, 42).unwrap();
        assert_eq!(got, want, "{method:?} vocab {vocab} batch {batch}");
    }

    crate::test_device!(verify_matches_cpu_reference, |device| {
        for vocab in [1003usize, 4096] {
            check_method(
                device,
                VerifyMethod::Greedy,
                DraftKind::Deterministic,
                false,
                vocab,
                37,
            );
            check_method(
                device,
                VerifyMethod::TargetOnly,
                DraftKind::Deterministic,
                false,
                vocab,
                37,
            );
            check_method(
                device,
                VerifyMethod::ChainRejection,
                DraftKind::Iid,
                true,
                vocab,
                37,
            );
            check_method(
                device,
                VerifyMethod::MultiRound,
                DraftKind::Iid,
                false,
                vocab,
                37,
            );
            check_method(
                device,
                VerifyMethod::RecursiveRejection,
                DraftKind::WithoutReplacement,
                false,
                vocab,
                37,
            );
        }
    });

    #[test]
    #[ignore = "needs a GPU"]
    fn the_gpu_entry_point_equals_its_cpu_twin_with_mixed_seeds() {
        let Some(gpu) = crate::cuda::testing::gpu_for_test(
            "verification::cuda::tests::the_gpu_entry_point_equals_its_cpu_twin_with_mixed_seeds",
        ) else {
            return;
        };
        let mut seeded_differs = 0;
        for vocab in [1003usize, 4096] {
            for (method, kind, chain) in GPU_METHODS {
                let (trees, rows) = random_batch(kind, chain, vocab);
                let (batch, flat) = batch_of(&trees, &rows);
                let on_device = gpu.stream().clone_htod(&flat).unwrap();
                let seeds = mixed_seeds(batch.len());
                let want = CpuVerifier.verify(method, &batch, &flat, &seeds).unwrap();
                let got = gpu.verify(method, &batch, &on_device, &seeds).unwrap();
                assert_eq!(got, want, "{method:?} vocab {vocab}");
                // the same batch under the run seed alone: seeded sequences must have mattered
                let run = SeededSequences::new(42);
                let unseeded = gpu.verify(method, &batch, &on_device, &run).unwrap();
                assert_eq!(
                    unseeded,
                    CpuVerifier.verify(method, &batch, &flat, &run).unwrap()
                );
                seeded_differs += got.iter().zip(&unseeded).filter(|(a, b)| a != b).count();
            }
        }
        assert!(seeded_differs > 0, "own seeds changed no GPU verdict");
    }

    #[test]
    #[ignore = "needs a GPU"]
    fn logits_to_verdicts_on_the_gpu_equal_the_cpu_for_greedy_parameters() {
        let Some(gpu) = crate::cuda::testing::gpu_for_test(
            "verification::cuda::tests::logits_to_verdicts_on_the_gpu_equal_the_cpu_for_greedy_parameters",
        ) else {
            return;
        };
        let vocab = 4099;
        let params = SamplingParams::greedy();
        for (method, kind, chain) in GPU_METHODS {
            let (trees, rows) = random_batch(kind, chain, vocab);
            let (batch, probs) = batch_of(&trees, &rows);
            // logits whose argmax is each row's most likely token
            let logits: Vec<f32> = probs.iter().map(|p| p.max(1e-30).ln()).collect();
            let seeds = mixed_seeds(batch.len());
            let mut host = logits.clone();
            CpuVerifier.prepare(&mut host, vocab, &params).unwrap();
            let want = CpuVerifier.verify(method, &batch, &host, &seeds).unwrap();
            let mut device = gpu.stream().clone_htod(&logits).unwrap();
            gpu.prepare(&mut device, vocab, &params).unwrap();
            assert_eq!(
                gpu.stream().clone_dtoh(&device).unwrap(),
                host,
                "{method:?}"
            );
            let got = gpu.verify(method, &batch, &device, &seeds).unwrap();
            assert_eq!(got, want, "{method:?}");
        }
    }

    crate::test_device!(verify_fills_the_gpu, |device| {
        // Vocabulary of Qwen2 (152k, a multiple of 4: vector loads), batch 64 chains on the GPU;
        // the CPU half (which only checks the dispatch) uses 4 sequences to stay fast.
        let batch = if device.is_cuda() { 64 } else { 4 };
        check_method(
            device,
            VerifyMethod::ChainRejection,
            DraftKind::Iid,
            true,
            151_936,
            batch,
        );
    });

    crate::test_device!(verify_edge_cases, |device| {
        let vocab = 9;
        let topo = TreeTopology::chain(3);
        // q = 0 at the drafted token: rejected; one-hot p: the residual is p's token.
        let mut q0 = vec![0.125f32; vocab];
        q0[2] = 0.0;
        q0[0] = 0.25;
        let mut one_hot = vec![0.0f32; vocab];
        one_hot[5] = 1.0;
        let tree = DraftTree::new(
            topo.clone(),
            vec![0, 2, 3],
            vec![Some(q0.clone()), Some(q0.clone()), None],
            DraftKind::Iid,
        )
        .unwrap();
        let p = vec![one_hot.clone(), one_hot.clone(), one_hot.clone()];
        let input = [VerifyInput {
            sequence: 1,
            step: 0,
            tree: &tree,
            target_probs: &p,
        }];
        let got = verify_batch_on(device, VerifyMethod::ChainRejection, &input, 9).unwrap();
        assert_eq!(got, vec![Verdict::new(vec![], 5)]);
        // NaN in p is refused, not verified.
        let mut bad = p.clone();
        bad[1][4] = f32::NAN;
        let input = [VerifyInput {
            sequence: 1,
            step: 0,
            tree: &tree,
            target_probs: &bad,
        }];
        assert!(verify_batch_on(device, VerifyMethod::ChainRejection, &input, 9).is_err());
        // Typical acceptance is not a GPU method.
        if device.is_cuda() {
            let input = [VerifyInput {
                sequence: 1,
                step: 0,
                tree: &tree,
                target_probs: &p,
            }];
            assert!(verify_batch_on(
                device,
                VerifyMethod::Typical {
                    epsilon: 0.1,
                    delta: 0.1
                },
                &input,
                9
            )
            .is_err());
        }
    });
}
