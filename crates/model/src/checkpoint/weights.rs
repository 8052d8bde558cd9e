//! [`Weights`]: a set of named tensors opened from a file (safetensors mmap, GGUF, MLX quantized
//! safetensors), with names already mapped to the canonical Kyutai PyTorch names.
//!
//! Tensors are borrowed zero-copy from the mmap; a canonical tensor assembled from several source
//! tensors (e.g. the depformer's per-step `in_projs.{k}` stacked into one `in_proj_weight`) keeps its
//! parts separate, so [`Weights::matrix_rows`] on one step is still zero-copy.
//!
//! Memory: a tensor's pages of the mapping are given back to the OS (`MADV_DONTNEED`) as soon as no
//! matrix reads them in place any more: quantized tensors once repacked, copied ones once copied,
//! borrowed ones (aligned f32/bf16/f16) when their matrix is dropped. Loading a q8_0 GGUF therefore
//! peaks at about the repacked model's size, not file + model (see [`Weights::released_bytes`]).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

use kernels::{Matrix, WeightFormat};

use super::dequant::{dequant_mlx, dequant_plain};
use super::format::detect_format;
use super::mapped::{map_file, Backing, Bytes, Owner};
use super::mlx::{group_mlx, SourceTensor};
use super::names::{self, Layout, Target};
use super::{
    gguf, safetensors, CheckpointError, Component, DType, FileFormat, Malformed, Quant, RawTensor,
};

/// One row block of a canonical tensor.
#[derive(Clone)]
pub(super) struct Part {
    pub(super) rows: usize,
    pub(super) data: Bytes,
    pub(super) scales: Option<Bytes>,
    pub(super) biases: Option<Bytes>,
}

/// A canonical tensor.
#[derive(Clone)]
pub(super) struct Entry {
    pub(super) shape: Vec<usize>,
    pub(super) quant: Quant,
    pub(super) parts: Vec<Part>,
    /// Source names (for messages).
    pub(super) sources: Vec<String>,
}

impl Entry {
    fn rows_cols(&self) -> (usize, usize) {
        let rows = self.shape.first().copied().unwrap_or(1);
        let cols = self.shape.iter().skip(1).product();
        (rows, cols)
    }
}

/// Public description of one canonical tensor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    /// Canonical shape.
    pub shape: Vec<usize>,
    /// Storage.
    pub quant: Quant,
    /// Bytes occupied in the file(s) (codes + scales + biases for MLX).
    pub bytes: usize,
    /// Names in the source file this tensor was assembled from.
    pub sources: Vec<String>,
}

/// Options of [`Weights::open_with`].
#[derive(Debug, Clone)]
pub struct OpenOptions {
    /// Which model the file holds.
    pub component: Component,
    /// Heads of the Mimi transformer (to undo the Hugging Face RoPE row permutation); default 8.
    pub mimi_num_heads: usize,
    /// MLX (bits, group) if known (otherwise inferred from shapes).
    pub mlx_bits_group: Option<(u8, usize)>,
    /// Accept `extra_heads.*` tensors (a speech-to-text LM with voice-activity heads); refused
    /// otherwise, since the duplex model has none.
    pub allow_extra_heads: bool,
}

impl OpenOptions {
    /// Defaults for `component` (released Mimi: 8 heads).
    pub fn new(component: Component) -> Self {
        OpenOptions {
            component,
            mimi_num_heads: 8,
            mlx_bits_group: None,
            allow_extra_heads: false,
        }
    }
}

/// A set of named tensors, names mapped to canonical.
pub struct Weights {
    pub(super) path: PathBuf,
    pub(super) component: Component,
    pub(super) format: FileFormat,
    pub(super) layout: Layout,
    pub(super) file_len: usize,
    pub(super) metadata: BTreeMap<String, String>,
    pub(super) entries: BTreeMap<String, Entry>,
    pub(super) backing: Owner,
}

impl std::fmt::Debug for Weights {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Weights")
            .field("path", &self.path)
            .field("format", &self.format)
            .field("layout", &self.layout)
            .field("tensors", &self.entries.len())
            .finish()
    }
}

impl Weights {
    /// Open a weights file (safetensors, GGUF or MLX safetensors) of `kind`, mapping names to canonical.
    pub fn open(path: &Path, kind: Component) -> Result<Weights, CheckpointError> {
        Self::open_with(path, &OpenOptions::new(kind))
    }

