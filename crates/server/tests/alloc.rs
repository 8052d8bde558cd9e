//! Heap allocations per frame on the server's own threads (the model worker and the per-client output thread
//! that Opus-encodes), counted after warm-up with a global allocator that only counts on those threads.
//! One test in this binary.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::path::PathBuf;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use server::backend::{BackendInfo, RuntimeBackend};
use server::ServeConfig;

struct Counting;

static COUNTING: AtomicBool = AtomicBool::new(false);
static ALLOCS: AtomicU64 = AtomicU64::new(0);
static OUT_ALLOCS: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// 0 = not looked at yet, 1 = looking (allocations while looking are not counted), 2 = count, 3 = ignore.
    static KIND: Cell<u8> = const { Cell::new(0) };
}

/// 2 = a model thread, 4 = an output thread, else not counted.
fn thread_kind() -> u8 {
    KIND.with(|k| match k.get() {
        0 => {
            k.set(1);
            let kind = match std::thread::current().name() {
                Some("moshi-ws-out") => 4,
                Some(n) if n.starts_with("moshi-") => 2,
                _ => 3,
            };
            k.set(kind);
            kind
        }
        kind => kind,
    })
}

fn count() {
    if COUNTING.load(Relaxed) {
        match thread_kind() {
            2 => ALLOCS.fetch_add(1, Relaxed),
            4 => OUT_ALLOCS.fetch_add(1, Relaxed),
            _ => 0,
        };
    }
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count();
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count();
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count();
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn backend(batch: usize) -> Arc<RuntimeBackend> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/lm");
    let engine =
        runtime::Engine::open(&dir, runtime::EngineOptions::default()).expect("tiny bundle");
    let mut b = RuntimeBackend::new(engine, BackendInfo::default());
    b.batch = batch;
    Arc::new(b)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_threads_allocate_nothing_per_frame() {
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
            ALLOCS.store(0, Relaxed);
            OUT_ALLOCS.store(0, Relaxed);
            COUNTING.store(true, Relaxed);
            while metrics.frames_processed.load(Relaxed) < 90 {
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            COUNTING.store(false, Relaxed);
            (
                ALLOCS.load(Relaxed),
                OUT_ALLOCS.load(Relaxed),
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
