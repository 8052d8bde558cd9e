//! Helpers shared by the convolution property tests.

/// `n` deterministic pseudo-random values in `[-1, 1)` (xorshift64 seeded by `seed`).
pub use testkit::rng::values as vals;
