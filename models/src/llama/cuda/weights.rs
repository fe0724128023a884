//! The decoder's weights on the device: GGUF block matrices as their blocks (read by the
//! block products, `specdec_kernels::quant::cuda::qmatmul_cuda`), float matrices as bf16, norm
//! gains and biases as f32.

use cudarc::driver::CudaSlice;
use half::bf16;
use specdec_kernels::cuda::Gpu;
use specdec_kernels::ops::cuda::embedding_gather_cuda;
use specdec_kernels::quant::cuda::{dequantize_cuda, qgather_cuda, qmatmul_supported};
use specdec_kernels::quant::QuantType;

use super::device_error;
use crate::error::Result;
use crate::llama::config::LlamaConfig;
use crate::llama::weights::{ModelWeights, WeightMatrix};

/// How a matrix stored as a GGUF type is kept on the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceLayout {
    /// The GGUF blocks as they are (Q4_K, Q6_K, Q8_0, …): about the file's bytes, decoded in
    /// registers by every product that reads them.
    Blocks,
    /// bf16 bytes copied as they are.
    Bf16Verbatim,
    /// f32 values rounded to bf16 (nearest even) on the host, then uploaded: 2 bytes per value
    /// cross the bus instead of 4.
    Bf16HostRound,
    /// f16 values uploaded and widened-then-rounded to bf16 by `dequantize_cuda::<bf16>`.
    Bf16DeviceDequant,
}

impl DeviceLayout {
    /// The layout of a matrix stored as `ty`.
    pub fn for_type(ty: QuantType) -> Self {
        match ty {
            QuantType::BF16 => Self::Bf16Verbatim,
            QuantType::F32 => Self::Bf16HostRound,
            ty if qmatmul_supported(ty) => Self::Blocks,
            _ => Self::Bf16DeviceDequant,
        }
    }

    /// Device bytes of a `[rows × cols]` matrix of `ty` in this layout.
    ///
    /// # Errors
    /// `cols` not a whole number of `ty`'s blocks.
    pub fn device_bytes(self, ty: QuantType, rows: usize, cols: usize) -> Result<usize> {
        Ok(match self {
            Self::Blocks => rows * ty.row_bytes(cols)?,
            _ => 2 * rows * cols,
        })
    }
}

/// A matrix's values on the device.
pub enum DeviceStorage {
    /// `[rows × cols]` row-major bf16.
    Bf16(CudaSlice<bf16>),
    /// `rows` GGUF rows of `cols` elements of `ty`, each `ty.row_bytes(cols)` bytes.
    Blocks {
        /// The block type.
        ty: QuantType,
        /// The blocks, row after row.
        bytes: CudaSlice<u8>,
    },
}

/// A `[rows × cols]` weight matrix on the device (see [`DeviceLayout`]).
pub struct DeviceMatrix {
    rows: usize,
    cols: usize,
    storage: DeviceStorage,
}

impl std::fmt::Debug for DeviceMatrix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.storage {
            DeviceStorage::Bf16(_) => {
                write!(f, "DeviceMatrix(bf16 [{} x {}])", self.rows, self.cols)
            }
            DeviceStorage::Blocks { ty, .. } => {
                write!(
                    f,
                    "DeviceMatrix({ty} blocks [{} x {}])",
                    self.rows, self.cols
                )
            }
        }
    }
}

