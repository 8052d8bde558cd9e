//! Mimi on the device against the oracle fixture (`fixtures/mimi/`: the tiny codec, 32 frames,
//! transformer context 8 so the K/V rings wrap many times) and the CPU codec: streaming decoder
//! PCM within 1e-4 of the oracle's and of the CPU's, encoder codes identical, no buffer or bind
//! group created per frame, reset back to a fresh stream.

mod common;

use common::{
    mimi_fixture as fixture, mimi_fixture_codec as mimi, mimi_input_frames as input_frames,
    mimi_oracle_codes as oracle_codes,
};

use std::sync::Arc;

use gpu::{GpuContext, GpuMimi, GpuMimiWeights};
use model::mimi::{CodecBackend, CpuMimi, Mimi};
use testkit::compare::max_abs_diff;

const TOL: f32 = 1e-4;

fn trace() -> testkit::TensorFile {
    testkit::TensorFile::open(fixture("trace.safetensors"))
}

/// What every test starts from: the context, the fixture codec, its device codec, the oracle's
/// codes (`[nq, T]`, and `T`) and the fixture's input PCM.
type Setup = (GpuContext, Arc<Mimi>, GpuMimi, (Vec<u32>, usize), Vec<f32>);

/// The [`Setup`], or `None` without an adapter (a printed skip).
fn setup() -> Option<Setup> {
    let ctx = common::context()?;
    let m = mimi();
    let w = GpuMimiWeights::upload(&ctx, m.clone()).unwrap();
    let g = GpuMimi::new(w, 1).unwrap();
    let pcm = input_frames(m.frame_size());
    Some((ctx, m, g, oracle_codes(), pcm))
}

/// Frame `f`'s codes out of `[nq, T]`.
fn frame_codes(codes: &[u32], nq: usize, t: usize, f: usize) -> Vec<u32> {
    (0..nq).map(|q| codes[q * t + f]).collect()
}

fn decode_all(c: &mut dyn CodecBackend, codes: &[u32], t: usize) -> Vec<f32> {
    let (fs, nq) = (c.frame_size(), c.n_codebooks());
    let mut pcm = vec![0.0; t * fs];
    for f in 0..t {
        c.decode_frames(
            &[0],
            &frame_codes(codes, nq, t, f),
            &mut pcm[f * fs..(f + 1) * fs],
        )
        .unwrap();
    }
    pcm
}

fn encode_all(c: &mut dyn CodecBackend, pcm: &[f32]) -> Vec<u32> {
    let (fs, nq) = (c.frame_size(), c.n_codebooks());
    let t = pcm.len() / fs;
    let mut codes = vec![0; nq * t];
    for f in 0..t {
        let got = c.encode_frames(&[0], &pcm[f * fs..(f + 1) * fs]).unwrap();
        for q in 0..nq {
            codes[q * t + f] = got[q];
        }
    }
    codes
}

#[test]
fn decoder_matches_oracle_and_cpu() {
    let Some((ctx, m, mut g, (codes, t), _)) = setup() else {
        return;
    };
    assert!(t >= 24, "the fixture wraps the context-8 rings");
    let got = common::creates_nothing(&ctx, "while decoding", || decode_all(&mut g, &codes, t));
    let (want, _) = trace().f32("pcm");
    let err = max_abs_diff(&got, &want);
    eprintln!("GPU decoder vs oracle: max abs diff {err:e}");
    assert!(err < TOL, "GPU decoder vs oracle: {err}");
    let mut cpu = CpuMimi::new(m, 1, Arc::new(kernels::Pool::new(1)));
    let cpu_pcm = decode_all(&mut cpu, &codes, t);
    let err = max_abs_diff(&got, &cpu_pcm);
    eprintln!("GPU decoder vs CPU: max abs diff {err:e}");
    assert!(err < TOL, "GPU decoder vs CPU: {err}");
}

#[test]
fn encoder_codes_match_oracle_and_cpu() {
    let Some((ctx, m, mut g, (want, t), pcm)) = setup() else {
        return;
    };
    assert_eq!(pcm.len() / m.frame_size(), t);
    let got = common::creates_nothing(&ctx, "while encoding", || encode_all(&mut g, &pcm));
    assert_eq!(got, want, "GPU codes differ from the oracle's");
    // The fixture's smallest code margin (~2e-3) is far above the device's bound: every level
    // is proven on the device.
    assert_eq!(g.host_decisions(), 0);
    let mut cpu = CpuMimi::new(m, 1, Arc::new(kernels::Pool::new(1)));
    assert_eq!(
        encode_all(&mut cpu, &pcm),
        got,
        "GPU codes differ from the CPU's"
    );
}

#[test]
fn host_decision_path_gives_the_same_codes() {
    let Some((_ctx, m, mut g, (want, _), pcm)) = setup() else {
        return;
    };
    g.force_host_decision(true);
    let got = encode_all(&mut g, &pcm);
    assert_eq!(g.host_decisions(), (pcm.len() / m.frame_size()) as u64);
    assert_eq!(got, want);
}

#[test]
fn reset_gives_a_fresh_stream() {
    let Some((_ctx, m, mut g, (codes, t), pcm)) = setup() else {
        return;
    };
    let n = 12.min(t);
    let fs = m.frame_size();
    let first_pcm = decode_all(&mut g, &codes[..], t);
    let first_codes = encode_all(&mut g, &pcm[..n * fs]);
    g.reset(0);
    assert_eq!(decode_all(&mut g, &codes[..], t), first_pcm);
    assert_eq!(encode_all(&mut g, &pcm[..n * fs]), first_codes);
}

#[test]
fn bad_input_is_refused() {
    let Some((_ctx, m, mut g, _, _)) = setup() else {
        return;
    };
    let fs = m.frame_size();
    let mut out = vec![0.0; fs];
    let bins = m.cardinality() as u32;
    assert!(g.decode_frames(&[0], &[bins; 8], &mut out).is_err());
    assert!(g.decode_frames(&[0], &[0; 7], &mut out).is_err());
    assert!(g.decode_frames(&[0], &[0; 8], &mut out[..fs - 1]).is_err());
    assert!(g.encode_frames(&[0], &vec![0.0; fs + 1]).is_err());
}

/// The device records the model's plan: each broken plan (`model::mimi::broken_plans`: a residual
/// unit dropped, two transformer layers swapped, on either side) moves the device codec off the
/// oracle (an encoder's codes, a decoder's samples), with the same launches otherwise; the
/// model's own plan stays on it (the tests above).
#[test]
fn a_broken_plan_fails_parity_on_the_device() {
    let Some((ctx, m, _, (codes, t), pcm)) = setup() else {
        return;
    };
    let (want_pcm, _) = trace().f32("pcm");
    for (name, plan) in model::mimi::broken_plans(m.config()) {
        let broken = Arc::try_unwrap(mimi()).unwrap().with_plan(plan).unwrap();
        let w = GpuMimiWeights::upload(&ctx, Arc::new(broken)).unwrap();
        let mut g = GpuMimi::new(w, 1).unwrap();
        let wrong_codes = encode_all(&mut g, &pcm)
            .iter()
            .zip(&codes)
            .filter(|(a, b)| a != b)
            .count();
        let err = max_abs_diff(&decode_all(&mut g, &codes, t), &want_pcm);
        eprintln!("{name}: {wrong_codes} codes differ, samples {err:e} off");
        assert!(wrong_codes > 0 || err > 100.0 * TOL, "{name}");
    }
}
