//! SentencePiece `.model` protobuf reader, then encode/decode with whatever model it accepted.
#![no_main]
use libfuzzer_sys::fuzz_target;
use model::text::SentencePiece;

fuzz_target!(|data: &[u8]| {
    if let Ok(sp) = SentencePiece::from_bytes(data) {
        let ids = sp.encode("Hello wörld 你好 🙂 <0x41> ▁▁");
        let _ = sp.decode(&ids);
        let n = sp.vocab_size().min(64) as u32;
        let all: Vec<u32> = (0..n).collect();
        let _ = sp.decode(&all);
    }
});