impl DeviceMatrix {
    /// Uploads `m` in its [`DeviceLayout`].
    ///
    /// # Errors
    /// A storage type without a device layout, or a CUDA failure (out of memory included), as
    /// [`crate::ModelError::Kernel`].
    pub fn upload(gpu: &Gpu, m: &WeightMatrix) -> Result<Self> {
        let n = m.rows() * m.cols();
        let st = gpu.stream();
        let what = format!("{m:?}");
        let bf16_values = |values: Vec<bf16>| {
            st.clone_htod(&values)
                .map_err(|e| device_error(&format!("upload {what}"), e))
        };
        let storage = match DeviceLayout::for_type(m.quant_type()) {
            DeviceLayout::Blocks => DeviceStorage::Blocks {
                ty: m.quant_type(),
                bytes: st
                    .clone_htod(m.bytes())
                    .map_err(|e| device_error(&format!("upload blocks of {what}"), e))?,
            },
            DeviceLayout::Bf16Verbatim => DeviceStorage::Bf16(bf16_values(
                m.bytes()
                    .chunks_exact(2)
                    .map(|b| bf16::from_bits(u16::from_le_bytes([b[0], b[1]])))
                    .collect(),
            )?),
            DeviceLayout::Bf16HostRound => DeviceStorage::Bf16(bf16_values(
                m.bytes()
                    .chunks_exact(4)
                    .map(|b| bf16::from_f32(f32::from_le_bytes([b[0], b[1], b[2], b[3]])))
                    .collect(),
            )?),
            DeviceLayout::Bf16DeviceDequant => {
                let blocks = st
                    .clone_htod(m.bytes())
                    .map_err(|e| device_error(&format!("upload {what}"), e))?;
                let mut out = st
                    .alloc_zeros::<bf16>(n)
                    .map_err(|e| device_error(&format!("alloc bf16 {what}"), e))?;
                dequantize_cuda(gpu, m.quant_type(), &blocks, n, &mut out)?;
                DeviceStorage::Bf16(out)
            }
        };
        Ok(Self {
            rows: m.rows(),
            cols: m.cols(),
            storage,
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

    /// The values.
    pub fn storage(&self) -> &DeviceStorage {
        &self.storage
    }

    /// `out[t] = self[ids[t]]` in f32 (`out`: `[ids.len() × cols]`): the embedding lookup.
    ///
    /// # Errors
    /// An id past the last row, shapes, CUDA failures (as [`crate::ModelError::Kernel`]).
    pub fn gather_rows(&self, gpu: &Gpu, ids: &[u32], out: &mut CudaSlice<f32>) -> Result<()> {
        match &self.storage {
            DeviceStorage::Bf16(data) => embedding_gather_cuda(gpu, data, self.cols, ids, out)?,
            DeviceStorage::Blocks { ty, bytes } => {
                qgather_cuda(gpu, *ty, bytes, self.cols, ids, out)?
            }
        }
        Ok(())
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
    /// Uploads `weights`; with `tied_head` the LM head is the token embedding, stored once
    /// (`weights.output` is not uploaded).
    ///
    /// # Errors
    /// As [`DeviceMatrix::upload`].
    pub fn upload(gpu: &Gpu, weights: &ModelWeights, tied_head: bool) -> Result<Self> {
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
            untied_output: if tied_head {
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

/// Device bytes `weights` (described by `config`) take in this layout: each matrix in its [`DeviceLayout`] (the
/// embedding once when the head is tied) plus f32 gains and biases. A planning figure, exact for
/// the layout.
///
/// # Errors
/// A matrix whose width is not a whole number of its type's blocks.
pub fn device_weight_bytes(config: &LlamaConfig, weights: &ModelWeights) -> Result<usize> {
    let matrix = |m: &WeightMatrix| {
        DeviceLayout::for_type(m.quant_type()).device_bytes(m.quant_type(), m.rows(), m.cols())
    };
    let mut bytes = matrix(&weights.token_embd)? + 4 * weights.output_norm.len();
    if !config.tied_head {
        bytes += matrix(&weights.output)?;
    }
    for l in &weights.layers {
        for m in [&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down] {
            bytes += matrix(m)?;
        }
        bytes += 4 * (l.attn_norm.len() + l.ffn_norm.len());
        for b in [&l.bq, &l.bk, &l.bv].into_iter().flatten() {
            bytes += 4 * b.len();
        }
    }
    Ok(bytes)
}
