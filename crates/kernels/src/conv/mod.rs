//! 1-D convolutions (`Conv1d`, `ConvTranspose1d`) over `[channels, time]` f32 buffers,
//! computed as a blocked GEMM (weights packed at construction, input gathered per
//! panel, no im2col buffer). Grouped transposed convolutions (Mimi's depthwise
//! upsampler) use a direct loop. `forward_reference` is the plain scalar definition.
//!
//! Micro-kernels come from the kernel table: scalar (reference), AVX2+FMA (6×16 blocks) and
//! AVX-512F (24×16 / 12×32 blocks). All run the same FMA chain per output, so their results
//! are bitwise equal; `forward_kernel` names a [`crate::KernelSet`] explicitly for tests and A/B
//! benchmarks. On a pool, wide
//! outputs are split by column panels (each share gathers its own input panels), narrow
//! ones by row panels with the input gathered once and shared.
//!
//! The files by job: [`Conv1d`] in `conv1d.rs`, [`ConvTranspose1d`] in `transpose.rs`, the checks
//! and entry points both share in `entry.rs`, the thread-local scratch and [`Workspace`] in
//! `scratch.rs`, and the ways a call is cut into shares for a pool in `par.rs`.

mod conv1d;
mod entry;
mod par;
mod scratch;
mod transpose;

pub use conv1d::Conv1d;
pub use scratch::Workspace;
pub use transpose::ConvTranspose1d;
