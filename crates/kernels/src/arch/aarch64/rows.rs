//! Row ops of the NEON tables: RMSNorm, LayerNorm, RoPE rotation, softmax, SiLU gating and the
//! f32 → bf16 conversion. Each performs the same IEEE operations as its portable body in
//! `arch/scalar.rs`, in the same order (the [`sum8`](crate::arch::scalar::sum8) lane
//! assignment for sums, separate multiplies and adds where the body has them), so every result
//! is bitwise equal to the portable one.

use std::arch::aarch64::*;

use crate::arch::scalar;

/// The 8 partial sums (lanes 0–3 in `a0`, 4–7 in `a1`) added in lane order, like `sum8`.
#[inline(always)]
unsafe fn lane_sum(a0: float32x4_t, a1: float32x4_t) -> f32 {
    let mut l = [0f32; 8];
    vst1q_f32(l.as_mut_ptr(), a0);
    vst1q_f32(l.as_mut_ptr().add(4), a1);
    let mut s = l[0];
    for v in &l[1..] {
        s += v;
    }
    s
}

/// `scalar::sum8(x, fs)` with `fv` the lane-wise version of `fs`.
#[inline(always)]
unsafe fn sum8(x: &[f32], fv: impl Fn(float32x4_t) -> float32x4_t, fs: impl Fn(f32) -> f32) -> f32 {
    let (n, p) = (x.len(), x.as_ptr());
    let (mut a0, mut a1) = (vdupq_n_f32(0.0), vdupq_n_f32(0.0));
    let mut i = 0;
    while i + 8 <= n {
        a0 = vaddq_f32(a0, fv(vld1q_f32(p.add(i))));
        a1 = vaddq_f32(a1, fv(vld1q_f32(p.add(i + 4))));
        i += 8;
    }
    let mut s = lane_sum(a0, a1);
    while i < n {
        s += fs(*p.add(i));
        i += 1;
    }
    s
}

/// `scalar::exp_nonpos` on 4 lanes, operation for operation (`fmaxnm` returns −87 for NaN
/// like `f32::max`).
#[inline(always)]
unsafe fn exp_nonpos(x: float32x4_t) -> float32x4_t {
    const MAGIC: f32 = 12_582_912.0;
    let low = vcltq_f32(x, vdupq_n_f32(-87.0));
    let x = vmaxnmq_f32(x, vdupq_n_f32(-87.0));
    let y = vaddq_f32(vmulq_n_f32(x, std::f32::consts::LOG2_E), vdupq_n_f32(MAGIC));
    let n = vsubq_f32(y, vdupq_n_f32(MAGIC));
    let ni = vsubq_s32(
        vreinterpretq_s32_f32(y),
        vdupq_n_s32(MAGIC.to_bits() as i32),
    );
    let r = vsubq_f32(
        vsubq_f32(x, vmulq_n_f32(n, 0.693_145_75)),
        vmulq_n_f32(n, 1.428_606_8e-6),
    );
    // Horner from the innermost coefficient, as in the portable body.
    let mut p = vmulq_n_f32(r, 0.001_388_89);
    for c in [0.008_333_452, 0.041_666_66, 0.166_666_67, 0.5, 1.0] {
        p = vmulq_f32(r, vaddq_f32(vdupq_n_f32(c), p));
    }
    let p = vaddq_f32(vdupq_n_f32(1.0), p);
    let bits = vshlq_n_u32::<23>(vreinterpretq_u32_s32(vaddq_s32(ni, vdupq_n_s32(127))));
    let e = vmulq_f32(p, vreinterpretq_f32_u32(bits));
    vbslq_f32(low, vdupq_n_f32(0.0), e)
}

/// RMSNorm (bitwise equal to the portable one).
///
/// # Safety
/// `w` and `out` at least as long as `x`.
pub(super) unsafe fn rms_norm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let ss = sum8(x, |v| vmulq_f32(v, v), |v| v * v);
    let inv = 1.0 / (ss / x.len() as f32 + eps).sqrt();
    let (n, xp, wp, op) = (x.len(), x.as_ptr(), w.as_ptr(), out.as_mut_ptr());
    let iv = vdupq_n_f32(inv);
    let mut i = 0;
    while i + 4 <= n {
        let g = vmulq_f32(vld1q_f32(wp.add(i)), iv);
        vst1q_f32(op.add(i), vmulq_f32(vld1q_f32(xp.add(i)), g));
        i += 4;
    }
    while i < n {
        *op.add(i) = *xp.add(i) * (*wp.add(i) * inv);
        i += 1;
    }
}

