//! The caller-driven transcriber (`runtime::Transcriber`) on the oracle's STT bundles (`fixtures/stt/{1b,2b6}`,
//! `tools/oracle/gen_stt.py`): pushed in uneven pieces, pulled and flushed, its events are the oracle's
//! (`events.json`: steps, tokens and times exact, voice-activity probabilities within 1e-4); reset, refusals
//! and the end-of-turn rule.

use std::path::PathBuf;
use std::sync::Arc;

use model::stt::testing::assert_json_events;
use runtime::{EngineOptions, SttEngine, Transcriber, TranscriberOptions, TranscriptEvent};
use serde_json::{json, Value};

fn dir(v: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures/stt")
        .join(v)
}

fn engine(v: &str) -> Arc<SttEngine> {
    SttEngine::open(&dir(v), EngineOptions::cpu(1)).unwrap()
}

fn oracle(v: &str) -> Value {
    let text = std::fs::read_to_string(dir(v).join("events.json")).unwrap();
    serde_json::from_str::<Value>(&text).unwrap()
}

/// A float32 WAV's samples (the oracle's `input.wav`).
fn input(v: &str) -> Vec<f32> {
    runtime::audio::read_wav_strict(dir(v).join("input.wav")).unwrap()
}

/// An event as the oracle writes it (`Step`, `Word` with tokens, `EndWord`), or `None` for `EndOfTurn`
/// (not an oracle event; checked separately).
fn to_json(e: &TranscriptEvent<'_>) -> Option<Value> {
    Some(match *e {
        TranscriptEvent::Step { step_idx, prs } => json!({"type": "Step", "step_idx": step_idx,
            "prs": prs.iter().map(|&p| f64::from(p)).collect::<Vec<_>>()}),
        TranscriptEvent::Word {
            tokens, start_time, ..
        } => json!({"type": "Word", "tokens": tokens, "start_time": start_time}),
        TranscriptEvent::EndWord { stop_time, .. } => {
            json!({"type": "EndWord", "stop_time": stop_time})
        }
        TranscriptEvent::EndOfTurn { .. } => return None,
    })
}

/// Every event of `pcm` pushed in `chunk`-sample pieces (pulling after each), then flushed.
fn transcribe(t: &mut Transcriber, pcm: &[f32], chunk: usize) -> Vec<Value> {
    let mut out = Vec::new();
    let spm = t.engine().tokenizer().clone();
    let drain = |t: &mut Transcriber, out: &mut Vec<Value>| {
        while let Some(e) = t.pull().unwrap() {
            let j = to_json(&e).unwrap_or_else(|| {
                let TranscriptEvent::EndOfTurn {
                    step_idx,
                    probability,
                    ..
                } = e
                else {
                    unreachable!()
                };
                json!({"type": "EndOfTurn", "step_idx": step_idx, "p": probability})
            });
            if let TranscriptEvent::Word { text, tokens, .. } = e {
                let want = spm.decode(tokens).unwrap();
                assert_eq!(text, want.trim(), "word text");
            }
            out.push(j);
        }
    };
    for c in pcm.chunks(chunk) {
        t.push(c).unwrap();
        drain(t, &mut out);
    }
    t.flush();
    drain(t, &mut out);
    out
}

/// Compares with the oracle's events: types, steps, tokens and times exact, probabilities within 1e-4.
fn assert_oracle(got: &[Value], want: &Value, what: &str) {
    assert_json_events(got, want, 1e-4, what, |g, w, at| assert_eq!(g, w, "{at}"));
}

#[test]
fn events_are_the_oracles_whatever_the_push_sizes() {
    for v in ["1b", "2b6"] {
        let e = engine(v);
        let want = oracle(v);
        let pcm = input(v);
        let frames = want["plan"]["frames"].as_u64().unwrap() as usize;
        let mut t = Transcriber::new(e.clone(), TranscriberOptions::default()).unwrap();
        for chunk in [1000, 1920, 7, pcm.len()] {
            let got = transcribe(&mut t, &pcm, chunk);
            assert_oracle(&got, &want["events"], &format!("{v}, pushes of {chunk}"));
            // The oracle's frames: prefix + audio + flush.
            assert_eq!(t.steps(), frames, "{v}: steps");
            assert!(got.iter().any(|e| e["type"] == "Word"), "{v}: no word");
            t.reset();
        }
    }
}

