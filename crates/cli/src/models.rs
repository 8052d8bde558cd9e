//! Model selection: variants, presets, Hugging Face repositories and the local hub cache.
//!
//! Every command that needs weights resolves them the same way, in this order:
//! `--model demo` (the tiny random-weight bundle shipped inside the binary), `--model-dir DIR`,
//! the `MOSHI_MODEL_DIR` environment variable, and finally the Hugging Face hub cache for
//! `--variant`/`--preset` (default: moshiko, q8).

use std::fmt;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};

// The Mimi codec file and the SentencePiece tokenizer shared by every released bundle are the names a
// bundle's `config.json` defaults to (`model::checkpoint`), written once there.
use model::checkpoint::{MIMI_NAME, TOKENIZER_NAME};

/// Which released voice to use.
#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
pub enum Variant {
    /// Moshi with the male voice.
    Moshiko,
    /// Moshi with the female voice.
    Moshika,
}

impl fmt::Display for Variant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Variant::Moshiko => "moshiko",
            Variant::Moshika => "moshika",
        })
    }
}

/// Which released weight format to use.
#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
pub enum Preset {
    /// PyTorch bf16 safetensors (`kyutai/<variant>-pytorch-bf16`, ~15 GB).
    Bf16,
    /// candle GGUF Q8_0 (`kyutai/<variant>-candle-q8`, ~8 GB). The default.
    Q8,
    /// MLX affine 4-bit (`kyutai/<variant>-mlx-q4`, ~4 GB).
    Q4,
    /// MLX bf16 safetensors (`kyutai/<variant>-mlx-bf16`).
    #[value(name = "mlx-bf16")]
    MlxBf16,
    /// MLX affine 8-bit (`kyutai/<variant>-mlx-q8`).
    #[value(name = "mlx-q8")]
    MlxQ8,
    /// candle bf16 safetensors (`kyutai/<variant>-candle-bf16`; speech-to-text: `kyutai/<stt>-candle`,
    /// the files Kyutai's Rust server reads).
    #[value(name = "candle-bf16")]
    CandleBf16,
}

impl fmt::Display for Preset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Preset::Bf16 => "bf16",
            Preset::Q8 => "q8",
            Preset::Q4 => "q4",
            Preset::MlxBf16 => "mlx-bf16",
            Preset::MlxQ8 => "mlx-q8",
            Preset::CandleBf16 => "candle-bf16",
        })
    }
}

/// The Hugging Face repository and files of one variant × preset.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RepoSpec {
    /// Repository id, e.g. `kyutai/moshiko-candle-q8`.
    pub repo: String,
    /// The LM weight file inside the repository.
    pub lm_file: &'static str,
    /// Every file to download (LM weights, Mimi, tokenizer).
    pub files: Vec<&'static str>,
}

/// Maps a variant and preset to its repository and file names.
pub fn repo_spec(variant: Variant, preset: Preset) -> RepoSpec {
    let (suffix, lm_file) = match preset {
        Preset::Bf16 => ("pytorch-bf16", "model.safetensors"),
        Preset::Q8 => ("candle-q8", "model.q8.gguf"),
        Preset::Q4 => ("mlx-q4", "model.q4.safetensors"),
        Preset::MlxBf16 => ("mlx-bf16", "model.safetensors"),
        Preset::MlxQ8 => ("mlx-q8", "model.q8.safetensors"),
        Preset::CandleBf16 => ("candle-bf16", "model.safetensors"),
    };
    RepoSpec {
        repo: format!("kyutai/{variant}-{suffix}"),
        lm_file,
        files: vec![lm_file, MIMI_NAME, TOKENIZER_NAME],
    }
}

pub use model::stt::SttRelease;

/// The presets Kyutai released its speech-to-text models in (no quantized files: `synth` writes
/// q8_0 / q4_0 layouts).
pub const STT_PRESETS: [Preset; 3] = [Preset::Bf16, Preset::CandleBf16, Preset::MlxBf16];

/// The Mimi file of the speech-to-text repositories (the same weights as Moshi's, another name).
pub const STT_MIMI_FILE: &str = "mimi-pytorch-e351c8d8@125.safetensors";

