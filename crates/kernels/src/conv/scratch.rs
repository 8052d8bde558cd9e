//! The convolutions' scratch: one set of buffers per thread, grown during warm-up, or the caller's
//! own ([`Workspace`]) while it has entered it.

use std::cell::RefCell;

use crate::gemm::swap_panels;

/// The scratch buffers of the convolutions, owned by the caller instead of the thread.
///
/// A convolution's scratch (its input's GEMM view, a strided input's phases, a transposed
/// convolution's product, the B panels) lives in the calling thread and grows during warm-up.
/// Work that a pool may hand to any of its threads, such as one conversation's chain of layers
/// run as one task, would grow a worker's scratch whenever that worker first ran it, at an
/// unpredictable frame. Inside [`Workspace::enter`] the thread uses this workspace's buffers
/// instead, so the growth follows the work (warmed up once, wherever it runs next).
#[derive(Debug, Default)]
pub struct Workspace {
    rows: Vec<usize>,
    phases: Vec<f32>,
    z: Vec<f32>,
    panels: Vec<f32>,
}

impl Workspace {
    /// An empty workspace (it grows on first use).
    pub fn new() -> Self {
        Self::default()
    }

    /// Runs `f` with this workspace as the calling thread's convolution scratch: the
    /// convolutions `f` runs on this thread (with or without a pool) take their scratch from
    /// here. Not to be nested inside a convolution call.
    pub fn enter<R>(&mut self, f: impl FnOnce() -> R) -> R {
        /// Swaps the buffers in on creation and back on drop (also when `f` panics).
        struct Entered<'a>(&'a mut Workspace);
        impl Entered<'_> {
            fn swap(&mut self) {
                let w = &mut *self.0;
                SCRATCH.with(|s| {
                    let s = &mut *s.borrow_mut();
                    std::mem::swap(&mut s.rows, &mut w.rows);
                    std::mem::swap(&mut s.phases, &mut w.phases);
                    std::mem::swap(&mut s.z, &mut w.z);
                });
                swap_panels(&mut w.panels);
            }
        }
        impl Drop for Entered<'_> {
            fn drop(&mut self) {
                self.swap();
            }
        }
        let mut entered = Entered(self);
        entered.swap();
        f()
    }
}

/// Scratch of the convolutions a thread runs, grown during warm-up.
pub(super) struct ConvScratch {
    /// The row offsets of the GEMM view of the input.
    pub(super) rows: Vec<usize>,
    /// A strided convolution's input split into its phases ([`split_phases`]).
    pub(super) phases: Vec<f32>,
    /// A transposed convolution's GEMM output, before the overlap-add.
    pub(super) z: Vec<f32>,
}

thread_local! {
    pub(super) static SCRATCH: RefCell<ConvScratch> = const {
        RefCell::new(ConvScratch {
            rows: Vec::new(),
            phases: Vec::new(),
            z: Vec::new(),
        })
    };
}

/// The first `n` values of a scratch buffer that grows (during warm-up) but never shrinks.
pub(super) fn fitted<T: Copy + Default>(v: &mut Vec<T>, n: usize) -> &mut [T] {
    if v.len() < n {
        v.resize(n, T::default());
    }
    &mut v[..n]
}
