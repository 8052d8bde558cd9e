//! `MnSession`: one full-duplex conversation, driven by the caller (push PCM, pull frames).

use std::ffi::c_char;

use model::sampling::SamplingParams;
use runtime::{Session, SessionControl, SessionOptions, Step};

use crate::engine::{engine_arc, MnEngine};
use crate::handle::{Shell, SESSION};
use crate::status::{
    boundary, check_size, non_null, read_options, write_default_options, COptions, Fail, MnStatus,
};
use crate::MN_AUDIO_CODEBOOKS;

/// One conversation: Mimi streams, LM state, samplers, input queue. Created by `mn_session_create`,
/// released by `mn_session_destroy`. Push and pull from one thread at a time; the controls from any.
pub struct MnSession {
    _opaque: [u8; 0],
}

/// Text bytes reserved per session for one frame's text (grown only for an unusually long piece).
const TEXT_RESERVE: usize = 256;

pub(crate) struct SessionState {
    session: Session,
    /// The last frame's text, NUL-terminated (what `MnFrame::text` points to).
    text: Vec<u8>,
}

pub(crate) type SessionShell = Shell<SessionState, SessionControl>;

/// Options of `mn_session_create`. Initialise with `mn_session_options_default`, then change fields.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct MnSessionOptions {
    /// `sizeof(MnSessionOptions)`; set by `mn_session_options_default`.
    pub struct_size: u32,
    /// Rate of the output PCM in Hz (24000 = the model rate, no resampling). Default 24000.
    pub output_rate: u32,
    /// Bounded input queue in 1920-sample frames (>= 1); when full the oldest frame is dropped. Default 4.
    pub max_queued_frames: u32,
    /// Apply Kyutai's server first-frame rule (1, default) or not (0).
    pub first_frame_reset: u32,
    /// Stop after this many LM steps of one stream; 0 = unbounded (default).
    pub max_steps: u64,
    /// Seed of both sampling streams. Default 42424242 (Kyutai's server).
    pub seed: u64,
    /// Text sampling temperature; <= 0 = argmax. Default 0.7.
    pub text_temperature: f32,
    /// Text top-k; 0 keeps all candidates. Default 25.
    pub text_top_k: u32,
    /// Audio sampling temperature; <= 0 = argmax. Default 0.8.
    pub audio_temperature: f32,
    /// Audio top-k; 0 keeps all candidates. Default 250.
    pub audio_top_k: u32,
    /// Multiply the text PAD probability by `exp(pad_mult)` (0 = off, the default).
    pub pad_mult: f32,
    /// Repetition penalty on recent text tokens (1 = off, the default; must be > 0).
    pub repetition_penalty: f32,
    /// Recent text tokens the repetition penalty looks at. Default 64.
    pub repetition_penalty_context: u32,
}

impl COptions for MnSessionOptions {
    type Rust = SessionOptions;

    fn defaults() -> MnSessionOptions {
        let d = SessionOptions::default();
        let p = SamplingParams::default();
        MnSessionOptions {
            struct_size: std::mem::size_of::<MnSessionOptions>() as u32,
            output_rate: d.output_rate,
            max_queued_frames: d.max_queued_frames as u32,
            first_frame_reset: u32::from(d.first_frame_reset),
            max_steps: d.max_steps.unwrap_or(0),
            seed: p.seed,
            text_temperature: p.text_temperature,
            text_top_k: p.text_top_k as u32,
            audio_temperature: p.audio_temperature,
            audio_top_k: p.audio_top_k as u32,
            pad_mult: 0.0,
            repetition_penalty: 1.0,
            repetition_penalty_context: p.repetition_penalty_context as u32,
        }
    }