/// The repository and files of a speech-to-text model in `preset`: PyTorch `kyutai/stt-…`
/// (`bf16`), candle `…-candle` (`candle-bf16`) or MLX `…-mlx` (`mlx-bf16`), each with
/// `config.json` (it carries `stt_config`), `model.safetensors`, Mimi and the tokenizer. Kyutai
/// released no quantized speech-to-text files: other presets are an error naming the three.
pub fn stt_repo_spec(variant: SttRelease, preset: Preset) -> Result<RepoSpec> {
    let suffix = match preset {
        Preset::Bf16 => "",
        Preset::CandleBf16 => "-candle",
        Preset::MlxBf16 => "-mlx",
        other => bail!(
            "{variant} has no `{other}` release\nhint: Kyutai released {variant} as --preset bf16 (PyTorch), candle-bf16 or mlx-bf16; `moshi-native synth` writes q8_0 / q4_0 layouts"
        ),
    };
    Ok(RepoSpec {
        repo: format!("{}{suffix}", variant.repo()),
        lm_file: "model.safetensors",
        files: vec![
            "config.json",
            "model.safetensors",
            STT_MIMI_FILE,
            variant.tokenizer(),
        ],
    })
}

/// Whether `--model NAME` names a speech-to-text model (`demo-stt`, `stt-1b`, `stt-2.6b`).
pub fn is_stt_name(name: &str) -> bool {
    name == "demo-stt" || SttRelease::parse(name).is_some()
}

/// The default preset of the speech-to-text models: the PyTorch release (the parity reference).
pub const STT_DEFAULT_PRESET: Preset = Preset::Bf16;

/// Resolves the flags of a speech-to-text command to a bundle directory and whether it is the
/// bundled demo: `--model demo-stt`, `--model stt-1b|stt-2.6b` (found in the hub cache at `cache`
/// in `--preset`, default bf16), or `--model-dir DIR`.
pub fn resolve_stt(
    model: Option<&str>,
    model_dir: Option<&Path>,
    preset: Option<Preset>,
    cache: &Path,
) -> Result<(PathBuf, bool)> {
    if let (Some(m), Some(_)) = (model, model_dir) {
        bail!("--model {m} and --model-dir are exclusive");
    }
    if let Some(dir) = model_dir {
        if preset.is_some() {
            eprintln!(
                "moshi-native: warning: --preset ignored: the bundle directory {} decides the weights",
                dir.display()
            );
        }
        if !dir.is_dir() {
            bail!(
                "model directory {} does not exist\nhint: pass a speech-to-text bundle directory (config.json with stt_config, weights, Mimi, tokenizer)",
                dir.display()
            );
        }
        return Ok((dir.to_path_buf(), false));
    }
    let name = model
        .context("no model\nhint: pass --model demo-stt|stt-1b|stt-2.6b or --model-dir DIR")?;
    if name == "demo-stt" {
        if let Some(p) = preset {
            eprintln!(
                "moshi-native: warning: --preset {p} ignored: --model demo-stt decides the weights"
            );
        }
        return Ok((embed::demo_stt::materialize()?, true));
    }
    let Some(variant) = SttRelease::parse(name) else {
        bail!("unknown --model `{name}`\nhint: the speech-to-text models are demo-stt (built in), stt-1b and stt-2.6b; use --model-dir for a bundle directory");
    };
    let preset = preset.unwrap_or(STT_DEFAULT_PRESET);
    let spec = stt_repo_spec(variant, preset)?;
    let dir = find_in_cache(cache, &spec).with_context(|| {
        format!(
            "{variant} {preset} ({}) is not in the Hugging Face cache ({})\nhint: run `moshi-native fetch --model {variant} --preset {preset}`, or try `--model demo-stt`",
            spec.repo,
            cache.display()
        )
    })?;
    Ok((dir, false))
}

/// The root of the Hugging Face hub cache: `HF_HUB_CACHE`, else `HF_HOME/hub`, else
/// `~/.cache/huggingface/hub` (the same rules as the official hub client).
pub fn hub_cache_dir() -> PathBuf {
    hub_cache_dir_from(|k| std::env::var_os(k))
}

