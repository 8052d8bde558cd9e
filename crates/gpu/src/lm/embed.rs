//! The LM's input embeddings on the device. A temporal step adds one row of each of its input
//! tables into `X` (the plan's run of [`Op::Embed`](model::lm::Op::Embed): 16 audio tables and
//! the text table at Moshi's sizes). Each table alone would be a launch of its own (its planes
//! are bindings of their own, and a kernel cannot bind 17 tables' planes portably), so the upload
//! places those tables' rows one after another in one matrix, the **arena**, in the plan's order,
//! and the recorder (`record.rs`) turns the run into one launch per arena chunk (one on a device
//! whose binding holds the arena) of the embedding-sum kernel (`shaders/matvec.rs`, `EMBED_BODY`),
//! which adds the entries in the plan's order, as the CPU does, so `X` is the same bit for bit.
//!
//! Arithmetic at Moshi's sizes (one row, `d = 4096`): 16 workgroups of 64 invocations, each
//! invocation reading 17 × 16 bytes of f32 weights (or 17 × 8 of bf16: 139 KB in all) and its 16
//! bytes of `X` once: nothing against the bandwidth; the 16 launches it saves are ~0.3 ms of an
//! H200 frame at the ~18 µs a launch costs there (an estimate from BENCHMARKS.md's profile).
//! The arena is built on the host before its upload: the tables' bytes (530 MB in bf16, 280 MB
//! in q8_0 at Moshi's sizes) are held at once during the load, where other matrices are held
//! one at a time.

use kernels::{CheckpointParts, Matrix, WeightFormat};
use model::lm::MatrixRef;

use crate::context::GpuContext;
use crate::matrix::{i32_bytes, GpuMatrix, Op};
use crate::shaders::{step, MAX_ROWS};
use crate::uniforms::MatParams;
use crate::GpuError;

/// The layout every member of an arena shares (the first member's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Layout {
    format: WeightFormat,
    cols: usize,
    row_bytes: usize,
    groups: usize,
    biased: bool,
}

/// An arena being filled on the host: its members' first rows, and their planes placed there.
pub(super) struct Arena {
    /// Name and first row of each member, in the plan's order.
    members: Vec<(String, usize)>,
    rows: usize,
    layout: Option<Layout>,
    parts: CheckpointParts,
}

impl Arena {
    /// An empty arena for the tables `members` (in the order their rows are placed).
    pub(super) fn new<'a>(members: impl IntoIterator<Item = &'a MatrixRef>) -> Arena {
        let mut rows = 0;
        let members = members
            .into_iter()
            .map(|m| {
                let base = rows;
                rows += m.rows();
                (m.name.clone(), base)
            })
            .collect();
        Arena {
            members,
            rows,
            layout: None,
            parts: CheckpointParts {
                codes: Vec::new(),
                scales: Vec::new(),
                biases: Vec::new(),
            },
        }
    }

    /// Places `parts` (table `entry`, of `format`) in the arena and gives the table's matrix,
    /// whose planes are set by [`Arena::finish`]; gives the parts back for a table that is not a
    /// member, or does not share the first member's format and width (uploaded alone then).
    pub(super) fn take(
        &mut self,
        entry: &MatrixRef,
        format: WeightFormat,
        parts: CheckpointParts,
    ) -> Result<GpuMatrix, CheckpointParts> {
        let Some(&(_, base)) = self.members.iter().find(|(n, _)| *n == entry.name) else {
            return Err(parts);
        };
        let (rows, cols) = (entry.rows(), entry.cols());
        let (nc, ns, nb) = (parts.codes.len(), parts.scales.len(), parts.biases.len());
        let fits = rows > 0
            && !entry.gated
            && cols.is_multiple_of(4)
            && nc.is_multiple_of(rows)
            && ns.is_multiple_of(rows)
            && (nb == 0 || nb == ns);
        if !fits {
            return Err(parts);
        }
        let layout = Layout {
            format,
            cols,
            row_bytes: nc / rows,
            groups: ns / rows,
            biased: nb != 0,
        };
        let bytes = nc + 2 * (ns + nb);
        let Some(m) = GpuMatrix::member(format, (rows, cols), layout.row_bytes, bytes, base) else {
            return Err(parts);
        };
        match self.layout {
            None => {
                let p = &mut self.parts;
                p.codes = vec![0; self.rows * layout.row_bytes];
                p.scales = vec![0; self.rows * layout.groups];
                p.biases = vec![0; if layout.biased { p.scales.len() } else { 0 }];
                self.layout = Some(layout);
            }
            Some(l) if l != layout => return Err(parts),
            Some(_) => {}
        }
        let p = &mut self.parts;
        p.codes[base * layout.row_bytes..][..nc].copy_from_slice(&parts.codes);
        // Dense formats have no scales, most none of the MLX biases.
        for (plane, part) in [
            (&mut p.scales, &parts.scales),
            (&mut p.biases, &parts.biases),
        ] {
            if !part.is_empty() {
                plane[base * layout.groups..][..part.len()].copy_from_slice(part);
            }
        }
        Ok(m)
    }

    /// Bytes the arena's upload will allocate (0 when no table joined it).
    pub(super) fn bytes(&self) -> u64 {
        let p = &self.parts;
        (p.codes.len() + 2 * (p.scales.len() + p.biases.len())) as u64
    }

    /// Uploads the arena (when a table joined it) and gives its planes to its members (each
    /// matrix `members` yields that [`Arena::take`] made).
    pub(super) fn finish<'a>(
        self,
        ctx: &GpuContext,
        members: impl IntoIterator<Item = &'a mut GpuMatrix>,
    ) -> Result<(), GpuError> {
        let Some(l) = self.layout else {
            return Ok(());
        };
        let arena = GpuMatrix::upload_parts(
            ctx,
            "input_embeddings",
            l.format,
            self.rows,
            l.cols,
            self.parts,
            false,
        )?;
        for m in members {
            if m.chunk_count() == 0 {
                m.share_planes(&arena);
            }
        }
        Ok(())
    }
}

