//! Shared helpers for the Mimi integration tests: fixture loading and trace collection.
#![allow(dead_code)]

use model::checkpoint::MimiConfig;
use model::mimi::{Mimi, Stage};
use safetensors::{Dtype, SafeTensors};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

pub type TensorMap = HashMap<String, (Vec<f32>, Vec<usize>)>;

pub fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures/mimi")
        .join(name)
}

/// Every f32 tensor of a safetensors file, plus i64 tensors converted to f32 (codes).
pub fn read_tensors(name: &str) -> TensorMap {
    let bytes = std::fs::read(fixture(name)).expect("fixture present");
    let st = SafeTensors::deserialize(&bytes).expect("valid safetensors");
    let mut m = TensorMap::new();
    for (n, v) in st.tensors() {
        let data = v.data();
        let vals: Vec<f32> = match v.dtype() {
            Dtype::F32 => data
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                .collect(),
            Dtype::I64 => data
                .chunks_exact(8)
                .map(|c| i64::from_le_bytes(c.try_into().unwrap()) as f32)
                .collect(),
            _ => continue,
        };
        m.insert(n.to_string(), (vals, v.shape().to_vec()));
    }
    m
}

/// The fixture input (`input.wav`: 24 kHz mono IEEE float32).
pub fn input_pcm() -> Vec<f32> {
    testkit::read_wav_f32(fixture("input.wav"))
}

pub fn spec() -> MimiConfig {
    MimiConfig::from_json(&std::fs::read_to_string(fixture("mimi_config.json")).unwrap()).unwrap()
}

pub fn load(weights: &str, spec: &MimiConfig) -> Arc<Mimi> {
    let w = read_tensors(weights);
    Arc::new(Mimi::from_tensors(&w, spec, 8).expect("load tiny mimi"))
}

/// Collects `[C, t]` per-call slices of each stage into `[C, T_total]` tensors.
#[derive(Default)]
pub struct Collector {
    pub parts: HashMap<&'static str, Vec<Vec<f32>>>,
}

impl Collector {
    pub fn push(&mut self, s: Stage, x: &[f32]) {
        self.parts.entry(s.name()).or_default().push(x.to_vec());
    }

    /// Concatenates along time, given the channel count.
    pub fn get(&self, name: &str, channels: usize) -> Vec<f32> {
        let parts = &self.parts[name];
        let total: usize = parts.iter().map(|p| p.len() / channels).sum();
        let mut out = vec![0.0; channels * total];
        let mut t0 = 0;
        for p in parts {
            let t = p.len() / channels;
            for c in 0..channels {
                out[c * total + t0..c * total + t0 + t].copy_from_slice(&p[c * t..(c + 1) * t]);
            }
            t0 += t;
        }
        out
    }
}
