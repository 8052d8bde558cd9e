//! `attend_chunks` (several rings in one call) against `KvRing::attend_chunk` ring by ring:
//! rings of different capacities, fill levels and wrap positions, f32 and bf16 keys, no pool and
//! pools of 1 and 2 threads. Each stream's output must be bitwise the one-ring result.

use kernels::attention::{attend_chunks, KvDtype, KvRing};
use kernels::Pool;
use proptest::prelude::*;

fn lcg(seed: &mut u64) -> f32 {
    *seed = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    ((*seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
}

/// Two identical rings (one for each side of the comparison) per `(capacity, pushes)`.
fn rings(
    shape: &[(usize, usize)],
    nh: usize,
    hd: usize,
    dtype: KvDtype,
    seed: u64,
) -> (Vec<KvRing>, Vec<KvRing>) {
    let mut s = seed;
    let d = nh * hd;
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for &(cap, pushes) in shape {
        let mut ra = KvRing::new(cap, nh, hd, dtype).unwrap();
        let mut rb = KvRing::new(cap, nh, hd, dtype).unwrap();
        for _ in 0..pushes {
            let k: Vec<f32> = (0..d).map(|_| lcg(&mut s) * 2.0).collect();
            let v: Vec<f32> = (0..d).map(|_| lcg(&mut s) * 3.0).collect();
            ra.push(&k, &v);
            rb.push(&k, &v);
        }
        a.push(ra);
        b.push(rb);
    }
    (a, b)
}

#[allow(clippy::too_many_arguments)]
fn check(
    shape: &[(usize, usize)],
    nh: usize,
    hd: usize,
    t: usize,
    context: usize,
    dtype: KvDtype,
    seed: u64,
    pool: Option<&Pool>,
) {
    let (d, m) = (nh * hd, shape.len());
    let stride = d + 3;
    let (mut one, many) = rings(shape, nh, hd, dtype, seed);
    let mut s = seed ^ 0x9e37_79b9;
    let q: Vec<f32> = (0..m * t * stride).map(|_| lcg(&mut s) * 2.0).collect();
    let mut want = vec![f32::NAN; m * t * d];
    for (j, ring) in one.iter_mut().enumerate() {
        ring.attend_chunk(
            &q[j * t * stride..],
            stride,
            t,
            context,
            &mut want[j * t * d..(j + 1) * t * d],
            None,
        );
    }
    let mut got = vec![f32::NAN; m * t * d];
    let mut scores = Vec::new();
    attend_chunks(
        |j| &many[j],
        m,
        &q,
        stride,
        t,
        context,
        &mut got,
        &mut scores,
        pool,
    );
    let (wb, gb): (Vec<u32>, Vec<u32>) = (
        want.iter().map(|x| x.to_bits()).collect(),
        got.iter().map(|x| x.to_bits()).collect(),
    );
    assert_eq!(wb, gb, "shape {shape:?} t {t} context {context} {dtype:?}");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    #[test]
    fn several_rings_match_one_at_a_time(
        shape in proptest::collection::vec((1usize..320, 0usize..700), 1..6),
        nh in 1usize..6,
        hd_half in 1usize..20,
        t in 1usize..4,
        context in 1usize..400,
        bf16 in any::<bool>(),
        seed in any::<u64>(),
    ) {
        // Every ring holds at least the chunk's t entries.
        let shape: Vec<_> = shape.into_iter().map(|(c, p)| (c.max(t), p.max(t))).collect();
        let dtype = if bf16 { KvDtype::Bf16 } else { KvDtype::F32 };
        let hd = 2 * hd_half;
        let (p1, p2) = (Pool::new(1), Pool::new(2));
        for pool in [None, Some(&p1), Some(&p2)] {
            check(&shape, nh, hd, t, context, dtype, seed, pool);
        }
    }
}

/// Mimi-like sizes (8 heads of 64, context 250, t = 2) for four streams at different points of
/// a conversation: one pool dispatch for all of them, results bitwise the per-ring ones.
#[test]
fn mimi_sized_streams_in_one_dispatch() {
    let shape = [(250, 2), (250, 251), (250, 600), (250, 97)];
    let pool = Pool::new(2);
    for dtype in [KvDtype::F32, KvDtype::Bf16] {
        let before = pool.dispatches();
        check(&shape, 8, 64, 2, 250, dtype, 7, Some(&pool));
        assert_eq!(pool.dispatches().wrapping_sub(before), 1);
        check(&shape, 8, 64, 2, 250, dtype, 8, Some(&Pool::new(1)));
    }
}
