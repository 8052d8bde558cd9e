//! Portable kernels: the table used on CPUs without a SIMD set (and under
//! `MOSHI_KERNELS_SCALAR=1`), and the references the property tests compare every SIMD
//! kernel with.
#![allow(clippy::needless_range_loop, clippy::too_many_arguments)]

use half::{bf16, f16};

use super::table::{HeadQuery, Kernels, MatmulSpan, SKINNY};
use crate::layout::{Act, ActRowOut, QKind, QPacked, MR, NR, QK, TILE};

/// The portable table.
pub(crate) static SCALAR: Kernels = Kernels {
    dense_f32: dense::<f32, false>,
    dense_bf16: dense::<u16, true>,
    dense_f16: dense::<u16, false>,
    quant,
    quantize_act: quantize_act_row,
    attend_head,
    gemm_tile,
    gemm_skinny,
    gemm_wide: None,
    dot,
    dot_bf16,
    axpy,
    axpy_bf16,
    to_bf16,
    gelu_erf,
    elu,
    rms_norm,
    layer_norm,
    rope,
    softmax,
    silu_gate,
};

/// Dot product with 8 partial sums (FMA), then the tail; `conv` widens one weight.
#[inline]
pub(crate) fn dot_with<T: Copy>(a: &[T], b: &[f32], conv: impl Fn(T) -> f32) -> f32 {
    let mut acc = [0f32; 8];
    let mut ca = a.chunks_exact(8);
    let mut cb = b.chunks_exact(8);
    for (x, y) in (&mut ca).zip(&mut cb) {
        for k in 0..8 {
            acc[k] = conv(x[k]).mul_add(y[k], acc[k]);
        }
    }
    let mut s: f32 = acc.iter().sum();
    for (x, y) in ca.remainder().iter().zip(cb.remainder()) {
        s = conv(*x).mul_add(*y, s);
    }
    s
}

/// A weight element the dense kernels widen to f32 (`u16` holds bf16 bits when `BF16`, else
/// f16 bits).
pub(crate) trait Widen: Copy {
    fn widen<const BF16: bool>(self) -> f32;
}

impl Widen for f32 {
    #[inline(always)]
    fn widen<const BF16: bool>(self) -> f32 {
        self
    }
}

impl Widen for u16 {
    #[inline(always)]
    fn widen<const BF16: bool>(self) -> f32 {
        if BF16 {
            bf16::from_bits(self).to_f32()
        } else {
            f16::from_bits(self).to_f32()
        }
    }
}

/// Dense rows of `span`, one [`dot_with`] per output.
unsafe fn dense<T: Widen, const BF16: bool>(w: &[T], x: &[f32], span: MatmulSpan, y: *mut f32) {
    let cols = span.cols;
    for r in span.r0..span.r1 {
        for i in 0..span.n {
            let (wr, xi) = (&w[r * cols..(r + 1) * cols], &x[i * cols..(i + 1) * cols]);
            *y.add(i * span.rows + r) = dot_with(wr, xi, T::widen::<BF16>);
        }
    }
}

/// Quantized rows of `span` against 8-bit activations: per block the exact integer sum of
/// codes × activation codes, scaled by `scale · d`, plus `bias · Σx` (the reference of every
/// SIMD quantized kernel: same integer sums, same f32 accumulation order).
unsafe fn quant(q: &QPacked, act: &Act<'_>, span: MatmulSpan, y: *mut f32) {
    let (rows, cols, n) = (span.rows, span.cols, span.n);
    let nb = q.blocks;
    let mut codes = [0i8; QK];
    let mut acc = [0f32; 8];
    let mut corr = [0f32; 8];
    let mut i0 = 0;
    while i0 < n {
        let ni = 8.min(n - i0);
        for r in span.r0..span.r1 {
            let (t, ri) = (r / TILE, r % TILE);
            acc[..ni].fill(0.0);
            corr[..ni].fill(0.0);
            for b in 0..nb {
                q.decode_block(t, b, ri, &mut codes);
                let (s, bias) = q.scale_bias(t, b / q.group_blocks, ri);
                for ii in 0..ni {
                    let i = i0 + ii;
                    let xq = &act.q[i * cols + b * QK..i * cols + (b + 1) * QK];
                    let mut isum = 0i32;
                    for (&c, &xv) in codes.iter().zip(xq) {
                        isum += c as i32 * xv as i32;
                    }
                    if q.kind == QKind::Affine8 {
                        isum += 128 * act.qs[i * nb + b];
                    }
                    acc[ii] = (s * act.d[i * nb + b]).mul_add(isum as f32, acc[ii]);
                    corr[ii] = bias.mul_add(act.s[i * nb + b], corr[ii]);
                }
            }
            for ii in 0..ni {
                *y.add((i0 + ii) * rows + r) = acc[ii] + corr[ii];
            }
        }
        i0 += ni;
    }
}

