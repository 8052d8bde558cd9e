//! The packed layouts the kernels read: quantized weights repacked into interleaved 8-row
//! tiles ([`QPacked`]), quantized activations ([`Act`]), and the panel layouts of the
//! convolution GEMM (weights packed once in [`PackedA`], inputs gathered per call through a
//! [`BView`]). The matrix products, the GEMM driver and every per-architecture kernel under
//! `arch/` read these types; none of them reaches into another's private data.
#![allow(clippy::needless_range_loop)]

use half::{bf16, f16};

/// Number of values in a quantization block (GGUF Q8_0/Q4_0 and activation blocks).
pub const QK: usize = 32;

/// Rows per interleaved tile of the repacked quantized layouts (and the unit of work
/// the pool splits by).
pub(crate) const TILE: usize = 8;

/// Kind of quantized layout after repacking.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum QKind {
    /// Q8_0: signed codes, f16 scales, no bias.
    Q8Sym,
    /// Q4_0: unsigned codes 0..15, f16 scales, bias = −8·scale.
    Q4Sym,
    /// MLX 8-bit: codes stored as `q − 128` (signed), bf16 scales and biases.
    Affine8,
    /// MLX 4-bit: unsigned codes 0..15, bf16 scales and biases.
    Affine4,
}

impl QKind {
    pub(crate) fn is_q4(self) -> bool {
        matches!(self, QKind::Q4Sym | QKind::Affine4)
    }
    /// Bytes of codes per tile and block.
    pub(crate) fn block_bytes(self) -> usize {
        if self.is_q4() {
            TILE * QK / 2
        } else {
            TILE * QK
        }
    }
}

/// Repacked quantized weights in tiles of 8 rows, stored in pairs of tiles (16 rows, the
/// unit of the AVX-512 kernels). Per pair and 32-column block: for each 4-byte group of
/// columns (`k`), 64 bytes = 32 bytes of tile `2p` (its 8 rows × 4 bytes) then 32 bytes of
/// tile `2p+1` (see `decode_block`). Per pair and scale group: the 16 scales (and biases)
/// of tile `2p` then `2p+1`. A tile on its own (AVX2) is read with a 64-byte stride between
/// its 4-byte groups. Rows past `rows` (up to an even number of tiles) are zero padding.
pub(crate) struct QPacked {
    pub(crate) kind: QKind,
    pub(crate) blocks: usize,
    pub(crate) group_blocks: usize,
    pub(crate) groups: usize,
    pub(crate) codes: Vec<u8>,
    pub(crate) scales: Vec<u16>,
    pub(crate) biases: Vec<u16>,
}

impl QPacked {
    /// Byte offset of tile `t`'s first 4-byte group in block `b` (groups follow every 64 bytes).
    #[inline]
    pub(crate) fn tile_block_base(&self, t: usize, b: usize) -> usize {
        ((t / 2) * self.blocks + b) * 2 * self.kind.block_bytes() + (t % 2) * 32
    }

    /// Index in `scales`/`biases` of row 0 of tile `t` in group `g` (8 consecutive rows).
    #[inline]
    pub(crate) fn scale_index(&self, t: usize, g: usize) -> usize {
        ((t / 2) * self.groups + g) * 2 * TILE + (t % 2) * TILE
    }

    /// Decodes the 32 codes of row `ri`, block `b` of tile `t` as the kernels see them
    /// (q4: 0..15; q8: signed).
    #[inline]
    pub(crate) fn decode_block(&self, t: usize, b: usize, ri: usize, out: &mut [i8; QK]) {
        let base = self.tile_block_base(t, b) + ri * 4;
        if self.kind.is_q4() {
            for k in 0..4 {
                let src = &self.codes[base + k * 64..base + k * 64 + 4];
                for i in 0..4 {
                    out[4 * k + i] = (src[i] & 15) as i8;
                    out[16 + 4 * k + i] = (src[i] >> 4) as i8;
                }
            }
        } else {
            for j in 0..8 {
                let src = &self.codes[base + j * 64..base + j * 64 + 4];
                for i in 0..4 {
                    out[4 * j + i] = src[i] as i8;
                }
            }
        }
    }

    /// (scale, bias) of row `ri` of tile `t` in group `g`, as f32.
    #[inline]
    pub(crate) fn scale_bias(&self, t: usize, g: usize, ri: usize) -> (f32, f32) {
        let i = self.scale_index(t, g) + ri;
        match self.kind {
            QKind::Q8Sym => (f16::from_bits(self.scales[i]).to_f32(), 0.0),
            QKind::Q4Sym => {
                let s = f16::from_bits(self.scales[i]).to_f32();
                (s, -8.0 * s)
            }
            QKind::Affine8 | QKind::Affine4 => (
                bf16::from_bits(self.scales[i]).to_f32(),
                bf16::from_bits(self.biases[i]).to_f32(),
            ),
        }
    }

