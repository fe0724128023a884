//! The counter-based generator: one 64-bit random word per [`DrawKey`], no state.
//!
//! # Contract (the CUDA twin computes the same words)
//!
//! With `mix(z)` the SplitMix64 finaliser
//! (`z ^= z >> 30; z *= 0xbf58476d1ce4e5b9; z ^= z >> 27; z *= 0x94d049bb133111eb; z ^= z >> 31`,
//! wrapping `u64` arithmetic) and `G = 0x9e3779b97f4a7c15`:
//!
//! ```text
//! h = mix(seed + G)
//! h = mix(h ^ sequence)
//! h = mix((h + G) ^ step)
//! word = mix(h ^ (node << 32 | purpose << 24 | draw))      // purpose as its u8 discriminant
//! ```
//!
//! Each stage is a bijection of its new input for fixed earlier ones, so distinct keys of one
//! seed give distinct words up to the 64-bit mixing quality. A word is turned into decisions by
//! [`crate::sampling::Replay`].

use std::collections::HashMap;

use super::decisions::DrawKey;

const GOLDEN: u64 = 0x9e37_79b9_7f4a_7c15;

/// The SplitMix64 finaliser: a bijective 64-bit mixer.
pub fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A source of one raw 64-bit random word per key (see [`crate::sampling::Replay`]).
pub trait UniformSource {
    /// The raw word for `key`. Counter-based sources return the same word for the same key.
    fn raw(&mut self, key: DrawKey) -> u64;
}

/// The seeded counter-based generator (see the module docs for the exact formula).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CounterRng {
    /// The run's seed.
    pub seed: u64,
}

impl CounterRng {
    /// A generator for `seed`.
    pub fn new(seed: u64) -> Self {
        Self { seed }
    }

    /// The word for `key` (pure function of seed and key).
    pub fn word(&self, key: DrawKey) -> u64 {
        let mut h = mix64(self.seed.wrapping_add(GOLDEN));
        h = mix64(h ^ key.sequence);
        h = mix64(h.wrapping_add(GOLDEN) ^ key.step);
        let tail = (u64::from(key.node) << 32)
            | (u64::from(key.purpose as u8) << 24)
            | u64::from(key.draw & 0x00ff_ffff);
        mix64(h ^ tail)
    }
}

impl UniformSource for CounterRng {
    fn raw(&mut self, key: DrawKey) -> u64 {
        self.word(key)
    }
}

/// A run's [`CounterRng`] in which some sequences draw from seeds of their own (a server's
/// requests that carry a `seed`): such a sequence draws exactly the words that sequence 0 of a
/// run seeded with its seed draws, so its decisions depend on that seed alone, not on its id,
/// the run's seed or the requests that share its batch. Every other sequence draws the run's
/// words. A sequence with its own seed may share words with another that has the same seed
/// (both then decide alike, as equal seeds should).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeededSequences {
    run: CounterRng,
    own: HashMap<u64, u64>,
}

impl SeededSequences {
    /// The run's generator for `seed`, no sequence seeded on its own yet.
    pub fn new(seed: u64) -> Self {
        Self {
            run: CounterRng::new(seed),
            own: HashMap::new(),
        }
    }

    /// Gives `sequence` its own `seed`, or (`None`) returns it to the run's words.
    pub fn seed_sequence(&mut self, sequence: u64, seed: Option<u64>) {
        match seed {
            Some(seed) => self.own.insert(sequence, seed),
            None => self.own.remove(&sequence),
        };
    }

    /// The run's seed (what every sequence without a seed of its own draws from).
    pub fn run_seed(&self) -> u64 {
        self.run.seed
    }

    /// The `(seed, key sequence)` pair whose words `sequence` draws: `(its own seed, 0)` for a
    /// sequence seeded on its own, `(the run's seed, sequence)` for any other. A kernel keying
    /// each sequence by this pair draws exactly [`SeededSequences::word`]'s words.
    pub fn key_of(&self, sequence: u64) -> (u64, u64) {
        match self.own.get(&sequence) {
            Some(&seed) => (seed, 0),
            None => (self.run.seed, sequence),
        }
    }

    /// The word for `key` (a pure function of the seeds and the key).
    pub fn word(&self, key: DrawKey) -> u64 {
        let (seed, sequence) = self.key_of(key.sequence);
        CounterRng::new(seed).word(DrawKey { sequence, ..key })
    }
}