/// Dequantizes the 32 weights of row `ri` of tile `t`, block `b`.
#[inline]
pub(crate) fn dequant_block(q: &QPacked, t: usize, b: usize, ri: usize, out: &mut [f32; QK]) {
    let mut codes = [0i8; QK];
    let (s, bias) = q.scale_bias(t, b / q.group_blocks, ri);
    q.decode_block(t, b, ri, &mut codes);
    for (o, &c) in out.iter_mut().zip(&codes) {
        let c = c as i32;
        *o = match q.kind {
            QKind::Q8Sym => s * c as f32,
            QKind::Q4Sym => s * (c - 8) as f32,
            QKind::Affine4 => s * c as f32 + bias,
            QKind::Affine8 => s * (c + 128) as f32 + bias,
        };
    }
}

/// Quantized rows of `span` against exact f32 activations (`MOSHI_KERNELS_F32_ACTIVATIONS`):
/// each block is dequantized and multiplied in f32, accumulated in column order with FMA.
///
/// # Safety
/// `x` holds `n·cols` values and `y` points to `n·rows` writable values.
pub(crate) unsafe fn quant_f32_act(q: &QPacked, x: &[f32], span: MatmulSpan, y: *mut f32) {
    let (rows, cols, n) = (span.rows, span.cols, span.n);
    let mut w = [0f32; QK];
    for r in span.r0..span.r1 {
        let (t, ri) = (r / TILE, r % TILE);
        for i in 0..n {
            *y.add(i * rows + r) = 0.0;
        }
        for b in 0..q.blocks {
            dequant_block(q, t, b, ri, &mut w);
            for i in 0..n {
                let xb = &x[i * cols + b * QK..i * cols + (b + 1) * QK];
                let o = &mut *y.add(i * rows + r);
                for (wv, xv) in w.iter().zip(xb) {
                    *o = wv.mul_add(*xv, *o);
                }
            }
        }
    }
}

/// Rounds half away from zero without a libm call (`|c| < 2^31`).
#[inline]
fn round_away(c: f32) -> i32 {
    let t = c as i32; // truncation toward zero
    let f = c - t as f32; // exact
    if f >= 0.5 {
        t + 1
    } else if f <= -0.5 {
        t - 1
    } else {
        t
    }
}

/// Sum of 32 values in a fixed pairwise order (lanes `i` and `i + 16`, then halves of 8,
/// 4, 2, 1), shared by the scalar and SIMD quantizers so their block sums are bitwise equal.
#[inline]
fn block_sum(xb: &[f32]) -> f32 {
    let mut l = [0f32; 16];
    for i in 0..16 {
        l[i] = xb[i] + xb[i + 16];
    }
    tree16(&mut l)
}

/// The pairwise tail of [`block_sum`] over 16 partial sums.
#[inline]
pub(crate) fn tree16(l: &mut [f32; 16]) -> f32 {
    let mut w = 8;
    while w > 0 {
        for i in 0..w {
            l[i] += l[i + w];
        }
        w /= 2;
    }
    l[0]
}