#[test]
fn end_of_turn_follows_kyutais_rule() {
    let e = engine("1b");
    let mut t = Transcriber::new(e.clone(), TranscriberOptions::default()).unwrap();
    let got = transcribe(&mut t, &input("1b"), 1920);
    // Rebuilt from the oracle's steps: head 2 above 0.5, once until the next word or word end.
    let mut want = Vec::new();
    let mut armed = true;
    for ev in oracle("1b")["events"].as_array().unwrap() {
        match ev["type"].as_str().unwrap() {
            "Step" => {
                let p = ev["prs"][2].as_f64().unwrap();
                if p > 0.5 && armed {
                    armed = false;
                    want.push(ev["step_idx"].as_u64().unwrap());
                }
            }
            _ => armed = true,
        }
    }
    let eot: Vec<u64> = got
        .iter()
        .filter(|e| e["type"] == "EndOfTurn")
        .map(|e| e["step_idx"].as_u64().unwrap())
        .collect();
    assert_eq!(eot, want);
    assert!(!want.is_empty(), "the fixture has no end of turn");
    // Each comes right after its step's Step event.
    for (i, e) in got.iter().enumerate() {
        if e["type"] == "EndOfTurn" {
            assert_eq!(got[i - 1]["type"], "Step");
            assert_eq!(got[i - 1]["step_idx"], e["step_idx"]);
            assert!(e["p"].as_f64().unwrap() > 0.5);
        }
    }
    // A threshold above 1 never fires; a head the model lacks never fires.
    for opts in [
        TranscriberOptions {
            end_of_turn_threshold: 1.0,
            ..Default::default()
        },
        TranscriberOptions {
            end_of_turn_head: 4,
            ..Default::default()
        },
    ] {
        let mut t = Transcriber::new(e.clone(), opts).unwrap();
        let got = transcribe(&mut t, &input("1b"), 1920);
        assert!(got.iter().all(|e| e["type"] != "EndOfTurn"));
    }
}

#[test]
fn reset_mid_stream_and_refusals_leave_a_fresh_stream() {
    let e = engine("1b");
    let pcm = input("1b");
    let mut fresh = Transcriber::new(e.clone(), TranscriberOptions::default()).unwrap();
    let want = transcribe(&mut fresh, &pcm, 1920);

    let mut t = Transcriber::new(e.clone(), TranscriberOptions::default()).unwrap();
    // Half a stream, some events left unpulled, then reset.
    t.push(&pcm[..pcm.len() / 2]).unwrap();
    assert!(t.pull().unwrap().is_some());
    t.reset();
    assert_eq!(
        (t.steps(), t.pending_samples(), t.queued_events()),
        (0, 0, 0)
    );
    assert!(t.pull().unwrap().is_none());
    // A refused push queues nothing.
    let mut bad = pcm[..3000].to_vec();
    bad[2999] = f32::NAN;
    let err = t.push(&bad).unwrap_err().to_string();
    assert!(err.contains("2999"), "{err}");
    assert_eq!(t.pending_samples(), 0);
    bad[2999] = f32::INFINITY;
    assert!(t.push(&bad).is_err());
    assert_eq!(transcribe(&mut t, &pcm, 1920), want);
}

