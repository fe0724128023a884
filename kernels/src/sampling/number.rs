//! The number types sampling and verification math runs on.
//!
//! The same verifier code runs on `f32` (the kernels' type), `f64`, and exact rationals
//! ([`BigRational`], used by the enumeration proofs). [`Prob`] is the small arithmetic surface that
//! code needs; [`KernelFloat`] adds what the replay decisions need from a float (fixed-point
//! conversion and the exact uniform grid).

use num_bigint::BigInt;
use num_rational::BigRational;
use num_traits::{Signed, ToPrimitive, Zero};
use std::fmt::Debug;
use std::ops::{Add, Div, Mul, Sub};

/// Scale of the fixed-point representation of a probability: `2^32` (32 fractional bits).
pub const FIXED_POINT_ONE: u64 = 1 << 32;

/// A probability-like number: `f32`, `f64` or [`BigRational`].
///
/// Contract: the arithmetic operators are the usual field operations (rounded for floats, exact
/// for rationals); [`Prob::total`] is a sum whose result does not depend on the order of its
/// inputs (exact for rationals, fixed-point for floats, see [`KernelFloat::fixed_point`]).
pub trait Prob:
    Clone
    + Debug
    + PartialOrd
    + Send
    + Sync
    + Add<Output = Self>
    + Sub<Output = Self>
    + Mul<Output = Self>
    + Div<Output = Self>
{
    /// The additive identity.
    fn zero() -> Self;
    /// The multiplicative identity.
    fn one() -> Self;
    /// The nearest value of this type to an exact rational (exact for rationals).
    fn from_rational(value: &BigRational) -> Self;
    /// The nearest value of this type to `value` (exact for rationals, since every finite `f64` is
    /// a dyadic rational). Non-finite inputs give zero.
    fn from_f64(value: f64) -> Self;
    /// This value as an `f64` (rounded for rationals), for printing and statistics.
    fn to_f64(&self) -> f64;
    /// `self^exponent`, exact for rationals.
    fn pow_u32(&self, exponent: u32) -> Self;
    /// `self^exponent` for a real exponent; `None` where the type cannot represent the result
    /// exactly (rationals).
    fn powf(&self, exponent: f64) -> Option<Self>;
    /// What the categorical decision rule weighs this value as ([`crate::sampling::rules`]):
    /// its 32-bit fixed-point value for floats ([`KernelFloat::fixed_point`]), the value itself
    /// for rationals.
    type Mass: Mass;
    /// This value as a [`Prob::Mass`].
    fn mass(&self) -> Self::Mass;
    /// Order-independent sum of `values` (see the trait docs). Negative and NaN entries count as
    /// zero for floats; rationals are summed exactly as given.
    fn total(values: &[Self]) -> Self;
    /// True iff the value is exactly zero.
    fn is_zero(&self) -> bool {
        *self == Self::zero()
    }
    /// True iff the value is strictly positive.
    fn is_positive(&self) -> bool {
        *self > Self::zero()
    }
}

/// A weight as the categorical decision rule adds and compares it: `u64` fixed point (floats)
/// or an exact rational. Sums are exact in both.
pub trait Mass: Clone + Debug + PartialOrd + Add<Output = Self> {
    /// No mass.
    fn empty() -> Self;
    /// True iff strictly positive.
    fn has_mass(&self) -> bool;
}

impl Mass for u64 {
    fn empty() -> Self {
        0
    }
    fn has_mass(&self) -> bool {
        *self > 0
    }
}

impl Mass for BigRational {
    fn empty() -> Self {
        <BigRational as Zero>::zero()
    }
    fn has_mass(&self) -> bool {
        Signed::is_positive(self)
    }
}

/// Float types the replay decisions (and the CUDA kernels) work in.
pub trait KernelFloat: Prob + Copy {
    /// `floor(min(max(self, 0), 1) * 2^32)`: the 32-fractional-bit fixed-point value of a
    /// probability. NaN and negative values give 0; values above 1 saturate at `2^32`. The
    /// scaling by `2^32` is exact, so the result is the same on every IEEE machine.
    fn fixed_point(self) -> u64;
    /// `Σ fixed_point(v)` over `values`, added saturating: the exact sum that
    /// [`Prob::total`] converts back.
    fn fixed_point_total(values: &[Self]) -> u64;
    /// Converts a fixed-point sum back: `sum as Self * 2^-32` (round to nearest even).
    fn from_fixed_point(sum: u64) -> Self;
    /// The uniform `bits * 2^-24` for `bits < 2^24`: exactly representable in `f32` and `f64`.
    fn from_u24(bits: u32) -> Self;
}

