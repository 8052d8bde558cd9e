//! The batched driver: several conversations share one worker thread, one pool and one batched LM step.
//!
//! A [`BatchRunner`] owns `slots` conversation slots and a worker thread with one compute context (on the CPU, a
//! `kernels::Pool` that the LM and every slot's Mimi streams share), the stepper (`stepper.rs`: the codec of
//! `slots` slots and the LM of `slots` rows) and, per slot, a conversation (`conversation.rs`: input ring,
//! control handle, detokenizer, resampler) and its event queue. A conversation joins with
//! [`BatchRunner::open`] (a free slot, or [`RuntimeError::NoFreeSlot`]) and gets a [`BatchSession`] with the same
//! parts as a [`crate::SessionRunner`]: [`PcmProducer`], [`SessionControl`], [`EventReceiver`] (same [`Event`]s),
//! and `stop`. Commands keep exactly their single-session semantics, per slot (the same code applies them).
//!
//! Each tick of the worker: apply every slot's commands, take the slots that have a whole input frame (and room
//! in their event queue), Mimi-encode their frames in ONE call of the codec, run ONE LM step for that
//! subset, Mimi-decode the frames it produced in ONE call, then detokenize, resample and emit per slot: each
//! weight matrix (codec and LM) is read once per tick for all stepped slots. The per-slot parts are the same
//! `Stepper` / `Conversation` calls a [`crate::Session`] makes for its single row. Slots without input are not
//! stepped and none of their state moves; a slot's reset (command, first-frame rule, a new conversation in
//! the slot) resets its own codec streams and LM rows only. A slot that stops, fails or whose receiver is gone
//! leaves the batch; its LM rows are reset for reuse. After warm-up a tick allocates nothing.
//!
//! Results of a slot equal those of a [`crate::Session`] with the same options fed the same audio, whatever
//! the other slots do: Mimi codes and samples exactly (`model::mimi::MimiBatchEncoder`), tokens exactly in
//! practice (the batched LM step sums in another order than a single row).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, Sender, SyncSender, TryRecvError, TrySendError};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::{self, JoinHandle, Thread};

use model::sampling::Sampler;

use crate::control::SessionControl;
use crate::conversation::Conversation;
use crate::events::{Counters, Event, FrameEvent, StopReason};
use crate::inlet::{Begin, Inlet};
use crate::ring::{FrameRing, PcmProducer};
use crate::runner::{handle_accessors, queues, EventReceiver, Handles};
use crate::stepper::{new_sampler, Stepper};
use crate::{Engine, RuntimeError, SessionOptions, FRAME_SIZE};

/// Options of [`BatchRunner::spawn`].
#[derive(Clone, Debug)]
pub struct BatchOptions {
    /// Conversation slots (>= 1): the most sessions stepped together. Every slot's LM state (KV caches) is
    /// allocated up front. Default 4.
    pub slots: usize,
    /// Bound of each slot's event queue, in frames (>= 1). When a slot's queue is full that slot waits
    /// (its input stays queued) while the others go on. Default 16.
    pub event_capacity: usize,
}

impl Default for BatchOptions {
    fn default() -> Self {
        BatchOptions {
            slots: 4,
            event_capacity: 16,
        }
    }
}

/// Bookkeeping of one slot, shared between the worker and the handles.
#[derive(Clone, Copy, Debug, Default)]
struct SlotInfo {
    busy: bool,
    /// Bumped at every join, so that a handle only ever waits for its own conversation.
    generation: u64,
    /// Final counters of the last conversation that left the slot.
    last: Option<Counters>,
}

struct Shared {
    stop: AtomicBool,
    /// Slot table; also serialises joins against the worker's exit (see `Worker::exit`).
    slots: Mutex<Table>,
    /// Notified when a slot is released or the worker ended.
    released: Condvar,
}

