//! End-to-end tests of the `moshi-native` binary on the bundled demo model and the committed
//! fixture bundle: output WAV format and length, non-silence, transcript, and error exits.

use std::path::Path;
use std::process::{Command, Output};

use testkit::ScratchDir;

mod common;

use common::{bin, root};

fn run(c: &mut Command) -> Output {
    let o = c.output().expect("binary runs");
    assert!(
        o.status.success(),
        "command failed: {:?}\nstdout: {}\nstderr: {}",
        c,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    o
}

/// Runs a command that must fail; returns its stderr.
fn refused(c: &mut Command) -> String {
    let o = c.output().expect("binary runs");
    assert!(!o.status.success(), "{c:?} succeeded");
    String::from_utf8_lossy(&o.stderr).to_string()
}

fn read_wav(p: &Path) -> (hound::WavSpec, Vec<f32>) {
    let mut r = hound::WavReader::open(p).unwrap();
    let spec = r.spec();
    let s = r
        .samples::<i16>()
        .map(|x| f32::from(x.unwrap()) / 32768.0)
        .collect();
    (spec, s)
}

fn input_frames(p: &Path) -> usize {
    let r = hound::WavReader::open(p).unwrap();
    let spec = r.spec();
    assert_eq!(
        spec.sample_rate, 24_000,
        "test input is already at the model rate"
    );
    (r.duration() as usize).div_ceil(1920)
}

/// What one `duplex` run on `fixtures/audio/hello.wav` wrote.
struct Reply {
    spec: hound::WavSpec,
    pcm: Vec<f32>,
    text: String,
    stderr: String,
}

/// `duplex <flags> --in hello.wav --out … --text-out …` in a fresh folder named after `tag`; checks
/// that there is one output frame per input frame.
fn duplex(flags: &[&str], tag: &str) -> Reply {
    let input = root().join("fixtures/audio/hello.wav");
    let dir = ScratchDir::new(&format!("cli-{tag}"));
    let (out, txt) = (dir.join("reply.wav"), dir.join("reply.txt"));
    let o = run(bin()
        .arg("duplex")
        .args(flags)
        .arg("--in")
        .arg(&input)
        .arg("--out")
        .arg(&out)
        .arg("--text-out")
        .arg(&txt));
    let (spec, pcm) = read_wav(&out);
    assert_eq!(
        pcm.len(),
        input_frames(&input) * 1920,
        "one output frame per input frame"
    );
    Reply {
        spec,
        pcm,
        text: std::fs::read_to_string(&txt).unwrap(),
        stderr: String::from_utf8_lossy(&o.stderr).to_string(),
    }
}

fn check_duplex(model_flags: &[&str], tag: &str) -> (String, Vec<f32>) {
    let r = duplex(&[model_flags, &["--greedy"]].concat(), tag);
    assert_eq!(r.spec.sample_rate, 24_000);
    assert_eq!(r.spec.channels, 1);
    assert!(r.pcm.iter().any(|&x| x.abs() > 1e-4), "output is all zeros");
    assert!(!r.text.trim().is_empty(), "empty transcript");
    assert!(r.stderr.contains("frames/s"), "{}", r.stderr);
    (r.stderr, r.pcm)
}

#[test]
fn duplex_on_demo_model_is_labelled() {
    let (stderr, _) = check_duplex(&["--model", "demo"], "demo");
    assert!(stderr.contains("DEMO MODEL: random weights"), "{stderr}");
}

#[test]
fn duplex_on_fixture_bundle_matches_demo() {
    let dir = root().join("fixtures/lm");
    let (stderr, bundle) = check_duplex(&["--model-dir", dir.to_str().unwrap()], "bundle");
    assert!(!stderr.contains("DEMO MODEL"), "{stderr}");
    // The demo model is the same tiny bundle: greedy runs must agree sample for sample.
    let (_, demo) = check_duplex(&["--model", "demo"], "demo2");
    assert_eq!(demo, bundle);
}

#[test]
fn duplex_stereo_puts_user_left_and_moshi_right() {
    let input = root().join("fixtures/audio/hello.wav");
    let dir = ScratchDir::new("cli-stereo");
    let out = dir.join("both.wav");
    run(bin()
        .args(["duplex", "--model", "demo", "--greedy", "--stereo", "--in"])
        .arg(&input)
        .arg("--out")
        .arg(&out));
    let (spec, pcm) = read_wav(&out);
    assert_eq!(spec.channels, 2);
    let (_, user) = read_wav(&input);
    let left: Vec<f32> = pcm.iter().step_by(2).copied().collect();
    assert_eq!(left.len(), input_frames(&input) * 1920);
    for (l, u) in left.iter().zip(&user) {
        assert!(
            (l - u).abs() <= 1.0 / 16384.0,
            "left channel is the user's input"
        );
    }
}

#[test]
fn generate_with_prompt_prints_transcript() {
    let dir = ScratchDir::new("cli-gen");
    let out = dir.join("gen.wav");
    let o = run(bin()
        .args([
            "generate",
            "--model",
            "demo",
            "--greedy",
            "--seconds",
            "1.6",
            "--prompt",
            "hello there",
            "--out",
        ])
        .arg(&out));
    let (spec, pcm) = read_wav(&out);
    assert_eq!(spec.sample_rate, 24_000);
    assert_eq!(pcm.len(), 20 * 1920);
    assert!(pcm.iter().any(|&x| x.abs() > 1e-4));
    let stdout = String::from_utf8_lossy(&o.stdout);
    // The prompt is forced into the text stream, so the transcript starts with it.
    assert!(stdout.trim_start().starts_with("hello there"), "{stdout}");
}

#[test]
fn bad_inputs_fail_with_one_clear_line_and_nonzero_exit() {
    let e = refused(
        bin()
            .args(["duplex", "--model", "demo", "--out", "/dev/null", "--in"])
            .arg(root().join("Cargo.toml")),
    );
    assert!(
        e.starts_with("error: cannot read") && e.lines().nth(1).unwrap_or("").starts_with("hint:"),
        "{e}"
    );

    let e = refused(
        bin()
            .args(["duplex", "--out", "/dev/null", "--in"])
            .arg(root().join("fixtures/audio/hello.wav")),
    );
    assert!(
        e.contains("not in the Hugging Face cache") && e.contains("moshi-native fetch"),
        "{e}"
    );

    refused(bin().args([
        "generate",
        "--model",
        "demo",
        "--seconds",
        "-1",
        "--out",
        "/dev/null",
    ]));
}

#[test]
fn inspect_reports_the_fixture_bundle() {
    let o = run(bin().arg("inspect").arg(root().join("fixtures/lm")));
    let s = String::from_utf8_lossy(&o.stdout);
    // Dimensions as written in the oracle's fixtures/lm/config.json.
    let cfg: serde_json::Value =
        serde_json::from_slice(&std::fs::read(root().join("fixtures/lm/config.json")).unwrap())
            .unwrap();
    for (key, label) in [
        ("dim", "dim"),
        ("num_layers", "x"),
        ("card", "card"),
        ("text_card", "text_card"),
    ] {
        let v = cfg[key].as_u64().unwrap();
        let needle = match label {
            "x" => format!("x {v} layers"),
            l => format!("{l} {v}"),
        };
        assert!(s.contains(&needle), "inspect output lacks `{needle}`:\n{s}");
    }

    // A refusal: a LoRA config is a clear error with a non-zero exit.
    let dir = ScratchDir::new("cli-lora");
    for f in std::fs::read_dir(root().join("fixtures/lm"))
        .unwrap()
        .flatten()
    {
        std::fs::copy(f.path(), dir.join(f.file_name())).unwrap();
    }
    let mut cfg = cfg;
    cfg["lora"] = serde_json::Value::Bool(true);
    std::fs::write(dir.join("config.json"), serde_json::to_vec(&cfg).unwrap()).unwrap();
    let o = bin().arg("inspect").arg(dir.path()).output().unwrap();
    assert!(!o.status.success(), "a LoRA bundle must be refused");
    let e = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(e.to_lowercase().contains("lora"), "{e}");
}

/// `duplex` on the fixture bundle with the given sampling / engine flags (no `--greedy`):
/// (transcript, output samples).
fn duplex_with(flags: &[&str], tag: &str) -> (String, Vec<f32>) {
    let bundle = root().join("fixtures/lm");
    let r = duplex(
        &[&["--model-dir", bundle.to_str().unwrap()], flags].concat(),
        tag,
    );
    (r.text, r.pcm)
}

/// Sampling, `--kv-dtype` and `--threads` end to end: a seeded sampled run is reproducible, does
/// not depend on the thread count, and the seed and the sampler settings are really used.
#[test]
fn duplex_sampling_kv_dtype_and_threads_are_seeded_and_deterministic() {
    let sampled = [
        "--seed",
        "7",
        "--text-temperature",
        "0.9",
        "--text-topk",
        "40",
        "--audio-temperature",
        "0.9",
        "--audio-topk",
        "30",
        "--kv-dtype",
        "bf16",
    ];
    let with = |extra: &[&str], tag: &str| {
        let flags: Vec<&str> = sampled.iter().chain(extra).copied().collect();
        duplex_with(&flags, tag)
    };
    let one = with(&["--threads", "1"], "s7t1");
    let again = with(&["--threads", "1"], "s7t1b");
    assert!(one == again, "same seed, same flags: same output");
    let two = with(&["--threads", "2"], "s7t2");
    assert!(one == two, "the thread count does not change a seeded run");
    let other_seed = duplex_with(
        &[&sampled[2..], &["--seed", "8", "--threads", "1"]].concat(),
        "s8",
    );
    assert!(one.1 != other_seed.1, "the seed is used");
    let greedy = duplex_with(&["--greedy", "--kv-dtype", "bf16", "--threads", "1"], "g");
    assert!(one.1 != greedy.1, "sampling is used");
}
