//! Property tests: every convolution micro-kernel (scalar, AVX2, AVX-512) and the pool
//! split against each other and against the direct definition. The GEMM micro-kernels run
//! the same FMA chain per output (k ascending, then the bias), so outputs wider than the
//! skinny path (> 4 steps) must be bitwise equal; skinny ones within the summation-order
//! tolerance `1e-5 · in·k + 1e-6` of the reference. Shapes reach every AVX-512 block
//! (1–4 row panels × 1–2 column panels) and the share boundaries of the threaded split.

use kernels::conv::{Conv1d, ConvTranspose1d};
use kernels::{KernelSet, Pool};
use proptest::prelude::*;

mod common;
use common::{close, conv1d_case, conv_transpose_case, vals};

fn bitwise(a: &[f32], b: &[f32], what: &str) {
    assert_eq!(a.len(), b.len());
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert_eq!(x.to_bits(), y.to_bits(), "{what}: index {i}: {x} vs {y}");
    }
}

/// Every kernel set, then the active one (what `forward` uses).
fn kernels_to_try() -> Vec<KernelSet> {
    let mut v = KernelSet::ALL.to_vec();
    v.push(kernels::kernel_set());
    v
}

/// One convolution call with a chosen kernel and optional pool, writing the output.
type RunConv<'a> = &'a dyn Fn(KernelSet, Option<&Pool>, &mut [f32]);

/// Runs `f(kernel, pool)` for every available kernel, with and without a pool, and checks
/// the outputs against `want` (tolerance) and against the scalar GEMM (bitwise when wide).
fn check_all(want: &[f32], tol: f32, wide: bool, f: RunConv<'_>) {
    let pool = Pool::new(2);
    let mut first = vec![0f32; want.len()];
    f(KernelSet::Scalar, None, &mut first);
    close(&first, want, tol, "scalar gemm vs reference");
    let mut avx2: Option<Vec<f32>> = None;
    for kern in kernels_to_try() {
        if !kern.available() {
            continue;
        }
        for p in [None, Some(&pool)] {
            let mut got = vec![f32::NAN; want.len()];
            f(kern, p, &mut got);
            let what = format!("{kern:?} pool={}", p.is_some());
            close(&got, want, tol, &what);
            if wide {
                bitwise(&got, &first, &what);
            }
            match &avx2 {
                Some(a) if kern != KernelSet::Scalar => bitwise(&got, a, &what),
                None if kern == KernelSet::Avx2 => avx2 = Some(got),
                _ => {}
            }
        }
    }
}

/// Lays `streams` (`[ch, t]` each) side by side (`[ch, m·t]`).
fn side_by_side(streams: &[Vec<f32>], ch: usize) -> Vec<f32> {
    let (m, t) = (streams.len(), streams[0].len() / ch);
    let mut side = vec![0f32; ch * m * t];
    for (j, x) in streams.iter().enumerate() {
        for c in 0..ch {
            side[(c * m + j) * t..(c * m + j + 1) * t].copy_from_slice(&x[c * t..(c + 1) * t]);
        }
    }
    side
}

/// `m` random streams of `[inc, t_in]` side by side, and each stream's output of `alone`
/// (`[outc, t_out]`) side by side.
fn streams_and_alone(
    (inc, outc): (usize, usize),
    (t_in, t_out): (usize, usize),
    m: usize,
    seed: u64,
    alone: &dyn Fn(&[f32], &mut [f32]),
) -> (Vec<f32>, Vec<f32>) {
    let streams: Vec<Vec<f32>> = (0..m as u64)
        .map(|j| common::vals(seed ^ ((j + 1) * 31), inc * t_in))
        .collect();
    let outs: Vec<Vec<f32>> = streams
        .iter()
        .map(|x| {
            let mut y = vec![0f32; outc * t_out];
            alone(x, &mut y);
            y
        })
        .collect();
    (side_by_side(&streams, inc), side_by_side(&outs, outc))
}