struct Table {
    info: Vec<SlotInfo>,
    /// The worker ended (stopped or panicked): no slot will be served any more.
    done: bool,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Table> {
        // A poisoned lock only means a panic elsewhere while holding it; the table stays consistent.
        self.slots.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A conversation joining the batch (built by the caller of `open`, installed by the worker).
struct Join {
    slot: usize,
    conv: Conversation,
    sampler: Sampler,
    tx: SyncSender<Event>,
    recycled: Receiver<FrameEvent>,
}

/// A running batch of conversations on one worker thread. `Send + Sync`: share it (e.g. in an `Arc`) between
/// the threads that open conversations. Dropping it stops the worker (every conversation gets
/// `Event::Stopped(StopReason::Requested)`).
pub struct BatchRunner {
    engine: Arc<Engine>,
    shared: Arc<Shared>,
    joins: Mutex<Sender<Join>>,
    worker: Thread,
    join: Mutex<Option<JoinHandle<()>>>,
    event_capacity: usize,
}

impl std::fmt::Debug for BatchRunner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BatchRunner")
            .field("slots", &self.slots())
            .field("active", &self.active())
            .finish()
    }
}

impl BatchRunner {
    /// Allocate the batch (LM state of every slot) and start its worker thread, computing on
    /// `engine.options().device` (on the CPU: one pool of that many threads for the whole batch).
    pub fn spawn(engine: Arc<Engine>, opts: BatchOptions) -> Result<BatchRunner, RuntimeError> {
        if opts.slots == 0 {
            return Err(RuntimeError::InvalidOption("slots must be >= 1".into()));
        }
        let (worker, shared, jtx) = Worker::new(&engine, opts.slots, None)?;
        let join = thread::Builder::new()
            .name("moshi-batch".into())
            .spawn(move || worker.run())
            .map_err(RuntimeError::Spawn)?;
        Ok(BatchRunner {
            engine,
            shared,
            joins: Mutex::new(jtx),
            worker: join.thread().clone(),
            join: Mutex::new(Some(join)),
            event_capacity: opts.event_capacity.max(1),
        })
    }

    /// Number of slots.
    pub fn slots(&self) -> usize {
        self.shared.lock().info.len()
    }

    /// Slots currently taken by a conversation.
    pub fn active(&self) -> usize {
        self.shared.lock().info.iter().filter(|s| s.busy).count()
    }

    /// Whether the worker has ended (stopped, or panicked).
    pub fn is_finished(&self) -> bool {
        self.shared.lock().done
    }

    /// Join the batch with a new conversation in a free slot (allocates its sampler, rings and output buffers;
    /// the worker only installs them; the slot's Mimi streams are part of the worker's codec). `opts` has the meaning it has for [`crate::Session::new`]. Errors:
    /// [`RuntimeError::NoFreeSlot`] when every slot is taken, [`RuntimeError::RunnerStopped`] after stop,
    /// [`RuntimeError::InvalidOption`] for bad options.
    pub fn open(&self, opts: SessionOptions) -> Result<BatchSession, RuntimeError> {
        if opts.max_queued_frames == 0 {
            return Err(RuntimeError::InvalidOption(
                "max_queued_frames must be >= 1".into(),
            ));
        }
        let sampler = new_sampler(&self.engine, opts.sampling.clone())?;
        let ring = FrameRing::new(opts.max_queued_frames);
        let inlet = Inlet::new(ring.clone(), opts.max_steps);
        let control = inlet.control.clone();
        let conv = Conversation::new(
            &self.engine,
            inlet,
            opts.output_rate,
            opts.first_frame_reset,
        )?;
        let producer = PcmProducer::new(ring.clone());
        let ((tx, recycled), consumer) = queues(self.event_capacity);
        let handles = Handles::connect(consumer, &ring, control, Some(producer), &self.worker);

        // Reserve a slot and hand the conversation to the worker under the table lock, so that the worker's
        // exit (which sets `done` and drains the queue under the same lock) never strands a join.
        let mut table = self.shared.lock();
        if table.done || self.shared.stop.load(Ordering::Acquire) {
            return Err(RuntimeError::RunnerStopped);
        }
        let Some(slot) = table.info.iter().position(|s| !s.busy) else {
            return Err(RuntimeError::NoFreeSlot {
                slots: table.info.len(),
            });
        };
        let joins = self.joins.lock().unwrap_or_else(|e| e.into_inner());
        let sent = joins.send(Join {
            slot,
            conv,
            sampler,
            tx,
            recycled,
        });
        drop(joins);
        if sent.is_err() {
            return Err(RuntimeError::RunnerStopped);
        }
        let info = &mut table.info[slot];
        info.busy = true;
        info.generation += 1;
        info.last = None;
        let generation = info.generation;
        drop(table);
        self.worker.unpark();
        Ok(BatchSession {
            slot,
            generation,
            handles,
            shared: self.shared.clone(),
            result: None,
        })
    }

