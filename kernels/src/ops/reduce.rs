//! The arithmetic of tensor-parallel collectives: how units are split among ranks
//! ([`split_even`]), the rank-order sum of an all-reduce ([`sum_ranks`]: every rank, on every
//! device, gets the same bits as a single-process group), and the join of column blocks
//! gathered from every rank into whole rows ([`join_rank_columns`]: the LM head's logits).

use std::ops::Range;

use crate::error::{KernelError, Result};

/// Range of `units` given to `rank` of `world`: as even as possible, the first `units % world`
/// ranks taking one more.
pub fn split_even(units: usize, world: usize, rank: usize) -> Range<usize> {
    let base = units / world;
    let extra = units % world;
    let start = rank * base + rank.min(extra);
    start..start + base + usize::from(rank < extra)
}

/// Joins the column blocks of `world` ranks into whole rows: rank `r` holds columns
/// [`split_even`]`(cols, world, r)` of each of `rows` rows, row-major `[rows × width_r]`, at
/// offset `r · stride` of `gathered` (`[world × stride]`, `stride` at least the widest block,
/// `rows × width_0`); `out` is `[rows × cols]`. Pure copies.
///
/// # Errors
/// [`KernelError::InvalidParameter`] for `world == 0` or `rows == 0` with a non-empty `out`;
/// [`KernelError::ShapeMismatch`] when `out` is not whole rows, `stride` is too short or
/// `gathered` is not `world × stride`.
pub fn join_rank_columns(
    gathered: &[f32],
    world: usize,
    stride: usize,
    rows: usize,
    out: &mut [f32],
) -> Result<()> {
    let cols = check_join(gathered.len(), world, stride, rows, out.len())?;
    for rank in 0..world {
        let range = split_even(cols, world, rank);
        let width = range.len();
        let part = &gathered[rank * stride..rank * stride + rows * width];
        for (row, own) in out
            .chunks_exact_mut(cols)
            .zip(part.chunks_exact(width.max(1)))
        {
            row[range.clone()].copy_from_slice(&own[..width]);
        }
    }
    Ok(())
}

/// The shape rule [`join_rank_columns`] and its CUDA twin share; the row width.
pub(crate) fn check_join(
    gathered: usize,
    world: usize,
    stride: usize,
    rows: usize,
    out: usize,
) -> Result<usize> {
    if world == 0 {
        return Err(KernelError::InvalidParameter {
            what: "world",
            reason: "a join of rank columns needs at least one rank".into(),
        });
    }
    if rows == 0 {
        return match out {
            0 => Ok(0),
            _ => Err(KernelError::InvalidParameter {
                what: "rows",
                reason: format!("0 rows cannot fill {out} values"),
            }),
        };
    }
    if !out.is_multiple_of(rows) {
        return Err(KernelError::ShapeMismatch {
            what: format!("joined rows ({rows} rows)"),
            expected: out.div_ceil(rows) * rows,
            actual: out,
        });
    }
    let cols = out / rows;
    let widest = rows * split_even(cols, world, 0).len();
    if stride < widest || gathered != world * stride {
        return Err(KernelError::ShapeMismatch {
            what: format!(
                "gathered column blocks ({world} ranks × a stride of {stride}, at least {widest})"
            ),
            expected: world * stride.max(widest),
            actual: gathered,
        });
    }
    Ok(cols)
}

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
    fn split_even_covers_without_overlap() {
        for units in 0..20 {
            for world in 1..5 {
                let mut next = 0;
                for rank in 0..world {
                    let r = split_even(units, world, rank);
                    assert_eq!(r.start, next);
                    assert!(r.len() == units / world || r.len() == units / world + 1);
                    next = r.end;
                }
                assert_eq!(next, units);
            }
        }
        assert_eq!(split_even(19, 2, 0), 0..10);
        assert_eq!(split_even(19, 2, 1), 10..19);
    }

    /// Rank blocks laid out as the LM head's ranks produce them, padded to a stride.
    fn blocks(rows: usize, cols: usize, world: usize, stride: usize) -> Vec<f32> {
        let mut gathered = vec![-1.0f32; world * stride];
        for rank in 0..world {
            let range = split_even(cols, world, rank);
            for row in 0..rows {
                for (j, col) in range.clone().enumerate() {
                    gathered[rank * stride + row * range.len() + j] = (row * 1000 + col) as f32;
                }
            }
        }
        gathered
    }

    #[test]
    fn joins_uneven_padded_blocks_into_rows() {
        for (rows, cols, world) in [(1, 7, 1), (3, 7, 2), (2, 11, 3), (4, 2, 3), (5, 64, 4)] {
            let stride = rows * split_even(cols, world, 0).len() + 3;
            let mut out = vec![0.0f32; rows * cols];
            join_rank_columns(
                &blocks(rows, cols, world, stride),
                world,
                stride,
                rows,
                &mut out,
            )
            .unwrap();
            let want: Vec<f32> = (0..rows * cols)
                .map(|i| ((i / cols) * 1000 + i % cols) as f32)
                .collect();
            assert_eq!(out, want, "{rows} × {cols} over {world}");
        }
        let mut out = vec![0.0f32; 6];
        let short = join_rank_columns(&[0.0; 4], 2, 2, 2, &mut out).unwrap_err();
        assert!(short.to_string().contains("at least 4"), "{short}");
        assert!(join_rank_columns(&[0.0; 8], 2, 4, 4, &mut out[..5]).is_err());
        assert!(join_rank_columns(&[], 0, 0, 1, &mut []).is_err());
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
