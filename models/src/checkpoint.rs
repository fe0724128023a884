//! [`Checkpoint`]: a decoder as stored, a GGUF file or a Hugging Face model folder, with one
//! way to read its configuration, weights, special tokens and tokenizer and to build a runner
//! on a device from it.

use std::path::Path;
use std::sync::Arc;

use specdec_kernels::cuda::Device;
use specdec_kernels::kv::dtype::require_f32;

use crate::error::Result;
use crate::gguf::GgufFile;
use crate::hf_folder::HfFolder;
use crate::llama::cuda::CudaLlamaModel;
use crate::llama::{
    read_config, read_special_tokens, read_weights, DeviceModelOptions, LlamaConfig, LlamaModel,
    LlamaOptions, ModelWeights, SpecialTokens,
};
use crate::model::LanguageModel;
use crate::tokenizer::Tokenizer;

/// A Llama-family decoder as stored. Cheap to clone (the file or folder is shared).
#[derive(Debug, Clone)]
pub enum Checkpoint {
    /// A GGUF file (quantised weights, tokenizer in the metadata).
    Gguf(Arc<GgufFile>),
    /// A Hugging Face folder (`config.json`, `tokenizer.json`, `*.safetensors`).
    HfFolder(Arc<HfFolder>),
}

impl From<Arc<GgufFile>> for Checkpoint {
    fn from(file: Arc<GgufFile>) -> Self {
        Checkpoint::Gguf(file)
    }
}

impl Checkpoint {
    /// Opens `path`: a directory as a Hugging Face folder ([`HfFolder::open`]), anything else
    /// as a GGUF file ([`GgufFile::open`], memory-mapped).
    ///
    /// # Errors
    /// As [`HfFolder::open`] or [`GgufFile::open`].
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        Ok(if path.is_dir() {
            Checkpoint::HfFolder(Arc::new(HfFolder::open(path)?))
        } else {
            Checkpoint::Gguf(Arc::new(GgufFile::open(path)?))
        })
    }

    /// The GGUF file, when this is one.
    pub fn gguf(&self) -> Option<&Arc<GgufFile>> {
        match self {
            Checkpoint::Gguf(file) => Some(file),
            Checkpoint::HfFolder(_) => None,
        }
    }

    /// The decoder's configuration.
    ///
    /// # Errors
    /// As [`read_config`] (a folder's was checked when it was opened).
    pub fn config(&self) -> Result<LlamaConfig> {
        match self {
            Checkpoint::Gguf(file) => read_config(file),
            Checkpoint::HfFolder(folder) => Ok(folder.config().clone()),
        }
    }

    /// The weights of the decoder `config` (this checkpoint's [`Checkpoint::config`])
    /// describes, over the stored bytes.
    ///
    /// # Errors
    /// As [`read_weights`] or [`HfFolder::read_weights`].
    pub fn weights(&self, config: &LlamaConfig) -> Result<ModelWeights> {
        match self {
            Checkpoint::Gguf(file) => read_weights(file, config),
            Checkpoint::HfFolder(folder) => folder.read_weights(),
        }
    }

    /// BOS and EOS ids.
    pub fn special_tokens(&self) -> SpecialTokens {
        match self {
            Checkpoint::Gguf(file) => read_special_tokens(file),
            Checkpoint::HfFolder(folder) => folder.special_tokens().clone(),
        }
    }

    /// The tokenizer: built from the GGUF metadata, or a folder's `tokenizer.json`.
    ///
    /// # Errors
    /// As [`Tokenizer::from_gguf`] or [`HfFolder::tokenizer`].
    pub fn tokenizer(&self) -> Result<Tokenizer> {
        match self {
            Checkpoint::Gguf(file) => Tokenizer::from_gguf(file),
            Checkpoint::HfFolder(folder) => folder.tokenizer(),
        }
    }

    /// A single-rank CPU runner.
    ///
    /// # Errors
    /// As [`Checkpoint::config`], [`Checkpoint::weights`] and [`LlamaModel::from_weights`].
    pub fn load(&self, options: LlamaOptions) -> Result<LlamaModel> {
        let config = self.config()?;
        let weights = self.weights(&config)?;
        LlamaModel::from_weights(config, weights, self.special_tokens(), options)
    }

    /// A tensor-parallel group of `world` CPU ranks on threads of this process
    /// ([`crate::shard::ShardedModel`]; `world` = 1 is one rank behind the same interface).
    ///
    /// # Errors
    /// As [`Checkpoint::load`]; a `world` the KV heads or the quantisation blocks cannot be
    /// split into ([`crate::shard::ShardPlan::new`]).
    pub fn load_sharded(
        &self,
        options: LlamaOptions,
        world: usize,
    ) -> Result<crate::shard::ShardedModel> {
        let config = self.config()?;
        let weights = self.weights(&config)?;
        crate::shard::ShardedModel::new(&config, &weights, &self.special_tokens(), options, world)
    }

    /// A tensor-parallel group of `world` ranks on `options.device`: CPU ranks on threads of
    /// this process ([`Checkpoint::load_sharded`]), or GPU ranks joined by NCCL, rank `r` on
    /// CUDA device `r` ([`crate::shard::ShardedModel::on_gpus`]).
    ///
    /// # Errors
    /// As [`Checkpoint::load_sharded`] and [`crate::shard::ShardedModel::on_gpus`] (fewer GPUs
    /// than ranks, no NCCL); a GPU other than device 0 ([`crate::ModelError::Config`]: the ranks
    /// take devices `0..world`); a KV type other than f32 on GPUs.
    pub fn load_sharded_on_device(
        &self,
        options: DeviceModelOptions,
        world: usize,
    ) -> Result<Box<dyn LanguageModel>> {
        match options.device {
            Device::Cpu => Ok(Box::new(self.load_sharded(options.cpu_options(), world)?)),
            Device::Cuda(0) => {
                require_f32(options.kv_dtype, "the CUDA runner")?;
                let config = self.config()?;
                let weights = self.weights(&config)?;
                Ok(Box::new(crate::shard::ShardedModel::on_gpus(
                    &config,
                    &weights,
                    &self.special_tokens(),
                    options.cuda_options(0),
                    world,
                )?))
            }
            Device::Cuda(ordinal) => Err(crate::ModelError::Config(format!(
                "{world} tensor-parallel GPU ranks take CUDA devices 0..{world}, one each; \
                 they cannot start at cuda:{ordinal}"
            ))),
        }
    }

    /// The decoder on `options.device`: the CPU runner or the CUDA runner.
    ///
    /// # Errors
    /// As [`Checkpoint::load`] on the CPU and [`CudaLlamaModel::from_weights`] on a GPU (no
    /// usable GPU is a [`crate::ModelError::Config`] naming the problem).
    pub fn load_on_device(&self, options: DeviceModelOptions) -> Result<Box<dyn LanguageModel>> {
        Ok(match options.device {
            Device::Cpu => Box::new(self.load(options.cpu_options())?),
            Device::Cuda(ordinal) => {
                require_f32(options.kv_dtype, "the CUDA runner")?;
                let cuda = options.cuda_options(ordinal);
                match self {
                    // the GGUF path checks the GPU before reading the file
                    Checkpoint::Gguf(file) => Box::new(CudaLlamaModel::from_gguf(file, cuda)?),
                    Checkpoint::HfFolder(_) => {
                        let config = self.config()?;
                        let weights = self.weights(&config)?;
                        Box::new(CudaLlamaModel::from_weights(
                            config,
                            &weights,
                            self.special_tokens(),
                            cuda,
                        )?)
                    }
                }
            }
        })
    }
}
