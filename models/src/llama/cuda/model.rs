//! [`CudaLlamaModel`]: the Llama / Qwen2 decoder forwarding on one GPU.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use cudarc::driver::CudaSlice;

use specdec_kernels::attention::cuda::{AttentionPlan, PlannedSeq};
use specdec_kernels::cuda::Gpu;
use specdec_kernels::kv::cuda::KvShape;
use specdec_kernels::kv::KvLayout;
use specdec_kernels::ops::RopeAngles;
use specdec_kernels::verification::VerifyMethod;
use specdec_kernels::TreeTopology;

use super::backend::{CudaBackend, CudaKvPool, GpuTensorParallel};
use super::device_error;
use super::kv_mirror::KvMirror;
use super::matmul::GpuMatmul;
use super::weights::{upload_f32, DeviceWeights};
use crate::error::{ModelError, Result};
use crate::gguf::GgufFile;
use crate::llama::block::BlockShape;
use crate::llama::config::LlamaConfig;
use crate::llama::forward::{run_blocks, KvPool};
use crate::llama::load::{read_config, read_special_tokens, read_weights, SpecialTokens};
use crate::llama::step_checks::{check_commit_path, check_steps};
use crate::llama::weights::ModelWeights;
use crate::model::{
    check_request, forward_then_verify_host, verify_rows, LanguageModel, Logits, SeqId,
    SequenceStep, VerifiedBatch, VerifyRequest,
};
use crate::shard::{Communicator, NcclCommunicator, ShardPlan};
use specdec_kernels::ops::cuda::join_rank_columns_cuda;
use specdec_kernels::ops::split_even;

/// Options of a [`CudaLlamaModel`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CudaLlamaOptions {
    /// Token slots in the device KV cache, over all sequences (rounded up to whole blocks).
    pub kv_capacity_tokens: usize,
    /// Token slots per KV block.
    pub kv_block_size: usize,
    /// The matrix-product mode.
    pub matmul: GpuMatmul,
    /// The CUDA device ordinal.
    pub device: usize,
}

impl Default for CudaLlamaOptions {
    /// 4096 slots in blocks of 16, the [`GpuMatmul::Fast`] mode, device 0.
    fn default() -> Self {
        Self {
            kv_capacity_tokens: 4096,
            kv_block_size: 16,
            matmul: GpuMatmul::default(),
            device: 0,
        }
    }
}

/// A Llama / Qwen2 decoder on one GPU implementing [`LanguageModel`] with the CPU runner's
/// contract (see the [module docs](super) for layout and precision): the whole model, or one
/// rank of a tensor-parallel group ([`CudaLlamaModel::rank_of`]).
pub struct CudaLlamaModel {
    gpu: Arc<Gpu>,
    config: LlamaConfig,
    weights: DeviceWeights,
    layout: KvLayout,
    mirror: KvMirror,
    kv: CudaKvPool,
    special: SpecialTokens,
    last_trees: HashMap<SeqId, TreeTopology>,
    matmul: GpuMatmul,
    /// This rank's share of the decoder ([`ShardPlan::single`] for the whole model).
    plan: ShardPlan,
    /// The group's communicator; `None` for the whole model on one GPU.
    comm: Option<Arc<NcclCommunicator>>,
}

impl std::fmt::Debug for CudaLlamaModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaLlamaModel")
            .field("gpu", &self.gpu)
            .field("config", &self.config)
            .field("matmul", &self.matmul)
            .finish_non_exhaustive()
    }
}

/// The GPU `options.device`, opened before any file is read so a machine without one hears so
/// first.
fn open_gpu(options: &CudaLlamaOptions) -> Result<Arc<Gpu>> {
    Gpu::shared(options.device).map_err(|e| {
        ModelError::Config(format!(
            "the CUDA Llama runner needs a GPU (device {}): {e}",
            options.device
        ))
    })
}

