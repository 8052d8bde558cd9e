//! The batched one-submission frame (`gpu::GpuDuplexBatch`: every listed slot's Mimi encode → one
//! LM step over their rows, each reading its own delay ring → device sampling, each row with its
//! own sampler → one decode of the ready slots, one submission and one wait per tick) against lone
//! `gpu::GpuDuplex` conversations fed the same frames: slots joining late, skipping ticks, listed
//! out of order and one reset mid-stream give each slot the lone conversation's tokens exactly and
//! its PCM bit for bit; one slot of a batch reproduces the oracle's duplex trace; a tick is one
//! submission and one wait, and launches the same kernels whatever the number of listed slots.

mod common;

use std::path::PathBuf;
use std::sync::Arc;

use gpu::{GpuDuplex, GpuDuplexBatch, GpuLmOptions, GpuLmWeights, GpuMimiWeights};
use model::lm::{FrameStep, LmError, LmFrame};
use model::sampling::{Sampler, SamplerConfig};
use testkit::TensorFile;

const FRAME: usize = 1920;

fn fixture(name: &str) -> PathBuf {
    testkit::fixtures_dir("duplex").join(name)
}

/// The fixture bundle's weights on one device (f32 KV, as the oracle computes), or `None`
/// (printed) without an adapter.
fn weights(profile: bool) -> Option<(Arc<GpuLmWeights>, Arc<GpuMimiWeights>)> {
    let ctx = common::context_with(gpu::GpuOptions {
        profile,
        ..Default::default()
    })?;
    let m = model::MoshiModel::open(&testkit::fixtures_dir("lm")).unwrap();
    let lm = GpuLmWeights::upload(&ctx, &m.lm).unwrap();
    let mimi = GpuMimiWeights::upload(&ctx, Arc::new(m.mimi)).unwrap();
    Some((lm, mimi))
}

/// Slot `s`'s sampler: sampled (not argmax) with a seed of its own, so that rows sampled with
/// one another's states give other tokens.
fn sampler(d: &gpu::GpuLmWeights, s: usize, greedy: bool) -> Sampler {
    let c = if greedy {
        SamplerConfig::greedy()
    } else {
        SamplerConfig::seeded(1000 + 7919 * s as u64)
    };
    Sampler::new(c, d.spec().text_card, d.spec().card).unwrap()
}

/// What one slot's conversation gave: per call its frame (text, codes) and the PCM of its ready
/// frames as bits.
#[derive(Default, Debug, PartialEq)]
struct Track {
    frames: Vec<Option<(u32, Vec<u32>)>>,
    pcm_bits: Vec<u32>,
}

impl Track {
    fn push(&mut self, f: Option<LmFrame>, pcm: &[f32]) {
        if f.is_some() {
            self.pcm_bits.extend(pcm.iter().map(|x| x.to_bits()));
        }
        self.frames.push(f.map(|f| (f.text, f.audio().to_vec())));
    }
}

/// Slot `s`'s input frame at its call `c` (each slot its own stretch of the fixture's input).
fn input(pcm: &[f32], s: usize, c: usize) -> &[f32] {
    let frames = pcm.len() / FRAME;
    let f = (c + 3 * s) % frames;
    &pcm[f * FRAME..(f + 1) * FRAME]
}

/// One slot's event at a tick: a frame (with the first-frame rule at the slot's call 0), or a
/// reset of the whole conversation before its next frame.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Event {
    Frame,
    Reset,
}

/// The ticks of the schedule: which slots each lists, in which order, and the resets due.
/// 4 slots: slot 0 every tick, slot 1 joining at tick 3 and reset after its 4th call, slot 2
/// skipping every third tick, slot 3 joining at tick 1 and skipping tick 6; the list order
/// rotates every tick.
fn schedule(ticks: usize) -> Vec<Vec<(usize, Event)>> {
    let mut out = Vec::new();
    let mut calls = [0usize; 4];
    for t in 0..ticks {
        let mut list = Vec::new();
        for s in 0..4 {
            let on = match s {
                0 => true,
                1 => t >= 3,
                2 => t % 3 != 2,
                _ => t >= 1 && t != 6,
            };
            if !on {
                continue;
            }
            if s == 1 && calls[1] == 4 {
                list.insert(0, (s, Event::Reset));
                calls[1] = 100;
            }
            list.push((s, Event::Frame));
            calls[s] += 1;
        }
        // Resets first (they apply before the tick), then the frames in a rotating order.
        let resets = list.iter().filter(|e| e.1 == Event::Reset).count();
        let r = t % (list.len() - resets);
        list[resets..].rotate_left(r);
        out.push(list);
    }
    out
}

