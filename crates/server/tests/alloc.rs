//! Heap allocations per frame on the server's own threads (the model worker and the per-client output thread
//! that Opus-encodes), counted after warm-up with a global allocator that only counts on those threads.
//! One test in this binary.

mod common;

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use server::backend::{BackendInfo, RuntimeBackend};
use server::ServeConfig;
use testkit::{class_allocations, classify_threads, start_counting, stop_counting};

#[global_allocator]
static GLOBAL: testkit::CountingAlloc = testkit::CountingAlloc;

/// Thread class of the model threads (named `moshi-*`).
const MODEL: usize = 0;
/// Thread class of the per-client output thread (`moshi-ws-out`).
const OUT: usize = 1;

/// Model threads and the output thread are counted; every other thread is not.
fn thread_kind(name: Option<&str>) -> Option<usize> {
    match name {
        Some("moshi-ws-out") => Some(OUT),
        Some(n) if n.starts_with("moshi-") => Some(MODEL),
        _ => None,
    }
}

fn backend(batch: usize) -> Arc<RuntimeBackend> {
    let engine = tiny_engine();
    let mut b = RuntimeBackend::new(engine, BackendInfo::default());
    b.batch = batch;
    Arc::new(b)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_threads_allocate_nothing_per_frame() {
    classify_threads(thread_kind);
    for batch in [1, 2] {
        let srv = start(
            ServeConfig {
                max_sessions: 2,
                ..ServeConfig::default()
            },
            backend(batch),
        )
        .await;
        let mut ws = connect(&srv.url("")).await;
        expect_ready(&mut ws).await;
        let metrics = srv.metrics.clone();
        // Count between frame 30 (past the tiny model's contexts) and the end of the input.
        let counter = tokio::spawn(async move {
            while metrics.frames_processed.load(Relaxed) < 30 {
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            let start = metrics.frames_processed.load(Relaxed);
            start_counting();
            while metrics.frames_processed.load(Relaxed) < 90 {
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            stop_counting();
            (
                class_allocations(MODEL),
                class_allocations(OUT),
                metrics.frames_processed.load(Relaxed) - start,
            )
        });
        let r = converse(
            ws,
            100,
            Duration::from_millis(20),
            true,
            Duration::from_millis(800),
        )
        .await;
        assert!(r.errors.is_empty(), "{:?}", r.errors);
        let (allocs, out_allocs, frames) = counter.await.unwrap();
        eprintln!(
            "batch {batch}: {allocs} allocations on model threads, {out_allocs} on the output thread, \
             over {frames} frames"
        );
        assert!(frames >= 50, "{frames}");
        // Zero per frame: a frame reuses the buffers of one the output thread handed back. Only when the
        // output thread still holds every buffer (a CPU hiccup) does the worker make a new one (a String and a
        // Vec), and at most the event queue's worth of buffers ever circulates.
        assert!(
            allocs <= 40,
            "batch {batch}: {allocs} model-thread allocations over {frames} frames"
        );
        // The output thread: Opus packets and Ogg pages go into reused buffers, and the outgoing messages are
        // carved from one buffer that is reclaimed once the WebSocket writer dropped them. A reclaim can fail if
        // a message is still in flight at that moment (then one new buffer), about once per 250 frames.
        assert!(
            out_allocs <= 4,
            "batch {batch}: {out_allocs} output-thread allocations over {frames} frames"
        );
        srv.shutdown().await.unwrap();
    }
}
