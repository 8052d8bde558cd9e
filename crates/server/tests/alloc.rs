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
//! The server runtime has as many workers as `serve`'s ([`server::WORKER_THREADS`]): a connection's socket
//! is owned by one task, so no two workers ever meet on it (two tasks sharing a split socket do, and the
//! one that finds the other holding the lock boxes its waker: an allocation per meeting, at the mercy of
//! scheduling).

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

/// Most input frames the client sends (80 ms each, at twice real time). It stops as soon as the count
/// is over, which takes `FIRST + SPAN` processed frames plus whatever input the server dropped while it fell
/// behind (a loaded machine); this cap only ends a run whose server stopped processing.
const MAX_FRAMES: usize = 750;
/// Counting starts once `frames_processed` reached this (past the tiny model's contexts: its KV rings
/// have wrapped) and lasts `SPAN` processed frames.
const FIRST: u64 = 30;
const SPAN: u64 = 90;

/// Largest message the output thread carves: the kind byte and the Ogg pages of one frame's two 40 ms
/// Opus packets, each page at most 27 header bytes, 16 lacing values and 4,000 packet bytes (the encoder's
/// packet buffer); a text message carries one frame's text, far less.
const LARGEST_MESSAGE: usize = 1 + 2 * (27 + 16 + 4000);

/// Bound on the allocations of all server threads together over the counted frames, from the design,
/// given the bytes of the messages the output thread carved in the whole conversation (`carved`):
///
/// - Model threads: a frame's event reuses the text and PCM buffers of one the output thread recycled. Only
///   when none is back yet does the worker make a new event (a `String` and a `Vec`). At most the event
///   queue's capacity (16) plus the one the worker fills and the one the output thread holds circulate:
///   2 × 18 allocations at most, in the whole session.
/// - Output thread: Opus packets and Ogg pages go into reused buffers; outgoing messages are carved from one
///   buffer of `WIRE_BUFFER` bytes, which is reserved again (reclaimed if the socket dropped every message
///   cut from it, else one new buffer: one allocation at most) only when less than the next message is
///   left. Between two reserves at least `WIRE_BUFFER - LARGEST_MESSAGE` bytes were carved, so a count
///   sees at most `1 + carved / (WIRE_BUFFER - LARGEST_MESSAGE)` (1 for ~200 frames of speech).
/// - Server runtime: a client message is read into the socket's read buffer, whose space is reclaimed once
///   the message is dropped (before the next read); its Ogg pages are demuxed in place into recycled packet
///   buffers and decoded into a reused buffer; the input queue is a preallocated ring. The outgoing
///   messages pass through the per-client channel (`OUT_QUEUE` = 64 slots, allocated by tokio in blocks of
///   32 that are reused once read: a block can be new only when the channel holds more unread messages
///   than ever before, at most `OUT_QUEUE / 32` blocks) into the socket's write buffer. That buffer holds
///   one frame at a time (each is flushed before the next, plus at most a pong of ≤ 127 bytes), and grows
///   only for a frame longer than its capacity, to at least twice that: starting from ≥ 1 byte, at most
///   `WRITE_BUFFER_GROWTHS` times in a session.
///
/// None of these grows with the number of frames: for a conversation that carves less than
/// `WIRE_BUFFER - LARGEST_MESSAGE` ≈ 56 KiB (this one carves ~43 KB) the bound is `2 × 18 + 64 / 32 + 14 + 1`
/// = 53, and a per-frame allocation anywhere (one per frame on any of these
/// threads) gives at least `SPAN` = 90 over a count and fails.
fn bound(carved: usize) -> usize {
    2 * (16 + 2)
        + server::OUT_QUEUE / 32
        + WRITE_BUFFER_GROWTHS
        + 1
        + carved / (server::WIRE_BUFFER - LARGEST_MESSAGE)
}

/// Doublings from 1 byte to the longest WebSocket frame (the largest message, a 14-byte frame header and a
/// pong): its bit length, 14.
const WRITE_BUFFER_GROWTHS: usize =
    (usize::BITS - (LARGEST_MESSAGE + 14 + 127).leading_zeros()) as usize;

#[test]
fn server_threads_allocate_within_the_queues_bound() {
    classify_threads(thread_kind);
    let server_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(server::WORKER_THREADS)
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
        let count_done = Arc::new(AtomicBool::new(false));
        let count_over = count_done.clone();
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
                while frames() < start + SPAN && !finished.load(Relaxed) {
                    std::thread::sleep(Duration::from_millis(2));
                }
                stop_counting();
                count_over.store(true, Relaxed);
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
            converse_until(
                ws,
                MAX_FRAMES,
                Duration::from_millis(40),
                true,
                Duration::from_millis(800),
                || count_done.load(Relaxed),
            )
            .await
        });
        done.store(true, Relaxed);
        assert!(r.errors.is_empty(), "{:?}", r.errors);
        let ([model, out, io], frames, dropped) = counter.join().unwrap();
        // Every carved message reached the client or was dropped from the full queue (and then counted).
        let carved =
            r.message_bytes + srv.metrics.messages_dropped.load(Relaxed) as usize * LARGEST_MESSAGE;
        let bound = bound(carved);
        eprintln!(
            "batch {batch}: {model} allocations on model threads, {out} on the output thread, {io} on the \
             server runtime, over {frames} frames ({dropped} input frames dropped, {carved} bytes carved)"
        );
        assert!(frames >= SPAN, "only {frames} frames counted");
        let total = model + out + io;
        assert!(
            total <= bound,
            "batch {batch}: {total} allocations on the server's threads over {frames} frames \
             (model {model}, output {out}, runtime {io}); the design allows {bound} ({carved} bytes carved)"
        );
        server_rt.block_on(srv.shutdown()).unwrap();
    }
}
