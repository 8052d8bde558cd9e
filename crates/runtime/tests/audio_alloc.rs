//! The streaming resampler does not allocate per chunk once built (counting global allocator,
//! thread-local counts so other test threads do not interfere).

use runtime::audio::StreamResampler;
use testkit::thread_allocations as allocs;

#[global_allocator]
static GLOBAL: testkit::CountingAlloc = testkit::CountingAlloc;

#[test]
fn no_allocation_per_chunk_after_construction() {
    testkit::assert_thread_meter_sees_allocations();
    for (from, to) in [
        (24_000, 48_000),
        (24_000, 44_100),
        (24_000, 16_000),
        (48_000, 24_000),
        (44_100, 24_000),
    ] {
        let input: Vec<f32> = (0..20_000).map(|i| (i as f32 * 0.01).sin()).collect();
        let mut r = StreamResampler::new(from, to).unwrap();
        // Browser-sized packets (20 ms) and odd sizes; the caller's buffer is reserved once.
        let sizes = [from as usize / 50, 1, 333, 1920, 7];
        let cap = sizes
            .iter()
            .map(|&n| r.max_output_len(n) + r.max_output_len(0))
            .max()
            .unwrap()
            + r.max_flush_len()
            + 4096;
        let mut out: Vec<f32> = Vec::with_capacity(cap);
        let before = allocs();
        let mut pos = 0;
        let mut k = 0;
        while pos < input.len() {
            let n = sizes[k % sizes.len()].min(input.len() - pos);
            out.clear();
            r.process(&input[pos..pos + n], &mut out).unwrap();
            pos += n;
            k += 1;
        }
        out.clear();
        r.flush(&mut out).unwrap();
        assert_eq!(
            allocs() - before,
            0,
            "{from}->{to}: allocations in the streaming loop"
        );
    }
}