    /// [`Weights::open`] with options.
    pub fn open_with(path: &Path, opts: &OpenOptions) -> Result<Weights, CheckpointError> {
        let owner = map_file(path)?;
        Self::from_owner(path, owner, opts)
    }

    /// Open weights from bytes in memory (tests, tools). `label` names the source in errors.
    pub fn from_bytes(
        label: &str,
        bytes: Vec<u8>,
        opts: &OpenOptions,
    ) -> Result<Weights, CheckpointError> {
        Self::from_owner(Path::new(label), Backing::owned(bytes), opts)
    }

    fn from_owner(
        path: &Path,
        owner: Owner,
        opts: &OpenOptions,
    ) -> Result<Weights, CheckpointError> {
        let bytes = (*owner).as_ref();
        let file_len = bytes.len();
        let format = detect_format(path, bytes)?;
        let malformed = |kind| CheckpointError::Malformed {
            path: path.to_path_buf(),
            kind,
        };
        let (raw, metadata) = match format {
            FileFormat::Safetensors => {
                let h = safetensors::parse(bytes).map_err(malformed)?;
                (h.tensors, h.metadata)
            }
            FileFormat::Gguf => {
                let h = gguf::parse(bytes).map_err(|e| e.into_checkpoint(path))?;
                let md = h
                    .metadata
                    .iter()
                    .map(|(k, v)| (k.clone(), format!("{v:?}")))
                    .collect();
                (h.tensors, md)
            }
        };
        names::refuse_tensors(
            raw.iter()
                .filter(|t| !(opts.allow_extra_heads && t.name.starts_with("extra_heads.")))
                .map(|t| {
                    (
                        t.name.as_str(),
                        t.dtype == DType::I8 && t.name.ends_with(".weight"),
                    )
                }),
        )?;
        if opts.component == Component::Lm {
            let hf: Vec<String> = raw
                .iter()
                .filter(|t| {
                    t.name.starts_with("decoder.model.") || t.name.starts_with("depth_decoder.")
                })
                .take(8)
                .map(|t| t.name.clone())
                .collect();
            if !hf.is_empty() {
                return Err(CheckpointError::UnsupportedLayout {
                    what: "Hugging Face transformers MoshiForConditionalGeneration weights (use a Kyutai repository)".into(),
                    keys: hf,
                });
            }
        }
        let entries_in = group_mlx(&raw, opts.mlx_bits_group)?;
        let base_names: Vec<&str> = entries_in.iter().map(|s| s.name.as_str()).collect();
        let layout = match opts.component {
            Component::Lm => names::detect_lm(&base_names),
            Component::Mimi => names::detect_mimi(&base_names),
        };
        let last_dec = names::hf_last_decoder_conv(&base_names);
        // Canonical name -> (part index -> source).
        let mut groups: BTreeMap<String, BTreeMap<usize, (SourceTensor, bool, bool)>> =
            BTreeMap::new();
        for src in entries_in {
            match names::map(opts.component, layout, &src.name, last_dec) {
                Target::Duplicate => {}
                Target::To {
                    name,
                    part,
                    reshape_norm,
                    unpermute_rope,
                } => {
                    let g = groups.entry(name.clone()).or_default();
                    if let Some((prev, _, _)) = g.get(&part) {
                        return Err(malformed(Malformed::MappingConflict {
                            a: prev.name.clone(),
                            b: src.name.clone(),
                            canonical: name,
                        }));
                    }
                    g.insert(part, (src, reshape_norm, unpermute_rope));
                }
            }
        }
        let mut entries = BTreeMap::new();
        for (name, parts) in groups {
            let e = assemble(&owner, &name, parts, opts)?;
            entries.insert(name, e);
        }
        Ok(Weights {
            path: path.to_path_buf(),
            component: opts.component,
            format,
            layout,
            file_len,
            metadata,
            entries,
            backing: owner,
        })
    }

