//! The speech-to-text driver: many transcription streams on one worker thread, one batched Mimi encode and
//! one batched LM step per tick (issue 32, `docs/stt.md`).
//!
//! An [`SttRunner`] owns `slots` stream slots, a worker thread, one `kernels::Pool`, the 32-codebook
//! batch encoder ([`MimiBatchEncoder`], one stream per slot) and the STT step of `slots` rows
//! ([`SttBatch`]). A stream joins with [`SttRunner::open`] (a free slot, or [`RuntimeError::NoFreeSlot`])
//! and gets an [`SttSession`]: a non-blocking PCM input ([`SttSession::push`], the lock-free frame ring of
//! the duplex sessions, here never asked to drop: see [`SttSession::room`]) and a bounded queue of
//! [`SttOutput`]s, one per step.
//!
//! Each tick: install joins (the slot's LM row and encoder stream reset), apply resets, take every slot that
//! has a frame to step (a silence-prefix frame, or a whole input frame) and room in its output queue, encode
//! their frames in ONE call, run ONE LM step over them, and hand each its step's events. A slot without input
//! or whose client does not read is not stepped and nothing of it moves, so streams join and leave at any
//! frame. A stream's output equals that of a lone [`model::stt::SttStream`] fed the same audio (the batch
//! encoder is exact per stream; the batched LM step sums in another order than a single row).
//!
//! Backpressure never drops audio (a transcript must not lose words): the input ring holds
//! `max_queued_frames`, and the caller stops reading its client while [`SttSession::room`] is short; a
//! stream whose output queue is full is skipped until its reader catches up. After warm-up a tick
//! allocates nothing, words included (a word's tokens travel inline, `model::stt::WordTokens`); with the LM
//! on a GPU ([`SttRunnerOptions::device`]) the host side of the step is also wgpu's command recording
//! and submission, which this crate does not count (no buffer or bind group is created per step:
//! `crates/gpu/tests/lm_parity.rs`).

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender, TryRecvError};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::{self, Thread};
use std::time::{Duration, Instant};

use kernels::Pool;
use model::lm::{KvDtype, LmBackend};
use model::mimi::MimiBatchEncoder;
use model::stt::{SttBatch, SttEvent, SttModel, WordTokens, MAX_EXTRA_HEADS};

use crate::ring::{FrameRing, PcmProducer, PushReport};
use crate::worker::WorkerHandle;
use crate::{Device, RuntimeError, FRAME_SIZE};

/// Options of [`SttRunner::spawn`].
#[derive(Clone, Debug)]
pub struct SttRunnerOptions {
    /// Stream slots (>= 1), all stepped together; every slot's KV cache is allocated up front.
    pub slots: usize,
    /// CPU threads of the worker's pool (>= 1).
    pub threads: usize,
    /// Whole input frames a stream may queue (>= 1); the caller keeps within it ([`SttSession::room`]).
    pub max_queued_frames: usize,
    /// Steps a stream's output queue holds before that stream waits for its reader (>= 1).
    pub output_capacity: usize,
    /// Element type of the KV caches.
    pub kv_dtype: KvDtype,
    /// Where the LM step runs ([`stt_batch`]): the CPU, on the worker's pool, or a GPU (the `gpu`
    /// feature; at most `gpu::shaders::MAX_ROWS` slots). Mimi's 32-codebook encoder runs on the
    /// pool either way. `Device`'s own thread count is not read: `threads` sizes the pool.
    pub device: Device,
}

impl Default for SttRunnerOptions {
    fn default() -> Self {
        SttRunnerOptions {
            slots: 4,
            threads: 1,
            max_queued_frames: 64,
            output_capacity: 16,
            kv_dtype: KvDtype::F32,
            device: Device::Cpu { threads: 1 },
        }
    }
}

/// The STT step of `rows` streams of `model` on `device`: the CPU backend on `pool`, or the GPU's
/// (`gpu::GpuLm`: the temporal transformer with `dep_q = 0` on adapter `adapter`, weights uploaded
/// here; the extra heads, a few KB, run on the host from the device's temporal output, read back
/// with the text logits). KV caches in `kv_dtype`.
pub fn stt_batch(
    model: &Arc<SttModel>,
    rows: usize,
    kv_dtype: KvDtype,
    device: Device,
    pool: Arc<Pool>,
) -> Result<SttBatch<dyn LmBackend>, RuntimeError> {
    let backend = crate::lm_backend(device, model.lm(), rows, kv_dtype, pool)?;
    Ok(SttBatch::new(model.clone(), backend)?)
}

