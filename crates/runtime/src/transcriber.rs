//! One speech-to-text stream driven by the caller: push PCM, pull events (issue 32 item 5, `docs/stt.md`).
//!
//! * [`SttEngine`]: a loaded STT bundle (the model of [`model::stt::SttModel`] and its SentencePiece
//!   vocabulary), immutable, shared by transcribers through `Arc`.
//! * [`Transcriber`]: one stream. [`Transcriber::push`] only queues samples (any length, never computes);
//!   [`Transcriber::pull`] returns the next [`TranscriptEvent`], running one model step (Mimi encode + LM
//!   step, [`SttStream`]) when no event is waiting and a whole frame is queued; [`Transcriber::flush`]
//!   queues the end of the audio (the partial frame padded with zeros, then the plan's delay + 1 s of
//!   silence, as Kyutai's scripts do); [`Transcriber::reset`] starts a new stream.
//!
//! The conventions are the duplex [`crate::Session`]'s (push never blocks, pull computes, caller-driven),
//! except that nothing is ever dropped: a transcript must not lose words, so the input grows to hold what
//! the caller pushes ahead of its pulls. The events are exactly [`SttStream`]'s (the same frames reach the
//! same stream), plus an end-of-turn event from the voice-activity heads (Kyutai's rule, as the CLI's
//! `--vad`). After warm-up a push or pull allocates nothing, words included, except when the caller pushes
//! more than the input holds: a word's tokens come inline in its event ([`model::stt::WordTokens`]) and
//! are queued so, and its text is decoded ([`SentencePiece::decode_into`]) into one text buffer shared by
//! the queued words, emptied whenever the queue is (only then is a step run). That buffer is reserved
//! for [`TEXT_RESERVE`] bytes and grows only for a step's words longer than that, once.

use std::collections::VecDeque;
use std::path::Path;
use std::sync::Arc;

use kernels::Pool;
use model::checkpoint::Bundle;
use model::lm::CpuLm;
use model::stt::{SttEvent, SttModel, SttPlan, SttStream, WordTokens, MAX_EXTRA_HEADS};
use model::text::SentencePiece;

use crate::{physical_cores, Device, EngineOptions, RuntimeError};

/// A loaded speech-to-text bundle (`model_type` "stt": Kyutai's stt-1b-en_fr / stt-2.6b-en, or the
/// bundled `demo-stt`) and the options its transcribers compute with.
pub struct SttEngine {
    model: Arc<SttModel>,
    tokenizer: Arc<SentencePiece>,
    opts: EngineOptions,
}

impl std::fmt::Debug for SttEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SttEngine")
            .field("plan", &self.model.plan())
            .field("extra_heads", &self.model.n_heads())
            .field("opts", &self.opts)
            .finish()
    }
}

impl SttEngine {
    /// Opens an STT bundle directory (Kyutai `config.json` with `stt_config`, LM weights, Mimi weights,
    /// SentencePiece model). Transcribers run on the CPU with `opts.device.threads()` threads each and
    /// `opts.kv_dtype` KV caches; [`Device::Gpu`] is refused (the GPU serves STT through the batched
    /// driver, [`crate::SttRunner`]). A Moshi bundle is refused with [`RuntimeError::Model`].
    pub fn open(bundle_dir: &Path, opts: EngineOptions) -> Result<Arc<SttEngine>, RuntimeError> {
        check_options(&opts)?;
        let model_err = |e: &dyn std::fmt::Display| RuntimeError::Model(e.to_string());
        let bundle = Bundle::open(bundle_dir).map_err(|e| model_err(&e))?;
        let model =
            SttModel::load(&bundle, &Pool::new(physical_cores())).map_err(|e| model_err(&e))?;
        let tokenizer = SentencePiece::load(&bundle.files.tokenizer).map_err(|e| model_err(&e))?;
        SttEngine::from_parts(Arc::new(model), Arc::new(tokenizer), opts)
    }

    /// An engine over an already-loaded model and vocabulary (tests, custom loaders).
    pub fn from_parts(
        model: Arc<SttModel>,
        tokenizer: Arc<SentencePiece>,
        opts: EngineOptions,
    ) -> Result<Arc<SttEngine>, RuntimeError> {
        check_options(&opts)?;
        Ok(Arc::new(SttEngine {
            model,
            tokenizer,
            opts,
        }))
    }

    /// The model.
    pub fn model(&self) -> &Arc<SttModel> {
        &self.model
    }

    /// The text vocabulary.
    pub fn tokenizer(&self) -> &Arc<SentencePiece> {
        &self.tokenizer
    }

