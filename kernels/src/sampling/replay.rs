//! The kernels' decisions, made on the CPU from raw random words: production and replay.
//!
//! # Contract (the CUDA kernels match this bit for bit)
//!
//! The rules are [`super::rules::accept_rule`] and [`super::rules::categorical_rule`] (the same
//! generic code the exact enumerator integrates), over the uniforms below. Every decision reads
//! one raw 64-bit word `r` for its [`DrawKey`] from a [`UniformSource`]
//! (the seeded [`CounterRng`] in production, [`GivenUniforms`] when replaying recorded inputs):
//!
//! - **accept(p, q)**: `u = (r >> 40) * 2^-24` (24 bits, exact in `f32`); accept iff `q > 0` and
//!   `u * q < p`, computed in the float type (`f32` in the kernels: one rounded multiply, no FMA,
//!   then a compare). So `p >= q > 0` always accepts and `p = 0` never does.
//! - **categorical(w)**: **integer fixed-point prefix sums** (chosen over an exponential race
//!   because it needs one word per draw instead of one per token, and no `log`). Each weight is
//!   converted to `W_i = floor(clamp(w_i, 0, 1) * 2^32)` (exact; NaN → 0), the total
//!   `T = Σ W_i` is an exact `u64` sum (any order gives the same total: at most `2^31` tokens),
//!   `T = 0` means "no mass" (`None`: the caller falls back, e.g. residual → sample from `p`);
//!   otherwise `t = (r * T) >> 64` (a 128-bit product) and the answer is the **lowest** index `i`
//!   with `W_0 + … + W_i > t`. Zero-weight tokens are never drawn.
//! - **uniform()**: `(r >> 11) * 2^-53` as `f64`.
//!
//! Sums that feed normalisations (`Prob::total` for floats) use the same fixed-point values, so
//! they too are independent of summation order.

use super::counter::{CounterRng, UniformSource};
use super::decisions::{Decisions, DrawKey};
use super::number::KernelFloat;
use super::rules::{accept_rule, Uniform24, Uniform64};
use std::collections::BTreeMap;

/// The kernels' decision rules (module docs) over a source of raw words.
#[derive(Debug, Clone)]
pub struct Replay<S> {
    source: S,
}

/// The production decisions: the kernels' rules over the seeded counter-based generator.
pub type Production = Replay<CounterRng>;

impl Replay<CounterRng> {
    /// Production decisions for `seed`.
    pub fn production(seed: u64) -> Self {
        Self::new(CounterRng::new(seed))
    }
}

impl<S: UniformSource> Replay<S> {
    /// Decisions over `source`.
    pub fn new(source: S) -> Self {
        Self { source }
    }

    /// The underlying source.
    pub fn source(&self) -> &S {
        &self.source
    }

    /// The underlying source, to change
    /// (e.g. [`SeededSequences::seed_sequence`](super::SeededSequences::seed_sequence)).
    pub fn source_mut(&mut self) -> &mut S {
        &mut self.source
    }
}

/// The accept rule on a raw word (see the module docs): [`accept_rule`] over [`Uniform24`].
pub fn accept_from_word<F: KernelFloat>(word: u64, p_target: F, q_draft: F) -> bool {
    accept_rule(&mut Uniform24::from_word(word), &p_target, &q_draft)
}

/// The categorical rule on a raw word (see the module docs):
/// [`categorical_rule`](super::rules::categorical_rule) over
/// [`Uniform64`] and the weights' fixed-point masses; `None` iff the
/// fixed-point total is 0.
///
/// Computed without materialising the masses: the total by the vectorised
/// [`KernelFloat::fixed_point_total`], the threshold `t = (r · T) >> 64` once, then the lowest
/// index whose prefix exceeds `t`, block by block (a block whose whole mass keeps the prefix
/// at most `t` is skipped). The answer is the rule's over the masses (tested against it).
pub fn categorical_from_word<F: KernelFloat>(word: u64, weights: &[F]) -> Option<usize> {
    const BLOCK: usize = 256;
    let total = F::fixed_point_total(weights);
    if total == 0 {
        return None;
    }
    let threshold = Uniform64(word).scaled(total);
    let mut prefix = 0u64;
    for (b, block) in weights.chunks(BLOCK).enumerate() {
        let block_mass = F::fixed_point_total(block);
        if prefix + block_mass <= threshold {
            prefix += block_mass;
            continue;
        }
        for (i, w) in block.iter().enumerate() {
            prefix += w.fixed_point();
            if threshold < prefix {
                return Some(b * BLOCK + i);
            }
        }
    }
    // Unreachable for a word below 2^64: the last prefix is the total, above the threshold.
    Some(weights.len() - 1)
}

impl<S: UniformSource, F: KernelFloat> Decisions<F> for Replay<S> {
    fn accept(&mut self, key: DrawKey, p_target: &F, q_draft: &F) -> bool {
        accept_from_word(self.source.raw(key), *p_target, *q_draft)
    }

    fn categorical(&mut self, key: DrawKey, weights: &[F]) -> Option<usize> {
        categorical_from_word(self.source.raw(key), weights)
    }

