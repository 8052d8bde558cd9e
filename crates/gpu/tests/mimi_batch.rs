//! The device codec of several slots (a [`GpuMimi`]) against one CPU codec per slot and the
//! oracle fixture (`fixtures/mimi/`): slots fed different inputs, joining late, skipping ticks,
//! listed in varying order, one reset mid-stream; each slot's codes identical and samples within
//! 1e-4, one submission per call, nothing created per tick.

mod common;

use common::{
    mimi_fixture_codec as mimi, mimi_input_frames as input_frames,
    mimi_oracle_codes as oracle_codes,
};

use std::sync::Arc;

use gpu::{GpuContext, GpuMimi, GpuMimiWeights};
use model::mimi::{CodecBackend, CpuMimi, Mimi};
use testkit::compare::max_abs_diff;

const TOL: f32 = 1e-4;
const SLOTS: usize = 3;

/// Slot `s`'s `f`-th input frame: the fixture's frames as they are (slot 0), in reverse order
/// (slot 1), at half amplitude and shifted by 7 frames (slot 2).
fn slot_frame(pcm: &[f32], fs: usize, s: usize, f: usize) -> Vec<f32> {
    let t = pcm.len() / fs;
    let (g, scale) = match s {
        0 => (f % t, 1.0),
        1 => (t - 1 - f % t, 1.0),
        _ => ((f + 7) % t, 0.5),
    };
    pcm[g * fs..(g + 1) * fs]
        .iter()
        .map(|v| v * scale)
        .collect()
}

/// The input of one tick: the frame `frame(s)` of each listed slot `s`, in the order of `slots`.
fn tick_frames(
    pcm: &[f32],
    fs: usize,
    slots: &[usize],
    frame: impl Fn(usize) -> usize,
) -> Vec<f32> {
    slots
        .iter()
        .flat_map(|&s| slot_frame(pcm, fs, s, frame(s)))
        .collect()
}

/// A context, the fixture codec and a batch codec of `SLOTS` slots of it, or `None` without an
/// adapter (a printed skip).
fn batch_codec() -> Option<(GpuContext, Arc<Mimi>, GpuMimi)> {
    let ctx = common::context()?;
    let m = mimi();
    let w = GpuMimiWeights::upload(&ctx, m.clone()).unwrap();
    let g = GpuMimi::new(w, SLOTS).unwrap();
    Some((ctx, m, g))
}

/// The slots listed at tick `k` (in this order): slot 2 joins at tick 3, slot 1 sits out every
/// fifth tick, the order turns around on odd ticks.
fn listed(k: usize) -> Vec<usize> {
    let mut v: Vec<usize> = (0..SLOTS)
        .filter(|&s| (s != 2 || k >= 3) && (s != 1 || k % 5 != 4))
        .collect();
    if k % 2 == 1 {
        v.reverse();
    }
    v
}

