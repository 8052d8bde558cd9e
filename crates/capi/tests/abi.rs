//! Every entry point of the C ABI, used correctly (parity with the oracle fixtures) and misused (NULL
//! handles and buffers, wrong sizes, wrong handle kinds, use after destroy, two threads on one session,
//! a panic inside a call): each misuse is an error status with a message, never a crash.

mod common;

use std::ffi::CStr;
use std::ptr::{null, null_mut};
use std::sync::{mpsc, Arc, Mutex};

use common::*;
use moshi_native::*;
use testkit::compare::max_abs_diff;

#[test]
fn version_is_the_crate_version() {
    // SAFETY: static NUL-terminated string.
    let v = unsafe { CStr::from_ptr(mn_version()) };
    assert_eq!(v.to_str().unwrap(), env!("CARGO_PKG_VERSION"));
}

#[test]
fn engine_open_refuses_bad_arguments() {
    // SAFETY: every pointer is valid or deliberately NULL; the ABI must cope with both.
    unsafe {
        expect(mn_engine_options_default(null_mut()), MnStatus::Null);
        expect(mn_session_options_default(null_mut()), MnStatus::Null);
        let dir = c_path(fixtures().join("lm"));
        expect(
            mn_engine_open(dir.as_ptr(), null(), null_mut()),
            MnStatus::Null,
        );
        assert!(last_error().contains("engine is NULL"), "{}", last_error());

        let mut engine = null_mut();
        let missing = c_path(fixtures().join("no-such-bundle"));
        expect(
            mn_engine_open(missing.as_ptr(), null(), &mut engine),
            MnStatus::Model,
        );
        assert!(last_error().contains("no-such-bundle"), "{}", last_error());
        assert!(engine.is_null());

        let bad_utf8 = b"\xff\xfe\0";
        expect(
            mn_engine_open(bad_utf8.as_ptr().cast(), null(), &mut engine),
            MnStatus::InvalidArgument,
        );

        let mut opts = std::mem::zeroed::<MnEngineOptions>();
        expect(mn_engine_options_default(&mut opts), MnStatus::Ok);
        let mut wrong = opts;
        wrong.struct_size -= 4;
        expect(
            mn_engine_open(dir.as_ptr(), &wrong, &mut engine),
            MnStatus::InvalidArgument,
        );
        assert!(last_error().contains("struct_size"), "{}", last_error());
        let mut wrong = opts;
        wrong.kv_dtype = 7;
        expect(
            mn_engine_open(dir.as_ptr(), &wrong, &mut engine),
            MnStatus::InvalidArgument,
        );
        let mut wrong = opts;
        wrong.threads = 0;
        expect(
            mn_engine_open(dir.as_ptr(), &wrong, &mut engine),
            MnStatus::InvalidArgument,
        );
        assert!(engine.is_null());

        // bf16 KV cache and NULL options (defaults) both open.
        opts.kv_dtype = MN_KV_DTYPE_BF16;
        expect(
            mn_engine_open(dir.as_ptr(), &opts, &mut engine),
            MnStatus::Ok,
        );
        expect(mn_engine_destroy(engine), MnStatus::Ok);
        expect(
            mn_engine_open(dir.as_ptr(), null(), &mut engine),
            MnStatus::Ok,
        );
        expect(mn_engine_destroy(engine), MnStatus::Ok);
        expect(mn_engine_destroy(engine), MnStatus::Destroyed);
        expect(mn_engine_destroy(null_mut()), MnStatus::Null);
        let mut session = null_mut();
        expect(
            mn_session_create(engine, null(), &mut session),
            MnStatus::Destroyed,
        );
    }
}

#[test]
fn the_demo_model_opens_without_a_bundle() {
    // SAFETY: valid pointers.
    unsafe {
        let mut engine = null_mut();
        expect(mn_engine_open(null(), null(), &mut engine), MnStatus::Ok);
        let mut session = null_mut();
        expect(
            mn_session_create(engine, null(), &mut session),
            MnStatus::Ok,
        );
        expect(mn_engine_destroy(engine), MnStatus::Ok);
        // The session keeps the weights alive.
        let pcm = signal(3);
        expect(
            mn_session_push(session, pcm.as_ptr(), pcm.len(), null_mut()),
            MnStatus::Ok,
        );
        let mut frame = new_frame();
        for i in 0..3 {
            expect(mn_session_pull(session, &mut frame), MnStatus::Ok);
            assert_eq!(frame.frame_index, i);
        }
        expect(mn_session_pull(session, &mut frame), MnStatus::NoFrame);
        expect(mn_session_destroy(session), MnStatus::Ok);
    }
}

