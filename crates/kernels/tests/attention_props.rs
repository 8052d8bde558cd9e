//! Property tests: the attention of every kernel set this CPU runs against the scalar
//! reference `KvRing::attend_reference`, for f32 and bf16 rings, wrapped and partial windows.
//!
//! Tolerance per output element: `2e-6 · (1 + S) · max|v| + 1e-6`, where `S` is the largest
//! `Σ|q·k|/√d` over the window: the scores differ from the reference by summation order
//! (relative 1e-6 of `S`), which moves each probability by about that much, and the vector
//! `exp` differs from libm by a few ulp.
//!
//! The `bfmmla` path (bf16 keys on a CPU with FEAT_BF16) multiplies bf16 halves of the query:
//! its scores are within `Δ = (2⁻¹⁸ + (d + 8)·2⁻²⁴)·S` of exact ones (the split leaves
//! `2⁻¹⁸·|q|`; each of at most d/2 + 4 round-to-odd additions along a lane errs by under one f32
//! ulp, 2⁻²³ of a partial sum bounded by `Σ|q·k|`). A softmax moves by at most twice its largest
//! score change in total (`Δp_e = p_e·(Δs_e − Σ p_j·Δs_j)`), so that path adds
//! `2.1 · Δ · max|v|` (2 plus a margin for the second-order terms at Δ ≤ 1e-3).

use kernels::attention::{KvDtype, KvRing};
use kernels::KernelSet;
use proptest::prelude::*;

fn lcg(seed: &mut u64) -> f32 {
    *seed = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    ((*seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
}

#[allow(clippy::too_many_arguments)]
fn check(
    hd: usize,
    nh: usize,
    cap: usize,
    pushes: usize,
    window: usize,
    dtype: KvDtype,
    seed: u64,
    scale: f32,
) {
    let mut s = seed;
    let mut ring = KvRing::new(cap, nh, hd, dtype).unwrap();
    let d = nh * hd;
    let mut ks = Vec::new();
    let mut vs = Vec::new();
    for _ in 0..pushes {
        let k: Vec<f32> = (0..d).map(|_| lcg(&mut s) * scale).collect();
        let v: Vec<f32> = (0..d).map(|_| lcg(&mut s) * 3.0).collect();
        ring.push(&k, &v);
        ks.push(k);
        vs.push(v);
    }
    let q: Vec<f32> = (0..d).map(|_| lcg(&mut s) * scale).collect();
    let mut want = vec![0f32; d];
    ring.attend_reference(&q, &mut want, window);
    let n = window.min(pushes).min(cap);
    let inv = 1.0 / (hd as f32).sqrt();
    for set in KernelSet::ALL {
        let mut got = vec![f32::NAN; d];
        if ring.attend_with(set, &q, &mut got, window).is_err() {
            assert!(!set.available());
            continue;
        }
        for h in 0..nh {
            let sl = h * hd..(h + 1) * hd;
            let smax = ks[pushes - n..]
                .iter()
                .map(|k| {
                    k[sl.clone()]
                        .iter()
                        .zip(&q[sl.clone()])
                        .map(|(a, b)| (a * b).abs())
                        .sum::<f32>()
                        * inv
                })
                .fold(0f32, f32::max);
            let vmax = vs[pushes - n..]
                .iter()
                .flat_map(|v| v[sl.clone()].iter().map(|x| x.abs()))
                .fold(0f32, f32::max);
            let mut tol = 2e-6 * (1.0 + smax) * vmax + 1e-6;
            if set.bfmmla_attention() && dtype == KvDtype::Bf16 {
                let delta = (2f32.powi(-18) + (hd as f32 + 8.0) * 2f32.powi(-24)) * smax;
                tol += 2.1 * delta * vmax;
            }
            for i in sl.clone() {
                assert!(
                    (got[i] - want[i]).abs() <= tol,
                    "{set} {dtype:?} hd {hd} nh {nh} cap {cap} pushes {pushes} window {window}: \
                     [{i}] {} vs {} (tol {tol})",
                    got[i],
                    want[i]
                );
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    #[test]
    fn attend_matches_reference(
        hdi in 0usize..6,
        nh in 1usize..4,
        cap in 1usize..70,
        pushes in 1usize..150,
        window in 1usize..80,
        bf16 in any::<bool>(),
        seed in any::<u64>(),
        big in any::<bool>(),
    ) {
        let hd = [16usize, 32, 64, 128, 24, 256][hdi];
        let dtype = if bf16 { KvDtype::Bf16 } else { KvDtype::F32 };
        check(hd, nh, cap, pushes, window, dtype, seed, if big { 4.0 } else { 1.0 });
    }
}

#[test]
fn long_window_bf16_and_f32() {
    // The shapes of the released temporal transformer (head_dim 128) at a full 3000 window,
    // wrapped, and the Depformer's (head_dim 64, 8 entries).
    for dtype in [KvDtype::Bf16, KvDtype::F32] {
        check(128, 2, 3000, 3500, 3000, dtype, 7, 2.0);
        check(64, 3, 8, 8, 8, dtype, 9, 1.0);
    }
}

proptest! {
    /// The ring's f32 → bf16 conversion (AVX-512 when available) equals `half`'s, bit for bit,
    /// including ties, subnormals, infinities and NaN (quiet).
    #[test]
    fn push_rounds_like_half(bits in proptest::collection::vec(any::<u32>(), 16..64)) {
        let mut x: Vec<f32> = bits.iter().map(|b| f32::from_bits(*b)).collect();
        x[0] = f32::from_bits(0x3f80_8000); // tie, even below → stays
        x[1] = f32::from_bits(0x3f81_8000); // tie, odd below → rounds up
        x[2] = f32::INFINITY;
        x[3] = f32::NAN;
        x[4] = f32::from_bits(0x0000_8001); // subnormal
        let mut got = vec![0u16; x.len()];
        let mut want = vec![0u16; x.len()];
        kernels::attention::to_bf16(&x, &mut got);
        kernels::attention::to_bf16_reference(&x, &mut want);
        prop_assert_eq!(got, want);
    }
}