impl CudaLlamaModel {
    /// Opens the GGUF file at `path` and uploads the model to the GPU.
    ///
    /// # Errors
    /// [`ModelError::Config`] naming the problem when there is no usable GPU (checked first,
    /// without panicking); then as [`CudaLlamaModel::from_gguf`].
    pub fn load(path: impl AsRef<Path>, options: CudaLlamaOptions) -> Result<Self> {
        open_gpu(&options)?;
        Self::from_gguf(&Arc::new(GgufFile::open(path)?), options)
    }

    /// Uploads the decoder in a parsed GGUF file (read with the CPU runner's loader).
    ///
    /// # Errors
    /// No GPU (as [`CudaLlamaModel::load`]); GGUF and configuration errors as
    /// [`crate::llama::LlamaModel::from_gguf`]; a storage type without a bf16 kernel; CUDA
    /// failures, out of device memory included.
    pub fn from_gguf(file: &Arc<GgufFile>, options: CudaLlamaOptions) -> Result<Self> {
        open_gpu(&options)?;
        let config = read_config(file)?;
        let weights = read_weights(file, &config)?;
        Self::from_weights(config, &weights, read_special_tokens(file), options)
    }

    /// Uploads weights built in memory.
    ///
    /// # Errors
    /// As [`CudaLlamaModel::from_gguf`], and [`ModelError::Config`] when `weights` does not
    /// match `config` or the attention kernel does not support its heads (`head_dim` 64 or
    /// 128, at most 8 query heads per KV head).
    pub fn from_weights(
        config: LlamaConfig,
        weights: &ModelWeights,
        special: SpecialTokens,
        options: CudaLlamaOptions,
    ) -> Result<Self> {
        Self::build(config, weights, special, options, None)
    }

    /// Rank `comm.rank()` of a tensor-parallel group of `comm.world_size()` GPU ranks over the
    /// full `weights`, on the communicator's GPU (`options.device` is ignored): it uploads only
    /// its [`ShardPlan`] slice (its KV heads with their query heads, its FFN rows, its
    /// vocabulary rows of the LM head) and keeps only its KV heads' cache. Inside a forward the
    /// partial sums after the attention output and down projections are all-reduced on the
    /// device ([`NcclCommunicator::all_reduce_sum_device`]); where the plan splits the output
    /// projection off the head boundaries, the attention output is gathered through the host.
    /// The logits (each rank's vocabulary rows) are gathered and joined on the device, so every
    /// rank holds whole rows and verifies there as the whole model does.
    ///
    /// # Errors
    /// As [`CudaLlamaModel::from_weights`]; as [`ShardPlan::new`] (too many ranks for the KV
    /// heads or quantisation blocks).
    pub fn rank_of(
        config: LlamaConfig,
        weights: &ModelWeights,
        special: SpecialTokens,
        options: CudaLlamaOptions,
        comm: Arc<NcclCommunicator>,
    ) -> Result<Self> {
        let options = CudaLlamaOptions {
            device: comm.ordinal(),
            ..options
        };
        Self::build(config, weights, special, options, Some(comm))
    }

