//! `moshi-native synth`: write a bundle with random weights of realistic scale in a released layout
//! (exact names, shapes and quantization), streamed to disk. For benchmarks and tests.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use bench::synth::{write_bundle, SynthFormat};
use clap::Args;
use model::checkpoint::{BundleConfig, LmConfig, MimiConfig};

/// Flags of `moshi-native synth`.
#[derive(Args, Debug, Clone)]
pub struct SynthArgs {
    /// Model size: `moshiko` (released 7B dimensions; moshika has the same architecture).
    #[arg(long, default_value = "moshiko")]
    pub variant: String,
    /// Layout: bf16 | candle-bf16 | q8-gguf | q4-gguf | mlx-q4 | mlx-q8, or a `--preset` name of the
    /// other commands (q8 = q8-gguf, q4 = mlx-q4, as the released bundles they name).
    #[arg(long, default_value = "bf16")]
    pub format: String,
    /// Kyutai config.json to take the LM (and `mimi_config_name`) dimensions from instead of `--variant`.
    #[arg(long, value_name = "CONFIG_JSON")]
    pub config: Option<PathBuf>,
    /// Output bundle directory.
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,
    /// Random seed.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
}

/// The layout a `--preset` name stands for (the released bundle of that preset), or `name` itself.
fn preset_layout(name: &str) -> Result<&str> {
    Ok(match name {
        "q8" => "q8-gguf",
        "q4" => "mlx-q4",
        "mlx-bf16" => bail!(
            "--format mlx-bf16: synth has no MLX bf16 layout\nhint: --format bf16 writes the PyTorch bf16 layout"
        ),
        other => other,
    })
}

/// Runs `synth`.
pub fn run(args: &SynthArgs) -> Result<()> {
    let format = SynthFormat::parse(preset_layout(&args.format)?).with_context(|| {
        format!(
            "unknown --format `{}` (bf16, candle-bf16, q8-gguf, q4-gguf, mlx-q4, mlx-q8; or the presets q8, q4, mlx-q8)",
            args.format
        )
    })?;
    let (lm, mimi) = match &args.config {
        Some(p) => {
            let text = std::fs::read_to_string(p).with_context(|| p.display().to_string())?;
            let cfg = BundleConfig::from_json(&text)?;
            let mimi = match &cfg.mimi_config_name {
                None => MimiConfig::v0_1(),
                Some(name) => {
                    let mp = p
                        .parent()
                        .unwrap_or(std::path::Path::new("."))
                        .join(name.trim_start_matches("file://"));
                    MimiConfig::from_json(
                        &std::fs::read_to_string(&mp).with_context(|| mp.display().to_string())?,
                    )?
                }
            };
            (cfg.lm, mimi)
        }
        None => match args.variant.as_str() {
            "moshiko" | "moshika" => (LmConfig::moshiko_v0_1(), MimiConfig::v0_1()),
            v => bail!("unknown --variant `{v}` (moshiko, moshika)"),
        },
    };
    let t0 = std::time::Instant::now();
    let rep = write_bundle(&args.out, format, &lm, &mimi, args.seed)?;
    let size = |b: u64| {
        if b >= 1_000_000_000 {
            format!("{:.2} GB", b as f64 / 1e9)
        } else {
            format!("{:.1} MB", b as f64 / 1e6)
        }
    };
    println!(
        "wrote {} ({}) and {} ({}){} in {:.1} s",
        rep.lm.0.display(),
        size(rep.lm.1),
        rep.mimi.0.display(),
        size(rep.mimi.1),
        if rep.config { " + config.json" } else { "" },
        t0.elapsed().as_secs_f64()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiny_synth_bundle_inspects_clean() {
        let out = testkit::ScratchDir::new("cli-synth");
        let cfg = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/lm/config.json");
        // Layout names, and preset names as the other commands spell them.
        for format in ["bf16", "q8-gguf", "mlx-q4", "q8", "q4"] {
            let dir = out.join(format);
            run(&SynthArgs {
                variant: "moshiko".into(),
                format: format.into(),
                config: Some(cfg.clone()),
                out: dir.clone(),
                seed: 1,
            })
            .unwrap();
            crate::cmd_inspect::run(&crate::cmd_inspect::InspectArgs {
                path: dir,
                tensors: false,
            })
            .unwrap();
        }
        assert_eq!(preset_layout("q8").unwrap(), "q8-gguf");
        assert_eq!(preset_layout("q4").unwrap(), "mlx-q4");
        assert_eq!(preset_layout("mlx-q8").unwrap(), "mlx-q8");
        assert!(preset_layout("mlx-bf16").is_err());
        assert!(run(&SynthArgs {
            variant: "moshiko".into(),
            format: "q3".into(),
            config: None,
            out: out.join("x"),
            seed: 1,
        })
        .is_err());
    }
}
