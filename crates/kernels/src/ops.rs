//! Row-wise ops on `&[f32]` / `&mut [f32]`.
//!
//! The norms, RoPE, softmax, SiLU gating, `dot`, `axpy` (used by attention) and the
//! activations `gelu_erf` / `elu` come from the kernel table (per-set versions through
//! [`SetOps`], scalar references such as [`dot_reference`]); `add`, `mul`, `scale` and `silu`
//! are plain loops the compiler vectorizes. All functions debug-assert matching lengths; in
//! release builds they work on the common prefix.

use crate::arch::active;

/// RMSNorm: `out = x / sqrt(mean(x²) + eps) · w`, accumulated in f32 (kernel table;
/// every set computes the same operations in the same order, so results are bitwise equal
/// across sets).
pub fn rms_norm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    debug_assert!(x.len() == w.len() && x.len() == out.len());
    let n = x.len().min(w.len()).min(out.len());
    // SAFETY: the active table was selected for this CPU; all slices hold n values.
    unsafe { (active().rms_norm)(&x[..n], &w[..n], eps, &mut out[..n]) }
}

/// LayerNorm with weight and bias: `out = (x − mean) / sqrt(var + eps) · w + b`
/// (biased variance, like PyTorch; kernel table, bitwise equal across sets).
pub fn layer_norm(x: &[f32], w: &[f32], b: &[f32], eps: f32, out: &mut [f32]) {
    debug_assert!(x.len() == w.len() && x.len() == b.len() && x.len() == out.len());
    let n = x.len().min(w.len()).min(b.len()).min(out.len());
    // SAFETY: the active table was selected for this CPU; all slices hold n values.
    unsafe { (active().layer_norm)(&x[..n], &w[..n], &b[..n], eps, &mut out[..n]) }
}

/// Pairs of rotary angles computed per call of [`rope_interleaved`] (a stack buffer).
const ROPE_CHUNK: usize = 64;

/// Rotary embedding on interleaved pairs `(2i, 2i+1)` of each head of `x`
/// (`n_heads · head_dim` values), at position `pos`:
/// `freq_i = exp(−ln(max_period)·2i/head_dim)` (computed in f32 like PyTorch),
/// angle `= freq_i · pos` computed in f64, so arbitrarily large positions stay exact.
/// The rotation itself is [`rope_rotate`].
pub fn rope_interleaved(
    x: &mut [f32],
    n_heads: usize,
    head_dim: usize,
    pos: usize,
    max_period: f32,
) {
    debug_assert!(x.len() >= n_heads * head_dim && head_dim.is_multiple_of(2));
    let half = head_dim / 2;
    let k = (-(max_period as f64).ln() * 2.0 / head_dim as f64) as f32;
    let x = &mut x[..n_heads * head_dim];
    let (mut cos, mut sin) = ([0f32; ROPE_CHUNK], [0f32; ROPE_CHUNK]);
    for i0 in (0..half).step_by(ROPE_CHUNK) {
        let m = ROPE_CHUNK.min(half - i0);
        for j in 0..m {
            let freq = ((i0 + j) as f32 * k).exp();
            let (s, c) = (freq as f64 * pos as f64).sin_cos();
            (cos[j], sin[j]) = (c as f32, s as f32);
        }
        // SAFETY: the active table was selected for this CPU; x holds whole heads and the
        // pairs i0..i0 + m lie inside each head.
        unsafe { (active().rope)(x, head_dim, i0, &cos[..m], &sin[..m]) }
    }
}

/// Rotates the interleaved pairs `(2i, 2i+1)`, `i < cos.len()`, of every head (`head_dim`
/// values) of `x` by the angles whose cosines and sines are given:
/// `(re, im) → (re·cos − im·sin, re·sin + im·cos)` (kernel table, bitwise equal across sets).
/// A trailing partial head is left alone.
pub fn rope_rotate(x: &mut [f32], head_dim: usize, cos: &[f32], sin: &[f32]) {
    assert!(
        cos.len() == sin.len() && 2 * cos.len() <= head_dim,
        "rope_rotate: {} cosines, {} sines for head_dim {head_dim}",
        cos.len(),
        sin.len()
    );
    let whole = x.len() / head_dim * head_dim;
    // SAFETY: the active table was selected for this CPU; x holds whole heads and the pairs
    // lie inside each head (checked above).
    unsafe { (active().rope)(&mut x[..whole], head_dim, 0, cos, sin) }
}

/// In-place softmax (max-subtracted, polynomial `exp` within ~2 ulp; kernel table, bitwise
/// equal across sets). An empty or all `−∞` slice is left alone.
pub fn softmax(x: &mut [f32]) {
    // SAFETY: the active table was selected for this CPU.
    unsafe { (active().softmax)(x) }
}

