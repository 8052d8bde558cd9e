//! Shared by the GPU tests: a device on any adapter (lavapipe here), or a printed skip.
#![allow(dead_code)]

use gpu::{AdapterChoice, GpuContext, GpuOptions};

/// A context on the best adapter of any type, or `None` (printed) when there is none; with
/// `MOSHI_REQUIRE_GPU=1` a missing adapter fails the test instead.
pub fn context_with(opts: GpuOptions) -> Option<GpuContext> {
    match GpuContext::new(AdapterChoice::Gpu(None), opts) {
        Ok(c) => {
            eprintln!("GPU tests on {}", c.adapter());
            Some(c)
        }
        Err(e) if gpu::gpu_required() => panic!("MOSHI_REQUIRE_GPU=1 but no usable adapter: {e}"),
        Err(e) => {
            eprintln!("skipping GPU test: {e}");
            None
        }
    }
}

/// [`context_with`] with default options.
pub fn context() -> Option<GpuContext> {
    context_with(GpuOptions::default())
}

/// Deterministic values in about [-1, 1] (xorshift), for weights and activations.
pub fn values(seed: u64, n: usize) -> Vec<f32> {
    testkit::rng::values(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15), n)
}
