//! `--device gpu` on the speech-to-text commands (issue 32): `stt --model demo-stt --device gpu` gives
//! the oracle's events on the 1b fixture input (words, start and stop times exact, the four
//! voice-activity probabilities of every step within 1e-4), `serve --model demo-stt --device gpu`
//! starts its batched driver with the LM on the device, and an adapter that does not exist or a batch
//! larger than the GPU backend steps is refused with its reason. Skips with a printed reason when no adapter exists;
//! `MOSHI_REQUIRE_GPU=1` (CI) makes that a failure.
#![cfg(unix)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

mod common;

use common::{sigterm_exit, spawn_demo_stt, wait_ready, word_tokens};
use model::stt::testing::assert_json_events;

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/stt/1b")
}

#[test]
fn stt_on_gpu_gives_the_oracles_events() {
    if gpu::skip_test_without_adapter() {
        return;
    }
    let cache = testkit::ScratchDir::new("stt-gpu-cli");
    let wav = fixture().join("input.wav");
    let o = Command::new(env!("CARGO_BIN_EXE_moshi-native"))
        .env("XDG_CACHE_HOME", cache.path())
        .args(["stt", "--model", "demo-stt", "--json", "--vad"])
        .args(["--device", "gpu"])
        .arg(&wav)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "stt --device gpu failed: {stderr}");
    assert!(
        stderr.contains("device gpu: the LM step runs on the GPU"),
        "{stderr}"
    );
    let got: Vec<serde_json::Value> = String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}")))
        .collect();
    let want: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixture().join("events.json")).unwrap())
            .unwrap();
    let spm = model::text::SentencePiece::load(fixture().join("tokenizer.model")).unwrap();
    // `--vad` prints an EndOfTurn line of its own; the oracle's events are the others.
    assert!(want["events"]
        .as_array()
        .unwrap()
        .iter()
        .any(|e| e["type"] == "Word"));
    assert_json_events(
        &got,
        &want["events"],
        1e-4,
        "stt --device gpu",
        |g, w, at| {
            if w["type"] == "Word" {
                assert_eq!(g["start_time"], w["start_time"], "{at}");
                let tokens = word_tokens(w);
                assert_eq!(g["text"], spm.decode(&tokens).unwrap().trim(), "{at}");
            } else {
                assert_eq!(g["stop_time"], w["stop_time"], "{at}");
            }
        },
    );
    // The flag reaches the device: an adapter that does not exist is an error, not the CPU.
    let o = Command::new(env!("CARGO_BIN_EXE_moshi-native"))
        .env("XDG_CACHE_HOME", cache.path())
        .args(["stt", "--model", "demo-stt", "--gpu", "99"])
        .arg(&wav)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "stt --gpu 99 ran: {stderr}");
    assert!(
        stderr.contains("starting the speech-to-text step"),
        "{stderr}"
    );
}

#[test]
fn serve_stt_on_gpu_starts_and_refuses_too_many_streams() {
    if gpu::skip_test_without_adapter() {
        return;
    }
    let (child, port) = spawn_demo_stt(&["--max-sessions", "2", "--device", "gpu"]);
    let ready = wait_ready(port, "streams free", Duration::from_secs(120));
    assert!(
        ready.contains("2 of 2 speech-to-text streams free"),
        "{ready}"
    );
    let err = sigterm_exit(child);
    assert!(err.contains("one batched step on the GPU"), "{err}");

    // More streams than the device backend's rows: refused with the reason, not a crash.
    let max = gpu::shaders::MAX_ROWS;
    let too_many = (max + 1).to_string();
    let (mut child, _) = spawn_demo_stt(&["--max-sessions", &too_many, "--device", "gpu"]);
    // A server that accepted the batch would serve until killed: give it a deadline.
    let t = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if t.elapsed() > Duration::from_secs(120) {
            child.kill().unwrap();
            let o = child.wait_with_output().unwrap();
            panic!(
                "serve accepted {} streams on the GPU: {}",
                max + 1,
                String::from_utf8_lossy(&o.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let o = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{err}");
    assert!(
        err.contains(&format!("a batch of {} rows", max + 1)),
        "{err}"
    );
}
