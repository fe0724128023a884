//! A finite distribution over outcomes, with exact total-variation comparison.

use specdec_kernels::sampling::Prob;
use std::collections::BTreeMap;

/// Outcomes with their probabilities; adding an outcome twice merges it (sums the probabilities).
#[derive(Debug, Clone, PartialEq)]
pub struct Distribution<S: Ord, N> {
    outcomes: BTreeMap<S, N>,
}

impl<S: Ord, N: Prob> Default for Distribution<S, N> {
    fn default() -> Self {
        Self::new()
    }
}

impl<S: Ord, N: Prob> Distribution<S, N> {
    /// The empty distribution (total 0).
    pub fn new() -> Self {
        Self {
            outcomes: BTreeMap::new(),
        }
    }

    /// The point mass on `outcome`.
    pub fn point(outcome: S) -> Self {
        let mut d = Self::new();
        d.add(outcome, N::one());
        d
    }

    /// Adds `prob` to `outcome` (merging equal outcomes). Zero probabilities are not stored.
    pub fn add(&mut self, outcome: S, prob: N) {
        if prob.is_zero() {
            return;
        }
        match self.outcomes.get_mut(&outcome) {
            Some(existing) => *existing = existing.clone() + prob,
            None => {
                self.outcomes.insert(outcome, prob);
            }
        }
    }

    /// Probability of `outcome` (0 if absent).
    pub fn prob(&self, outcome: &S) -> N {
        self.outcomes.get(outcome).cloned().unwrap_or_else(N::zero)
    }

    /// Outcomes and probabilities in outcome order.
    pub fn iter(&self) -> impl Iterator<Item = (&S, &N)> {
        self.outcomes.iter()
    }

    /// Number of outcomes with positive probability.
    pub fn len(&self) -> usize {
        self.outcomes.len()
    }

    /// True when no outcome has positive probability.
    pub fn is_empty(&self) -> bool {
        self.outcomes.is_empty()
    }

    /// Sum of all probabilities (1 for a complete distribution).
    pub fn total(&self) -> N {
        self.outcomes
            .values()
            .fold(N::zero(), |acc, p| acc + p.clone())
    }

    /// Total-variation distance `½ Σ |self(s) − other(s)|` over the union of outcomes (exact
    /// for rationals).
    pub fn total_variation(&self, other: &Self) -> N {
        let mut sum = N::zero();
        for (outcome, a) in &self.outcomes {
            let b = other.prob(outcome);
            sum = sum + abs_diff(a, &b);
        }
        for (outcome, b) in &other.outcomes {
            if !self.outcomes.contains_key(outcome) {
                sum = sum + b.clone();
            }
        }
        sum / (N::one() + N::one())
    }

    /// The outcome where the two distributions differ most, with `(self(s), other(s))`; `None`
    /// if they are equal.
    pub fn worst_outcome<'a>(&'a self, other: &'a Self) -> Option<(&'a S, N, N)> {
        let mut worst: Option<(&S, N, N, N)> = None;
        for outcome in self.outcomes.keys().chain(other.outcomes.keys()) {
            let (a, b) = (self.prob(outcome), other.prob(outcome));
            let d = abs_diff(&a, &b);
            if d.is_positive() && worst.as_ref().is_none_or(|w| d > w.3) {
                worst = Some((outcome, a, b, d));
            }
        }
        worst.map(|(s, a, b, _)| (s, a, b))
    }
}

fn abs_diff<N: Prob>(a: &N, b: &N) -> N {
    if a > b {
        a.clone() - b.clone()
    } else {
        b.clone() - a.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use specdec_kernels::sampling::{ratio, BigRational};

    #[test]
    fn merging_and_total_variation_are_exact() {
        let mut a: Distribution<u32, BigRational> = Distribution::new();
        a.add(0, ratio(1, 3));
        a.add(0, ratio(1, 6));
        a.add(1, ratio(1, 2));
        a.add(2, ratio(0, 1));
        assert_eq!(a.len(), 2);
        assert_eq!(a.total(), ratio(1, 1));
        let mut b = Distribution::new();
        b.add(1, ratio(1, 4));
        b.add(2, ratio(3, 4));
        assert_eq!(a.total_variation(&b), ratio(3, 4));
        assert_eq!(a.total_variation(&a), ratio(0, 1));
        let (s, x, y) = a.worst_outcome(&b).unwrap();
        assert_eq!((*s, x, y), (2, ratio(0, 1), ratio(3, 4)));
        assert!(a.worst_outcome(&a).is_none());
    }
}