#[test]
fn opening_refuses_other_bundles_and_options() {
    let lm = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/lm");
    let err = SttEngine::open(&lm, EngineOptions::cpu(1)).unwrap_err();
    assert!(matches!(err, runtime::RuntimeError::Model(_)), "{err}");
    assert!(err.to_string().contains("speech-to-text"), "{err}");
    let err = SttEngine::open(&dir("1b"), EngineOptions::cpu(0)).unwrap_err();
    assert!(
        matches!(err, runtime::RuntimeError::InvalidOption(_)),
        "{err}"
    );
    let gpu = EngineOptions {
        device: runtime::Device::Gpu {
            adapter: None,
            threads: 1,
        },
        ..Default::default()
    };
    assert!(SttEngine::open(&dir("1b"), gpu).is_err());
    let e = engine("1b");
    let opts = TranscriberOptions {
        reserve_frames: 0,
        ..Default::default()
    };
    assert!(Transcriber::new(e.clone(), opts).is_err());
    let opts = TranscriberOptions {
        end_of_turn_threshold: f32::NAN,
        ..Default::default()
    };
    assert!(Transcriber::new(e, opts).is_err());
}

/// Deterministic pseudo-random push sizes and audio over a long stream (the tiny model's context wraps many
/// times): the transcriber's events are a lone `SttStream`'s, exactly, pulled at any moment.
#[test]
fn long_streams_equal_a_lone_stt_stream() {
    use model::stt::{SttEvent, SttStream};
    let e = engine("1b");
    let frames = 150;
    let mut s = 0x9E37_79B9u32;
    let mut next = move || {
        s ^= s << 13;
        s ^= s >> 17;
        s ^= s << 5;
        s
    };
    let pcm: Vec<f32> = (0..frames * 1920)
        .map(|i| {
            let t = i as f32 / 24_000.0;
            0.3 * (2.0 * std::f32::consts::PI * 210.0 * t).sin() * (1.7 * t).sin().abs()
                + 0.05 * ((next() % 2001) as f32 / 1000.0 - 1.0)
        })
        .collect();
    let pool = std::sync::Arc::new(kernels::Pool::new(1));
    let mut lone = SttStream::cpu(e.model(), pool).unwrap();
    let mut want = Vec::new();
    let mut on_step = |_: &_, ev: &[SttEvent]| want.extend(ev.iter().cloned());
    lone.push_pcm(&pcm, &mut on_step).unwrap();
    lone.flush(&mut on_step).unwrap();
    let mut t = Transcriber::new(e.clone(), TranscriberOptions::default()).unwrap();
    let mut got = Vec::new();
    let mut pos = 0;
    while pos < pcm.len() {
        let n = (next() as usize % 5000).min(pcm.len() - pos);
        t.push(&pcm[pos..pos + n]).unwrap();
        pos += n;
        // Pull some of what is ready, sometimes nothing: the rest waits for a later pull.
        for _ in 0..next() % 8 {
            match t.pull().unwrap() {
                Some(ev) => got.push(to_event(&ev)),
                None => break,
            }
        }
    }
    t.flush();
    while let Some(ev) = t.pull().unwrap() {
        got.push(to_event(&ev));
    }
    let got: Vec<SttEvent> = got.into_iter().flatten().collect();
    assert_eq!(got, want);
    assert_eq!(t.steps(), frames + e.plan().flush_frames);
    assert!(
        got.iter()
            .filter(|e| matches!(e, SttEvent::Word { .. }))
            .count()
            >= 10
    );
}

/// The model's event a transcriber event stands for (`None` for the end of turn).
fn to_event(e: &TranscriptEvent<'_>) -> Option<model::stt::SttEvent> {
    use model::stt::{SttEvent, MAX_EXTRA_HEADS};
    Some(match *e {
        TranscriptEvent::Step { step_idx, prs } => {
            let mut p = [0f32; MAX_EXTRA_HEADS];
            p[..prs.len()].copy_from_slice(prs);
            SttEvent::Step {
                step_idx,
                n_heads: prs.len(),
                prs: p,
            }
        }
        TranscriptEvent::Word {
            tokens, start_time, ..
        } => SttEvent::Word {
            tokens: model::stt::WordTokens::from_slice(tokens).expect("a word within the cap"),
            start_time,
        },
        TranscriptEvent::EndWord { stop_time, .. } => SttEvent::EndWord { stop_time },
        TranscriptEvent::EndOfTurn { .. } => return None,
    })
}
