//! Steady-state push / pull and Mimi frames through the C ABI allocate nothing (counting allocator).
//!
//! One test in this binary: the counter sees every thread (pool workers included) but the harness's `main`.

mod common;

use std::ptr::null_mut;

use common::*;
use moshi_native::*;
use testkit::all_thread_allocations_during as allocations;

#[global_allocator]
static GLOBAL: testkit::CountingAlloc = testkit::CountingAlloc;

/// Pushes `pcm` half a frame at a time and pulls every ready frame; returns the frames pulled.
///
/// # Safety
/// `session` is a live session handle.
unsafe fn drive(session: *mut MnSession, pcm: &[f32], frame: &mut MnFrame) -> usize {
    let mut frames = 0;
    for chunk in pcm.chunks(MN_FRAME_SIZE / 2) {
        // SAFETY: live handle, valid buffers.
        unsafe {
            expect(
                mn_session_push(session, chunk.as_ptr(), chunk.len(), null_mut()),
                MnStatus::Ok,
            );
            while mn_session_pull(session, frame) == MnStatus::Ok {
                std::hint::black_box((frame.pcm_len, frame.text_len));
                frames += 1;
            }
        }
    }
    frames
}

#[test]
fn steady_state_calls_do_not_allocate() {
    // The counting allocator is installed and sees other threads (not the harness's own `main` thread, which
    // allocates at unpredictable moments).
    assert!(testkit::other_thread_probe(|f| allocations(f)) >= 1);
    // SAFETY: valid handles and buffers throughout.
    unsafe {
        for (threads, rate) in [(1, 24_000), (2, 48_000)] {
            let engine = open_engine(threads);
            let mut opts = session_options();
            opts.output_rate = rate;
            opts.max_queued_frames = 2;
            let mut session = null_mut();
            expect(mn_session_create(engine, &opts, &mut session), MnStatus::Ok);
            let pcm = signal(100);
            let mut frame = new_frame();
            // Warm-up past the tiny LM's and Mimi's contexts (their KV rings wrap).
            assert_eq!(drive(session, &pcm[..40 * MN_FRAME_SIZE], &mut frame), 40);
            let mut next = 40;
            let allocs = allocations(|| {
                let window = &pcm[next * MN_FRAME_SIZE..(next + 20) * MN_FRAME_SIZE];
                assert_eq!(drive(session, window, &mut frame), 20);
                next += 20;
            });
            assert_eq!(
                allocs, 0,
                "{allocs} allocations over 20 frames ({threads} threads, {rate} Hz)"
            );
            // Controls are atomics only.
            let allocs = allocations(|| {
                let mut epoch = 0;
                expect(mn_session_interrupt(session, &mut epoch), MnStatus::Ok);
                expect(mn_session_pause(session), MnStatus::Ok);
                expect(mn_session_resume(session), MnStatus::Ok);
            });
            assert_eq!(allocs, 0);
            expect(mn_session_destroy(session), MnStatus::Ok);
            expect(mn_engine_destroy(engine), MnStatus::Ok);

            let mut mimi = null_mut();
            let dir = c_path(fixtures().join("lm"));
            expect(
                mn_mimi_open(dir.as_ptr(), std::ptr::null(), 0, threads, &mut mimi),
                MnStatus::Ok,
            );
            let mut codes = [0u32; 8];
            let mut out = vec![0f32; MN_FRAME_SIZE];
            let mut frame_pass = |f: usize| {
                let s = &pcm[f * MN_FRAME_SIZE..(f + 1) * MN_FRAME_SIZE];
                expect(
                    mn_mimi_encode_frame(mimi, s.as_ptr(), MN_FRAME_SIZE, codes.as_mut_ptr(), 8),
                    MnStatus::Ok,
                );
                expect(
                    mn_mimi_decode_frame(mimi, codes.as_ptr(), 8, out.as_mut_ptr(), MN_FRAME_SIZE),
                    MnStatus::Ok,
                );
            };
            (0..20).for_each(&mut frame_pass);
            let mut next = 20;
            let allocs = allocations(|| {
                (next..next + 20).for_each(&mut frame_pass);
                next += 20;
            });
            assert_eq!(
                allocs, 0,
                "{allocs} allocations over 20 Mimi frames ({threads} threads)"
            );
            expect(mn_mimi_destroy(mimi), MnStatus::Ok);
        }
    }
}
