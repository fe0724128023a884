//! A toy feature head for the proofs ([`ToyFeatureHead`]) and the toy target features it drafts
//! from ([`toy_features`]).
//!
//! Features are small integers held exactly in `f32`. The toy target's feature at position `j`
//! stands for its hidden state there: it encodes the tokens `t_{j-1}, t_j`. The head reads pairs
//! like an EAGLE head: its output feature after the pair (`f`, `t`) encodes (the token the input
//! feature's last slot names, `t`, and the token of the pair before it in attention — the
//! previous committed pair or the node's tree parent), and its draft distribution is a toy
//! table's row after the two tokens the output names. So `q` depends on the feature it is given
//! and on the head's K/V: a head fed a stale feature, or attending to the wrong pair, drafts from
//! another row, and so does a pair at another position (as RoPE makes it).

use std::collections::HashMap;

use specdec_kernels::sampling::Prob;
use specdec_models::toy::ToyModel;
use specdec_models::{Features, SeqId};

use specdec_models::heads::HeadStep;

use crate::drafters::{FeatureHead, FeatureOutput};
use crate::error::{AlgorithmError, Result};

/// Width of a toy feature: (previous token, token).
pub const TOY_FEATURE_DIM: usize = 2;

/// The toy target's features of `tokens[..rows]`: position `j` holds `(t_{j-1}, t_j)`
/// (`t_{-1}` read as token 0).
pub fn toy_features(tokens: &[u32], rows: std::ops::Range<usize>) -> Features {
    let data = rows
        .flat_map(|j| {
            let previous = if j == 0 { 0 } else { tokens[j - 1] };
            [previous as f32, tokens[j] as f32]
        })
        .collect();
    Features::new(TOY_FEATURE_DIM, data).expect("rows of two values")
}

/// A toy EAGLE-style head over a toy table (see the module docs). `draft_ids` may be a subset
/// of the vocabulary (a reduced draft vocabulary): `q` is the table's row restricted to them and
/// renormalised.
#[derive(Debug, Clone)]
pub struct ToyFeatureHead {
    table: ToyModel,
    draft_ids: Vec<u32>,
    /// Committed pairs per sequence: the token of each.
    committed: HashMap<SeqId, Vec<u32>>,
    /// The last forward per sequence: (tokens, parents) of its nodes.
    last: HashMap<SeqId, (Vec<u32>, Vec<Option<usize>>)>,
    next_seq: u64,
    /// Whether `q` is read from the input feature (one position stale; see [`Self::stale`]).
    stale: bool,
}

impl ToyFeatureHead {
    /// A head drafting from `table`'s rows over `draft_ids` (distinct ids of its vocabulary).
    pub fn new(table: ToyModel, draft_ids: Vec<u32>) -> Self {
        Self {
            table,
            draft_ids,
            committed: HashMap::new(),
            last: HashMap::new(),
            next_seq: 0,
            stale: false,
        }
    }

    /// For negative controls: `q` is the row the *input* feature names (one position stale)
    /// while the output feature — what deeper drafts read — is the fresh one. A drafter that
    /// draws its tokens from the fresh head's `q` but records this head's is lossy.
    pub fn stale(mut self) -> Self {
        self.stale = true;
        self
    }

    /// The output for the pair (`feature`, `token`) at `position` whose attention predecessor
    /// has token `before`.
    fn output<N: Prob>(
        &self,
        feature: &[f32],
        token: u32,
        before: u32,
        position: usize,
    ) -> FeatureOutput<N> {
        let fresh = [feature[1] as u32, token];
        let read = if self.stale {
            [feature[0] as u32, feature[1] as u32]
        } else {
            fresh
        };
        // the position enters as RoPE does: a pair at another position drafts another row
        let shifted = (before as usize + position) % self.table.vocab();
        let row: Vec<N> = self
            .table
            .next_probs_as::<N>(&[shifted as u32, read[0], read[1]]);
        let kept: Vec<N> = self
            .draft_ids
            .iter()
            .map(|&i| row[i as usize].clone())
            .collect();
        let mass = kept.iter().fold(N::zero(), |a, b| a + b.clone());
        let q = if mass.is_positive() {
            kept.into_iter().map(|p| p / mass.clone()).collect()
        } else {
            kept
        };
        FeatureOutput {
            feature: vec![fresh[0] as f32, fresh[1] as f32],
            q,
            logits: Vec::new(),
        }
    }
}

impl<N: Prob> FeatureHead<N> for ToyFeatureHead {
    fn feature_dim(&self) -> usize {
        TOY_FEATURE_DIM
    }

    fn target_vocab(&self) -> usize {
        self.table.vocab()
    }

    fn draft_ids(&self) -> &[u32] {
        &self.draft_ids
    }

    fn new_sequence(&mut self) -> Result<SeqId> {
        let seq = SeqId(self.next_seq);
        self.next_seq += 1;
        self.committed.insert(seq, Vec::new());
        Ok(seq)
    }

    fn release(&mut self, seq: SeqId) -> Result<()> {
        self.last.remove(&seq);
        self.committed
            .remove(&seq)
            .map(|_| ())
            .ok_or_else(|| unknown(seq))
    }

    fn forward(&mut self, steps: &[HeadStep<'_>]) -> Result<Vec<Vec<FeatureOutput<N>>>> {
        let mut all = Vec::with_capacity(steps.len());
        for step in steps {
            let held = self
                .committed
                .get(&step.seq)
                .ok_or_else(|| unknown(step.seq))?;
            let parents = step.tree.parents().to_vec();
            let depths = step.tree.depths();
            let rows = (0..step.tokens.len())
                .map(|i| {
                    let before = match parents[i] {
                        Some(p) => step.tokens[p],
                        None => held.last().copied().unwrap_or(0),
                    };
                    let feature = &step.features[i * TOY_FEATURE_DIM..(i + 1) * TOY_FEATURE_DIM];
                    self.output(feature, step.tokens[i], before, held.len() + depths[i])
                })
                .collect();
            self.last.insert(step.seq, (step.tokens.to_vec(), parents));
            all.push(rows);
        }
        Ok(all)
    }

    fn commit(&mut self, seq: SeqId, path: &[usize]) -> Result<()> {
        let (tokens, parents) = self.last.remove(&seq).ok_or_else(|| unknown(seq))?;
        for (i, &node) in path.iter().enumerate() {
            let expected = if i == 0 { None } else { Some(path[i - 1]) };
            if node >= tokens.len() || parents[node] != expected {
                return Err(AlgorithmError::InvalidParameter {
                    name: "path",
                    reason: format!("{path:?} is not a root-to-node path"),
                });
            }
        }
        let held = self.committed.get_mut(&seq).ok_or_else(|| unknown(seq))?;
        held.extend(path.iter().map(|&n| tokens[n]));
        Ok(())
    }

    fn rewind(&mut self, seq: SeqId, n: usize) -> Result<()> {
        self.last.remove(&seq);
        let held = self.committed.get_mut(&seq).ok_or_else(|| unknown(seq))?;
        if n > held.len() {
            return Err(AlgorithmError::InvalidParameter {
                name: "n",
                reason: format!("rewinding {n} of {} pairs", held.len()),
            });
        }
        held.truncate(held.len() - n);
        Ok(())
    }
}

fn unknown(seq: SeqId) -> AlgorithmError {
    AlgorithmError::InvalidParameter {
        name: "seq",
        reason: format!("unknown head sequence {}", seq.0),
    }
}