/// Quantizes one activation row to signed 8-bit blocks of 32 values into `out`. `x.len()`
/// must be a multiple of 32.
pub fn quantize_act_row(x: &[f32], out: ActRowOut<'_>) {
    let ActRowOut { q, d, s, qs } = out;
    debug_assert_eq!(x.len() % QK, 0);
    for (b, xb) in x.chunks_exact(QK).enumerate() {
        let mut amax = 0f32;
        for &v in xb {
            amax = amax.max(v.abs());
        }
        let sum = block_sum(xb);
        let db = amax / 127.0;
        let id = if db > 0.0 { 1.0 / db } else { 0.0 };
        let mut qsum = 0i32;
        for (o, &v) in q[b * QK..(b + 1) * QK].iter_mut().zip(xb) {
            let c = round_away((v * id).clamp(-127.0, 127.0)) as i8;
            *o = c;
            qsum += c as i32;
        }
        d[b] = db;
        s[b] = sum;
        qs[b] = qsum;
    }
}

/// No SIMD attention here: the caller runs the reference loop of `attention.rs` (also what
/// the x86 kernels answer for head sizes they do not take).
pub(crate) unsafe fn attend_head(
    _head: &HeadQuery<'_>,
    _scores: &mut [f32],
    _out: &mut [f32],
) -> bool {
    false
}

/// The `MR × NR` GEMM micro-kernel: one FMA chain per output over `k` in increasing order.
fn gemm_tile(k: usize, a: &[f32], b: &[f32], tile: &mut [[f32; NR]; MR]) {
    for p in 0..k {
        let bp = &b[p * NR..(p + 1) * NR];
        for r in 0..MR {
            let av = a[p * MR + r];
            for j in 0..NR {
                tile[r][j] = av.mul_add(bp[j], tile[r][j]);
            }
        }
    }
}

/// The skinny GEMM kernel (outputs at most [`SKINNY`] wide).
fn gemm_skinny(k: usize, a: &[f32], bt: &[f32], tile: &mut [[f32; SKINNY]; MR]) {
    for p in 0..k {
        for r in 0..MR {
            for j in 0..SKINNY {
                tile[r][j] = a[p * MR + r].mul_add(bt[p * SKINNY + j], tile[r][j]);
            }
        }
    }
}

/// Dot product (8 partial sums with FMA, then the tail).
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    dot_with(a, b, |v| v)
}

/// Dot product of f32 `a` with bf16 bits `b`, one FMA chain.
pub fn dot_bf16(a: &[f32], b: &[u16]) -> f32 {
    let mut s = 0f32;
    for (x, &y) in a.iter().zip(b) {
        s = x.mul_add(bf16::from_bits(y).to_f32(), s);
    }
    s
}

/// `y += a · x` with FMA.
pub fn axpy(y: &mut [f32], a: f32, x: &[f32]) {
    for (o, v) in y.iter_mut().zip(x) {
        *o = a.mul_add(*v, *o);
    }
}

/// `y += a · x` with `x` as bf16 bits.
pub fn axpy_bf16(y: &mut [f32], a: f32, x: &[u16]) {
    for (o, &v) in y.iter_mut().zip(x) {
        *o = a.mul_add(bf16::from_bits(v).to_f32(), *o);
    }
}

/// f32 → bf16 bits, rounded to nearest even, NaN truncated with its quiet bit set (bitwise
/// equal to `half::bf16::from_f32`, the reference of the tests); branch-free integer
/// operations, so it vectorizes.
#[inline(always)]
pub(crate) fn to_bf16_body(x: &[f32], out: &mut [u16]) {
    for (o, v) in out.iter_mut().zip(x) {
        let b = v.to_bits();
        let nan = b & 0x7fff_ffff > 0x7f80_0000;
        // Round to nearest even: add 0x7fff plus the lowest kept bit, keep the high half.
        let rounded = b.wrapping_add(0x7fff + ((b >> 16) & 1));
        *o = (if nan { b | 0x0040_0000 } else { rounded } >> 16) as u16;
    }
}

/// f32 → bf16 bits, rounded to nearest even, NaN kept with its quiet bit set (bitwise equal to
/// `half::bf16::from_f32`): the portable build of the body the SIMD sets share.
pub fn to_bf16(x: &[f32], out: &mut [u16]) {
    to_bf16_body(x, out)
}

/// `a · b + c`, fused when `FUSED` (the SIMD clones compile the same bodies with FMA).
#[inline(always)]
fn fma<const FUSED: bool>(a: f32, b: f32, c: f32) -> f32 {
    if FUSED {
        a.mul_add(b, c)
    } else {
        a * b + c
    }
}

