//! Shared by the GPU tests: a device on any adapter (lavapipe here), or a printed skip.
#![allow(dead_code)]

use gpu::{AdapterChoice, GpuContext, GpuOptions};
use kernels::WeightFormat;

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

/// The matrix-product property tests' contexts, made once per test binary:
/// `[small bindings][subgroups]`. Small bindings (4 KiB) split most matrices of a property test
/// into several chunks; the fallback contexts have the subgroup path turned off.
pub fn matvec_context(small: bool, subgroups: bool) -> Option<&'static GpuContext> {
    static CTX: std::sync::OnceLock<[Option<GpuContext>; 4]> = std::sync::OnceLock::new();
    let all = CTX.get_or_init(|| {
        std::array::from_fn(|i| {
            let (small, sg) = (i / 2 == 1, i % 2 == 1);
            let c = context_with(GpuOptions {
                max_binding_bytes: small.then_some(4096),
                ..Default::default()
            })?;
            c.set_subgroups(sg);
            Some(c)
        })
    });
    all[usize::from(small) * 2 + usize::from(subgroups)].as_ref()
}

/// Values a lane of the matvec kernel reads per step (see `shaders/matvec.rs`).
pub fn step_values(format: WeightFormat) -> usize {
    match format {
        WeightFormat::F32 => 4,
        WeightFormat::F16 | WeightFormat::Bf16 => 8,
        _ => 32,
    }
}

/// Smallest column unit a format allows: 4 for the dense formats (the upload's requirement),
/// the block or group size otherwise.
pub fn col_unit(format: WeightFormat) -> usize {
    match format {
        WeightFormat::MlxAffine { group, .. } => group,
        WeightFormat::Q8_0 | WeightFormat::Q4_0 => 32,
        _ => 4,
    }
}

/// The LM of the fixture bundle `dir` (under `fixtures/`) on `ctx`, packed straight from its
/// checkpoint (`GpuLmWeights::from_source`, as the engine loads it: no CPU model built).
pub fn fixture_lm(ctx: &GpuContext, dir: &str) -> std::sync::Arc<gpu::GpuLmWeights> {
    let b = model::checkpoint::Bundle::open(&testkit::fixtures_dir(dir)).unwrap();
    let spec = model::lm::LmSpec::from_config(&b.config.lm).unwrap();
    gpu::GpuLmWeights::from_source(ctx, &b.lm_weights().unwrap(), spec).unwrap()
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

/// The Mimi fixture's input (`input.wav`, 24 kHz mono IEEE f32), zero-padded to whole frames of `fs` samples.
pub fn mimi_input_frames(fs: usize) -> Vec<f32> {
    let mut pcm = testkit::read_wav_f32(mimi_fixture("input.wav"));
    pcm.resize(pcm.len().div_ceil(fs) * fs, 0.0);
    pcm
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

/// The text tokens and audio codes of an oracle trace, the codes frame by frame (a frame's 8
/// codebooks together, as a run records them; the trace keeps them codebook by codebook).
pub fn oracle_tokens(trace: &testkit::TensorFile) -> (Vec<i64>, Vec<i64>) {
    let (text, _) = trace.i64("out_text");
    let (a, s) = trace.i64("out_audio");
    let frames = s[1];
    let audio = (0..frames)
        .flat_map(|t| (0..8).map(move |k| (t, k)))
        .map(|(t, k)| a[k * frames + t])
        .collect();
    (text, audio)
}