/// Runs `ticks` ticks of [`schedule`] on a batch of 4 slots; returns each slot's track and per
/// tick the (submissions, waits) it took.
fn run_batch(
    b: &mut GpuDuplexBatch,
    lm: &GpuLmWeights,
    pcm: &[f32],
    ticks: usize,
) -> (Vec<Track>, Vec<(u64, u64)>) {
    let mut samplers: Vec<Sampler> = (0..4).map(|s| sampler(lm, s, false)).collect();
    let mut tracks: Vec<Track> = (0..4).map(|_| Track::default()).collect();
    let mut calls = [0usize; 4];
    let mut per_tick = Vec::new();
    for events in schedule(ticks) {
        let mut slots = Vec::new();
        let mut frames = Vec::new();
        let mut opts = Vec::new();
        for (s, e) in events {
            match e {
                Event::Reset => {
                    b.reset_lm(s);
                    b.reset_codec(s);
                    samplers[s].reset();
                    calls[s] = 0;
                }
                Event::Frame => {
                    slots.push(s);
                    frames.extend_from_slice(input(pcm, s, calls[s]));
                    opts.push(FrameStep {
                        force_text: None,
                        reset_codec_after_encode: calls[s] == 0,
                    });
                    calls[s] += 1;
                }
            }
        }
        let n = slots.len();
        let mut out = vec![0.0f32; n * FRAME];
        let mut results: Vec<Result<Option<LmFrame>, LmError>> = (0..n).map(|_| Ok(None)).collect();
        let ctx = b.context().clone();
        let before = (ctx.submissions(), ctx.waits());
        common::creates_nothing(&ctx, "in a tick", || {
            b.tick(
                &slots,
                &frames,
                &opts,
                &mut samplers,
                &mut out,
                &mut results,
            )
            .unwrap()
        });
        per_tick.push((ctx.submissions() - before.0, ctx.waits() - before.1));
        for (i, &s) in slots.iter().enumerate() {
            let f = results[i].as_ref().unwrap();
            tracks[s].push(*f, &out[i * FRAME..(i + 1) * FRAME]);
        }
    }
    (tracks, per_tick)
}

/// Each slot's conversation alone (a `GpuDuplex` of its own, the same frames, the same reset).
fn run_alone(
    lm: &Arc<GpuLmWeights>,
    mimi: &Arc<GpuMimiWeights>,
    pcm: &[f32],
    ticks: usize,
    setup: impl Fn(&mut GpuDuplex),
) -> Vec<Track> {
    let mut tracks: Vec<Track> = (0..4).map(|_| Track::default()).collect();
    let sched = schedule(ticks);
    for (s, track) in tracks.iter_mut().enumerate() {
        let mut d = GpuDuplex::new(lm.clone(), mimi.clone(), GpuLmOptions::default()).unwrap();
        setup(&mut d);
        let mut smp = sampler(lm, s, false);
        let mut out = vec![0.0f32; FRAME];
        let mut calls = 0;
        for e in sched
            .iter()
            .flatten()
            .filter(|(t, _)| *t == s)
            .map(|(_, e)| *e)
        {
            if e == Event::Reset {
                d.reset_lm();
                d.reset_codec();
                smp.reset();
                calls = 0;
                continue;
            }
            let opts = FrameStep {
                force_text: None,
                reset_codec_after_encode: calls == 0,
            };
            let f = d
                .frame(input(pcm, s, calls), &mut smp, opts, &mut out)
                .unwrap();
            track.push(f, &out);
            calls += 1;
        }
    }
    tracks
}

