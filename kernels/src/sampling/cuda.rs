//! CUDA launcher for sampling preparation (`prepare.cu`): [`prepare_logits`](super::prepare_logits)
//! on the GPU for a batch of rows, without sorting the vocabulary (radix select).
//!
//! Agreement with the CPU: greedy rows are identical; kept sets are identical for top-k; the
//! top-p cut uses exact fixed-point mass where the CPU sums floats in sorted order, so at most the
//! boundary token can differ, and likewise at the min-p cut (relative to `1 / sum`);
//! probabilities agree within `1e-5` relative (the softmax sum is a fixed-order tree sum on the
//! GPU, left to right on the CPU).

use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};

use super::prepare::{inverse_temperature, SamplingParams};
use crate::cuda::nvrtc::cuda_error;
use crate::cuda::{sources, Gpu};
use crate::error::{KernelError, Result};

/// Prepares `logits` (`[rows × vocab]`) into probabilities `out` (same shape) with `params`.
///
/// # Errors
/// [`KernelError::InvalidParameter`] for bad parameters (as the CPU), a `top_k` or vocabulary
/// beyond `u32`; [`KernelError::ShapeMismatch`] for sizes that do not fit;
/// [`KernelError::InvalidDistribution`] naming the first row with a NaN / infinite logit or no
/// mass left; [`KernelError::Cuda`] on CUDA errors.
pub fn prepare_logits_cuda(
    gpu: &Gpu,
    logits: &CudaSlice<f32>,
    vocab: usize,
    params: &SamplingParams,
    out: &mut CudaSlice<f32>,
) -> Result<()> {
    params.validate()?;
    if vocab == 0 || vocab > u32::MAX as usize || !logits.len().is_multiple_of(vocab) {
        return Err(KernelError::ShapeMismatch {
            what: format!("logits [rows x {vocab}]"),
            expected: logits.len().div_ceil(vocab.max(1)) * vocab,
            actual: logits.len(),
        });
    }
    if out.len() != logits.len() {
        return Err(KernelError::ShapeMismatch {
            what: "prepared probabilities".into(),
            expected: logits.len(),
            actual: out.len(),
        });
    }
    let rows = logits.len() / vocab;
    if rows == 0 {
        return Ok(());
    }
    let inv_t = if params.is_greedy() {
        0.0f32
    } else {
        inverse_temperature(params)?
    };
    let top_k = params.top_k.map_or(0, |k| k.min(vocab)) as u32;
    let top_p = params.top_p.map_or(1.0, |p| p as f32);
    let min_p = params.min_p.map_or(0.0, |m| m as f32);
    let (v, stream) = (vocab as u32, gpu.stream());
    let mut status: CudaSlice<u32> = stream
        .alloc_zeros(rows)
        .map_err(|e| cuda_error("alloc status", e))?;
    let f = gpu.function(&sources::SAMPLING_PREPARE, "sampling_prepare")?;
    let mut l = stream.launch_builder(&f);
    l.arg(logits)
        .arg(&mut *out)
        .arg(&v)
        .arg(&inv_t)
        .arg(&top_k)
        .arg(&top_p)
        .arg(&min_p)
        .arg(&mut status);
    let cfg = LaunchConfig {
        grid_dim: (rows as u32, 1, 1),
        block_dim: (1024, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: logits and out hold rows x vocab floats, status one word per row; argument order
    // matches `sampling_prepare`.
    unsafe { l.launch(cfg) }.map_err(|e| cuda_error("launch sampling_prepare", e))?;
    let status = stream
        .clone_dtoh(&status)
        .map_err(|e| cuda_error("download status", e))?;
    if let Some((row, s)) = status.iter().enumerate().find(|(_, s)| **s != 0) {
        return Err(KernelError::InvalidDistribution {
            what: format!("logits row {row}"),
            reason: if *s == 1 {
                "a NaN or infinite logit".into()
            } else {
                "no mass left after temperature/top-k/top-p/min-p".into()
            },
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cuda::testing::gpu_for_test;
    use crate::sampling::{mix64, prepare_logits};

    #[test]
    #[ignore = "needs a GPU"]
    fn prepare_matches_cpu() {
        let Some(gpu) = gpu_for_test("sampling::cuda::prepare_matches_cpu") else {
            return;
        };
        let st = gpu.stream();
        let vocab = 151_936 + 3; // odd, and past a power of two
        let rows = 6;
        let mut logits: Vec<f32> = (0..rows * vocab)
            .map(|i| ((mix64(i as u64) >> 40) as f32 / 1_048_576.0) - 8.0)
            .collect();
        logits[vocab + 17] = 40.0; // a dominant token
        logits[2 * vocab + 5] = 9.0; // ties at the top
        logits[2 * vocab + 6] = 9.0;
        let params = [
            SamplingParams::greedy(),
            SamplingParams::with_temperature(1.0),
            SamplingParams {
                temperature: 0.7,
                top_k: Some(50),
                top_p: None,
                min_p: None,
            },
            SamplingParams {
                temperature: 1.0,
                top_k: None,
                top_p: Some(0.9),
                min_p: None,
            },
            SamplingParams {
                temperature: 1.3,
                top_k: Some(1000),
                top_p: Some(0.5),
                min_p: None,
            },
            SamplingParams {
                temperature: 1.0,
                top_k: None,
                top_p: None,
                min_p: Some(0.05),
            },
            SamplingParams {
                temperature: 0.8,
                top_k: Some(200),
                top_p: Some(0.95),
                min_p: Some(0.2),
            },
        ];
        let ld = st.clone_htod(&logits).unwrap();
        for p in params {
            let mut od = st.alloc_zeros::<f32>(logits.len()).unwrap();
            prepare_logits_cuda(&gpu, &ld, vocab, &p, &mut od).unwrap();
            let got = st.clone_dtoh(&od).unwrap();
            for r in 0..rows {
                let want = prepare_logits(&logits[r * vocab..(r + 1) * vocab], &p).unwrap();
                let g = &got[r * vocab..(r + 1) * vocab];
                let support_diff = g
                    .iter()
                    .zip(&want)
                    .filter(|(a, b)| (**a > 0.0) != (**b > 0.0))
                    .count();
                // The top-p and min-p cuts may differ at their boundary token (the sums differ
                // in rounding, see the module docs).
                let allowed = usize::from(p.top_p.is_some()) + usize::from(p.min_p.is_some());
                assert!(
                    support_diff <= allowed,
                    "{p:?} row {r}: {support_diff} kept-set differences"
                );
                if support_diff == 0 {
                    for (a, b) in g.iter().zip(&want) {
                        assert!(
                            (a - b).abs() <= 1e-5 * b.abs() + 1e-12,
                            "{p:?} row {r}: {a} vs {b}"
                        );
                    }
                }
            }
        }
        let mut bad = logits[..vocab].to_vec();
        bad[3] = f32::NAN;
        let bd = st.clone_htod(&bad).unwrap();
        let mut od = st.alloc_zeros::<f32>(vocab).unwrap();
        assert!(
            prepare_logits_cuda(&gpu, &bd, vocab, &SamplingParams::default(), &mut od).is_err()
        );
    }
}
