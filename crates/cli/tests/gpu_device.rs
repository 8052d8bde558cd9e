//! `--device gpu` on the binary, against the oracle's duplex trace (`fixtures/duplex/`, Kyutai's
//! server loop run greedily by `tools/oracle/`): `trace duplex` gives every step's text and audio
//! tokens exactly and the decoded samples within Mimi's parity bound (1e-4), and `duplex` (the
//! user's command, the LM and Mimi on the device) writes the same reply and transcript. The
//! choice of device is said at start. Skips with a printed reason when no adapter exists;
//! `MOSHI_REQUIRE_GPU=1` (CI) makes that a failure.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;

use testkit::compare::max_abs_diff;
use testkit::TensorFile;

/// Samples per frame (80 ms at 24 kHz).
const FRAME: usize = 1920;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Runs the binary with `args` (its cache in `dir`); panics with its output unless it succeeds.
/// Returns stderr and stdout together.
fn moshi(dir: &testkit::ScratchDir, args: Vec<OsString>) -> String {
    let o = Command::new(env!("CARGO_BIN_EXE_moshi-native"))
        .env("XDG_CACHE_HOME", dir.join("xdg"))
        .env_remove("MOSHI_MODEL_DIR")
        .args(&args)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(o.status.success(), "{args:?}: {stderr}");
    stderr + &String::from_utf8_lossy(&o.stdout)
}

/// `duplex --greedy --kv-dtype f32` of the fixture bundle on `input` with the `device` flags: the
/// log, the reply WAV and the transcript file.
fn duplex(device: &[&str], tag: &str, input: &Path) -> (String, Vec<u8>, String) {
    let dir = testkit::ScratchDir::new(&format!("gpu-cli-{tag}"));
    let (out, text) = (dir.join("reply.wav"), dir.join("reply.txt"));
    // f32 KV caches, as the oracle computes: the product's bf16 default moves the logits (see
    // `--kv-dtype`), and this test compares tokens exactly.
    let mut args: Vec<OsString> = ["duplex", "--greedy", "--threads", "1", "--kv-dtype", "f32"]
        .iter()
        .chain(device)
        .map(|a| a.into())
        .collect();
    for (flag, path) in [
        ("--model-dir", root().join("fixtures/lm")),
        ("--in", input.to_path_buf()),
        ("--out", out.clone()),
        ("--text-out", text.clone()),
    ] {
        args.extend([flag.into(), path.into()]);
    }
    let log = moshi(&dir, args);
    (
        log,
        std::fs::read(&out).unwrap(),
        std::fs::read_to_string(&text).unwrap(),
    )
}

/// The oracle trace's input cut to its whole frames (what the Python server processed: it drops
/// the partial tail), in the original sample format, written to `dir`.
fn whole_frames_input(dir: &testkit::ScratchDir, frames: usize) -> PathBuf {
    let mut r = hound::WavReader::open(root().join("fixtures/duplex/input.wav")).unwrap();
    let spec = r.spec();
    assert_eq!((spec.channels, spec.sample_rate), (1, 24_000));
    let path = dir.join("input_whole_frames.wav");
    let mut w = hound::WavWriter::create(&path, spec).unwrap();
    let n = match spec.sample_format {
        hound::SampleFormat::Int => r
            .samples::<i32>()
            .take(frames * FRAME)
            .map(|s| w.write_sample(s.unwrap()).unwrap())
            .count(),
        hound::SampleFormat::Float => r
            .samples::<f32>()
            .take(frames * FRAME)
            .map(|s| w.write_sample(s.unwrap()).unwrap())
            .count(),
    };
    assert_eq!(n, frames * FRAME, "the input holds {frames} whole frames");
    w.finalize().unwrap();
    path
}