/// Called by the worker thread when a stream has news (an output item, room in its input); must not block.
pub type SttNotify = Arc<dyn Fn() + Send + Sync>;

/// What one step of one stream produced, in Kyutai's order: the step itself (with the voice-activity
/// probabilities when the model has extra heads), then at most one word, then at most one word end.
#[derive(Debug, Clone, PartialEq)]
pub struct SttStepOutput {
    /// Steps this stream has run, this one included (1 for the first; the silence prefix counts).
    pub step_idx: usize,
    /// Number of valid entries of `prs` (the model's extra heads; 0 for stt-2.6b).
    pub n_heads: usize,
    /// Each extra head's class-0 probability (no voice activity over its horizon).
    pub prs: [f32; MAX_EXTRA_HEADS],
    /// A word that this step closed: its text tokens and start time (s from the first audio sample).
    pub word: Option<(WordTokens, f64)>,
    /// The stop time (s) of the last word, when this step ended it.
    pub end_word: Option<f64>,
    /// Whole input frames still queued after this step.
    pub queued_frames: usize,
    /// Wall time of the tick that ran this step, microseconds.
    pub tick_us: u64,
    /// Streams stepped together in that tick.
    pub batch_rows: usize,
}

impl SttStepOutput {
    /// The valid voice-activity probabilities.
    pub fn prs(&self) -> &[f32] {
        &self.prs[..self.n_heads]
    }
}

/// An item of a stream's output queue.
#[derive(Debug)]
#[allow(clippy::large_enum_variant)] // a step's word inline, not boxed: no allocation per word
pub enum SttOutput {
    /// One step ran.
    Step(SttStepOutput),
    /// The step failed; the stream has left its slot. Last item. The error is the tick's, shared by
    /// every stream in it ([`RuntimeError::Batch`]).
    Error(RuntimeError),
}

/// What the worker and a session share about one stream.
struct StreamShared {
    ring: Arc<FrameRing>,
    /// Output items sent and not yet received (so the worker never sends into a full queue).
    in_flight: AtomicUsize,
    capacity: usize,
    /// The session is gone (or stopped): free the slot.
    closed: AtomicBool,
    /// Back to the start of a stream at the next tick.
    reset: AtomicBool,
    /// Input frames published before the reset was asked (the worker discards those only).
    reset_mark: AtomicU64,
}

struct Shared {
    /// The worker's stop flag (also held by the runner's [`WorkerHandle`]).
    stop: Arc<AtomicBool>,
    /// Busy flag per slot; locked only when a stream joins or leaves.
    busy: Mutex<Vec<bool>>,
}

impl Shared {
    fn busy(&self) -> MutexGuard<'_, Vec<bool>> {
        self.busy.lock().unwrap_or_else(|e| e.into_inner())
    }
}

struct Join {
    slot: usize,
    stream: Arc<StreamShared>,
    tx: SyncSender<SttOutput>,
    notify: SttNotify,
}

/// A running batch of transcription streams on one worker thread (`Send + Sync`; share it in an `Arc`).
/// Dropping it stops the worker.
pub struct SttRunner {
    /// First, so that dropping the runner stops and joins the worker before anything else goes.
    worker: WorkerHandle<Join>,
    model: Arc<SttModel>,
    shared: Arc<Shared>,
    opts: SttRunnerOptions,
}

impl std::fmt::Debug for SttRunner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SttRunner")
            .field("slots", &self.opts.slots)
            .field("active", &self.active())
            .finish()
    }
}

