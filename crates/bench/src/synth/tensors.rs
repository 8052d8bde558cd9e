//! The values of synthetic tensors and their encoding: the generator, how each tensor is drawn, the
//! file tensors of each layout (names, shapes, storage) and their bytes, row chunk by row chunk.

use half::{bf16, f16};

use model::checkpoint::LmConfig;
use model::checkpoint::{Schema, TensorSpec};

use super::SynthFormat;

/// Small fast deterministic generator (SplitMix64).
pub(super) struct Rng(pub(super) u64);

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
pub(super) enum Init {
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

pub(super) fn init_for(spec: &TensorSpec) -> Init {
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

pub(super) fn fill(rng: &mut Rng, init: Init, out: &mut [f32]) {
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
pub(super) enum Store {
    F32,
    Bf16,
    Q8_0,
    Q4_0,
    Mlx { bits: u8, group: usize },
}

/// A tensor to write: file name, logical shape (as in the file for plain types), storage, init.
pub(super) struct Out {
    pub(super) name: String,
    pub(super) shape: Vec<usize>,
    pub(super) store: Store,
    pub(super) init: Init,
}

impl Out {
    pub(super) fn rows_cols(&self) -> (usize, usize) {
        (
            self.shape.first().copied().unwrap_or(1),
            self.shape.iter().skip(1).product::<usize>().max(1),
        )
    }
}

/// Map the canonical LM schema onto the file tensors of `format`.
pub(super) fn lm_outputs(cfg: &LmConfig, format: SynthFormat) -> Vec<Out> {
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
pub(super) fn expand(o: &Out) -> Vec<(String, &'static str, Vec<usize>, usize)> {
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
pub(super) fn stream_tensor(
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
