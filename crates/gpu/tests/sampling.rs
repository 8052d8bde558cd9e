//! The device sampler ([`gpu::GpuSampler`], the kernel the LM backend runs) against the host's
//! [`model::sampling::Sampler`]: the same random stream draw by draw, argmax exact, top-k
//! respected, seeds reproducible, the softmax distribution, refused non-finite logits, and the
//! settings it leaves to the host.

mod common;

use gpu::GpuSampler;
use model::sampling::{
    RepetitionPenalty, Rng, Sampler, SamplerConfig, SamplingError, TokenSampling,
};

/// Deterministic pseudo-random values (splitmix64), uniform in [0, 1).
fn uniforms(seed: u64, n: usize) -> Vec<f64> {
    let mut r = Rng::new(seed);
    (0..n).map(|_| r.next_f64()).collect()
}

/// Logits of `n` tokens: a seeded permutation of an evenly spaced grid over [-3, 3), so two
/// logits differ by at least 6/n (no near-ties; see `fragile`).
fn grid_logits(seed: u64, n: usize) -> Vec<f32> {
    let mut order: Vec<(f64, usize)> = uniforms(seed, n).into_iter().zip(0..n).collect();
    order.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut l = vec![0.0f32; n];
    for (rank, (_, i)) in order.into_iter().enumerate() {
        l[i] = (-3.0 + 6.0 * rank as f64 / n as f64) as f32;
    }
    l
}

/// Logits in [-3, 3) on a grid of 0.25 (exact ties).
fn coarse_logits(seed: u64, n: usize) -> Vec<f32> {
    uniforms(seed, n)
        .into_iter()
        .map(|u| ((u * 24.0).floor() / 4.0 - 3.0) as f32)
        .collect()
}

/// Normalized distance below which the device and the host may pick different tokens for the
/// same uniform draw. Derivation (module docs of `gpu::sample`), for logits in [-3, 3] and
/// temperature >= 0.5 so |x| = |l - max| / T <= 12: the device's `exp` errs by at most
/// 3 + 2·12 = 27 ulp, the scaling, normalization, PAD and penalty steps by a few ulp more
/// (< 35 ulp in all, 35 · 2⁻²³ ≈ 4.2e-6 relative per probability); its f32 running sum over at most
/// 256 candidates adds 256 · 2⁻²⁴ ≈ 1.5e-5 of the total; a boundary (running sum / total) thus
/// moves by < 2 · (4.2e-6 + 1.5e-5) ≈ 3.9e-5, plus 2⁻²⁴ for the 24-bit uniform, plus < 1e-6 for
/// the host's own f32 probabilities. 1e-4 is that bound rounded up.
const DELTA: f64 = 1e-4;

/// The host's draw, recomputed exactly (f64) from `logits` and `s`, for judging a comparison:
/// `(candidates in order, normalized cumulative boundaries)`.
fn exact_candidates(
    logits: &[f32],
    s: TokenSampling,
    pad: Option<(usize, f32)>,
) -> (Vec<usize>, Vec<f64>) {
    let n = logits.len();
    let t = s.temperature as f64;
    let max = logits
        .iter()
        .map(|&l| l as f64 / t)
        .fold(f64::MIN, f64::max);
    let mut p: Vec<f64> = logits.iter().map(|&l| (l as f64 / t - max).exp()).collect();
    let z: f64 = p.iter().sum();
    for v in &mut p {
        *v /= z;
    }
    if let Some((id, m)) = pad {
        p[id] *= (m as f64).exp();
    }
    let mut idx: Vec<usize> = (0..n).collect();
    idx.sort_by(|&a, &b| p[b].total_cmp(&p[a]).then(a.cmp(&b)));
    let k = if s.top_k == 0 || s.top_k >= n {
        n
    } else {
        s.top_k
    };
    // Keep one more for the near-tie check at the top-k cut.
    let keep: Vec<usize> = idx[..(k + 1).min(n)].to_vec();
    let total: f64 = keep[..k].iter().map(|&i| p[i]).sum();
    let mut acc = 0.0;
    let mut bounds = Vec::with_capacity(k);
    for &i in &keep[..k] {
        acc += p[i];
        bounds.push(acc / total);
    }
    let probs: Vec<f64> = keep.iter().map(|&i| p[i]).collect();
    // Relative gaps between neighbours: a near-tie may be ordered differently by the two sides.
    // (Equal logits give equal probabilities on both sides, ordered by index: not a near-tie.)
    let tie = probs
        .windows(2)
        .any(|w| w[0] != w[1] && (w[0] - w[1]) / w[0] < DELTA);
    if tie {
        return (keep, Vec::new());
    }
    (keep, bounds)
}

