//! The batched runner: a slot produces what a single `Session` produces (tokens exactly, PCM exactly),
//! whatever the other slots do; per-slot commands; join / leave; stop; typed errors.

mod common;

use std::time::Duration;

use common::*;
use runtime::{
    BatchOptions, BatchRunner, BatchSession, Event, EventReceiver, PcmProducer, RuntimeError,
    Session, SessionOptions, StopReason, FRAME_SIZE,
};

const WAIT: Duration = Duration::from_secs(30);

/// Tokens, indices and epochs exactly; PCM exactly: the batch codec gives each slot the samples its own Mimi
/// decoder gives for the same codes (equal floats; only the sign of an exact zero may differ, see
/// `model::mimi::MimiBatchDecoder`), and the output resampler is per slot.
#[track_caller]
fn assert_close(got: &Collected, want: &Collected) {
    assert_eq!(got.frame_index, want.frame_index, "frame indices");
    assert_eq!(got.epoch, want.epoch, "epochs");
    assert_eq!(got.text_tokens, want.text_tokens, "text tokens");
    assert_eq!(got.audio, want.audio, "audio tokens");
    assert_eq!(got.text, want.text, "text");
    assert_eq!(got.pcm.len(), want.pcm.len(), "pcm length");
    let bad = got.pcm.iter().zip(&want.pcm).position(|(a, b)| a != b);
    assert_eq!(bad, None, "first differing sample");
}

/// A conversation in the batch with its ends taken out.
struct Conv {
    s: BatchSession,
    mic: PcmProducer,
    ev: EventReceiver,
    got: Collected,
}

impl Conv {
    fn open(r: &BatchRunner, opts: SessionOptions) -> Conv {
        let mut s = r.open(opts).unwrap();
        Conv {
            mic: s.producer().unwrap(),
            ev: s.events().unwrap(),
            s,
            got: Collected::default(),
        }
    }

    /// Push one frame and wait for its event.
    fn frame(&mut self, pcm: &[f32]) {
        self.mic.push(pcm);
        self.expect_frame();
    }

    fn expect_frame(&mut self) {
        match self.ev.recv_timeout(WAIT).unwrap() {
            Event::Frame(f) => {
                self.got.record_event(&f);
                self.ev.recycle(f);
            }
            other => panic!("slot {}: {other:?}", self.s.slot()),
        }
    }

    /// Push one frame without waiting (its event is collected later).
    fn push(&mut self, pcm: &[f32]) {
        self.mic.push(pcm);
    }
}

fn frame_of(pcm: &[f32], i: usize) -> &[f32] {
    &pcm[i * FRAME_SIZE..(i + 1) * FRAME_SIZE]
}

#[test]
fn slot_matches_a_single_session_while_neighbours_come_and_go() {
    let r = BatchRunner::spawn(
        engine(),
        BatchOptions {
            slots: 3,
            event_capacity: 8,
        },
    )
    .unwrap();
    let frames = 24;
    let pcm_a = signal(frames, 1);
    let pcm_b = signal(frames, 2);
    let pcm_c = signal(frames, 3);
    let want_a = run(sampled(11), &pcm_a);
    let want_b = run(greedy(), &pcm_b);

    let mut a = Conv::open(&r, sampled(11));
    let mut b = Conv::open(&r, greedy());
    let mut c: Option<Conv> = None;
    for i in 0..frames {
        // B is fed in bursts (two frames at once every other tick), so A is sometimes stepped alone and
        // sometimes together with B; C joins, pauses, resets and leaves meanwhile (and never reads its events,
        // so its queue fills up and it is held back).
        if i % 2 == 0 {
            b.push(frame_of(&pcm_b, i));
            b.push(frame_of(&pcm_b, i + 1));
        }
        if i == 5 {
            c = Some(Conv::open(&r, sampled(3)));
        }
        if let Some(cc) = c.as_mut() {
            match i {
                9 => cc.s.control().pause(),
                12 => {
                    cc.s.control().resume();
                    cc.s.control().reset();
                }
                _ => {}
            }
            cc.push(frame_of(&pcm_c, i));
        }
        if i == 17 {
            let mut cc = c.take().unwrap();
            cc.s.stop().unwrap();
            assert!(cc.s.is_finished());
        }
        a.frame(frame_of(&pcm_a, i));
        if i % 2 == 1 {
            while b.got.frame_index.len() < i + 1 {
                b.expect_frame();
            }
        }
    }
    assert_close(&a.got, &want_a);
    assert_close(&b.got, &want_b);
    let ca = a.s.stop().unwrap();
    assert_eq!(ca.frames_processed, frames as u64);
    assert_eq!(
        a.s.stop().unwrap(),
        ca,
        "second stop returns the same counters"
    );
    assert!(matches!(
        a.ev.recv_timeout(WAIT),
        Ok(Event::Stopped(StopReason::Requested))
    ));
    assert!(a.ev.recv().is_none());
    r.stop().unwrap();
    r.stop().unwrap();
}

