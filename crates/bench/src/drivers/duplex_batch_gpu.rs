//! `moshi-native bench duplex --device gpu --slots N`: the batch driver's tick on the GPU (a
//! [`runtime::BatchBench`], the worker of `serve --device gpu --batch N` driven tick by tick: every
//! ready slot's Mimi encode, LM step and Mimi decode in one submission, then detokenization,
//! resampling and the events), N slots each with a frame against one slot alone, interleaved in the
//! same rounds over one engine: ms per tick, their ratio, submissions and waits per tick and, with
//! `--profile`, the launches per tick of each.

use anyhow::Result;

use super::args::{stats, BenchArgs};
use super::on_gpu::{gpu_options, FrameProfile};

/// One measured `bench duplex --device gpu --slots N` run (tests read it; the bench prints it).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct GpuBatchCell {
    /// Slots of the batch (each ticked with a frame).
    pub slots: usize,
    /// Ms of each timed tick of the batch (interleaved with the one-slot ticks).
    pub batch_ms: Vec<f64>,
    /// Ms of each timed tick of the one-slot batch.
    pub one_ms: Vec<f64>,
    /// Per round: median batch tick ÷ median one-slot tick.
    pub ratio: Vec<f64>,
    /// Device submissions per timed tick, batch then one slot.
    pub submissions_per_tick: (f64, f64),
    /// Host waits on the device per timed tick, batch then one slot.
    pub waits_per_tick: (f64, f64),
    /// The profiles of the timed ticks (`--profile`), batch then one slot.
    pub profile: (Option<gpu::ProfileReport>, Option<gpu::ProfileReport>),
}

/// A batch driver of `slots` slots and its timing: ms, submissions and waits of each tick.
struct Ticker {
    bench: runtime::BatchBench,
    pcm: Vec<f32>,
    ms: Vec<f64>,
    submissions: u64,
    waits: u64,
    prof: FrameProfile,
}

impl Ticker {
    /// One tick, every slot with its frame `f` of `signal`; `timed` ticks are counted.
    fn tick(&mut self, ctx: &gpu::GpuContext, signal: &[f32], f: usize, timed: bool) -> Result<()> {
        let fs = runtime::FRAME_SIZE;
        let slots = self.pcm.len() / fs;
        let frames = signal.len() / fs;
        for s in 0..slots {
            // Each slot reads the signal from its own place, so that no two slots code the same audio.
            let at = (f + s * 7) % frames;
            self.pcm[s * fs..(s + 1) * fs].copy_from_slice(&signal[at * fs..(at + 1) * fs]);
        }
        let counted = (ctx.submissions(), ctx.waits());
        if timed {
            self.prof.begin(ctx);
        }
        let t = std::time::Instant::now();
        let emitted = self.bench.tick(&self.pcm)?;
        let ms = t.elapsed().as_secs_f64() * 1e3;
        anyhow::ensure!(
            emitted == slots,
            "a tick of {slots} slots emitted {emitted}"
        );
        if timed {
            self.prof.end(ctx)?;
            self.ms.push(ms);
            self.submissions += ctx.submissions() - counted.0;
            self.waits += ctx.waits() - counted.1;
        }
        Ok(())
    }
}

/// `bench duplex --device gpu --slots N` for each source of `bench duplex` (the bundle's, or the
/// synthetic formats'), after the one-conversation frames.
pub(crate) fn run(args: &BenchArgs, adapter: Option<usize>) -> Result<()> {
    println!(
        "\n## duplex batch on the GPU: a tick of {} slots (one submission) vs one slot, ms",
        args.slots
    );
    for (label, parts) in super::duplex_parts(args)? {
        bench_duplex_batch_gpu(args, adapter, &label, parts)?;
    }
    Ok(())
}

