//! A tiny deterministic generator for policy simulations in tests (not for verification).

/// SplitMix64.
pub(crate) struct SplitMix(u64);

impl SplitMix {
    pub(crate) fn new(seed: u64) -> Self {
        Self(seed)
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub(crate) fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Accepted drafts of a chain of `k` with constant conditional acceptance `alpha`.
    pub(crate) fn chain_accepted(&mut self, k: usize, alpha: f64) -> usize {
        (0..k).take_while(|_| self.uniform() < alpha).count()
    }
}
