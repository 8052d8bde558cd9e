//! The server's Ogg/Opus input path, fed in arbitrary chunks as WebSocket messages would arrive.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| moshi_native_fuzz::ogg_opus_input(data));
