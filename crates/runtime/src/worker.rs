//! The caller's side of a batch worker thread ([`crate::BatchRunner`], [`crate::SttRunner`]): its stop flag, the
//! queue that hands it joining streams, and its join handle. Stopping sets the flag, wakes the thread and joins it
//! exactly once; dropping the handle stops the worker the same way.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle, Thread};

use crate::RuntimeError;

/// A running worker thread that takes joins of type `J`.
pub(crate) struct WorkerHandle<J> {
    /// Read by the worker's loop; set once, by [`WorkerHandle::stop`].
    stop: Arc<AtomicBool>,
    /// Behind a lock so that the runner is `Sync` (`Sender` alone is not shared between threads here).
    joins: Mutex<Sender<J>>,
    thread: Thread,
    /// Taken by the first stop, so that later stops return at once.
    join: Mutex<Option<JoinHandle<()>>>,
}

impl<J> WorkerHandle<J> {
    /// Starts a thread named `name` running `run`, which must return soon after `stop` is set and its thread
    /// unparked, and which receives the joins sent on `joins`' receiver.
    pub(crate) fn spawn(
        name: &str,
        stop: Arc<AtomicBool>,
        joins: Sender<J>,
        run: impl FnOnce() + Send + 'static,
    ) -> Result<WorkerHandle<J>, RuntimeError> {
        let join = thread::Builder::new()
            .name(name.into())
            .spawn(run)
            .map_err(RuntimeError::Spawn)?;
        Ok(WorkerHandle {
            stop,
            joins: Mutex::new(joins),
            thread: join.thread().clone(),
            join: Mutex::new(Some(join)),
        })
    }

    /// The worker's thread (to unpark it from a waker).
    pub(crate) fn thread(&self) -> &Thread {
        &self.thread
    }

    /// Wakes the worker (a join or new work is waiting).
    pub(crate) fn unpark(&self) {
        self.thread.unpark();
    }

    /// Whether a stop has been asked.
    pub(crate) fn stopping(&self) -> bool {
        self.stop.load(Ordering::Acquire)
    }

    /// Hands `join` to the worker (installed at its next tick; the caller unparks it once its own bookkeeping is
    /// done); [`RuntimeError::RunnerStopped`] when the worker has ended.
    pub(crate) fn send(&self, join: J) -> Result<(), RuntimeError> {
        // A poisoned lock only means a panic elsewhere while sending; the sender stays usable.
        let joins = self.joins.lock().unwrap_or_else(|e| e.into_inner());
        joins.send(join).map_err(|_| RuntimeError::RunnerStopped)
    }

    /// Stops the worker and joins it (exactly once; later calls return at once).
    pub(crate) fn stop(&self) -> Result<(), RuntimeError> {
        self.stop.store(true, Ordering::Release);
        self.thread.unpark();
        let handle = self.join.lock().unwrap_or_else(|e| e.into_inner()).take();
        match handle {
            Some(h) => h.join().map_err(|_| RuntimeError::WorkerPanicked),
            None => Ok(()),
        }
    }
}

impl<J> Drop for WorkerHandle<J> {
    fn drop(&mut self) {
        let _ = self.stop();
    }
}