/// Whether the draw `u` with these boundaries is too close to call (or a near-tie was found).
fn fragile(u: f64, bounds: &[f64]) -> bool {
    bounds.is_empty() || bounds.iter().any(|b| (u - b).abs() < DELTA)
}

/// The penalized logits the host samples from (Kyutai's rule, distinct ids once).
fn penalized(logits: &[f32], history: &[u32], penalty: f32) -> Vec<f32> {
    let mut l = logits.to_vec();
    let mut seen = std::collections::HashSet::new();
    for &t in history {
        if seen.insert(t) {
            let v = &mut l[t as usize];
            *v = if *v >= 0.0 {
                *v / penalty
            } else {
                *v * penalty
            };
        }
    }
    l
}

fn config(seed: u64, text: (f32, usize), audio: (f32, usize)) -> SamplerConfig {
    let mut c = SamplerConfig::seeded(seed);
    c.text = TokenSampling {
        temperature: text.0,
        top_k: text.1,
    };
    c.audio = TokenSampling {
        temperature: audio.0,
        top_k: audio.1,
    };
    c
}

struct Run {
    tokens: Vec<u32>,
    errors: Vec<Option<SamplingError>>,
}

fn sample(
    gs: &mut GpuSampler,
    samplers: &mut [Sampler],
    text: &[f32],
    audio: &[f32],
    forced: &[Option<u32>],
    draws: usize,
) -> Run {
    let n = forced.len();
    let mut tokens = vec![0; n * (1 + draws)];
    let mut errors = vec![None; n];
    assert!(gs
        .sample(samplers, text, audio, forced, &mut tokens, &mut errors)
        .unwrap());
    Run { tokens, errors }
}

