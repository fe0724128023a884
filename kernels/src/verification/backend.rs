//! Batched verification behind one backend trait ([`VerifyBackend`]): the whole batch's target
//! rows where they live (a host slice on the CPU, a device buffer on a GPU) plus the trees on
//! the host in, only the verdicts out. The CPU implementation ([`CpuVerifier`]) is the reference
//! ([`verify_batch`]); the GPU's ([`crate::cuda::Gpu`], in [`super::cuda`]) is the one-launch
//! `verify.cu` kernel, equal verdict for verdict. The step before, sampling preparation (logits
//! to target probabilities, [`VerifyBackend::prepare`]), runs where the rows live too, so a
//! batch goes from the target's logits to verdicts without the rows leaving the device.
//!
//! # Why a kernels-level trait
//! DESIGN.md §2 puts every kernel family's CPU reference and CUDA twin behind one signature, so
//! callers never branch on the device. Verification is a kernels family, and its inputs are not
//! a forward's: the models crate's `DeviceBackend` is one forward's view of a device (KV cache,
//! batch rows, RoPE tables) and stays crate-private, while verification needs only the rows and
//! the trees. A runner that keeps its logits on the GPU hands that buffer (the forward backend's
//! `CudaSlice<f32>`, the same type as [`VerifyBackend::Rows`] for the GPU) straight to the
//! verifier, and nothing but the verdicts crosses back to the host.
//!
//! # Contract
//! - `target_probs`: `[Σ tree.len() × vocab]` f32 row-major, the batch's sequences in order and
//!   each sequence's nodes in tree order: row `node` of a sequence is the target distribution
//!   after the path to `node` (prepared: after temperature / top-k / top-p). `vocab` is the
//!   rows' length over the batch's node count.
//! - Decisions: each sequence draws from [`SeededSequences`]: a sequence seeded on its own draws
//!   what sequence 0 of a run with its seed draws, every other sequence the run seed's words under
//!   its own id ([`SeededSequences::key_of`]). Verdicts therefore do not depend on the batch's
//!   order or composition.
//! - Output: one [`Verdict`] per sequence, in batch order.

use super::draft_tree::DraftTree;
use super::input::{Verdict, VerifyInput};
use super::{verify_batch, VerifyMethod};
use crate::error::{KernelError, Result};
use crate::sampling::{prepare_logits, Replay, SamplingParams, SeededSequences};

/// One sequence of a batch to verify: the identifiers that key its decisions and its draft tree
/// (its target rows are the batch's, see the [module docs](self)).
#[derive(Debug, Clone, Copy)]
pub struct VerifySequence<'a> {
    /// Stable sequence (request) id.
    pub sequence: u64,
    /// The sequence's decoding step.
    pub step: u64,
    /// The draft tree (node 0 the root).
    pub tree: &'a DraftTree<f32>,
}

impl<'a> VerifySequence<'a> {
    /// The sequence of a host [`VerifyInput`] (its rows left out).
    pub fn of(input: &VerifyInput<'a, f32>) -> Self {
        Self {
            sequence: input.sequence,
            step: input.step,
            tree: input.tree,
        }
    }

    /// The host [`VerifyInput`] of this sequence over its target rows `rows` (one per node).
    pub fn with_rows<'r>(&self, rows: &'r [Vec<f32>]) -> VerifyInput<'r, f32>
    where
        'a: 'r,
    {
        VerifyInput {
            sequence: self.sequence,
            step: self.step,
            tree: self.tree,
            target_probs: rows,
        }
    }
}

/// The sampling-preparation and batched-verification kernel families on one device (see the
/// [module docs](self)).
pub trait VerifyBackend {
    /// Where the batch's target rows live: `[f32]` on the host, a device buffer on a GPU.
    type Rows: ?Sized;

    /// Turns `rows` (`[n × vocab]` logits, row-major) into target probabilities in place with
    /// `params` (temperature, top-k, top-p, min-p), as [`prepare_logits`] does row by row. The
    /// GPU agrees with the CPU within `sampling::cuda`'s stated bounds (greedy rows and top-k
    /// kept sets identical; a top-p / min-p cut may differ at its boundary token; probabilities
    /// within 1e-5 relative), so verdicts over GPU-prepared rows equal the CPU's exactly for
    /// greedy parameters only.
    ///
    /// # Errors
    /// [`KernelError::ShapeMismatch`] when `rows` is not a whole number of rows of `vocab >= 1`;
    /// invalid `params`; [`KernelError::InvalidDistribution`] naming the first row with a
    /// non-finite logit or no mass left (the rows are then unchanged); on a GPU also
    /// [`KernelError::Cuda`].
    fn prepare(&self, rows: &mut Self::Rows, vocab: usize, params: &SamplingParams) -> Result<()>;

