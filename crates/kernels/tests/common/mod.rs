//! Helpers shared by the convolution property tests.

/// `n` deterministic pseudo-random values in `[-1, 1)` (xorshift64 seeded by `seed`).
pub fn vals(seed: u64, n: usize) -> Vec<f32> {
    let mut s = seed | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}
