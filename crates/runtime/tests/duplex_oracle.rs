//! Parity with the oracle's emulation of `moshi/server.py` (fixtures/duplex, moshi 0.2.13, greedy, tiny bundle):
//! the first frame is encoded, Mimi is reset, its codes go to LMGen call 0; every later LM output is decoded.

mod common;

use std::path::PathBuf;

use common::*;
use runtime::{Session, Step};
use testkit::TensorFile;

fn fixture(name: &str) -> PathBuf {
    testkit::fixtures_dir("duplex").join(name)
}

#[test]
fn server_loop_matches_the_python_server_emulation() {
    let trace = TensorFile::open(fixture("trace.safetensors"));
    let (text, text_shape) = trace.i64("text_tokens");
    let (audio, audio_shape) = trace.i64("audio_tokens");
    let (want_pcm, _) = trace.f32("pcm");
    let s_out = text_shape[0];
    assert_eq!(audio_shape, [8, s_out]);
    let input = runtime::audio::read_wav_strict(fixture("input.wav")).unwrap();

    // Same message sizes as the emulated WebSocket client; a queue large enough that nothing is dropped.
    let opts = queued_greedy(64);
    let mut s = Session::new(engine(), opts).unwrap();
    let mut got = Collected::default();
    let sizes = [960usize, 1500, 2000, 1920, 700, 3840];
    let (mut pos, mut i) = (0, 0);
    while pos < input.len() {
        let end = (pos + sizes[i % sizes.len()]).min(input.len());
        i += 1;
        s.push_pcm(&input[pos..end]).unwrap();
        pos = end;
        while got.record(s.step().unwrap()) {}
    }
    assert!(matches!(s.step().unwrap(), Step::Idle));
    assert_eq!(
        got.text_tokens.len(),
        s_out + 1,
        "one LM call per whole input frame; the tail is dropped"
    );
    assert_eq!(got.text_tokens[0], None);

    let got_text: Vec<i64> = got.text_tokens[1..]
        .iter()
        .map(|t| i64::from(t.unwrap()))
        .collect();
    assert_eq!(got_text, text, "text tokens");
    for (t, frame) in got.audio[1..].iter().enumerate() {
        let frame = frame.unwrap();
        for (k, &code) in frame.iter().enumerate() {
            assert_eq!(
                i64::from(code),
                audio[k * s_out + t],
                "audio token: codebook {k}, output {t}"
            );
        }
    }
    assert_eq!(got.pcm.len(), want_pcm.len());
    let max_err = testkit::compare::max_abs_diff(&got.pcm, &want_pcm);
    eprintln!(
        "duplex parity: {} outputs, pcm max abs error {max_err:e}",
        s_out
    );
    assert!(max_err <= 1e-4, "pcm max abs error {max_err}");

    // The text the session emitted (what the server sends as kind-2 messages, one per frame with
    // text) is Python's: `id_to_piece` with "▁" → " " for ids other than 0 and 3.
    let messages: Vec<&str> = got
        .texts
        .iter()
        .filter(|t| !t.is_empty())
        .map(String::as_str)
        .collect();
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixture("text_messages.json")).unwrap())
            .unwrap();
    let want: Vec<&str> = json["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m.as_str().unwrap())
        .collect();
    // Known difference: Python's server also sends the pieces of control tokens ("<s>" for id 1
    // here, twice), which the session's detokenizer does not emit. Everything else is identical, in
    // order.
    let control = ["<s>", "</s>"];
    assert!(want.iter().filter(|m| control.contains(m)).count() == 2);
    let want_without_control: Vec<&str> = want
        .iter()
        .copied()
        .filter(|m| !control.contains(m))
        .collect();
    assert_eq!(messages, want_without_control);
}
