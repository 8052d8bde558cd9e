//! The speech-to-text entry points (`mn_stt_*`): on the oracle's STT bundles (`fixtures/stt/{1b,2b6}`;
//! `demo-stt` is the 1b one) the pulled events are the oracle's (`events.json`, the same expectations as
//! the CPU STT tests: steps, tokens and times exact, voice-activity probabilities within 1e-4); misuse
//! is a status with a message, and a refused call leaves the stream as it was.

mod common;

use std::ffi::CStr;
use std::ptr::{null, null_mut};

use common::*;
use model::stt::testing::assert_json_events;
use moshi_native::*;
use serde_json::{json, Value};

fn oracle(v: &str) -> Value {
    let text = std::fs::read_to_string(fixtures().join("stt").join(v).join("events.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn input(v: &str) -> Vec<f32> {
    runtime::audio::read_wav_strict(fixtures().join("stt").join(v).join("input.wav")).unwrap()
}

/// Opens `fixtures/stt/<v>`, or the bundled demo for `None`.
fn open(v: Option<&str>) -> *mut MnSttEngine {
    let dir = v.map(|v| c_path(fixtures().join("stt").join(v)));
    let mut engine = null_mut();
    // SAFETY: valid pointers.
    expect(
        unsafe {
            mn_stt_engine_open(
                dir.as_ref().map_or(null(), |d| d.as_ptr()),
                null(),
                &mut engine,
            )
        },
        MnStatus::Ok,
    );
    engine
}

fn create(engine: *mut MnSttEngine) -> *mut MnSttTranscriber {
    let mut t = null_mut();
    // SAFETY: live engine handle, valid out-pointer; NULL options are the defaults.
    expect(
        unsafe { mn_stt_transcriber_create(engine, null(), &mut t) },
        MnStatus::Ok,
    );
    t
}

/// Pulls every ready event, as the oracle writes them (end-of-turn events apart, as `{"type": "EndOfTurn"}`).
///
/// # Safety
/// `t` is a live transcriber.
unsafe fn drain(t: *mut MnSttTranscriber, out: &mut Vec<Value>) {
    let mut ev = new_event();
    loop {
        // SAFETY: live handle, valid event.
        let st = unsafe { mn_stt_pull(t, &mut ev) };
        if st == MnStatus::NoFrame {
            return;
        }
        expect(st, MnStatus::Ok);
        let prs: Vec<f64> = ev.prs[..ev.n_prs as usize]
            .iter()
            .map(|&p| f64::from(p))
            .collect();
        // SAFETY: the text is NUL-terminated and lives until the next pull.
        let text = unsafe { CStr::from_ptr(ev.text) }.to_str().unwrap();
        assert_eq!(text.len(), ev.text_len);
        out.push(match ev.kind {
            MN_STT_EVENT_STEP => json!({"type": "Step", "step_idx": ev.step_idx, "prs": prs}),
            MN_STT_EVENT_END_OF_TURN => {
                json!({"type": "EndOfTurn", "step_idx": ev.step_idx, "p": ev.probability, "prs": prs})
            }
            MN_STT_EVENT_WORD => {
                // SAFETY: `n_tokens` ids at `tokens`, valid until the next pull.
                let ids = unsafe { std::slice::from_raw_parts(ev.tokens, ev.n_tokens) };
                json!({"type": "Word", "tokens": ids, "start_time": ev.time, "text": text})
            }
            MN_STT_EVENT_END_WORD => json!({"type": "EndWord", "stop_time": ev.time}),
            k => panic!("unknown event kind {k}"),
        });
    }
}

/// `pcm` pushed in `chunk`-sample pieces, pulled after each, then flushed and pulled.
///
/// # Safety
/// `t` is a live transcriber.
unsafe fn transcribe(t: *mut MnSttTranscriber, pcm: &[f32], chunk: usize) -> Vec<Value> {
    let mut out = Vec::new();
    // SAFETY: live handle, valid buffers.
    unsafe {
        for c in pcm.chunks(chunk) {
            expect(mn_stt_push(t, c.as_ptr(), c.len()), MnStatus::Ok);
            drain(t, &mut out);
        }
        expect(mn_stt_flush(t), MnStatus::Ok);
        drain(t, &mut out);
    }
    out
}

/// The oracle's events: types, steps, tokens and times exact, probabilities within 1e-4; each word's
/// text is the SentencePiece decoding of its tokens.
fn assert_oracle(got: &[Value], v: &str) {
    let spm =
        model::text::SentencePiece::load(fixtures().join("stt").join(v).join("tokenizer.model"))
            .unwrap();
    assert_json_events(got, &oracle(v)["events"], 1e-4, v, |g, w, at| {
        if w["type"] == "Word" {
            assert_eq!(g["tokens"], w["tokens"], "{at}");
            assert_eq!(g["start_time"], w["start_time"], "{at}");
            let ids: Vec<u32> = serde_json::from_value(w["tokens"].clone()).unwrap();
            assert_eq!(g["text"], spm.decode(&ids).unwrap().trim(), "{at}");
        } else {
            assert_eq!(g, w, "{at}");
        }
    });
}

#[test]
fn events_are_the_oracles_on_both_bundles_and_the_demo() {
    for (v, name) in [("1b", None), ("1b", Some("1b")), ("2b6", Some("2b6"))] {
        let engine = open(name);
        let mut info = MnSttInfo {
            struct_size: std::mem::size_of::<MnSttInfo>() as u32,
            ..Default::default()
        };
        // SAFETY: live handles, valid buffers throughout.
        unsafe {
            expect(mn_stt_engine_info(engine, &mut info), MnStatus::Ok);
            let plan = &oracle(v)["plan"];
            assert_eq!(
                u64::from(info.prefix_frames),
                plan["prefix"].as_u64().unwrap()
            );
            assert_eq!(
                u64::from(info.delay_steps),
                plan["delay_tokens"].as_u64().unwrap()
            );
            assert_eq!(
                u64::from(info.flush_frames),
                plan["flush"].as_u64().unwrap()
            );
            assert_eq!(info.n_heads, if v == "1b" { 4 } else { 0 });
            assert_eq!(info.is_demo, u32::from(name.is_none()));
            let t = create(engine);
            expect(mn_stt_engine_destroy(engine), MnStatus::Ok);
            let pcm = input(v);
            for chunk in [777, MN_FRAME_SIZE, pcm.len()] {
                let got = transcribe(t, &pcm, chunk);
                assert_oracle(&got, v);
                if v == "1b" {
                    // The end of turn: head 2 above 0.5, right after its step, with that step's heads.
                    let eot: Vec<&Value> =
                        got.iter().filter(|e| e["type"] == "EndOfTurn").collect();
                    assert_eq!(eot.len(), 3, "{got:?}");
                    for e in eot {
                        assert!(e["p"].as_f64().unwrap() > 0.5);
                        assert_eq!(e["p"], e["prs"][2]);
                    }
                }
                expect(mn_stt_reset(t), MnStatus::Ok);
            }
            expect(mn_stt_transcriber_destroy(t), MnStatus::Ok);
        }
    }
}

#[test]
fn refusals_leave_the_stream_as_it_was() {
    let pcm = input("1b");
    let half = 9 * MN_FRAME_SIZE + 500;
    // SAFETY: every pointer is valid or deliberately wrong; the ABI must cope with both.
    unsafe {
        let engine = open(None);
        let t = create(engine);
        let mut got = Vec::new();
        expect(mn_stt_push(t, pcm.as_ptr(), half), MnStatus::Ok);
        drain(t, &mut got);

        // Bad arguments.
        expect(mn_stt_push(t, null(), 10), MnStatus::Null);
        let mut bad = pcm[half..half + 3000].to_vec();
        bad[1234] = f32::NAN;
        expect(
            mn_stt_push(t, bad.as_ptr(), bad.len()),
            MnStatus::InvalidArgument,
        );
        assert!(last_error().contains("1234"), "{}", last_error());
        bad[1234] = f32::NEG_INFINITY;
        expect(
            mn_stt_push(t, bad.as_ptr(), bad.len()),
            MnStatus::InvalidArgument,
        );
        expect(mn_stt_pull(t, null_mut()), MnStatus::Null);
        let mut ev = new_event();
        ev.struct_size -= 8;
        expect(mn_stt_pull(t, &mut ev), MnStatus::InvalidArgument);
        assert!(last_error().contains("MnSttEvent"), "{}", last_error());
        // Handles of another kind, in both directions.
        let moshi = open_engine(1);
        let mut session = null_mut();
        expect(mn_session_create(moshi, null(), &mut session), MnStatus::Ok);
        expect(
            mn_stt_push(session.cast(), pcm.as_ptr(), 100),
            MnStatus::InvalidHandle,
        );
        expect(
            mn_stt_pull(engine.cast(), &mut new_event()),
            MnStatus::InvalidHandle,
        );
        expect(mn_stt_flush(moshi.cast()), MnStatus::InvalidHandle);
        expect(mn_stt_reset(session.cast()), MnStatus::InvalidHandle);
        let mut other = null_mut();
        expect(
            mn_stt_transcriber_create(moshi.cast(), null(), &mut other),
            MnStatus::InvalidHandle,
        );
        expect(
            mn_session_push(t.cast(), pcm.as_ptr(), 100, null_mut()),
            MnStatus::InvalidHandle,
        );
        let mut s2 = null_mut();
        expect(
            mn_session_create(engine.cast(), null(), &mut s2),
            MnStatus::InvalidHandle,
        );
        assert!(s2.is_null());
        expect(
            mn_stt_transcriber_destroy(engine.cast()),
            MnStatus::InvalidHandle,
        );
        expect(mn_stt_engine_destroy(t.cast()), MnStatus::InvalidHandle);
        expect(mn_stt_push(null_mut(), pcm.as_ptr(), 1), MnStatus::Null);
        close_session(moshi, session);

        // The rest of the audio: the whole stream is the oracle's.
        let rest = transcribe(t, &pcm[half..], 1000);
        got.extend(rest);
        assert_oracle(&got, "1b");

        // Reset mid-stream, then a whole stream: the oracle's again.
        expect(mn_stt_push(t, pcm.as_ptr(), half), MnStatus::Ok);
        expect(mn_stt_pull(t, &mut new_event()), MnStatus::Ok);
        expect(mn_stt_reset(t), MnStatus::Ok);
        expect(mn_stt_pull(t, &mut new_event()), MnStatus::NoFrame);
        assert_oracle(&transcribe(t, &pcm, 4000), "1b");

        // Destroyed handles.
        expect(mn_stt_transcriber_destroy(t), MnStatus::Ok);
        expect(mn_stt_push(t, pcm.as_ptr(), 1), MnStatus::Destroyed);
        expect(mn_stt_transcriber_destroy(t), MnStatus::Destroyed);
        expect(mn_stt_engine_destroy(engine), MnStatus::Ok);
        expect(
            mn_stt_transcriber_create(engine, null(), &mut other),
            MnStatus::Destroyed,
        );
        assert!(other.is_null());
    }
}

#[test]
fn opening_refuses_bad_arguments_and_other_models() {
    // SAFETY: every pointer is valid or deliberately NULL.
    unsafe {
        let dir = c_path(fixtures().join("stt/1b"));
        expect(
            mn_stt_engine_open(dir.as_ptr(), null(), null_mut()),
            MnStatus::Null,
        );
        let mut engine = null_mut();
        let moshi = c_path(fixtures().join("lm"));
        expect(
            mn_stt_engine_open(moshi.as_ptr(), null(), &mut engine),
            MnStatus::Model,
        );
        assert!(last_error().contains("speech-to-text"), "{}", last_error());
        let missing = c_path(fixtures().join("no-such-bundle"));
        expect(
            mn_stt_engine_open(missing.as_ptr(), null(), &mut engine),
            MnStatus::Model,
        );
        assert!(last_error().contains("no-such-bundle"), "{}", last_error());
        // The STT bundle is refused by the duplex engine.
        let mut duplex = null_mut();
        expect(
            mn_engine_open(dir.as_ptr(), null(), &mut duplex),
            MnStatus::Model,
        );
        assert!(duplex.is_null());
        let mut opts = std::mem::zeroed::<MnEngineOptions>();
        expect(mn_engine_options_default(&mut opts), MnStatus::Ok);
        opts.threads = 0;
        expect(
            mn_stt_engine_open(dir.as_ptr(), &opts, &mut engine),
            MnStatus::InvalidArgument,
        );
        opts.threads = 1;
        opts.struct_size += 4;
        expect(
            mn_stt_engine_open(dir.as_ptr(), &opts, &mut engine),
            MnStatus::InvalidArgument,
        );
        assert!(engine.is_null());
        opts.struct_size -= 4;
        opts.threads = 2;
        opts.kv_dtype = MN_KV_DTYPE_BF16;
        expect(
            mn_stt_engine_open(dir.as_ptr(), &opts, &mut engine),
            MnStatus::Ok,
        );

        expect(mn_stt_options_default(null_mut()), MnStatus::Null);
        let mut sopts = std::mem::zeroed::<MnSttOptions>();
        expect(mn_stt_options_default(&mut sopts), MnStatus::Ok);
        assert_eq!(
            (
                sopts.end_of_turn_head,
                sopts.end_of_turn_threshold,
                sopts.reserve_frames
            ),
            (2, 0.5, 64)
        );
        let mut t = null_mut();
        let mut wrong = sopts;
        wrong.struct_size = 3;
        expect(
            mn_stt_transcriber_create(engine, &wrong, &mut t),
            MnStatus::InvalidArgument,
        );
        let mut wrong = sopts;
        wrong.reserve_frames = 0;
        expect(
            mn_stt_transcriber_create(engine, &wrong, &mut t),
            MnStatus::InvalidArgument,
        );
        expect(
            mn_stt_transcriber_create(engine, &sopts, null_mut()),
            MnStatus::Null,
        );
        assert!(t.is_null());
        let mut info = MnSttInfo::default();
        expect(
            mn_stt_engine_info(engine, &mut info),
            MnStatus::InvalidArgument,
        );
        expect(mn_stt_engine_info(engine, null_mut()), MnStatus::Null);
        // Two threads and a bf16 KV cache: the words and times stay the oracle's on this clip.
        sopts.end_of_turn_threshold = 2.0;
        expect(
            mn_stt_transcriber_create(engine, &sopts, &mut t),
            MnStatus::Ok,
        );
        let got = transcribe(t, &input("1b"), 1920);
        assert!(got.iter().all(|e| e["type"] != "EndOfTurn"));
        let words = |g: &[Value]| -> Vec<Value> {
            g.iter()
                .filter(|e| e["type"] == "Word" || e["type"] == "EndWord")
                .map(|e| {
                    let mut e = e.clone();
                    e.as_object_mut().unwrap().remove("text");
                    e
                })
                .collect()
        };
        let want: Vec<Value> = oracle("1b")["events"].as_array().unwrap().clone();
        assert_eq!(words(&got), words(&want));
        expect(mn_stt_transcriber_destroy(t), MnStatus::Ok);
        expect(mn_stt_engine_destroy(engine), MnStatus::Ok);
    }
}
