//! The threaded driver: one worker thread per session, an event queue, stop that joins exactly once.
//!
//! The worker never polls. It sleeps in `thread::park` when there is nothing to do (no whole input frame,
//! paused, or the event queue full) and is woken by whoever can change that: the PCM producer (a frame was
//! completed), the control handle (any command) and the event receiver (an event was taken). A wake-up that
//! happens before the worker parks is not lost (`unpark` leaves a token). Stop sets a flag and wakes the worker;
//! a frame pass in progress completes, then the worker returns; `SessionRunner::stop` joins it once.

use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender, TryRecvError, TrySendError};
use std::sync::Arc;
use std::thread::{self, JoinHandle, Thread};
use std::time::{Duration, Instant};

use crate::control::SessionControl;
use crate::events::{Counters, Event, FrameEvent};
use crate::ring::{FrameRing, PcmProducer};
use crate::RuntimeError;

/// Something the worker can drive frame by frame (the real [`crate::Session`], or a fake in tests).
pub(crate) trait Drive: Send + 'static {
    /// One step: the event it produced (a frame; a stop or an error, after which the worker ends), or
    /// `None` when there was nothing to do (idle or paused: the worker sleeps until woken). A produced
    /// frame should reuse `spare`'s buffers (taking it) when it is `Some`.
    fn drive(&mut self, spare: &mut Option<FrameEvent>) -> Option<Event>;
    fn control(&self) -> SessionControl;
    fn ring(&self) -> Arc<FrameRing>;
    fn take_producer(&mut self) -> Option<PcmProducer>;
    fn counters(&self) -> Counters;
}

/// Runs a session on its own worker thread.
///
/// ```text
/// let mut runner = SessionRunner::spawn(session, 16)?;
/// let mut mic = runner.producer().unwrap();      // give to the audio/network side
/// let events = runner.events().unwrap();          // give to the output side
/// ... mic.push(&pcm); while let Some(ev) = events.recv() { ... } ...
/// runner.stop()?;                                 // or drop
/// ```
pub struct SessionRunner {
    handles: Handles,
    join: Option<JoinHandle<Counters>>,
    result: Option<Counters>,
}

/// The parts a threaded driver hands out for one conversation: the command handle, and the producer and
/// event receiver (each taken once). [`SessionRunner`] and [`crate::BatchSession`] each hold one and expose
/// it with [`handle_accessors`].
pub(crate) struct Handles {
    pub(crate) control: SessionControl,
    pub(crate) producer: Option<PcmProducer>,
    pub(crate) events: Option<EventReceiver>,
}

/// The worker's ends of a conversation's queues: events go out, recycled frame buffers come back.
pub(crate) type WorkerEnds = (SyncSender<Event>, Receiver<FrameEvent>);

/// The consumer's ends of a conversation's queues (they become its [`EventReceiver`]).
pub(crate) type ConsumerEnds = (Receiver<Event>, SyncSender<FrameEvent>);

/// A conversation's event queue of `capacity` (>= 1) frames and the queue that brings frame buffers back
/// for reuse (two more, so that recycling never blocks the consumer): the worker's ends (events in,
/// recycled frames out), then the consumer's, for [`Handles::connect`].
pub(crate) fn queues(capacity: usize) -> (WorkerEnds, ConsumerEnds) {
    let (tx, rx) = mpsc::sync_channel(capacity.max(1));
    let (recycle, recycled) = mpsc::sync_channel(capacity.max(1) + 2);
    ((tx, recycled), (rx, recycle))
}

impl Handles {
    /// Connect a conversation (its input `ring`, `control` and `producer`, and the consumer's ends of its
    /// [`queues`]) to the thread `worker` that drives it: a completed input frame, a command and a taken
    /// event each unpark that thread, which otherwise sleeps.
    pub(crate) fn connect(
        (rx, recycle): ConsumerEnds,
        ring: &FrameRing,
        control: SessionControl,
        producer: Option<PcmProducer>,
        worker: &Thread,
    ) -> Handles {
        let (w1, w2) = (worker.clone(), worker.clone());
        ring.set_waker(Arc::new(move || w1.unpark()));
        control.set_waker(Arc::new(move || w2.unpark()));
        let events = EventReceiver::new(rx, recycle, worker.clone(), control.clone());
        Handles {
            control,
            producer,
            events: Some(events),
        }
    }
}

