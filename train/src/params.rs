//! A head's tensors by name, trainable ones as candle [`Var`]s (updated by the optimiser and
//! checkpointed), frozen ones as plain tensors (no gradient is computed for them).

use std::collections::BTreeMap;

use candle_core::{Device, Tensor, Var};
use specdec_kernels::sampling::mix64;
use specdec_models::heads::HeadTensor;

use crate::error::{ModelContext, Result, TensorContext};

/// One tensor of a head.
#[derive(Debug, Clone)]
pub(crate) enum Param {
    /// Updated by the optimiser.
    Trainable(Var),
    /// Constant (taken from the target).
    Frozen(Tensor),
}

impl Param {
    pub(crate) fn tensor(&self) -> &Tensor {
        match self {
            Param::Trainable(v) => v.as_tensor(),
            Param::Frozen(t) => t,
        }
    }
}

/// A head's tensors in [`specdec_models::heads::HeadMeta::tensor_shapes`] order.
#[derive(Debug, Clone)]
pub(crate) struct Params {
    names: Vec<String>,
    params: Vec<Param>,
}

impl Params {
    pub(crate) fn new() -> Self {
        Self {
            names: Vec::new(),
            params: Vec::new(),
        }
    }

    /// Adds `name` holding `values` of `shape`, trainable or frozen.
    pub(crate) fn push(
        &mut self,
        name: &str,
        shape: &[usize],
        values: Vec<f32>,
        trainable: bool,
    ) -> Result<()> {
        let t = Tensor::from_vec(values, shape, &Device::Cpu).tensor_context("head tensor")?;
        let param = if trainable {
            Param::Trainable(Var::from_tensor(&t).tensor_context("head tensor")?)
        } else {
            Param::Frozen(t)
        };
        self.names.push(name.to_string());
        self.params.push(param);
        Ok(())
    }

    /// The tensor `name`. Panics when absent (the head kinds ask only for their own names).
    pub(crate) fn get(&self, name: &str) -> &Tensor {
        self.try_get(name)
            .unwrap_or_else(|| panic!("head tensor `{name}` was never added"))
    }

    /// The tensor `name`, if present.
    pub(crate) fn try_get(&self, name: &str) -> Option<&Tensor> {
        self.names
            .iter()
            .position(|n| n == name)
            .map(|i| self.params[i].tensor())
    }

    /// The trainable tensors with their names, in order.
    pub(crate) fn trainable(&self) -> Vec<(&str, &Var)> {
        self.names
            .iter()
            .zip(&self.params)
            .filter_map(|(n, p)| match p {
                Param::Trainable(v) => Some((n.as_str(), v)),
                Param::Frozen(_) => None,
            })
            .collect()
    }

    /// Number of trainable values.
    pub(crate) fn trainable_count(&self) -> usize {
        self.trainable()
            .iter()
            .map(|(_, v)| v.as_tensor().elem_count())
            .sum()
    }

    /// Every tensor as f32 values, for [`specdec_models::heads::HeadFile`].
    pub(crate) fn to_head_tensors(&self) -> Result<BTreeMap<String, HeadTensor>> {
        self.names
            .iter()
            .zip(&self.params)
            .map(|(name, p)| {
                let t = p.tensor();
                let data = t
                    .flatten_all()
                    .and_then(|f| f.to_vec1::<f32>())
                    .tensor_context("reading head tensors")?;
                let tensor = HeadTensor::new(t.dims().to_vec(), data)
                    .model_context(|| format!("head tensor `{name}`"))?;
                Ok((name.clone(), tensor))
            })
            .collect()
    }
}

/// Deterministic uniform values in `[-bound, bound)` for tensor number `tensor` of a run seeded
/// `seed` (counter-based: independent of thread count and order).
pub(crate) fn uniform_init(seed: u64, tensor: u64, n: usize, bound: f32) -> Vec<f32> {
    let stream = mix64(seed ^ mix64(tensor.wrapping_add(0x5eed)));
    (0..n as u64)
        .map(|i| {
            let u =
                (mix64(stream ^ i.wrapping_mul(0x9e37_79b9_7f4a_7c15)) >> 40) as f32 / 16_777_216.0;
            (2.0 * u - 1.0) * bound
        })
        .collect()
}
