//! A forward whose logits become verdicts where they live
//! ([`LanguageModel::forward_verify`](super::LanguageModel::forward_verify)).
//!
//! Speculative decoding reads a target forward's logits only to verify the drafts: prepare each
//! node's row (temperature, top-k, top-p) and run the verifier over the batch's trees. On a GPU
//! the `[tokens × vocab]` rows are the largest thing a step makes, so a model that keeps them on
//! the device verifies there ([`verify_rows`] over its [`VerifyBackend`]: one prepare and one
//! verify launch for the whole batch) and hands back only the [`Verdict`]s. Every other model
//! verifies on the host ([`verify_host`]), row by row as the engine always has.
//!
//! # Contract
//! - [`VerifyRequest::sequences`] holds one [`VerifySequence`] per forwarded step, in step
//!   order; each tree's tokens are the step's tokens ([`check_request`]).
//! - Decisions are keyed by (sequence, step, node, purpose) through [`SeededSequences`], so the
//!   verdicts do not depend on where they are computed, on batch order or on composition: the
//!   host and the batched paths agree verdict for verdict over the same prepared rows
//!   ([`VerifyBackend`]'s contract; the GPU's prepare matches the host's exactly for greedy
//!   parameters).

use std::time::Instant;

use specdec_kernels::sampling::{prepare_logits, Replay, SamplingParams, SeededSequences};
use specdec_kernels::verification::{
    verify_one, Verdict, VerifyBackend, VerifyMethod, VerifySequence,
};

use super::step::{Features, Logits, SequenceStep};
use crate::error::{ModelError, Result};

/// What a batch's verification needs besides the target's logits.
#[derive(Debug, Clone, Copy)]
pub struct VerifyRequest<'a> {
    /// The method every sequence of the batch is verified by.
    pub method: VerifyMethod,
    /// One per forwarded step, in step order: the ids that key its decisions and its draft tree
    /// (with the draft distributions).
    pub sequences: &'a [VerifySequence<'a>],
    /// How each target row becomes a distribution (temperature, top-k, top-p, min-p).
    pub sampling: &'a SamplingParams,
    /// The generator every decision is drawn from.
    pub seeds: &'a SeededSequences,
}

/// The outcome of [`LanguageModel::forward_verify`](super::LanguageModel::forward_verify).
#[derive(Debug, Clone)]
pub struct VerifiedBatch {
    /// One verdict per step, in step order.
    pub verdicts: Vec<Verdict>,
    /// Per step, the tapped features of its new tokens (`[n_new × width]`, as
    /// [`Logits::features`]); `None` when the model taps none.
    pub features: Vec<Option<Features>>,
    /// Seconds of the forward (logits ready where they live).
    pub forward_s: f64,
    /// Seconds of preparation and verification, verdicts on the host.
    pub verify_s: f64,
}

