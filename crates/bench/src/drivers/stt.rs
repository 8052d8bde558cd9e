//! `moshi-native bench stt`: the speech-to-text tick at the released sizes, batched against one stream
//! at a time, and how many real-time streams this machine holds.
//!
//! One tick is what `runtime::SttRunner` runs every 80 ms for the streams that have a frame: ONE
//! batched Mimi encode of their frames (`MimiBatchEncoder`, 32 codebooks) and ONE `SttBatch` step
//! (temporal transformer, text argmax, extra heads' softmax, word rules). Timed for `--streams` N
//! (1, 8, 32, 64) per variant (`--stt-variants`: stt-1b, stt-2.6b), weight format (`--formats`,
//! synthetic weights in memory, or `--bundle` an STT bundle) and thread count, in two modes
//! interleaved within every round:
//! * `batched`: the tick as the runner runs it (every weight read once per tick);
//! * `one`: the same N streams stepped one after the other (encode + step of one row each), what a
//!   server without batching does per tick.
//!
//! The KV caches are at `--stt-position` (default: the full context window, the steady state of a
//! stream older than 60 s for stt-1b, 30 s for stt-2.6b), so attention reads the real window. The
//! roofline of a tick is (LM weights streamed + N × KV bytes read) ÷ the read probe's bandwidth in
//! the same round (batched; N × that for `one`); the Mimi encoder's weights are left out of it.
//! A stream is real time when the tick takes at most 80 ms: per (variant, format, threads, mode) the
//! largest measured N that does, and an estimate interpolated between measured N.
//!
//! Result lines: `result impl=ours what=stt_tick variant=V format=F threads=T streams=N mode=batched|one
//! ms=… min=… max=… n=… encode_ms=… step_ms=… per_stream_ms=… roofline_ms=… ratio_to_roofline=…
//! probe_gbps=… [ratio_to_one=…]` and `result impl=ours what=stt_realtime variant=V format=F threads=T mode=M
//! streams=K estimate=E`.

use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use kernels::attention::KvDtype;
use kernels::{Pool, WeightFormat};
use model::checkpoint::MimiConfig;
use model::lm::{CpuLm, LmModel, LmSpec};
use model::mimi::{Mimi, MimiBatchEncoder, MimiOptions};
use model::stt::{SttBatch, SttEvent, SttModel, SttPlan, SttRelease};

use super::args::{ratio_fields, settle, stats, BenchArgs};
use super::{kv_elt_bytes, kv_name, parse_format, parse_kv, Probe};
use crate::lm::SyntheticSource;
use crate::mimi::{synthetic_tensors, test_signal};

/// One frame: 80 ms of audio at 24 kHz.
const FRAME: usize = 1920;
/// The real-time budget of a tick, ms.
const REAL_TIME_MS: f64 = 80.0;

/// A speech-to-text model to time, with its labels.
struct Subject {
    variant: String,
    format: String,
    model: Arc<SttModel>,
}

/// Samples of one (streams, mode) cell.
#[derive(Default, Clone)]
struct Cell {
    ms: Vec<f64>,
    encode: Vec<f64>,
    step: Vec<f64>,
    roofline: Vec<f64>,
    ratio: Vec<f64>,
    /// Read-probe GB/s of the round.
    probe: Vec<f64>,
    /// Batched only: per-round median tick ÷ the one-at-a-time median of the same round.
    to_one: Vec<f64>,
}

/// A synthetic STT model of `release`'s released sizes with `format` weights (LM and extra heads
/// from [`SyntheticSource`], Mimi from [`synthetic_tensors`] with the 32 codebooks it reads).
pub(crate) fn synthetic_stt(release: SttRelease, format: WeightFormat) -> Result<SttModel> {
    let cfg = release.lm_config();
    let spec = LmSpec::from_config(&cfg)?;
    let src = SyntheticSource { format, seed: 1 };
    let lm = LmModel::from_source(&src, spec.clone())?;
    let mimi_cfg = MimiConfig::v0_1();
    let mimi = Mimi::from_tensors_with(
        &synthetic_tensors(&mimi_cfg, 42),
        &mimi_cfg,
        cfg.n_q,
        &MimiOptions::default(),
    )?;
    Ok(SttModel::from_parts(
        lm,
        mimi,
        &src,
        cfg.extra_heads_num_heads,
        cfg.extra_heads_dim,
        spec,
        SttPlan::from_config(&release.stt_config()),
    )?)
}