    fn build(
        config: LlamaConfig,
        weights: &ModelWeights,
        special: SpecialTokens,
        options: CudaLlamaOptions,
        comm: Option<Arc<NcclCommunicator>>,
    ) -> Result<Self> {
        let gpu = open_gpu(&options)?;
        config.validate()?;
        if weights.layers.len() != config.n_layers {
            return Err(ModelError::Config(format!(
                "{} layers of weights for {} blocks",
                weights.layers.len(),
                config.n_layers
            )));
        }
        check_attention_shape(&config)?;
        if options.kv_block_size == 0 || options.kv_capacity_tokens == 0 {
            return Err(ModelError::Config(format!(
                "KV cache of {} tokens in blocks of {}: both must be >= 1",
                options.kv_capacity_tokens, options.kv_block_size
            )));
        }
        let plan = match &comm {
            Some(comm) => ShardPlan::new(&config, weights, comm.rank(), comm.world_size())?,
            None => ShardPlan::single(&config),
        };
        let layout = KvLayout::new(
            config.n_layers,
            plan.kv_heads.len(),
            config.head_dim,
            options.kv_block_size,
        )?;
        let blocks = options.kv_capacity_tokens.div_ceil(options.kv_block_size);
        let mirror = KvMirror::new(options.kv_block_size, blocks)?;
        let device_weights = match plan.world {
            1 => DeviceWeights::upload(&gpu, weights, config.tied_head)?,
            // a rank's LM head is its vocabulary rows, a slice even of a tied embedding
            _ => DeviceWeights::upload(&gpu, &plan.slice_weights(&config, weights)?, false)?,
        };
        let data = gpu
            .stream()
            .alloc_zeros::<f32>(blocks * layout.block_elems())
            .map_err(|e| device_error(&format!("alloc KV pool of {blocks} blocks"), e))?;
        gpu.synchronize()?;
        let kv = CudaKvPool {
            gpu: gpu.clone(),
            data,
            shape: kv_shape(&layout),
        };
        Ok(Self {
            gpu,
            config,
            weights: device_weights,
            layout,
            mirror,
            kv,
            special,
            last_trees: HashMap::new(),
            matmul: options.matmul,
            plan,
            comm,
        })
    }

    /// The hyper-parameters.
    pub fn config(&self) -> &LlamaConfig {
        &self.config
    }

    /// The matrix-product mode.
    pub fn matmul(&self) -> GpuMatmul {
        self.matmul
    }

    /// The GPU this model runs on.
    pub fn gpu(&self) -> &Arc<Gpu> {
        &self.gpu
    }

