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

/// What `probe` (with the `bench` feature) measured at start-up, after warm-up passes that are not counted (GPU pipelines
/// compiled, weights faulted in, caches warm); every figure is a median of the timed passes.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Probe {
    /// One conversation's full frame pass (encode, LM, decode) at KV position 0.
    pub start: FrameTimings,
    /// Conversations of the batched LM steps timed below (1 = none batched).
    pub rows: usize,
    /// LM step of `rows` conversations together at KV position 0, microseconds.
    pub rows_start_lm_us: u32,
    /// KV position of the full-context steps: the LM's temporal context (its KV window), in frames.
    pub context: usize,
    /// LM step of one conversation at the full context, microseconds.
    pub full_lm_us: u32,
    /// LM step of `rows` conversations together, each at the full context, microseconds.
    pub rows_full_lm_us: u32,
}

/// Times what the start-up real-time notice needs: one conversation's whole frame pass at KV position
/// 0 ([`time_passes`]), then the LM step of one and of `rows` conversations stepped together (the
/// batched worker's step), at position 0 and with every KV cache seeked to the full context (the
/// worst case a conversation reaches after `context` frames; the caches hold meaningless entries, so
/// attention reads exactly as many keys). Each shape runs once uncounted, then `passes` times (median).
/// The `rows` full-context KV caches are allocated here and freed on return (call it before the
/// serving workers allocate theirs). The engine's sessions are unaffected.
#[cfg(feature = "bench")]
pub fn probe(engine: &Arc<Engine>, rows: usize, passes: usize) -> Result<Probe, RuntimeError> {
    use crate::stepper::{lm_error, Stepper};
    let start = time_passes(engine, passes)?;
    let rows = rows.max(1);
    let passes = passes.max(1);
    let compute = engine.workers();
    let mut st = Stepper::new(engine, &compute, rows, None)?;
    let codes = [0u32; crate::N_AUDIO];
    // One LM step of rows 0..n; a row's sampling error is an error here too.
    let step = |st: &mut Stepper, n: usize| -> Result<u32, RuntimeError> {
        st.begin_tick();
        for r in 0..n {
            st.admit_with(r, &codes, None);
        }
        st.step_lm()?;
        for i in 0..n {
            st.take_result(i).map_err(|e| lm_error(e, 0))?;
        }
        Ok(st.lm_us())
    };
    let median = |st: &mut Stepper, n: usize| -> Result<u32, RuntimeError> {
        step(st, n)?;
        let mut t = Vec::with_capacity(passes);
        for _ in 0..passes {
            t.push(step(st, n)?);
        }
        t.sort_unstable();
        Ok(t[t.len() / 2])
    };
    // Position 0: a few steps in, far from any context length.
    let rows_start_lm_us = if rows > 1 {
        median(&mut st, rows)?
    } else {
        start.lm_us
    };
    let context = st.seek(engine.lm_spec().context);
    let full_lm_us = median(&mut st, 1)?;
    let rows_full_lm_us = if rows > 1 {
        median(&mut st, rows)?
    } else {
        full_lm_us
    };
    Ok(Probe {
        start,
        rows,
        rows_start_lm_us,
        context,
        full_lm_us,
        rows_full_lm_us,
    })
}

/// The verdict on one measured frame pass.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RealtimeCheck {
    /// Milliseconds of the full frame pass.
    pub frame_ms: f64,
}

impl RealtimeCheck {
    /// The verdict on `full`, a full frame pass as [`Session::warm_up`] or [`time_passes`] times it.
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

    /// The probe's shapes are all timed and the full context costs the LM something more than
    /// position 0 can without it: the fixture LM's context is 10 frames, so the seek puts 10 keys in
    /// every cache. (No timing is asserted beyond "each shape was stepped": the figures are medians of
    /// real passes.)
    #[test]
    fn probe_times_every_shape_at_both_positions() {
        let e = fixture_engine(1);
        let p = probe(&e, 3, 2).unwrap();
        assert_eq!((p.rows, p.context), (3, 10), "{p:?}");
        assert_eq!(
            p.start.total_us,
            p.start.encode_us + p.start.lm_us + p.start.decode_us
        );
        for us in [p.rows_start_lm_us, p.full_lm_us, p.rows_full_lm_us] {
            assert!(us > 0, "{p:?}");
        }
        // One row: the batched figures are the single ones.
        let p = probe(&e, 1, 1).unwrap();
        assert_eq!(p.rows, 1);
        assert_eq!(p.rows_start_lm_us, p.start.lm_us);
        assert_eq!(p.rows_full_lm_us, p.full_lm_us);
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
