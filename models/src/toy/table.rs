//! Toy language models: explicit conditional probability tables over a tiny vocabulary.
//!
//! A [`ToyModel`] of order `k` (0, 1 or 2 in the tests; any small `k` works) gives the next-token
//! distribution as a function of the last `k` tokens only, with exact rational entries, so the
//! exact distribution of anything generated from it can be computed. Contexts shorter than `k`
//! are padded on the left with token 0.

use crate::error::{ModelError, Result};
use num_bigint::BigInt;
use num_rational::BigRational;
use num_traits::{One, Zero};
use specdec_kernels::sampling::{CounterRng, DrawKey, Prob, Purpose};

/// An order-`order` Markov model over `vocab` tokens with exact rational rows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToyModel {
    vocab: usize,
    order: usize,
    /// `rows[context_index]`: the next-token distribution, `vocab` entries summing to 1.
    rows: Vec<Vec<BigRational>>,
}

fn invalid(reason: String) -> ModelError {
    ModelError::InvalidToyModel { reason }
}

/// How [`ToyModel::seeded`] shapes its rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ToyStyle {
    /// Chance in percent that an entry's weight is forced to zero.
    pub zero_percent: u32,
    /// Chance in percent that a row is one-hot.
    pub one_hot_percent: u32,
    /// Largest integer weight of an entry (weights are drawn from `1..=max_weight` before zeros).
    pub max_weight: u32,
}

impl ToyStyle {
    /// Rows with every entry positive (weights `1..=4`), no zeros, no one-hot rows.
    pub const DENSE: ToyStyle = ToyStyle {
        zero_percent: 0,
        one_hot_percent: 0,
        max_weight: 4,
    };
}

impl Default for ToyStyle {
    fn default() -> Self {
        Self {
            zero_percent: 20,
            one_hot_percent: 10,
            max_weight: 4,
        }
    }
}

impl ToyModel {
    /// A model from explicit rows, one per context (`vocab^order` of them, context index
    /// `Σ c_i · vocab^(order − i)` over the last `order` tokens `c_1 … c_order`, oldest first).
    ///
    /// # Errors
    /// [`ModelError::InvalidToyModel`] if `vocab` is 0, the row count or a row length is wrong,
    /// an entry is negative, or a row does not sum to exactly 1.
    pub fn new(vocab: usize, order: usize, rows: Vec<Vec<BigRational>>) -> Result<Self> {
        if vocab == 0 {
            return Err(invalid("the vocabulary is empty".into()));
        }
        let expected = vocab
            .checked_pow(order as u32)
            .ok_or_else(|| invalid(format!("vocab^order = {vocab}^{order} overflows")))?;
        if rows.len() != expected {
            return Err(invalid(format!(
                "order {order} over {vocab} tokens needs {expected} rows, got {}",
                rows.len()
            )));
        }
        for (i, row) in rows.iter().enumerate() {
            if row.len() != vocab {
                return Err(invalid(format!(
                    "row {i} has {} entries, not {vocab}",
                    row.len()
                )));
            }
            if row.iter().any(|p| *p < <BigRational as Zero>::zero()) {
                return Err(invalid(format!("row {i} has a negative entry")));
            }
            let sum: BigRational = row.iter().sum();
            if !sum.is_one() {
                return Err(invalid(format!("row {i} sums to {sum}, not 1")));
            }
        }
        Ok(Self { vocab, order, rows })
    }

    /// A model from non-negative integer weights per row (each row normalised exactly).
    ///
    /// # Errors
    /// As [`ToyModel::new`]; a row of all-zero weights is refused.
    pub fn from_weights(vocab: usize, order: usize, weights: &[Vec<u32>]) -> Result<Self> {
        let rows = weights
            .iter()
            .enumerate()
            .map(|(i, row)| {
                let total: u64 = row.iter().map(|&w| u64::from(w)).sum();
                if total == 0 {
                    return Err(invalid(format!("row {i} has no weight")));
                }
                Ok(row
                    .iter()
                    .map(|&w| BigRational::new(BigInt::from(w), BigInt::from(total)))
                    .collect())
            })
            .collect::<Result<Vec<_>>>()?;
        Self::new(vocab, order, rows)
    }

    /// A reproducible pseudo-random model: each row is one-hot (at a random token) with chance
    /// `style.one_hot_percent`, else random integer weights in `1..=style.max_weight` with each
    /// entry zeroed with chance `style.zero_percent` (a row left with no weight gets weight 1 on
    /// a random token). Same arguments, same model.
    pub fn seeded(seed: u64, vocab: usize, order: usize, style: ToyStyle) -> Result<Self> {
        if vocab == 0 {
            return Err(invalid("the vocabulary is empty".into()));
        }
        let rng = CounterRng::new(seed);
        let draw = |row: usize, entry: usize, what: u32| {
            rng.word(DrawKey {
                sequence: row as u64,
                step: u64::from(what),
                node: entry as u32,
                purpose: Purpose::Sample,
                draw: 0,
            })
        };
        let rows = vocab.checked_pow(order as u32).unwrap_or(0);
        let weights: Vec<Vec<u32>> = (0..rows)
            .map(|row| {
                let pick = (draw(row, 0, 0) % vocab as u64) as usize;
                if draw(row, 0, 1) % 100 < u64::from(style.one_hot_percent) {
                    return (0..vocab).map(|t| u32::from(t == pick)).collect();
                }
                let mut w: Vec<u32> = (0..vocab)
                    .map(|t| {
                        if draw(row, t, 2) % 100 < u64::from(style.zero_percent) {
                            0
                        } else {
                            1 + (draw(row, t, 3) % u64::from(style.max_weight.max(1))) as u32
                        }
                    })
                    .collect();
                if w.iter().all(|&x| x == 0) {
                    w[pick] = 1;
                }
                w
            })
            .collect();
        Self::from_weights(vocab, order, &weights)
    }