/// The fixture duplex trace (Kyutai's server loop, greedy) through the ABI: tokens exact, PCM within 1e-4.
#[test]
fn a_greedy_session_reproduces_the_duplex_trace() {
    let input = runtime::audio::read_wav_strict(fixtures().join("duplex/input.wav")).unwrap();
    let trace = fixtures().join("duplex/trace.safetensors");
    let (text, shape) = read_i64_tensor(trace.clone(), "text_tokens");
    let (audio, _) = read_i64_tensor(trace.clone(), "audio_tokens");
    let want_pcm = read_f32_tensor(trace, "pcm");
    let steps = shape[0];
    // SAFETY: valid pointers; frame buffers read before the next pull.
    unsafe {
        let mut opts = session_options();
        opts.text_temperature = 0.0;
        opts.audio_temperature = 0.0;
        opts.max_queued_frames = 64;
        let (engine, session) = open_session(&opts);
        let (mut tokens, mut codes, mut pcm) = (Vec::new(), Vec::new(), Vec::new());
        let mut frame = new_frame();
        for chunk in input.chunks(700) {
            let mut report = MnPushReport::default();
            expect(
                mn_session_push(session, chunk.as_ptr(), chunk.len(), &mut report),
                MnStatus::Ok,
            );
            assert_eq!(report.frames_dropped, 0);
            while mn_session_pull(session, &mut frame) == MnStatus::Ok {
                if frame.frame_index == 0 {
                    assert_eq!(frame.text_token, -1);
                    assert_eq!(frame.audio_tokens, [-1; 8]);
                } else {
                    tokens.push(i64::from(frame.text_token));
                    codes.push(frame.audio_tokens);
                }
                pcm.extend_from_slice(std::slice::from_raw_parts(frame.pcm, frame.pcm_len));
                let t = CStr::from_ptr(frame.text);
                assert_eq!(t.to_bytes().len(), frame.text_len);
            }
        }
        assert_eq!(tokens, text);
        for (t, c) in codes.iter().enumerate() {
            for (k, &code) in c.iter().enumerate() {
                assert_eq!(
                    i64::from(code),
                    audio[k * steps + t],
                    "codebook {k} step {t}"
                );
            }
        }
        assert_eq!(pcm.len(), want_pcm.len());
        let err = max_abs_diff(&pcm, &want_pcm);
        assert!(err <= 1e-4, "pcm max abs error {err}");
        close_session(engine, session);
    }
}