    /// How a stream is fed: silence prefix, delay, flush (`docs/stt.md`, "Stream").
    pub fn plan(&self) -> SttPlan {
        self.model.plan()
    }

    /// Voice-activity (extra) heads of the model: 4 for stt-1b, 0 for stt-2.6b.
    pub fn n_heads(&self) -> usize {
        self.model.n_heads()
    }

    /// The options transcribers compute with.
    pub fn options(&self) -> &EngineOptions {
        &self.opts
    }
}

fn check_options(opts: &EngineOptions) -> Result<(), RuntimeError> {
    match opts.device {
        Device::Cpu { threads: 0 } => {
            Err(RuntimeError::InvalidOption("threads must be >= 1".into()))
        }
        Device::Cpu { .. } => Ok(()),
        Device::Gpu { .. } => Err(RuntimeError::InvalidOption(
            "the transcriber runs on the CPU (the GPU serves speech-to-text through SttRunner)"
                .into(),
        )),
    }
}

/// Bytes of word text a transcriber reserves (the decoded text of the words queued at once: a step
/// closes at most one word of at most [`model::stt::MAX_WORD_TOKENS`] tokens).
pub const TEXT_RESERVE: usize = 1024;

/// Options of [`Transcriber::new`].
#[derive(Clone, Debug, PartialEq)]
pub struct TranscriberOptions {
    /// The extra head whose no-voice probability signals the end of a turn (Kyutai's scripts: head 2,
    /// 2 s of silence ahead on stt-1b).
    pub end_of_turn_head: usize,
    /// [`TranscriptEvent::EndOfTurn`] is reported when that head's probability exceeds this (Kyutai: 0.5).
    pub end_of_turn_threshold: f32,
    /// Input frames (80 ms each) reserved up front, besides the flush; pushing further ahead of the pulls
    /// grows the input (>= 1). Default 64 (5.1 s).
    pub reserve_frames: usize,
}

impl Default for TranscriberOptions {
    fn default() -> Self {
        TranscriberOptions {
            end_of_turn_head: 2,
            end_of_turn_threshold: 0.5,
            reserve_frames: 64,
        }
    }
}

/// What a stream reported, borrowed from its [`Transcriber`] until the next call on it. Events come in
/// Kyutai's order within a step: `Step`, then `EndOfTurn`, then `Word`, then `EndWord`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum TranscriptEvent<'a> {
    /// A model step ran (models with voice-activity heads only, as Kyutai's server sends it).
    Step {
        /// Steps run since the start of the stream, this one included (1 for the first; the silence
        /// prefix counts).
        step_idx: usize,
        /// Each head's class-0 probability (no voice activity over its horizon: 0.5, 1, 2 and 3 s on
        /// stt-1b).
        prs: &'a [f32],
    },
    /// The end-of-turn head crossed its threshold ([`TranscriberOptions`]); reported once, then again
    /// only after a word or word end.
    EndOfTurn {
        /// The step.
        step_idx: usize,
        /// That head's no-voice probability.
        probability: f32,
        /// Every head's probability at that step (as its `Step`).
        prs: &'a [f32],
    },
    /// A word was closed.
    Word {
        /// The step that closed it.
        step_idx: usize,
        /// Its text (the SentencePiece decoding of `tokens`, surrounding spaces trimmed).
        text: &'a str,
        /// Its text tokens.
        tokens: &'a [u32],
        /// Start time, seconds from the first audio sample.
        start_time: f64,
    },
    /// The last word ended.
    EndWord {
        /// The step.
        step_idx: usize,
        /// Stop time, seconds from the first audio sample.
        stop_time: f64,
    },
}

/// An event waiting to be pulled (owned).
#[derive(Debug)]
#[allow(clippy::large_enum_variant)] // a word's tokens inline, not boxed: no allocation per word
enum Queued {
    Step {
        step_idx: usize,
        n: usize,
        prs: [f32; MAX_EXTRA_HEADS],
    },
    EndOfTurn {
        step_idx: usize,
        probability: f32,
        n: usize,
        prs: [f32; MAX_EXTRA_HEADS],
    },
    Word {
        step_idx: usize,
        /// Byte range of the text in [`Outbox::text`].
        text: (usize, usize),
        tokens: WordTokens,
        start_time: f64,
    },
    EndWord {
        step_idx: usize,
        stop_time: f64,
    },
}

