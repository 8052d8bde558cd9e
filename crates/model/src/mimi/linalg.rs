//! Dense f32 helpers used by the Mimi codec: a small GEMM for the convolutions, a
//! multi-row linear for the transformers, and the pointwise ops Mimi needs.
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

/// Generates a portable function and, on x86_64, an AVX2+FMA clone plus a dispatcher.
/// Inside the body, `fma!(a, b, c)` computes `a * b + c` (fused in the AVX2 clone).
macro_rules! dispatch {
    (
        $(#[$meta:meta])*
        $vis:vis fn $name:ident / $portable:ident / $avx:ident ($($arg:ident : $ty:ty),* $(,)?) $body:block
    ) => {
        #[allow(clippy::too_many_arguments)]
        #[inline(always)]
        fn $portable($($arg: $ty),*) {
            #[allow(unused_macros)]
            macro_rules! fma { ($a:expr, $b:expr, $c:expr) => { $a * $b + $c }; }
            $body
        }

        #[cfg(target_arch = "x86_64")]
        #[allow(clippy::too_many_arguments)]
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
                if has_avx2_fma() {
                    // SAFETY: the CPU supports AVX2 and FMA (checked above).
                    return unsafe { $avx($($arg),*) };
                }
            }
            $portable($($arg),*)
        }
    };
}

const MR: usize = 4;
const NR: usize = 16;

dispatch! {
    /// `c[m, n] = a[m, k] · b[k, n]` (row-major, `c` overwritten). When `bias` is given,
    /// `c[i, :] += bias[i]` first. `ldb` is the row stride of `b` (≥ n).
    pub fn gemm / gemm_portable / gemm_avx2(
        m: usize, n: usize, k: usize,
        a: &[f32], b: &[f32], ldb: usize, c: &mut [f32], bias: Option<&[f32]>,
    ) {
        assert!(a.len() >= m * k && c.len() >= m * n);
        assert!(k == 0 || b.len() >= (k - 1) * ldb + n);
        let mut i0 = 0;
        while i0 < m {
            let mr = MR.min(m - i0);
            let mut j0 = 0;
            while j0 < n {
                let nr = NR.min(n - j0);
                let mut acc = [[0f32; NR]; MR];
                for (r, row) in acc.iter_mut().enumerate().take(mr) {
                    let bv = bias.map_or(0.0, |b| b[i0 + r]);
                    *row = [bv; NR];
                }
                if mr == MR && nr == NR {
                    let a0 = &a[i0 * k..(i0 + 1) * k];
                    let a1 = &a[(i0 + 1) * k..(i0 + 2) * k];
                    let a2 = &a[(i0 + 2) * k..(i0 + 3) * k];
                    let a3 = &a[(i0 + 3) * k..(i0 + 4) * k];
                    for p in 0..k {
                        let brow: &[f32; NR] = b[p * ldb + j0..p * ldb + j0 + NR].try_into().unwrap();
                        let (x0, x1, x2, x3) = (a0[p], a1[p], a2[p], a3[p]);
                        for q in 0..NR {
                            acc[0][q] = fma!(x0, brow[q], acc[0][q]);
                            acc[1][q] = fma!(x1, brow[q], acc[1][q]);
                            acc[2][q] = fma!(x2, brow[q], acc[2][q]);
                            acc[3][q] = fma!(x3, brow[q], acc[3][q]);
                        }
                    }
                } else {
                    for p in 0..k {
                        let brow = &b[p * ldb + j0..p * ldb + j0 + nr];
                        for (r, row) in acc.iter_mut().enumerate().take(mr) {
                            let x = a[(i0 + r) * k + p];
                            for (acc_q, &bq) in row.iter_mut().zip(brow) {
                                *acc_q = fma!(x, bq, *acc_q);
                            }
                        }
                    }
                }
                for (r, row) in acc.iter().enumerate().take(mr) {
                    c[(i0 + r) * n + j0..(i0 + r) * n + j0 + nr].copy_from_slice(&row[..nr]);
                }
                j0 += NR;
            }
            i0 += MR;
        }
    }
}

