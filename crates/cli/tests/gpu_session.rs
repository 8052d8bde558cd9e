//! A `runtime::Session` on `Device::Gpu` runs each frame pass as one submission (`gpu::GpuDuplexBatch`
//! of one slot behind the runtime's frame-level seam, `runtime/src/fused.rs`): one submission and one wait per
//! frame, counted on the device context; the CPU session's tokens and text for the same input
//! (greedy and seeded), samples within Mimi's parity tolerance; a warmed-up or reset GPU session
//! runs as a fresh one. Skips with a printed reason when no adapter exists; `MOSHI_REQUIRE_GPU=1`
//! (CI) makes that a failure.

mod common;

use common::root;

use std::sync::Arc;

use model::sampling::SamplerConfig;
use runtime::{
    Device, Engine, EngineOptions, FrameEvent, Session, SessionOptions, Step, FRAME_SIZE,
};

/// The fixture bundle on a GPU context the test holds (to read its counters), f32 KV.
fn gpu_engine() -> Option<(Arc<Engine>, gpu::GpuContext)> {
    if gpu::skip_test_without_adapter() {
        return None;
    }
    let opts = EngineOptions {
        device: Device::Gpu {
            adapter: None,
            threads: 1,
        },
        ..Default::default()
    };
    Some(common::gpu_fixture_engine(opts))
}

/// Speech-like input.
fn input(frames: usize) -> Vec<f32> {
    (0..frames * FRAME_SIZE)
        .map(|i| 0.3 * (i as f32 * 0.031).sin() * (1.0 + (i as f32 * 0.0007).cos()))
        .collect()
}

fn options(sampling: SamplerConfig) -> SessionOptions {
    SessionOptions {
        sampling,
        max_queued_frames: 64,
        ..Default::default()
    }
}

/// Every frame of `frames` frames (timings cleared), and per frame the submissions and waits it
/// took on `ctx` (when given).
fn run(
    s: &mut Session,
    frames: usize,
    ctx: Option<&gpu::GpuContext>,
) -> (Vec<FrameEvent>, Vec<(u64, u64)>) {
    s.push_pcm(&input(frames)).unwrap();
    let (mut out, mut counts) = (Vec::new(), Vec::new());
    loop {
        let before = ctx.map(|c| (c.submissions(), c.waits()));
        match s.step().unwrap() {
            Step::Frame(f) => {
                let mut f = f.clone();
                f.timings = Default::default();
                out.push(f);
            }
            _ => break,
        }
        if let (Some(c), Some(b)) = (ctx, before) {
            counts.push((c.submissions() - b.0, c.waits() - b.1));
        }
    }
    assert_eq!(out.len(), frames);
    (out, counts)
}

#[test]
fn gpu_session_frames_are_one_submission_and_match_the_cpu() {
    let Some((gpu_e, ctx)) = gpu_engine() else {
        return;
    };
    let cpu_e = Engine::open(&root().join("fixtures/lm"), EngineOptions::cpu(1)).unwrap();
    let frames = 14;
    for sampling in [SamplerConfig::greedy(), SamplerConfig::seeded(7)] {
        let mut g = Session::new(gpu_e.clone(), options(sampling.clone())).unwrap();
        let (got, counts) = run(&mut g, frames, Some(&ctx));
        let mut c = Session::new(cpu_e.clone(), options(sampling.clone())).unwrap();
        let (want, _) = run(&mut c, frames, None);
        for (i, &n) in counts.iter().enumerate() {
            assert_eq!(n, (1, 1), "{sampling:?} frame {i}: (submissions, waits)");
        }
        assert!(want.iter().skip(1).all(|f| f.audio_tokens.is_some()));
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(g.text_token, w.text_token, "{sampling:?} frame {i}: text");
            assert_eq!(
                g.audio_tokens, w.audio_tokens,
                "{sampling:?} frame {i}: codes"
            );
            assert_eq!(g.text, w.text, "{sampling:?} frame {i}: text piece");
            assert_eq!(g.pcm.len(), w.pcm.len(), "{sampling:?} frame {i}: samples");
            let err = testkit::compare::max_abs_diff(&g.pcm, &w.pcm);
            assert!(
                err <= 1e-4,
                "{sampling:?} frame {i}: pcm max abs error {err}"
            );
        }
    }
}

#[test]
fn a_warmed_up_or_reset_gpu_session_runs_as_a_fresh_one() {
    let Some((e, _ctx)) = gpu_engine() else {
        return;
    };
    let frames = 12;
    let opts = options(SamplerConfig::seeded(3));
    let bits = |v: &[FrameEvent]| -> Vec<Vec<u32>> {
        v.iter()
            .map(|f| f.pcm.iter().map(|x| x.to_bits()).collect())
            .collect()
    };
    let (want, _) = run(
        &mut Session::new(e.clone(), opts.clone()).unwrap(),
        frames,
        None,
    );
    let mut warmed = Session::new(e.clone(), opts.clone()).unwrap();
    warmed.warm_up().unwrap();
    let (got, _) = run(&mut warmed, frames, None);
    assert_eq!(bits(&got), bits(&want), "warmed-up: PCM");
    assert_eq!(got, want, "warmed-up");
    // A reset mid-stream: the next stream is a fresh one (epochs and counters aside).
    warmed.reset();
    assert!(matches!(warmed.step().unwrap(), Step::Idle));
    let (again, _) = run(&mut warmed, frames, None);
    assert_eq!(bits(&again), bits(&want), "after a reset: PCM");
    for (a, w) in again.iter().zip(&want) {
        assert_eq!(
            (a.text_token, a.audio_tokens, &a.text, a.frame_index),
            (w.text_token, w.audio_tokens, &w.text, w.frame_index)
        );
    }
}