    /// Stop every conversation and join the worker (exactly once; later calls return at once). Blocks at most
    /// for the rest of the tick in progress.
    pub fn stop(&self) -> Result<(), RuntimeError> {
        self.shared.stop.store(true, Ordering::Release);
        self.worker.unpark();
        let handle = self.join.lock().unwrap_or_else(|e| e.into_inner()).take();
        match handle {
            Some(h) => h.join().map_err(|_| RuntimeError::WorkerPanicked),
            None => Ok(()),
        }
    }
}

impl Drop for BatchRunner {
    fn drop(&mut self) {
        let _ = self.stop();
    }
}

/// One conversation in a [`BatchRunner`]: the same parts as a [`crate::SessionRunner`] (producer, control,
/// events, stop). Dropping it stops the conversation and frees its slot.
pub struct BatchSession {
    slot: usize,
    generation: u64,
    handles: Handles,
    shared: Arc<Shared>,
    result: Option<Counters>,
}

impl std::fmt::Debug for BatchSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BatchSession")
            .field("slot", &self.slot)
            .field("control", &self.handles.control)
            .finish()
    }
}

impl BatchSession {
    /// The slot index inside the batch.
    pub fn slot(&self) -> usize {
        self.slot
    }

    handle_accessors!();

    /// Whether this conversation has left the batch (stopped, failed, or the runner ended).
    pub fn is_finished(&self) -> bool {
        let t = self.shared.lock();
        t.done || t.info[self.slot].generation != self.generation || !t.info[self.slot].busy
    }

    /// Request stop and wait until the worker has released the slot (exactly once; later calls return the same
    /// counters). Blocks at most for the rest of the tick in progress. Returns the final counters.
    pub fn stop(&mut self) -> Result<Counters, RuntimeError> {
        if let Some(c) = self.result {
            return Ok(c);
        }
        self.handles.control.stop();
        let mut t = self.shared.lock();
        loop {
            let info = t.info[self.slot];
            if info.generation != self.generation || !info.busy {
                // Released (the slot may already serve someone else: then its `last` is not ours).
                let c = if info.generation == self.generation {
                    info.last
                } else {
                    None
                };
                self.result = Some(c.unwrap_or_default());
                return Ok(self.result.unwrap_or_default());
            }
            if t.done {
                // The worker ended without releasing this slot: it panicked.
                return Err(RuntimeError::WorkerPanicked);
            }
            t = self
                .shared
                .released
                .wait(t)
                .unwrap_or_else(|e| e.into_inner());
        }
    }
}

impl Drop for BatchSession {
    fn drop(&mut self) {
        let _ = self.stop();
    }
}

/// A conversation installed in a slot.
struct Slot {
    conv: Conversation,
    tx: SyncSender<Event>,
    recycled: Receiver<FrameEvent>,
    /// An event the full queue did not take yet; the slot is not stepped until it is delivered.
    pending: Option<Event>,
    spare: Option<FrameEvent>,
}