/// The accessors of [`Handles`] as methods of a driver's public handle type (a struct with a `handles`
/// field): one definition for the two drivers, whose handles hand out the same parts.
macro_rules! handle_accessors {
    () => {
        /// The producer end of the input queue (once). Each completed frame wakes the worker.
        pub fn producer(&mut self) -> Option<PcmProducer> {
            self.handles.producer.take()
        }

        /// The command handle (interrupt / pause / resume / reset / stop).
        pub fn control(&self) -> SessionControl {
            self.handles.control.clone()
        }

        /// The event receiver (once).
        pub fn events(&mut self) -> Option<EventReceiver> {
            self.handles.events.take()
        }
    };
}
pub(crate) use handle_accessors;

impl std::fmt::Debug for SessionRunner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionRunner")
            .field("control", &self.handles.control)
            .field("running", &self.join.is_some())
            .finish()
    }
}

/// The receiving end of a runner's events. `Send`; may be moved to another thread.
pub struct EventReceiver {
    rx: Receiver<Event>,
    recycle: SyncSender<FrameEvent>,
    worker: Thread,
    control: SessionControl,
}

impl std::fmt::Debug for EventReceiver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventReceiver").finish_non_exhaustive()
    }
}

impl EventReceiver {
    /// A receiver for events sent by the worker thread `worker` (which is unparked whenever an event is taken).
    pub(crate) fn new(
        rx: Receiver<Event>,
        recycle: SyncSender<FrameEvent>,
        worker: Thread,
        control: SessionControl,
    ) -> EventReceiver {
        EventReceiver {
            rx,
            recycle,
            worker,
            control,
        }
    }

    /// Whether to hand this event to the consumer (frames of an older epoch are dropped).
    /// Returns the event if it is to be delivered; a frame of an older epoch is dropped (its buffers recycled).
    fn keep(&self, ev: Event) -> Option<Event> {
        match ev {
            Event::Frame(f) if f.epoch < self.control.epoch() => {
                self.recycle(f);
                None
            }
            ev => Some(ev),
        }
    }

    /// Block until the next event. `None` once the worker has ended and every event was taken.
    pub fn recv(&self) -> Option<Event> {
        loop {
            let ev = self.rx.recv().ok()?;
            self.worker.unpark();
            if let Some(ev) = self.keep(ev) {
                return Some(ev);
            }
        }
    }

    /// Like [`EventReceiver::recv`] with a deadline.
    pub fn recv_timeout(&self, timeout: Duration) -> Result<Event, RecvTimeoutError> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let ev = self.rx.recv_timeout(left)?;
            self.worker.unpark();
            if let Some(ev) = self.keep(ev) {
                return Ok(ev);
            }
        }
    }

    /// Give a frame's buffers back to the worker, which reuses them for a later frame instead of allocating.
    /// Optional; a consumer that recycles every frame makes the whole threaded path allocation-free.
    pub fn recycle(&self, frame: FrameEvent) {
        let _ = self.recycle.try_send(frame);
    }

    /// The next event if one is ready.
    pub fn try_recv(&self) -> Result<Event, TryRecvError> {
        loop {
            let ev = self.rx.try_recv()?;
            self.worker.unpark();
            if let Some(ev) = self.keep(ev) {
                return Ok(ev);
            }
        }
    }
}

impl SessionRunner {
    /// Move a session onto a new worker thread. `event_capacity` (>= 1) bounds the queue of undelivered
    /// events; when it is full the worker waits (without consuming input) until the consumer takes one.
    pub fn spawn(
        session: crate::Session,
        event_capacity: usize,
    ) -> Result<SessionRunner, RuntimeError> {
        Self::spawn_driver(session, event_capacity)
    }

    pub(crate) fn spawn_driver<D: Drive>(
        mut driver: D,
        event_capacity: usize,
    ) -> Result<SessionRunner, RuntimeError> {
        let ((tx, recycled), consumer) = queues(event_capacity);
        let control = driver.control();
        let ring = driver.ring();
        let producer = driver.take_producer();
        let wctl = control.clone();
        let join = thread::Builder::new()
            .name("moshi-session".into())
            .spawn(move || worker(driver, tx, recycled, wctl))
            .map_err(RuntimeError::Spawn)?;
        let handles = Handles::connect(consumer, &ring, control, producer, join.thread());
        // A command or frame that arrived before the wakers were installed must not be missed.
        join.thread().unpark();
        Ok(SessionRunner {
            handles,
            join: Some(join),
            result: None,
        })
    }

    handle_accessors!();

