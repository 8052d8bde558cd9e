//! The batch driver on the GPU device: a `runtime::BatchRunner` on `Device::Gpu` (every ready
//! slot's Mimi encode, LM step and decode in one submission per tick, `gpu::GpuDuplexBatch`)
//! gives each of its slots the tokens and text the CPU batch path gives for the same inputs
//! (greedy and seeded slots, one reset mid-stream; slots joining late and skipping), samples
//! within Mimi's parity tolerance, one submission and one wait per tick; and
//! `serve --device gpu --batch N` starts, saying where the LM and Mimi run. Skips with a printed
//! reason when no adapter exists; `MOSHI_REQUIRE_GPU=1` (CI) makes that a failure.

mod common;

use common::root;

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use model::sampling::SamplerConfig;
use runtime::{
    BatchOptions, BatchRunner, BatchSession, Device, Engine, EngineOptions, Event, EventReceiver,
    PcmProducer, SessionOptions, FRAME_SIZE,
};

const WAIT: Duration = Duration::from_secs(120);

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

/// The fixture bundle on `device`; on the GPU, on a context the test holds (to read its counters).
fn engine(device: Device) -> (Arc<Engine>, Option<gpu::GpuContext>) {
    let opts = EngineOptions {
        device,
        ..EngineOptions::default()
    };
    if let Device::Cpu { .. } = device {
        return (
            Engine::open(&root().join("fixtures/lm"), opts).unwrap(),
            None,
        );
    }
    let (e, ctx) = common::gpu_fixture_engine(opts);
    (e, Some(ctx))
}

const GPU: Device = Device::Gpu {
    adapter: None,
    threads: 1,
};

/// One slot's part in a schedule of rounds: its sampler, the round it joins at, the rounds in
/// which it has no input, and the round after which it is reset.
struct Plan {
    sampling: SamplerConfig,
    join: usize,
    skip: std::ops::Range<usize>,
    reset_after: Option<usize>,
}

/// Device work of a run after its first round: submissions, waits and the runner's ticks.
#[derive(Debug, Default)]
struct Work {
    submissions: u64,
    waits: u64,
    ticks: u64,
}

/// The slots of `plans` in a batch of `slots` on `device`, `rounds` rounds: in each, every slot
/// that has joined and does not skip gets the next frame of its own signal, then the test waits
/// for all their frames. Returns what each slot produced and, on the GPU, the device work.
fn run_schedule(device: Device, slots: usize, plans: &[Plan], rounds: usize) -> (Vec<Got>, Work) {
    let (engine, ctx) = engine(device);
    let r = BatchRunner::spawn(
        engine,
        BatchOptions {
            slots,
            event_capacity: 8,
        },
    )
    .unwrap();
    let pcm: Vec<Vec<f32>> = (0..plans.len())
        .map(|i| signal(rounds, i as u64 + 1))
        .collect();
    let mut convs: Vec<Option<Conv>> = plans.iter().map(|_| None).collect();
    let mut fed = vec![0; plans.len()];
    let count = |r: &BatchRunner| {
        ctx.as_ref()
            .map(|c| (c.submissions(), c.waits(), r.ticks()))
    };
    let mut first = None;
    for round in 0..rounds {
        for (i, p) in plans.iter().enumerate() {
            if round == p.join {
                let mut s = r.open(options(p.sampling.clone())).unwrap();
                convs[i] = Some(Conv {
                    mic: s.producer().unwrap(),
                    ev: s.events().unwrap(),
                    s,
                    got: Got::default(),
                });
            }
        }
        let fed_now: Vec<usize> = (0..plans.len())
            .filter(|&i| convs[i].is_some() && !plans[i].skip.contains(&round))
            .collect();
        for &i in &fed_now {
            let f = fed[i];
            fed[i] += 1;
            let c = convs[i].as_mut().unwrap();
            c.mic.push(&pcm[i][f * FRAME_SIZE..(f + 1) * FRAME_SIZE]);
        }
        for &i in &fed_now {
            convs[i].as_mut().unwrap().next();
        }
        for (i, p) in plans.iter().enumerate() {
            if p.reset_after == Some(round) {
                convs[i].as_ref().unwrap().s.control().reset();
            }
        }
        if round == 0 {
            first = count(&r);
        }
    }
    let mut work = Work::default();
    if let (Some(a), Some(b)) = (first, count(&r)) {
        work = Work {
            submissions: b.0 - a.0,
            waits: b.1 - a.1,
            ticks: b.2 - a.2,
        };
    }
    let got = convs.into_iter().map(|c| c.unwrap().got).collect();
    r.stop().unwrap();
    (got, work)
}

