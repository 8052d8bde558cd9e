//! Mimi at the released size allocates nothing after warm-up on any thread (the caller and the
//! pool's workers), one stream at a time and several coded together. Counted with the all-thread
//! counter, so this binary holds a single test that runs the cases one after the other.

use model::mimi::{MimiBatchDecoder, MimiBatchEncoder, MimiDecoder, MimiEncoder};

#[global_allocator]
static GLOBAL: testkit::CountingAlloc = testkit::CountingAlloc;

use testkit::all_thread_allocations_during as allocations;

#[test]
fn mimi_frames_at_released_size_allocate_nothing_on_any_thread() {
    // The counter sees other threads (guards against a vacuous test).
    assert!(testkit::other_thread_probe(|f| allocations(f)) >= 1);
    released_size_frame_path(false);
    released_size_frame_path(true);
    batched_frame_path(false);
    batched_frame_path(true);
}

/// At released size every size threshold of the threaded/AVX-512 paths is crossed (pooled
/// per-channel work, pre-gathered row-split GEMMs, attention by heads, matmul-path transposed
/// convs): still nothing allocated on any thread after two warm-up frames.
fn released_size_frame_path(pooled: bool) {
    let mimi = model::mimi::bench::synthetic_mimi(8, 5).unwrap();
    let fs = mimi.frame_size();
    let input = model::mimi::bench::test_signal(6 * fs, 24000);
    let pool = model::mimi::Pool::new(2);
    let p = pooled.then_some(&pool);
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
    let a = allocations(|| (2..6).for_each(&mut frame));
    assert_eq!(a, 0, "pool {}: allocated", p.is_some());
}

/// Several streams coded together at released size (the joined GEMMs, gap-joined transposed
/// convolutions and multi-row matmuls): after one warm-up tick with every stream, ticks of any
/// subset of the streams, in any order, and per-stream resets allocate nothing on any thread.
fn batched_frame_path(pooled: bool) {
    let mimi = model::mimi::bench::synthetic_mimi(8, 5).unwrap();
    let (fs, nq) = (mimi.frame_size(), mimi.n_codebooks());
    let input = model::mimi::bench::test_signal(8 * fs, 24000);
    let pool = model::mimi::Pool::new(2);
    let p = pooled.then_some(&pool);
    let mut enc = MimiBatchEncoder::new(mimi.clone(), 3);
    let mut dec = MimiBatchDecoder::new(mimi.clone(), 3);
    let mut pcm = vec![0.0f32; 3 * fs];
    let mut codes = vec![0u32; 3 * nq];
    let mut out = vec![0.0f32; 3 * fs];
    let sets: [&[usize]; 5] = [&[0, 1, 2], &[1], &[2, 0], &[0], &[1, 2]];
    let mut tick = |k: usize| {
        let active = sets[k % sets.len()];
        if k == 5 {
            enc.reset(1);
            dec.reset(1);
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
    tick(0);
    tick(0);
    let a = allocations(|| (1..8).for_each(&mut tick));
    assert_eq!(a, 0, "batched, pool {}: allocated", p.is_some());
}
