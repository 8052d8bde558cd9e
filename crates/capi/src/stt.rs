//! `MnSttEngine` and `MnSttTranscriber`: Kyutai's streaming speech-to-text models, one stream per
//! transcriber, driven by the caller (push PCM, pull events), over `runtime::{SttEngine, Transcriber}`.

use std::ffi::c_char;
use std::sync::Arc;

use runtime::{SttEngine, Transcriber, TranscriberOptions, TranscriptEvent};

use crate::engine::MnEngineOptions;
use crate::handle::{Shell, STT_ENGINE, STT_TRANSCRIBER};
use crate::status::{
    boundary, bundle_dir_arg, check_size, non_null, read_options, write_default_options, COptions,
    Fail, MnStatus,
};

/// A loaded speech-to-text model (Kyutai's stt-1b-en_fr / stt-2.6b-en bundles, or the bundled demo),
/// shared by any number of transcribers. Created by `mn_stt_engine_open`, released by
/// `mn_stt_engine_destroy`; transcribers keep the weights alive.
pub struct MnSttEngine {
    _opaque: [u8; 0],
}

/// One transcription stream: Mimi encoder and LM state, queued input and events. Created by
/// `mn_stt_transcriber_create`, released by `mn_stt_transcriber_destroy`; one thread at a time.
pub struct MnSttTranscriber {
    _opaque: [u8; 0],
}

pub(crate) struct SttEngineState {
    engine: Arc<SttEngine>,
    demo: bool,
}

type SttEngineShell = Shell<SttEngineState>;

/// Bytes (text) and ids (tokens) reserved per transcriber for the pulled word: a word holds at most
/// `model::stt::MAX_WORD_TOKENS` (64) ids; its text grows the buffer only past 256 bytes, once.
const WORD_RESERVE: usize = 256;

pub(crate) struct TranscriberState {
    transcriber: Transcriber,
    /// The last word's text, NUL-terminated (what `MnSttEvent::text` points to).
    text: Vec<u8>,
    /// The last word's tokens (what `MnSttEvent::tokens` points to).
    tokens: Vec<u32>,
}

type TranscriberShell = Shell<TranscriberState>;

/// Most voice-activity probabilities an `MnSttEvent` carries (Kyutai's stt-1b has 4 heads).
pub const MN_STT_MAX_HEADS: usize = 8;

// The C struct's array holds every head the model layer reports.
const _: () = assert!(MN_STT_MAX_HEADS == model::stt::MAX_EXTRA_HEADS);

/// `MnSttEvent::kind`: a model step ran; `prs` holds the voice-activity probabilities (models with
/// voice-activity heads only, as Kyutai's server sends it).
pub const MN_STT_EVENT_STEP: u32 = 1;
/// `MnSttEvent::kind`: the end-of-turn head crossed its threshold (`probability`); once per turn.
pub const MN_STT_EVENT_END_OF_TURN: u32 = 2;
/// `MnSttEvent::kind`: a word (`text`, `tokens`, start time in `time`).
pub const MN_STT_EVENT_WORD: u32 = 3;
/// `MnSttEvent::kind`: the last word ended (stop time in `time`).
pub const MN_STT_EVENT_END_WORD: u32 = 4;

/// Opens a speech-to-text model: `bundle_dir` is an STT bundle directory (Kyutai `config.json` with
/// `stt_config`, LM weights, Mimi weights, SentencePiece model), or NULL for the tiny random-weight
/// `demo-stt` model compiled into the library (written once to a per-user cache folder; its words are
/// noise). `options` may be NULL (defaults): `threads` per transcriber and `kv_dtype` are used. A Moshi
/// bundle is refused with `MN_STATUS_MODEL`. On success `*engine` is a new handle owned by the caller.
///
/// # Safety
/// `bundle_dir` is NULL or a NUL-terminated UTF-8 path; `options` is NULL or valid for reads;
/// `engine` is NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn mn_stt_engine_open(
    bundle_dir: *const c_char,
    options: *const MnEngineOptions,
    engine: *mut *mut MnSttEngine,
) -> MnStatus {
    let make = || {
        // SAFETY: forwarded contract.
        let opts = unsafe { read_options(options) }?;
        // SAFETY: forwarded contract.
        let dir = unsafe { bundle_dir_arg(bundle_dir, embed::demo_stt::materialize) }?;
        let engine = SttEngine::open(&dir, opts)?;
        let demo = bundle_dir.is_null();
        Ok(((), SttEngineState { engine, demo }))
    };
    // SAFETY: forwarded contract.
    unsafe { SttEngineShell::hand_out(engine, "engine", STT_ENGINE, make) }
}

