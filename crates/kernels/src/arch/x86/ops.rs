//! Row ops of the x86 tables: dot products and `axpy` (AVX2), the activation quantizer
//! (AVX-512), and the pointwise activations, norms, RoPE, softmax, SiLU gating and f32 → bf16
//! conversion (the portable bodies of `arch/scalar.rs` compiled with AVX2+FMA or AVX-512
//! enabled).
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;

use crate::arch::scalar::{
    elu_body, gelu_erf_body, layer_norm_body, rms_norm_body, rope_body, silu_gate_body,
    softmax_body, to_bf16_body,
};
use crate::layout::{ActRowOut, QK};

/// `y += a·x` (AVX2).
///
/// # Safety
/// AVX2/FMA/F16C available; `x` at least as long as `y`.
pub(super) unsafe fn axpy_avx2(y: &mut [f32], a: f32, x: &[f32]) {
    axpy_either(y, a, x, None)
}

/// `y += a·x` with `x` as bf16 bits (AVX2).
///
/// # Safety
/// AVX2/FMA/F16C available; `x` at least as long as `y`.
pub(super) unsafe fn axpy_bf16_avx2(y: &mut [f32], a: f32, x: &[u16]) {
    axpy_either(y, a, &[], Some(x))
}

/// AVX2 `y += a·x` with `x` either f32 or bf16 bits.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn axpy_either(y: &mut [f32], a: f32, x: &[f32], xb: Option<&[u16]>) {
    let n = y.len();
    let av = _mm256_set1_ps(a);
    let yp = y.as_mut_ptr();
    let mut i = 0;
    match xb {
        None => {
            while i + 8 <= n {
                let v = _mm256_fmadd_ps(
                    av,
                    _mm256_loadu_ps(x.as_ptr().add(i)),
                    _mm256_loadu_ps(yp.add(i)),
                );
                _mm256_storeu_ps(yp.add(i), v);
                i += 8;
            }
            while i < n {
                *yp.add(i) = a.mul_add(x[i], *yp.add(i));
                i += 1;
            }
        }
        Some(b) => {
            while i + 8 <= n {
                let h = _mm_loadu_si128(b.as_ptr().add(i) as *const __m128i);
                let w = _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(h)));
                _mm256_storeu_ps(
                    yp.add(i),
                    _mm256_fmadd_ps(av, w, _mm256_loadu_ps(yp.add(i))),
                );
                i += 8;
            }
            while i < n {
                *yp.add(i) = a.mul_add(half::bf16::from_bits(b[i]).to_f32(), *yp.add(i));
                i += 1;
            }
        }
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn dot_avx2(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len();
    let (pa, pb) = (a.as_ptr(), b.as_ptr());
    let mut a0 = _mm256_setzero_ps();
    let mut a1 = _mm256_setzero_ps();
    let mut i = 0;
    while i + 16 <= n {
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(pa.add(i)), _mm256_loadu_ps(pb.add(i)), a0);
        a1 = _mm256_fmadd_ps(
            _mm256_loadu_ps(pa.add(i + 8)),
            _mm256_loadu_ps(pb.add(i + 8)),
            a1,
        );
        i += 16;
    }
    if i + 8 <= n {
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(pa.add(i)), _mm256_loadu_ps(pb.add(i)), a0);
        i += 8;
    }
    let mut s = super::hsum(_mm256_add_ps(a0, a1));
    while i < n {
        s = (*pa.add(i)).mul_add(*pb.add(i), s);
        i += 1;
    }
    s
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn dot_bf16_avx2(a: &[f32], b: &[u16]) -> f32 {
    let n = a.len();
    let mut acc = _mm256_setzero_ps();
    let mut i = 0;
    while i + 8 <= n {
        let h = _mm_loadu_si128(b.as_ptr().add(i) as *const __m128i);
        let w = _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(h)));
        acc = _mm256_fmadd_ps(_mm256_loadu_ps(a.as_ptr().add(i)), w, acc);
        i += 8;
    }
    let mut s = super::hsum(acc);
    while i < n {
        s = a[i].mul_add(half::bf16::from_bits(b[i]).to_f32(), s);
        i += 1;
    }
    s
}

