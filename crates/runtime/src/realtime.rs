//! Can this machine hold real time? A frame pass must take under one frame of audio (80 ms), or input
//! queues up and the oldest frames are dropped. [`warm_up`] runs the first frames of a throwaway session
//! of an engine (which also faults in the weights and buffers the first frames touch) and reports how
//! long a full frame pass took; [`RealtimeCheck`] turns that into a verdict.

use std::sync::Arc;

use crate::{Engine, FrameTimings, RuntimeError, Session, SessionOptions, Step, FRAME_SIZE};

/// Wall time of one frame of audio, the budget of a frame pass.
pub const FRAME_BUDGET_MS: f64 = 80.0;

/// Share of the budget a frame pass may take and still be called real time: the worker also wakes up,
/// the consumer encodes and sends, and other processes take their share of the cores.
pub const HEADROOM: f64 = 0.9;

/// What [`warm_up`] measured.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WarmUp {
    /// The first frame (LM call 0: encode and the LM step, nothing to decode yet), including first-touch costs.
    pub first: FrameTimings,
    /// The second frame: a full pass (encode, LM, decode), the one the verdict is based on.
    pub full: FrameTimings,
}

/// Runs two frames of quiet noise through a fresh session of `engine` (on its device and thread count,
/// default sampling), then drops the session. The engine's sessions are unaffected.
pub fn warm_up(engine: &Arc<Engine>) -> Result<WarmUp, RuntimeError> {
    let mut s = Session::new(
        engine.clone(),
        SessionOptions {
            max_queued_frames: 2,
            ..Default::default()
        },
    )?;
    // Low-level noise (a deterministic LCG), not silence: the pass does the same work either way, but
    // nothing downstream special-cases noise.
    let mut x = 0x2545_f491u32;
    let pcm: Vec<f32> = (0..2 * FRAME_SIZE)
        .map(|_| {
            x = x.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            ((x >> 8) as f32 / (1u32 << 24) as f32 - 0.5) * 0.01
        })
        .collect();
    s.push_pcm(&pcm)?;
    let mut frames = [FrameTimings::default(); 2];
    for f in &mut frames {
        match s.step()? {
            Step::Frame(ev) => *f = ev.timings,
            other => {
                return Err(RuntimeError::Model(format!(
                    "warm-up: no frame from a fresh session ({other:?})"
                )))
            }
        }
    }
    Ok(WarmUp {
        first: frames[0],
        full: frames[1],
    })
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

    #[test]
    fn warm_up_times_two_frames_and_only_the_second_decodes() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/lm");
        let engine = Engine::open(&dir, EngineOptions::cpu(1)).unwrap();
        let w = warm_up(&engine).unwrap();
        assert_eq!(w.first.decode_us, 0, "call 0 has nothing to decode");
        assert!(w.full.lm_us > 0 && w.full.encode_us > 0);
        assert_eq!(
            w.full.total_us,
            w.full.encode_us + w.full.lm_us + w.full.decode_us
        );
        assert!(w.full.lag_us >= w.full.total_us);
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
