//! [`ProductInput`]: one layer input multiplied by the weight matrices that read it, on the
//! chosen [`MatmulPath`] (the target's forward and the draft heads share it).

use specdec_kernels::quant::int8::Q8_BLOCK;
use specdec_kernels::quant::{
    int8_supported, q32_supported, quant_matmul_int8, quant_matmul_int8_packed,
    quant_matmul_int8_packed_many, quant_matmul_q32, quant_matmul_q32_packed,
    quant_matmul_q32_packed_many, Int8PackedMatrix, PackedProduct, Q8Activations, Q8Blocks32,
    QuantType,
};

use super::model::MatmulPath;
use super::weights::WeightMatrix;
use crate::error::Result;

/// One layer input (`[n, cols]` f32 rows) as read by the products that consume it: on the
/// [`MatmulPath::Int8`] path each of its 8-bit quantisations (256-blocks, 32-blocks) is made on
/// first use and shared by every later matrix reading the same input.
pub(crate) struct ProductInput<'a> {
    x: &'a [f32],
    n: usize,
    path: MatmulPath,
    q8: Option<Q8Activations>,
    q32: Option<Q8Blocks32>,
}

impl<'a> ProductInput<'a> {
    /// The input `x` (`[n, cols]`) for products on `path`.
    pub(crate) fn new(x: &'a [f32], n: usize, path: MatmulPath) -> Self {
        Self {
            x,
            n,
            path,
            q8: None,
            q32: None,
        }
    }

    /// `out = x · wᵀ` on the chosen path (`out: [n, w.rows()]`).
    pub(crate) fn product(&mut self, w: &WeightMatrix, out: &mut [f32]) -> Result<()> {
        let ty = w.quant_type();
        if self.path != MatmulPath::Int8 {
            return w.matmul(self.x, self.n, out);
        }
        if int8_supported(ty) && w.cols().is_multiple_of(Q8_BLOCK) {
            let acts = match &mut self.q8 {
                Some(acts) => acts,
                slot => slot.insert(Q8Activations::quantize(self.x, self.n, w.cols())?),
            };
            return Ok(match w.int8_packed() {
                Some(packed) => quant_matmul_int8_packed(packed, acts, out),
                None => quant_matmul_int8(&w.view(), acts, out),
            }?);
        }
        if q32_supported(ty) {
            let acts = match &mut self.q32 {
                Some(acts) => acts,
                slot => slot.insert(Q8Blocks32::quantize(self.x, self.n, w.cols())?),
            };
            return Ok(match w.int8_packed() {
                Some(packed) => quant_matmul_q32_packed(packed, acts, out),
                None => quant_matmul_q32(&w.view(), acts, out),
            }?);
        }
        w.matmul(self.x, self.n, out)
    }

    /// Several products of this input, `out = x · wᵀ` for each `(w, out)` pair, each output
    /// exactly as [`Self::product`] makes it. When every matrix is packed for the 8-bit path
    /// and of one activation format, they run as one fused call (one parallel region for all
    /// their tiles); otherwise one after the other.
    /// The outputs are any `[f32]` holders (slices, or a device backend's `Vec`s).
    pub(crate) fn products<O: AsMut<[f32]>>(
        &mut self,
        pairs: &mut [(&WeightMatrix, O)],
    ) -> Result<()> {
        let packed: Option<Vec<&Int8PackedMatrix>> =
            pairs.iter().map(|(w, _)| w.int8_packed()).collect();
        let fuse = self.path == MatmulPath::Int8 && pairs.len() > 1;
        if let (true, Some(packed)) = (fuse, packed) {
            let cols = packed[0].cols();
            let all = |f: fn(QuantType) -> bool| {
                packed.iter().all(|w| f(w.quant_type()) && w.cols() == cols)
            };
            let mut fused: Vec<PackedProduct<'_>> = packed
                .iter()
                .zip(pairs.iter_mut())
                .map(|(&w, (_, out))| PackedProduct {
                    w,
                    out: out.as_mut(),
                })
                .collect();
            if all(int8_supported) && cols.is_multiple_of(Q8_BLOCK) {
                let acts = match &mut self.q8 {
                    Some(acts) => acts,
                    slot => slot.insert(Q8Activations::quantize(self.x, self.n, cols)?),
                };
                return Ok(quant_matmul_int8_packed_many(&mut fused, acts)?);
            }
            if all(q32_supported) {
                let acts = match &mut self.q32 {
                    Some(acts) => acts,
                    slot => slot.insert(Q8Blocks32::quantize(self.x, self.n, cols)?),
                };
                return Ok(quant_matmul_q32_packed_many(&mut fused, acts)?);
            }
        }
        for (w, out) in pairs.iter_mut() {
            self.product(w, out.as_mut())?;
        }
        Ok(())
    }
}

/// `out = x · wᵀ` for every `(w, out)` of `pairs` (`x: [n, cols]`, each `out: [n, w.rows()]`)
/// on `path`, as the model's forward computes the products of one input: fused into one call
/// where the forward fuses them (Q, K and V; gate and up), the activations quantised once. For
/// benchmarks of the model's products.
///
/// # Errors
/// Shape mismatches and non-finite activations, as the kernels report them.
pub fn products_on(
    path: MatmulPath,
    x: &[f32],
    n: usize,
    pairs: &mut [(&WeightMatrix, &mut [f32])],
) -> Result<()> {
    ProductInput::new(x, n, path).products(pairs)
}

impl WeightMatrix {
    /// `out = x · selfᵀ` (`x: [n, cols]`, `out: [n, rows]`) on `path`, exactly as the model's
    /// forward computes it (activations quantised per call here; the forward shares them among
    /// the matrices reading one input). For benchmarks of the model's products.
    ///
    /// # Errors
    /// Shape mismatches and non-finite activations, as the kernels report them.
    pub fn product_on(&self, path: MatmulPath, x: &[f32], n: usize, out: &mut [f32]) -> Result<()> {
        ProductInput::new(x, n, path).product(self, out)
    }
}
