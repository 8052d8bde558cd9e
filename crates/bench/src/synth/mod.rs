//! Synthetic bundles: random weights of realistic scale with the exact released names, shapes and
//! quantization layouts, streamed to disk tensor by tensor (never holding the model in memory).
//! Used by the benchmarks (full moshiko and STT dimensions) and by tests (tiny configs).
//!
//! By job: `tensors` draws and encodes the values of each file tensor, `files` lays the
//! files out as the released ones, [`stt`] writes speech-to-text bundles; this module holds the
//! layouts, the Moshi bundle and the JSON written beside the weights.

use std::path::{Path, PathBuf};

use model::checkpoint::CheckpointError;
use model::checkpoint::{LmConfig, MimiConfig, MIMI_NAME, TOKENIZER_NAME};

mod files;
pub mod stt;
mod tensors;

use files::{io_err, write_mimi_file, write_tensor_file};
pub use files::{lm_inventory, write_lm_header_only, write_mimi_header_only, Inventory};
pub use stt::{stt_config_json, write_stt_bundle, SttSynth};
use tensors::lm_outputs;

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
    let (mimi_path, mimi_size) = write_mimi_file(dir, mimi, seed ^ 0x5eed)?;
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
mod tests;
