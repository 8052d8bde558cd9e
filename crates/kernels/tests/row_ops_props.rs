//! Property tests of the row ops in the kernel table (RMSNorm, LayerNorm, RoPE rotation,
//! softmax, SiLU gating, f32 → bf16):
//! * every kernel set this CPU runs is bitwise equal to the portable set: each SIMD version
//!   performs the same IEEE operations in the same order (the 8-lane partial sums of
//!   `arch/scalar.rs`'s `sum8`, separate multiplies and adds, the same polynomial `exp`), and
//!   Rust never contracts `a·b + c`, so any difference is a bug, not rounding;
//! * the portable set is within a derived bound of the f64 definition (bounds in `u`, the
//!   f32 unit roundoff 2⁻²⁴, first order, one comment per op);
//! * `to_bf16` equals `half::bf16::from_f32` bit for bit, including NaN payloads, infinities,
//!   subnormals, overflow to infinity and rounding ties.

use kernels::ops::SetOps;
use kernels::KernelSet;
use proptest::prelude::*;

mod common;
use common::vals;

/// f32 unit roundoff.
const U: f64 = 1.0 / (1u64 << 24) as f64;

/// Relative error bound of the polynomial `exp` on [−87, 0]: an exhaustive scan of every f32
/// in that range against f64 `exp` gave at most 4.26 u (at x = −26.686), rounded up.
const E_EXP: f64 = 5.0 * U;

fn scalar() -> SetOps {
    SetOps::of(KernelSet::Scalar).unwrap()
}

