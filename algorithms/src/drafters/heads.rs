//! The trained heads of `specdec_models::heads` as draft models: [`EagleFeatureHead`] (a
//! [`FeatureHead`] for [`FeatureDraftModel`](crate::drafters::FeatureDraftModel)) and
//! [`MedusaDraftModel`].
//!
//! Both prepare the head's draft-vocabulary logits with the run's [`SamplingParams`]
//! (temperature, top-k, top-p, min-p over the draft vocabulary) — after the target's
//! [`Penalties`] with the row's own generated history, when the run has penalties — and place
//! the result at the target ids of the draft vocabulary, zero elsewhere.

use std::collections::HashMap;

use specdec_kernels::sampling::{prepare_logits, Penalties, SamplingParams};
use specdec_models::heads::{DraftHead, EagleHead, HeadStep, MedusaHeads};
use specdec_models::SeqId;

use crate::drafters::{DraftFeedback, DraftModel, FeatureHead, FeatureOutput};
use crate::error::{AlgorithmError, Result};

/// A draft vocabulary's rows by target id (for penalties, which count target ids).
struct DraftRows(HashMap<u32, usize>);

impl DraftRows {
    fn of(d2t: &[u32]) -> Self {
        Self(d2t.iter().enumerate().map(|(row, &id)| (id, row)).collect())
    }

    /// `logits` over the draft vocabulary, penalised for `history`, then prepared.
    fn prepare(
        &self,
        logits: &[f32],
        params: &SamplingParams,
        penalties: &Penalties,
        history: impl IntoIterator<Item = u32>,
    ) -> Result<Vec<f32>> {
        if penalties.is_off() {
            return Ok(prepare_logits(logits, params)?);
        }
        let mut row = logits.to_vec();
        penalties.apply_mapped(history, &mut row, |id| self.0.get(&id).copied());
        Ok(prepare_logits(&row, params)?)
    }
}

/// An [`EagleHead`] whose logits are prepared with the run's sampling parameters.
pub struct EagleFeatureHead {
    head: EagleHead,
    params: SamplingParams,
    penalties: Penalties,
    rows: DraftRows,
}

impl EagleFeatureHead {
    /// Wraps `head`, preparing its distributions with `params`.
    ///
    /// # Errors
    /// [`AlgorithmError::InvalidParameter`] for a head whose input feature is wider than its
    /// output (a head reading several target blocks cannot draft past depth 1 from its own
    /// output).
    pub fn new(head: EagleHead, params: SamplingParams) -> Result<Self> {
        if head.feature_dim() != head.hidden() {
            return Err(AlgorithmError::InvalidParameter {
                name: "head",
                reason: format!(
                    "the head reads features of {} values but predicts {}: drafting deeper \
                     than one token needs them equal (one feature block)",
                    head.feature_dim(),
                    head.hidden()
                ),
            });
        }
        let rows = DraftRows::of(head.d2t());
        Ok(Self {
            head,
            params,
            penalties: Penalties::default(),
            rows,
        })
    }

    /// Applies the target's `penalties` to every kept row ([`FeatureHead::penalise`]).
    pub fn with_penalties(mut self, penalties: Penalties) -> Self {
        self.penalties = penalties;
        self
    }
}

impl FeatureHead<f32> for EagleFeatureHead {
    fn feature_dim(&self) -> usize {
        self.head.feature_dim()
    }

    fn target_vocab(&self) -> usize {
        self.head.meta().target.vocab_size
    }

    fn draft_ids(&self) -> &[u32] {
        self.head.d2t()
    }

    fn new_sequence(&mut self) -> Result<SeqId> {
        Ok(self.head.new_sequence()?)
    }

    fn release(&mut self, seq: SeqId) -> Result<()> {
        Ok(self.head.release(seq)?)
    }