impl Queued {
    /// The event as pulled; `words` is [`Outbox::text`].
    fn view<'a>(&'a self, words: &'a str) -> TranscriptEvent<'a> {
        match self {
            Queued::Step { step_idx, n, prs } => TranscriptEvent::Step {
                step_idx: *step_idx,
                prs: &prs[..*n],
            },
            Queued::EndOfTurn {
                step_idx,
                probability,
                n,
                prs,
            } => TranscriptEvent::EndOfTurn {
                step_idx: *step_idx,
                probability: *probability,
                prs: &prs[..*n],
            },
            Queued::Word {
                step_idx,
                text,
                tokens,
                start_time,
            } => TranscriptEvent::Word {
                step_idx: *step_idx,
                text: words.get(text.0..text.1).unwrap_or_default(),
                tokens,
                start_time: *start_time,
            },
            Queued::EndWord {
                step_idx,
                stop_time,
            } => TranscriptEvent::EndWord {
                step_idx: *step_idx,
                stop_time: *stop_time,
            },
        }
    }
}

/// The per-step state the stream's callback writes into.
#[derive(Debug)]
struct Outbox {
    queue: VecDeque<Queued>,
    steps: usize,
    /// An end of turn may be reported (cleared when one is, set by a word or word end).
    eot_armed: bool,
    /// Text of the queued words (and of the last pulled one), emptied when a step runs on an empty
    /// queue.
    text: String,
    /// Scratch of the SentencePiece decode (byte pieces).
    bytes: Vec<u8>,
}

/// One transcription stream (see the module documentation). `Send`; one thread at a time.
#[derive(Debug)]
pub struct Transcriber {
    engine: Arc<SttEngine>,
    stream: SttStream<CpuLm>,
    opts: TranscriberOptions,
    /// Queued samples; those before `read` were stepped.
    input: Vec<f32>,
    read: usize,
    out: Outbox,
    /// The event the last pull returned (kept so that its borrow outlives the pull).
    current: Option<Queued>,
}

impl Transcriber {
    /// A new stream on `engine`: its KV cache, Mimi encoder state, worker pool and buffers are allocated
    /// here.
    pub fn new(
        engine: Arc<SttEngine>,
        opts: TranscriberOptions,
    ) -> Result<Transcriber, RuntimeError> {
        if opts.reserve_frames == 0 {
            return Err(RuntimeError::InvalidOption(
                "reserve_frames must be >= 1".into(),
            ));
        }
        if !(opts.end_of_turn_threshold.is_finite()) {
            return Err(RuntimeError::InvalidOption(
                "end_of_turn_threshold must be finite".into(),
            ));
        }
        let pool = Arc::new(Pool::new(engine.opts.device.threads()));
        let batch = engine
            .model
            .cpu_batch(1, engine.opts.kv_dtype, pool.clone())?;
        let stream = SttStream::new(batch, pool);
        let plan = engine.model.plan();
        let fs = engine.model.mimi().frame_size();
        // One pull steps the whole silence prefix with the first frame: room for all its events.
        let events = 4 * (plan.prefix_frames + 2) + 16;
        Ok(Transcriber {
            input: Vec::with_capacity((opts.reserve_frames + plan.flush_frames + 1) * fs),
            read: 0,
            out: Outbox {
                queue: VecDeque::with_capacity(events),
                steps: 0,
                eot_armed: true,
                text: String::with_capacity(TEXT_RESERVE),
                bytes: Vec::with_capacity(model::stt::MAX_WORD_TOKENS),
            },
            current: None,
            stream,
            engine,
            opts,
        })
    }

    /// The engine.
    pub fn engine(&self) -> &Arc<SttEngine> {
        &self.engine
    }

    /// Samples of the model's frame (1920: 80 ms at 24 kHz).
    pub fn frame_size(&self) -> usize {
        self.engine.model.mimi().frame_size()
    }

    /// Steps run since the start of the stream (silence prefix and flush included).
    pub fn steps(&self) -> usize {
        self.out.steps
    }

    /// Samples pushed (or queued by a flush) and not yet stepped.
    pub fn pending_samples(&self) -> usize {
        self.input.len() - self.read
    }

    /// Events computed and not yet pulled.
    pub fn queued_events(&self) -> usize {
        self.out.queue.len()
    }

    /// Queues 24 kHz mono PCM, any length; computes nothing. A non-finite sample refuses the whole call
    /// ([`RuntimeError::InvalidOption`]) and queues nothing.
    pub fn push(&mut self, pcm: &[f32]) -> Result<(), RuntimeError> {
        if let Some(i) = pcm.iter().position(|x| !x.is_finite()) {
            return Err(RuntimeError::InvalidOption(format!(
                "pcm sample {i} is {} (samples must be finite)",
                pcm[i]
            )));
        }
        self.make_room(pcm.len());
        self.input.extend_from_slice(pcm);
        Ok(())
    }