dispatch! {
    /// `y[t, o] = Σ_i x[t, i] · w[o, i]` for `t < n` (a linear layer without bias on `n`
    /// tokens; each weight row is read once for all tokens). `w` is `[rows, cols]`.
    pub fn linear / linear_portable / linear_avx2(
        rows: usize, cols: usize, w: &[f32], x: &[f32], n: usize, y: &mut [f32],
    ) {
        assert!(w.len() >= rows * cols && x.len() >= n * cols && y.len() >= n * rows);
        let mut t0 = 0;
        while t0 < n {
            let nt = 4.min(n - t0);
            for o in 0..rows {
                let wr = &w[o * cols..(o + 1) * cols];
                let mut acc = [[0f32; 8]; 4];
                let chunks = cols / 8;
                for ch in 0..chunks {
                    let wv: &[f32; 8] = wr[ch * 8..ch * 8 + 8].try_into().unwrap();
                    for (t, acc_t) in acc.iter_mut().enumerate().take(nt) {
                        let xs = &x[(t0 + t) * cols + ch * 8..(t0 + t) * cols + ch * 8 + 8];
                        for q in 0..8 {
                            acc_t[q] = fma!(wv[q], xs[q], acc_t[q]);
                        }
                    }
                }
                for (t, acc_t) in acc.iter().enumerate().take(nt) {
                    let mut s = acc_t.iter().sum::<f32>();
                    for i in chunks * 8..cols {
                        s = fma!(wr[i], x[(t0 + t) * cols + i], s);
                    }
                    y[(t0 + t) * rows + o] = s;
                }
            }
            t0 += nt;
        }
    }
}

/// Dot product (used by attention and the codebook search).
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    dot_dispatch(a, b)
}

fn dot_dispatch(a: &[f32], b: &[f32]) -> f32 {
    let mut out = 0f32;
    dot_into(a, b, &mut out);
    out
}

dispatch! {
    fn dot_into / dot_portable / dot_avx2(a: &[f32], b: &[f32], out: &mut f32) {
        let n = a.len().min(b.len());
        let mut acc = [0f32; 16];
        let chunks = n / 16;
        for ch in 0..chunks {
            let av: &[f32; 16] = a[ch * 16..ch * 16 + 16].try_into().unwrap();
            let bv: &[f32; 16] = b[ch * 16..ch * 16 + 16].try_into().unwrap();
            for q in 0..16 {
                acc[q] = fma!(av[q], bv[q], acc[q]);
            }
        }
        let mut s = acc.iter().sum::<f32>();
        for i in chunks * 16..n {
            s = fma!(a[i], b[i], s);
        }
        *out = s;
    }
}

dispatch! {
    /// `y += alpha · x`.
    pub fn axpy / axpy_portable / axpy_avx2(alpha: f32, x: &[f32], y: &mut [f32]) {
        for (yi, &xi) in y.iter_mut().zip(x) {
            *yi = fma!(alpha, xi, *yi);
        }
    }
}

/// ELU with alpha = 1 (PyTorch `nn.ELU()`): x if x > 0 else exp(x) − 1.
#[inline]
pub fn elu(x: f32) -> f32 {
    if x > 0.0 {
        x
    } else {
        x.exp_m1()
    }
}

/// Exact (erf) GELU, as PyTorch `F.gelu` with the default `approximate="none"`.
#[inline]
pub fn gelu_erf(x: f32) -> f32 {
    0.5 * x * (1.0 + erf(x / std::f32::consts::SQRT_2))
}

/// erf in f32 computed through f64 (accurate to well below f32 rounding).
fn erf(x: f32) -> f32 {
    erf_f64(x as f64) as f32
}