/// The GPU runs reproduce the oracle's duplex trace: tokens exact, samples within Mimi's parity
/// bound (1e-4), transcript exact. Compared with the oracle, not with the CPU, so that a device
/// path that went wrong the same way as the CPU's, or a run with no text at all, cannot pass.
#[test]
fn duplex_on_gpu_reproduces_the_oracle_trace() {
    if gpu::skip_test_without_adapter() {
        return;
    }
    let want = TensorFile::open(root().join("fixtures/duplex/trace.safetensors"));
    let (want_pcm, _) = want.f32("pcm");
    // One LM output per input frame but the first (LMGen's call 0).
    let steps = want.i64("text_tokens").0.len();
    assert!(steps > 1 && want_pcm.len() == steps * FRAME);
    assert!(
        want_pcm.iter().any(|x| x.abs() > 1e-3),
        "the oracle's reply is not silence"
    );

    // `trace duplex`: the server loop's text and audio tokens, every step, exactly; PCM within
    // 1e-4.
    let dir = testkit::ScratchDir::new("gpu-cli-trace");
    let traced = dir.join("trace.safetensors");
    let mut args: Vec<OsString> = ["trace", "duplex", "--greedy", "--device", "gpu"]
        .iter()
        .map(|a| a.into())
        .collect();
    for (flag, path) in [
        ("--model-dir", root().join("fixtures/lm")),
        ("--input", root().join("fixtures/duplex/input.wav")),
        ("--out", traced.clone()),
    ] {
        args.extend([flag.into(), path.into()]);
    }
    moshi(&dir, args);
    let got = TensorFile::open(&traced);
    for name in ["text_tokens", "audio_tokens"] {
        assert_eq!(got.i64(name), want.i64(name), "{name}: GPU vs oracle");
    }
    let (got_pcm, _) = got.f32("pcm");
    let err = max_abs_diff(&got_pcm, &want_pcm);
    eprintln!("trace duplex on the GPU: pcm max abs error {err:e} against the oracle");
    assert!(err <= 1e-4, "trace duplex: pcm max abs error {err}");

    // `duplex`, the user's command, on the frames the server processed: frame 0 is silence (no
    // LM output yet), then the oracle's reply. The WAV stores round(x · 32767) in 16 bits, read
    // back here as n / 32767: within half a step of the device's value, itself within 1e-4 of
    // the oracle's (both clamped to [-1, 1] as the writer clamps).
    let input = whole_frames_input(&dir, steps + 1);
    let (log, wav, transcript) = duplex(&["--device", "gpu"], "gpu", &input);
    assert!(
        log.contains("device gpu: the LM and Mimi run on adapter #"),
        "{log}"
    );
    let (spec, reply) = samples(&wav);
    assert_eq!(
        (spec.sample_format, spec.bits_per_sample, spec.channels),
        (hound::SampleFormat::Int, 16, 1)
    );
    assert_eq!(reply.len(), (steps + 1) * FRAME, "reply length");
    assert!(
        reply[..FRAME].iter().all(|&x| x == 0.0),
        "frame 0 is silence"
    );
    let clamped: Vec<f32> = want_pcm.iter().map(|x| x.clamp(-1.0, 1.0)).collect();
    let err = max_abs_diff(&reply[FRAME..], &clamped);
    assert!(
        err <= 1e-4 + 0.5 / 32767.0,
        "duplex reply: max abs error {err} against the oracle"
    );
    // The transcript is the text the server sent (its kind-2 messages, in order), less the
    // pieces of control tokens ("<s>"), which Python's server sends and the session's
    // detokenizer does not emit (the known difference `runtime/tests/duplex_oracle.rs` states).
    let json: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(root().join("fixtures/duplex/text_messages.json")).unwrap(),
    )
    .unwrap();
    let want_text: String = json["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m.as_str().unwrap())
        .filter(|m| !["<s>", "</s>"].contains(m))
        .collect();
    assert!(!want_text.is_empty());
    // The transcript file ends its last line with a newline (a text file's convention), which
    // is not part of what the server sent.
    let transcript = transcript
        .strip_suffix('\n')
        .expect("the transcript file ends with a newline");
    assert_eq!(transcript, want_text, "transcript: GPU vs oracle");
}

/// A 16-bit mono WAV's format and samples as `n / 32767` (the inverse of the writer's
/// `round(x · 32767)`).
fn samples(wav: &[u8]) -> (hound::WavSpec, Vec<f32>) {
    let r = hound::WavReader::new(wav).unwrap();
    let spec = r.spec();
    assert_eq!(spec.sample_format, hound::SampleFormat::Int);
    let pcm = r
        .into_samples::<i32>()
        .map(|s| s.unwrap() as f32 / 32767.0)
        .collect();
    (spec, pcm)
}

#[test]
fn auto_never_takes_a_software_adapter() {
    let list = gpu::adapters();
    let hello = root().join("fixtures/audio/hello.wav");
    let (log, _, _) = duplex(&["--device", "auto"], "auto", &hello);
    if list.iter().any(|a| a.is_hardware_gpu()) {
        assert!(log.contains("device gpu"), "{log}");
    } else {
        assert!(log.contains("device cpu"), "{log}");
    }
}

#[test]
fn gpu_flag_with_cpu_device_is_refused() {
    let dir = testkit::ScratchDir::new("gpu-cli-refused");
    let o = Command::new(env!("CARGO_BIN_EXE_moshi-native"))
        .args(["duplex", "--device", "cpu", "--gpu", "0", "--model-dir"])
        .arg(root().join("fixtures/lm"))
        .arg("--in")
        .arg(root().join("fixtures/audio/hello.wav"))
        .arg("--out")
        .arg(dir.join("refused.wav"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{stderr}");
    assert!(stderr.contains("--gpu N"), "{stderr}");
}