impl SttRunner {
    /// Allocates every slot (KV caches, encoder streams), warms the step up and starts the worker.
    pub fn spawn(model: Arc<SttModel>, opts: SttRunnerOptions) -> Result<SttRunner, RuntimeError> {
        if opts.slots == 0 || opts.threads == 0 || opts.max_queued_frames == 0 {
            return Err(RuntimeError::InvalidOption(
                "slots, threads and max_queued_frames must be >= 1".into(),
            ));
        }
        let pool = Arc::new(Pool::new(opts.threads));
        let batch = stt_batch(&model, opts.slots, opts.kv_dtype, opts.device, pool.clone())?;
        let encoder = MimiBatchEncoder::new(model.mimi().clone(), opts.slots);
        let shared = Arc::new(Shared {
            stop: Arc::new(AtomicBool::new(false)),
            busy: Mutex::new(vec![false; opts.slots]),
        });
        let (jtx, jrx) = mpsc::channel();
        let n = opts.slots;
        let nq = model.lm().spec().n_q;
        let mut worker = Worker {
            shared: shared.clone(),
            joins: jrx,
            pool,
            batch,
            encoder,
            slots: (0..n).map(|_| None).collect(),
            ready: Vec::with_capacity(n),
            pcm: vec![0.0; n * FRAME_SIZE],
            frame: Box::new([0.0; FRAME_SIZE]),
            events: Vec::with_capacity(4 * n),
            outs: Vec::with_capacity(n),
            prefix: model.plan().prefix_frames,
            nq,
        };
        worker.warm_up()?;
        let worker =
            WorkerHandle::spawn("moshi-stt", shared.stop.clone(), jtx, move || worker.run())?;
        Ok(SttRunner {
            worker,
            model,
            shared,
            opts,
        })
    }

    /// The model.
    pub fn model(&self) -> &Arc<SttModel> {
        &self.model
    }

    /// Number of slots.
    pub fn slots(&self) -> usize {
        self.opts.slots
    }

    /// Slots taken by a stream.
    pub fn active(&self) -> usize {
        self.shared.busy().iter().filter(|b| **b).count()
    }

    /// A new stream in a free slot. `notify` is called (from the worker thread) after each output item
    /// and whenever the stream's input queue gets room; it must not block.
    pub fn open(&self, notify: SttNotify) -> Result<SttSession, RuntimeError> {
        let ring = FrameRing::new(self.opts.max_queued_frames);
        let worker = self.worker.thread().clone();
        ring.set_waker(Arc::new(move || worker.unpark()));
        let capacity = self.opts.output_capacity.max(1);
        let stream = Arc::new(StreamShared {
            ring: ring.clone(),
            in_flight: AtomicUsize::new(0),
            capacity,
            closed: AtomicBool::new(false),
            reset: AtomicBool::new(false),
            reset_mark: AtomicU64::new(0),
        });
        let (tx, rx) = mpsc::sync_channel(capacity + 1);
        let mut busy = self.shared.busy();
        if self.worker.stopping() {
            return Err(RuntimeError::RunnerStopped);
        }
        let Some(slot) = busy.iter().position(|b| !b) else {
            return Err(RuntimeError::NoFreeSlot { slots: busy.len() });
        };
        self.worker.send(Join {
            slot,
            stream: stream.clone(),
            tx,
            notify,
        })?;
        busy[slot] = true;
        drop(busy);
        self.worker.unpark();
        Ok(SttSession {
            slot,
            producer: PcmProducer::new(ring),
            rx,
            stream,
            worker: self.worker.thread().clone(),
            max_queued: self.opts.max_queued_frames,
        })
    }

    /// Stops the worker (every stream's queue then ends) and joins it; later calls return at once.
    pub fn stop(&self) -> Result<(), RuntimeError> {
        self.worker.stop()
    }
}

/// One transcription stream of an [`SttRunner`]. Dropping it frees its slot.
pub struct SttSession {
    slot: usize,
    producer: PcmProducer,
    rx: Receiver<SttOutput>,
    stream: Arc<StreamShared>,
    worker: Thread,
    max_queued: usize,
}

impl std::fmt::Debug for SttSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SttSession")
            .field("slot", &self.slot)
            .finish()
    }
}

impl SttSession {
    /// The slot index.
    pub fn slot(&self) -> usize {
        self.slot
    }

    /// Samples that can be pushed now without the input ring dropping a frame.
    pub fn room(&self) -> usize {
        let queued = self.stream.ring.len();
        (self.max_queued.saturating_sub(queued) * FRAME_SIZE)
            .saturating_sub(self.producer.partial_samples())
    }

    /// Queues 24 kHz mono PCM (any length; never blocks or allocates). Keep `pcm.len() <= room()`:
    /// beyond it the oldest queued frames are dropped (and reported).
    pub fn push(&mut self, pcm: &[f32]) -> PushReport {
        self.producer.push(pcm)
    }

