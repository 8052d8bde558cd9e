//! `moshi-native bench lm|mimi --device gpu`: the LM frame on a GPU adapter, one
//! [`LmBackend::sampled_step`](model::lm::LmBackend::sampled_step) per frame (one submission),
//! and Mimi's streaming encode + decode of one frame ([`gpu::GpuMimi`], one submission per
//! direction), each against a same-run device bandwidth probe (a copy kernel) as the roofline.

use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result};
use kernels::WeightFormat;
use model::lm::{Generator, LmError, LmFrame, LmSpec, NoObserver, TensorSource};
use model::mimi::{CodecBackend, Mimi};
use model::sampling::{Sampler, SamplerConfig};
use model::text::SentencePiece;

use super::args::{stats, BenchArgs};
use super::feed::{duplex_signal, Phases, SessionFeed};
use crate::lm::SyntheticSource;

/// The profile of the frames of one cell (`--profile`): each frame starts from a cleared profile
/// (so a bandwidth probe or a seek between frames is left out) and is resolved right after its
/// timed span.
pub(crate) struct FrameProfile {
    acc: Option<gpu::ProfileReport>,
}

impl FrameProfile {
    /// An empty profile, or none when `ctx` does not profile.
    pub(crate) fn new(ctx: &gpu::GpuContext) -> FrameProfile {
        FrameProfile {
            acc: ctx
                .profile_report()
                .map(|r| gpu::ProfileReport::empty(r.mode)),
        }
    }

    /// Before a frame's timed span.
    pub(crate) fn begin(&self, ctx: &gpu::GpuContext) {
        if self.acc.is_some() {
            ctx.profile_reset();
        }
    }

    /// After a frame's timed span: resolves its launches and adds them.
    pub(crate) fn end(&mut self, ctx: &gpu::GpuContext) -> Result<()> {
        if let Some(acc) = &mut self.acc {
            ctx.profile_frame()?;
            if let Some(r) = ctx.profile_report() {
                acc.merge(&r);
            }
        }
        Ok(())
    }

    /// Prints the `profile` lines (nothing without profiling).
    pub(crate) fn print(&self, tag: &str) {
        if let Some(acc) = &self.acc {
            for l in acc.lines(tag) {
                println!("{l}");
            }
        }
    }

    /// What was gathered (`None` without profiling).
    pub(crate) fn report(&self) -> Option<&gpu::ProfileReport> {
        self.acc.as_ref()
    }
}

/// The device options of a GPU bench: profiling with `--profile`.
pub(crate) fn gpu_options(args: &BenchArgs) -> gpu::GpuOptions {
    gpu::GpuOptions {
        profile: args.profile,
        ..Default::default()
    }
}

/// One measured cell (tests read it; the bench prints it).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct GpuLmCell {
    /// Source label (format or bundle file).
    pub label: String,
    /// KV position.
    pub pos: usize,
    /// Frame times, ms.
    pub ms: Vec<f64>,
    /// Probe GB/s measured in the same rounds.
    pub probe: Vec<f64>,
    /// Kernel launches per frame.
    pub dispatches: usize,
    /// Submissions per frame (1 when the frame is one `sampled_step`).
    pub submissions_per_frame: f64,
    /// Weight bytes read per frame.
    pub weight_bytes: usize,
    /// KV bytes read per frame at `pos`.
    pub kv_bytes: usize,
    /// The profile of the cell's frames (`--profile`).
    pub profile: Option<gpu::ProfileReport>,
}

/// LM weights packed for the device straight from their source (no CPU LM is built), with what a
/// CPU model would tell about them.
pub(crate) struct DeviceLm {
    /// The weights.
    pub weights: Arc<gpu::GpuLmWeights>,
    /// The format of the matrices ([`gpu::GpuLmWeights::format`]).
    pub format: WeightFormat,
    /// Bytes of the matrices one frame streams ([`gpu::GpuLmWeights::streamed_bytes`]).
    pub streamed_bytes: usize,
}

