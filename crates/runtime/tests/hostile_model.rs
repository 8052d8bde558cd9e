//! Non-finite weights end to end: a copy of the tiny bundle with one NaN/Inf poked into an output
//! projection still opens (the weights are not scanned at load), but the session reports
//! `RuntimeError::NonFiniteLogits` as its last event instead of emitting tokens sampled from garbage.

use std::path::Path;
use std::time::Duration;

use model::sampling::SamplerConfig;
use runtime::{Engine, EngineOptions, Event, RuntimeError, Session, SessionOptions, FRAME_SIZE};
use testkit::poke_f32;

/// Runs a threaded session on `dir` for up to 10 frames of input; returns the frame events
/// received before the last event, and the last event.
fn run_session(dir: &Path, sampling: SamplerConfig) -> (usize, usize, Option<Event>) {
    let engine =
        Engine::open(dir, EngineOptions::default()).expect("non-finite weights still load");
    let opts = SessionOptions {
        sampling,
        ..Default::default()
    };
    let mut runner = Session::new(engine, opts).unwrap().spawn(16).unwrap();
    let mut producer = runner.producer().unwrap();
    let events = runner.events().unwrap();
    let pcm: Vec<f32> = (0..FRAME_SIZE)
        .map(|i| 0.3 * (i as f32 * 0.05).sin())
        .collect();
    let (mut frames, mut with_tokens) = (0, 0);
    let mut last = None;
    'outer: for _ in 0..10 {
        producer.push(&pcm);
        while let Ok(ev) = events.recv_timeout(Duration::from_millis(500)) {
            match ev {
                Event::Frame(f) => {
                    frames += 1;
                    if f.text_token.is_some() || f.audio_tokens.is_some() {
                        with_tokens += 1;
                    }
                }
                other => {
                    last = Some(other);
                    break 'outer;
                }
            }
        }
    }
    runner.stop().ok();
    (frames, with_tokens, last)
}

#[test]
fn nan_weights_end_the_session_with_a_typed_error() {
    // (tensor, row width, value, stream); row 5 of an output projection -> logit 5 non-finite.
    for (tensor, width, value, stream) in [
        ("text_linear.weight", 64, f32::NAN, "text"),
        ("linears.0.weight", 32, f32::INFINITY, "audio"),
    ] {
        for sampling in [SamplerConfig::greedy(), SamplerConfig::seeded(3)] {
            let dir = testkit::lm_bundle_copy("hostile-model");
            poke_f32(&dir.join("model.safetensors"), tensor, 5 * width, value);
            let (frames, with_tokens, last) = run_session(&dir, sampling);
            match last {
                Some(Event::Error(RuntimeError::NonFiniteLogits {
                    frame,
                    stream: s,
                    index,
                    ..
                })) => {
                    assert_eq!((s, index), (stream, 5), "{tensor}");
                    // The very first LM call already samples text and audio.
                    assert_eq!(frame, 0, "{tensor}");
                }
                other => panic!("{tensor} = {value}: expected NonFiniteLogits, got {other:?}"),
            }
            assert_eq!(frames, 0, "{tensor}: frames emitted before the error");
            assert_eq!(with_tokens, 0);
        }
    }
}

#[test]
fn control_copy_of_the_bundle_runs() {
    let dir = testkit::lm_bundle_copy("hostile-model");
    let (frames, with_tokens, last) = run_session(&dir, SamplerConfig::greedy());
    assert!(last.is_none(), "unexpected last event {last:?}");
    assert_eq!(frames, 10);
    assert_eq!(with_tokens, 9);
}
