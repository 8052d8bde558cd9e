//! The exact-reference switch (`MOSHI_KERNELS_F32_ACTIVATIONS`, [`kernels::set_f32_activations`]):
//! quantized weights (Q8_0, Q4_0, MLX affine 4/8) times f32 activations, checked against an
//! independent f64 product of the dequantized weights (`Matrix::row_f32`).
//! Tolerance: `1e-6 · Σ|w·x|` (f32 summation only; no activation rounding). The switch is
//! process-wide, so this file is its own test binary.

use kernels::{Matrix, Pool, Scratch, WeightFormat};
use proptest::prelude::*;

mod common;
use common::{matmul_cases, vals, MatmulCase};

const FORMATS: [WeightFormat; 4] = [
    WeightFormat::Q8_0,
    WeightFormat::Q4_0,
    WeightFormat::MlxAffine { bits: 4, group: 32 },
    WeightFormat::MlxAffine { bits: 8, group: 64 },
];

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, .. ProptestConfig::default() })]

    #[test]
    fn quantized_times_f32_activations_is_exact(case in matmul_cases(6)) {
        kernels::set_f32_activations(true);
        prop_assert!(kernels::f32_activations());
        let MatmulCase { rows, cols, n, seed } = case;
        let w = case.weights();
        // Activations far from any 8-bit grid: a large dynamic range inside each block.
        let x: Vec<f32> = vals(seed ^ 0x9e37, n * cols)
            .iter()
            .enumerate()
            .map(|(i, v)| v * if i % 7 == 0 { 50.0 } else { 0.01 })
            .collect();
        let pool = Pool::new(2);
        for fmt in FORMATS {
            let m = Matrix::encode(fmt, rows, cols, &w).unwrap();
            let mut deq = vec![0f32; rows * cols];
            for r in 0..rows {
                m.row_f32(r, &mut deq[r * cols..(r + 1) * cols]);
            }
            let mut y = vec![0f32; n * rows];
            m.matmul(&x, n, &mut y, &mut Scratch::new());
            let mut yp = vec![0f32; n * rows];
            pool.matmul(&m, &x, n, &mut yp);
            prop_assert_eq!(&y, &yp);
            for i in 0..n {
                for r in 0..rows {
                    let (wr, xi) = (&deq[r * cols..(r + 1) * cols], &x[i * cols..(i + 1) * cols]);
                    let exact: f64 = wr.iter().zip(xi).map(|(a, b)| *a as f64 * *b as f64).sum();
                    let mag: f64 = wr.iter().zip(xi).map(|(a, b)| (*a as f64 * *b as f64).abs()).sum();
                    let got = y[i * rows + r] as f64;
                    prop_assert!(
                        (got - exact).abs() <= 1e-6 * mag + 1e-30,
                        "{:?} {}x{} row {} act {}: {} vs {}", fmt, rows, cols, r, i, got, exact
                    );
                }
            }
        }
    }
}