const TICKS: usize = 12;

/// Four slots joining late, skipping ticks, listed in a rotating order, one of them reset
/// mid-stream, each sampling with its own seed: every slot's frames are its lone conversation's
/// (tokens exact, PCM bit for bit), every tick one submission and one wait.
#[test]
fn slots_joining_late_skipping_out_of_order_and_reset_equal_lone_conversations() {
    let Some((lm, mimi)) = weights(false) else {
        return;
    };
    let pcm = testkit::read_wav_f32(fixture("input.wav"));
    let mut b = GpuDuplexBatch::new(lm.clone(), mimi.clone(), GpuLmOptions::default(), 4).unwrap();
    let (got, per_tick) = run_batch(&mut b, &lm, &pcm, TICKS);
    let want = run_alone(&lm, &mimi, &pcm, TICKS, |_| {});
    for s in 0..4 {
        assert!(
            got[s].frames.iter().filter(|f| f.is_some()).count() >= 3,
            "slot {s} produced too few frames to compare"
        );
        assert_eq!(got[s].frames, want[s].frames, "slot {s}: tokens");
        assert!(
            got[s].pcm_bits == want[s].pcm_bits,
            "slot {s}: PCM differs from its lone conversation's"
        );
    }
    assert_eq!(b.replays(), 0);
    for (t, &p) in per_tick.iter().enumerate() {
        assert_eq!(p, (1, 1), "tick {t}: (submissions, waits)");
    }
}

/// With every code decided on the host and the device's first code spoiled, ticks are replayed
/// (the exact codes written, the ready decoders restored): still every slot's lone frames, the
/// extra submissions those of the host decisions and the replays.
#[test]
fn replayed_ticks_equal_lone_conversations() {
    let Some((lm, mimi)) = weights(false) else {
        return;
    };
    let pcm = testkit::read_wav_f32(fixture("input.wav"));
    let mut b = GpuDuplexBatch::new(lm.clone(), mimi.clone(), GpuLmOptions::default(), 4).unwrap();
    b.force_host_decision(true);
    b.spoil_device_codes(true);
    let ticks = 8;
    let (got, per_tick) = run_batch(&mut b, &lm, &pcm, ticks);
    let want = run_alone(&lm, &mimi, &pcm, ticks, |_| {});
    for s in 0..4 {
        assert_eq!(got[s].frames, want[s].frames, "slot {s}: tokens");
        assert!(got[s].pcm_bits == want[s].pcm_bits, "slot {s}: PCM");
    }
    assert!(b.replays() * 2 > ticks as u64, "{} replays", b.replays());
    let extra: u64 = per_tick.iter().map(|&(s, _)| s - 1).sum();
    assert_eq!(extra, b.host_decisions() + b.replays());
}

