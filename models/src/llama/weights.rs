//! Weight matrices kept in their stored (quantised) form, and the weights of a decoder.

use std::ops::Range;
use std::sync::Arc;

use specdec_kernels::quant::int8::Q8_BLOCK;
use specdec_kernels::quant::{
    int8_supported, quant_matmul, quantize_values, Int8PackedMatrix, QuantMatrix, QuantType,
    SimdLevel,
};

use crate::error::{ModelError, Result};
use crate::gguf::GgufFile;
use crate::safetensors_file::SafetensorsFile;

/// Where a matrix's bytes live: inside a (memory-mapped) GGUF or safetensors file, or in an
/// owned buffer (a shard's column slice, a synthetic test model).
#[derive(Clone)]
enum Storage {
    File {
        file: Arc<GgufFile>,
        offset: usize,
        len: usize,
    },
    Safetensors {
        file: Arc<SafetensorsFile>,
        offset: usize,
        len: usize,
    },
    Owned(Arc<Vec<u8>>),
}

/// A `[rows, cols]` weight matrix stored row after row in GGML blocks of one [`QuantType`]
/// (each row `cols / block_len` blocks). Never dequantised as a whole: products consume the
/// blocks directly. Optionally also holds a copy repacked for the AVX-512 8-bit kernels
/// ([`WeightMatrix::pack_for_int8`]). Cheap to clone (the bytes are shared).
#[derive(Clone)]
pub struct WeightMatrix {
    ty: QuantType,
    rows: usize,
    cols: usize,
    storage: Storage,
    int8_packed: Option<Arc<Int8PackedMatrix>>,
}

impl std::fmt::Debug for WeightMatrix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "WeightMatrix({} [{} x {}])",
            self.ty, self.rows, self.cols
        )
    }
}

impl WeightMatrix {
    /// The 2-D tensor `name` of `file` as a matrix of `shape[1]` rows and `shape[0]` columns
    /// (GGML order); a 1-D tensor is one row.
    ///
    /// # Errors
    /// A missing tensor, or [`ModelError::Shape`] for a tensor of more than two dimensions.
    pub fn from_gguf(file: &Arc<GgufFile>, name: &str) -> Result<Self> {
        let info = file.tensor_info(name)?;
        let (cols, rows) = match info.shape.as_slice() {
            [cols] => (*cols, 1),
            [cols, rows] => (*cols, *rows),
            other => {
                return Err(ModelError::Shape {
                    what: name.to_string(),
                    reason: format!("a weight matrix has 1 or 2 dimensions, found {other:?}"),
                })
            }
        };
        // Through the GGML id, so this works whichever `QuantType` the reader names.
        let ty = QuantType::from_ggml_id(info.quant_type.ggml_id())?;
        let matrix = Self {
            ty,
            rows,
            cols,
            storage: Storage::File {
                file: Arc::clone(file),
                offset: info.offset,
                len: info.n_bytes,
            },
            int8_packed: None,
        };
        matrix.check_len(name)?;
        Ok(matrix)
    }

    /// The 2-D tensor `name` of a safetensors file (shape `[rows, cols]`, row-major, as Hugging
    /// Face checkpoints store `y = W·x` weights) as a matrix over the file's bytes: F32, F16 and
    /// BF16 keep their type (the GGUF types of the same names have the same byte layout).
    ///
    /// # Errors
    /// [`ModelError::MissingTensor`] when absent; [`ModelError::Shape`] naming the tensor when
    /// it does not have two dimensions or is stored as another dtype.
    pub fn from_safetensors(file: &Arc<SafetensorsFile>, name: &str) -> Result<Self> {
        use safetensors::Dtype;
        let entry = file.entry(name).ok_or_else(|| ModelError::MissingTensor {
            path: file.path().display().to_string(),
            name: name.to_string(),
        })?;
        let shape_error = |reason: String| ModelError::Shape {
            what: format!("{}: {name}", file.path().display()),
            reason,
        };
        let [rows, cols] = entry.shape[..] else {
            return Err(shape_error(format!(
                "a weight matrix has 2 dimensions, found {:?}",
                entry.shape
            )));
        };
        let ty = match entry.dtype {
            Dtype::F32 => QuantType::F32,
            Dtype::F16 => QuantType::F16,
            Dtype::BF16 => QuantType::BF16,
            other => {
                return Err(shape_error(format!(
                    "stored as {other:?}; weight matrices must be F32, F16 or BF16"
                )))
            }
        };
        let matrix = Self {
            ty,
            rows,
            cols,
            storage: Storage::Safetensors {
                file: Arc::clone(file),
                offset: entry.offset,
                len: entry.len,
            },
            int8_packed: None,
        };
        matrix.check_len(name)?;
        Ok(matrix)
    }

