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

use std::path::{Path, PathBuf};

use kernels::Pool;
use model::checkpoint::Bundle;
use model::lm::LmError;
use model::lm::{KvDtype, LmGen, LmModel, LmRecorder, LmSpec, StepOptions, TensorSource};
use model::sampling::{Sampler, SamplerConfig};
use safetensors::SafeTensors;

const FORMATS: [&str; 4] = ["mlx_q4", "mlx_q8", "candle_q8_0", "ggufpy_q4_0"];

fn dir(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures/tools")
        .join(name)
}

struct Trace(Vec<u8>);

impl Trace {
    fn open(path: &Path) -> Trace {
        Trace(std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display())))
    }
    fn f32(&self, name: &str) -> Vec<f32> {
        let st = SafeTensors::deserialize(&self.0).unwrap();
        let t = st.tensor(name).unwrap();
        assert_eq!(t.dtype(), safetensors::Dtype::F32, "{name}");
        t.data()
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect()
    }
    fn i64(&self, name: &str) -> (Vec<i64>, Vec<usize>) {
        let st = SafeTensors::deserialize(&self.0).unwrap();
        let t = st.tensor(name).unwrap();
        assert_eq!(t.dtype(), safetensors::Dtype::I64, "{name}");
        let v = t
            .data()
            .chunks_exact(8)
            .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
            .collect();
        (v, t.shape().to_vec())
    }
}

fn codes() -> Vec<i64> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/lm/CODES.safetensors");
    Trace::open(&p).i64("codes").0
}

/// Every matrix dequantized to f32 before the run: isolates loading from the kernels.
struct Dequantized<'a, S: TensorSource>(&'a S);

fn dequant(m: kernels::Matrix) -> kernels::Matrix {
    let (r, c) = (m.rows(), m.cols());
    let mut v = vec![0.0; r * c];
    for (i, row) in v.chunks_exact_mut(c).enumerate() {
        m.row_f32(i, row);
    }
    kernels::Matrix::from_f32(r, c, v).unwrap()
}

impl<S: TensorSource> TensorSource for Dequantized<'_, S> {
    fn matrix(&self, name: &str, rows: usize, cols: usize) -> Result<kernels::Matrix, LmError> {
        self.0.matrix(name, rows, cols).map(dequant)
    }
    fn matrix_rows(
        &self,
        name: &str,
        rows: usize,
        cols: usize,
        start: usize,
        n: usize,
    ) -> Result<kernels::Matrix, LmError> {
        self.0.matrix_rows(name, rows, cols, start, n).map(dequant)
    }
    fn vector(&self, name: &str, len: usize) -> Result<Vec<f32>, LmError> {
        self.0.vector(name, len)
    }
}

fn load(name: &str, dequantized: bool) -> LmModel {
    let b = Bundle::open(&dir(name)).unwrap();
    let w = b.lm_weights().unwrap();
    if dequantized {
        let spec = LmSpec::from_config(&b.config.lm).unwrap();
        LmModel::from_source(&Dequantized(&w), spec).unwrap()
    } else {
        LmModel::load(&w, &b.config.lm).unwrap()
    }
}

/// Runs the generator over the trace's steps (teacher-forced when the trace is), greedy.
fn run(model: &LmModel, trace: &Trace, forced: bool) -> LmRecorder {
    let codes = codes();
    let t_total = codes.len() / 8;
    let steps = trace.i64("input_tokens").1[0];
    let (ft, fa) = if forced {
        (trace.i64("forced_text").0, trace.i64("forced_audio").0)
    } else {
        (Vec::new(), Vec::new())
    };
    let pool = Pool::new(1);
    let mut sampler = Sampler::new(SamplerConfig::greedy(), 128, 64).unwrap();
    let mut gen = LmGen::new(model, KvDtype::F32).unwrap();
    let mut rec = LmRecorder::default();
    for t in 0..steps {
        let user: Vec<i64> = (0..8).map(|k| codes[k * t_total + t]).collect();
        let audio: Vec<u32> = if forced {
            (0..8).map(|k| fa[k * steps + t] as u32).collect()
        } else {
            Vec::new()
        };
        let opts = StepOptions {
            force_text: forced.then(|| ft[t] as u32),
            force_audio: forced.then_some(&audio[..]),
        };
        if let Some(f) = gen
            .step_with(model, &user, &mut sampler, &pool, &opts, &mut rec)
            .unwrap()
        {
            rec.record_frame(&f);
        }
    }
    rec
}

/// (max |Δ|, RMS Δ / std of the reference).
fn diff(ours: &[f32], reference: &[f32]) -> (f32, f32) {
    assert_eq!(ours.len(), reference.len());
    let n = reference.len() as f64;
    let mean = reference.iter().map(|&x| x as f64).sum::<f64>() / n;
    let var = reference
        .iter()
        .map(|&x| (x as f64 - mean).powi(2))
        .sum::<f64>()
        / n;
    let mut max = 0f32;
    let mut sq = 0f64;
    for (a, b) in ours.iter().zip(reference) {
        max = max.max((a - b).abs());
        sq += ((a - b) as f64).powi(2);
    }
    (max, ((sq / n) / var).sqrt() as f32)
}

/// Worst (max |Δ|, relative RMS) over transformer output, text and Depformer logits.
fn compare(rec: &LmRecorder, trace: &Trace) -> (f32, f32) {
    let (inp, _) = trace.i64("input_tokens");
    assert_eq!(rec.input_tokens, inp, "input tokens");
    [
        diff(&rec.transformer_out, &trace.f32("transformer_out")),
        diff(&rec.text_logits, &trace.f32("text_logits")),
        diff(&rec.depformer_logits, &trace.f32("depformer_logits")),
    ]
    .into_iter()
    .fold((0.0, 0.0), |a, b| (a.0.max(b.0), a.1.max(b.1)))
}

/// Tokens of a run against the trace's: index of the first differing output step, if any.
fn first_token_difference(rec: &LmRecorder, trace: &Trace) -> Option<usize> {
    let (text, _) = trace.i64("out_text");
    let (audio, shape) = trace.i64("out_audio");
    let s = shape[1];
    (0..s).find(|&t| {
        rec.out_text.get(t) != Some(&text[t])
            || (0..8).any(|k| rec.out_audio.get(t * 8 + k) != Some(&audio[k * s + t]))
    })
}

/// Dequantized weights, f32 kernels: every file matches its tool's trace like float noise, and
/// the greedy tokens are the tool's.
#[test]
fn dequantized_runs_match_the_tools_traces() {
    for name in FORMATS {
        let model = load(name, true);
        for (file, forced) in [
            ("trace.safetensors", false),
            ("trace_forced.safetensors", true),
        ] {
            let trace = Trace::open(&dir(name).join(file));
            let rec = run(&model, &trace, forced);
            let (max, rel) = compare(&rec, &trace);
            eprintln!("{name}/{file}: dequantized max |Δ| {max:e}, rel RMS {rel:e}");
            assert!(max < DEQUANTIZED_MAX_ABS, "{name}/{file}: {max}");
            assert_eq!(first_token_difference(&rec, &trace), None, "{name}/{file}");
        }
    }
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
        let st = SafeTensors::deserialize(&sample.0).unwrap();
        for (tensor, _) in st.tensors() {
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
