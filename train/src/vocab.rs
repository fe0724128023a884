//! The draft vocabulary: the target ids a head's distribution covers (`d2t`), most frequent
//! training labels first.

use specdec_models::VocabRanking;

use crate::error::{ModelContext, Result, TrainError};

/// The largest draft vocabulary allowed for a target of `vocab_size` ids: 16,384 for
/// vocabularies up to 65,536 ids (SmolLM2-sized: 49,152), 32,768 above (Qwen2.5: 151,936),
/// never more than the vocabulary itself.
pub fn draft_vocab_limit(vocab_size: usize) -> usize {
    let cap = if vocab_size <= 65_536 { 16_384 } else { 32_768 };
    cap.min(vocab_size)
}

/// Checks a requested draft vocabulary size against [`draft_vocab_limit`].
///
/// # Errors
/// [`TrainError::Option`] (`draft-vocab`) for 0 or more than the limit, naming the limit.
pub fn check_draft_vocab(draft_vocab: usize, vocab_size: usize) -> Result<()> {
    let limit = draft_vocab_limit(vocab_size);
    if draft_vocab == 0 || draft_vocab > limit {
        return Err(TrainError::Option {
            name: "draft-vocab",
            reason: format!(
                "{draft_vocab} is outside 1..={limit}, the limit for a target of {vocab_size} ids"
            ),
        });
    }
    Ok(())
}

/// The `draft_vocab` most frequent ids among `labels` (frequency descending, ties by ascending
/// id); when fewer distinct ids occur, the list is filled with the ids that never occur, in
/// ascending order (low ids are the early BPE merges, the frequent tokens). Ids must be below
/// `vocab_size`; the result has exactly `draft_vocab` distinct ids.
///
/// # Errors
/// As [`check_draft_vocab`]; [`TrainError::Data`] for a label id outside the vocabulary.
pub fn draft_vocabulary(
    labels: impl IntoIterator<Item = u32>,
    vocab_size: usize,
    draft_vocab: usize,
) -> Result<Vec<u32>> {
    check_draft_vocab(draft_vocab, vocab_size)?;
    let mut counts = vec![0u64; vocab_size];
    for id in labels {
        let slot = counts
            .get_mut(id as usize)
            .ok_or_else(|| TrainError::Data {
                path: "training labels".into(),
                reason: format!("token id {id} is outside the target's {vocab_size} ids"),
            })?;
        *slot += 1;
    }
    // by count descending, ascending ids among equal counts (zeros included)
    let mut ids = VocabRanking::from_counts(&counts, &[], "training labels".into())
        .model_context(|| "ranking the training labels".into())?
        .ids;
    ids.truncate(draft_vocab);
    Ok(ids)
}

/// The fraction of `labels` that fall inside `d2t` (0 for no labels).
pub fn coverage(labels: impl IntoIterator<Item = u32>, d2t: &[u32], vocab_size: usize) -> f64 {
    let mut inside = vec![false; vocab_size];
    for &id in d2t {
        if let Some(s) = inside.get_mut(id as usize) {
            *s = true;
        }
    }
    let (mut hit, mut total) = (0u64, 0u64);
    for id in labels {
        total += 1;
        hit += u64::from(inside.get(id as usize).copied().unwrap_or(false));
    }
    if total == 0 {
        0.0
    } else {
        hit as f64 / total as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ordered_by_frequency_then_id_and_filled_with_unseen_ids() {
        // counts: 7 → 3, 2 → 3, 5 → 2, 9 → 1
        let labels = [7, 2, 5, 7, 9, 2, 5, 2, 7];
        assert_eq!(draft_vocabulary(labels, 10, 3).unwrap(), [2, 7, 5]);
        assert_eq!(
            draft_vocabulary(labels, 10, 7).unwrap(),
            [2, 7, 5, 9, 0, 1, 3]
        );
        let all = draft_vocabulary(labels, 10, 10).unwrap();
        let mut sorted = all.clone();
        sorted.sort();
        assert_eq!(sorted, (0..10).collect::<Vec<u32>>());
        assert!((coverage(labels, &[2, 7], 10) - 6.0 / 9.0).abs() < 1e-12);
    }

    #[test]
    fn sizes_beyond_the_limit_and_bad_ids_are_refused() {
        assert_eq!(draft_vocab_limit(49_152), 16_384);
        assert_eq!(draft_vocab_limit(151_936), 32_768);
        assert_eq!(draft_vocab_limit(64), 64);
        let err = check_draft_vocab(16_385, 49_152).unwrap_err().to_string();
        assert!(
            err.contains("--draft-vocab") && err.contains("16384"),
            "{err}"
        );
        let err = check_draft_vocab(32_769, 151_936).unwrap_err().to_string();
        assert!(err.contains("32768"), "{err}");
        assert!(check_draft_vocab(32_768, 151_936).is_ok());
        assert!(check_draft_vocab(0, 64).is_err());
        assert!(draft_vocabulary([3, 64], 64, 4).is_err());
    }
}
