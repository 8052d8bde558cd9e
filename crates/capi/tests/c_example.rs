//! `examples/duplex.c` and `examples/transcribe.c` compiled with the system C compiler against the
//! committed header and the built library (shared and static), run on the demo models: the duplex
//! program's output equals a Rust session fed the same way; the transcriber's words, times and ends of
//! turn are the oracle's (`fixtures/stt/1b`, the `demo-stt` bundle).

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::fixtures;

/// The folder holding this test binary, where cargo also puts `libmoshi_native.so` / `.a`.
fn lib_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().unwrap().to_path_buf();
    assert!(
        dir.join("libmoshi_native.so").is_file() || dir.join("libmoshi_native.dylib").is_file(),
        "no shared library beside {}",
        exe.display()
    );
    dir
}

fn compile(source: &str, out: &Path, link: &[String]) {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let status = Command::new(&cc)
        .args(["-std=c11", "-O2", "-Wall", "-Wextra", "-Werror", "-I"])
        .arg(crate_dir.join("include"))
        .arg(crate_dir.join("examples").join(source))
        .arg("-o")
        .arg(out)
        .args(link)
        .status()
        .unwrap_or_else(|e| panic!("cannot run the C compiler `{cc}`: {e}"));
    assert!(status.success(), "{cc} failed on examples/{source}");
}

/// Rust reference: the runtime fed the same pushes as the C program (80 ms each, then pull).
fn reference(input: &[f32]) -> Vec<f32> {
    let engine = runtime::Engine::open(&fixtures().join("lm"), Default::default()).unwrap();
    let opts = runtime::SessionOptions {
        max_queued_frames: 8,
        ..Default::default()
    };
    let mut s = runtime::Session::new(engine, opts).unwrap();
    let mut pcm = Vec::new();
    for chunk in input.chunks(runtime::FRAME_SIZE) {
        s.push_pcm(chunk).unwrap();
        while let runtime::Step::Frame(f) = s.step().unwrap() {
            pcm.extend_from_slice(&f.pcm);
        }
    }
    pcm
}

/// The example `source` built against the shared library and (on Linux, when built) the static one.
fn binaries(source: &str, work: &testkit::ScratchDir) -> (Vec<PathBuf>, PathBuf) {
    let lib = lib_dir();
    let stem = source.trim_end_matches(".c");
    let shared = work.join(stem);
    compile(
        source,
        &shared,
        &[
            format!("-L{}", lib.display()),
            "-lmoshi_native".into(),
            format!("-Wl,-rpath,{}", lib.display()),
        ],
    );
    let mut binaries = vec![shared];
    let archive = lib.join("libmoshi_native.a");
    if cfg!(target_os = "linux") && archive.is_file() {
        let static_bin = work.join(format!("{stem}-static"));
        compile(
            source,
            &static_bin,
            &[
                archive.display().to_string(),
                "-lpthread".into(),
                "-ldl".into(),
                "-lm".into(),
            ],
        );
        binaries.push(static_bin);
    }
    (binaries, lib)
}

/// Runs the example program `bin` with `args`. Its run path names `lib`; cargo's
/// LD_LIBRARY_PATH (searched first) may also name folders holding other builds of the library, so
/// it names `lib` alone.
fn run_example(bin: &Path, lib: &Path, args: &[&Path]) -> Output {
    Command::new(bin)
        .env("LD_LIBRARY_PATH", lib)
        .args(args)
        .output()
        .unwrap()
}

/// [`run_example`] without a bundle: the program succeeds on the demo model and says so; its
/// output and stderr.
fn run_on_demo(bin: &Path, lib: &Path, args: &[&Path]) -> (Output, String) {
    let run = run_example(bin, lib, args);
    let stderr = String::from_utf8_lossy(&run.stderr).into_owned();
    assert!(run.status.success(), "{} failed: {stderr}", bin.display());
    assert!(stderr.contains("DEMO MODEL"), "{stderr}");
    (run, stderr)
}