/// Three slots (greedy, seeded, greedy) fed their own signals in lockstep on `device`; the third
/// is reset after frame `reset_after`.
fn run_batch(device: Device, frames: usize, reset_after: usize) -> Vec<Got> {
    let plans = [
        SamplerConfig::greedy(),
        SamplerConfig::seeded(11),
        SamplerConfig::greedy(),
    ]
    .into_iter()
    .enumerate()
    .map(|(i, sampling)| Plan {
        sampling,
        join: 0,
        skip: 0..0,
        reset_after: (i == 2).then_some(reset_after),
    })
    .collect::<Vec<_>>();
    run_schedule(device, 3, &plans, frames).0
}

/// Every slot of `gpu` has the frames of the same slot of `cpu`: tokens, text and epochs exact,
/// samples within Mimi's parity tolerance.
fn assert_same(gpu: &[Got], cpu: &[Got]) {
    for (slot, (g, c)) in gpu.iter().zip(cpu).enumerate() {
        assert_eq!(g.epochs, c.epochs, "slot {slot}: epochs");
        assert_eq!(g.text_tokens, c.text_tokens, "slot {slot}: text tokens");
        assert_eq!(g.audio, c.audio, "slot {slot}: audio tokens");
        assert_eq!(g.text, c.text, "slot {slot}: text");
        assert_eq!(g.pcm.len(), c.pcm.len(), "slot {slot}: samples");
        let err = testkit::compare::max_abs_diff(&g.pcm, &c.pcm);
        eprintln!("slot {slot}: GPU vs CPU samples max abs diff {err:e}");
        assert!(err < 1e-4, "slot {slot}: samples differ by {err}");
    }
}

#[test]
fn batch_runner_on_gpu_matches_the_cpu_batch_path() {
    if gpu::skip_test_without_adapter() {
        return;
    }
    let (frames, reset_after) = (14, 5);
    let cpu = run_batch(Device::Cpu { threads: 1 }, frames, reset_after);
    let gpu = run_batch(GPU, frames, reset_after);
    assert_eq!(cpu[2].epochs.last(), Some(&1), "the third slot was reset");
    assert_same(&gpu, &cpu);
    // The slots ran different inputs (else the comparison would not tell slots apart).
    assert_ne!(gpu[0].audio, gpu[1].audio);
}

/// `serve --device gpu --batch N`'s worker runs every ready slot's frame in one device call per
/// tick: with slots joining late, skipping rounds and resetting (two of them seeded), each slot's
/// frames are the CPU batch's, and every tick after the first round is one submission and one
/// wait on the device. Driven tick by tick (`BatchBench`), a tick of three slots is one
/// submission and one wait too.
#[test]
fn a_gpu_batch_tick_is_one_submission_and_matches_the_cpu_batch() {
    if gpu::skip_test_without_adapter() {
        return;
    }
    let plans = [
        Plan {
            sampling: SamplerConfig::seeded(5),
            join: 0,
            skip: 0..0,
            reset_after: Some(7),
        },
        Plan {
            sampling: SamplerConfig::greedy(),
            join: 0,
            skip: 4..7,
            reset_after: None,
        },
        Plan {
            sampling: SamplerConfig::seeded(9),
            join: 3,
            skip: 0..0,
            reset_after: None,
        },
    ];
    let rounds = 13;
    let (cpu, _) = run_schedule(Device::Cpu { threads: 1 }, 4, &plans, rounds);
    let (gpu, work) = run_schedule(GPU, 4, &plans, rounds);
    assert_eq!(cpu[0].epochs.last(), Some(&1), "the first slot was reset");
    assert_eq!(
        cpu[1].text_tokens.len(),
        rounds - 3,
        "the second slot skipped"
    );
    assert_eq!(
        cpu[2].text_tokens.len(),
        rounds - 3,
        "the third slot joined late"
    );
    assert_same(&gpu, &cpu);
    eprintln!("{work:?} after the first round");
    assert!(work.ticks >= (rounds - 1) as u64, "{work:?}");
    assert_eq!(work.submissions, work.ticks, "submissions per tick");
    assert_eq!(work.waits, work.ticks, "waits per tick");

    let (engine, ctx) = engine(GPU);
    let ctx = ctx.unwrap();
    let opts = options(SamplerConfig::seeded(2));
    let mut bench = runtime::BatchBench::new(&engine, 3, &opts, 16).unwrap();
    let pcm: Vec<f32> = (0..3).flat_map(|i| signal(1, i + 4)).collect();
    for tick in 0..4 {
        let before = (ctx.submissions(), ctx.waits());
        let frames = bench.tick(&pcm).unwrap();
        let n = (ctx.submissions() - before.0, ctx.waits() - before.1);
        assert_eq!(n, (1, 1), "tick {tick} of 3 slots: (submissions, waits)");
        assert_eq!(frames, 3, "tick {tick}: a frame per slot");
    }
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