/// Every draw of the device against the host sampler given the same logits and states: the
/// generator states agree exactly after every call (same draws taken), and the tokens agree
/// wherever the draw is not within `DELTA` of a boundary. Covers the Python defaults, top-k 0
/// ("all"), `pad_mult`, the repetition penalty, argmax rows and a forced text token.
#[test]
fn device_continues_the_host_stream_draw_by_draw() {
    let Some(ctx) = common::context() else { return };
    let (tv, av, draws, rows) = (1000, 300, 40, 4);
    let mut gs = GpuSampler::new(&ctx, rows, draws, tv, av).unwrap();
    let mut configs = [
        SamplerConfig::seeded(1),
        config(2, (0.5, 0), (1.0, 0)),
        config(3, (0.0, 25), (0.9, 250)),
        config(4, (1.0, 7), (0.0, 0)),
    ];
    configs[1].pad_mult = Some(0.8);
    configs[1].pad_id = 5;
    configs[2].repetition_penalty = Some(RepetitionPenalty {
        penalty: 1.3,
        context: 16,
    });
    configs[0].repetition_penalty = Some(RepetitionPenalty {
        penalty: 1.7,
        context: 64,
    });
    let mut dev: Vec<Sampler> = configs
        .iter()
        .map(|c| Sampler::new(c.clone(), tv, av).unwrap())
        .collect();
    let mut host = dev.clone();
    let mut stats = Stats::default();
    // Rounds 0..8: distinct logits; rounds 8..12: logits on a 0.25 grid (many exact ties, which
    // both sides order by index).
    let logits = |seed: u64, n: usize, round: u64| {
        if round < 8 {
            grid_logits(seed, n)
        } else {
            coarse_logits(seed, n)
        }
    };
    for round in 0..12u64 {
        let text: Vec<f32> = (0..rows as u64)
            .flat_map(|b| logits(100 * round + b, tv, round))
            .collect();
        let audio: Vec<f32> = (0..rows as u64)
            .flat_map(|b| logits(7000 + 100 * round + b, av, round))
            .collect();
        let forced: Vec<Option<u32>> = (0..rows)
            .map(|b| (b == 3 && round % 2 == 1).then_some(11))
            .collect();
        let histories: Vec<Vec<u32>> = dev.iter().map(|s| s.penalized_text().collect()).collect();
        let run = sample(&mut gs, &mut dev, &text, &audio, &forced, draws);
        assert!(run.errors.iter().all(Option::is_none));
        for b in 0..rows {
            let c = host[b].config().clone();
            let got = &run.tokens[b * (1 + draws)..(b + 1) * (1 + draws)];
            let tl = &text[b * tv..(b + 1) * tv];
            match forced[b] {
                Some(t) => assert_eq!(got[0], t),
                None => {
                    let states = host[b].stream_states();
                    let want = host[b].sample_text(tl).unwrap();
                    let tl = match c.repetition_penalty {
                        Some(p) => penalized(tl, &histories[b], p.penalty),
                        None => tl.to_vec(),
                    };
                    let draw = Draw {
                        s: c.text,
                        u: Rng::from_state(states[0]).next_f64(),
                        pad: c.pad_mult.map(|m| (c.pad_id as usize, m)),
                    };
                    stats.judge(&draw, &tl, want, got[0], (b, round, 0));
                }
            }
            let al = &audio[b * av..(b + 1) * av];
            for &g in &got[1..] {
                let states = host[b].stream_states();
                let want = host[b].sample_audio(al).unwrap();
                let draw = Draw {
                    s: c.audio,
                    u: Rng::from_state(states[1]).next_f64(),
                    pad: None,
                };
                stats.judge(&draw, al, want, g, (b, round, 1));
            }
            assert_eq!(
                host[b].stream_states(),
                dev[b].stream_states(),
                "generator states, row {b} round {round}"
            );
            // Both histories take the device's text token.
            host[b].record_text(got[0]);
            dev[b].record_text(got[0]);
        }
    }
    eprintln!(
        "{} tokens compared, {} draws within {DELTA} of a boundary skipped, {} draws",
        stats.compared, stats.skipped, stats.draws
    );
    assert!(
        stats.draws > 1000 && stats.skipped * 10 < stats.draws,
        "too few comparisons"
    );
}

/// One host draw being judged: its settings, uniform and PAD boost.
struct Draw {
    s: TokenSampling,
    u: f64,
    pad: Option<(usize, f32)>,
}

#[derive(Default)]
struct Stats {
    compared: usize,
    skipped: usize,
    draws: usize,
}

impl Stats {
    /// Compares the device's token with the host's unless the draw is too close to call.
    fn judge(&mut self, d: &Draw, logits: &[f32], want: u32, got: u32, at: (usize, u64, usize)) {
        if d.s.temperature <= 0.0 {
            assert_eq!(got, want, "argmax at (row, round, stream) {at:?}");
            self.compared += 1;
            return;
        }
        self.draws += 1;
        let (_, bounds) = exact_candidates(logits, d.s, d.pad);
        if fragile(d.u, &bounds) {
            self.skipped += 1;
        } else {
            self.compared += 1;
            assert_eq!(got, want, "(row, round, stream) {at:?}, u = {}", d.u);
        }
    }
}

