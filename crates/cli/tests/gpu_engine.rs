//! Where a GPU engine's LM lives: `Engine::open` on `Device::Gpu` packs the LM's weights for the
//! device straight from the checkpoint and holds no CPU copy of the LM (`Engine::cpu_lm` is `None`);
//! moved to the CPU (`with_options`), it builds that copy from its bundle once, shares it with every
//! engine made from it, and its CPU sessions are the CPU engine's frame for frame, bit for bit. An
//! engine over device weights alone refuses the move. Skips with a printed reason when no adapter
//! exists; `MOSHI_REQUIRE_GPU=1` (CI) makes that a failure.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use model::sampling::SamplerConfig;
use runtime::{Device, Engine, EngineOptions, FrameEvent, RuntimeError, Session, SessionOptions};

fn bundle() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/lm")
}

fn gpu_options() -> EngineOptions {
    EngineOptions {
        device: Device::Gpu {
            adapter: None,
            threads: 1,
        },
        ..Default::default()
    }
}

/// Every frame of a seeded session over `frames` frames of a chirp (timings cleared).
fn frames(engine: &Arc<Engine>, frames: usize) -> Vec<FrameEvent> {
    let opts = SessionOptions {
        sampling: SamplerConfig::seeded(11),
        max_queued_frames: frames,
        ..Default::default()
    };
    let mut s = Session::new(engine.clone(), opts).unwrap();
    let pcm: Vec<f32> = (0..frames * runtime::FRAME_SIZE)
        .map(|i| 0.3 * (i as f32 * 0.013 * (1.0 + i as f32 * 1e-5)).sin())
        .collect();
    let out = runtime::testing::frames_of(&mut s, &pcm).unwrap();
    assert_eq!(out.len(), frames);
    out
}

#[test]
fn a_gpu_engine_holds_no_cpu_lm_until_a_cpu_driver_asks_for_one() {
    if gpu::skip_test_without_adapter() {
        return;
    }
    let gpu_e = Engine::open(&bundle(), gpu_options()).unwrap();
    let cpu_e = Engine::open(&bundle(), EngineOptions::cpu(1)).unwrap();
    assert!(gpu_e.gpu_adapter().is_some());
    assert!(
        gpu_e.cpu_lm().is_none(),
        "a GPU engine opened from a bundle keeps no CPU copy of the LM"
    );
    assert_eq!(gpu_e.lm_spec(), cpu_e.lm_spec());
    assert_eq!(gpu_e.weight_format(), cpu_e.weight_format());
    // A GPU session does not build it either.
    drop(Session::new(gpu_e.clone(), SessionOptions::default()).unwrap());
    assert!(gpu_e.cpu_lm().is_none());

    let moved = gpu_e.with_options(EngineOptions::cpu(1)).unwrap();
    assert!(moved.gpu_adapter().is_none());
    let built = gpu_e.cpu_lm().expect("built for the CPU driver and kept");
    let again = gpu_e.with_options(EngineOptions::cpu(2)).unwrap();
    for e in [&moved, &again] {
        assert!(
            Arc::ptr_eq(&built, &e.cpu_lm().unwrap()),
            "built once, shared"
        );
    }
    assert_eq!(frames(&moved, 8), frames(&cpu_e, 8));
}

#[test]
fn an_engine_over_device_weights_alone_stays_on_the_gpu() {
    if gpu::skip_test_without_adapter() {
        return;
    }
    let m = model::MoshiModel::open(&bundle()).unwrap();
    let ctx =
        gpu::GpuContext::new(gpu::AdapterChoice::Gpu(None), gpu::GpuOptions::default()).unwrap();
    let w = gpu::GpuLmWeights::upload(&ctx, &m.lm).unwrap();
    let e = Engine::from_device_weights(
        w,
        m.lm.weight_format(),
        Arc::new(m.mimi),
        Some(Arc::new(m.tokenizer)),
        gpu_options(),
    )
    .unwrap();
    assert!(e.cpu_lm().is_none());
    let cpu = e.with_options(EngineOptions::cpu(1));
    assert!(
        matches!(cpu, Err(RuntimeError::InvalidOption(_))),
        "{cpu:?}"
    );
    assert!(e.with_options(gpu_options()).is_ok());
}