/// Uploads the LM of `spec` from `src` to `ctx`, one matrix at a time.
pub(crate) fn upload_lm<S: TensorSource + ?Sized>(
    ctx: &gpu::GpuContext,
    src: &S,
    spec: LmSpec,
) -> Result<DeviceLm> {
    let weights = gpu::GpuLmWeights::from_source(ctx, src, spec)?;
    Ok(DeviceLm {
        format: weights.format(),
        streamed_bytes: weights.streamed_bytes(),
        weights,
    })
}

/// The LM of a GPU bench source on `ctx`: synthetic weights in `format` at moshiko's sizes, or
/// (`None`) the `--bundle`'s checkpoint, read as `runtime::Engine::open` reads it on a GPU.
fn lm_on_gpu(
    args: &BenchArgs,
    ctx: &gpu::GpuContext,
    format: Option<WeightFormat>,
) -> Result<DeviceLm> {
    match format {
        Some(format) => upload_lm(ctx, &SyntheticSource { format, seed: 1 }, LmSpec::moshiko()),
        None => {
            let b = model::checkpoint::Bundle::open(bundle_dir(args)?)?;
            upload_lm(ctx, &b.lm_weights()?, LmSpec::from_config(&b.config.lm)?)
        }
    }
}

fn bundle_dir(args: &BenchArgs) -> Result<&std::path::Path> {
    args.bundle
        .as_deref()
        .context("a bundle source needs --bundle")
}

/// Times the LM of one of `lm_sources` (synthetic in `format`, or the bundle) on the adapter
/// (`None`: the best of any type) and prints one `result` line per KV position.
pub(crate) fn bench_lm_gpu(
    args: &BenchArgs,
    adapter: Option<usize>,
    label: &str,
    format: Option<WeightFormat>,
) -> Result<Vec<GpuLmCell>> {
    let ctx = gpu::GpuContext::new(gpu::AdapterChoice::Gpu(adapter), gpu_options(args))?;
    let probe = gpu::BandwidthProbe::new(&ctx, args.probe_mb)?;
    let t0 = Instant::now();
    let device_lm = lm_on_gpu(args, &ctx, format)?;
    let weight_bytes = device_lm.streamed_bytes;
    let spec = device_lm.weights.spec().clone();
    let lm = gpu::GpuLm::new(device_lm.weights, 1)?;
    let dispatches = lm.dispatches_per_frame();
    eprintln!(
        "lm {label} on {}: uploaded in {:.1} s, {dispatches} dispatches per frame, probe {} MiB",
        ctx.adapter(),
        t0.elapsed().as_secs_f64(),
        probe.bytes() >> 20
    );
    let mut gen = Generator::new(Box::new(lm))?;
    let mut samplers = [Sampler::new(
        SamplerConfig::default(),
        spec.text_card,
        spec.card,
    )?];
    let user: Vec<u32> = (0..spec.n_user() as u32)
        .map(|i| (100 + 37 * i) % spec.card as u32)
        .collect();
    let mut out: [Result<Option<LmFrame>, LmError>; 1] = [Ok(None)];
    let mut step = |gen: &mut Generator<gpu::GpuLm>| -> Result<()> {
        gen.step(&[0], &user, &mut samplers, None, &mut out, &mut NoObserver)?;
        Ok(())
    };
    step(&mut gen)?;
    probe.measure()?;
    let mut positions = args.positions.clone();
    if positions.is_empty() {
        positions.push(0);
    }
    let mut cells: Vec<GpuLmCell> = positions
        .iter()
        .map(|&pos| {
            let window = (pos + 1).min(spec.context);
            GpuLmCell {
                label: label.to_string(),
                pos,
                ms: Vec::new(),
                probe: Vec::new(),
                dispatches,
                submissions_per_frame: 0.0,
                weight_bytes,
                // The device's KV rings hold f32.
                kv_bytes: 2 * spec.num_layers * window * spec.dim * 4,
                profile: None,
            }
        })
        .collect();
    let mut subs = vec![0u64; positions.len()];
    let mut profiles: Vec<FrameProfile> =
        positions.iter().map(|_| FrameProfile::new(&ctx)).collect();
    for _ in 0..args.rounds {
        let bw = probe.measure()?;
        for ((c, s), prof) in cells.iter_mut().zip(&mut subs).zip(&mut profiles) {
            gen.seek_for_bench(c.pos);
            for _ in 0..args.lm_frames {
                let before = gen.backend().submissions();
                prof.begin(&ctx);
                let t = Instant::now();
                step(&mut gen)?;
                c.ms.push(t.elapsed().as_secs_f64() * 1e3);
                prof.end(&ctx)?;
                *s += gen.backend().submissions() - before;
                c.probe.push(bw);
            }
        }
    }
    for ((c, s), prof) in cells.iter_mut().zip(subs).zip(&profiles) {
        c.submissions_per_frame = s as f64 / c.ms.len().max(1) as f64;
        let (m, lo, hi) = stats(&c.ms);
        let (bw, bwlo, bwhi) = stats(&c.probe);
        let roof = (c.weight_bytes + c.kv_bytes) as f64 / bw / 1e6;
        println!(
            "result impl=ours what=lm_frame device=gpu adapter=\"{}\" format={label} pos={} kv=f32 ms={m:.1} \
             min={lo:.1} max={hi:.1} n={} weight_gb={:.3} kv_gb={:.3} probe_gbps={bw:.2} probe_min={bwlo:.2} \
             probe_max={bwhi:.2} roofline_ms={roof:.1} ratio={:.2} dispatches_per_frame={} submissions_per_frame={:.2}",
            ctx.adapter().name,
            c.pos,
            c.ms.len(),
            c.weight_bytes as f64 / 1e9,
            c.kv_bytes as f64 / 1e9,
            m / roof,
            c.dispatches,
            c.submissions_per_frame,
        );
        prof.print(&format!("what=lm_frame format={label} pos={}", c.pos));
        c.profile = prof.report().cloned();
    }
    Ok(cells)
}

