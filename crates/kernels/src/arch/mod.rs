//! Per-architecture kernels and the one table the crate dispatches through.
//!
//! The CPU's features are probed once ([`Features`]); together with the environment switches
//! and the run-time allow flags they select a [`KernelSet`], whose [`Kernels`] table holds
//! every hot kernel: dense and quantized matmul tiles, the activation quantizer, attention of
//! one head over the KV ring, the GEMM micro-kernels of the convolutions, the pointwise
//! activations and the f32 → bf16 conversion. The portable versions live in [`scalar`] and
//! are the references of the property tests; `x86` and `aarch64` hold the SIMD versions.
//! No code outside this folder uses `std::arch`.
//!
//! Environment switches (read once, before the first kernel call):
//! * `MOSHI_KERNELS_SCALAR=1`: the portable kernels only;
//! * `MOSHI_KERNELS_NO_AVX512=1`, `MOSHI_KERNELS_NO_VNNI=1`: drop those x86 tables;
//! * `MOSHI_KERNELS_NO_DOTPROD=1` (baseline NEON only), `MOSHI_KERNELS_NO_I8MM=1`: drop those
//!   aarch64 tables; `MOSHI_KERNELS_NO_BF16=1`: widened bf16 keys instead of `bfmmla`;
//! * `MOSHI_KERNELS_F32_ACTIVATIONS=1`: exact f32 activations for quantized weights
//!   ([`set_f32_activations`]).

use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::OnceLock;

use crate::KernelError;

#[cfg(target_arch = "aarch64")]
pub(crate) mod aarch64;
pub(crate) mod scalar;
pub(crate) mod sys;
mod table;
#[cfg(target_arch = "x86_64")]
pub(crate) mod x86;

pub(crate) use table::{
    BRows, Features, HeadQuery, Kernels, MatmulSpan, MicroFn, Seg, WideFn, PREFETCH,
    SHORT_ROW_TWIN, SKINNY,
};

/// A set of kernels for one instruction-set level; exactly one is active at a time
/// ([`kernel_set`]). Tests and benchmarks name a set explicitly to compare two of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KernelSet {
    /// The portable reference kernels (any CPU).
    Scalar,
    /// x86_64 AVX2 + FMA + F16C (`vpmaddubsw` integer dot products).
    Avx2,
    /// [`KernelSet::Avx2`] with AVX-VNNI `vpdpbusd` in the quantized kernels.
    Avx2Vnni,
    /// AVX-512 F/BW/DQ/VL + VNNI: zmm quantized kernels on pairs of tiles, zmm attention,
    /// GEMM blocks and activation quantizer (AVX-VNNI or AVX2 ymm kernels for a lone tile).
    Avx512,
    /// aarch64 baseline NEON (`smull` + pairwise adds in the quantized kernels).
    Neon,
    /// NEON with `sdot` (dotprod) quantized kernels.
    NeonDotprod,
    /// NEON with `smmla` (i8mm) quantized kernels for pairs of activation rows, and `bfmmla`
    /// attention over bf16 keys when the CPU has FEAT_BF16 ([`KernelSet::bfmmla_attention`]).
    NeonI8mm,
}

impl KernelSet {
    /// Every set, slowest first.
    pub const ALL: [KernelSet; 7] = [
        KernelSet::Scalar,
        KernelSet::Avx2,
        KernelSet::Avx2Vnni,
        KernelSet::Avx512,
        KernelSet::Neon,
        KernelSet::NeonDotprod,
        KernelSet::NeonI8mm,
    ];

    /// Whether this CPU can run the set and no environment switch forbids it (the run-time
    /// allow flags do not matter here).
    pub fn available(self) -> bool {
        let f = features();
        match self {
            KernelSet::Scalar => true,
            KernelSet::Avx2 => f.avx2,
            KernelSet::Avx2Vnni => f.avx2 && f.avxvnni,
            KernelSet::Avx512 => f.avx2 && f.avx512,
            KernelSet::Neon => f.neon,
            KernelSet::NeonDotprod => f.dotprod,
            KernelSet::NeonI8mm => f.i8mm,
        }
    }

    /// Whether this set's attention multiplies bf16 keys with `bfmmla` (bf16 × bf16 products
    /// of a split query; see the tolerance in the attention property tests) instead of
    /// widening them to f32: [`KernelSet::NeonI8mm`] on a CPU with FEAT_BF16, unless
    /// `MOSHI_KERNELS_NO_BF16` is set.
    pub fn bfmmla_attention(self) -> bool {
        self == KernelSet::NeonI8mm && features().bf16
    }

