//! Weight matrices in several formats and their matrix-vector products.

use half::{bf16, f16};

use crate::cpu::{simd_level, SimdLevel};
use crate::quant::{quantize_act_row, QK};
use crate::{check_len, KernelError, Storage};

/// Rows per interleaved tile of the repacked quantized layouts (and the unit of work
/// the pool splits by).
pub(crate) const TILE: usize = 8;

/// Storage format of a weight matrix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WeightFormat {
    /// 32-bit IEEE floats.
    F32,
    /// bfloat16.
    Bf16,
    /// IEEE half precision.
    F16,
    /// GGUF Q8_0: blocks of 32 along `cols`, 34 bytes = f16 scale + 32 × i8.
    Q8_0,
    /// GGUF Q4_0: blocks of 32 along `cols`, 18 bytes = f16 scale `d` + 16 bytes
    /// (low nibbles elements 0..15, high nibbles 16..31), value = `d·(q−8)`.
    Q4_0,
    /// MLX affine quantization: u32-packed codes (low bits first), bf16 scale and bias
    /// per `group` consecutive values of a row, `w = scale·q + bias`.
    MlxAffine {
        /// Bits per code: 4 or 8.
        bits: u8,
        /// Values per group (a multiple of 32; MLX uses 32 or 64).
        group: usize,
    },
}

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
    fn build(
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
        p
    }
}

/// Dense element storage, borrowed when suitably aligned, otherwise copied.
enum Dense {
    F32(Storage),
    F32Owned(Vec<f32>),
    U16(Storage),
    U16Owned(Vec<u16>),
}

impl Dense {
    fn f32s(&self) -> &[f32] {
        match self {
            Dense::F32Owned(v) => v,
            Dense::F32(s) => {
                let b = s.as_bytes();
                // SAFETY: alignment to 4 was checked at construction; any bit pattern is a valid f32.
                unsafe { std::slice::from_raw_parts(b.as_ptr() as *const f32, b.len() / 4) }
            }
            _ => &[],
        }
    }
    fn u16s(&self) -> &[u16] {
        match self {
            Dense::U16Owned(v) => v,
            Dense::U16(s) => {
                let b = s.as_bytes();
                // SAFETY: alignment to 2 was checked at construction.
                unsafe { std::slice::from_raw_parts(b.as_ptr() as *const u16, b.len() / 2) }
            }
            _ => &[],
        }
    }
}

enum Data {
    Dense(Dense),
    Quant(QPacked),
}

/// A weight matrix `[rows = out, cols = in]` in any supported format (quantized formats
/// are repacked at construction into 8-row interleaved tiles).
pub struct Matrix {
    rows: usize,
    cols: usize,
    format: WeightFormat,
    data: Data,
}

impl std::fmt::Debug for Matrix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Matrix")
            .field("rows", &self.rows)
            .field("cols", &self.cols)
            .field("format", &self.format)
            .finish()
    }
}

/// Reusable buffers for the matrix products (quantized activations). Grows to the
/// largest size used and then never allocates again.
#[derive(Default, Debug)]
pub struct Scratch {
    pub(crate) q: Vec<i8>,
    pub(crate) d: Vec<f32>,
    pub(crate) s: Vec<f32>,
    pub(crate) qs: Vec<i32>,
    pub(crate) qu: Vec<u8>,
}

impl Scratch {
    /// An empty scratch space.
    pub fn new() -> Scratch {
        Scratch::default()
    }
}

/// Activations prepared for one product (quantized when the weights are quantized).
pub(crate) struct Act<'a> {
    pub(crate) q: &'a [i8],
    pub(crate) d: &'a [f32],
    pub(crate) s: &'a [f32],
    pub(crate) qs: &'a [i32],
    /// The codes `q` as unsigned bytes `q + 128` (AVX-512 q8 kernels).
    pub(crate) qu: &'a [u8],
}

fn grow<T: Default + Clone>(v: &mut Vec<T>, n: usize) {
    if v.len() < n {
        v.resize(n, T::default());
    }
}

fn check_dims(rows: usize, cols: usize) -> Result<(), KernelError> {
    if rows == 0 || cols == 0 {
        return Err(KernelError::BadShape(format!(
            "matrix {rows}x{cols} has a zero dimension"
        )));
    }
    Ok(())
}

