//! The production decision rules, generic over how the uniform is represented.
//!
//! Both rules of [`crate::sampling::Replay`] (and of the CUDA kernels) are written once, here,
//! against a [`UniformDraw`]: a uniform `u` in `[0, 1)` that a rule may only *compare*, by asking
//! whether `u · scale < bound`. Three representations answer that question:
//!
//! - [`Uniform24`]: the accept rule's 24-bit uniform `u = (word >> 40) · 2^-24` in the kernels'
//!   float type (`f32` on the GPU): one rounded multiply, then a compare;
//! - [`Uniform64`]: the categorical rule's 64-bit uniform `u = word · 2^-64` over 32-bit
//!   fixed-point masses: `floor(word · T / 2^64) < P` with a 128-bit product, which equals the
//!   exact comparison `u · T < P` for integers `T` and `P`;
//! - [`ExactUniform`]: an exact rational `u` (for checking that the float and rational
//!   instances decide alike on dyadic inputs);
//!
//! and the exhaustive enumerator of `specdec-algorithms::proof` answers it **symbolically**: its
//! `u` is an interval of `[0, 1)`, each comparison splits the interval at `bound / scale`, and
//! each side is a branch weighted by its length. The enumerator therefore integrates the
//! production rule itself over the set of uniforms each outcome accepts, so a change to
//! [`accept_rule`] or [`categorical_rule`] changes the proof's result.

use super::number::{KernelFloat, Mass, Prob};

/// A uniform `u ∈ [0, 1)` as a decision rule sees it (see the module docs).
pub trait UniformDraw<M> {
    /// True iff `u · scale < bound`, for `scale >= 0`.
    fn scaled_below(&mut self, scale: &M, bound: &M) -> bool;
}

/// The accept rule: true iff `q > 0` and `u · q < p`. So `p >= q > 0` accepts for every `u`,
/// `p = 0` never does, and `q <= 0` rejects without reading `u` (a token the draft could not have
/// drawn is never accepted).
pub fn accept_rule<N: Prob, U: UniformDraw<N> + ?Sized>(
    u: &mut U,
    p_target: &N,
    q_draft: &N,
) -> bool {
    q_draft.is_positive() && u.scaled_below(q_draft, p_target)
}

/// The categorical rule over masses `m_i` (32-bit fixed point for floats, the exact weights for
/// rationals): `None` iff `T = Σ m_i` is 0 (then `u` is not read); otherwise the **lowest** `i`
/// with `u · T < m_0 + … + m_i`. Zero-mass entries are never drawn.
pub fn categorical_rule<M: Mass, U: UniformDraw<M> + ?Sized>(
    u: &mut U,
    masses: &[M],
) -> Option<usize> {
    let total = masses.iter().fold(M::empty(), |acc, m| acc + m.clone());
    if !total.has_mass() {
        return None;
    }
    let mut prefix = M::empty();
    for (i, m) in masses.iter().enumerate() {
        prefix = prefix + m.clone();
        if u.scaled_below(&total, &prefix) {
            return Some(i);
        }
    }
    // Unreachable for a uniform below 1: the last prefix is the total.
    Some(masses.len() - 1)
}

/// The accept rule's uniform: `(word >> 40) · 2^-24`, exact in `f32` and `f64`; the comparison
/// is one rounded multiply in `F` (no FMA), then a compare — what the kernels compute.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Uniform24<F>(pub F);

impl<F: KernelFloat> Uniform24<F> {
    /// The uniform a raw 64-bit word gives.
    pub fn from_word(word: u64) -> Self {
        Self(F::from_u24((word >> 40) as u32))
    }
}

impl<F: KernelFloat> UniformDraw<F> for Uniform24<F> {
    fn scaled_below(&mut self, scale: &F, bound: &F) -> bool {
        self.0 * *scale < *bound
    }
}

/// The categorical rule's uniform: the raw word as `word · 2^-64`, compared with integer
/// fixed-point masses by `floor(word · scale / 2^64) < bound` (a 128-bit product).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Uniform64(pub u64);

impl Uniform64 {
    /// `floor(word · scale / 2^64)`: the uniform scaled to `[0, scale)`, exact (a 128-bit
    /// product); `scaled_below(scale, bound)` is `scaled(scale) < bound`.
    pub fn scaled(self, scale: u64) -> u64 {
        ((u128::from(self.0) * u128::from(scale)) >> 64) as u64
    }
}

