//! `moshi-native list`: the released bundles already in the Hugging Face cache (Moshi's voices and
//! Kyutai's speech-to-text models), each with its model, preset, size on disk and whether it is complete (every file of the bundle present in
//! the snapshot `refs/main` names) or partial (what is missing, and any download left unfinished).

use std::path::Path;

use anyhow::Result;
use clap::{Args, ValueEnum};

use crate::models::{hub_cache_dir, repo_cache_dir, repo_spec, Preset, RepoSpec, Variant};
use crate::models::{stt_repo_spec, SttRelease, STT_PRESETS};

/// Flags of `list` (none: the cache is found as every command finds it, `HF_HUB_CACHE`,
/// `HF_HOME/hub`, `~/.cache/huggingface/hub`).
#[derive(Args, Debug)]
pub struct ListArgs {}

/// One bundle found in the cache.
#[derive(Debug, Clone, PartialEq)]
pub struct Found {
    /// The model: a Moshi voice (`moshiko`) or a speech-to-text model (`stt-1b`).
    pub model: String,
    /// The `fetch` flags that download (or resume) it: `--variant moshiko` or `--model stt-1b`.
    pub fetch_flag: String,
    /// The weight format.
    pub preset: Preset,
    /// Bytes of the bundle's files present (complete files and unfinished downloads).
    pub bytes: u64,
    /// The bundle's files not in the snapshot.
    pub missing: Vec<&'static str>,
    /// Downloads left unfinished (`blobs/*.incomplete`).
    pub unfinished: usize,
}

impl Found {
    /// Every file is in the snapshot.
    pub fn complete(&self) -> bool {
        self.missing.is_empty()
    }
}

fn file_len(p: &Path) -> u64 {
    std::fs::metadata(p).map(|m| m.len()).unwrap_or(0)
}

/// What the cache at `cache` holds of one bundle, `None` when nothing of it is there.
fn look(
    cache: &Path,
    (model, fetch_flag): (String, String),
    preset: Preset,
    spec: &RepoSpec,
) -> Option<Found> {
    let repo = repo_cache_dir(cache, &spec.repo);
    if !repo.is_dir() {
        return None;
    }
    let snap = std::fs::read_to_string(repo.join("refs").join("main"))
        .ok()
        .map(|rev| repo.join("snapshots").join(rev.trim()));
    let mut bytes = 0;
    let mut missing = Vec::new();
    for f in &spec.files {
        match snap.as_ref().map(|s| s.join(f)).filter(|p| p.is_file()) {
            Some(p) => bytes += file_len(&p),
            None => missing.push(*f),
        }
    }
    let mut unfinished = 0;
    if let Ok(rd) = std::fs::read_dir(repo.join("blobs")) {
        for e in rd.flatten() {
            if e.file_name().to_string_lossy().ends_with(".incomplete") {
                unfinished += 1;
                bytes += file_len(&e.path());
            }
        }
    }
    Some(Found {
        model,
        fetch_flag,
        preset,
        bytes,
        missing,
        unfinished,
    })
}

/// Every released bundle the cache at `cache` holds anything of: Moshi in variant × preset order,
/// then the speech-to-text models in model × preset order.
pub fn scan(cache: &Path) -> Vec<Found> {
    let mut out = Vec::new();
    for variant in Variant::value_variants() {
        for preset in Preset::value_variants() {
            let id = (variant.to_string(), format!("--variant {variant}"));
            if let Some(f) = look(cache, id, *preset, &repo_spec(*variant, *preset)) {
                out.push(f);
            }
        }
    }
    for v in SttRelease::ALL {
        for preset in STT_PRESETS {
            let spec = stt_repo_spec(v, preset).expect("a released preset");
            let id = (v.to_string(), format!("--model {v}"));
            if let Some(f) = look(cache, id, preset, &spec) {
                out.push(f);
            }
        }
    }
    out
}

