//! The enumerating [`Decisions`]: runs code once per random branch, with exact probabilities.
//!
//! [`enumerate`] calls a closure repeatedly with an [`Enumerator`]. Each decision the closure
//! asks for (an accept, a categorical draw) is a branch point with finitely many outcomes of
//! positive probability: accept(p, q) has `true` with `min(1, p/q)` and `false` with the rest
//! (`q = 0`: `false` only); categorical(w) has each `i` with `w_i / Σ w` (`None` when `Σ w = 0`).
//! The first run takes the first outcome everywhere; each later run replays a prefix of the
//! previous choices and advances the last branch point that has an untried outcome (a depth-first
//! odometer), until every path has run once. Each path's probability is the product of its
//! choices'; paths returning equal results are merged in a [`Distribution`].
//!
//! The closure must be deterministic given its decisions (no other randomness, no
//! [`Decisions::uniform`], which cannot be enumerated and makes [`enumerate`] fail).

use super::distribution::Distribution;
use crate::error::{AlgorithmError, Result};
use specdec_kernels::sampling::{Decisions, DrawKey, Prob};

/// Largest number of paths [`enumerate`] explores before giving up with an error.
pub const MAX_PATHS: usize = 2_000_000;

/// The decisions of one enumerated path (see the module docs).
#[derive(Debug)]
pub struct Enumerator<N> {
    script: Vec<usize>,
    /// `(chosen option, number of options)` at each branch point of this run.
    trace: Vec<(usize, usize)>,
    prob: N,
    used_uniform: bool,
}

impl<N: Prob> Enumerator<N> {
    fn with_script(script: Vec<usize>) -> Self {
        Self {
            script,
            trace: Vec::new(),
            prob: N::one(),
            used_uniform: false,
        }
    }

    /// Probability of the path taken so far.
    pub fn path_probability(&self) -> &N {
        &self.prob
    }

    fn choose<T>(&mut self, mut options: Vec<(T, N)>) -> T {
        if options.len() == 1 {
            return options.pop().expect("one option").0;
        }
        let position = self.trace.len();
        let index = self.script.get(position).copied().unwrap_or(0);
        self.trace.push((index, options.len()));
        let (value, prob) = options.swap_remove(index);
        self.prob = self.prob.clone() * prob;
        value
    }
}

impl<N: Prob> Decisions<N> for Enumerator<N> {
    fn accept(&mut self, _key: DrawKey, p_target: &N, q_draft: &N) -> bool {
        if !q_draft.is_positive() || !p_target.is_positive() {
            return false;
        }
        if p_target >= q_draft {
            return true;
        }
        let a = p_target.clone() / q_draft.clone();
        let rest = N::one() - a.clone();
        self.choose(vec![(true, a), (false, rest)])
    }

    fn categorical(&mut self, _key: DrawKey, weights: &[N]) -> Option<usize> {
        let total = N::total(weights);
        if !total.is_positive() {
            return None;
        }
        let options: Vec<(usize, N)> = weights
            .iter()
            .enumerate()
            .filter(|(_, w)| w.is_positive())
            .map(|(i, w)| (i, w.clone() / total.clone()))
            .collect();
        Some(self.choose(options))
    }

    fn uniform(&mut self, _key: DrawKey) -> f64 {
        self.used_uniform = true;
        0.0
    }
}

/// Runs `run` once per random branch and returns the exact distribution of its results (see the
/// module docs).
///
/// # Errors
/// `run`'s own errors; [`AlgorithmError::Enumeration`] if `run` asked for a raw uniform or more
/// than [`MAX_PATHS`] paths were needed.
pub fn enumerate<N, S, F>(mut run: F) -> Result<Distribution<S, N>>
where
    N: Prob,
    S: Ord,
    F: FnMut(&mut Enumerator<N>) -> Result<S>,
{
    let mut distribution = Distribution::new();
    let mut script = Vec::new();
    for _ in 0..MAX_PATHS {
        let mut enumerator = Enumerator::with_script(script);
        let outcome = run(&mut enumerator)?;
        if enumerator.used_uniform {
            return Err(AlgorithmError::Enumeration {
                reason: "the code asked for a raw uniform, which cannot be enumerated; \
                         use accept() or categorical()"
                    .into(),
            });
        }
        distribution.add(outcome, enumerator.prob);
        let trace = enumerator.trace;
        match trace
            .iter()
            .rposition(|&(chosen, count)| chosen + 1 < count)
        {
            Some(last) => {
                script = trace[..last].iter().map(|&(chosen, _)| chosen).collect();
                script.push(trace[last].0 + 1);
            }
            None => return Ok(distribution),
        }
    }
    Err(AlgorithmError::Enumeration {
        reason: format!("more than {MAX_PATHS} paths; use a smaller case"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use specdec_kernels::sampling::{ratio, BigRational, Purpose};

    fn key() -> DrawKey {
        DrawKey::new(0, 0, 0, Purpose::Sample)
    }

    #[test]
    fn enumerates_nested_branches_with_exact_probabilities() {
        // Draw a in {0,1,2} with weights (1,0,3); if a == 2 accept with p/q = 1/3.
        let dist = enumerate(|e: &mut Enumerator<BigRational>| {
            let a = e
                .categorical(key(), &[ratio(1, 4), ratio(0, 1), ratio(3, 4)])
                .unwrap();
            let accepted = a == 2 && e.accept(key(), &ratio(1, 6), &ratio(1, 2));
            Ok((a, accepted))
        })
        .unwrap();
        assert_eq!(dist.len(), 3);
        assert_eq!(dist.prob(&(0, false)), ratio(1, 4));
        assert_eq!(dist.prob(&(2, true)), ratio(1, 4));
        assert_eq!(dist.prob(&(2, false)), ratio(1, 2));
        assert_eq!(dist.total(), ratio(1, 1));
    }

    #[test]
    fn merges_equal_outcomes_and_skips_certain_decisions() {
        let dist = enumerate(|e: &mut Enumerator<BigRational>| {
            let a = e.categorical(key(), &[ratio(1, 2), ratio(1, 2)]).unwrap();
            let b = e.categorical(key(), &[ratio(1, 2), ratio(1, 2)]).unwrap();
            let sure = e.accept(key(), &ratio(1, 2), &ratio(1, 3));
            let never = e.accept(key(), &ratio(1, 2), &ratio(0, 1));
            assert!(sure && !never);
            Ok(a + b)
        })
        .unwrap();
        assert_eq!(dist.prob(&1), ratio(1, 2));
        assert_eq!(dist.len(), 3);
    }

    #[test]
    fn raw_uniforms_are_refused() {
        let result = enumerate(|e: &mut Enumerator<BigRational>| Ok(e.uniform(key()) > 0.5));
        assert!(matches!(result, Err(AlgorithmError::Enumeration { .. })));
    }
}
