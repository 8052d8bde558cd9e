//! Can this machine hold real time? A frame pass must take under one frame of audio (80 ms), or input
//! queues up and the oldest frames are dropped. [`Session::warm_up`] times one full frame pass of a
//! session (and faults in the weights and buffers a frame touches) and [`RealtimeCheck`] turns that
//! into a verdict. Where no session exists yet (a server at start-up), [`warm_up`] times one on a
//! short-lived session with a one-entry KV cache, so the check does not allocate a second
//! full-context cache next to the ones the conversations will get.

use std::sync::Arc;

use crate::{Engine, FrameTimings, RuntimeError, Session, SessionOptions};

/// Wall time of one frame of audio, the budget of a frame pass.
pub const FRAME_BUDGET_MS: f64 = 80.0;

/// Share of the budget a frame pass may take and still be called real time: the worker also wakes up,
/// the consumer encodes and sends, and other processes take their share of the cores.
pub const HEADROOM: f64 = 0.9;

/// Times one full frame pass ([`Session::warm_up`]) of a short-lived session of `engine` (on its device
/// and thread count, default sampling) whose LM keeps one temporal KV entry, the only one a first
/// frame uses (on the CPU; a GPU LM allocates its full cache), then drops it. The engine's sessions
/// are unaffected. Where the session that will run exists already, call its [`Session::warm_up`]
/// instead: that also prepares its own buffers.
pub fn warm_up(engine: &Arc<Engine>) -> Result<FrameTimings, RuntimeError> {
    let opts = SessionOptions {
        max_queued_frames: 1,
        ..Default::default()
    };
    Session::with_kv_capacity(engine.clone(), opts, 1)?.warm_up()
}

/// Times `passes` full frame passes ([`Session::warm_up`], each from the start of the stream) of one
/// short-lived session of `engine` after a first pass that is not counted (it compiles GPU pipelines,
/// faults in the weights and sizes the buffers), and returns the pass of median total time. `passes`
/// 0 counts one.
pub fn time_passes(engine: &Arc<Engine>, passes: usize) -> Result<FrameTimings, RuntimeError> {
    let opts = SessionOptions {
        max_queued_frames: 1,
        ..Default::default()
    };
    let mut s = Session::with_kv_capacity(engine.clone(), opts, 1)?;
    s.warm_up()?;
    let mut timed = Vec::with_capacity(passes.max(1));
    for _ in 0..passes.max(1) {
        timed.push(s.warm_up()?);
    }
    timed.sort_by_key(|t| t.total_us);
    Ok(timed[timed.len() / 2])
}

/// The verdict on one measured frame pass.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RealtimeCheck {
    /// Milliseconds of the full frame pass.
    pub frame_ms: f64,
}

impl RealtimeCheck {
    /// The verdict on `full`, a full frame pass (see [`WarmUp::full`]).
    pub fn new(full: &FrameTimings) -> RealtimeCheck {
        RealtimeCheck {
            frame_ms: f64::from(full.total_us) / 1e3,
        }
    }

    /// Whether a frame pass fits in the budget with [`HEADROOM`].
    pub fn holds(&self) -> bool {
        self.frame_ms <= FRAME_BUDGET_MS * HEADROOM
    }

    /// Frame pass time over the budget: above 1, input arrives faster than it is processed.
    pub fn load(&self) -> f64 {
        self.frame_ms / FRAME_BUDGET_MS
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::EngineOptions;

    fn fixture_engine(threads: usize) -> Arc<Engine> {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/lm");
        Engine::open(&dir, EngineOptions::cpu(threads)).unwrap()
    }

    /// The timings of one warm-up pass are consistent: the whole pass is the sum of its three
    /// stages and the lag includes it. (No stage is asserted to have taken time: a truncated
    /// microsecond count of a fast stage may be 0, and tests assert no timings.)
    #[test]
    fn warm_up_timings_add_up() {
        let w = warm_up(&fixture_engine(1)).unwrap();
        assert_eq!(w.total_us, w.encode_us + w.lm_us + w.decode_us, "{w:?}");
        assert!(w.lag_us >= w.total_us, "{w:?}");
    }

    #[test]
    fn time_passes_returns_one_of_its_passes() {
        let w = time_passes(&fixture_engine(1), 3).unwrap();
        assert!(w.lm_us > 0 && w.encode_us > 0 && w.decode_us > 0, "{w:?}");
        assert_eq!(w.total_us, w.encode_us + w.lm_us + w.decode_us);
    }

    #[test]
    fn verdict_compares_with_the_budget_and_headroom() {
        let t = |ms: u32| FrameTimings {
            total_us: ms * 1000,
            ..Default::default()
        };
        assert!(RealtimeCheck::new(&t(40)).holds());
        assert!(RealtimeCheck::new(&t(72)).holds());
        assert!(!RealtimeCheck::new(&t(73)).holds());
        assert!(!RealtimeCheck::new(&t(400)).holds());
        assert_eq!(RealtimeCheck::new(&t(160)).load(), 2.0);
    }
}
