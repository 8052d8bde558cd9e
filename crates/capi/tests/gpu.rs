//! The device choice of the C ABI (`MnEngineOptions::device`, `gpu_adapter`): an unknown device or a
//! negative adapter is `MN_STATUS_INVALID_ARGUMENT`, an adapter that does not exist is `MN_STATUS_DEVICE`,
//! the speech-to-text engine refuses the GPU with a status; and an engine opened with `MN_DEVICE_GPU`
//! gives the CPU engine's tokens exactly and its samples within Mimi's parity tolerance, frame by frame,
//! with seeded sampling (the GPU parity's bound). The GPU run skips with a printed reason when wgpu finds
//! no adapter; `MOSHI_REQUIRE_GPU=1` (CI, lavapipe) makes that a failure.

mod common;

use std::ptr::{null, null_mut};

use common::*;
use moshi_native::*;
use testkit::compare::max_abs_diff;

fn default_options() -> MnEngineOptions {
    let mut opts = std::mem::MaybeUninit::<MnEngineOptions>::uninit();
    // SAFETY: valid pointer; initialised by the default function.
    unsafe {
        expect(mn_engine_options_default(opts.as_mut_ptr()), MnStatus::Ok);
        opts.assume_init()
    }
}

#[test]
fn the_device_choice_is_checked_with_typed_statuses() {
    let opts = default_options();
    assert_eq!(opts.device, MN_DEVICE_CPU, "the default device is the CPU");
    assert_eq!(opts.gpu_adapter, -1, "the default adapter is the best one");
    let dir = c_path(fixtures().join("lm"));
    // SAFETY: valid pointers.
    unsafe {
        let mut engine = null_mut();
        let mut wrong = opts;
        wrong.device = 7;
        expect(
            mn_engine_open(dir.as_ptr(), &wrong, &mut engine),
            MnStatus::InvalidArgument,
        );
        assert!(last_error().contains("device 7"), "{}", last_error());
        let mut wrong = opts;
        wrong.device = MN_DEVICE_GPU;
        wrong.gpu_adapter = -2;
        expect(
            mn_engine_open(dir.as_ptr(), &wrong, &mut engine),
            MnStatus::InvalidArgument,
        );
        assert!(last_error().contains("gpu_adapter -2"), "{}", last_error());
        // No machine has adapter 4095: the device cannot be opened, whatever adapters exist.
        wrong.gpu_adapter = 4095;
        expect(
            mn_engine_open(dir.as_ptr(), &wrong, &mut engine),
            MnStatus::Device,
        );
        assert!(engine.is_null());

        // The transcriber runs on the CPU only: the GPU is refused before any weight is read.
        let mut stt = null_mut();
        let mut gpu = opts;
        gpu.device = MN_DEVICE_GPU;
        expect(
            mn_stt_engine_open(null(), &gpu, &mut stt),
            MnStatus::InvalidArgument,
        );
        assert!(stt.is_null());
    }
}

/// Tokens and samples of `frames` frames of `signal` through a session on an engine with `opts`.
fn run(opts: &MnEngineOptions, frames: usize) -> (Vec<(i32, [i32; 8])>, Vec<f32>) {
    let dir = c_path(fixtures().join("lm"));
    let mut session_opts = session_options();
    session_opts.seed = 1234;
    let (mut tokens, mut pcm) = (Vec::new(), Vec::new());
    // SAFETY: valid pointers; the frame's buffers are read before the next pull.
    unsafe {
        let mut engine = null_mut();
        expect(
            mn_engine_open(dir.as_ptr(), opts, &mut engine),
            MnStatus::Ok,
        );
        let mut device = u32::MAX;
        expect(mn_engine_device(engine, &mut device), MnStatus::Ok);
        assert_eq!(device, opts.device, "the engine runs where it was asked to");
        expect(mn_engine_device(engine, null_mut()), MnStatus::Null);
        let mut session = null_mut();
        expect(
            mn_session_create(engine, &session_opts, &mut session),
            MnStatus::Ok,
        );
        let input = signal(frames);
        let mut frame = new_frame();
        // One frame at a time, as a live caller does (the input queue holds a few frames only).
        for chunk in input.chunks(MN_FRAME_SIZE) {
            expect(
                mn_session_push(session, chunk.as_ptr(), chunk.len(), null_mut()),
                MnStatus::Ok,
            );
            expect(mn_session_pull(session, &mut frame), MnStatus::Ok);
            tokens.push((frame.text_token, frame.audio_tokens));
            pcm.extend_from_slice(std::slice::from_raw_parts(frame.pcm, frame.pcm_len));
        }
        close_session(engine, session);
    }
    (tokens, pcm)
}

#[test]
fn an_engine_on_the_gpu_gives_the_cpu_engine_s_tokens() {
    if gpu::skip_test_without_adapter() {
        return;
    }
    let frames = 12;
    let cpu = default_options();
    let mut on_gpu = cpu;
    on_gpu.device = MN_DEVICE_GPU;
    let (cpu_tokens, cpu_pcm) = run(&cpu, frames);
    let (gpu_tokens, gpu_pcm) = run(&on_gpu, frames);
    assert_eq!(gpu_tokens, cpu_tokens, "tokens, frame by frame");
    // The stream generated audio (else equal tokens would say little).
    assert!(cpu_tokens.iter().filter(|t| t.1[0] >= 0).count() >= frames - 2);
    assert_eq!(gpu_pcm.len(), cpu_pcm.len());
    let err = max_abs_diff(&gpu_pcm, &cpu_pcm);
    eprintln!("GPU vs CPU engine through the C ABI: samples max abs diff {err:e}");
    assert!(err < 1e-4, "samples differ by {err}");
}
