//! Weight matrices in several formats and their matrix-vector products.

use half::{bf16, f16};

use crate::arch::{self, KernelSet, Kernels, MatmulSpan};
use crate::layout::{Act, QKind, QPacked, TILE};
use crate::quant::{encode_mlx, encode_q4_0, encode_q8_0, quantize_act_row, ActRowOut, QK};
use crate::{check_len, KernelError, Storage};

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
            // SAFETY: alignment to 4 was checked at construction; any bit pattern is a valid f32.
            Dense::F32(s) => unsafe { view(s) },
            _ => &[],
        }
    }
    fn u16s(&self) -> &[u16] {
        match self {
            Dense::U16Owned(v) => v,
            // SAFETY: alignment to 2 was checked at construction.
            Dense::U16(s) => unsafe { view(s) },
            _ => &[],
        }
    }
}

/// The bytes of `s` as `T`s (the tail short of a whole `T` left out).
///
/// # Safety
/// `s` is aligned for `T` and every bit pattern is a valid `T`.
unsafe fn view<T>(s: &Storage) -> &[T] {
    let b = s.as_bytes();
    std::slice::from_raw_parts(b.as_ptr() as *const T, b.len() / std::mem::size_of::<T>())
}

/// `None` when `bytes` is aligned for `T` (it can be viewed in place), else its `W`-byte
/// little-endian values decoded into a vector.
fn unaligned_copy<T, const W: usize>(bytes: &Storage, from_le: fn([u8; W]) -> T) -> Option<Vec<T>> {
    let b = bytes.as_bytes();
    if (b.as_ptr() as usize).is_multiple_of(std::mem::align_of::<T>()) {
        return None;
    }
    let le = |c: &[u8]| from_le(c.try_into().expect("chunks of W bytes"));
    Some(b.chunks_exact(W).map(le).collect())
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

/// The shape checks of a matrix's on-disk bytes, shared by [`Matrix::from_bytes`] and
/// [`CheckpointParts::from_bytes`]: no zero dimension, `rows·cols` without overflow (returned),
/// and whole 32-value blocks per row for the GGUF formats.
fn check_bytes_shape(format: WeightFormat, rows: usize, cols: usize) -> Result<usize, KernelError> {
    check_dims(rows, cols)?;
    let n = rows
        .checked_mul(cols)
        .ok_or_else(|| KernelError::BadShape("size overflow".into()))?;
    if matches!(format, WeightFormat::Q8_0 | WeightFormat::Q4_0) && !cols.is_multiple_of(QK) {
        return Err(KernelError::BadShape(format!(
            "{format:?} needs cols % 32 == 0, got {cols}"
        )));
    }
    Ok(n)
}

/// The checks of MLX affine weights' three tensors (their byte lengths), shared by
/// [`Matrix::from_mlx`] and [`CheckpointParts::from_mlx`]: `bits` 4 or 8, `group` a positive
/// multiple of 32 dividing `cols`, and lengths that fit the shape. Returns the groups per row.
fn check_mlx(
    bits: u8,
    group: usize,
    rows: usize,
    cols: usize,
    [w, scales, biases]: [usize; 3],
) -> Result<usize, KernelError> {
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
    check_len("MLX packed codes bytes", rows * cols * bits as usize / 8, w)?;
    check_len("MLX scales bytes", rows * groups * 2, scales)?;
    check_len("MLX biases bytes", rows * groups * 2, biases)?;
    Ok(groups)
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
        let n = check_bytes_shape(format, rows, cols)?;
        let data = match format {
            WeightFormat::F32 => {
                check_len("f32 matrix bytes", n * 4, bytes.len())?;
                match unaligned_copy(&bytes, f32::from_le_bytes) {
                    None => Dense::F32(bytes),
                    Some(v) => Dense::F32Owned(v),
                }
            }
            WeightFormat::Bf16 | WeightFormat::F16 => {
                check_len("16-bit matrix bytes", n * 2, bytes.len())?;
                match unaligned_copy(&bytes, u16::from_le_bytes) {
                    None => Dense::U16(bytes),
                    Some(v) => Dense::U16Owned(v),
                }
            }
            WeightFormat::Q8_0 | WeightFormat::Q4_0 => {
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
                let q8 = format == WeightFormat::Q8_0;
                let kind = if q8 { QKind::Q8Sym } else { QKind::Q4Sym };
                let fill = |r: usize, b: usize, out: &mut [u8; QK]| {
                    let x = &blk(r, b)[2..];
                    if q8 {
                        out.copy_from_slice(x);
                    } else {
                        for j in 0..16 {
                            out[j] = x[j] & 15;
                            out[j + 16] = x[j] >> 4;
                        }
                    }
                };
                let q = QPacked::build(kind, rows, cols, QK, fill, scale, None);
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
        let groups = check_mlx(
            bits,
            group,
            rows,
            cols,
            [w.len(), scales.len(), biases.len()],
        )?;
        let (wb, sb, bb) = (w.as_bytes(), scales.as_bytes(), biases.as_bytes());
        let row_bytes = cols * bits as usize / 8;
        let u16_at = |b: &[u8], r: usize, g: usize| {
            let i = (r * groups + g) * 2;
            u16::from_le_bytes([b[i], b[i + 1]])
        };
        let scale = |r: usize, g: usize| u16_at(sb, r, g);
        let bias = |r: usize, g: usize| u16_at(bb, r, g);
        let kind = if bits == 4 {
            QKind::Affine4
        } else {
            QKind::Affine8
        };
        // Bytes of one block of 32 codes.
        let bb = 4 * bits as usize;
        let fill = |r: usize, b: usize, out: &mut [u8; QK]| {
            let x = &wb[r * row_bytes + b * bb..r * row_bytes + (b + 1) * bb];
            if bits == 4 {
                for j in 0..16 {
                    out[2 * j] = x[j] & 15;
                    out[2 * j + 1] = x[j] >> 4;
                }
            } else {
                for j in 0..32 {
                    out[j] = x[j] ^ 0x80; // q − 128 as a signed byte
                }
            }
        };
        let q = QPacked::build(kind, rows, cols, group, fill, scale, Some(&bias));
        Ok(Matrix {
            rows,
            cols,
            format: WeightFormat::MlxAffine { bits, group },
            data: Data::Quant(q),
        })
    }

    /// A matrix in `format` from f32 values (row-major `[rows, cols]`), encoded the way the
    /// on-disk formats are (`quant::encode_*` for Q8_0 / Q4_0 / MLX, round-to-nearest for
    /// bf16 / f16): for tests, benchmarks and synthetic weights.
    pub fn encode(
        format: WeightFormat,
        rows: usize,
        cols: usize,
        vals: &[f32],
    ) -> Result<Matrix, KernelError> {
        match format {
            WeightFormat::F32 => Matrix::from_f32(rows, cols, vals.to_vec()),
            WeightFormat::Bf16 | WeightFormat::F16 => {
                let b: Vec<u8> = vals
                    .iter()
                    .flat_map(|v| {
                        if format == WeightFormat::Bf16 {
                            half::bf16::from_f32(*v).to_bits().to_le_bytes()
                        } else {
                            half::f16::from_f32(*v).to_bits().to_le_bytes()
                        }
                    })
                    .collect();
                Matrix::from_bytes(format, rows, cols, Storage::from_vec(b))
            }
            WeightFormat::Q8_0 => {
                Matrix::from_bytes(format, rows, cols, Storage::from_vec(encode_q8_0(vals)?))
            }
            WeightFormat::Q4_0 => {
                Matrix::from_bytes(format, rows, cols, Storage::from_vec(encode_q4_0(vals)?))
            }
            WeightFormat::MlxAffine { bits, group } => {
                let (c, s, b) = encode_mlx(bits, group, rows, cols, vals)?;
                Matrix::from_mlx(
                    bits,
                    group,
                    rows,
                    cols,
                    Storage::from_vec(c),
                    Storage::from_vec(s),
                    Storage::from_vec(b),
                )
            }
        }
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
        self.matmul_level(arch::active(), x, n, y, scratch)
    }

    /// Scalar reference of [`Matrix::matmul`] (same activation quantization, portable code).
    pub fn matmul_reference(&self, x: &[f32], n: usize, y: &mut [f32], scratch: &mut Scratch) {
        self.matmul_level(arch::table(KernelSet::Scalar), x, n, y, scratch)
    }

    /// [`Matrix::matmul`] with the kernels of an explicit set (property tests and A/B
    /// benchmarks); refuses a set this CPU cannot run.
    pub fn matmul_with(
        &self,
        set: KernelSet,
        x: &[f32],
        n: usize,
        y: &mut [f32],
        scratch: &mut Scratch,
    ) -> Result<(), KernelError> {
        self.matmul_level(arch::checked_table(set)?, x, n, y, scratch);
        Ok(())
    }

    fn matmul_level(
        &self,
        level: &Kernels,
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
        if matches!(self.data, Data::Quant(_)) && !arch::f32_activations() {
            let nb = self.cols / QK;
            grow(&mut scratch.q, n * self.cols);
            grow(&mut scratch.d, n * nb);
            grow(&mut scratch.s, n * nb);
            grow(&mut scratch.qs, n * nb);
            grow(&mut scratch.qu, n * self.cols);
            for i in 0..n {
                let out = ActRowOut {
                    q: &mut scratch.q[i * self.cols..(i + 1) * self.cols],
                    d: &mut scratch.d[i * nb..(i + 1) * nb],
                    s: &mut scratch.s[i * nb..(i + 1) * nb],
                    qs: &mut scratch.qs[i * nb..(i + 1) * nb],
                };
                quantize_act_row(&x[i * self.cols..(i + 1) * self.cols], out);
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

    /// Computes outputs for rows `r0..r1` (`r0` a multiple of 8) of all `n` activation rows
    /// with the kernels of `level` (quantized weights against exact f32 activations when
    /// [`crate::f32_activations`] is on; `act` is then empty).
    ///
    /// # Safety
    /// `level` is available on this CPU; `y` must point to `n·rows` writable f32 values; no
    /// other thread may write rows `r0..r1`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) unsafe fn compute_rows(
        &self,
        level: &Kernels,
        act: &Act<'_>,
        x: &[f32],
        n: usize,
        r0: usize,
        r1: usize,
        y: *mut f32,
    ) {
        let span = MatmulSpan {
            rows: self.rows,
            cols: self.cols,
            n,
            r0,
            r1,
        };
        match &self.data {
            Data::Dense(d @ (Dense::F32(_) | Dense::F32Owned(_))) => {
                (level.dense_f32)(d.f32s(), x, span, y)
            }
            Data::Dense(d) if self.format == WeightFormat::Bf16 => {
                (level.dense_bf16)(d.u16s(), x, span, y)
            }
            Data::Dense(d) => (level.dense_f16)(d.u16s(), x, span, y),
            Data::Quant(q) if act.q.is_empty() => arch::scalar::quant_f32_act(q, x, span, y),
            Data::Quant(q) => (level.quant)(q, act, span, y),
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
                let mut w = [0f32; QK];
                for b in 0..q.blocks {
                    arch::scalar::dequant_block(q, t, b, ri, &mut w);
                    out[b * QK..(b + 1) * QK].copy_from_slice(&w);
                }
            }
        }
    }
}

/// A matrix's weights in the layout of its checkpoint format, row-major, for a device that
/// dequantizes them itself (the GPU backend uploads these bytes unchanged).
///
/// * `F32` / `Bf16` / `F16`: `codes` holds the little-endian values (`rows·cols·4` or `·2` bytes);
///   `scales` and `biases` are empty.
/// * `Q8_0`: `codes` the signed 8-bit codes (`rows·cols` bytes), `scales` the f16 bits of each
///   32-value block (`rows·cols/32`); the GGUF block is `scale ‖ codes`, split here into two planes.
/// * `Q4_0`: `codes` the GGUF nibbles (`rows·cols/2` bytes; per block, byte `j` holds value `j` in
///   its low nibble and value `j + 16` in its high nibble), `scales` as for Q8_0; value `d·(q − 8)`.
/// * `MlxAffine`: `codes` the MLX packed codes (`rows·cols·bits/8` bytes, low bits first: for 4
///   bits, byte `j` holds values `2j` and `2j + 1`), `scales` / `biases` the bf16 bits per group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointParts {
    /// Codes or dense values (see the type's docs).
    pub codes: Vec<u8>,
    /// Raw 16-bit scales, one per block / group, row-major (empty for dense formats).
    pub scales: Vec<u16>,
    /// Raw bf16 biases of MLX affine weights (empty otherwise).
    pub biases: Vec<u16>,
}

impl CheckpointParts {
    /// The parts of a matrix read straight from its on-disk bytes (the layout
    /// [`Matrix::from_bytes`] takes), without building a [`Matrix`]: dense values are copied as they
    /// are, GGUF blocks split into their code and scale planes. The result equals
    /// [`Matrix::checkpoint_parts`] of the matrix built from the same bytes. Allocates; load-time only.
    pub fn from_bytes(
        format: WeightFormat,
        rows: usize,
        cols: usize,
        bytes: &[u8],
    ) -> Result<CheckpointParts, KernelError> {
        let n = check_bytes_shape(format, rows, cols)?;
        let dense = |width: usize| {
            check_len("dense matrix bytes", n * width, bytes.len())?;
            Ok(CheckpointParts {
                codes: bytes.to_vec(),
                scales: Vec::new(),
                biases: Vec::new(),
            })
        };
        match format {
            WeightFormat::F32 => dense(4),
            WeightFormat::Bf16 | WeightFormat::F16 => dense(2),
            WeightFormat::Q8_0 | WeightFormat::Q4_0 => {
                // A GGUF block is the f16 scale, then the codes (32 bytes for Q8_0, 16 of nibbles
                // for Q4_0, already in the parts' order).
                let code_bytes = if format == WeightFormat::Q8_0 { 32 } else { 16 };
                let blocks = n / QK;
                check_len("GGUF block bytes", blocks * (2 + code_bytes), bytes.len())?;
                let mut codes = Vec::with_capacity(blocks * code_bytes);
                let mut scales = Vec::with_capacity(blocks);
                for b in bytes.chunks_exact(2 + code_bytes) {
                    scales.push(u16::from_le_bytes([b[0], b[1]]));
                    codes.extend_from_slice(&b[2..]);
                }
                Ok(CheckpointParts {
                    codes,
                    scales,
                    biases: Vec::new(),
                })
            }
            WeightFormat::MlxAffine { .. } => Err(KernelError::Unsupported(
                "MLX affine weights need CheckpointParts::from_mlx".into(),
            )),
        }
    }

    /// The parts of MLX affine weights from their three tensors (the arguments of
    /// [`Matrix::from_mlx`], bf16 scales and biases), without building a [`Matrix`].
    pub fn from_mlx(
        bits: u8,
        group: usize,
        rows: usize,
        cols: usize,
        w: &[u8],
        scales: &[u8],
        biases: &[u8],
    ) -> Result<CheckpointParts, KernelError> {
        check_mlx(
            bits,
            group,
            rows,
            cols,
            [w.len(), scales.len(), biases.len()],
        )?;
        let u16s = |b: &[u8]| -> Vec<u16> {
            b.chunks_exact(2)
                .map(|c| u16::from_le_bytes([c[0], c[1]]))
                .collect()
        };
        Ok(CheckpointParts {
            codes: w.to_vec(),
            scales: u16s(scales),
            biases: u16s(biases),
        })
    }
}

impl Matrix {
    /// The weights back in their checkpoint layout ([`CheckpointParts`]); lossless for every
    /// format (the repacked tiles hold the same codes and scale bits). Allocates; load-time only.
    #[allow(clippy::needless_range_loop)]
    pub fn checkpoint_parts(&self) -> CheckpointParts {
        let (rows, cols) = (self.rows, self.cols);
        match &self.data {
            Data::Dense(d @ (Dense::F32(_) | Dense::F32Owned(_))) => CheckpointParts {
                codes: d.f32s()[..rows * cols]
                    .iter()
                    .flat_map(|v| v.to_le_bytes())
                    .collect(),
                scales: Vec::new(),
                biases: Vec::new(),
            },
            Data::Dense(d) => CheckpointParts {
                codes: d.u16s()[..rows * cols]
                    .iter()
                    .flat_map(|v| v.to_le_bytes())
                    .collect(),
                scales: Vec::new(),
                biases: Vec::new(),
            },
            Data::Quant(q) => {
                let bits = if q.kind.is_q4() { 4 } else { 8 };
                let row_bytes = cols * bits / 8;
                let mut codes = vec![0u8; rows * row_bytes];
                let mut scales = vec![0u16; rows * q.groups];
                let mut biases = if q.biases.is_empty() {
                    Vec::new()
                } else {
                    vec![0u16; rows * q.groups]
                };
                let mut blk = [0i8; QK];
                for r in 0..rows {
                    let (t, ri) = (r / TILE, r % TILE);
                    let row = &mut codes[r * row_bytes..(r + 1) * row_bytes];
                    for b in 0..q.blocks {
                        q.decode_block(t, b, ri, &mut blk);
                        match q.kind {
                            QKind::Q8Sym => {
                                for (o, &c) in row[b * QK..(b + 1) * QK].iter_mut().zip(&blk) {
                                    *o = c as u8;
                                }
                            }
                            QKind::Affine8 => {
                                for (o, &c) in row[b * QK..(b + 1) * QK].iter_mut().zip(&blk) {
                                    *o = (c as u8) ^ 0x80;
                                }
                            }
                            QKind::Q4Sym => {
                                let o = &mut row[b * 16..(b + 1) * 16];
                                for j in 0..16 {
                                    o[j] = (blk[j] as u8 & 15) | ((blk[j + 16] as u8 & 15) << 4);
                                }
                            }
                            QKind::Affine4 => {
                                let o = &mut row[b * 16..(b + 1) * 16];
                                for j in 0..16 {
                                    o[j] = (blk[2 * j] as u8 & 15)
                                        | ((blk[2 * j + 1] as u8 & 15) << 4);
                                }
                            }
                        }
                    }
                    for g in 0..q.groups {
                        let i = q.scale_index(t, g) + ri;
                        scales[r * q.groups + g] = q.scales[i];
                        if !biases.is_empty() {
                            biases[r * q.groups + g] = q.biases[i];
                        }
                    }
                }
                CheckpointParts {
                    codes,
                    scales,
                    biases,
                }
            }
        }
    }
}

// Keep the tile size and block size in sync with the SIMD kernels.
const _: () = assert!(TILE == 8 && QK == 32);
