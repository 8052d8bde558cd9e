//! `moshi-native inspect <file-or-bundle-dir>`: detected format, layout/variant, per-storage counts,
//! total size, schema check; refusals print a clear message and exit non-zero.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::Args;
use embed::{guess_component, variant};
use model::checkpoint::Schema;
use model::checkpoint::{Bundle, CheckpointError, Component};
use model::checkpoint::{LmConfig, MimiConfig};
use model::checkpoint::{OpenOptions, Quant, Weights};
use model::stt::{SttPlan, SttRelease};

/// `println!` that hands a failed write back (`?`) instead of panicking: `inspect … | head` closes the
/// pipe early, and `main` ends quietly on that error.
macro_rules! out {
    ($($arg:tt)*) => {
        writeln!(std::io::stdout().lock(), $($arg)*)?
    };
}

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
    crate::models::human_bytes(bytes as u64)
}

fn print_weights(w: &Weights, list: bool) -> Result<()> {
    out!(
        "  file:      {} ({})",
        w.path().display(),
        human(w.file_len())
    );
    out!("  format:    {}", w.format());
    out!("  layout:    {}", w.layout().name());
    out!("  variant:   {}", variant(w));
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
    out!(
        "  tensors:   {} canonical, {} values, {}",
        w.len(),
        total_values,
        human(total_bytes)
    );
    for (q, (c, v, b)) in &per {
        out!(
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
            out!("    {n} {:?} {}{src}", info.shape, info.quant.name());
        }
    }
    Ok(())
}

/// What a file is when it is not weights: Mimi codes written by `mimi encode` / `trace mimi`
/// (described, `Ok(true)`), a WAV (refused with a hint), or neither (`Ok(false)`).
fn inspect_other(path: &Path) -> Result<bool> {
    let mut head = [0u8; 4];
    {
        use std::io::Read;
        let mut f =
            std::fs::File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
        let n = f.read(&mut head)?;
        if n == 4 && (&head == b"RIFF" || &head == b"RIFX" || &head == b"RF64") {
            bail!(
                "{} is a WAV file, not weights\nhint: `mimi encode` turns audio into codes; inspect takes weights files and bundle directories",
                path.display()
            );
        }
    }
    // A .codes file is small safetensors: read it whole only when it names itself or looks like one.
    let is_codes_name = path.extension().is_some_and(|e| e == "codes");
    let len = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
    if !is_codes_name && len > (64 << 20) {
        return Ok(false);
    }
    let bytes = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    let Ok(hdr) = model::checkpoint::safetensors::parse(&bytes) else {
        return Ok(false);
    };
    let tagged = hdr
        .metadata
        .get("format")
        .is_some_and(|f| f == "moshi-native-mimi-codes");
    let codes = hdr.tensors.iter().find(|t| t.name == "codes");
    let only_codes = hdr
        .tensors
        .iter()
        .all(|t| matches!(t.name.as_str(), "codes" | "num_samples"));
    let Some(codes) = codes.filter(|_| tagged || only_codes) else {
        return Ok(false);
    };
    use crate::models::count;
    out!("{}: Mimi codes (from `mimi encode`)", path.display());
    if let [nq, t] = codes.shape[..] {
        out!(
            "  codes:     {} x {} ({:.2} s at 12.5 frames/s), {}",
            count(nq, "codebook"),
            count(t, "frame"),
            t as f64 * 0.08,
            codes.dtype.name()
        );
    } else {
        out!("  codes:     shape {:?}", codes.shape);
    }
    if let Some(n) = hdr.tensors.iter().find(|t| t.name == "num_samples") {
        if n.len == 8 {
            let v = i64::from_le_bytes(bytes[n.offset..n.offset + 8].try_into().expect("8 bytes"));
            out!("  samples:   {v} ({:.2} s at 24 kHz)", v as f64 / 24_000.0);
        }
    }
    out!(
        "  decode:    moshi-native mimi decode {} OUT.wav",
        path.display()
    );
    Ok(true)
}

/// A lone LM file: Moshi's, or a speech-to-text one (no Depformer tensor; the voice-activity heads
/// of stt-1b are accepted here, where a duplex bundle refuses them).
fn open_lone_file(path: &Path) -> Result<(Weights, Component)> {
    match guess_component(path) {
        Err(CheckpointError::ExtraHeads { .. }) => {
            let mut o = OpenOptions::new(Component::Lm);
            o.allow_extra_heads = true;
            Ok((
                Weights::open_with(path, &o).context("refused")?,
                Component::Lm,
            ))
        }
        r => r.context("refused"),
    }
}

/// The released configuration a lone LM file is checked against: a speech-to-text release when
/// the file has no Depformer (the one whose tensors it matches, else the one with as many extra
/// heads), else moshiko v0.1.
fn lone_lm_schema(w: &Weights) -> (Schema, String) {
    let has_depformer = w.names().any(|n| n.starts_with("depformer"));
    if has_depformer || w.is_empty() {
        return (
            Schema::lm(&LmConfig::moshiko_v0_1()),
            "released moshiko/moshika v0.1 LM".into(),
        );
    }
    let heads = w.names().filter(|n| n.starts_with("extra_heads.")).count();
    let release = SttRelease::ALL
        .into_iter()
        .find(|r| w.check(&Schema::lm(&r.lm_config())).is_ok())
        .or_else(|| {
            SttRelease::ALL
                .into_iter()
                .find(|r| r.lm_config().extra_heads_num_heads == heads)
        })
        .unwrap_or(SttRelease::Stt1b);
    (
        Schema::lm(&release.lm_config()),
        format!("released {release} speech-to-text LM ({})", release.repo()),
    )
}

