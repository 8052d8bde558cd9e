//! Test-only helpers for moshi-native (a dev-dependency of the other crates, never a
//! dependency of a shipped target).
//!
//! [`CountingAlloc`] is a global allocator that forwards to [`System`] and keeps three
//! independent meters, so the tests that prove "no allocation after warm-up" (and the ones that
//! bound heap growth) share one implementation:
//!
//! - **per-thread counts**, always on: [`thread_allocations`] and [`thread_allocations_during`]
//!   see only the calling thread, so other test threads of the same binary do not interfere
//!   ([`assert_thread_meter_sees_allocations`] proves that the binary installed the allocator);
//! - **all-thread counts**, only between [`start_counting`] and [`stop_counting`]: they also see
//!   pool workers (and any other test's threads, so a binary that uses them should hold a single
//!   test); [`all_thread_allocations_during`] leaves out the harness's own `main` thread, which
//!   allocates at moments of its choosing (e.g. its "running for over 60 seconds" notice);
//! - **per-class counts**, counted with the all-thread counter: after [`classify_threads`] sorts
//!   threads into classes by name, [`class_allocations`] gives the allocations of one class;
//! - **live and peak heap bytes** over all threads: [`live_bytes`] and [`peak_growth_during`].
//!
//! An "allocation" is a call to `alloc`, `alloc_zeroed` or `realloc`; `dealloc` is not counted.
//!
//! To find where counted allocations come from, run a test with `TESTKIT_ALLOC_BACKTRACES=1`: every
//! allocation the all-thread counter sees then records its thread name and a backtrace, and
//! [`stop_counting`] prints them to stderr (the capture itself is not counted).
//!
//! A test binary installs it with
//!
//! ```ignore
//! #[global_allocator]
//! static GLOBAL: testkit::CountingAlloc = testkit::CountingAlloc;
//! ```
//!
//! The meters read zero (or stay still) in a binary that did not install it.
//!
//! [`compare`] measures how far a run's floats are from a reference's, [`naive_attention`] is the
//! f64 attention the attention tests check against; [`TensorFile`] and
//! [`read_wav_f32`] read the oracle's fixture files; [`FORMATS`] lists the weight formats the format sweeps cover
//! and [`mlx_matrix`] builds the MLX ones;
//! [`Forced`] holds the
//! forced runs of the tiny LM; [`ScratchDir`] is a temporary directory that removes itself; [`lm_bundle_copy`] fills one with
//! the tiny LM bundle and [`poke_f32`] damages a weight of such a copy.

#![forbid(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]

mod attention;
pub mod compare;
mod fixture;
mod forced;
pub mod rng;
mod scratch;

pub use attention::naive_attention;
pub use fixture::{fixtures_dir, poke_f32, read_wav_f32, TensorFile};
pub use forced::Forced;
pub use scratch::{lm_bundle_copy, mimi_bundle, ScratchDir};

use kernels::{Matrix, Storage, WeightFormat};

/// Every weight format the tests sweep (CPU kernels and device kernels alike): each the kernels
/// dequantize, MLX affine with 4 and 8 bits and groups of 32 and 64.
pub const FORMATS: [WeightFormat; 8] = [
    WeightFormat::F32,
    WeightFormat::Bf16,
    WeightFormat::F16,
    WeightFormat::Q8_0,
    WeightFormat::Q4_0,
    WeightFormat::MlxAffine { bits: 4, group: 32 },
    WeightFormat::MlxAffine { bits: 4, group: 64 },
    WeightFormat::MlxAffine { bits: 8, group: 64 },
];

/// MLX affine weights of `values` (`rows × cols`, row-major) as a checkpoint holds them (the
/// packed codes, bf16 scales and bf16 biases of `kernels::quant::encode_mlx`), with the CPU
/// matrix built from those bytes.
pub fn mlx_matrix(
    bits: u8,
    group: usize,
    rows: usize,
    cols: usize,
    values: &[f32],
) -> (Matrix, [Vec<u8>; 3]) {
    let (c, s, b) = kernels::quant::encode_mlx(bits, group, rows, cols, values).unwrap();
    let storage = |v: &Vec<u8>| Storage::from_vec(v.clone());
    let m = Matrix::from_mlx(
        bits,
        group,
        rows,
        cols,
        storage(&c),
        storage(&s),
        storage(&b),
    );
    (m.unwrap(), [c, s, b])
}

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};

/// Counting global allocator (forwards every call to [`System`]); see the crate docs.
#[derive(Debug, Clone, Copy, Default)]
pub struct CountingAlloc;

/// How many thread classes [`classify_threads`] can sort threads into (classes `0..THREAD_CLASSES`).
pub const THREAD_CLASSES: usize = 4;

/// `THREAD_CLASS` value of a thread not classified yet.
const UNSEEN: u8 = u8::MAX;
/// `THREAD_CLASS` value while the thread is being classified (its allocations meanwhile are not
/// counted in a class).
const LOOKING: u8 = u8::MAX - 1;
/// `THREAD_CLASS` value of a thread that belongs to no class.
const UNCLASSED: u8 = u8::MAX - 2;

