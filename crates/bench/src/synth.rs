//! Synthetic bundles: random weights of realistic scale with the exact released names, shapes and
//! quantization layouts, streamed to disk tensor by tensor (never holding the model in memory).
//! Used by the benchmarks (full moshiko dimensions) and by tests (tiny configs).

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use half::{bf16, f16};

use model::checkpoint::gguf;
use model::checkpoint::CheckpointError;
use model::checkpoint::{LmConfig, MimiConfig, MIMI_NAME, TOKENIZER_NAME};
use model::checkpoint::{Schema, TensorSpec};

/// Output layout of [`write_bundle`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SynthFormat {
    /// `kyutai/moshiko-pytorch-bf16`: PyTorch legacy names, bf16, `model.safetensors` + `config.json`.
    Bf16,
    /// PyTorch `state_dict()` names (`in_projs.{k}` / `out_projs.{k}`), bf16, `model.safetensors` + `config.json`.
    Bf16InProjs,
    /// `kyutai/moshiko-candle-bf16`: candle names, bf16, `model.safetensors`.
    CandleBf16,
    /// `kyutai/moshiko-candle-q8`: candle names, Q8_0 (F32 norms), `model.q8.gguf`.
    Q8Gguf,
    /// candle names, Q4_0 (F32 norms), `model.q4.gguf` + `config.json`: the 4-bit GGML layout of the
    /// same writer (no such file is released; for benchmarks of the Q4_0 kernels at full size).
    Q4Gguf,
    /// `kyutai/moshiko-mlx-q4`: MLX names, 4-bit group 32, `model.q4.safetensors`.
    MlxQ4,
    /// `kyutai/moshiko-mlx-q8`: MLX names, 8-bit group 64, `model.q8.safetensors`.
    MlxQ8,
}

impl SynthFormat {
    /// Parse the CLI name (`bf16`, `candle-bf16`, `q8-gguf`, `q4-gguf`, `mlx-q4`, `mlx-q8`).
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "bf16" => SynthFormat::Bf16,
            "bf16-in-projs" => SynthFormat::Bf16InProjs,
            "candle-bf16" => SynthFormat::CandleBf16,
            "q8-gguf" => SynthFormat::Q8Gguf,
            "q4-gguf" => SynthFormat::Q4Gguf,
            "mlx-q4" => SynthFormat::MlxQ4,
            "mlx-q8" => SynthFormat::MlxQ8,
            _ => return None,
        })
    }
    /// LM file name in the bundle.
    pub fn lm_file(self) -> &'static str {
        match self {
            SynthFormat::Bf16 | SynthFormat::Bf16InProjs | SynthFormat::CandleBf16 => {
                "model.safetensors"
            }
            SynthFormat::Q8Gguf => "model.q8.gguf",
            SynthFormat::Q4Gguf => "model.q4.gguf",
            SynthFormat::MlxQ4 => "model.q4.safetensors",
            SynthFormat::MlxQ8 => "model.q8.safetensors",
        }
    }
}

/// Small fast deterministic generator (SplitMix64).
struct Rng(u64);

impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in [-1, 1).
    fn sym(&mut self) -> f32 {
        ((self.next_u64() >> 40) as f32 / (1u64 << 23) as f32) - 1.0
    }
}

/// How values of a tensor are drawn.
#[derive(Clone, Copy)]
enum Init {
    /// Uniform with standard deviation `1/sqrt(fan_in)` (linears, convs).
    Fan(usize),
    /// Around 1 (norm weights, RMSNorm alpha).
    One,
    /// Small values (biases, LayerScale).
    Small,
    /// Positive usage counts (codebook `cluster_usage`), 0.5..1.5.
    Usage,
    /// Constant 1 (`_initialized`).
    Flag,
}

fn init_for(spec: &TensorSpec) -> Init {
    let n = &spec.name;
    if n.ends_with("_initialized") {
        Init::Flag
    } else if n.ends_with("cluster_usage") {
        Init::Usage
    } else if n.ends_with(".alpha")
        || (n.contains("norm") && n.ends_with(".weight") && spec.shape.len() == 1)
    {
        Init::One
    } else if n.ends_with(".bias") || n.ends_with(".scale") {
        Init::Small
    } else {
        Init::Fan(spec.shape.iter().skip(1).product::<usize>().max(1))
    }
}

fn fill(rng: &mut Rng, init: Init, out: &mut [f32]) {
    match init {
        Init::Fan(fan) => {
            let a = (3.0 / fan as f32).sqrt();
            out.iter_mut().for_each(|v| *v = a * rng.sym());
        }
        Init::One => out.iter_mut().for_each(|v| *v = 1.0 + 0.1 * rng.sym()),
        Init::Small => out.iter_mut().for_each(|v| *v = 0.02 * rng.sym()),
        Init::Usage => out.iter_mut().for_each(|v| *v = 1.0 + 0.5 * rng.sym()),
        Init::Flag => out.iter_mut().for_each(|v| *v = 1.0),
    }
}

/// Storage of one written tensor.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Store {
    F32,
    Bf16,
    Q8_0,
    Q4_0,
    Mlx { bits: u8, group: usize },
}

/// A tensor to write: file name, logical shape (as in the file for plain types), storage, init.
struct Out {
    name: String,
    shape: Vec<usize>,
    store: Store,
    init: Init,
}

impl Out {
    fn rows_cols(&self) -> (usize, usize) {
        (
            self.shape.first().copied().unwrap_or(1),
            self.shape.iter().skip(1).product::<usize>().max(1),
        )
    }
}

