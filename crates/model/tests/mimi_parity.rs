//! Parity of the Mimi codec with `moshi` 0.2.13 on the committed tiny fixture
//! (`fixtures/mimi/`, 32 frames, transformer context 8 so the KV ring wraps many times).

mod mimi_common;

use mimi_common::*;
use model::mimi::{
    broken_plans, ConvAt, Layout, Mimi, MimiDecoder, MimiEncoder, MimiError, MimiPlan, Side, Stage,
    Step, StreamEncoder,
};
use testkit::compare::max_abs_diff;

const TOL: f32 = 1e-4;

struct Run {
    codes: Vec<u32>, // [nq, T]
    pcm: Vec<f32>,
    tr: Collector,
}

fn run_streaming(mimi: &std::sync::Arc<model::mimi::Mimi>, input: &[f32]) -> Run {
    let fs = mimi.frame_size();
    let t = input.len().div_ceil(fs);
    let mut padded = input.to_vec();
    padded.resize(t * fs, 0.0);
    let nq = mimi.n_codebooks();
    let mut tr = Collector::default();
    let mut enc = MimiEncoder::new(mimi.clone());
    let mut codes = vec![0u32; nq * t];
    for f in 0..t {
        let mut cb = |s: Stage, x: &[f32]| tr.push(s, x);
        let c = enc
            .encode_frame_with(&padded[f * fs..(f + 1) * fs], None, Some(&mut cb))
            .unwrap();
        for q in 0..nq {
            codes[q * t + f] = c[q];
        }
    }
    let mut dec = MimiDecoder::new(mimi.clone());
    let mut pcm = vec![0.0; t * fs];
    for f in 0..t {
        let fc: Vec<u32> = (0..nq).map(|q| codes[q * t + f]).collect();
        let mut cb = |s: Stage, x: &[f32]| tr.push(s, x);
        dec.decode_frame_with(&fc, &mut pcm[f * fs..(f + 1) * fs], None, Some(&mut cb))
            .unwrap();
    }
    Run { codes, pcm, tr }
}

fn codes_of(m: &TensorMap, name: &str) -> (Vec<u32>, usize) {
    let (v, s) = &m[name];
    (v.iter().map(|&x| x as u32).collect(), s[1])
}

#[test]
fn streaming_matches_oracle() {
    let spec = spec();
    let mimi = load("mimi.safetensors", &spec);
    assert_eq!(mimi.layout(), Layout::Kyutai);
    let tr = read_tensors("trace.safetensors");
    let input = &input_pcm();
    let run = run_streaming(&mimi, input);
    let (want_codes, t) = codes_of(&tr, "codes");
    assert!(t >= 24);
    assert_eq!(run.codes, want_codes, "codes differ");
    let d = spec.seanet.dimension;
    for name in Stage::ALL.map(Stage::name) {
        let got = run.tr.get(name, d);
        let err = max_abs_diff(&got, &tr[name].0);
        eprintln!("{name}: max abs diff {err:e}");
        assert!(err < TOL, "{name}: max abs diff {err}");
    }
    let err = max_abs_diff(&run.pcm, &tr["pcm"].0);
    eprintln!("pcm: max abs diff {err:e}");
    assert!(err < TOL, "pcm: max abs diff {err}");
}

#[test]
fn batch_matches_oracle() {
    let spec = spec();
    let mimi = load("mimi.safetensors", &spec);
    let tr = read_tensors("trace.safetensors");
    let input = &input_pcm();
    let codes = mimi.encode(input);
    let (want, t) = codes_of(&tr, "codes_batch");
    assert_eq!(codes, want, "batch codes differ");
    // The fixture's batch PCM is the batch decode of the *streaming* codes.
    let (sc, _) = codes_of(&tr, "codes");
    let pcm = mimi.decode(&sc, t).unwrap();
    let err = max_abs_diff(&pcm, &tr["pcm_batch"].0);
    assert!(err < TOL, "batch pcm: max abs diff {err}");
}

#[test]
fn hf_layout_gives_identical_codes() {
    let spec = spec();
    let hf = load("mimi_hf.safetensors", &spec);
    assert_eq!(hf.layout(), Layout::HuggingFace);
    let tr = read_tensors("trace.safetensors");
    let run = run_streaming(&hf, &input_pcm());
    let (want, _) = codes_of(&tr, "codes");
    assert_eq!(run.codes, want);
    let err = max_abs_diff(&run.pcm, &tr["pcm"].0);
    assert!(err < TOL, "hf pcm: {err}");
}

