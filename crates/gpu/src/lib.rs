//! The GPU backend of moshi-native, on wgpu (Vulkan, Metal, DX12) with WGSL kernels.
//!
//! * [`adapters`] lists the adapters wgpu finds; [`AdapterChoice`] picks one ([`choose_adapter`]):
//!   `Auto` takes a discrete or integrated GPU and nothing else (a software rasterizer such as
//!   Mesa's lavapipe, a CPU-type adapter, is slower than the CPU backend), `Gpu(None)` the best
//!   adapter of any type (lavapipe included: that is how the tests run without a GPU), `Gpu(Some(i))`
//!   adapter `i` of the list.
//! * [`GpuContext`] is one device and queue with the compiled kernels; [`GpuMatrix`] a weight matrix
//!   uploaded in its checkpoint format ([`kernels::CheckpointParts`]) and dequantized in the shader,
//!   split by rows across bindings when it exceeds the device's binding size.
//! * [`GpuLmWeights`] is a whole LM on the device (shared by the backends of one engine) and
//!   [`GpuLm`] implements [`model::lm::LmBackend`]: temporal transformer, text head and Depformer
//!   with their KV rings in device memory; the logits come back through a readback ring.
//! * [`sample`] is token sampling in WGSL: [`GpuLm`]'s sampled step runs a whole frame (temporal
//!   transformer, text head, text sampling, each Depformer step sampling its code) in one
//!   submission and reads back only the tokens and the random generators' states. The device
//!   continues the host sampler's own streams; [`sample`]'s docs say exactly how its draws relate
//!   to the host's. [`BandwidthProbe`] is a copy kernel, the roofline of the GPU benchmarks.
//! * [`GpuMimiWeights`] is the Mimi codec on the device and [`GpuMimi`] implements
//!   [`model::mimi::CodecBackend`]: the encoders and decoders of a set of slots (one for a
//!   session, every slot of a batch driver) with their streaming state in device memory, one
//!   submission per call for all listed slots, each kernel launched once for all of them (a slot
//!   dimension in every Mimi kernel); only PCM and codes cross the bus.
//!
//! * [`GpuDuplexBatch`] is the whole duplex frame of up to eight conversation slots in one
//!   submission per tick: Mimi encode of the listed slots, one LM step over their rows each reading
//!   its input from its own delay ring in device memory, sampling, Mimi decode, one readback,
//!   waited for by its own submission index, each kernel launched once for all listed slots (the
//!   runtime's sessions, a batch of one, and its batch drivers use it on the GPU). [`GpuDuplex`]
//!   is one conversation's frame: a batch of one slot.
//!
//! Every buffer and bind group is created at load ([`GpuContext::buffers_created`] counts them); a
//! step records one command buffer (wgpu creates command encoders per submission by design),
//! writes its tokens with `Queue::write_buffer` and maps one readback buffer of a fixed ring.

mod bindings;
mod context;
mod dispatch;
mod duplex;
mod duplex_batch;
mod lm;
mod matrix;
mod mimi;
mod probe;
pub mod profile;
pub mod sample;
pub mod shaders;
mod uniforms;

pub use context::{adapters, choose_adapter, AdapterChoice, AdapterDesc, GpuContext, GpuOptions};
pub use duplex::GpuDuplex;
pub use duplex_batch::GpuDuplexBatch;
pub use lm::{AttentionRow, AttentionShape, GpuAttention, GpuLm, GpuLmOptions, GpuLmWeights};
pub use matrix::GpuMatrix;
pub use mimi::{GpuMimi, GpuMimiWeights, MimiKernel, TestConvOut};
pub use probe::BandwidthProbe;
pub use profile::{HostPhases, KernelProfile, ProfileMode, ProfileReport};
pub use sample::GpuSampler;

use kernels::WeightFormat;

/// The shader family of a [`WeightFormat`]: one compiled kernel per value. The same concept as
/// the format, less what a kernel takes at run time: the MLX affine group size (a uniform), so
/// `MlxAffine { bits: 4, group: 32 }` and `{ bits: 4, group: 64 }` share [`WeightKind::Mlx4`].
/// A matrix keeps its full format ([`GpuMatrix::format`]); this is only the pipeline key, and it
/// is `Hash` where the format is not.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WeightKind {
    /// f32.
    F32,
    /// IEEE half.
    F16,
    /// bfloat16.
    Bf16,
    /// GGUF Q8_0.
    Q8_0,
    /// GGUF Q4_0.
    Q4_0,
    /// MLX affine 4-bit (any group that is a multiple of 32).
    Mlx4,
    /// MLX affine 8-bit.
    Mlx8,
}