/// Top-k 1 is argmax (first index on ties), while still taking a draw per token as the host does.
#[test]
fn top_k_one_is_argmax() {
    let Some(ctx) = common::context() else { return };
    let (tv, av, draws, rows) = (517, 64, 3, 8);
    let mut gs = GpuSampler::new(&ctx, rows, draws, tv, av).unwrap();
    let mut dev: Vec<Sampler> = (0..rows as u64)
        .map(|s| Sampler::new(config(s, (0.7, 1), (1.3, 1)), tv, av).unwrap())
        .collect();
    let mut host = dev.clone();
    for round in 0..4u64 {
        // Logits on a coarse grid (exact ties, broken by the lowest index).
        let q = |v: f64| ((v * 8.0).floor() / 4.0) as f32;
        let text: Vec<f32> = uniforms(round, rows * tv).into_iter().map(q).collect();
        let audio: Vec<f32> = uniforms(50 + round, rows * av).into_iter().map(q).collect();
        let run = sample(&mut gs, &mut dev, &text, &audio, &[None; 8], draws);
        for b in 0..rows {
            let got = &run.tokens[b * (1 + draws)..(b + 1) * (1 + draws)];
            let tl = &text[b * tv..(b + 1) * tv];
            let al = &audio[b * av..(b + 1) * av];
            assert_eq!(got[0], model::sampling::argmax(tl));
            assert!(got[1..].iter().all(|&t| t == model::sampling::argmax(al)));
            assert_eq!(got[0], host[b].sample_text(tl).unwrap());
            for _ in 0..draws {
                host[b].sample_audio(al).unwrap();
            }
            assert_eq!(host[b].stream_states(), dev[b].stream_states());
        }
    }
}

/// Every sampled token lies in the top-k set; logits on a coarse grid make the set exact (equal
/// logits have equal probabilities on both sides; ties go to the lowest indices).
#[test]
fn sampled_tokens_stay_in_the_top_k() {
    let Some(ctx) = common::context() else { return };
    let (tv, av, draws, rows) = (300, 2048, 200, 8);
    let mut gs = GpuSampler::new(&ctx, rows, draws, tv, av).unwrap();
    let ks = [1usize, 2, 5, 25, 100, 250, 1000, 299];
    let mut dev: Vec<Sampler> = ks
        .iter()
        .enumerate()
        .map(|(b, &k)| Sampler::new(config(b as u64 + 10, (1.0, k), (2.0, k)), tv, av).unwrap())
        .collect();
    let q = |v: f64| ((v * 16.0).floor() / 4.0) as f32;
    let text: Vec<f32> = uniforms(77, rows * tv).into_iter().map(q).collect();
    let audio: Vec<f32> = uniforms(78, rows * av).into_iter().map(q).collect();
    let run = sample(&mut gs, &mut dev, &text, &audio, &[None; 8], draws);
    let top = |l: &[f32], k: usize| -> Vec<u32> {
        let mut idx: Vec<u32> = (0..l.len() as u32).collect();
        idx.sort_by(|&a, &b| l[b as usize].total_cmp(&l[a as usize]).then(a.cmp(&b)));
        idx.truncate(k.min(l.len()));
        idx
    };
    let mut distinct = std::collections::HashSet::new();
    for (b, &k) in ks.iter().enumerate() {
        let got = &run.tokens[b * (1 + draws)..(b + 1) * (1 + draws)];
        let tset = top(&text[b * tv..(b + 1) * tv], k);
        assert!(
            tset.contains(&got[0]),
            "text row {b}: {} not in top {k}",
            got[0]
        );
        let aset = top(&audio[b * av..(b + 1) * av], k);
        for &t in &got[1..] {
            assert!(aset.contains(&t), "audio row {b}: {t} not in top {k}");
            distinct.insert((b, t));
        }
    }
    // The draws are not all the same token (k > 1 rows spread over their candidates).
    assert!(distinct.len() > 3 * ks.len());
}