    fn to_rust(self) -> Result<SessionOptions, Fail> {
        check_size(
            self.struct_size,
            std::mem::size_of::<MnSessionOptions>(),
            "MnSessionOptions",
        )?;
        if self.first_frame_reset > 1 {
            return Err(Fail::new(
                MnStatus::InvalidArgument,
                "first_frame_reset must be 0 or 1",
            ));
        }
        let sampling = SamplingParams {
            greedy: false,
            seed: self.seed,
            text_temperature: self.text_temperature,
            text_top_k: self.text_top_k as usize,
            audio_temperature: self.audio_temperature,
            audio_top_k: self.audio_top_k as usize,
            // exp(0) = 1 and a penalty of 1 change nothing: those values mean "off".
            pad_mult: (self.pad_mult != 0.0).then_some(self.pad_mult),
            repetition_penalty: (self.repetition_penalty != 1.0).then_some(self.repetition_penalty),
            repetition_penalty_context: self.repetition_penalty_context as usize,
        }
        .config();
        Ok(SessionOptions {
            sampling,
            max_queued_frames: self.max_queued_frames as usize,
            output_rate: self.output_rate,
            max_steps: (self.max_steps > 0).then_some(self.max_steps),
            first_frame_reset: self.first_frame_reset == 1,
        })
    }
}

/// Fills `*options` with the defaults (and its `struct_size`).
///
/// # Safety
/// `options` is NULL or points to writable memory of `sizeof(MnSessionOptions)` bytes.
#[no_mangle]
pub unsafe extern "C" fn mn_session_options_default(options: *mut MnSessionOptions) -> MnStatus {
    // SAFETY: forwarded contract.
    unsafe { write_default_options(options) }
}

/// Creates a session on `engine` (all of its memory is allocated here). `options` may be NULL (defaults).
/// On success `*session` is a new handle owned by the caller (release with `mn_session_destroy`).
///
/// # Safety
/// `engine` is NULL or a handle from `mn_engine_open`; `options` NULL or readable; `session` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn mn_session_create(
    engine: *const MnEngine,
    options: *const MnSessionOptions,
    session: *mut *mut MnSession,
) -> MnStatus {
    let make = || {
        // SAFETY: forwarded contract.
        let opts = unsafe { read_options(options) }?;
        // SAFETY: forwarded contract.
        let engine = unsafe { engine_arc(engine) }?;
        let s = Session::new(engine, opts)?;
        let control = s.control();
        let state = SessionState {
            session: s,
            text: Vec::with_capacity(TEXT_RESERVE),
        };
        Ok((control, state))
    };
    // SAFETY: forwarded contract.
    unsafe { SessionShell::hand_out(session, "session", SESSION, make) }
}

/// Destroys a session handle (frees its memory; buffers it handed out become invalid). Afterwards every
/// call with this handle returns `MN_STATUS_DESTROYED`. Works on a poisoned handle.
///
/// # Safety
/// `session` is NULL or a handle from `mn_session_create`.
#[no_mangle]
pub unsafe extern "C" fn mn_session_destroy(session: *mut MnSession) -> MnStatus {
    boundary(|| {
        // SAFETY: forwarded contract.
        unsafe { SessionShell::destroy(session.cast(), SESSION) }?;
        Ok(MnStatus::Ok)
    })
}

/// What one `mn_session_push` did.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct MnPushReport {
    /// Whole 1920-sample frames this push completed (and queued).
    pub frames_completed: u32,
    /// Queued frames dropped (oldest first) during this push because the queue was full.
    pub frames_dropped: u32,
    /// Frames waiting in the queue after this push.
    pub queued: u64,
}

/// Pushes `n_samples` samples of 24 kHz mono PCM (any length; the session cuts 1920-sample frames).
/// Never blocks and, after the first frames, never allocates. Samples are sanitised (NaN/inf → 0, clamped
/// to [-1, 1]). `pcm` is read during the call only; it may be NULL when `n_samples` is 0. `report` may be NULL.
///
/// # Safety
/// `session` is NULL or a handle from `mn_session_create`; `pcm` is NULL or readable for `n_samples` floats;
/// `report` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn mn_session_push(
    session: *mut MnSession,
    pcm: *const f32,
    n_samples: usize,
    report: *mut MnPushReport,
) -> MnStatus {
    boundary(|| {
        // SAFETY: forwarded contract.
        let mut s = unsafe { SessionShell::enter(session.cast(), SESSION) }?;
        let samples: &[f32] = if n_samples == 0 {
            &[]
        } else {
            non_null(pcm, "pcm")?;
            // SAFETY: not NULL, readable for n_samples floats by the caller's contract.
            unsafe { std::slice::from_raw_parts(pcm, n_samples) }
        };
        let r = s.state().session.push_pcm(samples)?;
        if !report.is_null() {
            let out = MnPushReport {
                frames_completed: r.frames_completed,
                frames_dropped: r.frames_dropped,
                queued: r.queued as u64,
            };
            // SAFETY: not NULL, writable by the caller's contract.
            unsafe { report.write(out) };
        }
        Ok(MnStatus::Ok)
    })
}

