//! A small blocked f32 GEMM for the convolutions: `C[m, n] = A[m, k] · B[k, n]` with A
//! packed once (weights) in panels of [`MR`] rows and B gathered per call into panels of
//! [`NR`] columns from an arbitrary (row offset, column stride) view of the input, so a
//! convolution needs no explicit im2col. The AVX2 micro-kernel keeps a 6×16 block of C in
//! 12 registers; the scalar micro-kernel is its reference. Outputs at most [`SKINNY`] wide
//! (Mimi's 12.5/25 Hz layers) take a weight-streaming kernel that reads A exactly once.
#![allow(clippy::needless_range_loop)]

use std::cell::RefCell;

use crate::cpu::SimdLevel;

/// Which micro-kernel a GEMM call uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kern {
    /// Portable scalar micro-kernels (the reference).
    Scalar,
    /// AVX2+FMA (6×16 blocks).
    Avx2,
    /// AVX-512F blocks of up to 24×16 / 12×32 (skinny outputs stay on AVX2).
    Avx512,
}

impl Kern {
    /// The fastest kernel this CPU allows (honours `MOSHI_KERNELS_SCALAR`,
    /// `MOSHI_KERNELS_NO_AVX512` and [`crate::set_avx512_allowed`]).
    pub(crate) fn auto() -> Kern {
        match crate::cpu::simd_level() {
            SimdLevel::Avx2 if crate::cpu::avx512() => Kern::Avx512,
            SimdLevel::Avx2 => Kern::Avx2,
            _ => Kern::Scalar,
        }
    }

    fn level(self) -> SimdLevel {
        match self {
            Kern::Scalar => SimdLevel::Scalar,
            _ => crate::cpu::simd_level(),
        }
    }
}

/// Rows of A per packed panel (micro-kernel height).
pub(crate) const MR: usize = 6;
/// Columns of B per packed panel (micro-kernel width).
pub(crate) const NR: usize = 16;

/// A matrix packed in panels of `MR` rows: `[panel][k][MR]`, zero padded.
#[derive(Clone, Debug)]
pub(crate) struct PackedA {
    pub(crate) m: usize,
    pub(crate) k: usize,
    data: Vec<f32>,
}

impl PackedA {
    /// Packs a row-major `[m, k]` matrix given by `at(row, col)`.
    pub(crate) fn new(m: usize, k: usize, at: impl Fn(usize, usize) -> f32) -> PackedA {
        let panels = m.div_ceil(MR);
        // 8 floats of padding: the skinny kernel loads 8 lanes at the last panel row.
        let mut data = vec![0f32; panels * k * MR + 8];
        for r in 0..m {
            let (p, ri) = (r / MR, r % MR);
            for c in 0..k {
                data[(p * k + c) * MR + ri] = at(r, c);
            }
        }
        PackedA { m, k, data }
    }

    pub(crate) fn panels(&self) -> usize {
        self.m.div_ceil(MR)
    }

    /// Start of the packed data (panel `p` starts `p·k·MR` floats later).
    pub(crate) fn data_ptr(&self) -> *const f32 {
        self.data.as_ptr()
    }
}

/// A view of B: element `(c, t)` is `src[row_off(c) + t·stride]`.
pub(crate) struct BView<'a, F: Fn(usize) -> usize> {
    pub(crate) src: &'a [f32],
    pub(crate) row_off: F,
    pub(crate) stride: usize,
    pub(crate) n: usize,
}

