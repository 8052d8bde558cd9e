//! Properties of the matrix product's fusions (`Fuse::Norm`: RMS norm in the prologue, as the
//! LM's `in_proj` runs; `Fuse::NormGate`: that and the gated SiLU in the epilogue, as `lin_in`
//! runs) against an exact f64 computation of the CPU's definition (`kernels::ops::rms_norm`,
//! `kernels::ops::silu_gate` of the product), for every weight format: at Moshi's shapes, at
//! odd shapes, in small bindings (chunks), on both reduction paths.
//!
//! Tolerance (derived from the kernel's operations, not tuned; `u = 2⁻²⁴`, one ULP ≤ `2u`
//! relative):
//! * the sum of squares is a sum of positive terms through at most `c = 4 + ⌈cols/1024⌉ + 8`
//!   roundings (a lane's `dot` of a `vec4`, its running sum, the 256-wide tree), so it is within
//!   `c·u` relative; dividing by `cols` and adding `eps` round twice more; `sqrt` halves the
//!   relative error of its argument and is within WGSL's accuracy of `1/inverseSqrt` (2 + 2.5
//!   ULP), the reciprocal 2.5 ULP more: `δ = ((c + 2)/2 + 14)·u` bounds the norm factor's relative
//!   error;
//! * each activation `x·(w·inv)` rounds twice more, then the product's own bound
//!   (`tests/matvec_props.rs`: `m = V + ⌈S/32⌉ + 8` roundings per term): a product is within
//!   `E = (m + 2)·u·Σ|W·h| + δ·Σ|W·h|` of the exact `Σ W·h` (`h` the exact normed activations);
//! * the gate `a / (1 + e^−a) · g`: the error `E_a` of `a` moves `silu(a)` by at most
//!   `1.1·E_a` (`|silu'| < 1.1`), `exp` is within WGSL's `3 + 2|a|` ULP, the addition, the
//!   division (2.5 ULP) and the product round: `|silu(a)·g|·((3 + 2|a|)·2 + 8)·u + 1.1·E_a·|g|
//!   + |silu(a)|·E_g + 1.1·E_a·E_g`.

mod common;

use common::{col_unit, matvec_context as ctx, step_values};
use gpu::shaders::Fuse;
use gpu::GpuContext;
use kernels::{Matrix, WeightFormat};
use proptest::prelude::*;
use testkit::FORMATS;

const U: f64 = 1.0 / 16_777_216.0;
const EPS: f32 = 1e-5;

/// A case: weights, norm weights, activations, and per output of the product the exact value of
/// `Σ W·h` and its bound `E` (see the module docs).
struct Case {
    m: Matrix,
    norm: Vec<f32>,
    x: Vec<f32>,
    n: usize,
    exact: Vec<f64>,
    bound: Vec<f64>,
}

fn case(format: WeightFormat, rows: usize, cols: usize, n: usize, seed: u64) -> Case {
    let m = Matrix::encode(format, rows, cols, &common::values(seed, rows * cols)).unwrap();
    // Norm weights around 1 (as trained ones are), activations with a spread of magnitudes.
    let norm: Vec<f32> = common::values(seed ^ 0x5151, cols)
        .iter()
        .map(|v| 1.0 + 0.5 * v)
        .collect();
    let x: Vec<f32> = common::values(seed ^ 0xabcdef, n * cols)
        .iter()
        .enumerate()
        .map(|(i, v)| v * (1 + i % 7) as f32)
        .collect();
    let v = step_values(format);
    let c = 4 + cols.div_ceil(1024) + 8;
    let delta = ((c + 2) as f64 / 2.0 + 14.0) * U;
    let mm = (v + cols.div_ceil(v).div_ceil(32) + 8 + 2) as f64 * U;
    let (mut exact, mut bound) = (vec![0f64; n * rows], vec![0f64; n * rows]);
    let mut w = vec![0f32; cols];
    let mut h = vec![0f64; cols];
    for b in 0..n {
        let xb = &x[b * cols..(b + 1) * cols];
        let ss: f64 = xb.iter().map(|&v| v as f64 * v as f64).sum();
        let inv = 1.0 / (ss / cols as f64 + EPS as f64).sqrt();
        for c in 0..cols {
            h[c] = xb[c] as f64 * norm[c] as f64 * inv;
        }
        for r in 0..rows {
            m.row_f32(r, &mut w);
            let (mut e, mut a) = (0f64, 0f64);
            for (wc, hc) in w.iter().zip(&h) {
                let t = *wc as f64 * hc;
                e += t;
                a += t.abs();
            }
            exact[b * rows + r] = e;
            bound[b * rows + r] = (mm + delta) * a;
        }
    }
    Case {
        m,
        norm,
        x,
        n,
        exact,
        bound,
    }
}

fn silu(a: f64) -> f64 {
    a / (1.0 + (-a).exp())
}

