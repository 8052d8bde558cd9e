//! The threaded driver on the tiny bundle: events, epochs, and stop during every phase.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use common::*;
use runtime::{Event, Phase, Session, SessionRunner, StopReason};

const T: Duration = Duration::from_secs(30);

#[test]
fn runner_output_equals_stepping_by_hand() {
    let pcm = signal(8, 21);
    let opts = queued_greedy(16);
    let reference = run(opts.clone(), &pcm);
    let mut r = SessionRunner::spawn(Session::new(engine(), opts).unwrap(), 4).unwrap();
    let mut mic = r.producer().unwrap();
    let ev = r.events().unwrap();
    let feeder = std::thread::spawn(move || {
        for chunk in pcm.chunks(500) {
            mic.push(chunk);
        }
    });
    let mut got = Collected::default();
    while got.frame_index.len() < 8 {
        match ev.recv_timeout(T).unwrap() {
            Event::Frame(f) => got.record_event(&f),
            other => panic!("{other:?}"),
        }
    }
    feeder.join().unwrap();
    assert_same(&got, &reference);
    let c = r.stop().unwrap();
    assert_eq!(c.frames_processed, 8);
    assert!(matches!(
        ev.recv(),
        Some(Event::Stopped(StopReason::Requested))
    ));
    assert!(ev.recv().is_none());
}

#[test]
fn interrupted_epochs_are_not_delivered() {
    let pcm = signal(6, 22);
    let mut s = Session::new(engine(), queued_greedy(16)).unwrap();
    // Hold the worker at the start of frame 3 until the test has sent the interrupt.
    let (at3_tx, at3_rx) = mpsc::channel::<()>();
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let hook = Mutex::new((at3_tx, go_rx));
    let encodes = AtomicUsize::new(0);
    s.set_phase_hook(Some(Arc::new(move |p| {
        if p == Phase::Encode && encodes.fetch_add(1, Ordering::SeqCst) == 3 {
            let h = hook.lock().unwrap();
            h.0.send(()).unwrap();
            h.1.recv().unwrap();
        }
    })));
    let mut r = SessionRunner::spawn(s, 16).unwrap();
    let ev = r.events().unwrap();
    r.producer().unwrap().push(&pcm);
    at3_rx.recv_timeout(T).unwrap();
    // Frames 0..=2 are done and queued with epoch 0; frame 3 is in its pass (labelled epoch 0).
    assert_eq!(r.control().interrupt(), 1);
    go_tx.send(()).unwrap();
    let mut indices = Vec::new();
    while indices.len() < 2 {
        match ev.recv_timeout(T).unwrap() {
            Event::Frame(f) => {
                assert_eq!(
                    f.epoch, 1,
                    "frame {} of epoch {} delivered after interrupt",
                    f.frame_index, f.epoch
                );
                indices.push(f.frame_index);
            }
            other => panic!("{other:?}"),
        }
    }
    // Model state continued (indices are LM call indices); nothing of epoch 0 leaked through.
    assert_eq!(indices, [4, 5]);
    assert_eq!(r.stop().unwrap().frames_processed, 6);
}

/// Stop requested while the worker is inside `phase`: the pass completes, then the worker ends; stop joins once.
fn stop_during(phase: Phase) {
    let pcm = signal(4, 23);
    let mut s = greedy_session();
    let (tx, rx) = mpsc::channel::<()>();
    let tx = Mutex::new(tx);
    let entered = Arc::new(AtomicUsize::new(0));
    let ctl = s.control();
    let e2 = entered.clone();
    s.set_phase_hook(Some(Arc::new(move |p| {
        // The first frame has no decode (LMGen returns nothing at call 0): wait for phase `phase` of frame >= 1.
        if p == phase && e2.fetch_add(1, Ordering::SeqCst) == usize::from(phase == Phase::Decode) {
            tx.lock().unwrap().send(()).unwrap();
            while !ctl.is_stop_requested() {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    })));
    let mut r = SessionRunner::spawn(s, 8).unwrap();
    let ev = r.events().unwrap();
    r.producer().unwrap().push(&pcm);
    rx.recv_timeout(T).unwrap();
    let c = r.stop().unwrap();
    // The pass that was running completed; no further frame was started.
    let expected = if phase == Phase::Decode { 2 } else { 1 };
    assert_eq!(c.frames_processed, expected, "{phase:?}");
    let mut frames = 0;
    while let Some(e) = ev.recv() {
        match e {
            Event::Frame(_) => frames += 1,
            Event::Stopped(StopReason::Requested) => break,
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(frames, expected);
    assert_eq!(r.stop().unwrap(), c, "stop is idempotent");
}

#[test]
fn stop_during_every_phase() {
    for phase in [Phase::Encode, Phase::Lm, Phase::Depformer, Phase::Decode] {
        stop_during(phase);
    }
}

#[test]
fn stop_while_idle_paused_or_with_a_full_event_queue() {
    // idle
    let mut r = SessionRunner::spawn(greedy_session(), 1).unwrap();
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(r.stop().unwrap().frames_processed, 0);
    // paused with queued input
    let mut r = SessionRunner::spawn(greedy_session(), 1).unwrap();
    r.control().pause();
    r.producer().unwrap().push(&signal(3, 24));
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(r.stop().unwrap().frames_processed, 0);
    // event queue full (capacity 1), nobody reading, receiver alive
    let mut session = Session::new(engine(), queued_greedy(8)).unwrap();
    let started = Arc::new(AtomicUsize::new(0));
    let s2 = started.clone();
    session.set_phase_hook(Some(Arc::new(move |p| {
        if p == Phase::Encode {
            s2.fetch_add(1, Ordering::SeqCst);
        }
    })));
    let mut r = SessionRunner::spawn(session, 1).unwrap();
    let ev = r.events().unwrap();
    r.producer().unwrap().push(&signal(6, 25));
    // Wait (bounded) until the second pass has started; its event cannot be queued, so no third pass follows.
    let t0 = std::time::Instant::now();
    while started.load(Ordering::SeqCst) < 2 && t0.elapsed() < T {
        std::thread::sleep(Duration::from_millis(1));
    }
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(
        started.load(Ordering::SeqCst),
        2,
        "the worker waits for room in the event queue"
    );
    let c = r.stop().unwrap();
    assert_eq!(
        c.frames_processed, 2,
        "one event queued, one pass waiting for room"
    );
    assert!(matches!(ev.recv(), Some(Event::Frame(_))));
    assert!(
        ev.recv().is_none(),
        "the pending frame and Stopped could not be queued"
    );
    // dropping a running runner stops and joins it
    let r = SessionRunner::spawn(greedy_session(), 1).unwrap();
    drop(r);
}