#[test]
fn reset_reproduces_first_run_exactly() {
    let spec = spec();
    let mimi = load("mimi.safetensors", &spec);
    let input = &input_pcm();
    let fs = mimi.frame_size();
    let nq = mimi.n_codebooks();
    let mut enc = MimiEncoder::new(mimi.clone());
    let mut dec = MimiDecoder::new(mimi.clone());
    // Encodes then decodes input frames `frames`, returning their codes and decoded samples.
    let go = |enc: &mut MimiEncoder, dec: &mut MimiDecoder, frames: std::ops::Range<usize>| {
        let mut codes = Vec::new();
        let mut pcm = vec![0.0; frames.len() * fs];
        for (i, f) in frames.enumerate() {
            let c = enc
                .encode_frame(&input[f * fs..(f + 1) * fs])
                .unwrap()
                .to_vec();
            dec.decode_frame(&c, &mut pcm[i * fs..(i + 1) * fs])
                .unwrap();
            codes.extend(c);
        }
        (codes, pcm)
    };
    let (c1, p1) = go(&mut enc, &mut dec, 0..12);
    // run further so the state (ring, positions, conv tails) is far from fresh
    go(&mut enc, &mut dec, 12..30);
    enc.reset();
    dec.reset();
    let (c2, p2) = go(&mut enc, &mut dec, 0..12);
    assert_eq!(c1.len(), 12 * nq);
    assert_eq!(c1, c2);
    assert!(
        p1.iter().zip(&p2).all(|(a, b)| a.to_bits() == b.to_bits()),
        "pcm not bit-identical after reset"
    );
}

#[test]
fn stream_equals_batch_when_ring_never_limits() {
    // With a context longer than the signal the PyTorch ring limitation vanishes, so the
    // streaming and non-streaming paths must agree (codes exactly, floats to rounding).
    let mut spec = spec();
    spec.transformer.context = Some(1000);
    let mimi = load("mimi.safetensors", &spec);
    let input = &input_pcm();
    let run = run_streaming(&mimi, input);
    let t = run.codes.len() / mimi.n_codebooks();
    assert_eq!(mimi.encode(input), run.codes);
    let pcm = mimi.decode(&run.codes, t).unwrap();
    let err = max_abs_diff(&pcm, &run.pcm);
    assert!(err < TOL, "stream vs batch pcm {err}");
}

#[test]
fn stream_front_accepts_any_chunking() {
    let spec = spec();
    let mimi = load("mimi.safetensors", &spec);
    let input = &input_pcm();
    let run = run_streaming(&mimi, input);
    let nq = mimi.n_codebooks();
    let t = run.codes.len() / nq;
    let mut front = StreamEncoder::new(MimiEncoder::new(mimi.clone()));
    let mut got: Vec<Vec<u32>> = Vec::new();
    let sizes = [1usize, 7, 1919, 1920, 1921, 333, 4000, 0, 5];
    let mut pos = 0;
    let mut i = 0;
    while pos < input.len() {
        let n = sizes[i % sizes.len()].min(input.len() - pos);
        front
            .push(&input[pos..pos + n], |c| got.push(c.to_vec()))
            .unwrap();
        pos += n;
        i += 1;
    }
    front.flush(|c| got.push(c.to_vec())).unwrap();
    assert_eq!(got.len(), t);
    for (f, c) in got.iter().enumerate() {
        for (q, &cq) in c.iter().enumerate().take(nq) {
            assert_eq!(cq, run.codes[q * t + f], "frame {f} q {q}");
        }
    }
}

#[test]
fn bad_inputs_are_errors() {
    let spec = spec();
    let mimi = load("mimi.safetensors", &spec);
    let mut enc = MimiEncoder::new(mimi.clone());
    assert!(enc.encode_frame(&[0.0; 100]).is_err());
    let mut dec = MimiDecoder::new(mimi.clone());
    let mut out = vec![0.0; mimi.frame_size()];
    assert!(dec.decode_frame(&[0; 3], &mut out).is_err());
    assert!(dec.decode_frame(&[64; 8], &mut out).is_err());
    assert!(mimi.decode(&[0; 7], 1).is_err());
    let mut w = read_tensors("mimi.safetensors");
    w.remove("encoder_transformer.transformer.layers.1.linear2.weight");
    assert!(model::mimi::Mimi::from_tensors(&w, &spec, 8).is_err());
    let w = read_tensors("mimi.safetensors");
    assert!(model::mimi::Mimi::from_tensors(&w, &spec, 11).is_err());
}