    /// Short lower-case name (`scalar`, `avx2`, `avx2-vnni`, `avx512`) for logs and tables.
    pub fn name(self) -> &'static str {
        match self {
            KernelSet::Scalar => "scalar",
            KernelSet::Avx2 => "avx2",
            KernelSet::Avx2Vnni => "avx2-vnni",
            KernelSet::Avx512 => "avx512",
            KernelSet::Neon => "neon",
            KernelSet::NeonDotprod => "neon-dotprod",
            KernelSet::NeonI8mm => "neon-i8mm",
        }
    }
}

impl std::fmt::Display for KernelSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// True when the environment variable `name` is set, non-empty and not `0`.
fn env_set(name: &str) -> bool {
    std::env::var_os(name).is_some_and(|v| v != "0" && !v.is_empty())
}

/// The one CPU-feature probe (cached), with `MOSHI_KERNELS_*` applied.
pub(crate) fn features() -> Features {
    static F: OnceLock<Features> = OnceLock::new();
    *F.get_or_init(|| {
        if env_set("MOSHI_KERNELS_SCALAR") {
            return Features::default();
        }
        #[allow(unused_mut)]
        let mut f = Features::default();
        #[cfg(target_arch = "x86_64")]
        x86::probe(&mut f);
        #[cfg(target_arch = "aarch64")]
        aarch64::probe(&mut f);
        f.avx512 &= f.avx2 && !env_set("MOSHI_KERNELS_NO_AVX512");
        f.avxvnni &= f.avx2 && !env_set("MOSHI_KERNELS_NO_VNNI");
        f.dotprod &= !env_set("MOSHI_KERNELS_NO_DOTPROD");
        f.i8mm &= f.dotprod && !env_set("MOSHI_KERNELS_NO_I8MM");
        f.bf16 &= f.i8mm && !env_set("MOSHI_KERNELS_NO_BF16");
        f
    })
}

static AVX512_ALLOWED: AtomicBool = AtomicBool::new(true);
static VNNI_ALLOWED: AtomicBool = AtomicBool::new(true);

/// Allows or forbids the AVX-512 set at run time (tests and benchmarks compare the AVX-512 and
/// AVX2 paths in one process; both compute the same integer sums and, where documented, the
/// same floats bit for bit).
pub fn set_avx512_allowed(allowed: bool) {
    AVX512_ALLOWED.store(allowed, Ordering::Relaxed);
}

/// Allows or forbids the AVX-VNNI quantized kernels at run time (the AVX2 `vpmaddubsw` path
/// computes the same integer sums).
pub fn set_vnni_allowed(allowed: bool) {
    VNNI_ALLOWED.store(allowed, Ordering::Relaxed);
}

/// The kernel set the crate uses now: the fastest available one the allow flags permit.
pub fn kernel_set() -> KernelSet {
    let f = features();
    if f.avx512 && AVX512_ALLOWED.load(Ordering::Relaxed) {
        KernelSet::Avx512
    } else if f.avxvnni && VNNI_ALLOWED.load(Ordering::Relaxed) {
        KernelSet::Avx2Vnni
    } else if f.avx2 {
        KernelSet::Avx2
    } else if f.i8mm {
        KernelSet::NeonI8mm
    } else if f.dotprod {
        KernelSet::NeonDotprod
    } else if f.neon {
        KernelSet::Neon
    } else {
        KernelSet::Scalar
    }
}

/// Tri-state: 0 = not read from the environment yet, 1 = off, 2 = on.
static F32_ACTIVATIONS: AtomicU8 = AtomicU8::new(0);

/// Whether quantized weights are multiplied by exact f32 activations (see
/// [`set_f32_activations`]); defaults to `MOSHI_KERNELS_F32_ACTIVATIONS`.
pub fn f32_activations() -> bool {
    match F32_ACTIVATIONS.load(Ordering::Relaxed) {
        1 => false,
        2 => true,
        _ => {
            let on = env_set("MOSHI_KERNELS_F32_ACTIVATIONS");
            F32_ACTIVATIONS.store(if on { 2 } else { 1 }, Ordering::Relaxed);
            on
        }
    }
}