    /// The uniform model (every row uniform).
    pub fn uniform(vocab: usize, order: usize) -> Result<Self> {
        let rows = vocab.checked_pow(order as u32).unwrap_or(0);
        Self::from_weights(vocab, order, &vec![vec![1; vocab]; rows])
    }

    /// Vocabulary size.
    pub fn vocab(&self) -> usize {
        self.vocab
    }

    /// Markov order: how many previous tokens the next one depends on.
    pub fn order(&self) -> usize {
        self.order
    }

    /// All rows, by context index.
    pub fn rows(&self) -> &[Vec<BigRational>] {
        &self.rows
    }

    /// The row index of a context (its last `order` tokens, left-padded with 0; tokens taken
    /// modulo `vocab`).
    pub fn context_index(&self, context: &[u32]) -> usize {
        let start = context.len().saturating_sub(self.order);
        let tail = &context[start..];
        let padding = self.order - tail.len();
        std::iter::repeat_n(0u32, padding)
            .chain(tail.iter().copied())
            .fold(0usize, |acc, t| {
                acc * self.vocab + (t as usize % self.vocab)
            })
    }

    /// The exact next-token distribution after `context`.
    pub fn next_probs(&self, context: &[u32]) -> &[BigRational] {
        &self.rows[self.context_index(context)]
    }

    /// The next-token distribution after `context` in number type `N` (rounded for floats).
    pub fn next_probs_as<N: Prob>(&self, context: &[u32]) -> Vec<N> {
        self.next_probs(context)
            .iter()
            .map(N::from_rational)
            .collect()
    }
}

/// A target and a draft model over the same vocabulary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToyPair {
    /// The model whose distribution speculative decoding must preserve.
    pub target: ToyModel,
    /// The cheaper model that proposes drafts.
    pub draft: ToyModel,
}

impl ToyPair {
    /// A pair; both models must share the vocabulary.
    ///
    /// # Errors
    /// [`ModelError::InvalidToyModel`] if the vocabularies differ.
    pub fn new(target: ToyModel, draft: ToyModel) -> Result<Self> {
        if target.vocab() != draft.vocab() {
            return Err(invalid(format!(
                "target has {} tokens, draft {}",
                target.vocab(),
                draft.vocab()
            )));
        }
        Ok(Self { target, draft })
    }

    /// A reproducible pair: target from `seed`, draft from `seed + 1` (same vocab and order).
    pub fn seeded(seed: u64, vocab: usize, order: usize, style: ToyStyle) -> Result<Self> {
        Self::new(
            ToyModel::seeded(seed, vocab, order, style)?,
            ToyModel::seeded(seed.wrapping_add(1), vocab, order, style)?,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use specdec_kernels::sampling::ratio;

    #[test]
    fn order_two_rows_are_indexed_by_the_last_two_tokens() {
        let weights: Vec<Vec<u32>> = (0..4).map(|i| vec![i + 1, 1]).collect();
        let model = ToyModel::from_weights(2, 2, &weights).unwrap();
        assert_eq!(model.context_index(&[1, 1, 0]), 2);
        assert_eq!(model.next_probs(&[0, 1, 1]), &[ratio(4, 5), ratio(1, 5)]);
        // Short contexts are padded with token 0 on the left.
        assert_eq!(model.context_index(&[1]), 1);
        assert_eq!(model.context_index(&[]), 0);
        assert_eq!(model.next_probs_as::<f64>(&[1]), vec![2.0 / 3.0, 1.0 / 3.0]);
    }

    #[test]
    fn bad_tables_are_refused() {
        assert!(ToyModel::new(2, 1, vec![vec![ratio(1, 2), ratio(1, 2)]]).is_err());
        let not_one = vec![vec![ratio(1, 2), ratio(1, 3)]];
        assert!(ToyModel::new(2, 0, not_one)
            .unwrap_err()
            .to_string()
            .contains("sums to"));
        assert!(ToyModel::from_weights(2, 0, &[vec![0, 0]]).is_err());
        let a = ToyModel::uniform(2, 0).unwrap();
        let b = ToyModel::uniform(3, 0).unwrap();
        assert!(ToyPair::new(a, b).is_err());
    }

    #[test]
    fn seeded_models_reproduce_and_vary() {
        let style = ToyStyle::default();
        let a = ToyModel::seeded(1, 3, 1, style).unwrap();
        assert_eq!(a, ToyModel::seeded(1, 3, 1, style).unwrap());
        assert_ne!(a, ToyModel::seeded(2, 3, 1, style).unwrap());
        let pair = ToyPair::seeded(4, 3, 2, style).unwrap();
        assert_eq!(pair.target.rows().len(), 9);
    }
}