/// [`hub_cache_dir`] with an injectable environment, for tests.
pub fn hub_cache_dir_from(env: impl Fn(&str) -> Option<std::ffi::OsString>) -> PathBuf {
    if let Some(p) = env("HF_HUB_CACHE") {
        return PathBuf::from(p);
    }
    if let Some(p) = env("HF_HOME") {
        return PathBuf::from(p).join("hub");
    }
    let home = env("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("."));
    home.join(".cache").join("huggingface").join("hub")
}

/// The cache folder of one repository: `models--org--name`.
pub fn repo_cache_dir(cache: &Path, repo: &str) -> PathBuf {
    cache.join(format!("models--{}", repo.replace('/', "--")))
}

/// Looks a complete bundle up in the hub cache; returns the snapshot directory holding every file.
pub fn find_in_cache(cache: &Path, spec: &RepoSpec) -> Option<PathBuf> {
    let dir = repo_cache_dir(cache, &spec.repo);
    let rev = std::fs::read_to_string(dir.join("refs").join("main")).ok()?;
    let snap = dir.join("snapshots").join(rev.trim());
    spec.files
        .iter()
        .all(|f| snap.join(f).is_file())
        .then_some(snap)
}

/// `n` and `what`, with an `s` unless `n` is 1 ("1 frame", "2 frames").
pub fn count(n: usize, what: &str) -> String {
    if n == 1 {
        format!("1 {what}")
    } else {
        format!("{n} {what}s")
    }
}

/// A size in bytes for a person: GB with two decimals, MB and kB with one, bytes below 1 kB (what
/// `list`, `inspect` and `synth` print).
pub fn human_bytes(bytes: u64) -> String {
    let b = bytes as f64;
    if b >= 1e9 {
        format!("{:.2} GB", b / 1e9)
    } else if b >= 1e6 {
        format!("{:.1} MB", b / 1e6)
    } else if b >= 1e3 {
        format!("{:.1} kB", b / 1e3)
    } else {
        format!("{bytes} B")
    }
}

/// A short name for a bundle directory: `demo`, the repository of a Hugging Face cache snapshot
/// (`kyutai/moshiko-candle-q8`), else the folder's name.
pub fn bundle_name(dir: &Path, demo: bool) -> String {
    if demo {
        return "demo".into();
    }
    // <cache>/models--org--name/snapshots/<revision>
    let repo = dir
        .parent()
        .filter(|p| p.file_name().is_some_and(|n| n == "snapshots"))
        .and_then(Path::parent)
        .and_then(Path::file_name)
        .and_then(|n| n.to_str())
        .and_then(|n| n.strip_prefix("models--"));
    match repo {
        Some(r) => r.replacen("--", "/", 1),
        None => dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| dir.display().to_string()),
    }
}

/// Model-selection flags shared by every command that loads weights.
#[derive(Args, Clone, Debug, Default)]
pub struct ModelArgs {
    /// `demo` selects the tiny random-weight model bundled with the binary (no download needed).
    #[arg(long, value_name = "NAME")]
    pub model: Option<String>,
    /// An explicit bundle directory (config.json + weights + Mimi + tokenizer).
    #[arg(long, value_name = "DIR", env = "MOSHI_MODEL_DIR")]
    pub model_dir: Option<PathBuf>,
    /// Released voice, looked up in the Hugging Face cache.
    #[arg(long, value_enum)]
    pub variant: Option<Variant>,
    /// Released weight format, looked up in the Hugging Face cache.
    #[arg(long, value_enum)]
    pub preset: Option<Preset>,
}

/// Where the weights of a command come from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ModelSource {
    /// The bundled tiny random-weight demo model.
    Demo,
    /// A bundle directory on disk.
    Dir(PathBuf),
}

impl ModelArgs {
    /// Resolves the flags to a model source (see the module docs for the order).
    pub fn resolve(&self) -> Result<ModelSource> {
        self.resolve_with_cache(&hub_cache_dir())
    }

