//! Small statistics and clocks for benchmarks: medians and deterministic token streams.

use std::time::Instant;

pub use crate::metrics::median;

/// Runs `f` once and returns its result with the elapsed wall time in seconds.
pub fn timed<T>(f: impl FnOnce() -> T) -> (T, f64) {
    let start = Instant::now();
    let out = f();
    (out, start.elapsed().as_secs_f64())
}

/// `n` token ids in `[0, below)` from a fixed SplitMix64 stream seeded with `seed`: the same
/// "prompt" on every run (like llama-bench's random prompt tokens). `below` must be positive.
pub fn token_stream(seed: u64, n: usize, below: u32) -> Vec<u32> {
    let mut state = seed;
    (0..n)
        .map(|_| {
            state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^= z >> 31;
            (z % u64::from(below.max(1))) as u32
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_stream_is_deterministic_and_bounded() {
        let a = token_stream(7, 200, 50);
        assert_eq!(a, token_stream(7, 200, 50));
        assert_ne!(a, token_stream(8, 200, 50));
        assert!(a.iter().all(|&t| t < 50));
        // Not degenerate: many distinct ids.
        let mut distinct = a.clone();
        distinct.sort_unstable();
        distinct.dedup();
        assert!(distinct.len() > 30, "{}", distinct.len());
    }
}
