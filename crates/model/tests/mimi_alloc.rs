//! `encode_frame` / `decode_frame` (and the chunking front end) allocate nothing after
//! warm-up. A counting global allocator with a thread-local counter (so other test threads
//! do not interfere).

mod mimi_common;

use mimi_common::*;
use model::mimi::{MimiDecoder, MimiEncoder, StreamEncoder};
use testkit::thread_allocations as allocs;

#[global_allocator]
static GLOBAL: testkit::CountingAlloc = testkit::CountingAlloc;

#[test]
fn frame_path_allocates_nothing() {
    let spec = spec();
    let mimi = load("mimi.safetensors", &spec);
    let input = &input_pcm();
    let fs = mimi.frame_size();
    let mut enc = MimiEncoder::new(mimi.clone());
    let mut dec = MimiDecoder::new(mimi.clone());
    let mut out = vec![0.0; fs];
    let mut codes = vec![0u32; mimi.n_codebooks()];
    // warm-up: two frames
    for f in 0..2 {
        codes.copy_from_slice(enc.encode_frame(&input[f * fs..(f + 1) * fs]).unwrap());
        dec.decode_frame(&codes, &mut out).unwrap();
    }
    let before = allocs();
    // 20 more frames: the transformer ring (context 8) wraps several times
    for f in 2..22 {
        codes.copy_from_slice(enc.encode_frame(&input[f * fs..(f + 1) * fs]).unwrap());
        dec.decode_frame(&codes, &mut out).unwrap();
    }
    enc.reset();
    dec.reset();
    codes.copy_from_slice(enc.encode_frame(&input[..fs]).unwrap());
    dec.decode_frame(&codes, &mut out).unwrap();
    let after = allocs();
    assert_eq!(
        after - before,
        0,
        "frame path allocated {} times",
        after - before
    );

    // chunking front end
    let mut front = StreamEncoder::new(MimiEncoder::new(mimi.clone()));
    let mut n = 0usize;
    front.push(&input[..3000], |_| n += 1).unwrap();
    let before = allocs();
    front.push(&input[3000..20000], |_| n += 1).unwrap();
    front.push(&input[20000..20001], |_| n += 1).unwrap();
    let after = allocs();
    assert_eq!(after - before, 0);
    assert_eq!(n, 20001 / fs);

    // with a 2-thread pool (counts this thread's allocations; workers are persistent)
    let pool = model::mimi::Pool::new(2);
    let mut enc = MimiEncoder::new(mimi.clone());
    let mut dec = MimiDecoder::new(mimi.clone());
    let mut pooled_frame = |f: usize| {
        codes.copy_from_slice(
            enc.encode_frame_with(&input[f * fs..(f + 1) * fs], Some(&pool), None)
                .unwrap(),
        );
        dec.decode_frame_with(&codes, &mut out, Some(&pool), None)
            .unwrap();
    };
    (0..2).for_each(&mut pooled_frame);
    let before = allocs();
    (2..12).for_each(&mut pooled_frame);
    assert_eq!(allocs() - before, 0, "pooled frame path allocated");

    // the counter does count (guards against a vacuous test)
    let before = allocs();
    let v = std::hint::black_box(vec![1u8; 10]);
    drop(v);
    assert!(allocs() > before);
}

/// At released size every size threshold of the threaded/AVX-512 paths is crossed (pooled
/// per-channel work, pre-gathered row-split GEMMs, attention by heads, matmul-path transposed
/// convs): still nothing allocated on the calling thread after two warm-up frames.
#[test]
fn released_size_frame_path_allocates_nothing() {
    let mimi = model::mimi::bench::synthetic_mimi(8, 5).unwrap();
    let fs = mimi.frame_size();
    let input = model::mimi::bench::test_signal(6 * fs, 24000);
    let pool = model::mimi::Pool::new(2);
    for p in [None, Some(&pool)] {
        let mut enc = MimiEncoder::new(mimi.clone());
        let mut dec = MimiDecoder::new(mimi.clone());
        let mut codes = vec![0u32; mimi.n_codebooks()];
        let mut out = vec![0.0f32; fs];
        let mut before = 0;
        for f in 0..6 {
            if f == 2 {
                before = allocs();
            }
            codes.copy_from_slice(
                enc.encode_frame_with(&input[f * fs..(f + 1) * fs], p, None)
                    .unwrap(),
            );
            dec.decode_frame_with(&codes, &mut out, p, None).unwrap();
        }
        assert_eq!(allocs() - before, 0, "pool {}: allocated", p.is_some());
    }
}