impl Matrix {
    /// A dense f32 matrix from row-major values (`rows·cols` of them).
    pub fn from_f32(rows: usize, cols: usize, data: Vec<f32>) -> Result<Matrix, KernelError> {
        check_dims(rows, cols)?;
        check_len("f32 matrix values", rows * cols, data.len())?;
        Ok(Matrix {
            rows,
            cols,
            format: WeightFormat::F32,
            data: Data::Dense(Dense::F32Owned(data)),
        })
    }

    /// A matrix from bytes laid out as the on-disk format: F32/Bf16/F16 little-endian
    /// row-major; Q8_0/Q4_0 GGUF blocks per row (`cols` must be a multiple of 32).
    /// MLX affine weights come in three tensors: use [`Matrix::from_mlx`].
    pub fn from_bytes(
        format: WeightFormat,
        rows: usize,
        cols: usize,
        bytes: Storage,
    ) -> Result<Matrix, KernelError> {
        check_dims(rows, cols)?;
        let n = rows
            .checked_mul(cols)
            .ok_or_else(|| KernelError::BadShape("size overflow".into()))?;
        let data = match format {
            WeightFormat::F32 => {
                check_len("f32 matrix bytes", n * 4, bytes.len())?;
                if (bytes.as_bytes().as_ptr() as usize).is_multiple_of(4) {
                    Dense::F32(bytes)
                } else {
                    Dense::F32Owned(
                        bytes
                            .as_bytes()
                            .chunks_exact(4)
                            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                            .collect(),
                    )
                }
            }
            WeightFormat::Bf16 | WeightFormat::F16 => {
                check_len("16-bit matrix bytes", n * 2, bytes.len())?;
                if (bytes.as_bytes().as_ptr() as usize).is_multiple_of(2) {
                    Dense::U16(bytes)
                } else {
                    Dense::U16Owned(
                        bytes
                            .as_bytes()
                            .chunks_exact(2)
                            .map(|c| u16::from_le_bytes([c[0], c[1]]))
                            .collect(),
                    )
                }
            }
            WeightFormat::Q8_0 | WeightFormat::Q4_0 => {
                if !cols.is_multiple_of(QK) {
                    return Err(KernelError::BadShape(format!(
                        "{format:?} needs cols % 32 == 0, got {cols}"
                    )));
                }
                let bb = if format == WeightFormat::Q8_0 { 34 } else { 18 };
                let blocks = cols / QK;
                check_len("GGUF block bytes", rows * blocks * bb, bytes.len())?;
                let src = bytes.as_bytes();
                let blk =
                    |r: usize, b: usize| &src[(r * blocks + b) * bb..(r * blocks + b + 1) * bb];
                let scale = |r: usize, g: usize| {
                    let x = blk(r, g);
                    u16::from_le_bytes([x[0], x[1]])
                };
                let q = if format == WeightFormat::Q8_0 {
                    QPacked::build(
                        QKind::Q8Sym,
                        rows,
                        cols,
                        QK,
                        |r, b, out| out.copy_from_slice(&blk(r, b)[2..]),
                        scale,
                        None,
                    )
                } else {
                    QPacked::build(
                        QKind::Q4Sym,
                        rows,
                        cols,
                        QK,
                        |r, b, out| {
                            let x = &blk(r, b)[2..];
                            for j in 0..16 {
                                out[j] = x[j] & 15;
                                out[j + 16] = x[j] >> 4;
                            }
                        },
                        scale,
                        None,
                    )
                };
                return Ok(Matrix {
                    rows,
                    cols,
                    format,
                    data: Data::Quant(q),
                });
            }
            WeightFormat::MlxAffine { .. } => {
                return Err(KernelError::Unsupported(
                    "MLX affine weights need Matrix::from_mlx".into(),
                ))
            }
        };
        Ok(Matrix {
            rows,
            cols,
            format,
            data: Data::Dense(data),
        })
    }

