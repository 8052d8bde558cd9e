//! Weight matrices on the device, in their checkpoint format, and the dispatches that read them.

use kernels::{CheckpointParts, Matrix, WeightFormat};

use crate::context::GpuContext;
use crate::dispatch::{Dispatch, Grid};
use crate::shaders::{Fuse, Module, MATMUL_ROWS, MAX_ROWS};
use crate::uniforms::MatParams;
use crate::{GpuError, WeightKind};

/// Rows `row0 .. row0 + rows` of a matrix, in buffers small enough for one binding.
#[derive(Debug)]
pub(crate) struct Chunk {
    pub(crate) row0: usize,
    pub(crate) rows: usize,
    pub(crate) codes: wgpu::Buffer,
    pub(crate) scales: wgpu::Buffer,
    pub(crate) biases: wgpu::Buffer,
}

/// A weight matrix `[rows, cols]` uploaded in its checkpoint format ([`kernels::CheckpointParts`]:
/// the same codes and scale bits, scales in their own plane), dequantized by the kernels that read
/// it. Split by rows into chunks when one plane would exceed the device's binding size.
#[derive(Debug)]
pub struct GpuMatrix {
    /// The checkpoint format the planes hold.
    format: WeightFormat,
    /// Its shader family (the format less its MLX group, a run-time parameter).
    kind: WeightKind,
    /// Bytes of the planes as the checkpoint gives them (codes, then scales and biases in
    /// 16 bits), before any row padding: what one product streams.
    bytes: usize,
    rows: usize,
    cols: usize,
    /// Values per scale group (1 for dense formats: unused).
    group: usize,
    /// Its first row in the planes of `chunks`: 0, or where it lies in the embedding arena whose
    /// planes it shares ([`GpuMatrix::member`]).
    base: usize,
    /// Bytes of the codes plane per row on the device: the checkpoint's row, zero-padded to a
    /// multiple of 16 (only f16/bf16 rows of `cols ≡ 4 mod 8` are padded, by 8 bytes) so that
    /// every row starts on a 16-byte boundary for the matmul's `vec4<u32>` loads.
    ld_bytes: usize,
    pub(crate) chunks: Vec<Chunk>,
}

impl GpuMatrix {
    /// Uploads `m` (load time; allocates).
    pub fn upload(ctx: &GpuContext, label: &str, m: &Matrix) -> Result<GpuMatrix, GpuError> {
        Self::upload_rows(ctx, label, m, false)
    }

    /// Uploads a gated FFN's input matrix `m` (`2h` rows: the `h` rows of `a`, then the `h` of
    /// `g`) with its rows interleaved, `a_0, g_0, a_1, g_1, ..`, for the matmul's
    /// [`Fuse::NormGate`] epilogue (each pair in one workgroup). A permutation of whole rows, so
    /// every code and scale is the checkpoint's.
    pub fn upload_gated(ctx: &GpuContext, label: &str, m: &Matrix) -> Result<GpuMatrix, GpuError> {
        Self::upload_rows(ctx, label, m, true)
    }

    fn upload_rows(
        ctx: &GpuContext,
        label: &str,
        m: &Matrix,
        gated: bool,
    ) -> Result<GpuMatrix, GpuError> {
        let parts = m.checkpoint_parts();
        Self::upload_parts(ctx, label, m.format(), m.rows(), m.cols(), parts, gated)
    }