/// Destroys an STT engine handle. Transcribers created from it keep working. Afterwards every call with
/// this handle returns `MN_STATUS_DESTROYED`.
///
/// # Safety
/// `engine` is NULL or a handle from `mn_stt_engine_open`.
#[no_mangle]
pub unsafe extern "C" fn mn_stt_engine_destroy(engine: *mut MnSttEngine) -> MnStatus {
    boundary(|| {
        // SAFETY: forwarded contract.
        unsafe { SttEngineShell::destroy(engine.cast(), STT_ENGINE) }?;
        Ok(MnStatus::Ok)
    })
}

/// What an STT engine runs: filled by `mn_stt_engine_info`. Set `struct_size` first.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct MnSttInfo {
    /// `sizeof(MnSttInfo)`, set by the caller.
    pub struct_size: u32,
    /// Voice-activity heads (4 for stt-1b, 0 for stt-2.6b): the length of `MnSttEvent::prs`.
    pub n_heads: u32,
    /// Frames of silence fed before the audio (0 for stt-1b, 13 for stt-2.6b).
    pub prefix_frames: u32,
    /// The text's delay behind the audio, in 80 ms steps (6 for stt-1b, 31 for stt-2.6b).
    pub delay_steps: u32,
    /// Frames of silence `mn_stt_flush` queues after the audio (the delay + 1 s).
    pub flush_frames: u32,
    /// 1 for the bundled random-weight demo model, else 0.
    pub is_demo: u32,
}

/// Fills `*info` (whose `struct_size` the caller set) with what `engine` runs.
///
/// # Safety
/// `engine` is NULL or a handle from `mn_stt_engine_open`; `info` is NULL or points to an `MnSttInfo`.
#[no_mangle]
pub unsafe extern "C" fn mn_stt_engine_info(
    engine: *const MnSttEngine,
    info: *mut MnSttInfo,
) -> MnStatus {
    boundary(|| {
        non_null(info, "info")?;
        // SAFETY: not NULL, readable by the caller's contract.
        let size = unsafe { (*info).struct_size };
        check_size(size, std::mem::size_of::<MnSttInfo>(), "MnSttInfo")?;
        // SAFETY: forwarded contract.
        let (e, demo) = unsafe { engine_arc(engine) }?;
        let plan = e.plan();
        let out = MnSttInfo {
            struct_size: size,
            n_heads: e.n_heads() as u32,
            prefix_frames: plan.prefix_frames as u32,
            delay_steps: plan.delay_tokens as u32,
            flush_frames: plan.flush_frames as u32,
            is_demo: u32::from(demo),
        };
        // SAFETY: not NULL, writable by the caller's contract.
        unsafe { info.write(out) };
        Ok(MnStatus::Ok)
    })
}

/// The engine behind a handle (an `Arc` clone) and whether it is the demo.
///
/// # Safety
/// `engine` is NULL or a handle from `mn_stt_engine_open`.
unsafe fn engine_arc(engine: *const MnSttEngine) -> Result<(Arc<SttEngine>, bool), Fail> {
    // As `mn_engine_*`: concurrent users hold the flag for a clone only; wait rather than report BUSY.
    loop {
        // SAFETY: forwarded contract.
        match unsafe { SttEngineShell::enter(engine.cast(), STT_ENGINE) } {
            Ok(mut e) => {
                let s = e.state();
                return Ok((s.engine.clone(), s.demo));
            }
            Err(Fail(MnStatus::Busy, _)) => std::thread::yield_now(),
            Err(f) => return Err(f),
        }
    }
}