/// exp(x) for x ≤ 0 (inputs below −87 give 0, NaN gives exp(−87)), branch-free so it
/// vectorizes: Cody–Waite range reduction and a degree-6 polynomial; relative error ≈ 2 ulp.
/// Every operation is a separately rounded IEEE one (Rust never contracts), so the NEON
/// version in `arch/aarch64/rows.rs` that performs the same operations is bitwise equal.
#[inline(always)]
pub(crate) fn exp_nonpos(x: f32) -> f32 {
    let low = x < -87.0;
    let x = x.max(-87.0);
    // Round to nearest via the 1.5·2^23 trick (vectorizes, unlike `f32::round`).
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
    let e = p * f32::from_bits(bits);
    if low {
        0.0
    } else {
        e
    }
}

/// In-place exact (erf-based) GELU `0.5·x·(1 + erf(x/√2))` with a Chebyshev-fitted erfc
/// (relative error < 1.2e-7) and [`exp_nonpos`]; written to vectorize.
#[inline(always)]
pub(crate) fn gelu_erf_body<const FUSED: bool>(x: &mut [f32]) {
    for v in x.iter_mut() {
        let a = *v;
        let z = a.abs() * std::f32::consts::FRAC_1_SQRT_2;
        let t = 1.0 / fma::<FUSED>(0.5, z, 1.0);
        let mut p = 0.170_872_77f32;
        p = fma::<FUSED>(p, t, -0.822_152_23);
        p = fma::<FUSED>(p, t, 1.4885159);
        p = fma::<FUSED>(p, t, -1.135204);
        p = fma::<FUSED>(p, t, 0.278_868_07);
        p = fma::<FUSED>(p, t, -0.186_288_06);
        p = fma::<FUSED>(p, t, 0.096_784_18);
        p = fma::<FUSED>(p, t, 0.374_091_96);
        p = fma::<FUSED>(p, t, 1.0000237);
        p = fma::<FUSED>(p, t, -1.2655122);
        // exp argument −z² + p(t) ≤ ~1e-8 (p(1) ≈ 0 at z = 0): clamp to the ≤ 0 domain.
        let r = t * exp_nonpos(fma::<FUSED>(-z, z, p).min(0.0));
        let erf = if a >= 0.0 { 1.0 - r } else { r - 1.0 };
        *v = 0.5 * a * (1.0 + erf);
    }
}

/// `dst[i] = ELU(src[i])` (alpha 1) with [`exp_nonpos`]; written to vectorize.
#[inline(always)]
pub(crate) fn elu_body(src: &[f32], dst: &mut [f32]) {
    for (d, &x) in dst.iter_mut().zip(src) {
        let e = exp_nonpos(x.min(0.0)) - 1.0;
        *d = if x > 0.0 { x } else { e };
    }
}

/// Portable [`gelu_erf_body`] (no FMA contraction).
pub fn gelu_erf(x: &mut [f32]) {
    gelu_erf_body::<false>(x)
}

/// Portable [`elu_body`].
pub fn elu(src: &[f32], dst: &mut [f32]) {
    elu_body(src, dst)
}

/// `Σ f(x[i])` with 8 partial sums (element `i` of every whole chunk of 8 into sum `i % 8`),
/// the partial sums added in lane order, then the tail in order: the one summation order
/// of the row ops, which every SIMD version reproduces lane for lane.
#[inline(always)]
pub(crate) fn sum8(x: &[f32], f: impl Fn(f32) -> f32) -> f32 {
    let mut acc = [0f32; 8];
    let mut it = x.chunks_exact(8);
    for c in &mut it {
        for k in 0..8 {
            acc[k] += f(c[k]);
        }
    }
    let mut s = acc[0];
    for a in &acc[1..] {
        s += a;
    }
    for &v in it.remainder() {
        s += f(v);
    }
    s
}

