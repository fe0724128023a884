//! A toy table as a [`LanguageModel`], so the real engine loop runs on toy models.
//!
//! Logits are `ln p` in f32 (a zero probability becomes [`ZERO_PROB_LOGIT`], a finite stand-in
//! for −∞), so `softmax(logits)` gives back the table's row up to f32 rounding. The "KV cache" is
//! the list of committed tokens per sequence; a forward stores the step's tree as pending until
//! [`LanguageModel::commit`] keeps one root-to-node path of it — the same life cycle as the
//! real runner, which lets engine tests check commit/rewind bookkeeping without a real model.

use std::collections::BTreeMap;

use specdec_kernels::TreeTopology;

use super::table::ToyModel;
use crate::error::{ModelError, Result};
use crate::model::{LanguageModel, Logits, SeqId, SequenceStep};

/// The logit given to a token of probability 0 (finite, so samplers accept it; `exp` of it is 0).
pub const ZERO_PROB_LOGIT: f32 = -1.0e30;

#[derive(Debug, Clone, Default)]
struct ToySequence {
    committed: Vec<u32>,
    pending: Option<(Vec<u32>, TreeTopology)>,
}

/// A [`ToyModel`] behind the [`LanguageModel`] trait (see the module docs).
#[derive(Debug, Clone)]
pub struct ToyLanguageModel {
    table: ToyModel,
    max_context: usize,
    eos: Vec<u32>,
    sequences: BTreeMap<SeqId, ToySequence>,
    next_id: u64,
    forwarded_tokens: u64,
    forward_calls: u64,
    /// The ids whose logits are computed ([`LanguageModel::limit_logits`]); the rest are
    /// `-inf`.
    logit_ids: Option<Vec<u32>>,
}

impl ToyLanguageModel {
    /// Wraps `table`; sequences may hold up to `max_context` tokens; `eos` lists the tokens that
    /// end generation (may be empty).
    pub fn new(table: ToyModel, max_context: usize, eos: Vec<u32>) -> Self {
        Self {
            table,
            max_context,
            eos,
            sequences: BTreeMap::new(),
            next_id: 0,
            forwarded_tokens: 0,
            forward_calls: 0,
            logit_ids: None,
        }
    }

    /// The table.
    pub fn table(&self) -> &ToyModel {
        &self.table
    }

    /// Tokens forwarded over the model's life (one per tree node).
    pub fn forwarded_tokens(&self) -> u64 {
        self.forwarded_tokens
    }

    /// Calls of [`LanguageModel::forward`] so far (a batch of sequences is one call).
    pub fn forward_calls(&self) -> u64 {
        self.forward_calls
    }

    /// Committed tokens of `seq`.
    ///
    /// # Errors
    /// [`ModelError::InvalidStep`] for an unknown sequence.
    pub fn committed(&self, seq: SeqId) -> Result<&[u32]> {
        Ok(&self.sequence(seq)?.committed)
    }

    fn sequence(&self, seq: SeqId) -> Result<&ToySequence> {
        self.sequences.get(&seq).ok_or_else(|| unknown(seq))
    }

    fn sequence_mut(&mut self, seq: SeqId) -> Result<&mut ToySequence> {
        self.sequences.get_mut(&seq).ok_or_else(|| unknown(seq))
    }

    fn logits_after(&self, context: &[u32]) -> Vec<f32> {
        let mut computed = vec![self.logit_ids.is_none(); self.table.vocab()];
        for &id in self.logit_ids.iter().flatten() {
            computed[id as usize] = true;
        }
        self.table
            .next_probs_as::<f64>(context)
            .iter()
            .zip(computed)
            .map(|(&p, computed)| match (computed, p > 0.0) {
                (false, _) => f32::NEG_INFINITY,
                (true, true) => p.ln() as f32,
                (true, false) => ZERO_PROB_LOGIT,
            })
            .collect()
    }
}

fn unknown(seq: SeqId) -> ModelError {
    ModelError::InvalidStep {
        seq: seq.0,
        reason: "unknown sequence".to_string(),
    }
}

impl LanguageModel for ToyLanguageModel {
    fn vocab_size(&self) -> usize {
        self.table.vocab()
    }

    fn logit_ids(&self) -> Option<&[u32]> {
        self.logit_ids.as_deref()
    }

    fn limit_logits(&mut self, ids: &[u32]) -> Result<()> {
        let whole = crate::model::check_logit_ids(ids, self.table.vocab())?;
        self.logit_ids = (!whole).then(|| ids.to_vec());
        Ok(())
    }

    fn bos_id(&self) -> Option<u32> {
        None
    }

    fn eos_ids(&self) -> &[u32] {
        &self.eos
    }