/// The SIMD sets this CPU runs (the portable one excluded).
fn simd_sets() -> Vec<(KernelSet, SetOps)> {
    KernelSet::ALL
        .into_iter()
        .filter(|&s| s != KernelSet::Scalar)
        .filter_map(|s| SetOps::of(s).map(|o| (s, o)))
        .collect()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// `n` values in `[-scale, scale)` with a few special ones mixed in when `specials`.
fn input(seed: u64, n: usize, scale: f32, specials: bool) -> Vec<f32> {
    let mut v: Vec<f32> = vals(seed, n).iter().map(|x| x * scale).collect();
    if specials && n > 3 {
        let s = seed as usize;
        v[s % n] = f32::NEG_INFINITY;
        v[(s / 7) % n] = -0.0;
        v[(s / 49) % n] = 0.0;
    }
    v
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, .. ProptestConfig::default() })]

    /// Every set against the portable one, bit for bit, for every op and length 0..300
    /// (covers the 4- and 8-lane bodies and every tail length).
    #[test]
    fn every_set_equals_the_portable_row_ops(
        n in 0usize..300,
        seed in 1u64..1_000_000,
        mag in 0i32..4,
        hd_pick in 0usize..6,
    ) {
        let scale = 10f32.powi(2 * mag - 3);
        let x = input(seed, n, scale, false);
        let w: Vec<f32> = vals(seed ^ 0x77, n).iter().map(|v| v + 1.5).collect();
        let b = vals(seed ^ 0x99, n);
        let eps = 1e-5;
        let sc = scalar();
        let mut want_rms = vec![0f32; n];
        sc.rms_norm(&x, &w, eps, &mut want_rms);
        let mut want_ln = vec![0f32; n];
        sc.layer_norm(&x, &w, &b, eps, &mut want_ln);
        // softmax with −∞ and ±0 among scores of every scale (−∞ entries must give 0).
        let sm_in = input(seed ^ 0x5, n, 30.0 * scale, true);
        let mut want_sm = sm_in.clone();
        sc.softmax(&mut want_sm);
        // gate inputs reach ±100 (exp(−|a|) below the polynomial's range there).
        let g = input(seed ^ 0x3, 2 * n, 100.0 * scale, false);
        let mut want_gate = vec![0f32; n];
        sc.silu_gate(&g, &mut want_gate);
        let hd = [2usize, 4, 6, 16, 64, 130][hd_pick];
        let pairs = (seed as usize % (hd / 2)) + 1;
        let (cos, sin): (Vec<f32>, Vec<f32>) =
            (0..pairs).map(|i| ((i as f32 * 0.37 + seed as f32).cos(), (i as f32 * 0.37 + seed as f32).sin())).unzip();
        let rope_in = input(seed ^ 0x11, n.div_ceil(hd) * hd, scale, false);
        let mut want_rope = rope_in.clone();
        sc.rope_rotate(&mut want_rope, hd, &cos, &sin);
        for (set, ops) in simd_sets() {
            let mut got = vec![f32::NAN; n];
            ops.rms_norm(&x, &w, eps, &mut got);
            prop_assert_eq!(bits(&got), bits(&want_rms), "{} rms_norm", set);
            ops.layer_norm(&x, &w, &b, eps, &mut got);
            prop_assert_eq!(bits(&got), bits(&want_ln), "{} layer_norm", set);
            let mut sm = sm_in.clone();
            ops.softmax(&mut sm);
            prop_assert_eq!(bits(&sm), bits(&want_sm), "{} softmax", set);
            ops.silu_gate(&g, &mut got);
            prop_assert_eq!(bits(&got), bits(&want_gate), "{} silu_gate", set);
            let mut r = rope_in.clone();
            ops.rope_rotate(&mut r, hd, &cos, &sin);
            prop_assert_eq!(bits(&r), bits(&want_rope), "{} rope", set);
        }
    }

    /// The portable RMSNorm against f64. Bound: Σx² of nonnegative rounded squares is within
    /// (n + 1)u relative in any order; /n, +eps, 1/sqrt add 1 + 1 + 1/2 + 1 (the sqrt halves
    /// the relative error of its input); g·inv and v·(…) add 2: out within ((n+1)/2 + 6)u of
    /// |out| (plus 1e-37 for underflow).
    #[test]
    fn portable_rms_norm_matches_f64(n in 1usize..400, seed in 1u64..1_000_000, mag in 0i32..4) {
        let x = input(seed, n, 10f32.powi(2 * mag - 3), false);
        let w: Vec<f32> = vals(seed ^ 0x77, n).iter().map(|v| v * 2.0).collect();
        let mut out = vec![0f32; n];
        scalar().rms_norm(&x, &w, 1e-6, &mut out);
        let ss: f64 = x.iter().map(|&v| v as f64 * v as f64).sum();
        let inv = 1.0 / (ss / n as f64 + 1e-6f32 as f64).sqrt();
        for i in 0..n {
            let e = x[i] as f64 * w[i] as f64 * inv;
            let tol = ((n as f64 + 1.0) / 2.0 + 6.0) * U * e.abs() + 1e-37;
            prop_assert!((out[i] as f64 - e).abs() <= tol, "{}: {} vs {}", i, out[i], e);
        }
    }

    /// The portable LayerNorm against f64. Bound: the mean is within δ = (n + 1)u·mean|x| of the
    /// exact one; Σ(x − m̂)² = n·var + n·(m̂ − m)² exactly, computed within (n + 3)u relative,
    /// so 1/sqrt(var + eps) is within ((n + 3)/2 + 3)u + δ²/(2 var) relative; each output
    /// (x − m̂)·inv·g + b is then within |g|·inv·(δ + |x − m|·(((n + 3)/2 + 6)u + δ²/(2 var)))
    /// + u·(|out| + |b|) (the last add).
    #[test]
    fn portable_layer_norm_matches_f64(n in 2usize..400, seed in 1u64..1_000_000, off in -3.0f32..3.0) {
        let x: Vec<f32> = vals(seed, n).iter().map(|v| v * 2.0 + off).collect();
        let w: Vec<f32> = vals(seed ^ 0x77, n).iter().map(|v| v * 2.0).collect();
        let b = vals(seed ^ 0x99, n);
        let eps = 1e-5f32;
        let mut out = vec![0f32; n];
        scalar().layer_norm(&x, &w, &b, eps, &mut out);
        let nf = n as f64;
        let mean: f64 = x.iter().map(|&v| v as f64).sum::<f64>() / nf;
        let var: f64 = x.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / nf;
        let inv = 1.0 / (var + eps as f64).sqrt();
        let delta = (nf + 1.0) * U * x.iter().map(|&v| (v as f64).abs()).sum::<f64>() / nf;
        let rel = ((nf + 3.0) / 2.0 + 6.0) * U + delta * delta / (2.0 * (var + eps as f64));
        for i in 0..n {
            let c = x[i] as f64 - mean;
            let e = c * inv * w[i] as f64 + b[i] as f64;
            let tol = (w[i] as f64).abs() * inv * (delta + c.abs() * rel)
                + U * (e.abs() + (b[i] as f64).abs())
                + 1e-30;
            prop_assert!((out[i] as f64 - e).abs() <= tol, "{}: {} vs {}", i, out[i], e);
        }
    }

    /// The portable softmax against f64. Bound per entry: x − m rounds within u·|x − m|, which
    /// moves exp by that much relative; the polynomial adds E_EXP. The sum of nonnegative terms
    /// carries the probability-weighted mean of those entry errors plus its own rounding: each
    /// of the 8 partial sums adds at most ⌈n/8⌉ terms, then 7 lane adds and at most 7 tail adds,
    /// so a depth of n/8 + 15 roundings; 1/sum and the product add 2u.
    #[test]
    fn portable_softmax_matches_f64(n in 1usize..300, seed in 1u64..1_000_000, spread in 0.1f32..60.0) {
        let x = input(seed, n, spread, true);
        let mut out = x.clone();
        scalar().softmax(&mut out);
        let m = x.iter().cloned().fold(f32::NEG_INFINITY, f32::max) as f64;
        if m == f64::NEG_INFINITY {
            prop_assert_eq!(bits(&out), bits(&x));
            return Ok(());
        }
        let ex: Vec<f64> = x.iter().map(|&v| (v as f64 - m).exp()).collect();
        let sum: f64 = ex.iter().sum();
        let entry = |v: f32| E_EXP + U * (v as f64 - m).abs();
        let mean_err: f64 = x.iter().zip(&ex).filter(|(v, _)| v.is_finite()).map(|(&v, e)| entry(v) * e / sum).sum();
        for i in 0..n {
            let e = ex[i] / sum;
            if x[i] == f32::NEG_INFINITY || (x[i] as f64 - m) < -87.0 {
                // Flushed to 0 below −87 (true value < 1.7e-38).
                prop_assert!(out[i] as f64 <= 1.7e-38, "{}: {}", i, out[i]);
                continue;
            }
            let tol = (entry(x[i]) + mean_err + (n as f64 / 8.0 + 17.0) * U) * e + 2e-38;
            prop_assert!((out[i] as f64 - e).abs() <= tol, "{}: {} vs {}", i, out[i], e);
        }
    }

    /// The portable SiLU gating against f64. Bound: e = exp(−|a|) within E_EXP (exact
    /// argument); 1 + e adds u; num/(1 + e) is then within 2·E_EXP + 2u; a·σ and ·b add 2u:
    /// out within (2·E_EXP + 4u)·|out| (flush of e below 1.7e-38 adds at most |a·b|·1.7e-38).
    #[test]
    fn portable_silu_gate_matches_f64(n in 1usize..300, seed in 1u64..1_000_000, scale in 0.01f32..120.0) {
        let g = input(seed, 2 * n, scale, false);
        let mut out = vec![0f32; n];
        scalar().silu_gate(&g, &mut out);
        for i in 0..n {
            let (a, b) = (g[i] as f64, g[n + i] as f64);
            let e = a / (1.0 + (-a).exp()) * b;
            let tol = (2.0 * E_EXP + 4.0 * U) * e.abs() + (a * b).abs() * 1.7e-38 + 1e-40;
            prop_assert!((out[i] as f64 - e).abs() <= tol, "{}: {} vs {}", i, out[i], e);
        }
    }

    /// The portable rotation against f64: each output is two rounded products and a rounded
    /// sum, within 2u·(|re·c| + |im·s|) (+1e-38 for underflow).
    #[test]
    fn portable_rope_matches_f64(heads in 1usize..5, half in 1usize..40, seed in 1u64..1_000_000) {
        let hd = 2 * half;
        let x = input(seed, heads * hd, 3.0, false);
        let ang = vals(seed ^ 0x1234, half);
        let (cos, sin): (Vec<f32>, Vec<f32>) = ang.iter().map(|a| ((a * 3.0).cos(), (a * 3.0).sin())).unzip();
        let mut out = x.clone();
        scalar().rope_rotate(&mut out, hd, &cos, &sin);
        for h in 0..heads {
            for i in 0..half {
                let j = h * hd + 2 * i;
                let (re, im, c, s) = (x[j] as f64, x[j + 1] as f64, cos[i] as f64, sin[i] as f64);
                let mag = (re * c).abs() + (im * s).abs() + (re * s).abs() + (im * c).abs();
                let tol = 2.0 * U * mag + 1e-38;
                prop_assert!((out[j] as f64 - (re * c - im * s)).abs() <= tol);
                prop_assert!((out[j + 1] as f64 - (re * s + im * c)).abs() <= tol);
            }
        }
    }

    /// `to_bf16` of every set equals `half::bf16::from_f32` for random bit patterns (every
    /// class: NaNs with payloads, infinities, subnormals, normals).
    #[test]
    fn to_bf16_equals_half_on_random_bits(raw in proptest::collection::vec(any::<u32>(), 0..100)) {
        let x: Vec<f32> = raw.iter().map(|&b| f32::from_bits(b)).collect();
        let want: Vec<u16> = x.iter().map(|&v| half::bf16::from_f32(v).to_bits()).collect();
        for set in KernelSet::ALL {
            let Some(ops) = SetOps::of(set) else { continue };
            let mut got = vec![0u16; x.len()];
            ops.to_bf16(&x, &mut got);
            prop_assert_eq!(&got, &want, "{}", set);
        }
    }
}

