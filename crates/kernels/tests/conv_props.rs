//! Property tests: convolution GEMM paths (SIMD, scalar micro-kernel, pool) against the
//! direct scalar definition. Tolerance: 1e-5 · (Σ|w·x| + 1) per output (order only).

use kernels::conv::{Conv1d, ConvTranspose1d};
use kernels::Pool;
use proptest::prelude::*;

mod common;
use common::{close, conv1d_case, conv_transpose_case, vals, ConvCase};

/// Runs the three public paths of a [`common::ConvCase`] (`forward`, `forward_scalar_gemm`,
/// `forward_pool` on two threads) and checks each against the reference output. A macro: the
/// two convolution types share these methods but no trait.
macro_rules! check_paths {
    ($case:expr) => {{
        let ConvCase {
            conv, x, want, tol, ..
        } = $case;
        let mut got = vec![0f32; want.len()];
        conv.forward(&x, &mut got).unwrap();
        close(&got, &want, tol, "forward");
        conv.forward_scalar_gemm(&x, &mut got).unwrap();
        close(&got, &want, tol, "scalar gemm");
        let pool = Pool::new(2);
        conv.forward_pool(&x, &mut got, &pool).unwrap();
        close(&got, &want, tol, "pool");
    }};
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 40, .. ProptestConfig::default() })]

    #[test]
    fn conv1d_paths_agree(ig in 1usize..6, og in 1usize..9, groups in 1usize..3, k in 1usize..6,
                          stride in 1usize..4, dilation in 1usize..3, t_extra in 0usize..40, seed in any::<u64>()) {
        check_paths!(conv1d_case(ig, og, groups, k, stride, dilation, t_extra, seed));
    }

    #[test]
    fn conv_transpose_paths_agree(ig in 1usize..8, og in 1usize..8, groups in 1usize..3, k in 1usize..9,
                                  stride in 1usize..5, t_in in 1usize..30, seed in any::<u64>()) {
        check_paths!(conv_transpose_case(ig, og, groups, k, stride, t_in, seed));
    }
}

/// Checks `forward_pool` on `$pool` against `forward_reference` for `$conv` on an input of
/// `$t_in` steps drawn from `$seed`. A macro for the same reason as `check_paths!`.
macro_rules! check_threaded {
    ($conv:expr, $t_in:expr, $seed:expr, $pool:expr, $what:expr) => {{
        let conv = $conv;
        let x = vals($seed, conv.in_channels() * $t_in);
        let len = conv.out_channels() * conv.out_len($t_in);
        let (mut a, mut b) = (vec![0f32; len], vec![0f32; len]);
        conv.forward_reference(&x, &mut a).unwrap();
        conv.forward_pool(&x, &mut b, $pool).unwrap();
        close(&a, &b, 1e-3, $what);
    }};
}

/// Big enough to take the threaded paths (the small cases above run inline).
#[test]
fn large_convs_threaded_match_reference() {
    let pool = Pool::new(2);
    let conv = Conv1d::new(vals(1, 48 * 32 * 3), Some(vals(2, 48)), 32, 48, 3, 1, 2, 1).unwrap();
    check_threaded!(conv, 300, 3, &pool, "threaded conv1d");
    let ct =
        ConvTranspose1d::new(vals(4, 64 * 40 * 8), Some(vals(5, 40)), 64, 40, 8, 4, 1).unwrap();
    check_threaded!(ct, 100, 6, &pool, "threaded conv transpose");
}

#[test]
fn conv_constructors_reject_bad_sizes() {
    assert!(Conv1d::new(vec![0.0; 5], None, 2, 2, 1, 1, 1, 1).is_err());
    assert!(Conv1d::new(vec![0.0; 4], None, 3, 2, 1, 1, 1, 2).is_err());
    assert!(Conv1d::new(vec![0.0; 4], None, 2, 2, 1, 0, 1, 1).is_err());
    assert!(ConvTranspose1d::new(vec![0.0; 3], None, 2, 2, 1, 1, 1).is_err());
    let c = Conv1d::new(vec![1.0; 4], None, 2, 2, 1, 1, 1, 1).unwrap();
    assert!(c.forward(&[0.0; 5], &mut [0.0; 4]).is_err());
}