    /// Canonical tensor names (sorted).
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.entries.keys().map(String::as_str)
    }
    /// Number of canonical tensors.
    pub fn len(&self) -> usize {
        self.entries.len()
    }
    /// True when no tensor was found.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
    /// True if `name` exists.
    pub fn contains(&self, name: &str) -> bool {
        self.entries.contains_key(name)
    }
    /// Canonical shape of `name`.
    pub fn shape(&self, name: &str) -> Option<&[usize]> {
        self.entries.get(name).map(|e| e.shape.as_slice())
    }
    /// Storage of `name`.
    pub fn quant(&self, name: &str) -> Option<Quant> {
        self.entries.get(name).map(|e| e.quant)
    }
    /// Description of `name`.
    pub fn info(&self, name: &str) -> Option<TensorInfo> {
        self.entries.get(name).map(|e| TensorInfo {
            shape: e.shape.clone(),
            quant: e.quant,
            bytes: e
                .parts
                .iter()
                .map(|p| {
                    p.data.len
                        + p.scales.as_ref().map_or(0, |s| s.len)
                        + p.biases.as_ref().map_or(0, |b| b.len)
                })
                .sum(),
            sources: e.sources.clone(),
        })
    }
    /// File the weights came from.
    pub fn path(&self) -> &Path {
        &self.path
    }
    /// Container format.
    pub fn format(&self) -> FileFormat {
        self.format
    }
    /// Detected source layout.
    pub fn layout(&self) -> Layout {
        self.layout
    }
    /// Component given at open.
    pub fn component(&self) -> Component {
        self.component
    }
    /// Size of the file in bytes.
    pub fn file_len(&self) -> usize {
        self.file_len
    }
    /// Share of the weights file that is in the page cache (0.0..=1.0), sampled with `mincore(2)` over
    /// 1024 pages spread across the file; `None` for weights in memory ([`Weights::from_bytes`]), off
    /// Unix, or when the OS refuses the call. Reads no weight byte.
    pub fn resident_share(&self) -> Option<f64> {
        self.backing.resident_share(1024)
    }
    /// Bytes of the file mapping given back to the OS so far (`MADV_DONTNEED`; a range released
    /// twice counts twice). Pages of a tensor are released once no matrix reads them in place: right
    /// after a quantized tensor is repacked (or an unaligned one copied) by [`Weights::matrix`], after
    /// [`Weights::f32`] copied it out, or when a matrix that borrows it is dropped. Loading a
    /// quantized checkpoint therefore peaks near the repacked model's size instead of file + model.
    /// Always 0 for weights in memory ([`Weights::from_bytes`]) and off Unix.
    pub fn released_bytes(&self) -> usize {
        self.backing.released.load(Ordering::Relaxed)
    }
    /// Container metadata (safetensors `__metadata__`, GGUF key/values rendered as text).
    pub fn metadata(&self) -> &BTreeMap<String, String> {
        &self.metadata
    }

    fn entry(&self, name: &str) -> Result<&Entry, CheckpointError> {
        self.entries
            .get(name)
            .ok_or_else(|| CheckpointError::NoSuchTensor(name.to_string()))
    }

    /// The tensor as a [`kernels::Matrix`] of shape `[shape[0], prod(shape[1..])]`.
    ///
    /// Zero-copy from the mmap when the tensor is a single source tensor; tensors assembled from
    /// several parts are concatenated into an owned buffer.
    pub fn matrix(&self, name: &str) -> Result<Matrix, CheckpointError> {
        let e = self.entry(name)?;
        let (rows, _) = e.rows_cols();
        self.matrix_rows(name, 0, rows)
    }

    /// Rows `start..start + n` of the tensor as a matrix (e.g. one depformer step of a stacked
    /// `in_proj_weight`); zero-copy when the rows lie within one source tensor.
    pub fn matrix_rows(
        &self,
        name: &str,
        start: usize,
        n: usize,
    ) -> Result<Matrix, CheckpointError> {
        let (rows, cols) = self.rows_as_stored(name, start, n)?;
        let m = match rows {
            StoredRows::Plain { format, data } => {
                data.prefetch();
                Matrix::from_bytes(format, n, cols, data.storage())
            }
            StoredRows::Mlx {
                bits,
                group,
                w,
                s,
                b,
            } => {
                w.prefetch();
                Matrix::from_mlx(bits, group, n, cols, w.storage(), s, b)
            }
        };
        m.map_err(|err| kernel_err(name, err))
    }

    /// Rows `start..start + n` of the tensor in its checkpoint layout ([`kernels::CheckpointParts`]:
    /// the file's codes and scale bits, split into planes) with its format, for a device that packs
    /// the weights itself: no CPU matrix is built. MLX scales stored as f16 / f32 become bf16 as in
    /// [`Weights::matrix_rows`]. The mapped pages are released as [`Weights::matrix_rows`] releases
    /// those of a repacked tensor.
    pub fn checkpoint_parts(
        &self,
        name: &str,
        start: usize,
        n: usize,
    ) -> Result<(WeightFormat, kernels::CheckpointParts), CheckpointError> {
        let (rows, cols) = self.rows_as_stored(name, start, n)?;
        let (format, parts) = match rows {
            StoredRows::Plain { format, data } => (
                format,
                kernels::CheckpointParts::from_bytes(format, n, cols, data.storage().as_bytes()),
            ),
            StoredRows::Mlx {
                bits,
                group,
                w,
                s,
                b,
            } => (
                WeightFormat::MlxAffine { bits, group },
                kernels::CheckpointParts::from_mlx(
                    bits,
                    group,
                    n,
                    cols,
                    w.storage().as_bytes(),
                    s.as_bytes(),
                    b.as_bytes(),
                ),
            ),
        };
        Ok((format, parts.map_err(|err| kernel_err(name, err))?))
    }

    /// Rows `start..start + n` of the tensor as the file stores them (MLX scales as bf16), and its
    /// column count: what [`Weights::matrix_rows`] repacks and [`Weights::checkpoint_parts`]
    /// exports.
    fn rows_as_stored(
        &self,
        name: &str,
        start: usize,
        n: usize,
    ) -> Result<(StoredRows, usize), CheckpointError> {
        let e = self.entry(name)?;
        let (rows, cols) = e.rows_cols();
        if start.checked_add(n).is_none_or(|end| end > rows) || n == 0 {
            return Err(CheckpointError::Kernel {
                name: name.into(),
                message: format!(
                    "rows {start}..{} outside 0..{rows}",
                    start.saturating_add(n)
                ),
            });
        }
        let stored = match e.quant {
            Quant::Plain(dt) => {
                let format = plain_format(name, dt)?;
                let row_bytes =
                    dt.bytes_for(cols as u64)
                        .ok_or_else(|| CheckpointError::Kernel {
                            name: name.into(),
                            message: format!("{cols} columns do not fit {dt} blocks"),
                        })? as usize;
                let data = gather(&e.parts, start, n, |p| Some(&p.data), row_bytes);
                StoredRows::Plain { format, data }
            }
            Quant::Mlx {
                bits,
                group,
                scale_dtype,
            } => {
                let value_bytes = mlx_scale_bytes(name, scale_dtype)?;
                let w_row = cols * bits as usize / 8;
                let s_row = cols / group * value_bytes;
                let w = gather(&e.parts, start, n, |p| Some(&p.data), w_row);
                let s = gather(&e.parts, start, n, |p| p.scales.as_ref(), s_row);
                let b = gather(&e.parts, start, n, |p| p.biases.as_ref(), s_row);
                let (s, b) = if scale_dtype == DType::Bf16 {
                    (s.storage(), b.storage())
                } else {
                    (
                        mlx_scales_as_bf16(name, scale_dtype, &s)?,
                        mlx_scales_as_bf16(name, scale_dtype, &b)?,
                    )
                };
                StoredRows::Mlx {
                    bits,
                    group,
                    w,
                    s,
                    b,
                }
            }
        };
        Ok((stored, cols))
    }

    /// Dequantized f32 copy of the tensor plus its canonical shape.
    pub fn f32(&self, name: &str) -> Result<(Vec<f32>, Vec<usize>), CheckpointError> {
        let e = self.entry(name)?;
        let (_, cols) = e.rows_cols();
        let total: usize = e.shape.iter().product();
        let mut out = Vec::with_capacity(total);
        for p in &e.parts {
            match e.quant {
                Quant::Plain(dt) => dequant_plain_of(name, None, dt, p.data.as_slice(), &mut out)?,
                Quant::Mlx {
                    bits,
                    group,
                    scale_dtype,
                } => {
                    let mut s = Vec::new();
                    let mut b = Vec::new();
                    let sc = p.scales.as_ref().expect("mlx part has scales");
                    let bi = p.biases.as_ref().expect("mlx part has biases");
                    dequant_plain_of(name, Some("scales"), scale_dtype, sc.as_slice(), &mut s)?;
                    dequant_plain_of(name, Some("biases"), scale_dtype, bi.as_slice(), &mut b)?;
                    dequant_mlx(
                        bits,
                        group,
                        p.rows,
                        cols,
                        p.data.as_slice(),
                        &s,
                        &b,
                        &mut out,
                    );
                }
            }
        }
        debug_assert_eq!(out.len(), total);
        // The values now live in `out`: the mapped pages are not needed for them any more.
        for p in &e.parts {
            p.data.release();
            p.scales.iter().chain(&p.biases).for_each(Bytes::release);
        }
        Ok((out, e.shape.clone()))
    }
}