/// Options of `mn_stt_transcriber_create`. Initialise with `mn_stt_options_default`, then change fields.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct MnSttOptions {
    /// `sizeof(MnSttOptions)`; set by `mn_stt_options_default`.
    pub struct_size: u32,
    /// The voice-activity head read for the end of a turn. Default 2 (Kyutai's scripts; 2 s on stt-1b).
    pub end_of_turn_head: u32,
    /// `MN_STT_EVENT_END_OF_TURN` is reported when that head's probability exceeds this. Default 0.5.
    pub end_of_turn_threshold: f32,
    /// Input frames (80 ms) reserved up front (>= 1); pushing further ahead of the pulls grows the
    /// input. Default 64.
    pub reserve_frames: u32,
}

impl COptions for MnSttOptions {
    type Rust = TranscriberOptions;

    fn defaults() -> MnSttOptions {
        let d = TranscriberOptions::default();
        MnSttOptions {
            struct_size: std::mem::size_of::<MnSttOptions>() as u32,
            end_of_turn_head: d.end_of_turn_head as u32,
            end_of_turn_threshold: d.end_of_turn_threshold,
            reserve_frames: d.reserve_frames as u32,
        }
    }

    fn to_rust(self) -> Result<TranscriberOptions, Fail> {
        check_size(
            self.struct_size,
            std::mem::size_of::<MnSttOptions>(),
            "MnSttOptions",
        )?;
        Ok(TranscriberOptions {
            end_of_turn_head: self.end_of_turn_head as usize,
            end_of_turn_threshold: self.end_of_turn_threshold,
            reserve_frames: self.reserve_frames as usize,
        })
    }
}

/// Fills `*options` with the defaults (and its `struct_size`).
///
/// # Safety
/// `options` is NULL or points to writable memory of `sizeof(MnSttOptions)` bytes.
#[no_mangle]
pub unsafe extern "C" fn mn_stt_options_default(options: *mut MnSttOptions) -> MnStatus {
    // SAFETY: forwarded contract.
    unsafe { write_default_options(options) }
}

/// Creates a transcriber on `engine` (its memory is allocated here). `options` may be NULL (defaults).
/// On success `*transcriber` is a new handle owned by the caller (release with
/// `mn_stt_transcriber_destroy`).
///
/// # Safety
/// `engine` is NULL or a handle from `mn_stt_engine_open`; `options` NULL or readable; `transcriber`
/// NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn mn_stt_transcriber_create(
    engine: *const MnSttEngine,
    options: *const MnSttOptions,
    transcriber: *mut *mut MnSttTranscriber,
) -> MnStatus {
    let make = || {
        // SAFETY: forwarded contract.
        let opts = unsafe { read_options(options) }?;
        // SAFETY: forwarded contract.
        let (e, _) = unsafe { engine_arc(engine) }?;
        let state = TranscriberState {
            transcriber: Transcriber::new(e, opts)?,
            text: Vec::with_capacity(WORD_RESERVE),
            tokens: Vec::with_capacity(WORD_RESERVE),
        };
        Ok(((), state))
    };
    // SAFETY: forwarded contract.
    unsafe { TranscriberShell::hand_out(transcriber, "transcriber", STT_TRANSCRIBER, make) }
}

/// Destroys a transcriber (frees its memory; the pointers of its last event become invalid). Afterwards
/// every call with this handle returns `MN_STATUS_DESTROYED`. Works on a poisoned handle.
///
/// # Safety
/// `transcriber` is NULL or a handle from `mn_stt_transcriber_create`.
#[no_mangle]
pub unsafe extern "C" fn mn_stt_transcriber_destroy(
    transcriber: *mut MnSttTranscriber,
) -> MnStatus {
    boundary(|| {
        // SAFETY: forwarded contract.
        unsafe { TranscriberShell::destroy(transcriber.cast(), STT_TRANSCRIBER) }?;
        Ok(MnStatus::Ok)
    })
}

