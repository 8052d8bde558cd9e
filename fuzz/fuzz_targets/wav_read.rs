//! WAV reading: the permissive reader (any format, downmix, resample to 24 kHz) and the strict one.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = runtime::audio::read_wav_from(std::io::Cursor::new(data));
    let _ = runtime::audio::read_wav_strict_from(std::io::Cursor::new(data));
});
