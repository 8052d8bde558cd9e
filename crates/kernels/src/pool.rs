//! A small persistent worker pool for per-token kernels (matvec, attention heads, convs).
//!
//! Hand-off protocol: the caller publishes a job pointer and a number of shares, then
//! bumps an epoch stored in the high half of one atomic word whose low half is the next
//! unclaimed share, and unparks the workers (a no-op unless they are parked). Every
//! participant — the caller included — claims shares with a compare-and-swap on that word
//! until none is left, so a worker that is descheduled (shared machines) or still parked
//! simply leaves its shares to the caller instead of making it wait. Idle workers spin on
//! the epoch for about [`SPIN`] before parking. Nothing is allocated or spawned per call.
//! With one thread there is no worker at all.
//!
//! [`Pool::run_affine`] is the one exception to "whoever comes first": its tasks have a home
//! thread (task `i` on thread `i mod n`, the caller being thread 0), claimed through a bitmask
//! word, so that a sequence of calls over the same streams keeps each stream's data in one core's
//! cache. A thread whose own tasks are done still takes the others' last tasks, so a descheduled
//! worker delays a call no more than with [`Pool::run`].

use std::cell::UnsafeCell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::{self, JoinHandle, Thread};
use std::time::{Duration, Instant};

use crate::arch;
use crate::layout::TILE;
use crate::matrix::Scratch;
use crate::Matrix;

/// How long an idle worker spins before parking.
pub const SPIN: Duration = Duration::from_micros(80);

/// Shares per thread a matrix product is cut into (dynamic load balancing).
const SHARES_PER_THREAD: usize = 4;

/// Most shares one dispatch can have (15-bit field of the state word).
const MAX_SHARES: usize = 0x7fff;

/// The state word's flag for a [`Pool::run_affine`] dispatch (its shares are claimed in
/// [`Shared::claims`]).
const AFFINE: u64 = 1 << 31;

/// Most tasks of one [`Pool::run_affine`] call (the bits of the claim mask).
const MAX_AFFINE_TASKS: usize = 32;

type Job = *const (dyn Fn(usize) + Sync);

struct Shared {
    /// Epoch (bits 32..64) | [`AFFINE`] | number of shares (bits 16..31) | next unclaimed share
    /// (bits 0..16).
    state: AtomicU64,
    /// For an affine dispatch: its epoch (bits 32..64) | the claimed shares (one bit each). It
    /// carries the epoch so that a claim can only succeed against the dispatch that published it.
    claims: AtomicU64,
    completed: AtomicUsize,
    panicked: AtomicBool,
    stop: AtomicBool,
    /// Workers that have started running.
    started: AtomicUsize,
    /// Threads taking part in a call (workers + the caller), set once the workers are spawned.
    threads: AtomicUsize,
    job: UnsafeCell<Option<Job>>,
}

// SAFETY: `job` is written only by the dispatching caller while no share of the previous
// epoch is running and none of the next one can be claimed yet.
unsafe impl Sync for Shared {}
unsafe impl Send for Shared {}

impl Shared {
    /// Claims and runs shares of `epoch` until none is left, as thread `me` (the caller is 0).
    /// Returns how many ran.
    fn work(&self, epoch: u32, me: usize) -> usize {
        let mut ran = 0;
        loop {
            let s = self.state.load(Ordering::Acquire);
            if (s >> 32) as u32 != epoch {
                return ran;
            }
            // The share count lives in the same word as the epoch and the claim index, so
            // a claim can only succeed against the dispatch that published it.
            let n = ((s >> 16) & 0x7fff) as usize;
            if s & AFFINE != 0 {
                return ran + self.work_affine(epoch, n, me);
            }
            let i = (s & 0xffff) as usize;
            if i >= n {
                return ran;
            }
            if self
                .state
                .compare_exchange_weak(s, s + 1, Ordering::AcqRel, Ordering::Relaxed)
                .is_err()
            {
                continue;
            }
            self.run_share(i);
            ran += 1;
        }
    }

    /// The shares of an affine dispatch of `n` shares: first this thread's own (`i mod threads
    /// == me`, lowest first), then the highest unclaimed one of the others (their owners work
    /// up from their lowest).
    fn work_affine(&self, epoch: u32, n: usize, me: usize) -> usize {
        let threads = self.threads.load(Ordering::Acquire);
        let all = if n >= 32 { u32::MAX } else { (1u32 << n) - 1 };
        let own = (0..n)
            .filter(|i| i % threads == me)
            .fold(0u32, |m, i| m | (1 << i));
        let mut ran = 0;
        loop {
            let w = self.claims.load(Ordering::Acquire);
            if (w >> 32) as u32 != epoch {
                return ran;
            }
            let free = !(w as u32) & all;
            if free == 0 {
                return ran;
            }
            let i = if free & own != 0 {
                (free & own).trailing_zeros()
            } else {
                31 - free.leading_zeros()
            };
            if self
                .claims
                .compare_exchange_weak(w, w | (1 << i), Ordering::AcqRel, Ordering::Relaxed)
                .is_err()
            {
                continue;
            }
            self.run_share(i as usize);
            ran += 1;
        }
    }

