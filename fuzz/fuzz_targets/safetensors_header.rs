//! safetensors: header parsing, then the full open path (layout detection, name mapping, schema).
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| moshi_native_fuzz::safetensors_header(data));