impl WeightKind {
    /// Every kind.
    pub const ALL: [WeightKind; 7] = [
        WeightKind::F32,
        WeightKind::F16,
        WeightKind::Bf16,
        WeightKind::Q8_0,
        WeightKind::Q4_0,
        WeightKind::Mlx4,
        WeightKind::Mlx8,
    ];

    /// The shader family of a matrix format, or `None` for a format the kernels do not read.
    pub fn of(format: WeightFormat) -> Option<WeightKind> {
        Some(match format {
            WeightFormat::F32 => WeightKind::F32,
            WeightFormat::F16 => WeightKind::F16,
            WeightFormat::Bf16 => WeightKind::Bf16,
            WeightFormat::Q8_0 => WeightKind::Q8_0,
            WeightFormat::Q4_0 => WeightKind::Q4_0,
            WeightFormat::MlxAffine { bits: 4, .. } => WeightKind::Mlx4,
            WeightFormat::MlxAffine { bits: 8, .. } => WeightKind::Mlx8,
            WeightFormat::MlxAffine { .. } => return None,
        })
    }
}

/// Errors of the GPU backend, each with a hint for the user.
#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    /// No adapter matches the request.
    #[error("no GPU adapter: {reason} (hint: {hint})")]
    NoAdapter {
        /// What was looked for and what was found.
        reason: String,
        /// What to do about it.
        hint: &'static str,
    },
    /// The adapter refused to open a device.
    #[error("GPU adapter {adapter} refused a device: {message} (hint: update the GPU driver, or run with --device cpu)")]
    Device {
        /// Adapter name.
        adapter: String,
        /// wgpu's message.
        message: String,
    },
    /// A weight format or shape the kernels do not handle.
    #[error("weight format {format} is not supported on the GPU: {why} (hint: use a Q8_0, Q4_0, MLX 4/8-bit, bf16, f16 or f32 checkpoint, or --device cpu)")]
    Unsupported {
        /// The format.
        format: String,
        /// Why.
        why: String,
    },
    /// The model (or one of its buffers) does not fit the device.
    #[error("{what} does not fit on the GPU: {needed} bytes needed, {available} bytes available (hint: a smaller quantization such as q4, fewer batch rows, a shorter context, or --device cpu)")]
    DoesNotFit {
        /// Which allocation.
        what: String,
        /// Bytes needed.
        needed: u64,
        /// Bytes the device offers for it.
        available: u64,
    },
    /// The device reported an error while running (validation, lost device, out of memory).
    #[error("GPU error: {0}")]
    Runtime(String),
    /// A weight could not be read from its source (missing tensor, wrong shape, bad bytes).
    #[error("the LM weights could not be read: {0}")]
    Weights(#[from] model::lm::LmError),
}

/// A GPU failure inside the LM stays a [`GpuError`] (boxed: `model` cannot name this crate), so the
/// runtime's caller can downcast it.
impl From<GpuError> for model::lm::LmError {
    fn from(e: GpuError) -> Self {
        model::lm::LmError::Backend(Box::new(e))
    }
}

/// Whether GPU tests must run: `MOSHI_REQUIRE_GPU=1` (CI sets it) turns a missing adapter into a
/// failure instead of a skip.
pub fn gpu_required() -> bool {
    std::env::var("MOSHI_REQUIRE_GPU").is_ok_and(|v| v == "1")
}

/// For tests that need an adapter: `true` (after printing why) when wgpu finds none and a GPU is not
/// required, so the caller returns early; panics, failing the test, when `MOSHI_REQUIRE_GPU=1` asks for
/// one and there is none (CI sets it, so a missing driver cannot pass as a skip there). Test scaffolding:
/// only with the `testing` feature, which the other crates' dev-dependencies turn on.
#[cfg(feature = "testing")]
pub fn skip_test_without_adapter() -> bool {
    if !adapters().is_empty() {
        return false;
    }
    assert!(
        !gpu_required(),
        "MOSHI_REQUIRE_GPU=1 but wgpu finds no adapter"
    );
    eprintln!("skipping: no GPU adapter");
    true
}
