//! aarch64 kernels: baseline NEON for every table entry, `sdot` (dotprod) and `smmla` (i8mm)
//! quantized matmuls, `bfmmla` (bf16) attention over bf16 keys, chosen at run time from `is_aarch64_feature_detected!`. Nothing here is
//! Linux-specific (the same code builds for aarch64-apple-darwin).

use super::table::{Features, Kernels};

mod attention;
mod gemm;
mod matvec;
pub(crate) mod ops;
mod rows;

/// Fills the aarch64 flags of [`Features`].
pub(super) fn probe(f: &mut Features) {
    f.neon = std::arch::is_aarch64_feature_detected!("neon");
    f.dotprod = f.neon && std::arch::is_aarch64_feature_detected!("dotprod");
    f.i8mm = f.dotprod && std::arch::is_aarch64_feature_detected!("i8mm");
    f.bf16 = f.i8mm && std::arch::is_aarch64_feature_detected!("bf16");
}

const NEON_BASE: Kernels = Kernels {
    dense_f32: matvec::dense_f32,
    dense_bf16: matvec::dense_half::<true>,
    dense_f16: matvec::dense_half::<false>,
    quant: matvec::plain::quant,
    quantize_act: ops::quantize_act,
    attend_head: attention::attend_head::<false>,
    gemm_tile: gemm::tile,
    gemm_skinny: gemm::skinny,
    gemm_wide: None,
    dot: ops::dot,
    dot_bf16: ops::dot_bf16,
    axpy: ops::axpy,
    axpy_bf16: ops::axpy_bf16,
    to_bf16: rows::to_bf16,
    gelu_erf: ops::gelu_erf,
    elu: ops::elu,
    rms_norm: rows::rms_norm,
    layer_norm: rows::layer_norm,
    rope: rows::rope,
    softmax: rows::softmax,
    silu_gate: rows::silu_gate,
};

/// Baseline NEON (`smull` + pairwise adds in the quantized kernels).
pub(crate) static NEON: Kernels = NEON_BASE;

/// NEON with `sdot` quantized kernels.
pub(crate) static NEON_DOTPROD: Kernels = Kernels {
    quant: matvec::dotprod::quant,
    ..NEON_BASE
};

/// NEON with `smmla` quantized kernels (pairs of activation rows; `sdot` for a lone row).
pub(crate) static NEON_I8MM: Kernels = NEON_I8MM_BASE;

const NEON_I8MM_BASE: Kernels = Kernels {
    quant: matvec::quant_i8mm,
    ..NEON_BASE
};

/// [`NEON_I8MM`] with bf16-key attention through `bfmmla` (FEAT_BF16).
pub(crate) static NEON_I8MM_BF16: Kernels = Kernels {
    attend_head: attention::attend_head::<true>,
    ..NEON_I8MM_BASE
};