/// What to do with a slot after looking at it.
enum Verdict {
    Skip,
    Step,
    Leave(Option<Event>),
}

struct Worker {
    shared: Arc<Shared>,
    joins: Receiver<Join>,
    /// The codec and LM side: one codec slot and one LM row per slot.
    stepper: Stepper,
    slots: Vec<Option<Slot>>,
}

/// Marks the worker as ended (also when it unwinds) and wakes every waiting handle.
struct DoneGuard(Arc<Shared>);

impl Drop for DoneGuard {
    fn drop(&mut self) {
        self.0.lock().done = true;
        self.0.released.notify_all();
    }
}

impl Worker {
    /// A worker of `n` empty slots on a compute context of its own, with its shared table and join queue.
    /// `kv_capacity` as in [`crate::Session::with_kv_capacity`]; `None` keeps the model's context.
    fn new(
        engine: &Engine,
        n: usize,
        kv_capacity: Option<usize>,
    ) -> Result<(Worker, Arc<Shared>, Sender<Join>), RuntimeError> {
        let compute = engine.workers();
        let stepper = Stepper::new(engine, &compute, n, kv_capacity)?;
        let shared = Arc::new(Shared {
            stop: AtomicBool::new(false),
            slots: Mutex::new(Table {
                info: vec![SlotInfo::default(); n],
                done: false,
            }),
            released: Condvar::new(),
        });
        let (jtx, jrx) = mpsc::channel();
        let worker = Worker {
            shared: shared.clone(),
            joins: jrx,
            stepper,
            slots: (0..n).map(|_| None).collect(),
        };
        Ok((worker, shared, jtx))
    }

    fn run(mut self) {
        let _guard = DoneGuard(self.shared.clone());
        self.stepper.warm_up_codec();
        while !self.shared.stop.load(Ordering::Acquire) {
            self.install_joins();
            if !self.tick() {
                thread::park();
            }
        }
        self.exit();
    }

    fn install_joins(&mut self) {
        loop {
            match self.joins.try_recv() {
                Ok(j) => {
                    let b = j.slot;
                    self.stepper.reset_row(b);
                    self.stepper.reset_codec(b);
                    self.stepper.set_sampler(b, j.sampler);
                    self.slots[b] = Some(Slot {
                        conv: j.conv,
                        tx: j.tx,
                        recycled: j.recycled,
                        pending: None,
                        spare: None,
                    });
                }
                Err(TryRecvError::Empty) | Err(TryRecvError::Disconnected) => return,
            }
        }
    }

    /// Remove the conversation of slot `b`, sending `last` (best effort) first, reset its LM rows and sampler,
    /// and publish its final counters.
    fn release(&mut self, b: usize, last: Option<Event>) {
        let Some(slot) = self.slots[b].take() else {
            return;
        };
        if let Some(ev) = last {
            let _ = slot.tx.try_send(ev);
        }
        let counters = slot.conv.inlet.counters();
        drop(slot);
        self.stepper.reset_row(b);
        let mut t = self.shared.lock();
        t.info[b].busy = false;
        t.info[b].last = Some(counters);
        drop(t);
        self.shared.released.notify_all();
    }

    /// Look at slot `b`: deliver a pending event, apply commands, pop and encode a frame.
    fn prepare(&mut self, b: usize) -> Verdict {
        let Some(slot) = self.slots[b].as_mut() else {
            return Verdict::Skip;
        };
        if let Some(ev) = slot.pending.take() {
            match slot.tx.try_send(ev) {
                Ok(()) => {}
                Err(TrySendError::Full(ev)) => {
                    if slot.conv.inlet.control.is_stop_requested() {
                        return Verdict::Leave(None);
                    }
                    slot.pending = Some(ev);
                    return Verdict::Skip;
                }
                Err(TrySendError::Disconnected(_)) => return Verdict::Leave(None),
            }
        }
        if slot.spare.is_none() {
            slot.spare = slot.recycled.try_recv().ok();
        }
        match self.stepper.begin(b, &mut slot.conv) {
            Begin::Idle | Begin::Paused => Verdict::Skip,
            Begin::Stopped(r) => Verdict::Leave(Some(Event::Stopped(r))),
            Begin::Ready => Verdict::Step,
        }
    }

