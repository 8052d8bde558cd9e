//! Shared by the GPU tests: a device on any adapter (lavapipe here), or a printed skip.
#![allow(dead_code)]

use gpu::{AdapterChoice, GpuContext, GpuOptions};

/// A context on the best adapter of any type, or `None` (printed) when there is none; with
/// `MOSHI_REQUIRE_GPU=1` a missing adapter fails the test instead.
pub fn context_with(opts: GpuOptions) -> Option<GpuContext> {
    match GpuContext::new(AdapterChoice::Gpu(None), opts) {
        Ok(c) => {
            eprintln!("GPU tests on {}", c.adapter());
            Some(c)
        }
        Err(e) if gpu::gpu_required() => panic!("MOSHI_REQUIRE_GPU=1 but no usable adapter: {e}"),
        Err(e) => {
            eprintln!("skipping GPU test: {e}");
            None
        }
    }
}

/// [`context_with`] with default options.
pub fn context() -> Option<GpuContext> {
    context_with(GpuOptions::default())
}

/// Deterministic values in about [-1, 1] (xorshift), for weights and activations.
pub fn values(seed: u64, n: usize) -> Vec<f32> {
    testkit::rng::values(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15), n)
}

/// A file of the Mimi oracle fixture (`fixtures/mimi`).
pub fn mimi_fixture(name: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures/mimi")
        .join(name)
}

/// The Mimi oracle's streaming codes `[8, T]` and T.
pub fn mimi_oracle_codes() -> (Vec<u32>, usize) {
    let (c, shape) = testkit::TensorFile::open(mimi_fixture("trace.safetensors")).i64("codes");
    (c.iter().map(|&v| v as u32).collect(), shape[1])
}

/// The Mimi fixture's input (`input.wav`, 24 kHz mono IEEE f32): the samples of its `data` chunk,
/// zero-padded to whole frames of `fs` samples.
pub fn mimi_input_frames(fs: usize) -> Vec<f32> {
    let b = std::fs::read(mimi_fixture("input.wav")).unwrap();
    let mut i = 12;
    while i + 8 <= b.len() {
        let n = u32::from_le_bytes(b[i + 4..i + 8].try_into().unwrap()) as usize;
        if &b[i..i + 4] == b"data" {
            let mut pcm: Vec<f32> = b[i + 8..i + 8 + n]
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                .collect();
            pcm.resize(pcm.len().div_ceil(fs) * fs, 0.0);
            return pcm;
        }
        i += 8 + n + (n & 1);
    }
    panic!("input.wav has no data chunk");
}

/// The Mimi fixture's codec, built on the CPU from the f32 tensors of its checkpoint.
pub fn mimi_fixture_codec() -> std::sync::Arc<model::mimi::Mimi> {
    let cfg = model::checkpoint::MimiConfig::from_json(
        &std::fs::read_to_string(mimi_fixture("mimi_config.json")).unwrap(),
    )
    .unwrap();
    let bytes = std::fs::read(mimi_fixture("mimi.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let weights: std::collections::HashMap<String, model::mimi::F32Tensor> = st
        .tensors()
        .into_iter()
        .filter(|(_, t)| t.dtype() == safetensors::Dtype::F32)
        .map(|(n, t)| {
            let v = t
                .data()
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                .collect();
            (n, (v, t.shape().to_vec()))
        })
        .collect();
    std::sync::Arc::new(model::mimi::Mimi::from_tensors(&weights, &cfg, 8).unwrap())
}

/// Runs `f` and asserts that it created no buffer or bind group on `ctx` (the per-frame promise:
/// everything is made at load); `what` names the work in the failure message.
pub fn creates_nothing<T>(ctx: &GpuContext, what: &str, f: impl FnOnce() -> T) -> T {
    let before = (ctx.buffers_created(), ctx.bind_groups_created());
    let out = f();
    assert_eq!(
        (ctx.buffers_created(), ctx.bind_groups_created()),
        before,
        "buffers or bind groups created {what}"
    );
    out
}