    /// The end of the audio: queues zeros up to a whole frame, then the plan's flush frames of silence
    /// (the audio delay + 1 s), so that the following pulls deliver the last words. The stream goes on
    /// afterwards (more audio may follow); [`Transcriber::reset`] starts a new one.
    pub fn flush(&mut self) {
        let fs = self.frame_size();
        let partial = self.pending_samples() % fs;
        let pad = if partial == 0 { 0 } else { fs - partial };
        let n = pad + self.engine.model.plan().flush_frames * fs;
        self.make_room(n);
        self.input.resize(self.input.len() + n, 0.0);
    }

    /// Back to a fresh stream: queued input and events are dropped. Allocates nothing.
    pub fn reset(&mut self) {
        self.stream.reset();
        self.input.clear();
        self.read = 0;
        self.out.queue.clear();
        self.out.steps = 0;
        self.out.eot_armed = true;
        self.out.text.clear();
        self.current = None;
    }

    /// The next event: a waiting one, else the events of the next model step(s) when a whole frame is
    /// queued; `None` when no event waits and less than a frame is queued (push more, or flush). The first
    /// step of a stream also runs its silence prefix. A model without voice-activity heads (stt-2.6b) may
    /// run several steps in one pull (steps that close no word report nothing).
    pub fn pull(&mut self) -> Result<Option<TranscriptEvent<'_>>, RuntimeError> {
        if self.out.queue.is_empty() {
            // No queued word reads the text any more (the last pulled one's borrow has ended).
            self.current = None;
            self.out.text.clear();
        }
        while self.out.queue.is_empty() {
            if !self.step_frame()? {
                self.current = None;
                return Ok(None);
            }
        }
        self.current = self.out.queue.pop_front();
        let words = self.out.text.as_str();
        Ok(self.current.as_ref().map(|q| q.view(words)))
    }

    /// Runs the next queued frame through the stream; false when less than a frame is queued.
    fn step_frame(&mut self) -> Result<bool, RuntimeError> {
        let fs = self.frame_size();
        if self.pending_samples() < fs {
            return Ok(false);
        }
        let Transcriber {
            engine,
            stream,
            opts,
            input,
            read,
            out,
            ..
        } = self;
        let frame = &input[*read..*read + fs];
        *read += fs;
        let spm = &engine.tokenizer;
        stream.push_pcm(frame, |_, events| out.step(events, opts, spm))?;
        Ok(true)
    }

    /// Makes room for `n` more samples without growing when the stepped prefix can be dropped instead.
    fn make_room(&mut self, n: usize) {
        if self.read > 0 && self.input.len() + n > self.input.capacity() {
            self.input.copy_within(self.read.., 0);
            self.input.truncate(self.input.len() - self.read);
            self.read = 0;
        }
    }
}

impl Outbox {
    /// Queues one step's events, with the end-of-turn rule.
    fn step(&mut self, events: &[SttEvent], opts: &TranscriberOptions, spm: &SentencePiece) {
        self.steps += 1;
        let step_idx = self.steps;
        for e in events {
            match e {
                SttEvent::Step { n_heads, prs, .. } => {
                    self.queue.push_back(Queued::Step {
                        step_idx,
                        n: *n_heads,
                        prs: *prs,
                    });
                    let head = opts.end_of_turn_head;
                    if head < *n_heads && prs[head] > opts.end_of_turn_threshold && self.eot_armed {
                        self.eot_armed = false;
                        self.queue.push_back(Queued::EndOfTurn {
                            step_idx,
                            probability: prs[head],
                            n: *n_heads,
                            prs: *prs,
                        });
                    }
                }
                SttEvent::Word { tokens, start_time } => {
                    self.eot_armed = true;
                    let start = self.text.len();
                    // Ids come from the model's own vocabulary: decoding cannot fail on them (and
                    // writes nothing when it does).
                    let _ = spm.decode_into(tokens, &mut self.text, &mut self.bytes);
                    let word = &self.text[start..];
                    let lead = word.len() - word.trim_start().len();
                    let end = start + word.trim_end().len();
                    self.queue.push_back(Queued::Word {
                        step_idx,
                        text: ((start + lead).min(end), end),
                        tokens: *tokens,
                        start_time: *start_time,
                    });
                }
                SttEvent::EndWord { stop_time } => {
                    self.eot_armed = true;
                    self.queue.push_back(Queued::EndWord {
                        step_idx,
                        stop_time: *stop_time,
                    });
                }
            }
        }
    }
}
