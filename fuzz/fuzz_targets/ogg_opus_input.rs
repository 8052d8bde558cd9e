//! The server's Ogg/Opus input path, fed in arbitrary chunks as WebSocket messages would arrive.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(mut dec) = server::codec::OggOpusDecoder::new() else { return };
    let mut out = Vec::new();
    // Split at a data-derived point so page boundaries fall anywhere.
    let cut = data.first().map(|&b| b as usize % (data.len() + 1)).unwrap_or(0);
    dec.push(&data[..cut], &mut out);
    dec.push(&data[cut..], &mut out);
    assert!(out.iter().all(|x| x.is_finite()), "decoder produced non-finite samples");
});