#[test]
fn the_c_example_runs_full_duplex_on_the_demo_model() {
    let work = testkit::ScratchDir::new("capi-c");
    let (binaries, lib) = binaries("duplex.c", &work);
    let input_path = fixtures().join("audio/hello.wav");
    let input = runtime::audio::read_wav_strict(&input_path).unwrap();
    let want = reference(&input);
    let frames = input.len() / runtime::FRAME_SIZE;
    assert_eq!(want.len(), (frames - 1) * runtime::FRAME_SIZE);
    for bin in binaries {
        let out = work.join("reply.wav");
        let (_, stderr) = run_on_demo(&bin, &lib, &[&input_path, &out]);
        assert!(stderr.contains(&format!("{frames} frames")), "{stderr}");
        let got = runtime::audio::read_wav_strict(&out).unwrap();
        assert_eq!(got.len(), want.len());
        // The C program writes 16-bit PCM (x * 32767, truncated), read back as x / 32768.
        let clamped: Vec<f32> = want.iter().map(|b| b.clamp(-1.0, 1.0)).collect();
        let err = testkit::compare::max_abs_diff(&got, &clamped);
        assert!(
            err <= 2.0 / 32767.0,
            "{}: max abs error {err}",
            bin.display()
        );
        assert!(
            want.iter().any(|&x| x.abs() > 1e-3),
            "the reference is not silence"
        );
    }
    // Usage errors exit with status 2.
    let run = run_example(&work.join("duplex"), &lib, &[]);
    assert_eq!(run.status.code(), Some(2));
}

/// What `transcribe.c` prints for the oracle's events (`events.json`): a word at its end (its EndWord, or
/// the next word's start), an end of turn when head 2's probability first exceeds 0.5 after a word.
fn oracle_transcript() -> String {
    let dir = fixtures().join("stt/1b");
    let spm = model::text::SentencePiece::load(dir.join("tokenizer.model")).unwrap();
    let text = std::fs::read_to_string(dir.join("events.json")).unwrap();
    let j: serde_json::Value = serde_json::from_str(&text).unwrap();
    let mut out = String::new();
    let mut pending: Option<(String, f64)> = None;
    let mut armed = true;
    for e in j["events"].as_array().unwrap() {
        match e["type"].as_str().unwrap() {
            "Step" => {
                let p = e["prs"][2].as_f64().unwrap();
                if armed && p > 0.5 {
                    armed = false;
                    out += &format!("<end of turn, p = {p:.2}>\n");
                }
            }
            kind => {
                armed = true;
                let t = e[if kind == "Word" {
                    "start_time"
                } else {
                    "stop_time"
                }]
                .as_f64()
                .unwrap();
                if let Some((w, s)) = pending.take() {
                    out += &format!("[{s:6.2} - {t:6.2}] {w}\n");
                }
                if kind == "Word" {
                    let ids: Vec<u32> = e["tokens"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|x| x.as_u64().unwrap() as u32)
                        .collect();
                    pending = Some((spm.decode(&ids).unwrap().trim().to_string(), t));
                }
            }
        }
    }
    if let Some((w, s)) = pending {
        out += &format!("[{s:6.2} -       ] {w}\n");
    }
    out
}

#[test]
fn the_c_transcriber_prints_the_oracles_words_on_the_demo_model() {
    let work = testkit::ScratchDir::new("capi-c-stt");
    let (binaries, lib) = binaries("transcribe.c", &work);
    let want = oracle_transcript();
    assert!(
        want.contains("end of turn") && want.matches('[').count() >= 3,
        "{want}"
    );
    let input = fixtures().join("stt/1b/input.wav");
    for bin in binaries {
        let (run, stderr) = run_on_demo(&bin, &lib, &[&input]);
        assert!(
            stderr.contains("39 steps, 5 words, 4 voice-activity heads"),
            "{stderr}"
        );
        assert_eq!(
            String::from_utf8_lossy(&run.stdout),
            want,
            "{}",
            bin.display()
        );
    }
    // The same with the bundle named; a Moshi bundle is refused (exit 1, the library's message).
    let transcribe = work.join("transcribe");
    let run = run_example(&transcribe, &lib, &[&input, &fixtures().join("stt/1b")]);
    assert!(run.status.success());
    assert!(!String::from_utf8_lossy(&run.stderr).contains("DEMO"));
    assert_eq!(String::from_utf8_lossy(&run.stdout), want);
    let run = run_example(&transcribe, &lib, &[&input, &fixtures().join("lm")]);
    assert_eq!(run.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(stderr.contains("speech-to-text"), "{stderr}");
    let run = run_example(&transcribe, &lib, &[]);
    assert_eq!(run.status.code(), Some(2));
}