    /// Uploads a `[rows, cols]` matrix of `format` given in its checkpoint layout (`parts`, as
    /// read from a checkpoint or un-packed from a CPU matrix), its rows interleaved for the gated
    /// epilogue when `gated` (see [`GpuMatrix::upload_gated`]). Refuses parts whose sizes do not
    /// match the shape.
    pub(crate) fn upload_parts(
        ctx: &GpuContext,
        label: &str,
        format: WeightFormat,
        rows: usize,
        cols: usize,
        mut parts: CheckpointParts,
        gated: bool,
    ) -> Result<GpuMatrix, GpuError> {
        let unsupported = |why: String| GpuError::Unsupported {
            format: format!("{format:?}"),
            why,
        };
        let kind = WeightKind::of(format).ok_or_else(|| unsupported("no kernel".into()))?;
        let group = group_of(format);
        if !cols.is_multiple_of(4) {
            return Err(unsupported(format!(
                "{label}: {cols} columns (the kernels need a multiple of 4)"
            )));
        }
        if gated && !rows.is_multiple_of(2) {
            return Err(unsupported(format!(
                "{label}: a gated matrix of {rows} rows (two halves needed)"
            )));
        }
        let (nc, ns, nb) = (parts.codes.len(), parts.scales.len(), parts.biases.len());
        if rows == 0
            || !nc.is_multiple_of(rows)
            || !ns.is_multiple_of(rows)
            || (nb != 0 && nb != ns)
        {
            return Err(unsupported(format!(
                "{label}: {nc} bytes of codes, {ns} scales and {nb} biases for {rows} rows"
            )));
        }
        let bytes = nc + 2 * (ns + nb);
        let row_bytes = parts.codes.len() / rows;
        let ld_bytes = row_bytes.div_ceil(16) * 16;
        let groups = if parts.scales.is_empty() {
            0
        } else {
            parts.scales.len() / rows
        };
        if gated {
            parts.codes = interleave_halves(&parts.codes, rows, row_bytes);
            parts.scales = interleave_halves(&parts.scales, rows, groups);
            parts.biases = interleave_halves(&parts.biases, rows, groups);
        }
        let max = ctx.max_binding() as usize;
        // Whole rows per chunk; the scale planes are 2 bytes per group.
        let per_row = ld_bytes.max(groups * 2).max(1);
        let mut chunk_rows = (max / per_row).min(rows);
        if gated {
            // A chunk holds whole pairs.
            chunk_rows -= chunk_rows % 2;
        }
        if chunk_rows == 0 {
            return Err(GpuError::DoesNotFit {
                what: format!("one row of {label}"),
                needed: per_row as u64,
                available: max as u64,
            });
        }
        let mut chunks = Vec::new();
        let mut row0 = 0;
        while row0 < rows {
            let n = chunk_rows.min(rows - row0);
            let src = &parts.codes[row0 * row_bytes..(row0 + n) * row_bytes];
            let codes = if ld_bytes == row_bytes {
                ctx.storage_init(label, src)?
            } else {
                let mut padded = vec![0u8; n * ld_bytes];
                for (d, s) in padded
                    .chunks_exact_mut(ld_bytes)
                    .zip(src.chunks_exact(row_bytes))
                {
                    d[..row_bytes].copy_from_slice(s);
                }
                ctx.storage_init(label, &padded)?
            };
            let plane = |v: &[u16]| -> Vec<u8> {
                if v.is_empty() {
                    Vec::new()
                } else {
                    v[row0 * groups..(row0 + n) * groups]
                        .iter()
                        .flat_map(|h| h.to_le_bytes())
                        .collect()
                }
            };
            let scales = ctx.storage_init(label, &plane(&parts.scales))?;
            let biases = ctx.storage_init(label, &plane(&parts.biases))?;
            chunks.push(Chunk {
                row0,
                rows: n,
                codes,
                scales,
                biases,
            });
            row0 += n;
        }
        Ok(GpuMatrix {
            format,
            kind,
            bytes,
            base: 0,
            rows,
            cols,
            group,
            ld_bytes,
            chunks,
        })
    }

    /// A `[rows, cols]` table of `format` whose planes will be rows `base .. base + rows` of an
    /// arena ([`GpuMatrix::share_planes`]); `row_bytes` of codes per row (as the checkpoint gives
    /// them), `bytes` in all. `None` for a format no kernel reads.
    pub(crate) fn member(
        format: WeightFormat,
        (rows, cols): (usize, usize),
        row_bytes: usize,
        bytes: usize,
        base: usize,
    ) -> Option<GpuMatrix> {
        Some(GpuMatrix {
            format,
            kind: WeightKind::of(format)?,
            bytes,
            base,
            rows,
            cols,
            group: group_of(format),
            ld_bytes: row_bytes.div_ceil(16) * 16,
            chunks: Vec::new(),
        })
    }

    /// Gives a member its arena's planes (the same buffers, the arena's row numbering).
    pub(crate) fn share_planes(&mut self, arena: &GpuMatrix) {
        debug_assert_eq!((self.kind, self.ld_bytes), (arena.kind, arena.ld_bytes));
        self.chunks = arena
            .chunks
            .iter()
            .map(|c| Chunk {
                row0: c.row0,
                rows: c.rows,
                codes: c.codes.clone(),
                scales: c.scales.clone(),
                biases: c.biases.clone(),
            })
            .collect();
    }

