//! [`super::Backend`] on top of the `runtime` crate.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use model::sampling::{SamplerConfig, SamplingParams};

use super::{
    AudioInput, Backend, BackendError, BackendInfo, Event, EventSource, FrameEvent, InputReport,
    OpenSession, SessionCommand, Stopper,
};
use crate::protocol::SessionParams;

/// Frames buffered between a session's worker and the server's output thread.
const EVENT_CAPACITY: usize = 16;

/// Serves conversations from one resident [`runtime::Engine`]: by default one
/// [`runtime::Session`] per client, driven by its own [`runtime::SessionRunner`] worker thread;
/// with [`RuntimeBackend::batch`] `> 1`, conversations share [`runtime::BatchRunner`]s of that
/// many slots (one worker thread and one batched LM step per runner).
pub struct RuntimeBackend {
    engine: Arc<runtime::Engine>,
    info: BackendInfo,
    /// Bounded input queue of each session (frames); when the model falls behind, the oldest
    /// queued frame is dropped (the runtime's policy).
    pub max_queued_frames: usize,
    /// Conversations per batched runner; 1 (default) = one `SessionRunner` per conversation.
    /// Runners are created when every existing one is full and kept for later conversations
    /// (admission, `ServeConfig::max_sessions`, bounds how many exist).
    pub batch: usize,
    runners: Mutex<Vec<Arc<runtime::BatchRunner>>>,
    seed_counter: AtomicU64,
}

impl RuntimeBackend {
    /// A backend over `engine`, described by `info` in the metadata message.
    pub fn new(engine: Arc<runtime::Engine>, info: BackendInfo) -> Self {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        Self {
            engine,
            info,
            max_queued_frames: 4,
            batch: 1,
            runners: Mutex::new(Vec::new()),
            seed_counter: AtomicU64::new(t),
        }
    }

    /// Batched runners created so far (0 unless [`RuntimeBackend::batch`] `> 1`).
    pub fn batch_runners(&self) -> usize {
        self.runners.lock().map_or(0, |r| r.len())
    }

    /// Starts `n` batched runners of [`RuntimeBackend::batch`] slots now (their KV caches allocated,
    /// their codecs warmed up), so that the first conversations do not pay for it and a failure shows
    /// at start-up. Does nothing when `batch` is 1 (single-session workers start per conversation).
    pub fn start_runners(&self, n: usize) -> Result<(), BackendError> {
        if self.batch <= 1 {
            return Ok(());
        }
        let mut runners = self.runners.lock().unwrap_or_else(|e| e.into_inner());
        while runners.len() < n {
            let r = runtime::BatchRunner::spawn(
                self.engine.clone(),
                runtime::BatchOptions {
                    slots: self.batch,
                    event_capacity: EVENT_CAPACITY,
                },
            )?;
            runners.push(Arc::new(r));
        }
        Ok(())
    }

    /// A free slot in an existing batched runner, or a new runner.
    fn open_batched(
        &self,
        opts: runtime::SessionOptions,
    ) -> Result<runtime::BatchSession, runtime::RuntimeError> {
        let mut runners = self.runners.lock().unwrap_or_else(|e| e.into_inner());
        for r in runners.iter() {
            match r.open(opts.clone()) {
                Err(runtime::RuntimeError::NoFreeSlot { .. })
                | Err(runtime::RuntimeError::RunnerStopped) => continue,
                other => return other,
            }
        }
        let r = Arc::new(runtime::BatchRunner::spawn(
            self.engine.clone(),
            runtime::BatchOptions {
                slots: self.batch,
                event_capacity: EVENT_CAPACITY,
            },
        )?);
        runners.retain(|r| !r.is_finished());
        runners.push(r.clone());
        tracing::info!(
            "batched runner {} started ({} slots)",
            runners.len(),
            self.batch
        );
        r.open(opts)
    }

    /// The sampler configuration of a session with `params` (seeds drawn by the server when the
    /// client gives none).
    pub fn sampler_config(&self, params: &SessionParams) -> SamplerConfig {
        let drawn = self
            .seed_counter
            .fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed);
        let mut c = SamplingParams {
            greedy: false,
            seed: params.text_seed.unwrap_or(drawn),
            text_temperature: params.text_temperature as f32,
            text_top_k: params.text_topk,
            audio_temperature: params.audio_temperature as f32,
            audio_top_k: params.audio_topk,
            // The query's "off" values: exp(0) = 1 and a penalty of 1 change nothing.
            pad_mult: (params.pad_mult != 0.0).then_some(params.pad_mult as f32),
            repetition_penalty: (params.repetition_penalty != 1.0)
                .then_some(params.repetition_penalty as f32),
            repetition_penalty_context: params.repetition_penalty_context,
        }
        .config();
        if let Some(s) = params.audio_seed {
            c.audio_seed = s;
        }
        c
    }
}

impl Backend for RuntimeBackend {
    fn info(&self) -> BackendInfo {
        self.info.clone()
    }

    fn open(&self, params: &SessionParams) -> Result<OpenSession, BackendError> {
        let opts = runtime::SessionOptions {
            sampling: self.sampler_config(params),
            max_queued_frames: self.max_queued_frames.max(1),
            output_rate: runtime::SAMPLE_RATE,
            max_steps: params.max_steps,
            first_frame_reset: true,
        };
        if self.batch > 1 {
            let mut s = self.open_batched(opts)?;
            return handed_out((s.producer(), s.events()), s);
        }
        let session = runtime::Session::new(self.engine.clone(), opts)?;
        let mut runner = session.spawn(EVENT_CAPACITY)?;
        handed_out((runner.producer(), runner.events()), runner)
    }
}

/// A freshly opened conversation as the server sees it: the producer and event receiver just taken from
/// its driver's `handle`, which stays behind to stop it.
fn handed_out(
    taken: (Option<runtime::PcmProducer>, Option<runtime::EventReceiver>),
    handle: impl Stopper + 'static,
) -> Result<OpenSession, BackendError> {
    let (Some(producer), Some(events)) = taken else {
        return Err(BackendError::Runtime(runtime::RuntimeError::ProducerTaken));
    };
    Ok(OpenSession {
        input: Box::new(producer),
        events: Box::new(events),
        stopper: Box::new(handle),
    })
}

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
    fn recv(&mut self) -> Option<Event> {
        runtime::EventReceiver::recv(self)
    }

    fn recycle(&mut self, frame: FrameEvent) {
        runtime::EventReceiver::recycle(self, frame);
    }
}

/// Maps a client command onto the runtime's session commands (all atomics; never blocks).
fn apply(control: &runtime::SessionControl, command: SessionCommand) {
    match command {
        SessionCommand::Pause => control.pause(),
        SessionCommand::Resume => control.resume(),
        SessionCommand::Reset => {
            control.reset();
        }
        SessionCommand::Interrupt => {
            control.interrupt();
        }
    }
}

/// [`Stopper`] for a runtime driver's conversation handle (the two drivers' handles have the same
/// `stop` and `control`); `what` names the driver in the log.
macro_rules! runtime_stopper {
    ($handle:ty, $what:literal) => {
        impl Stopper for $handle {
            fn stop(&mut self) {
                if let Err(e) = <$handle>::stop(self) {
                    tracing::warn!("{} ended badly: {e}", $what);
                }
            }

            fn command(&self, command: SessionCommand) -> bool {
                apply(&self.control(), command);
                true
            }
        }
    };
}

runtime_stopper!(runtime::BatchSession, "batch slot");
runtime_stopper!(runtime::SessionRunner, "session worker");
