//! Helpers shared by the real-tool fixture tests (`real_tools.rs`, `real_tools_exact.rs`).
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use kernels::Pool;
use model::checkpoint::Bundle;
use model::lm::{KvDtype, LmError, LmGen, LmModel, LmRecorder, LmSpec, StepOptions, TensorSource};
use model::sampling::{Sampler, SamplerConfig};
use safetensors::SafeTensors;

pub const FORMATS: [&str; 4] = ["mlx_q4", "mlx_q8", "candle_q8_0", "ggufpy_q4_0"];

pub fn dir(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures/tools")
        .join(name)
}

pub struct Trace(pub Vec<u8>);

impl Trace {
    pub fn open(path: &Path) -> Trace {
        Trace(std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display())))
    }
    pub fn f32(&self, name: &str) -> Vec<f32> {
        let st = SafeTensors::deserialize(&self.0).unwrap();
        let t = st.tensor(name).unwrap();
        assert_eq!(t.dtype(), safetensors::Dtype::F32, "{name}");
        t.data()
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect()
    }
    pub fn i64(&self, name: &str) -> (Vec<i64>, Vec<usize>) {
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

pub fn codes() -> Vec<i64> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/lm/CODES.safetensors");
    Trace::open(&p).i64("codes").0
}

/// Every matrix dequantized to f32 before the run: isolates loading from the kernels.
pub struct Dequantized<'a, S: TensorSource>(&'a S);

pub fn dequant(m: kernels::Matrix) -> kernels::Matrix {
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

pub fn load(name: &str, dequantized: bool) -> LmModel {
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
pub fn run(model: &LmModel, trace: &Trace, forced: bool) -> LmRecorder {
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
pub fn diff(ours: &[f32], reference: &[f32]) -> (f32, f32) {
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
pub fn compare(rec: &LmRecorder, trace: &Trace) -> (f32, f32) {
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
pub fn first_token_difference(rec: &LmRecorder, trace: &Trace) -> Option<usize> {
    let (text, _) = trace.i64("out_text");
    let (audio, shape) = trace.i64("out_audio");
    let s = shape[1];
    (0..s).find(|&t| {
        rec.out_text.get(t) != Some(&text[t])
            || (0..8).any(|k| rec.out_audio.get(t * 8 + k) != Some(&audio[k * s + t]))
    })
}
