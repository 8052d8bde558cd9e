//! Benchmarks of moshi-native, kept out of the product crates: synthetic weights at any size and the
//! drivers of `moshi-native bench`.
//!
//! * [`synth`]: bundles of random weights in every released layout, streamed to disk (`moshi-native
//!   synth`, and tests that need a bundle in a given format).
//! * [`lm`]: [`lm::SyntheticSource`], random LM weights in memory at any dimensions and format.
//! * [`mimi`]: synthetic Mimi weights at the released size, a test signal, and frame timers.
//! * `drivers` (feature `drivers`): `moshi-native bench` itself — the flags, the CPU, batch and GPU
//!   benchmarks. The CLI links them; the model's tests use the rest without the runtime or wgpu.
//!
//! The kernel benchmarks stay in `kernels::bench` (feature `bench` of `moshi-kernels`): they reach the
//! kernels' private per-instruction-set tables, which no other crate sees.

pub mod lm;
pub mod mimi;
pub mod synth;

#[cfg(feature = "drivers")]
pub mod drivers;
