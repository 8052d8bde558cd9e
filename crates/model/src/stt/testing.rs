//! The speech-to-text oracle fixtures (`fixtures/stt/{1b,2b6}`, `tools/oracle/gen_stt.py`) as the
//! parity tests read them: this crate's (CPU), the GPU crate's and the front ends' (runtime, C ABI,
//! CLI) compare their events to the same JSON the same way. Test helpers (behind the `testing` feature): they panic on a missing or
//! malformed fixture, which is a failed test.

use std::path::PathBuf;
use std::sync::Arc;

use kernels::Pool;
use serde_json::Value;

use super::{SttBatch, SttEvent, SttModel, SttStream};
use crate::checkpoint::Bundle;
use crate::lm::LmBackend;

/// The fixture variants: `kyutai/stt-1b-en_fr` and `kyutai/stt-2.6b-en` at the tiny size.
pub const VARIANTS: [&str; 2] = ["1b", "2b6"];

/// `fixtures/stt/<v>` of this repository.
pub fn fixture_dir(v: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures/stt")
        .join(v)
}

/// The model of variant `v`, loaded on one thread.
pub fn load(v: &str) -> Arc<SttModel> {
    let b = Bundle::open(&fixture_dir(v)).unwrap();
    Arc::new(SttModel::load(&b, &Pool::new(1)).unwrap())
}

/// The oracle's `events.json` of variant `v` (events, crafted events, plan).
pub fn events_json(v: &str) -> Value {
    let text = std::fs::read_to_string(fixture_dir(v).join("events.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

/// An event as the oracle writes it (JSON), for an exact comparison (f64 times and f32
/// probabilities compared as numbers parsed from the same JSON text the oracle wrote).
pub fn to_json(e: &SttEvent) -> Value {
    match e {
        SttEvent::Step { step_idx, .. } => serde_json::json!({
            "type": "Step", "step_idx": step_idx,
            "prs": e.prs().iter().map(|&p| f64::from(p)).collect::<Vec<_>>()}),
        SttEvent::Word { tokens, start_time } => {
            serde_json::json!({"type": "Word", "tokens": tokens.as_slice(), "start_time": start_time})
        }
        SttEvent::EndWord { stop_time } => {
            serde_json::json!({"type": "EndWord", "stop_time": stop_time})
        }
    }
}

/// Compares event lists: types, tokens, step indices and times exact; `Step` probabilities within
/// `tol`.
pub fn assert_events(got: &[SttEvent], want: &Value, tol: f64, what: &str) {
    let got: Vec<Value> = got.iter().map(to_json).collect();
    assert_json_events(&got, want, tol, what, |g, w, at| assert_eq!(g, w, "{at}"));
}

/// Compares events written as JSON by a front end (the runtime's transcriber, the C ABI, the CLI's
/// `--json`) with the oracle's `want`: `EndOfTurn` events in `got` are left out (the oracle writes
/// none; each caller checks them its own way); the rest have the oracle's types in its order, each
/// `Step` its step index exact and its probabilities within `tol`. Every other event goes to
/// `other(got, want, at)` (`at` names the event for a message), as each front end writes words in
/// its own fields.
pub fn assert_json_events(
    got: &[Value],
    want: &Value,
    tol: f64,
    what: &str,
    mut other: impl FnMut(&Value, &Value, &str),
) {
    let got: Vec<&Value> = got.iter().filter(|e| e["type"] != "EndOfTurn").collect();
    let want = want.as_array().unwrap();
    assert_eq!(got.len(), want.len(), "{what}: event count");
    for (i, (g, w)) in got.into_iter().zip(want).enumerate() {
        let at = format!("{what} event {i}");
        assert_eq!(g["type"], w["type"], "{at}");
        if w["type"] == "Step" {
            assert_eq!(g["step_idx"], w["step_idx"], "{at}");
            let (gp, wp) = (g["prs"].as_array().unwrap(), w["prs"].as_array().unwrap());
            assert_eq!(gp.len(), wp.len(), "{at}");
            for (a, b) in gp.iter().zip(wp) {
                let (a, b) = (a.as_f64().unwrap(), b.as_f64().unwrap());
                assert!((a - b).abs() <= tol, "{at}: prs {a} vs {b}");
            }
        } else {
            other(g, w, &at);
        }
    }
}

/// What a stream gives for `pcm` pushed in uneven chunks of 1000 samples (the stream frames them
/// itself), then flushed: per step its text token and the audio codes it fed (codebooks 1..;
/// step t >= 1 feeds frame t's), and every event.
pub fn transcribe<B: LmBackend + ?Sized>(
    s: &mut SttStream<B>,
    pcm: &[f32],
) -> (Vec<i64>, Vec<Vec<u32>>, Vec<SttEvent>) {
    let (mut text, mut codes, mut events) = (Vec::new(), Vec::new(), Vec::new());
    let mut on_step = |b: &SttBatch<B>, ev: &[SttEvent]| {
        text.push(b.text_tokens()[0].unwrap() as i64);
        codes.push(b.last_inputs()[1..].to_vec());
        events.extend_from_slice(ev);
    };
    for chunk in pcm.chunks(1000) {
        s.push_pcm(chunk, &mut on_step).unwrap();
    }
    s.flush(&mut on_step).unwrap();
    (text, codes, events)
}
