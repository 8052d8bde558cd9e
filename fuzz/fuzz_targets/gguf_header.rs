//! GGUF: header parsing (KV pairs, tensor infos, alignment), then the full open path.
#![no_main]
use libfuzzer_sys::fuzz_target;
use model::checkpoint::Component;
use model::weights::{OpenOptions, Weights};

fuzz_target!(|data: &[u8]| {
    let _ = model::checkpoint::gguf::parse(data);
    if let Ok(w) = Weights::from_bytes("fuzz.gguf", data.to_vec(), &OpenOptions::new(Component::Lm)) {
        let names: Vec<String> = w.names().map(str::to_owned).collect();
        for n in names.iter().take(8) {
            let _ = w.matrix(n);
        }
    }
});