/// Runs the case with `fuse` on `ctx`, checks every output against the exact value within its
/// bound, returns the device's outputs.
fn check(ctx: &GpuContext, c: &Case, fuse: Fuse, what: &str) -> Vec<f32> {
    let (rows, n) = (c.m.rows(), c.n);
    let y = ctx
        .matmul_fused_once(&c.m, fuse, &c.norm, EPS, &c.x, n)
        .unwrap();
    let fail = |i: usize, got: f64, want: f64, bound: f64| {
        panic!(
            "{what}: {fuse:?} {:?} {rows}x{} n={n} output {i}: gpu {got} exact {want} bound {bound}",
            c.m.format(),
            c.m.cols()
        )
    };
    match fuse {
        Fuse::Plain | Fuse::Norm => {
            assert_eq!(y.len(), n * rows);
            for (i, &got) in y.iter().enumerate() {
                let (got, want, bound) = (got as f64, c.exact[i], c.bound[i]);
                if !(got.is_finite() && (got - want).abs() <= bound) {
                    fail(i, got, want, bound);
                }
            }
        }
        Fuse::NormGate => {
            let hdim = rows / 2;
            assert_eq!(y.len(), n * hdim);
            for b in 0..n {
                for j in 0..hdim {
                    let (ia, ig) = (b * rows + j, b * rows + hdim + j);
                    let (a, g) = (c.exact[ia], c.exact[ig]);
                    let (ea, eg) = (c.bound[ia], c.bound[ig]);
                    let want = silu(a) * g;
                    let bound = (silu(a) * g).abs() * ((3.0 + 2.0 * a.abs()) * 2.0 + 8.0) * U
                        + 1.1 * ea * g.abs()
                        + silu(a).abs() * eg
                        + 1.1 * ea * eg;
                    let got = y[b * hdim + j] as f64;
                    if !(got.is_finite() && (got - want).abs() <= bound) {
                        fail(b * hdim + j, got, want, bound);
                    }
                }
            }
        }
    }
    y
}

/// Both reduction paths: each within the bound, and the same bits.
fn check_both_paths(small: bool, c: &Case, fuse: Fuse, what: &str) {
    let (Some(sg), Some(fb)) = (ctx(small, true), ctx(small, false)) else {
        return;
    };
    let a = check(sg, c, fuse, &format!("{what} subgroup={}", sg.subgroups()));
    let b = check(fb, c, fuse, &format!("{what} fallback"));
    for (i, (p, q)) in a.iter().zip(&b).enumerate() {
        assert_eq!(
            p.to_bits(),
            q.to_bits(),
            "{what}: {fuse:?} {:?} output {i}: subgroup path {p} fallback {q}",
            c.m.format()
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 16, failure_persistence: None, ..ProptestConfig::default() })]

    /// Odd shapes in small bindings, both fusions, both reduction paths.
    #[test]
    fn odd_shapes_match_the_exact_norm_and_gate(
        f in 0usize..FORMATS.len(),
        pairs in 1usize..36,
        col_units in 1usize..12,
        n in 1usize..=8,
        gate in any::<bool>(),
        seed in any::<u64>(),
    ) {
        let format = FORMATS[f];
        let c = case(format, 2 * pairs, col_unit(format) * col_units, n, seed);
        let fuse = if gate { Fuse::NormGate } else { Fuse::Norm };
        check_both_paths(true, &c, fuse, "odd shape");
    }
}

/// A row's result does not depend on the step's row count (the norm is per row): the same
/// activations at the last row of an `n`-row product give row 0's bits of a one-row product.
#[test]
fn batched_rows_equal_the_single_row() {
    let Some(ctx) = ctx(true, true) else { return };
    for fuse in [Fuse::Norm, Fuse::NormGate] {
        for format in [WeightFormat::Q8_0, WeightFormat::Bf16] {
            let (rows, cols) = (30, col_unit(format) * 6);
            let one = case(format, rows, cols, 1, 41);
            let y1 = ctx
                .matmul_fused_once(&one.m, fuse, &one.norm, EPS, &one.x, 1)
                .unwrap();
            for n in [2, 5, 8] {
                let mut x = common::values(42, n * cols);
                x[(n - 1) * cols..].copy_from_slice(&one.x);
                let y = ctx
                    .matmul_fused_once(&one.m, fuse, &one.norm, EPS, &x, n)
                    .unwrap();
                let per = y1.len();
                for (j, v) in y1.iter().enumerate() {
                    assert_eq!(
                        y[(n - 1) * per + j].to_bits(),
                        v.to_bits(),
                        "{fuse:?} {format:?} n={n} output {j}"
                    );
                }
            }
        }
    }
}

/// Moshi's shapes: the temporal `in_proj` (12288×4096, norm) and `lin_in` (22528×4096, norm and
/// gate) at q8_0 and q4_0, one row; the Depformer's (3072×1024 and 5632×1024) at n = 8 for every
/// format on both paths.
#[test]
fn moshi_shapes_match_the_exact_norm_and_gate() {
    // (rows, seed, fusion, name) of the Depformer's and the temporal transformer's pair.
    let dep = [
        (3072, 51, Fuse::Norm, "dep in_proj"),
        (5632, 52, Fuse::NormGate, "dep lin_in"),
    ];
    let temporal = [
        (12288, 53, Fuse::Norm, "in_proj"),
        (22528, 54, Fuse::NormGate, "lin_in"),
    ];
    for format in FORMATS {
        for (rows, seed, fuse, what) in dep {
            check_both_paths(false, &case(format, rows, 1024, 8, seed), fuse, what);
        }
    }
    let Some(ctx) = ctx(false, true) else { return };
    for format in [WeightFormat::Q8_0, WeightFormat::Q4_0] {
        for (rows, seed, fuse, what) in temporal {
            check(ctx, &case(format, rows, 4096, 1, seed), fuse, what);
        }
    }
}
