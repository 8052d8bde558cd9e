//! Property tests: convolution GEMM paths (SIMD, scalar micro-kernel, pool) against the
//! direct scalar definition. Tolerance: 1e-5 · (Σ|w·x| + 1) per output (order only).

use kernels::conv::{Conv1d, ConvTranspose1d};
use kernels::Pool;
use proptest::prelude::*;

mod common;
use common::vals;

fn close(a: &[f32], b: &[f32], tol: f32) {
    assert_eq!(a.len(), b.len());
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!((x - y).abs() <= tol, "index {i}: {x} vs {y}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 40, .. ProptestConfig::default() })]

    #[test]
    fn conv1d_paths_agree(ig in 1usize..6, og in 1usize..9, groups in 1usize..3, k in 1usize..6,
                          stride in 1usize..4, dilation in 1usize..3, t_extra in 0usize..40, seed in any::<u64>()) {
        let (inc, outc) = (ig * groups, og * groups);
        let w = vals(seed, outc * ig * k);
        let bias = vals(seed ^ 7, outc);
        let conv = Conv1d::new(w, Some(bias), inc, outc, k, stride, dilation, groups).unwrap();
        let t_in = conv.effective_kernel() + t_extra;
        let x = vals(seed ^ 99, inc * t_in);
        let t_out = conv.out_len(t_in);
        let mut want = vec![0f32; outc * t_out];
        conv.forward_reference(&x, &mut want).unwrap();
        let tol = 1e-5 * (ig * k) as f32 + 1e-6;
        let mut got = vec![0f32; outc * t_out];
        conv.forward(&x, &mut got).unwrap();
        close(&got, &want, tol);
        conv.forward_scalar_gemm(&x, &mut got).unwrap();
        close(&got, &want, tol);
        let pool = Pool::new(2);
        conv.forward_pool(&x, &mut got, &pool).unwrap();
        close(&got, &want, tol);
    }

    #[test]
    fn conv_transpose_paths_agree(ig in 1usize..8, og in 1usize..8, groups in 1usize..3, k in 1usize..9,
                                  stride in 1usize..5, t_in in 1usize..30, seed in any::<u64>()) {
        let (inc, outc) = (ig * groups, og * groups);
        let w = vals(seed, inc * og * k);
        let bias = vals(seed ^ 3, outc);
        let conv = ConvTranspose1d::new(w, Some(bias), inc, outc, k, stride, groups).unwrap();
        let x = vals(seed ^ 5, inc * t_in);
        let t_out = conv.out_len(t_in);
        let mut want = vec![0f32; outc * t_out];
        conv.forward_reference(&x, &mut want).unwrap();
        let tol = 1e-5 * (ig * k) as f32 + 1e-6;
        let mut got = vec![0f32; outc * t_out];
        conv.forward(&x, &mut got).unwrap();
        close(&got, &want, tol);
        conv.forward_scalar_gemm(&x, &mut got).unwrap();
        close(&got, &want, tol);
        let pool = Pool::new(2);
        conv.forward_pool(&x, &mut got, &pool).unwrap();
        close(&got, &want, tol);
    }
}

/// Big enough to take the threaded paths (the small cases above run inline).
#[test]
fn large_convs_threaded_match_reference() {
    let pool = Pool::new(2);
    let conv = Conv1d::new(vals(1, 48 * 32 * 3), Some(vals(2, 48)), 32, 48, 3, 1, 2, 1).unwrap();
    let x = vals(3, 32 * 300);
    let t = conv.out_len(300);
    let (mut a, mut b) = (vec![0f32; 48 * t], vec![0f32; 48 * t]);
    conv.forward_reference(&x, &mut a).unwrap();
    conv.forward_pool(&x, &mut b, &pool).unwrap();
    close(&a, &b, 1e-3);
    let ct =
        ConvTranspose1d::new(vals(4, 64 * 40 * 8), Some(vals(5, 40)), 64, 40, 8, 4, 1).unwrap();
    let x = vals(6, 64 * 100);
    let t = ct.out_len(100);
    let (mut a, mut b) = (vec![0f32; 40 * t], vec![0f32; 40 * t]);
    ct.forward_reference(&x, &mut a).unwrap();
    ct.forward_pool(&x, &mut b, &pool).unwrap();
    close(&a, &b, 1e-3);
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
