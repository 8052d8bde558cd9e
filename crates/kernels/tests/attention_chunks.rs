//! Chunked attention (`Chunks`, `KvRing::attend_chunk`: `t` causal queries per stream).
//!
//! 1. `Chunks::attend` (several rings in one call) against `KvRing::attend_chunk` ring by ring:
//!    rings of different capacities, fill levels and wrap positions, f32 and bf16 keys, no pool
//!    and pools of 1 and 2 threads. Each stream's output must be bitwise the one-ring result.
//! 2. Every kernel set this CPU runs (`Chunks::attend_with`), against an independent naive
//!    attention in f64 over the pushed history (keys and values rounded to bf16 first for a bf16
//!    ring): chunks of t > 1 queries, rings that wrapped, contexts shorter and longer than the
//!    ring. Tolerance per output element, with `S` the largest `Σ|q·k|/√d` of the head's window,
//!    `n` its length and `V` its largest `|v|`: `(2.2·(d + 8)·2⁻²⁴·(1 + S) + (n + 8)·2⁻²³)·V
//!    + 1e-6`. An f32 score differs from the exact one by at most about `d·2⁻²⁴·S` (the dot
//!    product's roundings) plus the `exp`'s few ulp, a softmax moves by at most twice its largest
//!    score change in total, and the weighted sum of `n` values adds `n` roundings of at most
//!    `V`. The `bfmmla` path (bf16 ring on a CPU with FEAT_BF16) adds `2.1·Δ·V`, with
//!    `Δ = (2⁻¹⁸ + (d + 8)·2⁻²⁴)·S` as derived in `attention_props.rs`.

use half::bf16;
use kernels::attention::{Chunks, KvDtype, KvRing};
use kernels::{KernelSet, Pool};
use proptest::prelude::*;

fn lcg(seed: &mut u64) -> f32 {
    *seed = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    ((*seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
}

/// A chunk of `t` queries for streams of `(capacity, pushes)`: `nh` heads of `hd` values, each
/// query seeing `context` entries, keys and values stored as `dtype`, all drawn from `seed`.
#[derive(Clone, Debug)]
struct Case {
    shape: Vec<(usize, usize)>,
    nh: usize,
    hd: usize,
    t: usize,
    context: usize,
    dtype: KvDtype,
    seed: u64,
}

impl Case {
    /// A fixed case: `[nh, hd, t, context]`.
    fn new(shape: &[(usize, usize)], sizes: [usize; 4], dtype: KvDtype, seed: u64) -> Case {
        let [nh, hd, t, context] = sizes;
        let shape = shape.to_vec();
        Case {
            shape,
            nh,
            hd,
            t,
            context,
            dtype,
            seed,
        }
    }

    /// The case's chunks over `rings`, with its query rows `q` (`stride` apart).
    fn chunks<'a, R>(&self, rings: R, q: &'a [f32], stride: usize) -> Chunks<'a, R> {
        Chunks {
            rings,
            m: self.shape.len(),
            q,
            q_stride: stride,
            t: self.t,
            context: self.context,
        }
    }

    /// The streams of the case, each ring and what was pushed into it, drawn from `s`.
    fn streams(&self, s: &mut u64) -> Vec<Stream> {
        (self.shape.iter())
            .map(|&(cap, pushes)| stream(cap, pushes, self.nh, self.hd, self.dtype, s))
            .collect()
    }
}

/// [`Case`]s of 1 to `streams - 1` streams with capacities below `cap` and push counts below
/// `pushes` (both raised to at least `t`: every ring holds the chunk's entries), fewer than
/// `heads` heads of an even size below 40, `t` queries and a context below `context`.
fn cases(
    cap: usize,
    pushes: usize,
    streams: usize,
    heads: usize,
    t: std::ops::Range<usize>,
    context: usize,
) -> impl Strategy<Value = Case> {
    let shape = proptest::collection::vec((1..cap, 0..pushes), 1..streams);
    let sizes = (1..heads, 1usize..20, t, 1..context);
    (shape, sizes, any::<bool>(), any::<u64>()).prop_map(
        |(shape, (nh, hd_half, t, context), bf16, seed)| Case {
            shape: shape
                .into_iter()
                .map(|(c, p)| (c.max(t), p.max(t)))
                .collect(),
            nh,
            hd: 2 * hd_half,
            t,
            context,
            dtype: if bf16 { KvDtype::Bf16 } else { KvDtype::F32 },
            seed,
        },
    )
}

