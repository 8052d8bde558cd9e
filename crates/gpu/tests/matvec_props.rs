//! Properties of the matvec kernel (`Module::Matmul` / `Module::MatmulSubgroup`) against the CPU
//! kernels, for every weight format: at Moshi's shapes, at odd shapes (rows not a multiple of the
//! 8 rows of a workgroup, f16/bf16 columns not a multiple of the 8 values of a 16-byte load,
//! n = 1..8), split into small bindings, on the subgroup path and on the forced shared-memory
//! fallback.
//!
//! Tolerance (derived from the kernel's summation order, not tuned). Let `V` be the values one
//! lane reads per step (4 for f32, 8 for f16/bf16, 32 for the block formats) and `S` the steps
//! of a row (`cols / V`, rounded up). A product `w·x` is rounded once; inside a step it goes
//! through at most `V − 1` additions (four-term dots, then the step's chain of dots), then
//! through at most `⌈S/32⌉` additions of the lane's running sum and the 5 levels of the 32-lane
//! tree; a block scale is applied once to a step's sum (q8_0, q4_0: `s·Σq·x`, exact
//! factorisation of the CPU's `Σ(s·q)·x`), and a dequantized weight is rounded at most once
//! (MLX's `s·q + b`). So every product passes through at most `m = V + ⌈S/32⌉ + 8` roundings and
//! the result is within `m·u·Σ|w·x|` of the exact sum (`u = 2⁻²⁴`; first order, `m·u ≪ 1`). At
//! 22528×4096 q8_0 that is `44·u` ≈ 2.6e-6 relative to `Σ|w·x|`. The CPU's scalar reference
//! errs by at most 1e-6·Σ|w·x| (`kernels::set_f32_activations`), which is added for the
//! GPU-against-CPU check.

mod common;

use common::{col_unit, matvec_context as ctx, step_values};
use gpu::{GpuContext, GpuOptions};
use kernels::{Matrix, Scratch, WeightFormat};
use proptest::prelude::*;
use testkit::FORMATS;

/// A weight matrix and activations of a case, and the CPU's answers: the exact product of the
/// dequantized weights (f64), `Σ|w·x|` per output, and the CPU scalar reference.
struct Case {
    m: Matrix,
    x: Vec<f32>,
    n: usize,
    exact: Vec<f64>,
    mag: Vec<f64>,
    cpu: Vec<f32>,
}

fn case(format: WeightFormat, rows: usize, cols: usize, n: usize, seed: u64) -> Case {
    let m = Matrix::encode(format, rows, cols, &common::values(seed, rows * cols)).unwrap();
    let x = common::values(seed ^ 0xabcdef, n * cols);
    let (mut exact, mut mag) = (vec![0f64; n * rows], vec![0f64; n * rows]);
    let mut w = vec![0f32; cols];
    for r in 0..rows {
        m.row_f32(r, &mut w);
        for b in 0..n {
            let xb = &x[b * cols..(b + 1) * cols];
            let (mut e, mut a) = (0f64, 0f64);
            for (wc, xc) in w.iter().zip(xb) {
                let t = *wc as f64 * *xc as f64;
                e += t;
                a += t.abs();
            }
            exact[b * rows + r] = e;
            mag[b * rows + r] = a;
        }
    }
    kernels::set_f32_activations(true);
    let mut cpu = vec![0f32; n * rows];
    m.matmul_reference(&x, n, &mut cpu, &mut Scratch::new());
    Case {
        m,
        x,
        n,
        exact,
        mag,
        cpu,
    }
}

/// Runs the case on `ctx` and checks every output against the exact product and the CPU
/// reference within the bound of the module docs; returns the device's outputs.
fn check(ctx: &GpuContext, c: &Case, what: &str) -> Vec<f32> {
    let (rows, cols, n) = (c.m.rows(), c.m.cols(), c.n);
    let y = ctx.matmul_once(&c.m, &c.x, n).unwrap();
    assert_eq!(y.len(), n * rows);
    let v = step_values(c.m.format());
    let m = v + cols.div_ceil(v).div_ceil(32) + 8;
    let factor = m as f64 * f64::powi(2.0, -24);
    for b in 0..n {
        for r in 0..rows {
            let i = b * rows + r;
            let got = y[i] as f64;
            let bound = factor * c.mag[i];
            assert!(
                got.is_finite() && (got - c.exact[i]).abs() <= bound,
                "{what}: {:?} {rows}x{cols} n={n} row {r} batch {b}: gpu {got} exact {} bound {bound}",
                c.m.format(),
                c.exact[i]
            );
            let cpu = c.cpu[i] as f64;
            assert!(
                (got - cpu).abs() <= bound + 1e-6 * c.mag[i],
                "{what}: {:?} {rows}x{cols} row {r} batch {b}: gpu {got} cpu {cpu}",
                c.m.format()
            );
        }
    }
    y
}

/// Both reduction paths on one case: each within the bound, and the same bits (the tree order is
/// the same; on a device without subgroups both contexts run the fallback).
fn check_both_paths(small: bool, c: &Case, what: &str) {
    let (Some(sg), Some(fb)) = (ctx(small, true), ctx(small, false)) else {
        return;
    };
    assert!(
        !fb.subgroups(),
        "the fallback context must not use subgroups"
    );
    let a = check(sg, c, &format!("{what} subgroup={}", sg.subgroups()));
    let b = check(fb, c, &format!("{what} fallback"));
    for (i, (p, q)) in a.iter().zip(&b).enumerate() {
        assert_eq!(
            p.to_bits(),
            q.to_bits(),
            "{what}: {:?} output {i}: subgroup path {p} fallback {q}",
            c.m.format()
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, failure_persistence: None, ..ProptestConfig::default() })]

    /// Odd shapes in small bindings, both reduction paths.
    #[test]
    fn odd_shapes_match_cpu_on_both_paths(
        f in 0usize..FORMATS.len(),
        rows in 1usize..70,
        col_units in 1usize..12,
        n in 1usize..=8,
        seed in any::<u64>(),
    ) {
        let format = FORMATS[f];
        let c = case(format, rows, col_unit(format) * col_units, n, seed);
        check_both_paths(true, &c, "odd shape");
    }
}