impl UniformSource for SeededSequences {
    fn raw(&mut self, key: DrawKey) -> u64 {
        self.word(key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampling::Purpose;

    #[test]
    fn words_depend_on_every_key_field() {
        let rng = CounterRng::new(7);
        let base = DrawKey::new(1, 2, 3, Purpose::Accept);
        let variants = [
            DrawKey {
                sequence: 9,
                ..base
            },
            DrawKey { step: 9, ..base },
            DrawKey { node: 9, ..base },
            DrawKey {
                purpose: Purpose::Bonus,
                ..base
            },
            DrawKey { draw: 1, ..base },
        ];
        for v in variants {
            assert_ne!(rng.word(base), rng.word(v), "{v:?}");
        }
        assert_ne!(rng.word(base), CounterRng::new(8).word(base));
        assert_eq!(rng.word(base), CounterRng::new(7).word(base));
    }

    #[test]
    fn mix64_is_the_splitmix64_finaliser() {
        // The first outputs of the reference SplitMix64 generator seeded with 0 (state advanced
        // by the golden gamma, then finalised), as published with the algorithm.
        let expected = [
            0xe220_a839_7b1d_cdaf_u64,
            0x6e78_9e6a_a1b9_65f4,
            0x06c4_5d18_8009_454f,
        ];
        for (i, want) in expected.into_iter().enumerate() {
            let state = GOLDEN.wrapping_mul(i as u64 + 1);
            assert_eq!(mix64(state), want, "output {i}");
        }
    }

    #[test]
    fn word_is_the_documented_formula() {
        // The module docs' formula, stage by stage, with the bits of the key's tail placed by
        // hand (node 0x0102_0304, purpose 2, draw 0x0a0b0c; a draw's bits above 24 are
        // dropped).
        let (seed, sequence, step) = (0x1234_5678_9abc_def0_u64, 77u64, 5u64);
        let key = DrawKey {
            sequence,
            step,
            node: 0x0102_0304,
            purpose: Purpose::Accept,
            draw: 0x7f0a_0b0c,
        };
        let h = mix64(seed.wrapping_add(GOLDEN));
        let h = mix64(h ^ sequence);
        let h = mix64(h.wrapping_add(GOLDEN) ^ step);
        let tail = 0x0102_0304_020a_0b0c_u64;
        assert_eq!(CounterRng::new(seed).word(key), mix64(h ^ tail));
        assert_eq!(
            CounterRng::new(seed).raw(key),
            CounterRng::new(seed).word(key)
        );
    }

    #[test]
    fn a_seeded_sequence_draws_sequence_zero_of_its_seed_and_the_others_the_runs() {
        let mut source = SeededSequences::new(7);
        source.seed_sequence(5, Some(42));
        for (step, node) in [(0, 0), (3, 1), (9, 4)] {
            let key = DrawKey::new(5, step, node, Purpose::Draft);
            let alone = DrawKey::new(0, step, node, Purpose::Draft);
            assert_eq!(source.raw(key), CounterRng::new(42).word(alone));
            assert_ne!(source.raw(key), CounterRng::new(7).word(key));
            let other = DrawKey::new(6, step, node, Purpose::Draft);
            assert_eq!(source.raw(other), CounterRng::new(7).word(other));
        }
        assert_eq!((source.key_of(5), source.key_of(6)), ((42, 0), (7, 6)));
        source.seed_sequence(5, None);
        let key = DrawKey::new(5, 1, 2, Purpose::Accept);
        assert_eq!(source.raw(key), CounterRng::new(7).word(key));
        assert_eq!((source.key_of(5), source.run_seed()), ((7, 5), 7));
    }

    #[test]
    fn words_look_uniform() {
        // Mean of the top 24 bits over 4096 keys is near 1/2 (sd ≈ 0.0045).
        let rng = CounterRng::new(1);
        let n = 4096;
        let mean: f64 = (0..n)
            .map(|i| (rng.word(DrawKey::new(i, 0, 0, Purpose::Sample)) >> 40) as f64 / 16777216.0)
            .sum::<f64>()
            / n as f64;
        assert!((mean - 0.5).abs() < 0.03, "{mean}");
    }
}