/// Queues `n_samples` samples of 24 kHz mono PCM (any length); computes nothing (the pulls do). Nothing is
/// ever dropped: the input grows past its reserve when the caller pushes far ahead of its pulls. A sample
/// that is NaN or infinite refuses the whole call (`MN_STATUS_INVALID_ARGUMENT`) and queues nothing.
/// `pcm` is read during the call only; it may be NULL when `n_samples` is 0.
///
/// # Safety
/// `transcriber` is NULL or a handle from `mn_stt_transcriber_create`; `pcm` is NULL or readable for
/// `n_samples` floats.
#[no_mangle]
pub unsafe extern "C" fn mn_stt_push(
    transcriber: *mut MnSttTranscriber,
    pcm: *const f32,
    n_samples: usize,
) -> MnStatus {
    boundary(|| {
        // SAFETY: forwarded contract.
        let mut t = unsafe { TranscriberShell::enter(transcriber.cast(), STT_TRANSCRIBER) }?;
        let samples: &[f32] = if n_samples == 0 {
            &[]
        } else {
            non_null(pcm, "pcm")?;
            // SAFETY: not NULL, readable for n_samples floats by the caller's contract.
            unsafe { std::slice::from_raw_parts(pcm, n_samples) }
        };
        t.state().transcriber.push(samples)?;
        Ok(MnStatus::Ok)
    })
}

/// One event of a transcriber. Set `struct_size` (`sizeof(MnSttEvent)`) before `mn_stt_pull`; the other
/// fields are written by it (those a kind does not use are zero / NULL).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct MnSttEvent {
    /// `sizeof(MnSttEvent)`, set by the caller.
    pub struct_size: u32,
    /// `MN_STT_EVENT_STEP`, `_END_OF_TURN`, `_WORD` or `_END_WORD`. Within one step they come in this
    /// order (Kyutai's server order, the end of turn right after its step).
    pub kind: u32,
    /// The model step that produced the event, counted from 1 since the start of the stream (the silence
    /// prefix counts).
    pub step_idx: u64,
    /// WORD: its start time; END_WORD: the stop time; in seconds from the first audio sample. 0 otherwise.
    pub time: f64,
    /// WORD: its text, NUL-terminated UTF-8 (surrounding spaces trimmed); "" otherwise. Owned by the
    /// transcriber: valid until the next `mn_stt_pull`, `mn_stt_reset` or `mn_stt_transcriber_destroy`.
    pub text: *const c_char,
    /// Bytes of `text` before the NUL.
    pub text_len: usize,
    /// WORD: its SentencePiece token ids; NULL otherwise. Owned by the transcriber, valid as `text`.
    pub tokens: *const u32,
    /// Ids at `tokens`.
    pub n_tokens: usize,
    /// STEP and END_OF_TURN: valid entries of `prs` (the model's heads); 0 otherwise.
    pub n_prs: u32,
    /// END_OF_TURN: the end-of-turn head's probability; 0 otherwise.
    pub probability: f32,
    /// STEP and END_OF_TURN (that step's): each voice-activity head's probability of no voice activity
    /// over its horizon (stt-1b: 0.5, 1, 2 and 3 s).
    pub prs: [f32; MN_STT_MAX_HEADS],
}

