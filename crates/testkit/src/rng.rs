//! A small deterministic generator for test inputs (weights, activations, byte mutations).

/// xorshift64 (shifts 13, 7, 17). The state must not be zero: a zero state stays zero.
#[derive(Clone, Debug)]
pub struct XorShift(pub u64);

impl XorShift {
    /// The next 64-bit output.
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// The next value in `[-1, 1)`: the output's top 24 bits as a fraction, mapped linearly.
    pub fn next_f32(&mut self) -> f32 {
        ((self.next_u64() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }

    /// `n` values of [`XorShift::next_f32`], each times `scale`.
    pub fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.next_f32() * scale).collect()
    }

    /// An index below `n` (below 1 when `n` is 0), by remainder.
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n.max(1) as u64) as usize
    }
}

/// `n` values in `[-1, 1)` from [`XorShift`] seeded with `seed | 1` (never zero).
pub fn values(seed: u64, n: usize) -> Vec<f32> {
    XorShift(seed | 1).vec(n, 1.0)
}
