//! The CLI behaves the same everywhere (issue 31): `mimi` reads what `duplex` reads and writes
//! 16-bit PCM, refuses a WAV given as codes; `inspect` names a codes file, refuses what is not
//! weights and prints no Rust debug text; an empty WAV is called empty; warnings for more threads
//! than cores, for flags the chosen model ignores and for a prompt longer than the generation;
//! `synth --format` takes the preset names; no loader noise from `devices`; no colour codes in piped
//! logs; counts read "1 frame"; transcripts end with a newline; `completions` and `list`.

use std::path::Path;
use std::process::{Command, Output};

use testkit::ScratchDir;

mod common;

use common::{bin, root};

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Runs a command that must succeed; returns (stdout, stderr).
fn ok(c: &mut Command) -> (String, String) {
    let o: Output = c.output().expect("binary runs");
    assert!(
        o.status.success(),
        "command failed: {c:?}\nstdout: {}\nstderr: {}",
        text(&o.stdout),
        text(&o.stderr)
    );
    (text(&o.stdout), text(&o.stderr))
}

/// Runs a command that must fail; returns (stdout, stderr).
fn fails(c: &mut Command) -> (String, String) {
    let o = c.output().expect("binary runs");
    assert!(
        !o.status.success(),
        "{c:?} succeeded\nstdout: {}\nstderr: {}",
        text(&o.stdout),
        text(&o.stderr)
    );
    (text(&o.stdout), text(&o.stderr))
}

/// A 16-bit PCM WAV of `channels` × `frames` samples at `rate` (a 440 Hz tone).
fn tone_wav(path: &Path, rate: u32, channels: u16, frames: usize) {
    let spec = hound::WavSpec {
        channels,
        sample_rate: rate,
        bits_per_sample: 16,
        sample_format: hound::SampleFormat::Int,
    };
    let mut w = hound::WavWriter::create(path, spec).unwrap();
    for i in 0..frames {
        let v = (0.3
            * (2.0 * std::f32::consts::PI * 440.0 * i as f32 / rate as f32).sin()
            * 32767.0) as i16;
        for _ in 0..channels {
            w.write_sample(v).unwrap();
        }
    }
    w.finalize().unwrap();
}

/// A WAV header announcing 100 samples with none after it (a recording never written to).
fn header_only_wav(path: &Path) {
    tone_wav(path, 24_000, 1, 100);
    let bytes = std::fs::read(path).unwrap();
    std::fs::write(path, &bytes[..bytes.len() - 200]).unwrap();
}

#[test]
fn mimi_reads_any_wav_writes_pcm16_and_refuses_a_wav_as_codes() {
    let dir = ScratchDir::new("cli-mimi");
    // 16 kHz stereo, 0.5 s: resampled and mixed down as duplex does.
    let wav = dir.join("in.wav");
    tone_wav(&wav, 16_000, 2, 8_000);
    let codes = dir.join("in.codes");
    let (_, e) = ok(bin()
        .args(["mimi", "encode", "--model", "demo"])
        .arg(&wav)
        .arg(&codes));
    assert!(e.contains("converted to 24000 Hz mono"), "{e}");
    // 0.5 s at 24 kHz = 12000 samples = 7 frames (6.25 rounded up).
    assert!(e.contains("7 frames x 8 codebooks"), "{e}");

    let out = dir.join("out.wav");
    let (_, e) = ok(bin()
        .args(["mimi", "decode", "--model", "demo"])
        .arg(&codes)
        .arg(&out));
    assert!(e.contains("7 frames"), "{e}");
    let r = hound::WavReader::open(&out).unwrap();
    let spec = r.spec();
    assert_eq!(
        (
            spec.channels,
            spec.sample_rate,
            spec.bits_per_sample,
            spec.sample_format
        ),
        (1, 24_000, 16, hound::SampleFormat::Int),
        "16-bit PCM by default"
    );
    assert_eq!(r.duration(), 12_000, "trimmed to the encoded length");
    let (_, _) = ok(bin()
        .args(["mimi", "decode", "--float", "--model", "demo"])
        .arg(&codes)
        .arg(dir.join("f.wav")));
    let spec = hound::WavReader::open(dir.join("f.wav")).unwrap().spec();
    assert_eq!(
        (spec.bits_per_sample, spec.sample_format),
        (32, hound::SampleFormat::Float)
    );

    // A WAV given where codes are expected.
    let (_, e) = fails(
        bin()
            .args(["mimi", "decode", "--model", "demo"])
            .arg(&wav)
            .arg(dir.join("x.wav")),
    );
    assert!(e.contains("is a WAV file, not Mimi codes"), "{e}");
    assert!(e.contains("hint: `mimi encode"), "{e}");
    assert!(!e.contains("header length"), "{e}");

    // Counts: a clip shorter than a frame is "1 frame".
    let short = dir.join("short.wav");
    tone_wav(&short, 24_000, 1, 1_000);
    let (_, e) = ok(bin()
        .args(["mimi", "encode", "--model", "demo"])
        .arg(&short)
        .arg(dir.join("short.codes")));
    assert!(e.contains(": 1 frame x 8 codebooks"), "{e}");

    // inspect names a codes file as such.
    let (o, _) = ok(bin().arg("inspect").arg(&codes));
    assert!(o.contains("Mimi codes"), "{o}");
    assert!(o.contains("8 codebooks x 7 frames"), "{o}");
    assert!(o.contains("samples:   12000"), "{o}");
    assert!(!o.to_lowercase().contains("lm weights"), "{o}");
    // ... and refuses a WAV, non-zero.
    let (_, e) = fails(bin().arg("inspect").arg(&wav));
    assert!(e.contains("is a WAV file, not weights"), "{e}");
}

