//! Command and stream semantics of a session on the tiny bundle (one test per rule).

mod common;

use common::*;
use kernels::Pool;
use model::lm::LmGen;
use model::mimi::{MimiDecoder, MimiEncoder};
use model::sampling::{Sampler, SamplerConfig};
use runtime::{Session, SessionOptions, Step, StopReason, FRAME_SIZE};

/// The Python server loop written directly against the model APIs (`moshi/server.py`): the first frame is
/// encoded, Mimi (encoder and decoder) is reset, and its codes still go to LMGen call 0.
fn manual_server_loop(pcm: &[f32], first_frame_reset: bool) -> (Vec<Option<u32>>, Vec<f32>) {
    let e = engine();
    let lm = &*e.cpu_lm().expect("a CPU engine holds its LM");
    let mut enc = MimiEncoder::new(e.mimi().clone());
    let mut dec = MimiDecoder::new(e.mimi().clone());
    let mut gen = LmGen::new(lm, e.options().kv_dtype).unwrap();
    let mut sampler =
        Sampler::new(SamplerConfig::greedy(), lm.spec().text_card, lm.spec().card).unwrap();
    let pool = Pool::new(1);
    let mut texts = Vec::new();
    let mut out = Vec::new();
    let mut buf = vec![0f32; FRAME_SIZE];
    for (i, frame) in pcm.chunks_exact(FRAME_SIZE).enumerate() {
        let codes = enc.encode_frame(frame).unwrap().to_vec();
        if i == 0 && first_frame_reset {
            enc.reset();
            dec.reset();
        }
        match gen.step(lm, &codes, &mut sampler, &pool).unwrap() {
            Some(f) => {
                texts.push(Some(f.text));
                dec.decode_frame(f.audio(), &mut buf).unwrap();
                out.extend_from_slice(&buf);
            }
            None => texts.push(None),
        }
    }
    (texts, out)
}

#[test]
fn first_frame_rule_is_the_python_server_loop() {
    let pcm = signal(12, 1);
    let got = run(greedy(), &pcm);
    let (texts, out) = manual_server_loop(&pcm, true);
    assert_eq!(got.text_tokens, texts);
    assert_eq!(got.pcm, out);
    assert_eq!(got.text_tokens[0], None, "LMGen returns nothing at call 0");
    assert_eq!(got.frame_index, (0..12).collect::<Vec<_>>());
    // The rule changes the stream: without it the second frame is encoded with the first frame's history.
    let (texts_no_reset, out_no_reset) = manual_server_loop(&pcm, false);
    let plain = run(
        SessionOptions {
            first_frame_reset: false,
            ..greedy()
        },
        &pcm,
    );
    assert_eq!(plain.text_tokens, texts_no_reset);
    assert_eq!(plain.pcm, out_no_reset);
    assert_ne!(
        plain.pcm, got.pcm,
        "resetting Mimi after frame 0 must change the output"
    );
}

/// The uninterrupted greedy run over `pcm`, and a greedy session fed its first `frames` frames with what
/// that session emitted so far: the start of a test of a command given mid-stream.
fn reference_and_started(pcm: &[f32], frames: usize) -> (Collected, Session, Collected) {
    let reference = run(greedy(), pcm);
    let mut s = greedy_session();
    let mut c = Collected::default();
    feed(&mut s, &pcm[..frames * FRAME_SIZE], &mut c);
    (reference, s, c)
}

#[test]
fn interrupt_bumps_epoch_and_leaves_model_state_untouched() {
    let pcm = signal(10, 2);
    let (reference, mut s, mut c) = reference_and_started(&pcm, 4);
    assert_eq!(s.interrupt(), 1);
    feed(&mut s, &pcm[4 * FRAME_SIZE..], &mut c);
    assert_eq!(c.epoch, [0, 0, 0, 0, 1, 1, 1, 1, 1, 1]);
    // Mimi, LM and Depformer continued: same tokens and audio as without the interrupt.
    assert_eq!(c.text_tokens, reference.text_tokens);
    assert_eq!(c.audio, reference.audio);
    assert_eq!(c.pcm, reference.pcm);
    assert_eq!(c.frame_index, reference.frame_index);
}

#[test]
fn pause_does_not_advance_the_model_and_resume_continues_the_stream() {
    let pcm = signal(10, 3);
    let (reference, mut s, mut c) = reference_and_started(&pcm, 5);
    s.pause();
    for _ in 0..5 {
        assert!(matches!(s.step().unwrap(), Step::Paused));
    }
    // Input pushed while paused waits in the queue; nothing is consumed or synthesized.
    s.push_pcm(&pcm[5 * FRAME_SIZE..7 * FRAME_SIZE]).unwrap();
    assert!(matches!(s.step().unwrap(), Step::Paused));
    assert_eq!(s.counters().frames_processed, 5);
    assert_eq!(s.counters().queued, 2);
    assert_eq!(s.frame_index(), 5);
    s.resume();
    while c.record(s.step().unwrap()) {}
    feed(&mut s, &pcm[7 * FRAME_SIZE..], &mut c);
    assert_same(&c, &reference);
}