    /// The next output item, if one is ready (never blocks).
    pub fn try_recv(&self) -> Option<SttOutput> {
        match self.rx.try_recv() {
            Ok(o) => {
                // The worker may be holding this stream back for lack of room: tell it.
                if self.stream.in_flight.fetch_sub(1, Ordering::AcqRel) >= self.stream.capacity {
                    self.worker.unpark();
                }
                Some(o)
            }
            Err(_) => None,
        }
    }

    /// Whether the stream has ended: the worker stopped or failed it, and every item was received.
    pub fn is_finished(&self) -> bool {
        matches!(self.rx.try_recv(), Err(TryRecvError::Disconnected))
    }

    /// Back to the start of a stream at the next tick: queued input is discarded and the model state,
    /// word rules and encoder stream start afresh (items already in the queue stay).
    pub fn reset(&mut self) {
        // Only what was pushed before this call is discarded: audio pushed right after it belongs to
        // the new stream, whenever the worker applies the reset.
        let ring = &self.stream.ring;
        self.stream
            .reset_mark
            .store(ring.published(), Ordering::Release);
        ring.forget_partial();
        self.stream.reset.store(true, Ordering::Release);
        self.worker.unpark();
    }
}

impl Drop for SttSession {
    fn drop(&mut self) {
        self.stream.closed.store(true, Ordering::Release);
        self.worker.unpark();
    }
}

/// A stream installed in a slot.
struct Slot {
    stream: Arc<StreamShared>,
    tx: SyncSender<SttOutput>,
    notify: SttNotify,
    /// Silence-prefix frames still to step.
    prefix_left: usize,
    /// Steps run since the stream started (or was reset).
    steps: usize,
    /// A step of this stream failed: it leaves at the next tick.
    failed: bool,
}

struct Worker {
    shared: Arc<Shared>,
    joins: Receiver<Join>,
    pool: Arc<Pool>,
    batch: SttBatch<dyn LmBackend>,
    encoder: MimiBatchEncoder,
    slots: Vec<Option<Slot>>,
    /// Slots stepped this tick, in order, and their frames side by side.
    ready: Vec<usize>,
    pcm: Vec<f32>,
    frame: Box<[f32; FRAME_SIZE]>,
    events: Vec<(usize, SttEvent)>,
    /// The output of each ready slot, in the order of `ready`.
    outs: Vec<SttStepOutput>,
    prefix: usize,
    nq: usize,
}

impl Worker {
    /// Two ticks of silence on every slot, then every slot reset: the work buffers of a full batch reach
    /// their final size before the first stream, so later ticks do not allocate.
    fn warm_up(&mut self) -> Result<(), RuntimeError> {
        let n = self.slots.len();
        self.ready.clear();
        self.ready.extend(0..n);
        self.pcm.fill(0.0);
        for _ in 0..2 {
            self.events.clear();
            let codes = self
                .encoder
                .encode_frames(&self.ready, &self.pcm, Some(&self.pool))?;
            self.batch.step(&self.ready, codes, &mut self.events)?;
        }
        for b in 0..n {
            self.encoder.reset(b);
            self.batch.reset_row(b);
        }
        self.ready.clear();
        self.events.clear();
        Ok(())
    }

    fn run(mut self) {
        while !self.shared.stop.load(Ordering::Acquire) {
            self.install_joins();
            self.collect();
            if self.ready.is_empty() {
                // Woken by a push that completes a frame, a join, a reader catching up, or stop.
                thread::park_timeout(Duration::from_millis(50));
                continue;
            }
            self.tick();
        }
        // Dropping the slots closes their queues: each session sees the end.
        self.slots.clear();
    }

    fn install_joins(&mut self) {
        while let Ok(j) = self.joins.try_recv() {
            self.encoder.reset(j.slot);
            self.batch.reset_row(j.slot);
            self.slots[j.slot] = Some(Slot {
                stream: j.stream,
                tx: j.tx,
                notify: j.notify,
                prefix_left: self.prefix,
                steps: 0,
                failed: false,
            });
        }
    }

