//! GGUF: header parsing (KV pairs, tensor infos, alignment), then the full open path.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| moshi_native_fuzz::gguf_header(data));