thread_local! {
    /// Allocations made by this thread since it started.
    static THREAD_ALLOCS: Cell<usize> = const { Cell::new(0) };
    /// This thread's class (`0..THREAD_CLASSES`), or [`UNSEEN`] / [`LOOKING`] / [`UNCLASSED`].
    static THREAD_CLASS: Cell<u8> = const { Cell::new(UNSEEN) };
    /// Set while this thread records a backtrace: its own allocations are not counted.
    static IN_TRACE: Cell<bool> = const { Cell::new(false) };
}

/// Whether counted allocations record backtraces (`TESTKIT_ALLOC_BACKTRACES`, read by [`start_counting`]).
static TRACING: AtomicBool = AtomicBool::new(false);
/// Backtraces recorded while [`TRACING`] (printed and cleared by [`stop_counting`]).
static TRACES: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// Thread classifier for [`classify_threads`]: a thread's name to its class.
pub type Classifier = fn(Option<&str>) -> Option<usize>;

/// The thread classifier set by [`classify_threads`].
static CLASSIFY: OnceLock<Classifier> = OnceLock::new();
/// Allocations per thread class while [`COUNTING`] is set.
static CLASS_ALLOCS: [AtomicUsize; THREAD_CLASSES] =
    [const { AtomicUsize::new(0) }; THREAD_CLASSES];

/// Whether the all-thread counter is running.
static COUNTING: AtomicBool = AtomicBool::new(false);
/// Allocations on all threads while [`COUNTING`] is set.
static ALL_ALLOCS: AtomicUsize = AtomicUsize::new(0);
/// Heap bytes currently allocated (all threads).
static LIVE: AtomicUsize = AtomicUsize::new(0);
/// Highest value of [`LIVE`] since the last reset by [`peak_growth_during`].
static PEAK: AtomicUsize = AtomicUsize::new(0);

/// Counts one allocation call (before it is forwarded).
fn count() {
    if IN_TRACE.try_with(Cell::get).unwrap_or(false) {
        return;
    }
    // `try_with`: during thread teardown the slot may be gone; such allocations are not counted.
    let _ = THREAD_ALLOCS.try_with(|c| c.set(c.get() + 1));
    if COUNTING.load(Ordering::Relaxed) {
        ALL_ALLOCS.fetch_add(1, Ordering::Relaxed);
        if let Some(class) = thread_class() {
            CLASS_ALLOCS[class].fetch_add(1, Ordering::Relaxed);
        }
        if TRACING.load(Ordering::Relaxed) {
            record_backtrace();
        }
    }
}

/// Records the calling thread's name and backtrace in [`TRACES`] (debugging aid; see the crate docs).
#[cold]
fn record_backtrace() {
    if IN_TRACE.try_with(|t| t.set(true)).is_err() {
        return;
    }
    let trace = format!(
        "allocation on thread {:?}:\n{}",
        std::thread::current().name(),
        std::backtrace::Backtrace::force_capture()
    );
    if let Ok(mut traces) = TRACES.lock() {
        traces.push(trace);
    }
    let _ = IN_TRACE.try_with(|t| t.set(false));
}

/// The calling thread's class, classifying it by name on first use (only ever while counting).
fn thread_class() -> Option<usize> {
    let classify = CLASSIFY.get()?;
    let class = THREAD_CLASS
        .try_with(|k| match k.get() {
            UNSEEN => {
                // Looking up the name may allocate: those allocations see `LOOKING`.
                k.set(LOOKING);
                let class = classify(std::thread::current().name())
                    .filter(|&c| c < THREAD_CLASSES)
                    .map_or(UNCLASSED, |c| c as u8);
                k.set(class);
                class
            }
            class => class,
        })
        .ok()?;
    (usize::from(class) < THREAD_CLASSES).then_some(usize::from(class))
}

/// Records `n` more live bytes and raises the peak.
fn grow(n: usize) {
    let now = LIVE.fetch_add(n, Ordering::SeqCst) + n;
    PEAK.fetch_max(now, Ordering::SeqCst);
}

// SAFETY: every method forwards to `System` with the caller's arguments unchanged; the
// bookkeeping around it never allocates and never touches the returned memory.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: forwarded with the caller's guarantees for `GlobalAlloc::alloc`.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            grow(layout.size());
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: forwarded with the caller's guarantees for `GlobalAlloc::alloc_zeroed`.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            grow(layout.size());
        }
        p
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count();
        // SAFETY: forwarded with the caller's guarantees for `GlobalAlloc::realloc`.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            LIVE.fetch_sub(layout.size(), Ordering::SeqCst);
            grow(new_size);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Ordering::SeqCst);
        // SAFETY: forwarded with the caller's guarantees for `GlobalAlloc::dealloc`.
        unsafe { System.dealloc(ptr, layout) }
    }
}

/// Allocations made so far by the calling thread (always counted, whatever other threads do).
pub fn thread_allocations() -> usize {
    THREAD_ALLOCS.with(Cell::get)
}