    fn uniform(&mut self, key: DrawKey) -> f64 {
        (self.source.raw(key) >> 11) as f64 * (1.0 / 9_007_199_254_740_992.0)
    }
}

/// Raw words given per key (e.g. recorded from a GPU run, or chosen by a test). A key with no
/// word reads 0 and is listed in [`GivenUniforms::missing`].
#[derive(Debug, Clone, Default)]
pub struct GivenUniforms {
    words: BTreeMap<DrawKey, u64>,
    missing: Vec<DrawKey>,
}

impl GivenUniforms {
    /// Words for the given keys.
    pub fn new(words: BTreeMap<DrawKey, u64>) -> Self {
        Self {
            words,
            missing: Vec::new(),
        }
    }

    /// The word that makes `u = (word >> 40) * 2^-24` equal `u24 * 2^-24` (for accept tests).
    pub fn word_for_u24(u24: u32) -> u64 {
        u64::from(u24 & 0x00ff_ffff) << 40
    }

    /// Keys that were asked for but not given, in the order asked.
    pub fn missing(&self) -> &[DrawKey] {
        &self.missing
    }
}

impl UniformSource for GivenUniforms {
    fn raw(&mut self, key: DrawKey) -> u64 {
        match self.words.get(&key) {
            Some(word) => *word,
            None => {
                self.missing.push(key);
                0
            }
        }
    }
}

/// A source that records every word another source hands out, so a run can be replayed.
#[derive(Debug, Clone)]
pub struct Recording<S> {
    inner: S,
    record: BTreeMap<DrawKey, u64>,
}

impl<S: UniformSource> Recording<S> {
    /// Records the words `inner` hands out.
    pub fn new(inner: S) -> Self {
        Self {
            inner,
            record: BTreeMap::new(),
        }
    }

    /// The recorded words, ready for [`GivenUniforms::new`].
    pub fn into_record(self) -> BTreeMap<DrawKey, u64> {
        self.record
    }
}