    /// Runs claimed share `i` of the current job and counts it completed.
    fn run_share(&self, i: usize) {
        // SAFETY: a claimed, uncompleted share of the current epoch keeps the caller
        // waiting, so the job published (release) with this epoch is alive.
        if let Some(job) = unsafe { *self.job.get() } {
            let r = catch_unwind(AssertUnwindSafe(|| unsafe { (*job)(i) }));
            if r.is_err() {
                self.panicked.store(true, Ordering::Relaxed);
            }
        }
        self.completed.fetch_add(1, Ordering::Release);
    }
}

/// Persistent worker pool; splits a matvec/matmul by output rows (pairs of 8-row tiles).
/// No allocation or spawn per call. `Pool` is `Sync`: concurrent calls from several
/// threads are serialized (the second caller spins until the first one finishes).
pub struct Pool {
    shared: Arc<Shared>,
    workers: Vec<(Thread, JoinHandle<()>)>,
    busy: AtomicBool,
    scratch: UnsafeCell<Scratch>,
    epoch: std::cell::Cell<u32>,
}

// SAFETY: `scratch` and `epoch` are only touched while `busy` is held.
unsafe impl Sync for Pool {}

struct SendPtr(*mut f32);
// SAFETY: used only to write disjoint row ranges from different threads.
unsafe impl Sync for SendPtr {}
unsafe impl Send for SendPtr {}

impl Pool {
    /// A pool with `n_threads` threads in total including the caller (`0` is treated as
    /// 1; one thread means no worker). If the OS refuses to spawn a thread the pool
    /// keeps the workers it got.
    pub fn new(n_threads: usize) -> Pool {
        let shared = Arc::new(Shared {
            state: AtomicU64::new(0),
            claims: AtomicU64::new(0),
            completed: AtomicUsize::new(0),
            panicked: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            started: AtomicUsize::new(0),
            threads: AtomicUsize::new(1),
            job: UnsafeCell::new(None),
        });
        let mut workers = Vec::new();
        for idx in 1..n_threads.max(1) {
            let sh = shared.clone();
            match thread::Builder::new()
                .name(format!("moshi-kernels-{idx}"))
                .spawn(move || worker(sh, idx))
            {
                Ok(h) => workers.push((h.thread().clone(), h)),
                Err(_) => break,
            }
        }
        // A thread's start-up allocates (the standard library copies its name for the stack
        // overflow handler). The caller never waits for a worker, so a worker the scheduler starts
        // late would make that allocation during some later frame: wait until every one runs.
        while shared.started.load(Ordering::Acquire) < workers.len() {
            thread::yield_now();
        }
        shared.threads.store(workers.len() + 1, Ordering::Release);
        Pool {
            shared,
            workers,
            busy: AtomicBool::new(false),
            scratch: UnsafeCell::new(Scratch::new()),
            epoch: std::cell::Cell::new(0),
        }
    }

    /// Number of threads taking part in a call (workers + the caller).
    pub fn n_threads(&self) -> usize {
        self.workers.len() + 1
    }

    /// How many calls so far were split over the workers (wrapping). Lets a test check that a
    /// computation ran on this pool, without timing it.
    pub fn dispatches(&self) -> u32 {
        let _guard = self.lock();
        self.epoch.get()
    }

    /// `y = W · x` split over the pool's threads.
    pub fn matvec(&self, m: &Matrix, x: &[f32], y: &mut [f32]) {
        self.matmul(m, x, 1, y)
    }

    /// `y [n, rows] = x [n, cols] · Wᵀ`, split by output rows over the pool's threads;
    /// activations are quantized once by the caller.
    pub fn matmul(&self, m: &Matrix, x: &[f32], n: usize, y: &mut [f32]) {
        assert!(
            x.len() >= n * m.cols() && y.len() >= n * m.rows(),
            "Pool::matmul: buffer too short"
        );
        let _guard = self.lock();
        // SAFETY: the busy flag is held, so nobody else uses the scratch.
        let scratch = unsafe { &mut *self.scratch.get() };
        let act = m.prepare(x, n, scratch);
        let level = arch::active();
        // Split by pairs of tiles (16 rows), the unit of the AVX-512 kernels.
        let pairs = m.tiles().div_ceil(2);
        let unit = 2 * TILE;
        let shares = (self.n_threads() * SHARES_PER_THREAD)
            .min(pairs)
            .min(MAX_SHARES);
        let yp = SendPtr(y.as_mut_ptr());
        let rows = m.rows();
        let f = |i: usize| {
            let (a, b) = split(pairs, shares, i);
            if a < b {
                let yp = &yp;
                // SAFETY: each share writes its own rows; y was checked above.
                unsafe { m.compute_rows(level, &act, x, n, a * unit, (b * unit).min(rows), yp.0) }
            }
        };
        if self.n_threads() <= 1 || shares <= 1 {
            (0..shares.max(1)).for_each(f)
        } else {
            self.dispatch(shares, &f, false)
        }
    }

