//! `moshi-native stt` on the bundled `demo-stt` model and the oracle's 1b input: the JSON events are
//! the oracle's (`fixtures/stt/1b/events.json`: word start times, end times, order), the words are
//! the tokenizer's decoding of the oracle's word tokens, and `--vad` reports the extra heads.

use std::path::{Path, PathBuf};
use std::process::Command;

use testkit::ScratchDir;

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
            let tokens: Vec<u32> = w["tokens"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| t.as_u64().unwrap() as u32)
                .collect();
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