#[test]
fn session_calls_refuse_misuse() {
    // SAFETY: every pointer is valid or deliberately NULL / destroyed / of the wrong kind.
    unsafe {
        let engine = open_engine(1);
        let mut session = null_mut();
        expect(
            mn_session_create(null(), null(), &mut session),
            MnStatus::Null,
        );
        expect(
            mn_session_create(engine, null(), null_mut()),
            MnStatus::Null,
        );
        // Each a default options struct with one bad field.
        let invalid: [fn(&mut MnSessionOptions); 3] = [
            |o| o.max_queued_frames = 0,
            |o| o.first_frame_reset = 2,
            |o| o.struct_size = 8,
        ];
        for spoil in invalid {
            let mut opts = session_options();
            spoil(&mut opts);
            expect(
                mn_session_create(engine, &opts, &mut session),
                MnStatus::InvalidArgument,
            );
        }
        let refused: [fn(&mut MnSessionOptions); 2] = [
            |o| o.text_temperature = f32::NAN,
            |o| o.repetition_penalty = 0.0,
        ];
        for spoil in refused {
            let mut opts = session_options();
            spoil(&mut opts);
            assert!((mn_session_create(engine, &opts, &mut session) as i32) < 0);
        }
        assert!(session.is_null());
        let mut opts = session_options();
        (
            opts.pad_mult,
            opts.repetition_penalty,
            opts.repetition_penalty_context,
        ) = (0.5, 1.1, 16);
        expect(mn_session_create(engine, &opts, &mut session), MnStatus::Ok);
        expect(mn_session_destroy(session), MnStatus::Ok);
        session = null_mut();

        let mut opts = session_options();
        opts.output_rate = 48_000;
        expect(mn_session_create(engine, &opts, &mut session), MnStatus::Ok);
        let pcm = signal(4);
        let mut frame = new_frame();

        // NULL handles, NULL buffers, wrong struct sizes.
        expect(
            mn_session_push(null_mut(), pcm.as_ptr(), 10, null_mut()),
            MnStatus::Null,
        );
        expect(
            mn_session_push(session, null(), 10, null_mut()),
            MnStatus::Null,
        );
        expect(
            mn_session_push(session, null(), 0, null_mut()),
            MnStatus::Ok,
        );
        expect(mn_session_pull(null_mut(), &mut frame), MnStatus::Null);
        expect(mn_session_pull(session, null_mut()), MnStatus::Null);
        let mut small = new_frame();
        small.struct_size = 16;
        expect(
            mn_session_pull(session, &mut small),
            MnStatus::InvalidArgument,
        );
        expect(mn_session_interrupt(null_mut(), null_mut()), MnStatus::Null);
        expect(mn_session_pause(null_mut()), MnStatus::Null);
        expect(mn_session_resume(null_mut()), MnStatus::Null);
        expect(mn_session_reset(null_mut(), null_mut()), MnStatus::Null);
        expect(mn_session_stop(null_mut()), MnStatus::Null);
        expect(mn_session_destroy(null_mut()), MnStatus::Null);

        // A handle of another kind.
        let as_session = engine.cast::<MnSession>();
        expect(
            mn_session_push(as_session, pcm.as_ptr(), 10, null_mut()),
            MnStatus::InvalidHandle,
        );
        expect(mn_session_pause(as_session), MnStatus::InvalidHandle);
        expect(mn_session_destroy(as_session), MnStatus::InvalidHandle);
        expect(mn_engine_destroy(session.cast()), MnStatus::InvalidHandle);

        // The normal path with every control.
        expect(mn_session_pull(session, &mut frame), MnStatus::NoFrame);
        let mut report = MnPushReport::default();
        expect(
            mn_session_push(session, pcm.as_ptr(), pcm.len(), &mut report),
            MnStatus::Ok,
        );
        assert_eq!((report.frames_completed, report.queued), (4, 4));
        expect(mn_session_pull(session, &mut frame), MnStatus::Ok);
        assert_eq!(
            (frame.frame_index, frame.pcm_len, frame.text_len),
            (0, 0, 0)
        );
        expect(mn_session_pull(session, &mut frame), MnStatus::Ok);
        assert_eq!(frame.frame_index, 1);
        assert!(frame.text_token >= 0 && frame.audio_tokens.iter().all(|&a| a >= 0));
        assert!(
            frame.pcm_len > 0 && frame.pcm_len <= 2 * MN_FRAME_SIZE + 64,
            "48 kHz output: {} samples",
            frame.pcm_len
        );
        expect(mn_session_pause(session), MnStatus::Ok);
        expect(mn_session_pull(session, &mut frame), MnStatus::Paused);
        expect(mn_session_resume(session), MnStatus::Ok);
        let mut epoch = 0;
        expect(mn_session_interrupt(session, &mut epoch), MnStatus::Ok);
        assert_eq!(epoch, 1);
        expect(mn_session_pull(session, &mut frame), MnStatus::Ok);
        assert_eq!((frame.frame_index, frame.epoch), (2, 1));
        expect(mn_session_reset(session, &mut epoch), MnStatus::Ok);
        assert_eq!(epoch, 2);
        // The queued frame was pushed before the reset: discarded.
        expect(mn_session_pull(session, &mut frame), MnStatus::NoFrame);
        expect(
            mn_session_push(session, pcm.as_ptr(), MN_FRAME_SIZE, null_mut()),
            MnStatus::Ok,
        );
        expect(mn_session_pull(session, &mut frame), MnStatus::Ok);
        assert_eq!((frame.frame_index, frame.epoch), (0, 2));
        expect(mn_session_stop(session), MnStatus::Ok);
        expect(mn_session_pull(session, &mut frame), MnStatus::Stopped);

        // Use after destroy.
        expect(mn_session_destroy(session), MnStatus::Ok);
        expect(mn_session_destroy(session), MnStatus::Destroyed);
        expect(
            mn_session_push(session, pcm.as_ptr(), 10, null_mut()),
            MnStatus::Destroyed,
        );
        expect(mn_session_pull(session, &mut frame), MnStatus::Destroyed);
        expect(
            mn_session_interrupt(session, null_mut()),
            MnStatus::Destroyed,
        );
        expect(mn_session_reset(session, null_mut()), MnStatus::Destroyed);
        expect(mn_session_pause(session), MnStatus::Destroyed);
        expect(mn_session_resume(session), MnStatus::Destroyed);
        expect(mn_session_stop(session), MnStatus::Destroyed);
        assert!(last_error().contains("destroyed"), "{}", last_error());
        expect(mn_engine_destroy(engine), MnStatus::Ok);
    }
}