/// One measured Mimi run on the device (tests read it; the bench prints it).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct GpuMimiCell {
    /// Encoder frame times, ms.
    pub enc_ms: Vec<f64>,
    /// Decoder frame times, ms.
    pub dec_ms: Vec<f64>,
    /// Probe GB/s, one per timed frame (measured once per round).
    pub probe: Vec<f64>,
    /// Kernel launches of an encoder frame plus a decoder frame.
    pub dispatches: usize,
    /// Submissions per frame, encode + decode (2 when each direction is one submission).
    pub submissions_per_frame: f64,
    /// Encoder frames whose codes the host decided (each one more submission).
    pub host_decisions: u64,
    /// Codec weight bytes on the device (read at least once per encode + decode).
    pub weight_bytes: u64,
    /// Slots of the batch codec timed beside (a [`gpu::GpuMimi`] of that many slots; `--slots`, 0
    /// when skipped).
    pub slots: usize,
    /// Batch ticks (encode + decode of every slot), ms.
    pub batch_ms: Vec<f64>,
    /// Submissions per batch tick (2 when each direction is one submission for all slots).
    pub batch_submissions_per_tick: f64,
    /// The profile of the single-slot frames (`--profile`).
    pub profile: Option<gpu::ProfileReport>,
}

/// Times `mimi`'s streaming encode and decode on the adapter (`None`: the best of any type), one
/// frame each way per step (the decoder takes the codes the encoder just gave), and, with
/// `--slots` above 1, the batch codec's tick for that many slots in the same rounds; prints the
/// `result` lines.
pub(crate) fn bench_mimi_gpu(
    args: &BenchArgs,
    adapter: Option<usize>,
    label: &str,
    mimi: Arc<Mimi>,
) -> Result<GpuMimiCell> {
    let ctx = gpu::GpuContext::new(gpu::AdapterChoice::Gpu(adapter), gpu_options(args))?;
    let probe = gpu::BandwidthProbe::new(&ctx, args.probe_mb)?;
    let t0 = Instant::now();
    let weights = gpu::GpuMimiWeights::upload(&ctx, mimi.clone())?;
    let weight_bytes = weights.weight_bytes();
    let mut codec = gpu::GpuMimi::new(weights.clone(), 1)?;
    let slots = if args.slots > 1 { args.slots } else { 0 };
    let mut batch = match slots {
        0 => None,
        n => Some(gpu::GpuMimi::new(weights, n)?),
    };
    let (dec_l, enc_l) = codec.launches_per_call();
    eprintln!(
        "mimi {label} on {}: uploaded in {:.1} s, {} + {} dispatches per frame (encode + decode), probe {} MiB",
        ctx.adapter(),
        t0.elapsed().as_secs_f64(),
        enc_l,
        dec_l,
        probe.bytes() >> 20
    );
    let fs = codec.frame_size();
    let pcm: Vec<f32> = (0..fs)
        .map(|i| 0.3 * (i as f32 * 0.031).sin() + 0.1 * (i as f32 * 0.17).sin())
        .collect();
    let nq = codec.n_codebooks();
    let mut codes = vec![0u32; nq];
    let mut out = vec![0.0f32; fs];
    let mut frame = |codec: &mut gpu::GpuMimi| -> Result<(f64, f64)> {
        let t = Instant::now();
        codes.copy_from_slice(codec.encode_frames(&[0], &pcm)?);
        let e = t.elapsed().as_secs_f64() * 1e3;
        let t = Instant::now();
        codec.decode_frames(&[0], &codes, &mut out)?;
        Ok((e, t.elapsed().as_secs_f64() * 1e3))
    };
    frame(&mut codec)?;
    let all: Vec<usize> = (0..slots).collect();
    let batch_pcm: Vec<f32> = (0..slots).flat_map(|_| pcm.iter().copied()).collect();
    let mut batch_codes = vec![0u32; slots * nq];
    let mut batch_out = vec![0.0f32; slots * fs];
    let mut tick = |b: &mut gpu::GpuMimi| -> Result<f64> {
        let t = Instant::now();
        batch_codes.copy_from_slice(b.encode_frames(&all, &batch_pcm)?);
        b.decode_frames(&all, &batch_codes, &mut batch_out)?;
        Ok(t.elapsed().as_secs_f64() * 1e3)
    };
    if let Some(b) = batch.as_mut() {
        tick(b)?;
    }
    probe.measure()?;
    let mut cell = GpuMimiCell {
        enc_ms: Vec::new(),
        dec_ms: Vec::new(),
        probe: Vec::new(),
        dispatches: enc_l + dec_l,
        submissions_per_frame: 0.0,
        host_decisions: 0,
        weight_bytes,
        slots,
        batch_ms: Vec::new(),
        batch_submissions_per_tick: 0.0,
        profile: None,
    };
    let batch_subs0 = batch.as_ref().map_or(0, |b| b.submissions());
    let (subs0, host0) = (codec.submissions(), codec.host_decisions());
    let (mut prof, mut batch_prof) = (FrameProfile::new(&ctx), FrameProfile::new(&ctx));
    for _ in 0..args.rounds {
        let bw = probe.measure()?;
        for _ in 0..args.mimi_frames {
            prof.begin(&ctx);
            let (e, d) = frame(&mut codec)?;
            prof.end(&ctx)?;
            cell.enc_ms.push(e);
            cell.dec_ms.push(d);
            cell.probe.push(bw);
        }
        if let Some(b) = batch.as_mut() {
            for _ in 0..args.mimi_frames {
                batch_prof.begin(&ctx);
                cell.batch_ms.push(tick(b)?);
                batch_prof.end(&ctx)?;
            }
        }
    }
    if let Some(b) = &batch {
        cell.batch_submissions_per_tick =
            (b.submissions() - batch_subs0) as f64 / cell.batch_ms.len().max(1) as f64;
    }
    let n = cell.enc_ms.len().max(1) as f64;
    cell.submissions_per_frame = (codec.submissions() - subs0) as f64 / n;
    cell.host_decisions = codec.host_decisions() - host0;
    let sum: Vec<f64> = cell
        .enc_ms
        .iter()
        .zip(&cell.dec_ms)
        .map(|(a, b)| a + b)
        .collect();
    let (bw, bwlo, bwhi) = stats(&cell.probe);
    let roof = weight_bytes as f64 / bw / 1e6;
    for (what, v) in [
        ("mimi_encode", &cell.enc_ms),
        ("mimi_decode", &cell.dec_ms),
        ("mimi_encdec", &sum),
    ] {
        let (m, lo, hi) = stats(v);
        let extra = if what == "mimi_encdec" {
            format!(
                " weight_gb={:.3} probe_gbps={bw:.2} probe_min={bwlo:.2} probe_max={bwhi:.2} \
                 roofline_ms={roof:.2} ratio={:.2} dispatches_per_frame={} submissions_per_frame={:.2} \
                 host_decisions={}",
                weight_bytes as f64 / 1e9,
                m / roof,
                cell.dispatches,
                cell.submissions_per_frame,
                cell.host_decisions,
            )
        } else {
            String::new()
        };
        println!(
            "result impl=ours what={what} device=gpu adapter=\"{}\" source=\"{label}\" ms={m:.3} \
             min={lo:.3} max={hi:.3} n={}{extra}",
            ctx.adapter().name,
            v.len(),
        );
    }
    prof.print("what=mimi_encdec");
    if let Some(b) = &batch {
        let (m, lo, hi) = stats(&cell.batch_ms);
        let (single, _, _) = stats(&sum);
        let (dec_l, enc_l) = b.launches_per_call();
        println!(
            "result impl=ours what=mimi_batch_encdec device=gpu adapter=\"{}\" source=\"{label}\" slots={slots} \
             ms={m:.3} min={lo:.3} max={hi:.3} n={} ms_per_slot={:.3} ratio_to_single={:.2} \
             dispatches_per_tick={} submissions_per_tick={:.2}",
            ctx.adapter().name,
            cell.batch_ms.len(),
            m / slots as f64,
            m / single,
            enc_l + dec_l,
            cell.batch_submissions_per_tick,
        );
        batch_prof.print(&format!("what=mimi_batch_encdec slots={slots}"));
    }
    cell.profile = prof.report().cloned();
    Ok(cell)
}

