//! SentencePiece `.model` protobuf reader, then encode/decode with whatever model it accepted.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| moshi_native_fuzz::spm_model(data));