    /// Verifies every sequence of `batch` by `method` over `target_probs`, decisions drawn from
    /// `seeds`; one verdict per sequence, in batch order (an empty batch gives none).
    ///
    /// # Errors
    /// [`KernelError::ShapeMismatch`] for rows that are not a whole number of rows per node;
    /// the validation errors of [`verify_batch`] (trees that do not fit the vocabulary, bad
    /// rows, a branching tree under chain rejection); on a GPU also
    /// [`KernelError::InvalidParameter`] for typical acceptance and [`KernelError::Cuda`].
    fn verify(
        &self,
        method: VerifyMethod,
        batch: &[VerifySequence<'_>],
        target_probs: &Self::Rows,
        seeds: &SeededSequences,
    ) -> Result<Vec<Verdict>>;
}

/// The CPU reference of [`VerifyBackend`]: [`verify_batch`] over host rows (copied into one row
/// vector per node, the reference's input form), every method included.
#[derive(Debug, Clone, Copy, Default)]
pub struct CpuVerifier;

impl VerifyBackend for CpuVerifier {
    type Rows = [f32];

    fn prepare(&self, rows: &mut [f32], vocab: usize, params: &SamplingParams) -> Result<()> {
        check_rows(rows.len(), vocab)?;
        let prepared = rows
            .chunks_exact(vocab)
            .enumerate()
            .map(|(row, logits)| {
                prepare_logits(logits, params).map_err(|e| match e {
                    KernelError::InvalidDistribution { reason, .. } => {
                        KernelError::InvalidDistribution {
                            what: format!("logits row {row}"),
                            reason,
                        }
                    }
                    other => other,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        for (row, probs) in rows.chunks_exact_mut(vocab).zip(prepared) {
            row.copy_from_slice(&probs);
        }
        Ok(())
    }

    fn verify(
        &self,
        method: VerifyMethod,
        batch: &[VerifySequence<'_>],
        target_probs: &[f32],
        seeds: &SeededSequences,
    ) -> Result<Vec<Verdict>> {
        if batch.is_empty() {
            return Ok(Vec::new());
        }
        let vocab = batch_vocab(batch, target_probs.len())?;
        let mut rows = target_probs.chunks_exact(vocab);
        let owned: Vec<Vec<Vec<f32>>> = batch
            .iter()
            .map(|s| {
                rows.by_ref()
                    .take(s.tree.len())
                    .map(<[f32]>::to_vec)
                    .collect()
            })
            .collect();
        let inputs: Vec<VerifyInput<'_, f32>> = batch
            .iter()
            .zip(&owned)
            .map(|(s, rows)| s.with_rows(rows))
            .collect();
        verify_batch(method, &inputs, &mut Replay::new(seeds.clone()))
    }
}

/// Checks that `len` elements are a whole number of rows of `vocab >= 1`.
///
/// # Errors
/// [`KernelError::ShapeMismatch`] otherwise.
pub(crate) fn check_rows(len: usize, vocab: usize) -> Result<()> {
    if vocab == 0 || !len.is_multiple_of(vocab) {
        return Err(KernelError::ShapeMismatch {
            what: format!("rows [n x {vocab}]"),
            expected: len.div_ceil(vocab.max(1)) * vocab.max(1),
            actual: len,
        });
    }
    Ok(())
}

/// The vocabulary of a batch's rows: `rows_len` over the batch's node count.
///
/// # Errors
/// [`KernelError::ShapeMismatch`] when the rows are not a whole, non-zero number of entries per
/// node.
pub(crate) fn batch_vocab(batch: &[VerifySequence<'_>], rows_len: usize) -> Result<usize> {
    let nodes: usize = batch.iter().map(|s| s.tree.len()).sum();
    if nodes == 0 || rows_len == 0 || !rows_len.is_multiple_of(nodes) {
        return Err(KernelError::ShapeMismatch {
            what: format!("target rows [{nodes} nodes x vocab]"),
            expected: rows_len.div_ceil(nodes.max(1)).max(1) * nodes,
            actual: rows_len,
        });
    }
    Ok(rows_len / nodes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampling::{mix64, Production};
    use crate::verification::test_inputs::{batch_of, mixed_seeds, random_batch, GPU_METHODS};
    use crate::verification::{verify_one, DraftKind};

    #[test]
    fn the_cpu_entry_point_gives_the_references_verdicts_and_own_seeds_decide_alone() {
        let vocab = 37;
        let mut seeded_differs = 0;
        let typical = VerifyMethod::Typical {
            epsilon: 0.3,
            delta: 0.09,
        };
        let methods = GPU_METHODS
            .into_iter()
            .chain([(typical, DraftKind::Iid, false)]);
        for (method, kind, chain) in methods {
            let (trees, rows) = random_batch(kind, chain, vocab);
            let (batch, flat) = batch_of(&trees, &rows);
            let inputs: Vec<VerifyInput<'_, f32>> = batch
                .iter()
                .zip(&rows)
                .map(|(s, p)| s.with_rows(p))
                .collect();
            let seeds = mixed_seeds(batch.len());
            let got = CpuVerifier.verify(method, &batch, &flat, &seeds).unwrap();
            let reference = verify_batch(method, &inputs, &mut Replay::new(seeds.clone())).unwrap();
            assert_eq!(got, reference, "{method:?}");
            for (i, (input, verdict)) in inputs.iter().zip(&got).enumerate() {
                let run = verify_one(method, input, &mut Production::production(42)).unwrap();
                match i % 3 {
                    0 => {
                        // what sequence 0 of a run seeded with its own seed decides
                        let alone = VerifyInput {
                            sequence: 0,
                            ..*input
                        };
                        let mut own = Production::production(1000 + i as u64);
                        let want = verify_one(method, &alone, &mut own).unwrap();
                        assert_eq!(verdict, &want, "{method:?} seeded sequence {i}");
                        seeded_differs += usize::from(verdict != &run);
                    }
                    _ => assert_eq!(verdict, &run, "{method:?} unseeded sequence {i}"),
                }
            }
        }
        // negative control: own seeds do change decisions, so the checks above can fail
        assert!(
            seeded_differs > 0,
            "no seeded sequence decided unlike the run"
        );
    }

    #[test]
    fn cpu_preparation_is_prepare_logits_row_by_row_and_feeds_verification() {
        let vocab = 29;
        let (trees, rows) = random_batch(DraftKind::Iid, true, vocab);
        let (batch, _) = batch_of(&trees, &rows);
        let nodes: usize = trees.iter().map(|t| t.len()).sum();
        let logits: Vec<f32> = (0..nodes * vocab)
            .map(|i| (mix64(i as u64) >> 44) as f32 / 4096.0 - 2.0)
            .collect();
        let params = SamplingParams {
            temperature: 0.8,
            top_k: Some(20),
            top_p: Some(0.9),
            min_p: None,
        };
        let mut prepared = logits.clone();
        CpuVerifier.prepare(&mut prepared, vocab, &params).unwrap();
        let per_row: Vec<Vec<f32>> = logits
            .chunks(vocab)
            .map(|row| prepare_logits(row, &params).unwrap())
            .collect();
        assert_eq!(prepared, per_row.concat());
        assert_ne!(prepared, logits);
        let seeds = mixed_seeds(batch.len());
        let method = VerifyMethod::ChainRejection;
        let verdicts = CpuVerifier
            .verify(method, &batch, &prepared, &seeds)
            .unwrap();
        let mut rows = per_row.into_iter();
        let owned: Vec<Vec<Vec<f32>>> = trees
            .iter()
            .map(|t| rows.by_ref().take(t.len()).collect())
            .collect();
        let inputs: Vec<_> = batch
            .iter()
            .zip(&owned)
            .map(|(s, r)| s.with_rows(r))
            .collect();
        let reference = verify_batch(method, &inputs, &mut Replay::new(seeds)).unwrap();
        assert_eq!(verdicts, reference);
        // a bad row is named and nothing is changed; rows must be whole
        let mut bad = logits.clone();
        bad[2 * vocab + 1] = f32::INFINITY;
        let err = CpuVerifier.prepare(&mut bad, vocab, &params).unwrap_err();
        assert!(err.to_string().contains("logits row 2"), "{err}");
        assert_eq!(bad[..vocab], logits[..vocab]);
        assert!(CpuVerifier.prepare(&mut bad[1..], vocab, &params).is_err());
        assert!(CpuVerifier.prepare(&mut bad, 0, &params).is_err());
    }

    #[test]
    fn the_cpu_entry_point_refuses_rows_that_do_not_fit_the_batch() {
        let (trees, rows) = random_batch(DraftKind::Iid, true, 11);
        let (batch, flat) = batch_of(&trees, &rows);
        let seeds = SeededSequences::new(1);
        let method = VerifyMethod::ChainRejection;
        assert!(matches!(
            CpuVerifier.verify(method, &batch, &flat[1..], &seeds),
            Err(KernelError::ShapeMismatch { .. })
        ));
        assert!(CpuVerifier.verify(method, &batch, &[], &seeds).is_err());
        assert_eq!(CpuVerifier.verify(method, &[], &flat, &seeds).unwrap(), []);
        let mut bad = flat.clone();
        bad[3] = f32::NAN;
        assert!(matches!(
            CpuVerifier.verify(method, &batch, &bad, &seeds),
            Err(KernelError::InvalidDistribution { .. })
        ));
    }
}