/// Map the canonical LM schema onto the file tensors of `format`.
fn lm_outputs(cfg: &LmConfig, format: SynthFormat) -> Vec<Out> {
    let schema = Schema::lm(cfg);
    let steps = cfg.depformer_weight_steps();
    let mut outs = Vec::new();
    let mlx = matches!(format, SynthFormat::MlxQ4 | SynthFormat::MlxQ8);
    let candle = !matches!(format, SynthFormat::Bf16 | SynthFormat::Bf16InProjs);
    let (bits, group) = match format {
        SynthFormat::MlxQ4 => (4, 32),
        _ => (8, 64),
    };
    for spec in &schema.tensors {
        let init = init_for(spec);
        let is_norm = spec.name.ends_with(".alpha");
        let store_for = |cols: usize| -> Store {
            match format {
                SynthFormat::Bf16 | SynthFormat::Bf16InProjs | SynthFormat::CandleBf16 => {
                    Store::Bf16
                }
                SynthFormat::Q8Gguf | SynthFormat::Q4Gguf => {
                    if is_norm || !cols.is_multiple_of(32) {
                        // candle's tensor-tools keeps tensors whose rows do not fill GGML blocks in F32.
                        Store::F32
                    } else if format == SynthFormat::Q4Gguf {
                        Store::Q4_0
                    } else {
                        Store::Q8_0
                    }
                }
                SynthFormat::MlxQ4 | SynthFormat::MlxQ8 => {
                    if is_norm || !cols.is_multiple_of(group) {
                        Store::Bf16
                    } else {
                        Store::Mlx { bits, group }
                    }
                }
            }
        };
        let mut push = |name: String, shape: Vec<usize>| {
            let cols = shape.iter().skip(1).product::<usize>();
            let shape = if mlx && is_norm {
                vec![*shape.last().expect("norm dim")]
            } else {
                shape
            };
            outs.push(Out {
                name,
                store: store_for(cols),
                shape,
                init,
            });
        };
        if !candle {
            let split = [
                ("self_attn.in_proj_weight", "self_attn.in_projs"),
                ("self_attn.out_proj.weight", "self_attn.out_projs"),
            ];
            match split.iter().find(|(c, _)| spec.name.ends_with(c)) {
                Some((c, new)) if format == SynthFormat::Bf16InProjs => {
                    let k = if spec.name.starts_with("depformer.") {
                        steps
                    } else {
                        1
                    };
                    let base = &spec.name[..spec.name.len() - c.len()];
                    for i in 0..k {
                        push(
                            format!("{base}{new}.{i}.weight"),
                            vec![spec.shape[0] / k, spec.shape[1]],
                        );
                    }
                }
                _ => push(spec.name.clone(), spec.shape.clone()),
            }
            continue;
        }
        let dep = if mlx {
            "depformer.slices."
        } else {
            "depformer."
        };
        let leaf_mlx = |leaf: &str| -> String {
            if !mlx {
                return leaf.to_string();
            }
            leaf.replace("self_attn.in_proj_weight", "self_attn.in_proj.weight")
                .replace("norm1.alpha", "norm1.weight")
                .replace("norm2.alpha", "norm2.weight")
                .replace("out_norm.alpha", "out_norm.weight")
        };
        let n = spec.name.as_str();
        let idx_after =
            |p: &str| -> Option<usize> { n.strip_prefix(p)?.split('.').next()?.parse().ok() };
        if let Some(k) = idx_after("depformer_in.") {
            push(format!("{dep}{k}.linear_in.weight"), spec.shape.clone());
        } else if let Some(k) = idx_after("linears.") {
            push(format!("{dep}{k}.linear_out.weight"), spec.shape.clone());
        } else if n == "depformer_text_emb.weight" {
            push(format!("{dep}0.emb.weight"), spec.shape.clone());
        } else if let Some(k) = idx_after("depformer_emb.") {
            push(format!("{dep}{}.emb.weight", k + 1), spec.shape.clone());
        } else if let Some(j) = idx_after("depformer.layers.") {
            let leaf = &n[format!("depformer.layers.{j}.").len()..];
            if leaf == "self_attn.in_proj_weight" || leaf == "self_attn.out_proj.weight" {
                let rows = spec.shape[0] / steps;
                for k in 0..steps {
                    push(
                        format!("{dep}{k}.transformer.layers.{j}.{}", leaf_mlx(leaf)),
                        vec![rows, spec.shape[1]],
                    );
                }
            } else if leaf.starts_with("norm") {
                for k in 0..steps {
                    push(
                        format!("{dep}{k}.transformer.layers.{j}.{}", leaf_mlx(leaf)),
                        spec.shape.clone(),
                    );
                }
            } else if let Some(g) = leaf.strip_prefix("gating.") {
                let (k, rest) = g.split_once('.').expect("gating.{k}.linear_*");
                push(
                    format!("{dep}{k}.transformer.layers.{j}.gating.{rest}"),
                    spec.shape.clone(),
                );
            } else {
                push(n.to_string(), spec.shape.clone());
            }
        } else if let (true, Some(i)) = (mlx, idx_after("emb.")) {
            push(format!("audio_embs.{i}.weight"), spec.shape.clone());
        } else {
            push(leaf_mlx(n), spec.shape.clone());
        }
    }
    outs
}

/// Bytes of each file tensor of `o` (for MLX: the packed codes, scales, biases as separate tensors).
fn expand(o: &Out) -> Vec<(String, &'static str, Vec<usize>, usize)> {
    let (rows, cols) = o.rows_cols();
    let n: usize = o.shape.iter().product();
    match o.store {
        Store::F32 => vec![(o.name.clone(), "F32", o.shape.clone(), n * 4)],
        Store::Bf16 => vec![(o.name.clone(), "BF16", o.shape.clone(), n * 2)],
        Store::Q8_0 => vec![(o.name.clone(), "Q8_0", o.shape.clone(), n / 32 * 34)],
        Store::Q4_0 => vec![(o.name.clone(), "Q4_0", o.shape.clone(), n / 32 * 18)],
        Store::Mlx { bits, group } => {
            let base = o
                .name
                .strip_suffix(".weight")
                .unwrap_or(&o.name)
                .to_string();
            let packed = cols * bits as usize / 32;
            let ng = cols / group;
            vec![
                (
                    format!("{base}.weight"),
                    "U32",
                    vec![rows, packed],
                    rows * packed * 4,
                ),
                (
                    format!("{base}.scales"),
                    "BF16",
                    vec![rows, ng],
                    rows * ng * 2,
                ),
                (
                    format!("{base}.biases"),
                    "BF16",
                    vec![rows, ng],
                    rows * ng * 2,
                ),
            ]
        }
    }
}

