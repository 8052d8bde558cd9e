//! Attention of one head over the KV ring for the NEON tables: scores `q·k`, the softmax of
//! `rows.rs`, then `out += p·v` in entry order. Keys and values are f32 or bf16; bf16 keys go
//! through `bfmmla` (FEAT_BF16) when the table has it, else they are widened to f32.
//!
//! `bfmmla` multiplies bf16 by bf16, so the f32 query is split as `q ≈ hi + lo` (both bf16,
//! `|q − hi − lo| ≤ 2⁻¹⁸·|q|`): one instruction takes both halves against two keys, a 2×2
//! block `[hi·k₀, hi·k₁, lo·k₀, lo·k₁]` over 4 columns. FEAT_BF16 rounds its sums to odd
//! and flushes subnormals (FPCR ignored), so the scores are within
//! `(2⁻¹⁸ + (hd + 8)·2⁻²⁴)·Σ|q·k|` of exact f32 ones; values stay widened (exact).

use std::arch::aarch64::*;
use std::arch::asm;

use super::ops::{axpy_any, dot_any};
use super::rows::{bf16x4, softmax};
use crate::arch::table::HeadQuery;

/// Widest head the `bfmmla` path takes (its split query lives on the stack).
const MAX_HD: usize = 256;

/// Scores, softmax and `out = Σ p·v` of one head; `score(k)` is `q·k` for the key at `k`.
#[inline(always)]
unsafe fn attend_with(
    head: &HeadQuery<'_>,
    scores: &mut [f32],
    out: &mut [f32],
    fill_scores: impl FnOnce(&mut [f32]) -> usize,
) {
    let &HeadQuery { bf16, hd, .. } = head;
    let n = fill_scores(scores);
    softmax(&mut scores[..n]);
    out.fill(0.0);
    let es = if bf16 { 2 } else { 4 };
    let mut i = 0;
    for seg in &head.segs {
        for e in 0..seg.n {
            let v = seg.v.add(e * hd * es);
            if bf16 {
                axpy_any::<true>(out, scores[i], v);
            } else {
                axpy_any::<false>(out, scores[i], v);
            }
            i += 1;
        }
    }
}

/// Attention of one head (NEON, any head size). The keys are widened to f32 for the dot
/// products, except with `BFMMLA` (a CPU with FEAT_BF16) for bf16 keys of head sizes a
/// multiple of 8 up to [`MAX_HD`], scored by [`scores_bfmmla`].
///
/// # Safety
/// As [`crate::arch::table::HeadFn`]; with `BFMMLA`, the CPU has FEAT_BF16.
pub(super) unsafe fn attend_head<const BFMMLA: bool>(
    head: &HeadQuery<'_>,
    scores: &mut [f32],
    out: &mut [f32],
) -> bool {
    let &HeadQuery {
        bf16, hd, q, inv, ..
    } = head;
    if BFMMLA && bf16 && hd.is_multiple_of(8) && hd <= MAX_HD {
        attend_with(head, scores, out, |scores| scores_bfmmla(head, scores));
        return true;
    }
    attend_with(head, scores, out, |scores| {
        let es = if bf16 { 2 } else { 4 };
        let mut i = 0;
        for seg in &head.segs {
            for e in 0..seg.n {
                let k = seg.k.add(e * hd * es);
                let s = if bf16 {
                    dot_any::<true>(q.as_ptr(), k, hd)
                } else {
                    dot_any::<false>(q.as_ptr(), k, hd)
                };
                scores[i] = s * inv;
                i += 1;
            }
        }
        i
    });
    true
}

/// `acc += a · bᵀ` for `a`, `b` 2×4 bf16 (row-major, rows in the low and high halves),
/// `acc` 2×2 f32 row-major (`bfmmla`).
#[inline(always)]
unsafe fn bfmmla(acc: float32x4_t, a: uint16x8_t, b: uint16x8_t) -> float32x4_t {
    let mut acc = acc;
    asm!(
        "bfmmla {acc:v}.4s, {a:v}.8h, {b:v}.8h",
        acc = inout(vreg) acc,
        a = in(vreg) a,
        b = in(vreg) b,
        options(pure, nomem, nostack)
    );
    acc
}

/// The scores `q·k/√hd` of a head with bf16 keys (head size a multiple of 8 up to [`MAX_HD`])
/// through `bfmmla`, written to `scores`; returns their count.
///
/// # Safety
/// The CPU has FEAT_BF16; `head` as [`crate::arch::table::HeadFn`] says, with bf16 keys.
#[target_feature(enable = "bf16")]
unsafe fn scores_bfmmla(head: &HeadQuery<'_>, scores: &mut [f32]) -> usize {
    let &HeadQuery { hd, q, inv, .. } = head;
    // Chunk c of 4 columns: [hi(q[4c..4c+4]), lo(q[4c..4c+4])] (q − hi is exact in f32).
    let mut qv = [vdupq_n_u16(0); MAX_HD / 4];
    for (c, v) in qv[..hd / 4].iter_mut().enumerate() {
        let x = vld1q_f32(q.as_ptr().add(4 * c));
        let hi = bf16x4(vreinterpretq_u32_f32(x));
        let rest = vsubq_f32(x, vreinterpretq_f32_u32(vshll_n_u16::<16>(hi)));
        *v = vcombine_u16(hi, bf16x4(vreinterpretq_u32_f32(rest)));
    }
    let mut i = 0;
    for seg in &head.segs {
        let kp = seg.k as *const u16;
        let mut e = 0;
        while e < seg.n {
            // Two keys per pass; a lone last key is paired with itself.
            let e1 = (e + 1).min(seg.n - 1);
            let (ka, kb) = (kp.add(e * hd), kp.add(e1 * hd));
            let (mut a0, mut a1) = (vdupq_n_f32(0.0), vdupq_n_f32(0.0));
            let mut c = 0;
            while c < hd {
                let x = vreinterpretq_u64_u16(vld1q_u16(ka.add(c)));
                let y = vreinterpretq_u64_u16(vld1q_u16(kb.add(c)));
                let lo = vreinterpretq_u16_u64(vzip1q_u64(x, y));
                let hi = vreinterpretq_u16_u64(vzip2q_u64(x, y));
                a0 = bfmmla(a0, *qv.get_unchecked(c / 4), lo);
                a1 = bfmmla(a1, *qv.get_unchecked(c / 4 + 1), hi);
                c += 8;
            }
            let s = vaddq_f32(a0, a1);
            // [hi·k_a + lo·k_a, hi·k_b + lo·k_b]
            let pair = vadd_f32(vget_low_f32(s), vget_high_f32(s));
            scores[i] = vget_lane_f32::<0>(pair) * inv;
            if e1 > e {
                scores[i + 1] = vget_lane_f32::<1>(pair) * inv;
            }
            i += 1 + e1 - e;
            e += 2;
        }
    }
    i
}
