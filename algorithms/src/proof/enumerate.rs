//! The enumerating [`Decisions`]: runs code once per random branch, with exact probabilities.
//!
//! [`enumerate`] calls a closure repeatedly with an [`Enumerator`]. Each decision the closure
//! asks for (an accept, a categorical draw) runs the **production rule** itself
//! ([`specdec_kernels::sampling::rules`]: the code `Replay` and the CUDA kernels follow) on a
//! symbolic uniform: an interval of `[0, 1)` that every comparison the rule makes may cut in
//! two, each side a branch point outcome weighted by its length. So accept(p, q) has `true` with
//! the measure of `{u : u·q < p}` = `min(1, p/q)` and categorical(w) has each `i` with the
//! measure of its slice `w_i / Σ w` — *because the production rule says so*: a different rule
//! gives a different distribution.
//! The first run takes the first outcome everywhere; each later run replays a prefix of the
//! previous choices and advances the last branch point that has an untried outcome (a depth-first
//! odometer), until every path has run once. Each path's probability is the product of its
//! choices'; paths returning equal results are merged in a [`Distribution`].
//!
//! Every decision that reads its uniform records its [`DrawKey`]; two on one path with the same
//! key make [`enumerate`] fail (in production they would read one random word). One path is
//! one round (one step) in the proofs, so this asserts that no two decisions of a step share a
//! key.
//!
//! The closure must be deterministic given its decisions (no other randomness, no
//! [`Decisions::uniform`], which cannot be enumerated and makes [`enumerate`] fail).

use super::distribution::Distribution;
use crate::error::{AlgorithmError, Result};
use specdec_kernels::sampling::{
    accept_rule, categorical_rule, Decisions, DrawKey, Mass, Prob, UniformDraw,
};
use std::collections::BTreeSet;

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
    /// Keys of the decisions that read their uniform on this path.
    keys: BTreeSet<DrawKey>,
    /// The first key two decisions of this path read.
    shared_key: Option<DrawKey>,
}

impl<N: Prob> Enumerator<N> {
    fn with_script(script: Vec<usize>) -> Self {
        Self {
            script,
            trace: Vec::new(),
            prob: N::one(),
            used_uniform: false,
            keys: BTreeSet::new(),
            shared_key: None,
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

    /// Runs a production rule on a fresh symbolic uniform for `key`, recording the key if the
    /// rule read the uniform.
    fn decide<T>(
        &mut self,
        key: DrawKey,
        rule: impl FnOnce(&mut SymbolicUniform<'_, N>) -> T,
    ) -> T {
        let mut u = SymbolicUniform {
            enumerator: self,
            low: N::zero(),
            high: N::one(),
            read: false,
        };
        let outcome = rule(&mut u);
        if u.read && !self.keys.insert(key) && self.shared_key.is_none() {
            self.shared_key = Some(key);
        }
        outcome
    }
}

/// The enumerator's uniform: the interval `[low, high)` of `[0, 1)` that the comparisons made
/// so far leave. A comparison `u · scale < bound` that cuts the interval at `t = bound / scale`
/// is a branch point with the two sides as outcomes, each weighted by its share of the
/// interval's length; one that does not cut it has one outcome.
struct SymbolicUniform<'a, N> {
    enumerator: &'a mut Enumerator<N>,
    low: N,
    high: N,
    read: bool,
}

impl<N: Prob> UniformDraw<N> for SymbolicUniform<'_, N> {
    fn scaled_below(&mut self, scale: &N, bound: &N) -> bool {
        self.read = true;
        if !scale.is_positive() {
            // u · 0 = 0 for every u.
            return bound.is_positive();
        }
        let cut = bound.clone() / scale.clone();
        if cut >= self.high {
            return true;
        }
        if cut <= self.low {
            return false;
        }
        let width = self.high.clone() - self.low.clone();
        let below = (cut.clone() - self.low.clone()) / width.clone();
        let above = (self.high.clone() - cut.clone()) / width;
        let taken = self.enumerator.choose(vec![(true, below), (false, above)]);
        if taken {
            self.high = cut;
        } else {
            self.low = cut;
        }
        taken
    }
}

/// The production rules ([`accept_rule`], [`categorical_rule`]) integrated over the uniform:
/// exact for number types whose masses are the values themselves (rationals).
impl<N: Prob<Mass = N> + Mass> Decisions<N> for Enumerator<N> {
    fn accept(&mut self, key: DrawKey, p_target: &N, q_draft: &N) -> bool {
        self.decide(key, |u| accept_rule(u, p_target, q_draft))
    }