#[test]
fn non_finite_weights_are_refused_at_load() {
    let spec = spec();
    for (name, bad) in [
        (
            "decoder_transformer.transformer.layers.0.linear1.weight",
            f32::NAN,
        ),
        ("encoder.model.0.conv.conv.weight", f32::INFINITY),
        (
            "quantizer.rvq_rest.vq.layers.2._codebook.embedding_sum",
            f32::NEG_INFINITY,
        ),
    ] {
        let mut w = read_tensors("mimi.safetensors");
        let t = w.get_mut(name).expect("tensor in the fixture");
        let i = t.0.len() / 2;
        t.0[i] = bad;
        match model::mimi::Mimi::from_tensors(&w, &spec, 8) {
            Err(model::mimi::MimiError::NonFinite { name: n }) => assert_eq!(n, name),
            other => panic!("{name}: expected NonFinite, got {other:?}"),
        }
    }
}

#[test]
fn bf16_transformers_option_stays_close() {
    // Opt-in speed mode: transformer weights rounded to bf16. Not exact; on the tiny fixture the
    // streaming codes still match the oracle and the PCM stays close.
    let spec = spec();
    let w = read_tensors("mimi.safetensors");
    let opts = model::mimi::MimiOptions {
        bf16_transformers: true,
    };
    let mimi =
        std::sync::Arc::new(model::mimi::Mimi::from_tensors_with(&w, &spec, 8, &opts).unwrap());
    let tr = read_tensors("trace.safetensors");
    let run = run_streaming(&mimi, &input_pcm());
    let (want, _) = codes_of(&tr, "codes");
    let same = run.codes.iter().zip(&want).filter(|(a, b)| a == b).count();
    let err = max_abs_diff(&run.pcm, &tr["pcm"].0);
    eprintln!(
        "bf16 transformers: {same}/{} codes equal, pcm max abs diff {err:e}",
        want.len()
    );
    assert!(
        same * 10 >= want.len() * 9,
        "too many code changes: {same}/{}",
        want.len()
    );
    let exact = max_abs_diff(
        &run_streaming(&load("mimi.safetensors", &spec), &input_pcm()).pcm,
        &tr["pcm"].0,
    );
    assert!(err > exact, "bf16 path should not be bit-identical to f32");
}

/// The CPU runs its plan: each broken plan ([`broken_plans`]: a residual unit dropped, two
/// transformer layers swapped, on either side) moves the streaming run off the oracle's trace
/// and samples, while the model's own plan stays on them; a plan that does not fit the weights is
/// refused with a typed error.
#[test]
fn a_broken_plan_fails_parity_on_the_cpu() {
    let spec = spec();
    let (weights, tr, input) = (
        read_tensors("mimi.safetensors"),
        read_tensors("trace.safetensors"),
        input_pcm(),
    );
    // The largest distance of the traced tensors and of the samples from the oracle's.
    let off = |m: Mimi| {
        let run = run_streaming(&std::sync::Arc::new(m), &input);
        let d = |name: &str, got: &[f32]| max_abs_diff(got, &tr[name].0);
        Stage::ALL
            .map(|s| d(s.name(), &run.tr.get(s.name(), spec.seanet.dimension)))
            .into_iter()
            .fold(d("pcm", &run.pcm), f32::max)
    };
    let model = || Mimi::from_tensors(&weights, &spec, 8).unwrap();
    assert!(off(model()) < TOL);
    for (name, plan) in broken_plans(&spec) {
        let e = off(model().with_plan(plan).unwrap());
        eprintln!("{name}: {e:e} from the oracle");
        assert!(e > 100.0 * TOL, "{name}: {e}");
    }
    let unfit = |f: &dyn Fn(&mut MimiPlan)| {
        let mut p = MimiPlan::new(&spec);
        f(&mut p);
        matches!(model().with_plan(p), Err(MimiError::Config(_)))
    };
    let down0 = |s: &Step| {
        matches!(
            s,
            Step::Conv {
                at: ConvAt::Down(0),
                ..
            }
        )
    };
    assert!(
        unfit(&|p| p.encoder.retain(|s| !down0(s))),
        "channels that do not fit"
    );
    assert!(
        unfit(&|p| {
            p.encoder.pop();
        }),
        "an encoder ending in latents"
    );
    let layer0 = Step::Layer {
        side: Side::Decoder,
        layer: 0,
    };
    assert!(
        unfit(&|p| p.decoder.insert(5, layer0)),
        "a layer named twice"
    );
}

