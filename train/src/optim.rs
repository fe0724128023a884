//! AdamW (decoupled weight decay) with global gradient-norm clipping, and the learning-rate
//! schedule: linear warm-up, then cosine decay to zero.

use candle_core::backprop::GradStore;
use candle_core::{Tensor, Var};
use serde::{Deserialize, Serialize};

use crate::error::{Result, TensorContext};

/// Optimiser settings.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct AdamWConfig {
    /// Peak learning rate.
    pub lr: f64,
    /// First-moment decay β₁.
    pub beta1: f64,
    /// Second-moment decay β₂.
    pub beta2: f64,
    /// Denominator term ε.
    pub eps: f64,
    /// Decoupled weight decay, applied to matrices only (not to norm gains or biases).
    pub weight_decay: f64,
    /// Largest global gradient L2 norm; larger gradients are scaled down to it.
    pub grad_clip: f64,
    /// Steps of linear warm-up from `lr / warmup` to `lr`.
    pub warmup_steps: u64,
    /// Steps of the whole schedule (warm-up included).
    pub total_steps: u64,
}

impl AdamWConfig {
    /// The learning rate of step `step` (0-based): `lr · (step + 1) / warmup` during warm-up,
    /// then `lr · ½(1 + cos(π · (step − warmup) / (total − warmup)))`.
    pub fn lr_at(&self, step: u64) -> f64 {
        if step < self.warmup_steps {
            return self.lr * (step + 1) as f64 / self.warmup_steps as f64;
        }
        let decay = self.total_steps.saturating_sub(self.warmup_steps).max(1);
        let progress = ((step - self.warmup_steps) as f64 / decay as f64).min(1.0);
        self.lr * 0.5 * (1.0 + (std::f64::consts::PI * progress).cos())
    }
}

/// AdamW state over a fixed list of variables.
pub(crate) struct AdamW {
    config: AdamWConfig,
    vars: Vec<Var>,
    /// First moments, one per variable.
    pub(crate) m: Vec<Tensor>,
    /// Second moments, one per variable.
    pub(crate) v: Vec<Tensor>,
    /// Updates applied so far (the bias correction's `t`).
    pub(crate) step: u64,
}

impl AdamW {
    /// Fresh state (zero moments, step 0) for `vars`.
    pub(crate) fn new(config: AdamWConfig, vars: Vec<Var>) -> Result<Self> {
        let zeros = |v: &Var| v.as_tensor().zeros_like();
        let m = vars
            .iter()
            .map(zeros)
            .collect::<candle_core::Result<Vec<_>>>()
            .tensor_context("optimiser state")?;
        let v = m.clone();
        Ok(Self {
            config,
            vars,
            m,
            v,
            step: 0,
        })
    }

    /// One update from `grads` at the schedule's learning rate for the current step; returns
    /// the global gradient norm before clipping. A variable without a gradient is left alone.
    pub(crate) fn step(&mut self, grads: &GradStore) -> Result<f64> {
        let c = self.config;
        let run = || -> candle_core::Result<f64> {
            let mut sum_sq = 0f64;
            for var in &self.vars {
                if let Some(g) = grads.get(var.as_tensor()) {
                    sum_sq += f64::from(g.sqr()?.sum_all()?.to_scalar::<f32>()?);
                }
            }
            Ok(sum_sq.sqrt())
        };
        let norm = run().tensor_context("gradient norm")?;
        let clip = if norm > c.grad_clip {
            c.grad_clip / (norm + 1e-6)
        } else {
            1.0
        };
        let lr = c.lr_at(self.step);
        let t = (self.step + 1) as i32;
        let (bc1, bc2) = (1.0 - c.beta1.powi(t), 1.0 - c.beta2.powi(t));
        let mut update = || -> candle_core::Result<()> {
            for (i, var) in self.vars.iter().enumerate() {
                let Some(g) = grads.get(var.as_tensor()) else {
                    continue;
                };
                let g = (g * clip)?;
                let m = ((&self.m[i] * c.beta1)? + (&g * (1.0 - c.beta1))?)?;
                let v = ((&self.v[i] * c.beta2)? + (g.sqr()? * (1.0 - c.beta2))?)?;
                let direction = ((&m / bc1)? / ((&v / bc2)?.sqrt()? + c.eps)?)?;
                let theta = var.as_tensor();
                let decayed = if theta.rank() >= 2 && c.weight_decay > 0.0 {
                    (theta * (1.0 - lr * c.weight_decay))?
                } else {
                    theta.clone()
                };
                var.set(&(decayed - (direction * lr)?)?)?;
                self.m[i] = m;
                self.v[i] = v;
            }
            Ok(())
        };
        update().tensor_context("optimiser update")?;
        self.step += 1;
        Ok(norm)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    fn config() -> AdamWConfig {
        AdamWConfig {
            lr: 0.1,
            beta1: 0.9,
            beta2: 0.95,
            eps: 1e-8,
            weight_decay: 0.0,
            grad_clip: 1e9,
            warmup_steps: 4,
            total_steps: 14,
        }
    }

    #[test]
    fn schedule_warms_up_linearly_then_decays_by_cosine_to_zero() {
        let c = config();
        let lrs: Vec<f64> = (0..16).map(|s| c.lr_at(s)).collect();
        assert!((lrs[0] - 0.025).abs() < 1e-12 && (lrs[3] - 0.1).abs() < 1e-12);
        assert!((lrs[4] - 0.1).abs() < 1e-12, "cosine starts at the peak");
        assert!((lrs[9] - 0.05).abs() < 1e-12, "halfway down at the middle");
        assert!(lrs[14].abs() < 1e-12 && lrs[15].abs() < 1e-12);
        assert!(lrs[4..15].windows(2).all(|w| w[1] < w[0]));
    }

    #[test]
    fn one_step_is_the_adamw_formula_and_clipping_scales_the_gradient() {
        // f(x) = Σ 3x: gradient 3 everywhere. First AdamW step: m̂ = g, v̂ = g², so every
        // coordinate moves by lr · g/(|g| + ε) ≈ lr, whatever the clip factor.
        let x = Var::new(&[1f32, -2.0], &Device::Cpu).unwrap();
        let mut opt = AdamW::new(config(), vec![x.clone()]).unwrap();
        let loss = (x.as_tensor() * 3.0).unwrap().sum_all().unwrap();
        let grads = loss.backward().unwrap();
        let norm = opt.step(&grads).unwrap();
        assert!((norm - 18f64.sqrt()).abs() < 1e-5);
        let got = x.as_tensor().to_vec1::<f32>().unwrap();
        let lr = config().lr_at(0) as f32;
        assert!((got[0] - (1.0 - lr)).abs() < 1e-6 && (got[1] - (-2.0 - lr)).abs() < 1e-6);
        // With clipping to 0.3 the second moment sees the clipped gradient (0.3/√18 · 3).
        let c = AdamWConfig {
            grad_clip: 0.3,
            ..config()
        };
        let y = Var::new(&[0f32, 0.0], &Device::Cpu).unwrap();
        let mut opt = AdamW::new(c, vec![y.clone()]).unwrap();
        let grads = (y.as_tensor() * 3.0)
            .unwrap()
            .sum_all()
            .unwrap()
            .backward()
            .unwrap();
        opt.step(&grads).unwrap();
        let g = 3.0 * 0.3 / 18f32.sqrt();
        let v = opt.v[0].to_vec1::<f32>().unwrap();
        assert!((v[0] - 0.05 * g * g).abs() < 1e-7, "{v:?}");
    }
}
