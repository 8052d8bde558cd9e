//! x86_64 kernels: AVX2 + FMA + F16C, AVX-VNNI and AVX-512 (F, BW, DQ, VL, VNNI), and the
//! tables that group them. Every function here assumes its table was selected for this CPU.

use std::arch::x86_64::*;

use super::table::{Features, Kernels};

mod attention;
mod dense512;
mod gemm;
mod matvec;
pub(crate) mod ops;

/// Fills the x86 flags of [`Features`] from CPUID.
pub(super) fn probe(f: &mut Features) {
    f.avx2 = is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c");
    f.avx512 = is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512dq")
        && is_x86_feature_detected!("avx512vl")
        && is_x86_feature_detected!("avx512vnni");
    f.avxvnni = is_x86_feature_detected!("avxvnni");
}

/// Horizontal sum of 8 lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn hsum(v: __m256) -> f32 {
    let lo = _mm256_castps256_ps128(v);
    let hi = _mm256_extractf128_ps::<1>(v);
    let s = _mm_add_ps(lo, hi);
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

/// Prefetch distance (bytes) of a dense kernel reading `block` weight rows of `row_bytes` side
/// by side, each row a stream of its own; 0 when software prefetch is off.
///
/// Half the streaming distance ahead in the same row is right for long rows. In a block of short
/// rows that distance runs into the next row, whose own stream is reading there already, so every
/// prefetch would be wasted: there each stream fetches its twin row of the next block instead (all
/// of those lines are read next, one block later). Blocks up to 16 KiB are treated so (the current
/// and the next block then fit in L1 together). Measured on Mimi's transformer linears, most of
/// whose weights lie in 512-column rows (`docs/bench-log.md`): ~25 % less time at 8 activation rows
/// and ~10 % less at 2 than with the in-row distance.
#[inline(always)]
pub(crate) fn dense_prefetch_distance(row_bytes: usize, block: usize) -> usize {
    let pf = crate::arch::table::PREFETCH.load(std::sync::atomic::Ordering::Relaxed) / 2;
    let twin = crate::arch::table::SHORT_ROW_TWIN.load(std::sync::atomic::Ordering::Relaxed);
    if pf == 0 || !twin || block * row_bytes > 16 * 1024 {
        pf
    } else {
        block * row_bytes
    }
}

/// Prefetches `lines` cache lines from `pf` bytes past `p` into L1; nothing when `pf` is 0
/// (software prefetch off). The address may lie past the end of the stream.
#[inline(always)]
pub(crate) fn prefetch_lines(p: *const u8, pf: usize, lines: usize) {
    if pf > 0 {
        for l in 0..lines {
            // SAFETY: a prefetch never faults, whatever the address.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(pf + 64 * l) as *const i8) };
        }
    }
}

/// AVX2 + FMA + F16C.
pub(crate) static AVX2: Kernels = AVX2_BASE;

const AVX2_BASE: Kernels = Kernels {
    dense_f32: matvec::dense_f32,
    dense_bf16: matvec::dense_bf16,
    dense_f16: matvec::dense_f16,
    quant: matvec::plain::quant,
    quantize_act: super::scalar::quantize_act_row,
    attend_head: attention::avx2::attend_head,
    gemm_tile: gemm::kernel_avx2,
    gemm_skinny: gemm::skinny_avx2,
    gemm_wide: None,
    dot: ops::dot_avx2,
    dot_bf16: ops::dot_bf16_avx2,
    axpy: ops::axpy_avx2,
    axpy_bf16: ops::axpy_bf16_avx2,
    to_bf16: ops::rows_avx2::to_bf16,
    gelu_erf: ops::gelu_erf_avx2,
    elu: ops::elu_avx2,
    rms_norm: ops::rows_avx2::rms_norm,
    layer_norm: ops::rows_avx2::layer_norm,
    rope: ops::rows_avx2::rope,
    softmax: ops::rows_avx2::softmax,
    silu_gate: ops::rows_avx2::silu_gate,
};

/// AVX2 with AVX-VNNI quantized kernels.
pub(crate) static AVX2_VNNI: Kernels = Kernels {
    quant: matvec::vnni::quant,
    ..AVX2_BASE
};

/// AVX-512 (plain AVX2 kernels for a lone tile).
pub(crate) static AVX512: Kernels = AVX512_BASE;

const AVX512_BASE: Kernels = Kernels {
    dense_f32: dense512::dense_f32,
    quant: matvec::avx512q::quant::<false>,
    quantize_act: ops::quantize_act_avx512,
    attend_head: attention::avx512::attend_head,
    gemm_wide: Some(gemm::blocks),
    to_bf16: ops::rows_avx512::to_bf16,
    gelu_erf: ops::gelu_erf_avx512,
    elu: ops::elu_avx512,
    rms_norm: ops::rows_avx512::rms_norm,
    layer_norm: ops::rows_avx512::layer_norm,
    rope: ops::rows_avx512::rope,
    softmax: ops::rows_avx512::softmax,
    silu_gate: ops::rows_avx512::silu_gate,
    ..AVX2_BASE
};

/// AVX-512 with AVX-VNNI kernels for a lone tile.
pub(crate) static AVX512_VNNI: Kernels = Kernels {
    quant: matvec::avx512q::quant::<true>,
    ..AVX512_BASE
};
