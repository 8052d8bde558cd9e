//! After warm-up, the hot calls allocate nothing on any thread (the caller and the pool's
//! workers): matrix products in every weight format (single thread and through the pool),
//! attention, convolutions and row ops. Counted with the all-thread counter, so this binary holds
//! a single test.

use kernels::attention::{KvDtype, KvRing};
use kernels::conv::{Conv1d, ConvTranspose1d, Workspace};
use kernels::{ops, Matrix, Pool, Scratch, WeightFormat};

use testkit::all_thread_allocations_during as allocations;

mod common;
use common::FORMATS;

#[global_allocator]
static GLOBAL: testkit::CountingAlloc = testkit::CountingAlloc;

#[test]
fn hot_calls_do_not_allocate_after_warm_up() {
    let (rows, cols) = (40, 128);
    let vals: Vec<f32> = (0..rows * cols)
        .map(|i| (i % 9) as f32 * 0.1 - 0.4)
        .collect();
    let mats = FORMATS.map(|f| Matrix::encode(f, rows, cols, &vals).unwrap());
    // Large enough that the pool's worker wakes up in time to claim shares.
    let (big_rows, big_cols) = (2048, 1024);
    let big_vals: Vec<f32> = (0..big_rows * big_cols)
        .map(|i| (i % 13) as f32 * 0.05 - 0.3)
        .collect();
    let big = Matrix::encode(WeightFormat::Q8_0, big_rows, big_cols, &big_vals).unwrap();
    let big_x: Vec<f32> = (0..big_cols * 4).map(|i| (i % 7) as f32 - 3.0).collect();
    let mut big_y = vec![0f32; big_rows * 4];
    let x: Vec<f32> = (0..cols * 4).map(|i| (i % 5) as f32 - 2.0).collect();
    let mut y = vec![0f32; rows * 4];
    let mut scratch = Scratch::new();
    let pool = Pool::new(2);
    let mut ring = KvRing::new(64, 2, 16, KvDtype::Bf16).unwrap();
    let conv = Conv1d::new(vec![0.1; 8 * 4 * 3], None, 4, 8, 3, 1, 1, 1).unwrap();
    let convt = ConvTranspose1d::new(vec![0.1; 8 * 4 * 4], None, 8, 4, 4, 2, 1).unwrap();
    let cin: Vec<f32> = vec![0.5; 4 * 40];
    let mut cout = vec![0f32; 8 * 38];
    let tin: Vec<f32> = vec![0.5; 8 * 30];
    let mut tout = vec![0f32; 4 * 62];
    let kv = vec![0.25f32; 32];
    let mut att = vec![0f32; 32];
    let mut row = vec![0f32; cols];
    let mut a2 = vec![0f32; 32];
    let mut step = |scratch: &mut Scratch, ring: &mut KvRing, y: &mut [f32]| {
        for m in &mats {
            m.matvec(&x[..cols], &mut y[..rows], scratch);
            m.matmul(&x, 4, y, scratch);
            pool.matvec(m, &x[..cols], &mut y[..rows]);
            pool.matmul(m, &x, 4, y);
            m.row_f32(3, &mut row);
        }
        pool.matmul(&big, &big_x, 4, &mut big_y);
        pool.matvec(&big, &big_x[..big_cols], &mut big_y[..big_rows]);
        ring.push(&kv, &kv);
        ring.attend(&kv, &mut att, 64);
        ring.attend_pool(&kv, &mut att, 64, &pool);
        conv.forward(&cin, &mut cout).unwrap();
        conv.forward_pool(&cin, &mut cout, &pool).unwrap();
        convt.forward(&tin, &mut tout).unwrap();
        convt.forward_pool(&tin, &mut tout, &pool).unwrap();
        ops::softmax(&mut att);
        ops::rope_interleaved(&mut att, 2, 16, 12345, 10000.0);
        a2.copy_from_slice(&att);
        ops::rms_norm(&a2, &kv, 1e-5, &mut att);
    };
    for _ in 0..20 {
        step(&mut scratch, &mut ring, &mut y);
    }
    // Ten calls, so that the pool's worker surely claims some shares.
    let n = allocations(|| {
        for _ in 0..10 {
            step(&mut scratch, &mut ring, &mut y)
        }
    });
    assert_eq!(n, 0, "unexpected allocations in the hot path");
    // The counter works, on this thread and on another one.
    assert!(allocations(|| drop(std::hint::black_box(vec![1u8; 10]))) >= 1);
    assert!(testkit::other_thread_probe(|f| allocations(f)) >= 1);
    workspace_follows_the_work();
}

/// Convolutions run inside a [`Workspace`] warmed on one thread allocate nothing on another
/// thread that never ran them (the scratch moves with the workspace, not the thread), and give
/// the same results as outside it.
fn workspace_follows_the_work() {
    use std::sync::Barrier;
    let conv = Conv1d::new(vec![0.1; 64 * 32 * 8], None, 32, 64, 8, 4, 1, 1).unwrap();
    let convt = ConvTranspose1d::new(vec![0.1; 32 * 16 * 8], None, 32, 16, 8, 4, 1).unwrap();
    let x: Vec<f32> = (0..32 * 484).map(|i| (i % 11) as f32 * 0.1 - 0.5).collect();
    let mut y = vec![0f32; 64 * 120];
    let mut yt = vec![0f32; 16 * convt.out_len(484)];
    let (mut want, mut want_t) = (y.clone(), yt.clone());
    conv.forward(&x, &mut want).unwrap();
    convt.forward(&x, &mut want_t).unwrap();
    let mut ws = Workspace::new();
    ws.enter(|| {
        conv.forward(&x, &mut y).unwrap();
        convt.forward(&x, &mut yt).unwrap();
    });
    assert_eq!((&y, &yt), (&want, &want_t));
    let (ready, start, done) = (Barrier::new(2), Barrier::new(2), Barrier::new(2));
    let n = std::thread::scope(|s| {
        s.spawn(|| {
            // This thread's own scratch exists (a tiny call), but is far too small for `conv`.
            let tiny = Conv1d::new(vec![0.1; 2], None, 1, 2, 1, 1, 1, 1).unwrap();
            tiny.forward(&[1.0; 4], &mut [0.0; 8]).unwrap();
            ready.wait();
            start.wait();
            ws.enter(|| {
                conv.forward(&x, &mut y).unwrap();
                convt.forward(&x, &mut yt).unwrap();
            });
            done.wait();
        });
        // Counting starts once the thread has started and made its own scratch.
        ready.wait();
        allocations(|| {
            start.wait();
            done.wait();
        })
    });
    assert_eq!(n, 0, "a warmed workspace allocated on another thread");
    assert_eq!((&y, &yt), (&want, &want_t));
}
