//! The LM on the device against the oracle fixtures and the CPU backend, for every weight format of
//! the tiny model (`fixtures/lm*`): greedy tokens identical over the fixture length, logits within
//! 1e-4 of the oracle (each fixture's trace was computed by moshi in f32 from that file's
//! dequantized weights, which is what the device computes) and of the CPU backend in its exact
//! mode (quantized weights × f32 activations, `kernels::set_f32_activations`).

mod common;

use std::path::PathBuf;
use std::sync::Arc;

use gpu::{GpuContext, GpuError, GpuLm, GpuLmOptions, GpuLmWeights};
use kernels::Pool;
use model::lm::{
    CpuLm, Generator, KvDtype, LmBackend, LmError, LmFrame, LmModel, LmObserver, LmPlan,
    LmRecorder, Op,
};
use model::sampling::{Sampler, SamplerConfig};
use testkit::compare::max_abs_diff;
use testkit::TensorFile;

fn fixtures() -> PathBuf {
    testkit::fixtures_dir("")
}

/// User codes `[8, T]` of the LM fixtures.
fn user_codes() -> (Vec<i64>, usize) {
    let (c, shape) = TensorFile::open(fixtures().join("lm/CODES.safetensors")).i64("codes");
    (c, shape[1])
}

fn load(dir: &str) -> LmModel {
    model::MoshiModel::open(&fixtures().join(dir)).unwrap().lm
}

/// Runs `steps` greedy calls of one session through `backend`, recording everything.
fn run(backend: Box<dyn LmBackend>, steps: usize) -> LmRecorder {
    let mut gen = Generator::new(backend).unwrap();
    let mut rec = LmRecorder::default();
    let out = run_observed(&mut gen, steps, SamplerConfig::greedy(), &mut rec);
    (rec.out_text, rec.out_audio) = (out.text, out.audio);
    rec
}

fn cpu_backend(m: LmModel) -> Box<dyn LmBackend> {
    Box::new(CpuLm::new(Arc::new(m), 1, KvDtype::F32, Arc::new(Pool::new(1))).unwrap())
}

fn gpu_backend(ctx: &GpuContext, m: &LmModel, rows: usize) -> GpuLm {
    GpuLm::new(GpuLmWeights::upload(ctx, m).unwrap(), rows).unwrap()
}

/// The device weights of fixture `dir` read straight from its checkpoint (the engine's path: no
/// CPU model built).
fn checkpoint_weights(ctx: &GpuContext, dir: &str) -> Arc<GpuLmWeights> {
    let b = model::checkpoint::Bundle::open(&fixtures().join(dir)).unwrap();
    let spec = model::lm::LmSpec::from_config(&b.config.lm).unwrap();
    GpuLmWeights::from_source(ctx, &b.lm_weights().unwrap(), spec).unwrap()
}

/// One fixture format: GPU vs oracle trace and vs CPU.
fn check_format(ctx: &GpuContext, dir: &str) {
    kernels::set_f32_activations(true);
    let trace = TensorFile::open(fixtures().join(dir).join("trace.safetensors"));
    let (inp, shape) = trace.i64("input_tokens");
    let steps = shape[0];
    let g = run(
        Box::new(GpuLm::new(checkpoint_weights(ctx, dir), 1).unwrap()),
        steps,
    );
    let c = run(cpu_backend(load(dir)), steps);
    assert_eq!(g.input_tokens, inp, "{dir}: input tokens");
    assert_eq!(g.input_tokens, c.input_tokens, "{dir}: input tokens vs CPU");
    let (out_text, audio) = common::oracle_tokens(&trace);
    assert_eq!(g.out_text, out_text, "{dir}: text tokens");
    assert_eq!(g.out_audio, audio, "{dir}: audio tokens");
    assert_eq!(
        (&g.out_text, &g.out_audio),
        (&c.out_text, &c.out_audio),
        "{dir}: tokens vs CPU"
    );
    for (name, got, cpu) in [
        ("transformer_out", &g.transformer_out, &c.transformer_out),
        ("text_logits", &g.text_logits, &c.text_logits),
        ("depformer_logits", &g.depformer_logits, &c.depformer_logits),
    ] {
        let (want, _) = trace.f32(name);
        let d_oracle = max_abs_diff(got, &want);
        let d_cpu = max_abs_diff(got, cpu);
        eprintln!("{dir} {name}: max |gpu - oracle| {d_oracle:e}, max |gpu - cpu| {d_cpu:e}");
        assert!(d_oracle < 1e-4, "{dir} {name}: {d_oracle} from the oracle");
        assert!(d_cpu < 1e-4, "{dir} {name}: {d_cpu} from the CPU");
    }
}

