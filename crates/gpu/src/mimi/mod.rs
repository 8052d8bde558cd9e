//! Mimi on the device: [`GpuMimiWeights`] (every codec weight, uploaded once per engine, and the
//! compiled kernels) and [`GpuMimi`] (the streaming state of a set of conversation slots and the
//! recorded launches of a call over them; a [`CodecBackend`](model::mimi::CodecBackend), one slot
//! for a session).
//!
//! Every kernel has a slot dimension, so a call launches each kernel once for all the slots it
//! lists, in any order, and reads each weight once per call (the arithmetic is in `shaders`'
//! docs). The files, by job: `weights` (upload), `record` (the launches of a frame, built once),
//! `streams` (the per-slot state and the recording of the model's plan, `model::mimi::MimiPlan`),
//! `codec` (the calls), `shaders` with `wgsl_conv` and `wgsl_codec` (the kernels), `testing` (the kernel tests' entry
//! points).
//!
//! A call is one submission: the decoder takes the listed slots' codes (a `Queue::write_buffer`
//! of `n_codebooks` words per slot) and returns their PCM through one mapped readback buffer; the
//! encoder takes the PCM and returns the codes. Every buffer and bind group is created by
//! [`GpuMimi::new`]; the streaming state (convolution histories, transposed-convolution tails,
//! the transformers' K/V rings, positions) stays in device memory.
//!
//! **Exact codes.** The split-RVQ search runs on the device in f32 and carries a rigorous bound
//! on its own rounding error (see [`MimiKernel::RvqScore`] and [`MimiKernel::RvqPick`]): a level's code is proven when no
//! other centroid's lower bound reaches the winner's upper bound, and then it is the argmin of
//! the exactly evaluated distance, the same code the CPU's f64 decision gives for the same
//! latent. When a level cannot be proven (a near-tie within ~1e-5 relative), the frame's two
//! projected latents (still in device memory) are read back and the host decides every level
//! with the CPU's exact f64 search ([`Mimi::rvq_codes_exact`](model::mimi::Mimi::rvq_codes_exact)).

mod codec;
mod record;
mod shaders;
mod streams;
mod testing;
mod weights;
mod wgsl_codec;
mod wgsl_conv;

pub use codec::GpuMimi;
pub use shaders::MimiKernel;
#[doc(hidden)]
pub use testing::TestConvOut;
pub use weights::GpuMimiWeights;

use model::mimi::MimiError;

use crate::context::GpuContext;
use crate::GpuError;

/// A GPU failure inside the codec stays a [`GpuError`] (boxed: `model` cannot name this crate).
impl From<GpuError> for MimiError {
    fn from(e: GpuError) -> Self {
        MimiError::Backend(Box::new(e))
    }
}

/// Counter words (`u32` each) of one slot's region of the counter buffer: the decoder's
/// transformer position, the encoder's, and the encoder's frames seen.
const DEC_POS: u32 = 0;
const ENC_POS: u32 = 2;
const ENC_FRAMES: u32 = 3;
const COUNTERS: usize = 4;

/// Longest attention head the attention kernel holds (its private accumulator).
const MAX_HEAD_DIM: usize = 128;

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn storage_usage() -> wgpu::BufferUsages {
    wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST | wgpu::BufferUsages::COPY_SRC
}

/// Refuses a code at or above the codebook size `bins`.
fn check_code_range(codes: &[u32], bins: usize) -> Result<(), MimiError> {
    match codes.iter().find(|&&c| c as usize >= bins) {
        Some(bad) => Err(MimiError::Input(format!(
            "code {bad} out of range (codebook size {bins})"
        ))),
        None => Ok(()),
    }
}

pub(crate) fn bytes_of_f32(v: &[f32]) -> &[u8] {
    // SAFETY: f32 has no padding and any byte is a valid u8; the length covers exactly `v`.
    unsafe { std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), std::mem::size_of_val(v)) }
}

/// Maps `rb`'s first `out.len()` words into `out` (as raw bits).
fn read_words(ctx: &GpuContext, rb: &wgpu::Buffer, out: &mut [u32]) -> Result<(), GpuError> {
    crate::context::read_mapped_as(ctx, rb, out, u32::from_le_bytes)
}
