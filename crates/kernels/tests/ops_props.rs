//! Property tests for the SIMD row ops against their scalar references.
//! Tolerance: 1e-5 · Σ|a·b| + 1e-6 (summation order only).

use kernels::ops;
use proptest::prelude::*;

proptest! {
    #[test]
    fn dot_matches_reference(v in proptest::collection::vec(-4.0f32..4.0, 0..200)) {
        let a = &v;
        let b: Vec<f32> = v.iter().rev().map(|x| x * 0.5 + 0.25).collect();
        let mag: f32 = a.iter().zip(&b).map(|(x, y)| (x * y).abs()).sum();
        let (s, r) = (ops::dot(a, &b), ops::dot_reference(a, &b));
        prop_assert!((s - r).abs() <= 1e-5 * mag + 1e-6, "{} vs {}", s, r);
        let bb: Vec<u16> = b.iter().map(|x| half::bf16::from_f32(*x).to_bits()).collect();
        let (s, r) = (ops::dot_bf16(a, &bb), ops::dot_bf16_reference(a, &bb));
        prop_assert!((s - r).abs() <= 1e-5 * mag + 1e-6, "{} vs {}", s, r);
    }

    #[test]
    fn layer_norm_has_zero_mean_unit_variance(v in proptest::collection::vec(-10.0f32..10.0, 2..100)) {
        let n = v.len();
        let spread = v.iter().cloned().fold(f32::NEG_INFINITY, f32::max) - v.iter().cloned().fold(f32::INFINITY, f32::min);
        prop_assume!(spread > 1e-2);
        let mut out = vec![0f32; n];
        ops::layer_norm(&v, &vec![1.0; n], &vec![0.0; n], 1e-8, &mut out);
        let mean: f32 = out.iter().sum::<f32>() / n as f32;
        let var: f32 = out.iter().map(|x| (x - mean) * (x - mean)).sum::<f32>() / n as f32;
        prop_assert!(mean.abs() < 1e-4 && (var - 1.0).abs() < 1e-3);
    }
}

#[test]
fn gelu_matches_erf_definition() {
    // GELU(x) = x·Φ(x); Φ(1) = 0.841344746068543 (standard normal CDF table value).
    let mut x = [1.0f32, 0.0, -1.0];
    ops::gelu_erf(&mut x);
    assert!((x[0] - 0.841_344_7).abs() < 1e-6);
    assert_eq!(x[1], 0.0);
    assert!((x[2] + (1.0 - 0.841_344_7)).abs() < 1e-6);
}

proptest! {
    #[test]
    fn axpy_matches_reference(v in proptest::collection::vec(-4.0f32..4.0, 0..100), a in -2.0f32..2.0) {
        let mut y1: Vec<f32> = v.iter().map(|x| x * 0.3 - 1.0).collect();
        let mut y2 = y1.clone();
        ops::axpy(&mut y1, a, &v);
        ops::axpy_reference(&mut y2, a, &v);
        prop_assert_eq!(&y1, &y2);
        let vb: Vec<u16> = v.iter().map(|x| half::bf16::from_f32(*x).to_bits()).collect();
        ops::axpy_bf16(&mut y1, a, &vb);
        ops::axpy_bf16_reference(&mut y2, a, &vb);
        prop_assert_eq!(&y1, &y2);
    }
}