#[test]
fn f32_weights_match_oracle_and_cpu() {
    let Some(ctx) = common::context() else { return };
    check_format(&ctx, "lm");
}

/// The device records its plan: each broken plan (`model::lm::broken_plans`) is recorded, runs,
/// and fails the oracle's trace (the model's own plan passes it: `f32_weights_match_oracle_and_cpu`);
/// a plan this device cannot record (an intermediate left unfused) is refused.
#[test]
fn a_broken_plan_fails_parity_on_the_device() {
    let Some(ctx) = common::context() else { return };
    let trace = TensorFile::open(fixtures().join("lm/trace.safetensors"));
    let steps = trace.i64("input_tokens").1[0];
    let w = checkpoint_weights(&ctx, "lm");
    let opts = GpuLmOptions::default();
    for (name, plan) in model::lm::broken_plans(w.spec()) {
        let g = run(
            Box::new(GpuLm::with_plan(w.clone(), 1, opts, &plan).unwrap()),
            steps,
        );
        let d = |got: &[f32], name| max_abs_diff(got, &trace.f32(name).0);
        let d = d(&g.transformer_out, "transformer_out")
            .max(d(&g.text_logits, "text_logits"))
            .max(d(&g.depformer_logits, "depformer_logits"));
        eprintln!("{name}: {d:e} from the oracle");
        assert!(d > 1e-2, "{name}: {d}");
    }
    // Layer 0's residual add after out_proj dropped: out_proj's output (an intermediate) unread.
    let mut plan = LmPlan::new(w.spec());
    let add = plan
        .temporal
        .ops
        .iter()
        .position(|op| matches!(op, Op::AddInto { .. }))
        .unwrap();
    plan.temporal.ops.remove(add);
    let r = GpuLm::with_plan(w, 1, opts, &plan);
    assert!(matches!(r, Err(GpuError::Unsupported { .. })), "{r:?}");
}

/// The plan recorded with its fusions: per layer 5 launches (`in_proj` with the norm, attention,
/// `out_proj` accumulating, `lin_in` with the norm and the gated SiLU, `lin_out` accumulating), 6
/// when the attention's keys span several chunks (its merge); the temporal step adds one launch
/// for the sum of its input embeddings (every table in one arena), the out norm and the text
/// head, a Depformer step its input projection, its token embedding and its head. The tiny
/// model's matrices are one chunk each.
#[test]
fn the_recorded_plan_fuses_into_five_launches_a_layer() {
    let Some(ctx) = common::context() else { return };
    let w = checkpoint_weights(&ctx, "lm");
    let s = w.spec().clone();
    for (chunk, per_layer) in [(64, 5), (4, 6)] {
        let opts = GpuLmOptions {
            attention_chunk: chunk,
            ..GpuLmOptions::default()
        };
        let g = GpuLm::with_options(w.clone(), 1, opts).unwrap();
        let temporal = 1 + per_layer * s.num_layers + 2;
        let dep = 2 + per_layer * s.dep_layers + 1;
        assert_eq!(
            g.dispatches_per_step(),
            (temporal, dep),
            "chunks of {chunk}"
        );
        assert_eq!(g.dispatches_per_frame(), temporal + 1 + s.dep_q * (dep + 1));
    }
}

/// The oracle's LM fixtures in a weight format other than f32 (`lm`).
const FORMAT_FIXTURES: [&str; 7] = [
    "lm_candle_bf16",
    "lm_gguf_q8",
    "lm_mlx_bf16",
    "lm_mlx_q4",
    "lm_mlx_q8",
    // Written by the real tools (gguf-py's Q4_0, candle's Q8_0); traces from moshi on the
    // tools' own dequantization.
    "tools/ggufpy_q4_0",
    "tools/candle_q8_0",
];