    /// Runs `f(i)` exactly once for every `i` in `0..n_tasks`, spread over the pool's
    /// threads (tasks are claimed dynamically, in contiguous chunks). Blocks until all are
    /// done. Panics in `f` are propagated to the caller after all tasks finish.
    pub fn run(&self, n_tasks: usize, f: &(dyn Fn(usize) + Sync)) {
        if n_tasks == 0 {
            return;
        }
        if self.n_threads() <= 1 || n_tasks == 1 {
            (0..n_tasks).for_each(f);
            return;
        }
        let _guard = self.lock();
        let shares = n_tasks
            .min(self.n_threads() * SHARES_PER_THREAD)
            .min(MAX_SHARES);
        let g = |i: usize| {
            let (a, b) = split(n_tasks, shares, i);
            (a..b).for_each(f)
        };
        self.dispatch(shares, &g, false)
    }

    /// Runs `f(i)` exactly once for every `i` in `0..n_tasks`, task `i` on thread `i mod
    /// n_threads()` (the caller is thread 0) unless that thread is late: a thread done with its
    /// own tasks takes the others' last ones. For calls that follow each other over the same
    /// independent streams (task `i` = stream `i`), so that what one call leaves in a core's
    /// cache for a stream is there for the next. More than 32 tasks (the bits of the claim word) run
    /// as with [`Pool::run`]. Blocks until all are done; panics in `f` are propagated to the caller
    /// after all tasks finish.
    pub fn run_affine(&self, n_tasks: usize, f: &(dyn Fn(usize) + Sync)) {
        if n_tasks > MAX_AFFINE_TASKS {
            return self.run(n_tasks, f);
        }
        if self.n_threads() <= 1 || n_tasks <= 1 {
            (0..n_tasks).for_each(f);
            return;
        }
        let _guard = self.lock();
        self.dispatch(n_tasks, f, true)
    }

