//! `moshi-native synth`: write a bundle with random weights of realistic scale in a released layout
//! (exact names, shapes and quantization), streamed to disk. For benchmarks and tests: Moshi
//! (`--variant moshiko`) and the speech-to-text models (`--variant stt-1b|stt-2.6b`, or a `--config`
//! with `model_type` "stt").

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use bench::synth::{write_bundle, write_stt_bundle, SttSynth, SynthFormat};
use clap::Args;
use model::checkpoint::{BundleConfig, LmConfig, MimiConfig};
use model::stt::SttRelease;

/// Flags of `moshi-native synth`.
#[derive(Args, Debug, Clone)]
pub struct SynthArgs {
    /// Model size: `moshiko` (released 7B dimensions; moshika has the same architecture), or a
    /// speech-to-text release, `stt-1b` (`kyutai/stt-1b-en_fr`) or `stt-2.6b` (`kyutai/stt-2.6b-en`).
    #[arg(long, default_value = "moshiko")]
    pub variant: String,
    /// Layout: bf16 | candle-bf16 | q8-gguf | q4-gguf | mlx-q4 | mlx-q8, or a `--preset` name of the
    /// other commands (q8 = q8-gguf, q4 = mlx-q4, as the released bundles they name), or a weight
    /// format (q8_0 = q8-gguf, q4_0 = q4-gguf).
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
        "q8_0" => "q8-gguf",
        "q4_0" => "q4-gguf",
        "mlx-bf16" => bail!(
            "--format mlx-bf16: synth has no MLX bf16 layout\nhint: --format bf16 writes the PyTorch bf16 layout"
        ),
        other => other,
    })
}

/// What `synth` writes.
enum Model {
    /// A duplex Moshi bundle: its LM and Mimi.
    Moshi(LmConfig, MimiConfig),
    /// A speech-to-text bundle.
    Stt(SttSynth),
}

/// Runs `synth`.
pub fn run(args: &SynthArgs) -> Result<()> {
    let format = SynthFormat::parse(preset_layout(&args.format)?).with_context(|| {
        format!(
            "unknown --format `{}` (bf16, candle-bf16, q8-gguf, q4-gguf, mlx-q4, mlx-q8; the presets q8, q4, mlx-q8; q8_0, q4_0)",
            args.format
        )
    })?;
    let what = match &args.config {
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
            match cfg.stt {
                Some(stt) => Model::Stt(SttSynth {
                    lm: cfg.lm,
                    stt,
                    mimi,
                    tokenizer_name: cfg.tokenizer_name,
                }),
                None => Model::Moshi(cfg.lm, mimi),
            }
        }
        None => match args.variant.as_str() {
            "moshiko" | "moshika" => Model::Moshi(LmConfig::moshiko_v0_1(), MimiConfig::v0_1()),
            v => match SttRelease::parse(v) {
                Some(r) => Model::Stt(SttSynth::release(r)),
                None => bail!("unknown --variant `{v}` (moshiko, moshika, stt-1b, stt-2.6b)"),
            },
        },
    };
    let t0 = std::time::Instant::now();
    let rep = match &what {
        Model::Moshi(lm, mimi) => write_bundle(&args.out, format, lm, mimi, args.seed)?,
        Model::Stt(s) => write_stt_bundle(&args.out, format, s, args.seed)?,
    };
    let size = crate::models::human_bytes;
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
        // A speech-to-text config.json gives an STT bundle.
        let stt =
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/stt/1b/config.json");
        for format in ["q8_0", "q4_0", "bf16"] {
            let dir = out.join(format!("stt-{format}"));
            run(&SynthArgs {
                variant: "moshiko".into(),
                format: format.into(),
                config: Some(stt.clone()),
                out: dir.clone(),
                seed: 1,
            })
            .unwrap();
            let b = model::checkpoint::Bundle::open(&dir).unwrap();
            assert_eq!(b.config.model_type, "stt");
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
            variant: "stt-3b".into(),
            format: "bf16".into(),
            config: None,
            out: out.join("y"),
            seed: 1,
        })
        .is_err());
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
