//! Helpers shared by the real-tool fixture tests (`real_tools.rs`, `real_tools_exact.rs`).
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use kernels::Pool;
use model::checkpoint::Bundle;
use model::lm::{DequantizedSource, KvDtype, LmGen, LmModel, LmRecorder, LmSpec, StepOptions};
use model::sampling::{Sampler, SamplerConfig};
use testkit::compare::diff_stats;
use testkit::TensorFile;

pub const FORMATS: [&str; 4] = ["mlx_q4", "mlx_q8", "candle_q8_0", "ggufpy_q4_0"];

pub fn dir(name: &str) -> PathBuf {
    testkit::fixtures_dir("tools").join(name)
}

/// A trace of a tool's run (`fixtures/tools/<format>/trace*.safetensors`).
pub struct Trace(TensorFile);

impl Trace {
    pub fn open(path: &Path) -> Trace {
        Trace(TensorFile::open(path))
    }
    pub fn names(&self) -> Vec<String> {
        self.0.names()
    }
    pub fn f32(&self, name: &str) -> Vec<f32> {
        self.0.f32(name).0
    }
    pub fn i64(&self, name: &str) -> (Vec<i64>, Vec<usize>) {
        self.0.i64(name)
    }
}

pub fn codes() -> Vec<i64> {
    Trace::open(&testkit::fixtures_dir("lm").join("CODES.safetensors"))
        .i64("codes")
        .0
}

pub fn load(name: &str, dequantized: bool) -> LmModel {
    let b = Bundle::open(&dir(name)).unwrap();
    let w = b.lm_weights().unwrap();
    if dequantized {
        let spec = LmSpec::from_config(&b.config.lm).unwrap();
        LmModel::from_source(&DequantizedSource(&w), spec).unwrap()
    } else {
        LmModel::load(&w, &b.config.lm).unwrap()
    }
}

/// Runs every format's model (`dequantized` or not) over its greedy and its teacher-forced trace;
/// `check(format, file, run, trace)` judges each run.
pub fn for_each_run(dequantized: bool, mut check: impl FnMut(&str, &str, &LmRecorder, &Trace)) {
    for name in FORMATS {
        let model = load(name, dequantized);
        for (file, forced) in [
            ("trace.safetensors", false),
            ("trace_forced.safetensors", true),
        ] {
            let trace = Trace::open(&dir(name).join(file));
            let rec = run(&model, &trace, forced);
            check(name, file, &rec, &trace);
        }
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

/// Worst (max |Δ|, relative RMS) over transformer output, text and Depformer logits.
pub fn compare(rec: &LmRecorder, trace: &Trace) -> (f32, f32) {
    let (inp, _) = trace.i64("input_tokens");
    assert_eq!(rec.input_tokens, inp, "input tokens");
    [
        diff_stats(&rec.transformer_out, &trace.f32("transformer_out")),
        diff_stats(&rec.text_logits, &trace.f32("text_logits")),
        diff_stats(&rec.depformer_logits, &trace.f32("depformer_logits")),
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