/// SiLU gating of a gated FFN: `u[i] = silu(g[i]) · g[h + i]`, `h = u.len()` (`g` holds the
/// gate half, then the value half; kernel table, bitwise equal across sets).
pub fn silu_gate(g: &[f32], u: &mut [f32]) {
    assert!(
        g.len() >= 2 * u.len(),
        "silu_gate: {} inputs for {} outputs",
        g.len(),
        u.len()
    );
    // SAFETY: the active table was selected for this CPU; g holds 2·u.len() values.
    unsafe { (active().silu_gate)(g, u) }
}

/// The row ops of one named kernel set, for tests and benchmarks that compare sets in one
/// process (the free functions of this module use the active set).
#[derive(Clone, Copy)]
pub struct SetOps(&'static crate::arch::Kernels);

impl SetOps {
    /// The ops of `set`, or `None` when this CPU cannot run it.
    pub fn of(set: crate::KernelSet) -> Option<Self> {
        set.available().then(|| SetOps(crate::arch::table(set)))
    }

    /// [`rms_norm`] with this set.
    pub fn rms_norm(self, x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
        let n = x.len().min(w.len()).min(out.len());
        // SAFETY: the set is available on this CPU; all slices hold n values.
        unsafe { (self.0.rms_norm)(&x[..n], &w[..n], eps, &mut out[..n]) }
    }

    /// [`layer_norm`] with this set.
    pub fn layer_norm(self, x: &[f32], w: &[f32], b: &[f32], eps: f32, out: &mut [f32]) {
        let n = x.len().min(w.len()).min(b.len()).min(out.len());
        // SAFETY: the set is available on this CPU; all slices hold n values.
        unsafe { (self.0.layer_norm)(&x[..n], &w[..n], &b[..n], eps, &mut out[..n]) }
    }

    /// [`rope_rotate`] with this set.
    pub fn rope_rotate(self, x: &mut [f32], head_dim: usize, cos: &[f32], sin: &[f32]) {
        assert!(cos.len() == sin.len() && 2 * cos.len() <= head_dim);
        let whole = x.len() / head_dim * head_dim;
        // SAFETY: the set is available on this CPU; the pairs lie inside each head.
        unsafe { (self.0.rope)(&mut x[..whole], head_dim, 0, cos, sin) }
    }

    /// [`softmax`] with this set.
    pub fn softmax(self, x: &mut [f32]) {
        // SAFETY: the set is available on this CPU.
        unsafe { (self.0.softmax)(x) }
    }

    /// [`silu_gate`] with this set.
    pub fn silu_gate(self, g: &[f32], u: &mut [f32]) {
        assert!(g.len() >= 2 * u.len());
        // SAFETY: the set is available on this CPU; g holds 2·u.len() values.
        unsafe { (self.0.silu_gate)(g, u) }
    }

    /// f32 → bf16 bits (round to nearest even) with this set.
    pub fn to_bf16(self, x: &[f32], out: &mut [u16]) {
        let n = x.len().min(out.len());
        // SAFETY: the set is available on this CPU; both slices hold n values.
        unsafe { (self.0.to_bf16)(&x[..n], &mut out[..n]) }
    }
}

/// In-place SiLU: `x · sigmoid(x)`.
pub fn silu(x: &mut [f32]) {
    for v in x.iter_mut() {
        *v /= 1.0 + (-*v).exp();
    }
}

/// Error function (absolute error below 1e-7 in f32 terms; computed in f64).
pub fn erf(x: f32) -> f32 {
    erf64(x as f64) as f32
}

/// erf in f64 via a Chebyshev-fitted complementary error function (W. J. Cody style
/// rational approximations would be more exact; this one has relative error < 1.2e-7,
/// enough for f32 outputs).
fn erf64(x: f64) -> f64 {
    let z = x.abs();
    let t = 1.0 / (1.0 + 0.5 * z);
    let r = t
        * (-z * z - 1.265_512_23
            + t * (1.000_023_68
                + t * (0.374_091_96
                    + t * (0.096_784_18
                        + t * (-0.186_288_06
                            + t * (0.278_868_07
                                + t * (-1.135_203_98
                                    + t * (1.488_515_87
                                        + t * (-0.822_152_23 + t * 0.170_872_77)))))))))
            .exp();
    if x >= 0.0 {
        1.0 - r
    } else {
        r - 1.0
    }
}

/// In-place exact (erf-based) GELU `0.5·x·(1 + erf(x/√2))`, vectorized: the erfc of [`erf`]
/// evaluated in f32 with a polynomial `exp`; within `4e-7 · max(1, |x|)` of the f64 definition.
pub fn gelu_erf(x: &mut [f32]) {
    // SAFETY: the active table was selected for this CPU.
    unsafe { (active().gelu_erf)(x) }
}

/// `dst[i] = ELU(src[i])` with alpha 1 (PyTorch `nn.ELU()`), vectorized with a polynomial
/// `exp`: within 3e-7 of `x.exp_m1()`.
pub fn elu_into(src: &[f32], dst: &mut [f32]) {
    debug_assert_eq!(src.len(), dst.len());
    // SAFETY: the active table was selected for this CPU.
    unsafe { (active().elu)(src, dst) }
}

/// In-place ELU: `x` if `x > 0`, else `alpha · (exp(x) − 1)` (as [`elu_into`]).
pub fn elu(x: &mut [f32], alpha: f32) {
    let mut buf = [0f32; 64];
    for chunk in x.chunks_mut(64) {
        let src = &mut buf[..chunk.len()];
        src.copy_from_slice(chunk);
        elu_into(src, chunk);
        if alpha != 1.0 {
            // Negative outputs come from negative inputs only.
            for v in chunk.iter_mut().filter(|v| **v < 0.0) {
                *v *= alpha;
            }
        }
    }
}

/// `a += b`.
pub fn add(a: &mut [f32], b: &[f32]) {
    debug_assert_eq!(a.len(), b.len());
    for (x, y) in a.iter_mut().zip(b) {
        *x += *y;
    }
}

/// `a *= b` element-wise.
pub fn mul(a: &mut [f32], b: &[f32]) {
    debug_assert_eq!(a.len(), b.len());
    for (x, y) in a.iter_mut().zip(b) {
        *x *= *y;
    }
}

/// `a *= s`.
pub fn scale(a: &mut [f32], s: f32) {
    for x in a.iter_mut() {
        *x *= s;
    }
}

/// `y += a · x` (SIMD when available; scalar reference [`axpy_reference`]).
pub fn axpy(y: &mut [f32], a: f32, x: &[f32]) {
    debug_assert_eq!(y.len(), x.len());
    let n = y.len().min(x.len());
    // SAFETY: the active table was selected for this CPU; both slices hold n values.
    unsafe { (active().axpy)(&mut y[..n], a, &x[..n]) }
}

pub use crate::arch::scalar::axpy as axpy_reference;

/// Dot product (SIMD when available; scalar reference [`dot_reference`]).
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    debug_assert_eq!(a.len(), b.len());
    let n = a.len().min(b.len());
    // SAFETY: the active table was selected for this CPU; both slices hold n values.
    unsafe { (active().dot)(&a[..n], &b[..n]) }
}

