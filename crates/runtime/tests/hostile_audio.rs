//! Hostile audio on the tiny bundle (`fixtures/lm`): NaN/Inf/subnormal/out-of-range samples,
//! empty and 1-sample chunks, long silence, and a producer far faster than real time.
//!
//! Input sanitisation (in `PcmProducer::push`, before anything reaches Mimi or the LM): NaN and ±inf
//! become 0, finite samples are clamped to `[-1, 1]`, subnormals are flushed to 0. The tests prove it
//! end to end: a session fed hostile samples produces exactly the tokens and PCM of a session fed
//! the sanitised samples (greedy, deterministic).

mod common;

use std::time::{Duration, Instant};

use common::{assert_same, engine, greedy, greedy_session, queued_greedy, run, signal, Collected};
use runtime::{Event, Session, Step, FRAME_SIZE};

/// The documented input rule, written independently of the runtime's code.
fn sanitised(x: f32) -> f32 {
    let subnormal = x != 0.0 && x.abs() < f32::MIN_POSITIVE;
    if x.is_nan() || x.is_infinite() || subnormal {
        0.0
    } else {
        x.clamp(-1.0, 1.0)
    }
}

/// `signal` with every kind of hostile sample sprinkled in.
fn hostile(frames: usize) -> Vec<f32> {
    let mut v = signal(frames, 11);
    for (i, x) in v.iter_mut().enumerate() {
        *x = match i % 97 {
            3 => f32::NAN,
            10 => f32::INFINITY,
            17 => f32::NEG_INFINITY,
            24 => f32::MIN_POSITIVE / 4.0,  // subnormal
            31 => -f32::MIN_POSITIVE / 8.0, // subnormal
            38 => 1e30,
            45 => -3.5,
            52 => f32::MAX,
            59 => *x * 40.0, // clipped speech
            _ => *x,
        };
    }
    // One whole frame of NaN and one of +inf, one of huge values.
    for (f, val) in [(5usize, f32::NAN), (6, f32::INFINITY), (7, -1e38)] {
        v[f * FRAME_SIZE..(f + 1) * FRAME_SIZE].fill(val);
    }
    v
}

fn all_finite(c: &Collected) -> bool {
    c.pcm.iter().all(|x| x.is_finite())
}

#[test]
fn hostile_samples_behave_exactly_like_their_sanitised_version() {
    let frames = 30;
    let bad = hostile(frames);
    let clean: Vec<f32> = bad.iter().map(|&x| sanitised(x)).collect();
    assert!(clean.iter().all(|x| x.is_finite() && x.abs() <= 1.0));
    let got = run(greedy(), &bad);
    let want = run(greedy(), &clean);
    assert_eq!(got.frame_index.len(), frames);
    assert!(all_finite(&got), "non-finite output PCM");
    assert!(got.text_tokens.iter().skip(1).all(|t| t.is_some()));
    assert_same(&got, &want);

    // Subnormals alone are indistinguishable from silence, and clipping is a clamp.
    let denormal: Vec<f32> = (0..10 * FRAME_SIZE)
        .map(|i| f32::MIN_POSITIVE / (2 + i % 7) as f32 * if i % 2 == 0 { 1.0 } else { -1.0 })
        .collect();
    assert_same(
        &run(greedy(), &denormal),
        &run(greedy(), &vec![0.0; 10 * FRAME_SIZE]),
    );
    let loud: Vec<f32> = signal(10, 3).iter().map(|x| x * 1000.0).collect();
    let clipped: Vec<f32> = loud.iter().map(|x| x.clamp(-1.0, 1.0)).collect();
    assert_same(&run(greedy(), &loud), &run(greedy(), &clipped));
}

#[test]
fn empty_and_one_sample_chunks_equal_whole_frames() {
    let frames = 8;
    let pcm = signal(frames, 5);
    let want = run(greedy(), &pcm);

    let mut s = greedy_session();
    let mut got = Collected::default();
    let mut completed = 0u32;
    for (i, &x) in pcm.iter().enumerate() {
        // An empty push between every sample: never completes a frame, never fails.
        let r0 = s.push_pcm(&[]).unwrap();
        assert_eq!(r0.frames_completed, 0);
        let r = s.push_pcm(&[x]).unwrap();
        completed += r.frames_completed;
        assert_eq!(r.frames_dropped, 0);
        if (i + 1) % FRAME_SIZE == 0 {
            assert_eq!(r.frames_completed, 1, "frame completes on its last sample");
            while got.record(s.step().unwrap()) {}
        } else {
            assert_eq!(r.frames_completed, 0);
        }
    }
    assert_eq!(completed as usize, frames);
    assert_same(&got, &want);
    // A trailing partial frame is held, not processed.
    s.push_pcm(&pcm[..FRAME_SIZE - 1]).unwrap();
    assert!(matches!(s.step().unwrap(), Step::Idle));
    assert_eq!(s.counters().frames_processed, frames as u64);
}