    /// A matrix over owned bytes (`rows` rows of `ty.row_bytes(cols)` bytes).
    ///
    /// # Errors
    /// [`ModelError::Shape`] when `cols` is not a whole number of blocks or `bytes` is not
    /// `rows` rows long.
    pub fn from_bytes(ty: QuantType, rows: usize, cols: usize, bytes: Vec<u8>) -> Result<Self> {
        let matrix = Self {
            ty,
            rows,
            cols,
            storage: Storage::Owned(Arc::new(bytes)),
            int8_packed: None,
        };
        matrix.check_len("matrix bytes")?;
        Ok(matrix)
    }

    /// An F32 matrix holding `values` (`rows * cols` of them, row-major).
    ///
    /// # Errors
    /// [`ModelError::Shape`] when the length differs.
    pub fn from_f32(rows: usize, cols: usize, values: &[f32]) -> Result<Self> {
        Self::quantize(rows, cols, values, QuantType::F32)
    }

    /// A `[rows, cols]` matrix holding `values` (row-major) stored as `ty`: F32 exactly, F16 /
    /// BF16 rounded to nearest, or Q8_0 / Q4_0 blocks of 32 (rounding as [`quantize_values`]),
    /// so the products take it as they take a GGUF matrix of that type.
    ///
    /// # Errors
    /// [`ModelError::Shape`] when `values.len() != rows * cols` or `cols` is not a whole number
    /// of `ty`'s blocks; a kernel error for a type without a quantiser (not F32, F16, BF16, Q8_0
    /// or Q4_0) or a non-finite value stored as Q8_0 or Q4_0.
    pub fn quantize(rows: usize, cols: usize, values: &[f32], ty: QuantType) -> Result<Self> {
        let shape_error = |reason: String| ModelError::Shape {
            what: format!("{ty} matrix [{rows} x {cols}]"),
            reason,
        };
        if values.len() != rows * cols {
            return Err(shape_error(format!("{} values given", values.len())));
        }
        ty.row_bytes(cols).map_err(|e| shape_error(e.to_string()))?;
        Self::from_bytes(ty, rows, cols, quantize_values(ty, values)?)
    }

    fn check_len(&self, what: &str) -> Result<()> {
        let row = self
            .ty
            .row_bytes(self.cols)
            .map_err(|e| ModelError::Shape {
                what: what.to_string(),
                reason: e.to_string(),
            })?;
        if row * self.rows != self.bytes().len() {
            return Err(ModelError::Shape {
                what: what.to_string(),
                reason: format!(
                    "{} bytes do not hold {} rows of {} {} values",
                    self.bytes().len(),
                    self.rows,
                    self.cols,
                    self.ty
                ),
            });
        }
        Ok(())
    }

    /// The storage format.
    pub fn quant_type(&self) -> QuantType {
        self.ty
    }

    /// Output dimension.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Input dimension.
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Bytes of one stored row.
    pub fn row_bytes(&self) -> usize {
        self.cols / self.ty.block_len() * self.ty.block_bytes()
    }

    /// All stored bytes, row after row.
    pub fn bytes(&self) -> &[u8] {
        match &self.storage {
            Storage::File { file, offset, len } => &file.bytes()[*offset..*offset + *len],
            Storage::Safetensors { file, offset, len } => &file.bytes()[*offset..*offset + *len],
            Storage::Owned(bytes) => bytes,
        }
    }

    /// The stored bytes of row `r`. Panics if `r >= rows()`.
    pub fn row(&self, r: usize) -> &[u8] {
        let n = self.row_bytes();
        &self.bytes()[r * n..(r + 1) * n]
    }