/// One output frame (80 ms of the model). Set `struct_size` (`sizeof(MnFrame)`) before `mn_session_pull`;
/// the other fields are written by it.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct MnFrame {
    /// `sizeof(MnFrame)`, set by the caller.
    pub struct_size: u32,
    /// Text token of this LM step, or -1 (the first step of a stream produces none).
    pub text_token: i32,
    /// Audio tokens of this LM step (8 codebooks), or all -1 when none.
    pub audio_tokens: [i32; MN_AUDIO_CODEBOOKS],
    /// Output PCM at the session's `output_rate` (empty at the first step; its length varies by a sample
    /// when resampling). Owned by the session: valid until the next `mn_session_pull` or
    /// `mn_session_destroy` on this session.
    pub pcm: *const f32,
    /// Samples at `pcm`.
    pub pcm_len: usize,
    /// Text decoded this step, NUL-terminated UTF-8 ("" for none). Owned by the session, valid as `pcm`.
    pub text: *const c_char,
    /// Bytes of `text` before the NUL.
    pub text_len: usize,
    /// LM step index within the stream (0 after creation or reset).
    pub frame_index: u64,
    /// Epoch of the output (incremented by interrupt and reset).
    pub epoch: u64,
    /// Input frames dropped so far because the queue was full.
    pub frames_dropped: u64,
    /// Input frames still queued after this step (the lag, in 80 ms frames).
    pub queued: u64,
}

/// Runs one frame pass if a whole input frame is queued and fills `*frame`.
/// Returns `MN_STATUS_OK` (a frame), `MN_STATUS_NO_FRAME` (push more input), `MN_STATUS_PAUSED` or
/// `MN_STATUS_STOPPED`; `*frame` is written only with `MN_STATUS_OK`. Controls requested since the last
/// pull are applied first. After warm-up this allocates nothing.
///
/// # Safety
/// `session` is NULL or a handle from `mn_session_create`; `frame` is NULL or points to an `MnFrame`.
#[no_mangle]
pub unsafe extern "C" fn mn_session_pull(session: *mut MnSession, frame: *mut MnFrame) -> MnStatus {
    boundary(|| {
        non_null(frame, "frame")?;
        // SAFETY: not NULL, readable by the caller's contract.
        let size = unsafe { (*frame).struct_size };
        check_size(size, std::mem::size_of::<MnFrame>(), "MnFrame")?;
        // SAFETY: forwarded contract.
        let mut s = unsafe { SessionShell::enter(session.cast(), SESSION) }?;
        let SessionState { session, text } = s.state();
        let f = match session.step()? {
            Step::Idle => return Ok(MnStatus::NoFrame),
            Step::Paused => return Ok(MnStatus::Paused),
            Step::Stopped(_) => return Ok(MnStatus::Stopped),
            Step::Frame(f) => f,
        };
        text.clear();
        text.extend_from_slice(f.text.as_bytes());
        text.push(0);
        let mut audio_tokens = [-1i32; MN_AUDIO_CODEBOOKS];
        if let Some(a) = f.audio_tokens {
            for (dst, src) in audio_tokens.iter_mut().zip(a) {
                *dst = src as i32;
            }
        }
        let out = MnFrame {
            struct_size: size,
            text_token: f.text_token.map_or(-1, |t| t as i32),
            audio_tokens,
            pcm: f.pcm.as_ptr(),
            pcm_len: f.pcm.len(),
            text: text.as_ptr().cast(),
            text_len: text.len() - 1,
            frame_index: f.frame_index,
            epoch: f.epoch,
            frames_dropped: f.counters.frames_dropped,
            queued: f.counters.queued as u64,
        };
        // SAFETY: not NULL, writable by the caller's contract.
        unsafe { frame.write(out) };
        Ok(MnStatus::Ok)
    })
}

