//! The WGSL matrix product and embedding gather of every weight format against exact products of
//! the dequantized weights (f64) and the CPU's scalar reference.
//!
//! Bound (derived, not tuned): the kernel forms each output as a sum of `cols` products. A thread
//! adds `ceil(cols/256)` 4-term dot products in sequence, then a 6-level tree adds the 64 thread
//! sums, so every product goes through at most `m = 4·ceil(cols/256) + 6` additions and one
//! multiplication; recursive summation then errs by at most `(m + 1)·u·Σ|w·x|` (first order,
//! `u = 2⁻²⁴`). A dequantized weight `s·q + b` may be formed with or without a fused
//! multiply-add on the device and on the CPU: at most one rounding each, `2u·|w|` per weight,
//! `2u·Σ|w·x|` in total. Bound: `(4·ceil(cols/256) + 10)·u·Σ|w·x|` (for the sizes below at most
//! `14·u`, under 1e-6 relative to Σ|w·x|, well inside the 1e-5 asked of f32).

mod common;

use std::sync::OnceLock;

use gpu::{GpuContext, GpuOptions};
use kernels::{Matrix, Scratch, WeightFormat};
use proptest::prelude::*;
use testkit::FORMATS;

/// One shared device; its binding limit is set to 1 KiB so most matrices are split into
/// several row chunks (each its own binding).
fn ctx() -> Option<&'static GpuContext> {
    static CTX: OnceLock<Option<GpuContext>> = OnceLock::new();
    CTX.get_or_init(|| {
        common::context_with(GpuOptions {
            max_binding_bytes: Some(1024),
            ..Default::default()
        })
    })
    .as_ref()
}

fn dequantized(m: &Matrix) -> Vec<f32> {
    let mut w = vec![0f32; m.rows() * m.cols()];
    for (r, row) in w.chunks_exact_mut(m.cols()).enumerate() {
        m.row_f32(r, row);
    }
    w
}

