//! MLX quantized triplets (`.weight` u32 + `.scales` + `.biases`): validation and matrix construction.
//! Seeded with the MLX q4/q8 fixtures so the fuzzer starts from valid triplets.
#![no_main]
use libfuzzer_sys::fuzz_target;
use model::checkpoint::Component;
use model::weights::{OpenOptions, Weights};

fuzz_target!(|data: &[u8]| {
    // The first byte picks the (bits, group) hint: none, or one of the four MLX layouts.
    let Some((&sel, rest)) = data.split_first() else { return };
    let mut opts = OpenOptions::new(Component::Lm);
    opts.mlx_bits_group = match sel % 5 {
        0 => None,
        1 => Some((4, 32)),
        2 => Some((4, 64)),
        3 => Some((8, 32)),
        _ => Some((8, 64)),
    };
    if let Ok(w) = Weights::from_bytes("fuzz.mlx.safetensors", rest.to_vec(), &opts) {
        let names: Vec<String> = w.names().map(str::to_owned).collect();
        for n in names.iter().take(16) {
            if let Ok(m) = w.matrix(n) {
                let mut row = vec![0f32; m.cols()];
                if m.rows() > 0 {
                    m.row_f32(0, &mut row);
                }
            }
        }
    }
});