/// Exact-reference mode for quantized weights (Q8_0, Q4_0, MLX affine 4/8): when on, the
/// products multiply the dequantized weights by the f32 activations (no 8-bit activation
/// rounding), with the portable kernel. Meant for parity tests against an f32 reference; slow.
/// Results then match the exact f32 product of the dequantized weights within
/// `1e-6 · Σ|w·x|` (summation order only).
pub fn set_f32_activations(on: bool) {
    F32_ACTIVATIONS.store(if on { 2 } else { 1 }, Ordering::Relaxed);
}

/// The table of `set`, which must be [`KernelSet::available`] (checked in debug builds).
///
/// This depends on the CPU and the environment only, never on the run-time allow flags: the
/// `*_with(set, ..)` entry points that tests use to compare two sets must run exactly the set they
/// name even while another test thread of the same binary flips a flag ([`active`] applies them).
pub(crate) fn table(set: KernelSet) -> &'static Kernels {
    debug_assert!(set.available(), "{set:?} is not available on this CPU");
    match set {
        #[cfg(target_arch = "x86_64")]
        KernelSet::Avx2 => &x86::AVX2,
        #[cfg(target_arch = "x86_64")]
        KernelSet::Avx2Vnni => &x86::AVX2_VNNI,
        #[cfg(target_arch = "x86_64")]
        KernelSet::Avx512 if features().avxvnni => &x86::AVX512_VNNI,
        #[cfg(target_arch = "x86_64")]
        KernelSet::Avx512 => &x86::AVX512,
        #[cfg(target_arch = "aarch64")]
        KernelSet::Neon => &aarch64::NEON,
        #[cfg(target_arch = "aarch64")]
        KernelSet::NeonDotprod => &aarch64::NEON_DOTPROD,
        #[cfg(target_arch = "aarch64")]
        KernelSet::NeonI8mm if features().bf16 => &aarch64::NEON_I8MM_BF16,
        #[cfg(target_arch = "aarch64")]
        KernelSet::NeonI8mm => &aarch64::NEON_I8MM,
        _ => &scalar::SCALAR,
    }
}

/// The table of an explicitly named set (the `*_with(set, ..)` entry points), refused with
/// [`KernelError::Unsupported`] when this CPU cannot run it.
pub(crate) fn checked_table(set: KernelSet) -> Result<&'static Kernels, KernelError> {
    if set.available() {
        Ok(table(set))
    } else {
        Err(KernelError::Unsupported(format!(
            "kernel set {set} on this CPU"
        )))
    }
}

/// The active table ([`kernel_set`]); with AVX-512 active, [`set_vnni_allowed`]`(false)` also
/// moves its lone tiles from the AVX-VNNI to the plain AVX2 ymm kernel.
pub(crate) fn active() -> &'static Kernels {
    match kernel_set() {
        #[cfg(target_arch = "x86_64")]
        KernelSet::Avx512 if !VNNI_ALLOWED.load(Ordering::Relaxed) => &x86::AVX512,
        set => table(set),
    }
}

/// Sum of `v` for the benchmarks' streaming-read probe (AVX2 when the CPU has it).
#[cfg(feature = "bench")]
pub(crate) fn sum_f32(v: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if features().avx2 {
        // SAFETY: AVX2 detected.
        return unsafe { x86::ops::sum_f32_avx2(v) };
    }
    let mut acc = [0f32; 16];
    for c in v.chunks_exact(16) {
        for k in 0..16 {
            acc[k] += c[k];
        }
    }
    acc.iter().sum()
}

/// Wrapping sum of `v` for the benchmarks' roofline probe (AVX2 with software prefetch when
/// the CPU has it); memory-bound on any buffer well above the last-level cache.
#[cfg(feature = "bench")]
pub(crate) fn sum_u64(v: &[u64]) -> u64 {
    #[cfg(target_arch = "x86_64")]
    if features().avx2 {
        // SAFETY: AVX2 detected.
        return unsafe { x86::ops::sum_u64_avx2(v) };
    }
    let mut acc = [0u64; 8];
    let mut chunks = v.chunks_exact(8);
    for c in &mut chunks {
        for k in 0..8 {
            acc[k] = acc[k].wrapping_add(c[k]);
        }
    }
    let tail: u64 = chunks.remainder().iter().fold(0, |a, &b| a.wrapping_add(b));
    acc.iter().fold(tail, |a, &b| a.wrapping_add(b))
}
