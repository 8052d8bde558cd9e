//! `MnEngine`: a loaded model (LM + Mimi + tokenizer), shared by sessions.

use std::ffi::c_char;
use std::sync::Arc;

use kernels::attention::KvDtype;
use runtime::{Engine, EngineOptions};

use crate::handle::{Shell, ENGINE};
use crate::status::{
    boundary, bundle_dir_arg, check_size, non_null, read_options, write_default_options, COptions,
    Fail, MnStatus,
};

/// A loaded model: the resident weights of one bundle, shared by any number of sessions.
///
/// Created by `mn_engine_open`, released by `mn_engine_destroy`. Sessions keep the weights alive: an
/// engine may be destroyed while its sessions run.
pub struct MnEngine {
    _opaque: [u8; 0],
}

pub(crate) type EngineShell = Shell<Arc<Engine>>;

/// `MnEngineOptions::kv_dtype`: f32 KV cache (exact; the default).
pub const MN_KV_DTYPE_F32: u32 = 0;
/// `MnEngineOptions::kv_dtype`: bfloat16 KV cache (half the memory).
pub const MN_KV_DTYPE_BF16: u32 = 1;

/// `MnEngineOptions::device`: the CPU (the default): `threads` threads per session.
pub const MN_DEVICE_CPU: u32 = 0;
/// `MnEngineOptions::device`: a GPU through wgpu (Vulkan, Metal, DX12): the LM and Mimi run on adapter
/// `gpu_adapter`, their weights uploaded once by `mn_engine_open`. No usable adapter (or a library built
/// without its `gpu` feature) makes `mn_engine_open` return `MN_STATUS_DEVICE`. The speech-to-text engine
/// (`mn_stt_engine_open`) runs on the CPU only and refuses it with `MN_STATUS_INVALID_ARGUMENT`.
pub const MN_DEVICE_GPU: u32 = 1;

/// Options of `mn_engine_open`. Initialise with `mn_engine_options_default`, then change fields.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct MnEngineOptions {
    /// `sizeof(MnEngineOptions)`; set by `mn_engine_options_default` (checks the header matches the library).
    pub struct_size: u32,
    /// Matrix-product threads per session (the calling thread plus `threads - 1` workers); >= 1. Default 1.
    pub threads: u32,
    /// `MN_KV_DTYPE_F32` (default) or `MN_KV_DTYPE_BF16`.
    pub kv_dtype: u32,
    /// Where sessions compute: `MN_DEVICE_CPU` (default) or `MN_DEVICE_GPU`; any other value is
    /// `MN_STATUS_INVALID_ARGUMENT`.
    pub device: u32,
    /// With `MN_DEVICE_GPU`: the adapter's index (as `moshi-native devices` numbers them), or -1 (default)
    /// for the best adapter of any type, software ones included. Not read on the CPU.
    pub gpu_adapter: i32,
}

impl COptions for MnEngineOptions {
    type Rust = EngineOptions;

    fn defaults() -> MnEngineOptions {
        let d = EngineOptions::default();
        MnEngineOptions {
            struct_size: std::mem::size_of::<MnEngineOptions>() as u32,
            threads: d.device.threads() as u32,
            kv_dtype: match d.kv_dtype {
                KvDtype::Bf16 => MN_KV_DTYPE_BF16,
                KvDtype::F32 => MN_KV_DTYPE_F32,
            },
            device: MN_DEVICE_CPU,
            gpu_adapter: -1,
        }
    }

    fn to_rust(self) -> Result<EngineOptions, Fail> {
        check_size(
            self.struct_size,
            std::mem::size_of::<MnEngineOptions>(),
            "MnEngineOptions",
        )?;
        let kv_dtype = match self.kv_dtype {
            MN_KV_DTYPE_F32 => KvDtype::F32,
            MN_KV_DTYPE_BF16 => KvDtype::Bf16,
            other => {
                return Err(Fail::new(
                    MnStatus::InvalidArgument,
                    format!("kv_dtype {other} (expected MN_KV_DTYPE_F32 or MN_KV_DTYPE_BF16)"),
                ))
            }
        };
        let threads = self.threads as usize;
        let device = match self.device {
            MN_DEVICE_CPU => runtime::Device::Cpu { threads },
            MN_DEVICE_GPU => runtime::Device::Gpu {
                adapter: match self.gpu_adapter {
                    -1 => None,
                    i if i >= 0 => Some(i as usize),
                    other => {
                        return Err(Fail::new(
                            MnStatus::InvalidArgument,
                            format!(
                            "gpu_adapter {other} (expected an adapter index, or -1 for the best)"
                        ),
                        ))
                    }
                },
                threads,
            },
            other => {
                return Err(Fail::new(
                    MnStatus::InvalidArgument,
                    format!("device {other} (expected MN_DEVICE_CPU or MN_DEVICE_GPU)"),
                ))
            }
        };
        Ok(EngineOptions { device, kv_dtype })
    }
}