macro_rules! float_prob {
    ($t:ty) => {
        impl Prob for $t {
            fn zero() -> Self {
                0.0
            }
            fn one() -> Self {
                1.0
            }
            fn from_rational(value: &BigRational) -> Self {
                ToPrimitive::to_f64(value).unwrap_or(0.0) as $t
            }
            fn from_f64(value: f64) -> Self {
                if value.is_finite() {
                    value as $t
                } else {
                    0.0
                }
            }
            fn to_f64(&self) -> f64 {
                f64::from(*self)
            }
            fn pow_u32(&self, exponent: u32) -> Self {
                self.powi(exponent as i32)
            }
            fn powf(&self, exponent: f64) -> Option<Self> {
                Some(<$t>::powf(*self, exponent as $t))
            }
            type Mass = u64;
            fn mass(&self) -> u64 {
                self.fixed_point()
            }
            fn total(values: &[Self]) -> Self {
                Self::from_fixed_point(Self::fixed_point_total(values))
            }
        }

        impl KernelFloat for $t {
            fn fixed_point(self) -> u64 {
                if self.is_nan() || self <= 0.0 {
                    0
                } else if self >= 1.0 {
                    FIXED_POINT_ONE
                } else {
                    // Exact: scaling by a power of two, then truncation toward zero.
                    (self * 4_294_967_296.0) as u64
                }
            }
            fn fixed_point_total(values: &[Self]) -> u64 {
                // Σ fixed_point(v), saturating, computed branch-free so that it vectorises:
                // each value clamped to [0, 1] (NaN and negatives to 0) is `c · 2^32 =
                // high · 2^16 + low` with `high = trunc(c · 2^16) <= 2^16` and `low < 2^16`, both
                // exact (the scalings are by powers of two, and `low` keeps bits of `c` only), so
                // `trunc(c · 2^32) = high · 2^16 + trunc(low)`. In blocks of 2^15 values the
                // halves' sums fit u32; the blocks' exact sums are then added saturating, which
                // equals the value-by-value saturating sum.
                values
                    .chunks(1 << 15)
                    .map(|block| {
                        let (mut high_sum, mut low_sum) = (0u32, 0u32);
                        for &v in block {
                            let c = if v > 0.0 { v.min(1.0) } else { 0.0 };
                            // SAFETY: `c` is in [0, 1], so `c · 2^16` is finite and in
                            // [0, 2^16], which i32 holds; conversion truncates toward zero.
                            let high: i32 = unsafe { (c * 65_536.0).to_int_unchecked() };
                            let low = c * 4_294_967_296.0 - high as $t * 65_536.0;
                            // SAFETY: `low` is in [0, 2^16) (see above), which i32 holds.
                            let low: i32 = unsafe { low.to_int_unchecked() };
                            high_sum += high as u32;
                            low_sum += low as u32;
                        }
                        (u64::from(high_sum) << 16) + u64::from(low_sum)
                    })
                    .fold(0u64, u64::saturating_add)
            }
            fn from_fixed_point(sum: u64) -> Self {
                (sum as $t) * (1.0 / 4_294_967_296.0)
            }
            fn from_u24(bits: u32) -> Self {
                (bits & 0x00ff_ffff) as $t * (1.0 / 16_777_216.0)
            }
        }
    };
}

float_prob!(f32);
float_prob!(f64);

impl Prob for BigRational {
    fn zero() -> Self {
        <BigRational as Zero>::zero()
    }
    fn one() -> Self {
        <BigRational as num_traits::One>::one()
    }
    fn from_rational(value: &BigRational) -> Self {
        value.clone()
    }
    fn from_f64(value: f64) -> Self {
        BigRational::from_float(value).unwrap_or_else(<BigRational as Zero>::zero)
    }
    fn to_f64(&self) -> f64 {
        ToPrimitive::to_f64(self).unwrap_or(f64::NAN)
    }
    fn pow_u32(&self, exponent: u32) -> Self {
        num_traits::pow(self.clone(), exponent as usize)
    }
    fn powf(&self, _exponent: f64) -> Option<Self> {
        None
    }
    type Mass = BigRational;
    fn mass(&self) -> BigRational {
        self.clone()
    }
    fn total(values: &[Self]) -> Self {
        values
            .iter()
            .fold(<BigRational as Zero>::zero(), |acc, v| acc + v)
    }
    fn is_zero(&self) -> bool {
        Zero::is_zero(self)
    }
    fn is_positive(&self) -> bool {
        Signed::is_positive(self)
    }
}

