//! Heap allocations per frame on every server thread that touches a frame, counted after warm-up with a
//! global allocator that sorts threads by name:
//!
//! - the server's tokio runtime (`srv-io`: WebSocket reads and writes, Ogg demuxing, Opus decoding, the
//!   input queue),
//! - the model threads (`moshi-session` / `moshi-batch` and their pool's `moshi-kernels-*`),
//! - the per-client output thread (`moshi-ws-out`: Opus encoding, outgoing messages).
//!
//! The test client (its encoder, its WebSocket, its reader) runs on a runtime of its own (`client`
//! threads and the test thread), which is not counted. One test in this binary.
//!
//! The server runtime has one worker here, where `serve` has two: with two, the socket's read and write
//! halves (`futures_util` `split`, a `BiLock`) can be polled at the same instant, and the half that finds the
//! other one holding the lock boxes its waker (one allocation per meeting; 0–5 per 60 frames measured with
//! `TESTKIT_ALLOC_BACKTRACES=1`). Those meetings depend on scheduling, not on the queues, so no bound from
//! the design covers them; this test pins everything else.

mod common;

use std::sync::atomic::AtomicBool;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use server::backend::{BackendInfo, RuntimeBackend};
use server::ServeConfig;
use testkit::{class_allocations, classify_threads, start_counting, stop_counting};

#[global_allocator]
static GLOBAL: testkit::CountingAlloc = testkit::CountingAlloc;

/// Thread class of the model threads (`moshi-session`, `moshi-batch`, `moshi-kernels-*`).
const MODEL: usize = 0;
/// Thread class of the per-client output thread (`moshi-ws-out`).
const OUT: usize = 1;
/// Thread class of the server's tokio runtime (`srv-io`).
const IO: usize = 2;

/// Name of the server runtime's threads (workers and blocking threads).
const SERVER_THREADS: &str = "srv-io";

/// The server's threads are counted; the client's, the test thread and the harness are not.
fn thread_kind(name: Option<&str>) -> Option<usize> {
    match name {
        Some("moshi-ws-out") => Some(OUT),
        Some(n) if n.starts_with("moshi-") => Some(MODEL),
        Some(SERVER_THREADS) => Some(IO),
        _ => None,
    }
}

fn backend(batch: usize) -> Arc<RuntimeBackend> {
    let engine = tiny_engine();
    let mut b = RuntimeBackend::new(engine, BackendInfo::default());
    b.batch = batch;
    Arc::new(b)
}

/// Input frames the client sends (80 ms each, at twice real time).
const FRAMES: usize = 120;
/// Counts from this value of `frames_processed` (past the tiny model's contexts: its KV rings have
/// wrapped) to `LAST` or the end of the conversation, whichever comes first.
const FIRST: u64 = 30;
const LAST: u64 = 90;
/// Fewest frames a count must span.
const MIN_FRAMES: u64 = 50;

/// Bound on the allocations of all server threads together over the counted frames, from the design:
///
/// - Model threads: a frame's event reuses the text and PCM buffers of one the output thread recycled. Only
///   when none is back yet does the worker make a new event (a `String` and a `Vec`). At most the event
///   queue's capacity (16) plus the one the worker fills and the one the output thread holds circulate, and
///   the queue fills long before frame 30 only if the output thread falls behind: 2 × 18 allocations at
///   most, in the whole session.
/// - Output thread: Opus packets and Ogg pages go into reused buffers; outgoing messages are carved from one
///   64 KiB buffer that is reclaimed once the WebSocket writer dropped them. A reclaim fails only while a
///   message is still in flight, then one new buffer: at most one per carve, i.e. per outgoing message, and
///   only while messages are in flight; in practice about once per 250 frames.
/// - Server runtime: the incoming Ogg pages are demuxed in place into recycled packet buffers and decoded
///   into a reused buffer, the input queue is a preallocated ring, and the outgoing messages pass through
///   the per-client channel (`OUT_QUEUE` = 64 slots, allocated by tokio in blocks of 32 that are reused once
///   read) into the WebSocket writer's reused buffer: a block can be new only when the channel holds more
///   unread messages than ever before, at most 64 / 32 blocks.
///
/// None of these grows with the number of frames, so the whole is bounded by one event queue and one
/// outgoing channel's worth of buffers, whatever the run length: `2 × 18 + 64 / 32 + 1` = 39 for one
/// conversation. A per-frame allocation anywhere (one per frame on any of these threads) gives at least
/// `MIN_FRAMES` = 50 over a count and fails.
const BOUND: usize = 2 * (16 + 2) + 64 / 32 + 1;

#[test]
fn server_threads_allocate_within_the_queues_bound() {
    classify_threads(thread_kind);
    let server_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name(SERVER_THREADS)
        .enable_all()
        .build()
        .unwrap();
    let client_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("client")
        .enable_all()
        .build()
        .unwrap();
    for batch in [1, 2] {
        let srv = server_rt.block_on(start(
            ServeConfig {
                max_sessions: 2,
                ..ServeConfig::default()
            },
            backend(batch),
        ));
        let metrics = srv.metrics.clone();
        let done = Arc::new(AtomicBool::new(false));
        let finished = done.clone();
        // The meter runs on its own (uncounted) thread, polling the server's frame counter.
        let counter = std::thread::Builder::new()
            .name("meter".into())
            .spawn(move || {
                let frames = || metrics.frames_processed.load(Relaxed);
                while frames() < FIRST && !finished.load(Relaxed) {
                    std::thread::sleep(Duration::from_millis(2));
                }
                let start = frames();
                start_counting();
                while frames() < LAST && !finished.load(Relaxed) {
                    std::thread::sleep(Duration::from_millis(2));
                }
                stop_counting();
                let counted = frames() - start;
                (
                    [MODEL, OUT, IO].map(class_allocations),
                    counted,
                    metrics.frames_dropped.load(Relaxed),
                )
            })
            .unwrap();
        let url = srv.url("");
        let r = client_rt.block_on(async move {
            let mut ws = connect(&url).await;
            expect_ready(&mut ws).await;
            converse(
                ws,
                FRAMES,
                Duration::from_millis(40),
                true,
                Duration::from_millis(800),
            )
            .await
        });
        done.store(true, Relaxed);
        assert!(r.errors.is_empty(), "{:?}", r.errors);
        let ([model, out, io], frames, dropped) = counter.join().unwrap();
        eprintln!(
            "batch {batch}: {model} allocations on model threads, {out} on the output thread, {io} on the \
             server runtime, over {frames} frames ({dropped} input frames dropped)"
        );
        assert!(frames >= MIN_FRAMES, "only {frames} frames counted");
        let total = model + out + io;
        assert!(
            total <= BOUND,
            "batch {batch}: {total} allocations on the server's threads over {frames} frames \
             (model {model}, output {out}, runtime {io}); the design allows {BOUND}"
        );
        server_rt.block_on(srv.shutdown()).unwrap();
    }
}