/// Checks that `request` describes `steps`: as many sequences, each tree as long as its step.
///
/// # Errors
/// [`ModelError::Shape`] naming the first mismatch.
pub fn check_request(steps: &[SequenceStep<'_>], request: &VerifyRequest<'_>) -> Result<()> {
    if steps.len() != request.sequences.len() {
        return Err(ModelError::Shape {
            what: "verify request".into(),
            reason: format!(
                "{} sequences to verify for {} forwarded steps",
                request.sequences.len(),
                steps.len()
            ),
        });
    }
    for (step, sequence) in steps.iter().zip(request.sequences) {
        if sequence.tree.tokens() != step.tokens {
            return Err(ModelError::Shape {
                what: format!("verify request of sequence {}", sequence.sequence),
                reason: format!(
                    "its tree has tokens {:?} but the step forwards {:?}",
                    sequence.tree.tokens(),
                    step.tokens
                ),
            });
        }
    }
    Ok(())
}

/// Verifies on the host: each sequence's rows of `logits` prepared one by one
/// ([`prepare_logits`]), then [`verify_one`] with `request`'s seeds. The reference every
/// model can use.
///
/// # Errors
/// [`ModelError::TargetRow`] naming the request and node of a row that is no distribution
/// (a non-finite logit, no mass left); the verifier's validation errors.
pub fn verify_host(request: &VerifyRequest<'_>, logits: &[Logits]) -> Result<Vec<Verdict>> {
    let mut decisions = Replay::new(request.seeds.clone());
    request
        .sequences
        .iter()
        .zip(logits)
        .map(|(sequence, logits)| {
            let rows = (0..sequence.tree.len())
                .map(|node| {
                    prepare_logits(logits.row(node), request.sampling).map_err(|source| {
                        ModelError::TargetRow {
                            request: sequence.sequence,
                            node,
                            source,
                        }
                    })
                })
                .collect::<Result<Vec<_>>>()?;
            Ok(verify_one(
                request.method,
                &sequence.with_rows(&rows),
                &mut decisions,
            )?)
        })
        .collect()
}

/// Verifies on `backend`, where `rows` (the batch's `[Σ n_new × vocab]` logits, step order)
/// live: one batched prepare, in place, then one batched verify; only the verdicts leave.
///
/// # Errors
/// The backend's ([`VerifyBackend::prepare`] names the batch row at fault,
/// [`VerifyBackend::verify`] the method it cannot run).
pub fn verify_rows<B: VerifyBackend + ?Sized>(
    backend: &B,
    rows: &mut B::Rows,
    vocab: usize,
    request: &VerifyRequest<'_>,
) -> Result<Vec<Verdict>> {
    backend.prepare(rows, vocab, request.sampling)?;
    Ok(backend.verify(request.method, request.sequences, rows, request.seeds)?)
}

/// The host path of [`LanguageModel::forward_verify`](super::LanguageModel::forward_verify):
/// `forward` gives the logits on the host, [`verify_host`] the verdicts.
///
/// # Errors
/// [`check_request`]'s, `forward`'s and [`verify_host`]'s.
pub fn forward_then_verify_host(
    steps: &[SequenceStep<'_>],
    request: &VerifyRequest<'_>,
    forward: impl FnOnce(&[SequenceStep<'_>]) -> Result<Vec<Logits>>,
) -> Result<VerifiedBatch> {
    check_request(steps, request)?;
    let t0 = Instant::now();
    let mut logits = forward(steps)?;
    let forward_s = t0.elapsed().as_secs_f64();
    let t0 = Instant::now();
    let verdicts = verify_host(request, &logits)?;
    let verify_s = t0.elapsed().as_secs_f64();
    Ok(VerifiedBatch {
        verdicts,
        features: logits.iter_mut().map(Logits::take_features).collect(),
        forward_s,
        verify_s,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::LanguageModel;
    use crate::toy::{ToyLanguageModel, ToyModel, ToyStyle};
    use specdec_kernels::verification::{CpuVerifier, DraftKind, DraftTree};
    use specdec_kernels::TreeTopology;

    /// A toy model and two sequences with a committed prompt each.
    fn model_with_two_sequences() -> (ToyLanguageModel, Vec<crate::SeqId>) {
        let table = ToyModel::seeded(5, 12, 2, ToyStyle::default()).expect("toy table");
        let mut model = ToyLanguageModel::new(table, 64, vec![]);
        let seqs = (0..2)
            .map(|s| {
                let seq = model.new_sequence().unwrap();
                model.prefill(seq, &[1 + s, 2, 3]).unwrap();
                seq
            })
            .collect();
        (model, seqs)
    }

    /// The host path and the batched path over the CPU backend give the same verdicts for every
    /// lossless method (seeded, T = 1), and each equals verifying the sequence alone.
    #[test]
    fn host_and_batched_verification_agree() {
        let (mut model, seqs) = model_with_two_sequences();
        let vocab = model.vocab_size();
        let q = |peak: usize| {
            let mut q = vec![0.5 / (vocab - 1) as f32; vocab];
            q[peak] = 0.5;
            q
        };
        // a chain of 2 drafts for sequence 0, a chain of 1 for sequence 1
        let chain = |tokens: Vec<u32>, q: Vec<Option<Vec<f32>>>| {
            DraftTree::new(TreeTopology::chain(tokens.len()), tokens, q, DraftKind::Iid).unwrap()
        };
        let trees = [
            chain(vec![3, 5, 7], vec![Some(q(5)), Some(q(7)), None]),
            chain(vec![3, 9], vec![Some(q(9)), None]),
        ];
        let sequences: Vec<VerifySequence<'_>> = trees
            .iter()
            .enumerate()
            .map(|(i, tree)| VerifySequence {
                sequence: 10 + i as u64,
                step: 4,
                tree,
            })
            .collect();
        let steps: Vec<SequenceStep<'_>> = seqs
            .iter()
            .zip(&trees)
            .map(|(&seq, tree)| SequenceStep::chain(seq, tree.tokens(), tree.topology()))
            .collect();
        let mut seeds = SeededSequences::new(3);
        seeds.seed_sequence(11, Some(99));
        let sampling = SamplingParams::with_temperature(1.0);
        let mut distinct = std::collections::HashSet::new();
        for method in [
            VerifyMethod::Greedy,
            VerifyMethod::ChainRejection,
            VerifyMethod::MultiRound,
            VerifyMethod::TargetOnly,
        ] {
            let request = VerifyRequest {
                method,
                sequences: &sequences,
                sampling: &sampling,
                seeds: &seeds,
            };
            let host = forward_then_verify_host(&steps, &request, |s| model.forward(s)).unwrap();
            let logits = model.forward(&steps).unwrap();
            let mut rows: Vec<f32> = logits.iter().flat_map(|l| l.as_slice().to_vec()).collect();
            let batched = verify_rows(&CpuVerifier, &mut rows, vocab, &request).unwrap();
            assert_eq!(host.verdicts, batched, "{method:?}");
            assert_eq!(host.features, vec![None, None]);
            let alone = forward_then_verify_host(
                &steps[1..],
                &VerifyRequest {
                    sequences: &sequences[1..],
                    ..request
                },
                |s| model.forward(s),
            )
            .unwrap();
            assert_eq!(alone.verdicts[0], host.verdicts[1], "{method:?} alone");
            distinct.insert(format!("{:?}", host.verdicts));
        }
        // the methods decide differently somewhere: the comparison is not between constants
        assert!(distinct.len() > 1, "{distinct:?}");
    }

    /// A request that does not describe the steps is refused before the forward, naming it;
    /// a non-finite logit names the request and node.
    #[test]
    fn mismatched_requests_and_bad_rows_are_refused_by_name() {
        let (model, seqs) = model_with_two_sequences();
        let tree = DraftTree::<f32>::root_only(3, DraftKind::Iid);
        let topology = tree.topology().clone();
        let sequences = [VerifySequence {
            sequence: 7,
            step: 0,
            tree: &tree,
        }];
        let sampling = SamplingParams::with_temperature(1.0);
        let seeds = SeededSequences::new(1);
        let request = VerifyRequest {
            method: VerifyMethod::ChainRejection,
            sequences: &sequences,
            sampling: &sampling,
            seeds: &seeds,
        };
        let other = [4u32];
        let step = [SequenceStep::chain(seqs[0], &other, &topology)];
        let err = forward_then_verify_host(&step, &request, |_| panic!("no forward")).unwrap_err();
        assert!(err.to_string().contains("sequence 7"), "{err}");
        let two = [step[0], SequenceStep::chain(seqs[1], &other, &topology)];
        let err = forward_then_verify_host(&two, &request, |_| panic!("no forward")).unwrap_err();
        assert!(err.to_string().contains("1 sequences"), "{err}");
        let mut bad = Logits::new(model.vocab_size(), vec![0.0; model.vocab_size()]).unwrap();
        let mut values = bad.clone().into_vec();
        values[2] = f32::NAN;
        bad = Logits::new(model.vocab_size(), values).unwrap();
        let err = verify_host(&request, &[bad]).unwrap_err();
        assert!(
            err.to_string()
                .contains("request 7: target logits at tree node 0"),
            "{err}"
        );
    }
}
