//! The building blocks both head kinds share, on candle tensors (f32, CPU), composed of
//! differentiable primitives: linear maps, RMSNorm, RoPE in the kernels' two layouts, softmax,
//! and the losses.

use candle_core::{Device, Result, Tensor, D};
use specdec_kernels::ops::{RopeAngles, RopeLayout};

/// `x · Wᵀ` for `x: [.., in]` and `w: [out, in]` (rows = outputs, as the head file stores
/// them): `[.., out]`.
pub(crate) fn linear(x: &Tensor, w: &Tensor) -> Result<Tensor> {
    let dims = x.dims().to_vec();
    let (rows, cols) = (
        dims[..dims.len() - 1].iter().product::<usize>(),
        dims[dims.len() - 1],
    );
    let y = x.reshape((rows, cols))?.matmul(&w.t()?)?;
    let mut out_dims = dims;
    *out_dims.last_mut().expect("at least one dimension") = w.dim(0)?;
    y.reshape(out_dims)
}

/// `linear(x, w) + b` with `b: [out]`.
pub(crate) fn linear_bias(x: &Tensor, w: &Tensor, b: Option<&Tensor>) -> Result<Tensor> {
    let y = linear(x, w)?;
    match b {
        Some(b) => y.broadcast_add(b),
        None => Ok(y),
    }
}

/// RMSNorm over the last dimension, as `specdec_kernels::ops::rms_norm`:
/// `x · (mean(x²) + eps)^(-1/2) · gain`.
pub(crate) fn rms_norm(x: &Tensor, gain: &Tensor, eps: f32) -> Result<Tensor> {
    let mean_sq = x.sqr()?.mean_keepdim(D::Minus1)?;
    let scale = (mean_sq + f64::from(eps))?.sqrt()?.recip()?;
    x.broadcast_mul(&scale)?.broadcast_mul(gain)
}

/// `silu(gate) · up` (SwiGLU's inner product), elementwise.
pub(crate) fn swiglu(gate: &Tensor, up: &Tensor) -> Result<Tensor> {
    gate.silu()? * up
}

/// Softmax over the last dimension (the maximum subtracted is a constant for the gradient,
/// which softmax's shift invariance allows).
pub(crate) fn softmax(x: &Tensor) -> Result<Tensor> {
    let max = x.max_keepdim(D::Minus1)?.detach();
    let e = x.broadcast_sub(&max)?.exp()?;
    let sum = e.sum_keepdim(D::Minus1)?;
    e.broadcast_div(&sum)
}

/// Log-softmax over the last dimension (see [`softmax`]).
pub(crate) fn log_softmax(x: &Tensor) -> Result<Tensor> {
    let max = x.max_keepdim(D::Minus1)?.detach();
    let shifted = x.broadcast_sub(&max)?;
    let log_sum = shifted.exp()?.sum_keepdim(D::Minus1)?.log()?;
    shifted.broadcast_sub(&log_sum)
}

/// Mean over rows of the cross-entropy `−Σ_v p_v · log q_v` of soft labels `p` against
/// `q = softmax(logits)`; both `[rows, V]`.
pub(crate) fn soft_cross_entropy(logits: &Tensor, p: &Tensor) -> Result<Tensor> {
    (p * log_softmax(logits)?)?
        .sum(D::Minus1)?
        .neg()?
        .mean_all()
}

/// Mean over rows of the entropy `−Σ_v p_v · log p_v` of the distributions whose
/// log-probabilities are `log_p: [rows, V]` (finite where `p` underflows to 0).
pub(crate) fn mean_entropy(log_p: &Tensor) -> Result<Tensor> {
    (log_p.exp()? * log_p)?.sum(D::Minus1)?.neg()?.mean_all()
}

/// Mean over all elements of the smooth L1 loss (β = 1, PyTorch's `SmoothL1Loss`):
/// `0.5 d²` where `|d| < 1`, else `|d| − 0.5`, with `d = x − y`.
pub(crate) fn smooth_l1(x: &Tensor, y: &Tensor) -> Result<Tensor> {
    let a = (x - y)?.abs()?;
    let c = a.clamp(0f32, 1f32)?;
    ((c.sqr()? * 0.5)? + (a - c)?)?.mean_all()
}

/// Cosine and sine tables `[len, head_dim/2]` for positions `0..len`, computed by the kernels'
/// [`RopeAngles`] (f64 angles rounded to f32 once), so they equal the target's bit for bit.
pub(crate) fn rope_tables(
    len: usize,
    head_dim: usize,
    base: f32,
    device: &Device,
) -> crate::error::Result<(Tensor, Tensor)> {
    use crate::error::{ModelContext, TensorContext};
    let positions: Vec<usize> = (0..len).collect();
    let angles = RopeAngles::new(&positions, head_dim, base)
        .model_context(|| "RoPE angles of the head".into())?;
    let half = head_dim / 2;
    let cos = Tensor::from_slice(angles.cos(), (len, half), device).tensor_context("rope")?;
    let sin = Tensor::from_slice(angles.sin(), (len, half), device).tensor_context("rope")?;
    Ok((cos, sin))
}

