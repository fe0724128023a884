//! A tokenizer's ids ranked by how often they occur in some text, most frequent first: which
//! ids a draft model's limited LM head keeps ([`crate::LanguageModel::limit_logits`], the
//! frequency-ranked drafting of FR-Spec, Zhao et al. 2025). Written by `specdec rank-vocab`,
//! read by a method's `draft_vocab_ranking`.
//!
//! The file is JSON: `format` ([`FORMAT`]), `vocab_size`, `source` (what was counted, in words),
//! `tokens_counted`, and `ids`, every id of the vocabulary exactly once. A ranking only decides
//! which drafts can be proposed, never what is accepted: any ranking (even one from another
//! text) keeps speculation exact.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::{ModelError, Result};

/// The `format` field of a ranking file.
pub const FORMAT: &str = "specdec-vocab-ranking/1";

/// Every id of a vocabulary, most frequent first (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VocabRanking {
    /// [`FORMAT`].
    pub format: String,
    /// Ids in the vocabulary (the model's logit rows, padding ids included).
    pub vocab_size: usize,
    /// What was counted, in words (data, its SHA-256, how many conversations).
    pub source: String,
    /// Tokens counted.
    pub tokens_counted: u64,
    /// Every id in `0..vocab_size` once, most frequent first.
    pub ids: Vec<u32>,
}

impl VocabRanking {
    /// Ranks the ids of a `counts.len()`-id vocabulary: `first` (e.g. the end-of-generation
    /// ids, which a draft must be able to propose) in their order, then the rest by count
    /// descending, equal counts by ascending id (low ids are the early BPE merges).
    ///
    /// # Errors
    /// [`ModelError::Config`] for an id of `first` outside the vocabulary.
    pub fn from_counts(counts: &[u64], first: &[u32], source: String) -> Result<Self> {
        let vocab_size = counts.len();
        let mut placed = vec![false; vocab_size];
        let mut ids = Vec::with_capacity(vocab_size);
        for &id in first {
            let slot = placed.get_mut(id as usize).ok_or_else(|| {
                ModelError::Config(format!(
                    "vocabulary ranking: id {id} is outside the {vocab_size} ids"
                ))
            })?;
            if !*slot {
                *slot = true;
                ids.push(id);
            }
        }
        let mut rest: Vec<u32> = (0..vocab_size as u32)
            .filter(|&id| !placed[id as usize])
            .collect();
        // A stable sort keeps ascending ids among equal counts.
        rest.sort_by_key(|&id| std::cmp::Reverse(counts[id as usize]));
        ids.extend(rest);
        Ok(Self {
            format: FORMAT.to_string(),
            vocab_size,
            source,
            tokens_counted: counts.iter().sum(),
            ids,
        })
    }

    /// The `n` most frequent ids.
    ///
    /// # Errors
    /// [`ModelError::Config`] when `n` is 0 or more than the vocabulary.
    pub fn top(&self, n: usize) -> Result<&[u32]> {
        if n == 0 || n > self.ids.len() {
            return Err(ModelError::Config(format!(
                "a draft vocabulary of {n} ids from a ranking of {} ids (must be 1..={})",
                self.ids.len(),
                self.ids.len()
            )));
        }
        Ok(&self.ids[..n])
    }

    /// Reads and checks a ranking file: its format, and `ids` a permutation of
    /// `0..vocab_size`.
    ///
    /// # Errors
    /// [`ModelError::Io`] when it cannot be read; [`ModelError::Config`] naming the path and
    /// the fault otherwise.
    pub fn read(path: &Path) -> Result<Self> {
        let shown = path.display().to_string();
        let bytes = std::fs::read(path).map_err(|source| ModelError::Io {
            path: shown.clone(),
            source,
        })?;
        let bad = |reason: String| ModelError::Config(format!("{shown}: {reason}"));
        let ranking: Self = serde_json::from_slice(&bytes)
            .map_err(|e| bad(format!("not a vocabulary ranking ({e})")))?;
        if ranking.format != FORMAT {
            return Err(bad(format!(
                "format `{}`, expected `{FORMAT}`",
                ranking.format
            )));
        }
        let mut seen = vec![false; ranking.vocab_size];
        for &id in &ranking.ids {
            match seen.get_mut(id as usize) {
                Some(slot) if !*slot => *slot = true,
                Some(_) => return Err(bad(format!("id {id} is ranked twice"))),
                None => {
                    return Err(bad(format!(
                        "id {id} is outside its vocabulary of {} ids",
                        ranking.vocab_size
                    )))
                }
            }
        }
        if ranking.ids.len() != ranking.vocab_size {
            return Err(bad(format!(
                "ranks {} of its {} ids (every id must be ranked)",
                ranking.ids.len(),
                ranking.vocab_size
            )));
        }
        Ok(ranking)
    }

    /// Writes the ranking as JSON to `path` (its folder created).
    ///
    /// # Errors
    /// [`ModelError::Io`] naming the path.
    pub fn write(&self, path: &Path) -> Result<()> {
        let io = |source| ModelError::Io {
            path: path.display().to_string(),
            source,
        };
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(io)?;
        }
        let json = serde_json::to_vec(self).expect("a ranking serialises");
        std::fs::write(path, json).map_err(io)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_first_ids_then_by_count_ties_by_id() {
        let counts = [0, 5, 2, 5, 0, 9];
        let ranking = VocabRanking::from_counts(&counts, &[4, 4], "test".into()).unwrap();
        assert_eq!(ranking.ids, [4, 5, 1, 3, 2, 0]);
        assert_eq!(ranking.tokens_counted, 21);
        assert_eq!(ranking.top(2).unwrap(), [4, 5]);
        for n in [0, 7] {
            assert!(ranking
                .top(n)
                .unwrap_err()
                .to_string()
                .contains(&n.to_string()));
        }
        let err = VocabRanking::from_counts(&counts, &[6], "test".into()).unwrap_err();
        assert!(err.to_string().contains("id 6"), "{err}");
    }

    #[test]
    fn a_file_round_trips_and_bad_files_are_refused_naming_the_fault() {
        let dir = std::env::temp_dir().join(format!("specdec-ranking-{}", std::process::id()));
        let path = dir.join("r.json");
        let ranking = VocabRanking::from_counts(&[1, 3, 2], &[], "test".into()).unwrap();
        ranking.write(&path).unwrap();
        assert_eq!(VocabRanking::read(&path).unwrap(), ranking);
        for (ids, fault) in [
            (vec![1, 1, 0], "id 1 is ranked twice"),
            (vec![1, 3, 0], "id 3 is outside"),
            (vec![1, 0], "ranks 2 of its 3 ids"),
        ] {
            VocabRanking {
                ids,
                ..ranking.clone()
            }
            .write(&path)
            .unwrap();
            let err = VocabRanking::read(&path).unwrap_err().to_string();
            assert!(err.contains(fault) && err.contains("r.json"), "{err}");
        }
        std::fs::write(&path, "[1, 2]").unwrap();
        let err = VocabRanking::read(&path).unwrap_err().to_string();
        assert!(err.contains("not a vocabulary ranking"), "{err}");
        let missing = VocabRanking::read(&dir.join("none.json")).unwrap_err();
        assert!(missing.to_string().contains("none.json"), "{missing}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