/// Fills `*options` with the defaults (and its `struct_size`).
///
/// # Safety
/// `options` is NULL or points to writable memory of `sizeof(MnEngineOptions)` bytes.
#[no_mangle]
pub unsafe extern "C" fn mn_engine_options_default(options: *mut MnEngineOptions) -> MnStatus {
    // SAFETY: forwarded contract.
    unsafe { write_default_options(options) }
}

/// Opens a model: `bundle_dir` is a bundle directory (Kyutai `config.json` + LM weights + Mimi weights +
/// SentencePiece model), or NULL for the tiny random-weight demo model compiled into the library (written
/// once to a per-user cache folder; it does not speak). `options` may be NULL (defaults).
/// On success `*engine` is a new handle, owned by the caller (release with `mn_engine_destroy`).
///
/// # Safety
/// `bundle_dir` is NULL or a NUL-terminated UTF-8 path; `options` is NULL or valid for reads;
/// `engine` is NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn mn_engine_open(
    bundle_dir: *const c_char,
    options: *const MnEngineOptions,
    engine: *mut *mut MnEngine,
) -> MnStatus {
    let make = || {
        // SAFETY: forwarded contract.
        let opts = unsafe { read_options(options) }?;
        // SAFETY: forwarded contract.
        let dir = unsafe { bundle_dir_arg(bundle_dir, embed::demo::materialize) }?;
        Ok(((), Engine::open(&dir, opts)?))
    };
    // SAFETY: forwarded contract.
    unsafe { EngineShell::hand_out(engine, "engine", ENGINE, make) }
}

/// The engine behind a handle (an `Arc` clone; the engine's critical section is this clone only).
///
/// # Safety
/// `engine` is NULL or a handle from `mn_engine_open`.
pub(crate) unsafe fn engine_arc(engine: *const MnEngine) -> Result<Arc<Engine>, Fail> {
    // Concurrent users of one engine hold its flag for a clone only: wait for it rather than
    // reporting BUSY, which would make creating sessions from several threads fail at random.
    loop {
        // SAFETY: forwarded contract.
        match unsafe { EngineShell::enter(engine.cast(), ENGINE) } {
            Ok(mut e) => return Ok(e.state().clone()),
            Err(Fail(MnStatus::Busy, _)) => std::thread::yield_now(),
            Err(f) => return Err(f),
        }
    }
}

/// Writes where `engine`'s sessions compute to `*device`: `MN_DEVICE_CPU` or `MN_DEVICE_GPU` (what the
/// engine runs on, as opened: a caller can log it, or check that a GPU it asked for is in use).
///
/// # Safety
/// `engine` is NULL or a handle from `mn_engine_open`; `device` is NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn mn_engine_device(engine: *const MnEngine, device: *mut u32) -> MnStatus {
    boundary(|| {
        non_null(device, "device")?;
        // SAFETY: forwarded contract.
        let e = unsafe { engine_arc(engine) }?;
        let d = match e.gpu_adapter() {
            Some(_) => MN_DEVICE_GPU,
            None => MN_DEVICE_CPU,
        };
        // SAFETY: not NULL, writable by the caller's contract.
        unsafe { device.write(d) };
        Ok(MnStatus::Ok)
    })
}

/// Destroys an engine handle. Sessions created from it keep working; the weights are freed with the last
/// of them. Afterwards every call with this handle returns `MN_STATUS_DESTROYED`.
///
/// # Safety
/// `engine` is NULL or a handle from `mn_engine_open`.
#[no_mangle]
pub unsafe extern "C" fn mn_engine_destroy(engine: *mut MnEngine) -> MnStatus {
    boundary(|| {
        // SAFETY: forwarded contract.
        unsafe { EngineShell::destroy(engine.cast(), ENGINE) }?;
        Ok(MnStatus::Ok)
    })
}