/// RMSNorm `out = x · (w / sqrt(mean(x²) + eps))`, grouped like moshi's
/// `x * (alpha * rsqrt(var))`; [`sum8`] order.
#[inline(always)]
pub(crate) fn rms_norm_body(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let ss = sum8(x, |v| v * v);
    let inv = 1.0 / (ss / x.len() as f32 + eps).sqrt();
    for ((o, &v), &g) in out.iter_mut().zip(x).zip(w) {
        *o = v * (g * inv);
    }
}

/// LayerNorm `out = (x − mean) · inv · w + b` with the biased variance; [`sum8`] order.
#[inline(always)]
pub(crate) fn layer_norm_body(x: &[f32], w: &[f32], b: &[f32], eps: f32, out: &mut [f32]) {
    let n = x.len() as f32;
    let mean = sum8(x, |v| v) / n;
    let var = sum8(x, |v| (v - mean) * (v - mean)) / n;
    let inv = 1.0 / (var + eps).sqrt();
    for (((o, &v), &g), &bb) in out.iter_mut().zip(x).zip(w).zip(b) {
        *o = (v - mean) * inv * g + bb;
    }
}

/// Rotates the interleaved pairs `i0 .. i0 + cos.len()` of every head (`head_dim` values) of
/// `x`: `(re, im) → (re·c − im·s, re·s + im·c)`.
#[inline(always)]
pub(crate) fn rope_body(x: &mut [f32], head_dim: usize, i0: usize, cos: &[f32], sin: &[f32]) {
    for head in x.chunks_exact_mut(head_dim) {
        let pairs = &mut head[2 * i0..2 * (i0 + cos.len())];
        for ((p, &c), &s) in pairs.chunks_exact_mut(2).zip(cos).zip(sin) {
            let (re, im) = (p[0], p[1]);
            p[0] = re * c - im * s;
            p[1] = re * s + im * c;
        }
    }
}

/// In-place softmax: max-subtracted [`exp_nonpos`], [`sum8`] order, times `1/sum`. An empty or
/// all `−∞` slice is left alone.
#[inline(always)]
pub(crate) fn softmax_body(x: &mut [f32]) {
    let mut acc = [f32::NEG_INFINITY; 8];
    let mut it = x.chunks_exact(8);
    for c in &mut it {
        for k in 0..8 {
            acc[k] = acc[k].max(c[k]);
        }
    }
    let m = acc
        .iter()
        .chain(it.remainder())
        .fold(f32::NEG_INFINITY, |a, &b| a.max(b));
    if m == f32::NEG_INFINITY {
        return;
    }
    for v in x.iter_mut() {
        *v = exp_nonpos(*v - m);
    }
    let inv = 1.0 / sum8(x, |v| v);
    for v in x.iter_mut() {
        *v *= inv;
    }
}

/// SiLU gating `u[i] = silu(g[i]) · g[h + i]` with `h = u.len()`: `sigmoid(a)` as
/// `1/(1+e)` or `e/(1+e)` with `e = exp(−|a|)` ([`exp_nonpos`]), so no exponent overflows.
#[inline(always)]
pub(crate) fn silu_gate_body(g: &[f32], u: &mut [f32]) {
    let n = u.len();
    let (a, b) = (&g[..n], &g[n..2 * n]);
    for i in 0..n {
        let e = exp_nonpos(-a[i].abs());
        let num = if a[i] >= 0.0 { 1.0 } else { e };
        u[i] = a[i] * (num / (1.0 + e)) * b[i];
    }
}

/// Portable [`rms_norm_body`].
pub fn rms_norm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    rms_norm_body(x, w, eps, out)
}

/// Portable [`layer_norm_body`].
pub fn layer_norm(x: &[f32], w: &[f32], b: &[f32], eps: f32, out: &mut [f32]) {
    layer_norm_body(x, w, b, eps, out)
}

/// Portable [`rope_body`].
pub fn rope(x: &mut [f32], head_dim: usize, i0: usize, cos: &[f32], sin: &[f32]) {
    rope_body(x, head_dim, i0, cos, sin)
}

/// Portable [`softmax_body`].
pub fn softmax(x: &mut [f32]) {
    softmax_body(x)
}

/// Portable [`silu_gate_body`].
pub fn silu_gate(g: &[f32], u: &mut [f32]) {
    silu_gate_body(g, u)
}