#[test]
fn every_weight_format_matches_oracle_and_cpu() {
    let Some(ctx) = common::context() else { return };
    for dir in FORMAT_FIXTURES {
        check_format(&ctx, dir);
    }
}

/// The weights read straight from the checkpoint are the ones uploaded from the CPU model: every
/// logit of a greedy run is the same bit for bit, in every fixture format.
#[test]
fn checkpoint_weights_are_the_cpu_model_weights() {
    let Some(ctx) = common::context() else { return };
    kernels::set_f32_activations(true);
    for dir in std::iter::once("lm").chain(FORMAT_FIXTURES) {
        let from_model = run(Box::new(gpu_backend(&ctx, &load(dir), 1)), 6);
        let direct = run(
            Box::new(GpuLm::new(checkpoint_weights(&ctx, dir), 1).unwrap()),
            6,
        );
        let bits = |r: &LmRecorder| -> Vec<u32> {
            r.text_logits
                .iter()
                .chain(&r.depformer_logits)
                .chain(&r.transformer_out)
                .map(|x| x.to_bits())
                .collect()
        };
        assert!(!bits(&direct).is_empty(), "{dir}");
        assert_eq!(bits(&direct), bits(&from_model), "{dir}");
        assert_eq!(direct.out_audio, from_model.out_audio, "{dir}");
    }
}

/// The device weights know their own format and the bytes a frame streams, as the CPU model of
/// the same checkpoint tells them, in every fixture format (the engine and the bench read them
/// there, no CPU model built).
#[test]
fn device_weights_tell_their_format_and_streamed_bytes() {
    let Some(ctx) = common::context() else { return };
    for dir in std::iter::once("lm").chain(FORMAT_FIXTURES) {
        let (m, w) = (load(dir), checkpoint_weights(&ctx, dir));
        assert_eq!(w.format(), m.weight_format(), "{dir}");
        assert_eq!(w.streamed_bytes(), m.streamed_weight_bytes(), "{dir}");
    }
}

/// Rows of a batch are independent: two sessions stepped together, or one alone, give the same
/// logits bit for bit as a batch of one; a reset row starts over.
#[test]
fn batch_rows_are_independent_and_reset() {
    let Some(ctx) = common::context() else { return };
    let m = load("lm");
    let w = GpuLmWeights::upload(&ctx, &m).unwrap();
    let s = m.spec().clone();
    let k = s.num_streams();
    let col = |t: usize, salt: u32| -> Vec<u32> {
        (0..k)
            .map(|i| {
                if i == 0 {
                    (t as u32 * 7 + salt) % 128
                } else {
                    (t as u32 * 3 + i as u32 + salt) % 64
                }
            })
            .collect()
    };
    let mut one_a = GpuLm::new(w.clone(), 1).unwrap();
    let mut one_b = GpuLm::new(w.clone(), 1).unwrap();
    let mut two = GpuLm::new(w.clone(), 2).unwrap();
    for t in 0..14 {
        let (a, b) = (col(t, 0), col(t, 5));
        one_a.temporal_step(&[0], &a).unwrap();
        one_b.temporal_step(&[0], &b).unwrap();
        // Odd steps: row 1 first, then both; row 1 alone on every third step.
        if t % 3 == 2 {
            two.temporal_step(&[0], &a).unwrap();
            assert_eq!(
                two.text_logits()[..s.text_card],
                one_a.text_logits()[..s.text_card]
            );
            two.temporal_step(&[1], &b).unwrap();
            assert_eq!(
                two.text_logits()[..s.text_card],
                one_b.text_logits()[..s.text_card]
            );
        } else {
            let mut both = b.clone();
            both.extend_from_slice(&a);
            two.temporal_step(&[1, 0], &both).unwrap();
            assert_eq!(
                two.text_logits()[..s.text_card],
                one_b.text_logits()[..s.text_card]
            );
            assert_eq!(
                two.text_logits()[s.text_card..2 * s.text_card],
                one_a.text_logits()[..s.text_card]
            );
            for kk in 0..s.dep_q {
                let la = one_a.depformer_step(&[0], kk, &[3]).unwrap().to_vec();
                let lb = one_b.depformer_step(&[0], kk, &[4]).unwrap().to_vec();
                let l2 = two.depformer_step(&[1, 0], kk, &[4, 3]).unwrap();
                assert_eq!(l2[..s.card], lb[..s.card]);
                assert_eq!(l2[s.card..2 * s.card], la[..s.card]);
            }
        }
    }
    // Reset row 0 of `two`; a fresh backend given the same inputs agrees.
    two.reset_row(0);
    let mut fresh = GpuLm::new(w, 1).unwrap();
    for t in 0..3 {
        two.temporal_step(&[0], &col(t, 9)).unwrap();
        fresh.temporal_step(&[0], &col(t, 9)).unwrap();
        assert_eq!(
            two.text_logits()[..s.text_card],
            fresh.text_logits()[..s.text_card]
        );
    }
}

