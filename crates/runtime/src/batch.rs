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
//! `Stepper` / `Conversation` calls a [`crate::Session`] makes for its single row. On a device with a
//! whole-frame call (the GPU: `fused.rs`, chosen once at spawn where a session's is) the encode, LM step and
//! decode of the tick are that ONE call instead (one submission and one wait per tick), with the same
//! begin / forced text / first-frame rule / codec resets / finish per slot as a fused session; every
//! conversation's sampler must then run on the device ([`BatchRunner::open`] refuses one that cannot). Slots without input are not
//! stepped and none of their state moves; a slot's reset (command, first-frame rule, a new conversation in
//! the slot) resets its own codec streams and LM rows only. A slot that stops, fails or whose receiver is gone
//! leaves the batch; its LM rows are reset for reuse. After warm-up a tick allocates nothing.
//!
//! Results of a slot equal those of a [`crate::Session`] with the same options fed the same audio, whatever
//! the other slots do: Mimi codes and samples exactly (`model::mimi::MimiBatchEncoder`), tokens exactly in
//! practice (the batched LM step sums in another order than a single row).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, Sender, SyncSender, TryRecvError, TrySendError};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread;

use model::sampling::{Sampler, SamplerConfig};

use crate::control::SessionControl;
use crate::conversation::{Conversation, PassSlots};
use crate::events::{Counters, Event, FrameEvent, StopReason};
use crate::fused::FusedFrames;
use crate::inlet::{Begin, Inlet};
use crate::ring::{FrameRing, PcmProducer};
use crate::runner::{handle_accessors, queues, EventReceiver, Handles};
use crate::stepper::{new_sampler, Stepper};
use crate::worker::WorkerHandle;
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
    /// The worker's stop flag (also held by the runner's [`WorkerHandle`]).
    stop: Arc<AtomicBool>,
    /// Ticks that stepped at least one slot.
    ticks: AtomicU64,
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
    /// First, so that dropping the runner stops and joins the worker before anything else goes.
    worker: WorkerHandle<Join>,
    engine: Arc<Engine>,
    shared: Arc<Shared>,
    event_capacity: usize,
    /// The worker runs the fused pass: a joining conversation's sampler must run on the device.
    #[cfg_attr(not(feature = "gpu"), allow(dead_code))]
    fused: bool,
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
        let fused = matches!(worker.pass, Pass::Fused(_));
        let worker = WorkerHandle::spawn("moshi-batch", shared.stop.clone(), jtx, move || {
            worker.run()
        })?;
        Ok(BatchRunner {
            worker,
            engine,
            shared,
            event_capacity: opts.event_capacity.max(1),
            fused,
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

    /// Ticks so far that stepped at least one slot (tests count the device's submissions per tick).
    #[doc(hidden)]
    pub fn ticks(&self) -> u64 {
        self.shared.ticks.load(Ordering::Relaxed)
    }

    /// Join the batch with a new conversation in a free slot (allocates its sampler, rings and output buffers;
    /// the worker only installs them; the slot's Mimi streams are part of the worker's codec). `opts` has the meaning it has for [`crate::Session::new`]. Errors:
    /// [`RuntimeError::NoFreeSlot`] when every slot is taken, [`RuntimeError::RunnerStopped`] after stop,
    /// [`RuntimeError::InvalidOption`] for bad options, and on a batch whose ticks run on the device as one
    /// call (the GPU) for sampling settings the device cannot run (a session would run them split).
    pub fn open(&self, opts: SessionOptions) -> Result<BatchSession, RuntimeError> {
        if opts.max_queued_frames == 0 {
            return Err(RuntimeError::InvalidOption(
                "max_queued_frames must be >= 1".into(),
            ));
        }
        let sampler = new_sampler(&self.engine, opts.sampling.clone())?;
        #[cfg(feature = "gpu")]
        if self.fused && !crate::gpu_frame::device_samples(self.engine.lm_spec(), &sampler) {
            return Err(RuntimeError::InvalidOption(
                "sampling: this batch samples on the device, and these settings need the host (top-k \
                 at most gpu::sample::MAX_TOP_K, a repetition penalty context at most \
                 MAX_PENALTY_CONTEXT; or run the conversation alone, `--batch 1`)"
                    .into(),
            ));
        }
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
        let handles = Handles::connect(
            consumer,
            &ring,
            control,
            Some(producer),
            self.worker.thread(),
        );

        // Reserve a slot and hand the conversation to the worker under the table lock, so that the worker's
        // exit (which sets `done` and drains the queue under the same lock) never strands a join.
        let mut table = self.shared.lock();
        if table.done || self.worker.stopping() {
            return Err(RuntimeError::RunnerStopped);
        }
        let Some(slot) = table.info.iter().position(|s| !s.busy) else {
            return Err(RuntimeError::NoFreeSlot {
                slots: table.info.len(),
            });
        };
        self.worker.send(Join {
            slot,
            conv,
            sampler,
            tx,
            recycled,
        })?;
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
        self.worker.stop()
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

/// What to do with a slot after looking at it: stay (stepped this tick if its frame was staged), or
/// leave with its last event.
enum Verdict {
    Stay,
    Leave(Option<Event>),
}

/// How the worker runs its slots' frame passes, chosen once at its start (`Engine`'s
/// `batch_frame_backend`, where a session's fused pass is chosen).
enum Pass {
    /// Encode, LM step and decode apart, each one call for every ready slot (the CPU): the codec
    /// of `slots` slots and the LM of `slots` rows.
    Split(Box<Stepper>),
    /// Every ready slot's whole pass in one call of the device per tick (`fused.rs`; the GPU: one
    /// submission and one wait per tick).
    Fused(Box<FusedFrames>),
}

impl Pass {
    fn begin_tick(&mut self) {
        match self {
            Pass::Split(st) => st.begin_tick(),
            Pass::Fused(f) => f.begin_tick(),
        }
    }

    fn begin(&mut self, b: usize, conv: &mut Conversation) -> Begin {
        match self {
            Pass::Split(st) => st.begin(b, conv),
            Pass::Fused(f) => f.begin(b, conv),
        }
    }

    /// The slots of this tick's results, in order (result `i` is slot `rows()[i]`'s).
    fn rows(&self) -> &[usize] {
        match self {
            Pass::Split(st) => st.active(),
            Pass::Fused(f) => f.staged(),
        }
    }

    fn finish(&mut self, i: usize, conv: &mut Conversation) -> Result<(), RuntimeError> {
        match self {
            Pass::Split(st) => st.finish(i, conv),
            Pass::Fused(f) => f.finish(i, conv),
        }
    }

    /// The slots of whichever pass runs.
    fn slots(&mut self) -> &mut dyn PassSlots {
        match self {
            Pass::Split(st) => &mut **st,
            Pass::Fused(f) => &mut **f,
        }
    }

    /// A new conversation in slot `b`: fresh LM row, codec streams and its sampler.
    fn install(&mut self, b: usize, sampler: Sampler) {
        let slots = self.slots();
        slots.reset_row(b);
        slots.reset_codec(b);
        slots.set_sampler(b, sampler);
    }
}

struct Worker {
    shared: Arc<Shared>,
    joins: Receiver<Join>,
    /// The codec and LM side: one codec slot and one LM row per slot.
    pass: Pass,
    /// Ticks of the fused pass's warm-up (`max_delay + 1`: the last one decodes).
    warm_ticks: usize,
    /// The slots of a failed call (`slots` reserved).
    failing: Vec<usize>,
    slots: Vec<Option<Slot>>,
}

/// `rows` into `to` (within its reserved capacity).
fn copy_rows(to: &mut Vec<usize>, rows: &[usize]) {
    to.clear();
    to.extend_from_slice(rows);
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
    /// `kv_capacity` as in [`crate::Session::with_kv_capacity`] (the split pass); `None` keeps the model's
    /// context.
    fn new(
        engine: &Engine,
        n: usize,
        kv_capacity: Option<usize>,
    ) -> Result<(Worker, Arc<Shared>, Sender<Join>), RuntimeError> {
        let pass = match engine.batch_frame_backend(n)? {
            Some(backend) => {
                tracing::info!(
                    "batch of {n} slots: encode, LM step and decode of every ready slot in one \
                     device submission per tick (samplers run on the device)"
                );
                let samplers = (0..n)
                    .map(|_| new_sampler(engine, SamplerConfig::greedy()))
                    .collect::<Result<Vec<_>, _>>()?;
                Pass::Fused(Box::new(FusedFrames::new(backend, samplers)))
            }
            None => Pass::Split(Box::new(Stepper::new(
                engine,
                &engine.workers(),
                n,
                kv_capacity,
            )?)),
        };
        let shared = Arc::new(Shared {
            stop: Arc::new(AtomicBool::new(false)),
            ticks: AtomicU64::new(0),
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
            pass,
            warm_ticks: engine.lm_spec().max_delay() + 1,
            failing: Vec::with_capacity(n),
            slots: (0..n).map(|_| None).collect(),
        };
        Ok((worker, shared, jtx))
    }

    /// Before the first conversation: every buffer that grows with the slots coded together reaches its
    /// final size (the split codec), or every part of the device's tick has run once (the fused pass); every
    /// slot is left fresh.
    fn warm_up(&mut self) {
        match &mut self.pass {
            Pass::Split(st) => st.warm_up_codec(),
            Pass::Fused(f) => {
                if let Err(e) = f.warm_up(self.warm_ticks) {
                    // The first tick will fail the same way and tell its conversations.
                    tracing::warn!("batch: the warm-up tick failed: {e}");
                }
            }
        }
    }

    fn run(mut self) {
        let _guard = DoneGuard(self.shared.clone());
        self.warm_up();
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
                    self.pass.install(b, j.sampler);
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
        self.pass.slots().reset_row(b);
        let mut t = self.shared.lock();
        t.info[b].busy = false;
        t.info[b].last = Some(counters);
        drop(t);
        self.shared.released.notify_all();
    }

    /// Every slot of `failing` leaves with the one error of the call they shared.
    fn fail(&mut self, e: RuntimeError) {
        let e = Arc::new(e);
        for j in 0..self.failing.len() {
            let b = self.failing[j];
            self.release(b, Some(Event::Error(RuntimeError::Batch(e.clone()))));
        }
    }

    /// Look at slot `b`: deliver a pending event, apply commands, pop and stage a frame.
    fn prepare(&mut self, b: usize) -> Verdict {
        let Some(slot) = self.slots[b].as_mut() else {
            return Verdict::Stay;
        };
        if let Some(ev) = slot.pending.take() {
            match slot.tx.try_send(ev) {
                Ok(()) => {}
                Err(TrySendError::Full(ev)) => {
                    if slot.conv.inlet.control.is_stop_requested() {
                        return Verdict::Leave(None);
                    }
                    slot.pending = Some(ev);
                    return Verdict::Stay;
                }
                Err(TrySendError::Disconnected(_)) => return Verdict::Leave(None),
            }
        }
        if slot.spare.is_none() {
            slot.spare = slot.recycled.try_recv().ok();
        }
        match self.pass.begin(b, &mut slot.conv) {
            Begin::Idle | Begin::Paused | Begin::Ready => Verdict::Stay,
            Begin::Stopped(r) => Verdict::Leave(Some(Event::Stopped(r))),
        }
    }

    /// The split pass of the frames staged this tick: one encode (admitting their rows to the LM step), one
    /// LM step, one decode. Returns the number of results, or `None` when nothing was staged. A failed call is
    /// reported to (and removes) the slots it concerned.
    fn step_split(&mut self) -> Option<usize> {
        let Pass::Split(st) = &mut self.pass else {
            return None;
        };
        if st.staged().is_empty() {
            return None;
        }
        let failed = if let Err(e) = st.encode() {
            tracing::error!("batch: encode failed: {e}");
            copy_rows(&mut self.failing, st.staged());
            Some(e)
        } else {
            for j in 0..st.staged().len() {
                let b = st.staged()[j];
                if let Some(slot) = self.slots[b].as_mut() {
                    st.admit(j, &mut slot.conv);
                }
            }
            // An error of the LM step is an argument error (nothing was stepped): a bug, reported to every
            // slot of this tick.
            st.step_lm().err().inspect(|_| {
                copy_rows(&mut self.failing, st.active());
            })
        };
        if let Some(e) = failed {
            self.fail(e);
            return Some(0);
        }
        let m = st.active().len();
        if let Err(e) = st.decode() {
            tracing::error!("batch: decode failed: {e}");
            copy_rows(&mut self.failing, st.decoding());
            self.fail(e);
        }
        Some(m)
    }

    /// The fused pass of the frames staged this tick: one call of the device. Returns the number of
    /// results, or `None` when nothing was staged; a failed call is reported to (and removes) its slots.
    fn step_fused(&mut self) -> Option<usize> {
        let Pass::Fused(f) = &mut self.pass else {
            return None;
        };
        let m = f.staged().len();
        if m == 0 {
            return None;
        }
        if let Err(e) = f.run(None) {
            tracing::error!("batch: the device's tick failed: {e}");
            copy_rows(&mut self.failing, f.staged());
            self.fail(RuntimeError::Lm(e));
            return Some(0);
        }
        Some(m)
    }

    /// One tick; returns whether any slot was stepped.
    fn tick(&mut self) -> bool {
        self.pass.begin_tick();
        for b in 0..self.slots.len() {
            if let Verdict::Leave(ev) = self.prepare(b) {
                self.release(b, ev);
            }
        }
        let results = match self.pass {
            Pass::Split(_) => self.step_split(),
            Pass::Fused(_) => self.step_fused(),
        };
        let Some(m) = results else {
            return false;
        };
        self.shared.ticks.fetch_add(1, Ordering::Relaxed);
        for i in 0..m {
            let b = self.pass.rows()[i];
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
        if let Err(e) = self.pass.finish(i, &mut slot.conv) {
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
        worker.warm_up();
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
