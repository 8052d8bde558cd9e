//! `moshi-native stt` on the bundled `demo-stt` model and the oracle's 1b input: the JSON events are
//! the oracle's (`fixtures/stt/1b/events.json`: word start times, end times, order), the words are
//! the tokenizer's decoding of the oracle's word tokens, and `--vad` reports the extra heads.

use std::path::{Path, PathBuf};
use std::process::Command;

use testkit::ScratchDir;

mod common;

use common::word_tokens;

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/stt/1b")
}

fn stt(args: &[&str], cache: &Path) -> (Vec<serde_json::Value>, String) {
    let o = Command::new(env!("CARGO_BIN_EXE_moshi-native"))
        .env("XDG_CACHE_HOME", cache)
        .arg("stt")
        .args(args)
        .output()
        .expect("binary runs");
    let stderr = String::from_utf8_lossy(&o.stderr).to_string();
    assert!(o.status.success(), "stt failed: {stderr}");
    let lines = String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}")))
        .collect();
    (lines, stderr)
}

#[test]
fn stt_json_events_are_the_oracles() {
    let cache = ScratchDir::new("stt-cli");
    let wav = fixture().join("input.wav");
    let want: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixture().join("events.json")).unwrap())
            .unwrap();
    let spm = model::text::SentencePiece::load(fixture().join("tokenizer.model")).unwrap();
    let frames = want["plan"]["frames"].as_u64().unwrap() as usize;
    let want: Vec<&serde_json::Value> = want["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["type"] != "Step")
        .collect();
    let (got, stderr) = stt(
        &["--model", "demo-stt", "--json", wav.to_str().unwrap()],
        cache.path(),
    );
    assert!(stderr.contains("DEMO MODEL"), "{stderr}");
    assert_eq!(got.len(), want.len(), "{got:?}");
    for (g, w) in got.iter().zip(&want) {
        assert_eq!(g["type"], w["type"]);
        if w["type"] == "Word" {
            assert_eq!(g["start_time"], w["start_time"]);
            let tokens = word_tokens(w);
            assert_eq!(g["text"], spm.decode(&tokens).unwrap().trim());
        } else {
            assert_eq!(g["stop_time"], w["stop_time"]);
        }
    }
    // --vad adds one Step per step (4 probabilities each) to the same words.
    let (vad, _) = stt(
        &[
            "--model",
            "demo-stt",
            "--json",
            "--vad",
            wav.to_str().unwrap(),
        ],
        cache.path(),
    );
    let steps: Vec<_> = vad.iter().filter(|e| e["type"] == "Step").collect();
    assert_eq!(steps.len(), frames);
    assert!(steps
        .iter()
        .all(|s| s["prs"].as_array().unwrap().len() == 4));
    let words = |v: &[serde_json::Value]| {
        v.iter()
            .filter(|e| e["type"] == "Word")
            .cloned()
            .collect::<Vec<_>>()
    };
    assert_eq!(words(&vad), words(&got));
}

/// The oracle's 1b bundle laid out as Kyutai's `-candle` repository in a hub cache at `cache`
/// (Kyutai's file names, `config.json` naming them), as `fetch --model stt-1b --preset candle-bf16`
/// leaves it.
fn cache_as_stt_1b_candle(cache: &Path) -> PathBuf {
    let repo = cache.join("models--kyutai--stt-1b-en_fr-candle");
    let snap = repo.join("snapshots/rev1");
    std::fs::create_dir_all(&snap).unwrap();
    std::fs::create_dir_all(repo.join("refs")).unwrap();
    std::fs::write(repo.join("refs/main"), "rev1").unwrap();
    let mimi = "mimi-pytorch-e351c8d8@125.safetensors";
    let spm = "tokenizer_en_fr_audio_8000.model";
    for (from, to) in [
        ("model.safetensors", "model.safetensors"),
        ("mimi.safetensors", mimi),
        ("tokenizer.model", spm),
        ("mimi_config.json", "mimi_config.json"),
    ] {
        std::fs::copy(fixture().join(from), snap.join(to)).unwrap();
    }
    let mut cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixture().join("config.json")).unwrap())
            .unwrap();
    cfg["mimi_name"] = mimi.into();
    cfg["tokenizer_name"] = spm.into();
    std::fs::write(snap.join("config.json"), cfg.to_string()).unwrap();
    snap
}