    /// The kernels' borrowed view of this matrix.
    pub fn view(&self) -> QuantMatrix<'_> {
        QuantMatrix::new(self.ty, self.rows, self.cols, self.bytes())
            .expect("shape checked at construction")
    }

    /// Makes the copy repacked sixteen rows at a time for the AVX-512 8-bit kernels
    /// ([`Int8PackedMatrix`]) when the 8-bit path takes this matrix (a Q4_K / Q6_K matrix whose
    /// width is a multiple of 256, or a Q8_0 / Q4_0 / Q4_1 / Q5_0 one; else does nothing), and
    /// releases the file pages it was read from: the 8-bit products then read only the copy, and
    /// the exact path maps the file bytes in again when it needs them. Returns whether a copy
    /// was made.
    ///
    /// # Errors
    /// Kernel errors from packing (none for a matrix that passed construction).
    pub fn pack_for_int8(&mut self) -> Result<bool> {
        let takes = if int8_supported(self.ty) {
            self.cols.is_multiple_of(Q8_BLOCK)
        } else {
            Int8PackedMatrix::packable(self.ty)
        };
        if self.int8_packed.is_some() || !takes {
            return Ok(self.int8_packed.is_some());
        }
        self.int8_packed = Some(Arc::new(Int8PackedMatrix::pack(&self.view())?));
        if let Storage::File { file, offset, len } = &self.storage {
            file.release_range(*offset, *len);
        }
        Ok(true)
    }

    /// The repacked copy, when [`WeightMatrix::pack_for_int8`] made one.
    pub fn int8_packed(&self) -> Option<&Int8PackedMatrix> {
        self.int8_packed.as_deref()
    }

    /// `out[t, r] = Σ_c self[r, c] · x[t, c]` for `n` tokens (`x: [n, cols]`, `out: [n, rows]`),
    /// batch-invariant (see [`quant_matmul`]).
    ///
    /// # Errors
    /// [`ModelError::Kernel`] when the buffer lengths do not match.
    pub fn matmul(&self, x: &[f32], n: usize, out: &mut [f32]) -> Result<()> {
        Ok(quant_matmul(&self.view(), x, n, out)?)
    }

    /// Rows `range` as a matrix sharing these bytes (column-parallel sharding).
    ///
    /// # Errors
    /// [`ModelError::Shape`] when the range exceeds the rows.
    pub fn slice_rows(&self, range: Range<usize>) -> Result<Self> {
        if range.start > range.end || range.end > self.rows {
            return Err(ModelError::Shape {
                what: format!("{self:?}"),
                reason: format!("row range {range:?} exceeds {} rows", self.rows),
            });
        }
        let n = self.row_bytes();
        let storage = match &self.storage {
            Storage::File { file, offset, .. } => Storage::File {
                file: Arc::clone(file),
                offset: offset + range.start * n,
                len: range.len() * n,
            },
            Storage::Safetensors { file, offset, .. } => Storage::Safetensors {
                file: Arc::clone(file),
                offset: offset + range.start * n,
                len: range.len() * n,
            },
            Storage::Owned(bytes) => {
                Storage::Owned(Arc::new(bytes[range.start * n..range.end * n].to_vec()))
            }
        };
        Ok(Self {
            ty: self.ty,
            rows: range.len(),
            cols: self.cols,
            storage,
            int8_packed: None,
        })
    }

    /// Rows `ids` in that order as a new matrix (their bytes copied): a draft model's LM head
    /// over a chosen vocabulary ([`crate::LanguageModel::limit_logits`]).
    ///
    /// # Errors
    /// [`ModelError::Shape`] when an id is not a row.
    pub fn gather_rows(&self, ids: &[u32]) -> Result<Self> {
        if let Some(&bad) = ids.iter().find(|&&id| id as usize >= self.rows) {
            return Err(ModelError::Shape {
                what: format!("{self:?}"),
                reason: format!("row {bad} is not one of its {} rows", self.rows),
            });
        }
        let mut bytes = Vec::with_capacity(ids.len() * self.row_bytes());
        for &id in ids {
            bytes.extend_from_slice(self.row(id as usize));
        }
        Self::from_bytes(self.ty, ids.len(), self.cols, bytes)
    }

    /// Columns `range` as a new matrix, copying the covered blocks of every row (row-parallel
    /// sharding). Both ends must fall on block boundaries of the storage format.
    ///
    /// # Errors
    /// [`ModelError::Shape`] when the range exceeds the columns or splits a block.
    pub fn slice_cols(&self, range: Range<usize>) -> Result<Self> {
        let block = self.ty.block_len();
        if range.start > range.end
            || range.end > self.cols
            || !range.start.is_multiple_of(block)
            || !range.end.is_multiple_of(block)
        {
            return Err(ModelError::Shape {
                what: format!("{self:?}"),
                reason: format!(
                    "column range {range:?} is not within {} columns on {block}-element block \
                     boundaries",
                    self.cols
                ),
            });
        }
        let first = range.start / block * self.ty.block_bytes();
        let last = range.end / block * self.ty.block_bytes();
        let mut bytes = Vec::with_capacity(self.rows * (last - first));
        for r in 0..self.rows {
            bytes.extend_from_slice(&self.row(r)[first..last]);
        }
        Self::from_bytes(self.ty, self.rows, range.len(), bytes)
    }
}

