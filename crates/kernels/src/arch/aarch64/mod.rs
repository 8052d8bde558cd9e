//! aarch64 NEON kernels.