/// One action of a command script.
#[derive(Clone, Copy, Debug)]
enum Act {
    /// Push frame `i` of the signal.
    Push(usize),
    Interrupt,
    Pause,
    Resume,
    Reset,
}

/// The script on a single `Session`, stepped by hand.
fn script_on_session(opts: SessionOptions, pcm: &[f32], script: &[Act]) -> Collected {
    let mut s = Session::new(engine(), opts).unwrap();
    let mut c = Collected::default();
    for act in script {
        match *act {
            Act::Push(i) => {
                s.push_pcm(frame_of(pcm, i)).unwrap();
            }
            Act::Interrupt => {
                s.interrupt();
            }
            Act::Pause => s.pause(),
            Act::Resume => s.resume(),
            Act::Reset => {
                s.reset();
            }
        }
        while c.record(s.step().unwrap()) {}
    }
    c
}

/// The same script on a batch slot: after each action, wait for the frames it makes runnable.
fn script_on_slot(conv: &mut Conv, pcm: &[f32], script: &[Act]) {
    let mut paused = false;
    let mut queued = 0;
    for act in script {
        match *act {
            Act::Push(i) => {
                conv.push(frame_of(pcm, i));
                queued += 1;
            }
            Act::Interrupt => {
                conv.s.control().interrupt();
            }
            Act::Pause => {
                conv.s.control().pause();
                paused = true;
            }
            Act::Resume => {
                conv.s.control().resume();
                paused = false;
            }
            Act::Reset => {
                conv.s.control().reset();
                queued = 0;
            }
        }
        if !paused {
            for _ in 0..queued {
                conv.expect_frame();
            }
            queued = 0;
        }
    }
}

#[test]
fn per_slot_commands_keep_single_session_semantics() {
    use Act::*;
    let script = [
        Push(0),
        Push(1),
        Push(2),
        Interrupt,
        Push(3),
        Push(4),
        Pause,
        Push(5),
        Push(6),
        Resume,
        Push(7),
        Reset,
        Push(8),
        Push(9),
        Push(10),
        Interrupt,
        Interrupt,
        Push(11),
        Pause,
        Resume,
        Push(12),
        Push(13),
    ];
    let pcm = signal(14, 5);
    let pcm_other = signal(14, 6);
    // Without the first-frame rule a reset command is the only thing that resets the slot's Mimi streams
    // (with it, the rule resets them again right after the first frame, which would hide a missed reset).
    for first_frame_reset in [true, false] {
        let opts = SessionOptions {
            first_frame_reset,
            ..sampled(21)
        };
        let want = script_on_session(opts.clone(), &pcm, &script);
        let r = BatchRunner::spawn(engine(), BatchOptions::default()).unwrap();
        // A neighbour that runs the whole time, fed without waiting (its queue holds all of its input).
        let other_opts = SessionOptions {
            max_queued_frames: 8,
            ..sampled(1)
        };
        let mut other = Conv::open(&r, other_opts.clone());
        let mut conv = Conv::open(&r, opts);
        for i in 0..6 {
            other.push(frame_of(&pcm_other, i));
        }
        script_on_slot(&mut conv, &pcm, &script);
        assert_close(&conv.got, &want);
        for _ in 0..6 {
            other.expect_frame();
        }
        assert_close(&other.got, &run(other_opts, &pcm_other[..6 * FRAME_SIZE]));
    }
}

