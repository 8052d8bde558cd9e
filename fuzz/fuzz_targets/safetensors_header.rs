//! safetensors: header parsing, then the full open path (layout detection, name mapping, schema).
#![no_main]
use libfuzzer_sys::fuzz_target;
use model::checkpoint::Component;
use model::weights::{OpenOptions, Weights};

fuzz_target!(|data: &[u8]| {
    let _ = model::checkpoint::safetensors::parse(data);
    for c in [Component::Lm, Component::Mimi] {
        if let Ok(w) = Weights::from_bytes("fuzz.safetensors", data.to_vec(), &OpenOptions::new(c)) {
            let names: Vec<String> = w.names().map(str::to_owned).collect();
            for n in names.iter().take(8) {
                let _ = w.f32(n);
            }
        }
    }
});