    /// MLX affine weights: `w` u32-packed codes `[rows, cols·bits/32]` (little-endian,
    /// low bits first), `scales`/`biases` bf16 `[rows, cols/group]`. `bits` ∈ {4, 8};
    /// `group` a positive multiple of 32 dividing `cols`.
    pub fn from_mlx(
        bits: u8,
        group: usize,
        rows: usize,
        cols: usize,
        w: Storage,
        scales: Storage,
        biases: Storage,
    ) -> Result<Matrix, KernelError> {
        check_dims(rows, cols)?;
        if !(bits == 4 || bits == 8) {
            return Err(KernelError::Unsupported(format!(
                "MLX affine with {bits} bits"
            )));
        }
        if group == 0 || !group.is_multiple_of(QK) || !cols.is_multiple_of(group) {
            return Err(KernelError::BadShape(format!(
                "MLX group {group} does not fit cols {cols}"
            )));
        }
        let groups = cols / group;
        check_len(
            "MLX packed codes bytes",
            rows * cols * bits as usize / 8,
            w.len(),
        )?;
        check_len("MLX scales bytes", rows * groups * 2, scales.len())?;
        check_len("MLX biases bytes", rows * groups * 2, biases.len())?;
        let (wb, sb, bb) = (w.as_bytes(), scales.as_bytes(), biases.as_bytes());
        let row_bytes = cols * bits as usize / 8;
        let u16_at = |b: &[u8], r: usize, g: usize| {
            let i = (r * groups + g) * 2;
            u16::from_le_bytes([b[i], b[i + 1]])
        };
        let scale = |r: usize, g: usize| u16_at(sb, r, g);
        let bias = |r: usize, g: usize| u16_at(bb, r, g);
        let q = if bits == 4 {
            QPacked::build(
                QKind::Affine4,
                rows,
                cols,
                group,
                |r, b, out| {
                    let x = &wb[r * row_bytes + b * 16..r * row_bytes + b * 16 + 16];
                    for j in 0..16 {
                        out[2 * j] = x[j] & 15;
                        out[2 * j + 1] = x[j] >> 4;
                    }
                },
                scale,
                Some(&bias),
            )
        } else {
            QPacked::build(
                QKind::Affine8,
                rows,
                cols,
                group,
                |r, b, out| {
                    let x = &wb[r * row_bytes + b * 32..r * row_bytes + b * 32 + 32];
                    for j in 0..32 {
                        out[j] = x[j] ^ 0x80; // q − 128 as a signed byte
                    }
                },
                scale,
                Some(&bias),
            )
        };
        Ok(Matrix {
            rows,
            cols,
            format: WeightFormat::MlxAffine { bits, group },
            data: Data::Quant(q),
        })
    }

    /// Number of rows (outputs).
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Number of columns (inputs).
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// The format the matrix was loaded from.
    pub fn format(&self) -> WeightFormat {
        self.format
    }

    /// Bytes of weight data the products stream per call (for bandwidth figures).
    pub fn weight_bytes(&self) -> usize {
        match &self.data {
            Data::Dense(Dense::F32(_) | Dense::F32Owned(_)) => self.rows * self.cols * 4,
            Data::Dense(_) => self.rows * self.cols * 2,
            // The real tiles only (the padding tile of an odd count is never read).
            Data::Quant(q) => {
                let t = self.tiles();
                let sb = if q.biases.is_empty() { 2 } else { 4 };
                t * q.blocks * q.kind.block_bytes() + t * q.groups * TILE * sb
            }
        }
    }

    /// `y[rows] = W · x[cols]` (single thread, allocation-free once `scratch` has grown).
    pub fn matvec(&self, x: &[f32], y: &mut [f32], scratch: &mut Scratch) {
        self.matmul(x, 1, y, scratch)
    }

    /// `n` activation rows against the same weights, weights read once: `x [n, cols]`,
    /// `y [n, rows]`. Meant for `n` in 1..=8 (larger `n` works too).
    pub fn matmul(&self, x: &[f32], n: usize, y: &mut [f32], scratch: &mut Scratch) {
        self.matmul_level(simd_level(), x, n, y, scratch)
    }

    /// Scalar reference of [`Matrix::matmul`] (same activation quantization, portable code).
    pub fn matmul_reference(&self, x: &[f32], n: usize, y: &mut [f32], scratch: &mut Scratch) {
        self.matmul_level(SimdLevel::Scalar, x, n, y, scratch)
    }

    fn matmul_level(
        &self,
        level: SimdLevel,
        x: &[f32],
        n: usize,
        y: &mut [f32],
        scratch: &mut Scratch,
    ) {
        assert!(
            x.len() >= n * self.cols && y.len() >= n * self.rows,
            "matmul: buffer too short"
        );
        let act = self.prepare(x, n, scratch);
        // SAFETY: y holds n·rows values (checked above) and nothing else aliases it.
        unsafe { self.compute_rows(level, &act, x, n, 0, self.rows, y.as_mut_ptr()) }
    }