/// f16/bf16 rows of `cols ≡ 4 (mod 8)`: the last 16-byte load of a row is half padding (zero
/// codes), and the activations it would pair with are the next batch row's first values. With an
/// infinite value there, batch row 0 must stay finite and exact (`0 · inf` would be a NaN if the
/// tail were not masked); batch row 1 is infinite by construction and not checked.
#[test]
fn half_rows_ignore_what_follows_the_row() {
    for small in [true, false] {
        for subgroups in [true, false] {
            let Some(ctx) = ctx(small, subgroups) else {
                return;
            };
            for format in [WeightFormat::F16, WeightFormat::Bf16] {
                for cols in [4, 12, 36] {
                    let c = case(format, 9, cols, 2, 11);
                    let mut x = c.x.clone();
                    x[cols] = f32::INFINITY;
                    let y = ctx.matmul_once(&c.m, &x, 2).unwrap();
                    let m = 8 + cols.div_ceil(8).div_ceil(32) + 8;
                    for (r, &got) in y.iter().take(9).enumerate() {
                        let bound = m as f64 * f64::powi(2.0, -24) * c.mag[r];
                        let got = got as f64;
                        assert!(
                            got.is_finite() && (got - c.exact[r]).abs() <= bound,
                            "{format:?} cols {cols} row {r}: gpu {got} exact {}",
                            c.exact[r]
                        );
                    }
                }
            }
        }
    }
}

/// A row's result does not depend on the step's row count: the same activations as row 0 of a
/// one-row product, placed at every row of an eight-row product, give the same bits.
#[test]
fn batched_rows_equal_the_single_row() {
    let Some(ctx) = ctx(true, true) else { return };
    for format in FORMATS {
        let (rows, cols) = (29, col_unit(format) * 6);
        let m = Matrix::encode(format, rows, cols, &common::values(21, rows * cols)).unwrap();
        let x1 = common::values(22, cols);
        let one = ctx.matmul_once(&m, &x1, 1).unwrap();
        for n in [2, 5, 8] {
            let mut x = common::values(23, n * cols);
            let b = n - 1;
            x[b * cols..(b + 1) * cols].copy_from_slice(&x1);
            let y = ctx.matmul_once(&m, &x, n).unwrap();
            for r in 0..rows {
                assert_eq!(
                    y[b * rows + r].to_bits(),
                    one[r].to_bits(),
                    "{format:?} n={n} row {r}"
                );
            }
        }
    }
}

/// Moshi's shapes: `out_proj` 4096×4096 for every format (both paths), `lin_in` 22528×4096 for
/// the block formats (the dense ones at that size take lavapipe too long), the Depformer's
/// `in_proj` 3072×1024 at n = 8, and a 4096×4096 q4_0 matrix in 1 MiB bindings (9 chunks).
#[test]
fn moshi_shapes_match_cpu() {
    for format in FORMATS {
        let c = case(format, 4096, 4096, 1, 31);
        check_both_paths(false, &c, "out_proj");
    }
    let Some(ctx) = ctx(false, true) else { return };
    for format in FORMATS.into_iter().filter(|&f| step_values(f) == 32) {
        check(ctx, &case(format, 22528, 4096, 1, 32), "lin_in");
    }
    check(
        ctx,
        &case(WeightFormat::Q8_0, 3072, 1024, 8, 33),
        "dep in_proj",
    );
    let chunked = common::context_with(GpuOptions {
        max_binding_bytes: Some(1 << 20),
        ..Default::default()
    })
    .unwrap();
    check(
        &chunked,
        &case(WeightFormat::Q4_0, 4096, 4096, 3, 35),
        "chunked",
    );
}

/// The subgroup variants validate with naga's subgroup capability and translate to MSL and HLSL
/// (`tests/naga_targets.rs` covers the other modules without capabilities).
#[test]
fn subgroup_variants_translate() {
    use gpu::shaders::Module;
    for m in Module::subgroup_variants() {
        let src = m.source();
        let module = naga::front::wgsl::parse_str(&src)
            .unwrap_or_else(|e| panic!("{m:?}: WGSL parse error:\n{}", e.emit_to_string(&src)));
        let caps = naga::valid::Capabilities::SUBGROUP;
        let info = naga::valid::Validator::new(naga::valid::ValidationFlags::all(), caps)
            .subgroup_stages(naga::valid::ShaderStages::COMPUTE)
            .subgroup_operations(naga::valid::SubgroupOperationSet::all())
            .validate(&module)
            .unwrap_or_else(|e| panic!("{m:?}: validation error:\n{}", e.emit_to_string(&src)));
        let msl_opts = naga::back::msl::Options {
            lang_version: (2, 1),
            ..Default::default()
        };
        naga::back::msl::write_string(
            &module,
            &info,
            &msl_opts,
            &naga::back::msl::PipelineOptions::default(),
        )
        .unwrap_or_else(|e| panic!("{m:?}: MSL: {e}"));
        let mut out = String::new();
        let opts = naga::back::hlsl::Options {
            shader_model: naga::back::hlsl::ShaderModel::V6_0,
            ..Default::default()
        };
        naga::back::hlsl::Writer::new(&mut out, &opts, &Default::default())
            .write(&module, &info, None)
            .unwrap_or_else(|e| panic!("{m:?}: HLSL: {e}"));
    }
}
