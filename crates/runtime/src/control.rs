//! Commands to a session: atomics written by any thread, observed by the session between frames.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use crate::ring::{FrameRing, Waker};

pub(crate) struct ControlState {
    /// The session's input ring (a reset marks where the new stream's input starts).
    pub(crate) ring: Arc<FrameRing>,
    /// Latest requested epoch (interrupt and reset bump it).
    pub(crate) epoch: AtomicU64,
    /// Number of reset requests so far.
    pub(crate) resets: AtomicU64,
    /// Input frames with a sequence number below this were pushed before the latest reset.
    pub(crate) reset_mark: AtomicU64,
    pub(crate) paused: AtomicBool,
    pub(crate) stop: AtomicBool,
    /// Woken after every command (the runner's worker thread). Set once at spawn.
    pub(crate) waker: OnceLock<Waker>,
}

/// A cloneable handle to send commands to a session from any thread.
///
/// Every method only touches atomics (and wakes the runner's worker thread, if any) and never blocks on the
/// frame pass. Commands take effect between frames: a frame pass in progress always completes.
#[derive(Clone)]
pub struct SessionControl {
    pub(crate) state: Arc<ControlState>,
}

impl std::fmt::Debug for SessionControl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionControl")
            .field("epoch", &self.epoch())
            .field("paused", &self.is_paused())
            .field("stop_requested", &self.is_stop_requested())
            .finish()
    }
}

impl SessionControl {
    pub(crate) fn new(ring: Arc<FrameRing>) -> SessionControl {
        SessionControl {
            state: Arc::new(ControlState {
                ring,
                epoch: AtomicU64::new(0),
                resets: AtomicU64::new(0),
                reset_mark: AtomicU64::new(0),
                paused: AtomicBool::new(false),
                stop: AtomicBool::new(false),
                waker: OnceLock::new(),
            }),
        }
    }

    fn wake(&self) {
        if let Some(w) = self.state.waker.get() {
            w();
        }
    }

    /// Install the waker (once; later calls are ignored).
    pub(crate) fn set_waker(&self, waker: Waker) {
        let _ = self.state.waker.set(waker);
    }

    /// Soft interrupt: bump the epoch and return the new value. Output of older epochs is discarded; Mimi, LM
    /// and Depformer state continue untouched.
    pub fn interrupt(&self) -> u64 {
        let e = self.state.epoch.fetch_add(1, Ordering::AcqRel) + 1;
        self.wake();
        e
    }

    /// Mic pause: no frame is submitted to the model until [`SessionControl::resume`].
    pub fn pause(&self) {
        self.state.paused.store(true, Ordering::Release);
        self.wake();
    }

    /// Resume after [`SessionControl::pause`]; the same stream continues.
    pub fn resume(&self) {
        self.state.paused.store(false, Ordering::Release);
        self.wake();
    }

    /// New stream: at the next frame boundary the session becomes indistinguishable from a fresh one. Input
    /// pushed before this call (queued frames and a partial frame) belongs to the old stream and is discarded;
    /// input pushed after it is the new stream's. Also bumps the epoch; returns the new epoch.
    pub fn reset(&self) -> u64 {
        let e = self.state.epoch.fetch_add(1, Ordering::AcqRel) + 1;
        self.state.ring.forget_partial();
        self.state
            .reset_mark
            .store(self.state.ring.published(), Ordering::Release);
        self.state.resets.fetch_add(1, Ordering::AcqRel);
        self.wake();
        e
    }

    /// Stop the session (irreversible). A running frame pass completes first.
    pub fn stop(&self) {
        self.state.stop.store(true, Ordering::Release);
        self.wake();
    }

    /// The latest requested epoch. Consumers drop output whose epoch is older.
    pub fn epoch(&self) -> u64 {
        self.state.epoch.load(Ordering::Acquire)
    }

    /// Whether pause is currently requested.
    pub fn is_paused(&self) -> bool {
        self.state.paused.load(Ordering::Acquire)
    }

    /// Whether stop has been requested.
    pub fn is_stop_requested(&self) -> bool {
        self.state.stop.load(Ordering::Acquire)
    }

    pub(crate) fn resets(&self) -> u64 {
        self.state.resets.load(Ordering::Acquire)
    }

    pub(crate) fn reset_mark(&self) -> u64 {
        self.state.reset_mark.load(Ordering::Acquire)
    }
}