/// The weights of one decoder block.
#[derive(Debug, Clone)]
pub struct LayerWeights {
    /// RMSNorm gain before attention, `[hidden]`.
    pub attn_norm: Vec<f32>,
    /// Query projection `[q_dim, hidden]`.
    pub wq: WeightMatrix,
    /// Key projection `[kv_dim, hidden]`.
    pub wk: WeightMatrix,
    /// Value projection `[kv_dim, hidden]`.
    pub wv: WeightMatrix,
    /// Query bias `[q_dim]` (qwen2).
    pub bq: Option<Vec<f32>>,
    /// Key bias `[kv_dim]` (qwen2).
    pub bk: Option<Vec<f32>>,
    /// Value bias `[kv_dim]` (qwen2).
    pub bv: Option<Vec<f32>>,
    /// Attention output projection `[hidden, q_dim]`.
    pub wo: WeightMatrix,
    /// RMSNorm gain before the MLP, `[hidden]`.
    pub ffn_norm: Vec<f32>,
    /// SwiGLU gate `[ffn, hidden]`.
    pub w_gate: WeightMatrix,
    /// SwiGLU up `[ffn, hidden]`.
    pub w_up: WeightMatrix,
    /// SwiGLU down `[hidden, ffn]`.
    pub w_down: WeightMatrix,
}

impl LayerWeights {
    /// The layer's matrices, writable.
    fn matrices_mut(&mut self) -> [&mut WeightMatrix; 7] {
        [
            &mut self.wq,
            &mut self.wk,
            &mut self.wv,
            &mut self.wo,
            &mut self.w_gate,
            &mut self.w_up,
            &mut self.w_down,
        ]
    }
}

/// All weights of a decoder.
#[derive(Debug, Clone)]
pub struct ModelWeights {
    /// Token embedding `[vocab, hidden]` (gathered row by row).
    pub token_embd: WeightMatrix,
    /// Decoder blocks.
    pub layers: Vec<LayerWeights>,
    /// Final RMSNorm gain `[hidden]`.
    pub output_norm: Vec<f32>,
    /// LM head `[vocab, hidden]` (the token embedding when tied).
    pub output: WeightMatrix,
}