/// Generate `o` row-chunk by row-chunk and hand each encoded buffer (per output tensor) to `sink`.
/// For MLX, codes, scales and biases are written as three consecutive tensors, so `sink` receives
/// `(tensor index within expand(o), bytes)`.
fn stream_tensor(
    o: &Out,
    rng: &mut Rng,
    mut sink: impl FnMut(usize, &[u8]) -> std::io::Result<()>,
) -> std::io::Result<()> {
    let (rows, cols) = o.rows_cols();
    let chunk_rows = (1usize << 20).div_ceil(cols.max(1)).clamp(1, rows.max(1));
    let mut vals = vec![0f32; chunk_rows * cols];
    let mut buf = Vec::new();
    // MLX: three passes would regenerate; instead buffer scales/biases (small: rows*cols/group).
    let mut scales = Vec::new();
    let mut biases = Vec::new();
    let mut r = 0;
    while r < rows {
        let n = chunk_rows.min(rows - r);
        let v = &mut vals[..n * cols];
        fill(rng, o.init, v);
        buf.clear();
        match o.store {
            Store::F32 => v
                .iter()
                .for_each(|x| buf.extend_from_slice(&x.to_le_bytes())),
            Store::Bf16 => v
                .iter()
                .for_each(|x| buf.extend_from_slice(&bf16::from_f32(*x).to_le_bytes())),
            Store::Q8_0 => {
                for blk in v.chunks_exact(32) {
                    let amax = blk.iter().fold(0f32, |m, x| m.max(x.abs()));
                    let d = amax / 127.0;
                    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                    buf.extend_from_slice(&f16::from_f32(d).to_le_bytes());
                    buf.extend(blk.iter().map(|x| (x * id).round() as i8 as u8));
                }
            }
            Store::Q4_0 => {
                // GGML Q4_0: w = d·(q − 8) with q in 0..=15; d is set from the value of largest
                // magnitude (sign kept) so that value maps to q = 0 exactly. Byte j holds element j
                // in its low nibble and element j + 16 in its high nibble.
                for blk in v.chunks_exact(32) {
                    let extreme = blk
                        .iter()
                        .fold(0f32, |m, &x| if x.abs() > m.abs() { x } else { m });
                    let d = extreme / -8.0;
                    let d16 = f16::from_f32(d);
                    let dq = d16.to_f32();
                    let id = if dq != 0.0 { 1.0 / dq } else { 0.0 };
                    let q = |x: f32| (x * id + 8.0).round().clamp(0.0, 15.0) as u8;
                    buf.extend_from_slice(&d16.to_le_bytes());
                    buf.extend((0..16).map(|j| q(blk[j]) | (q(blk[j + 16]) << 4)));
                }
            }
            Store::Mlx { bits, group } => {
                let levels = ((1u32 << bits) - 1) as f32;
                let per_word = 32 / bits as usize;
                for row in v.chunks_exact(cols) {
                    let mut word = 0u32;
                    for (gi, g) in row.chunks_exact(group).enumerate() {
                        let (lo, hi) = g
                            .iter()
                            .fold((f32::MAX, f32::MIN), |(a, b), x| (a.min(*x), b.max(*x)));
                        let scale = ((hi - lo) / levels).max(1e-7);
                        let (s16, b16) = (bf16::from_f32(scale), bf16::from_f32(lo));
                        scales.extend_from_slice(&s16.to_le_bytes());
                        biases.extend_from_slice(&b16.to_le_bytes());
                        let (s, b) = (s16.to_f32(), b16.to_f32());
                        for (j, x) in g.iter().enumerate() {
                            let q = ((x - b) / s).round().clamp(0.0, levels) as u32;
                            let c = gi * group + j;
                            word |= q << ((c % per_word) * bits as usize);
                            if c % per_word == per_word - 1 {
                                buf.extend_from_slice(&word.to_le_bytes());
                                word = 0;
                            }
                        }
                    }
                }
            }
        }
        sink(0, &buf)?;
        r += n;
    }
    if matches!(o.store, Store::Mlx { .. }) {
        sink(1, &scales)?;
        sink(2, &biases)?;
    }
    Ok(())
}

fn io_err(path: &Path) -> impl Fn(std::io::Error) -> CheckpointError + '_ {
    move |source| CheckpointError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Byte size and placement of each file tensor of `outs` (MLX triplets expanded).
type Infos<'a> = Vec<(String, &'a str, Vec<usize>, usize)>;

