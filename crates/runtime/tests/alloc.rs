//! Zero heap allocations per frame after warm-up (counting global allocator, tiny bundle).
//!
//! This binary holds a single test so that no other test thread allocates while counting; the counter is
//! global (all threads), which also covers the session's pool workers.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use common::*;
use runtime::{EngineOptions, Event, Session, SessionOptions, SessionRunner, Step, FRAME_SIZE};

struct Counting;

static COUNTING: AtomicBool = AtomicBool::new(false);
static ALLOCS: AtomicU64 = AtomicU64::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
            ALLOCS.fetch_add(1, Ordering::Relaxed);
        }
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
            ALLOCS.fetch_add(1, Ordering::Relaxed);
        }
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
            ALLOCS.fetch_add(1, Ordering::Relaxed);
        }
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn count_frames(session: &mut Session, pcm: &[f32]) -> (u64, usize) {
    let mut frames = 0;
    ALLOCS.store(0, Ordering::SeqCst);
    COUNTING.store(true, Ordering::SeqCst);
    for chunk in pcm.chunks(FRAME_SIZE / 2) {
        session.push_pcm(chunk).unwrap();
        while let Step::Frame(f) = session.step().unwrap() {
            std::hint::black_box((f.pcm.len(), f.text.len(), f.text_token));
            frames += 1;
        }
    }
    COUNTING.store(false, Ordering::SeqCst);
    (ALLOCS.load(Ordering::SeqCst), frames)
}

#[test]
fn steady_state_frames_do_not_allocate() {
    // The counter itself works.
    ALLOCS.store(0, Ordering::SeqCst);
    COUNTING.store(true, Ordering::SeqCst);
    std::hint::black_box(Box::new(7u64));
    COUNTING.store(false, Ordering::SeqCst);
    assert_eq!(ALLOCS.load(Ordering::SeqCst), 1);
    // Sampling (not greedy) so the sampler's paths are exercised; a small queue so drops happen too.
    // Two threads and a 48 kHz output exercise the pool workers and the output resampler.
    for (threads, output_rate) in [(1, 24_000), (2, 48_000)] {
        let engine = runtime::Engine::open(
            &bundle_dir(),
            EngineOptions {
                threads,
                ..Default::default()
            },
        )
        .unwrap();
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
            mic.push(&pcm[f * FRAME_SIZE..(f + 1) * FRAME_SIZE]);
            match ev.recv() {
                Some(Event::Frame(e)) => {
                    std::hint::black_box(e.pcm.len());
                    ev.recycle(e);
                    n += 1;
                }
                other => panic!("{other:?}"),
            }
        }
        n
    };
    assert_eq!(run_frames(0..40), 40);
    ALLOCS.store(0, Ordering::SeqCst);
    COUNTING.store(true, Ordering::SeqCst);
    let n = run_frames(40..240);
    COUNTING.store(false, Ordering::SeqCst);
    let allocs = ALLOCS.load(Ordering::SeqCst);
    assert_eq!((allocs, n), (0, 200), "threaded path with recycled events");
    r.stop().unwrap();
}