/// `to_bf16` on the edge cases, each at every position of an 8- and 16-lane body and tail:
/// NaNs (quiet, signaling, payload only in the low half, negative), ±inf, ±0, the smallest
/// and largest subnormals, ties to even (low half exactly 0x8000 with an even and an odd
/// kept bit), just above and below a tie, the largest finite value and the values that round
/// up to infinity or into the next binade.
#[test]
fn to_bf16_edge_cases_every_set() {
    let edge: [u32; 22] = [
        0x7fc0_0000,
        0xffc0_0000,
        0x7f80_0001,
        0x7fa0_0000,
        0x7f80_8000,
        0xff80_0001,
        0x7f80_0000,
        0xff80_0000,
        0x0000_0000,
        0x8000_0000,
        0x0000_0001,
        0x807f_ffff,
        0x3f80_8000,
        0x3f81_8000,
        0x3f80_8001,
        0x3f80_7fff,
        0x7f7f_ffff,
        0x7f7f_8000,
        0xff7f_8000,
        0x3fff_ffff,
        0x0080_0000,
        0x007f_8000,
    ];
    for len in [1usize, 7, 8, 9, 15, 16, 17, 33] {
        for shift in 0..len.min(edge.len()) {
            let x: Vec<f32> = (0..len)
                .map(|i| f32::from_bits(edge[(i + shift) % edge.len()]))
                .collect();
            let want: Vec<u16> = x
                .iter()
                .map(|&v| half::bf16::from_f32(v).to_bits())
                .collect();
            for set in KernelSet::ALL {
                let Some(ops) = SetOps::of(set) else { continue };
                let mut got = vec![0u16; len];
                ops.to_bf16(&x, &mut got);
                assert_eq!(got, want, "{set} len {len} shift {shift}");
            }
        }
    }
}
