//! GEMM micro-kernels of the convolutions for NEON: the same FMA chain per output as the
//! portable kernels (k ascending), so results are bitwise equal to them.
#![allow(clippy::needless_range_loop)]

use std::arch::aarch64::*;

use crate::arch::table::SKINNY;
use crate::layout::{MR, NR};

/// The `MR × NR` (6 × 16) tile: 24 f32x4 accumulators.
///
/// # Safety
/// `a` holds `k·MR` floats, `b` holds `k·NR`.
pub(super) unsafe fn tile(k: usize, a: &[f32], b: &[f32], tile: &mut [[f32; NR]; MR]) {
    assert!(a.len() >= k * MR && b.len() >= k * NR);
    let mut c = [[vdupq_n_f32(0.0); NR / 4]; MR];
    let (mut ap, mut bp) = (a.as_ptr(), b.as_ptr());
    for _ in 0..k {
        let bv = [
            vld1q_f32(bp),
            vld1q_f32(bp.add(4)),
            vld1q_f32(bp.add(8)),
            vld1q_f32(bp.add(12)),
        ];
        for r in 0..MR {
            let av = *ap.add(r);
            for j in 0..NR / 4 {
                c[r][j] = vfmaq_n_f32(c[r][j], bv[j], av);
            }
        }
        ap = ap.add(MR);
        bp = bp.add(NR);
    }
    for r in 0..MR {
        for j in 0..NR / 4 {
            vst1q_f32(tile[r].as_mut_ptr().add(4 * j), c[r][j]);
        }
    }
}

/// The skinny kernel (outputs at most [`SKINNY`] = 4 wide): one f32x4 accumulator per row.
///
/// # Safety
/// `a` holds `k·MR` floats, `bt` holds `k·SKINNY`.
pub(super) unsafe fn skinny(k: usize, a: &[f32], bt: &[f32], tile: &mut [[f32; SKINNY]; MR]) {
    assert!(a.len() >= k * MR && bt.len() >= k * SKINNY);
    let mut c = [vdupq_n_f32(0.0); MR];
    for p in 0..k {
        let bv = vld1q_f32(bt.as_ptr().add(p * SKINNY));
        for r in 0..MR {
            c[r] = vfmaq_n_f32(c[r], bv, *a.get_unchecked(p * MR + r));
        }
    }
    for r in 0..MR {
        vst1q_f32(tile[r].as_mut_ptr(), c[r]);
    }
}