    /// [`ModelArgs::resolve`] against an explicit hub cache root.
    pub fn resolve_with_cache(&self, cache: &Path) -> Result<ModelSource> {
        if let Some(w) = self.ignored_flags() {
            eprintln!("moshi-native: warning: {w}");
        }
        match self.model.as_deref() {
            Some("demo") => return Ok(ModelSource::Demo),
            Some(other) => bail!(
                "unknown --model `{other}`\nhint: the only built-in model is `demo`; use --model-dir for a bundle directory"
            ),
            None => {}
        }
        if let Some(dir) = &self.model_dir {
            if !dir.is_dir() {
                bail!(
                    "model directory {} does not exist\nhint: pass a bundle directory (config.json, weights, Mimi, tokenizer) or --model demo",
                    dir.display()
                );
            }
            return Ok(ModelSource::Dir(dir.clone()));
        }
        let variant = self.variant.unwrap_or(Variant::Moshiko);
        let preset = self.preset.unwrap_or(Preset::Q8);
        let spec = repo_spec(variant, preset);
        find_in_cache(cache, &spec)
            .map(ModelSource::Dir)
            .with_context(|| {
                format!(
                    "{variant} {preset} is not in the Hugging Face cache ({})\nhint: run `moshi-native fetch --variant {variant} --preset {preset}`, or try `--model demo`",
                    cache.display()
                )
            })
    }
}

impl ModelArgs {
    /// The flags given that the chosen source ignores (`--model demo --variant moshika`), said in
    /// one line; `None` when every flag given is used.
    pub fn ignored_flags(&self) -> Option<String> {
        let chosen = match (&self.model, &self.model_dir) {
            (Some(m), _) => format!("--model {m}"),
            (None, Some(d)) => format!("the bundle directory {}", d.display()),
            (None, None) => return None,
        };
        let mut ignored = Vec::new();
        if let Some(v) = self.variant {
            ignored.push(format!("--variant {v}"));
        }
        if let Some(p) = self.preset {
            ignored.push(format!("--preset {p}"));
        }
        if self.model.is_some() && self.model_dir.is_some() {
            ignored.push("--model-dir (or MOSHI_MODEL_DIR)".into());
        }
        (!ignored.is_empty()).then(|| {
            format!(
                "{} ignored: {chosen} decides the weights",
                ignored.join(" and ")
            )
        })
    }
}

