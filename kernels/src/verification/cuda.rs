//! CUDA launcher for batched verification (`verify.cu`): the same contract as [`verify_batch`]
//! with production decisions ([`crate::sampling::Production`] for `seed`): given the same inputs
//! and seed, the GPU returns exactly the CPU's verdicts (accepted paths and next tokens).
//!
//! One launch verifies the whole batch, one block per sequence. Supported methods: greedy, chain
//! rejection, multi-round (i.i.d.), recursive rejection, target-only; typical acceptance stays on
//! the CPU ([`KernelError::InvalidParameter`]).

use cudarc::driver::{CudaSlice, DevicePtr, DeviceRepr, LaunchConfig, PushKernelArg};

use super::input::{Verdict, VerifyInput};
use super::{verify_batch, VerifyMethod};
use crate::cuda::nvrtc::cuda_error;
use crate::cuda::{sources, Device, Gpu};
use crate::error::{KernelError, Result};
use crate::sampling::Production;

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
    sequence_ids: u64,
    steps: u64,
    scratch: u64,
    accepted_path: u64,
    accepted_len: u64,
    next_token: u64,
    status: u64,
    seed: u64,
    vocab: u32,
    method: u32,
    max_path: u32,
}

// SAFETY: plain `repr(C)` data of integers, matching the kernel's by-value struct parameter.
unsafe impl DeviceRepr for VerifyParams {}