    /// Discards stale speculative entries and reserves the new tokens' slots, all or nothing.
    fn reserve(&mut self, steps: &[SequenceStep<'_>]) -> Result<()> {
        let mut needed = 0;
        for step in steps {
            self.mirror.rewind(step.seq, 0)?;
            self.last_trees.remove(&step.seq);
            needed += self
                .mirror
                .cache()
                .blocks_needed(step.seq, step.tokens.len())?;
        }
        let free = self.mirror.cache().allocator().free_blocks();
        if needed > free {
            return Err(ModelError::InvalidStep {
                seq: steps[0].seq.0,
                reason: format!(
                    "the batch needs {needed} KV blocks but {free} are free \
                     (raise CudaLlamaOptions::kv_capacity_tokens)"
                ),
            });
        }
        for step in steps {
            let copy_on_write = self.mirror.reserve(step.seq, step.tokens.len())?;
            self.kv.move_kv(&copy_on_write)?;
        }
        Ok(())
    }

    /// The forward of `steps` (checked, non-empty) with its `[Σ n_new × vocab]` logits left on
    /// the device (on a rank, every rank's vocabulary rows joined), every step's tree recorded
    /// for its commit.
    fn forward_on_device(&mut self, steps: &[SequenceStep<'_>]) -> Result<CudaSlice<f32>> {
        self.reserve(steps)?;
        let c = self.config.clone();
        let (mut positions, mut tokens, mut slots) = (Vec::new(), Vec::new(), Vec::new());
        let mut prefix = Vec::with_capacity(steps.len());
        for step in steps {
            let len = self.mirror.cache().len(step.seq)?;
            positions.extend(step.tree.depths().iter().map(|d| len + d));
            tokens.extend_from_slice(step.tokens);
            slots.extend(self.mirror.pending_slots(step.seq)?);
            prefix.push(len);
        }
        let angles = RopeAngles::scaled(&positions, c.head_dim, c.rope_base, &c.rope_scaling)?;
        let shape = BlockShape {
            hidden: c.hidden,
            head_dim: c.head_dim,
            q_heads: self.plan.q_heads(&c).len(),
            kv_heads: self.plan.kv_heads.len(),
            ffn: self.plan.ffn.len(),
            rms_eps: c.rms_eps,
            rope_layout: c.rope_layout,
        };
        let gpu = &*self.gpu;
        // one plan (block tables, ancestor masks) for every layer; queries and outputs stay here
        let planned = steps
            .iter()
            .zip(&prefix)
            .map(|(step, &len)| {
                Ok(PlannedSeq {
                    block_table: self.mirror.cache().block_table(step.seq)?,
                    prefix_len: len,
                    tree: step.tree,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let plan = AttentionPlan::new(
            gpu,
            &self.layout,
            self.kv.data.len(),
            shape.q_heads,
            &planned,
        )?;
        let mut dev = CudaBackend {
            gpu,
            parallel: self.comm.as_deref().map(|comm| GpuTensorParallel {
                comm,
                plan: &self.plan,
                q_dim: c.q_dim(),
            }),
            mode: self.matmul,
            kv: &mut self.kv,
            slots,
            plan,
            cos: upload_f32(gpu, "rope cosines", angles.cos())?,
            sin: upload_f32(gpu, "rope sines", angles.sin())?,
        };
        let decoder = self.weights.on_gpu();
        let rows = run_blocks(&mut dev, &shape, &decoder, &tokens, &mut |_, _| Ok(()))?;
        let mut logits = rows.logits(&dev, &shape, &decoder)?;
        drop(dev);
        if let Some(comm) = self.comm.as_deref().filter(|_| self.plan.world > 1) {
            // every rank's vocabulary rows, joined into whole rows on every rank's GPU
            let (n, world) = (tokens.len(), self.plan.world);
            let stride = n * split_even(c.vocab_size, world, 0).len();
            let gathered = comm.all_gather_padded_device(gpu, &logits, stride)?;
            logits = gpu
                .stream()
                .alloc_zeros::<f32>(n * c.vocab_size)
                .map_err(|e| device_error("alloc joined logits", e))?;
            join_rank_columns_cuda(gpu, &gathered, world, stride, n, &mut logits)?;
        }
        for step in steps {
            self.last_trees.insert(step.seq, step.tree.clone());
        }
        Ok(logits)
    }

    /// Checks `steps` against the caches; `false` for an empty batch (nothing to forward).
    fn check(&self, steps: &[SequenceStep<'_>]) -> Result<bool> {
        check_steps(steps, self.config.vocab_size, self.max_context(), |seq| {
            Ok(self.mirror.cache().len(seq)?)
        })?;
        Ok(!steps.is_empty())
    }

    fn forward_impl(&mut self, steps: &[SequenceStep<'_>]) -> Result<Vec<Logits>> {
        if !self.check(steps)? {
            return Ok(Vec::new());
        }
        let logits = self.forward_on_device(steps)?;
        let gpu = &*self.gpu;
        let logits = gpu
            .stream()
            .clone_dtoh(&logits)
            .map_err(|e| device_error("download logits", e))?;
        gpu.synchronize()?;
        split_logits(steps, self.config.vocab_size, &logits)
    }

    /// [`LanguageModel::forward_verify`] on the device: the logits stay here, one batched
    /// prepare and one verify launch ([`verify_rows`] over [`Gpu`]), only the verdicts are
    /// downloaded. Typical acceptance, which the device verifier does not run, verifies on the
    /// host instead.
    fn forward_verify_impl(
        &mut self,
        steps: &[SequenceStep<'_>],
        request: &VerifyRequest<'_>,
    ) -> Result<VerifiedBatch> {
        if matches!(request.method, VerifyMethod::Typical { .. }) {
            return forward_then_verify_host(steps, request, |steps| self.forward_impl(steps));
        }
        check_request(steps, request)?;
        let t0 = Instant::now();
        let mut logits = match self.check(steps)? {
            true => self.forward_on_device(steps)?,
            false => return forward_then_verify_host(steps, request, |_| Ok(Vec::new())),
        };
        self.gpu.synchronize()?;
        let forward_s = t0.elapsed().as_secs_f64();
        let t0 = Instant::now();
        let verdicts = verify_rows(&*self.gpu, &mut logits, self.config.vocab_size, request)?;
        Ok(VerifiedBatch {
            verdicts,
            features: vec![None; steps.len()],
            forward_s,
            verify_s: t0.elapsed().as_secs_f64(),
        })
    }
}

/// The device pool's shape for `layout`.
fn kv_shape(layout: &KvLayout) -> KvShape {
    KvShape {
        num_layers: layout.num_layers(),
        num_kv_heads: layout.num_kv_heads(),
        head_dim: layout.head_dim(),
        block_size: layout.block_size(),
    }
}

/// Refuses heads the CUDA attention kernel does not serve, at load time rather than mid-forward.
fn check_attention_shape(config: &LlamaConfig) -> Result<()> {
    use specdec_kernels::attention::cuda::GPU_MAX_GROUP;
    if config.head_dim != 64 && config.head_dim != 128 {
        return Err(ModelError::Config(format!(
            "the CUDA runner's attention supports head_dim 64 and 128, not {}",
            config.head_dim
        )));
    }
    if config.group_size() > GPU_MAX_GROUP {
        return Err(ModelError::Config(format!(
            "the CUDA runner's attention serves at most {GPU_MAX_GROUP} query heads per KV head, \
             not {}",
            config.group_size()
        )));
    }
    Ok(())
}

/// Cuts `[Σ n_i × vocab]` logits into one [`Logits`] per step.
fn split_logits(steps: &[SequenceStep<'_>], vocab: usize, logits: &[f32]) -> Result<Vec<Logits>> {
    let mut out = Vec::with_capacity(steps.len());
    let mut first = 0;
    for step in steps {
        let rows = step.tokens.len();
        out.push(Logits::new(
            vocab,
            logits[first * vocab..(first + rows) * vocab].to_vec(),
        )?);
        first += rows;
    }
    Ok(out)
}

impl LanguageModel for CudaLlamaModel {
    fn vocab_size(&self) -> usize {
        self.config.vocab_size
    }

    fn bos_id(&self) -> Option<u32> {
        self.special.bos
    }

    fn eos_ids(&self) -> &[u32] {
        &self.special.eos
    }

    fn max_context(&self) -> usize {
        self.config.context_length
    }

    fn new_sequence(&mut self) -> Result<SeqId> {
        Ok(self.mirror.create_sequence())
    }

    fn fork(&mut self, seq: SeqId) -> Result<SeqId> {
        self.mirror.fork(seq)
    }

    fn release(&mut self, seq: SeqId) -> Result<()> {
        self.mirror.free_sequence(seq)?;
        self.last_trees.remove(&seq);
        Ok(())
    }

    fn seq_len(&self, seq: SeqId) -> Result<usize> {
        Ok(self.mirror.cache().len(seq)?)
    }

    fn forward(&mut self, steps: &[SequenceStep<'_>]) -> Result<Vec<Logits>> {
        self.forward_impl(steps)
    }

    fn forward_verify(
        &mut self,
        steps: &[SequenceStep<'_>],
        request: &VerifyRequest<'_>,
    ) -> Result<VerifiedBatch> {
        self.forward_verify_impl(steps, request)
    }

    fn kv_room(&self) -> Option<crate::model::KvRoom> {
        Some(crate::model::KvRoom::of(self.mirror.cache()))
    }

    fn commit(&mut self, seq: SeqId, path: &[usize]) -> Result<()> {
        self.mirror.cache().len(seq)?;
        check_commit_path(seq, path, self.last_trees.get(&seq))?;
        let moves = self.mirror.commit(seq, path)?;
        self.kv.move_kv(&moves)?;
        self.last_trees.remove(&seq);
        Ok(())
    }

    fn rewind(&mut self, seq: SeqId, n: usize) -> Result<()> {
        self.mirror.rewind(seq, n)?;
        self.last_trees.remove(&seq);
        Ok(())
    }
}