impl ModelWeights {
    /// [`WeightMatrix::pack_for_int8`] for every matrix the products read (the LM head
    /// included; the token embedding, only gathered, stays as stored) whose packed layout has
    /// kernels on `level` ([`Int8PackedMatrix::has_kernels`]), in parallel.
    ///
    /// # Errors
    /// The first packing error.
    pub fn pack_for_int8(&mut self, level: SimdLevel) -> Result<()> {
        use rayon::prelude::*;
        let mut matrices: Vec<&mut WeightMatrix> = self
            .layers
            .iter_mut()
            .flat_map(LayerWeights::matrices_mut)
            .collect();
        matrices.push(&mut self.output);
        matrices
            .into_par_iter()
            .filter(|m| Int8PackedMatrix::has_kernels(m.ty, level))
            .try_for_each(|m| m.pack_for_int8().map(drop))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::llama::{products_on, MatmulPath};
    use specdec_kernels::quant::synthetic_weights;

    fn matrix(ty: QuantType, rows: usize, cols: usize) -> WeightMatrix {
        let bytes = synthetic_weights(ty, rows, cols, 3).unwrap();
        WeightMatrix::from_bytes(ty, rows, cols, bytes).unwrap()
    }

    #[test]
    fn quantised_matrices_hold_their_values_on_both_paths() {
        let (rows, cols) = (5, 64);
        let values: Vec<f32> = (0..rows * cols)
            .map(|i| ((i * 29) % 97) as f32 / 48.0 - 1.0)
            .collect();
        let x: Vec<f32> = (0..2 * cols)
            .map(|i| ((i * 13) % 31) as f32 / 15.0 - 1.0)
            .collect();
        let exact = WeightMatrix::from_f32(rows, cols, &values).unwrap();
        assert_eq!(exact.quant_type(), QuantType::F32);
        let mut want = vec![0.0; 2 * rows];
        exact.matmul(&x, 2, &mut want).unwrap();
        // |w|, |x| <= 1: an output moves by at most cols · (weight step + activation step)
        for (ty, weight_step) in [
            (QuantType::F32, 0.0),
            (QuantType::F16, 1.0 / 2048.0),
            (QuantType::BF16, 1.0 / 256.0),
            (QuantType::Q8_0, 1.0 / 254.0 + 1.0 / 2048.0),
        ] {
            let mut m = WeightMatrix::quantize(rows, cols, &values, ty).unwrap();
            assert_eq!((m.quant_type(), m.rows(), m.cols()), (ty, rows, cols));
            for path in [MatmulPath::Exact, MatmulPath::Int8] {
                let activation_step = if path == MatmulPath::Int8 && ty == QuantType::Q8_0 {
                    1.0 / 254.0
                } else {
                    0.0
                };
                let bound = cols as f32 * (weight_step + activation_step) + 1e-5;
                let mut got = vec![0.0; 2 * rows];
                m.product_on(path, &x, 2, &mut got).unwrap();
                for (g, w) in got.iter().zip(&want) {
                    assert!((g - w).abs() <= bound, "{ty} {path:?}: {g} vs {w}");
                }
            }
            m.pack_for_int8().unwrap();
        }
        let shape = |r: Result<WeightMatrix>| matches!(r, Err(ModelError::Shape { .. }));
        assert!(shape(WeightMatrix::quantize(
            rows,
            cols,
            &values[1..],
            QuantType::BF16
        )));
        assert!(shape(WeightMatrix::quantize(
            2,
            48,
            &values[..96],
            QuantType::Q8_0
        )));
        assert!(WeightMatrix::quantize(1, 256, &values[..256], QuantType::Q4_K).is_err());
    }

    #[test]
    fn packing_keeps_the_products_and_skips_what_it_cannot_take() {
        let x: Vec<f32> = (0..3 * 512)
            .map(|i| ((i % 37) as f32 - 18.0) / 9.0)
            .collect();
        for ty in [
            QuantType::Q4_K,
            QuantType::Q6_K,
            QuantType::Q8_0,
            QuantType::Q5_0,
            QuantType::Q4_0,
            QuantType::Q4_1,
        ] {
            let raw = matrix(ty, 21, 512);
            let mut packed = raw.clone();
            assert!(packed.pack_for_int8().unwrap(), "{ty} is packed");
            assert!(
                packed.pack_for_int8().unwrap(),
                "packing again keeps the copy"
            );
            assert!(raw.int8_packed().is_none() && packed.int8_packed().is_some());
            let (mut a, mut b) = (vec![0.0; 3 * 21], vec![0.0; 3 * 21]);
            raw.product_on(MatmulPath::Int8, &x, 3, &mut a).unwrap();
            packed.product_on(MatmulPath::Int8, &x, 3, &mut b).unwrap();
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&a), bits(&b), "{ty}: packed and stored layouts agree");
            // the exact path still reads the stored bytes
            raw.product_on(MatmulPath::Exact, &x, 3, &mut a).unwrap();
            packed.product_on(MatmulPath::Exact, &x, 3, &mut b).unwrap();
            assert_eq!(bits(&a), bits(&b), "{ty}: exact path unchanged");
        }
        let mut f16 = matrix(QuantType::F16, 4, 512);
        assert!(!f16.pack_for_int8().unwrap(), "F16 has no 8-bit path");
        assert!(f16.int8_packed().is_none());
    }

    /// `products_on` (one input, several matrices: fused where the forward fuses) gives every
    /// output bit for bit as that matrix's own `product_on`, fused or not, on both paths.
    #[test]
    fn fused_products_equal_one_product_at_a_time() {
        let x: Vec<f32> = (0..3 * 512)
            .map(|i| ((i % 41) as f32 - 20.0) / 10.0)
            .collect();
        for types in [
            [QuantType::Q4_K, QuantType::Q6_K, QuantType::Q4_K],
            [QuantType::Q8_0, QuantType::Q4_1, QuantType::Q5_0],
            [QuantType::Q8_0, QuantType::Q4_K, QuantType::F16],
        ] {
            let mats: Vec<WeightMatrix> = types
                .iter()
                .zip([21, 16, 5])
                .map(|(&ty, rows)| {
                    let mut m = matrix(ty, rows, 512);
                    m.pack_for_int8().unwrap();
                    m
                })
                .collect();
            for path in [MatmulPath::Exact, MatmulPath::Int8] {
                let mut fused: Vec<Vec<f32>> =
                    mats.iter().map(|m| vec![f32::NAN; 3 * m.rows()]).collect();
                let mut pairs: Vec<(&WeightMatrix, &mut [f32])> = mats
                    .iter()
                    .zip(fused.iter_mut())
                    .map(|(m, out)| (m, out.as_mut_slice()))
                    .collect();
                products_on(path, &x, 3, &mut pairs).unwrap();
                for (m, got) in mats.iter().zip(&fused) {
                    let mut want = vec![0.0; 3 * m.rows()];
                    m.product_on(path, &x, 3, &mut want).unwrap();
                    let same = got
                        .iter()
                        .zip(&want)
                        .all(|(g, w)| g.to_bits() == w.to_bits());
                    assert!(same, "{types:?} {path:?}: {} differs", m.quant_type());
                }
            }
        }
    }
}
