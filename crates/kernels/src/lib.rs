//! SIMD math kernels and a persistent worker pool for moshi-native.
//!
//! This crate knows nothing about Moshi: it provides matrix-vector products over
//! several weight formats ([`Matrix`]), row-wise ops ([`ops`]), attention over a
//! ring-buffer KV cache ([`attention`]), causal convolutions ([`conv`]) and a small
//! persistent worker pool ([`Pool`]).
//!
//! # Kernel sets
//! Every hot kernel (dense and quantized matmul tiles, the activation quantizer, attention of
//! one head over the KV ring, the GEMM micro-kernels of the convolutions, GELU / ELU, dot /
//! axpy and the f32 → bf16 conversion) lives under `src/arch/` (`scalar`, `x86`, `aarch64`)
//! and is reached through one table per [`KernelSet`], chosen from the CPU's features, probed
//! once: AVX-512 (F/BW/DQ/VL + VNNI), AVX2 with AVX-VNNI, AVX2 + FMA + F16C, or the portable
//! scalar set (other CPUs, and the reference of every property test). [`kernel_set`] reports
//! the active one. Environment switches, read before the first kernel call:
//! `MOSHI_KERNELS_SCALAR=1` (portable kernels only), `MOSHI_KERNELS_NO_AVX512=1`,
//! `MOSHI_KERNELS_NO_VNNI=1`; [`set_avx512_allowed`] / [`set_vnni_allowed`] switch at run
//! time for A/B comparisons in one process. The AVX-512 set runs zmm `vpdpbusd` on pairs of
//! tiles, and its activation quantizer and bf16 KV conversion are bitwise equal to the AVX2 /
//! scalar ones; AVX-VNNI and plain AVX2 (`vpmaddubsw`) compute the same integer sums.
//!
//! # Quantized formats and activations
//! Quantized weights (GGUF Q8_0 / Q4_0, MLX affine 4/8-bit) are multiplied against
//! activations quantized once per call to signed 8-bit blocks of 32 values with one f32
//! scale (`d = max|x| / 127`, codes rounded half away from zero), like llama.cpp's q8_0
//! activation path. The additive parts (Q4_0's `-8·d` and MLX's per-group bias) are
//! applied to the exact f32 block sums of the activations, so only the multiplicative
//! part sees activation quantization. The relative error of a quantized dot product is
//! therefore about `0.5/127` of `Σ|w·x|` in the worst case (typically far less); dense
//! formats (f32, bf16, f16) are computed exactly in f32 (FMA, different summation order).
//!
//! # Exact f32 activations (reference mode)
//! `MOSHI_KERNELS_F32_ACTIVATIONS=1` (or [`set_f32_activations`]) makes the quantized
//! products skip activation quantization: each block of weights is dequantized and multiplied
//! by the f32 activations with FMA in column order (portable code, slow). The result then
//! equals the exact product of the dequantized weights ([`Matrix::row_f32`]) within
//! `1e-6 · Σ|w·x|` (f32 summation only; `tests/f32_activations.rs`). Parity tests use it to
//! separate weight quantization from activation quantization.
//!
//! # Tolerances (property tests, `tests/*_props.rs`)
//! * f32 / bf16 / f16 weights, SIMD vs scalar reference: `1e-5 · Σ|w·x|` (summation
//!   order only; bf16/f16 are widened exactly to f32).
//! * Quantized weights, SIMD (AVX2 and AVX-VNNI) vs scalar reference: `1e-5 · Σ|w·x|`
//!   (same integer block sums, same f32 accumulation order; AVX2 and VNNI are bitwise equal).
//! * Quantized weights vs the exact f32 product with the dequantized weights: the
//!   activation-quantization bound `Σ_blocks Σ|w − β| · max|x_block| / 254` plus rounding,
//!   where `β` is the block's additive constant (`−8d` for Q4_0, the group bias for MLX, 0
//!   for Q8_0): the kernels multiply activation codes by the stored code times the scale
//!   and add `β · Σx` from the exact activation sum.
//! * Convolutions (GEMM paths, threaded or not) vs direct loops: `1e-5 · in·k + 1e-6`.
//! * `dot`/`dot_bf16`: `1e-5 · Σ|a·b|`; `axpy`/`axpy_bf16`: bitwise equal.
//! * Attention (`KvRing::attend`, AVX-512 / AVX2 fused kernels) vs `attend_reference`:
//!   `2e-6 · (1 + S) · max|v| + 1e-6` per output, `S` the largest `Σ|q·k|/√d` in the window
//!   (score summation order and a polynomial `exp`).
//!
//! # Threads
//! [`Pool`] splits products by pairs of 8-row tiles (16 rows), attention by heads
//! ([`attention::KvRing::attend_pool`]) and convolutions by panels; everything else runs
//! on the calling thread. Nothing allocates after warm-up (`tests/no_alloc.rs`).
//!
//! # Weight layout
//! Weights are row-major `[rows = out, cols = in]` like a PyTorch `Linear.weight`.
//! Quantized formats are repacked at construction into tiles of 8 interleaved rows so
//! one activation block feeds 8 rows and 8 outputs are produced without horizontal sums;
//! tiles are stored in pairs so the AVX-512 kernels read 16 rows per zmm (one dword lane
//! per row), while the AVX2 kernels read one tile of a pair with a 64-byte stride.
//! The streaming kernels prefetch 4 KiB ahead in software ([`set_prefetch_distance`]).