/// One table of an embedding sum: the table (its rows in its planes from [`GpuMatrix::base`]),
/// and where row `b`'s token lies in the step buffer: `tok_off + b · tok_stride`.
pub(super) struct Entry<'a> {
    pub(super) table: &'a GpuMatrix,
    pub(super) tok_off: usize,
    pub(super) tok_stride: usize,
}

/// The launches of `Σ_e table_e[token_e(b)]` added into `y` (rows of `ld_y` values) in the order
/// of `entries`, which share their planes (one arena, or one table), with the map buffer they
/// read (to be kept alive with them).
pub(super) fn embed_sum(
    ctx: &GpuContext,
    entries: &[Entry<'_>],
    y: &wgpu::Buffer,
    stepb: &wgpu::Buffer,
    ld_y: usize,
) -> Result<(Vec<crate::dispatch::Dispatch>, wgpu::Buffer), GpuError> {
    let mut words = vec![entries.len() as u32, 0, 0, 0];
    for e in entries {
        debug_assert!(e.table.same_planes(entries[0].table));
        words.extend([e.table.base(), e.table.rows(), e.tok_off, e.tok_stride].map(|v| v as u32));
    }
    let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
    let map = ctx.storage_init("embed_map", &bytes)?;
    let p = MatParams {
        ld_y: ld_y as u32,
        ..Default::default()
    };
    let ds = entries[0]
        .table
        .dispatches(ctx, Op::Embed, &map, y, stepb, &map, &p);
    Ok((ds, map))
}

impl GpuContext {
    /// The embedding sum on the device, once (tests): row `b` of the result is
    /// `Σ_e tables[e][tokens[b · T + e]]` (`T = tables.len()`, `n = tokens.len() / T` rows of at
    /// most [`MAX_ROWS`]; −1 adds nothing, other negative tokens read row 0), the tables placed
    /// in one arena as the LM's are, added in their order. The tables must share format and width.
    pub fn embed_sum_once(&self, tables: &[&Matrix], tokens: &[i32]) -> Result<Vec<f32>, GpuError> {
        let t = tables.len();
        let n = tokens.len().checked_div(t).unwrap_or(0);
        let cols = tables.first().map_or(0, |m| m.cols());
        if n == 0 || n > MAX_ROWS || tokens.len() != n * t {
            return Err(GpuError::Runtime(format!(
                "embed_sum_once: {} tokens for {t} tables",
                tokens.len()
            )));
        }
        let refs: Vec<MatrixRef> = tables
            .iter()
            .enumerate()
            .map(|(e, m)| MatrixRef {
                name: format!("table{e}"),
                shape: [m.rows(), m.cols()],
                take: None,
                gated: false,
            })
            .collect();
        let mut arena = Arena::new(&refs);
        let mut members = Vec::new();
        for (r, m) in refs.iter().zip(tables) {
            let member = arena
                .take(r, m.format(), m.checkpoint_parts())
                .map_err(|_| {
                    GpuError::Runtime("embed_sum_once: tables of one format and width".into())
                })?;
            members.push(member);
        }
        arena.finish(self, members.iter_mut())?;
        let mut st = vec![0i32; step::TOKENS + n * t];
        st[0] = n as i32;
        st[step::TOKENS..].copy_from_slice(tokens);
        let stepb = self.storage_init("step", &i32_bytes(&st))?;
        let y = self.buffer(
            "y",
            (n * cols * 4) as u64,
            wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC,
        )?;
        let entries: Vec<Entry<'_>> = members
            .iter()
            .enumerate()
            .map(|(e, table)| Entry {
                table,
                tok_off: step::TOKENS + e,
                tok_stride: t,
            })
            .collect();
        let (ds, _map) = embed_sum(self, &entries, &y, &stepb, cols)?;
        self.run_and_read(&ds, n as u32, &y, n * cols)
    }
}