fn check_product(format: WeightFormat, rows: usize, col_units: usize, n: usize, seed: u64) {
    let Some(ctx) = ctx() else { return };
    let unit = match format {
        WeightFormat::MlxAffine { group, .. } => group,
        WeightFormat::Q8_0 | WeightFormat::Q4_0 => 32,
        _ => 4,
    };
    let cols = unit * col_units;
    let m = Matrix::encode(format, rows, cols, &common::values(seed, rows * cols)).unwrap();
    let x = common::values(seed ^ 0xabcdef, n * cols);
    let y = ctx.matmul_once(&m, &x, n).unwrap();
    let w = dequantized(&m);
    let u = f64::powi(2.0, -24);
    let bound_factor = (4 * cols.div_ceil(256) + 10) as f64 * u;
    // The CPU's scalar reference in its exact mode (quantized weights × f32 activations).
    kernels::set_f32_activations(true);
    let mut cpu = vec![0f32; n * rows];
    m.matmul_reference(&x, n, &mut cpu, &mut Scratch::new());
    for b in 0..n {
        for r in 0..rows {
            let (mut exact, mut mag) = (0f64, 0f64);
            for c in 0..cols {
                let t = w[r * cols + c] as f64 * x[b * cols + c] as f64;
                exact += t;
                mag += t.abs();
            }
            let got = y[b * rows + r] as f64;
            let bound = bound_factor * mag;
            assert!(
                (got - exact).abs() <= bound,
                "{format:?} {rows}x{cols} n={n} row {r} batch {b}: gpu {got} exact {exact} bound {bound}"
            );
            // The CPU reference errs by at most 1e-6·Σ|w·x| (kernels::set_f32_activations).
            let c = cpu[b * rows + r] as f64;
            assert!(
                (got - c).abs() <= bound + 1e-6 * mag,
                "{format:?} row {r} batch {b}: gpu {got} cpu {c}"
            );
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 40, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn matmul_matches_exact_dequantized_product(
        f in 0usize..FORMATS.len(),
        rows in 1usize..40,
        col_units in 1usize..5,
        n in 1usize..=8,
        seed in any::<u64>(),
    ) {
        check_product(FORMATS[f], rows, col_units, n, seed);
    }
}

/// Every format at a size spanning several chunks and a 256-column stride, batch 1 and 8.
#[test]
fn every_format_larger_matrix() {
    for f in FORMATS {
        check_product(f, 37, 8, 1, 7);
        check_product(f, 37, 8, 8, 8);
    }
}

/// Rows gathered by the embedding kernel equal the CPU's dequantized rows: bit for bit where the
/// dequantization is exact (f32, f16, bf16, Q8_0, Q4_0: `s·q` is exact in f32), within one
/// rounding each of `s·q + b` for MLX affine.
#[test]
fn embedding_rows_match_cpu_rows() {
    let Some(ctx) = ctx() else { return };
    for f in FORMATS {
        let (rows, cols) = (21, 128);
        let m = Matrix::encode(f, rows, cols, &common::values(3, rows * cols)).unwrap();
        let tokens = [0, 20, -1, 7, 7, 13, -5, 1];
        let got = ctx.embed_sum_once(&[&m], &tokens).unwrap();
        let mut want = vec![0f32; cols];
        for (b, &t) in tokens.iter().enumerate() {
            if t == -1 {
                want.fill(0.0);
            } else {
                m.row_f32(t.max(0) as usize, &mut want);
            }
            for c in 0..cols {
                let (g, w) = (got[b * cols + c], want[c]);
                if matches!(f, WeightFormat::MlxAffine { .. }) {
                    assert!(
                        (g - w).abs() <= 2.0 * f32::EPSILON * w.abs().max(1e-30) + 1e-7,
                        "{f:?} token {t} col {c}: {g} vs {w}"
                    );
                } else {
                    // Equal values (the device sums onto +0, so a −0 row entry reads +0).
                    assert_eq!(g, w, "{f:?} token {t} col {c}");
                }
            }
        }
    }
}

/// `Σ_e tables[e][tokens[b·T + e]]` on the CPU: the rows added one table after another onto
/// zeros, as the LM's plan adds its input embeddings (−1 adds nothing, negative reads row 0).
fn cpu_embedding_sum(tables: &[Matrix], tokens: &[i32], cols: usize) -> (Vec<f32>, Vec<f32>) {
    let t = tables.len();
    let n = tokens.len() / t;
    let (mut sum, mut mag) = (vec![0f32; n * cols], vec![0f32; n * cols]);
    let mut row = vec![0f32; cols];
    for b in 0..n {
        for (e, m) in tables.iter().enumerate() {
            let tok = tokens[b * t + e];
            if tok == -1 {
                continue;
            }
            m.row_f32(tok.max(0) as usize, &mut row);
            for c in 0..cols {
                sum[b * cols + c] += row[c];
                mag[b * cols + c] += row[c].abs();
            }
        }
    }
    (sum, mag)
}

/// One embedding sum on `ctx`: `t` tables of `rows(e)` rows and `cols` columns, `n` token rows.
/// Equal bit for bit to the CPU's sum where the dequantization is exact (f32, f16, bf16, Q8_0,
/// Q4_0); for MLX affine each dequantized value may differ by one rounding (`s·q + b` with or
/// without a fused multiply-add), and the additions, made in the same order, by one rounding of
/// each partial sum: within `(t + 2)·ε·Σ|row values|`.
fn check_sum(ctx: &GpuContext, f: WeightFormat, rows: &[usize], cols: usize, n: usize, seed: u64) {
    let tables: Vec<Matrix> = rows
        .iter()
        .enumerate()
        .map(|(e, &r)| {
            Matrix::encode(f, r, cols, &common::values(seed + e as u64, r * cols)).unwrap()
        })
        .collect();
    let t = tables.len();
    // Every kind of token: first and last rows, −1, other negatives, repeats.
    let tokens: Vec<i32> = (0..n * t)
        .map(|i| {
            let r = rows[i % t] as i32;
            match (i as u64 + seed) % 7 {
                0 => -1,
                1 => -3,
                2 => r - 1,
                _ => ((i as u64 * 2654435761 + seed) % r as u64) as i32,
            }
        })
        .collect();
    let refs: Vec<&Matrix> = tables.iter().collect();
    let got = ctx.embed_sum_once(&refs, &tokens).unwrap();
    let (want, mag) = cpu_embedding_sum(&tables, &tokens, cols);
    for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
        if matches!(f, WeightFormat::MlxAffine { .. }) {
            let bound = (t + 2) as f32 * f32::EPSILON * mag[i] + 1e-7;
            assert!((g - w).abs() <= bound, "{f:?} value {i}: {g} vs {w}");
        } else {
            assert_eq!(g.to_bits(), w.to_bits(), "{f:?} {rows:?}x{cols} value {i}");
        }
    }
}

/// The embedding sum of the LM's temporal step (one launch for all its tables) equals the CPU's
/// sum of the tables' rows in order: at Moshi's shape (17 tables of 4096 columns, fewer rows) on
/// a device that binds them whole, and at odd shapes on one whose 1 KiB bindings split the arena
/// into several chunks (each launch adds the entries of its rows, in order).
#[test]
fn embedding_sums_match_the_cpu_sum_in_order() {
    if let Some(whole) = common::context() {
        for f in FORMATS {
            let mut rows = vec![9; 16];
            rows.push(13);
            check_sum(&whole, f, &rows, 4096, 3, 11);
        }
    }
    let Some(split) = ctx() else { return };
    for f in FORMATS {
        let cols = 8 * common::col_unit(f);
        check_sum(split, f, &[7, 5, 9], cols, 8, 21);
        check_sum(split, f, &[3], cols, 5, 4);
    }
}

/// The lossless export the upload relies on: `checkpoint_parts` of an encoded matrix rebuilt
/// through the on-disk constructors gives the same matrix (same dequantized rows).
#[test]
fn checkpoint_parts_round_trip() {
    use kernels::Storage;
    for f in FORMATS {
        let (rows, cols) = (19, 128);
        let m = Matrix::encode(f, rows, cols, &common::values(5, rows * cols)).unwrap();
        let p = m.checkpoint_parts();
        let u16_bytes =
            |v: &[u16]| Storage::from_vec(v.iter().flat_map(|h| h.to_le_bytes()).collect());
        let back = match f {
            WeightFormat::MlxAffine { bits, group } => Matrix::from_mlx(
                bits,
                group,
                rows,
                cols,
                Storage::from_vec(p.codes.clone()),
                u16_bytes(&p.scales),
                u16_bytes(&p.biases),
            )
            .unwrap(),
            WeightFormat::Q8_0 | WeightFormat::Q4_0 => {
                // Reassemble the GGUF blocks: scale ‖ codes.
                let cb = if f == WeightFormat::Q8_0 { 32 } else { 16 };
                let mut bytes = Vec::new();
                for (i, s) in p.scales.iter().enumerate() {
                    bytes.extend_from_slice(&s.to_le_bytes());
                    bytes.extend_from_slice(&p.codes[i * cb..(i + 1) * cb]);
                }
                Matrix::from_bytes(f, rows, cols, Storage::from_vec(bytes)).unwrap()
            }
            _ => Matrix::from_bytes(f, rows, cols, Storage::from_vec(p.codes.clone())).unwrap(),
        };
        assert_eq!(dequantized(&m), dequantized(&back), "{f:?}");
        assert_eq!(back.checkpoint_parts(), p, "{f:?}");
    }
}