/// The call `run` of `m` streams (`side`), on the calling thread and on a pool: each returns
/// `t_out` and writes `want` bitwise.
type RunStreams<'a> = &'a dyn Fn(&[f32], &mut [f32], Option<&Pool>) -> usize;
fn check_streams(side: &[f32], want: &[f32], m: usize, t_out: usize, run: RunStreams<'_>) {
    let pool = Pool::new(2);
    for p in [None, Some(&pool)] {
        let mut got = vec![f32::NAN; want.len()];
        assert_eq!(run(side, &mut got, p), t_out);
        bitwise(&got, want, &format!("{m} streams, pool={}", p.is_some()));
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, .. ProptestConfig::default() })]

    #[test]
    fn conv1d_kernels_agree(ig in 1usize..12, og in 1usize..40, groups in 1usize..3, k in 1usize..6,
                            stride in 1usize..4, dilation in 1usize..3, t_extra in 0usize..80,
                            seed in any::<u64>()) {
        let c = conv1d_case(ig, og, groups, k, stride, dilation, t_extra, seed);
        check_all(&c.want, c.tol, c.t_out > 4, &|kern, pool, out| {
            c.conv.forward_kernel(kern, &c.x, out, pool).unwrap();
        });
    }

    /// Several streams side by side (`forward_streams`) give each stream's output of
    /// `forward` bitwise, on the calling thread and on a pool.
    #[test]
    fn conv1d_streams_equal_each_alone(ig in 1usize..12, og in 1usize..40, groups in 1usize..3,
                                       k in 1usize..6, stride in 1usize..4, dilation in 1usize..3,
                                       t_extra in 0usize..80, m in 1usize..5, seed in any::<u64>()) {
        let c = conv1d_case(ig, og, groups, k, stride, dilation, t_extra, seed);
        let (inc, outc) = (c.conv.in_channels(), c.conv.out_channels());
        let t_in = c.x.len() / inc;
        let t_out = c.t_out;
        let (side, want) = streams_and_alone((inc, outc), (t_in, t_out), m, seed, &|x, y| {
            c.conv.forward(x, y).unwrap();
        });
        check_streams(&side, &want, m, t_out, &|x, y, p| c.conv.forward_streams(x, m, y, p).unwrap());
    }

    /// As `conv1d_streams_equal_each_alone`, for the transposed convolution (groups = 1).
    #[test]
    fn conv_transpose_streams_equal_each_alone(ig in 1usize..12, og in 1usize..12,
                                               k in 1usize..9, stride in 1usize..5,
                                               t_in in 1usize..70, m in 1usize..5,
                                               seed in any::<u64>()) {
        let c = conv_transpose_case(ig, og, 1, k, stride, t_in, seed);
        let (inc, outc, t_out) = (ig, og, c.t_out);
        let (side, want) = streams_and_alone((inc, outc), (t_in, t_out), m, seed, &|x, y| {
            c.conv.forward(x, y).unwrap();
        });
        check_streams(&side, &want, m, t_out, &|x, y, p| c.conv.forward_streams(x, m, y, p).unwrap());
    }

    #[test]
    fn conv_transpose_kernels_agree(ig in 1usize..12, og in 1usize..12, groups in 1usize..3,
                                    k in 1usize..9, stride in 1usize..5, t_in in 1usize..70,
                                    seed in any::<u64>()) {
        let c = conv_transpose_case(ig, og, groups, k, stride, t_in, seed);
        check_all(&c.want, c.tol, t_in > 4, &|kern, pool, out| {
            c.conv.forward_kernel(kern, &c.x, out, pool).unwrap();
        });
    }
}

/// Released-Mimi-like shapes, large enough for the threaded splits and every block size.
#[test]
fn mimi_sized_convs_agree() {
    for &(cin, cout, k, s, t_out) in &[
        (64usize, 32usize, 3usize, 1usize, 200usize),
        (64, 128, 8, 4, 97),
        (256, 70, 12, 6, 16),
        (130, 64, 3, 1, 33),
    ] {
        let conv = Conv1d::new(
            vals(1, cout * cin * k),
            Some(vals(2, cout)),
            cin,
            cout,
            k,
            s,
            1,
            1,
        )
        .unwrap();
        let t_in = (t_out - 1) * s + k;
        let x = vals(3, cin * t_in);
        let mut want = vec![0f32; cout * t_out];
        conv.forward_reference(&x, &mut want).unwrap();
        check_all(
            &want,
            1e-5 * (cin * k) as f32 + 1e-6,
            true,
            &|kern, pool, out| {
                conv.forward_kernel(kern, &x, out, pool).unwrap();
            },
        );
    }
    let ct =
        ConvTranspose1d::new(vals(4, 96 * 40 * 8), Some(vals(5, 40)), 96, 40, 8, 4, 1).unwrap();
    let x = vals(6, 96 * 100);
    let mut want = vec![0f32; 40 * ct.out_len(100)];
    ct.forward_reference(&x, &mut want).unwrap();
    check_all(&want, 1e-5 * 96.0 * 8.0 + 1e-6, true, &|kern, pool, out| {
        ct.forward_kernel(kern, &x, out, pool).unwrap();
    });
}

#[test]
fn unavailable_kernel_is_refused_not_run() {
    let conv = Conv1d::new(vec![1.0; 4], None, 2, 2, 1, 1, 1, 1).unwrap();
    let mut out = [0f32; 6];
    for kern in kernels_to_try() {
        let r = conv.forward_kernel(kern, &[1.0; 6], &mut out, None);
        assert_eq!(r.is_ok(), kern.available(), "{kern:?}");
    }
    assert!(KernelSet::Scalar.available() && kernels::kernel_set().available());
}