impl UniformDraw<u64> for Uniform64 {
    fn scaled_below(&mut self, scale: &u64, bound: &u64) -> bool {
        self.scaled(*scale) < *bound
    }
}

/// An exactly known uniform: `u · scale < bound` in `N`'s own arithmetic (exact for rationals).
#[derive(Debug, Clone, PartialEq)]
pub struct ExactUniform<N>(pub N);

impl<N: Prob> UniformDraw<N> for ExactUniform<N> {
    fn scaled_below(&mut self, scale: &N, bound: &N) -> bool {
        self.0.clone() * scale.clone() < *bound
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampling::{ratio, BigRational, Prob};
    use num_bigint::BigInt;

    fn word_as_rational(word: u64) -> BigRational {
        BigRational::new(BigInt::from(word), BigInt::from(1u128 << 64))
    }

    proptest::proptest! {
        /// On dyadic inputs (8 significant bits, so the `f32` product is exact) the kernels'
        /// accept rule and its rational instance decide identically for every 24-bit uniform.
        #[test]
        fn accept_float_and_rational_instances_agree_on_dyadic_inputs(
            p in 0i64..=256, q in 0i64..=256, u24 in 0u32..(1 << 24),
        ) {
            let word = u64::from(u24) << 40;
            let float = accept_rule(&mut Uniform24::<f32>::from_word(word), &(p as f32 / 256.0), &(q as f32 / 256.0));
            let wide = accept_rule(&mut Uniform24::<f64>::from_word(word), &(p as f64 / 256.0), &(q as f64 / 256.0));
            let u = ratio(i64::from(u24), 1 << 24);
            let exact = accept_rule(&mut ExactUniform(u), &ratio(p, 256), &ratio(q, 256));
            proptest::prop_assert_eq!(float, exact);
            proptest::prop_assert_eq!(wide, exact);
        }

        /// On dyadic weights (multiples of `2^-12`, exact in 32-bit fixed point) the fixed-point
        /// categorical rule and its rational instance pick the same index for every word.
        #[test]
        fn categorical_fixed_point_and_rational_instances_agree_on_dyadic_inputs(
            weights in proptest::collection::vec(0i64..=4096, 1..7), word in proptest::num::u64::ANY,
        ) {
            let floats: Vec<f32> = weights.iter().map(|&w| w as f32 / 4096.0).collect();
            let fixed: Vec<u64> = floats.iter().map(|w| w.mass()).collect();
            let exact: Vec<BigRational> = weights.iter().map(|&w| ratio(w, 4096)).collect();
            let picked = categorical_rule(&mut Uniform64(word), &fixed);
            let rational = categorical_rule(&mut ExactUniform(word_as_rational(word)), &exact);
            proptest::prop_assert_eq!(picked, rational);
        }
    }

    #[test]
    fn exact_uniform_compares_strictly() {
        // u · scale < bound at, just below and just above equality.
        let mut u = ExactUniform(ratio(1, 2));
        assert!(!u.scaled_below(&ratio(1, 1), &ratio(1, 2)));
        assert!(u.scaled_below(&ratio(1, 1), &ratio(3, 4)));
        assert!(!u.scaled_below(&ratio(1, 1), &ratio(1, 4)));
        assert!(!u.scaled_below(&ratio(2, 3), &ratio(1, 3)));
        assert!(u.scaled_below(&ratio(2, 3), &ratio(1, 2)));
        assert!(!accept_rule(&mut u, &ratio(1, 4), &ratio(1, 2)));
        assert!(accept_rule(&mut u, &ratio(1, 3), &ratio(1, 2)));
    }

    #[test]
    fn rules_do_not_read_the_uniform_without_mass() {
        struct Unread;
        impl UniformDraw<BigRational> for Unread {
            fn scaled_below(&mut self, _: &BigRational, _: &BigRational) -> bool {
                panic!("read")
            }
        }
        assert!(!accept_rule(&mut Unread, &ratio(1, 2), &ratio(0, 1)));
        assert_eq!(
            categorical_rule(&mut Unread, &[ratio(0, 1), ratio(0, 1)]),
            None
        );
    }
}