/// The header of the LM file of `format` holding `infos`, each tensor's data offset (relative to
/// the data section), and the file's total length. Written as the released files are:
/// * GGUF (candle's writer, `moshiko-candle-q8`): version 2, no metadata key, tensor data
///   aligned to 32 bytes;
/// * MLX (`mx.save_safetensors`): `__metadata__` `{"format": "mlx"}`, header not padded (the
///   data section may be unaligned);
/// * PyTorch / candle safetensors: no metadata, header padded to 8 bytes.
fn lm_header(format: SynthFormat, infos: &Infos<'_>) -> (Vec<u8>, Vec<u64>, u64) {
    match format {
        SynthFormat::Q8Gguf | SynthFormat::Q4Gguf => {
            let typed: Vec<(&str, u32, &[usize], usize)> = infos
                .iter()
                .map(|(n, d, s, l)| {
                    let t = match *d {
                        "F32" => gguf::ggml::F32,
                        "Q8_0" => gguf::ggml::Q8_0,
                        "Q4_0" => gguf::ggml::Q4_0,
                        _ => gguf::ggml::BF16,
                    };
                    (n.as_str(), t, s.as_slice(), *l)
                })
                .collect();
            let (h, offsets) = gguf::header_bytes(&typed, 2);
            let end = offsets.last().copied().unwrap_or(0) + infos.last().map_or(0, |i| i.3 as u64);
            let len =
                h.len() as u64 + end.div_ceil(gguf::DEFAULT_ALIGNMENT) * gguf::DEFAULT_ALIGNMENT;
            (h, offsets, len)
        }
        _ => {
            let mlx = matches!(format, SynthFormat::MlxQ4 | SynthFormat::MlxQ8);
            let metadata: std::collections::BTreeMap<String, String> =
                [("format".to_string(), "mlx".to_string())].into();
            let h = model::checkpoint::safetensors::header_bytes_with(
                infos,
                mlx.then_some(&metadata),
                !mlx,
            );
            let mut offsets = Vec::with_capacity(infos.len());
            let mut off = 0u64;
            for i in infos {
                offsets.push(off);
                off += i.3 as u64;
            }
            (h.clone(), offsets, h.len() as u64 + off)
        }
    }
}

/// Write the file of `outs` in `format` (safetensors, or GGUF with F32 / Q8_0 / Q4_0 / BF16
/// tensors only), streaming each tensor to the offset the header gives its first file tensor and
/// zero-filling the alignment gaps (GGUF's; safetensors has none).
fn write_tensor_file(
    path: &Path,
    format: SynthFormat,
    outs: &[Out],
    seed: u64,
) -> Result<u64, CheckpointError> {
    let per_out: Vec<Infos<'_>> = outs.iter().map(expand).collect();
    let infos: Infos<'_> = per_out.concat();
    let (header, offsets, total) = lm_header(format, &infos);
    let f = File::create(path).map_err(io_err(path))?;
    let mut w = BufWriter::with_capacity(1 << 22, f);
    w.write_all(&header).map_err(io_err(path))?;
    let mut rng = Rng(seed);
    let mut pos = 0u64;
    // Index in `offsets` of the next tensor's first file tensor (an MLX matrix has three, written
    // one after the other by `stream_tensor`).
    let mut first = 0;
    for (o, parts) in outs.iter().zip(&per_out) {
        let off = offsets[first];
        first += parts.len();
        let pad = off - pos;
        w.write_all(&vec![0u8; pad as usize])
            .map_err(io_err(path))?;
        pos = off;
        stream_tensor(o, &mut rng, |_, b| {
            pos += b.len() as u64;
            w.write_all(b)
        })
        .map_err(io_err(path))?;
    }
    let end = total - header.len() as u64;
    w.write_all(&vec![0u8; (end - pos) as usize])
        .map_err(io_err(path))?;
    w.flush().map_err(io_err(path))?;
    Ok(total)
}

/// What the LM file of `format` for `cfg` holds, computed from the schema without writing it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inventory {
    /// Tensors in the file (an MLX quantized matrix counts as its three tensors).
    pub tensors: usize,
    /// Tensors per file dtype (`BF16`, `F32`, `Q8_0`, `U32`).
    pub by_dtype: std::collections::BTreeMap<String, usize>,
    /// Model values (dequantized elements of every weight).
    pub values: u64,
    /// File length in bytes.
    pub file_len: u64,
}

/// The inventory of the LM file [`write_bundle`] writes for `cfg` in `format`.
pub fn lm_inventory(cfg: &LmConfig, format: SynthFormat) -> Inventory {
    let outs = lm_outputs(cfg, format);
    let infos: Infos<'_> = outs.iter().flat_map(expand).collect();
    let (_, _, file_len) = lm_header(format, &infos);
    let mut by_dtype = std::collections::BTreeMap::new();
    for i in &infos {
        *by_dtype.entry(i.1.to_string()).or_insert(0) += 1;
    }
    Inventory {
        tensors: infos.len(),
        by_dtype,
        values: outs
            .iter()
            .map(|o| o.shape.iter().product::<usize>() as u64)
            .sum(),
        file_len,
    }
}

/// Write only the header of the LM file of `format` for `cfg` and extend the file to its full
/// length without writing data (a sparse file): enough to exercise format detection, name mapping
/// and schema checks at full size without generating gigabytes.
pub fn write_lm_header_only(
    path: &Path,
    format: SynthFormat,
    cfg: &LmConfig,
) -> Result<u64, CheckpointError> {
    let outs = lm_outputs(cfg, format);
    let infos: Infos<'_> = outs.iter().flat_map(expand).collect();
    let (header, _, total) = lm_header(format, &infos);
    let mut f = File::create(path).map_err(io_err(path))?;
    f.write_all(&header).map_err(io_err(path))?;
    f.set_len(total).map_err(io_err(path))?;
    Ok(total)
}

/// Write only the header of an f32 Mimi file for `cfg` (Kyutai names, or the Hugging Face layout when
/// `hf`) and extend it to full length without data (sparse), like [`write_lm_header_only`].
pub fn write_mimi_header_only(
    path: &Path,
    cfg: &MimiConfig,
    hf: bool,
) -> Result<u64, CheckpointError> {
    let infos = mimi_infos(cfg, hf)?;
    let header = model::checkpoint::safetensors::header_bytes(&infos, None);
    let total = header.len() as u64 + infos.iter().map(|i| i.3 as u64).sum::<u64>();
    let mut f = File::create(path).map_err(io_err(path))?;
    f.write_all(&header).map_err(io_err(path))?;
    f.set_len(total).map_err(io_err(path))?;
    Ok(total)
}