/// Lays out the Hugging Face cache's snapshot `rev` of `repo` by hand (`refs/main` naming it), as a
/// user following the offline hint would: each of `files` holding `bytes`. Returns the snapshot.
#[cfg(test)]
pub(crate) fn cached_snapshot(
    cache: &Path,
    repo: &str,
    rev: &str,
    files: &[&str],
    bytes: &[u8],
) -> PathBuf {
    let repo = repo_cache_dir(cache, repo);
    std::fs::create_dir_all(repo.join("refs")).unwrap();
    std::fs::write(repo.join("refs/main"), format!("{rev}\n")).unwrap();
    let snap = repo.join("snapshots").join(rev);
    std::fs::create_dir_all(&snap).unwrap();
    for f in files {
        std::fs::write(snap.join(f), bytes).unwrap();
    }
    snap
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::OsString;

    #[test]
    fn flags_the_chosen_model_ignores_are_named() {
        let demo = ModelArgs {
            model: Some("demo".into()),
            variant: Some(Variant::Moshika),
            ..Default::default()
        };
        assert_eq!(
            demo.ignored_flags().as_deref(),
            Some("--variant moshika ignored: --model demo decides the weights")
        );
        let dir = ModelArgs {
            model_dir: Some("/b".into()),
            preset: Some(Preset::Q4),
            ..Default::default()
        };
        assert!(dir
            .ignored_flags()
            .unwrap()
            .starts_with("--preset q4 ignored"));
        let cache = ModelArgs {
            variant: Some(Variant::Moshika),
            preset: Some(Preset::Q4),
            ..Default::default()
        };
        assert_eq!(cache.ignored_flags(), None);
        assert_eq!(count(1, "frame"), "1 frame");
        assert_eq!(count(0, "frame"), "0 frames");
        assert_eq!(count(2, "frame"), "2 frames");
    }

    #[test]
    fn bundle_names_read_like_their_source() {
        let snap = Path::new("/c/models--kyutai--moshiko-candle-q8/snapshots/abc");
        assert_eq!(bundle_name(snap, false), "kyutai/moshiko-candle-q8");
        assert_eq!(bundle_name(Path::new("/x/my-bundle"), false), "my-bundle");
        assert_eq!(bundle_name(snap, true), "demo");
    }

    #[test]
    fn every_preset_routes_to_its_repo_and_files() {
        let cases = [
            (
                Variant::Moshiko,
                Preset::Bf16,
                "kyutai/moshiko-pytorch-bf16",
                "model.safetensors",
            ),
            (
                Variant::Moshiko,
                Preset::Q8,
                "kyutai/moshiko-candle-q8",
                "model.q8.gguf",
            ),
            (
                Variant::Moshika,
                Preset::Q4,
                "kyutai/moshika-mlx-q4",
                "model.q4.safetensors",
            ),
            (
                Variant::Moshika,
                Preset::MlxBf16,
                "kyutai/moshika-mlx-bf16",
                "model.safetensors",
            ),
            (
                Variant::Moshiko,
                Preset::MlxQ8,
                "kyutai/moshiko-mlx-q8",
                "model.q8.safetensors",
            ),
            (
                Variant::Moshika,
                Preset::CandleBf16,
                "kyutai/moshika-candle-bf16",
                "model.safetensors",
            ),
        ];
        for (v, p, repo, lm) in cases {
            let s = repo_spec(v, p);
            assert_eq!(s.repo, repo);
            assert_eq!(s.lm_file, lm);
            assert_eq!(s.files, vec![lm, MIMI_NAME, TOKENIZER_NAME]);
        }
    }

    #[test]
    fn cache_dir_follows_hub_env_rules() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| OsString::from(v))
            }
        };
        assert_eq!(
            hub_cache_dir_from(env(&[("HF_HUB_CACHE", "/a"), ("HF_HOME", "/b")])),
            PathBuf::from("/a")
        );
        assert_eq!(
            hub_cache_dir_from(env(&[("HF_HOME", "/b")])),
            PathBuf::from("/b/hub")
        );
        assert_eq!(
            hub_cache_dir_from(env(&[("HOME", "/h")])),
            PathBuf::from("/h/.cache/huggingface/hub")
        );
        assert_eq!(
            repo_cache_dir(Path::new("/c"), "kyutai/moshiko-candle-q8"),
            PathBuf::from("/c/models--kyutai--moshiko-candle-q8")
        );
    }

    #[test]
    fn resolution_order_and_cache_lookup() {
        // The cache root exists but is empty, and is removed when the test ends.
        let scratch = testkit::ScratchDir::new("models");
        let tmp = scratch.to_path_buf();
        let args = ModelArgs::default();
        let err = args.resolve_with_cache(&tmp).unwrap_err().to_string();
        assert!(
            err.contains("moshiko q8 is not in the Hugging Face cache"),
            "{err}"
        );
        assert!(
            err.contains("moshi-native fetch --variant moshiko --preset q8"),
            "{err}"
        );

        // Lay out a complete snapshot by hand, as a user following the offline hint would.
        let spec = repo_spec(Variant::Moshiko, Preset::Q8);
        let snap = cached_snapshot(&tmp, &spec.repo, "abc123", &spec.files[..2], b"x");
        assert!(
            args.resolve_with_cache(&tmp).is_err(),
            "incomplete snapshot must not resolve"
        );
        std::fs::write(snap.join(TOKENIZER_NAME), b"x").unwrap();
        assert_eq!(
            args.resolve_with_cache(&tmp).unwrap(),
            ModelSource::Dir(snap.clone())
        );

        let demo = ModelArgs {
            model: Some("demo".into()),
            ..Default::default()
        };
        assert_eq!(demo.resolve_with_cache(&tmp).unwrap(), ModelSource::Demo);
        let bad = ModelArgs {
            model: Some("huge".into()),
            ..Default::default()
        };
        assert!(bad.resolve_with_cache(&tmp).is_err());
        let dir = ModelArgs {
            model_dir: Some(tmp.clone()),
            ..Default::default()
        };
        assert_eq!(
            dir.resolve_with_cache(&tmp).unwrap(),
            ModelSource::Dir(tmp.clone())
        );
        let missing = ModelArgs {
            model_dir: Some(tmp.join("nope")),
            ..Default::default()
        };
        assert!(missing.resolve_with_cache(&tmp).is_err());
    }

    #[test]
    fn stt_models_route_to_kyutais_repositories() {
        let cases = [
            (SttRelease::Stt1b, Preset::Bf16, "kyutai/stt-1b-en_fr"),
            (
                SttRelease::Stt1b,
                Preset::CandleBf16,
                "kyutai/stt-1b-en_fr-candle",
            ),
            (
                SttRelease::Stt1b,
                Preset::MlxBf16,
                "kyutai/stt-1b-en_fr-mlx",
            ),
            (SttRelease::Stt2b6, Preset::Bf16, "kyutai/stt-2.6b-en"),
            (
                SttRelease::Stt2b6,
                Preset::CandleBf16,
                "kyutai/stt-2.6b-en-candle",
            ),
            (
                SttRelease::Stt2b6,
                Preset::MlxBf16,
                "kyutai/stt-2.6b-en-mlx",
            ),
        ];
        for (v, p, repo) in cases {
            let s = stt_repo_spec(v, p).unwrap();
            assert_eq!(s.repo, repo);
            assert_eq!(s.lm_file, "model.safetensors");
            assert_eq!(
                s.files,
                vec![
                    "config.json",
                    "model.safetensors",
                    STT_MIMI_FILE,
                    v.tokenizer()
                ]
            );
            assert_eq!(SttRelease::parse(v.name()), Some(v));
        }
        assert_eq!(
            SttRelease::Stt1b.tokenizer(),
            "tokenizer_en_fr_audio_8000.model"
        );
        assert_eq!(
            SttRelease::Stt2b6.tokenizer(),
            "tokenizer_en_audio_4000.model"
        );
        for p in [Preset::Q8, Preset::Q4, Preset::MlxQ8] {
            let e = stt_repo_spec(SttRelease::Stt1b, p).unwrap_err().to_string();
            assert!(e.contains("no `") && e.contains("candle-bf16"), "{e}");
        }
        assert_eq!(SttRelease::parse("stt-7b"), None);
    }

    #[test]
    fn stt_resolution_demo_dir_and_cache() {
        let scratch = testkit::ScratchDir::new("models-stt");
        let cache = scratch.to_path_buf();
        // Not in the cache: the hint names the fetch command of that model and preset.
        let e = resolve_stt(Some("stt-2.6b"), None, Some(Preset::MlxBf16), &cache)
            .unwrap_err()
            .to_string();
        assert!(e.contains("kyutai/stt-2.6b-en-mlx"), "{e}");
        assert!(
            e.contains("moshi-native fetch --model stt-2.6b --preset mlx-bf16"),
            "{e}"
        );
        // A complete snapshot of the default preset (PyTorch) resolves to its folder.
        let spec = stt_repo_spec(SttRelease::Stt1b, STT_DEFAULT_PRESET).unwrap();
        let repo = repo_cache_dir(&cache, &spec.repo);
        std::fs::create_dir_all(repo.join("refs")).unwrap();
        std::fs::write(repo.join("refs/main"), "r9").unwrap();
        let snap = repo.join("snapshots/r9");
        std::fs::create_dir_all(&snap).unwrap();
        for f in &spec.files[1..] {
            std::fs::write(snap.join(f), b"x").unwrap();
        }
        assert!(
            resolve_stt(Some("stt-1b"), None, None, &cache).is_err(),
            "config.json missing: incomplete"
        );
        std::fs::write(snap.join("config.json"), b"{}").unwrap();
        assert_eq!(
            resolve_stt(Some("stt-1b"), None, None, &cache).unwrap(),
            (snap.clone(), false)
        );
        // The other presets of the same model are other repositories.
        assert!(resolve_stt(Some("stt-1b"), None, Some(Preset::CandleBf16), &cache).is_err());
        let (demo, is_demo) = resolve_stt(Some("demo-stt"), None, None, &cache).unwrap();
        assert!(is_demo && demo.join("config.json").is_file());
        assert_eq!(
            resolve_stt(None, Some(&snap), None, &cache).unwrap(),
            (snap.clone(), false)
        );
        for bad in [
            resolve_stt(Some("demo"), None, None, &cache),
            resolve_stt(None, None, None, &cache),
            resolve_stt(Some("stt-1b"), Some(&snap), None, &cache),
            resolve_stt(None, Some(&snap.join("nope")), None, &cache),
            resolve_stt(Some("stt-1b"), None, Some(Preset::Q8), &cache),
        ] {
            assert!(bad.is_err());
        }
    }
}