fn run(args: &[&str], hub: &Path, cache: &Path) -> (bool, String, String) {
    let o = Command::new(env!("CARGO_BIN_EXE_moshi-native"))
        .env("XDG_CACHE_HOME", cache)
        .env("HF_HUB_CACHE", hub)
        .args(args)
        .output()
        .expect("binary runs");
    (
        o.status.success(),
        String::from_utf8_lossy(&o.stdout).to_string(),
        String::from_utf8_lossy(&o.stderr).to_string(),
    )
}

#[test]
fn stt_model_names_resolve_through_the_hub_cache() {
    let hub = ScratchDir::new("stt-hub");
    let cache = ScratchDir::new("stt-hub-xdg");
    let wav = fixture().join("input.wav");
    let wav = wav.to_str().unwrap();
    // Empty cache: the error names the repository and the fetch command.
    let (ok, _, err) = run(
        &["stt", "--model", "stt-1b", "--preset", "candle-bf16", wav],
        &hub,
        &cache,
    );
    assert!(!ok);
    assert!(
        err.contains("kyutai/stt-1b-en_fr-candle")
            && err.contains("moshi-native fetch --model stt-1b --preset candle-bf16"),
        "{err}"
    );
    let (ok, _, err) = run(
        &["stt", "--model", "stt-1b", "--preset", "q8", wav],
        &hub,
        &cache,
    );
    assert!(!ok && err.contains("no `q8` release"), "{err}");
    cache_as_stt_1b_candle(&hub);
    let (ok, out, err) = run(
        &[
            "stt",
            "--model",
            "stt-1b",
            "--preset",
            "candle-bf16",
            "--json",
            wav,
        ],
        &hub,
        &cache,
    );
    assert!(ok, "{err}");
    let (demo, _) = stt(&["--model", "demo-stt", "--json", wav], cache.path());
    let got: Vec<serde_json::Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(!got.is_empty());
    assert_eq!(
        got, demo,
        "the same bundle under Kyutai's names transcribes the same"
    );
    // `list` shows it; `verify --model stt-1b --preset candle-bf16` finds and checks it.
    let (ok, out, _) = run(&["list"], &hub, &cache);
    assert!(ok);
    let row = out
        .lines()
        .find(|l| l.split_whitespace().take(2).eq(["stt-1b", "candle-bf16"]))
        .unwrap_or_else(|| panic!("{out}"));
    assert!(row.ends_with("complete"), "{row}");
    let (ok, out, err) = run(
        &["verify", "--model", "stt-1b", "--preset", "candle-bf16"],
        &hub,
        &cache,
    );
    assert!(ok, "{out}{err}");
    assert!(
        out.contains("voice activity") && out.contains("transcription"),
        "{out}"
    );
}

#[test]
fn inspect_prints_stt_facts() {
    let hub = ScratchDir::new("stt-inspect");
    let (ok, out, err) = run(&["inspect", fixture().to_str().unwrap()], &hub, &hub);
    assert!(ok, "{err}");
    for fact in [
        "speech-to-text (model_type stt)",
        "dep_q 0 (no Depformer)",
        "n_q 32 audio codebooks in",
        "4 extra heads x 6 outputs",
        "audio delay 0.5 s = 6 steps",
        "flush 19 frames",
    ] {
        assert!(out.contains(fact), "no `{fact}` in {out}");
    }
    let big = fixture().join("../2b6");
    let (ok, out, _) = run(&["inspect", big.to_str().unwrap()], &hub, &hub);
    assert!(ok);
    assert!(
        out.contains("no extra heads") && out.contains("silence prefix 1 s = 13 frames"),
        "{out}"
    );
    // A lone STT LM file with its voice-activity heads is read (a Moshi bundle refuses them) and
    // checked against the released stt-1b.
    let lone = fixture().join("model.safetensors");
    let (ok, out, err) = run(&["inspect", lone.to_str().unwrap()], &hub, &hub);
    assert!(ok, "{err}");
    assert!(out.contains("released stt-1b speech-to-text LM"), "{out}");
}