impl<S: UniformSource> UniformSource for Recording<S> {
    fn raw(&mut self, key: DrawKey) -> u64 {
        let word = self.inner.raw(key);
        self.record.insert(key, word);
        word
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampling::rules::categorical_rule;
    use crate::sampling::Purpose;

    fn key() -> DrawKey {
        DrawKey::new(0, 0, 1, Purpose::Accept)
    }

    #[test]
    fn accept_rule_edges() {
        let half = GivenUniforms::word_for_u24(1 << 23);
        assert!(accept_from_word(half, 0.6f32, 1.0));
        assert!(!accept_from_word(half, 0.5f32, 1.0), "u*q < p is strict");
        assert!(!accept_from_word(0, 0.5f32, 0.0), "q = 0 rejects");
        assert!(!accept_from_word(0, 0.0f32, 0.5), "p = 0 never accepts");
        assert!(
            accept_from_word(u64::MAX, 0.3f32, 0.3),
            "p >= q always accepts"
        );
    }

    proptest::proptest! {
        /// The block-skipping walk draws what the rule draws over the materialised masses, on
        /// rows long enough for several blocks, with zero, tiny, saturating and NaN weights.
        #[test]
        fn categorical_from_word_is_the_rule_over_the_masses(
            weights in proptest::collection::vec(
                proptest::prop_oneof![
                    4 => 0.0f32..1.0,
                    1 => proptest::strategy::Just(0.0f32),
                    1 => 0.0f32..1e-9,
                    1 => proptest::sample::select(vec![1.0f32, 2.0, -0.5, f32::NAN]),
                ],
                1..1500,
            ),
            word in proptest::num::u64::ANY,
        ) {
            let masses: Vec<u64> = weights.iter().map(|w| w.fixed_point()).collect();
            let rule = categorical_rule(&mut Uniform64(word), &masses);
            proptest::prop_assert_eq!(categorical_from_word(word, &weights), rule);
            for edge in [0, u64::MAX] {
                let rule = categorical_rule(&mut Uniform64(edge), &masses);
                proptest::prop_assert_eq!(categorical_from_word(edge, &weights), rule);
            }
        }
    }

    #[test]
    fn categorical_rule_edges() {
        assert_eq!(categorical_from_word::<f32>(123, &[0.0, 0.0]), None);
        assert_eq!(categorical_from_word(0, &[0.0f32, 0.5, 0.5]), Some(1));
        assert_eq!(
            categorical_from_word(u64::MAX, &[0.5f32, 0.5, 0.0]),
            Some(1)
        );
        assert_eq!(categorical_from_word(1 << 63, &[0.5f32, 0.5]), Some(1));
        assert_eq!(
            categorical_from_word((1 << 63) - 1, &[0.5f32, 0.5]),
            Some(0)
        );
        // Below the fixed-point grid counts as no mass.
        assert_eq!(categorical_from_word(7, &[1e-12f64]), None);
    }

    proptest::proptest! {
        /// With dyadic inputs (at most 8 significant bits) the f32 product `u * q` is exact, so the
        /// replay rule must equal the exact comparison `u * q < p` on rationals.
        #[test]
        fn accept_rule_is_the_exact_comparison_on_dyadic_inputs(
            p in 0u32..=256, q in 0u32..=256, u24 in 0u32..(1 << 24),
        ) {
            let (pf, qf) = (p as f32 / 256.0, q as f32 / 256.0);
            let word = GivenUniforms::word_for_u24(u24);
            let exact = q > 0 && u64::from(u24) * u64::from(q) < u64::from(p) << 24;
            proptest::prop_assert_eq!(accept_from_word(word, pf, qf), exact);
        }

        /// The categorical rule picks the lowest index whose fixed-point prefix sum exceeds
        /// `floor(word * T / 2^64)`, never a zero-weight index, and is monotone in the word.
        #[test]
        fn categorical_rule_is_the_fixed_point_inverse_cdf(
            weights in proptest::collection::vec(0u32..=8, 1..6), word in proptest::num::u64::ANY,
        ) {
            let w: Vec<f32> = weights.iter().map(|&x| x as f32 / 32.0).collect();
            let picked = categorical_from_word(word, &w);
            let fixed: Vec<u64> = weights.iter().map(|&x| u64::from(x) << 27).collect();
            let total: u64 = fixed.iter().sum();
            if total == 0 {
                proptest::prop_assert_eq!(picked, None);
            } else {
                let t = ((u128::from(word) * u128::from(total)) >> 64) as u64;
                let mut prefix = 0;
                let expected = fixed.iter().position(|f| { prefix += f; prefix > t });
                proptest::prop_assert_eq!(picked, expected);
                proptest::prop_assert!(weights[picked.unwrap()] > 0);
                let later = categorical_from_word(word.saturating_add(1 << 40), &w).unwrap();
                proptest::prop_assert!(later >= picked.unwrap());
            }
        }
    }

    #[test]
    fn uniform_is_the_top_53_bits_of_the_word() {
        let k = DrawKey::new(2, 0, 0, Purpose::Sample);
        let given = |word| {
            let mut replay = Replay::new(GivenUniforms::new(BTreeMap::from([(k, word)])));
            Decisions::<f32>::uniform(&mut replay, k)
        };
        assert_eq!(given(1 << 63), 0.5);
        assert_eq!(given(3 << 62), 0.75);
        assert_eq!(given(u64::MAX), 1.0 - 2f64.powi(-53));
        assert_eq!(given((1 << 11) - 1), 0.0);
        assert_eq!(given(1 << 11), 2f64.powi(-53));
    }

    #[test]
    fn given_words_are_returned_and_missing_keys_listed() {
        assert_eq!(GivenUniforms::word_for_u24(1), 1 << 40);
        assert_eq!(GivenUniforms::word_for_u24(0x0123_4567), 0x23_4567 << 40);
        let (a, b) = (key(), DrawKey::new(0, 0, 2, Purpose::Accept));
        let mut given = GivenUniforms::new(BTreeMap::from([(a, 77)]));
        assert_eq!((given.raw(a), given.raw(b), given.raw(b)), (77, 0, 0));
        assert_eq!(given.missing(), &[b, b]);
        let mut recording = Recording::new(CounterRng::new(4));
        let word = recording.raw(a);
        assert_eq!(word, CounterRng::new(4).word(a));
        assert_eq!(recording.into_record(), BTreeMap::from([(a, word)]));
        assert_eq!(Replay::production(4).source(), &CounterRng::new(4));
    }

    #[test]
    fn categorical_frequencies_follow_weights() {
        let mut dec = Replay::production(3);
        let weights = [0.125f64, 0.5, 0.0, 0.375];
        let mut counts = [0usize; 4];
        let n = 20_000;
        for i in 0..n {
            let k = DrawKey::new(i, 0, 0, Purpose::Sample);
            counts[dec.categorical(k, &weights).unwrap()] += 1;
        }
        assert_eq!(counts[2], 0);
        for (c, w) in counts.iter().zip(weights) {
            assert!((*c as f64 / n as f64 - w).abs() < 0.02, "{counts:?}");
        }
    }

    #[test]
    fn replay_reproduces_a_recorded_run() {
        let mut recording = Replay::new(Recording::new(CounterRng::new(11)));
        let weights = [0.2f32, 0.3, 0.5];
        let a: Vec<Option<usize>> = (0..10)
            .map(|i| recording.categorical(DrawKey::new(i, 0, 0, Purpose::Sample), &weights))
            .collect();
        let accepted = Decisions::<f32>::accept(&mut recording, key(), &0.3, &0.6);
        let words = recording.source.into_record();
        let mut replay = Replay::new(GivenUniforms::new(words));
        let b: Vec<Option<usize>> = (0..10)
            .map(|i| replay.categorical(DrawKey::new(i, 0, 0, Purpose::Sample), &weights))
            .collect();
        assert_eq!(a, b);
        assert_eq!(
            Decisions::<f32>::accept(&mut replay, key(), &0.3, &0.6),
            accepted
        );
        assert!(replay.source().missing().is_empty());
    }
}