pub use crate::arch::scalar::dot as dot_reference;

/// Dot product of f32 `a` with bf16 bits `b` (scalar reference: [`dot_bf16_reference`]).
pub fn dot_bf16(a: &[f32], b: &[u16]) -> f32 {
    debug_assert_eq!(a.len(), b.len());
    let n = a.len().min(b.len());
    // SAFETY: the active table was selected for this CPU; both slices hold n values.
    unsafe { (active().dot_bf16)(&a[..n], &b[..n]) }
}

pub use crate::arch::scalar::dot_bf16 as dot_bf16_reference;

/// `y += a · x` with `x` given as bf16 bits (SIMD when available; scalar reference
/// [`axpy_bf16_reference`]).
pub fn axpy_bf16(y: &mut [f32], a: f32, x: &[u16]) {
    debug_assert_eq!(y.len(), x.len());
    let n = y.len().min(x.len());
    // SAFETY: the active table was selected for this CPU; both slices hold n values.
    unsafe { (active().axpy_bf16)(&mut y[..n], a, &x[..n]) }
}

pub use crate::arch::scalar::axpy_bf16 as axpy_bf16_reference;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn softmax_sums_to_one() {
        let mut x = vec![1.0, 2.0, 3.0, -1e30];
        softmax(&mut x);
        assert!((x.iter().sum::<f32>() - 1.0).abs() < 1e-6);
        assert_eq!(x[3], 0.0);
        let e = [1f32.exp(), 2f32.exp(), 3f32.exp()];
        let s: f32 = e.iter().sum();
        assert!((x[2] - e[2] / s).abs() < 1e-6);
    }

    #[test]
    fn erf_matches_known_values() {
        // erf values from the series definition computed independently in f64 below.
        for &x in &[-3.0f64, -1.0, -0.3, 0.0, 0.1, 0.5, 1.0, 2.0, 4.0] {
            // Maclaurin series (converges well for |x| <= 4 in f64 with enough terms).
            let mut term = x;
            let mut sum = x;
            for n in 1..200 {
                term *= -x * x / n as f64;
                sum += term / (2 * n + 1) as f64;
            }
            let want = 2.0 / std::f64::consts::PI.sqrt() * sum;
            assert!(
                (erf64(x) - want).abs() < 3e-7,
                "erf({x}) = {} want {want}",
                erf64(x)
            );
        }
    }

    #[test]
    fn rms_norm_unit_rows() {
        let x = [3.0f32, 4.0];
        let mut out = [0f32; 2];
        rms_norm(&x, &[1.0, 2.0], 0.0, &mut out);
        let r = (12.5f32).sqrt();
        assert!((out[0] - 3.0 / r).abs() < 1e-6 && (out[1] - 8.0 / r).abs() < 1e-6);
    }

    #[test]
    fn rope_rotates_pairs_and_large_positions_are_finite() {
        let mut x = vec![1.0f32, 0.0, 1.0, 0.0];
        rope_interleaved(&mut x, 1, 4, 1, 10000.0);
        assert!((x[0] - 1f32.cos()).abs() < 1e-6 && (x[1] - 1f32.sin()).abs() < 1e-6);
        let mut y = vec![0.6f32, 0.8];
        rope_interleaved(&mut y, 1, 2, 1 << 40, 10000.0);
        assert!(((y[0] * y[0] + y[1] * y[1]) - 1.0).abs() < 1e-5);
    }

    /// ELU with alpha = 1 (PyTorch `nn.ELU()`): x if x > 0 else exp(x) − 1 (reference).
    fn elu_ref(x: f32) -> f32 {
        if x > 0.0 {
            x
        } else {
            x.exp_m1()
        }
    }

    /// GELU(erf) evaluated in f64 (the definition the vectorized one approximates).
    fn gelu_ref(x: &mut [f32]) {
        for v in x.iter_mut() {
            let a = *v as f64;
            *v = (0.5 * a * (1.0 + erf64(a * std::f64::consts::FRAC_1_SQRT_2))) as f32;
        }
    }

    /// The AVX-512 clones compute the same per-lane FMAs as the AVX2 ones: bitwise equal.
    #[test]
    fn avx512_clones_equal_avx2_clones() {
        let src: Vec<f32> = (0..5003).map(|i| (i as f32 - 2500.0) / 300.0).collect();
        let run = |on: bool| {
            crate::set_avx512_allowed(on);
            let mut e = vec![0.0; src.len()];
            elu_into(&src, &mut e);
            let mut g = src.clone();
            gelu_erf(&mut g);
            (e, g)
        };
        let (a, b) = (run(true), run(false));
        crate::set_avx512_allowed(true);
        for (x, y) in a.0.iter().chain(&a.1).zip(b.0.iter().chain(&b.1)) {
            assert_eq!(x.to_bits(), y.to_bits());
        }
    }

    #[test]
    fn fast_gelu_close_to_kernels_gelu() {
        let src: Vec<f32> = (0..40001).map(|i| (i as f32 - 20000.0) / 2000.0).collect();
        let mut want = src.clone();
        gelu_ref(&mut want);
        let mut got = src.clone();
        gelu_erf(&mut got);
        let mut got2 = src.clone();
        crate::arch::scalar::gelu_erf(&mut got2);
        for ((&x, &w), (&g, &g2)) in src.iter().zip(&want).zip(got.iter().zip(&got2)) {
            let tol = 4e-7 * x.abs().max(1.0);
            assert!((g - w).abs() <= tol, "{x}: {g} vs {w}");
            assert!((g2 - w).abs() <= tol, "portable {x}: {g2} vs {w}");
        }
        let mut big = [1e30f32, -1e30, 0.0, -0.0, 200.0, -200.0];
        gelu_erf(&mut big);
        assert_eq!(big, [1e30, -0.0, 0.0, -0.0, 200.0, -0.0]);
    }

    #[test]
    fn fast_elu_close_to_expm1() {
        let src: Vec<f32> = (0..20001).map(|i| (i as f32 - 15000.0) / 1000.0).collect();
        let mut dst = vec![0.0; src.len()];
        elu_into(&src, &mut dst);
        for (&x, &y) in src.iter().zip(&dst) {
            assert!((y - elu_ref(x)).abs() < 3e-7, "{x}: {y} vs {}", elu_ref(x));
        }
        let mut d2 = vec![0.0; src.len()];
        crate::arch::scalar::elu(&src, &mut d2);
        assert!(dst.iter().zip(&d2).all(|(a, b)| (a - b).abs() < 3e-7));
    }

    #[test]
    fn elu_and_silu() {
        let mut x = vec![-1.0f32, 0.0, 2.0];
        elu(&mut x, 1.0);
        assert!((x[0] - ((-1f32).exp() - 1.0)).abs() < 1e-7 && x[1] == 0.0 && x[2] == 2.0);
        let mut s = vec![0.0f32, 1.0];
        silu(&mut s);
        assert!(s[0] == 0.0 && (s[1] - 1.0 / (1.0 + (-1f32).exp())).abs() < 1e-7);
    }
}