/// Applies a control through the session's command handle (atomics only; any thread, any time).
///
/// # Safety
/// `session` is NULL or a handle from `mn_session_create`; `epoch` is NULL or writable.
unsafe fn control(
    session: *mut MnSession,
    epoch: *mut u64,
    op: impl FnOnce(&SessionControl) -> u64,
) -> MnStatus {
    boundary(|| {
        // SAFETY: forwarded contract.
        let shell = unsafe { SessionShell::peek(session.cast(), SESSION) }?;
        let e = op(&shell.shared);
        if !epoch.is_null() {
            // SAFETY: not NULL, writable by the caller's contract.
            unsafe { epoch.write(e) };
        }
        Ok(MnStatus::Ok)
    })
}

/// [`control`] for a command that reports no epoch.
///
/// # Safety
/// `session` is NULL or a handle from `mn_session_create`.
unsafe fn command(session: *mut MnSession, op: impl FnOnce(&SessionControl)) -> MnStatus {
    // SAFETY: forwarded contract; a NULL epoch is not written.
    unsafe {
        control(session, std::ptr::null_mut(), |c| {
            op(c);
            c.epoch()
        })
    }
}

/// Soft interrupt: output of the current epoch is discarded from the next pull on, the model state
/// continues. Writes the new epoch to `*epoch` when not NULL. Callable from any thread.
///
/// # Safety
/// `session` is NULL or a handle from `mn_session_create`; `epoch` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn mn_session_interrupt(
    session: *mut MnSession,
    epoch: *mut u64,
) -> MnStatus {
    // SAFETY: forwarded contract.
    unsafe { control(session, epoch, SessionControl::interrupt) }
}

/// Pauses the session: pulls return `MN_STATUS_PAUSED`, pushed input queues up (bounded). Any thread.
///
/// # Safety
/// `session` is NULL or a handle from `mn_session_create`.
#[no_mangle]
pub unsafe extern "C" fn mn_session_pause(session: *mut MnSession) -> MnStatus {
    // SAFETY: forwarded contract.
    unsafe { command(session, SessionControl::pause) }
}

/// Resumes a paused session (the same stream continues). Any thread.
///
/// # Safety
/// `session` is NULL or a handle from `mn_session_create`.
#[no_mangle]
pub unsafe extern "C" fn mn_session_resume(session: *mut MnSession) -> MnStatus {
    // SAFETY: forwarded contract.
    unsafe { command(session, SessionControl::resume) }
}

/// Starts a new stream: from the next pull the session is as if freshly created; input pushed before this
/// call is discarded. Writes the new epoch to `*epoch` when not NULL. Any thread.
///
/// # Safety
/// `session` is NULL or a handle from `mn_session_create`; `epoch` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn mn_session_reset(session: *mut MnSession, epoch: *mut u64) -> MnStatus {
    // SAFETY: forwarded contract.
    unsafe { control(session, epoch, SessionControl::reset) }
}

/// Stops the session for good: every later pull returns `MN_STATUS_STOPPED`. Any thread.
///
/// # Safety
/// `session` is NULL or a handle from `mn_session_create`.
#[no_mangle]
pub unsafe extern "C" fn mn_session_stop(session: *mut MnSession) -> MnStatus {
    // SAFETY: forwarded contract.
    unsafe { command(session, SessionControl::stop) }
}

/// Test hook (not in the header): installs a hook called at the start of every phase of the frame pass
/// (tests of the panic boundary and of two threads on one session).
///
/// # Safety
/// `session` is a live handle from `mn_session_create` not in use by another thread.
#[doc(hidden)]
pub unsafe fn test_set_phase_hook(session: *mut MnSession, hook: Option<runtime::PhaseHook>) {
    // SAFETY: forwarded contract.
    match unsafe { SessionShell::enter(session.cast(), SESSION) } {
        Ok(mut s) => s.state().session.set_phase_hook(hook),
        Err(Fail(status, msg)) => panic!("not a live session: {status:?} {msg}"),
    }
}
