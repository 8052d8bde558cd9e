//! Name mapping tables: every released layout onto the canonical Kyutai PyTorch names.
//!
//! LM layouts: PyTorch legacy (`self_attn.in_proj_weight`, canonical), PyTorch new (`in_projs.{k}`,
//! `out_projs.{k}`), candle bf16 / q8 GGUF (`depformer.{k}.…` slices), MLX bf16/q8/q4
//! (`audio_embs`, `depformer.slices.{k}`, `in_proj.weight`, squeezed norms `normX.weight`).
//! Mimi layouts: Kyutai file (canonical, legacy or `in_projs` attention) and Hugging Face
//! `kyutai/mimi` (`encoder.layers.{i}.conv`, split `q/k/v_proj` with RoPE-permuted rows, ...).

use super::{CheckpointError, Component};

/// Source layout family of a weights file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Layout {
    /// Kyutai PyTorch names, legacy fused `in_proj_weight` (canonical).
    PytorchLegacy,
    /// Kyutai PyTorch `state_dict()` names (`in_projs.{k}` / `out_projs.{k}`).
    PytorchNew,
    /// candle names (`depformer.{k}.…`), safetensors or GGUF.
    Candle,
    /// MLX names (`audio_embs`, `depformer.slices.{k}`, `in_proj.weight`, `normX.weight`).
    Mlx,
    /// Hugging Face `transformers` Mimi (`kyutai/mimi`).
    HfMimi,
}

impl Layout {
    /// Short description.
    pub fn name(self) -> &'static str {
        match self {
            Layout::PytorchLegacy => "pytorch (legacy in_proj_weight)",
            Layout::PytorchNew => "pytorch (in_projs state_dict)",
            Layout::Candle => "candle",
            Layout::Mlx => "mlx",
            Layout::HfMimi => "hugging face transformers (kyutai/mimi)",
        }
    }
}

/// Where one source tensor goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// Canonical tensor `name`, as row block `part` (concatenated along dim 0 in part order; 0 when
    /// the tensor is whole). `reshape_norm` marks a squeezed norm `[d]` to be viewed as `[1, 1, d]`.
    To {
        /// Canonical name.
        name: String,
        /// Row-block index.
        part: usize,
        /// View `[d]` as `[1, 1, d]`.
        reshape_norm: bool,
        /// Hugging Face q/k rows to un-permute from half-split to interleaved RoPE order.
        unpermute_rope: bool,
    },
    /// A duplicate that carries no information (candle's per-slice copies of the shared depformer norms).
    Duplicate,
}

fn to(name: String, part: usize) -> Target {
    Target::To {
        name,
        part,
        reshape_norm: false,
        unpermute_rope: false,
    }
}

/// One unsupported variant: whether a tensor (name, is int8) belongs to it, and the refusal that
/// lists its tensors.
type Refusal = (fn(&str, bool) -> bool, fn(Vec<String>) -> CheckpointError);

/// The unsupported variants in the order they are tested and reported: a tensor counts for the
/// first variant it matches, and the first variant with any tensor is the one refused.
const REFUSALS: [Refusal; 7] = [
    (
        |n, _| n.contains("lora_A") || n.contains("lora_B") || n.contains(".lora."),
        |keys| CheckpointError::Lora { keys },
    ),
    (
        |n, _| n.starts_with("condition_provider.") || n.starts_with("fuser."),
        |keys| CheckpointError::Conditioning { keys },
    ),
    (
        |n, _| n.contains("cross_attention.") || n.contains("norm_cross."),
        |keys| CheckpointError::CrossAttention { keys },
    ),
    (
        |n, int8| {
            n.ends_with("_scb") || n.ends_with(".SCB") || n.ends_with("weight_format") || int8
        },
        |keys| CheckpointError::BitsAndBytes { keys },
    ),
    (
        |n, _| n.contains("text_emb.out1") || n.contains("text_emb.out2"),
        |keys| CheckpointError::Demux { keys },
    ),
    (
        |n, _| n.starts_with("extra_heads."),
        |keys| CheckpointError::ExtraHeads { keys },
    ),
    (
        |n, _| n.contains(".low_rank."),
        |keys| CheckpointError::LowRankEmbeddings { keys },
    ),
];

