//! The shell behind every opaque handle: a kind tag, a busy flag and the state.
//!
//! A handle is a pointer to a `Shell`. The shell is never freed: destroying a handle drops its state and
//! marks the tag `DEAD`, so a later call with the same pointer is refused with `MN_STATUS_DESTROYED`
//! instead of touching freed memory (a few dozen bytes per destroyed handle). The busy flag turns a
//! second thread entering the same handle into `MN_STATUS_BUSY`; a panic while inside marks it
//! `POISONED`. All of it is atomics: entering a handle never locks or allocates.

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

use crate::status::{boundary, non_null, Fail, MnStatus};

/// Tag of a destroyed handle.
const DEAD: u32 = 0xDEAD_0000;
/// Tag of a handle poisoned by a panic.
const POISONED: u32 = 0xBAD0_0000;

/// Tags of the live handle kinds (distinct, so a handle of another kind is recognised).
pub(crate) const ENGINE: u32 = 0x4D4E_0001;
pub(crate) const SESSION: u32 = 0x4D4E_0002;
pub(crate) const MIMI: u32 = 0x4D4E_0003;
pub(crate) const STT_ENGINE: u32 = 0x4D4E_0004;
pub(crate) const STT_TRANSCRIBER: u32 = 0x4D4E_0005;

/// `repr(C)` keeps `tag` first in every kind of shell, so reading it through a handle of the wrong kind
/// reads a tag (and is refused).
#[repr(C)]
pub(crate) struct Shell<T, S = ()> {
    tag: AtomicU32,
    busy: AtomicBool,
    /// State readable without the busy flag (`Sync` parts, e.g. a session's control handle).
    pub shared: S,
    state: UnsafeCell<Option<T>>,
}

// SAFETY: `state` is only reached through `Entered`, which holds the busy flag exclusively.
unsafe impl<T: Send, S: Sync> Sync for Shell<T, S> {}

impl<T, S> Shell<T, S> {
    /// A new live shell, leaked: the returned pointer is the handle.
    pub fn create(kind: u32, shared: S, state: T) -> *mut Shell<T, S> {
        Box::into_raw(Box::new(Shell {
            tag: AtomicU32::new(kind),
            busy: AtomicBool::new(false),
            shared,
            state: UnsafeCell::new(Some(state)),
        }))
    }

    /// The whole body of a call that creates a handle (`mn_engine_open`, `mn_session_create`, ...):
    /// refuses a NULL `out` (named `what` in the message) before anything is built, builds the shared
    /// part and the state with `make`, and writes a new shell of `kind` to `*out` (the caller owns it
    /// from then on). Nothing is written when `make` fails.
    ///
    /// # Safety
    /// `out` is NULL or valid for writes.
    pub unsafe fn hand_out<H>(
        out: *mut *mut H,
        what: &str,
        kind: u32,
        make: impl FnOnce() -> Result<(S, T), Fail>,
    ) -> MnStatus {
        boundary(|| {
            non_null(out, what)?;
            let (shared, state) = make()?;
            // SAFETY: not NULL, writable by the caller's contract.
            unsafe { out.write(Self::create(kind, shared, state).cast()) };
            Ok(MnStatus::Ok)
        })
    }

    /// Takes the busy flag, or fails with BUSY when another thread holds it.
    fn take_busy(&self) -> Result<(), Fail> {
        self.busy
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .map(|_| ())
            .map_err(|_| Fail::new(MnStatus::Busy, "the handle is in use by another thread"))
    }

    /// Checks `p` is a live handle of `kind`, without entering it.
    ///
    /// # Safety
    /// `p` is NULL or a pointer this library returned for a handle (destroyed or not).
    pub unsafe fn peek<'a>(p: *const Shell<T, S>, kind: u32) -> Result<&'a Shell<T, S>, Fail> {
        if p.is_null() {
            return Err(Fail::new(MnStatus::Null, "handle is NULL"));
        }
        // SAFETY: shells are never freed; `p` came from `create` by the caller's contract.
        let shell = unsafe { &*p };
        match shell.tag.load(Ordering::Acquire) {
            t if t == kind => Ok(shell),
            DEAD => Err(Fail::new(MnStatus::Destroyed, "the handle was destroyed")),
            POISONED => Err(Fail::new(
                MnStatus::Poisoned,
                "the handle is poisoned by an earlier panic; destroy it",
            )),
            _ => Err(Fail::new(
                MnStatus::InvalidHandle,
                "not a handle of this kind",
            )),
        }
    }

    /// Enters a live handle of `kind` exclusively (the busy flag), for the rest of the call.
    ///
    /// # Safety
    /// As [`Shell::peek`].
    pub unsafe fn enter<'a>(p: *const Shell<T, S>, kind: u32) -> Result<Entered<'a, T, S>, Fail> {
        // SAFETY: forwarded contract.
        let shell = unsafe { Self::peek(p, kind) }?;
        shell.take_busy()?;
        // Destroyed between the tag check and taking the flag: the state is gone.
        let entered = Entered { shell };
        // SAFETY: busy flag held.
        if unsafe { (*shell.state.get()).is_none() } {
            return Err(Fail::new(MnStatus::Destroyed, "the handle was destroyed"));
        }
        Ok(entered)
    }

    /// Destroys the handle: drops its state and marks it dead. A poisoned handle may be destroyed.
    ///
    /// # Safety
    /// As [`Shell::peek`].
    pub unsafe fn destroy(p: *const Shell<T, S>, kind: u32) -> Result<(), Fail> {
        if p.is_null() {
            return Err(Fail::new(MnStatus::Null, "handle is NULL"));
        }
        // SAFETY: as in `peek`.
        let shell = unsafe { &*p };
        let tag = shell.tag.load(Ordering::Acquire);
        if tag != POISONED {
            // SAFETY: forwarded contract; refuses dead handles and other kinds.
            unsafe { Self::peek(p, kind) }?;
        }
        shell.take_busy()?;
        // The flag stays held: a dead handle is never entered again.
        shell.tag.store(DEAD, Ordering::Release);
        // SAFETY: busy flag held exclusively.
        let state = unsafe { (*shell.state.get()).take() };
        drop(state);
        Ok(())
    }
}

/// Exclusive access to a handle's state for the duration of one call.
pub(crate) struct Entered<'a, T, S> {
    shell: &'a Shell<T, S>,
}

impl<T, S> Entered<'_, T, S> {
    /// The state.
    pub fn state(&mut self) -> &mut T {
        // SAFETY: the busy flag is held by `self`; `enter` checked the state is present and only
        // `destroy` (which needs the flag) removes it.
        unsafe { (*self.shell.state.get()).as_mut() }.expect("state present while entered")
    }
}

impl<T, S> Drop for Entered<'_, T, S> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            // The state may be half-updated: only destroy is allowed from now on.
            self.shell.tag.store(POISONED, Ordering::Release);
        }
        self.shell.busy.store(false, Ordering::Release);
    }
}
