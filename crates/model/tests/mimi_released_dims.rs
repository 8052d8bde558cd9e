//! Released Mimi dimensions (512-d, 8 layers, 2048 × 256 codebooks, context 250) with synthetic
//! weights: shapes load, streaming equals non-streaming while the KV ring does not limit the
//! window, outputs are finite and codes in range.

use bench::mimi as bench;
use model::mimi::{MimiDecoder, MimiEncoder};

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
    assert_close_to_scale(&batch, &out, "stream vs batch");
}

/// The pooled paths (convolutions split by panels, per-channel pre-processing, matmuls by
/// rows, AVX-512 or not) give the codes of the single-thread path and PCM within float
/// summation-order noise, at released size where every threshold for splitting is crossed.
#[test]
fn released_dims_pool_equals_single_thread() {
    let mimi = bench::synthetic_mimi(8, 11).unwrap();
    let frames = 3;
    let pcm = bench::test_signal(frames * 1920, 24000);
    let pool = model::mimi::Pool::new(2);
    let run = |pool: Option<&model::mimi::Pool>| {
        let mut enc = MimiEncoder::new(mimi.clone());
        let mut dec = MimiDecoder::new(mimi.clone());
        let (mut codes, mut out) = (Vec::new(), vec![0.0f32; frames * 1920]);
        for f in 0..frames {
            let c = enc
                .encode_frame_with(&pcm[f * 1920..(f + 1) * 1920], pool, None)
                .unwrap()
                .to_vec();
            dec.decode_frame_with(&c, &mut out[f * 1920..(f + 1) * 1920], pool, None)
                .unwrap();
            codes.extend(c);
        }
        (codes, out)
    };
    let (c1, o1) = run(None);
    let (c2, o2) = run(Some(&pool));
    assert_eq!(c1, c2);
    assert_close_to_scale(&o2, &o1, "pool vs single");
}

/// Max |a − b| within 1e-4 of max(1, max |reference|).
fn assert_close_to_scale(got: &[f32], reference: &[f32], what: &str) {
    let err = testkit::compare::max_abs_diff(got, reference);
    let scale = reference.iter().map(|v| v.abs()).fold(0.0, f32::max);
    assert!(err <= 1e-4 * scale.max(1.0), "{what} {err} (scale {scale})");
}
