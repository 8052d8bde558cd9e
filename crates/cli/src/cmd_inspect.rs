//! `moshi-native inspect <file-or-bundle-dir>`: detected format, layout/variant, per-storage counts,
//! total size, schema check; refusals print a clear message and exit non-zero.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::Args;
use embed::{guess_component, variant};
use model::checkpoint::Schema;
use model::checkpoint::{Bundle, CheckpointError, Component};
use model::checkpoint::{LmConfig, MimiConfig};
use model::checkpoint::{Quant, Weights};

/// Flags of `moshi-native inspect`.
#[derive(Args, Debug, Clone)]
pub struct InspectArgs {
    /// A weights file (safetensors / GGUF / MLX) or a bundle directory.
    #[arg(value_name = "FILE_OR_DIR")]
    pub path: PathBuf,
    /// Also list every canonical tensor with its shape and storage.
    #[arg(long)]
    pub tensors: bool,
}

/// Runs `inspect`.
pub fn run(args: &InspectArgs) -> Result<()> {
    let p = &args.path;
    if p.is_dir() {
        inspect_bundle(p, args.tensors)
    } else if p.is_file() {
        inspect_file(p, args.tensors)
    } else {
        bail!("{}: no such file or directory", p.display())
    }
}

fn human(bytes: usize) -> String {
    let b = bytes as f64;
    if b >= 1e9 {
        format!("{:.2} GB", b / 1e9)
    } else if b >= 1e6 {
        format!("{:.2} MB", b / 1e6)
    } else if b >= 1e3 {
        format!("{:.1} kB", b / 1e3)
    } else {
        format!("{bytes} B")
    }
}

fn print_weights(w: &Weights, list: bool) {
    println!(
        "  file:      {} ({})",
        w.path().display(),
        human(w.file_len())
    );
    println!("  format:    {}", w.format());
    println!("  layout:    {}", w.layout().name());
    println!("  variant:   {}", variant(w));
    let mut per: BTreeMap<String, (usize, usize, usize)> = BTreeMap::new();
    let mut total_values = 0usize;
    let mut total_bytes = 0usize;
    for n in w.names() {
        let info = w.info(n).expect("listed name");
        let values: usize = info.shape.iter().product();
        let e = per.entry(info.quant.name()).or_default();
        e.0 += 1;
        e.1 += values;
        e.2 += info.bytes;
        total_values += values;
        total_bytes += info.bytes;
    }
    println!(
        "  tensors:   {} canonical, {} values, {}",
        w.len(),
        total_values,
        human(total_bytes)
    );
    for (q, (c, v, b)) in &per {
        println!(
            "    {q:<14} {c:>5} tensors {v:>14} values {:>10}",
            human(*b)
        );
    }
    if list {
        for n in w.names() {
            let info = w.info(n).expect("listed name");
            let src = if info.sources.len() == 1 && info.sources[0] == n {
                String::new()
            } else {
                format!("  <- {}", info.sources.join(", "))
            };
            println!("    {n} {:?} {}{src}", info.shape, info.quant.name());
        }
    }
}

fn inspect_file(path: &Path, list: bool) -> Result<()> {
    let (w, comp) = guess_component(path).context("refused")?;
    println!("{}: {comp} weights", path.display());
    print_weights(&w, list);
    let (schema, what) = match comp {
        Component::Lm => (
            Schema::lm(&LmConfig::moshiko_v0_1()),
            "released moshiko/moshika v0.1 LM",
        ),
        Component::Mimi => (Schema::mimi(&MimiConfig::v0_1()), "released Mimi"),
    };
    match w.check(&schema) {
        Ok(()) => println!("  schema:    matches the {what}"),
        Err(e) => {
            println!("  schema:    differs from the {what}: {e}");
            println!("             (a bundle directory is checked against the dimensions of its config.json)");
        }
    }
    // Quantized storage summary per tensor kind.
    let quantized = w
        .names()
        .filter(|n| matches!(w.quant(n), Some(Quant::Mlx { .. })))
        .count();
    if quantized > 0 {
        println!("  mlx triplets: {quantized}");
    }
    Ok(())
}