/// Rows of a tensor as the file stores them ([`Weights::rows_as_stored`]).
enum StoredRows {
    Plain {
        format: WeightFormat,
        data: Bytes,
    },
    Mlx {
        bits: u8,
        group: usize,
        w: Bytes,
        /// Scales and biases, bf16.
        s: kernels::Storage,
        b: kernels::Storage,
    },
}

fn kernel_err(name: &str, err: kernels::KernelError) -> CheckpointError {
    CheckpointError::Kernel {
        name: name.to_string(),
        message: err.to_string(),
    }
}

/// The matrix format of a plain tensor `name` of `dt`; dtypes no kernel reads are refused.
fn plain_format(name: &str, dt: DType) -> Result<WeightFormat, CheckpointError> {
    Ok(match dt {
        DType::F32 => WeightFormat::F32,
        DType::Bf16 => WeightFormat::Bf16,
        DType::F16 => WeightFormat::F16,
        DType::Q8_0 => WeightFormat::Q8_0,
        DType::Q4_0 => WeightFormat::Q4_0,
        other => {
            return Err(CheckpointError::DtypeNotAllowed {
                name: name.into(),
                dtype: other.name().into(),
                allowed: "f32, bf16, f16, q8_0, q4_0, mlx".into(),
            })
        }
    })
}

