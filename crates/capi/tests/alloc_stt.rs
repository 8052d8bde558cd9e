//! Steady-state `mn_stt_push` / `mn_stt_pull` allocate nothing, the pulls that run a word's step or
//! return it included (counting allocator): the model's word event carries its tokens inline
//! (`model::stt::WordTokens`) and the transcriber decodes the text into its reserved buffer. Reset and
//! flush allocate nothing.
//!
//! One test in this binary: the counter sees every thread (pool workers included) but the harness's `main`.

mod common;

use std::ptr::{null, null_mut};

use common::*;
use moshi_native::*;
use testkit::all_thread_allocations_during as allocations;

#[global_allocator]
static GLOBAL: testkit::CountingAlloc = testkit::CountingAlloc;

#[test]
fn steady_state_push_and_pull_allocate_nothing_words_included() {
    assert!(testkit::other_thread_probe(|f| allocations(f)) >= 1);
    // SAFETY: valid handles and buffers throughout.
    unsafe {
        for threads in [1, 2] {
            let mut opts = std::mem::zeroed::<MnEngineOptions>();
            expect(mn_engine_options_default(&mut opts), MnStatus::Ok);
            opts.threads = threads;
            let mut engine = null_mut();
            expect(mn_stt_engine_open(null(), &opts, &mut engine), MnStatus::Ok);
            let mut t = null_mut();
            expect(
                mn_stt_transcriber_create(engine, null(), &mut t),
                MnStatus::Ok,
            );
            let pcm = signal(160);
            let mut ev = new_event();
            // Half a frame per push, then every ready event; per call: (allocations, whether it pulled
            // a word).
            let mut calls: Vec<(usize, usize)> = Vec::with_capacity(4096);
            let mut run = |frames: std::ops::Range<usize>, calls: &mut Vec<(usize, usize)>| {
                let chunk = MN_FRAME_SIZE / 2;
                for c in pcm[frames.start * MN_FRAME_SIZE..frames.end * MN_FRAME_SIZE].chunks(chunk)
                {
                    let a = allocations(|| {
                        expect(mn_stt_push(t, c.as_ptr(), c.len()), MnStatus::Ok);
                    });
                    calls.push((a, 0));
                    loop {
                        let mut st = MnStatus::Ok;
                        let a = allocations(|| st = mn_stt_pull(t, &mut ev));
                        let word = st == MnStatus::Ok && ev.kind == MN_STT_EVENT_WORD;
                        calls.push((a, usize::from(word)));
                        if st == MnStatus::NoFrame {
                            break;
                        }
                        expect(st, MnStatus::Ok);
                    }
                }
            };
            // Warm-up past the tiny LM's context and Mimi's (their KV rings wrap).
            run(0..60, &mut calls);
            calls.clear();
            run(60..160, &mut calls);
            let words: usize = calls.iter().map(|c| c.1).sum();
            let total: usize = calls.iter().map(|c| c.0).sum();
            eprintln!(
                "{threads} threads: {total} allocations over 100 frames ({} calls, {words} words)",
                calls.len()
            );
            assert_eq!(
                total, 0,
                "allocations over 100 frames with {words} words ({threads} threads)"
            );
            // The word path ran under the count (its step's pull and its own pull).
            assert!(words > 0, "no word in 100 frames ({threads} threads)");
            // Flush and reset only queue zeros or clear.
            let allocs = allocations(|| {
                expect(mn_stt_flush(t), MnStatus::Ok);
                expect(mn_stt_reset(t), MnStatus::Ok);
            });
            assert_eq!(allocs, 0);
            expect(mn_stt_transcriber_destroy(t), MnStatus::Ok);
            expect(mn_stt_engine_destroy(engine), MnStatus::Ok);
        }
    }
}