#[test]
fn empty_wav_is_called_empty() {
    let dir = ScratchDir::new("cli-empty");
    let wav = dir.join("empty.wav");
    header_only_wav(&wav);
    let (_, e) = fails(
        bin()
            .args(["duplex", "--model", "demo", "--out"])
            .arg(dir.join("o.wav"))
            .arg("--in")
            .arg(&wav),
    );
    assert!(e.contains("empty"), "{e}");
    assert!(!e.contains("truncated"), "{e}");
    let (_, e) = fails(
        bin()
            .args(["mimi", "encode", "--model", "demo"])
            .arg(&wav)
            .arg(dir.join("o.codes")),
    );
    assert!(e.contains("empty"), "{e}");
}

#[test]
fn inspect_prints_plain_values_and_refuses_what_is_not_weights() {
    let (o, _) = ok(bin().arg("inspect").arg(root().join("fixtures/lm")));
    let ctx = o.lines().find(|l| l.contains("context ")).unwrap_or("");
    assert!(!ctx.is_empty(), "{o}");
    assert!(
        !o.contains("Some(") && !o.contains("None"),
        "Rust debug text: {o}"
    );

    // An empty directory: one clear line naming it once.
    let dir = ScratchDir::new("cli-inspect");
    let empty = dir.join("emptydir");
    std::fs::create_dir_all(&empty).unwrap();
    let (_, e) = fails(bin().arg("inspect").arg(&empty));
    assert_eq!(e.matches("emptydir").count(), 1, "{e}");

    // A safetensors file of tensors no Moshi model has: refused, non-zero.
    let other = dir.join("other.safetensors");
    let header = br#"{"foo.bar":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}"#;
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(header);
    bytes.extend_from_slice(&[0; 4]);
    std::fs::write(&other, bytes).unwrap();
    let (_, e) = fails(bin().arg("inspect").arg(&other));
    assert!(e.contains("none is a Moshi LM or Mimi weight"), "{e}");
    assert!(e.contains("1 tensor "), "{e}");
}

#[test]
fn warnings_for_threads_ignored_flags_and_long_prompts_and_plain_logs() {
    let dir = ScratchDir::new("cli-warn");
    let txt = dir.join("reply.txt");
    // The prompt is 120 words: more tokens than the 2 frames of 0.16 s.
    let prompt = "hello there ".repeat(60);
    let (_, e) = ok(bin()
        .args([
            "-v",
            "generate",
            "--model",
            "demo",
            "--variant",
            "moshika",
            "--greedy",
        ])
        .args(["--seconds", "0.16", "--prompt", &prompt, "--out"])
        .arg(dir.join("g.wav"))
        .arg("--text-out")
        .arg(&txt));
    assert!(
        e.contains("warning: --variant moshika ignored: --model demo decides the weights"),
        "{e}"
    );
    assert!(
        e.contains("warning: the prompt is") && e.contains("allows 2 frames"),
        "{e}"
    );
    assert!(
        !e.contains("warning: --threads"),
        "no thread warning by default: {e}"
    );
    let t = std::fs::read_to_string(&txt).unwrap();
    assert!(t.ends_with('\n'), "{t:?}");

    // More threads than physical cores.
    let too_many = runtime::physical_cores() + 1;
    let (_, e) = ok(bin()
        .args([
            "generate",
            "--model",
            "demo",
            "--seconds",
            "0.08",
            "--threads",
        ])
        .arg(too_many.to_string())
        .arg("--out")
        .arg(dir.join("t.wav")));
    assert!(
        e.contains(&format!("warning: --threads {too_many} is more than the")),
        "{e}"
    );

    // duplex's transcript file ends with a newline too; its summary counts in words.
    let wav = dir.join("in.wav");
    tone_wav(&wav, 24_000, 1, 1_920);
    let reply = dir.join("duplex.txt");
    let (_, e) = ok(bin()
        .args(["duplex", "--model", "demo", "--in"])
        .arg(&wav)
        .arg("--out")
        .arg(dir.join("d.wav"))
        .arg("--text-out")
        .arg(&reply));
    assert!(e.contains("duplex: 1 frame "), "{e}");
    assert!(std::fs::read_to_string(&reply).unwrap().ends_with('\n'));
}