/// A second thread entering a session while a pull runs gets BUSY; the controls still work from it.
#[test]
fn two_threads_on_one_session_get_busy_not_a_crash() {
    struct Handle(*mut MnSession);
    // SAFETY: the ABI is what is under test; the handle is used from two threads on purpose.
    unsafe impl Send for Handle {}
    // SAFETY: valid pointers; the hook blocks the pulling thread inside the session.
    unsafe {
        let (engine, session) = open_session(null());
        let (inside_tx, inside_rx) = mpsc::channel::<()>();
        let (go_tx, go_rx) = mpsc::channel::<()>();
        let (inside_tx, go_rx) = (Mutex::new(inside_tx), Mutex::new(go_rx));
        test_set_phase_hook(
            session,
            Some(Arc::new(move |_| {
                inside_tx.lock().unwrap().send(()).ok();
                go_rx.lock().unwrap().recv().ok();
            })),
        );
        let pcm = signal(1);
        expect(
            mn_session_push(session, pcm.as_ptr(), pcm.len(), null_mut()),
            MnStatus::Ok,
        );
        let h = Handle(session);
        let puller = std::thread::spawn(move || {
            let h = h;
            let mut frame = new_frame();
            mn_session_pull(h.0, &mut frame)
        });
        inside_rx.recv().unwrap();
        let mut frame = new_frame();
        expect(
            mn_session_push(session, pcm.as_ptr(), pcm.len(), null_mut()),
            MnStatus::Busy,
        );
        expect(mn_session_pull(session, &mut frame), MnStatus::Busy);
        expect(mn_session_destroy(session), MnStatus::Busy);
        assert!(last_error().contains("another thread"), "{}", last_error());
        let mut epoch = 0;
        expect(mn_session_interrupt(session, &mut epoch), MnStatus::Ok);
        assert_eq!(epoch, 1);
        // Let every remaining phase of the pass through.
        for _ in 0..16 {
            go_tx.send(()).ok();
        }
        drop(go_tx);
        expect(puller.join().unwrap(), MnStatus::Ok);
        while inside_rx.try_recv().is_ok() {}
        close_session(engine, session);
    }
}

/// A panic inside a call becomes MN_STATUS_PANIC; the session is poisoned and can only be destroyed.
#[test]
fn a_panic_stops_at_the_boundary_and_poisons_the_handle() {
    // SAFETY: valid pointers.
    unsafe {
        let (engine, session) = open_session(null());
        test_set_phase_hook(session, Some(Arc::new(|_| panic!("injected test panic"))));
        let pcm = signal(1);
        expect(
            mn_session_push(session, pcm.as_ptr(), pcm.len(), null_mut()),
            MnStatus::Ok,
        );
        let mut frame = new_frame();
        expect(mn_session_pull(session, &mut frame), MnStatus::Panic);
        assert!(
            last_error().contains("injected test panic"),
            "{}",
            last_error()
        );
        expect(
            mn_session_push(session, pcm.as_ptr(), pcm.len(), null_mut()),
            MnStatus::Poisoned,
        );
        expect(mn_session_pull(session, &mut frame), MnStatus::Poisoned);
        expect(mn_session_pause(session), MnStatus::Poisoned);
        expect(mn_session_destroy(session), MnStatus::Ok);
        expect(mn_session_destroy(session), MnStatus::Destroyed);
        expect(mn_engine_destroy(engine), MnStatus::Ok);
    }
}

