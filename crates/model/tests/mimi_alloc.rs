//! `encode_frame` / `decode_frame` (and the chunking front end) allocate nothing after
//! warm-up, on any thread (the caller and the pool's workers). Counted with the all-thread
//! counter, so this binary holds a single test that runs the cases one after the other. The cases at
//! the released size are in `mimi_alloc_released_size.rs`, a binary of their own so that the
//! emulated aarch64 run in CI can leave them out (minutes under qemu) by name.

mod mimi_common;

use mimi_common::*;
use model::mimi::{MimiDecoder, MimiEncoder, StreamEncoder};

#[global_allocator]
static GLOBAL: testkit::CountingAlloc = testkit::CountingAlloc;

use testkit::all_thread_allocations_during as allocations;

#[test]
fn mimi_frames_allocate_nothing_on_any_thread() {
    // The counter sees other threads (guards against a vacuous test).
    assert!(testkit::other_thread_probe(|f| allocations(f)) >= 1);
    tiny_frame_path();
    tiny_pooled_frame_path();
}

fn tiny_frame_path() {
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
    let n = allocations(|| {
        // 20 more frames: the transformer ring (context 8) wraps several times
        for f in 2..22 {
            codes.copy_from_slice(enc.encode_frame(&input[f * fs..(f + 1) * fs]).unwrap());
            dec.decode_frame(&codes, &mut out).unwrap();
        }
        enc.reset();
        dec.reset();
        codes.copy_from_slice(enc.encode_frame(&input[..fs]).unwrap());
        dec.decode_frame(&codes, &mut out).unwrap();
    });
    assert_eq!(n, 0, "frame path allocated {n} times");

    // chunking front end
    let mut front = StreamEncoder::new(MimiEncoder::new(mimi.clone()));
    let mut n = 0usize;
    front.push(&input[..3000], |_| n += 1).unwrap();
    let a = allocations(|| {
        front.push(&input[3000..20000], |_| n += 1).unwrap();
        front.push(&input[20000..20001], |_| n += 1).unwrap();
    });
    assert_eq!(a, 0, "chunking front end");
    assert_eq!(n, 20001 / fs);
}

fn tiny_pooled_frame_path() {
    let spec = spec();
    let mimi = load("mimi.safetensors", &spec);
    let input = &input_pcm();
    let fs = mimi.frame_size();
    let mut out = vec![0.0; fs];
    let mut codes = vec![0u32; mimi.n_codebooks()];
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
    let a = allocations(|| (2..12).for_each(&mut pooled_frame));
    assert_eq!(a, 0, "pooled frame path allocated");
}