/// The f32 tensors of the Mimi file for `cfg` (Kyutai names, or the Hugging Face layout).
fn mimi_infos(cfg: &MimiConfig, hf: bool) -> Result<Infos<'static>, CheckpointError> {
    let mut infos: Infos<'static> = Vec::new();
    for t in Schema::mimi(cfg).tensors {
        let n: usize = t.shape.iter().product();
        if !hf {
            infos.push((t.name, "F32", t.shape, n * 4));
            continue;
        }
        let names = model::checkpoint::names::to_hf_mimi(&t.name)
            .ok_or_else(|| CheckpointError::NoSuchTensor(t.name.clone()))?;
        let k = names.len();
        let mut shape = t.shape.clone();
        shape[0] /= k;
        for name in names {
            infos.push((name, "F32", shape.clone(), n / k * 4));
        }
    }
    Ok(infos)
}

/// A minimal SentencePiece `ModelProto` with `vocab` pieces (`<unk>`, `<s>`, `</s>`, `<pad>`, then
/// `▁w{i}` normal pieces), enough for id → piece decoding in benchmarks.
pub fn tiny_spm(vocab: usize) -> Vec<u8> {
    fn varint(mut v: u64, out: &mut Vec<u8>) {
        while v >= 0x80 {
            out.push((v as u8) | 0x80);
            v >>= 7;
        }
        out.push(v as u8);
    }
    let mut out = Vec::new();
    for i in 0..vocab {
        let (piece, ty) = match i {
            0 => ("<unk>".to_string(), 2),
            1 => ("<s>".to_string(), 3),
            2 => ("</s>".to_string(), 3),
            3 => ("<pad>".to_string(), 3),
            _ => (format!("\u{2581}w{i}"), 1),
        };
        let mut body = vec![0x0a];
        varint(piece.len() as u64, &mut body);
        body.extend_from_slice(piece.as_bytes());
        body.push(0x15);
        body.extend_from_slice(&(-(i as f32) / vocab as f32).to_le_bytes());
        body.push(0x18);
        varint(ty, &mut body);
        out.push(0x0a);
        varint(body.len() as u64, &mut out);
        out.extend_from_slice(&body);
    }
    out
}

/// The Kyutai `config.json` for `cfg`.
pub fn config_json(cfg: &LmConfig, moshi_name: &str, mimi_config_name: Option<&str>) -> String {
    let mut m = serde_json::json!({
        "dim": cfg.dim, "text_card": cfg.text_card, "existing_text_padding_id": cfg.existing_text_padding_id,
        "n_q": cfg.n_q, "dep_q": cfg.dep_q, "card": cfg.card, "num_heads": cfg.num_heads,
        "num_layers": cfg.num_layers, "hidden_scale": cfg.hidden_scale, "causal": cfg.causal,
        "layer_scale": null, "context": cfg.context, "max_period": cfg.max_period,
        "gating": cfg.gating.name(), "norm": cfg.norm.name(), "positional_embedding": cfg.positional_embedding.name(),
        "depformer_dim": cfg.depformer_dim, "depformer_dim_feedforward": cfg.depformer_dim_feedforward,
        "depformer_num_heads": cfg.depformer_num_heads, "depformer_num_layers": cfg.depformer_num_layers,
        "depformer_layer_scale": null, "depformer_multi_linear": cfg.depformer_multi_linear,
        "depformer_context": cfg.depformer_context, "depformer_max_period": cfg.depformer_max_period,
        "depformer_gating": cfg.depformer_gating.name(), "depformer_pos_emb": cfg.depformer_pos_emb.name(),
        "depformer_weights_per_step": cfg.depformer_weights_per_step, "delays": cfg.delays,
        "moshi_name": moshi_name, "mimi_name": MIMI_NAME, "tokenizer_name": TOKENIZER_NAME, "model_type": "moshi",
    });
    if let Some(n) = mimi_config_name {
        m["mimi_config_name"] = serde_json::Value::String(n.to_string());
    }
    serde_json::to_string_pretty(&m).expect("serialisable")
}

/// What [`write_bundle`] wrote.
#[derive(Debug, Clone)]
pub struct SynthReport {
    /// LM weights file and its size in bytes.
    pub lm: (PathBuf, u64),
    /// Mimi weights file and its size in bytes.
    pub mimi: (PathBuf, u64),
    /// Whether a `config.json` was written.
    pub config: bool,
}

/// Write a bundle with random weights into `dir` (created if needed).
///
/// `config.json` is written for [`SynthFormat::Bf16`] (as in the released PyTorch repository) and for
/// every format when `lm`/`mimi` differ from the released configurations (the candle and MLX
/// repositories have none). Mimi is written in f32 with the Kyutai names.
pub fn write_bundle(
    dir: &Path,
    format: SynthFormat,
    lm: &LmConfig,
    mimi: &MimiConfig,
    seed: u64,
) -> Result<SynthReport, CheckpointError> {
    std::fs::create_dir_all(dir).map_err(io_err(dir))?;
    let released = *lm == LmConfig::moshiko_v0_1() && *mimi == MimiConfig::v0_1();
    let lm_path = dir.join(format.lm_file());
    let outs = lm_outputs(lm, format);
    let lm_size = write_tensor_file(&lm_path, format, &outs, seed)?;
    let mimi_outs: Vec<Out> = Schema::mimi(mimi)
        .tensors
        .iter()
        .map(|s| Out {
            name: s.name.clone(),
            shape: s.shape.clone(),
            store: Store::F32,
            init: init_for(s),
        })
        .collect();
    let mimi_path = dir.join(MIMI_NAME);
    // The released Mimi file is a plain PyTorch safetensors file (padded header, no metadata).
    let mimi_size = write_tensor_file(&mimi_path, SynthFormat::Bf16, &mimi_outs, seed ^ 0x5eed)?;
    let spm = dir.join(TOKENIZER_NAME);
    std::fs::write(&spm, tiny_spm(lm.text_card)).map_err(io_err(&spm))?;
    // No released repository holds a Q4_0 GGUF, so no file-name default finds it: name it in config.json.
    let write_cfg = matches!(
        format,
        SynthFormat::Bf16 | SynthFormat::Bf16InProjs | SynthFormat::Q4Gguf
    ) || !released;
    if write_cfg {
        let mimi_cfg = if *mimi == MimiConfig::v0_1() {
            None
        } else {
            let p = dir.join("mimi_config.json");
            std::fs::write(&p, mimi_config_json(mimi)).map_err(io_err(&p))?;
            Some("mimi_config.json")
        };
        let p = dir.join("config.json");
        std::fs::write(&p, config_json(lm, format.lm_file(), mimi_cfg)).map_err(io_err(&p))?;
    }
    Ok(SynthReport {
        lm: (lm_path, lm_size),
        mimi: (mimi_path, mimi_size),
        config: write_cfg,
    })
}

