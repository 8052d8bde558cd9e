//! The batched Mimi streams (`MimiBatchEncoder` / `MimiBatchDecoder`, one call for several
//! conversation slots) against each stream run alone through `MimiEncoder` / `MimiDecoder`:
//! codes identical and samples identical, with streams that start at different ticks, skip
//! ticks, run in a different order from tick to tick and reset mid-stream, on the tiny oracle
//! fixture (the demo model's Mimi) and at released size (every kernel path and pool split of
//! the full model is crossed), with and without a pool.
//!
//! Under emulation (the aarch64 stage of `.ci/run`, where one released-size frame costs seconds)
//! `MOSHI_RELEASED_SIZE_SUBSET=1` runs a subset at released size: the same model and widths, so
//! the same NEON kernel paths and pool splits, with the pool only and 3 ticks
//! ([`subset_schedule`]) that still join 2 and then 3 streams at different positions (the middle
//! stream of a 3-way join has gap columns on both sides), start a stream late, skip and resume
//! one, reset one, and reverse the order. It drops the single-thread run, the longer schedule and
//! joins of streams that have run many frames; those run at released size on x86 (the full test)
//! and on aarch64 with the oracle fixture.
//!
//! Why exact equality is the right bound: every output of the convolution GEMM micro-kernels
//! and of the dense matmul tiles is one FMA chain over its inputs in a fixed order, whatever
//! the other columns / rows of the product (see `kernels::conv` and the `dense` kernels), and
//! every other step is per stream or elementwise. The one difference a joined product can make
//! is in the transposed convolutions, where a stream's span also receives exact `+0.0` terms
//! from the zero gap columns: that changes no value, only possibly the sign of an exactly zero
//! result. So samples must compare equal as floats, and their bits may differ only at ±0.

mod mimi_common;

use bench::mimi as bench;
use model::mimi::{Mimi, MimiBatchDecoder, MimiBatchEncoder, MimiDecoder, MimiEncoder};
use std::sync::Arc;

/// What stream `s` does at tick `k`.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Act {
    Idle,
    Step,
    /// Reset, then step.
    ResetStep,
}

/// What each stream does at each tick: `schedule(s, k)`.
type Schedule = fn(usize, usize) -> Act;

/// 3 streams: 0 runs every tick; 1 starts at tick 2 and skips every third tick; 2 starts at
/// tick 4 and resets at tick 9.
fn schedule(s: usize, k: usize) -> Act {
    match s {
        0 => Act::Step,
        1 if k >= 2 && k % 3 != 1 => Act::Step,
        2 if k == 9 => Act::ResetStep,
        2 if k >= 4 => Act::Step,
        _ => Act::Idle,
    }
}

/// The 3-tick subset for emulated runs: tick 0 joins streams 0 and 1 (both at position 0);
/// tick 1 joins 2 (starting late) and 0 in reversed order while 1 skips; tick 2 joins all three
/// at three different positions, with 1 resumed and 2 reset first.
fn subset_schedule(s: usize, k: usize) -> Act {
    match (s, k) {
        (0, _) | (1, 0) | (1, 2) | (2, 1) => Act::Step,
        (2, 2) => Act::ResetStep,
        _ => Act::Idle,
    }
}

/// Whether the released-size test runs its subset (`MOSHI_RELEASED_SIZE_SUBSET=1`).
fn released_size_subset() -> bool {
    std::env::var_os("MOSHI_RELEASED_SIZE_SUBSET").is_some_and(|v| v == "1")
}

/// Distinct input for each stream (the same signal at different offsets and gains).
fn stream_input(base: &[f32], s: usize, frames: usize, fs: usize) -> Vec<f32> {
    let gain = [1.0, 0.5, -0.8][s];
    (0..frames * fs)
        .map(|i| gain * base[(i + s * 7919) % base.len()])
        .collect()
}

fn same_sample(a: f32, b: f32) -> bool {
    a.to_bits() == b.to_bits() || (a == 0.0 && b == 0.0)
}