/// The place → name table (`model::mimi::tensor_names`, what the loader and any backend reading
/// the checkpoint itself use) names exactly the fixture checkpoints' tensors, in both layouts:
/// none missing, none left unread (but the quantizer's `initialized` training flags, which
/// carry no weight).
#[test]
fn the_name_table_names_every_checkpoint_tensor() {
    use std::collections::BTreeSet;
    let spec = spec();
    let canonical = model::mimi::tensor_names(&spec, spec.quantizer.n_q);
    let weights = |file: &str| -> BTreeSet<String> {
        read_tensors(file)
            .into_keys()
            .filter(|n| !n.ends_with("initialized"))
            .collect()
    };
    let kyutai: BTreeSet<String> = canonical.iter().cloned().collect();
    assert_eq!(kyutai.len(), canonical.len(), "a name given twice");
    assert_eq!(kyutai, weights("mimi.safetensors"));
    let hf: BTreeSet<String> = canonical
        .iter()
        .flat_map(|n| match n.strip_suffix("in_proj_weight") {
            Some(p) => ["q_proj", "k_proj", "v_proj"]
                .map(|q| Layout::HuggingFace.checkpoint_name(&format!("{p}{q}.weight")))
                .to_vec(),
            None => vec![Layout::HuggingFace.checkpoint_name(n)],
        })
        .collect();
    assert_eq!(hf, weights("mimi_hf.safetensors"));
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

fn conv_key(c: &model::mimi::ConvWeights) -> impl PartialEq + std::fmt::Debug {
    let shape = (c.cin, c.cout, c.k, c.stride, c.dilation, c.replicate);
    (shape, bits(&c.weight), bits(&c.bias))
}

/// `MimiSource` (a checkpoint read by plan place, no CPU model built: what a device backend
/// uploads from) gives, for every convolution, transposed convolution and residual unit the
/// plan names and both transformers, bit for bit the weights and shapes the loaded CPU model
/// exports, in both layouts.
#[test]
fn the_checkpoint_source_gives_the_loaded_weights_by_place() {
    use model::mimi::{ConvTrWeights, MimiSource};
    let spec = spec();
    let tr_key = |c: &ConvTrWeights| {
        let shape = (c.cin, c.cout, c.k, c.stride, c.depthwise);
        (shape, bits(&c.weight), bits(&c.bias))
    };
    for file in ["mimi.safetensors", "mimi_hf.safetensors"] {
        let tensors = read_tensors(file);
        let mimi = load(file, &spec);
        let src = MimiSource::new(&tensors, &spec).unwrap();
        assert_eq!(src.layout(), mimi.layout());
        let plan = MimiPlan::new(&spec);
        for &step in plan.encoder.iter().chain(&plan.decoder) {
            match step {
                Step::Conv { at, .. } => assert_eq!(
                    conv_key(&src.conv_weights(at).unwrap()),
                    conv_key(&mimi.conv_weights(at).unwrap()),
                    "{file} {at:?}"
                ),
                Step::ConvTr { at, .. } => assert_eq!(
                    tr_key(&src.conv_tr_weights(at).unwrap()),
                    tr_key(&mimi.conv_tr_weights(at).unwrap()),
                    "{file} {at:?}"
                ),
                Step::Res(at) => {
                    let (a, b) = (src.res_weights(at).unwrap(), mimi.res_weights(at).unwrap());
                    assert_eq!(conv_key(&a.c1), conv_key(&b.c1), "{file} {at:?}");
                    assert_eq!(conv_key(&a.c2), conv_key(&b.c2), "{file} {at:?}");
                }
                _ => {}
            }
        }
        for side in [Side::Encoder, Side::Decoder] {
            let (a, b) = (
                src.transformer_weights(side).unwrap(),
                mimi.transformer_weights(side),
            );
            assert_eq!(
                (a.d, a.heads, a.ff, a.context),
                (b.d, b.heads, b.ff, b.context)
            );
            assert_eq!(a.max_period.to_bits(), b.max_period.to_bits());
            assert_eq!(a.layers.len(), b.layers.len());
            for (x, y) in a.layers.iter().zip(&b.layers) {
                let all = |l: &model::mimi::TransformerLayerWeights| {
                    [
                        &l.norm1_w,
                        &l.norm1_b,
                        &l.in_proj,
                        &l.out_proj,
                        &l.ls1,
                        &l.norm2_w,
                    ]
                    .into_iter()
                    .chain([&l.norm2_b, &l.linear1, &l.linear2, &l.ls2])
                    .map(|v| bits(v))
                    .collect::<Vec<_>>()
                };
                assert_eq!(all(x), all(y), "{file} {side:?}");
            }
        }
    }
}