/// Panics unless [`thread_allocations`] sees an allocation of the calling thread: without
/// [`CountingAlloc`] installed, every "allocates nothing" check of a binary would pass vacuously.
pub fn assert_thread_meter_sees_allocations() {
    let b = thread_allocations();
    let v = std::hint::black_box(vec![1u8; 10]);
    assert!(thread_allocations() > b, "the counter must see allocations");
    drop(v);
}

/// Runs `f` and returns how many allocations the calling thread made meanwhile (allocations
/// that `f` causes on other threads are not seen).
pub fn thread_allocations_during(f: impl FnOnce()) -> usize {
    let before = thread_allocations();
    f();
    thread_allocations() - before
}

/// Resets the all-thread counter and the per-class counters to zero and starts them.
pub fn start_counting() {
    TRACING.store(
        std::env::var_os("TESTKIT_ALLOC_BACKTRACES").is_some_and(|v| v == "1"),
        Ordering::SeqCst,
    );
    ALL_ALLOCS.store(0, Ordering::SeqCst);
    for c in &CLASS_ALLOCS {
        c.store(0, Ordering::SeqCst);
    }
    COUNTING.store(true, Ordering::SeqCst);
}

/// Stops the all-thread counter and returns the allocations it saw (all threads) since
/// [`start_counting`]. With `TESTKIT_ALLOC_BACKTRACES=1`, prints their backtraces to stderr.
pub fn stop_counting() -> usize {
    COUNTING.store(false, Ordering::SeqCst);
    if TRACING.swap(false, Ordering::SeqCst) {
        let traces = std::mem::take(&mut *TRACES.lock().unwrap_or_else(|e| e.into_inner()));
        for t in traces {
            eprintln!("{t}");
        }
    }
    ALL_ALLOCS.load(Ordering::SeqCst)
}

/// Sorts threads into classes for [`class_allocations`]: `classify` gets a thread's name and
/// returns its class (`0..THREAD_CLASSES`; `None` or a larger value: not counted in any class).
/// Each thread is classified once, at its first allocation while counting. Call it once per
/// process, before counting.
///
/// # Panics
///
/// If a classifier was already set (threads classified by it would keep their classes).
pub fn classify_threads(classify: Classifier) {
    assert!(
        CLASSIFY.set(classify).is_ok(),
        "classify_threads: a classifier is already set"
    );
}

/// Allocations made by threads of `class` (see [`classify_threads`]) between
/// [`start_counting`] and [`stop_counting`]; 0 for a class out of range.
pub fn class_allocations(class: usize) -> usize {
    CLASS_ALLOCS
        .get(class)
        .map_or(0, |c| c.load(Ordering::SeqCst))
}

/// Heap bytes currently allocated through the allocator, over all threads.
pub fn live_bytes() -> usize {
    LIVE.load(Ordering::SeqCst)
}

/// Runs `f` and returns its result with the peak heap growth (all threads) above the live
/// bytes at the start. Concurrent measurements disturb each other: serialize them.
pub fn peak_growth_during<T>(f: impl FnOnce() -> T) -> (T, usize) {
    let base = live_bytes();
    PEAK.store(base, Ordering::SeqCst);
    let r = f();
    (r, PEAK.load(Ordering::SeqCst).saturating_sub(base))
}

/// Proves that a meter sees other threads: `measure` (e.g. a closure around [`start_counting`] /
/// [`stop_counting`]) is run around exactly one allocation made by a second, already running
/// thread while the calling thread only waits on barriers (which do not allocate). Returns what
/// `measure` reported: 1 for an all-thread meter, 0 for a per-thread one.
pub fn other_thread_probe(measure: impl FnOnce(&mut dyn FnMut()) -> usize) -> usize {
    use std::sync::{Arc, Barrier};
    let start = Arc::new(Barrier::new(2));
    let done = Arc::new(Barrier::new(2));
    // The thread ends only after the measurement: thread exit may allocate.
    let exit = Arc::new(Barrier::new(2));
    let (s2, d2, e2) = (start.clone(), done.clone(), exit.clone());
    let worker = std::thread::spawn(move || {
        s2.wait();
        drop(std::hint::black_box(vec![1u8; 10]));
        d2.wait();
        e2.wait();
    });
    let n = measure(&mut || {
        start.wait();
        done.wait();
    });
    exit.wait();
    worker.join().expect("probe thread");
    n
}

/// Runs `f` and returns the allocations made meanwhile by every thread except the test harness's
/// own `main` thread (which prints results of other tests at any time): the calling thread, pool
/// workers, anything `f` starts. Allocations of concurrently running tests are seen too, so a
/// binary that uses it should run one test at a time (hold a single non-ignored test). Sets the
/// thread classifier: do not combine with [`classify_threads`].
pub fn all_thread_allocations_during(f: impl FnOnce()) -> usize {
    static SET: std::sync::Once = std::sync::Once::new();
    SET.call_once(|| classify_threads(|name| (name != Some("main")).then_some(0)));
    start_counting();
    f();
    stop_counting();
    class_allocations(0)
}
