//! Small f32 helpers of the Mimi codec (attention over the KV ring, pointwise ops); the matrix
//! products themselves run in the `kernels` crate.
//!
//! Every routine has a portable body; on x86_64 the same body is also compiled with
//! AVX2+FMA enabled and selected at run time. The two agree to float rounding (FMA
//! contraction only), far below the 1e-4 parity tolerance.

/// Whether the AVX2+FMA variants may be used on this machine (checked once).
#[cfg(target_arch = "x86_64")]
fn has_avx2_fma() -> bool {
    use std::sync::OnceLock;
    static FLAG: OnceLock<bool> = OnceLock::new();
    *FLAG.get_or_init(|| is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma"))
}

/// Generates a portable function and, on x86_64, an AVX2+FMA clone, an AVX-512 clone (used
/// when `kernels::avx512()` allows it) and a dispatcher.
/// Inside the body, `fma!(a, b, c)` computes `a * b + c` (fused in the AVX2 clone).
macro_rules! dispatch {
    (
        $(#[$meta:meta])*
        $vis:vis fn $name:ident / $portable:ident / $avx:ident ($($arg:ident : $ty:ty),* $(,)?) $body:block
    ) => {
        #[allow(clippy::too_many_arguments, clippy::assign_op_pattern)]
        #[inline(always)]
        fn $portable($($arg: $ty),*) {
            #[allow(unused_macros)]
            macro_rules! fma { ($a:expr, $b:expr, $c:expr) => { $a * $b + $c }; }
            $body
        }

        #[cfg(target_arch = "x86_64")]
        #[allow(clippy::too_many_arguments, clippy::assign_op_pattern)]
        #[target_feature(enable = "avx2,fma")]
        fn $avx($($arg: $ty),*) {
            #[allow(unused_macros)]
            macro_rules! fma { ($a:expr, $b:expr, $c:expr) => { f32::mul_add($a, $b, $c) }; }
            $body
        }

        $(#[$meta])*
        #[allow(clippy::too_many_arguments)]
        $vis fn $name($($arg: $ty),*) {
            #[cfg(target_arch = "x86_64")]
            {
                /// The same body compiled for AVX-512 (wider vectors, same per-lane FMAs, so
                /// bitwise equal to the AVX2 clone).
                #[allow(clippy::too_many_arguments, clippy::assign_op_pattern)]
                #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma")]
                fn wide($($arg: $ty),*) {
                    #[allow(unused_macros)]
                    macro_rules! fma { ($a:expr, $b:expr, $c:expr) => { f32::mul_add($a, $b, $c) }; }
                    $body
                }
                if kernels::avx512() {
                    // SAFETY: kernels::avx512() checked AVX-512 F/BW/DQ/VL (and AVX2+FMA).
                    return unsafe { wide($($arg),*) };
                }
                if has_avx2_fma() {
                    // SAFETY: the CPU supports AVX2 and FMA (checked above).
                    return unsafe { $avx($($arg),*) };
                }
            }
            $portable($($arg),*)
        }
    };
}

/// Sizes of one [`attend`] call.
#[derive(Debug, Clone, Copy)]
pub struct AttendShape {
    /// Model dimension (row length of the KV rings).
    pub d: usize,
    /// Heads (head dim = d / heads).
    pub heads: usize,
    /// First and last (inclusive) absolute key positions attended.
    pub lo: usize,
    /// Last key position (the query's own).
    pub hi: usize,
    /// Ring capacity (slot = position mod cap).
    pub cap: usize,
    /// Score scale (1/√head_dim).
    pub scale: f32,
    /// Heads `h0..h1` are computed; `out` holds just their `(h1 − h0)·head_dim` values.
    pub h0: usize,
    /// End of the head range.
    pub h1: usize,
}

dispatch! {
    /// Multi-head attention of one query row `q [d]` over ring slots of keys/values `[cap, d]`
    /// for positions `lo..=hi`: per head `h0..h1` softmax(q·k·scale) v into `out`
    /// (`[(h1 − h0)·head_dim]`, head `h0` first).
    pub fn attend / attend_portable / attend_avx2(
        q: &[f32], keys: &[f32], values: &[f32], sh: AttendShape, scores: &mut [f32], out: &mut [f32],
    ) {
        let hd = sh.d / sh.heads;
        let n = sh.hi + 1 - sh.lo;
        for h in sh.h0..sh.h1 {
            let qh = &q[h * hd..(h + 1) * hd];
            let sc = &mut scores[..n];
            let mut mx = f32::NEG_INFINITY;
            for (i, kp) in (sh.lo..=sh.hi).enumerate() {
                let slot = kp % sh.cap;
                let k = &keys[slot * sh.d + h * hd..slot * sh.d + (h + 1) * hd];
                let mut acc = [0f32; 16];
                let chunks = hd / 16;
                for ch in 0..chunks {
                    let av: &[f32; 16] = qh[ch * 16..ch * 16 + 16].try_into().unwrap();
                    let bv: &[f32; 16] = k[ch * 16..ch * 16 + 16].try_into().unwrap();
                    for j in 0..16 {
                        acc[j] = fma!(av[j], bv[j], acc[j]);
                    }
                }
                let mut v = acc.iter().sum::<f32>();
                for j in chunks * 16..hd {
                    v = fma!(qh[j], k[j], v);
                }
                let v = v * sh.scale;
                sc[i] = v;
                mx = mx.max(v);
            }
            let mut sum = 0.0;
            for v in sc.iter_mut() {
                *v = (*v - mx).exp();
                sum += *v;
            }
            let inv = 1.0 / sum;
            let o = &mut out[(h - sh.h0) * hd..(h - sh.h0 + 1) * hd];
            o.fill(0.0);
            for (i, kp) in (sh.lo..=sh.hi).enumerate() {
                let slot = kp % sh.cap;
                let vv = &values[slot * sh.d + h * hd..slot * sh.d + (h + 1) * hd];
                let w = sc[i] * inv;
                for (oj, &vj) in o.iter_mut().zip(vv) {
                    *oj = fma!(w, vj, *oj);
                }
            }
        }
    }
}

/// ELU with alpha = 1 (PyTorch `nn.ELU()`): x if x > 0 else exp(x) − 1 (reference).
#[cfg(test)]
pub fn elu(x: f32) -> f32 {
    if x > 0.0 {
        x
    } else {
        x.exp_m1()
    }
}

/// exp(x) for x ≤ 0 (inputs below −87 give 0), branch-free so it vectorizes: Cody–Waite
/// range reduction and a degree-6 polynomial; relative error ≈ 2 ulp.
#[inline(always)]
fn exp_nonpos(x: f32) -> f32 {
    let x = x.max(-87.0);
    // round to nearest via the 1.5·2^23 trick (vectorizes, unlike `f32::round`)
    const MAGIC: f32 = 12_582_912.0;
    let y = x * std::f32::consts::LOG2_E + MAGIC;
    let n = y - MAGIC;
    // The integer n read from y's mantissa (y ∈ [2^23, 2^24): ulp 1), not with `n as i32`,
    // whose saturating conversion kept the loop from vectorizing.
    let ni = (y.to_bits() as i32).wrapping_sub(MAGIC.to_bits() as i32);
    let r = x - n * 0.693_145_75 - n * 1.428_606_8e-6;
    let p = 1.0
        + r * (1.0
            + r * (0.5
                + r * (0.166_666_67
                    + r * (0.041_666_66 + r * (0.008_333_452 + r * 0.001_388_89)))));
    let bits = (ni.wrapping_add(127) as u32) << 23;
    p * f32::from_bits(bits)
}

dispatch! {
    /// `dst[i] = ELU(src[i])` (alpha 1) over slices, vectorized; differs from `expm1` by at
    /// most ~2e-7 absolute.
    pub fn elu_into / elu_into_portable / elu_into_avx2(src: &[f32], dst: &mut [f32]) {
        for (d, &x) in dst.iter_mut().zip(src) {
            let e = exp_nonpos(x.min(0.0)) - 1.0;
            *d = if x > 0.0 { x } else { e };
        }
    }
}

dispatch! {
    /// In-place exact (erf-based) GELU `0.5·x·(1 + erf(x/√2))`, vectorized: the same
    /// Chebyshev-fitted erfc as `kernels::ops::gelu_erf` (relative error < 1.2e-7), evaluated
    /// in f32 with [`exp_nonpos`] instead of a scalar f64 `exp` (~10× faster); differs from
    /// `ops::gelu_erf` by ~1e-7·max(1, |x|).
    pub fn gelu_erf / gelu_erf_portable / gelu_erf_avx2(x: &mut [f32]) {
        for v in x.iter_mut() {
            let a = *v;
            let z = a.abs() * std::f32::consts::FRAC_1_SQRT_2;
            let t = 1.0 / fma!(0.5, z, 1.0);
            let mut p = 0.170_872_77f32;
            p = fma!(p, t, -0.822_152_23);
            p = fma!(p, t, 1.4885159);
            p = fma!(p, t, -1.135204);
            p = fma!(p, t, 0.278_868_07);
            p = fma!(p, t, -0.186_288_06);
            p = fma!(p, t, 0.096_784_18);
            p = fma!(p, t, 0.374_091_96);
            p = fma!(p, t, 1.0000237);
            p = fma!(p, t, -1.2655122);
            // exp argument −z² + p(t) ≤ ~1e-8 (p(1) ≈ 0 at z = 0): clamp to the ≤ 0 domain.
            let r = t * exp_nonpos(fma!(-z, z, p).min(0.0));
            let erf = if a >= 0.0 { 1.0 - r } else { r - 1.0 };
            *v = 0.5 * a * (1.0 + erf);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The AVX-512 clones compute the same per-lane FMAs as the AVX2 ones: bitwise equal.
    #[test]
    fn avx512_clones_equal_avx2_clones() {
        let src: Vec<f32> = (0..5003).map(|i| (i as f32 - 2500.0) / 300.0).collect();
        let run = |on: bool| {
            kernels::set_avx512_allowed(on);
            let mut e = vec![0.0; src.len()];
            elu_into(&src, &mut e);
            let mut g = src.clone();
            gelu_erf(&mut g);
            (e, g)
        };
        let (a, b) = (run(true), run(false));
        kernels::set_avx512_allowed(true);
        for (x, y) in a.0.iter().chain(&a.1).zip(b.0.iter().chain(&b.1)) {
            assert_eq!(x.to_bits(), y.to_bits());
        }
    }

    #[test]
    fn fast_gelu_close_to_kernels_gelu() {
        let src: Vec<f32> = (0..40001).map(|i| (i as f32 - 20000.0) / 2000.0).collect();
        let mut want = src.clone();
        kernels::ops::gelu_erf(&mut want);
        let mut got = src.clone();
        gelu_erf(&mut got);
        let mut got2 = src.clone();
        gelu_erf_portable(&mut got2);
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
            assert!((y - elu(x)).abs() < 3e-7, "{x}: {y} vs {}", elu(x));
        }
        let mut d2 = vec![0.0; src.len()];
        elu_into_portable(&src, &mut d2);
        assert!(dst.iter().zip(&d2).all(|(a, b)| (a - b).abs() < 3e-7));
    }
}
