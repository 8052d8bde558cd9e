//! WAV reading: the permissive reader (any format, downmix, resample to 24 kHz) and the strict one.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| moshi_native_fuzz::wav_read(data));