    fn categorical(&mut self, key: DrawKey, weights: &[N]) -> Option<usize> {
        let masses: Vec<N> = weights.iter().map(Prob::mass).collect();
        self.decide(key, |u| categorical_rule(u, &masses))
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
/// `run`'s own errors; [`AlgorithmError::Enumeration`] if `run` asked for a raw uniform, if two
/// decisions of one path read the same [`DrawKey`] (in production they would read the same
/// random word, so they would not be independent), or if more than [`MAX_PATHS`] paths were
/// needed.
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
        if let Some(key) = enumerator.shared_key {
            return Err(AlgorithmError::Enumeration {
                reason: format!(
                    "two decisions of one step read the same key {key:?}: in production they \
                     would share one random word, so they would not be independent"
                ),
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
        key_at(0)
    }

    fn key_at(node: usize) -> DrawKey {
        DrawKey::new(0, 0, node, Purpose::Sample)
    }

    #[test]
    fn enumerates_nested_branches_with_exact_probabilities() {
        // Draw a in {0,1,2} with weights (1,0,3); if a == 2 accept with p/q = 1/3.
        let dist = enumerate(|e: &mut Enumerator<BigRational>| {
            let a = e
                .categorical(key(), &[ratio(1, 4), ratio(0, 1), ratio(3, 4)])
                .unwrap();
            let accepted = a == 2 && e.accept(key_at(1), &ratio(1, 6), &ratio(1, 2));
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
            let b = e
                .categorical(key_at(1), &[ratio(1, 2), ratio(1, 2)])
                .unwrap();
            let sure = e.accept(key_at(2), &ratio(1, 2), &ratio(1, 3));
            let never = e.accept(key_at(3), &ratio(1, 2), &ratio(0, 1));
            assert!(sure && !never);
            Ok(a + b)
        })
        .unwrap();
        assert_eq!(dist.prob(&1), ratio(1, 2));
        assert_eq!(dist.len(), 3);
    }

    #[test]
    fn two_decisions_with_one_key_are_refused() {
        let half = [ratio(1, 2), ratio(1, 2)];
        let shared = enumerate(|e: &mut Enumerator<BigRational>| {
            let a = e.categorical(key(), &half).unwrap();
            let b = e.accept(key(), &ratio(1, 4), &ratio(1, 2));
            Ok((a, b))
        });
        assert!(
            matches!(&shared, Err(AlgorithmError::Enumeration { reason }) if reason.contains("same key")),
            "{shared:?}"
        );
        // A decision that reads no uniform (no mass, q = 0) does not use its key.
        let fine = enumerate(|e: &mut Enumerator<BigRational>| {
            let none = e.categorical(key(), &[ratio(0, 1), ratio(0, 1)]);
            let never = e.accept(key(), &ratio(1, 2), &ratio(0, 1));
            Ok((none, never, e.categorical(key(), &half)))
        });
        assert_eq!(fine.unwrap().len(), 2);
    }

    /// The enumerator integrates the production rules: a rule that compared differently would
    /// give different probabilities. Here the measure of each categorical slice and of the
    /// accept set equals what the rule on an exact uniform picks on a fine grid of `u`.
    #[test]
    fn branch_probabilities_are_the_measure_of_the_production_rules_sets() {
        use specdec_kernels::sampling::{accept_rule, categorical_rule, ExactUniform};
        let weights = [ratio(1, 8), ratio(0, 1), ratio(3, 8), ratio(1, 2)];
        let dist = enumerate(|e: &mut Enumerator<BigRational>| Ok(e.categorical(key(), &weights)))
            .unwrap();
        let grid = 64;
        for (i, _) in weights.iter().enumerate() {
            let hits = (0..grid)
                .filter(|&g| {
                    categorical_rule(&mut ExactUniform(ratio(g, grid)), &weights) == Some(i)
                })
                .count();
            assert_eq!(dist.prob(&Some(i)), ratio(hits as i64, grid), "token {i}");
        }
        let (p, q) = (ratio(3, 16), ratio(1, 2));
        let accepted =
            enumerate(|e: &mut Enumerator<BigRational>| Ok(e.accept(key(), &p, &q))).unwrap();
        let hits = (0..grid)
            .filter(|&g| accept_rule(&mut ExactUniform(ratio(g, grid)), &p, &q))
            .count();
        assert_eq!(accepted.prob(&true), ratio(hits as i64, grid));
    }

    #[test]
    fn raw_uniforms_are_refused() {
        let result = enumerate(|e: &mut Enumerator<BigRational>| Ok(e.uniform(key()) > 0.5));
        assert!(matches!(result, Err(AlgorithmError::Enumeration { .. })));
    }
}
