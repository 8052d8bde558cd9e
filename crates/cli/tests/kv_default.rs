//! The KV element type each command runs with when `--kv-dtype` is not given: bf16 for the commands
//! that hold conversations (`duplex`, `serve`; their start-up notice names what is in use), f32 for
//! the parity tools (`trace lm`, `trace duplex`), and `--kv-dtype f32` still honoured.
#![cfg(unix)]

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use testkit::ScratchDir;

mod common;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn bin(dir: &ScratchDir) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_moshi-native"));
    c.env("XDG_CACHE_HOME", dir.join("xdg"))
        .env_remove("MOSHI_MODEL_DIR")
        .env_remove("RUST_LOG");
    c
}

/// The start-up notice line of `duplex --model demo` with `flags`.
fn duplex_notice(flags: &[&str]) -> String {
    let dir = ScratchDir::new("kv-default-duplex");
    let o = bin(&dir)
        .args(["duplex", "--model", "demo", "--greedy", "--in"])
        .arg(root().join("fixtures/audio/hello.wav"))
        .arg("--out")
        .arg(dir.join("reply.wav"))
        .args(flags)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(o.status.success(), "{stderr}");
    stderr
        .lines()
        .find(|l| l.contains("real time:"))
        .unwrap_or_else(|| panic!("no real-time notice: {stderr}"))
        .to_string()
}

#[test]
fn duplex_runs_bf16_kv_unless_told_f32() {
    let line = duplex_notice(&[]);
    assert!(line.contains(", bf16 KV,"), "{line}");
    let line = duplex_notice(&["--kv-dtype", "f32"]);
    assert!(line.contains(", f32 KV,"), "{line}");
}

#[test]
fn serve_runs_bf16_kv_by_default() {
    let dir = ScratchDir::new("kv-default-serve");
    let log = dir.join("stderr.txt");
    let mut child = bin(&dir)
        .args(["serve", "--model", "demo", "--host", "127.0.0.1", "--port"])
        .arg(common::free_port().to_string())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let started = Instant::now();
    let notice = loop {
        let mut text = String::new();
        std::fs::File::open(&log)
            .unwrap()
            .read_to_string(&mut text)
            .unwrap();
        if let Some(l) = text.lines().find(|l| l.contains("real time:")) {
            break Ok(l.to_string());
        }
        if child.try_wait().unwrap().is_some() || started.elapsed() > Duration::from_secs(120) {
            break Err(text);
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let _ = child.kill();
    let _ = child.wait();
    let line = notice.unwrap_or_else(|log| panic!("no real-time notice: {log}"));
    assert!(line.contains(", bf16 KV,"), "{line}");
}

/// The parity tools keep the oracle's arithmetic: their `--kv-dtype` defaults to f32 (the product
/// commands' help says bf16).
#[test]
fn trace_tools_default_to_f32_kv() {
    let dir = ScratchDir::new("kv-default-help");
    let help = |args: &[&str]| {
        let o = bin(&dir).args(args).arg("--help").output().unwrap();
        assert!(o.status.success());
        let text = String::from_utf8_lossy(&o.stdout).into_owned();
        // The flag's block of the help: from `--kv-dtype` to the next flag.
        let at = text
            .find("--kv-dtype")
            .unwrap_or_else(|| panic!("{args:?}: {text}"));
        let rest = &text[at..];
        let end = rest[2..].find("\n  -").map_or(rest.len(), |e| e + 2);
        rest[..end].to_string()
    };
    for tool in [["trace", "lm"], ["trace", "duplex"]] {
        let h = help(&tool);
        assert!(h.contains("[default: f32]"), "{tool:?}: {h}");
    }
    for cmd in ["duplex", "generate", "serve", "verify"] {
        let h = help(&[cmd]);
        assert!(h.contains("[default: bf16]"), "{cmd}: {h}");
    }
}
