//! [`super::Backend`] on top of the `runtime` crate.

use super::{AudioInput, BackendEvent, EventSource, FrameOut, InputReport, Stopper};

impl AudioInput for runtime::PcmProducer {
    fn push(&mut self, pcm: &[f32]) -> InputReport {
        let r = runtime::PcmProducer::push(self, pcm);
        InputReport {
            frames_completed: r.frames_completed,
            frames_dropped: r.frames_dropped,
            queued: r.queued,
        }
    }
}

impl EventSource for runtime::EventReceiver {
    fn recv(&mut self) -> Option<BackendEvent> {
        Some(match runtime::EventReceiver::recv(self)? {
            runtime::Event::Frame(f) => BackendEvent::Frame(FrameOut {
                pcm: f.pcm,
                text: f.text,
                step_us: u64::from(f.timings.total_us),
                queued: f.counters.queued,
            }),
            runtime::Event::Stopped(r) => BackendEvent::Stopped {
                max_steps: r == runtime::StopReason::MaxSteps,
            },
            runtime::Event::Error(e) => BackendEvent::Error(e.to_string()),
        })
    }
}

impl Stopper for runtime::SessionRunner {
    fn stop(&mut self) {
        if let Err(e) = runtime::SessionRunner::stop(self) {
            tracing::warn!("session worker ended badly: {e}");
        }
    }
}