/// Writes the next event to `*event`: a waiting one, else the events of the next model step when a whole
/// 1920-sample frame is queued (the step runs in this call; the first one also runs the model's silence
/// prefix). Returns `MN_STATUS_OK` (an event), or `MN_STATUS_NO_FRAME` when no event waits and less than a
/// frame is queued (push more, or flush); `*event` is written only with `MN_STATUS_OK`. After warm-up this
/// allocates nothing except when a word completes.
///
/// # Safety
/// `transcriber` is NULL or a handle from `mn_stt_transcriber_create`; `event` is NULL or points to an
/// `MnSttEvent`.
#[no_mangle]
pub unsafe extern "C" fn mn_stt_pull(
    transcriber: *mut MnSttTranscriber,
    event: *mut MnSttEvent,
) -> MnStatus {
    boundary(|| {
        non_null(event, "event")?;
        // SAFETY: not NULL, readable by the caller's contract.
        let size = unsafe { (*event).struct_size };
        check_size(size, std::mem::size_of::<MnSttEvent>(), "MnSttEvent")?;
        // SAFETY: forwarded contract.
        let mut t = unsafe { TranscriberShell::enter(transcriber.cast(), STT_TRANSCRIBER) }?;
        let TranscriberState {
            transcriber,
            text,
            tokens,
        } = t.state();
        let Some(e) = transcriber.pull()? else {
            return Ok(MnStatus::NoFrame);
        };
        text.clear();
        tokens.clear();
        let mut out = MnSttEvent {
            struct_size: size,
            kind: 0,
            step_idx: 0,
            time: 0.0,
            text: std::ptr::null(),
            text_len: 0,
            tokens: std::ptr::null(),
            n_tokens: 0,
            n_prs: 0,
            probability: 0.0,
            prs: [0.0; MN_STT_MAX_HEADS],
        };
        match e {
            TranscriptEvent::Step { step_idx, prs } => {
                out.kind = MN_STT_EVENT_STEP;
                out.step_idx = step_idx as u64;
                out.n_prs = prs.len() as u32;
                out.prs[..prs.len()].copy_from_slice(prs);
            }
            TranscriptEvent::EndOfTurn {
                step_idx,
                probability,
                prs,
            } => {
                out.kind = MN_STT_EVENT_END_OF_TURN;
                out.step_idx = step_idx as u64;
                out.probability = probability;
                out.n_prs = prs.len() as u32;
                out.prs[..prs.len()].copy_from_slice(prs);
            }
            TranscriptEvent::Word {
                step_idx,
                text: word,
                tokens: ids,
                start_time,
            } => {
                out.kind = MN_STT_EVENT_WORD;
                out.step_idx = step_idx as u64;
                out.time = start_time;
                text.extend_from_slice(word.as_bytes());
                tokens.extend_from_slice(ids);
                out.tokens = tokens.as_ptr();
                out.n_tokens = tokens.len();
            }
            TranscriptEvent::EndWord {
                step_idx,
                stop_time,
            } => {
                out.kind = MN_STT_EVENT_END_WORD;
                out.step_idx = step_idx as u64;
                out.time = stop_time;
            }
        }
        text.push(0);
        out.text = text.as_ptr().cast();
        out.text_len = text.len() - 1;
        // SAFETY: not NULL, writable by the caller's contract.
        unsafe { event.write(out) };
        Ok(MnStatus::Ok)
    })
}

/// The end of the audio: queues zeros up to a whole frame, then the model's flush (its delay + 1 s of
/// silence, as Kyutai's scripts do), so that the following pulls deliver the last words. The stream goes
/// on afterwards; `mn_stt_reset` starts a new one.
///
/// # Safety
/// `transcriber` is NULL or a handle from `mn_stt_transcriber_create`.
#[no_mangle]
pub unsafe extern "C" fn mn_stt_flush(transcriber: *mut MnSttTranscriber) -> MnStatus {
    boundary(|| {
        // SAFETY: forwarded contract.
        let mut t = unsafe { TranscriberShell::enter(transcriber.cast(), STT_TRANSCRIBER) }?;
        t.state().transcriber.flush();
        Ok(MnStatus::Ok)
    })
}

/// Starts a new stream: queued input and events are dropped, the next pull starts from a fresh model
/// state (step 1, times from 0). Allocates nothing.
///
/// # Safety
/// `transcriber` is NULL or a handle from `mn_stt_transcriber_create`.
#[no_mangle]
pub unsafe extern "C" fn mn_stt_reset(transcriber: *mut MnSttTranscriber) -> MnStatus {
    boundary(|| {
        // SAFETY: forwarded contract.
        let mut t = unsafe { TranscriberShell::enter(transcriber.cast(), STT_TRANSCRIBER) }?;
        let s = t.state();
        s.transcriber.reset();
        s.text.clear();
        s.tokens.clear();
        Ok(MnStatus::Ok)
    })
}