#[test]
fn reset_makes_the_session_indistinguishable_from_a_fresh_one() {
    let a = signal(9, 4);
    let b = signal(11, 5);
    for opts in [greedy(), sampled(7)] {
        let fresh = run(opts.clone(), &b);
        let mut s = Session::new(engine(), opts).unwrap();
        let mut c = Collected::default();
        feed(&mut s, &a, &mut c);
        // Half a frame pushed before the reset belongs to the old stream and is forgotten.
        s.push_pcm(&a[..FRAME_SIZE / 2]).unwrap();
        s.reset();
        let mut after = Collected::default();
        feed(&mut s, &b, &mut after);
        assert!(after.epoch.iter().all(|&e| e == 1));
        after.epoch.iter_mut().for_each(|e| *e = 0);
        assert_same(&after, &fresh);
    }
}

#[test]
fn sampling_is_reproducible_for_a_seed() {
    let pcm = signal(8, 6);
    assert_same(&run(sampled(11), &pcm), &run(sampled(11), &pcm));
}

#[test]
fn full_queue_drops_oldest_frames_without_resetting_the_stream() {
    let pcm = signal(10, 8);
    let opts = queued_greedy(3);
    let mut s = Session::new(engine(), opts.clone()).unwrap();
    let mut c = Collected::default();
    feed(&mut s, &pcm[..2 * FRAME_SIZE], &mut c);
    // 6 frames arrive while the session is busy, in odd chunk sizes: the 3 oldest are dropped.
    for chunk in pcm[2 * FRAME_SIZE..8 * FRAME_SIZE].chunks(1000) {
        s.push_pcm(chunk).unwrap();
    }
    let k = s.counters();
    assert_eq!((k.frames_in, k.frames_dropped, k.queued), (8, 3, 3));
    while c.record(s.step().unwrap()) {}
    assert_eq!(
        c.frame_index,
        [0, 1, 2, 3, 4],
        "stream continues; indices count LM calls"
    );
    // Same as a session that saw frames 0, 1, 5, 6, 7 back to back: state was not reset.
    let mut kept = pcm[..2 * FRAME_SIZE].to_vec();
    kept.extend_from_slice(&pcm[5 * FRAME_SIZE..8 * FRAME_SIZE]);
    let expect = run(opts, &kept);
    assert_same(&c, &expect);
}

#[test]
fn stop_and_max_steps() {
    let pcm = signal(6, 9);
    let mut s = Session::new(
        engine(),
        SessionOptions {
            max_steps: Some(4),
            ..greedy()
        },
    )
    .unwrap();
    let mut c = Collected::default();
    feed(&mut s, &pcm, &mut c);
    assert_eq!(c.frame_index.len(), 4);
    assert!(matches!(
        s.step().unwrap(),
        Step::Stopped(StopReason::MaxSteps)
    ));
    // A new stream gets a new step budget.
    s.reset();
    let mut again = Collected::default();
    feed(&mut s, &pcm, &mut again);
    assert_eq!(again.frame_index, [0, 1, 2, 3]);
    let mut s = greedy_session();
    s.push_pcm(&pcm[..FRAME_SIZE]).unwrap();
    s.stop();
    assert!(matches!(
        s.step().unwrap(),
        Step::Stopped(StopReason::Requested)
    ));
    assert_eq!(s.counters().frames_processed, 0);
}

#[test]
fn producer_works_from_another_thread_in_any_chunk_size() {
    let pcm = signal(6, 10);
    let reference = run(queued_greedy(8), &pcm);
    let mut s = Session::new(engine(), queued_greedy(8)).unwrap();
    let mut p = s.take_producer().unwrap();
    assert!(s.push_pcm(&[0.0]).is_err());
    let data = pcm.clone();
    std::thread::spawn(move || {
        for chunk in data.chunks(777) {
            p.push(chunk);
        }
    })
    .join()
    .unwrap();
    let mut c = Collected::default();
    while c.record(s.step().unwrap()) {}
    assert_same(&c, &reference);
}

#[test]
fn forced_text_enters_the_text_stream() {
    let pcm = signal(8, 12);
    let mut s = greedy_session();
    // LMGen returns the text sampled at call t at call t + 1.
    s.force_text(&[5, 6, 7]).unwrap();
    let mut c = Collected::default();
    feed(&mut s, &pcm, &mut c);
    assert_eq!(&c.text_tokens[1..4], &[Some(5), Some(6), Some(7)]);
    let free = run(greedy(), &pcm);
    assert_ne!(c.text_tokens, free.text_tokens);
    assert!(s.force_text(&[100_000]).is_err());
}

#[test]
fn output_is_resampled_continuously_to_the_consumer_rate() {
    let pcm = signal(12, 13);
    let base = run(greedy(), &pcm);
    for rate in [48_000u32, 44_100, 16_000] {
        let got = run(
            SessionOptions {
                output_rate: rate,
                ..greedy()
            },
            &pcm,
        );
        assert_eq!(got.text_tokens, base.text_tokens, "{rate}");
        // Frame-by-frame output equals resampling the whole 24 kHz stream in one call.
        let mut r = runtime::audio::StreamResampler::with_chunk(24_000, rate, FRAME_SIZE).unwrap();
        let mut whole = Vec::new();
        r.process(&base.pcm, &mut whole).unwrap();
        assert_eq!(got.pcm.len(), whole.len(), "{rate}");
        assert_eq!(got.pcm, whole, "{rate}");
        let expect = base.pcm.len() as f64 * rate as f64 / 24_000.0;
        assert!((got.pcm.len() as f64) > expect - 2.0 * FRAME_SIZE as f64 * rate as f64 / 24_000.0);
    }
    assert!(Session::new(
        engine(),
        SessionOptions {
            output_rate: 7,
            ..greedy()
        }
    )
    .is_err());
}
