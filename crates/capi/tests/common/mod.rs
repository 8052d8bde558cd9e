//! Helpers shared by the ABI tests: fixture paths, status checks, C strings.
#![allow(dead_code)]

use std::ffi::{CStr, CString};
use std::path::PathBuf;

use moshi_native::*;

pub fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures")
}

pub fn c_path(p: PathBuf) -> CString {
    CString::new(p.to_str().unwrap()).unwrap()
}

pub fn last_error() -> String {
    // SAFETY: mn_last_error never returns NULL and the string lives until the next failing call.
    unsafe { CStr::from_ptr(mn_last_error()) }
        .to_str()
        .unwrap()
        .to_string()
}

/// Asserts a call returned `want`; on a mismatch the message shows the last error.
#[track_caller]
pub fn expect(got: MnStatus, want: MnStatus) {
    assert_eq!(got, want, "last error: {}", last_error());
}

/// Opens the tiny fixture bundle (`fixtures/lm`, the demo model's files).
pub fn open_engine(threads: u32) -> *mut MnEngine {
    let mut opts = std::mem::MaybeUninit::<MnEngineOptions>::uninit();
    // SAFETY: valid pointers; the options are initialised by the default function.
    unsafe {
        expect(mn_engine_options_default(opts.as_mut_ptr()), MnStatus::Ok);
        let mut opts = opts.assume_init();
        opts.threads = threads;
        let mut engine = std::ptr::null_mut();
        let dir = c_path(fixtures().join("lm"));
        expect(
            mn_engine_open(dir.as_ptr(), &opts, &mut engine),
            MnStatus::Ok,
        );
        engine
    }
}

/// A session with `options` (NULL: defaults) on a fresh fixture engine (`open_engine(1)`), both created
/// successfully: `(engine, session)`.
///
/// # Safety
/// `options` is NULL or valid for reads.
pub unsafe fn open_session(options: *const MnSessionOptions) -> (*mut MnEngine, *mut MnSession) {
    let engine = open_engine(1);
    let mut session = std::ptr::null_mut();
    // SAFETY: valid pointers; `options` by the caller's contract.
    expect(
        unsafe { mn_session_create(engine, options, &mut session) },
        MnStatus::Ok,
    );
    (engine, session)
}

/// Destroys `session`, then `engine`; both must succeed.
///
/// # Safety
/// Both are live handles (or what the ABI refuses with a status, which fails the test).
pub unsafe fn close_session(engine: *mut MnEngine, session: *mut MnSession) {
    // SAFETY: by the caller's contract.
    unsafe {
        expect(mn_session_destroy(session), MnStatus::Ok);
        expect(mn_engine_destroy(engine), MnStatus::Ok);
    }
}

pub fn session_options() -> MnSessionOptions {
    let mut opts = std::mem::MaybeUninit::<MnSessionOptions>::uninit();
    // SAFETY: valid pointer; initialised by the default function.
    unsafe {
        expect(mn_session_options_default(opts.as_mut_ptr()), MnStatus::Ok);
        opts.assume_init()
    }
}

pub fn new_frame() -> MnFrame {
    MnFrame {
        struct_size: std::mem::size_of::<MnFrame>() as u32,
        text_token: 0,
        audio_tokens: [0; 8],
        pcm: std::ptr::null(),
        pcm_len: 0,
        text: std::ptr::null(),
        text_len: 0,
        frame_index: 0,
        epoch: 0,
        frames_dropped: 0,
        queued: 0,
    }
}

/// A deterministic test signal: a few tones with a slow envelope.
pub fn signal(frames: usize) -> Vec<f32> {
    (0..frames * MN_FRAME_SIZE)
        .map(|i| {
            let t = i as f32 / 24_000.0;
            0.3 * (t * 2.0 * std::f32::consts::PI * 220.0).sin() * (t * 1.3).sin()
                + 0.1 * (t * 2.0 * std::f32::consts::PI * 570.0).sin()
        })
        .collect()
}

pub fn read_f32_tensor(path: PathBuf, name: &str) -> Vec<f32> {
    testkit::TensorFile::open(path).f32(name).0
}

pub fn read_i64_tensor(path: PathBuf, name: &str) -> (Vec<i64>, Vec<usize>) {
    testkit::TensorFile::open(path).i64(name)
}

/// An empty event for `mn_stt_pull`, as a C caller makes one: zeroed, its `struct_size` set.
pub fn new_event() -> MnSttEvent {
    // SAFETY: every field of the C struct (integers, floats, raw pointers) is valid as zeros.
    let mut ev: MnSttEvent = unsafe { std::mem::zeroed() };
    ev.struct_size = std::mem::size_of::<MnSttEvent>() as u32;
    ev
}