    /// Encode the frames staged this tick in one codec call and admit their rows to the LM step. A
    /// failure is reported to (and removes) the slots of that call.
    fn encode_ready(&mut self) {
        if let Err(e) = self.stepper.encode() {
            tracing::error!("batch: encode failed: {e}");
            let e = Arc::new(e);
            for j in 0..self.stepper.staged().len() {
                let b = self.stepper.staged()[j];
                let ev = Event::Error(RuntimeError::Batch(e.clone()));
                self.release(b, Some(ev));
            }
            return;
        }
        for j in 0..self.stepper.staged().len() {
            let b = self.stepper.staged()[j];
            if let Some(slot) = self.slots[b].as_mut() {
                self.stepper.admit(j, &mut slot.conv);
            }
        }
    }

    /// Decode, in one codec call, the frames this tick's LM step produced. A failure is reported to
    /// (and removes) the slots of that call.
    fn decode_results(&mut self) {
        if let Err(e) = self.stepper.decode() {
            tracing::error!("batch: decode failed: {e}");
            let e = Arc::new(e);
            for j in 0..self.stepper.decoding().len() {
                let b = self.stepper.decoding()[j];
                let ev = Event::Error(RuntimeError::Batch(e.clone()));
                self.release(b, Some(ev));
            }
        }
    }

    /// One tick; returns whether any slot was stepped.
    fn tick(&mut self) -> bool {
        self.stepper.begin_tick();
        for b in 0..self.slots.len() {
            match self.prepare(b) {
                Verdict::Skip | Verdict::Step => {}
                Verdict::Leave(ev) => self.release(b, ev),
            }
        }
        if self.stepper.staged().is_empty() {
            return false;
        }
        self.encode_ready();
        let m = self.stepper.active().len();
        if m == 0 {
            // The encode failed: those slots left.
            return true;
        }
        if let Err(e) = self.stepper.step_lm() {
            // An argument error (nothing was stepped): a bug, reported to every slot of this tick.
            let e = Arc::new(e);
            for i in 0..m {
                let b = self.stepper.active()[i];
                let ev = Event::Error(RuntimeError::Batch(e.clone()));
                self.release(b, Some(ev));
            }
            return true;
        }
        self.decode_results();
        for i in 0..m {
            let b = self.stepper.active()[i];
            if let Some(ev) = self.emit(i, b) {
                self.release(b, Some(ev));
            }
        }
        true
    }

    /// Finish result `i` of this tick (slot `b`'s frame) and queue its event. Returns the last event to send
    /// if the slot must leave.
    fn emit(&mut self, i: usize, b: usize) -> Option<Event> {
        let slot = self.slots[b].as_mut()?;
        if let Err(e) = self.stepper.finish(i, &mut slot.conv) {
            return Some(Event::Error(e));
        }
        let frame = &slot.conv.frame;
        let ev = match slot.spare.take() {
            Some(mut ev) => {
                frame.copy_into(&mut ev);
                ev
            }
            None => frame.to_event(),
        };
        if ev.epoch < slot.conv.inlet.control.epoch() {
            // Interrupted after this frame was produced: discard it, keep the buffers.
            slot.spare = Some(ev);
            return None;
        }
        match slot.tx.try_send(Event::Frame(ev)) {
            Ok(()) => None,
            Err(TrySendError::Full(ev)) => {
                slot.pending = Some(ev);
                None
            }
            // Nobody listens any more: leave.
            Err(TrySendError::Disconnected(_)) => Some(Event::Stopped(StopReason::Requested)),
        }
    }

