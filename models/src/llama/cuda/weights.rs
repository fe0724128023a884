//! The decoder's weights on the device: matrices as bf16 (dequantised there from the GGUF blocks),
//! norm gains and biases as f32.

use cudarc::driver::CudaSlice;
use half::bf16;
use specdec_kernels::cuda::Gpu;
use specdec_kernels::quant::cuda::dequantize_cuda;
use specdec_kernels::quant::QuantType;

use super::device_error;
use crate::error::Result;
use crate::llama::config::LlamaConfig;
use crate::llama::weights::{ModelWeights, WeightMatrix};

/// A `[rows × cols]` row-major bf16 matrix on the device.
pub struct DeviceMatrix {
    rows: usize,
    cols: usize,
    data: CudaSlice<bf16>,
}

impl std::fmt::Debug for DeviceMatrix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DeviceMatrix(bf16 [{} x {}])", self.rows, self.cols)
    }
}

/// How a stored matrix reaches bf16 on the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bf16Route {
    /// The bytes are bf16 already: uploaded as they are.
    Verbatim,
    /// f32 values rounded to bf16 (nearest even) on the host, then uploaded: 2 bytes per value
    /// cross the bus instead of 4, and no kernel exists for f32 → bf16 dequantisation.
    HostRound,
    /// The GGUF blocks are uploaded and dequantised by `dequantize_cuda::<bf16>`.
    DeviceDequant,
}

impl Bf16Route {
    /// The route for a matrix stored as `ty`.
    pub fn for_type(ty: QuantType) -> Self {
        match ty {
            QuantType::BF16 => Self::Verbatim,
            QuantType::F32 => Self::HostRound,
            _ => Self::DeviceDequant,
        }
    }
}

impl DeviceMatrix {
    /// Uploads `m` and converts it to bf16 on the way (see [`Bf16Route`]).
    ///
    /// # Errors
    /// A storage type without a bf16 kernel, or a CUDA failure (out of memory included), as
    /// [`crate::ModelError::Kernel`].
    pub fn upload(gpu: &Gpu, m: &WeightMatrix) -> Result<Self> {
        let n = m.rows() * m.cols();
        let st = gpu.stream();
        let what = format!("{m:?}");
        let data = match Bf16Route::for_type(m.quant_type()) {
            Bf16Route::Verbatim => {
                let values: Vec<bf16> = m
                    .bytes()
                    .chunks_exact(2)
                    .map(|b| bf16::from_bits(u16::from_le_bytes([b[0], b[1]])))
                    .collect();
                st.clone_htod(&values)
                    .map_err(|e| device_error(&format!("upload {what}"), e))?
            }
            Bf16Route::HostRound => {
                let values: Vec<bf16> = m
                    .bytes()
                    .chunks_exact(4)
                    .map(|b| bf16::from_f32(f32::from_le_bytes([b[0], b[1], b[2], b[3]])))
                    .collect();
                st.clone_htod(&values)
                    .map_err(|e| device_error(&format!("upload {what}"), e))?
            }
            Bf16Route::DeviceDequant => {
                let blocks = st
                    .clone_htod(m.bytes())
                    .map_err(|e| device_error(&format!("upload blocks of {what}"), e))?;
                let mut out = st
                    .alloc_zeros::<bf16>(n)
                    .map_err(|e| device_error(&format!("alloc bf16 {what}"), e))?;
                dequantize_cuda(gpu, m.quant_type(), &blocks, n, &mut out)?;
                out
            }
        };
        Ok(Self {
            rows: m.rows(),
            cols: m.cols(),
            data,
        })
    }

    /// Output dimension.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Input dimension.
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// The `rows * cols` bf16 values, row-major.
    pub fn data(&self) -> &CudaSlice<bf16> {
        &self.data
    }
}

/// Uploads an f32 vector (a norm gain or a bias).
pub(super) fn upload_f32(gpu: &Gpu, what: &str, values: &[f32]) -> Result<CudaSlice<f32>> {
    gpu.stream()
        .clone_htod(values)
        .map_err(|e| device_error(&format!("upload {what}"), e))
}

