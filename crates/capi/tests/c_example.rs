//! `examples/duplex.c` compiled with the system C compiler against the committed header and the built
//! library (shared and static), run on the demo model; its output equals a Rust session fed the same way.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

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

fn compile(out: &Path, link: &[String]) {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let status = Command::new(&cc)
        .args(["-std=c11", "-O2", "-Wall", "-Wextra", "-Werror", "-I"])
        .arg(crate_dir.join("include"))
        .arg(crate_dir.join("examples/duplex.c"))
        .arg("-o")
        .arg(out)
        .args(link)
        .status()
        .unwrap_or_else(|e| panic!("cannot run the C compiler `{cc}`: {e}"));
    assert!(status.success(), "{cc} failed on examples/duplex.c");
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

#[test]
fn the_c_example_runs_full_duplex_on_the_demo_model() {
    let lib = lib_dir();
    let work = testkit::ScratchDir::new("capi-c");
    let shared = work.join("duplex");
    compile(
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
        let static_bin = work.join("duplex-static");
        compile(
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

    let input_path = fixtures().join("audio/hello.wav");
    let input = runtime::audio::read_wav_strict(&input_path).unwrap();
    let want = reference(&input);
    let frames = input.len() / runtime::FRAME_SIZE;
    assert_eq!(want.len(), (frames - 1) * runtime::FRAME_SIZE);
    for bin in binaries {
        let out = work.join("reply.wav");
        // The program's run path names `lib`; cargo's LD_LIBRARY_PATH (searched first) may also name
        // folders holding other builds of the library.
        let run = Command::new(&bin)
            .env("LD_LIBRARY_PATH", &lib)
            .arg(&input_path)
            .arg(&out)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&run.stderr);
        assert!(run.status.success(), "{} failed: {stderr}", bin.display());
        assert!(stderr.contains("DEMO MODEL"), "{stderr}");
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
    let run = Command::new(work.join("duplex")).output().unwrap();
    assert_eq!(run.status.code(), Some(2));
}