    /// Worker exit: every conversation gets `Stopped(Requested)` (best effort) and its slot is released.
    fn exit(&mut self) {
        for b in 0..self.slots.len() {
            if self.slots[b].is_some() {
                self.release(b, Some(Event::Stopped(StopReason::Requested)));
            }
        }
        // Joins still queued: refuse them under the table lock (`open` sends under it), so none is stranded.
        let mut t = self.shared.lock();
        t.done = true;
        while let Ok(j) = self.joins.try_recv() {
            let _ = j.tx.try_send(Event::Stopped(StopReason::Requested));
            t.info[j.slot].busy = false;
            t.info[j.slot].last = Some(j.conv.inlet.counters());
        }
        drop(t);
        self.shared.released.notify_all();
    }
}

/// A batch worker driven tick by tick on the caller's thread, every slot taken by a conversation: for benchmarks
/// that time the whole tick of a [`BatchRunner`] (commands, one joint Mimi encode, one LM step, one joint Mimi
/// decode, detokenize, resample, emit) without the scheduling of its thread. Not part of the API.
#[doc(hidden)]
pub struct BatchBench {
    worker: Worker,
    mics: Vec<PcmProducer>,
    events: Vec<Receiver<Event>>,
    recycle: Vec<SyncSender<FrameEvent>>,
}

impl BatchBench {
    /// `slots` conversations with options `opts` in a fresh batch of `engine`, whose LM keeps `kv_capacity`
    /// temporal KV entries per slot (see [`crate::Session::with_kv_capacity`]): a benchmark of a few hundred ticks
    /// then holds a few hundred entries per slot instead of the model's full context.
    pub fn new(
        engine: &Arc<Engine>,
        slots: usize,
        opts: &SessionOptions,
        kv_capacity: usize,
    ) -> Result<BatchBench, RuntimeError> {
        if slots == 0 {
            return Err(RuntimeError::InvalidOption("slots must be >= 1".into()));
        }
        let (mut worker, shared, joins) = Worker::new(engine, slots, Some(kv_capacity))?;
        worker.stepper.warm_up_codec();
        let (mut mics, mut events, mut recycle) = (Vec::new(), Vec::new(), Vec::new());
        for slot in 0..slots {
            let ring = FrameRing::new(opts.max_queued_frames.max(1));
            let inlet = Inlet::new(ring.clone(), opts.max_steps);
            let conv = Conversation::new(engine, inlet, opts.output_rate, opts.first_frame_reset)?;
            let (tx, rx) = mpsc::sync_channel(4);
            let (rtx, rrx) = mpsc::sync_channel(6);
            let sampler = new_sampler(engine, opts.sampling.clone())?;
            let join = Join {
                slot,
                conv,
                sampler,
                tx,
                recycled: rrx,
            };
            joins.send(join).map_err(|_| RuntimeError::RunnerStopped)?;
            shared.lock().info[slot].busy = true;
            mics.push(PcmProducer::new(ring));
            events.push(rx);
            recycle.push(rtx);
        }
        worker.install_joins();
        Ok(BatchBench {
            worker,
            mics,
            events,
            recycle,
        })
    }

    /// Queue one frame per slot (`pcm`: `slots × FRAME_SIZE` samples, slot after slot), run one tick and
    /// collect its events. Returns the number of frames the tick emitted.
    pub fn tick(&mut self, pcm: &[f32]) -> Result<usize, RuntimeError> {
        for (j, mic) in self.mics.iter_mut().enumerate() {
            mic.push(&pcm[j * FRAME_SIZE..(j + 1) * FRAME_SIZE]);
        }
        self.worker.tick();
        let mut n = 0;
        for (rx, rtx) in self.events.iter().zip(&self.recycle) {
            while let Ok(ev) = rx.try_recv() {
                match ev {
                    Event::Frame(f) => {
                        n += 1;
                        let _ = rtx.try_send(f);
                    }
                    Event::Error(e) => return Err(e),
                    _ => {}
                }
            }
        }
        Ok(n)
    }
}