#[test]
fn slots_match_one_cpu_codec_each_with_a_reset_mid_stream() {
    let Some((_ctx, m, mut g)) = batch_codec() else {
        return;
    };
    let (fs, nq) = (m.frame_size(), m.n_codebooks());
    assert_eq!(
        (g.slots(), g.frame_size(), g.n_codebooks()),
        (SLOTS, fs, nq)
    );
    let pool = Arc::new(kernels::Pool::new(1));
    let mut cpu: Vec<CpuMimi> = (0..SLOTS)
        .map(|_| CpuMimi::new(m.clone(), 1, pool.clone()))
        .collect();
    let pcm = input_frames(fs);
    let (oracle, t) = oracle_codes();
    let reset_at = 10;
    // Frames each slot has seen since it started (or was reset).
    let mut seen = [0usize; SLOTS];
    let (mut worst, mut checked_oracle) = (0.0f32, 0);
    for k in 0..t + 4 {
        if k == reset_at {
            let before = g.submissions();
            g.reset(0);
            cpu[0].reset(0);
            seen[0] = 0;
            assert_eq!(g.submissions(), before + 1);
        }
        let slots = listed(k);
        let frames = tick_frames(&pcm, fs, &slots, |s| seen[s]);
        // Refused calls move nothing (checked by the next frames' parity).
        assert!(g.encode_frames(&[0, 0], &frames[..2 * fs]).is_err());
        assert!(g.encode_frames(&[SLOTS], &frames[..fs]).is_err());
        assert!(g
            .encode_frames(&slots, &frames[..frames.len() - 1])
            .is_err());
        let (subs, host) = (g.submissions(), g.host_decisions());
        let got = g.encode_frames(&slots, &frames).unwrap().to_vec();
        assert_eq!(
            g.submissions() - subs,
            1 + (g.host_decisions() - host),
            "one submission for every listed slot"
        );
        assert_eq!(got.len(), slots.len() * nq);
        let mut codes = Vec::new();
        for (i, &s) in slots.iter().enumerate() {
            let want = cpu[s]
                .encode_frames(&[0], &frames[i * fs..(i + 1) * fs])
                .unwrap();
            assert_eq!(&got[i * nq..(i + 1) * nq], want, "tick {k} slot {s}: codes");
            if s == 0 && seen[0] < t {
                // Slot 0 runs the fixture's input from the start (again after its reset).
                let f = seen[0];
                let o: Vec<u32> = (0..nq).map(|q| oracle[q * t + f]).collect();
                assert_eq!(&got[i * nq..(i + 1) * nq], &o[..], "tick {k}: oracle codes");
                checked_oracle += 1;
            }
            codes.extend_from_slice(want);
        }
        let bins = m.cardinality() as u32;
        let mut bad = codes.clone();
        bad[0] = bins;
        let mut out = vec![0.0f32; slots.len() * fs];
        assert!(g.decode_frames(&slots, &bad, &mut out).is_err());
        assert!(g.decode_frames(&slots, &codes, &mut out[..fs]).is_err() || slots.len() == 1);
        let subs = g.submissions();
        g.decode_frames(&slots, &codes, &mut out).unwrap();
        assert_eq!(g.submissions() - subs, 1);
        for (i, &s) in slots.iter().enumerate() {
            let mut want = vec![0.0f32; fs];
            cpu[s]
                .decode_frames(&[0], &codes[i * nq..(i + 1) * nq], &mut want)
                .unwrap();
            let err = max_abs_diff(&out[i * fs..(i + 1) * fs], &want);
            worst = worst.max(err);
            assert!(err < TOL, "tick {k} slot {s}: samples differ by {err}");
        }
        for &s in &slots {
            seen[s] += 1;
        }
    }
    eprintln!("GPU batch decoder vs CPU: max abs diff {worst:e}; {checked_oracle} oracle frames");
    assert!(checked_oracle >= t, "slot 0 compared with the oracle");
}

#[test]
fn no_buffer_or_bind_group_created_per_tick() {
    let Some((ctx, m, mut g)) = batch_codec() else {
        return;
    };
    let (fs, nq) = (m.frame_size(), m.n_codebooks());
    let pcm = input_frames(fs);
    let mut out = vec![0.0f32; SLOTS * fs];
    let mut tick = |g: &mut GpuMimi, k: usize| {
        let slots = listed(k);
        let frames = tick_frames(&pcm, fs, &slots, |_| k);
        let codes = g.encode_frames(&slots, &frames).unwrap().to_vec();
        g.decode_frames(&slots, &codes, &mut out[..slots.len() * fs])
            .unwrap();
        if k % 37 == 36 {
            g.reset(k % SLOTS);
        }
        assert_eq!(codes.len(), slots.len() * nq);
    };
    tick(&mut g, 0);
    common::creates_nothing(&ctx, "over 100 ticks", || {
        for k in 1..=100 {
            tick(&mut g, k);
        }
    });
}

#[test]
fn zero_slots_is_refused() {
    let Some(ctx) = common::context() else {
        return;
    };
    let w = GpuMimiWeights::upload(&ctx, mimi()).unwrap();
    assert!(GpuMimi::new(w, 0).is_err());
}

