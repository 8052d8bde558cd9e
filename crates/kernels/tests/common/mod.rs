//! Helpers shared by the kernel property tests (each test binary uses a part of them).
#![allow(dead_code)]

use kernels::conv::{Conv1d, ConvTranspose1d};
use kernels::KernelError;
use proptest::strategy::Strategy;

/// `n` deterministic pseudo-random values in `[-1, 1)` (xorshift64 seeded by `seed`).
pub use testkit::rng::values as vals;

/// Every weight format the kernels multiply (MLX affine with 4 and 8 bits, groups of 32 and 64).
#[allow(unused_imports)] // like the helpers below, not every test binary uses it
pub use testkit::FORMATS;

/// A random matrix product of the matmul property tests: `rows` weight rows of `cols` columns
/// (whole blocks of 64, as every format needs), `n` activation rows, values drawn from `seed`.
#[derive(Clone, Debug)]
pub struct MatmulCase {
    /// Weight rows.
    pub rows: usize,
    /// Columns (a multiple of 64).
    pub cols: usize,
    /// Activation rows.
    pub n: usize,
    /// Seed of the weights (and, mixed with a constant, of the activations).
    pub seed: u64,
}

impl MatmulCase {
    /// The `rows·cols` weights of the case.
    pub fn weights(&self) -> Vec<f32> {
        vals(self.seed, self.rows * self.cols)
    }
}

/// [`MatmulCase`]s of 1..40 rows, 1..4 blocks of 64 columns and `1..max_n` activation rows:
/// ragged row counts that end inside a tile, and from a single activation row to a few.
pub fn matmul_cases(max_n: usize) -> impl Strategy<Value = MatmulCase> {
    (1usize..40, 1usize..5, 1usize..max_n, 1u64..1_000_000).prop_map(|(rows, blocks, n, seed)| {
        MatmulCase {
            rows,
            cols: 64 * blocks,
            n,
            seed,
        }
    })
}

/// Asserts that `a` and `b` have the same length and differ by at most `tol` anywhere (`what`
/// names the case in the failure message).
pub fn close(a: &[f32], b: &[f32], tol: f32, what: &str) {
    assert_eq!(a.len(), b.len());
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!((x - y).abs() <= tol, "{what}: index {i}: {x} vs {y}");
    }
}

/// A random convolution with biases, an input for it and the output of the direct definition
/// (`forward_reference`), with the summation-order tolerance `1e-5 · in·k + 1e-6` of any GEMM
/// path against it.
pub struct ConvCase<C> {
    /// The convolution (weights from `seed`).
    pub conv: C,
    /// The input, `[in_channels, t_in]`.
    pub x: Vec<f32>,
    /// The reference output, `[out_channels, t_out]`.
    pub want: Vec<f32>,
    /// Output steps.
    pub t_out: usize,
    /// Tolerance of a GEMM path against `want`.
    pub tol: f32,
}

impl<C> ConvCase<C> {
    /// The case of `conv` on `x` (`t_out` steps of `out_ch` channels out, `in_k` products per
    /// output for the tolerance), `want` from the layer's `forward_reference`.
    fn new(
        conv: C,
        x: Vec<f32>,
        out_ch: usize,
        t_out: usize,
        in_k: usize,
        forward_reference: impl Fn(&C, &[f32], &mut [f32]) -> Result<usize, KernelError>,
    ) -> Self {
        let mut want = vec![0f32; out_ch * t_out];
        forward_reference(&conv, &x, &mut want).unwrap();
        ConvCase {
            conv,
            x,
            want,
            t_out,
            tol: 1e-5 * in_k as f32 + 1e-6,
        }
    }
}

/// A [`ConvCase`] of a `Conv1d` with `groups` groups of `ig` inputs and `og` outputs each, on an
/// input `t_extra` steps longer than the effective kernel.
#[allow(clippy::too_many_arguments)]
pub fn conv1d_case(
    ig: usize,
    og: usize,
    groups: usize,
    k: usize,
    stride: usize,
    dilation: usize,
    t_extra: usize,
    seed: u64,
) -> ConvCase<Conv1d> {
    let (inc, outc) = (ig * groups, og * groups);
    let w = vals(seed, outc * ig * k);
    let bias = vals(seed ^ 7, outc);
    let conv = Conv1d::new(w, Some(bias), inc, outc, k, stride, dilation, groups).unwrap();
    let t_in = conv.effective_kernel() + t_extra;
    let x = vals(seed ^ 99, inc * t_in);
    let t_out = conv.out_len(t_in);
    ConvCase::new(conv, x, outc, t_out, ig * k, Conv1d::forward_reference)
}

/// A [`ConvCase`] of a `ConvTranspose1d` with `groups` groups of `ig` inputs and `og` outputs
/// each, on an input of `t_in` steps.
pub fn conv_transpose_case(
    ig: usize,
    og: usize,
    groups: usize,
    k: usize,
    stride: usize,
    t_in: usize,
    seed: u64,
) -> ConvCase<ConvTranspose1d> {
    let (inc, outc) = (ig * groups, og * groups);
    let w = vals(seed, inc * og * k);
    let bias = vals(seed ^ 3, outc);
    let conv = ConvTranspose1d::new(w, Some(bias), inc, outc, k, stride, groups).unwrap();
    let x = vals(seed ^ 5, inc * t_in);
    let t_out = conv.out_len(t_in);
    ConvCase::new(
        conv,
        x,
        outc,
        t_out,
        ig * k,
        ConvTranspose1d::forward_reference,
    )
}