    /// Whether the worker thread has ended (stopped, max steps, or error).
    pub fn is_finished(&self) -> bool {
        self.join.as_ref().is_none_or(|j| j.is_finished())
    }

    /// Request stop and join the worker (exactly once; later calls return the same counters). Never
    /// deadlocks: the worker never blocks on the event queue, and a frame pass in progress simply completes,
    /// so this blocks at most for the rest of one frame pass (call it off an async executor's worker threads).
    pub fn stop(&mut self) -> Result<Counters, RuntimeError> {
        self.handles.control.stop();
        if let Some(j) = self.join.take() {
            match j.join() {
                Ok(c) => self.result = Some(c),
                Err(_) => return Err(RuntimeError::WorkerPanicked),
            }
        }
        self.result.ok_or(RuntimeError::WorkerPanicked)
    }
}

impl Drop for SessionRunner {
    fn drop(&mut self) {
        let _ = self.stop();
    }
}

/// Send an event, waiting (parked) while the queue is full. Returns false if the worker must end
/// (receiver gone, or stop requested while waiting).
fn send<D: Drive>(tx: &SyncSender<Event>, mut ev: Event, control: &SessionControl, _d: &D) -> bool {
    loop {
        match tx.try_send(ev) {
            Ok(()) => return true,
            Err(TrySendError::Disconnected(_)) => return false,
            Err(TrySendError::Full(back)) => {
                if control.is_stop_requested() {
                    return false;
                }
                ev = back;
                thread::park();
            }
        }
    }
}