/// Bad input is a typed error that leaves the state alone, as on the CPU: after the refusals, one
/// valid frame gives bit for bit what a fresh backend's first frame gives.
#[test]
fn bad_tokens_are_refused() {
    let Some(ctx) = common::context() else { return };
    let m = load("lm");
    let mut g = gpu_backend(&ctx, &m, 1);
    let k = m.spec().num_streams();
    let mut col = vec![0u32; k];
    col[0] = 129;
    assert!(matches!(
        g.temporal_step(&[0], &col),
        Err(LmError::Token { stream: 0, .. })
    ));
    assert!(g.temporal_step(&[1], &vec![0; k]).is_err());
    assert!(
        g.depformer_step(&[0], 0, &[0]).is_err(),
        "depformer before a temporal step"
    );
    let after = one_frame(&mut g);
    let fresh = one_frame(&mut gpu_backend(&ctx, &m, 1));
    assert!(fresh.iter().flatten().any(|&b| b != 0));
    for (i, (a, f)) in after.iter().zip(&fresh).enumerate() {
        assert!(
            a == f,
            "output {i} of the frame after the refusals differs from a fresh backend's first frame"
        );
    }
}

/// One frame of session 0 from a fixed valid input column: the bits of the text logits, the
/// temporal output and every Depformer step's logits (each step fed the previous one's argmax,
/// the first the text logits').
fn one_frame(g: &mut GpuLm) -> Vec<Vec<u32>> {
    let spec = g.spec().clone();
    let col: Vec<u32> = (0..spec.num_streams())
        .map(|i| {
            if i == 0 {
                3
            } else {
                (1 + 3 * i as u32) % spec.card as u32
            }
        })
        .collect();
    g.temporal_step(&[0], &col).unwrap();
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<u32>>();
    let argmax = |v: &[f32]| (0..v.len()).fold(0, |b, i| if v[i] > v[b] { i } else { b }) as u32;
    let mut out = vec![bits(g.text_logits()), bits(g.transformer_out())];
    let mut prev = argmax(g.text_logits());
    for step in 0..spec.dep_q {
        let logits = g.depformer_step(&[0], step, &[prev]).unwrap();
        out.push(bits(logits));
        prev = argmax(logits);
    }
    out
}

/// Nothing is created per frame: buffers and bind groups are counted over 100 frames (the KV ring
/// of context 10 wraps many times) and the count does not move after construction.
#[test]
fn no_buffer_or_bind_group_created_per_frame() {
    let Some(ctx) = common::context() else { return };
    let (g, buffers, binds) = counted_backend(&ctx);
    assert!(buffers > 0 && binds > 0);
    let rec = run(Box::new(g), 100);
    assert_eq!(rec.out_text.len(), 99);
    assert_nothing_created(&ctx, buffers, binds);
}

/// A one-session backend of the fixture LM on `ctx`, and the context's buffer and bind-group counts
/// once it is built.
fn counted_backend(ctx: &GpuContext) -> (GpuLm, u64, u64) {
    let g = gpu_backend(ctx, &load("lm"), 1);
    (g, ctx.buffers_created(), ctx.bind_groups_created())
}

