//! Status codes, the thread-local last error, and the panic boundary.

use std::cell::RefCell;
use std::ffi::{c_char, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

/// The result of every call: `>= 0` success, `< 0` error (message in `mn_last_error()`).
#[repr(i32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MnStatus {
    /// Success.
    Ok = 0,
    /// `mn_session_pull`, `mn_stt_pull`: no whole input frame is queued (and, for `mn_stt_pull`, no event
    /// waits); push more PCM.
    NoFrame = 1,
    /// `mn_session_pull`: the session is paused (input queues up, nothing is computed).
    Paused = 2,
    /// `mn_session_pull`: the session stopped (`mn_session_stop`, or `max_steps` reached).
    Stopped = 3,
    /// A required pointer argument (handle, buffer, out-parameter) is NULL.
    Null = -1,
    /// An argument is out of range (sizes, options, a non-UTF-8 path).
    InvalidArgument = -2,
    /// A caller buffer is smaller than the call needs.
    BufferTooSmall = -3,
    /// The handle was destroyed.
    Destroyed = -4,
    /// The handle is in use by another thread.
    Busy = -5,
    /// The handle is not of the kind the function takes, or does not come from this library.
    InvalidHandle = -6,
    /// A file or folder does not exist or cannot be read.
    Io = -7,
    /// The model files were refused (format, shapes, configuration).
    Model = -8,
    /// The runtime refused the operation or failed while computing (message says which).
    Runtime = -9,
    /// A panic inside the library was caught; the handle involved is poisoned (destroy it).
    Panic = -10,
    /// The handle is poisoned by an earlier panic; only its destroy function works.
    Poisoned = -11,
    /// The compute device cannot be used: no GPU adapter (or not the one asked for), a library built
    /// without GPU support, a size the device refuses, or the device failed while computing a frame
    /// (message says which).
    Device = -12,
}

/// An error on its way to the caller: a status and its message.
pub(crate) struct Fail(pub MnStatus, pub String);

impl Fail {
    pub fn new(status: MnStatus, msg: impl Into<String>) -> Fail {
        Fail(status, msg.into())
    }
}

/// The status of a runtime error. A failure of the compute device, opening it or inside a frame (a GPU
/// error in the LM or the codec, `RuntimeError::is_device`), is `MN_STATUS_DEVICE`; the model's own
/// failures (building, stepping the LM or the codec, the speech-to-text step, the output resampler) are
/// `MN_STATUS_MODEL`; a batched failure has the status of the error it shares.
fn status_of(e: &runtime::RuntimeError) -> MnStatus {
    use runtime::RuntimeError as E;
    match e {
        e if e.is_device() => MnStatus::Device,
        E::InvalidOption(_) => MnStatus::InvalidArgument,
        E::Model(_) | E::Lm(_) | E::Codec(_) | E::Stt(_) | E::Resample(_) => MnStatus::Model,
        E::Batch(shared) => status_of(shared),
        _ => MnStatus::Runtime,
    }
}

impl From<runtime::RuntimeError> for Fail {
    fn from(e: runtime::RuntimeError) -> Fail {
        Fail(status_of(&e), e.message())
    }
}

impl From<embed::EmbedError> for Fail {
    fn from(e: embed::EmbedError) -> Fail {
        let status = match e {
            embed::EmbedError::Io { .. } | embed::EmbedError::NotFound(_) => MnStatus::Io,
            embed::EmbedError::Config { .. } | embed::EmbedError::Model { .. } => MnStatus::Model,
        };
        Fail(status, e.to_string())
    }
}

impl From<model::mimi::MimiError> for Fail {
    fn from(e: model::mimi::MimiError) -> Fail {
        Fail(MnStatus::InvalidArgument, e.to_string())
    }
}

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

fn set_last_error(msg: &str) {
    // Interior NULs would truncate the message in C; replace them.
    let c = CString::new(msg.replace('\0', " ")).unwrap_or_default();
    LAST_ERROR.with(|e| *e.borrow_mut() = c);
}

/// The message of the last error on the calling thread, as NUL-terminated UTF-8 ("" if none yet).
///
/// The string is owned by the library and stays valid until the next call on this thread that fails;
/// successful calls leave it untouched. Never NULL.
#[no_mangle]
pub extern "C" fn mn_last_error() -> *const c_char {
    LAST_ERROR.with(|e| e.borrow().as_ptr())
}

/// Runs an entry point's body: a `Fail` or a panic becomes a negative status with its message.
pub(crate) fn boundary(body: impl FnOnce() -> Result<MnStatus, Fail>) -> MnStatus {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(status)) => status,
        Ok(Err(Fail(status, msg))) => {
            set_last_error(&msg);
            status
        }
        Err(payload) => {
            let what = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            set_last_error(&format!("internal panic caught at the C boundary: {what}"));
            MnStatus::Panic
        }
    }
}

