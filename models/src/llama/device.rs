//! The run-time device choice for a Llama-family model: the CPU runner ([`LlamaModel`]) or the
//! CUDA runner ([`CudaLlamaModel`]) behind one `Box<dyn LanguageModel>`, from the same GGUF file.

use std::sync::Arc;

use specdec_kernels::cuda::Device;
use specdec_kernels::kv::KvDtype;

#[cfg(doc)]
use super::cuda::CudaLlamaModel;
use super::cuda::{CudaLlamaOptions, GpuMatmul};
#[cfg(doc)]
use super::model::LlamaModel;
use super::model::{LlamaOptions, MatmulPath};
use crate::checkpoint::Checkpoint;
use crate::error::{ModelError, Result};
use crate::gguf::GgufFile;
use crate::model::LanguageModel;

/// Parses a device name: `cpu`, `cuda` (device 0) or `cuda:N`.
///
/// # Errors
/// [`ModelError::Config`] naming the text and the accepted forms.
pub fn parse_device(text: &str) -> Result<Device> {
    Device::parse(text).map_err(|_| {
        ModelError::Config(format!(
            "unknown device `{text}`: expected `cpu`, `cuda` or `cuda:N`"
        ))
    })
}

/// How to build a model on a device: the KV cache size and each runner's product mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceModelOptions {
    /// Where the model runs.
    pub device: Device,
    /// Token slots in the KV cache, over all sequences.
    pub kv_capacity_tokens: usize,
    /// Token slots per KV block.
    pub kv_block_size: usize,
    /// Element type of the KV cache: any on the CPU, f32 on a GPU (the CUDA kernels read f32
    /// pools; anything else is refused).
    pub kv_dtype: KvDtype,
    /// The CPU runner's matmul path (used when `device` is the CPU).
    pub cpu_matmul: MatmulPath,
    /// The CUDA runner's product mode (used when `device` is a GPU).
    pub gpu_matmul: GpuMatmul,
}

impl Default for DeviceModelOptions {
    /// The CPU with [`LlamaOptions::default`]'s cache and path, [`GpuMatmul::Fast`] on a GPU.
    fn default() -> Self {
        let cpu = LlamaOptions::default();
        Self {
            device: Device::Cpu,
            kv_capacity_tokens: cpu.kv_capacity_tokens,
            kv_block_size: cpu.kv_block_size,
            kv_dtype: cpu.kv_dtype,
            cpu_matmul: cpu.matmul,
            gpu_matmul: GpuMatmul::Fast,
        }
    }
}

/// The decoder in `file` on `options.device` ([`Checkpoint::load_on_device`]).
///
/// # Errors
/// As [`LlamaModel::from_gguf`] on the CPU and [`CudaLlamaModel::from_gguf`] on a GPU (no usable
/// GPU is a [`ModelError::Config`] naming the problem).
pub fn load_on_device(
    file: &Arc<GgufFile>,
    options: DeviceModelOptions,
) -> Result<Box<dyn LanguageModel>> {
    Checkpoint::Gguf(Arc::clone(file)).load_on_device(options)
}

impl DeviceModelOptions {
    /// The CPU runner's options: this cache and the CPU matmul path.
    pub fn cpu_options(&self) -> LlamaOptions {
        LlamaOptions {
            kv_capacity_tokens: self.kv_capacity_tokens,
            kv_block_size: self.kv_block_size,
            kv_dtype: self.kv_dtype,
            matmul: self.cpu_matmul,
        }
    }

    /// The CUDA runner's options on device `ordinal`: this cache and the GPU product mode.
    pub fn cuda_options(&self, ordinal: usize) -> CudaLlamaOptions {
        CudaLlamaOptions {
            kv_capacity_tokens: self.kv_capacity_tokens,
            kv_block_size: self.kv_block_size,
            matmul: self.gpu_matmul,
            device: ordinal,
        }
    }
}