/// One measured `bench duplex --device gpu` run (tests read it; the bench prints it).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct GpuDuplexCell {
    /// Push-to-answer time of each timed frame through the session, ms.
    pub e2e: Vec<f64>,
    /// The session's own phases per timed frame, ms: pass (total), encode, LM, decode.
    pub pass: Vec<f64>,
    /// Encode phase, ms.
    pub encode: Vec<f64>,
    /// LM phase, ms.
    pub lm: Vec<f64>,
    /// Decode phase, ms.
    pub decode: Vec<f64>,
    /// Frames the session had processed at the end.
    pub frames: u64,
    /// Device submissions per timed frame (1: the one-submission frame, `gpu::GpuDuplex`).
    pub submissions_per_frame: f64,
    /// Host waits on the device per timed frame.
    pub waits_per_frame: f64,
    /// The profile of the timed frames (`--profile`).
    pub profile: Option<gpu::ProfileReport>,
}

/// `bench duplex --device gpu`: the frame pass a conversation runs with `--device gpu` (a
/// [`runtime::Session`] on its [`runtime::SessionRunner`] worker thread over an engine whose LM and
/// Mimi are on the device: Mimi encode, LM step, Mimi decode), fed one frame at a time through its
/// input ring and answered through its event queue; prints one `result` line in the CPU duplex
/// bench's format (threads=1: the model runs on the device) and, with `--profile`, the `profile`
/// lines of the timed frames.
pub(crate) fn bench_duplex_gpu(
    args: &BenchArgs,
    adapter: Option<usize>,
    label: &str,
    format: Option<WeightFormat>,
) -> Result<GpuDuplexCell> {
    let ctx = gpu::GpuContext::new(gpu::AdapterChoice::Gpu(adapter), gpu_options(args))?;
    let t0 = Instant::now();
    let opts = runtime::EngineOptions {
        device: runtime::Device::Gpu {
            adapter,
            threads: 1,
        },
        ..Default::default()
    };
    // The bundle's codec and tokenizer, or a synthetic Mimi and a tiny tokenizer beside synthetic
    // weights (as the CPU duplex bench's); the LM straight from its source to the device.
    let (lm, mimi, tokenizer) = match format {
        Some(_) => {
            let lm = lm_on_gpu(args, &ctx, format)?;
            let spm = crate::synth::tiny_spm(lm.weights.spec().text_card);
            let mimi = crate::mimi::synthetic_mimi(8, 42)?;
            (lm, mimi, SentencePiece::from_bytes(&spm)?)
        }
        None => {
            let m = model::Bundled::open_with(bundle_dir(args)?, 1, |w, spec| {
                upload_lm(&ctx, w, spec)
            })?;
            (m.lm, Arc::new(m.mimi), m.tokenizer)
        }
    };
    let engine = runtime::Engine::from_device_weights(
        lm.weights,
        lm.format,
        mimi,
        Some(Arc::new(tokenizer)),
        opts,
    )?;
    eprintln!(
        "duplex {label} on {}: uploaded in {:.1} s",
        ctx.adapter(),
        t0.elapsed().as_secs_f64()
    );
    let mut feed = SessionFeed::start(engine, args.output_rate)?;
    let frames = args.duplex_frames.max(1);
    let pcm = duplex_signal(frames, args.rounds);
    // Warm-up: three frames (the first decodes nothing).
    for _ in 0..3 {
        feed.pass(&pcm)?;
    }
    let mut prof = FrameProfile::new(&ctx);
    let mut phases = Phases::default();
    // The profiler's own resolve is not counted; nothing else runs on this context meanwhile.
    let counted = (ctx.submissions(), ctx.waits());
    for round in 0..args.rounds {
        for k in 0..frames {
            prof.begin(&ctx);
            let (total, t) = feed.pass(&pcm)?;
            prof.end(&ctx)?;
            if args.per_frame {
                eprintln!(
                    "frame device=gpu format={label} round={round} i={k} {}",
                    Phases::frame_text(total, &t)
                );
            }
            phases.push(total, &t);
        }
    }
    let timed = phases.e2e.len().max(1) as f64;
    let submissions_per_frame = (ctx.submissions() - counted.0) as f64 / timed;
    let waits_per_frame = (ctx.waits() - counted.1) as f64 / timed;
    let processed = feed.processed();
    feed.stop()?;
    let p = &phases;
    let med = |v: &[f64]| stats(v).0;
    let (m, lo, hi) = stats(&p.e2e);
    let parts_ms = med(&p.encode) + med(&p.lm) + med(&p.decode);
    println!(
        "result impl=ours what=duplex_frame device=gpu adapter=\"{}\" format={label} threads=1 kv=f32 output_rate={} \
         ms={m:.1} min={lo:.1} max={hi:.1} n={} pass_ms={:.1} parts_ms={parts_ms:.1} overhead={:.3} rounds={} \
         {} pos={} submissions_per_frame={:.1} waits_per_frame={:.1}",
        ctx.adapter().name,
        args.output_rate,
        p.e2e.len(),
        med(&p.pass),
        m / parts_ms,
        args.rounds,
        p.medians_text(),
        processed,
        submissions_per_frame,
        waits_per_frame,
    );
    prof.print(&format!("what=duplex_frame format={label}"));
    Ok(GpuDuplexCell {
        e2e: phases.e2e,
        pass: phases.pass,
        encode: phases.encode,
        lm: phases.lm,
        decode: phases.decode,
        frames: processed,
        submissions_per_frame,
        waits_per_frame,
        profile: prof.report().cloned(),
    })
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        bench: BenchArgs,
    }

    /// `bench` with the words of `line` and `--bundle` of the fixture LM when `bundle`, or `None`
    /// when no adapter exists (the test is skipped, unless `MOSHI_REQUIRE_GPU=1`).
    fn gpu_args(line: &str, bundle: bool) -> Option<BenchArgs> {
        if gpu::skip_test_without_adapter() {
            return None;
        }
        let dir = fixture_dir();
        let tail = bundle.then(|| ["--bundle", dir.to_str().unwrap()]);
        let all = ["bench"]
            .into_iter()
            .chain(line.split(' '))
            .chain(tail.into_iter().flatten());
        Some(Cli::parse_from(all).bench)
    }

    fn fixture_dir() -> std::path::PathBuf {
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/lm")
    }

    /// A context on the best adapter and the fixture LM's launches per frame on it.
    fn fixture_launches() -> (gpu::GpuContext, usize) {
        let ctx = gpu::GpuContext::new(gpu::AdapterChoice::Gpu(None), gpu::GpuOptions::default())
            .unwrap();
        let b = model::checkpoint::Bundle::open(&fixture_dir()).unwrap();
        let spec = LmSpec::from_config(&b.config.lm).unwrap();
        let lm = upload_lm(&ctx, &b.lm_weights().unwrap(), spec).unwrap();
        let n = gpu::GpuLm::new(lm.weights, 1)
            .unwrap()
            .dispatches_per_frame();
        (ctx, n)
    }

    /// The GPU frame bench on the fixture LM: every frame is one submission, the dispatch count is
    /// the backend's, a probe bandwidth and a time come out (any adapter: lavapipe here), and the
    /// streamed bytes are those the CPU model counts.
    #[test]
    fn gpu_lm_bench_is_one_submission_per_frame() {
        let words = "lm --rounds 2 --lm-frames 3 --positions 0,25 --probe-mb 4";
        let Some(args) = gpu_args(words, true) else {
            return;
        };
        let (_ctx, expected) = fixture_launches();
        let cells = bench_lm_gpu(&args, None, "fixture", None).unwrap();
        let cpu = model::MoshiModel::open(&fixture_dir()).unwrap().lm;
        assert_eq!(cells.len(), 2);
        for c in &cells {
            assert_eq!(c.submissions_per_frame, 1.0, "{c:?}");
            assert_eq!(c.dispatches, expected);
            assert_eq!(c.weight_bytes, cpu.streamed_weight_bytes());
            assert_eq!(c.ms.len(), 6);
            assert!(c.ms.iter().all(|&m| m > 0.0) && c.probe.iter().all(|&b| b > 0.0));
        }
        assert!(cells[1].kv_bytes > cells[0].kv_bytes);
        assert!(cells.iter().all(|c| c.profile.is_none()));
    }

    /// `--profile`: each cell's profile holds its timed frames only (not the probe's launches nor
    /// the warm-up), every launch of each.
    #[test]
    fn gpu_lm_bench_profile_holds_every_launch_of_the_timed_frames() {
        let words = "lm --rounds 2 --lm-frames 2 --positions 0,7 --probe-mb 4 --profile";
        let Some(args) = gpu_args(words, true) else {
            return;
        };
        let cells = bench_lm_gpu(&args, None, "fixture", None).unwrap();
        for c in &cells {
            let p = c.profile.as_ref().expect("a profile with --profile");
            assert_eq!(p.frames, 4, "{p:#?}");
            assert_eq!(p.calls_per_frame(), c.dispatches as f64, "{p:#?}");
            assert!(p.kernels.iter().all(|k| k.kernel != "Copy"), "{p:#?}");
        }
    }

    /// The fixture codec of the Mimi benches.
    fn fixture_mimi(name: &str) -> Arc<Mimi> {
        let (dir, _) = testkit::mimi_bundle(name);
        let mimi = embed::open_mimi(&dir, None, 8).unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        mimi
    }

    /// The GPU Mimi bench on the fixture codec: each direction of a frame is one submission, the
    /// dispatch count is the codec's own, times and a probe bandwidth come out (any adapter;
    /// skipped without one unless `MOSHI_REQUIRE_GPU=1`).
    #[test]
    fn gpu_mimi_bench_is_one_submission_per_direction() {
        let words = "mimi --rounds 2 --mimi-frames 3 --probe-mb 4 --slots 2";
        let Some(args) = gpu_args(words, false) else {
            return;
        };
        let mimi = fixture_mimi("bench-gpu");
        let ctx = gpu::GpuContext::new(gpu::AdapterChoice::Gpu(None), gpu::GpuOptions::default())
            .unwrap();
        let w = gpu::GpuMimiWeights::upload(&ctx, mimi.clone()).unwrap();
        let g = gpu::GpuMimi::new(w, 1).unwrap();
        let (d, e) = g.launches_per_call();
        let cell = bench_mimi_gpu(&args, None, "fixture", mimi).unwrap();
        assert_eq!(cell.dispatches, d + e);
        assert_eq!(cell.host_decisions, 0, "{cell:?}");
        assert_eq!(cell.submissions_per_frame, 2.0, "{cell:?}");
        assert_eq!((cell.enc_ms.len(), cell.dec_ms.len()), (6, 6));
        assert!(cell.enc_ms.iter().chain(&cell.dec_ms).all(|&m| m > 0.0));
        assert!(cell.probe.iter().all(|&b| b > 0.0) && cell.weight_bytes > 0);
        // The batch codec: one submission per direction for both slots.
        assert_eq!(cell.slots, 2);
        assert_eq!(cell.batch_ms.len(), 6);
        assert_eq!(cell.batch_submissions_per_tick, 2.0, "{cell:?}");
        assert!(cell.profile.is_none());
    }

    /// `bench duplex --device gpu --profile` on the fixture bundle: every timed frame goes through
    /// the session as one submission and one wait (`gpu::GpuDuplex`), and its profile holds
    /// exactly one Mimi encode, one LM frame and one Mimi decode per frame (the launch counts of a
    /// device LM and codec built beside it).
    #[test]
    fn gpu_duplex_bench_runs_the_whole_frame_on_the_device() {
        let words = "duplex --rounds 2 --duplex-frames 2 --profile";
        let Some(args) = gpu_args(words, true) else {
            return;
        };
        let (ctx, lm_launches) = fixture_launches();
        let m = model::MoshiModel::open(&fixture_dir()).unwrap();
        let w = gpu::GpuMimiWeights::upload(&ctx, Arc::new(m.mimi)).unwrap();
        let codec = gpu::GpuMimi::new(w, 1).unwrap();
        let (dec, enc) = codec.launches_per_call();
        let expected = lm_launches + dec + enc;
        let cell = bench_duplex_gpu(&args, None, "fixture", None).unwrap();
        assert_eq!(cell.e2e.len(), 4);
        assert!(cell.e2e.iter().all(|&ms| ms > 0.0));
        assert!(cell.lm.iter().all(|&ms| ms > 0.0), "{cell:?}");
        assert_eq!(cell.frames, 3 + 4);
        assert_eq!(
            (cell.submissions_per_frame, cell.waits_per_frame),
            (1.0, 1.0),
            "{cell:?}"
        );
        let p = cell.profile.as_ref().expect("a profile with --profile");
        assert_eq!(p.frames, 4, "{p:#?}");
        assert_eq!(p.calls_per_frame(), expected as f64, "{p:#?}");
    }

    /// `--profile` on the Mimi bench: the single-slot profile holds every launch of each timed
    /// encode + decode.
    #[test]
    fn gpu_mimi_bench_profile_holds_every_launch_of_the_timed_frames() {
        let words = "mimi --rounds 1 --mimi-frames 3 --probe-mb 4 --slots 0 --profile";
        let Some(args) = gpu_args(words, false) else {
            return;
        };
        let cell =
            bench_mimi_gpu(&args, None, "fixture", fixture_mimi("bench-gpu-profile")).unwrap();
        let p = cell.profile.as_ref().expect("a profile with --profile");
        assert_eq!(p.frames, 3, "{p:#?}");
        assert_eq!(p.calls_per_frame(), cell.dispatches as f64, "{p:#?}");
    }
}
