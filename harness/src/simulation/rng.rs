//! A small seeded generator for the simulation's Bernoulli draws.

/// SplitMix64 (Steele, Lea, Flood 2014): a 64-bit state advanced by a Weyl increment and mixed.
/// Deterministic for a seed on every platform; not for cryptography.
#[derive(Debug, Clone)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    /// A generator started at `seed`.
    pub fn new(seed: u64) -> Self {
        SplitMix64 { state: seed }
    }

    /// A generator for stream `stream` of `seed` (e.g. one stream per request), independent of
    /// the order streams are used in.
    pub fn stream(seed: u64, stream: u64) -> Self {
        let mut g = SplitMix64::new(seed ^ stream.wrapping_mul(0xD1B5_4A32_D192_ED03));
        g.next_u64();
        g
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A uniform in [0, 1) with 53 random bits.
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uniform_is_in_range_and_has_the_right_mean() {
        let mut g = SplitMix64::new(7);
        let n = 100_000;
        let mut sum = 0.0;
        for _ in 0..n {
            let u = g.uniform();
            assert!((0.0..1.0).contains(&u));
            sum += u;
        }
        // mean 0.5, sd of the mean = sqrt(1/12 / n) ≈ 0.0009; allow 5 sd.
        assert!((sum / n as f64 - 0.5).abs() < 0.0046);
    }

    #[test]
    fn streams_differ_and_repeat() {
        let a: Vec<u64> = (0..4)
            .map(|_| SplitMix64::stream(1, 0).next_u64())
            .collect();
        assert!(a.windows(2).all(|w| w[0] == w[1]));
        assert_ne!(
            SplitMix64::stream(1, 0).next_u64(),
            SplitMix64::stream(1, 1).next_u64()
        );
    }
}