/// LayerNorm (bitwise equal to the portable one).
///
/// # Safety
/// `w`, `b` and `out` at least as long as `x`.
pub(super) unsafe fn layer_norm(x: &[f32], w: &[f32], b: &[f32], eps: f32, out: &mut [f32]) {
    let nf = x.len() as f32;
    let mean = sum8(x, |v| v, |v| v) / nf;
    let mv = vdupq_n_f32(mean);
    let var = sum8(
        x,
        |v| {
            let d = vsubq_f32(v, mv);
            vmulq_f32(d, d)
        },
        |v| (v - mean) * (v - mean),
    ) / nf;
    let inv = 1.0 / (var + eps).sqrt();
    let iv = vdupq_n_f32(inv);
    let (n, xp, wp, bp, op) = (
        x.len(),
        x.as_ptr(),
        w.as_ptr(),
        b.as_ptr(),
        out.as_mut_ptr(),
    );
    let mut i = 0;
    while i + 4 <= n {
        let c = vmulq_f32(vsubq_f32(vld1q_f32(xp.add(i)), mv), iv);
        let o = vaddq_f32(vmulq_f32(c, vld1q_f32(wp.add(i))), vld1q_f32(bp.add(i)));
        vst1q_f32(op.add(i), o);
        i += 4;
    }
    while i < n {
        *op.add(i) = (*xp.add(i) - mean) * inv * *wp.add(i) + *bp.add(i);
        i += 1;
    }
}

/// RoPE rotation of pairs `i0 .. i0 + cos.len()` of every head (`ld2`/`st2` de-interleave
/// 4 pairs at a time; bitwise equal to the portable one).
///
/// # Safety
/// `x` holds whole heads; `sin` as long as `cos`; `2·(i0 + cos.len()) ≤ head_dim`.
pub(super) unsafe fn rope(x: &mut [f32], head_dim: usize, i0: usize, cos: &[f32], sin: &[f32]) {
    let m = cos.len();
    let (cp, sp) = (cos.as_ptr(), sin.as_ptr());
    for head in x.chunks_exact_mut(head_dim) {
        let hp = head.as_mut_ptr().add(2 * i0);
        let mut j = 0;
        while j + 4 <= m {
            let v = vld2q_f32(hp.add(2 * j));
            let (c, s) = (vld1q_f32(cp.add(j)), vld1q_f32(sp.add(j)));
            let re = vsubq_f32(vmulq_f32(v.0, c), vmulq_f32(v.1, s));
            let im = vaddq_f32(vmulq_f32(v.0, s), vmulq_f32(v.1, c));
            vst2q_f32(hp.add(2 * j), float32x4x2_t(re, im));
            j += 4;
        }
        while j < m {
            let (re, im) = (*hp.add(2 * j), *hp.add(2 * j + 1));
            let (c, s) = (*cp.add(j), *sp.add(j));
            *hp.add(2 * j) = re * c - im * s;
            *hp.add(2 * j + 1) = re * s + im * c;
            j += 1;
        }
    }
}