/// A Mimi config JSON (`seanet` / `transformer` / `quantizer` sub-dicts) for `c`.
pub fn mimi_config_json(c: &MimiConfig) -> String {
    let s = &c.seanet;
    let t = &c.transformer;
    let q = &c.quantizer;
    let m = serde_json::json!({
        "sample_rate": c.sample_rate, "channels": c.channels, "frame_rate": c.frame_rate,
        "seanet": {
            "channels": s.channels, "dimension": s.dimension, "causal": s.causal, "n_filters": s.n_filters,
            "n_residual_layers": s.n_residual_layers, "activation": s.activation, "compress": s.compress,
            "dilation_base": s.dilation_base, "disable_norm_outer_blocks": s.disable_norm_outer_blocks,
            "kernel_size": s.kernel_size, "residual_kernel_size": s.residual_kernel_size,
            "last_kernel_size": s.last_kernel_size, "norm": s.norm, "pad_mode": s.pad_mode,
            "ratios": s.ratios, "true_skip": s.true_skip,
        },
        "quantizer": {
            "dimension": q.dimension, "n_q": q.n_q, "bins": q.bins,
            "input_dimension": q.input_dimension, "output_dimension": q.output_dimension,
        },
        "transformer": {
            "d_model": t.d_model, "num_heads": t.num_heads, "num_layers": t.num_layers, "causal": t.causal,
            "layer_scale": t.layer_scale, "context": t.context, "conv_layout": t.conv_layout,
            "max_period": t.max_period, "gating": t.gating.name(), "norm": t.norm.name(),
            "positional_embedding": t.positional_embedding.name(), "dim_feedforward": t.dim_feedforward,
            "input_dimension": t.input_dimension, "output_dimensions": t.output_dimensions,
        },
    });
    serde_json::to_string_pretty(&m).expect("serialisable")
}

#[cfg(test)]
mod tests {
    use super::*;
    use model::checkpoint::names::Layout;
    use model::checkpoint::Bundle;
    use model::checkpoint::Quant;
    use testkit::ScratchDir;

    fn tiny() -> (LmConfig, MimiConfig) {
        let mut lm = LmConfig::moshiko_v0_1();
        lm.dim = 64;
        lm.num_heads = 4;
        lm.num_layers = 2;
        lm.text_card = 100;
        lm.text_card_out = 100;
        lm.card = 64;
        lm.context = Some(10);
        lm.depformer_dim = 64;
        lm.depformer_num_heads = 4;
        lm.depformer_num_layers = 1;
        lm.depformer_dim_feedforward = (4.125 * 64.0) as usize;
        let mut mimi = MimiConfig::v0_1();
        mimi.seanet.dimension = 32;
        mimi.seanet.n_filters = 4;
        mimi.transformer.d_model = 32;
        mimi.transformer.input_dimension = 32;
        mimi.transformer.output_dimensions = vec![32];
        mimi.transformer.num_heads = 4;
        mimi.transformer.num_layers = 1;
        mimi.transformer.dim_feedforward = 64;
        mimi.quantizer.dimension = 16;
        mimi.quantizer.n_q = 8;
        mimi.quantizer.bins = 64;
        mimi.quantizer.input_dimension = 32;
        mimi.quantizer.output_dimension = 32;
        (lm, mimi)
    }

    /// Q4_0 blocks written by the generator decode (through the kernels' block decoder) to the drawn
    /// values within the format's rounding: the levels are d·(q − 8), q in 0..=15, with d (after its f16
    /// rounding) set so the value of largest magnitude sits on q = 0 up to that rounding. A value inside
    /// the 16 levels is off by at most |d|/2 (round to nearest); one beyond the last level on the other
    /// side (|x| > 7.5·|d|) is clamped to q = 15 (or 0), off by |x| − 7·|d|. Plus float slack.
    #[test]
    fn q4_0_blocks_decode_to_the_drawn_values() {
        let o = Out {
            name: "w".into(),
            shape: vec![4, 64],
            store: Store::Q4_0,
            init: Init::Fan(64),
        };
        let mut drawn = vec![0f32; 4 * 64];
        fill(&mut Rng(3), o.init, &mut drawn);
        let mut bytes = Vec::new();
        stream_tensor(&o, &mut Rng(3), |_, b| {
            bytes.extend_from_slice(b);
            Ok(())
        })
        .unwrap();
        assert_eq!(bytes.len(), 4 * 64 / 32 * 18);
        // The kernels read the file's GGUF blocks as they are (the loader's dequantizer is private
        // to the model crate; both decode d·(q − 8)).
        let m = kernels::Matrix::from_bytes(
            kernels::WeightFormat::Q4_0,
            4,
            64,
            kernels::Storage::from_vec(bytes.clone()),
        )
        .unwrap();
        let mut dec = vec![0f32; 4 * 64];
        for (r, row) in dec.chunks_exact_mut(64).enumerate() {
            m.row_f32(r, row);
        }
        for (b, (x, y)) in bytes
            .chunks_exact(18)
            .zip(drawn.chunks_exact(32).zip(dec.chunks_exact(32)))
        {
            let d = f16::from_le_bytes([b[0], b[1]]).to_f32().abs();
            for (xv, yv) in x.iter().zip(y) {
                let bound = (d / 2.0).max(xv.abs() - 7.0 * d) + 1e-6;
                assert!((xv - yv).abs() <= bound, "{xv} -> {yv} (d {d})");
            }
        }
    }