/// One source's `bench duplex --device gpu --slots N` (module docs): prints one `result` line (the batch's
/// tick, with the one-slot tick and their ratio) and, with `--profile`, the `profile` lines of
/// both.
pub(crate) fn bench_duplex_batch_gpu(
    args: &BenchArgs,
    adapter: Option<usize>,
    label: &str,
    parts: super::DuplexParts,
) -> Result<GpuBatchCell> {
    let slots = args.slots.max(1);
    let ctx = gpu::GpuContext::new(gpu::AdapterChoice::Gpu(adapter), gpu_options(args))?;
    // The model runs on the device: the driver's pool (one thread) holds the host work only.
    let device = runtime::Device::Gpu {
        adapter,
        threads: 1,
    };
    let opts = runtime::EngineOptions {
        device,
        ..Default::default()
    };
    let (lm, mimi, tok) = (parts.lm, parts.mimi, parts.tokenizer);
    let engine = runtime::Engine::from_parts_on(lm, mimi, tok, opts, ctx.clone())?;
    let session = runtime::SessionOptions {
        output_rate: args.output_rate,
        ..Default::default()
    };
    let frames = args.duplex_frames.max(1);
    let signal = crate::mimi::test_signal(
        (frames * args.rounds + 3 + 7 * slots) * runtime::FRAME_SIZE,
        runtime::SAMPLE_RATE as usize,
    );
    // The KV capacity is the CPU's; a GPU LM keeps its whole context.
    let ticker = |n: usize| -> Result<Ticker> {
        Ok(Ticker {
            bench: runtime::BatchBench::new(&engine, n, &session, frames * args.rounds + 3)?,
            pcm: vec![0.0; n * runtime::FRAME_SIZE],
            ms: Vec::new(),
            submissions: 0,
            waits: 0,
            prof: FrameProfile::new(&ctx),
        })
    };
    let (mut batch, mut one) = (ticker(slots)?, ticker(1)?);
    // Warm-up: three ticks each (the first decodes nothing).
    for f in 0..3 {
        batch.tick(&ctx, &signal, f, false)?;
        one.tick(&ctx, &signal, f, false)?;
    }
    let mut ratio = Vec::new();
    for round in 0..args.rounds {
        let (b0, o0) = (batch.ms.len(), one.ms.len());
        for k in 0..frames {
            let f = 3 + round * frames + k;
            batch.tick(&ctx, &signal, f, true)?;
            one.tick(&ctx, &signal, f, true)?;
        }
        ratio.push(stats(&batch.ms[b0..]).0 / stats(&one.ms[o0..]).0);
    }
    let timed = (frames * args.rounds) as f64;
    let per = |t: &Ticker| (t.submissions as f64 / timed, t.waits as f64 / timed);
    let cell = GpuBatchCell {
        slots,
        submissions_per_tick: (per(&batch).0, per(&one).0),
        waits_per_tick: (per(&batch).1, per(&one).1),
        profile: (batch.prof.report().cloned(), one.prof.report().cloned()),
        batch_ms: batch.ms.clone(),
        one_ms: one.ms.clone(),
        ratio,
    };
    let (m, lo, hi) = stats(&cell.batch_ms);
    let (r, rlo, rhi) = stats(&cell.ratio);
    let launches = |p: &Option<gpu::ProfileReport>| {
        p.as_ref()
            .map_or("-".to_string(), |p| format!("{}", p.calls_per_frame()))
    };
    println!(
        "result impl=ours what=duplex_batch_tick device=gpu adapter=\"{}\" format={label} slots={slots} kv=f32 \
         output_rate={} ms={m:.1} min={lo:.1} max={hi:.1} n={} one_slot_ms={:.1} ratio={r:.3} ratio_min={rlo:.3} \
         ratio_max={rhi:.3} per_slot_ms={:.2} rounds={} submissions_per_tick={:.1} waits_per_tick={:.1} \
         one_slot_submissions_per_tick={:.1} launches_per_tick={} one_slot_launches_per_tick={}",
        ctx.adapter().name,
        args.output_rate,
        cell.batch_ms.len(),
        stats(&cell.one_ms).0,
        m / slots as f64,
        args.rounds,
        cell.submissions_per_tick.0,
        cell.waits_per_tick.0,
        cell.submissions_per_tick.1,
        launches(&cell.profile.0),
        launches(&cell.profile.1),
    );
    batch.prof.print(&format!(
        "what=duplex_batch_tick format={label} slots={slots}"
    ));
    one.prof
        .print(&format!("what=duplex_batch_tick format={label} slots=1"));
    Ok(cell)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The arguments of `bench` followed by `words`.
    fn bench_args(words: &[&str]) -> BenchArgs {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            bench: BenchArgs,
        }
        let line = std::iter::once("bench").chain(words.iter().copied());
        <Cli as clap::Parser>::parse_from(line).bench
    }

    /// `bench duplex --device gpu --slots 3 --profile` on the fixture bundle: a tick of three slots
    /// and a tick of one are each one submission and one wait, and launch the same kernels as
    /// often (each launch's grid carries the slots); times come out (any adapter: lavapipe here,
    /// structure only; skipped without one unless `MOSHI_REQUIRE_GPU=1`).
    #[test]
    fn gpu_batch_tick_is_one_submission_and_the_launches_of_one_slot() {
        if gpu::skip_test_without_adapter() {
            return;
        }
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/lm");
        let bundle = dir.to_str().unwrap();
        let args = bench_args(&[
            "duplex", "--rounds", "2", "--slots", "3", "--bundle", bundle,
        ]);
        let args = BenchArgs {
            duplex_frames: 2,
            profile: true,
            ..args
        };
        let (label, p) = crate::drivers::duplex_parts(&args).unwrap().remove(0);
        let cell = bench_duplex_batch_gpu(&args, None, &label, p).unwrap();
        assert_eq!(cell.slots, 3);
        assert_eq!((cell.batch_ms.len(), cell.one_ms.len()), (4, 4));
        assert!(cell.batch_ms.iter().chain(&cell.one_ms).all(|&ms| ms > 0.0));
        assert_eq!(cell.ratio.len(), 2);
        assert_eq!(cell.submissions_per_tick, (1.0, 1.0), "{cell:?}");
        assert_eq!(cell.waits_per_tick, (1.0, 1.0), "{cell:?}");
        let (b, o) = (cell.profile.0.unwrap(), cell.profile.1.unwrap());
        assert_eq!((b.frames, o.frames), (4, 4));
        assert!(o.calls_per_frame() > 0.0);
        assert_eq!(b.calls_per_frame(), o.calls_per_frame(), "{b:#?}\n{o:#?}");
    }
}
