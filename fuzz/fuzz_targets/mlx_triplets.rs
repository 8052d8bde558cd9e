//! MLX quantized triplets (`.weight` u32 + `.scales` + `.biases`): validation and matrix construction.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| moshi_native_fuzz::mlx_triplets(data));
