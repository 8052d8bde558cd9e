//! `--device gpu` on the binary: full duplex on the fixture bundle gives the same reply as the CPU
//! (the same transcript, i.e. the same tokens; samples within Mimi's parity tolerance, the codec
//! running on the device too), and the choice is said at start. Skips with a
//! printed reason when no adapter exists; `MOSHI_REQUIRE_GPU=1` (CI) makes that a failure.

use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn duplex(device: &[&str], tag: &str) -> (String, Vec<u8>) {
    let dir = testkit::ScratchDir::new(&format!("gpu-cli-{tag}"));
    let out = dir.join("reply.wav");
    let o = Command::new(env!("CARGO_BIN_EXE_moshi-native"))
        .env("XDG_CACHE_HOME", dir.join("xdg"))
        .env_remove("MOSHI_MODEL_DIR")
        .args(["duplex", "--greedy", "--threads", "1", "--model-dir"])
        .arg(root().join("fixtures/lm"))
        .args(device)
        .arg("--in")
        .arg(root().join("fixtures/audio/hello.wav"))
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(o.status.success(), "{device:?}: {stderr}");
    let stdout = String::from_utf8_lossy(&o.stdout).into_owned();
    (stderr + &stdout, std::fs::read(&out).unwrap())
}

#[test]
fn duplex_on_gpu_matches_cpu() {
    if gpu::skip_test_without_adapter() {
        return;
    }
    let (cpu_log, cpu_wav) = duplex(&["--device", "cpu"], "cpu");
    let (gpu_log, gpu_wav) = duplex(&["--device", "gpu"], "gpu");
    assert!(cpu_log.contains("device cpu"), "{cpu_log}");
    assert!(
        gpu_log.contains("device gpu: the LM and Mimi run on adapter #"),
        "{gpu_log}"
    );
    // Mimi runs on the device too: the user's codes are exact (same tokens, same transcript) and the
    // reply's samples are the CPU's within Mimi's parity tolerance (1e-4), plus one step of the WAV's
    // sample format for a value rounded across a step boundary.
    assert_eq!(
        transcript(&gpu_log),
        transcript(&cpu_log),
        "transcript differs between GPU and CPU"
    );
    let (cpu_spec, cpu_pcm) = samples(&cpu_wav);
    let (gpu_spec, gpu_pcm) = samples(&gpu_wav);
    assert_eq!(gpu_spec, cpu_spec);
    assert_eq!(gpu_pcm.len(), cpu_pcm.len(), "reply lengths differ");
    let step = match cpu_spec.sample_format {
        hound::SampleFormat::Int => 1.0 / (1u32 << (cpu_spec.bits_per_sample - 1)) as f32,
        hound::SampleFormat::Float => 0.0,
    };
    let err = gpu_pcm
        .iter()
        .zip(&cpu_pcm)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    assert!(err <= 1e-4 + step, "reply samples differ by {err}");
}

/// The `transcript:` line of a duplex log (none when the reply has no text).
fn transcript(log: &str) -> Option<&str> {
    log.lines().find(|l| l.starts_with("transcript:"))
}

/// A WAV's format and samples as f32 in [-1, 1].
fn samples(wav: &[u8]) -> (hound::WavSpec, Vec<f32>) {
    let r = hound::WavReader::new(wav).unwrap();
    let spec = r.spec();
    let pcm = match spec.sample_format {
        hound::SampleFormat::Float => r.into_samples::<f32>().map(|s| s.unwrap()).collect(),
        hound::SampleFormat::Int => {
            let scale = (1u32 << (spec.bits_per_sample - 1)) as f32;
            r.into_samples::<i32>()
                .map(|s| s.unwrap() as f32 / scale)
                .collect()
        }
    };
    (spec, pcm)
}

#[test]
fn auto_never_takes_a_software_adapter() {
    let list = gpu::adapters();
    let (log, _) = duplex(&["--device", "auto"], "auto");
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
