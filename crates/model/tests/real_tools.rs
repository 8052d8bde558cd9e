//! Quantized checkpoints written by the real tools (`fixtures/tools/`, provenance in
//! `tools/oracle/README.md`): MLX q4/g32 and q8/g64 written by MLX with Kyutai's quantization
//! call, a q8_0 GGUF written by candle's quantizer and GGUF writer, a Q4_0 GGUF written by
//! gguf-py. References: for MLX, Kyutai's `moshi_mlx` running the file with MLX's quantized
//! kernels (f32 activations); for the GGUF files, moshi (PyTorch, f32) on the tool's own
//! dequantization of the file.
//!
//! Bounds (teacher-forced, 32 steps, max |Δ| over text and Depformer logits; logit std ≈ 8): the
//! per-format table is in `tools/oracle/README.md` ("Bounds per format"), each with its measured
//! value; the constants below are those bounds.

mod real_tools_common;

use model::checkpoint::Bundle;
use model::lm::LmModel;
use real_tools_common::*;

/// Dequantized weights, f32 kernels: every file matches its tool's trace like float noise, and
/// the greedy tokens are the tool's.
#[test]
fn dequantized_runs_match_the_tools_traces() {
    for_each_run(true, |name, file, rec, trace| {
        let (max, rel) = compare(rec, trace);
        eprintln!("{name}/{file}: dequantized max |Δ| {max:e}, rel RMS {rel:e}");
        assert!(max < DEQUANTIZED_MAX_ABS, "{name}/{file}: {max}");
        assert_eq!(first_token_difference(rec, trace), None, "{name}/{file}");
    });
}

/// Dequantized-path bound: f32 summation order only (MLX sums per group and scales once).
const DEQUANTIZED_MAX_ABS: f32 = 1e-4;

/// The fast path (weights in their file format, activations rounded to 8-bit blocks by the
/// kernels) against the same traces: within the per-format bounds measured below.
#[test]
fn native_kernels_within_measured_bounds() {
    for (name, max_bound, rel_bound) in NATIVE_BOUNDS {
        let model = load(name, false);
        let trace = Trace::open(&dir(name).join("trace_forced.safetensors"));
        let (max, rel) = compare(&run(&model, &trace, true), &trace);
        let greedy = Trace::open(&dir(name).join("trace.safetensors"));
        let first = first_token_difference(&run(&model, &greedy, false), &greedy);
        eprintln!(
            "{name}: native kernels max |Δ| {max:.4}, rel RMS {rel:.4}; greedy tokens first differ at {first:?}"
        );
        assert!(
            max < max_bound && rel < rel_bound,
            "{name}: max {max} rel {rel}"
        );
    }
}

/// (format, max |Δ| bound, relative RMS bound) of the int8-activation kernels, teacher-forced:
/// the measured values (README table) plus about 25 %.
const NATIVE_BOUNDS: [(&str, f32, f32); 4] = [
    ("mlx_q4", 3.0, 0.055),
    ("mlx_q8", 2.5, 0.06),
    ("candle_q8_0", 1.1, 0.023),
    ("ggufpy_q4_0", 3.0, 0.057),
];

/// The GGUF files are what the tools write: candle's is GGUF v2 with no metadata key (like the
/// released `moshiko-candle-q8`), gguf-py's v3 with its `general.architecture` key; and our
/// dequantization of every tensor is the tool's own (`dequant_sample.safetensors` in full,
/// `dequant_sums.json` per tensor).
#[test]
fn gguf_files_dequantize_like_their_tools() {
    for (name, file, version, keys) in [
        ("candle_q8_0", "model.q8.gguf", 2u32, 0u64),
        ("ggufpy_q4_0", "model.q4_0.gguf", 3, 1),
    ] {
        let bytes = std::fs::read(dir(name).join(file)).unwrap();
        assert_eq!(&bytes[..4], b"GGUF");
        assert_eq!(u32::from_le_bytes(bytes[4..8].try_into().unwrap()), version);
        assert_eq!(u64::from_le_bytes(bytes[16..24].try_into().unwrap()), keys);
        let b = Bundle::open(&dir(name)).unwrap();
        let w = b.lm_weights().unwrap();
        let sample = Trace::open(&dir(name).join("dequant_sample.safetensors"));
        for tensor in sample.names() {
            let (ours, _) = w.f32(&tensor).unwrap();
            assert!(
                ours == sample.f32(&tensor),
                "{name}: {tensor} differs from the tool's"
            );
        }
        let sums: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(dir(name).join("dequant_sums.json")).unwrap(),
        )
        .unwrap();
        let sums = sums.as_object().unwrap();
        for (tensor, want) in sums {
            let (ours, _) = w.f32(tensor).unwrap();
            let s: f64 = ours.iter().map(|&x| x as f64).sum();
            let q: f64 = ours.iter().map(|&x| (x as f64).powi(2)).sum();
            let (ws, wq) = (want[0].as_f64().unwrap(), want[1].as_f64().unwrap());
            assert!(
                (s - ws).abs() <= 1e-9 * wq.sqrt().max(1.0),
                "{name}: {tensor} sum"
            );
            assert!(
                (q - wq).abs() <= 1e-9 * wq.max(1.0),
                "{name}: {tensor} sum of squares"
            );
        }
        assert!(sums.len() > 40, "{name}: every tensor");
    }
}

/// MLX writes scales and biases in the model's dtype: the q4 file with its scales and biases
/// stored as f16 and as f32 (written by MLX) loads and runs exactly like the bf16 one.
#[test]
fn mlx_scales_in_f16_and_f32_are_accepted() {
    use model::checkpoint::{Component, Weights};
    let b = Bundle::open(&dir("mlx_q4")).unwrap();
    let trace = Trace::open(&dir("mlx_q4").join("trace_forced.safetensors"));
    let run_file = |file: &str| {
        let w = Weights::open(&dir("mlx_q4").join(file), Component::Lm).unwrap();
        run(&LmModel::load(&w, &b.config.lm).unwrap(), &trace, true)
    };
    let reference = run_file("model.q4.safetensors");
    for file in [
        "model.q4.scales_f16.safetensors",
        "model.q4.scales_f32.safetensors",
    ] {
        assert!(run_file(file) == reference, "{file}");
    }
}