#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")]
/// The activation quantizer with AVX-512 (same codes, scales and sums as the portable one,
/// bit for bit).
///
/// # Safety
/// AVX-512 F/BW/DQ/VL available; `q` holds `x.len()` codes, `d`, `s`, `qs` one value per block.
pub(super) unsafe fn quantize_act_avx512(x: &[f32], out: ActRowOut<'_>) {
    let ActRowOut { q, d, s, qs } = out;
    let nb = x.len() / QK;
    let abs_mask = _mm512_set1_epi32(0x7fff_ffff);
    let half = _mm512_set1_ps(0.5);
    let lim = _mm512_set1_ps(127.0);
    for b in 0..nb {
        let p = x.as_ptr().add(b * QK);
        let v0 = _mm512_loadu_ps(p);
        let v1 = _mm512_loadu_ps(p.add(16));
        let a0 = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(v0), abs_mask));
        let a1 = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(v1), abs_mask));
        let amax = _mm512_reduce_max_ps(_mm512_max_ps(a0, a1));
        let db = amax / 127.0;
        let id = if db > 0.0 { 1.0 / db } else { 0.0 };
        let idv = _mm512_set1_ps(id);
        let mut codes = [_mm_setzero_si128(); 2];
        let mut csum = _mm512_setzero_si512();
        for (k, v) in [v0, v1].into_iter().enumerate() {
            let c = _mm512_min_ps(
                _mm512_max_ps(
                    _mm512_mul_ps(v, idv),
                    _mm512_sub_ps(_mm512_setzero_ps(), lim),
                ),
                lim,
            );
            let t = _mm512_cvttps_epi32(c);
            let f = _mm512_sub_ps(c, _mm512_cvtepi32_ps(t));
            let up = _mm512_cmp_ps_mask::<_CMP_GE_OQ>(f, half);
            let dn = _mm512_cmp_ps_mask::<_CMP_LE_OQ>(f, _mm512_sub_ps(_mm512_setzero_ps(), half));
            let one = _mm512_set1_epi32(1);
            let t = _mm512_mask_add_epi32(t, up, t, one);
            let t = _mm512_mask_sub_epi32(t, dn, t, one);
            csum = _mm512_add_epi32(csum, t);
            codes[k] = _mm512_cvtepi32_epi8(t);
        }
        let qp = q.as_mut_ptr().add(b * QK) as *mut __m128i;
        _mm_storeu_si128(qp, codes[0]);
        _mm_storeu_si128(qp.add(1), codes[1]);
        *d.get_unchecked_mut(b) = db;
        let mut l = [0f32; 16];
        _mm512_storeu_ps(l.as_mut_ptr(), _mm512_add_ps(v0, v1));
        *s.get_unchecked_mut(b) = crate::arch::scalar::tree16(&mut l);
        *qs.get_unchecked_mut(b) = _mm512_reduce_add_epi32(csum);
    }
}

/// GELU(erf) compiled for AVX2 + FMA.
///
/// # Safety
/// AVX2 and FMA available.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn gelu_erf_avx2(x: &mut [f32]) {
    gelu_erf_body::<true>(x)
}

/// GELU(erf) compiled for AVX-512 (same per-lane FMAs as the AVX2 clone: bitwise equal).
///
/// # Safety
/// AVX-512 F/BW/DQ/VL, AVX2 and FMA available.
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma")]
pub(super) unsafe fn gelu_erf_avx512(x: &mut [f32]) {
    gelu_erf_body::<true>(x)
}

/// ELU compiled for AVX2 + FMA.
///
/// # Safety
/// AVX2 and FMA available.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn elu_avx2(src: &[f32], dst: &mut [f32]) {
    elu_body(src, dst)
}

/// ELU compiled for AVX-512.
///
/// # Safety
/// AVX-512 F/BW/DQ/VL, AVX2 and FMA available.
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma")]
pub(super) unsafe fn elu_avx512(src: &[f32], dst: &mut [f32]) {
    elu_body(src, dst)
}