    fn lock(&self) -> BusyGuard<'_> {
        let mut spins = 0u32;
        while self
            .busy
            .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            spins += 1;
            if spins < 1000 {
                std::hint::spin_loop();
            } else {
                thread::yield_now();
            }
        }
        BusyGuard(&self.busy)
    }

    /// Runs `f(i)` for `i` in `0..shares` on the caller and the workers; with `affine`, share
    /// `i` preferably on thread `i mod n_threads()` (at most [`MAX_AFFINE_TASKS`] shares).
    fn dispatch(&self, shares: usize, f: &(dyn Fn(usize) + Sync), affine: bool) {
        let sh = &*self.shared;
        // SAFETY: erase the lifetime; the pointer is cleared before this function returns,
        // and no share can be claimed after that (all are claimed and completed).
        let job: Job = unsafe {
            std::mem::transmute::<*const (dyn Fn(usize) + Sync + '_), Job>(f as *const _)
        };
        unsafe { *sh.job.get() = Some(job) };
        debug_assert!(shares <= MAX_SHARES);
        sh.completed.store(0, Ordering::Relaxed);
        let epoch = self.epoch.get().wrapping_add(1);
        self.epoch.set(epoch);
        let mut state = ((epoch as u64) << 32) | ((shares as u64) << 16);
        if affine {
            debug_assert!(shares <= MAX_AFFINE_TASKS);
            // Published by the release store of `state` below, which workers acquire first.
            sh.claims.store((epoch as u64) << 32, Ordering::Relaxed);
            state |= AFFINE;
        }
        sh.state.store(state, Ordering::Release);
        for (t, _) in &self.workers {
            t.unpark();
        }
        sh.work(epoch, 0);
        let start = Instant::now();
        let mut k = 0u32;
        while sh.completed.load(Ordering::Acquire) < shares {
            k = k.wrapping_add(1);
            if k.is_multiple_of(256) && start.elapsed() > SPIN {
                thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
        unsafe { *sh.job.get() = None };
        if sh.panicked.swap(false, Ordering::Relaxed) {
            panic!("a kernels::Pool task panicked");
        }
    }
}

struct BusyGuard<'a>(&'a AtomicBool);
impl Drop for BusyGuard<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

/// Share `i` of `n` items split into `parts` contiguous near-equal chunks.
fn split(n: usize, parts: usize, i: usize) -> (usize, usize) {
    let base = n / parts;
    let rem = n % parts;
    let a = i * base + i.min(rem);
    let b = a + base + usize::from(i < rem);
    (a.min(n), b.min(n))
}

fn worker(sh: Arc<Shared>, me: usize) {
    sh.started.fetch_add(1, Ordering::Release);
    let mut seen = 0u32;
    loop {
        let epoch_of = |s: u64| (s >> 32) as u32;
        let mut e = epoch_of(sh.state.load(Ordering::Acquire));
        if e == seen {
            let start = Instant::now();
            let mut k = 0u32;
            loop {
                std::hint::spin_loop();
                e = epoch_of(sh.state.load(Ordering::Acquire));
                if e != seen {
                    break;
                }
                k = k.wrapping_add(1);
                if k.is_multiple_of(64) && start.elapsed() > SPIN {
                    while e == seen {
                        thread::park();
                        e = epoch_of(sh.state.load(Ordering::Acquire));
                    }
                    break;
                }
            }
        }
        seen = e;
        if sh.stop.load(Ordering::Acquire) {
            return;
        }
        sh.work(e, me);
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        let epoch = self.epoch.get().wrapping_add(1);
        self.shared
            .state
            .store((epoch as u64) << 32, Ordering::Release);
        for (t, _) in &self.workers {
            t.unpark();
        }
        for (_, h) in self.workers.drain(..) {
            let _ = h.join();
        }
    }
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("n_threads", &self.n_threads())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_covers_everything() {
        for n in 0..20 {
            for parts in 1..5 {
                let mut next = 0;
                for i in 0..parts {
                    let (a, b) = split(n, parts, i);
                    assert_eq!(a, next);
                    next = b;
                }
                assert_eq!(next, n);
            }
        }
    }

    #[test]
    fn many_dispatches_and_panics_propagate() {
        let pool = Pool::new(3);
        let total = AtomicUsize::new(0);
        for round in 0..30000 {
            let n = 1 + round % 9;
            pool.run(n, &|i| {
                total.fetch_add(i + 1, Ordering::Relaxed);
            });
        }
        let want: usize = (0..30000)
            .map(|r| {
                let n = 1 + r % 9;
                n * (n + 1) / 2
            })
            .sum();
        assert_eq!(total.load(Ordering::Relaxed), want);
        panic_propagates_and_pool_recovers(&pool, Pool::run);
    }

    /// A task's panic reaches the caller of `run`, and the pool still runs every task after.
    fn panic_propagates_and_pool_recovers(
        pool: &Pool,
        run: fn(&Pool, usize, &(dyn Fn(usize) + Sync)),
    ) {
        let r = catch_unwind(AssertUnwindSafe(|| {
            run(pool, 4, &|i| {
                if i == 3 {
                    panic!("task failure");
                }
            })
        }));
        assert!(r.is_err());
        let hits = AtomicUsize::new(0);
        run(pool, 6, &|_| {
            hits.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(hits.load(Ordering::Relaxed), 6);
    }

    #[test]
    fn run_affine_visits_each_task_once_and_propagates_panics() {
        for threads in [2usize, 3] {
            let pool = Pool::new(threads);
            for n in [1usize, 2, 3, 4, 5, 8, 31, 32, 33, 100] {
                let hits: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
                for _ in 0..200 {
                    pool.run_affine(n, &|i| {
                        hits[i].fetch_add(1, Ordering::Relaxed);
                    });
                    // Plain dispatches in between must not see the affine claims.
                    pool.run(3, &|_| ());
                }
                assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 200));
            }
            panic_propagates_and_pool_recovers(&pool, Pool::run_affine);
        }
    }

    #[test]
    fn run_affine_runs_tasks_on_their_home_thread_when_all_are_awake() {
        // Each task waits until every thread holds one, so no thread can finish early and
        // take another's task: the first `threads` tasks then each run on their home thread.
        let pool = Pool::new(2);
        let names: Vec<std::sync::Mutex<Option<String>>> =
            (0..2).map(|_| std::sync::Mutex::new(None)).collect();
        let arrived = AtomicUsize::new(0);
        pool.run_affine(2, &|i| {
            arrived.fetch_add(1, Ordering::AcqRel);
            while arrived.load(Ordering::Acquire) < 2 {
                std::hint::spin_loop();
            }
            *names[i].lock().unwrap() = thread::current().name().map(str::to_string);
        });
        let caller = thread::current().name().map(str::to_string);
        assert_eq!(*names[0].lock().unwrap(), caller);
        assert_eq!(names[1].lock().unwrap().as_deref(), Some("moshi-kernels-1"));
    }

    #[test]
    fn run_visits_each_task_once() {
        let pool = Pool::new(3);
        for n in [1usize, 2, 3, 7, 100] {
            let hits: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
            pool.run(n, &|i| {
                hits[i].fetch_add(1, Ordering::Relaxed);
            });
            assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1));
        }
    }
}
