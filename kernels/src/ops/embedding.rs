//! Embedding gather from a quantised table.

use crate::error::{KernelError, Result};
use crate::quant::dequant::dequantize_row;
use crate::quant::QuantMatrix;

/// Gathers token embeddings: `out[t] = dequantise(table.row(ids[t]))`, `out` being
/// `[ids.len() × table.cols()]` row-major. Values are exactly [`dequantize_row`]'s.
///
/// # Errors
/// [`KernelError::InvalidParameter`] naming the first id `>= table.rows()`;
/// [`KernelError::ShapeMismatch`] when `out` has the wrong length.
pub fn embed_rows(table: &QuantMatrix<'_>, ids: &[u32], out: &mut [f32]) -> Result<()> {
    let cols = table.cols();
    if out.len() != ids.len() * cols {
        return Err(KernelError::ShapeMismatch {
            what: "embedding output [n_tokens x dim]".to_string(),
            expected: ids.len() * cols,
            actual: out.len(),
        });
    }
    if let Some((t, &id)) = ids
        .iter()
        .enumerate()
        .find(|(_, &id)| id as usize >= table.rows())
    {
        return Err(KernelError::InvalidParameter {
            what: "token id",
            reason: format!(
                "token {t} has id {id}, beyond the {} table rows",
                table.rows()
            ),
        });
    }
    for (&id, o) in ids.iter().zip(out.chunks_exact_mut(cols.max(1))) {
        dequantize_row(table.quant_type(), table.row(id as usize), o)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::testutil::{random_row, TestRng};
    use crate::quant::{dequantize_row_to_vec, QuantType};

    #[test]
    fn gathers_the_dequantised_rows() {
        let mut rng = TestRng(21);
        let (ty, rows, cols) = (QuantType::Q8_0, 5, 64);
        let data: Vec<u8> = (0..rows)
            .flat_map(|_| random_row(ty, cols, &mut rng))
            .collect();
        let table = QuantMatrix::new(ty, rows, cols, &data).unwrap();
        let ids = [3u32, 0, 3];
        let mut out = vec![0.0; 3 * cols];
        embed_rows(&table, &ids, &mut out).unwrap();
        for (t, &id) in ids.iter().enumerate() {
            let want = dequantize_row_to_vec(ty, table.row(id as usize), cols).unwrap();
            assert_eq!(out[t * cols..(t + 1) * cols], want[..]);
        }
        let err = embed_rows(&table, &[1, 5], &mut vec![0.0; 2 * cols]).unwrap_err();
        assert!(err.to_string().contains("id 5"), "{err}");
        assert!(embed_rows(&table, &[1], &mut vec![0.0; cols + 1]).is_err());
    }
}