/// Rotates `x: [B, heads, T, d]` at positions `0..T` with tables from [`rope_tables`] (at
/// least `T` rows), pairing dimensions as `layout` says (module docs of
/// `specdec_kernels::ops::rope`): `(a, b) → (a·cos − b·sin, a·sin + b·cos)`.
pub(crate) fn apply_rope(
    x: &Tensor,
    cos: &Tensor,
    sin: &Tensor,
    layout: RopeLayout,
) -> Result<Tensor> {
    let (b, h, t, d) = x.dims4()?;
    let half = d / 2;
    let cos = cos.narrow(0, 0, t)?;
    let sin = sin.narrow(0, 0, t)?;
    match layout {
        RopeLayout::Interleaved => {
            let pairs = x.reshape((b, h, t, half, 2))?;
            let a = pairs.narrow(D::Minus1, 0, 1)?.squeeze(D::Minus1)?;
            let bb = pairs.narrow(D::Minus1, 1, 1)?.squeeze(D::Minus1)?;
            let ra = (a.broadcast_mul(&cos)? - bb.broadcast_mul(&sin)?)?;
            let rb = (a.broadcast_mul(&sin)? + bb.broadcast_mul(&cos)?)?;
            Tensor::stack(&[ra, rb], D::Minus1)?.reshape((b, h, t, d))
        }
        RopeLayout::HalfSplit => {
            let a = x.narrow(D::Minus1, 0, half)?;
            let bb = x.narrow(D::Minus1, half, half)?;
            let ra = (a.broadcast_mul(&cos)? - bb.broadcast_mul(&sin)?)?;
            let rb = (a.broadcast_mul(&sin)? + bb.broadcast_mul(&cos)?)?;
            Tensor::cat(&[ra, rb], D::Minus1)
        }
    }
}

/// Index of the largest value of each row of `x: [rows, V]` (ties: the lowest index).
pub(crate) fn argmax_rows(x: &Tensor) -> crate::error::Result<Vec<u32>> {
    use crate::error::TensorContext;
    let rows = x.to_vec2::<f32>().tensor_context("argmax")?;
    Ok(rows
        .iter()
        .map(|r| specdec_kernels::ops::argmax(r).unwrap_or(0) as u32)
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: &[f32], b: &[f32], tol: f32) {
        assert_eq!(a.len(), b.len());
        for (i, (x, y)) in a.iter().zip(b).enumerate() {
            assert!((x - y).abs() <= tol * (1.0 + y.abs()), "[{i}] {x} vs {y}");
        }
    }

    #[test]
    fn rope_and_norm_match_the_kernels() {
        let dev = Device::Cpu;
        let (heads, t, d) = (3, 5, 8);
        let values: Vec<f32> = (0..heads * t * d)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 17.0)
            .collect();
        // kernels: [tokens × heads × d]; candle: [1, heads, T, d]
        let x = Tensor::from_slice(&values, (1, t, heads, d), &dev).unwrap();
        let xt = x.transpose(1, 2).unwrap().contiguous().unwrap();
        let (cos, sin) = rope_tables(t, d, 10_000.0, &dev).unwrap();
        let angles = RopeAngles::new(&(0..t).collect::<Vec<_>>(), d, 10_000.0).unwrap();
        for layout in [RopeLayout::Interleaved, RopeLayout::HalfSplit] {
            let mut want = values.clone();
            specdec_kernels::ops::apply_rope(&mut want, heads, &angles, layout).unwrap();
            let got = apply_rope(&xt, &cos, &sin, layout)
                .unwrap()
                .transpose(1, 2)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1::<f32>()
                .unwrap();
            // the kernel rounds each product then the sum, as candle does: equal bit for bit
            assert_eq!(got, want, "{layout:?}");
        }
        let gain: Vec<f32> = (0..d).map(|i| 0.5 + i as f32 / 8.0).collect();
        let mut want = vec![0.0; values.len()];
        specdec_kernels::ops::rms_norm(&values, &gain, 1e-5, &mut want).unwrap();
        let got = rms_norm(
            &Tensor::from_slice(&values, (heads * t, d), &dev).unwrap(),
            &Tensor::from_slice(&gain, d, &dev).unwrap(),
            1e-5,
        )
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1::<f32>()
        .unwrap();
        close(&got, &want, 1e-6);
    }

    #[test]
    fn losses_are_the_textbook_ones() {
        let dev = Device::Cpu;
        let x = Tensor::new(&[[0.5f32, 3.0], [-2.0, 0.0]], &dev).unwrap();
        let y = Tensor::new(&[[0.0f32, 0.0], [0.0, 0.0]], &dev).unwrap();
        // 0.125, 2.5, 1.5, 0 → mean 1.03125
        let l = smooth_l1(&x, &y).unwrap().to_scalar::<f32>().unwrap();
        assert!((l - 1.03125).abs() < 1e-6, "{l}");
        let p = Tensor::new(&[[1.0f32, 0.0], [0.5, 0.5]], &dev).unwrap();
        let ce = soft_cross_entropy(&x, &p)
            .unwrap()
            .to_scalar::<f32>()
            .unwrap();
        let lse = |a: f64, b: f64| (a.exp() + b.exp()).ln();
        let want = ((lse(0.5, 3.0) - 0.5) + (lse(-2.0, 0.0) - 0.5 * -2.0)) / 2.0;
        assert!((f64::from(ce) - want).abs() < 1e-5, "{ce} vs {want}");
        let s = softmax(&x)
            .unwrap()
            .sum(D::Minus1)
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        close(&s, &[1.0, 1.0], 1e-6);
    }
}