/// One decoder block on the device.
pub struct DeviceLayer {
    /// RMSNorm gain before attention, `[hidden]` f32.
    pub attn_norm: CudaSlice<f32>,
    /// Query projection `[q_dim × hidden]`.
    pub wq: DeviceMatrix,
    /// Key projection `[kv_dim × hidden]`.
    pub wk: DeviceMatrix,
    /// Value projection `[kv_dim × hidden]`.
    pub wv: DeviceMatrix,
    /// Q, K, V biases (qwen2), f32.
    pub bias: Option<[CudaSlice<f32>; 3]>,
    /// Attention output projection `[hidden × q_dim]`.
    pub wo: DeviceMatrix,
    /// RMSNorm gain before the MLP, `[hidden]` f32.
    pub ffn_norm: CudaSlice<f32>,
    /// SwiGLU gate `[ffn × hidden]`.
    pub w_gate: DeviceMatrix,
    /// SwiGLU up `[ffn × hidden]`.
    pub w_up: DeviceMatrix,
    /// SwiGLU down `[hidden × ffn]`.
    pub w_down: DeviceMatrix,
}

/// All weights on the device. A tied LM head is not uploaded twice: [`DeviceWeights::output`]
/// is then the token embedding.
pub struct DeviceWeights {
    /// Token embedding `[vocab × hidden]` bf16 (gathered row by row, widened to f32 exactly).
    pub token_embd: DeviceMatrix,
    /// Decoder blocks.
    pub layers: Vec<DeviceLayer>,
    /// Final RMSNorm gain `[hidden]` f32.
    pub output_norm: CudaSlice<f32>,
    /// A separate LM head `[vocab × hidden]`, `None` when tied to the embedding.
    pub untied_output: Option<DeviceMatrix>,
}

impl DeviceWeights {
    /// Uploads `weights` (described by `config`).
    ///
    /// # Errors
    /// As [`DeviceMatrix::upload`].
    pub fn upload(gpu: &Gpu, config: &LlamaConfig, weights: &ModelWeights) -> Result<Self> {
        let layers = weights
            .layers
            .iter()
            .enumerate()
            .map(|(i, l)| {
                let bias = match (&l.bq, &l.bk, &l.bv) {
                    (Some(q), Some(k), Some(v)) => Some([
                        upload_f32(gpu, &format!("blk.{i} q bias"), q)?,
                        upload_f32(gpu, &format!("blk.{i} k bias"), k)?,
                        upload_f32(gpu, &format!("blk.{i} v bias"), v)?,
                    ]),
                    _ => None,
                };
                Ok(DeviceLayer {
                    attn_norm: upload_f32(gpu, &format!("blk.{i} attn_norm"), &l.attn_norm)?,
                    wq: DeviceMatrix::upload(gpu, &l.wq)?,
                    wk: DeviceMatrix::upload(gpu, &l.wk)?,
                    wv: DeviceMatrix::upload(gpu, &l.wv)?,
                    bias,
                    wo: DeviceMatrix::upload(gpu, &l.wo)?,
                    ffn_norm: upload_f32(gpu, &format!("blk.{i} ffn_norm"), &l.ffn_norm)?,
                    w_gate: DeviceMatrix::upload(gpu, &l.w_gate)?,
                    w_up: DeviceMatrix::upload(gpu, &l.w_up)?,
                    w_down: DeviceMatrix::upload(gpu, &l.w_down)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            token_embd: DeviceMatrix::upload(gpu, &weights.token_embd)?,
            layers,
            output_norm: upload_f32(gpu, "output_norm", &weights.output_norm)?,
            untied_output: if config.tied_head {
                None
            } else {
                Some(DeviceMatrix::upload(gpu, &weights.output)?)
            },
        })
    }

    /// The LM head: the separate output matrix, or the token embedding when tied.
    pub fn output(&self) -> &DeviceMatrix {
        self.untied_output.as_ref().unwrap_or(&self.token_embd)
    }
}

/// Device bytes the weights of `config` take in this layout: bf16 matrices (the embedding once
/// when the head is tied) plus f32 gains and biases. A planning figure, exact for the layout.
pub fn device_weight_bytes(config: &LlamaConfig) -> usize {
    let (h, q, kv, f, v) = (
        config.hidden,
        config.q_dim(),
        config.kv_dim(),
        config.ffn,
        config.vocab_size,
    );
    let per_layer = 2 * (q * h + 2 * kv * h + h * q + 3 * f * h)
        + 4 * (2 * h + if config.qkv_bias { q + 2 * kv } else { 0 });
    let head = if config.tied_head { 0 } else { 2 * v * h };
    config.n_layers * per_layer + 2 * v * h + head + 4 * h
}
