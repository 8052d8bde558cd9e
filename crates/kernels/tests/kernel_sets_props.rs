//! Property tests: every kernel set this CPU runs against the portable reference, for every
//! weight format. The NEON sets (baseline, dotprod, i8mm) compute the quantized products with the
//! same integer block sums and the same f32 operations in the same order as the reference, so
//! they must be bitwise equal to it; the x86 sets and the dense formats within the documented
//! summation-order tolerance `1e-5 · Σ|w·x|`.

use kernels::{KernelSet, Matrix, Scratch, WeightFormat};
use proptest::prelude::*;

mod common;
use common::{matmul_cases, vals, MatmulCase, FORMATS};

fn exact(set: KernelSet, fmt: WeightFormat) -> bool {
    let neon = matches!(
        set,
        KernelSet::Neon | KernelSet::NeonDotprod | KernelSet::NeonI8mm
    );
    let quantized = !matches!(
        fmt,
        WeightFormat::F32 | WeightFormat::Bf16 | WeightFormat::F16
    );
    neon && quantized
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, .. ProptestConfig::default() })]

    #[test]
    fn every_set_matches_the_reference(case in matmul_cases(7)) {
        let MatmulCase { rows, cols, n, seed } = case;
        let w = case.weights();
        let x: Vec<f32> = vals(seed ^ 0x51, n * cols).iter().map(|v| v * 3.0).collect();
        let mut sc = Scratch::new();
        for fmt in FORMATS {
            let m = Matrix::encode(fmt, rows, cols, &w).unwrap();
            let mut want = vec![0f32; n * rows];
            m.matmul_reference(&x, n, &mut want, &mut sc);
            for set in KernelSet::ALL {
                let mut got = vec![f32::NAN; n * rows];
                let ran = m.matmul_with(set, &x, n, &mut got, &mut sc);
                prop_assert_eq!(ran.is_ok(), set.available());
                if ran.is_err() {
                    continue;
                }
                for i in 0..n {
                    for r in 0..rows {
                        let (g, e) = (got[i * rows + r], want[i * rows + r]);
                        if exact(set, fmt) {
                            prop_assert_eq!(g.to_bits(), e.to_bits(), "{:?} {:?} row {} act {}", set, fmt, r, i);
                        } else {
                            let mut row = vec![0f32; cols];
                            m.row_f32(r, &mut row);
                            let mag: f32 = row.iter().zip(&x[i * cols..(i + 1) * cols]).map(|(a, b)| (a * b).abs()).sum();
                            prop_assert!((g - e).abs() <= 1e-5 * mag + 1e-6, "{:?} {:?}: {} vs {}", set, fmt, g, e);
                        }
                    }
                }
            }
        }
    }
}
