//! A test double of [`crate::backend::Backend`] for protocol tests that must not depend on a model:
//! every input frame comes back as output audio (scaled by ½) after a configurable step time, with
//! a text piece every few frames. Same drop-oldest input policy as the runtime. Not a product path.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::backend::{
    AudioInput, Backend, BackendError, BackendInfo, Event, EventSource, FrameEvent, InputReport,
    OpenSession, StopReason, Stopper,
};
use crate::protocol::{SessionCommand, SessionParams};

/// Samples per model frame.
pub const FRAME: usize = 1920;

/// Echo backend (test double).
#[derive(Debug, Clone)]
pub struct EchoBackend {
    /// Simulated frame pass time.
    pub step_time: Duration,
    /// Bounded input queue (frames).
    pub max_queued_frames: usize,
    /// A text piece is produced every `text_every` frames.
    pub text_every: u64,
    /// Every command the sessions received, in order (shared by clones).
    pub commands: Arc<Mutex<Vec<SessionCommand>>>,
}

impl Default for EchoBackend {
    fn default() -> Self {
        Self {
            step_time: Duration::from_millis(2),
            max_queued_frames: 4,
            text_every: 3,
            commands: Arc::default(),
        }
    }
}

#[derive(Default)]
struct Shared {
    queue: VecDeque<Vec<f32>>,
    stop: bool,
}

struct Queue {
    state: Mutex<Shared>,
    cv: Condvar,
}

struct Input {
    q: Arc<Queue>,
    partial: Vec<f32>,
    cap: usize,
}

impl AudioInput for Input {
    fn push(&mut self, pcm: &[f32]) -> InputReport {
        let mut r = InputReport::default();
        let mut rest = pcm;
        while !rest.is_empty() {
            let take = (FRAME - self.partial.len()).min(rest.len());
            self.partial.extend_from_slice(&rest[..take]);
            rest = &rest[take..];
            if self.partial.len() == FRAME {
                let frame = std::mem::replace(&mut self.partial, Vec::with_capacity(FRAME));
                let mut s = self.q.state.lock().unwrap_or_else(|e| e.into_inner());
                if s.queue.len() >= self.cap {
                    s.queue.pop_front();
                    r.frames_dropped += 1;
                }
                s.queue.push_back(frame);
                r.frames_completed += 1;
                r.queued = s.queue.len();
                self.q.cv.notify_one();
            }
        }
        r
    }
}

struct Events {
    q: Arc<Queue>,
    step_time: Duration,
    text_every: u64,
    index: u64,
    max_steps: Option<u64>,
    done: bool,
}

impl EventSource for Events {
    fn recv(&mut self) -> Option<Event> {
        if self.done {
            return None;
        }
        if self.max_steps.is_some_and(|m| self.index >= m) {
            self.done = true;
            return Some(Event::Stopped(StopReason::MaxSteps));
        }
        let (frame, queued) = {
            let mut s = self.q.state.lock().unwrap_or_else(|e| e.into_inner());
            loop {
                if s.stop {
                    self.done = true;
                    return None;
                }
                if let Some(f) = s.queue.pop_front() {
                    break (f, s.queue.len());
                }
                s = self.q.cv.wait(s).unwrap_or_else(|e| e.into_inner());
            }
        };
        let t0 = Instant::now();
        // Busy wait to behave like CPU work (a sleep would not load the machine).
        while t0.elapsed() < self.step_time {
            std::hint::spin_loop();
        }
        let i = self.index;
        self.index += 1;
        let pcm = if i == 0 {
            Vec::new()
        } else {
            frame.iter().map(|x| 0.5 * x).collect()
        };
        let text = if i > 0 && i.is_multiple_of(self.text_every) {
            format!(" w{i}")
        } else {
            String::new()
        };
        Some(Event::Frame(FrameEvent {
            pcm,
            text,
            timings: runtime::FrameTimings {
                total_us: t0.elapsed().as_micros() as u32,
                ..Default::default()
            },
            counters: runtime::Counters {
                queued,
                ..Default::default()
            },
            ..Default::default()
        }))
    }
}

struct Stop {
    q: Arc<Queue>,
    commands: Arc<Mutex<Vec<SessionCommand>>>,
}

impl Stopper for Stop {
    fn stop(&mut self) {
        let mut s = self.q.state.lock().unwrap_or_else(|e| e.into_inner());
        s.stop = true;
        self.q.cv.notify_all();
    }

    fn command(&self, command: SessionCommand) -> bool {
        if command == SessionCommand::Reset {
            let mut s = self.q.state.lock().unwrap_or_else(|e| e.into_inner());
            s.queue.clear();
        }
        self.commands
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(command);
        true
    }
}

impl Backend for EchoBackend {
    fn info(&self) -> BackendInfo {
        BackendInfo {
            lm_model_file: "echo".into(),
            mimi_model_file: "echo".into(),
            instance_name: "echo-test".into(),
            ..Default::default()
        }
    }

    fn open(&self, params: &SessionParams) -> Result<OpenSession, BackendError> {
        let q = Arc::new(Queue {
            state: Mutex::new(Shared::default()),
            cv: Condvar::new(),
        });
        Ok(OpenSession {
            input: Box::new(Input {
                q: q.clone(),
                partial: Vec::with_capacity(FRAME),
                cap: self.max_queued_frames.max(1),
            }),
            events: Box::new(Events {
                q: q.clone(),
                step_time: self.step_time,
                text_every: self.text_every.max(1),
                index: 0,
                max_steps: params.max_steps,
                done: false,
            }),
            stopper: Box::new(Stop {
                q,
                commands: self.commands.clone(),
            }),
        })
    }
}