#![warn(missing_docs)]

#[cfg(target_endian = "big")]
compile_error!("moshi-kernels assumes a little-endian target");

mod arch;
pub mod attention;
#[cfg(feature = "bench")]
pub mod bench;
pub mod conv;
mod gemm;
mod layout;
mod matrix;
mod mem;
pub mod ops;
mod pool;
pub mod quant;
mod storage;

pub use arch::{
    f32_activations, kernel_set, set_avx512_allowed, set_f32_activations, set_vnni_allowed,
    KernelSet,
};
pub use matrix::{CheckpointParts, Matrix, Scratch, WeightFormat};
pub use mem::{advise_huge_pages, huge_page_share, set_huge_pages_allowed};
pub use pool::Pool;

/// Software-prefetch distance in bytes of the streaming kernels (AVX-512 quantized matmul and
/// attention; the dense kernels use half of it, or one block of rows ahead where rows are short);
/// default 4096, 0 = off. For benchmarks (A/B).
#[doc(hidden)]
pub fn set_prefetch_distance(bytes: usize) {
    arch::PREFETCH.store(bytes, std::sync::atomic::Ordering::Relaxed);
}

/// Where the x86 dense kernels prefetch in blocks of short rows: the twin row of the next block
/// (`true`, the default) or half the distance ahead in the same row. For benchmarks (an A/B in
/// one process, `examples/dense_rows.rs`).
#[doc(hidden)]
pub fn set_short_row_prefetch(twin: bool) {
    arch::SHORT_ROW_TWIN.store(twin, std::sync::atomic::Ordering::Relaxed);
}
pub use storage::Storage;

/// Errors reported by constructors and validating calls of this crate.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KernelError {
    /// A buffer had the wrong number of bytes or elements.
    #[error("{what}: expected length {expected}, got {got}")]
    BadLength {
        /// Which buffer.
        what: &'static str,
        /// Expected length (bytes or elements, as described by `what`).
        expected: usize,
        /// Actual length.
        got: usize,
    },
    /// A shape or parameter is invalid (zero sizes, non-divisible dimensions, ...).
    #[error("invalid shape: {0}")]
    BadShape(String),
    /// A format or parameter combination is not supported.
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// A byte range lies outside its owner.
    #[error("range {offset}+{len} is outside a buffer of {total} bytes")]
    OutOfRange {
        /// Start of the range.
        offset: usize,
        /// Length of the range.
        len: usize,
        /// Size of the owning buffer.
        total: usize,
    },
}

/// Checks `got == expected` and reports a [`KernelError::BadLength`] otherwise.
pub(crate) fn check_len(
    what: &'static str,
    expected: usize,
    got: usize,
) -> Result<(), KernelError> {
    if expected == got {
        Ok(())
    } else {
        Err(KernelError::BadLength {
            what,
            expected,
            got,
        })
    }
}
