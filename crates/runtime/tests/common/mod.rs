//! Helpers shared by the runtime's integration tests (tiny bundle in `fixtures/lm`).
#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use model::sampling::SamplerConfig;
use runtime::{
    Engine, EngineOptions, Event, EventReceiver, FrameEvent, PcmProducer, Session, SessionOptions,
    Step, FRAME_SIZE,
};

/// The tiny Moshi bundle produced by the oracle.
pub fn bundle_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/lm")
}

/// The tiny engine (opened once per test binary).
pub fn engine() -> Arc<Engine> {
    static E: OnceLock<Arc<Engine>> = OnceLock::new();
    E.get_or_init(|| {
        Engine::open(&bundle_dir(), EngineOptions::default()).expect("open tiny bundle")
    })
    .clone()
}

/// Deterministic test speech stand-in: a slow chirp plus a little pseudo-random noise.
pub fn signal(frames: usize, seed: u64) -> Vec<f32> {
    let n = frames * FRAME_SIZE;
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|i| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let noise = ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.05;
            let t = i as f32 / 24_000.0;
            let f = 150.0 + 900.0 * ((t * 0.37).sin() * 0.5 + 0.5);
            0.4 * (std::f32::consts::TAU * f * t).sin() + noise
        })
        .collect()
}

/// Greedy options (deterministic tokens).
pub fn greedy() -> SessionOptions {
    SessionOptions {
        sampling: SamplerConfig::greedy(),
        ..Default::default()
    }
}

/// A greedy session on the tiny bundle.
pub fn greedy_session() -> Session {
    Session::new(engine(), greedy()).unwrap()
}

/// [`greedy`] with room for `max_queued_frames` input frames.
pub fn queued_greedy(max_queued_frames: usize) -> SessionOptions {
    SessionOptions {
        max_queued_frames,
        ..greedy()
    }
}

/// Sampling options with a fixed seed.
pub fn sampled(seed: u64) -> SessionOptions {
    SessionOptions {
        sampling: SamplerConfig::seeded(seed),
        ..Default::default()
    }
}

/// Everything a run produced, frame by frame.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Collected {
    pub frame_index: Vec<u64>,
    pub epoch: Vec<u64>,
    pub text_tokens: Vec<Option<u32>>,
    pub audio: Vec<Option<[u32; 8]>>,
    pub pcm: Vec<f32>,
    pub text: String,
    /// The text of every frame, in order (empty when a frame has none).
    pub texts: Vec<String>,
}

impl Collected {
    /// Record one step's output; returns whether a frame was produced.
    pub fn record(&mut self, step: Step<'_>) -> bool {
        match step {
            Step::Frame(f) => {
                self.record_event(f);
                true
            }
            _ => false,
        }
    }

    /// Record one frame event of a threaded driver (`SessionRunner`, `BatchRunner`).
    pub fn record_event(&mut self, f: &FrameEvent) {
        self.frame_index.push(f.frame_index);
        self.epoch.push(f.epoch);
        self.text_tokens.push(f.text_token);
        self.audio.push(f.audio_tokens);
        self.pcm.extend_from_slice(&f.pcm);
        self.text.push_str(&f.text);
        self.texts.push(f.text.clone());
    }
}

/// Push `pcm` one frame at a time, stepping after each push until idle.
pub fn feed(session: &mut Session, pcm: &[f32], out: &mut Collected) {
    for chunk in pcm.chunks(FRAME_SIZE) {
        session.push_pcm(chunk).unwrap();
        while out.record(session.step().unwrap()) {}
    }
}

/// A fresh session fed `pcm` from start to end.
pub fn run(opts: SessionOptions, pcm: &[f32]) -> Collected {
    let mut s = Session::new(engine(), opts).unwrap();
    let mut c = Collected::default();
    feed(&mut s, pcm, &mut c);
    c
}

/// Compare two runs field by field, reporting the first difference compactly.
#[track_caller]
pub fn assert_same(got: &Collected, want: &Collected) {
    assert_eq!(got.frame_index, want.frame_index, "frame indices");
    assert_eq!(got.epoch, want.epoch, "epochs");
    for (i, (g, w)) in got.text_tokens.iter().zip(&want.text_tokens).enumerate() {
        assert_eq!(g, w, "text token at frame {i}");
    }
    assert_eq!(got.text_tokens.len(), want.text_tokens.len(), "frame count");
    for (i, (g, w)) in got.audio.iter().zip(&want.audio).enumerate() {
        assert_eq!(g, w, "audio tokens at frame {i}");
    }
    assert_eq!(got.pcm.len(), want.pcm.len(), "pcm length");
    if let Some(i) = got.pcm.iter().zip(&want.pcm).position(|(a, b)| a != b) {
        panic!(
            "pcm differs first at sample {i} (frame {}): {} vs {}",
            i / FRAME_SIZE,
            got.pcm[i],
            want.pcm[i]
        );
    }
    assert_eq!(got.text, want.text, "text");
}

/// Pushes one input frame into `mic`, waits for its output frame and hands the frame's buffers
/// back for reuse (any other event panics).
pub fn push_and_recycle(mic: &mut PcmProducer, ev: &EventReceiver, frame: &[f32]) {
    mic.push(frame);
    match ev.recv() {
        Some(Event::Frame(e)) => {
            std::hint::black_box(e.pcm.len());
            ev.recycle(e);
        }
        other => panic!("{other:?}"),
    }
}