/// The models to time: the bundle's (`--bundle`), else one synthetic model per variant and format.
fn subjects(args: &BenchArgs) -> Result<Vec<(String, String, Option<WeightFormat>)>> {
    if let Some(dir) = &args.bundle {
        let b = model::checkpoint::Bundle::open(dir)?;
        let variant = SttRelease::matching(&b.config.lm)
            .map_or_else(|| "custom".to_string(), |r| r.name().to_string());
        let file = b
            .files
            .lm
            .file_name()
            .map(|n| n.to_string_lossy().into_owned());
        return Ok(vec![(
            variant,
            format!("bundle:{}", file.unwrap_or_default()),
            None,
        )]);
    }
    let mut out = Vec::new();
    for v in &args.stt_variants {
        let r = SttRelease::parse(v)
            .with_context(|| format!("unknown --stt-variants `{v}` (stt-1b, stt-2.6b)"))?;
        for f in &args.formats {
            out.push((r.name().to_string(), f.clone(), Some(parse_format(f)?)));
        }
    }
    Ok(out)
}

fn build(
    args: &BenchArgs,
    variant: &str,
    format: &str,
    fmt: Option<WeightFormat>,
) -> Result<Subject> {
    let t0 = Instant::now();
    let model = match fmt {
        Some(f) => synthetic_stt(SttRelease::parse(variant).expect("parsed"), f)
            .with_context(|| format!("building synthetic {variant} {format}"))?,
        None => {
            let dir = args.bundle.as_ref().expect("bundle subject");
            let b = model::checkpoint::Bundle::open(dir)?;
            SttModel::load(&b, &Pool::new(runtime::physical_cores()))?
        }
    };
    eprintln!(
        "stt {variant} {format}: built in {:.1} s, {:.3} GB streamed per step",
        t0.elapsed().as_secs_f64(),
        model.lm().streamed_weight_bytes() as f64 / 1e9
    );
    Ok(Subject {
        variant: variant.to_string(),
        format: format.to_string(),
        model: Arc::new(model),
    })
}

/// Runs `bench stt`.
pub(super) fn run(args: &BenchArgs, probe: &Probe) -> Result<()> {
    if args.streams.is_empty() || args.streams.contains(&0) {
        bail!("--streams needs positive counts");
    }
    let kv = parse_kv(args.kv.first().map_or("bf16", |k| k.as_str()))?;
    println!(
        "\n## stt: one tick = batched Mimi encode (32 codebooks) + STT step (LM, text argmax, extra heads, word rules) of N streams, ms; real time = {REAL_TIME_MS} ms"
    );
    for (variant, format, fmt) in subjects(args)? {
        let s = build(args, &variant, &format, fmt)?;
        for &threads in &args.threads {
            let pool = Arc::new(Pool::new(threads));
            let mut measured = Vec::new();
            for &n in &args.streams {
                if let Some(cells) = bench_cell(args, &s, &pool, probe, kv, n)? {
                    measured.push((n, cells));
                }
            }
            for (mi, mode) in ["batched", "one"].iter().enumerate() {
                let pts: Vec<(usize, f64)> = measured
                    .iter()
                    .map(|(n, c)| (*n, stats(&c[mi].ms).0))
                    .collect();
                let (k, est) = real_time_streams(&pts);
                println!(
                    "result impl=ours what=stt_realtime variant={} format={} threads={threads} mode={mode} kv={} \
                     streams={k} estimate={est:.1}",
                    s.variant,
                    s.format,
                    kv_name(kv)
                );
            }
        }
    }
    Ok(())
}