thread_local! {
    static BPANEL: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Copies column panels `q..q + w` of B into `dst` as `[k][16·w]`, zero padded.
pub(crate) fn gather<F: Fn(usize) -> usize>(
    b: &BView<'_, F>,
    k: usize,
    q: usize,
    w: usize,
    dst: &mut [f32],
) {
    let ldb = w * NR;
    let t0 = q * NR;
    let nv = (b.n - t0).min(ldb);
    for (cc, dst) in dst[..k * ldb].chunks_exact_mut(ldb).enumerate() {
        let base = (b.row_off)(cc) + t0 * b.stride;
        if b.stride == 1 {
            dst[..nv].copy_from_slice(&b.src[base..base + nv]);
        } else {
            for (j, d) in dst[..nv].iter_mut().enumerate() {
                *d = b.src[base + j * b.stride];
            }
        }
        dst[nv..].fill(0.0);
    }
}

/// Computes `C[rows of panels p0..p1, cols of N-panels q0..q1] = A · B`, writing C row `r`
/// at `c[r·ldc ..]` and adding `bias[r]` when given.
///
/// # Safety
/// `c` must be valid for the written rows/cols; no other thread writes the same region.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn gemm<F: Fn(usize) -> usize>(
    kern: Kern,
    a: &PackedA,
    b: &BView<'_, F>,
    c: *mut f32,
    ldc: usize,
    bias: Option<&[f32]>,
    (p0, p1): (usize, usize),
    (q0, q1): (usize, usize),
) {
    let k = a.k;
    let level = kern.level();
    if b.n <= SKINNY {
        if q0 < q1 {
            skinny(level, a, b, c, ldc, bias, (p0, p1));
        }
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if kern == Kern::Avx512 {
        return crate::gemm_avx512::gemm(a, b, c, ldc, bias, (p0, p1), (q0, q1));
    }
    BPANEL.with(|buf| {
        let mut buf = buf.borrow_mut();
        if buf.len() < k * NR {
            buf.resize(k * NR, 0.0);
        }
        let bp = &mut buf[..k * NR];
        for q in q0..q1 {
            let t0 = q * NR;
            let nv = (b.n - t0).min(NR);
            gather(b, k, q, 1, bp);
            for p in p0..p1 {
                let ap = &a.data[p * k * MR..(p + 1) * k * MR];
                let mut tile = [[0f32; NR]; MR];
                match level {
                    #[cfg(target_arch = "x86_64")]
                    SimdLevel::Avx2 => kernel_avx2(k, ap, bp, &mut tile),
                    _ => kernel_scalar(k, ap, bp, &mut tile),
                }
                let mv = (a.m - p * MR).min(MR);
                for (ri, row) in tile.iter().enumerate().take(mv) {
                    let r = p * MR + ri;
                    let bv = bias.map_or(0.0, |bb| bb[r]);
                    let dst = c.add(r * ldc + t0);
                    for (j, v) in row.iter().enumerate().take(nv) {
                        *dst.add(j) = v + bv;
                    }
                }
            }
        }
    })
}

/// Widest `n` handled by the skinny (weight-streaming) path.
pub(crate) const SKINNY: usize = 4;

/// `n <= SKINNY`: stream the packed A once, B transposed into `[k][SKINNY]`.
#[allow(clippy::too_many_arguments)]
unsafe fn skinny<F: Fn(usize) -> usize>(
    level: SimdLevel,
    a: &PackedA,
    b: &BView<'_, F>,
    c: *mut f32,
    ldc: usize,
    bias: Option<&[f32]>,
    (p0, p1): (usize, usize),
) {
    let k = a.k;
    BPANEL.with(|buf| {
        let mut buf = buf.borrow_mut();
        if buf.len() < k * SKINNY {
            buf.resize(k * SKINNY, 0.0);
        }
        let bt = &mut buf[..k * SKINNY];
        for (cc, dst) in bt.chunks_exact_mut(SKINNY).enumerate() {
            let base = (b.row_off)(cc);
            for (j, d) in dst.iter_mut().enumerate() {
                *d = if j < b.n {
                    b.src[base + j * b.stride]
                } else {
                    0.0
                };
            }
        }
        for p in p0..p1 {
            let ap = &a.data[p * k * MR..(p + 1) * k * MR + 8];
            let mut tile = [[0f32; SKINNY]; MR];
            match level {
                #[cfg(target_arch = "x86_64")]
                SimdLevel::Avx2 => skinny_avx2(k, ap, bt, &mut tile),
                _ => skinny_scalar(k, ap, bt, &mut tile),
            }
            let mv = (a.m - p * MR).min(MR);
            for (ri, row) in tile.iter().enumerate().take(mv) {
                let r = p * MR + ri;
                let bv = bias.map_or(0.0, |bb| bb[r]);
                for (j, v) in row.iter().enumerate().take(b.n) {
                    *c.add(r * ldc + j) = v + bv;
                }
            }
        }
    })
}

fn skinny_scalar(k: usize, a: &[f32], bt: &[f32], tile: &mut [[f32; SKINNY]; MR]) {
    for p in 0..k {
        for r in 0..MR {
            for j in 0..SKINNY {
                tile[r][j] = a[p * MR + r].mul_add(bt[p * SKINNY + j], tile[r][j]);
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
fn skinny_avx2(k: usize, a: &[f32], bt: &[f32], tile: &mut [[f32; SKINNY]; MR]) {
    use std::arch::x86_64::*;
    assert!(a.len() >= k * MR + 2 && bt.len() >= k * SKINNY);
    // SAFETY: bounds checked above (8-lane loads of A read at most 2 padding floats).
    unsafe {
        let mut acc0 = [_mm256_setzero_ps(); SKINNY];
        let mut acc1 = [_mm256_setzero_ps(); SKINNY];
        let (ap, bp) = (a.as_ptr(), bt.as_ptr());
        let mut p = 0;
        while p + 2 <= k {
            let a0 = _mm256_loadu_ps(ap.add(p * MR));
            let a1 = _mm256_loadu_ps(ap.add((p + 1) * MR));
            for j in 0..SKINNY {
                acc0[j] =
                    _mm256_fmadd_ps(a0, _mm256_broadcast_ss(&*bp.add(p * SKINNY + j)), acc0[j]);
                acc1[j] = _mm256_fmadd_ps(
                    a1,
                    _mm256_broadcast_ss(&*bp.add((p + 1) * SKINNY + j)),
                    acc1[j],
                );
            }
            p += 2;
        }
        if p < k {
            let a0 = _mm256_loadu_ps(ap.add(p * MR));
            for j in 0..SKINNY {
                acc0[j] =
                    _mm256_fmadd_ps(a0, _mm256_broadcast_ss(&*bp.add(p * SKINNY + j)), acc0[j]);
            }
        }
        for j in 0..SKINNY {
            let mut lanes = [0f32; 8];
            _mm256_storeu_ps(lanes.as_mut_ptr(), _mm256_add_ps(acc0[j], acc1[j]));
            for r in 0..MR {
                tile[r][j] = lanes[r];
            }
        }
    }
}

fn kernel_scalar(k: usize, a: &[f32], b: &[f32], tile: &mut [[f32; NR]; MR]) {
    for p in 0..k {
        let bp = &b[p * NR..(p + 1) * NR];
        for r in 0..MR {
            let av = a[p * MR + r];
            for j in 0..NR {
                tile[r][j] = av.mul_add(bp[j], tile[r][j]);
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
fn kernel_avx2(k: usize, a: &[f32], b: &[f32], tile: &mut [[f32; NR]; MR]) {
    use std::arch::x86_64::*;
    assert!(a.len() >= k * MR && b.len() >= k * NR);
    // SAFETY: bounds checked above; unaligned loads only.
    unsafe {
        let mut c = [[_mm256_setzero_ps(); 2]; MR];
        let (mut ap, mut bp) = (a.as_ptr(), b.as_ptr());
        for _ in 0..k {
            let b0 = _mm256_loadu_ps(bp);
            let b1 = _mm256_loadu_ps(bp.add(8));
            for (r, cr) in c.iter_mut().enumerate() {
                let av = _mm256_broadcast_ss(&*ap.add(r));
                cr[0] = _mm256_fmadd_ps(av, b0, cr[0]);
                cr[1] = _mm256_fmadd_ps(av, b1, cr[1]);
            }
            ap = ap.add(MR);
            bp = bp.add(NR);
        }
        for (r, cr) in c.iter().enumerate() {
            _mm256_storeu_ps(tile[r].as_mut_ptr(), cr[0]);
            _mm256_storeu_ps(tile[r].as_mut_ptr().add(8), cr[1]);
        }
    }
}