/// 600 frames (48 s) of digital silence, then speech: every frame is processed, the output stays
/// finite, no frame is dropped, the queue never grows.
#[test]
fn long_silence_then_speech_stays_healthy() {
    let mut s = Session::new(engine(), common::sampled(9)).unwrap();
    let silence = vec![0.0f32; FRAME_SIZE];
    let mut c = Collected::default();
    let mut max_queued = 0;
    for _ in 0..600 {
        let r = s.push_pcm(&silence).unwrap();
        max_queued = max_queued.max(r.queued);
        while c.record(s.step().unwrap()) {}
    }
    let speech = signal(20, 1);
    for chunk in speech.chunks(FRAME_SIZE) {
        let r = s.push_pcm(chunk).unwrap();
        max_queued = max_queued.max(r.queued);
        while c.record(s.step().unwrap()) {}
    }
    let k = s.counters();
    assert_eq!(k.frames_processed, 620);
    assert_eq!(k.frames_dropped, 0);
    assert!(max_queued <= 1, "queue grew to {max_queued}");
    assert!(all_finite(&c));
    assert_eq!(c.frame_index, (0..620).collect::<Vec<u64>>());
}

/// A producer pushing 10x faster than real time (one frame every 8 ms) and then as fast as it can,
/// against the threaded runner: the input queue stays bounded by `max_queued_frames`, excess input
/// is dropped and counted, and every frame is accounted for.
#[test]
fn producer_at_ten_times_real_time_is_bounded_and_counted() {
    let max_q = 4;
    let opts = queued_greedy(max_q);
    let mut runner = Session::new(engine(), opts).unwrap().spawn(8).unwrap();
    let mut producer = runner.producer().unwrap();
    let events = runner.events().unwrap();
    let consumer = std::thread::spawn(move || {
        let mut frames = 0u64;
        let mut last_index = None;
        loop {
            match events.recv() {
                Some(Event::Frame(f)) => {
                    assert!(f.pcm.iter().all(|x| x.is_finite()));
                    // Drops never reset the stream: indices only increase.
                    if let Some(l) = last_index {
                        assert!(f.frame_index > l);
                    }
                    last_index = Some(f.frame_index);
                    frames += 1;
                    // A slow consumer, too.
                    if frames.is_multiple_of(16) {
                        std::thread::sleep(Duration::from_millis(5));
                    }
                }
                Some(Event::Error(e)) => panic!("session error: {e}"),
                Some(Event::Stopped(_)) | None => return frames,
            }
        }
    });
    let pcm = signal(40, 2);
    let mut pushed = 0u64;
    let mut dropped = 0u64;
    let mut max_seen = 0;
    // Phase 1: 10x real time for ~1.6 s.
    let start = Instant::now();
    for i in 0..200u64 {
        let f = (i as usize % 40) * FRAME_SIZE;
        let r = producer.push(&pcm[f..f + FRAME_SIZE]);
        pushed += u64::from(r.frames_completed);
        dropped += u64::from(r.frames_dropped);
        max_seen = max_seen.max(r.queued);
        let next = start + Duration::from_millis(8 * (i + 1));
        if let Some(d) = next.checked_duration_since(Instant::now()) {
            std::thread::sleep(d);
        }
    }
    // Phase 2: a burst with no pause at all, in odd chunk sizes.
    for i in 0..300usize {
        let f = (i % 39) * FRAME_SIZE;
        let r = producer.push(&pcm[f..f + FRAME_SIZE + 7]);
        pushed += u64::from(r.frames_completed);
        dropped += u64::from(r.frames_dropped);
        max_seen = max_seen.max(r.queued);
    }
    assert!(max_seen <= max_q, "queue held {max_seen} > {max_q}");
    assert!(
        dropped > 0,
        "a 300-frame burst must overflow a 4-frame queue"
    );
    let k = runner.stop().unwrap();
    let received = consumer.join().unwrap();
    assert_eq!(k.frames_in, pushed);
    assert_eq!(k.frames_dropped, dropped);
    assert_eq!(
        k.frames_in,
        k.frames_processed + k.frames_dropped + k.frames_discarded + k.queued as u64,
        "every input frame is processed, dropped, discarded or still queued: {k:?}"
    );
    assert!(received <= k.frames_processed);
}