/// Mimi on its own: the fixture's streaming codes and PCM, and every misuse.
/// `mn_mimi_encode_frame` or `mn_mimi_decode_frame`: `(mimi, input, n_in, out, capacity)`.
type FrameCall<I, O> =
    unsafe extern "C" fn(*mut MnMimi, *const I, usize, *mut O, usize) -> MnStatus;

/// The argument checks of a Mimi frame call, in call order: an input one value short or one too
/// long, an output one value short, a NULL input, a NULL output; each is refused with its status
/// (before anything is read or the stream moves). `n_in` and `cap` are a frame's sizes.
///
/// # Safety
/// `mimi` is a live Mimi handle; `input` is readable for `n_in` values, `out` writable for `cap`.
unsafe fn frame_call_refusals<I, O>(
    f: FrameCall<I, O>,
    what: &str,
    mimi: *mut MnMimi,
    (input, n_in): (*const I, usize),
    (out, cap): (*mut O, usize),
) {
    // SAFETY: the caller's contract; every size the calls get wrong is refused before any access.
    let cases = unsafe {
        [
            (
                f(mimi, input, n_in - 1, out, cap),
                MnStatus::InvalidArgument,
            ),
            (
                f(mimi, input, n_in + 1, out, cap),
                MnStatus::InvalidArgument,
            ),
            (f(mimi, input, n_in, out, cap - 1), MnStatus::BufferTooSmall),
            (f(mimi, null(), n_in, out, cap), MnStatus::Null),
            (f(mimi, input, n_in, null_mut(), cap), MnStatus::Null),
        ]
    };
    for (i, (got, want)) in cases.into_iter().enumerate() {
        assert_eq!(got, want, "{what} case {i}");
    }
}

/// Decodes `codes` (`[nq, t]`, codebook by codebook) frame by frame into `t` frames of `fs`
/// samples.
///
/// # Safety
/// `mimi` is a live Mimi handle of `nq` codebooks and frames of `fs` samples.
unsafe fn decode_frames(mimi: *mut MnMimi, codes: &[u32], nq: usize, fs: usize) -> Vec<f32> {
    let t = codes.len() / nq;
    let mut pcm = vec![0f32; t * fs];
    for f in 0..t {
        let c: Vec<u32> = (0..nq).map(|q| codes[q * t + f]).collect();
        // SAFETY: the caller's contract; `c` holds `nq` codes and `pcm` `fs` samples from `f * fs`.
        let status =
            unsafe { mn_mimi_decode_frame(mimi, c.as_ptr(), nq, pcm[f * fs..].as_mut_ptr(), fs) };
        expect(status, MnStatus::Ok);
    }
    pcm
}