/// The context's buffer and bind-group counts are still `buffers` and `binds` after 100 frames.
fn assert_nothing_created(ctx: &GpuContext, buffers: u64, binds: u64) {
    assert_eq!(
        ctx.buffers_created(),
        buffers,
        "buffers created during 100 frames"
    );
    assert_eq!(
        ctx.bind_groups_created(),
        binds,
        "bind groups created during 100 frames"
    );
}

/// The f32 fixture LM with each matrix passed through `edit(name, matrix)` as it loads.
struct Edited<F> {
    inner: model::checkpoint::Weights,
    edit: F,
}

impl<F: Fn(&str, kernels::Matrix) -> kernels::Matrix> model::lm::TensorSource for Edited<F> {
    fn matrix(&self, name: &str, rows: usize, cols: usize) -> Result<kernels::Matrix, LmError> {
        let m = model::lm::TensorSource::matrix(&self.inner, name, rows, cols)?;
        Ok((self.edit)(name, m))
    }
    fn matrix_rows(
        &self,
        name: &str,
        shape: [usize; 2],
        take: std::ops::Range<usize>,
    ) -> Result<kernels::Matrix, LmError> {
        let m = model::lm::TensorSource::matrix_rows(&self.inner, name, shape, take)?;
        Ok((self.edit)(name, m))
    }
    fn vector(&self, name: &str, len: usize) -> Result<Vec<f32>, LmError> {
        model::lm::TensorSource::vector(&self.inner, name, len)
    }
}