/// Runs `list`.
pub fn run(_a: &ListArgs) -> Result<()> {
    let cache = hub_cache_dir();
    let found = scan(&cache);
    if found.is_empty() {
        println!(
            "no released bundle in the Hugging Face cache ({})",
            cache.display()
        );
        println!("fetch one with `moshi-native fetch --variant moshiko --preset q8` (speech-to-text: `fetch --model stt-1b`), or try `--model demo`");
        return Ok(());
    }
    println!("bundles in {}:", cache.display());
    println!("  {:<8} {:<11} {:>9}  state", "model", "preset", "size");
    for f in &found {
        let state = if f.complete() {
            "complete".to_string()
        } else {
            let mut s = format!("partial: missing {}", f.missing.join(", "));
            if f.unfinished > 0 {
                s.push_str(&format!(
                    " ({} unfinished; `moshi-native fetch {} --preset {}` resumes)",
                    crate::models::count(f.unfinished, "download"),
                    f.fetch_flag,
                    f.preset
                ));
            }
            s
        };
        println!(
            "  {:<8} {:<11} {:>9}  {state}",
            f.model,
            f.preset.to_string(),
            crate::models::human_bytes(f.bytes)
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scan_tells_complete_from_partial() {
        let cache = testkit::ScratchDir::new("list");
        assert!(scan(&cache).is_empty());
        // A complete q8 moshiko, and a moshika q4 whose LM download stopped halfway.
        let spec = repo_spec(Variant::Moshiko, Preset::Q8);
        crate::models::cached_snapshot(&cache, &spec.repo, "r1", &spec.files, b"0123456789");
        let spec4 = repo_spec(Variant::Moshika, Preset::Q4);
        let repo4 = repo_cache_dir(&cache, &spec4.repo);
        std::fs::create_dir_all(repo4.join("blobs")).unwrap();
        std::fs::write(repo4.join("blobs/model.q4.safetensors.incomplete"), b"0123").unwrap();
        let found = scan(&cache);
        assert_eq!(found.len(), 2, "{found:?}");
        assert_eq!(
            (found[0].model.as_str(), found[0].preset),
            ("moshiko", Preset::Q8)
        );
        assert!(found[0].complete());
        assert_eq!(found[0].bytes, 30);
        assert_eq!(
            (found[1].model.as_str(), found[1].preset),
            ("moshika", Preset::Q4)
        );
        assert!(!found[1].complete());
        assert_eq!(found[1].missing.len(), 3);
        assert_eq!(found[1].unfinished, 1);
        assert_eq!(found[1].bytes, 4);
        assert_eq!(found[1].fetch_flag, "--variant moshika");
    }

    #[test]
    fn scan_lists_stt_bundles_after_moshi() {
        let cache = testkit::ScratchDir::new("list-stt");
        // A complete stt-2.6b MLX snapshot and an stt-1b candle one without its tokenizer.
        let full = stt_repo_spec(SttRelease::Stt2b6, Preset::MlxBf16).unwrap();
        let part = stt_repo_spec(SttRelease::Stt1b, Preset::CandleBf16).unwrap();
        for (spec, skip) in [(&full, None), (&part, Some(SttRelease::Stt1b.tokenizer()))] {
            let repo = repo_cache_dir(&cache, &spec.repo);
            std::fs::create_dir_all(repo.join("snapshots/r")).unwrap();
            std::fs::create_dir_all(repo.join("refs")).unwrap();
            std::fs::write(repo.join("refs/main"), "r").unwrap();
            for f in spec.files.iter().filter(|f| Some(**f) != skip) {
                std::fs::write(repo.join("snapshots/r").join(f), b"12345").unwrap();
            }
        }
        let moshi = repo_spec(Variant::Moshiko, Preset::Bf16);
        std::fs::create_dir_all(repo_cache_dir(&cache, &moshi.repo)).unwrap();
        let found = scan(&cache);
        let got: Vec<(&str, Preset, bool)> = found
            .iter()
            .map(|f| (f.model.as_str(), f.preset, f.complete()))
            .collect();
        assert_eq!(
            got,
            vec![
                ("moshiko", Preset::Bf16, false),
                ("stt-1b", Preset::CandleBf16, false),
                ("stt-2.6b", Preset::MlxBf16, true),
            ]
        );
        assert_eq!(found[1].missing, vec!["tokenizer_en_fr_audio_8000.model"]);
        assert_eq!(found[1].fetch_flag, "--model stt-1b");
        assert_eq!(found[2].bytes, 20);
    }
}
