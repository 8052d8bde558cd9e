//! The one-submission duplex frame (`gpu::GpuDuplex`: Mimi encode → LM step with the delay ring on
//! the device → device sampling → Mimi decode, one submission, one wait on it) against the
//! oracle's emulation of Kyutai's server loop (`fixtures/duplex`, moshi 0.2.13, greedy, the tiny
//! bundle `fixtures/lm`: frame 0 encoded, Mimi reset, its codes to LMGen call 0, every later output
//! decoded): text and audio tokens exact, PCM within Mimi's parity bound (1e-4), one submission
//! and one wait per frame; the replay path (host codes differing from the device's) gives the same
//! frames; a reset conversation runs as a fresh one.

mod common;

use std::path::PathBuf;
use std::sync::Arc;

use gpu::{GpuDuplex, GpuLmOptions, GpuLmWeights, GpuMimiWeights};
use model::lm::FrameStep;
use model::sampling::{Sampler, SamplerConfig};
use testkit::TensorFile;

const FRAME: usize = 1920;

fn fixture(name: &str) -> PathBuf {
    testkit::fixtures_dir("duplex").join(name)
}

/// The conversation of the fixture bundle on the device, or `None` (printed) without an adapter.
fn duplex() -> Option<GpuDuplex> {
    let ctx = common::context()?;
    let m = model::MoshiModel::open(&testkit::fixtures_dir("lm")).unwrap();
    let lm = GpuLmWeights::upload(&ctx, &m.lm).unwrap();
    let mimi = GpuMimiWeights::upload(&ctx, Arc::new(m.mimi)).unwrap();
    // f32 KV rings, as the oracle computes.
    Some(GpuDuplex::new(lm, mimi, GpuLmOptions::default()).unwrap())
}

/// What a run gave: the returned frames' text tokens, codes `[frames][8]`, decoded PCM, and per
/// call the submissions and waits it took.
#[derive(Default)]
struct Run {
    text: Vec<i64>,
    audio: Vec<Vec<i64>>,
    pcm: Vec<f32>,
    per_call: Vec<(u64, u64)>,
}

/// `frames` calls on the fixture's input with a greedy sampler, the first-frame rule on frame 0
/// when `rule`.
fn run(d: &mut GpuDuplex, frames: usize, rule: bool) -> Run {
    let input = testkit::read_wav_f32(fixture("input.wav"));
    assert!(input.len() >= frames * FRAME);
    let spec = d.spec().clone();
    let mut sampler = Sampler::new(SamplerConfig::greedy(), spec.text_card, spec.card).unwrap();
    let mut out = vec![0.0f32; FRAME];
    let mut r = Run::default();
    for i in 0..frames {
        let ctx = d.context().clone();
        let before = (ctx.submissions(), ctx.waits());
        let opts = FrameStep {
            force_text: None,
            reset_codec_after_encode: rule && i == 0,
        };
        let got = common::creates_nothing(&ctx, "in a frame", || {
            d.frame(
                &input[i * FRAME..(i + 1) * FRAME],
                &mut sampler,
                opts,
                &mut out,
            )
            .unwrap()
        });
        r.per_call
            .push((ctx.submissions() - before.0, ctx.waits() - before.1));
        match got {
            Some(f) => {
                r.text.push(i64::from(f.text));
                r.audio
                    .push(f.audio().iter().map(|&c| i64::from(c)).collect());
                r.pcm.extend_from_slice(&out);
            }
            None => assert_eq!(i, 0, "only call 0 has no frame"),
        }
    }
    r
}

/// Asserts `r` is the oracle's trace: tokens exact, PCM within 1e-4.
fn assert_oracle(r: &Run, what: &str) {
    let trace = TensorFile::open(fixture("trace.safetensors"));
    let (text, _) = trace.i64("text_tokens");
    let (audio, shape) = trace.i64("audio_tokens");
    let (pcm, _) = trace.f32("pcm");
    let steps = text.len();
    assert_eq!(shape, [8, steps]);
    assert_eq!(r.text, text, "{what}: text tokens");
    for (t, codes) in r.audio.iter().enumerate() {
        for (k, &c) in codes.iter().enumerate() {
            assert_eq!(c, audio[k * steps + t], "{what}: codebook {k}, output {t}");
        }
    }
    assert_eq!(r.pcm.len(), pcm.len(), "{what}: samples");
    let err = testkit::compare::max_abs_diff(&r.pcm, &pcm);
    eprintln!("{what}: {steps} outputs, pcm max abs error {err:e} against the oracle");
    assert!(err <= 1e-4, "{what}: pcm max abs error {err}");
}

fn oracle_calls() -> usize {
    let trace = TensorFile::open(fixture("trace.safetensors"));
    // One LM output per input frame but the first (LMGen's call 0).
    trace.i64("text_tokens").0.len() + 1
}

/// The server loop in one submission per frame reproduces the oracle's trace, and each call
/// takes exactly one submission and one wait (no code needed the host's decision here).
#[test]
fn one_submission_frames_reproduce_the_oracle_trace() {
    let Some(mut d) = duplex() else { return };
    let calls = oracle_calls();
    let r = run(&mut d, calls, true);
    assert_oracle(&r, "one-submission frames");
    assert_eq!(d.host_decisions(), 0, "every code proven on the device");
    assert_eq!(d.replays(), 0);
    for (i, &(submits, waits)) in r.per_call.iter().enumerate() {
        assert_eq!((submits, waits), (1, 1), "call {i}: (submissions, waits)");
    }
}

/// When the host's exact codes differ from the device's (the device's first code zeroed on
/// purpose, every frame decided on the host), the frame is replayed from the restored decoder
/// state and the LM's same position: the same trace, with the extra submissions counted.
#[test]
fn replayed_frames_reproduce_the_oracle_trace() {
    let Some(mut d) = duplex() else { return };
    d.force_host_decision(true);
    d.spoil_device_codes(true);
    let calls = oracle_calls();
    let r = run(&mut d, calls, true);
    assert_oracle(&r, "replayed frames");
    assert_eq!(d.host_decisions(), calls as u64);
    assert!(
        d.replays() * 2 > calls as u64,
        "{} of {calls} frames replayed",
        d.replays()
    );
    let extra: u64 = r.per_call.iter().map(|&(s, _)| s - 1).sum();
    // One submission for each host decision (the latents' readback), one for each replay.
    assert_eq!(extra, d.host_decisions() + d.replays());
}

/// After a reset (LM row, delay ring, codec streams, sampler) the conversation runs as a fresh
/// one: the oracle's trace again, and without the first-frame rule (which resets the codec after
/// frame 0's encode anyway and would hide a codec left dirty) a fresh conversation's frames bit
/// for bit.
#[test]
fn a_reset_conversation_runs_as_a_fresh_one() {
    let Some(mut d) = duplex() else { return };
    let _ = run(&mut d, 5, true);
    d.reset_lm();
    d.reset_codec();
    assert_eq!(d.offset(), 0);
    let r = run(&mut d, oracle_calls(), true);
    assert_oracle(&r, "after a reset");

    let want = run(&mut duplex().unwrap(), 12, false);
    d.reset_lm();
    d.reset_codec();
    let got = run(&mut d, 12, false);
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!((&got.text, &got.audio), (&want.text, &want.audio));
    assert_eq!(
        bits(&got.pcm),
        bits(&want.pcm),
        "without the first-frame rule: PCM"
    );
}