/// A seed reproduces its tokens; another seed gives others.
#[test]
fn same_seed_same_tokens() {
    let Some(ctx) = common::context() else { return };
    let (tv, av, draws, rows) = (128, 256, 64, 2);
    let mut gs = GpuSampler::new(&ctx, rows, draws, tv, av).unwrap();
    let text: Vec<f32> = uniforms(5, rows * tv)
        .into_iter()
        .map(|v| v as f32 * 4.0)
        .collect();
    let audio: Vec<f32> = uniforms(6, rows * av)
        .into_iter()
        .map(|v| v as f32 * 4.0)
        .collect();
    let mut go = |seed: u64| {
        let mut s: Vec<Sampler> = (0..rows as u64)
            .map(|b| Sampler::new(SamplerConfig::seeded(seed + b), tv, av).unwrap())
            .collect();
        sample(&mut gs, &mut s, &text, &audio, &[None; 2], draws).tokens
    };
    let a = go(9);
    assert_eq!(a, go(9));
    assert_ne!(a, go(10));
}

/// The frequencies of 20 000 draws from a fixed logits row match softmax(l / T). The seed is
/// fixed, so the outcome is deterministic; the draws are the host's own stream (see the first
/// test), so another device can change only draws within `DELTA` of a boundary (expected about
/// 20 000 · 2 · 6 · 1e-4 = 24 tokens, far inside the 5σ ≥ 5·√(20 000 · 0.03 · 0.97) ≈ 120 margin
/// of each count).
#[test]
fn frequencies_follow_the_softmax() {
    let Some(ctx) = common::context() else { return };
    let (tv, av, draws, rows) = (4, 6, 2500, 8);
    let mut gs = GpuSampler::new(&ctx, rows, draws, tv, av).unwrap();
    let logits = [0.3f32, -1.0, 1.2, 0.0, 0.9, -2.0];
    let temp = 0.8;
    let mut s: Vec<Sampler> = (0..rows as u64)
        .map(|b| Sampler::new(config(1000 + b, (1.0, 0), (temp, 0)), tv, av).unwrap())
        .collect();
    let audio: Vec<f32> = (0..rows).flat_map(|_| logits).collect();
    let run = sample(&mut gs, &mut s, &[0.0; 32], &audio, &[None; 8], draws);
    let mut counts = [0usize; 6];
    for b in 0..rows {
        for &t in &run.tokens[b * (1 + draws) + 1..(b + 1) * (1 + draws)] {
            counts[t as usize] += 1;
        }
    }
    let n = (rows * draws) as f64;
    let e: Vec<f64> = logits
        .iter()
        .map(|&l| (l as f64 / temp as f64).exp())
        .collect();
    let z: f64 = e.iter().sum();
    for (i, &c) in counts.iter().enumerate() {
        let p = e[i] / z;
        let sd = (p * (1.0 - p) / n).sqrt();
        let f = c as f64 / n;
        eprintln!(
            "token {i}: frequency {f:.5}, probability {p:.5}, z = {:.2}",
            (f - p) / sd
        );
        assert!((f - p).abs() < 5.0 * sd, "token {i}: {f} vs {p}");
    }
}

