//! Zero heap allocations per tick of the batched runner after warm-up (counting global allocator, tiny bundle).
//! One test in this binary, so no other test thread allocates while counting; the counter covers every thread
//! (the batch worker and its pool).

mod common;

use common::*;
use runtime::{BatchOptions, BatchRunner, EngineOptions, SessionOptions, FRAME_SIZE};
use testkit::all_thread_allocations_during as allocations;

#[global_allocator]
static GLOBAL: testkit::CountingAlloc = testkit::CountingAlloc;

type Conv = (
    runtime::BatchSession,
    runtime::PcmProducer,
    runtime::EventReceiver,
);

#[test]
fn batched_ticks_do_not_allocate() {
    for threads in [1, 2] {
        let engine = runtime::Engine::open(&bundle_dir(), EngineOptions::cpu(threads)).unwrap();
        let r = BatchRunner::spawn(
            engine,
            BatchOptions {
                slots: 3,
                event_capacity: 4,
            },
        )
        .unwrap();
        let mut convs: Vec<Conv> = [24_000, 48_000]
            .into_iter()
            .enumerate()
            .map(|(i, rate)| {
                let mut s = r
                    .open(SessionOptions {
                        output_rate: rate,
                        ..sampled(i as u64)
                    })
                    .unwrap();
                let mic = s.producer().unwrap();
                let ev = s.events().unwrap();
                (s, mic, ev)
            })
            .collect();
        let pcm = signal(240, 40);
        // Slot 0 every frame, slot 1 every other frame: ticks of one and of two active slots.
        let run = |convs: &mut Vec<Conv>, frames: std::ops::Range<usize>| {
            let mut n = 0;
            for f in frames {
                let x = &pcm[f * FRAME_SIZE..(f + 1) * FRAME_SIZE];
                for (k, (_, mic, ev)) in convs.iter_mut().enumerate() {
                    if k == 1 && f % 2 == 1 {
                        continue;
                    }
                    push_and_recycle(mic, ev, x);
                    n += 1;
                }
            }
            n
        };
        // Warm-up past the tiny LM's and Mimi's contexts (the KV rings wrap).
        assert_eq!(run(&mut convs, 0..40), 60);
        let mut n = 0;
        let allocs = allocations(|| n = run(&mut convs, 40..240));
        assert_eq!((allocs, n), (0, 300), "batched path ({threads} threads)");
        // Commands between frames do not allocate either.
        for (s, _, _) in &convs {
            let c = s.control();
            c.interrupt();
            c.pause();
            c.resume();
            c.reset();
        }
        let mut n = 0;
        let allocs = allocations(|| n = run(&mut convs, 0..30));
        assert_eq!((allocs, n), (0, 45), "after commands ({threads} threads)");
        drop(convs);
        r.stop().unwrap();
    }
}