    /// Whether the two read the same planes (one arena's tables, or one matrix).
    pub(crate) fn same_planes(&self, other: &GpuMatrix) -> bool {
        self.chunks.first().map(|c| &c.codes) == other.chunks.first().map(|c| &c.codes)
    }

    /// Its first row in its planes (0 unless an arena's member).
    pub(crate) fn base(&self) -> usize {
        self.base
    }

    /// Output rows.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Input columns.
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// The checkpoint format the matrix was uploaded in.
    pub fn format(&self) -> WeightFormat {
        self.format
    }

    /// The shader family that reads it ([`WeightKind`]).
    pub fn kind(&self) -> WeightKind {
        self.kind
    }

    /// Bytes of its codes, scales and biases as uploaded (scales and biases in 16 bits, rows not
    /// padded): what one product over it reads from memory.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Number of row chunks (bindings) the matrix is split into.
    pub fn chunk_count(&self) -> usize {
        self.chunks.len()
    }

    /// The dispatches of one of the matrix's kernels (one per chunk) over `x` / `y` with `step`
    /// (the step buffer), created once: each is a pipeline, a bind group and a grid. `op` is
    /// [`Module::Matmul`], `y (+)= W x` with what it fuses (a fused norm's weights in `nw` at
    /// `p.norm_off`), or [`Module::Embed`], `y[b] += Σ_e row_e(token_e(b))` over the entries of
    /// the map bound as `x` (`lm/embed.rs`; `nw` is not read).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn dispatches(
        &self,
        ctx: &GpuContext,
        op: Op,
        x: &wgpu::Buffer,
        y: &wgpu::Buffer,
        step: &wgpu::Buffer,
        nw: &wgpu::Buffer,
        p: &MatParams,
    ) -> Vec<Dispatch> {
        let module = match op {
            Op::Matmul(f) if ctx.subgroups() => Module::MatmulSubgroup(self.kind, f),
            Op::Matmul(f) => Module::Matmul(self.kind, f),
            Op::Embed => Module::Embed(self.kind),
        };
        // The matmul reads activations as `vec4<f32>` (every caller passes row strides of a
        // multiple-of-4 column count).
        debug_assert!(
            p.ld_x.is_multiple_of(4) && p.x_off.is_multiple_of(4),
            "unaligned activations"
        );
        let pipeline = ctx.pipeline(module);
        (0..self.chunks.len())
            .map(|c| {
                let ch = &self.chunks[c];
                let block = MatParams {
                    rows: ch.rows as u32,
                    cols: self.cols as u32,
                    group: self.group as u32,
                    row0: ch.row0 as u32,
                    ld_w: (self.ld_bytes / 4) as u32,
                    ..*p
                };
                let uni = ctx.uniform("params", &block.bytes());
                let mut bufs = vec![&uni, &ch.codes, &ch.scales, &ch.biases, x, y, step];
                if op != Op::Embed {
                    bufs.push(nw);
                }
                let bind = ctx.bind(module, &bufs);
                let grid = match module {
                    Module::Embed(_) => Grid::PerRow((self.cols / 4).div_ceil(64) as u32),
                    _ => Grid::Rows((ch.rows as u32).div_ceil(MATMUL_ROWS)),
                };
                Dispatch {
                    pipeline: pipeline.clone(),
                    bind,
                    grid,
                    _uniform: uni,
                }
            })
            .collect()
    }
}

/// What a weight-reading dispatch computes (its module follows from the matrix's format).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Op {
    /// The matrix product with what it fuses.
    Matmul(Fuse),
    /// The embedding sum.
    Embed,
}

/// Values per scale group of `format` (1 for dense formats: unused).
fn group_of(format: WeightFormat) -> usize {
    match format {
        WeightFormat::MlxAffine { group, .. } => group,
        WeightFormat::Q8_0 | WeightFormat::Q4_0 => 32,
        _ => 1,
    }
}

/// `v` (`rows` rows of `per_row` items: the two halves of a gated matrix) with its rows
/// reordered `0, h, 1, h + 1, ..` (`h = rows / 2`); empty stays empty.
fn interleave_halves<T: Copy>(v: &[T], rows: usize, per_row: usize) -> Vec<T> {
    if v.is_empty() {
        return Vec::new();
    }
    let h = rows / 2;
    let mut out = Vec::with_capacity(v.len());
    for j in 0..h {
        out.extend_from_slice(&v[j * per_row..(j + 1) * per_row]);
        out.extend_from_slice(&v[(h + j) * per_row..(h + j + 1) * per_row]);
    }
    out
}