fn method_code(method: VerifyMethod, inputs: &[VerifyInput<'_, f32>]) -> Result<u32> {
    Ok(match method {
        VerifyMethod::Greedy => 0,
        VerifyMethod::ChainRejection => {
            if let Some(i) = inputs.iter().find(|i| !i.tree.topology().is_chain()) {
                return Err(KernelError::InvalidDraftTree {
                    reason: format!(
                        "chain rejection sampling needs a chain, sequence {} has a branching tree",
                        i.sequence
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

/// Verifies a batch on `device` with production decisions for `seed`: the CPU reference
/// ([`verify_batch`] with [`Production`]) or the CUDA kernel, with identical results.
///
/// # Errors
/// As [`verify_batch`]; on CUDA also [`KernelError::CudaUnavailable`] / [`KernelError::Cuda`].
pub fn verify_batch_on(
    device: Device,
    method: VerifyMethod,
    inputs: &[VerifyInput<'_, f32>],
    seed: u64,
) -> Result<Vec<Verdict>> {
    match device {
        Device::Cpu => verify_batch(method, inputs, &mut Production::production(seed)),
        Device::Cuda(ordinal) => verify_batch_cuda(&*Gpu::shared(ordinal)?, method, inputs, seed),
    }
}

/// Verifies a batch with the CUDA kernel (inputs are validated on the host first, as the CPU
/// reference does, so NaN, negative or massless rows are refused with the same errors).
///
/// # Errors
/// As [`verify_batch`]; [`KernelError::Cuda`] when a CUDA call fails.
pub fn verify_batch_cuda(
    gpu: &Gpu,
    method: VerifyMethod,
    inputs: &[VerifyInput<'_, f32>],
    seed: u64,
) -> Result<Vec<Verdict>> {
    if inputs.is_empty() {
        return Ok(Vec::new());
    }
    let mut plan = VerifyPlan::new(gpu, method, inputs)?;
    plan.launch(gpu, seed)?;
    plan.verdicts(gpu)
}

/// A batch uploaded to the GPU once and verified by [`VerifyPlan::launch`] (as often as wanted:
/// the benchmark runner times launches alone).
pub struct VerifyPlan {
    p: CudaSlice<f32>,
    q: CudaSlice<f32>,
    q_row: CudaSlice<i32>,
    tokens: CudaSlice<u32>,
    node_offsets: CudaSlice<u32>,
    child_offsets: CudaSlice<u32>,
    child_nodes: CudaSlice<u32>,
    sequence_ids: CudaSlice<u64>,
    steps: CudaSlice<u64>,
    scratch: CudaSlice<f32>,
    path: CudaSlice<u32>,
    len: CudaSlice<u32>,
    next: CudaSlice<u32>,
    status: CudaSlice<u32>,
    sequences: Vec<u64>,
    code: u32,
    vocab: usize,
    max_path: usize,
}

impl VerifyPlan {
    /// Validates `inputs` (as the CPU does) and uploads them.
    ///
    /// # Errors
    /// As [`verify_batch`]; [`KernelError::Cuda`] when an upload fails.
    pub fn new(gpu: &Gpu, method: VerifyMethod, inputs: &[VerifyInput<'_, f32>]) -> Result<Self> {
        for input in inputs {
            input.validate()?;
        }
        let code = method_code(method, inputs)?;
        let vocab = inputs.first().map_or(1, |i| i.vocab());
        if let Some(i) = inputs.iter().find(|i| i.vocab() != vocab) {
            return Err(KernelError::ShapeMismatch {
                what: format!("vocabulary of sequence {}", i.sequence),
                expected: vocab,
                actual: i.vocab(),
            });
        }
        // Flatten the ragged batch.
        let mut p = Vec::new();
        let mut q = Vec::new();
        let (mut q_row, mut tokens, mut node_offsets) = (Vec::new(), Vec::new(), vec![0u32]);
        let (mut child_offsets, mut child_nodes) = (vec![0u32], Vec::new());
        let mut max_path = 1usize;
        for input in inputs {
            let tree = input.tree;
            let topo = tree.topology();
            max_path = max_path.max(topo.max_depth());
            for node in 0..tree.len() {
                p.extend_from_slice(&input.target_probs[node]);
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
        for v in [&mut p, &mut q] {
            if v.is_empty() {
                v.push(0.0);
            }
        }
        for v in [&mut tokens, &mut child_nodes] {
            if v.is_empty() {
                v.push(0);
            }
        }
        if q_row.is_empty() {
            q_row.push(-1);
        }
        let batch = inputs.len().max(1);
        let sequences: Vec<u64> = inputs.iter().map(|i| i.sequence).collect();
        let mut steps: Vec<u64> = inputs.iter().map(|i| i.step).collect();
        let mut sequence_ids = sequences.clone();
        sequence_ids.resize(batch, 0);
        steps.resize(batch, 0);
        let stream = gpu.stream();
        let up = |what: &str, e| cuda_error(&format!("upload {what}"), e);
        let alloc = |what: &str, e| cuda_error(&format!("alloc {what}"), e);
        Ok(Self {
            p: stream.clone_htod(&p).map_err(|e| up("p", e))?,
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
            sequence_ids: stream
                .clone_htod(&sequence_ids)
                .map_err(|e| up("sequence ids", e))?,
            steps: stream.clone_htod(&steps).map_err(|e| up("steps", e))?,
            scratch: stream
                .alloc_zeros(if code == 1 || code == 2 {
                    batch * 2 * vocab
                } else {
                    1
                })
                .map_err(|e| alloc("scratch", e))?,
            path: stream
                .alloc_zeros(batch * max_path)
                .map_err(|e| alloc("paths", e))?,
            len: stream.alloc_zeros(batch).map_err(|e| alloc("lengths", e))?,
            next: stream
                .alloc_zeros(batch)
                .map_err(|e| alloc("next tokens", e))?,
            status: stream.alloc_zeros(batch).map_err(|e| alloc("status", e))?,
            sequences,
            code,
            vocab,
            max_path,
        })
    }

    /// Bytes a launch must move at least: every target and draft row once (an upper bound on
    /// what one verification reads, a lower bound on the benchmark's honest denominator).
    pub fn input_bytes(&self) -> usize {
        (self.p.len() + self.q.len()) * 4
    }

    /// Enqueues the verification of the whole batch (one block per sequence) with production
    /// decisions for `seed`.
    ///
    /// # Errors
    /// [`KernelError::Cuda`] when the launch fails.
    pub fn launch(&mut self, gpu: &Gpu, seed: u64) -> Result<()> {
        if self.sequences.is_empty() {
            return Ok(());
        }
        let stream = gpu.stream();
        let (pp, _g0) = self.p.device_ptr(stream);
        let (qp, _g1) = self.q.device_ptr(stream);
        let (qr, _g2) = self.q_row.device_ptr(stream);
        let (tk, _g3) = self.tokens.device_ptr(stream);
        let (no, _g4) = self.node_offsets.device_ptr(stream);
        let (co, _g5) = self.child_offsets.device_ptr(stream);
        let (cn, _g6) = self.child_nodes.device_ptr(stream);
        let (si, _g7) = self.sequence_ids.device_ptr(stream);
        let (st, _g8) = self.steps.device_ptr(stream);
        let (sc, _g9) = self.scratch.device_ptr(stream);
        let (ap, _g10) = self.path.device_ptr(stream);
        let (al, _g11) = self.len.device_ptr(stream);
        let (nt, _g12) = self.next.device_ptr(stream);
        let (ss, _g13) = self.status.device_ptr(stream);
        let params = VerifyParams {
            p: pp,
            q: qp,
            q_row: qr,
            tokens: tk,
            node_offsets: no,
            child_offsets: co,
            child_nodes: cn,
            sequence_ids: si,
            steps: st,
            scratch: sc,
            accepted_path: ap,
            accepted_len: al,
            next_token: nt,
            status: ss,
            seed,
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
        // SAFETY: `params` matches the kernel's struct; every buffer was sized from the flattened
        // batch in `new` (p: nodes x vocab, q rows, scratch 2 x vocab per sequence, outputs per
        // sequence x max_path) and the guards keep the pointers valid until after the launch.
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
    use crate::sampling::mix64;
    use crate::tree::TreeTopology;
    use crate::verification::{DraftKind, DraftTree};

    /// A deterministic pseudo-random distribution over `vocab` with some exact zeros, a few
    /// heavy tokens, and the given one-hot / zero rules applied by the caller.
    fn dist(vocab: usize, salt: u64) -> Vec<f32> {
        let mut w: Vec<f32> = (0..vocab)
            .map(|i| {
                let r = mix64(salt ^ (i as u64).wrapping_mul(0x9e37));
                if r.is_multiple_of(7) {
                    0.0
                } else {
                    ((r >> 40) as f32 + 1.0) * if r.is_multiple_of(97) { 50.0 } else { 1.0 }
                }
            })
            .collect();
        let s: f32 = w.iter().sum();
        w.iter_mut().for_each(|x| *x /= s);
        w
    }

    /// A random tree of `n` nodes (parents earlier), tokens drawn to often hit the argmax.
    fn random_input(
        seq: u64,
        n: usize,
        vocab: usize,
        kind: DraftKind,
        chain: bool,
    ) -> (DraftTree<f32>, Vec<Vec<f32>>) {
        let parents: Vec<Option<usize>> = (0..n)
            .map(|i| {
                if i == 0 {
                    None
                } else if chain {
                    Some(i - 1)
                } else {
                    Some((mix64(seq * 31 + i as u64) % i as u64) as usize)
                }
            })
            .collect();
        let topo = TreeTopology::from_parents(&parents).unwrap();
        let p: Vec<Vec<f32>> = (0..n).map(|i| dist(vocab, seq * 1000 + i as u64)).collect();
        let q: Vec<Option<Vec<f32>>> = (0..n)
            .map(|i| (!topo.children(i).is_empty()).then(|| dist(vocab, seq * 7777 + i as u64)))
            .collect();
        let mut tokens = vec![0u32; n];
        for node in 1..n {
            let parent = parents[node].unwrap();
            let r = mix64(seq ^ (node as u64 * 0x51));
            // Half the time the parent's most likely target token (accepts), else a random one.
            let best = p[parent]
                .iter()
                .enumerate()
                .fold(0, |b, (i, v)| if *v > p[parent][b] { i } else { b });
            tokens[node] = if r.is_multiple_of(2) {
                best as u32
            } else {
                (r >> 20) as u32 % vocab as u32
            };
        }
        if kind == DraftKind::WithoutReplacement {
            // Siblings must differ: make them distinct by offsetting repeats.
            for node in 0..n {
                let mut seen = std::collections::HashSet::new();
                for &c in topo.children(node) {
                    while !seen.insert(tokens[c]) {
                        tokens[c] = (tokens[c] + 1) % vocab as u32;
                    }
                }
            }
        }
        (DraftTree::new(topo, tokens, q, kind).unwrap(), p)
    }

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