/// Softmax (bitwise equal to the portable one: the same max, `exp`, lane sums and scaling).
///
/// # Safety
/// None beyond NEON (baseline on aarch64).
pub(super) unsafe fn softmax(x: &mut [f32]) {
    let (n, p) = (x.len(), x.as_mut_ptr());
    let ninf = vdupq_n_f32(f32::NEG_INFINITY);
    let (mut m0, mut m1) = (ninf, ninf);
    let mut i = 0;
    while i + 8 <= n {
        m0 = vmaxnmq_f32(m0, vld1q_f32(p.add(i)));
        m1 = vmaxnmq_f32(m1, vld1q_f32(p.add(i + 4)));
        i += 8;
    }
    // The maximum does not depend on the order (fmaxnm skips NaN like f32::max).
    let mut m = vmaxnmvq_f32(vmaxnmq_f32(m0, m1));
    while i < n {
        m = m.max(*p.add(i));
        i += 1;
    }
    if m == f32::NEG_INFINITY {
        return;
    }
    let mv = vdupq_n_f32(m);
    let (mut a0, mut a1) = (vdupq_n_f32(0.0), vdupq_n_f32(0.0));
    let mut i = 0;
    while i + 8 <= n {
        let e0 = exp_nonpos(vsubq_f32(vld1q_f32(p.add(i)), mv));
        let e1 = exp_nonpos(vsubq_f32(vld1q_f32(p.add(i + 4)), mv));
        vst1q_f32(p.add(i), e0);
        vst1q_f32(p.add(i + 4), e1);
        a0 = vaddq_f32(a0, e0);
        a1 = vaddq_f32(a1, e1);
        i += 8;
    }
    let mut sum = lane_sum(a0, a1);
    while i < n {
        let e = scalar::exp_nonpos(*p.add(i) - m);
        *p.add(i) = e;
        sum += e;
        i += 1;
    }
    let inv = 1.0 / sum;
    let mut i = 0;
    while i + 4 <= n {
        vst1q_f32(p.add(i), vmulq_n_f32(vld1q_f32(p.add(i)), inv));
        i += 4;
    }
    while i < n {
        *p.add(i) *= inv;
        i += 1;
    }
}

/// SiLU gating `u = silu(g[..h]) · g[h..2h]` (bitwise equal to the portable one).
///
/// # Safety
/// `g` holds `2·u.len()` values.
pub(super) unsafe fn silu_gate(g: &[f32], u: &mut [f32]) {
    let (n, ap, op) = (u.len(), g.as_ptr(), u.as_mut_ptr());
    let bp = ap.add(n);
    let one = vdupq_n_f32(1.0);
    let mut i = 0;
    while i + 4 <= n {
        let a = vld1q_f32(ap.add(i));
        let e = exp_nonpos(vnegq_f32(vabsq_f32(a)));
        let num = vbslq_f32(vcgeq_f32(a, vdupq_n_f32(0.0)), one, e);
        let sig = vdivq_f32(num, vaddq_f32(one, e));
        vst1q_f32(
            op.add(i),
            vmulq_f32(vmulq_f32(a, sig), vld1q_f32(bp.add(i))),
        );
        i += 4;
    }
    while i < n {
        let a = *ap.add(i);
        let e = scalar::exp_nonpos(-a.abs());
        let num = if a >= 0.0 { 1.0 } else { e };
        *op.add(i) = a * (num / (1.0 + e)) * *bp.add(i);
        i += 1;
    }
}

/// 4 f32 (as bits) → bf16 bits, rounded to nearest even, NaN truncated with the quiet bit set.
#[inline(always)]
pub(super) unsafe fn bf16x4(b: uint32x4_t) -> uint16x4_t {
    // Round to nearest even: add 0x7fff plus the lowest kept bit, keep the high half.
    let lsb = vandq_u32(vshrq_n_u32::<16>(b), vdupq_n_u32(1));
    let r = vaddq_u32(b, vaddq_u32(vdupq_n_u32(0x7fff), lsb));
    let nan = vcgtq_u32(
        vandq_u32(b, vdupq_n_u32(0x7fff_ffff)),
        vdupq_n_u32(0x7f80_0000),
    );
    vshrn_n_u32::<16>(vbslq_u32(nan, vorrq_u32(b, vdupq_n_u32(0x0040_0000)), r))
}

/// f32 → bf16 bits, rounded to nearest even, NaN kept quiet (bitwise equal to the portable
/// one, including infinities, subnormals and NaN payloads).
///
/// # Safety
/// `out` at least as long as `x`.
pub(super) unsafe fn to_bf16(x: &[f32], out: &mut [u16]) {
    let n = x.len();
    let (xp, op) = (x.as_ptr() as *const u32, out.as_mut_ptr());
    let mut i = 0;
    while i + 8 <= n {
        let mut h = [vdup_n_u16(0); 2];
        for (k, hk) in h.iter_mut().enumerate() {
            *hk = bf16x4(vld1q_u32(xp.add(i + 4 * k)));
        }
        vst1q_u16(op.add(i), vcombine_u16(h[0], h[1]));
        i += 8;
    }
    scalar::to_bf16(&x[i..], &mut out[i..n]);
}
