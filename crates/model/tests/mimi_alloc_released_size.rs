//! Mimi at the released size allocates nothing after warm-up on any thread (the caller and the
//! pool's workers), one stream at a time and several coded together. Counted with the all-thread
//! counter, so this binary holds a single test that runs the cases one after the other.
//!
//! Under emulation (the aarch64 stage of `.ci/run`, where one released-size frame costs seconds)
//! `MOSHI_RELEASED_SIZE_SUBSET=1` runs a subset: the same model and widths, so the same NEON
//! kernel paths and pool splits, with the pool only (the caller and the workers both count), after
//! the same warm-up, two measured frames alone and three measured batched ticks (a reordered pair,
//! one stream, a reset and a pair). It drops the single-thread runs and the longer measured
//! windows (so an allocation that recurs less often than every frame, such as a buffer growing
//! at a later frame, is seen only by the full run on x86).

use model::mimi::{Mimi, MimiBatchDecoder, MimiBatchEncoder, MimiDecoder, MimiEncoder, Pool};
use std::sync::Arc;

#[global_allocator]
static GLOBAL: testkit::CountingAlloc = testkit::CountingAlloc;

use testkit::all_thread_allocations_during as allocations;

/// One batched tick: the streams that step, in call order, and the stream reset before it.
type Tick = (&'static [usize], Option<usize>);

/// The full run's measured ticks: every subset of the streams in several orders, with stream 1
/// reset before the fifth.
const FULL_TICKS: [Tick; 7] = [
    (&[1], None),
    (&[2, 0], None),
    (&[0], None),
    (&[1, 2], None),
    (&[0, 1, 2], Some(1)),
    (&[1], None),
    (&[2, 0], None),
];

/// The subset's measured ticks.
const SUBSET_TICKS: [Tick; 3] = [(&[2, 0], None), (&[1], None), (&[1, 2], Some(1))];

#[test]
fn mimi_frames_at_released_size_allocate_nothing_on_any_thread() {
    // The counter sees other threads (guards against a vacuous test).
    assert!(testkit::other_thread_probe(|f| allocations(f)) >= 1);
    let mimi = bench::mimi::synthetic_mimi(8, 5).unwrap();
    let pool = Pool::new(2);
    if std::env::var_os("MOSHI_RELEASED_SIZE_SUBSET").is_some_and(|v| v == "1") {
        eprintln!("released size: the subset (MOSHI_RELEASED_SIZE_SUBSET=1)");
        released_size_frame_path(&mimi, Some(&pool), 2);
        batched_frame_path(&mimi, Some(&pool), &SUBSET_TICKS);
    } else {
        released_size_frame_path(&mimi, None, 4);
        released_size_frame_path(&mimi, Some(&pool), 4);
        batched_frame_path(&mimi, None, &FULL_TICKS);
        batched_frame_path(&mimi, Some(&pool), &FULL_TICKS);
    }
}

/// At released size every size threshold of the threaded/AVX-512 paths is crossed (pooled
/// per-channel work, pre-gathered row-split GEMMs, attention by heads, matmul-path transposed
/// convs): still nothing allocated on any thread in `measured` frames after two warm-up frames.
fn released_size_frame_path(mimi: &Arc<Mimi>, p: Option<&Pool>, measured: usize) {
    let fs = mimi.frame_size();
    let frames = 2 + measured;
    let input = bench::mimi::test_signal(frames * fs, 24000);
    let mut enc = MimiEncoder::new(mimi.clone());
    let mut dec = MimiDecoder::new(mimi.clone());
    let mut codes = vec![0u32; mimi.n_codebooks()];
    let mut out = vec![0.0f32; fs];
    let mut frame = |f: usize| {
        codes.copy_from_slice(
            enc.encode_frame_with(&input[f * fs..(f + 1) * fs], p, None)
                .unwrap(),
        );
        dec.decode_frame_with(&codes, &mut out, p, None).unwrap();
    };
    (0..2).for_each(&mut frame);
    let a = allocations(|| (2..frames).for_each(&mut frame));
    assert_eq!(a, 0, "pool {}: allocated", p.is_some());
}

/// Several streams coded together at released size (the joined GEMMs, gap-joined transposed
/// convolutions and multi-row matmuls): after two warm-up ticks with every stream, the
/// `measured` ticks (subsets of the streams in any order, per-stream resets) allocate nothing on
/// any thread.
fn batched_frame_path(mimi: &Arc<Mimi>, p: Option<&Pool>, measured: &[Tick]) {
    let (fs, nq) = (mimi.frame_size(), mimi.n_codebooks());
    let input = bench::mimi::test_signal(8 * fs, 24000);
    let mut enc = MimiBatchEncoder::new(mimi.clone(), 3);
    let mut dec = MimiBatchDecoder::new(mimi.clone(), 3);
    let mut pcm = vec![0.0f32; 3 * fs];
    let mut codes = vec![0u32; 3 * nq];
    let mut out = vec![0.0f32; 3 * fs];
    let mut tick = |k: usize, (active, reset): Tick| {
        if let Some(s) = reset {
            enc.reset(s);
            dec.reset(s);
        }
        let m = active.len();
        for j in 0..m {
            pcm[j * fs..(j + 1) * fs].copy_from_slice(&input[(k % 7) * fs..(k % 7 + 1) * fs]);
        }
        codes[..m * nq].copy_from_slice(enc.encode_frames(active, &pcm[..m * fs], p).unwrap());
        dec.decode_frames(active, &codes[..m * nq], &mut out[..m * fs], p)
            .unwrap();
    };
    // Warm-up: two ticks of every stream, as the single-stream cases take two frames.
    tick(0, (&[0, 1, 2], None));
    tick(0, (&[0, 1, 2], None));
    let a = allocations(|| {
        for (k, &t) in measured.iter().enumerate() {
            tick(k + 1, t);
        }
    });
    assert_eq!(a, 0, "batched, pool {}: allocated", p.is_some());
}
