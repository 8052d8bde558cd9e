//! Released Mimi dimensions (512-d, 8 layers, 2048 × 256 codebooks, context 250) with synthetic
//! weights: shapes load, streaming equals non-streaming while the KV ring does not limit the
//! window, outputs are finite and codes in range.

use model::mimi::{bench, MimiDecoder, MimiEncoder};

#[test]
fn released_dims_stream_equals_batch() {
    let mimi = bench::synthetic_mimi(8, 7).unwrap();
    assert_eq!(mimi.frame_size(), 1920);
    let frames = 3;
    let pcm = bench::test_signal(frames * 1920, 24000);
    let mut enc = MimiEncoder::new(mimi.clone());
    let mut dec = MimiDecoder::new(mimi.clone());
    let nq = mimi.n_codebooks();
    let mut codes = vec![0u32; nq * frames];
    let mut out = vec![0.0f32; frames * 1920];
    for f in 0..frames {
        let c = enc
            .encode_frame(&pcm[f * 1920..(f + 1) * 1920])
            .unwrap()
            .to_vec();
        for q in 0..nq {
            assert!(c[q] < 2048);
            codes[q * frames + f] = c[q];
        }
        dec.decode_frame(&c, &mut out[f * 1920..(f + 1) * 1920])
            .unwrap();
    }
    assert!(out.iter().all(|v| v.is_finite()));
    assert!(
        out.iter().any(|v| v.abs() > 1e-6),
        "decoder output is all zeros"
    );
    assert_eq!(mimi.encode(&pcm), codes);
    let batch = mimi.decode(&codes, frames).unwrap();
    let err = batch
        .iter()
        .zip(&out)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f32::max);
    let scale = out.iter().map(|v| v.abs()).fold(0.0, f32::max);
    assert!(
        err <= 1e-4 * scale.max(1.0),
        "stream vs batch {err} (scale {scale})"
    );
}
