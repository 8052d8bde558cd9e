//! The shape of a kernel table: the function types every architecture fills in, and the
//! shared parameters the kernels read. `arch/mod.rs` picks a table; `scalar`, `x86` and
//! `aarch64` define them.

use crate::layout::{Act, ActRowOut, PackedA, QPacked, MR, NR, TILE};

/// Widest GEMM output (in columns) handled by the skinny, weight-streaming micro-kernel.
pub(crate) const SKINNY: usize = 4;

/// What the CPU offers, after the environment switches (probed once).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Features {
    /// AVX2 + FMA + F16C.
    pub(crate) avx2: bool,
    /// AVX-512 F, BW, DQ, VL and VNNI.
    pub(crate) avx512: bool,
    /// AVX-VNNI (VEX `vpdpbusd`).
    pub(crate) avxvnni: bool,
    /// aarch64 Advanced SIMD (NEON).
    pub(crate) neon: bool,
    /// aarch64 `sdot` / `udot` (FEAT_DotProd).
    pub(crate) dotprod: bool,
    /// aarch64 `smmla` (FEAT_I8MM).
    pub(crate) i8mm: bool,
    /// aarch64 `bfmmla` (FEAT_BF16; taken only with i8mm, as on every Armv8.6 core).
    pub(crate) bf16: bool,
}

/// The part of one matmul a kernel call computes: rows `r0..r1` of a weight matrix
/// `[rows, cols]` against `n` activation rows `[n, cols]`, into an output `[n, rows]`. One value
/// instead of five positional `usize`s, which a call could swap unnoticed.
#[derive(Debug, Clone, Copy)]
pub(crate) struct MatmulSpan {
    /// Rows of the whole weight matrix: the stride of the output rows.
    pub(crate) rows: usize,
    /// Columns of the weight matrix, and the length of each activation row.
    pub(crate) cols: usize,
    /// Activation rows (and output rows).
    pub(crate) n: usize,
    /// First weight row to compute (a multiple of [`TILE`] for the quantized kernels).
    pub(crate) r0: usize,
    /// One past the last weight row to compute (at most `rows`).
    pub(crate) r1: usize,
}

/// Dense matmul `(w, x, span, y)`: the rows of `span` of `w [rows, cols]` against
/// `x [n, cols]`, writing `y [n, rows]`.
pub(crate) type DenseFn<T> = unsafe fn(&[T], &[f32], MatmulSpan, *mut f32);

