//! Bodies of the fuzz targets, shared by `cargo fuzz` (`fuzz_targets/*.rs`) and by the workspace's
//! mutation smoke test (`crates/cli/tests/fuzz_smoke.rs`), which runs every body on the committed
//! fixtures and on deterministic mutations of them in every CI run. A body must never panic.
//! (Both crates name the product libraries `model`, `runtime` and `server`.)

use model::checkpoint::Component;
use model::checkpoint::{OpenOptions, Weights};

/// safetensors: header parsing, then the full open path (layout detection, name mapping).
pub fn safetensors_header(data: &[u8]) {
    let _ = model::checkpoint::safetensors::parse(data);
    for c in [Component::Lm, Component::Mimi] {
        if let Ok(w) = Weights::from_bytes("fuzz.safetensors", data.to_vec(), &OpenOptions::new(c))
        {
            let names: Vec<String> = w.names().map(str::to_owned).collect();
            for n in names.iter().take(8) {
                let _ = w.f32(n);
            }
        }
    }
}

/// GGUF: header parsing (KV pairs, tensor infos, alignment), then the full open path.
pub fn gguf_header(data: &[u8]) {
    let _ = model::checkpoint::gguf::parse(data);
    if let Ok(w) = Weights::from_bytes("fuzz.gguf", data.to_vec(), &OpenOptions::new(Component::Lm))
    {
        let names: Vec<String> = w.names().map(str::to_owned).collect();
        for n in names.iter().take(8) {
            let _ = w.matrix(n);
        }
    }
}

/// MLX quantized triplets (`.weight` u32 + `.scales` + `.biases`): validation and matrix construction.
/// The first byte picks the (bits, group) hint: none, or one of the four MLX layouts.
pub fn mlx_triplets(data: &[u8]) {
    let Some((&sel, rest)) = data.split_first() else {
        return;
    };
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
}

/// SentencePiece `.model` protobuf reader, then encode/decode with whatever model it accepted.
pub fn spm_model(data: &[u8]) {
    if let Ok(sp) = model::text::SentencePiece::from_bytes(data) {
        let ids = sp.encode("Hello wörld 你好 🙂 <0x41> ▁▁");
        let _ = sp.decode(&ids);
        let n = sp.vocab_size().min(64) as u32;
        let all: Vec<u32> = (0..n).collect();
        let _ = sp.decode(&all);
    }
}

/// WAV reading: the permissive reader (any format, downmix, resample to 24 kHz) and the strict one.
pub fn wav_read(data: &[u8]) {
    let _ = runtime::audio::read_wav_from(std::io::Cursor::new(data));
    let _ = runtime::audio::read_wav_strict_from(std::io::Cursor::new(data));
}

/// The server's Ogg/Opus input path, fed in two chunks split at a data-derived point.
pub fn ogg_opus_input(data: &[u8]) {
    let Ok(mut dec) = server::codec::OggOpusDecoder::new() else {
        return;
    };
    let mut out = Vec::new();
    let cut = data
        .first()
        .map(|&b| b as usize % (data.len() + 1))
        .unwrap_or(0);
    dec.push(&data[..cut], &mut out);
    dec.push(&data[cut..], &mut out);
    assert!(
        out.iter().all(|x| x.is_finite()),
        "decoder produced non-finite samples"
    );
}

/// WebSocket binary message parsing and the `/api/chat` query-string validation.
pub fn ws_message(data: &[u8]) {
    let _ = server::protocol::parse_client_message(data);
    if let Ok(q) = std::str::from_utf8(data) {
        let _ = server::protocol::SessionParams::from_query(Some(q));
        let _ = server::protocol::percent_decode(q);
    }
}