/// One slot of a batch (slot 2 of 3, the others running beside it on other input) reproduces
/// the oracle's duplex trace: text and audio tokens exact, PCM within Mimi's 1e-4.
#[test]
fn one_slot_of_a_batch_reproduces_the_oracle_trace() {
    let Some((lm, mimi)) = weights(false) else {
        return;
    };
    let pcm = testkit::read_wav_f32(fixture("input.wav"));
    let trace = TensorFile::open(fixture("trace.safetensors"));
    let (text, _) = trace.i64("text_tokens");
    let (audio, shape) = trace.i64("audio_tokens");
    let (want_pcm, _) = trace.f32("pcm");
    let steps = text.len();
    assert_eq!(shape, [8, steps]);
    let mut b = GpuDuplexBatch::new(lm.clone(), mimi, GpuLmOptions::default(), 3).unwrap();
    let mut samplers: Vec<Sampler> = (0..3).map(|s| sampler(&lm, s, s == 2)).collect();
    let (mut got_text, mut got_audio, mut got_pcm) = (Vec::new(), Vec::new(), Vec::new());
    for c in 0..=steps {
        let slots = [2, 0, 1];
        let mut frames = pcm[c * FRAME..(c + 1) * FRAME].to_vec();
        frames.extend_from_slice(input(&pcm, 0, c));
        frames.extend_from_slice(input(&pcm, 1, c));
        let opts = [FrameStep {
            force_text: None,
            reset_codec_after_encode: c == 0,
        }; 3];
        let mut out = vec![0.0f32; 3 * FRAME];
        let mut results: Vec<Result<Option<LmFrame>, LmError>> = (0..3).map(|_| Ok(None)).collect();
        b.tick(
            &slots,
            &frames,
            &opts,
            &mut samplers,
            &mut out,
            &mut results,
        )
        .unwrap();
        if let Some(f) = results[0].as_ref().unwrap() {
            got_text.push(i64::from(f.text));
            got_audio.push(f.audio().iter().map(|&c| i64::from(c)).collect::<Vec<_>>());
            got_pcm.extend_from_slice(&out[..FRAME]);
        }
    }
    assert_eq!(got_text, text, "text tokens");
    for (t, codes) in got_audio.iter().enumerate() {
        for (k, &c) in codes.iter().enumerate() {
            assert_eq!(c, audio[k * steps + t], "codebook {k}, output {t}");
        }
    }
    let err = testkit::compare::max_abs_diff(&got_pcm, &want_pcm);
    eprintln!("slot 2 of 3: {steps} outputs, pcm max abs error {err:e} against the oracle");
    assert_eq!(got_pcm.len(), want_pcm.len());
    assert!(err <= 1e-4, "pcm max abs error {err}");
}

/// The profile of a tick listing one slot, and of one listing all four: the same launches (each
/// kernel's grid carries the listed rows or slots), which are also a lone conversation's frame's.
/// The profile lines are printed (structure on this adapter; lavapipe gives no speed).
#[test]
fn launches_per_tick_do_not_grow_with_the_listed_slots() {
    let Some((lm, mimi)) = weights(true) else {
        return;
    };
    let ctx = lm.context().clone();
    let pcm = testkit::read_wav_f32(fixture("input.wav"));
    let mut b = GpuDuplexBatch::new(lm.clone(), mimi.clone(), GpuLmOptions::default(), 4).unwrap();
    let mut samplers: Vec<Sampler> = (0..4).map(|s| sampler(&lm, s, false)).collect();
    let max_delay = lm.spec().max_delay();
    let mut launches = Vec::new();
    // Past the delays, so that every listed slot decodes.
    for c in 0..=max_delay + 1 {
        for slots in [&[1usize][..], &[3, 0, 2, 1][..]] {
            let n = slots.len();
            let frames: Vec<f32> = slots
                .iter()
                .flat_map(|&s| input(&pcm, s, c).to_vec())
                .collect();
            let opts = vec![FrameStep::default(); n];
            let mut out = vec![0.0f32; n * FRAME];
            let mut results: Vec<Result<Option<LmFrame>, LmError>> =
                (0..n).map(|_| Ok(None)).collect();
            ctx.profile_reset();
            b.tick(slots, &frames, &opts, &mut samplers, &mut out, &mut results)
                .unwrap();
            ctx.profile_frame().unwrap();
            let r = ctx.profile_report().unwrap();
            if c == max_delay + 1 {
                for l in r.lines(&format!("what=duplex_batch slots={n}")) {
                    println!("{l}");
                }
                launches.push(r.calls_per_frame());
            }
        }
    }
    assert_eq!(launches[0], launches[1], "1 slot vs 4 slots listed");
    // A lone conversation's frame past its delays launches the same kernels.
    let mut d = GpuDuplex::new(lm.clone(), mimi, GpuLmOptions::default()).unwrap();
    let mut smp = sampler(&lm, 0, false);
    let mut out = vec![0.0f32; FRAME];
    for c in 0..=max_delay + 1 {
        ctx.profile_reset();
        d.frame(input(&pcm, 0, c), &mut smp, FrameStep::default(), &mut out)
            .unwrap();
        ctx.profile_frame().unwrap();
    }
    let lone = ctx.profile_report().unwrap().calls_per_frame();
    assert_eq!(launches[0], lone, "a tick of one slot vs a lone frame");
}