/// Bytes of one MLX scale or bias of `dtype` (tensor `name`'s); other dtypes are refused.
fn mlx_scale_bytes(name: &str, dtype: DType) -> Result<usize, CheckpointError> {
    match dtype {
        DType::Bf16 | DType::F16 => Ok(2),
        DType::F32 => Ok(4),
        other => Err(CheckpointError::DtypeNotAllowed {
            name: format!("{name} (scales)"),
            dtype: other.name().into(),
            allowed: "bf16, f16, f32".into(),
        }),
    }
}

fn raw_bytes(owner: &Owner, t: &RawTensor) -> Bytes {
    Bytes {
        owner: owner.clone(),
        offset: t.offset,
        len: t.len,
    }
}

/// Build one canonical entry from its parts.
fn assemble(
    owner: &Owner,
    name: &str,
    parts: BTreeMap<usize, (SourceTensor, bool, bool)>,
    opts: &OpenOptions,
) -> Result<Entry, CheckpointError> {
    let n = parts.len();
    if parts.keys().copied().ne(0..n) {
        let have: Vec<usize> = parts.keys().copied().collect();
        let missing: Vec<String> = (0..*have.last().unwrap_or(&0) + 1)
            .filter(|k| !have.contains(k))
            .map(|k| format!("{name} (part {k})"))
            .collect();
        return Err(CheckpointError::MissingTensor { names: missing });
    }
    let mut quant = None;
    let mut tail: Option<Vec<usize>> = None;
    let mut total_rows = 0;
    let mut out_parts = Vec::with_capacity(n);
    let mut sources = Vec::with_capacity(n);
    let mut reshape = false;
    for (_, (src, reshape_norm, unpermute)) in parts {
        reshape |= reshape_norm;
        if quant.is_some_and(|q| q != src.quant) {
            return Err(CheckpointError::DtypeNotAllowed {
                name: src.name.clone(),
                dtype: src.quant.name(),
                allowed: format!("same storage as the other parts of `{name}`"),
            });
        }
        quant = Some(src.quant);
        let shape = if src.shape.is_empty() {
            vec![1]
        } else {
            src.shape.clone()
        };
        let t = shape[1..].to_vec();
        if tail.as_ref().is_some_and(|x| *x != t) {
            return Err(CheckpointError::ShapeMismatch {
                name: src.name.clone(),
                expected: tail.clone().unwrap_or_default(),
                found: t,
            });
        }
        tail = Some(t);
        total_rows += shape[0];
        let mut data = raw_bytes(owner, &src.data);
        if unpermute {
            let cols: usize = shape[1..].iter().product();
            let elem = match src.quant {
                Quant::Plain(d) if d.block().0 == 1 => d.block().1 as usize,
                _ => {
                    return Err(CheckpointError::DtypeNotAllowed {
                        name: src.name.clone(),
                        dtype: src.quant.name(),
                        allowed: "a plain float dtype (Hugging Face q/k rows are permuted)".into(),
                    })
                }
            };
            let rows_src =
                names::hf_rope_source_rows(shape[0], opts.mimi_num_heads).ok_or_else(|| {
                    CheckpointError::ShapeMismatch {
                        name: src.name.clone(),
                        expected: vec![opts.mimi_num_heads, shape[0] / opts.mimi_num_heads.max(1)],
                        found: shape.clone(),
                    }
                })?;
            let rb = cols * elem;
            let s = data.as_slice();
            let mut v = Vec::with_capacity(s.len());
            for r in rows_src {
                v.extend_from_slice(&s[r * rb..(r + 1) * rb]);
            }
            data.release();
            data = Bytes::owned(v);
        }
        out_parts.push(Part {
            rows: shape[0],
            data,
            scales: src.scales.as_ref().map(|t| raw_bytes(owner, t)),
            biases: src.biases.as_ref().map(|t| raw_bytes(owner, t)),
        });
        sources.push(src.name);
    }
    let tail = tail.unwrap_or_default();
    let mut shape = vec![total_rows];
    shape.extend_from_slice(&tail);
    if reshape && shape.len() == 1 {
        shape = vec![1, 1, total_rows];
        // A [d] norm viewed as [1, 1, d] is one row of d values.
        for p in &mut out_parts {
            p.rows = 1;
        }
    }
    Ok(Entry {
        shape,
        quant: quant.expect("at least one part"),
        parts: out_parts,
        sources,
    })
}

