//! Row ops of the NEON tables: dot products and `axpy` (f32 and bf16), the activation
//! quantizer (bitwise equal to the portable one) and the pointwise activations (the portable
//! bodies with fused multiply-adds).
#![allow(clippy::needless_range_loop)]

use std::arch::aarch64::*;

use super::matvec::bf16x4_to_f32;
use crate::arch::scalar::{elu_body, gelu_erf_body, tree16};
use crate::layout::{ActRowOut, QK};

/// 4 elements of `p` as f32 (bf16 bits widened when `BF16`).
#[inline(always)]
unsafe fn load4<const BF16: bool>(p: *const u8, i: usize) -> float32x4_t {
    if BF16 {
        bf16x4_to_f32(vld1_u16((p as *const u16).add(i)))
    } else {
        vld1q_f32((p as *const f32).add(i))
    }
}

/// One element of `p` as f32.
#[inline(always)]
unsafe fn load1<const BF16: bool>(p: *const u8, i: usize) -> f32 {
    if BF16 {
        half::bf16::from_bits(*(p as *const u16).add(i)).to_f32()
    } else {
        *(p as *const f32).add(i)
    }
}

/// `Σ a·b` over `n` values, `b` f32 or bf16 (two f32x4 accumulators, then the tail).
#[inline(always)]
pub(super) unsafe fn dot_any<const BF16: bool>(a: *const f32, b: *const u8, n: usize) -> f32 {
    let (mut s0, mut s1) = (vdupq_n_f32(0.0), vdupq_n_f32(0.0));
    let mut i = 0;
    while i + 8 <= n {
        s0 = vfmaq_f32(s0, vld1q_f32(a.add(i)), load4::<BF16>(b, i));
        s1 = vfmaq_f32(s1, vld1q_f32(a.add(i + 4)), load4::<BF16>(b, i + 4));
        i += 8;
    }
    let mut s = vaddvq_f32(vaddq_f32(s0, s1));
    while i < n {
        s = (*a.add(i)).mul_add(load1::<BF16>(b, i), s);
        i += 1;
    }
    s
}

/// `y += a·x` over `y.len()` values, `x` f32 or bf16 (one FMA per element, like the reference).
#[inline(always)]
pub(super) unsafe fn axpy_any<const BF16: bool>(y: &mut [f32], a: f32, x: *const u8) {
    let (n, yp) = (y.len(), y.as_mut_ptr());
    let mut i = 0;
    while i + 4 <= n {
        vst1q_f32(
            yp.add(i),
            vfmaq_n_f32(vld1q_f32(yp.add(i)), load4::<BF16>(x, i), a),
        );
        i += 4;
    }
    while i < n {
        *yp.add(i) = a.mul_add(load1::<BF16>(x, i), *yp.add(i));
        i += 1;
    }
}

/// Dot product (NEON).
///
/// # Safety
/// `b` at least as long as `a`.
pub(super) unsafe fn dot(a: &[f32], b: &[f32]) -> f32 {
    dot_any::<false>(a.as_ptr(), b.as_ptr() as *const u8, a.len())
}

/// Dot product with bf16 bits (NEON).
///
/// # Safety
/// `b` at least as long as `a`.
pub(super) unsafe fn dot_bf16(a: &[f32], b: &[u16]) -> f32 {
    dot_any::<true>(a.as_ptr(), b.as_ptr() as *const u8, a.len())
}

/// `y += a·x` (NEON; bitwise equal to the reference).
///
/// # Safety
/// `x` at least as long as `y`.
pub(super) unsafe fn axpy(y: &mut [f32], a: f32, x: &[f32]) {
    axpy_any::<false>(y, a, x.as_ptr() as *const u8)
}

/// `y += a·x` with bf16 bits (NEON; bitwise equal to the reference).
///
/// # Safety
/// `x` at least as long as `y`.
pub(super) unsafe fn axpy_bf16(y: &mut [f32], a: f32, x: &[u16]) {
    axpy_any::<true>(y, a, x.as_ptr() as *const u8)
}

/// The activation quantizer with NEON: the same codes (`fcvtas` rounds half away from zero
/// like the reference), scales and block sums (same pairwise order), bit for bit.
///
/// # Safety
/// `q` holds `x.len()` codes; `d`, `s`, `qs` one value per block of 32.
pub(super) unsafe fn quantize_act(x: &[f32], out: ActRowOut<'_>) {
    let ActRowOut { q, d, s, qs } = out;
    let lim = vdupq_n_f32(127.0);
    let nlim = vdupq_n_f32(-127.0);
    for b in 0..x.len() / QK {
        let p = x.as_ptr().add(b * QK);
        let mut v = [vdupq_n_f32(0.0); 8];
        for k in 0..8 {
            v[k] = vld1q_f32(p.add(4 * k));
        }
        let mut m = vabsq_f32(v[0]);
        for k in 1..8 {
            m = vmaxq_f32(m, vabsq_f32(v[k]));
        }
        let amax = vmaxvq_f32(m);
        let mut l = [0f32; 16];
        for k in 0..4 {
            vst1q_f32(l.as_mut_ptr().add(4 * k), vaddq_f32(v[k], v[k + 4]));
        }
        let db = amax / 127.0;
        let id = if db > 0.0 { 1.0 / db } else { 0.0 };
        let mut c = [vdupq_n_s32(0); 8];
        let mut csum = vdupq_n_s32(0);
        for k in 0..8 {
            let t = vminq_f32(vmaxq_f32(vmulq_n_f32(v[k], id), nlim), lim);
            c[k] = vcvtaq_s32_f32(t);
            csum = vaddq_s32(csum, c[k]);
        }
        let h = [
            vcombine_s16(vmovn_s32(c[0]), vmovn_s32(c[1])),
            vcombine_s16(vmovn_s32(c[2]), vmovn_s32(c[3])),
            vcombine_s16(vmovn_s32(c[4]), vmovn_s32(c[5])),
            vcombine_s16(vmovn_s32(c[6]), vmovn_s32(c[7])),
        ];
        let qp = q.as_mut_ptr().add(b * QK);
        vst1q_s8(qp, vcombine_s8(vmovn_s16(h[0]), vmovn_s16(h[1])));
        vst1q_s8(qp.add(16), vcombine_s8(vmovn_s16(h[2]), vmovn_s16(h[3])));
        *d.get_unchecked_mut(b) = db;
        *s.get_unchecked_mut(b) = tree16(&mut l);
        *qs.get_unchecked_mut(b) = vaddvq_s32(csum);
    }
}

/// GELU(erf) with fused multiply-adds (within the documented bound of the f64 definition).
///
/// # Safety
/// None beyond NEON (baseline on aarch64).
pub(super) unsafe fn gelu_erf(x: &mut [f32]) {
    gelu_erf_body::<true>(x)
}

/// ELU (alpha 1).
///
/// # Safety
/// None beyond NEON (baseline on aarch64).
pub(super) unsafe fn elu(src: &[f32], dst: &mut [f32]) {
    elu_body(src, dst)
}
