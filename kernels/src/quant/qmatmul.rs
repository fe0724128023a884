//! The fixed-order product over GGUF blocks and the row gather: the CPU twins of `qmatmul.cu`.
//!
//! [`qmatmul_fma`] computes `out[m][n] = Σ_k a[m][k] · w[n][k]` as one fused multiply-add chain
//! over `k` in ascending order, from `w`'s rows dequantised exactly ([`dequantize_row`]). The CUDA
//! kernel decodes each element to the same f32 and runs the same chain (`fmaf` is a correctly
//! rounded FMA, as is [`f32::mul_add`]), so the two agree bit for bit, and a row's result never
//! depends on the other rows: the batch-invariant device mode's product. It is a reference, not
//! the CPU's fast path (that is [`super::quant_matmul_int8`] and friends).

use super::dequant::dequantize_row;
use super::matmul::QuantMatrix;
use crate::error::{KernelError, Result};

/// `out = a · wᵀ` (`a`: `[m × w.cols()]` f32 row-major, `out`: `[m × w.rows()]`), each element
/// the in-order FMA chain over the dequantised weight row.
///
/// # Errors
/// [`KernelError::ShapeMismatch`] when `a` or `out` does not fit `w`; dequantisation errors.
pub fn qmatmul_fma(a: &[f32], w: &QuantMatrix<'_>, out: &mut [f32]) -> Result<()> {
    let (rows, k) = (w.rows(), w.cols());
    check_product(a.len(), k, rows, out.len())?;
    let mut weight = vec![0.0f32; k];
    for n in 0..rows {
        dequantize_row(w.quant_type(), w.row(n), &mut weight)?;
        for (t, x) in a.chunks_exact(k).enumerate() {
            out[t * rows + n] = x
                .iter()
                .zip(&weight)
                .fold(0.0f32, |acc, (&xi, &wi)| xi.mul_add(wi, acc));
        }
    }
    Ok(())
}

/// `out[t] = w[ids[t]]` dequantised (`out`: `[ids.len() × w.cols()]` f32): the embedding lookup.
///
/// # Errors
/// [`KernelError::OutOfRange`] for an id past the last row; [`KernelError::ShapeMismatch`] for
/// `out`.
pub fn qgather_rows(w: &QuantMatrix<'_>, ids: &[u32], out: &mut [f32]) -> Result<()> {
    let width = w.cols();
    check_gather(w.rows(), width, ids, out.len())?;
    for (&id, row) in ids.iter().zip(out.chunks_exact_mut(width.max(1))) {
        dequantize_row(w.quant_type(), w.row(id as usize), row)?;
    }
    Ok(())
}

/// The checks of a product `out[m × rows] = a[m × k] · w[rows × k]ᵀ` (CPU and CUDA alike):
/// returns `m`.
///
/// # Errors
/// [`KernelError::ShapeMismatch`] when `a` is not whole rows of `k` or `out` is not `m × rows`.
pub(crate) fn check_product(a_len: usize, k: usize, rows: usize, out_len: usize) -> Result<usize> {
    if k == 0 || !a_len.is_multiple_of(k) {
        return Err(KernelError::ShapeMismatch {
            what: format!("activations (a multiple of the {k} columns)"),
            expected: a_len.div_ceil(k.max(1)) * k,
            actual: a_len,
        });
    }
    let m = a_len / k;
    if out_len != m * rows {
        return Err(KernelError::ShapeMismatch {
            what: "product output [tokens x rows]".into(),
            expected: m * rows,
            actual: out_len,
        });
    }
    Ok(m)
}

/// The checks of a gather of `ids` from a table of `rows` rows of `width` (CPU and CUDA alike).
///
/// # Errors
/// [`KernelError::ShapeMismatch`] for an output other than `ids.len() × width`;
/// [`KernelError::OutOfRange`] for an id past the last row.
pub(crate) fn check_gather(rows: usize, width: usize, ids: &[u32], out_len: usize) -> Result<()> {
    if out_len != ids.len() * width {
        return Err(KernelError::ShapeMismatch {
            what: "gathered rows [ids x width]".into(),
            expected: ids.len() * width,
            actual: out_len,
        });
    }
    match ids.iter().find(|&&id| id as usize >= rows) {
        Some(&bad) => Err(KernelError::OutOfRange {
            what: "row id".into(),
            index: bad as usize,
            limit: rows,
        }),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::dequant::dequantize_row_to_vec;
    use crate::quant::synthetic_weights;
    use crate::quant::QuantType;

    #[test]
    fn each_output_is_the_in_order_fma_chain_and_rows_are_independent() {
        let (rows, k) = (5usize, 512usize);
        for ty in [
            QuantType::Q4_K,
            QuantType::Q6_K,
            QuantType::Q8_0,
            QuantType::Q4_1,
        ] {
            let bytes = synthetic_weights(ty, rows, k, 3).unwrap();
            let w = QuantMatrix::new(ty, rows, k, &bytes).unwrap();
            let a: Vec<f32> = (0..3 * k)
                .map(|i| ((i * 37 % 101) as f32 - 50.0) / 64.0)
                .collect();
            let mut out = vec![0.0; 3 * rows];
            qmatmul_fma(&a, &w, &mut out).unwrap();
            for n in 0..rows {
                let wn = dequantize_row_to_vec(ty, w.row(n), k).unwrap();
                for t in 0..3 {
                    let mut acc = 0.0f32;
                    for i in 0..k {
                        acc = a[t * k + i].mul_add(wn[i], acc);
                    }
                    assert_eq!(
                        out[t * rows + n].to_bits(),
                        acc.to_bits(),
                        "{ty} t {t} n {n}"
                    );
                }
            }
            // one token alone: bit-identical to its row in the batch
            let mut alone = vec![0.0; rows];
            qmatmul_fma(&a[k..2 * k], &w, &mut alone).unwrap();
            assert_eq!(alone, out[rows..2 * rows].to_vec(), "{ty}");
        }
    }

    #[test]
    fn gather_returns_dequantised_rows_and_refuses_bad_ids() {
        let (rows, k) = (7usize, 256usize);
        let bytes = synthetic_weights(QuantType::Q4_K, rows, k, 9).unwrap();
        let w = QuantMatrix::new(QuantType::Q4_K, rows, k, &bytes).unwrap();
        let mut out = vec![0.0; 2 * k];
        qgather_rows(&w, &[6, 0], &mut out).unwrap();
        assert_eq!(
            out[..k],
            dequantize_row_to_vec(QuantType::Q4_K, w.row(6), k).unwrap()[..]
        );
        assert_eq!(
            out[k..],
            dequantize_row_to_vec(QuantType::Q4_K, w.row(0), k).unwrap()[..]
        );
        assert!(qgather_rows(&w, &[7, 0], &mut out).is_err());
        assert!(qgather_rows(&w, &[1], &mut out).is_err());
        let short = vec![0.0; 10];
        assert!(qmatmul_fma(&short, &w, &mut vec![0.0; rows]).is_err());
    }
}