/// Typed refusal if `names` contain tensors of an unsupported variant (LoRA, conditioners, ...).
pub fn refuse_tensors<'a>(
    names: impl Iterator<Item = (&'a str, bool)>,
) -> Result<(), CheckpointError> {
    // (name, is_int8)
    let mut found: [Vec<String>; REFUSALS.len()] = Default::default();
    for (n, int8) in names {
        if let Some(i) = REFUSALS.iter().position(|(belongs, _)| belongs(n, int8)) {
            found[i].push(n.to_string());
        }
    }
    for ((_, refuse), keys) in REFUSALS.iter().zip(found) {
        if !keys.is_empty() {
            return Err(refuse(keys));
        }
    }
    Ok(())
}

/// Split `s` at the first `.` into (head, rest).
fn split1(s: &str) -> Option<(&str, &str)> {
    s.split_once('.')
}

fn parse_idx(s: &str) -> Option<usize> {
    if s.is_empty() || s.len() > 6 || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

/// Detect the layout of an LM file from its (base) tensor names.
pub fn detect_lm(names: &[&str]) -> Layout {
    let any = |f: &dyn Fn(&str) -> bool| names.iter().any(|n| f(n));
    if any(&|n| {
        n.starts_with("audio_embs.")
            || n.starts_with("depformer.slices.")
            || n.ends_with("self_attn.in_proj.weight")
    }) {
        Layout::Mlx
    } else if any(&|n| {
        n.strip_prefix("depformer.")
            .and_then(split1)
            .is_some_and(|(k, _)| parse_idx(k).is_some())
    }) {
        Layout::Candle
    } else if any(&|n| n.contains(".in_projs.") || n.contains(".out_projs.")) {
        Layout::PytorchNew
    } else {
        Layout::PytorchLegacy
    }
}

/// Detect the layout of a Mimi file.
pub fn detect_mimi(names: &[&str]) -> Layout {
    let hf = names.iter().any(|n| {
        n.starts_with("encoder.layers.")
            || n.starts_with("decoder.layers.")
            || n.starts_with("quantizer.semantic_residual_vector_quantizer.")
            || n.starts_with("encoder_transformer.layers.")
    });
    if hf {
        Layout::HfMimi
    } else if names
        .iter()
        .any(|n| n.contains(".in_projs.") || n.contains(".out_projs."))
    {
        Layout::PytorchNew
    } else {
        Layout::PytorchLegacy
    }
}

/// `…self_attn.in_projs.{k}.weight` → (`…self_attn.in_proj_weight`, k); same for `out_projs`.
fn new_attn(name: &str) -> Option<(String, usize)> {
    for (pat, canon) in [
        (".self_attn.in_projs.", ".self_attn.in_proj_weight"),
        (".self_attn.out_projs.", ".self_attn.out_proj.weight"),
    ] {
        if let Some(i) = name.find(pat) {
            let rest = &name[i + pat.len()..];
            let (k, leaf) = split1(rest)?;
            if leaf == "weight" {
                return Some((format!("{}{}", &name[..i], canon), parse_idx(k)?));
            }
        }
    }
    None
}

/// Map one LM tensor name (base name for MLX triplets) to its canonical target.
/// Returns `None` for a name that no rule recognises (it stays as-is and is judged by the schema).
pub fn map_lm(layout: Layout, name: &str) -> Target {
    if let Some((n, k)) = new_attn(name) {
        return to(n, k);
    }
    match layout {
        Layout::Mlx => map_mlx(name),
        Layout::Candle => {
            map_candle_depformer(name, "depformer.").unwrap_or_else(|| to(name.to_string(), 0))
        }
        _ => to(name.to_string(), 0),
    }
}

fn mlx_leaf(rest: &str) -> (String, bool) {
    // MLX module leaf names → canonical leaf names.
    if let Some(p) = rest.strip_suffix("self_attn.in_proj.weight") {
        return (format!("{p}self_attn.in_proj_weight"), false);
    }
    for n in ["norm1", "norm2", "out_norm"] {
        if let Some(p) = rest.strip_suffix(&format!("{n}.weight")) {
            if p.is_empty() || p.ends_with('.') {
                return (format!("{p}{n}.alpha"), true);
            }
        }
    }
    (rest.to_string(), false)
}

fn map_mlx(name: &str) -> Target {
    if let Some(rest) = name.strip_prefix("audio_embs.") {
        return to(format!("emb.{rest}"), 0);
    }
    if let Some(rest) = name.strip_prefix("depformer.slices.") {
        let (n, reshape) = mlx_leaf(rest);
        return match map_candle_depformer(&format!("depformer.{n}"), "depformer.") {
            Some(Target::To { name, part, .. }) => Target::To {
                name,
                part,
                reshape_norm: reshape,
                unpermute_rope: false,
            },
            Some(t) => t,
            None => to(format!("depformer.slices.{n}"), 0),
        };
    }
    let (n, reshape) = mlx_leaf(name);
    Target::To {
        name: n,
        part: 0,
        reshape_norm: reshape,
        unpermute_rope: false,
    }
}

/// candle depformer slices: `depformer.{k}.…` → canonical.
fn map_candle_depformer(name: &str, prefix: &str) -> Option<Target> {
    let rest = name.strip_prefix(prefix)?;
    let (k, leaf) = split1(rest)?;
    let k = parse_idx(k)?;
    Some(match leaf {
        "linear_in.weight" => to(format!("depformer_in.{k}.weight"), 0),
        "linear_out.weight" => to(format!("linears.{k}.weight"), 0),
        "emb.weight" if k == 0 => to("depformer_text_emb.weight".into(), 0),
        "emb.weight" => to(format!("depformer_emb.{}.weight", k - 1), 0),
        _ => {
            let l = leaf.strip_prefix("transformer.layers.")?;
            let (j, leaf) = split1(l)?;
            let j = parse_idx(j)?;
            match leaf {
                "self_attn.in_proj_weight" => {
                    to(format!("depformer.layers.{j}.self_attn.in_proj_weight"), k)
                }
                "self_attn.out_proj.weight" => {
                    to(format!("depformer.layers.{j}.self_attn.out_proj.weight"), k)
                }
                "norm1.alpha" | "norm2.alpha" => {
                    if k == 0 {
                        to(format!("depformer.layers.{j}.{leaf}"), 0)
                    } else {
                        Target::Duplicate
                    }
                }
                "gating.linear_in.weight" | "gating.linear_out.weight" => to(
                    format!(
                        "depformer.layers.{j}.gating.{k}.{}",
                        &leaf["gating.".len()..]
                    ),
                    0,
                ),
                _ => return None,
            }
        }
    })
}

/// Map one Mimi tensor name. `last_decoder_conv` = the index of the last `decoder.layers.{i}.conv`
/// in a Hugging Face file (that one and index 0 are plain convs; the others are transposed convs).
pub fn map_mimi(layout: Layout, name: &str, last_decoder_conv: Option<usize>) -> Target {
    if let Some((n, k)) = new_attn(name) {
        return to(n, k);
    }
    if layout != Layout::HfMimi {
        return to(name.to_string(), 0);
    }
    map_hf_mimi(name, last_decoder_conv).unwrap_or_else(|| to(name.to_string(), 0))
}

fn map_hf_mimi(name: &str, last_decoder_conv: Option<usize>) -> Option<Target> {
    for side in ["encoder", "decoder"] {
        if let Some(rest) = name.strip_prefix(&format!("{side}.layers.")) {
            let (i, leaf) = split1(rest)?;
            let idx = parse_idx(i)?;
            if let Some(p) = leaf.strip_prefix("conv.") {
                let transposed = side == "decoder" && idx != 0 && Some(idx) != last_decoder_conv;
                let mid = if transposed {
                    "convtr.convtr"
                } else {
                    "conv.conv"
                };
                return Some(to(format!("{side}.model.{idx}.{mid}.{p}"), 0));
            }
            if let Some(b) = leaf.strip_prefix("block.") {
                let (j, l) = split1(b)?;
                let p = l.strip_prefix("conv.")?;
                return Some(to(format!("{side}.model.{idx}.block.{j}.conv.conv.{p}"), 0));
            }
            return None;
        }
        let tp = format!("{side}_transformer.layers.");
        if let Some(rest) = name.strip_prefix(&tp) {
            let (l, leaf) = split1(rest)?;
            let l = parse_idx(l)?;
            let base = format!("{side}_transformer.transformer.layers.{l}.");
            let qkv = [
                ("self_attn.q_proj.weight", 0),
                ("self_attn.k_proj.weight", 1),
                ("self_attn.v_proj.weight", 2),
            ];
            for (pat, part) in qkv {
                if leaf == pat {
                    return Some(Target::To {
                        name: format!("{base}self_attn.in_proj_weight"),
                        part,
                        reshape_norm: false,
                        unpermute_rope: part < 2,
                    });
                }
            }
            let canon = hf_to_canon(&HF_LAYER_LEAVES, leaf)?;
            return Some(to(format!("{base}{canon}"), 0));
        }
    }
    if let Some(canon) = hf_to_canon(&HF_RESAMPLERS, name) {
        return Some(to(canon.into(), 0));
    }
    for &(hf, canon) in &HF_RVQ_PREFIXES {
        if let Some(rest) = name.strip_prefix(hf) {
            if rest.starts_with("input_proj.") || rest.starts_with("output_proj.") {
                return Some(to(format!("{canon}{rest}"), 0));
            }
            let l = rest.strip_prefix("layers.")?;
            let (n, leaf) = split1(l)?;
            let n = parse_idx(n)?;
            let leaf = hf_to_canon(&HF_CODEBOOK_LEAVES, leaf)?;
            return Some(to(format!("{canon}vq.layers.{n}.{leaf}"), 0));
        }
    }
    None
}

/// Hugging Face Mimi names against canonical ones, as `(hf, canonical)` rows: one table serves the
/// mapping and its inverse, so the two cannot drift apart.
type NameTable = [(&'static str, &'static str)];

/// Leaves of a transformer layer (after `…layers.{l}.`).
const HF_LAYER_LEAVES: [(&str, &str); 9] = [
    ("self_attn.o_proj.weight", "self_attn.out_proj.weight"),
    ("mlp.fc1.weight", "linear1.weight"),
    ("mlp.fc2.weight", "linear2.weight"),
    ("input_layernorm.weight", "norm1.weight"),
    ("input_layernorm.bias", "norm1.bias"),
    ("post_attention_layernorm.weight", "norm2.weight"),
    ("post_attention_layernorm.bias", "norm2.bias"),
    ("self_attn_layer_scale.scale", "layer_scale_1.scale"),
    ("mlp_layer_scale.scale", "layer_scale_2.scale"),
];

/// The learnt down- and upsample convolutions (whole names).
const HF_RESAMPLERS: [(&str, &str); 2] = [
    ("downsample.conv.weight", "downsample.conv.conv.conv.weight"),
    (
        "upsample.conv.weight",
        "upsample.convtr.convtr.convtr.weight",
    ),
];

/// The two residual quantizers (name prefixes).
const HF_RVQ_PREFIXES: [(&str, &str); 2] = [
    (
        "quantizer.semantic_residual_vector_quantizer.",
        "quantizer.rvq_first.",
    ),
    (
        "quantizer.acoustic_residual_vector_quantizer.",
        "quantizer.rvq_rest.",
    ),
];

/// Codebook leaves (after `layers.{n}.` / `vq.layers.{n}.`).
const HF_CODEBOOK_LEAVES: [(&str, &str); 3] = [
    ("codebook.embed_sum", "_codebook.embedding_sum"),
    ("codebook.initialized", "_codebook._initialized"),
    ("codebook.cluster_usage", "_codebook.cluster_usage"),
];

fn hf_to_canon(table: &NameTable, hf: &str) -> Option<&'static str> {
    table.iter().find(|(h, _)| *h == hf).map(|(_, c)| *c)
}