/// One (model, threads, N) cell: both modes, interleaved per round. `None` when its KV caches
/// would pass `--stt-max-kv-gb`.
fn bench_cell(
    args: &BenchArgs,
    s: &Subject,
    pool: &Arc<Pool>,
    probe: &Probe,
    kv: KvDtype,
    n: usize,
) -> Result<Option<[Cell; 2]>> {
    let spec = s.model.lm().spec().clone();
    let ticks = args.lm_frames.max(1);
    let warm = 2;
    let total = warm + args.rounds * ticks * 2;
    let pos = args.stt_position.unwrap_or(spec.context).min(spec.context);
    // The ring holds the window the steps read: the context when full, else what the run reaches.
    let capacity = (pos + total + 1).min(spec.context);
    let window = pos.min(spec.context);
    let kv_row = 2 * spec.num_layers * capacity * spec.dim * kv_elt_bytes(kv);
    let kv_gb = (n * kv_row) as f64 / 1e9;
    if kv_gb > args.stt_max_kv_gb {
        println!(
            "# stt {} {} threads={} streams={n}: skipped, its KV caches would take {kv_gb:.1} GB (--stt-max-kv-gb {})",
            s.variant,
            s.format,
            pool.n_threads(),
            args.stt_max_kv_gb
        );
        return Ok(None);
    }
    let mut backend = CpuLm::with_kv_capacity(s.model.lm().clone(), n, kv, capacity, pool.clone())?;
    model::lm::LmBackend::seek_for_bench(&mut backend, pos);
    let mut batch = SttBatch::new(s.model.clone(), Box::new(backend))?;
    let mut encoder = MimiBatchEncoder::new(s.model.mimi().clone(), n);
    // Stream j's frame k: the test signal from frame (k + 3j) on, so the streams differ.
    let signal = test_signal((total + 3 * n + 1) * FRAME, 24_000);
    let mut frames = vec![0.0f32; n * FRAME];
    let rows: Vec<usize> = (0..n).collect();
    let mut events: Vec<(usize, SttEvent)> = Vec::with_capacity(16 * n);
    let mut k = 0usize;
    let fill = |frames: &mut [f32], k: &mut usize| {
        for j in 0..n {
            let f = *k + 3 * j;
            frames[j * FRAME..(j + 1) * FRAME].copy_from_slice(&signal[f * FRAME..(f + 1) * FRAME]);
        }
        *k += 1;
    };
    for _ in 0..warm {
        fill(&mut frames, &mut k);
        tick(&mut batch, &mut encoder, &mut events, &rows, &frames, pool)?;
    }
    let wbytes = s.model.lm().streamed_weight_bytes() as f64;
    let kv_read = (2 * spec.num_layers * window.max(1) * spec.dim * kv_elt_bytes(kv)) as f64;
    let mut cells = [Cell::default(), Cell::default()];
    for _ in 0..args.rounds {
        settle();
        let bw = probe.measure(pool);
        let mut round = [Vec::new(), Vec::new()];
        for _ in 0..ticks {
            for (mi, c) in cells.iter_mut().enumerate() {
                fill(&mut frames, &mut k);
                settle();
                let t = Instant::now();
                let (e, st) = if mi == 0 {
                    tick(&mut batch, &mut encoder, &mut events, &rows, &frames, pool)?
                } else {
                    one_at_a_time(&mut batch, &mut encoder, &mut events, &frames, pool)?
                };
                let ms = t.elapsed().as_secs_f64() * 1e3;
                let reads = if mi == 0 { 1.0 } else { n as f64 };
                let roof = (reads * wbytes + n as f64 * kv_read) / bw / 1e6;
                c.ms.push(ms);
                c.encode.push(e);
                c.step.push(st);
                c.roofline.push(roof);
                c.ratio.push(ms / roof);
                c.probe.push(bw);
                round[mi].push(ms);
            }
        }
        let r = stats(&round[0]).0 / stats(&round[1]).0;
        cells[0].to_one.push(r);
    }
    for (mi, mode) in ["batched", "one"].iter().enumerate() {
        let c = &cells[mi];
        let (m, lo, hi) = stats(&c.ms);
        let med = |v: &[f64]| stats(v).0;
        let to_one = ratio_fields(
            &c.to_one,
            ["ratio_to_one", "ratio_to_one_min", "ratio_to_one_max"],
        );
        println!(
            "result impl=ours what=stt_tick variant={} format={} threads={} streams={n} mode={mode} kv={} pos={pos} \
             ms={m:.1} min={lo:.1} max={hi:.1} n={} encode_ms={:.1} step_ms={:.1} per_stream_ms={:.2} \
             roofline_ms={:.1} ratio_to_roofline={:.2} probe_gbps={:.1}{to_one} real_time={}",
            s.variant,
            s.format,
            pool.n_threads(),
            kv_name(kv),
            c.ms.len(),
            med(&c.encode),
            med(&c.step),
            m / n as f64,
            med(&c.roofline),
            med(&c.ratio),
            med(&c.probe),
            m <= REAL_TIME_MS
        );
    }
    Ok(Some(cells))
}