/// Checks an out-parameter or input pointer is not NULL.
pub(crate) fn non_null<T>(p: *const T, what: &str) -> Result<(), Fail> {
    if p.is_null() {
        Err(Fail::new(MnStatus::Null, format!("{what} is NULL")))
    } else {
        Ok(())
    }
}

/// A NUL-terminated UTF-8 path argument.
///
/// # Safety
/// `p` is NULL or points to a NUL-terminated string that stays valid during the call.
pub(crate) unsafe fn path_arg<'a>(
    p: *const c_char,
    what: &str,
) -> Result<&'a std::path::Path, Fail> {
    non_null(p, what)?;
    // SAFETY: not NULL, NUL-terminated by the caller's contract.
    let s = unsafe { std::ffi::CStr::from_ptr(p) };
    s.to_str()
        .map(std::path::Path::new)
        .map_err(|_| Fail::new(MnStatus::InvalidArgument, format!("{what} is not UTF-8")))
}

/// The bundle directory a `bundle_dir` argument names; when it is NULL, the one `demo` writes (the demo
/// model compiled into the library).
///
/// # Safety
/// As [`path_arg`].
pub(crate) unsafe fn bundle_dir_arg(
    bundle_dir: *const c_char,
    demo: fn() -> Result<std::path::PathBuf, embed::EmbedError>,
) -> Result<std::path::PathBuf, Fail> {
    if bundle_dir.is_null() {
        Ok(demo()?)
    } else {
        // SAFETY: forwarded contract.
        Ok(unsafe { path_arg(bundle_dir, "bundle_dir") }?.to_path_buf())
    }
}

/// An options struct of the C API: its defaults and the checked conversion to the Rust options it
/// stands for.
pub(crate) trait COptions: Copy {
    /// The Rust options.
    type Rust;
    /// The defaults, `struct_size` set.
    fn defaults() -> Self;
    /// The Rust options (the `struct_size` checked first).
    fn to_rust(self) -> Result<Self::Rust, Fail>;
}

/// Fills `*options` with the defaults (the `*_options_default` calls).
///
/// # Safety
/// `options` is NULL or points to writable memory of `sizeof(T)` bytes.
pub(crate) unsafe fn write_default_options<T: COptions>(options: *mut T) -> MnStatus {
    boundary(|| {
        non_null(options, "options")?;
        // SAFETY: not NULL, writable by the caller's contract.
        unsafe { options.write(T::defaults()) };
        Ok(MnStatus::Ok)
    })
}

/// The Rust options `options` stands for; the defaults' when it is NULL.
///
/// # Safety
/// `options` is NULL or readable.
pub(crate) unsafe fn read_options<T: COptions>(options: *const T) -> Result<T::Rust, Fail> {
    if options.is_null() {
        T::defaults()
    } else {
        // SAFETY: readable by the caller's contract; plain old data.
        unsafe { options.read() }
    }
    .to_rust()
}

/// Checks the `struct_size` field of an options / output struct against this library's layout.
pub(crate) fn check_size(got: u32, want: usize, what: &str) -> Result<(), Fail> {
    if got as usize == want {
        Ok(())
    } else {
        Err(Fail::new(
            MnStatus::InvalidArgument,
            format!("{what}.struct_size is {got}, this library's is {want} (initialise it with the matching *_default function)"),
        ))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use model::lm::LmError;
    use model::mimi::MimiError;
    use runtime::RuntimeError;

    use super::*;

    fn lost() -> Box<dyn std::error::Error + Send + Sync> {
        Box::new(std::io::Error::other("device lost (injected)"))
    }

    #[test]
    fn a_gpu_failure_mid_frame_is_a_device_status_with_the_device_message() {
        let lm = || RuntimeError::Lm(LmError::Backend(lost()));
        for e in [
            lm(),
            RuntimeError::Codec(MimiError::Backend(lost())),
            RuntimeError::Batch(Arc::new(lm())),
        ] {
            let Fail(status, msg) = Fail::from(e);
            assert_eq!(
                (status, msg.as_str()),
                (MnStatus::Device, "device lost (injected)")
            );
        }
        let Fail(status, msg) = Fail::from(RuntimeError::Device(lost()));
        assert_eq!(
            (status, msg.as_str()),
            (MnStatus::Device, "device: device lost (injected)")
        );
        // The model's own failures keep their status.
        let Fail(status, _) = Fail::from(RuntimeError::Lm(LmError::Config("bad".into())));
        assert_eq!(status, MnStatus::Model);
    }
}