fn check(
    mimi: &Arc<Mimi>,
    base: &[f32],
    ticks: usize,
    pool: Option<&model::mimi::Pool>,
    schedule: Schedule,
) {
    let fs = mimi.frame_size();
    let nq = mimi.n_codebooks();
    let streams = 3;
    let inputs: Vec<Vec<f32>> = (0..streams)
        .map(|s| stream_input(base, s, ticks, fs))
        .collect();

    // Alone: each stream's own encoder / decoder, frames in the order it receives them.
    let mut alone_codes = vec![Vec::new(); streams];
    let mut alone_pcm = vec![Vec::new(); streams];
    for s in 0..streams {
        let mut enc = MimiEncoder::new(mimi.clone());
        let mut dec = MimiDecoder::new(mimi.clone());
        let mut out = vec![0.0; fs];
        for k in 0..ticks {
            let act = schedule(s, k);
            if act == Act::Idle {
                continue;
            }
            if act == Act::ResetStep {
                enc.reset();
                dec.reset();
            }
            let c = enc
                .encode_frame_with(&inputs[s][k * fs..(k + 1) * fs], pool, None)
                .unwrap()
                .to_vec();
            dec.decode_frame_with(&c, &mut out, pool, None).unwrap();
            alone_codes[s].extend_from_slice(&c);
            alone_pcm[s].extend_from_slice(&out);
        }
    }

    // Together: one call per tick for the streams that step, listed in a tick-dependent order.
    let mut enc = MimiBatchEncoder::new(mimi.clone(), streams);
    let mut dec = MimiBatchDecoder::new(mimi.clone(), streams);
    let mut got_codes = vec![Vec::new(); streams];
    let mut got_pcm = vec![Vec::new(); streams];
    let (mut pcm, mut codes, mut out) = (Vec::new(), Vec::new(), Vec::new());
    let mut joint_ticks = 0;
    for k in 0..ticks {
        let mut active: Vec<usize> = (0..streams)
            .filter(|&s| schedule(s, k) != Act::Idle)
            .collect();
        if k % 2 == 1 {
            active.reverse();
        }
        for &s in &active {
            if schedule(s, k) == Act::ResetStep {
                enc.reset(s);
                dec.reset(s);
            }
        }
        joint_ticks += usize::from(active.len() > 1);
        pcm.clear();
        for &s in &active {
            pcm.extend_from_slice(&inputs[s][k * fs..(k + 1) * fs]);
        }
        codes.clear();
        codes.extend_from_slice(enc.encode_frames(&active, &pcm, pool).unwrap());
        assert_eq!(codes.len(), active.len() * nq);
        // Decode in the opposite order, so the decoder's joined layout differs from the
        // encoder's.
        let rev: Vec<usize> = active.iter().rev().copied().collect();
        let rev_codes: Vec<u32> = (0..active.len())
            .rev()
            .flat_map(|j| codes[j * nq..(j + 1) * nq].to_vec())
            .collect();
        out.clear();
        out.resize(active.len() * fs, 0.0);
        dec.decode_frames(&rev, &rev_codes, &mut out, pool).unwrap();
        for (j, &s) in active.iter().enumerate() {
            got_codes[s].extend_from_slice(&codes[j * nq..(j + 1) * nq]);
        }
        for (j, &s) in rev.iter().enumerate() {
            got_pcm[s].extend_from_slice(&out[j * fs..(j + 1) * fs]);
        }
    }
    assert!(joint_ticks >= ticks / 2, "the schedule must batch streams");
    for s in 0..streams {
        assert_eq!(got_codes[s], alone_codes[s], "stream {s}: codes");
        assert_eq!(got_pcm[s].len(), alone_pcm[s].len());
        let bad = got_pcm[s]
            .iter()
            .zip(&alone_pcm[s])
            .position(|(&a, &b)| !same_sample(a, b));
        assert_eq!(bad, None, "stream {s}: first differing sample");
        assert!(
            got_pcm[s].iter().any(|v| v.abs() > 1e-6),
            "silent stream {s}"
        );
    }
}

#[test]
fn batched_streams_equal_streams_alone_on_the_oracle_fixture() {
    let spec = mimi_common::spec();
    let mimi = mimi_common::load("mimi.safetensors", &spec);
    let base = mimi_common::input_pcm();
    // 20 ticks: the context-8 KV rings wrap in every stream.
    check(&mimi, &base, 20, None, schedule);
    let pool = model::mimi::Pool::new(2);
    check(&mimi, &base, 20, Some(&pool), schedule);
}

#[test]
fn batched_streams_equal_streams_alone_at_released_size() {
    let mimi = bench::synthetic_mimi(8, 5).unwrap();
    let base = bench::test_signal(8 * 1920, 24000);
    let pool = model::mimi::Pool::new(2);
    if released_size_subset() {
        eprintln!("released size: the subset (MOSHI_RELEASED_SIZE_SUBSET=1)");
        check(&mimi, &base, 3, Some(&pool), subset_schedule);
    } else {
        check(&mimi, &base, 12, None, schedule);
        check(&mimi, &base, 12, Some(&pool), schedule);
    }
}

#[test]
fn bad_stream_lists_are_errors() {
    let spec = mimi_common::spec();
    let mimi = mimi_common::load("mimi.safetensors", &spec);
    let fs = mimi.frame_size();
    let nq = mimi.n_codebooks();
    let mut enc = MimiBatchEncoder::new(mimi.clone(), 2);
    let mut dec = MimiBatchDecoder::new(mimi.clone(), 2);
    let pcm = vec![0.0; 2 * fs];
    assert!(enc.encode_frames(&[0, 0], &pcm, None).is_err());
    assert!(enc.encode_frames(&[0, 2], &pcm, None).is_err());
    assert!(enc.encode_frames(&[0], &pcm, None).is_err());
    assert!(enc.encode_frames(&[], &[], None).unwrap().is_empty());
    let mut out = vec![0.0; 2 * fs];
    assert!(dec
        .decode_frames(&[1, 1], &vec![0; 2 * nq], &mut out, None)
        .is_err());
    let mut bad = vec![0; 2 * nq];
    bad[nq + 1] = mimi.cardinality() as u32;
    assert!(dec.decode_frames(&[0, 1], &bad, &mut out, None).is_err());
}