#[test]
fn mimi_matches_the_fixture_and_refuses_misuse() {
    let input = runtime::audio::read_wav_strict(fixtures().join("mimi/input.wav")).unwrap();
    let trace = fixtures().join("mimi/trace.safetensors");
    let (want_codes, shape) = read_i64_tensor(trace.clone(), "codes");
    let want_pcm = read_f32_tensor(trace, "pcm");
    let (nq, t) = (shape[0], shape[1]);
    // SAFETY: valid pointers or deliberate misuse.
    unsafe {
        let mut mimi = null_mut();
        let file = c_path(fixtures().join("mimi/mimi.safetensors"));
        let config = c_path(fixtures().join("mimi/mimi_config.json"));
        let missing = c_path(fixtures().join("mimi/none.safetensors"));
        expect(
            mn_mimi_open(null(), null(), 0, 1, &mut mimi),
            MnStatus::Null,
        );
        expect(
            mn_mimi_open(file.as_ptr(), null(), 0, 1, null_mut()),
            MnStatus::Null,
        );
        expect(
            mn_mimi_open(missing.as_ptr(), null(), 0, 1, &mut mimi),
            MnStatus::Io,
        );
        // The tiny weights without their config do not fit the released dimensions.
        expect(
            mn_mimi_open(file.as_ptr(), null(), 0, 1, &mut mimi),
            MnStatus::Model,
        );
        expect(
            mn_mimi_open(file.as_ptr(), config.as_ptr(), 99, 1, &mut mimi),
            MnStatus::Model,
        );
        assert!(mimi.is_null());
        let bundle = c_path(fixtures().join("lm"));
        for (path, cfg, threads) in [
            (file.as_ptr(), config.as_ptr(), 1),
            (bundle.as_ptr(), null(), 2),
        ] {
            expect(mn_mimi_open(path, cfg, 0, threads, &mut mimi), MnStatus::Ok);
            let (mut fs, mut n) = (0, 0);
            expect(mn_mimi_shape(mimi, &mut fs, &mut n), MnStatus::Ok);
            assert_eq!((fs, n), (MN_FRAME_SIZE, nq));
            expect(mn_mimi_shape(mimi, null_mut(), null_mut()), MnStatus::Ok);
            let mut padded = input.clone();
            padded.resize(t * fs, 0.0);
            let mut codes = vec![0u32; nq * t];
            let mut frame_codes = vec![0u32; nq];
            for f in 0..t {
                let s = &padded[f * fs..(f + 1) * fs];
                expect(
                    mn_mimi_encode_frame(mimi, s.as_ptr(), fs, frame_codes.as_mut_ptr(), nq),
                    MnStatus::Ok,
                );
                for q in 0..nq {
                    codes[q * t + f] = frame_codes[q];
                }
            }
            let codes_i64: Vec<i64> = codes.iter().map(|&c| i64::from(c)).collect();
            assert_eq!(codes_i64, want_codes);
            let mut pcm = decode_frames(mimi, &codes, nq, fs);
            let err = max_abs_diff(&pcm, &want_pcm);
            assert!(err <= 1e-4, "pcm max abs error {err}");
            expect(mn_mimi_reset(mimi), MnStatus::Ok);
            // After a reset the first frame's codes come back.
            expect(
                mn_mimi_encode_frame(mimi, padded.as_ptr(), fs, frame_codes.as_mut_ptr(), nq),
                MnStatus::Ok,
            );
            assert!((0..nq).all(|q| frame_codes[q] == codes[q * t]));

            // Wrong sizes and NULL buffers, in call order.
            let fresh_pcm = pcm.clone();
            let p = padded.as_ptr();
            let c = frame_codes.as_mut_ptr();
            let out = pcm.as_mut_ptr();
            frame_call_refusals(mn_mimi_encode_frame, "encode", mimi, (p, fs), (c, nq));
            frame_call_refusals(
                mn_mimi_decode_frame,
                "decode",
                mimi,
                (c.cast_const(), nq),
                (out, fs),
            );
            frame_codes[0] = 1 << 20;
            expect(
                mn_mimi_decode_frame(mimi, c, nq, out, fs),
                MnStatus::InvalidArgument,
            );
            expect(
                mn_mimi_encode_frame(null_mut(), p, fs, c, nq),
                MnStatus::Null,
            );
            expect(mn_session_pause(mimi.cast()), MnStatus::InvalidHandle);
            // The refusals moved neither stream: the encoder continues after frame 0 with the
            // fixture's codes of the next frames, and the decoder (unused since the reset)
            // decodes bit for bit what the freshly opened handle decoded.
            for f in 1..t {
                let s = &padded[f * fs..(f + 1) * fs];
                expect(
                    mn_mimi_encode_frame(mimi, s.as_ptr(), fs, c, nq),
                    MnStatus::Ok,
                );
                let got: Vec<u32> = std::slice::from_raw_parts(c, nq).to_vec();
                let want: Vec<u32> = (0..nq).map(|q| codes[q * t + f]).collect();
                assert_eq!(got, want, "encoded frame {f} after the refusals");
            }
            let again = decode_frames(mimi, &codes, nq, fs);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<u32>>();
            assert!(
                bits(&again) == bits(&fresh_pcm),
                "decoded frames after the refusals differ from a fresh handle's"
            );

            // Use after destroy.
            expect(mn_mimi_destroy(mimi), MnStatus::Ok);
            expect(mn_mimi_destroy(mimi), MnStatus::Destroyed);
            expect(
                mn_mimi_encode_frame(mimi, p, fs, c, nq),
                MnStatus::Destroyed,
            );
            expect(
                mn_mimi_decode_frame(mimi, c, nq, out, fs),
                MnStatus::Destroyed,
            );
            expect(mn_mimi_reset(mimi), MnStatus::Destroyed);
            expect(
                mn_mimi_shape(mimi, null_mut(), null_mut()),
                MnStatus::Destroyed,
            );
            expect(mn_mimi_destroy(null_mut()), MnStatus::Null);
            mimi = null_mut();
        }
    }
}