#[test]
fn synth_format_takes_preset_names() {
    let dir = ScratchDir::new("cli-synth-preset");
    let cfg = root().join("fixtures/lm/config.json");
    for (preset, file) in [("q8", "model.q8.gguf"), ("q4", "model.q4.safetensors")] {
        let out = dir.join(preset);
        ok(bin()
            .args(["synth", "--format", preset, "--config"])
            .arg(&cfg)
            .arg("--out")
            .arg(&out));
        assert!(
            out.join(file).is_file(),
            "--format {preset} wrote no {file}"
        );
    }
}

#[test]
fn devices_prints_no_loader_noise_and_plain_logs() {
    // -v: the GPU library's debug logs reach stderr, which is a pipe here.
    let (_, e) = ok(bin().args(["-v", "devices"]).env_remove("XDG_RUNTIME_DIR"));
    assert!(!e.contains("XDG_RUNTIME_DIR"), "{e}");
    assert!(e.contains("DEBUG"), "no logs to check: {e}");
    assert!(!e.contains('\u{1b}'), "ANSI codes in piped stderr: {e:?}");
}

#[test]
fn completions_for_each_shell() {
    for (shell, marker) in [
        ("bash", "complete -F"),
        ("zsh", "#compdef moshi-native"),
        ("fish", "complete -c moshi-native"),
    ] {
        let (o, _) = ok(bin().args(["completions", shell]));
        assert!(o.contains(marker), "{shell}: {o}");
        for sub in ["duplex", "serve", "list", "completions"] {
            assert!(o.contains(sub), "{shell} completion lacks {sub}");
        }
    }
    fails(bin().args(["completions", "powershell-9"]));
}

#[test]
fn list_shows_cached_bundles() {
    let cache = ScratchDir::new("cli-list");
    let (o, _) = ok(bin().arg("list").env("HF_HUB_CACHE", cache.path()));
    assert!(o.contains("no released bundle"), "{o}");
    // A complete moshiko q8 and a partial moshika q4 (LM download unfinished).
    let snap = cache.join("models--kyutai--moshiko-candle-q8/snapshots/r1");
    std::fs::create_dir_all(&snap).unwrap();
    std::fs::create_dir_all(cache.join("models--kyutai--moshiko-candle-q8/refs")).unwrap();
    std::fs::write(
        cache.join("models--kyutai--moshiko-candle-q8/refs/main"),
        "r1",
    )
    .unwrap();
    for f in [
        "model.q8.gguf",
        "tokenizer-e351c8d8-checkpoint125.safetensors",
        "tokenizer_spm_32k_3.model",
    ] {
        std::fs::write(snap.join(f), vec![0u8; 2_000]).unwrap();
    }
    let blobs = cache.join("models--kyutai--moshika-mlx-q4/blobs");
    std::fs::create_dir_all(&blobs).unwrap();
    std::fs::write(
        blobs.join("model.q4.safetensors.incomplete"),
        vec![0u8; 500],
    )
    .unwrap();
    let (o, _) = ok(bin().arg("list").env("HF_HUB_CACHE", cache.path()));
    let row = |v: &str, p: &str| {
        o.lines()
            .find(|l| {
                let w: Vec<&str> = l.split_whitespace().collect();
                w.len() > 2 && w[0] == v && w[1] == p
            })
            .unwrap_or_else(|| panic!("no {v} {p} row: {o}"))
            .to_string()
    };
    let k = row("moshiko", "q8");
    assert!(k.contains("6.0 kB") && k.ends_with("complete"), "{k}");
    let a = row("moshika", "q4");
    assert!(
        a.contains("500 B") && a.contains("partial: missing model.q4.safetensors"),
        "{a}"
    );
    assert!(a.contains("1 download unfinished"), "{a}");
    let rows = o
        .lines()
        .filter(|l| l.trim_start().starts_with("moshik"))
        .count();
    assert_eq!(rows, 2, "{o}");
}