    /// Frees closed slots, applies resets, and gathers the slots to step with their frames.
    fn collect(&mut self) {
        self.ready.clear();
        for b in 0..self.slots.len() {
            let Some(s) = self.slots[b].as_mut() else {
                continue;
            };
            if s.stream.closed.load(Ordering::Acquire) || s.failed {
                self.slots[b] = None;
                self.shared.busy()[b] = false;
                continue;
            }
            if s.stream.reset.swap(false, Ordering::AcqRel) {
                s.stream
                    .ring
                    .discard_before(s.stream.reset_mark.load(Ordering::Acquire));
                s.prefix_left = self.prefix;
                s.steps = 0;
                self.encoder.reset(b);
                self.batch.reset_row(b);
                (s.notify)();
            }
            if s.stream.in_flight.load(Ordering::Acquire) >= s.stream.capacity {
                continue;
            }
            let i = self.ready.len();
            let dst = &mut self.pcm[i * FRAME_SIZE..(i + 1) * FRAME_SIZE];
            if s.prefix_left > 0 {
                s.prefix_left -= 1;
                dst.fill(0.0);
            } else if s.stream.ring.pop_stamped(&mut self.frame).is_some() {
                dst.copy_from_slice(&self.frame[..]);
                // Room in the input ring: a client held back may go on.
                (s.notify)();
            } else {
                continue;
            }
            self.ready.push(b);
        }
    }

    fn tick(&mut self) {
        let t0 = Instant::now();
        let n = self.ready.len();
        self.events.clear();
        let stepped = self
            .encoder
            .encode_frames(&self.ready, &self.pcm[..n * FRAME_SIZE], Some(&self.pool))
            .map_err(RuntimeError::Codec)
            .and_then(|codes| {
                debug_assert_eq!(codes.len(), n * self.nq);
                Ok(self.batch.step(&self.ready, codes, &mut self.events)?)
            });
        if let Err(e) = stepped {
            tracing::error!("speech-to-text step failed: {e}");
            // Every stream of the tick ends with the one error, shared.
            let e = Arc::new(e);
            for &b in &self.ready {
                if let Some(s) = self.slots[b].as_mut() {
                    let _ =
                        s.tx.try_send(SttOutput::Error(RuntimeError::Batch(e.clone())));
                    s.failed = true;
                    (s.notify)();
                }
            }
            return;
        }
        let tick_us = t0.elapsed().as_micros() as u64;
        self.outs.clear();
        for &b in &self.ready {
            let queued = self.slots[b].as_ref().map_or(0, |s| s.stream.ring.len());
            self.outs.push(SttStepOutput {
                step_idx: 0,
                n_heads: 0,
                prs: [0.0; MAX_EXTRA_HEADS],
                word: None,
                end_word: None,
                queued_frames: queued,
                tick_us,
                batch_rows: n,
            });
        }
        for (b, e) in self.events.drain(..) {
            let Some(i) = self.ready.iter().position(|&r| r == b) else {
                continue;
            };
            let o = &mut self.outs[i];
            match e {
                SttEvent::Step {
                    step_idx,
                    n_heads,
                    prs,
                } => {
                    o.n_heads = n_heads;
                    o.prs = prs;
                    o.step_idx = step_idx;
                }
                SttEvent::Word { tokens, start_time } => o.word = Some((tokens, start_time)),
                SttEvent::EndWord { stop_time } => o.end_word = Some(stop_time),
            }
        }
        for (i, &b) in self.ready.iter().enumerate() {
            let Some(s) = self.slots[b].as_mut() else {
                continue;
            };
            s.steps += 1;
            let mut out = std::mem::replace(
                &mut self.outs[i],
                SttStepOutput {
                    step_idx: 0,
                    n_heads: 0,
                    prs: [0.0; MAX_EXTRA_HEADS],
                    word: None,
                    end_word: None,
                    queued_frames: 0,
                    tick_us: 0,
                    batch_rows: 0,
                },
            );
            // Counted here too: a model without extra heads has no Step event to carry it.
            out.step_idx = s.steps;
            s.stream.in_flight.fetch_add(1, Ordering::AcqRel);
            if s.tx.try_send(SttOutput::Step(out)).is_err() {
                // The reader is gone; the session's drop frees the slot.
                s.stream.in_flight.fetch_sub(1, Ordering::AcqRel);
            }
            (s.notify)();
        }
    }
}
