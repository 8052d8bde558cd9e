//! The exact reference mode (`MOSHI_KERNELS_F32_ACTIVATIONS=1`, here through
//! `kernels::set_f32_activations`, a process-wide switch: this binary holds only these tests):
//! the quantized kernels multiply the file's weights by f32 activations, so the MLX files must
//! give moshi_mlx's greedy tokens exactly and its floats within 1e-3, and every GGUF file the
//! tool's trace likewise. Fixtures and bounds: `tools/oracle/README.md`, "Bounds per format".

mod real_tools_common;

use real_tools_common::*;

/// Bound of the exact mode (f32 summation order only).
const EXACT_MAX_ABS: f32 = 1e-3;

#[test]
fn f32_activation_kernels_match_the_tools_traces() {
    kernels::set_f32_activations(true);
    assert!(kernels::f32_activations());
    for_each_run(false, |name, file, rec, trace| {
        let (max, rel) = compare(rec, trace);
        eprintln!("{name}/{file}: f32 activations max |Δ| {max:e}, rel RMS {rel:e}");
        assert!(max < EXACT_MAX_ABS, "{name}/{file}: {max}");
        assert_eq!(
            first_token_difference(rec, trace),
            None,
            "{name}/{file}: tokens"
        );
    });
}