fn canon_to_hf(table: &NameTable, canon: &str) -> Option<&'static str> {
    table.iter().find(|(_, c)| *c == canon).map(|(h, _)| *h)
}

/// Hugging Face `kyutai/mimi` name(s) of a canonical Mimi tensor (the inverse of the mapping above;
/// a fused `in_proj_weight` gives its `q_proj`, `k_proj`, `v_proj` parts in order).
pub fn to_hf_mimi(canonical: &str) -> Option<Vec<String>> {
    for side in ["encoder", "decoder"] {
        if let Some(rest) = canonical.strip_prefix(&format!("{side}.model.")) {
            let (i, leaf) = split1(rest)?;
            for mid in ["conv.conv.", "convtr.convtr."] {
                if let Some(p) = leaf.strip_prefix(mid) {
                    return Some(vec![format!("{side}.layers.{i}.conv.{p}")]);
                }
            }
            let b = leaf.strip_prefix("block.")?;
            let (j, l) = split1(b)?;
            let p = l.strip_prefix("conv.conv.")?;
            return Some(vec![format!("{side}.layers.{i}.block.{j}.conv.{p}")]);
        }
        if let Some(rest) =
            canonical.strip_prefix(&format!("{side}_transformer.transformer.layers."))
        {
            let (l, leaf) = split1(rest)?;
            let base = format!("{side}_transformer.layers.{l}.");
            if leaf == "self_attn.in_proj_weight" {
                return Some(
                    ["q", "k", "v"]
                        .iter()
                        .map(|x| format!("{base}self_attn.{x}_proj.weight"))
                        .collect(),
                );
            }
            let hf = canon_to_hf(&HF_LAYER_LEAVES, leaf)?;
            return Some(vec![format!("{base}{hf}")]);
        }
    }
    if let Some(hf) = canon_to_hf(&HF_RESAMPLERS, canonical) {
        return Some(vec![hf.into()]);
    }
    for &(hf, canon) in &HF_RVQ_PREFIXES {
        if let Some(rest) = canonical.strip_prefix(canon) {
            if rest.starts_with("input_proj.") || rest.starts_with("output_proj.") {
                return Some(vec![format!("{hf}{rest}")]);
            }
            let l = rest.strip_prefix("vq.layers.")?;
            let (n, leaf) = split1(l)?;
            let leaf = canon_to_hf(&HF_CODEBOOK_LEAVES, leaf)?;
            return Some(vec![format!("{hf}layers.{n}.{leaf}")]);
        }
    }
    None
}