/// erf via the Abramowitz–Stegun 7.1.26-free approach: series for small |x|, continued
/// fraction (erfc) for large |x|; relative error < 1e-13 on the f32 range.
fn erf_f64(x: f64) -> f64 {
    let ax = x.abs();
    let r = if ax < 2.5 {
        // Maclaurin series: erf(x) = 2/√π Σ (−1)^n x^(2n+1) / (n! (2n+1))
        let x2 = ax * ax;
        let mut term = ax;
        let mut sum = ax;
        let mut n = 0.0f64;
        loop {
            n += 1.0;
            term *= -x2 / n;
            let add = term / (2.0 * n + 1.0);
            sum += add;
            if add.abs() < 1e-17 * sum.abs() {
                break;
            }
        }
        sum * std::f64::consts::FRAC_2_SQRT_PI
    } else if ax > 6.0 {
        1.0
    } else {
        // Continued fraction for erfc (Lentz), converges fast for x ≥ 2.5.
        let x2 = ax * ax;
        let tiny = 1e-300;
        let mut f = ax;
        let mut c = ax;
        let mut d = 0.0;
        for i in 1..200 {
            let an = i as f64 / 2.0;
            d = ax + an * d;
            d = if d.abs() < tiny { tiny } else { d };
            c = ax + an / c;
            c = if c.abs() < tiny { tiny } else { c };
            d = 1.0 / d;
            let delta = c * d;
            f *= delta;
            if (delta - 1.0).abs() < 1e-16 {
                break;
            }
        }
        1.0 - (-x2).exp() / (f * std::f64::consts::PI.sqrt())
    };
    if x < 0.0 {
        -r
    } else {
        r
    }
}

/// LayerNorm over one row (biased variance, like PyTorch), `out = (x − μ)/√(σ² + eps) · w + b`.
pub fn layer_norm(x: &[f32], w: &[f32], b: &[f32], eps: f32, out: &mut [f32]) {
    let n = x.len() as f32;
    let mean = x.iter().sum::<f32>() / n;
    let var = x.iter().map(|&v| (v - mean) * (v - mean)).sum::<f32>() / n;
    let inv = 1.0 / (var + eps).sqrt();
    for i in 0..x.len() {
        out[i] = (x[i] - mean) * inv * w[i] + b[i];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gemm_matches_naive() {
        let (m, n, k) = (7, 37, 13);
        let a: Vec<f32> = (0..m * k).map(|i| ((i * 7919) % 101) as f32 / 50.0 - 1.0).collect();
        let b: Vec<f32> = (0..k * (n + 3)).map(|i| ((i * 104729) % 97) as f32 / 48.0 - 1.0).collect();
        let bias: Vec<f32> = (0..m).map(|i| i as f32 * 0.1).collect();
        let mut c = vec![0f32; m * n];
        gemm(m, n, k, &a, &b, n + 3, &mut c, Some(&bias));
        for i in 0..m {
            for j in 0..n {
                let mut s = bias[i] as f64;
                for p in 0..k {
                    s += a[i * k + p] as f64 * b[p * (n + 3) + j] as f64;
                }
                assert!((c[i * n + j] as f64 - s).abs() < 1e-4, "{i} {j}");
            }
        }
    }

    #[test]
    fn linear_matches_naive() {
        let (rows, cols, n) = (9, 45, 6);
        let w: Vec<f32> = (0..rows * cols).map(|i| ((i * 31) % 17) as f32 / 8.0 - 1.0).collect();
        let x: Vec<f32> = (0..n * cols).map(|i| ((i * 13) % 11) as f32 / 5.0 - 1.0).collect();
        let mut y = vec![0f32; n * rows];
        linear(rows, cols, &w, &x, n, &mut y);
        for t in 0..n {
            for o in 0..rows {
                let s: f64 = (0..cols).map(|i| w[o * cols + i] as f64 * x[t * cols + i] as f64).sum();
                assert!((y[t * rows + o] as f64 - s).abs() < 1e-4);
            }
        }
    }

    #[test]
    fn erf_known_values() {
        // Values from the defining series evaluated independently (Wolfram tables).
        let cases = [(0.5, 0.520_499_877_813_046_5), (1.0, 0.842_700_792_949_714_9), (3.0, 0.999_977_909_503_001_4)];
        for (x, e) in cases {
            assert!((erf_f64(x) - e).abs() < 1e-12, "{x}");
            assert!((erf_f64(-x) + e).abs() < 1e-12);
        }
    }
}
