//! SIMD math kernels and a persistent worker pool for moshi-native.
//!
//! This crate knows nothing about Moshi: it provides matrix-vector products over
//! several weight formats, row-wise ops, convolutions and attention.