fn inspect_bundle(dir: &Path, list: bool) -> Result<()> {
    let b = Bundle::open(dir).with_context(|| format!("refused: bundle {}", dir.display()))?;
    println!("{}: bundle", dir.display());
    match &b.files.config {
        Some(p) => println!("  config:    {}", p.display()),
        None => println!("  config:    none (released moshiko v0.1 configuration applies)"),
    }
    let c = &b.config.lm;
    println!(
        "  lm:        dim {} x {} layers ({} heads), ffn {}, depformer {} x {} ({} heads, ffn {}), n_q {}, dep_q {}, card {}, text_card {}, context {:?}",
        c.dim,
        c.num_layers,
        c.num_heads,
        c.ffn_hidden(),
        c.depformer_dim,
        c.depformer_num_layers,
        c.depformer_num_heads,
        c.depformer_ffn_hidden(),
        c.n_q,
        c.dep_q,
        c.card,
        c.text_card,
        c.context
    );
    let m = &b.mimi_config;
    println!(
        "  mimi:      dim {}, filters {}, transformer {} x {} ({} heads), codebooks {} x {} (dim {}){}",
        m.seanet.dimension,
        m.seanet.n_filters,
        m.transformer.d_model,
        m.transformer.num_layers,
        m.transformer.num_heads,
        m.quantizer.n_q,
        m.quantizer.bins,
        m.quantizer.dimension,
        match &b.files.mimi_config {
            Some(p) => format!(", config {}", p.display()),
            None => String::new(),
        }
    );
    println!(
        "  tokenizer: {} ({})",
        b.files.tokenizer.display(),
        human(
            std::fs::metadata(&b.files.tokenizer)
                .map(|m| m.len() as usize)
                .unwrap_or(0)
        )
    );
    print_bundle_weights("LM", &b.files.lm, b.lm_weights(), list)?;
    print_bundle_weights("Mimi", &b.files.mimi, b.mimi_weights(), list)
}

/// One weights file of a bundle under `title`: `opened` is what the bundle made of `file` (an
/// error when the file does not match the schema).
fn print_bundle_weights(
    title: &str,
    file: &Path,
    opened: Result<Weights, CheckpointError>,
    list: bool,
) -> Result<()> {
    println!("{title} weights:");
    let w = opened.with_context(|| format!("refused: {title} weights {}", file.display()))?;
    print_weights(&w, list);
    println!("  schema:    complete ({} tensors)", w.len());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixtures() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures")
    }

    fn inspect(p: PathBuf) -> Result<()> {
        run(&InspectArgs {
            path: p,
            tensors: true,
        })
    }

    #[test]
    fn inspects_bundles_and_files() {
        for d in ["lm", "lm_gguf_q8", "lm_mlx_q4", "lm_candle_bf16"] {
            inspect(fixtures().join(d)).unwrap();
        }
        inspect(fixtures().join("mimi/mimi_hf.safetensors")).unwrap();
        inspect(fixtures().join("lm_mlx_q8/model.q8.safetensors")).unwrap();
    }

    #[test]
    fn refusals_exit_with_errors() {
        let dir = testkit::ScratchDir::new("inspect");
        let lora = dir.join("lora.safetensors");
        let t = vec![
            ("text_emb.weight".to_string(), "F32", vec![1], vec![0u8; 4]),
            ("a.lora_B.weight".to_string(), "F32", vec![1], vec![0u8; 4]),
        ];
        std::fs::write(&lora, model::checkpoint::safetensors::to_bytes(&t)).unwrap();
        let e = inspect(lora).unwrap_err();
        assert!(format!("{e:#}").contains("LoRA"), "{e:#}");
        let trunc = dir.join("trunc.gguf");
        std::fs::write(&trunc, b"GGUF\x03\x00\x00\x00\x01").unwrap();
        let e = inspect(trunc).unwrap_err();
        assert!(format!("{e:#}").contains("truncated"), "{e:#}");
        assert!(inspect(dir.join("missing")).is_err());
        // A bundle whose config.json asks for an unsupported model type.
        std::fs::write(dir.join("config.json"), r#"{"model_type": "hibiki"}"#).unwrap();
        let e = inspect(dir.to_path_buf()).unwrap_err();
        assert!(format!("{e:#}").contains("hibiki"), "{e:#}");
    }
}