/// NaN or infinite logits give the host's typed error, token 0 and no draw, in both streams and
/// modes; the text stream's error is reported before the audio stream's.
#[test]
fn non_finite_logits_are_refused() {
    let Some(ctx) = common::context() else { return };
    let (tv, av, draws, rows) = (40, 16, 3, 6);
    let mut gs = GpuSampler::new(&ctx, rows, draws, tv, av).unwrap();
    for cfg in [SamplerConfig::seeded(3), SamplerConfig::greedy()] {
        let mut dev: Vec<Sampler> = (0..rows)
            .map(|_| Sampler::new(cfg.clone(), tv, av).unwrap())
            .collect();
        let before: Vec<_> = dev.iter().map(Sampler::stream_states).collect();
        let mut text = vec![0.5f32; rows * tv];
        let mut audio = vec![0.25f32; rows * av];
        // Row 0: NaN text at 5 and 9; row 1: +inf audio at 0; row 2: -inf text at 39 and NaN
        // audio at 3 (the text error wins); rows 3..5 clean.
        text[5] = f32::NAN;
        text[9] = f32::INFINITY;
        audio[av] = f32::INFINITY;
        text[2 * tv + 39] = f32::NEG_INFINITY;
        audio[2 * av + 3] = f32::NAN;
        let run = sample(&mut gs, &mut dev, &text, &audio, &[None; 6], draws);
        let err = |e: &Option<SamplingError>| match e {
            Some(SamplingError::NonFiniteLogits {
                stream,
                index,
                value,
            }) => Some((*stream, *index, value.to_bits())),
            _ => None,
        };
        assert_eq!(err(&run.errors[0]), Some(("text", 5, f32::NAN.to_bits())));
        assert_eq!(
            err(&run.errors[1]),
            Some(("audio", 0, f32::INFINITY.to_bits()))
        );
        assert_eq!(
            err(&run.errors[2]),
            Some(("text", 39, f32::NEG_INFINITY.to_bits()))
        );
        assert!(run.errors[3..].iter().all(Option::is_none));
        let per = 1 + draws;
        assert_eq!(run.tokens[0], 0);
        assert!(run.tokens[per + 1..2 * per].iter().all(|&t| t == 0));
        assert_eq!(run.tokens[2 * per], 0);
        assert!(run.tokens[2 * per + 1..3 * per].iter().all(|&t| t == 0));
        // A refused stream took no draw (row 0's audio and row 1's text did, when sampling).
        let after: Vec<_> = dev.iter().map(Sampler::stream_states).collect();
        assert_eq!(after[0][0], before[0][0]);
        assert_eq!(after[1][1], before[1][1]);
        assert_eq!(after[2], before[2]);
        // The host refuses the same rows with the same errors.
        let mut host = Sampler::new(cfg.clone(), tv, av).unwrap();
        assert_eq!(
            err(&Some(host.sample_text(&text[..tv]).unwrap_err())),
            err(&run.errors[0])
        );
    }
}

/// Settings beyond the device (a top-k above `gpu::sample::MAX_TOP_K`, a longer penalty context)
/// are left to the host: `Ok(false)`, nothing advanced.
#[test]
fn settings_beyond_the_device_are_declined() {
    let Some(ctx) = common::context() else { return };
    let (tv, av) = (4000, 16);
    let mut gs = GpuSampler::new(&ctx, 1, 1, tv, av).unwrap();
    let run = |gs: &mut GpuSampler, c: SamplerConfig| {
        let mut s = [Sampler::new(c, tv, av).unwrap()];
        let before = s[0].stream_states();
        let (mut t, mut e) = (vec![0; 2], vec![None]);
        let ok = gs
            .sample(&mut s, &vec![0.0; tv], &[0.0; 16], &[None], &mut t, &mut e)
            .unwrap();
        if !ok {
            assert_eq!(s[0].stream_states(), before);
        }
        ok
    };
    assert!(!run(&mut gs, config(1, (1.0, 0), (1.0, 0))));
    assert!(!run(
        &mut gs,
        config(1, (1.0, gpu::sample::MAX_TOP_K + 1), (1.0, 0))
    ));
    let mut c = SamplerConfig::seeded(1);
    c.repetition_penalty = Some(RepetitionPenalty {
        penalty: 1.2,
        context: gpu::sample::MAX_PENALTY_CONTEXT + 1,
    });
    assert!(!run(&mut gs, c));
    // Argmax reads any vocabulary; the largest top-k fits.
    assert!(run(&mut gs, config(1, (0.0, 0), (1.0, 0))));
    assert!(run(
        &mut gs,
        config(1, (1.0, gpu::sample::MAX_TOP_K), (1.0, 0))
    ));
}