    /// Number of 8-row tiles (the unit of work splitting).
    pub(crate) fn tiles(&self) -> usize {
        self.rows.div_ceil(TILE)
    }

    /// Quantizes the activations when the weights are quantized.
    pub(crate) fn prepare<'a>(&self, x: &[f32], n: usize, scratch: &'a mut Scratch) -> Act<'a> {
        if let Data::Quant(_) = self.data {
            let nb = self.cols / QK;
            grow(&mut scratch.q, n * self.cols);
            grow(&mut scratch.d, n * nb);
            grow(&mut scratch.s, n * nb);
            grow(&mut scratch.qs, n * nb);
            grow(&mut scratch.qu, n * self.cols);
            for i in 0..n {
                quantize_act_row(
                    &x[i * self.cols..(i + 1) * self.cols],
                    &mut scratch.q[i * self.cols..(i + 1) * self.cols],
                    &mut scratch.d[i * nb..(i + 1) * nb],
                    &mut scratch.s[i * nb..(i + 1) * nb],
                    &mut scratch.qs[i * nb..(i + 1) * nb],
                );
            }
            for (u, &c) in scratch.qu[..n * self.cols]
                .iter_mut()
                .zip(&scratch.q[..n * self.cols])
            {
                *u = (c as u8) ^ 0x80;
            }
            Act {
                q: &scratch.q,
                d: &scratch.d,
                s: &scratch.s,
                qs: &scratch.qs,
                qu: &scratch.qu,
            }
        } else {
            Act {
                q: &[],
                d: &[],
                s: &[],
                qs: &[],
                qu: &[],
            }
        }
    }

    /// Computes outputs for rows `r0..r1` (`r0` a multiple of 8) of all `n` activation rows.
    ///
    /// # Safety
    /// `y` must point to `n·rows` writable f32 values; no other thread may write rows `r0..r1`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) unsafe fn compute_rows(
        &self,
        level: SimdLevel,
        act: &Act<'_>,
        x: &[f32],
        n: usize,
        r0: usize,
        r1: usize,
        y: *mut f32,
    ) {
        #[cfg(target_arch = "x86_64")]
        if level == SimdLevel::Avx2 {
            let (rows, cols) = (self.rows, self.cols);
            match &self.data {
                Data::Dense(d @ (Dense::F32(_) | Dense::F32Owned(_))) => {
                    crate::x86::dense_f32(d.f32s(), rows, cols, x, n, r0, r1, y)
                }
                Data::Dense(d) if self.format == WeightFormat::Bf16 => {
                    crate::x86::dense_bf16(d.u16s(), rows, cols, x, n, r0, r1, y)
                }
                Data::Dense(d) => crate::x86::dense_f16(d.u16s(), rows, cols, x, n, r0, r1, y),
                Data::Quant(q) => crate::x86::quant(q, rows, cols, act, n, r0, r1, y),
            }
            return;
        }
        let _ = level;
        self.compute_rows_scalar(act, x, n, r0, r1, y)
    }

    unsafe fn compute_rows_scalar(
        &self,
        act: &Act<'_>,
        x: &[f32],
        n: usize,
        r0: usize,
        r1: usize,
        y: *mut f32,
    ) {
        let (rows, cols) = (self.rows, self.cols);
        match &self.data {
            Data::Dense(d) => {
                for r in r0..r1 {
                    for i in 0..n {
                        let xi = &x[i * cols..(i + 1) * cols];
                        let v = match d {
                            Dense::F32(_) | Dense::F32Owned(_) => {
                                dot_f32(&d.f32s()[r * cols..(r + 1) * cols], xi)
                            }
                            _ => {
                                let w = &d.u16s()[r * cols..(r + 1) * cols];
                                if self.format == WeightFormat::Bf16 {
                                    dot_conv(w, xi, |b| bf16::from_bits(b).to_f32())
                                } else {
                                    dot_conv(w, xi, |b| f16::from_bits(b).to_f32())
                                }
                            }
                        };
                        *y.add(i * rows + r) = v;
                    }
                }
            }
            Data::Quant(q) => {
                let nb = q.blocks;
                let mut codes = [0i8; QK];
                let mut acc = [0f32; 8];
                let mut corr = [0f32; 8];
                let n8 = n.min(8);
                let mut i0 = 0;
                while i0 < n {
                    let ni = n8.min(n - i0);
                    for r in r0..r1 {
                        let (t, ri) = (r / TILE, r % TILE);
                        acc[..ni].fill(0.0);
                        corr[..ni].fill(0.0);
                        for b in 0..nb {
                            q.decode_block(t, b, ri, &mut codes);
                            let (s, bias) = q.scale_bias(t, b / q.group_blocks, ri);
                            for ii in 0..ni {
                                let i = i0 + ii;
                                let xq = &act.q[i * cols + b * QK..i * cols + (b + 1) * QK];
                                let mut isum = 0i32;
                                for (&c, &xv) in codes.iter().zip(xq) {
                                    isum += c as i32 * xv as i32;
                                }
                                if q.kind == QKind::Affine8 {
                                    isum += 128 * act.qs[i * nb + b];
                                }
                                acc[ii] = (s * act.d[i * nb + b]).mul_add(isum as f32, acc[ii]);
                                corr[ii] = bias.mul_add(act.s[i * nb + b], corr[ii]);
                            }
                        }
                        for ii in 0..ni {
                            *y.add((i0 + ii) * rows + r) = acc[ii] + corr[ii];
                        }
                    }
                    i0 += ni;
                }
            }
        }
    }

    /// Dequantizes row `r` to f32 (embedding lookup). `out.len()` must be `cols`.
    pub fn row_f32(&self, r: usize, out: &mut [f32]) {
        assert!(
            r < self.rows && out.len() == self.cols,
            "row_f32: bad row or length"
        );
        let cols = self.cols;
        match &self.data {
            Data::Dense(d @ (Dense::F32(_) | Dense::F32Owned(_))) => {
                out.copy_from_slice(&d.f32s()[r * cols..(r + 1) * cols])
            }
            Data::Dense(d) => {
                let w = &d.u16s()[r * cols..(r + 1) * cols];
                for (o, &b) in out.iter_mut().zip(w) {
                    *o = if self.format == WeightFormat::Bf16 {
                        bf16::from_bits(b).to_f32()
                    } else {
                        f16::from_bits(b).to_f32()
                    };
                }
            }
            Data::Quant(q) => {
                let (t, ri) = (r / TILE, r % TILE);
                let mut codes = [0i8; QK];
                for b in 0..q.blocks {
                    let (s, bias) = q.scale_bias(t, b / q.group_blocks, ri);
                    q.decode_block(t, b, ri, &mut codes);
                    for (e, &c) in codes.iter().enumerate() {
                        let c = c as i32;
                        out[b * QK + e] = match q.kind {
                            QKind::Q8Sym => s * c as f32,
                            QKind::Q4Sym => s * (c - 8) as f32,
                            QKind::Affine4 => s * c as f32 + bias,
                            QKind::Affine8 => s * (c + 128) as f32 + bias,
                        };
                    }
                }
            }
        }
    }
}

fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let mut ca = a.chunks_exact(8);
    let mut cb = b.chunks_exact(8);
    for (x, y) in (&mut ca).zip(&mut cb) {
        for k in 0..8 {
            acc[k] = x[k].mul_add(y[k], acc[k]);
        }
    }
    let mut s: f32 = acc.iter().sum();
    for (x, y) in ca.remainder().iter().zip(cb.remainder()) {
        s = x.mul_add(*y, s);
    }
    s
}

fn dot_conv(a: &[u16], b: &[f32], conv: impl Fn(u16) -> f32) -> f32 {
    let mut acc = [0f32; 8];
    let mut ca = a.chunks_exact(8);
    let mut cb = b.chunks_exact(8);
    for (x, y) in (&mut ca).zip(&mut cb) {
        for k in 0..8 {
            acc[k] = conv(x[k]).mul_add(y[k], acc[k]);
        }
    }
    let mut s: f32 = acc.iter().sum();
    for (x, y) in ca.remainder().iter().zip(cb.remainder()) {
        s = conv(*x).mul_add(*y, s);
    }
    s
}

// Keep the tile size and block size in sync with the SIMD kernels.
const _: () = assert!(TILE == 8 && QK == 32);