/// Index of the last `decoder.layers.{i}.conv.*` tensor in a Hugging Face Mimi file.
pub fn hf_last_decoder_conv(names: &[&str]) -> Option<usize> {
    names
        .iter()
        .filter_map(|n| {
            let rest = n.strip_prefix("decoder.layers.")?;
            let (i, leaf) = split1(rest)?;
            if leaf.starts_with("conv.") {
                parse_idx(i)
            } else {
                None
            }
        })
        .max()
}

/// Map a name for `component` (convenience over [`map_lm`] / [`map_mimi`]).
pub fn map(
    component: Component,
    layout: Layout,
    name: &str,
    last_decoder_conv: Option<usize>,
) -> Target {
    match component {
        Component::Lm => map_lm(layout, name),
        Component::Mimi => map_mimi(layout, name, last_decoder_conv),
    }
}

/// Inverse of the Hugging Face RoPE row permutation for one q or k matrix.
///
/// HF stores row `h*hd + s*(hd/2) + i` for the original (interleaved-pair) row `h*hd + 2*i + s`.
/// Returns, for each canonical row, the source row it comes from.
pub fn hf_rope_source_rows(rows: usize, num_heads: usize) -> Option<Vec<usize>> {
    if num_heads == 0 || !rows.is_multiple_of(num_heads) {
        return None;
    }
    let hd = rows / num_heads;
    if !hd.is_multiple_of(2) {
        return None;
    }
    let half = hd / 2;
    let mut src = vec![0; rows];
    for h in 0..num_heads {
        for i in 0..half {
            for s in 0..2 {
                src[h * hd + 2 * i + s] = h * hd + s * half + i;
            }
        }
    }
    Some(src)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::err_variant;

    fn canon(t: Target) -> (String, usize) {
        match t {
            Target::To { name, part, .. } => (name, part),
            Target::Duplicate => ("<dup>".into(), 0),
        }
    }

    /// Asserts that each `(source, canonical, part)` row maps as listed under `layout`.
    fn assert_lm_maps(layout: Layout, rows: &[(&str, &str, usize)]) {
        for &(src, want, part) in rows {
            assert_eq!(
                canon(map_lm(layout, src)),
                (want.to_string(), part),
                "{src}"
            );
        }
    }

    #[test]
    fn candle_names() {
        let l = Layout::Candle;
        assert_lm_maps(
            l,
            &[
                ("depformer.3.linear_in.weight", "depformer_in.3.weight", 0),
                ("depformer.0.emb.weight", "depformer_text_emb.weight", 0),
                ("depformer.2.emb.weight", "depformer_emb.1.weight", 0),
                (
                    "depformer.5.transformer.layers.1.self_attn.in_proj_weight",
                    "depformer.layers.1.self_attn.in_proj_weight",
                    5,
                ),
                (
                    "depformer.5.transformer.layers.1.gating.linear_out.weight",
                    "depformer.layers.1.gating.5.linear_out.weight",
                    0,
                ),
                (
                    "transformer.layers.0.norm1.alpha",
                    "transformer.layers.0.norm1.alpha",
                    0,
                ),
            ],
        );
        assert_eq!(
            map_lm(l, "depformer.5.transformer.layers.1.norm1.alpha"),
            Target::Duplicate
        );
    }

    #[test]
    fn mlx_names() {
        let l = Layout::Mlx;
        assert_lm_maps(
            l,
            &[
                ("audio_embs.4.weight", "emb.4.weight", 0),
                (
                    "transformer.layers.3.self_attn.in_proj.weight",
                    "transformer.layers.3.self_attn.in_proj_weight",
                    0,
                ),
                (
                    "depformer.slices.2.transformer.layers.0.self_attn.in_proj.weight",
                    "depformer.layers.0.self_attn.in_proj_weight",
                    2,
                ),
            ],
        );
        // MLX squeezes norms to `[d]`; the canonical schema wants `[1, 1, d]`.
        for (src, want) in [
            ("out_norm.weight", "out_norm.alpha"),
            (
                "depformer.slices.0.transformer.layers.0.norm2.weight",
                "depformer.layers.0.norm2.alpha",
            ),
        ] {
            assert_eq!(
                map_lm(l, src),
                Target::To {
                    name: want.into(),
                    part: 0,
                    reshape_norm: true,
                    unpermute_rope: false
                }
            );
        }
        assert_eq!(
            map_lm(l, "depformer.slices.1.transformer.layers.0.norm2.weight"),
            Target::Duplicate
        );
    }

    #[test]
    fn new_layout() {
        assert_eq!(
            canon(map_lm(
                Layout::PytorchNew,
                "depformer.layers.1.self_attn.in_projs.7.weight"
            )),
            ("depformer.layers.1.self_attn.in_proj_weight".into(), 7)
        );
        assert_eq!(
            canon(map_mimi(
                Layout::PytorchNew,
                "encoder_transformer.transformer.layers.0.self_attn.out_projs.0.weight",
                None
            )),
            (
                "encoder_transformer.transformer.layers.0.self_attn.out_proj.weight".into(),
                0
            )
        );
    }

    #[test]
    fn hf_mimi_names() {
        let l = Layout::HfMimi;
        let m = |n| canon(map_mimi(l, n, Some(14)));
        for (src, want) in [
            (
                "decoder.layers.2.conv.weight",
                "decoder.model.2.convtr.convtr.weight",
            ),
            (
                "decoder.layers.14.conv.bias",
                "decoder.model.14.conv.conv.bias",
            ),
            (
                "decoder.layers.0.conv.bias",
                "decoder.model.0.conv.conv.bias",
            ),
            (
                "encoder.layers.1.block.3.conv.weight",
                "encoder.model.1.block.3.conv.conv.weight",
            ),
            (
                "quantizer.acoustic_residual_vector_quantizer.layers.30.codebook.embed_sum",
                "quantizer.rvq_rest.vq.layers.30._codebook.embedding_sum",
            ),
            (
                "upsample.conv.weight",
                "upsample.convtr.convtr.convtr.weight",
            ),
        ] {
            assert_eq!(m(src).0, want, "{src}");
        }
        assert_eq!(
            m("encoder_transformer.layers.5.self_attn.k_proj.weight"),
            (
                "encoder_transformer.transformer.layers.5.self_attn.in_proj_weight".into(),
                1
            )
        );
    }

    #[test]
    fn hf_mimi_mapping_is_a_bijection_on_the_schema() {
        let cfg = crate::checkpoint::MimiConfig::v0_1();
        let schema = crate::checkpoint::Schema::mimi(&cfg);
        let hf: Vec<(String, String, usize)> = schema
            .tensors
            .iter()
            .flat_map(|t| {
                to_hf_mimi(&t.name)
                    .unwrap_or_else(|| panic!("{}", t.name))
                    .into_iter()
                    .enumerate()
                    .map(move |(k, h)| (t.name.clone(), h, k))
            })
            .collect();
        let names: Vec<&str> = hf.iter().map(|x| x.1.as_str()).collect();
        let last = hf_last_decoder_conv(&names);
        assert_eq!(last, Some(14));
        for (want, h, k) in &hf {
            assert_eq!(
                canon(map_mimi(Layout::HfMimi, h, last)),
                (want.clone(), *k),
                "{h}"
            );
        }
    }

    #[test]
    fn rope_unpermute_inverts_hf() {
        // HF permutation: view [heads, hd/2, 2, d] -> transpose(1,2) -> reshape.
        let (heads, hd) = (3, 8);
        let rows = heads * hd;
        let mut hf_of_orig = vec![0; rows];
        for h in 0..heads {
            for s in 0..2 {
                for i in 0..hd / 2 {
                    // HF row (h, s, i) holds original row (h, i, s).
                    hf_of_orig[h * hd + 2 * i + s] = h * hd + s * hd / 2 + i;
                }
            }
        }
        assert_eq!(hf_rope_source_rows(rows, heads).unwrap(), hf_of_orig);
        assert!(hf_rope_source_rows(10, 4).is_none());
    }

    #[test]
    fn refusals() {
        let r = |names: &[&str]| err_variant(&refuse_tensors(names.iter().map(|n| (*n, false))));
        for (name, want) in [
            (
                "transformer.layers.0.gating.linear_in.lora_A.weight",
                "Lora",
            ),
            (
                "condition_provider.conditioners.x.embed.weight",
                "Conditioning",
            ),
            ("fuser.cfg", "Conditioning"),
            (
                "transformer.layers.0.cross_attention.in_proj_weight",
                "CrossAttention",
            ),
            (
                "transformer.layers.0.gating.linear_in.weight_scb",
                "BitsAndBytes",
            ),
            ("text_emb.out1.weight", "Demux"),
            ("extra_heads.0.weight", "ExtraHeads"),
            ("depformer_emb.0.low_rank.weight", "LowRankEmbeddings"),
        ] {
            assert_eq!(r(&[name]), want, "{name}");
        }
        assert!(matches!(
            refuse_tensors([("transformer.layers.0.gating.linear_in.weight", true)].into_iter()),
            Err(CheckpointError::BitsAndBytes { .. })
        ));
        assert_eq!(r(&["text_emb.weight", "emb.0.weight"]), "Ok");
    }
}
