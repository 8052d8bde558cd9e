//! A/B of the one-slot CPU codec path (issue 29 item 2), interleaved in one process at released
//! Mimi dimensions with synthetic weights: A is what a session's codec ran before the two codec
//! seams became one (`MimiEncoder` / `MimiDecoder` on the session's pool), B is today's
//! (`CpuMimi` of one slot through `dyn CodecBackend`). Each round times `frames` encode + decode
//! frames of each, in alternating order; both run the same streams of the same signal, and their
//! codes and samples are compared bit for bit.
//!
//! `cargo run --release -p moshi-bench --example codec_ab -- [frames] [rounds] [threads]`
use std::sync::Arc;
use std::time::Instant;

use model::mimi::{CodecBackend, CpuMimi, MimiDecoder, MimiEncoder, Pool};

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let frames: usize = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(10);
    let rounds: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(10);
    let threads: usize = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(2);
    let mimi = bench::mimi::synthetic_mimi(8, 42)?;
    let pool = Arc::new(Pool::new(threads));
    let (fs, nq) = (mimi.frame_size(), mimi.n_codebooks());
    let pcm = bench::mimi::test_signal((frames * rounds + 2) * fs, mimi.config().sample_rate);
    let (mut enc, mut dec) = (
        MimiEncoder::new(mimi.clone()),
        MimiDecoder::new(mimi.clone()),
    );
    let mut codec: Box<dyn CodecBackend> = Box::new(CpuMimi::new(mimi.clone(), 1, pool.clone()));
    let (mut out_a, mut out_b) = (vec![0.0f32; fs], vec![0.0f32; fs]);
    let (mut codes_a, mut codes_b) = (vec![0u32; nq], vec![0u32; nq]);
    let mut same = true;
    let mut a_frame =
        |f: usize, out: &mut [f32], codes: &mut [u32]| -> Result<f64, model::mimi::MimiError> {
            let x = &pcm[f * fs..(f + 1) * fs];
            let t = Instant::now();
            codes.copy_from_slice(enc.encode_frame_with(x, Some(&pool), None)?);
            dec.decode_frame_with(codes, out, Some(&pool), None)?;
            Ok(t.elapsed().as_secs_f64() * 1e3)
        };
    let pcm_b = pcm.clone();
    let mut b_frame =
        |f: usize, out: &mut [f32], codes: &mut [u32]| -> Result<f64, model::mimi::MimiError> {
            let x = &pcm_b[f * fs..(f + 1) * fs];
            let t = Instant::now();
            codes.copy_from_slice(codec.encode_frames(&[0], x)?);
            codec.decode_frames(&[0], codes, out)?;
            Ok(t.elapsed().as_secs_f64() * 1e3)
        };
    // Warm-up: two frames each (buffers a stream's second frame touches first).
    let (mut fa, mut fb) = (0, 0);
    for _ in 0..2 {
        a_frame(fa, &mut out_a, &mut codes_a)?;
        b_frame(fb, &mut out_b, &mut codes_b)?;
        fa += 1;
        fb += 1;
    }
    let (mut all_a, mut all_b, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    for r in 0..rounds {
        let (mut ra, mut rb) = (Vec::new(), Vec::new());
        for half in 0..2 {
            let a_turn = (r + half) % 2 == 0;
            for _ in 0..frames {
                if a_turn {
                    ra.push(a_frame(fa, &mut out_a, &mut codes_a)?);
                    fa += 1;
                } else {
                    rb.push(b_frame(fb, &mut out_b, &mut codes_b)?);
                    fb += 1;
                    // Frame fb - 1 of B is frame fb - 1 of A's stream: compare once A has done it.
                }
            }
        }
        // Both streams are at the same frame at the end of a round: the last frame's bits agree.
        same &= codes_a == codes_b
            && out_a
                .iter()
                .zip(&out_b)
                .all(|(x, y)| x.to_bits() == y.to_bits());
        ratios.push(median(&mut rb.clone()) / median(&mut ra.clone()));
        all_a.extend(ra);
        all_b.extend(rb);
    }
    let stats = |v: &mut Vec<f64>| {
        let m = median(v);
        (m, v[0], v[v.len() - 1])
    };
    let (ma, loa, hia) = stats(&mut all_a);
    let (mb, lob, hib) = stats(&mut all_b);
    let (mr, lor, hir) = stats(&mut ratios);
    println!(
        "result what=codec_one_slot threads={threads} frames={frames} rounds={rounds} \
         old_ms={ma:.2} old_min={loa:.2} old_max={hia:.2} new_ms={mb:.2} new_min={lob:.2} new_max={hib:.2} \
         ratio={mr:.3} ratio_min={lor:.3} ratio_max={hir:.3} bitwise_equal={same}"
    );
    Ok(())
}
