//! Zero heap allocations per frame after warm-up (counting global allocator, tiny bundle).
//!
//! This binary holds a single test so that no other test thread allocates while counting; the counter is
//! global (all threads), which also covers the session's pool workers.

mod common;

use common::*;
use runtime::{EngineOptions, Session, SessionOptions, SessionRunner, Step, FRAME_SIZE};
use testkit::all_thread_allocations_during as allocations;

#[global_allocator]
static GLOBAL: testkit::CountingAlloc = testkit::CountingAlloc;

fn count_frames(session: &mut Session, pcm: &[f32]) -> (usize, usize) {
    let mut frames = 0;
    let allocs = allocations(|| {
        for chunk in pcm.chunks(FRAME_SIZE / 2) {
            session.push_pcm(chunk).unwrap();
            while let Step::Frame(f) = session.step().unwrap() {
                std::hint::black_box((f.pcm.len(), f.text.len(), f.text_token));
                frames += 1;
            }
        }
    });
    (allocs, frames)
}

#[test]
fn steady_state_frames_do_not_allocate() {
    // The counter itself works and sees other threads (the harness's own `main` thread is left out: it
    // allocates at unpredictable moments, e.g. its 60-second "still running" notice under load).
    assert!(testkit::other_thread_probe(|f| allocations(f)) >= 1);
    // Sampling (not greedy) so the sampler's paths are exercised; a small queue, which bursts of
    // input overfill, so drops happen too.
    // Two threads and a 48 kHz output exercise the pool workers and the output resampler.
    for (threads, output_rate) in [(1, 24_000), (2, 48_000)] {
        let engine = runtime::Engine::open(&bundle_dir(), EngineOptions::cpu(threads)).unwrap();
        let opts = SessionOptions {
            max_queued_frames: 2,
            output_rate,
            ..sampled(3)
        };
        let mut s = Session::new(engine, opts).unwrap();
        let pcm = signal(260, 31);
        // Warm-up: 40 frames (past the tiny LM's 10-step and Mimi's 8-step contexts, so the KV rings wrap).
        let (_, warm) = count_frames(&mut s, &pcm[..40 * FRAME_SIZE]);
        assert_eq!(warm, 40);
        let (allocs, frames) = count_frames(&mut s, &pcm[40 * FRAME_SIZE..]);
        assert_eq!(frames, 220);
        assert_eq!(
            allocs, 0,
            "{allocs} heap allocations over {frames} steady-state frames ({threads} threads)"
        );
        // Bursts of four frames into the two-frame queue: the oldest two of each are dropped,
        // without allocating either.
        let (mut frames, mut dropped) = (0, 0);
        let allocs = allocations(|| {
            for burst in pcm[..40 * FRAME_SIZE].chunks(4 * FRAME_SIZE) {
                dropped += s.push_pcm(burst).unwrap().frames_dropped as usize;
                while let Step::Frame(f) = s.step().unwrap() {
                    std::hint::black_box((f.pcm.len(), f.text.len(), f.text_token));
                    frames += 1;
                }
            }
        });
        assert!(dropped > 0, "the bursts overfilled the queue");
        assert_eq!(frames + dropped, 40);
        assert_eq!(
            allocs, 0,
            "{allocs} heap allocations with drops ({threads} threads)"
        );
        // Commands between frames do not allocate either.
        s.interrupt();
        s.pause();
        s.resume();
        s.reset();
        let (allocs, frames) = count_frames(&mut s, &pcm[..30 * FRAME_SIZE]);
        assert_eq!(
            (allocs, frames),
            (0, 30),
            "after commands ({threads} threads)"
        );
    }

    // The threaded driver: producer → worker → events, with every frame's buffers recycled.
    let session = Session::new(
        engine(),
        SessionOptions {
            max_queued_frames: 4,
            ..sampled(5)
        },
    )
    .unwrap();
    let mut r = SessionRunner::spawn(session, 4).unwrap();
    let mut mic = r.producer().unwrap();
    let ev = r.events().unwrap();
    let pcm = signal(240, 32);
    let mut run_frames = |frames: std::ops::Range<usize>| {
        let mut n = 0;
        for f in frames {
            push_and_recycle(&mut mic, &ev, &pcm[f * FRAME_SIZE..(f + 1) * FRAME_SIZE]);
            n += 1;
        }
        n
    };
    assert_eq!(run_frames(0..40), 40);
    let mut n = 0;
    let allocs = allocations(|| n = run_frames(40..240));
    assert_eq!((allocs, n), (0, 200), "threaded path with recycled events");
    r.stop().unwrap();
}
