//! The sum at the heart of a tensor-parallel all-reduce: every rank's partial rows, added in
//! rank order, so every rank (and every device) gets the same bits as a single-process group.

use crate::error::{KernelError, Result};

/// `out[i] = ((gathered[0·len + i] + gathered[1·len + i]) + gathered[2·len + i]) + …`: the
/// element-wise sum of `world` partial buffers of `len = out.len()` values laid end to end in
/// rank order (`gathered`: `[world × len]`), one rounded f32 add per rank after the first.
///
/// # Errors
/// [`KernelError::InvalidParameter`] for `world == 0`; [`KernelError::ShapeMismatch`] when
/// `gathered` does not hold `world × out.len()` values.
pub fn sum_ranks(gathered: &[f32], world: usize, out: &mut [f32]) -> Result<()> {
    check_sum_ranks(gathered.len(), world, out.len())?;
    let len = out.len();
    if len == 0 {
        return Ok(());
    }
    out.copy_from_slice(&gathered[..len]);
    for part in gathered[len..].chunks_exact(len) {
        for (sum, &v) in out.iter_mut().zip(part) {
            *sum += v;
        }
    }
    Ok(())
}

/// The shape rule [`sum_ranks`] and its CUDA twin share.
pub(crate) fn check_sum_ranks(gathered: usize, world: usize, len: usize) -> Result<()> {
    if world == 0 {
        return Err(KernelError::InvalidParameter {
            what: "world",
            reason: "a sum over ranks needs at least one rank".into(),
        });
    }
    if gathered != world * len {
        return Err(KernelError::ShapeMismatch {
            what: format!("gathered partials ({world} ranks × {len} values)"),
            expected: world * len,
            actual: gathered,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_in_rank_order() {
        // 1e8 + 1 - 1e8 is 0 in f32 (rank order), 1 in exact arithmetic: the order shows
        let gathered = [1e8f32, 2.0, 1.0, 3.0, -1e8, -4.0];
        let mut out = [0.0f32; 2];
        sum_ranks(&gathered, 3, &mut out).unwrap();
        assert_eq!(out, [0.0, 1.0]);
        let mut one = [9.0f32; 2];
        sum_ranks(&gathered[..2], 1, &mut one).unwrap();
        assert_eq!(one, [1e8, 2.0]);
    }

    #[test]
    fn refuses_bad_shapes() {
        let mut out = [0.0f32; 2];
        let err = sum_ranks(&[1.0; 5], 3, &mut out).unwrap_err().to_string();
        assert!(err.contains('6') && err.contains('5'), "{err}");
        assert!(sum_ranks(&[], 0, &mut []).is_err());
        assert!(sum_ranks(&[], 4, &mut []).is_ok());
    }
}