    #[test]
    fn every_format_roundtrips_through_bundle() {
        let (lm, mimi) = tiny();
        let root = ScratchDir::new("synth-test");
        for (fmt, layout) in [
            (SynthFormat::Bf16, Layout::PytorchLegacy),
            (SynthFormat::Bf16InProjs, Layout::PytorchNew),
            (SynthFormat::CandleBf16, Layout::Candle),
            (SynthFormat::Q8Gguf, Layout::Candle),
            (SynthFormat::Q4Gguf, Layout::Candle),
            (SynthFormat::MlxQ4, Layout::Mlx),
            (SynthFormat::MlxQ8, Layout::Mlx),
        ] {
            let dir = root.join(format!("{fmt:?}"));
            let rep = write_bundle(&dir, fmt, &lm, &mimi, 7).unwrap();
            assert_eq!(
                std::fs::metadata(&rep.lm.0).unwrap().len(),
                rep.lm.1,
                "{fmt:?}"
            );
            let b = Bundle::open(&dir).unwrap();
            assert_eq!(b.config.lm, lm);
            assert_eq!(b.mimi_config, mimi);
            let w = b.lm_weights().unwrap_or_else(|e| panic!("{fmt:?}: {e}"));
            assert_eq!(w.layout(), layout);
            let q = w
                .quant("transformer.layers.1.gating.linear_in.weight")
                .unwrap();
            let expect = match fmt {
                SynthFormat::Bf16 | SynthFormat::Bf16InProjs | SynthFormat::CandleBf16 => "bf16",
                SynthFormat::Q8Gguf => "q8_0",
                SynthFormat::Q4Gguf => "q4_0",
                SynthFormat::MlxQ4 => "mlx-q4-g32",
                SynthFormat::MlxQ8 => "mlx-q8-g64",
            };
            assert_eq!(q.name(), expect);
            // Values have the intended scale: std ~ 1/sqrt(fan_in) for a linear.
            let (v, _) = w
                .f32("transformer.layers.0.self_attn.in_proj_weight")
                .unwrap();
            let std = (v.iter().map(|x| x * x).sum::<f32>() / v.len() as f32).sqrt();
            assert!((std - 0.125).abs() < 0.02, "{fmt:?} std {std}");
            b.mimi_weights().unwrap();
            if let Quant::Mlx { .. } = q {
                w.matrix("text_emb.weight").unwrap();
            }
            let spm = model::text::SentencePiece::load(&b.files.tokenizer).unwrap();
            let _ = spm;
        }
    }

    /// Full-size moshiko files (header only, sparse) in every layout map completely onto the schema.
    #[test]
    fn moshiko_header_only_files_map_completely() {
        let cfg = LmConfig::moshiko_v0_1();
        let schema = Schema::lm(&cfg);
        let root = ScratchDir::new("synth-hdr");
        for (fmt, layout, q) in [
            (SynthFormat::Bf16, Layout::PytorchLegacy, "bf16"),
            (SynthFormat::Bf16InProjs, Layout::PytorchNew, "bf16"),
            (SynthFormat::CandleBf16, Layout::Candle, "bf16"),
            (SynthFormat::Q8Gguf, Layout::Candle, "q8_0"),
            (SynthFormat::Q4Gguf, Layout::Candle, "q4_0"),
            (SynthFormat::MlxQ4, Layout::Mlx, "mlx-q4-g32"),
            (SynthFormat::MlxQ8, Layout::Mlx, "mlx-q8-g64"),
        ] {
            let p = root.join(format!("{fmt:?}"));
            let len = write_lm_header_only(&p, fmt, &cfg).unwrap();
            let w = model::checkpoint::Weights::open(&p, model::checkpoint::Component::Lm).unwrap();
            assert_eq!(w.file_len() as u64, len);
            assert_eq!(w.layout(), layout, "{fmt:?}");
            w.check(&schema).unwrap_or_else(|e| panic!("{fmt:?}: {e}"));
            for n in [
                "text_emb.weight",
                "depformer.layers.5.gating.7.linear_out.weight",
                "linears.7.weight",
            ] {
                assert_eq!(w.quant(n).unwrap().name(), q, "{fmt:?} {n}");
            }
            let i = w
                .info("depformer.layers.3.self_attn.in_proj_weight")
                .unwrap();
            assert_eq!(i.shape, vec![24576, 1024]);
            std::fs::remove_file(&p).unwrap();
        }
    }

    /// The released Mimi (Kyutai and Hugging Face layouts, header only) maps onto the schema.
    #[test]
    fn released_mimi_header_only_both_layouts() {
        let cfg = MimiConfig::v0_1();
        let schema = Schema::mimi(&cfg);
        let root = ScratchDir::new("synth-mimi");
        for (hf, layout) in [(false, Layout::PytorchLegacy), (true, Layout::HfMimi)] {
            let p = root.join(format!("mimi-{hf}.safetensors"));
            write_mimi_header_only(&p, &cfg, hf).unwrap();
            let w =
                model::checkpoint::Weights::open(&p, model::checkpoint::Component::Mimi).unwrap();
            assert_eq!(w.layout(), layout);
            w.check(&schema).unwrap_or_else(|e| panic!("hf={hf}: {e}"));
            let i = w.info("decoder.model.11.convtr.convtr.weight").unwrap();
            assert_eq!(i.shape, vec![128, 64, 8]);
            if hf {
                assert_eq!(i.sources, vec!["decoder.layers.11.conv.weight".to_string()]);
                assert_eq!(
                    w.info("decoder.model.14.conv.conv.weight").unwrap().shape,
                    vec![1, 64, 3]
                );
            }
        }
    }

