//! Run-time CPU feature detection (done once, cached).

use std::sync::atomic::{AtomicU8, Ordering};

/// The SIMD instruction set the kernels use on this machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SimdLevel {
    /// Portable scalar code (reference implementations).
    Scalar,
    /// x86_64 AVX2 + FMA + F16C.
    Avx2,
}

static LEVEL: AtomicU8 = AtomicU8::new(0);

/// Detects (once) and returns the SIMD level used by the kernels.
/// `MOSHI_KERNELS_SCALAR=1` in the environment forces [`SimdLevel::Scalar`].
pub fn simd_level() -> SimdLevel {
    match LEVEL.load(Ordering::Relaxed) {
        1 => SimdLevel::Scalar,
        2 => SimdLevel::Avx2,
        _ => {
            let l = detect();
            LEVEL.store(if l == SimdLevel::Avx2 { 2 } else { 1 }, Ordering::Relaxed);
            l
        }
    }
}

fn detect() -> SimdLevel {
    if env_set("MOSHI_KERNELS_SCALAR") {
        return SimdLevel::Scalar;
    }
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("fma")
            && std::arch::is_x86_feature_detected!("f16c")
        {
            return SimdLevel::Avx2;
        }
    }
    SimdLevel::Scalar
}

/// Cached tri-state flag: 0 = not yet detected, 1 = false, 2 = true.
fn cached_flag(cell: &AtomicU8, detect: fn() -> bool) -> bool {
    match cell.load(Ordering::Relaxed) {
        1 => false,
        2 => true,
        _ => {
            let v = detect();
            cell.store(if v { 2 } else { 1 }, Ordering::Relaxed);
            v
        }
    }
}

/// True when the environment variable `name` is set, non-empty and not `0`.
fn env_set(name: &str) -> bool {
    std::env::var_os(name).is_some_and(|v| v != "0" && !v.is_empty())
}

static VNNI: AtomicU8 = AtomicU8::new(0);
static VNNI_ALLOWED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(true);

/// True when the quantized kernels use AVX-VNNI (`vpdpbusd`): the CPU has it, the SIMD
/// level is AVX2, `MOSHI_KERNELS_NO_VNNI` is unset and [`set_vnni_allowed`] did not turn
/// it off.
pub fn vnni() -> bool {
    if !VNNI_ALLOWED.load(Ordering::Relaxed) {
        return false;
    }
    cached_flag(&VNNI, detect_vnni)
}

fn detect_vnni() -> bool {
    if simd_level() != SimdLevel::Avx2 || env_set("MOSHI_KERNELS_NO_VNNI") {
        return false;
    }
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avxvnni")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Allows or forbids the AVX-VNNI kernels at run time (both paths compute the same
/// integer sums; tests and benchmarks use this to compare them).
pub fn set_vnni_allowed(allowed: bool) {
    VNNI_ALLOWED.store(allowed, Ordering::Relaxed);
}

static AVX512: AtomicU8 = AtomicU8::new(0);
static AVX512_ALLOWED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(true);

/// True when kernels may use AVX-512 (F, BW, DQ, VL and VNNI, i.e. `vpdpbusd` on `zmm`): the CPU
/// has them, the SIMD level is AVX2, `MOSHI_KERNELS_NO_AVX512` is unset and
/// [`set_avx512_allowed`] did not turn it off. Kernels with an AVX-512 path must compute the same
/// result as their AVX2 path up to float summation order (integer sums exactly).
pub fn avx512() -> bool {
    if !AVX512_ALLOWED.load(Ordering::Relaxed) {
        return false;
    }
    cached_flag(&AVX512, detect_avx512)
}

fn detect_avx512() -> bool {
    if simd_level() != SimdLevel::Avx2 || env_set("MOSHI_KERNELS_NO_AVX512") {
        return false;
    }
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bw")
            && std::arch::is_x86_feature_detected!("avx512dq")
            && std::arch::is_x86_feature_detected!("avx512vl")
            && std::arch::is_x86_feature_detected!("avx512vnni")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Allows or forbids the AVX-512 kernels at run time (tests and benchmarks use this to compare
/// the AVX-512 and AVX2 paths in one process).
pub fn set_avx512_allowed(allowed: bool) {
    AVX512_ALLOWED.store(allowed, Ordering::Relaxed);
}