/// Eight slots listed in a different order every tick with one slot left out: every listed
/// slot's codes and samples are the same bits as those of a `GpuMimi` of its own fed the same
/// frames (the batch reads each slot's input, state and output at that slot, whatever its place
/// in the list).
#[test]
fn eight_slots_out_of_order_equal_codecs_alone_bit_for_bit() {
    const N: usize = 8;
    let Some(ctx) = common::context() else {
        return;
    };
    let m = mimi();
    let w = GpuMimiWeights::upload(&ctx, m.clone()).unwrap();
    let mut g = GpuMimi::new(w.clone(), N).unwrap();
    let mut alone: Vec<GpuMimi> = (0..N)
        .map(|_| GpuMimi::new(w.clone(), 1).unwrap())
        .collect();
    let (fs, nq) = (m.frame_size(), m.n_codebooks());
    let pcm = input_frames(fs);
    let t = pcm.len() / fs;
    let mut seen = [0usize; N];
    for k in 0..6 {
        // A permutation of the slots (7 is prime to 8) that turns every tick, minus one slot.
        let out_slot = (3 * k) % N;
        let slots: Vec<usize> = (0..N)
            .map(|i| (3 + 7 * (i + k)) % N)
            .filter(|&s| s != out_slot)
            .collect();
        // Slot s: the fixture's frames from frame s on, scaled by 1 - s/10.
        let frames: Vec<f32> = slots
            .iter()
            .flat_map(|&s| {
                let f = (seen[s] + s) % t;
                let scale = 1.0 - 0.1 * s as f32;
                pcm[f * fs..(f + 1) * fs].iter().map(move |v| v * scale)
            })
            .collect();
        let got = g.encode_frames(&slots, &frames).unwrap().to_vec();
        let mut out = vec![0.0f32; slots.len() * fs];
        g.decode_frames(&slots, &got, &mut out).unwrap();
        for (i, &s) in slots.iter().enumerate() {
            let want = alone[s]
                .encode_frames(&[0], &frames[i * fs..(i + 1) * fs])
                .unwrap()
                .to_vec();
            assert_eq!(
                &got[i * nq..(i + 1) * nq],
                &want[..],
                "tick {k} slot {s}: codes"
            );
            let mut one = vec![0.0f32; fs];
            alone[s].decode_frames(&[0], &want, &mut one).unwrap();
            let same = out[i * fs..(i + 1) * fs]
                .iter()
                .zip(&one)
                .all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(
                same,
                "tick {k} slot {s}: samples differ from the codec alone"
            );
            seen[s] += 1;
        }
    }
}

/// The profile of one batched tick (4 slots, 3 listed out of order): each kernel launch of the
/// codec runs once per call whatever the number of listed slots, its grid carrying the slots
/// (the kernel's x times 3 for a grid-launched kernel, 3 layers of z for one with a thread per
/// output), so the tick's launches are those of one slot. The profile lines are printed (the
/// structure of a tick on this adapter; lavapipe gives no speed).
#[test]
fn a_batched_tick_launches_each_kernel_once_for_all_listed_slots() {
    let Some(ctx) = common::context_with(gpu::GpuOptions {
        profile: true,
        ..Default::default()
    }) else {
        return;
    };
    let m = mimi();
    let w = GpuMimiWeights::upload(&ctx, m.clone()).unwrap();
    let mut g = GpuMimi::new(w, 4).unwrap();
    let (dec, enc) = g.launches_per_call();
    let (fs, nq) = (m.frame_size(), m.n_codebooks());
    let pcm = input_frames(fs);
    let slots = [3, 0, 2];
    let frames = tick_frames(&pcm, fs, &slots, |s| s);
    let mut out = vec![0.0f32; slots.len() * fs];
    ctx.profile_reset();
    let codes = g.encode_frames(&slots, &frames).unwrap().to_vec();
    g.decode_frames(&slots, &codes, &mut out).unwrap();
    ctx.profile_frame().unwrap();
    let r = ctx.profile_report().unwrap();
    for l in r.lines("what=mimi_batch slots=3") {
        println!("{l}");
    }
    assert_eq!(codes.len(), slots.len() * nq);
    assert_eq!(r.calls_per_frame(), (enc + dec) as f64, "{r:#?}");
    for k in &r.kernels {
        let [x, _, z] = k.grid;
        assert!(
            z == 3 || (z == 1 && x % 3 == 0),
            "{} grid {:?}: the 3 listed slots are not in it",
            k.kernel,
            k.grid
        );
    }
    // (A host decision adds a copy and a submission, no launch.)
    assert_eq!(g.host_decisions(), 0);
}
