//! CI smoke of every fuzz target: the bodies of `fuzz/fuzz_targets` (shared through
//! `fuzz/src/lib.rs`) run on the committed fixtures, on any saved crash inputs under
//! `fuzz/regressions/<target>/`, and on deterministic mutations of the fixtures (byte flips,
//! extreme integers, truncations, insertions; mostly in the first 4 KiB, where the headers are).
//! The coverage-guided campaign (`tools/fuzz/run.sh`, cargo-fuzz + libFuzzer) is recorded in
//! RELIABILITY.md; this test keeps every target exercised on every CI run. A panic fails it.

#[allow(dead_code)]
#[path = "../../../fuzz/src/lib.rs"]
mod bodies;

use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Every file under `fixtures/` whose name ends with one of `exts` (symlinks followed).
fn fixtures(exts: &[&str]) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut stack = vec![root().join("fixtures")];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        let mut entries: Vec<_> = rd.flatten().map(|e| e.path()).collect();
        entries.sort();
        for p in entries {
            if p.is_dir() {
                stack.push(p);
            } else if exts.iter().any(|e| p.to_string_lossy().ends_with(e)) {
                if let Ok(b) = std::fs::read(&p) {
                    out.push(b);
                }
            }
        }
    }
    out
}

fn regressions(target: &str) -> Vec<Vec<u8>> {
    let d = root().join("fuzz/regressions").join(target);
    let mut v: Vec<_> = std::fs::read_dir(d)
        .map(|rd| rd.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    v.sort();
    v.iter().filter_map(|p| std::fs::read(p).ok()).collect()
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

fn mutate(seed: &[u8], rng: &mut Rng) -> Vec<u8> {
    let mut v = seed.to_vec();
    for _ in 0..1 + rng.below(4) {
        let in_header = rng.below(8) != 0;
        let span = if in_header {
            v.len().min(4096)
        } else {
            v.len()
        };
        match rng.below(6) {
            0 if span > 0 => {
                let i = rng.below(span);
                v[i] ^= 1 << rng.below(8);
            }
            1 if span >= 8 => {
                let i = rng.below(span - 7);
                let extreme = [
                    0u64,
                    1,
                    u64::MAX,
                    1 << 60,
                    10_000_000_000,
                    u32::MAX as u64 + 1,
                ][rng.below(6)];
                v[i..i + 8].copy_from_slice(&extreme.to_le_bytes());
            }
            2 if span > 0 => v.truncate(rng.below(v.len())),
            3 => {
                let i = rng.below(span + 1).min(v.len());
                let junk: Vec<u8> = (0..1 + rng.below(16)).map(|_| rng.next() as u8).collect();
                v.splice(i..i, junk);
            }
            4 if span > 0 => {
                let i = rng.below(span);
                v[i] = [b'"', b'{', b'}', b':', b',', b'[', b']', 0, 0xff][rng.below(9)];
            }
            _ if span > 1 => {
                let i = rng.below(span);
                let j = rng.below(span);
                v.swap(i, j);
            }
            _ => {}
        }
    }
    v
}

fn smoke(name: &str, body: fn(&[u8]), seeds: Vec<Vec<u8>>, mutations_per_seed: usize) {
    assert!(!seeds.is_empty(), "{name}: no seed inputs found");
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ name.len() as u64);
    let mut runs = 0usize;
    for s in regressions(name) {
        body(&s);
        runs += 1;
    }
    for seed in &seeds {
        body(seed);
        runs += 1;
        for _ in 0..mutations_per_seed {
            body(&mutate(seed, &mut rng));
            runs += 1;
        }
    }
    body(&[]);
    eprintln!("{name}: {runs} inputs, no panic");
}

#[test]
fn safetensors_header() {
    let mut seeds = fixtures(&["CODES.safetensors", "quant/blocks.safetensors"]);
    seeds.extend(fixtures(&["lm/model.safetensors"]));
    smoke("safetensors_header", bodies::safetensors_header, seeds, 400);
}

#[test]
fn gguf_header() {
    smoke(
        "gguf_header",
        bodies::gguf_header,
        fixtures(&[".gguf"]),
        600,
    );
}

#[test]
fn mlx_triplets() {
    let seeds: Vec<Vec<u8>> = fixtures(&[
        "lm_mlx_q4/model.q4.safetensors",
        "lm_mlx_q8/model.q8.safetensors",
    ])
    .into_iter()
    .enumerate()
    .map(|(i, mut s)| {
        s.insert(0, i as u8 + 1);
        s
    })
    .collect();
    smoke("mlx_triplets", bodies::mlx_triplets, seeds, 300);
}

#[test]
fn spm_model() {
    smoke("spm_model", bodies::spm_model, fixtures(&[".model"]), 400);
}

#[test]
fn wav_read() {
    smoke(
        "wav_read",
        bodies::wav_read,
        fixtures(&["hello.wav", "input.wav"]),
        300,
    );
}

#[test]
fn ogg_opus_input() {
    // A real Ogg/Opus stream from the server's own encoder (2 s of a tone with noise).
    let mut enc = server::codec::OggOpusEncoder::new().unwrap();
    let mut ogg = Vec::new();
    enc.write_headers(&mut ogg).unwrap();
    let pcm: Vec<f32> = (0..48_000)
        .map(|i| 0.3 * (i as f32 * 0.05).sin() + 0.01 * ((i * 7919 % 101) as f32 / 101.0 - 0.5))
        .collect();
    enc.push(&pcm, &mut ogg).unwrap();
    smoke("ogg_opus_input", bodies::ogg_opus_input, vec![ogg], 800);
}

#[test]
fn ws_message() {
    let seeds = vec![
        vec![0, 0, 0, 0, 0, 0, 0, 0, 0],
        b"\x02hello".to_vec(),
        b"\x01OggS\x00\x02".to_vec(),
        b"text_temperature=0.7&text_topk=25&audio_temperature=0.8&audio_topk=250&pad_mult=0&repetition_penalty=1.0&repetition_penalty_context=64&text_seed=1&audio_seed=2&max_steps=100".to_vec(),
        b"text_topk=%FF%00&audio_seed=-1&max_steps=99999999999999999999".to_vec(),
    ];
    smoke("ws_message", bodies::ws_message, seeds, 3000);
}
