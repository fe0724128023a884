//! What the training loop needs from a head kind ([`HeadModel`]), shared by EAGLE and Medusa.

use candle_core::Tensor;

use crate::batch::{Batch, Frozen};
use crate::error::Result;
use crate::params::Params;

/// One batch's loss.
pub(crate) struct StepLoss {
    /// The scalar to minimise.
    pub total: Tensor,
    /// Its parts, named by [`HeadModel::component_names`] (unweighted).
    pub components: Vec<f32>,
    /// Training positions the loss covers (each position counted once per unrolled step or
    /// Medusa head it is trained at).
    pub positions: u64,
}

/// The cross-entropy of draft `logits` against labels given as log-probabilities
/// `label_log_p` (both `[rows, V_d]`): the loss term (with its graph), and the KL divergence
/// `CE − H(p)` (its distance from the floor, for the record).
pub(crate) fn cross_entropy_and_kl(
    logits: &Tensor,
    label_log_p: &Tensor,
) -> candle_core::Result<(Tensor, f32)> {
    let ce = crate::nn::soft_cross_entropy(logits, &label_log_p.exp()?)?;
    let entropy = crate::nn::mean_entropy(label_log_p)?.to_scalar::<f32>()?;
    let kl = ce.to_scalar::<f32>()? - entropy;
    Ok((ce, kl))
}

/// Top-1 agreement counts at one drafting depth.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Agreement {
    /// Positions where the head's argmax equals the label's argmax.
    pub hits: u64,
    /// Positions compared.
    pub total: u64,
}

impl Agreement {
    /// Counts the rows where the argmax of `q` equals the argmax of `p` (both `[rows, V]`
    /// logits or probabilities; ties go to the lowest index), among the rows `counted` marks.
    pub(crate) fn of(q: &Tensor, p: &Tensor, counted: &[bool]) -> Result<Self> {
        let (q, p) = (crate::nn::argmax_rows(q)?, crate::nn::argmax_rows(p)?);
        let rows = || q.iter().zip(&p).zip(counted).filter(|(_, &c)| c);
        Ok(Self {
            hits: rows().filter(|((a, b), _)| a == b).count() as u64,
            total: rows().count() as u64,
        })
    }

    /// `hits / total` (0 when nothing was compared).
    pub(crate) fn rate(&self) -> f64 {
        if self.total == 0 {
            0.0
        } else {
            self.hits as f64 / self.total as f64
        }
    }
}

/// A trainable head: its tensors, its loss on a batch, its agreement with the labels.
pub(crate) trait HeadModel {
    /// The head's tensors (trainable and frozen).
    fn params(&self) -> &Params;

    /// Names of the loss parts [`HeadModel::loss`] reports, e.g. `feat@1`, `ce@1`.
    fn component_names(&self) -> Vec<String>;

    /// The loss on `batch` (with the graph for the gradient).
    fn loss(&self, frozen: &Frozen<'_>, batch: &Batch) -> Result<StepLoss>;

    /// Top-1 agreement of the head's argmax with the label's argmax at drafting depths
    /// `1..=depths`, leaving out the predictions of tokens `t_i` with `i < skip_tokens` (a
    /// prefix every sequence shares, which says nothing about drafting).
    fn agreement(
        &self,
        frozen: &Frozen<'_>,
        batch: &Batch,
        depths: usize,
        skip_tokens: usize,
    ) -> Result<Vec<Agreement>>;
}