/// The row ops of `arch/scalar.rs` compiled for one x86 level: `$feat` enabled, the same
/// IEEE operations in the same order (no contraction), so bitwise equal to the portable ones.
macro_rules! row_ops {
    ($module:ident, $feat:literal) => {
        pub(in crate::arch::x86) mod $module {
            use super::*;

            /// RMSNorm.
            ///
            /// # Safety
            /// The CPU has the features of this module.
            #[target_feature(enable = $feat)]
            pub(in crate::arch::x86) unsafe fn rms_norm(
                x: &[f32],
                w: &[f32],
                eps: f32,
                out: &mut [f32],
            ) {
                rms_norm_body(x, w, eps, out)
            }

            /// LayerNorm.
            ///
            /// # Safety
            /// The CPU has the features of this module.
            #[target_feature(enable = $feat)]
            pub(in crate::arch::x86) unsafe fn layer_norm(
                x: &[f32],
                w: &[f32],
                b: &[f32],
                eps: f32,
                out: &mut [f32],
            ) {
                layer_norm_body(x, w, b, eps, out)
            }

            /// RoPE rotation.
            ///
            /// # Safety
            /// The CPU has the features of this module.
            #[target_feature(enable = $feat)]
            pub(in crate::arch::x86) unsafe fn rope(
                x: &mut [f32],
                head_dim: usize,
                i0: usize,
                cos: &[f32],
                sin: &[f32],
            ) {
                rope_body(x, head_dim, i0, cos, sin)
            }

            /// Softmax.
            ///
            /// # Safety
            /// The CPU has the features of this module.
            #[target_feature(enable = $feat)]
            pub(in crate::arch::x86) unsafe fn softmax(x: &mut [f32]) {
                softmax_body(x)
            }

            /// SiLU gating.
            ///
            /// # Safety
            /// The CPU has the features of this module.
            #[target_feature(enable = $feat)]
            pub(in crate::arch::x86) unsafe fn silu_gate(g: &[f32], u: &mut [f32]) {
                silu_gate_body(g, u)
            }

            /// f32 → bf16.
            ///
            /// # Safety
            /// The CPU has the features of this module.
            #[target_feature(enable = $feat)]
            pub(in crate::arch::x86) unsafe fn to_bf16(x: &[f32], out: &mut [u16]) {
                to_bf16_body(x, out)
            }
        }
    };
}

row_ops!(rows_avx2, "avx2,fma");
row_ops!(rows_avx512, "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma");

#[cfg(feature = "bench")]
#[target_feature(enable = "avx2,fma,f16c")]
/// Sum of `v` with 8 accumulators (bandwidth probe).
///
/// # Safety
/// AVX2 available.
pub(crate) unsafe fn sum_f32_avx2(v: &[f32]) -> f32 {
    let mut a = [_mm256_setzero_ps(); 8];
    let n = v.len() / 64 * 64;
    let p = v.as_ptr();
    let mut i = 0;
    while i < n {
        for (k, ak) in a.iter_mut().enumerate() {
            *ak = _mm256_add_ps(*ak, _mm256_loadu_ps(p.add(i + 8 * k)));
        }
        i += 64;
    }
    let mut s = _mm256_setzero_ps();
    for ak in a {
        s = _mm256_add_ps(s, ak);
    }
    super::hsum(s)
}

#[cfg(feature = "bench")]
#[target_feature(enable = "avx2")]
/// Wrapping sum of `v` with 8 accumulators and software prefetch (bandwidth probe).
///
/// # Safety
/// AVX2 available.
pub(crate) unsafe fn sum_u64_avx2(v: &[u64]) -> u64 {
    let mut acc = [_mm256_setzero_si256(); 8];
    let blocks = v.len() / 32;
    let p = v.as_ptr() as *const __m256i;
    for i in 0..blocks {
        // Software prefetch 4 KiB ahead, like the streaming kernels (without it one core reads
        // ~20 % less on the development host, and the roofline would flatter the kernels).
        let b = p.add(i * 8) as *const i8;
        for l in 0..4 {
            _mm_prefetch::<_MM_HINT_T0>(b.wrapping_add(4096 + 64 * l));
        }
        for (k, a) in acc.iter_mut().enumerate() {
            // SAFETY: i * 8 + k < blocks * 8 = the number of whole 32-byte chunks of `v`.
            *a = _mm256_add_epi64(*a, unsafe { _mm256_loadu_si256(p.add(i * 8 + k)) });
        }
    }
    let mut s = acc[0];
    for a in &acc[1..] {
        s = _mm256_add_epi64(s, *a);
    }
    let mut lanes = [0u64; 4];
    // SAFETY: `lanes` holds 32 bytes.
    unsafe { _mm256_storeu_si256(lanes.as_mut_ptr() as *mut __m256i, s) };
    v[blocks * 32..]
        .iter()
        .chain(&lanes)
        .fold(0, |a, &b| a.wrapping_add(b))
}