    fn max_context(&self) -> usize {
        self.max_context
    }

    fn new_sequence(&mut self) -> Result<SeqId> {
        let id = SeqId(self.next_id);
        self.next_id += 1;
        self.sequences.insert(id, ToySequence::default());
        Ok(id)
    }

    fn fork(&mut self, seq: SeqId) -> Result<SeqId> {
        let committed = self.sequence(seq)?.committed.clone();
        let id = self.new_sequence()?;
        self.sequence_mut(id)?.committed = committed;
        Ok(id)
    }

    fn release(&mut self, seq: SeqId) -> Result<()> {
        self.sequences
            .remove(&seq)
            .map(|_| ())
            .ok_or_else(|| unknown(seq))
    }

    fn seq_len(&self, seq: SeqId) -> Result<usize> {
        Ok(self.sequence(seq)?.committed.len())
    }

    fn forward(&mut self, steps: &[SequenceStep<'_>]) -> Result<Vec<Logits>> {
        self.forward_calls += 1;
        let vocab = self.table.vocab();
        let mut out = Vec::with_capacity(steps.len());
        for step in steps {
            step.validate(vocab)?;
            let committed = &self.sequence(step.seq)?.committed;
            let total = committed.len() + step.tree.max_depth() + 1;
            if total > self.max_context {
                return Err(ModelError::InvalidStep {
                    seq: step.seq.0,
                    reason: format!("{total} tokens exceed the context of {}", self.max_context),
                });
            }
            let mut data = Vec::with_capacity(step.tokens.len() * vocab);
            for node in 0..step.tree.len() {
                let mut context = committed.clone();
                context.extend(step.tree.path_to(node).iter().map(|&n| step.tokens[n]));
                data.extend(self.logits_after(&context));
            }
            out.push(Logits::new(vocab, data)?);
        }
        for step in steps {
            self.forwarded_tokens += step.tokens.len() as u64;
            let sequence = self.sequence_mut(step.seq)?;
            sequence.pending = Some((step.tokens.to_vec(), step.tree.clone()));
        }
        Ok(out)
    }

    fn commit(&mut self, seq: SeqId, path: &[usize]) -> Result<()> {
        let sequence = self.sequence_mut(seq)?;
        if path.is_empty() {
            sequence.pending = None;
            return Ok(());
        }
        let (tokens, tree) = sequence
            .pending
            .take()
            .ok_or_else(|| ModelError::InvalidStep {
                seq: seq.0,
                reason: "commit of a path, but nothing was forwarded".to_string(),
            })?;
        for (i, &node) in path.iter().enumerate() {
            let expected_parent = i.checked_sub(1).map(|j| path[j]);
            if node >= tree.len() || tree.parent(node) != expected_parent {
                return Err(ModelError::InvalidStep {
                    seq: seq.0,
                    reason: format!("commit path {path:?} is not a root-to-node path (entry {i})"),
                });
            }
        }
        sequence.committed.extend(path.iter().map(|&n| tokens[n]));
        Ok(())
    }

    fn rewind(&mut self, seq: SeqId, n: usize) -> Result<()> {
        let sequence = self.sequence_mut(seq)?;
        if n > sequence.committed.len() {
            return Err(ModelError::InvalidStep {
                seq: seq.0,
                reason: format!(
                    "cannot rewind {n} tokens: only {} committed",
                    sequence.committed.len()
                ),
            });
        }
        let keep = sequence.committed.len() - n;
        sequence.committed.truncate(keep);
        sequence.pending = None;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::toy::ToyStyle;

    #[test]
    fn tree_logits_equal_path_logits_and_commit_keeps_the_path() {
        let table = ToyModel::seeded(3, 4, 2, ToyStyle::default()).unwrap();
        let mut lm = ToyLanguageModel::new(table, 64, vec![]);
        let seq = lm.new_sequence().unwrap();
        let tree = TreeTopology::from_parents(&[None, Some(0), Some(0), Some(2)]).unwrap();
        let tokens = [1, 2, 3, 0];
        let logits = lm
            .forward(&[SequenceStep::chain(seq, &tokens, &tree)])
            .unwrap();
        let path_logits = lm.logits_after(&[1, 3, 0]);
        assert_eq!(logits[0].row(3), &path_logits[..]);
        lm.commit(seq, &[0, 2, 3]).unwrap();
        assert_eq!(lm.committed(seq).unwrap(), &[1, 3, 0]);
        lm.rewind(seq, 2).unwrap();
        assert_eq!(lm.committed(seq).unwrap(), &[1]);
        assert!(lm.rewind(seq, 5).is_err());
        assert!(
            lm.commit(seq, &[0]).is_err(),
            "nothing pending after a rewind"
        );
    }
}