/// [`dequant_plain`] of tensor `name` (or of its `what` companion: MLX scales, biases), a dtype it
/// cannot read refused with the tensor's name.
fn dequant_plain_of(
    name: &str,
    what: Option<&str>,
    dtype: DType,
    bytes: &[u8],
    out: &mut Vec<f32>,
) -> Result<(), CheckpointError> {
    dequant_plain(dtype, bytes, out).map_err(|m| CheckpointError::DtypeNotAllowed {
        name: match what {
            Some(w) => format!("{name} ({w})"),
            None => name.into(),
        },
        dtype: dtype.name().into(),
        allowed: m.into(),
    })
}

/// Rows `start..start+n` (each `row_bytes` long) of the concatenation of the parts' chosen buffers.
/// MLX scales or biases stored as f16 / f32 (MLX writes the model's dtype) converted to the bf16
/// the kernels hold. Exact for files quantized from a bf16 model; otherwise each value is rounded
/// to the nearest bf16 (relative error at most 2^-9, far below the 4/8-bit weight step) and a
/// warning says so once per process.
fn mlx_scales_as_bf16(
    name: &str,
    dtype: DType,
    bytes: &Bytes,
) -> Result<kernels::Storage, CheckpointError> {
    let mut values = Vec::new();
    dequant_plain_of(name, Some("scales"), dtype, bytes.as_slice(), &mut values)?;
    let mut rounded = 0usize;
    let mut out = Vec::with_capacity(values.len() * 2);
    for v in values {
        let h = half::bf16::from_f32(v);
        rounded += usize::from(h.to_f32() != v);
        out.extend_from_slice(&h.to_le_bytes());
    }
    if rounded > 0 {
        static WARNED: std::sync::Once = std::sync::Once::new();
        WARNED.call_once(|| {
            tracing::warn!(
                "{name}: {rounded} MLX {dtype} scales/biases rounded to bf16 (further tensors not reported)"
            )
        });
    }
    Ok(kernels::Storage::from_vec(out))
}

fn gather(
    parts: &[Part],
    start: usize,
    n: usize,
    pick: impl Fn(&Part) -> Option<&Bytes>,
    row_bytes: usize,
) -> Bytes {
    let mut base = 0;
    for p in parts {
        if start >= base && start + n <= base + p.rows {
            let b = pick(p).expect("buffer present");
            return b.sub((start - base) * row_bytes, n * row_bytes);
        }
        base += p.rows;
    }
    // Spans several parts: copy.
    let mut v = Vec::with_capacity(n * row_bytes);
    let mut base = 0;
    for p in parts {
        let lo = start.max(base);
        let hi = (start + n).min(base + p.rows);
        if lo < hi {
            let b = pick(p).expect("buffer present");
            let rows = b.sub((lo - base) * row_bytes, (hi - lo) * row_bytes);
            v.extend_from_slice(rows.as_slice());
            rows.release();
        }
        base += p.rows;
    }
    Bytes::owned(v)
}

#[cfg(test)]
mod tests;
