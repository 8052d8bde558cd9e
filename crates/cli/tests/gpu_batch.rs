//! The batch driver on the GPU device: a `runtime::BatchRunner` on `Device::Gpu` (the LM's
//! batched step and every slot's Mimi on the device, one `gpu::GpuMimi`) gives each of its
//! slots the tokens and text the CPU batch path gives for the same inputs (greedy and seeded
//! slots, one reset mid-stream), samples within Mimi's parity tolerance; and
//! `serve --device gpu --batch N` starts, saying where the LM and Mimi run. Skips with a printed
//! reason when no adapter exists; `MOSHI_REQUIRE_GPU=1` (CI) makes that a failure.

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use model::sampling::SamplerConfig;
use runtime::{
    BatchOptions, BatchRunner, BatchSession, Device, Engine, EngineOptions, Event, EventReceiver,
    PcmProducer, SessionOptions, FRAME_SIZE,
};

const WAIT: Duration = Duration::from_secs(120);

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A chirp with a little pseudo-random noise, different per `seed`.
fn signal(frames: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..frames * FRAME_SIZE)
        .map(|i| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            let noise = ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.05;
            let t = i as f32 / 24_000.0;
            let f = 150.0 + 120.0 * seed as f32 + 700.0 * ((t * 0.37).sin() * 0.5 + 0.5);
            0.4 * (std::f32::consts::TAU * f * t).sin() + noise
        })
        .collect()
}

/// What one slot produced, frame by frame.
#[derive(Debug, Default)]
struct Got {
    epochs: Vec<u64>,
    text_tokens: Vec<Option<u32>>,
    audio: Vec<Option<[u32; 8]>>,
    text: String,
    pcm: Vec<f32>,
}

struct Conv {
    s: BatchSession,
    mic: PcmProducer,
    ev: EventReceiver,
    got: Got,
}

impl Conv {
    fn next(&mut self) {
        match self.ev.recv_timeout(WAIT).unwrap() {
            Event::Frame(f) => {
                self.got.epochs.push(f.epoch);
                self.got.text_tokens.push(f.text_token);
                self.got.audio.push(f.audio_tokens);
                self.got.text.push_str(&f.text);
                self.got.pcm.extend_from_slice(&f.pcm);
                self.ev.recycle(f);
            }
            other => panic!("{other:?}"),
        }
    }
}

fn options(sampling: SamplerConfig) -> SessionOptions {
    SessionOptions {
        sampling,
        ..Default::default()
    }
}

/// Three slots (greedy, seeded, greedy) fed their own signals in lockstep on `device`; the third
/// is reset after frame `reset_after`.
fn run_batch(device: Device, frames: usize, reset_after: usize) -> Vec<Got> {
    let engine: Arc<Engine> = Engine::open(
        &root().join("fixtures/lm"),
        EngineOptions {
            device,
            ..EngineOptions::default()
        },
    )
    .unwrap();
    let r = BatchRunner::spawn(
        engine,
        BatchOptions {
            slots: 3,
            event_capacity: 8,
        },
    )
    .unwrap();
    let sampling = [
        SamplerConfig::greedy(),
        SamplerConfig::seeded(11),
        SamplerConfig::greedy(),
    ];
    let pcm: Vec<Vec<f32>> = (0..3).map(|i| signal(frames, i as u64 + 1)).collect();
    let mut convs: Vec<Conv> = sampling
        .iter()
        .map(|s| {
            let mut s = r.open(options(s.clone())).unwrap();
            Conv {
                mic: s.producer().unwrap(),
                ev: s.events().unwrap(),
                s,
                got: Got::default(),
            }
        })
        .collect();
    for i in 0..frames {
        for (c, p) in convs.iter_mut().zip(&pcm) {
            c.mic.push(&p[i * FRAME_SIZE..(i + 1) * FRAME_SIZE]);
        }
        for c in convs.iter_mut() {
            c.next();
        }
        if i == reset_after {
            convs[2].s.control().reset();
        }
    }
    let got = convs.into_iter().map(|c| c.got).collect();
    r.stop().unwrap();
    got
}

#[test]
fn batch_runner_on_gpu_matches_the_cpu_batch_path() {
    if gpu::skip_test_without_adapter() {
        return;
    }
    let (frames, reset_after) = (14, 5);
    let cpu = run_batch(Device::Cpu { threads: 1 }, frames, reset_after);
    let gpu = run_batch(
        Device::Gpu {
            adapter: None,
            threads: 1,
        },
        frames,
        reset_after,
    );
    assert_eq!(cpu[2].epochs.last(), Some(&1), "the third slot was reset");
    for (slot, (g, c)) in gpu.iter().zip(&cpu).enumerate() {
        assert_eq!(g.epochs, c.epochs, "slot {slot}: epochs");
        assert_eq!(g.text_tokens, c.text_tokens, "slot {slot}: text tokens");
        assert_eq!(g.audio, c.audio, "slot {slot}: audio tokens");
        assert_eq!(g.text, c.text, "slot {slot}: text");
        assert_eq!(g.pcm.len(), c.pcm.len(), "slot {slot}: samples");
        let err = testkit::compare::max_abs_diff(&g.pcm, &c.pcm);
        eprintln!("slot {slot}: GPU vs CPU samples max abs diff {err:e}");
        assert!(err < 1e-4, "slot {slot}: samples differ by {err}");
    }
    // The slots ran different inputs (else the comparison would not tell slots apart).
    assert_ne!(gpu[0].audio, gpu[1].audio);
}

#[test]
fn serve_gpu_batch_starts_and_says_where_the_model_runs() {
    if gpu::skip_test_without_adapter() {
        return;
    }
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dir = testkit::ScratchDir::new("gpu-serve");
    let mut child = Command::new(env!("CARGO_BIN_EXE_moshi-native"))
        .env("XDG_CACHE_HOME", dir.join("xdg"))
        .env_remove("MOSHI_MODEL_DIR")
        .args(["serve", "--device", "gpu", "--batch", "2", "--port"])
        .arg(port.to_string())
        .arg("--model-dir")
        .arg(root().join("fixtures/lm"))
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let mut log = String::new();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let started = loop {
        match lines.next() {
            Some(Ok(l)) => {
                log.push_str(&l);
                log.push('\n');
                if l.contains("serve: http://") {
                    break true;
                }
            }
            _ => break false,
        }
    };
    let _ = child.kill();
    let _ = child.wait();
    assert!(started, "serve did not start: {log}");
    assert!(
        log.contains("device gpu: the LM and Mimi run on adapter #"),
        "{log}"
    );
    assert!(!log.contains("Mimi runs on the CPU"), "{log}");
    assert!(log.contains("batched 2 per worker"), "{log}");
}