    #[test]
    fn moshiko_outputs_match_released_counts() {
        // candle bf16: 8 slices x 6 layers x (in/out proj + 2 norms + 2 gating) + per-slice 3.
        let outs = lm_outputs(&LmConfig::moshiko_v0_1(), SynthFormat::CandleBf16);
        let dep: Vec<_> = outs
            .iter()
            .filter(|o| o.name.starts_with("depformer."))
            .collect();
        assert_eq!(dep.len(), 8 * (6 * 6 + 3));
        let outs = lm_outputs(&LmConfig::moshiko_v0_1(), SynthFormat::MlxQ4);
        let t: Vec<_> = outs.iter().flat_map(expand).collect();
        let w = t
            .iter()
            .find(|x| x.0 == "transformer.layers.0.self_attn.in_proj.weight")
            .unwrap();
        assert_eq!(w.2, vec![12288, 512]);
        let s = t
            .iter()
            .find(|x| x.0 == "transformer.layers.0.self_attn.in_proj.scales")
            .unwrap();
        assert_eq!(s.2, vec![12288, 128]);
        let e = t.iter().find(|x| x.0 == "text_emb.weight").unwrap();
        assert_eq!(e.2, vec![32001, 512]);
        let outs = lm_outputs(&LmConfig::moshiko_v0_1(), SynthFormat::Bf16);
        let bytes: usize = outs.iter().flat_map(expand).map(|x| x.3).sum();
        assert_eq!(bytes, 2 * 7_687_729_152);
    }

    /// The full-size inventories, computed from the schema (nothing written), are those of the
    /// released files: PyTorch bf16 355 tensors / 7,687,729,152 values; candle q8 523 tensors
    /// (362 Q8_0, 161 F32) in 8,169,420,704 bytes; MLX q4 and q8 1,247 tensors; Mimi 318
    /// tensors (Hugging Face layout 350) / 96,151,393 values.
    #[test]
    fn full_size_inventories_match_the_released_files() {
        let cfg = LmConfig::moshiko_v0_1();
        let bf16 = lm_inventory(&cfg, SynthFormat::Bf16);
        assert_eq!((bf16.tensors, bf16.values), (355, 7_687_729_152));
        let q8 = lm_inventory(&cfg, SynthFormat::Q8Gguf);
        assert_eq!(q8.tensors, 523);
        assert_eq!(q8.by_dtype.get("Q8_0"), Some(&362));
        assert_eq!(q8.by_dtype.get("F32"), Some(&161));
        assert_eq!(q8.file_len, 8_169_420_704);
        // candle and MLX files repeat each Depformer norm per slice: 8 slices x 6 layers x 2 x 1024.
        let dep_norm_copies = 7 * 6 * 2 * 1024;
        assert_eq!(q8.values, bf16.values + dep_norm_copies);
        for fmt in [SynthFormat::MlxQ4, SynthFormat::MlxQ8] {
            let m = lm_inventory(&cfg, fmt);
            assert_eq!(m.tensors, 1_247, "{fmt:?}");
            assert_eq!(m.values, bf16.values + dep_norm_copies, "{fmt:?}");
        }
        for (hf, tensors) in [(false, 318), (true, 350)] {
            let infos = mimi_infos(&MimiConfig::v0_1(), hf).unwrap();
            assert_eq!(infos.len(), tensors, "hf {hf}");
            let values: usize = infos.iter().map(|i| i.3 / 4).sum();
            assert_eq!(values, 96_151_393, "hf {hf}");
        }
    }

    /// The files are laid out as the released ones: GGUF version 2 with no metadata key; MLX
    /// safetensors with `{"format":"mlx"}` and an unpadded header; and `write_lm_header_only`
    /// gives the inventory's length.
    #[test]
    fn headers_are_those_of_the_released_files() {
        let cfg = LmConfig::moshiko_v0_1();
        let root = ScratchDir::new("synth-inv");
        for fmt in [SynthFormat::Q8Gguf, SynthFormat::MlxQ4, SynthFormat::Bf16] {
            let p = root.join(format!("{fmt:?}"));
            let len = write_lm_header_only(&p, fmt, &cfg).unwrap();
            assert_eq!(len, lm_inventory(&cfg, fmt).file_len);
            let head = {
                use std::io::Read;
                let mut b = vec![0u8; 1 << 20];
                let n = File::open(&p).unwrap().read(&mut b).unwrap();
                b.truncate(n);
                b
            };
            match fmt {
                SynthFormat::Q8Gguf => {
                    assert_eq!(&head[..4], b"GGUF");
                    assert_eq!(u32::from_le_bytes(head[4..8].try_into().unwrap()), 2);
                    assert_eq!(u64::from_le_bytes(head[8..16].try_into().unwrap()), 523);
                    assert_eq!(u64::from_le_bytes(head[16..24].try_into().unwrap()), 0);
                }
                _ => {
                    let n = u64::from_le_bytes(head[..8].try_into().unwrap()) as usize;
                    let json: serde_json::Value = serde_json::from_slice(&head[8..8 + n]).unwrap();
                    if fmt == SynthFormat::MlxQ4 {
                        assert_eq!(json["__metadata__"], serde_json::json!({"format": "mlx"}));
                        assert_ne!(head[8 + n - 1], b' ', "no padding");
                    } else {
                        assert!(json.get("__metadata__").is_none());
                        assert_eq!((8 + n) % 8, 0);
                    }
                }
            }
            std::fs::remove_file(&p).unwrap();
        }
    }
}