    /// Builds the packed layout. `fill(r, b, codes)` writes the 32 stored codes of block `b`
    /// of row `r` (q4: 0..15; q8: the signed code as u8); `scale(r, g)`/`bias(r, g)` give raw
    /// 16-bit scale / bias bits.
    pub(crate) fn build(
        kind: QKind,
        rows: usize,
        cols: usize,
        group: usize,
        mut fill: impl FnMut(usize, usize, &mut [u8; QK]),
        scale: impl Fn(usize, usize) -> u16,
        bias: Option<&dyn Fn(usize, usize) -> u16>,
    ) -> QPacked {
        let blocks = cols / QK;
        let groups = cols / group;
        // Even number of tiles: the last pair is complete (zero rows as padding).
        let tiles = rows.div_ceil(2 * TILE) * 2;
        let mut p = QPacked {
            kind,
            blocks,
            group_blocks: group / QK,
            groups,
            codes: crate::mem::zeroed_bytes(tiles * blocks * kind.block_bytes()),
            scales: crate::mem::zeroed_u16(tiles * groups * TILE),
            biases: if bias.is_some() {
                vec![0u16; tiles * groups * TILE]
            } else {
                Vec::new()
            },
        };
        let mut buf = [0u8; QK];
        for r in 0..rows {
            let (t, ri) = (r / TILE, r % TILE);
            for b in 0..blocks {
                fill(r, b, &mut buf);
                // Same placement as `decode_block`, written out per 4-byte group.
                let base = p.tile_block_base(t, b) + ri * 4;
                if kind.is_q4() {
                    for k in 0..4 {
                        let dst = &mut p.codes[base + k * 64..base + k * 64 + 4];
                        for i in 0..4 {
                            dst[i] = (buf[4 * k + i] & 15) | ((buf[16 + 4 * k + i] & 15) << 4);
                        }
                    }
                } else {
                    for j in 0..8 {
                        p.codes[base + j * 64..base + j * 64 + 4]
                            .copy_from_slice(&buf[4 * j..4 * j + 4]);
                    }
                }
            }
            for g in 0..groups {
                let i = p.scale_index(t, g) + ri;
                p.scales[i] = scale(r, g);
                if let Some(bias) = bias {
                    p.biases[i] = bias(r, g);
                }
            }
        }
        crate::mem::collapse_huge(&p.codes);
        p
    }
}

/// Where the activation quantizer writes one row: the codes, and per block of 32 values its
/// scale, exact sum and code sum. One value instead of four slices, two of them `&mut [f32]`
/// (scales and sums) that a call could swap unnoticed.
#[derive(Debug)]
pub struct ActRowOut<'a> {
    /// Codes, `x.len()` of them.
    pub q: &'a mut [i8],
    /// Scale `max|x|/127` per block.
    pub d: &'a mut [f32],
    /// Exact f32 sum per block.
    pub s: &'a mut [f32],
    /// Sum of the codes per block.
    pub qs: &'a mut [i32],
}

/// Activations prepared for one product (quantized when the weights are quantized).
pub(crate) struct Act<'a> {
    pub(crate) q: &'a [i8],
    pub(crate) d: &'a [f32],
    pub(crate) s: &'a [f32],
    pub(crate) qs: &'a [i32],
    /// The codes `q` as unsigned bytes `q + 128` (AVX-512 q8 kernels).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub(crate) qu: &'a [u8],
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
    pub(crate) data: Vec<f32>,
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
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub(crate) fn data_ptr(&self) -> *const f32 {
        self.data.as_ptr()
    }
}

/// A view of B: row `c` is the `n` consecutive values at `src[offs[c]..]`. A convolution's
/// rows are its input channels at each tap (`Conv1d` reads a strided input through its phases,
/// so every view is contiguous along `t`).
pub(crate) struct BView<'a> {
    pub(crate) src: &'a [f32],
    pub(crate) offs: &'a [usize],
    pub(crate) n: usize,
    /// Kernels that can should read whole panels in place rather than gather them: set when
    /// consecutive rows overlap (the taps of a stride-1 convolution), so the rows of a panel
    /// share cache lines. Measured on AVX-512 (one thread, Mimi's layers, `docs/bench-log.md`): in
    /// place is 6–15 % faster for the k = 3 and k = 7 layers, gathering 3–25 % faster when the
    /// rows are far apart (k = 1 layers, phases of a strided one), where a contiguous copy
    /// streams better than rows spread over the input.
    pub(crate) in_place: bool,
}

impl BView<'_> {
    /// Values `t0..t0 + len` of row `c`.
    #[inline(always)]
    pub(crate) fn row(&self, c: usize, t0: usize, len: usize) -> &[f32] {
        let base = self.offs[c] + t0;
        &self.src[base..base + len]
    }
}

/// Copies column panels `q..q + w` of B into `dst` as `[k][16·w]`, zero padded.
pub(crate) fn gather(b: &BView<'_>, k: usize, q: usize, w: usize, dst: &mut [f32]) {
    let ldb = w * NR;
    let t0 = q * NR;
    let nv = (b.n - t0).min(ldb);
    if nv == ldb {
        // Whole panels: copies of a length known at compile time stay inline (a `memmove`
        // call per 16 or 32 floats cost as much as the copy itself).
        match w {
            1 => return gather_rows::<NR>(b, k, t0, dst),
            2 => return gather_rows::<{ 2 * NR }>(b, k, t0, dst),
            _ => {}
        }
    }
    for (cc, dst) in dst[..k * ldb].chunks_exact_mut(ldb).enumerate() {
        dst[..nv].copy_from_slice(b.row(cc, t0, nv));
        dst[nv..].fill(0.0);
    }
}

/// [`gather`] of `L` whole columns from `t0`.
fn gather_rows<const L: usize>(b: &BView<'_>, k: usize, t0: usize, dst: &mut [f32]) {
    for (cc, dst) in dst[..k * L].chunks_exact_mut(L).enumerate() {
        dst.copy_from_slice(b.row(cc, t0, L));
    }
}