/// `Chunks::attend` on `pool` against `KvRing::attend_chunk` ring by ring: bitwise equal.
fn check(case: &Case, pool: Option<&Pool>) {
    let (d, m, t, context) = (case.nh * case.hd, case.shape.len(), case.t, case.context);
    let stride = d + 3;
    // Two identical sets of rings, one for each side of the comparison.
    let rings = || -> Vec<KvRing> {
        let streams = case.streams(&mut case.seed.clone());
        streams.into_iter().map(|st| st.ring).collect()
    };
    let (mut one, many) = (rings(), rings());
    let mut s = case.seed ^ 0x9e37_79b9;
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
    let chunks = case.chunks(|j: usize| &many[j], &q, stride);
    chunks.attend(&mut got, &mut scores, pool);
    let (wb, gb): (Vec<u32>, Vec<u32>) = (
        want.iter().map(|x| x.to_bits()).collect(),
        got.iter().map(|x| x.to_bits()).collect(),
    );
    assert_eq!(wb, gb, "{case:?}");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    #[test]
    fn several_rings_match_one_at_a_time(case in cases(320, 700, 6, 6, 1..4, 400)) {
        let (p1, p2) = (Pool::new(1), Pool::new(2));
        for pool in [None, Some(&p1), Some(&p2)] {
            check(&case, pool);
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
        let case = |seed| Case::new(&shape, [8, 64, 2, 250], dtype, seed);
        let before = pool.dispatches();
        check(&case(7), Some(&pool));
        assert_eq!(pool.dispatches().wrapping_sub(before), 1);
        check(&case(8), Some(&Pool::new(1)));
    }
}

/// One stream of the naive reference: its ring and every key and value pushed into it.
struct Stream {
    ring: KvRing,
    keys: Vec<Vec<f32>>,
    values: Vec<Vec<f32>>,
}

/// A ring of `cap` entries that received `pushes` random keys (`±2`) and values (`±3`), with the
/// values as the ring stores them (bf16-rounded for a bf16 ring).
fn stream(
    cap: usize,
    pushes: usize,
    nh: usize,
    hd: usize,
    dtype: KvDtype,
    seed: &mut u64,
) -> Stream {
    let d = nh * hd;
    let mut ring = KvRing::new(cap, nh, hd, dtype).unwrap();
    let stored = |x: f32| match dtype {
        KvDtype::F32 => x,
        KvDtype::Bf16 => bf16::from_f32(x).to_f32(),
    };
    let (mut keys, mut values) = (Vec::new(), Vec::new());
    for _ in 0..pushes {
        let k: Vec<f32> = (0..d).map(|_| lcg(seed) * 2.0).collect();
        let v: Vec<f32> = (0..d).map(|_| lcg(seed) * 3.0).collect();
        ring.push(&k, &v);
        keys.push(k.into_iter().map(stored).collect());
        values.push(v.into_iter().map(stored).collect());
    }
    Stream { ring, keys, values }
}

/// Naive causal attention of query row `s` of a chunk of `t` (the query of entry
/// `p = pushes − t + s`) over entries `max(p + 1 − context, pushes − cap) ..= p`, head `h`, in
/// f64. Returns the output and the tolerance of the module docs for it.
#[allow(clippy::too_many_arguments)]
fn naive_head(
    st: &Stream,
    q: &[f32],
    h: usize,
    hd: usize,
    s: usize,
    t: usize,
    context: usize,
    bfmmla: bool,
) -> (Vec<f64>, f64) {
    let pushes = st.keys.len();
    let cap = st.ring.capacity();
    let p = pushes - t + s;
    let lo = (p + 1)
        .saturating_sub(context)
        .max(pushes.saturating_sub(cap));
    let cols = h * hd..(h + 1) * hd;
    let inv = 1.0 / (hd as f64).sqrt();
    let (mut scores, mut mags) = (Vec::new(), Vec::new());
    for k in &st.keys[lo..=p] {
        let (dot, mag) = k[cols.clone()]
            .iter()
            .zip(q)
            .fold((0f64, 0f64), |(a, m), (&k, &q)| {
                (a + k as f64 * q as f64, m + (k as f64 * q as f64).abs())
            });
        scores.push(dot * inv);
        mags.push(mag * inv);
    }
    let top = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let w: Vec<f64> = scores.iter().map(|x| (x - top).exp()).collect();
    let z: f64 = w.iter().sum();
    let mut out = vec![0f64; hd];
    let mut vmax = 0f64;
    for (wi, v) in w.iter().zip(&st.values[lo..=p]) {
        for (o, &x) in out.iter_mut().zip(&v[cols.clone()]) {
            *o += wi / z * x as f64;
            vmax = vmax.max((x as f64).abs());
        }
    }
    let smax = mags.iter().cloned().fold(0f64, f64::max);
    let n = (p + 1 - lo) as f64;
    let eps = 2f64.powi(-24);
    let mut tol =
        (2.2 * (hd as f64 + 8.0) * eps * (1.0 + smax) + (n + 8.0) * 2.0 * eps) * vmax + 1e-6;
    if bfmmla {
        let delta = (2f64.powi(-18) + (hd as f64 + 8.0) * eps) * smax;
        tol += 2.1 * delta * vmax;
    }
    (out, tol)
}

/// Says once per set and process that a set this CPU lacks is left out.
fn say_skipped(set: KernelSet) {
    use std::sync::Mutex;
    static SAID: Mutex<Vec<KernelSet>> = Mutex::new(Vec::new());
    let mut said = SAID.lock().unwrap();
    if !said.contains(&set) {
        said.push(set);
        eprintln!("attention_chunks: the {set} kernels are not available on this CPU: skipped");
    }
}

/// Every kernel set's `Chunks::attend_with` against [`naive_head`].
fn check_naive(case: &Case, pool: Option<&Pool>) {
    let (nh, hd, t, context) = (case.nh, case.hd, case.t, case.context);
    let (d, m) = (nh * hd, case.shape.len());
    let stride = d + 1;
    let mut s = case.seed | 1;
    let streams = case.streams(&mut s);
    let q: Vec<f32> = (0..m * t * stride).map(|_| lcg(&mut s) * 2.0).collect();
    let mut scores = Vec::new();
    for set in KernelSet::ALL {
        let mut got = vec![f32::NAN; m * t * d];
        let chunks = case.chunks(|j: usize| &streams[j].ring, &q, stride);
        let ran = chunks.attend_with(set, &mut got, &mut scores, pool);
        if ran.is_err() {
            assert!(!set.available(), "{set} refused although available");
            say_skipped(set);
            continue;
        }
        let bfmmla = set.bfmmla_attention() && case.dtype == KvDtype::Bf16;
        for (j, st) in streams.iter().enumerate() {
            for row in 0..t {
                let r = j * t + row;
                for h in 0..nh {
                    let qh = &q[r * stride + h * hd..r * stride + (h + 1) * hd];
                    let (want, tol) = naive_head(st, qh, h, hd, row, t, context, bfmmla);
                    let g = &got[r * d + h * hd..r * d + (h + 1) * hd];
                    for (i, (&g, &w)) in g.iter().zip(&want).enumerate() {
                        // Written so that NaN fails: `!(x <= tol)`.
                        let err = (g as f64 - w).abs();
                        assert!(
                            err <= tol,
                            "{set} {case:?}: stream {j} row {row} head {h} [{i}]: {g} vs {w} \
                             (tol {tol:e})"
                        );
                    }
                }
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]
    /// t > 1 queries per stream; capacities and push counts such that most rings wrapped.
    #[test]
    fn every_set_matches_a_naive_f64_attention(case in cases(40, 120, 4, 4, 2..6, 60)) {
        check_naive(&case, None);
    }
}

/// Fixed cases: Mimi's shape (8 heads of 64, context 250, t = 2) wrapped and not, a context
/// shorter than the ring, a ring shorter than the context, a chunk as long as the ring; one
/// pool dispatch for several streams.
#[test]
fn fixed_shapes_match_a_naive_f64_attention() {
    let pool = Pool::new(2);
    for dtype in [KvDtype::F32, KvDtype::Bf16] {
        let mimi = [(250, 2), (250, 251), (250, 600)];
        check_naive(&Case::new(&mimi, [8, 64, 2, 250], dtype, 3), Some(&pool));
        check_naive(
            &Case::new(&[(16, 40), (16, 7)], [2, 16, 4, 5], dtype, 4),
            None,
        );
        check_naive(&Case::new(&[(6, 20)], [3, 8, 3, 50], dtype, 5), None);
        check_naive(&Case::new(&[(4, 9)], [1, 32, 4, 4], dtype, 6), None);
    }
}