/// Encode ms and step ms of one tick of `rows` together (`pcm`: their frames side by side).
fn tick(
    batch: &mut SttBatch<CpuLm>,
    encoder: &mut MimiBatchEncoder,
    events: &mut Vec<(usize, SttEvent)>,
    rows: &[usize],
    pcm: &[f32],
    pool: &Pool,
) -> Result<(f64, f64)> {
    events.clear();
    let t0 = Instant::now();
    let codes = encoder.encode_frames(rows, pcm, Some(pool))?;
    let t1 = Instant::now();
    batch.step(rows, codes, events)?;
    let t2 = Instant::now();
    Ok(((t1 - t0).as_secs_f64() * 1e3, (t2 - t1).as_secs_f64() * 1e3))
}

/// The same streams stepped one after the other (a tick of one row each): summed encode and step ms.
fn one_at_a_time(
    batch: &mut SttBatch<CpuLm>,
    encoder: &mut MimiBatchEncoder,
    events: &mut Vec<(usize, SttEvent)>,
    frames: &[f32],
    pool: &Pool,
) -> Result<(f64, f64)> {
    let (mut e, mut st) = (0.0, 0.0);
    for j in 0..frames.len() / FRAME {
        let (a, b) = tick(
            batch,
            encoder,
            events,
            &[j],
            &frames[j * FRAME..(j + 1) * FRAME],
            pool,
        )?;
        e += a;
        st += b;
    }
    Ok((e, st))
}

/// From measured (streams, median tick ms), sorted by streams: the largest measured count whose tick
/// fits in real time, and an estimate of the largest count that would (linear between the last
/// measured count that fits and the first that does not; from the last two points when all fit,
/// from the origin when none does).
pub(crate) fn real_time_streams(pts: &[(usize, f64)]) -> (usize, f64) {
    let mut pts = pts.to_vec();
    pts.sort_by_key(|p| p.0);
    let fits: Vec<&(usize, f64)> = pts.iter().filter(|p| p.1 <= REAL_TIME_MS).collect();
    let k = fits.last().map_or(0, |p| p.0);
    let line = |(n1, t1): (usize, f64), (n2, t2): (usize, f64)| -> f64 {
        if n2 == n1 || t2 <= t1 {
            return n2 as f64;
        }
        n1 as f64 + (REAL_TIME_MS - t1) * (n2 - n1) as f64 / (t2 - t1)
    };
    let est = match pts.iter().position(|p| p.1 > REAL_TIME_MS) {
        None if pts.len() >= 2 => line(pts[pts.len() - 2], pts[pts.len() - 1]),
        None => pts.first().map_or(0.0, |p| p.0 as f64 * REAL_TIME_MS / p.1),
        Some(0) => pts[0].0 as f64 * REAL_TIME_MS / pts[0].1,
        Some(i) => line(pts[i - 1], pts[i]),
    };
    (k, est)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn real_time_streams_interpolate_between_measured_counts() {
        // 8 fit (60 ms), 32 do not (140 ms): 8 + 20 x 24 / 80 = 14.
        let (k, e) = real_time_streams(&[(1, 30.0), (8, 60.0), (32, 140.0)]);
        assert_eq!(k, 8);
        assert!((e - 14.0).abs() < 1e-9, "{e}");
        // None fits: a fraction of one stream.
        let (k, e) = real_time_streams(&[(1, 160.0), (8, 900.0)]);
        assert_eq!(k, 0);
        assert!((e - 0.5).abs() < 1e-9, "{e}");
        // All fit: extrapolated from the last two.
        let (k, e) = real_time_streams(&[(1, 10.0), (8, 40.0)]);
        assert_eq!(k, 8);
        assert!((e - (8.0 + 40.0 * 7.0 / 30.0)).abs() < 1e-9, "{e}");
    }
}