#[test]
fn join_leave_reuse_and_errors() {
    let r = BatchRunner::spawn(
        engine(),
        BatchOptions {
            slots: 2,
            event_capacity: 4,
        },
    )
    .unwrap();
    assert_eq!(r.slots(), 2);
    let pcm = signal(6, 9);
    let mut x = Conv::open(&r, sampled(4));
    let y = Conv::open(&r, greedy());
    assert_eq!(r.active(), 2);
    assert!(matches!(
        r.open(greedy()),
        Err(RuntimeError::NoFreeSlot { slots: 2 })
    ));
    // Run X a little, then let it leave; a newcomer gets its slot and starts fresh.
    for i in 0..3 {
        x.frame(frame_of(&pcm, i));
    }
    let slot_x = x.s.slot();
    drop(x);
    assert_eq!(r.active(), 1);
    let mut z = Conv::open(&r, sampled(4));
    assert_eq!(z.s.slot(), slot_x);
    for i in 0..6 {
        z.frame(frame_of(&pcm, i));
    }
    assert_close(&z.got, &run(sampled(4), &pcm));
    // max_steps: the slot stops by itself and leaves the batch.
    drop(y);
    let mut m = Conv::open(
        &r,
        SessionOptions {
            max_steps: Some(2),
            ..greedy()
        },
    );
    m.push(&pcm[..4 * FRAME_SIZE]);
    m.expect_frame();
    m.expect_frame();
    assert!(matches!(
        m.ev.recv_timeout(WAIT),
        Ok(Event::Stopped(StopReason::MaxSteps))
    ));
    assert!(m.ev.recv().is_none());
    assert_eq!(m.s.stop().unwrap().frames_processed, 2);
    // Bad options are typed errors.
    assert!(matches!(
        r.open(queued_greedy(0)),
        Err(RuntimeError::InvalidOption(_))
    ));
    assert!(matches!(
        r.open(SessionOptions {
            output_rate: 0,
            ..greedy()
        }),
        Err(RuntimeError::InvalidOption(_))
    ));
    assert!(matches!(
        BatchRunner::spawn(
            engine(),
            BatchOptions {
                slots: 0,
                event_capacity: 1
            }
        ),
        Err(RuntimeError::InvalidOption(_))
    ));
    // Stopping the runner stops every conversation, exactly once.
    r.stop().unwrap();
    assert!(r.is_finished());
    assert!(matches!(
        z.ev.recv_timeout(WAIT),
        Ok(Event::Stopped(StopReason::Requested))
    ));
    assert!(z.ev.recv().is_none());
    assert_eq!(z.s.stop().unwrap().frames_processed, 6);
    assert!(matches!(r.open(greedy()), Err(RuntimeError::RunnerStopped)));
    r.stop().unwrap();
}

#[test]
fn a_full_event_queue_holds_only_its_own_slot() {
    let r = BatchRunner::spawn(
        engine(),
        BatchOptions {
            slots: 2,
            event_capacity: 1,
        },
    )
    .unwrap();
    let pcm = signal(8, 12);
    let mut lazy = Conv::open(&r, greedy());
    let mut busy = Conv::open(&r, greedy());
    // Nobody reads `lazy`: after one queued event and one pending it stops being stepped ...
    lazy.push(&pcm[..4 * FRAME_SIZE]);
    // ... while `busy` goes on.
    for i in 0..8 {
        busy.frame(frame_of(&pcm, i));
    }
    assert!(lazy.s.control().epoch() == 0 && !lazy.s.is_finished());
    // Reading `lazy` now gives its frames in order, the same as a fresh session.
    for _ in 0..4 {
        lazy.expect_frame();
    }
    assert_close(&lazy.got, &run(greedy(), &pcm[..4 * FRAME_SIZE]));
    assert_close(&busy.got, &run(greedy(), &pcm));
    // Stop with a full queue and nobody reading never deadlocks.
    busy.push(&pcm[..3 * FRAME_SIZE]);
    std::thread::sleep(Duration::from_millis(20));
    busy.s.stop().unwrap();
    r.stop().unwrap();
}