fn inspect_file(path: &Path, list: bool) -> Result<()> {
    if inspect_other(path)? {
        return Ok(());
    }
    let (w, comp) = open_lone_file(path)?;
    let (schema, what) = match comp {
        Component::Lm => lone_lm_schema(&w),
        Component::Mimi => (Schema::mimi(&MimiConfig::v0_1()), "released Mimi".into()),
    };
    // Weights share their tensor names with the released files whatever their dimensions; a file
    // holding none of them is something else.
    if !w.is_empty() && !w.names().any(|n| schema.get(n).is_some()) {
        bail!(
            "refused: {} holds {} and none is a Moshi LM or Mimi weight\nhint: inspect takes Moshi / Mimi weights (safetensors, GGUF, MLX) and bundle directories",
            path.display(),
            crate::models::count(w.len(), "tensor")
        );
    }
    out!("{}: {comp} weights", path.display());
    print_weights(&w, list)?;
    match w.check(&schema) {
        Ok(()) => {
            out!("  schema:    matches the {what}");
        }
        Err(e) => {
            out!("  schema:    differs from the {what}: {e}");
            out!("             (a bundle directory is checked against the dimensions of its config.json)");
        }
    }
    // Quantized storage summary per tensor kind.
    let quantized = w
        .names()
        .filter(|n| matches!(w.quant(n), Some(Quant::Mlx { .. })))
        .count();
    if quantized > 0 {
        out!("  mlx triplets: {quantized}");
    }
    Ok(())
}

fn inspect_bundle(dir: &Path, list: bool) -> Result<()> {
    // The bundle's errors name the directory already.
    let b = Bundle::open(dir).context("refused")?;
    out!("{}: bundle", dir.display());
    match &b.files.config {
        Some(p) => {
            out!("  config:    {}", p.display());
        }
        None => {
            out!("  config:    none (released moshiko v0.1 configuration applies)");
        }
    }
    let c = &b.config.lm;
    if let Some(stt) = &b.config.stt {
        print_stt_facts(c, stt)?;
        return inspect_bundle_weights(&b, list);
    }
    out!(
        "  lm:        dim {} x {} layers ({} heads), ffn {}, depformer {} x {} ({} heads, ffn {}), n_q {}, dep_q {}, card {}, text_card {}, context {}",
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
        context_words(c)
    );
    inspect_bundle_weights(&b, list)
}

/// The temporal context of `c` in frames, or "unbounded".
fn context_words(c: &LmConfig) -> String {
    c.context
        .map_or_else(|| "unbounded".into(), |n| n.to_string())
}

/// What a speech-to-text bundle is (`model_type` "stt"): the temporal transformer, the stream plan
/// its `stt_config` gives, the extra heads, and the release it has the dimensions of.
fn print_stt_facts(c: &LmConfig, stt: &model::checkpoint::SttConfig) -> Result<()> {
    let plan = SttPlan::from_config(stt);
    let release = match SttRelease::matching(c) {
        Some(r) => format!("the dimensions of {r} ({})", r.repo()),
        None => "not the dimensions of a released model (stt-1b, stt-2.6b)".into(),
    };
    out!("  model:     speech-to-text (model_type stt), {release}");
    out!(
        "  lm:        dim {} x {} layers ({} heads), ffn {}, n_q {} audio codebooks in, dep_q {} (no Depformer), card {}, text_card {}, context {}",
        c.dim,
        c.num_layers,
        c.num_heads,
        c.ffn_hidden(),
        c.n_q,
        c.dep_q,
        c.card,
        c.text_card,
        context_words(c)
    );
    if c.extra_heads_num_heads > 0 {
        out!(
            "  heads:     {} extra heads x {} outputs (voice activity: Step.prs; --vad reads head 2)",
            c.extra_heads_num_heads, c.extra_heads_dim
        );
    } else {
        out!("  heads:     no extra heads (no voice-activity probabilities)");
    }
    out!(
        "  stream:    audio delay {} s = {} steps, silence prefix {} s = {} frames, flush {} frames; words start at (step - {}) / 12.5 s",
        stt.audio_delay_seconds,
        plan.delay_tokens,
        stt.audio_silence_prefix_seconds,
        plan.prefix_frames,
        plan.flush_frames,
        plan.skip()
    );
    Ok(())
}

/// The Mimi line, the tokenizer and both weight files of an opened bundle.
fn inspect_bundle_weights(b: &Bundle, list: bool) -> Result<()> {
    let m = &b.mimi_config;
    out!(
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
    out!(
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
    out!("{title} weights:");
    let w = opened.with_context(|| format!("refused: {title} weights {}", file.display()))?;
    print_weights(&w, list)?;
    out!("  schema:    complete ({} tensors)", w.len());
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