/// Writes the step buffer of a standalone product: `n` active rows.
fn step_bytes(n: usize) -> Vec<u8> {
    let mut v = [0i32; crate::shaders::step::TOKENS];
    v[0] = n as i32;
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

impl GpuContext {
    /// `y [n, rows] = W · x [n, cols]` on the device, once (tests and checks: it creates its
    /// buffers, uploads `m`, and waits). `n` is at most [`MAX_ROWS`].
    pub fn matmul_once(&self, m: &Matrix, x: &[f32], n: usize) -> Result<Vec<f32>, GpuError> {
        if n == 0 || n > MAX_ROWS || x.len() != n * m.cols() {
            return Err(GpuError::Runtime(format!(
                "matmul_once: {n} rows of {} values expected, {} given",
                m.cols(),
                x.len()
            )));
        }
        let w = GpuMatrix::upload(self, "w", m)?;
        let xb = self.storage_init("x", &f32_bytes(x))?;
        let yb = self.buffer(
            "y",
            (n * m.rows() * 4) as u64,
            wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC,
        )?;
        let step = self.storage_init("step", &step_bytes(n))?;
        let p = MatParams {
            ld_x: m.cols() as u32,
            ld_y: m.rows() as u32,
            ..Default::default()
        };
        let ds = w.dispatches(self, Op::Matmul(Fuse::Plain), &xb, &yb, &step, &xb, &p);
        self.run_and_read(&ds, n as u32, &yb, n * m.rows())
    }

    /// The fused products of the LM's layers on the device, once (tests): `y = W · rms_norm(x)`
    /// ([`Fuse::Norm`], `y [n, rows]`) or `y = silu_gate(W · rms_norm(x))` ([`Fuse::NormGate`],
    /// `y [n, rows / 2]`: `silu(a_j) · g_j` of the halves `a`, `g` of the product), the norm of
    /// weights `norm` (`cols` values) and `eps`; [`Fuse::Plain`] is [`GpuContext::matmul_once`].
    pub fn matmul_fused_once(
        &self,
        m: &Matrix,
        fuse: Fuse,
        norm: &[f32],
        eps: f32,
        x: &[f32],
        n: usize,
    ) -> Result<Vec<f32>, GpuError> {
        if n == 0 || n > MAX_ROWS || x.len() != n * m.cols() || norm.len() != m.cols() {
            return Err(GpuError::Runtime(format!(
                "matmul_fused_once: {n} rows of {} values and a norm of as many expected, {} \
                 and {} given",
                m.cols(),
                x.len(),
                norm.len()
            )));
        }
        let gated = fuse == Fuse::NormGate;
        let w = if gated {
            GpuMatrix::upload_gated(self, "w", m)?
        } else {
            GpuMatrix::upload(self, "w", m)?
        };
        let out_rows = if gated { m.rows() / 2 } else { m.rows() };
        let xb = self.storage_init("x", &f32_bytes(x))?;
        let nw = self.storage_init("norm", &f32_bytes(norm))?;
        let yb = self.buffer(
            "y",
            (n * out_rows * 4) as u64,
            wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC,
        )?;
        let step = self.storage_init("step", &step_bytes(n))?;
        let p = MatParams {
            ld_x: m.cols() as u32,
            ld_y: out_rows as u32,
            eps,
            ..Default::default()
        };
        let ds = w.dispatches(self, Op::Matmul(fuse), &xb, &yb, &step, &nw, &p);
        self.run_and_read(&ds, n as u32, &yb, n * out_rows)
    }

    pub(crate) fn run_and_read(
        &self,
        ds: &[Dispatch],
        n: u32,
        y: &wgpu::Buffer,
        len: usize,
    ) -> Result<Vec<f32>, GpuError> {
        let rb = self.buffer(
            "readback",
            (len * 4) as u64,
            wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        )?;
        let mut enc = self
            .device()
            .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None });
        {
            let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor::default());
            for d in ds {
                d.record(&mut pass, n);
            }
        }
        enc.copy_buffer_to_buffer(y, 0, &rb, 0, (len * 4) as u64);
        self.submit(enc.finish());
        let mut out = vec![0f32; len];
        crate::context::read_mapped(self, &rb, &mut out)?;
        Ok(out)
    }
}

pub(crate) fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

pub(crate) fn i32_bytes(v: &[i32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}