/// Quantized matmul `(q, act, span, y)`: the rows of `span` against activations prepared for
/// its `n` rows.
pub(crate) type QuantFn = unsafe fn(&QPacked, &Act<'_>, MatmulSpan, *mut f32);

/// Activation quantizer of one row `(x, out)`.
pub(crate) type QuantizeFn = unsafe fn(&[f32], ActRowOut<'_>);

/// A run of consecutive KV entries of one head: `n` rows of `head_dim` elements (f32, or bf16
/// bits when the ring stores bf16).
#[derive(Clone, Copy)]
pub(crate) struct Seg {
    pub(crate) k: *const u8,
    pub(crate) v: *const u8,
    pub(crate) n: usize,
}

/// One head's query against its window of the KV ring: what an attention kernel reads, as one
/// value instead of five positional arguments (a `bool` and a `usize` among them, which a call
/// could swap unnoticed).
#[derive(Clone, Copy)]
pub(crate) struct HeadQuery<'a> {
    /// Keys and values are bf16 bits (else f32).
    pub(crate) bf16: bool,
    /// Head size: the length of the query, of every key and value row and of the output.
    pub(crate) hd: usize,
    /// The query of this head.
    pub(crate) q: &'a [f32],
    /// The window, oldest entries first: at most two runs of the ring (the second empty
    /// unless it wraps).
    pub(crate) segs: [Seg; 2],
    /// Scale of the scores, `1/√hd`.
    pub(crate) inv: f32,
}

/// Attention of one head `(head, scores, out)` (`scores` holds the window's length, `out` is
/// `hd` long). Returns `false`, touching nothing, when this set has no kernel for `hd` (the
/// caller then runs the portable reference).
pub(crate) type HeadFn = unsafe fn(&HeadQuery<'_>, &mut [f32], &mut [f32]) -> bool;

/// A GEMM micro-kernel `(k, a, b, tile)` keeping an `MR × W` block of C: `k` steps of packed
/// A (`MR` per step) against B (`W` per step).
pub(crate) type MicroFn<const W: usize> = unsafe fn(usize, &[f32], &[f32], &mut [[f32; W]; MR]);

/// The GEMM micro-kernel against gathered B (`NR` columns per step).
pub(crate) type TileFn = MicroFn<NR>;

/// The skinny GEMM kernel `(k, a, bt, tile)`: packed A (plus 8 floats of padding) against B
/// transposed to `[k][SKINNY]`.
pub(crate) type SkinnyFn = MicroFn<SKINNY>;

/// Where a wide GEMM block reads its column panels of B.
#[derive(Clone, Copy)]
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(crate) enum BRows<'a> {
    /// Gathered as `[k][16·w]` (zero padded past the last column).
    Gathered(*const f32),
    /// In place: row `kk` of B starts at `src + offs[kk]`; every column of the panels exists.
    InPlace { src: *const f32, offs: &'a [usize] },
}

/// Wide GEMM blocks `(a, b, q, w, b_n, c, ldc, bias, (p0, p1))`: rows of panels `p0..p1`
/// against the `w` (1 or 2) column panels `q..q + w` of a B `b_n` wide, read from `b`.
pub(crate) type WideFn = unsafe fn(
    &PackedA,
    BRows<'_>,
    usize,
    usize,
    usize,
    *mut f32,
    usize,
    Option<&[f32]>,
    (usize, usize),
);

/// LayerNorm `(x, w, b, eps, out)`.
pub(crate) type LayerNormFn = unsafe fn(&[f32], &[f32], &[f32], f32, &mut [f32]);

/// One kernel table. Every function assumes the CPU supports its set; [`table`] hands out
/// only tables of available sets.
pub(crate) struct Kernels {
    pub(crate) dense_f32: DenseFn<f32>,
    pub(crate) dense_bf16: DenseFn<u16>,
    pub(crate) dense_f16: DenseFn<u16>,
    pub(crate) quant: QuantFn,
    pub(crate) quantize_act: QuantizeFn,
    pub(crate) attend_head: HeadFn,
    pub(crate) gemm_tile: TileFn,
    pub(crate) gemm_skinny: SkinnyFn,
    /// Wide blocks over pairs of gathered column panels, when the set has them.
    pub(crate) gemm_wide: Option<WideFn>,
    pub(crate) dot: unsafe fn(&[f32], &[f32]) -> f32,
    pub(crate) dot_bf16: unsafe fn(&[f32], &[u16]) -> f32,
    pub(crate) axpy: unsafe fn(&mut [f32], f32, &[f32]),
    pub(crate) axpy_bf16: unsafe fn(&mut [f32], f32, &[u16]),
    pub(crate) to_bf16: unsafe fn(&[f32], &mut [u16]),
    pub(crate) gelu_erf: unsafe fn(&mut [f32]),
    pub(crate) elu: unsafe fn(&[f32], &mut [f32]),
    /// `(x, w, eps, out)`.
    pub(crate) rms_norm: unsafe fn(&[f32], &[f32], f32, &mut [f32]),
    pub(crate) layer_norm: LayerNormFn,
    /// `(x, head_dim, first pair, cos, sin)`: rotates pairs `first .. first + cos.len()` of
    /// every head.
    pub(crate) rope: unsafe fn(&mut [f32], usize, usize, &[f32], &[f32]),
    pub(crate) softmax: unsafe fn(&mut [f32]),
    /// `(g, u)`: `u = silu(g[..h]) · g[h..2h]`, `h = u.len()`.
    pub(crate) silu_gate: unsafe fn(&[f32], &mut [f32]),
}

/// Software-prefetch distance (bytes ahead in each weight / KV stream) of the streaming
/// kernels; 0 = off. 4 KiB measured best on the development host (one core reaches ~18–27 %
/// more bandwidth than with the hardware prefetchers alone; `examples/prefetch_ab.rs`).
pub(crate) static PREFETCH: std::sync::atomic::AtomicUsize =
    std::sync::atomic::AtomicUsize::new(4096);

/// Whether the dense kernels prefetch the twin row of the next block where rows are short
/// (`x86::dense_prefetch_distance`), rather than half the distance ahead in the same row.
pub(crate) static SHORT_ROW_TWIN: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(true);

/// The work of a quantized matmul over the rows of `span` as `(tile, first activation row,
/// count)`: every 8-row tile, its activation rows in chunks of at most `most`.
#[inline(always)]
pub(crate) fn tile_chunks(
    span: MatmulSpan,
    most: usize,
) -> impl Iterator<Item = (usize, usize, usize)> {
    let n = span.n;
    (span.r0 / TILE..span.r1.div_ceil(TILE)).flat_map(move |t| {
        (0..n)
            .step_by(most)
            .map(move |i0| (t, i0, (n - i0).min(most)))
    })
}

/// Calls `$f::<K>(args)` for a chunk of `$k` activation rows, `K` its const row count (1 to 3,
/// else 4): the one dispatch from [`tile_chunks`]-sized chunks to the const-generic tile
/// kernels. `with_rows!(k, f<A>(args))` calls `f::<A, K>(args)`, for kernels with a leading
/// const parameter of their own.
macro_rules! with_rows {
    ($k:expr, $f:ident $(<$($pre:literal),*>)? ($($arg:expr),* $(,)?)) => {
        match $k {
            1 => $f::<$($($pre,)*)? 1>($($arg),*),
            2 => $f::<$($($pre,)*)? 2>($($arg),*),
            3 => $f::<$($($pre,)*)? 3>($($arg),*),
            _ => $f::<$($($pre,)*)? 4>($($arg),*),
        }
    };
}
pub(crate) use with_rows;

/// Scale group of consecutive blocks without an integer division per block (`b / per`
/// was a `div` in the kernels' inner loop).
pub(crate) struct GroupCounter {
    g: usize,
    i: usize,
    per: usize,
}

impl GroupCounter {
    #[inline(always)]
    pub(crate) fn new(per: usize) -> GroupCounter {
        GroupCounter { g: 0, i: 0, per }
    }

    /// The group of the current block; advances to the next block.
    #[inline(always)]
    #[allow(clippy::should_implement_trait)]
    pub(crate) fn next(&mut self) -> usize {
        let g = self.g;
        self.i += 1;
        if self.i == self.per {
            self.i = 0;
            self.g += 1;
        }
        g
    }
}
