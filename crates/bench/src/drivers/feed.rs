//! The `duplex` benchmarks' frame pass as a caller sees it, on the CPU and on the GPU alike: a
//! [`runtime::Session`] on its [`runtime::SessionRunner`] worker thread, fed one frame at a time from a
//! looping test signal, its answer awaited and its buffers recycled; and the phases of the answered frames.

use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context, Result};

use super::args::stats;

/// The test signal of a duplex run of `frames` timed frames per round over `rounds` rounds (and three warm-up
/// frames), at the session's input rate.
pub(crate) fn duplex_signal(frames: usize, rounds: usize) -> Vec<f32> {
    crate::mimi::test_signal(
        (frames * rounds + 3) * runtime::FRAME_SIZE,
        runtime::SAMPLE_RATE as usize,
    )
}

/// A session on its worker thread, fed from a signal one frame at a time.
pub(crate) struct SessionFeed {
    runner: runtime::SessionRunner,
    producer: runtime::PcmProducer,
    events: runtime::EventReceiver,
    /// Frames pushed so far (the next is this one modulo the signal's frames).
    fed: usize,
    /// Frames the session has answered: its position, as a frame index.
    processed: u64,
}

impl SessionFeed {
    /// A session of `engine` whose output is resampled to `output_rate`, started on its worker thread.
    pub(crate) fn start(engine: Arc<runtime::Engine>, output_rate: u32) -> Result<SessionFeed> {
        let session = runtime::Session::new(
            engine,
            runtime::SessionOptions {
                output_rate,
                ..Default::default()
            },
        )?;
        let mut runner = session.spawn(16)?;
        let producer = runner.producer().context("runner producer")?;
        let events = runner.events().context("runner events")?;
        Ok(SessionFeed {
            runner,
            producer,
            events,
            fed: 0,
            processed: 0,
        })
    }

    /// One frame through the session: push the next frame of `pcm`, wait for the answer, recycle its
    /// buffers. The push-to-answer time in ms and the session's own timings of the pass.
    pub(crate) fn pass(&mut self, pcm: &[f32]) -> Result<(f64, runtime::FrameTimings)> {
        let f = self.fed % (pcm.len() / runtime::FRAME_SIZE);
        self.fed += 1;
        let frame = &pcm[f * runtime::FRAME_SIZE..(f + 1) * runtime::FRAME_SIZE];
        let t = Instant::now();
        self.producer.push(frame);
        let ev = match self.events.recv() {
            Some(runtime::Event::Frame(ev)) => ev,
            Some(other) => bail!("duplex session ended: {other:?}"),
            None => bail!("duplex session ended"),
        };
        let ms = t.elapsed().as_secs_f64() * 1e3;
        let timings = ev.timings;
        self.processed = ev.frame_index + 1;
        self.events.recycle(ev);
        Ok((ms, timings))
    }

    /// Frames the session has answered so far.
    pub(crate) fn processed(&self) -> u64 {
        self.processed
    }

    /// Stops the session's worker and joins it.
    pub(crate) fn stop(mut self) -> Result<()> {
        self.runner.stop()?;
        Ok(())
    }
}

/// The phases of the frames a [`SessionFeed`] answered, ms each.
#[derive(Default, Clone)]
pub(crate) struct Phases {
    /// Push of a frame to its answer (the worker's wake-up, the pass, the event queue).
    pub(crate) e2e: Vec<f64>,
    /// The pass as the worker timed it (encode + LM + decode).
    pub(crate) pass: Vec<f64>,
    pub(crate) encode: Vec<f64>,
    pub(crate) lm: Vec<f64>,
    pub(crate) decode: Vec<f64>,
    pub(crate) resample: Vec<f64>,
    pub(crate) detok: Vec<f64>,
    pub(crate) lag: Vec<f64>,
}

/// Microseconds as ms.
fn ms(us: u32) -> f64 {
    f64::from(us) / 1e3
}

impl Phases {
    /// A frame answered after `e2e` ms whose pass the session timed as `t`.
    pub(crate) fn push(&mut self, e2e: f64, t: &runtime::FrameTimings) {
        self.e2e.push(e2e);
        self.pass.push(ms(t.total_us));
        self.encode.push(ms(t.encode_us));
        self.lm.push(ms(t.lm_us));
        self.decode.push(ms(t.decode_us));
        self.resample.push(ms(t.resample_us));
        self.detok.push(ms(t.detok_us));
        self.lag.push(ms(t.lag_us));
    }

    /// The key=value pairs of the phases' medians on a `result` line.
    pub(crate) fn medians_text(&self) -> String {
        let med = |v: &[f64]| stats(v).0;
        format!(
            "encode_ms={:.2} lm_ms={:.1} decode_ms={:.2} resample_ms={:.3} detok_ms={:.3} lag_ms={:.1}",
            med(&self.encode),
            med(&self.lm),
            med(&self.decode),
            med(&self.resample),
            med(&self.detok),
            med(&self.lag)
        )
    }

    /// The key=value pairs of one frame's phases on a `--per-frame` line.
    pub(crate) fn frame_text(e2e: f64, t: &runtime::FrameTimings) -> String {
        format!(
            "e2e={e2e:.2} pass={:.2} encode={:.2} lm={:.2} decode={:.2} resample={:.3} detok={:.3} lag={:.2}",
            ms(t.total_us),
            ms(t.encode_us),
            ms(t.lm_us),
            ms(t.decode_us),
            ms(t.resample_us),
            ms(t.detok_us),
            ms(t.lag_us)
        )
    }
}