    fn forward(&mut self, steps: &[HeadStep<'_>]) -> Result<Vec<Vec<FeatureOutput<f32>>>> {
        let hidden = self.head.hidden();
        let vocab = self.head.draft_vocab();
        self.head
            .forward(steps)?
            .into_iter()
            .map(|out| {
                out.features
                    .chunks(hidden)
                    .zip(out.logits.chunks(vocab))
                    .map(|(feature, logits)| {
                        Ok(FeatureOutput {
                            feature: feature.to_vec(),
                            q: prepare_logits(logits, &self.params)?,
                            logits: match self.penalties.is_off() {
                                true => Vec::new(),
                                false => logits.to_vec(),
                            },
                        })
                    })
                    .collect()
            })
            .collect()
    }

    fn commit(&mut self, seq: SeqId, path: &[usize]) -> Result<()> {
        Ok(self.head.commit(seq, path)?)
    }

    fn rewind(&mut self, seq: SeqId, n: usize) -> Result<()> {
        Ok(self.head.rewind(seq, n)?)
    }

    fn penalise(
        &self,
        out: &mut FeatureOutput<f32>,
        generated: &[u32],
        path: &[u32],
    ) -> Result<()> {
        if self.penalties.is_off() {
            return Ok(());
        }
        let history = generated.iter().chain(path).copied();
        out.q = self
            .rows
            .prepare(&out.logits, &self.params, &self.penalties, history)?;
        Ok(())
    }
}

/// What [`MedusaDraftModel`] keeps for one sequence.
struct MedusaState {
    /// The context after the last verdict.
    context: Vec<u32>,
    /// Tokens of `context` that are the prompt (the penalties' history starts after them).
    prompt_len: usize,
    /// The target's feature of the last committed token (empty before any).
    last_feature: Vec<f32>,
    /// This step's logits, one row per head over the draft vocabulary (computed on first use;
    /// empty rows before any feature).
    logits: Option<Vec<Vec<f32>>>,
}

/// [`MedusaHeads`] as a [`DraftModel`]: after a context whose last committed token has the
/// target feature `f`, the distribution `d` tokens past the root (`d ≥ 1`) is head `d − 1`'s on
/// `f`, whatever the drafted tokens in between; past the last head, `q` has no mass (nothing
/// is drafted). Paired with a shape drafter it drafts Medusa's static trees.
pub struct MedusaDraftModel {
    heads: MedusaHeads,
    params: SamplingParams,
    penalties: Penalties,
    rows: DraftRows,
    sequences: HashMap<u64, MedusaState>,
}

impl MedusaDraftModel {
    /// Wraps `heads`, preparing their distributions with `params`.
    pub fn new(heads: MedusaHeads, params: SamplingParams) -> Self {
        let rows = DraftRows::of(heads.d2t());
        Self {
            heads,
            params,
            penalties: Penalties::default(),
            rows,
            sequences: HashMap::new(),
        }
    }

    /// Applies the target's `penalties` to the heads' logits, each query with its own
    /// generated history.
    pub fn with_penalties(mut self, penalties: Penalties) -> Self {
        self.penalties = penalties;
        self
    }

    /// The number of heads (the deepest draft).
    pub fn depth(&self) -> usize {
        self.heads.heads()
    }

    /// The logits of every head for `state`'s last feature (empty rows before any).
    fn logits(&self, state: &MedusaState) -> Result<Vec<Vec<f32>>> {
        if state.last_feature.is_empty() {
            return Ok(vec![Vec::new(); self.heads.heads()]);
        }
        let logits = self.heads.forward(&state.last_feature, 1)?;
        Ok(logits
            .chunks(self.heads.draft_vocab())
            .map(<[f32]>::to_vec)
            .collect())
    }
}

impl DraftModel<f32> for MedusaDraftModel {
    fn vocab(&self) -> usize {
        self.heads.meta().target.vocab_size
    }

    fn next_probs(&mut self, sequence: u64, tokens: &[u32]) -> Result<Vec<f32>> {
        let state =
            self.sequences
                .get(&sequence)
                .ok_or_else(|| AlgorithmError::InvalidParameter {
                    name: "medusa",
                    reason: format!("sequence {sequence}: no verdict heard yet"),
                })?;
        let n = state.context.len();
        if tokens.len() < n || tokens[..n] != state.context[..] {
            return Err(AlgorithmError::InvalidParameter {
                name: "medusa",
                reason: format!(
                    "sequence {sequence}: the query does not extend the context of the last verdict"
                ),
            });
        }
        if state.logits.is_none() {
            let logits = self.logits(state)?;
            self.sequences.get_mut(&sequence).expect("present").logits = Some(logits);
        }
        let state = &self.sequences[&sequence];
        let mut full = vec![0.0; self.vocab()];
        let row = state
            .logits
            .as_ref()
            .expect("set above")
            .get(tokens.len() - n);
        if let Some(row) = row.filter(|r| !r.is_empty()) {
            let history = tokens[state.prompt_len.min(tokens.len())..].iter().copied();
            let q = self
                .rows
                .prepare(row, &self.params, &self.penalties, history)?;
            for (&id, p) in self.heads.d2t().iter().zip(q) {
                full[id as usize] = p;
            }
        }
        Ok(full)
    }

    /// Keeps the feature of the last committed token.
    ///
    /// # Errors
    /// A verdict without features, or with features of another width.
    fn observe(&mut self, feedback: &DraftFeedback<'_>) -> Result<()> {
        let hidden = self.heads.hidden();
        let features = feedback
            .features
            .ok_or_else(|| AlgorithmError::InvalidParameter {
                name: "medusa",
                reason: format!(
                    "sequence {}: the verdict carries no target features",
                    feedback.sequence
                ),
            })?;
        if features.dim() != hidden {
            return Err(AlgorithmError::InvalidParameter {
                name: "medusa",
                reason: format!(
                    "the target's features have {} values per token, the heads read {hidden}",
                    features.dim()
                ),
            });
        }
        let state = self
            .sequences
            .entry(feedback.sequence)
            .or_insert_with(|| MedusaState {
                context: Vec::new(),
                prompt_len: 0,
                last_feature: Vec::new(),
                logits: None,
            });
        if features.rows() > 0 {
            state.last_feature = features.row(features.rows() - 1).to_vec();
        }
        state.context = feedback.context.to_vec();
        state.prompt_len = feedback.prompt_len;
        state.logits = None;
        Ok(())
    }

    fn release(&mut self, sequence: u64) -> Result<()> {
        self.sequences.remove(&sequence);
        Ok(())
    }

    fn wants_features(&self) -> bool {
        true
    }
}