fn worker<D: Drive>(
    mut d: D,
    tx: SyncSender<Event>,
    recycled: Receiver<FrameEvent>,
    control: SessionControl,
) -> Counters {
    let mut spare: Option<FrameEvent> = None;
    loop {
        if spare.is_none() {
            spare = recycled.try_recv().ok();
        }
        match d.drive(&mut spare) {
            None => thread::park(),
            Some(Event::Frame(f)) => {
                if f.epoch < control.epoch() {
                    spare = Some(f); // interrupted after this frame was produced: discard, keep the buffers
                    continue;
                }
                if !send(&tx, Event::Frame(f), &control, &d) {
                    break;
                }
            }
            // A stop or an error is the conversation's last event.
            Some(last) => {
                if let Event::Error(e) = &last {
                    tracing::error!("session frame pass failed: {e}");
                }
                let _ = tx.try_send(last);
                break;
            }
        }
    }
    d.counters()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::events::StopReason;
    use crate::FRAME_SIZE;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A fake session: output = input frame scaled, with an optional hook called inside the pass.
    pub(crate) struct Fake {
        pub ring: Arc<FrameRing>,
        pub control: SessionControl,
        pub producer: Option<PcmProducer>,
        pub index: u64,
        pub processed: u64,
        pub hook: Option<Arc<dyn Fn() + Send + Sync>>,
        pub completed: Arc<AtomicUsize>,
    }

    impl Fake {
        pub fn new(cap: usize) -> Fake {
            let ring = FrameRing::new(cap);
            Fake {
                producer: Some(PcmProducer::new(ring.clone())),
                control: SessionControl::new(ring.clone()),
                ring,
                index: 0,
                processed: 0,
                hook: None,
                completed: Arc::new(AtomicUsize::new(0)),
            }
        }
    }

    impl Drive for Fake {
        fn drive(&mut self, _spare: &mut Option<FrameEvent>) -> Option<Event> {
            if self.control.is_stop_requested() {
                return Some(Event::Stopped(StopReason::Requested));
            }
            if self.control.is_paused() {
                return None;
            }
            let mut buf = [0f32; FRAME_SIZE];
            self.ring.pop(&mut buf)?;
            if let Some(h) = &self.hook {
                h();
            }
            let ev = FrameEvent {
                epoch: self.control.epoch(),
                frame_index: self.index,
                text_token: None,
                audio_tokens: None,
                text: String::new(),
                pcm: buf.iter().map(|x| x * 2.0).collect(),
                timings: Default::default(),
                counters: self.counters(),
            };
            self.index += 1;
            self.processed += 1;
            self.completed.fetch_add(1, Ordering::SeqCst);
            Some(Event::Frame(ev))
        }
        fn control(&self) -> SessionControl {
            self.control.clone()
        }
        fn ring(&self) -> Arc<FrameRing> {
            self.ring.clone()
        }
        fn take_producer(&mut self) -> Option<PcmProducer> {
            self.producer.take()
        }
        fn counters(&self) -> Counters {
            Counters {
                frames_processed: self.processed,
                ..Default::default()
            }
        }
    }

    #[test]
    fn frames_flow_and_stop_joins_once() {
        let mut r = SessionRunner::spawn_driver(Fake::new(8), 4).unwrap();
        let mut p = r.producer().unwrap();
        assert!(r.producer().is_none());
        let ev = r.events().unwrap();
        p.push(&vec![0.5; FRAME_SIZE * 2 + 10]);
        for i in 0..2 {
            match ev.recv_timeout(Duration::from_secs(10)).unwrap() {
                Event::Frame(f) => {
                    assert_eq!(f.frame_index, i);
                    assert!(f.pcm.iter().all(|&x| x == 1.0));
                }
                other => panic!("{other:?}"),
            }
        }
        let c = r.stop().unwrap();
        assert_eq!(c.frames_processed, 2);
        assert_eq!(r.stop().unwrap(), c, "second stop returns the same result");
        assert!(matches!(
            ev.recv(),
            Some(Event::Stopped(StopReason::Requested))
        ));
        assert!(ev.recv().is_none());
    }

    #[test]
    fn stop_while_idle_paused_or_output_full() {
        // idle
        let mut r = SessionRunner::spawn_driver(Fake::new(4), 1).unwrap();
        std::thread::sleep(Duration::from_millis(20));
        r.stop().unwrap();
        // paused with queued input
        let mut r = SessionRunner::spawn_driver(Fake::new(4), 1).unwrap();
        r.control().pause();
        r.producer().unwrap().push(&vec![0.1; FRAME_SIZE * 3]);
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(r.stop().unwrap().frames_processed, 0);
        // output queue full, nobody reading, receiver still alive
        let mut r = SessionRunner::spawn_driver(Fake::new(8), 1).unwrap();
        let _ev = r.events().unwrap();
        r.producer().unwrap().push(&vec![0.1; FRAME_SIZE * 5]);
        std::thread::sleep(Duration::from_millis(50));
        let c = r.stop().unwrap();
        assert!(
            c.frames_processed <= 3,
            "worker must wait while the queue is full: {c:?}"
        );
    }

    #[test]
    fn stop_inside_a_pass_completes_the_pass() {
        let mut fake = Fake::new(4);
        let (in_tx, in_rx) = mpsc::channel::<()>();
        let ctl = fake.control.clone();
        let in_tx = std::sync::Mutex::new(in_tx);
        fake.hook = Some(Arc::new(move || {
            in_tx.lock().unwrap().send(()).unwrap();
            // Stay inside the pass until stop has been requested.
            while !ctl.is_stop_requested() {
                std::thread::sleep(Duration::from_millis(1));
            }
        }));
        let completed = fake.completed.clone();
        let mut r = SessionRunner::spawn_driver(fake, 4).unwrap();
        let ev = r.events().unwrap();
        r.producer().unwrap().push(&vec![0.0; FRAME_SIZE]);
        in_rx.recv_timeout(Duration::from_secs(10)).unwrap();
        let c = r.stop().unwrap();
        assert_eq!(completed.load(Ordering::SeqCst), 1);
        assert_eq!(c.frames_processed, 1);
        // The frame finished before stop was observed; it is delivered, then Stopped.
        assert!(matches!(ev.recv(), Some(Event::Frame(_))));
        assert!(matches!(ev.recv(), Some(Event::Stopped(_))));
    }

    #[test]
    fn interrupt_drops_older_epochs_at_the_receiver() {
        let fake = Fake::new(8);
        let completed = fake.completed.clone();
        let mut r = SessionRunner::spawn_driver(fake, 8).unwrap();
        let ev = r.events().unwrap();
        let mut p = r.producer().unwrap();
        p.push(&vec![0.0; FRAME_SIZE * 3]);
        // Let the worker queue the three frames of epoch 0, then interrupt before reading them.
        let t0 = Instant::now();
        while completed.load(Ordering::SeqCst) < 3 && t0.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(1));
        }
        let e = r.control().interrupt();
        assert_eq!(e, 1);
        p.push(&vec![0.0; FRAME_SIZE]);
        match ev.recv_timeout(Duration::from_secs(10)).unwrap() {
            Event::Frame(f) => {
                assert_eq!(f.epoch, 1);
                assert_eq!(f.frame_index, 3);
            }
            other => panic!("{other:?}"),
        }
        r.stop().unwrap();
    }
}