/// The exact rational `numerator / denominator` (a convenience for tests and toy tables).
/// Panics if `denominator` is zero.
pub fn ratio(numerator: i64, denominator: i64) -> BigRational {
    BigRational::new(BigInt::from(numerator), BigInt::from(denominator))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_point_is_exact_and_saturating() {
        assert_eq!(0.5f32.fixed_point(), 1 << 31);
        assert_eq!(1.0f32.fixed_point(), FIXED_POINT_ONE);
        assert_eq!(3.0f64.fixed_point(), FIXED_POINT_ONE);
        assert_eq!((-0.1f32).fixed_point(), 0);
        assert_eq!(f32::NAN.fixed_point(), 0);
        // 2^-33 is below the grid: truncates to zero.
        assert_eq!((2f64).powi(-33).fixed_point(), 0);
        assert_eq!(f32::from_u24(1 << 23), 0.5);
    }

    #[test]
    fn one_is_two_to_the_thirty_two_in_fixed_point() {
        assert_eq!(FIXED_POINT_ONE, 4_294_967_296);
        assert_eq!(1.0f32.fixed_point(), 4_294_967_296);
        assert_eq!(f64::from_fixed_point(3 << 30), 0.75);
    }

    #[test]
    fn zero_and_positive_are_exact_tests() {
        for zero in [0.0f32, -0.0] {
            assert!(Prob::is_zero(&zero) && !Prob::is_positive(&zero), "{zero}");
        }
        for (v, positive) in [(0.5f64, true), (1e-300, true), (-0.5, false)] {
            assert!(!Prob::is_zero(&v), "{v}");
            assert_eq!(Prob::is_positive(&v), positive, "{v}");
        }
        let zero = <BigRational as Prob>::zero();
        assert!(Prob::is_zero(&zero) && !Prob::is_positive(&zero));
        assert!(!Prob::is_zero(&ratio(1, 7)) && Prob::is_positive(&ratio(1, 7)));
        assert!(!Prob::is_zero(&ratio(-1, 7)) && !Prob::is_positive(&ratio(-1, 7)));
    }

    #[test]
    fn masses_are_positive_exactly_when_they_weigh_something() {
        assert_eq!(<u64 as Mass>::empty(), 0);
        assert!(!0u64.has_mass() && 1u64.has_mass() && u64::MAX.has_mass());
        assert_eq!(<BigRational as Mass>::empty(), ratio(0, 1));
        assert!(!ratio(0, 1).has_mass() && ratio(1, 9).has_mass() && !ratio(-1, 9).has_mass());
        assert_eq!(ratio(3, 8).mass(), ratio(3, 8));
        assert_eq!(0.375f32.mass(), 3 << 29);
    }

    #[test]
    fn rational_conversions_are_exact() {
        assert_eq!(<BigRational as Prob>::one(), ratio(5, 5));
        assert_eq!(BigRational::from_rational(&ratio(2, 3)), ratio(2, 3));
        assert_eq!(Prob::to_f64(&ratio(3, 4)), 0.75);
        assert_eq!(Prob::to_f64(&ratio(-1, 8)), -0.125);
        assert_eq!(f32::from_rational(&ratio(1, 4)), 0.25);
        assert_eq!(
            ratio(6, 4),
            BigRational::new(BigInt::from(3), BigInt::from(2))
        );
        assert_eq!(BigRational::total(&[ratio(1, 2), ratio(1, 3)]), ratio(5, 6));
    }

    /// The definition [`Prob::total`] must equal: the value-by-value saturating sum of
    /// [`KernelFloat::fixed_point`].
    fn reference_total<T: KernelFloat>(values: &[T]) -> u64 {
        values
            .iter()
            .fold(0u64, |acc, &v| acc.saturating_add(v.fixed_point()))
    }

    #[test]
    fn float_total_is_the_exact_sum_of_the_fixed_points() {
        // values spread over every binade below 1, the grid's edges, and the specials, in a row
        // longer than one block of the vectorised sum
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let specials = [
            0.0,
            -0.0,
            1.0,
            1.5,
            -0.25,
            f64::NAN,
            f64::INFINITY,
            f64::NEG_INFINITY,
            1.0 - f64::EPSILON,
            2f64.powi(-32),
            2f64.powi(-33),
            3.0 * 2f64.powi(-33),
            1e-300,
            65_535.0 / 65_536.0,
        ];
        let values: Vec<f64> = (0..(1 << 15) + 777)
            .map(|i| match specials.get(i % 101) {
                Some(&v) => v,
                None => {
                    let bits = next();
                    let mantissa = (bits >> 11) as f64 / (1u64 << 53) as f64;
                    mantissa * 2f64.powi(-((bits % 40) as i32))
                }
            })
            .collect();
        let singles: Vec<f32> = values.iter().map(|&v| v as f32).collect();
        for len in [0, 1, 7, 100, 1 << 15, values.len()] {
            let want64 = reference_total(&values[..len]);
            assert_eq!(f64::fixed_point_total(&values[..len]), want64, "f64 {len}");
            let want32 = reference_total(&singles[..len]);
            assert_eq!(f32::fixed_point_total(&singles[..len]), want32, "f32 {len}");
        }
        // enough ones to saturate no u64, but every block at its largest
        let ones = vec![1.0f32; (1 << 16) + 1];
        assert_eq!(f32::fixed_point_total(&ones), reference_total(&ones));
    }

    #[test]
    fn float_total_does_not_depend_on_order() {
        let values = [0.1f32, 0.2, 0.3, 1e-7, 0.4];
        let mut reversed = values;
        reversed.reverse();
        assert_eq!(
            f32::total(&values).to_bits(),
            f32::total(&reversed).to_bits()
        );
        assert!((f32::total(&values) - 1.0).abs() < 1e-6);
    }

    #[test]
    fn rationals_are_exact() {
        let third = ratio(1, 3);
        let sum = BigRational::total(&[third.clone(), third.clone(), third.clone()]);
        assert_eq!(sum, <BigRational as Prob>::one());
        assert_eq!(third.pow_u32(2), ratio(1, 9));
        assert!(third.powf(0.5).is_none());
        assert_eq!(<BigRational as Prob>::from_f64(0.25), ratio(1, 4));
    }
}
