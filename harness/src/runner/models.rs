//! Real models for the engine backend: files opened once, instantiated on the run's device, and
//! the checks and timings the backend needs of them.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use specdec_kernels::cuda::Device;
use specdec_kernels::kv::KvDtype;
use specdec_kernels::TreeTopology;
use specdec_models::llama::cuda::GpuMatmul;
use specdec_models::llama::{DeviceModelOptions, LlamaModel, LlamaOptions};
use specdec_models::shard::ShardedModel;
use specdec_models::tokenizer::Tokenizer;
use specdec_models::{registry, Checkpoint, LanguageModel, SequenceStep};

use crate::error::{HarnessError, Result};
pub use crate::methods::DeviceModel;

/// A model opened once: its checkpoint (a parsed GGUF file or a Hugging Face folder) and
/// tokenizer.
pub struct LoadedModel {
    /// The name it was asked by (registry name or path).
    pub name: String,
    /// The file or folder.
    pub path: PathBuf,
    checkpoint: Checkpoint,
    /// Its tokenizer.
    pub tokenizer: Arc<Tokenizer>,
}

impl LoadedModel {
    /// Opens `name` (a registry name such as `smollm2-135m`, a path to a GGUF file, or a
    /// Hugging Face model folder).
    ///
    /// # Errors
    /// [`HarnessError::Model`] when the name is unknown, the file is missing from the cache (the
    /// message names `scripts/fetch-models.sh`), or the file or folder is not a usable model.
    pub fn open(name: &str) -> Result<Self> {
        let path = registry::resolve(name)?;
        let checkpoint = Checkpoint::open(&path)?;
        let tokenizer = Arc::new(checkpoint.tokenizer()?);
        Ok(Self {
            name: name.to_string(),
            path,
            checkpoint,
            tokenizer,
        })
    }

    /// A runnable model whose KV pool holds `kv_tokens` token slots (shared by its sequences;
    /// see [`super::kv_memory`]).
    ///
    /// # Errors
    /// As [`Checkpoint::load`].
    pub fn instantiate(&self, kv_tokens: usize, dtype: KvDtype) -> Result<LlamaModel> {
        Ok(self.checkpoint.load(kv_options(kv_tokens, dtype))?)
    }

    /// [`LoadedModel::instantiate`] split among `world` tensor-parallel CPU ranks, each with a
    /// pool of `kv_tokens` slots of its share of the KV heads.
    ///
    /// # Errors
    /// As [`Checkpoint::load_sharded`].
    pub fn instantiate_sharded(
        &self,
        kv_tokens: usize,
        dtype: KvDtype,
        world: usize,
    ) -> Result<ShardedModel> {
        Ok(self
            .checkpoint
            .load_sharded(kv_options(kv_tokens, dtype), world)?)
    }

    /// [`LoadedModel::instantiate`] with a pool for one sequence of the model's whole context
    /// (and a draft tree's room).
    ///
    /// # Errors
    /// As [`LoadedModel::instantiate`] and [`LoadedModel::kv_shape`].
    pub fn instantiate_one(&self) -> Result<LlamaModel> {
        let (_, context) = self.kv_shape(KvDtype::F32)?;
        self.instantiate(context + crate::engine::KV_TREE_ROOM, KvDtype::F32)
    }

    /// Bytes of `dtype` KV one token takes in this model (every layer's K and V, all KV heads),
    /// and its context length.
    ///
    /// # Errors
    /// As [`Checkpoint::config`] (missing or bad hyperparameters).
    pub fn kv_shape(&self, dtype: KvDtype) -> Result<(usize, usize)> {
        let c = self.checkpoint.config()?;
        let bytes = c.n_layers * 2 * c.n_kv_heads * c.head_dim * dtype.bytes();
        Ok((bytes, c.context_length))
    }

    /// [`LoadedModel::instantiate`] on `device`: the CPU runner, or the CUDA runner in its
    /// batch-invariant mode (the engine's greedy equality rests on batch invariance).
    ///
    /// # Errors
    /// As [`Checkpoint::load_on_device`]: no usable GPU is an error naming the problem.
    pub fn instantiate_on(
        &self,
        device: Device,
        kv_tokens: usize,
        dtype: KvDtype,
    ) -> Result<DeviceModel> {
        if device == Device::Cpu {
            return Ok(Box::new(self.instantiate(kv_tokens, dtype)?));
        }
        Ok(self
            .checkpoint
            .load_on_device(device_options(device, kv_tokens, dtype))?)
    }

    /// [`LoadedModel::instantiate_on`] split among `world` tensor-parallel ranks: CPU ranks on
    /// threads, or GPU ranks (one per GPU, devices `0..world`, NCCL) in the batch-invariant mode,
    /// each with a pool of `kv_tokens` slots of its share of the KV heads.
    ///
    /// # Errors
    /// As [`Checkpoint::load_sharded_on_device`] (fewer GPUs than ranks is an error naming
    /// both counts).
    pub fn instantiate_sharded_on(
        &self,
        device: Device,
        kv_tokens: usize,
        dtype: KvDtype,
        world: usize,
    ) -> Result<DeviceModel> {
        Ok(self
            .checkpoint
            .load_sharded_on_device(device_options(device, kv_tokens, dtype), world)?)
    }
}