/// The f32 fixture LM, edited as [`Edited`] says.
fn edited_model(edit: impl Fn(&str, kernels::Matrix) -> kernels::Matrix) -> LmModel {
    use model::checkpoint::{Component, LmConfig, Weights};
    let dir = fixtures().join("lm");
    let cfg =
        LmConfig::from_json(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
    let src = Edited {
        inner: Weights::open(&dir.join("model.safetensors"), Component::Lm).unwrap(),
        edit,
    };
    LmModel::from_source(&src, model::lm::LmSpec::from_config(&cfg).unwrap()).unwrap()
}

/// The values of `m`, row-major.
fn dense(m: &kernels::Matrix) -> Vec<f32> {
    let mut v = vec![0f32; m.rows() * m.cols()];
    for (r, row) in v.chunks_exact_mut(m.cols()).enumerate() {
        m.row_f32(r, row);
    }
    v
}

/// The f32 fixture LM with its matrices re-encoded in `format` (those whose columns the format
/// cannot group stay f32, as in real quantized files).
fn reencoded(format: kernels::WeightFormat) -> LmModel {
    let unit = match format {
        kernels::WeightFormat::MlxAffine { group, .. } => group,
        kernels::WeightFormat::Q8_0 | kernels::WeightFormat::Q4_0 => 32,
        _ => 1,
    };
    edited_model(move |_, m| {
        if !m.cols().is_multiple_of(unit) {
            return m;
        }
        kernels::Matrix::encode(format, m.rows(), m.cols(), &dense(&m)).unwrap()
    })
}

/// Every weight format on the same tiny model, device against CPU (exact mode): identical greedy
/// tokens over 40 steps (the ring of context 10 wraps) and logits within 1e-4.
#[test]
fn every_format_on_one_model_matches_cpu() {
    let Some(ctx) = common::context() else { return };
    kernels::set_f32_activations(true);
    for format in testkit::FORMATS {
        let m = reencoded(format);
        let g = run(Box::new(gpu_backend(&ctx, &m, 1)), 40);
        let c = run(cpu_backend(m), 40);
        assert_eq!(g.out_text, c.out_text, "{format:?}: text tokens");
        assert_eq!(g.out_audio, c.out_audio, "{format:?}: audio tokens");
        for (name, a, b) in [
            ("transformer_out", &g.transformer_out, &c.transformer_out),
            ("text_logits", &g.text_logits, &c.text_logits),
            ("depformer_logits", &g.depformer_logits, &c.depformer_logits),
        ] {
            let d = max_abs_diff(a, b);
            eprintln!("{format:?} {name}: max |gpu - cpu| {d:e}");
            assert!(d < 1e-4, "{format:?} {name}: {d}");
        }
    }
}

/// Tokens and generator states of `steps` calls of one session through the generator without an
/// observer: on the GPU backend, every call is one `sampled_step` (sampling on the device).
struct Sampled {
    text: Vec<i64>,
    audio: Vec<i64>,
    states: Vec<[[u64; 4]; 2]>,
    results: Vec<Result<(), LmError>>,
}

fn run_sampled<B: LmBackend + ?Sized>(
    gen: &mut Generator<B>,
    steps: usize,
    config: SamplerConfig,
) -> Sampled {
    run_observed(gen, steps, config, &mut model::lm::NoObserver)
}

/// Runs `steps` calls of session 0 through `gen` on the fixture's user codes, sampling with a
/// sampler of `config`, `observer` watching.
fn run_observed<B: LmBackend + ?Sized>(
    gen: &mut Generator<B>,
    steps: usize,
    config: SamplerConfig,
    observer: &mut impl LmObserver,
) -> Sampled {
    let (codes, t_total) = user_codes();
    let spec = gen.backend().spec().clone();
    let mut samplers = [Sampler::new(config, spec.text_card, spec.card).unwrap()];
    let mut out = Sampled {
        text: Vec::new(),
        audio: Vec::new(),
        states: Vec::new(),
        results: Vec::new(),
    };
    for t in 0..steps {
        let user: Vec<u32> = (0..8)
            .map(|k| codes[k * t_total + t % t_total] as u32)
            .collect();
        let mut o: [Result<Option<LmFrame>, LmError>; 1] = [Ok(None)];
        gen.step(&[0], &user, &mut samplers, None, &mut o, observer)
            .unwrap();
        let [o] = o;
        match o {
            Ok(Some(f)) => {
                out.text.push(f.text as i64);
                out.audio.extend(f.audio().iter().map(|&x| x as i64));
                out.results.push(Ok(()));
            }
            Ok(None) => out.results.push(Ok(())),
            Err(e) => out.results.push(Err(e)),
        }
        out.states.push(samplers[0].stream_states());
    }
    out
}

/// Greedy frames sampled on the device (one submission per frame) give the oracle's tokens and
/// the CPU's on every fixture.
#[test]
fn device_sampled_greedy_frames_match_oracle_and_cpu_on_every_fixture() {
    let Some(ctx) = common::context() else { return };
    kernels::set_f32_activations(true);
    for dir in std::iter::once("lm").chain(FORMAT_FIXTURES) {
        let trace = TensorFile::open(fixtures().join(dir).join("trace.safetensors"));
        let (_, shape) = trace.i64("input_tokens");
        let steps = shape[0];
        let m = load(dir);
        let mut gen = Generator::new(Box::new(gpu_backend(&ctx, &m, 1))).unwrap();
        let g = run_sampled(&mut gen, steps, SamplerConfig::greedy());
        assert_eq!(
            gen.backend().submissions(),
            steps as u64,
            "{dir}: one submission per frame"
        );
        let mut cpu = Generator::new(cpu_backend(m)).unwrap();
        let c = run_sampled(&mut cpu, steps, SamplerConfig::greedy());
        let (out_text, audio) = common::oracle_tokens(&trace);
        assert_eq!(g.text, out_text, "{dir}: text tokens");
        assert_eq!(g.audio, audio, "{dir}: audio tokens");
        assert_eq!((&g.text, &g.audio), (&c.text, &c.audio), "{dir}: vs CPU");
    }
}

/// Sampling settings on the device against the piecewise path of the same backend (the same
/// logits, sampled on the host): top-k 1 makes every draw's token the most probable one, so the
/// tokens must agree exactly, while each draw still advances the streams, whose states must agree
/// after every frame; the repetition penalty and `pad_mult` change which token is most probable.
#[test]
fn device_sampling_matches_host_sampling_of_the_same_logits() {
    let Some(ctx) = common::context() else { return };
    let m = load("lm");
    let w = GpuLmWeights::upload(&ctx, &m).unwrap();
    let mut cfg = SamplerConfig::seeded(7);
    cfg.text.top_k = 1;
    cfg.audio.top_k = 1;
    cfg.pad_mult = Some(1.5);
    cfg.repetition_penalty = Some(model::sampling::RepetitionPenalty {
        penalty: 3.0,
        context: 8,
    });
    let mut dev = Generator::new(Box::new(GpuLm::new(w.clone(), 1).unwrap())).unwrap();
    let d = run_sampled(&mut dev, 40, cfg.clone());
    // The same backend run piecewise: an observer that observes nothing but asks for tensors.
    struct Piecewise;
    impl model::lm::LmObserver for Piecewise {}
    let mut host = Generator::new(Box::new(GpuLm::new(w, 1).unwrap())).unwrap();
    let h = run_observed(&mut host, 40, cfg, &mut Piecewise);
    for t in 0..40 {
        assert_eq!(h.states[t], d.states[t], "states after call {t}");
    }
    let spec = m.spec();
    assert_eq!(host.backend().submissions(), 40 * (1 + spec.dep_q as u64));
    assert_eq!(dev.backend().submissions(), 40);
    assert_eq!((&d.text, &d.audio), (&h.text, &h.audio));
    // The penalty and PAD boost moved the tokens away from plain argmax somewhere.
    let mut greedy = Generator::new(Box::new(
        GpuLm::new(GpuLmWeights::upload(&ctx, &m).unwrap(), 1).unwrap(),
    ))
    .unwrap();
    let g = run_sampled(&mut greedy, 40, SamplerConfig::greedy());
    assert_ne!(g.text, d.text);
}

/// A frame sampled on the device is one submission and one readback, and creates no buffer or
/// bind group: counted over 100 frames (the KV ring of context 10 wraps many times).
#[test]
fn one_submission_and_one_readback_per_sampled_frame() {
    let Some(ctx) = common::context() else { return };
    let (g, buffers, binds) = counted_backend(&ctx);
    let mut gen = Generator::new(Box::new(g)).unwrap();
    let out = run_sampled(&mut gen, 100, SamplerConfig::seeded(3));
    assert_eq!(out.text.len(), 99);
    assert_eq!(
        gen.backend().submissions(),
        100,
        "submissions in 100 frames"
    );
    assert_eq!(gen.backend().readbacks(), 100, "readbacks in 100 frames");
    assert_nothing_created(&ctx, buffers, binds);
}

/// The fixture LM with text-head row 7 set to NaN: the device refuses the text logits with the
/// CPU's typed error (never a token), every frame, on both backends.
#[test]
fn non_finite_text_logits_are_the_cpus_typed_error() {
    let Some(ctx) = common::context() else { return };
    let m = nan_head_model();
    let mut gen = Generator::new(Box::new(gpu_backend(&ctx, &m, 1))).unwrap();
    let g = run_sampled(&mut gen, 5, SamplerConfig::seeded(1));
    let mut cpu = Generator::new(cpu_backend(nan_head_model())).unwrap();
    let c = run_sampled(&mut cpu, 5, SamplerConfig::seeded(1));
    for (a, b) in g.results.iter().zip(&c.results) {
        let e = |r: &Result<(), LmError>| match r {
            Err(LmError::Sampling(model::sampling::SamplingError::NonFiniteLogits {
                stream,
                index,
                value,
            })) => Some((*stream, *index, value.is_nan())),
            _ => None,
        };
        assert_eq!(e(a), Some(("text", 7, true)), "{a:?}");
        assert_eq!(e(a), e(b));
    }
    assert_eq!(gen.backend().submissions(), 5);
}

/// The f32 fixture LM whose text head's row 7 is NaN.
fn nan_head_model() -> LmModel {
    edited_model(|name, m| {
        if !name.contains("text_linear") {
            return m;
        }
        let (rows, cols) = (m.rows(), m.cols());
        let mut v = dense(&m);
        v[7 * cols] = f32::NAN;
        kernels::Matrix::encode(kernels::WeightFormat::F32, rows, cols, &v).unwrap()
    })
}