/// The runners' options for a pool of `kv_tokens` slots of `dtype` on `device`: the CPU
/// defaults, and on a GPU the batch-invariant mode (the engine's greedy equality rests on batch
/// invariance).
fn device_options(device: Device, kv_tokens: usize, dtype: KvDtype) -> DeviceModelOptions {
    let cpu = kv_options(kv_tokens, dtype);
    DeviceModelOptions {
        device,
        kv_capacity_tokens: cpu.kv_capacity_tokens,
        kv_block_size: cpu.kv_block_size,
        kv_dtype: dtype,
        cpu_matmul: cpu.matmul,
        gpu_matmul: GpuMatmul::BatchInvariant,
    }
}

/// The target of an [`EngineBackend`]: the CPU runner (whose layers a layer-skip drafter can
/// share), or another runner behind the trait (the CUDA one).
pub enum Target {
    /// The CPU Llama-family runner.
    Cpu(Box<LlamaModel>),
    /// A runner on another device.
    Device(DeviceModel),
    /// Tensor-parallel ranks (`tensor_parallel` ≥ 2): CPU ranks on threads of this process, or
    /// GPU ranks joined by NCCL.
    Sharded(DeviceModel),
}

impl Target {
    /// The model, whatever its device.
    pub fn model(&mut self) -> &mut dyn LanguageModel {
        match self {
            Target::Cpu(m) => m.as_mut(),
            Target::Device(m) => m.as_mut(),
            Target::Sharded(m) => m.as_mut(),
        }
    }

    /// The model, read-only.
    pub fn model_ref(&self) -> &dyn LanguageModel {
        match self {
            Target::Cpu(m) => m.as_ref(),
            Target::Device(m) => m.as_ref(),
            Target::Sharded(m) => m.as_ref(),
        }
    }

    /// The CPU runner, for what only it offers (`what` names the feature for the error).
    ///
    /// # Errors
    /// [`HarnessError::InvalidEngine`] when the target runs on another device.
    pub fn cpu(&mut self, what: &str) -> Result<&mut LlamaModel> {
        match self {
            Target::Cpu(m) => Ok(m.as_mut()),
            Target::Device(_) => Err(HarnessError::InvalidEngine(format!(
                "{what} needs the CPU runner (models.device = \"cpu\"): the GPU runner has no \
                 layer subsets"
            ))),
            Target::Sharded(_) => Err(HarnessError::InvalidEngine(format!(
                "{what} needs the unsharded CPU runner (models.tensor_parallel = 1): the \
                 tensor-parallel ranks have no layer subsets or feature taps"
            ))),
        }
    }
}

/// KV options with a pool of `kv_tokens` token slots (at least one) of `dtype` elements.
pub fn kv_options(kv_tokens: usize, dtype: KvDtype) -> LlamaOptions {
    LlamaOptions {
        kv_capacity_tokens: kv_tokens.max(1),
        kv_dtype: dtype,
        ..LlamaOptions::default()
    }
}

/// Refuses a draft whose tokenizer differs from the target's: same vocabulary size and the same
/// strings at a spread of token ids (first, last, and 14 in between).
///
/// # Errors
/// [`HarnessError::InvalidEngine`] naming both models and the first difference.
pub fn check_same_tokenizer(target: &LoadedModel, draft: &LoadedModel) -> Result<()> {
    let (t, d) = (&target.tokenizer, &draft.tokenizer);
    let refuse = |what: String| {
        Err(HarnessError::InvalidEngine(format!(
            "draft `{}` cannot draft for target `{}`: their tokenizers differ ({what}); \
             speculative decoding needs the same token ids — use an n-gram or layer_skip \
             drafter instead",
            draft.name, target.name
        )))
    };
    if t.vocab_size() != d.vocab_size() {
        return refuse(format!(
            "vocabulary {} vs {} tokens",
            t.vocab_size(),
            d.vocab_size()
        ));
    }
    let n = t.vocab_size() as u32;
    for i in 0..16u32 {
        let id = (n - 1) * i / 15;
        if t.token_str(id) != d.token_str(id) {
            return refuse(format!(
                "token {id} is {:?} vs {:?}",
                t.token_str(id),
                d.token_str(id)
            ));
        }
    }
    Ok(())
}

/// Median seconds of a forward of `n` chained tokens after a 32-token prefix (3 runs): one
/// point of a model's cost curve over tokens per pass.
///
/// # Errors
/// The model's errors (no free sequence, KV capacity).
pub fn time_forward(model: &mut dyn LanguageModel, n: usize) -> Result<f64> {
    let seq = model.new_sequence()?;
    let result = (|| -> Result<f64> {
        let prefix: Vec<u32> = (0..32u32).map(|i| 100 + i).collect();
        let chain = TreeTopology::chain(prefix.len());
        model.forward(&[SequenceStep::chain(seq, &prefix, &chain)])?;
        model.commit(seq, &(0..prefix.len()).collect::<Vec<_>>())?;
        let tokens: Vec<u32> = (0..n as u32).map(|i| 200 + i).collect();
        let tree = TreeTopology::chain(n);
        let mut times = Vec::new();
        for _ in 0..3 {
            let t0 = Instant::now();
            model.forward(&[SequenceStep::chain(seq, &tokens, &tree)])?;
            times.push(t0.elapsed().as_secs_f64());
        }
        times.sort_by(f64::total_cmp);
        Ok(times[1].max(1e-9))
    })();
    model.release(seq)?;
    result
}
