//! `moshi-native bench`: speed at full moshiko dimensions with synthetic weights, each result next to
//! its roofline measured in the same run.
//!
//! * `probe`: plain streaming-read bandwidth (sum of a large buffer split over the pool).
//! * `kernels`: matvec GB/s per weight format and the Mimi conv stack ([`kernels::bench`]).
//! * `lm`: one LM frame (temporal step + text sampling + 8 Depformer steps + their sampling,
//!   i.e. one [`LmGen::step`]) per weight format, thread count and temporal KV position P (reached
//!   with `LmGen::seek_for_bench`), and the batched step of several sessions ([`LmBatchGen`]).
//!   Roofline = (streamed weight bytes + KV bytes read at P) ÷ read-probe bandwidth measured in
//!   the same round and thread count. With `--device gpu` (`--gpu N`): the frame on the adapter as
//!   one sampled step (one submission), against a device copy kernel's bandwidth measured in the
//!   same round, with the dispatches and submissions per frame (`on_gpu.rs`).
//! * `mimi`: streaming encode and decode, ms per 80 ms frame. With `--device gpu`: the codec on
//!   the adapter, one submission per direction, with its dispatches per frame and the device copy
//!   kernel's bandwidth as a weights-only roofline (`on_gpu.rs`).
//! * `duplex`: the product frame pass (a [`runtime::Session`] on its [`runtime::SessionRunner`] worker
//!   thread, fed through its input ring, answered through its event queue), per phase, next to the LM
//!   frame and the Mimi encode + decode timed alone in the same rounds: the overhead ratio. With
//!   `--device gpu --slots N` (N > 1) also the batch driver's tick of N slots against one slot
//!   (`duplex_batch_gpu.rs`).
//! * `stt`: the speech-to-text tick of N streams (one batched 32-codebook Mimi encode + one STT
//!   step), batched against one stream at a time, and the real-time streams (`stt.rs`).
//!
//! Noise handling (2 shared vCPUs): every round runs each thread count once, interleaved, with the
//! read probe re-measured right before the timed frames; medians and min–max over rounds are
//! reported. The 2-thread pool is idle (its worker parked) while 1-thread numbers are taken.
//!
//! Every result is also printed as one machine-readable line starting with `result ` (key=value
//! pairs), which `tools/bench/compare.sh` reads to interleave ours with the baselines.

use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use kernels::attention::KvDtype;
use kernels::{Pool, WeightFormat};
use model::lm::{LmBatchGen, LmFrame, LmGen, LmModel, LmSpec};
use model::mimi::Mimi;

use crate::lm::SyntheticSource;
use model::sampling::{Sampler, SamplerConfig};

mod args;
mod batch;
mod duplex_batch_gpu;
mod feed;
mod on_gpu;
mod stt;

use args::{settle, stats};
pub use args::{BenchArgs, What};
use feed::{duplex_signal, Phases, SessionFeed};

/// The AVX-512 settings each cell is timed with: allowed and forbidden with `--ab-avx512`
/// (interleaved), else one cell with the default.
fn ab_modes(ab_avx512: bool) -> Vec<Option<bool>> {
    if ab_avx512 {
        vec![Some(true), Some(false)]
    } else {
        vec![None]
    }
}

/// The result-line suffix of an AVX-512 setting from [`ab_modes`].
fn simd_label(mode: Option<bool>) -> &'static str {
    match mode {
        Some(true) => " simd=avx512",
        Some(false) => " simd=avx2",
        None => "",
    }
}

/// A buffer for the streaming-read probe.
struct Probe {
    buf: Vec<u64>,
}

impl Probe {
    fn new(mb: usize) -> Probe {
        // Distinct values so no page is shared (zero pages would all map to one frame).
        let n = mb.max(16) * (1 << 20) / 8;
        // Huge pages like the kernels' weight and KV buffers (else the roofline flatters them).
        let mut buf = vec![0u64; n];
        kernels::advise_huge_pages(&buf);
        for (i, v) in buf.iter_mut().enumerate() {
            *v = i as u64;
        }
        Probe { buf }
    }

    /// GB/s of one pass summing the buffer, split over the pool's threads, after an untimed pass: on a
    /// virtual machine whose host reclaims guest memory left idle for tens of seconds (the buffer waits
    /// out a model load), the first pass over it reads at a fraction of the bandwidth while the weights,
    /// read every frame, stay warm.
    fn measure(&self, pool: &Pool) -> f64 {
        self.pass(pool);
        self.pass(pool)
    }

    fn pass(&self, pool: &Pool) -> f64 {
        let nt = pool.n_threads();
        let chunk = self.buf.len().div_ceil(nt);
        let sink = std::sync::atomic::AtomicU64::new(0);
        let t0 = Instant::now();
        pool.run(nt, &|i| {
            let lo = (i * chunk).min(self.buf.len());
            let hi = ((i + 1) * chunk).min(self.buf.len());
            let s = kernels::bench::sum_u64(&self.buf[lo..hi]);
            sink.fetch_add(s, std::sync::atomic::Ordering::Relaxed);
        });
        let dt = t0.elapsed().as_secs_f64();
        std::hint::black_box(sink.load(std::sync::atomic::Ordering::Relaxed));
        (self.buf.len() * 8) as f64 / dt / 1e9
    }
}

fn parse_format(s: &str) -> Result<WeightFormat> {
    Ok(match s.to_ascii_lowercase().as_str() {
        "q8_0" | "q8" => WeightFormat::Q8_0,
        "q4_0" | "q4" => WeightFormat::Q4_0,
        "bf16" => WeightFormat::Bf16,
        "f32" => WeightFormat::F32,
        "mlx-q4" => WeightFormat::MlxAffine { bits: 4, group: 32 },
        "mlx-q8" => WeightFormat::MlxAffine { bits: 8, group: 64 },
        other => bail!("unknown format `{other}` (q8_0, q4_0, bf16, f32, mlx-q4, mlx-q8)"),
    })
}

fn parse_kv(s: &str) -> Result<KvDtype> {
    Ok(match s {
        "f32" => KvDtype::F32,
        "bf16" => KvDtype::Bf16,
        other => bail!("unknown KV type `{other}` (f32, bf16)"),
    })
}

fn kv_name(k: KvDtype) -> &'static str {
    match k {
        KvDtype::F32 => "f32",
        KvDtype::Bf16 => "bf16",
    }
}

fn kv_elt_bytes(k: KvDtype) -> usize {
    match k {
        KvDtype::F32 => 4,
        KvDtype::Bf16 => 2,
    }
}

/// Runs `bench` on `device` (the CLI resolves `--device` / `--gpu N`; only `Device::Gpu`'s adapter is
/// read: the CPU parts take their thread counts from `--threads`).
pub fn run(args: &BenchArgs, device: &runtime::Device) -> Result<()> {
    if args.threads.is_empty() || args.threads.contains(&0) {
        bail!("--threads needs positive counts");
    }
    if args.rounds == 0 {
        bail!("--rounds must be at least 1");
    }
    if let runtime::Device::Gpu { adapter, .. } = *device {
        match args.what {
            What::Lm => {
                print_machine();
                println!(
                    "\n## lm on the GPU: one frame = one sampled step (LmBackend::sampled_step), ms"
                );
                for (label, fmt) in lm_sources(args)? {
                    on_gpu::bench_lm_gpu(args, adapter, &label, fmt)?;
                }
            }
            What::Mimi => {
                print_machine();
                let (mimi, src) = mimi_source(args)?;
                println!(
                    "\n## mimi on the GPU ({src}): streaming ms per 80 ms frame, one submission per direction"
                );
                on_gpu::bench_mimi_gpu(args, adapter, &src, mimi)?;
            }
            What::Duplex => {
                print_machine();
                println!(
                    "\n## duplex on the GPU: frame pass through the session (Mimi encode, LM step, Mimi decode on the device), ms"
                );
                for (label, fmt) in lm_sources(args)? {
                    on_gpu::bench_duplex_gpu(args, adapter, &label, fmt)?;
                }
                if args.slots > 1 {
                    duplex_batch_gpu::run(args, adapter)?;
                }
            }
            _ => bail!("bench --device gpu measures `lm`, `mimi` and `duplex`"),
        }
        return Ok(());
    }
    print_machine();
    let pools: Vec<Pool> = args.threads.iter().map(|&t| Pool::new(t)).collect();
    let probe = Probe::new(args.probe_mb);
    let all = args.what == What::All;
    if all || args.what == What::Probe {
        bench_probe(args, &pools, &probe);
    }
    if all || args.what == What::Kernels {
        bench_kernels(args);
    }
    if all || args.what == What::Mimi {
        bench_mimi(args, &pools)?;
    }
    if all || args.what == What::Lm {
        bench_lm(args, &pools, &probe)?;
    }
    if args.what == What::Batch {
        batch::run(args, &pools)?;
    }
    if args.what == What::Duplex {
        bench_duplex(args, &pools)?;
    }
    if args.what == What::Stt {
        stt::run(args, &probe)?;
    }
    Ok(())
}

fn print_machine() {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "# machine: {cpu}, {cores} logical CPUs, SIMD {:?}, loadavg {}",
        kernels::kernel_set(),
        load.split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    );
}

fn bench_probe(args: &BenchArgs, pools: &[Pool], probe: &Probe) {
    let mut s = vec![Vec::new(); pools.len()];
    for _ in 0..args.rounds.max(3) {
        for (pi, pool) in pools.iter().enumerate() {
            settle();
            s[pi].push(probe.measure(pool));
        }
    }
    println!("\n## read probe ({} MiB, GB/s)", args.probe_mb);
    for (pi, v) in s.iter().enumerate() {
        let (m, lo, hi) = stats(v);
        println!(
            "result impl=ours what=read_probe threads={} gbps={m:.2} min={lo:.2} max={hi:.2} n={}",
            args.threads[pi],
            v.len()
        );
    }
}

fn bench_kernels(args: &BenchArgs) {
    println!("\n## kernels: matvec GB/s vs read probe (kernels::bench)");
    let opts = kernels::bench::BenchOptions {
        threads: args.threads.clone(),
        rounds: args.rounds.max(3),
        ..Default::default()
    };
    let rows = kernels::bench::run(&opts, &|s| eprintln!("{s}"));
    print!("{}", kernels::bench::markdown(&rows));
    println!("\n## kernels: Mimi SEANet conv stack per frame (encoder + decoder)");
    for r in kernels::bench::run_mimi_convs(&args.threads, args.rounds.max(3)) {
        println!(
            "result impl=ours what=mimi_convs threads={} ms={:.3} min={:.3} max={:.3} gflops={:.1}",
            r.threads, r.ms_median, r.ms_range.0, r.ms_range.1, r.gflops
        );
    }
}

/// The codec `bench mimi` times: the bundle's, else synthetic weights at the released Mimi's
/// sizes (8 codebooks); with its label.
fn mimi_source(args: &BenchArgs) -> Result<(Arc<Mimi>, String)> {
    let t0 = Instant::now();
    let (mimi, src) = match &args.bundle {
        Some(dir) => {
            let b = model::checkpoint::Bundle::open(dir)?;
            let w = b.mimi_weights()?;
            (
                Arc::new(Mimi::load(&w, &b.mimi_config, 8)?),
                b.files.mimi.display().to_string(),
            )
        }
        None => (
            crate::mimi::synthetic_mimi(8, 42)?,
            "synthetic in memory".to_string(),
        ),
    };
    eprintln!(
        "mimi: loaded ({src}) in {:.1} s",
        t0.elapsed().as_secs_f64()
    );
    Ok((mimi, src))
}

fn bench_mimi(args: &BenchArgs, pools: &[Pool]) -> Result<()> {
    let (mimi, src) = mimi_source(args)?;
    // The 1-thread path runs without a pool, as the runtime does for threads = 1.
    let pool_of = |pi: usize| (args.threads[pi] > 1).then_some(&pools[pi]);
    for pi in 0..pools.len() {
        crate::mimi::time_frames(&mimi, 2, pool_of(pi))?;
    }
    // Cells: (thread index, AVX-512 allowed) — with --ab-avx512 each thread count is timed
    // with the AVX-512 kernels allowed and forbidden, interleaved within every round.
    let modes = ab_modes(args.ab_avx512);
    let cells: Vec<(usize, Option<bool>)> = (0..pools.len())
        .flat_map(|pi| modes.iter().map(move |&m| (pi, m)))
        .collect();
    let n = cells.len();
    let (mut enc, mut dec, mut sum) = (
        vec![Vec::new(); n],
        vec![Vec::new(); n],
        vec![Vec::new(); n],
    );
    for _ in 0..args.rounds {
        for (ci, &(pi, mode)) in cells.iter().enumerate() {
            if let Some(on) = mode {
                kernels::set_avx512_allowed(on);
            }
            settle();
            let (e, d) = crate::mimi::time_frames(&mimi, args.mimi_frames, pool_of(pi))?;
            sum[ci].extend(e.iter().zip(&d).map(|(a, b)| a + b));
            enc[ci].extend(e);
            dec[ci].extend(d);
        }
    }
    kernels::set_avx512_allowed(true);
    println!(
        "\n## mimi: streaming ms per 80 ms frame ({src}; {} frames x {} rounds)",
        args.mimi_frames, args.rounds
    );
    for (ci, &(pi, mode)) in cells.iter().enumerate() {
        let simd = simd_label(mode);
        for (what, v) in [
            ("mimi_encode", &enc[ci]),
            ("mimi_decode", &dec[ci]),
            ("mimi_encdec", &sum[ci]),
        ] {
            let (m, lo, hi) = stats(v);
            let (_, p10, p90) = {
                let mut s = v.clone();
                s.sort_by(|a, b| a.total_cmp(b));
                let k = s.len();
                (0.0, s[k / 10], s[(k * 9 / 10).min(k - 1)])
            };
            println!(
                "result impl=ours what={what} threads={}{simd} ms={m:.3} min={lo:.3} max={hi:.3} p10={p10:.3} p90={p90:.3} n={}",
                args.threads[pi],
                v.len()
            );
        }
    }
    Ok(())
}

/// Samples of one (position, thread count) cell.
#[derive(Default, Clone)]
struct Cell {
    ms: Vec<f64>,
    ratio: Vec<f64>,
    probe: Vec<f64>,
}

/// The LMs `bench lm` times: the bundle's, else one synthetic LM per format (label, format).
fn lm_sources(args: &BenchArgs) -> Result<Vec<(String, Option<WeightFormat>)>> {
    Ok(match &args.bundle {
        Some(dir) => {
            let lm = model::checkpoint::Bundle::open(dir)?.files.lm;
            let name = lm.file_name().map(|n| n.to_string_lossy().into_owned());
            vec![(format!("bundle:{}", name.unwrap_or_default()), None)]
        }
        None => args
            .formats
            .iter()
            .map(|f| Ok((f.clone(), Some(parse_format(f)?))))
            .collect::<Result<_>>()?,
    })
}

/// Builds one of [`lm_sources`]: synthetic weights of `format` at moshiko's sizes, or the bundle's
/// LM as the product loads it.
fn build_lm(args: &BenchArgs, label: &str, format: Option<WeightFormat>) -> Result<LmModel> {
    let t0 = Instant::now();
    let model = match format {
        Some(format) => {
            LmModel::from_source(&SyntheticSource { format, seed: 1 }, LmSpec::moshiko())
                .with_context(|| format!("building synthetic {label} LM"))?
        }
        None => {
            let dir = args.bundle.as_ref().expect("bundle source");
            let b = model::checkpoint::Bundle::open(dir)?;
            let w = b.lm_weights()?;
            // As the product loads it (`Engine::open`): matrices built on every physical core.
            LmModel::load_on(&w, &b.config.lm, &Pool::new(runtime::physical_cores()))?
        }
    };
    eprintln!(
        "lm {label}: built in {:.1} s, {:.3} GB streamed per frame{}",
        t0.elapsed().as_secs_f64(),
        model.streamed_weight_bytes() as f64 / 1e9,
        kernels::huge_page_share()
    );
    Ok(model)
}

fn bench_lm(args: &BenchArgs, pools: &[Pool], probe: &Probe) -> Result<()> {
    let spec = LmSpec::moshiko();
    let sources = lm_sources(args)?;
    let kvs: Vec<KvDtype> = args.kv.iter().map(|k| parse_kv(k)).collect::<Result<_>>()?;
    let mut positions = args.positions.clone();
    if positions.is_empty() {
        positions.push(0);
    }
    println!(
        "\n## lm: one frame = temporal step + text sampling + 8 Depformer steps (LmGen::step), ms"
    );
    for (label, fmt) in sources {
        let model = build_lm(args, &label, fmt)?;
        let wbytes = model.streamed_weight_bytes();
        let user: Vec<u32> = (0..spec.n_user() as u32).map(|i| 100 + 37 * i).collect();
        let n = pools.len();
        // One generator per KV type in turn (a 3000-entry temporal cache is 1.6 GB in bf16,
        // 3.1 GB in f32), so only one is resident next to the weights.
        for (ki, &kv) in kvs.iter().enumerate() {
            let mut gen = LmGen::new(&model, kv)?;
            let mut sampler = Sampler::new(SamplerConfig::default(), spec.text_card, spec.card)?;
            // Batched step (position 0, first KV type only): only where the weights are small
            // enough for the extra KV caches.
            let nb = args.batch;
            let mut batch = if ki == 0 && nb > 1 && wbytes < 9_000_000_000 {
                Some((
                    LmBatchGen::new(&model, nb, KvDtype::Bf16)?,
                    (0..nb)
                        .map(|_| Sampler::new(SamplerConfig::default(), spec.text_card, spec.card))
                        .collect::<Result<Vec<_>, _>>()?,
                    user.repeat(nb),
                    vec![None::<LmFrame>; nb],
                ))
            } else {
                None
            };
            // Warm-up: one frame per pool.
            for pool in pools {
                gen.step(&model, &user, &mut sampler, pool)?;
                if let Some((bg, samplers, codes, out)) = batch.as_mut() {
                    bg.step(&model, codes, samplers, pool, out)?;
                }
            }
            // A/B of the AVX-512 kernels (in-process, interleaved per round and pool).
            let modes = ab_modes(args.ab_avx512);
            let nm = modes.len();
            let mut cells = vec![vec![Cell::default(); n * nm]; positions.len()];
            let mut batch_ms = vec![Vec::new(); n * nm];
            let mut batch_pair = vec![Vec::new(); n * nm];
            for _ in 0..args.rounds {
                for (pi0, pool) in pools.iter().enumerate() {
                    settle();
                    let bw = probe.measure(pool);
                    settle();
                    for (mi, mode) in modes.iter().enumerate() {
                        let pi = pi0 * nm + mi;
                        if let Some(on) = mode {
                            kernels::set_avx512_allowed(*on);
                        }
                        for (qi, &pos) in positions.iter().enumerate() {
                            // Real position: the KV rings hold min(pos, context) entries (LM owner's
                            // benchmark helper), so attention reads the real window.
                            gen.seek_for_bench(pos);
                            for _ in 0..args.lm_frames {
                                let window = (gen.state().position() + 1).min(spec.context);
                                let kv_bytes =
                                    2 * spec.num_layers * window * spec.dim * kv_elt_bytes(kv);
                                let t = Instant::now();
                                gen.step(&model, &user, &mut sampler, pool)?;
                                let ms = t.elapsed().as_secs_f64() * 1e3;
                                let c = &mut cells[qi][pi];
                                c.ms.push(ms);
                                c.probe.push(bw);
                                c.ratio.push(ms / ((wbytes + kv_bytes) as f64 / bw / 1e6));
                                if pos == 0 {
                                    if let Some((bg, samplers, codes, out)) = batch.as_mut() {
                                        let t = Instant::now();
                                        bg.step(&model, codes, samplers, pool, out)?;
                                        let b = t.elapsed().as_secs_f64() * 1e3;
                                        batch_ms[pi].push(b);
                                        batch_pair[pi].push(b / ms);
                                    }
                                }
                            }
                        }
                    }
                }
            }
            kernels::set_avx512_allowed(true);
            let simd = |pi: usize| simd_label(modes[pi % nm]);
            for (qi, &pos) in positions.iter().enumerate() {
                for (pi, c) in cells[qi].iter().enumerate() {
                    let th = args.threads[pi / nm];
                    let (m, lo, hi) = stats(&c.ms);
                    let (bw, bwlo, bwhi) = stats(&c.probe);
                    let (r, rlo, rhi) = stats(&c.ratio);
                    let window = (pos + 1).min(spec.context);
                    let kv_bytes = 2 * spec.num_layers * window * spec.dim * kv_elt_bytes(kv);
                    let roof = (wbytes + kv_bytes) as f64 / bw / 1e6;
                    println!(
                        "result impl=ours what=lm_frame format={label} threads={th} pos={pos} kv={} ms={m:.1} min={lo:.1} \
                         max={hi:.1} n={} weight_gb={:.3} kv_gb={:.3} probe_gbps={bw:.2} probe_min={bwlo:.2} \
                         probe_max={bwhi:.2} roofline_ms={roof:.1} ratio={r:.2} ratio_min={rlo:.2} ratio_max={rhi:.2}{}",
                        kv_name(kv),
                        c.ms.len(),
                        wbytes as f64 / 1e9,
                        kv_bytes as f64 / 1e9,
                        simd(pi),
                    );
                }
            }
            for pi in 0..n * nm {
                if batch_ms[pi].is_empty() {
                    continue;
                }
                let (bm, blo, bhi) = stats(&batch_ms[pi]);
                // Paired: each batched step against the single-session frame just before it.
                let (r, rlo, rhi) = stats(&batch_pair[pi]);
                println!(
                    "result impl=ours what=lm_batch format={label} threads={} pos=0 sessions={nb} ms={bm:.1} \
                     min={blo:.1} max={bhi:.1} ratio_to_single={r:.2} ratio_min={rlo:.2} ratio_max={rhi:.2} n={}{}",
                    args.threads[pi / nm],
                    batch_pair[pi].len(),
                    simd(pi)
                );
            }
        }
        drop(model);
    }
    Ok(())
}

/// The LM and Mimi of `bench duplex`, as an engine (the tokenizer included, so detokenization runs).
fn duplex_sources(args: &BenchArgs, kv: KvDtype) -> Result<Vec<(String, Arc<runtime::Engine>)>> {
    let opts = runtime::EngineOptions {
        device: runtime::Device::Cpu {
            threads: args.threads[0],
        },
        kv_dtype: kv,
    };
    duplex_parts(args)?
        .into_iter()
        .map(|(label, p)| {
            let engine = runtime::Engine::from_parts(p.lm, p.mimi, p.tokenizer, opts.clone())?;
            Ok((label, engine))
        })
        .collect()
}

/// The components of one `bench duplex` engine.
pub(crate) struct DuplexParts {
    /// The LM.
    pub lm: LmModel,
    /// The codec.
    pub mimi: Arc<Mimi>,
    /// The tokenizer (detokenization runs in the frame pass).
    pub tokenizer: Option<Arc<model::text::SentencePiece>>,
}

/// The LM, Mimi and tokenizer of `bench duplex`: the bundle's (`--bundle`), else synthetic moshiko
/// LMs in each `--formats` with a synthetic Mimi and a tiny tokenizer.
pub(crate) fn duplex_parts(args: &BenchArgs) -> Result<Vec<(String, DuplexParts)>> {
    if let Some(dir) = &args.bundle {
        let t0 = Instant::now();
        let name = model::checkpoint::Bundle::open(dir)?
            .files
            .lm
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let m = model::MoshiModel::open_on(dir, &Pool::new(runtime::physical_cores()))
            .with_context(|| format!("opening the bundle {}", dir.display()))?;
        eprintln!(
            "duplex: bundle {} opened in {:.1} s",
            dir.display(),
            t0.elapsed().as_secs_f64()
        );
        let parts = DuplexParts {
            lm: m.lm,
            mimi: Arc::new(m.mimi),
            tokenizer: Some(Arc::new(m.tokenizer)),
        };
        return Ok(vec![(format!("bundle:{name}"), parts)]);
    }
    let spec = LmSpec::moshiko();
    let mut out = Vec::new();
    for f in &args.formats {
        let t0 = Instant::now();
        let lm = LmModel::from_source(
            &SyntheticSource {
                format: parse_format(f)?,
                seed: 1,
            },
            spec.clone(),
        )
        .with_context(|| format!("building synthetic {f} LM"))?;
        let mimi = crate::mimi::synthetic_mimi(8, 42)?;
        let spm = model::text::SentencePiece::from_bytes(&crate::synth::tiny_spm(spec.text_card))?;
        eprintln!(
            "duplex: synthetic {f} built in {:.1} s",
            t0.elapsed().as_secs_f64()
        );
        let parts = DuplexParts {
            lm,
            mimi,
            tokenizer: Some(Arc::new(spm)),
        };
        out.push((f.clone(), parts));
    }
    Ok(out)
}

/// Samples of one thread count of `bench duplex`.
#[derive(Default, Clone)]
struct DuplexCell {
    /// The frames through the session.
    phases: Phases,
    /// Timed alone, interleaved with the pass.
    lm_alone: Vec<f64>,
    mimi_alone: Vec<f64>,
    /// Per round: median pass (push to answer) ÷ (median LM alone + median Mimi alone).
    overhead: Vec<f64>,
    /// Pool dispatches (hand-offs to the workers) per LM frame and per Mimi encode + decode: the
    /// synchronisation points of a frame, which cost more the more threads take part.
    lm_dispatches: u32,
    mimi_dispatches: u32,
    /// Minor page faults (whole process) per LM frame alone and per frame through the session.
    lm_faults: Vec<f64>,
    pass_faults: Vec<f64>,
}

/// Minor page faults of this process so far (`/proc/self/stat`, field 10; 0 where unreadable). Read
/// between timed sections only: a fault in a frame pass is a kernel entry the pass should not need.
fn minor_faults() -> u64 {
    std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|s| {
            // Fields after the command name, which is in parentheses and may hold spaces.
            let rest = s.rsplit_once(')')?.1;
            rest.split_whitespace().nth(7)?.parse().ok()
        })
        .unwrap_or(0)
}

/// `bench duplex`: rounds of (LM frame alone, Mimi encode + decode alone, frames through the session),
/// every thread count once per round.
fn bench_duplex(args: &BenchArgs, pools: &[Pool]) -> Result<()> {
    let kv = parse_kv(args.kv.first().map_or("bf16", |k| k.as_str()))?;
    let frames = args.duplex_frames.max(1);
    println!(
        "\n## duplex: frame pass through the session (worker thread, input ring, event queue) vs its parts alone, ms"
    );
    for (label, base) in duplex_sources(args, kv)? {
        let spec = base.lm_spec().clone();
        let cpu_model = base.cpu_lm().context("a CPU engine holds its LM")?;
        let n = pools.len();
        let mut sessions = Vec::with_capacity(n);
        for &t in &args.threads {
            let engine = base.with_options(runtime::EngineOptions {
                device: runtime::Device::Cpu { threads: t },
                kv_dtype: kv,
            })?;
            sessions.push(SessionFeed::start(engine, args.output_rate)?);
        }
        let mut gen = LmGen::new(&cpu_model, kv)?;
        let mut sampler = Sampler::new(SamplerConfig::default(), spec.text_card, spec.card)?;
        let user: Vec<u32> = (0..spec.n_user() as u32)
            .map(|i| (100 + 37 * i) % spec.card as u32)
            .collect();
        let pcm = duplex_signal(frames, args.rounds);
        // Warm-up: three frames per session (call 0 decodes nothing), one LM frame and a few Mimi frames
        // per pool.
        let pool_of = |pi: usize| (args.threads[pi] > 1).then_some(&pools[pi]);
        for (pi, pool) in pools.iter().enumerate() {
            for _ in 0..3 {
                sessions[pi].pass(&pcm)?;
            }
            gen.step(&cpu_model, &user, &mut sampler, pool)?;
            crate::mimi::time_frames(base.mimi(), 2, pool_of(pi))?;
        }
        let mut cells = vec![DuplexCell::default(); n];
        for round in 0..args.rounds {
            for (pi, pool) in pools.iter().enumerate() {
                let c = &mut cells[pi];
                settle();
                // The LM alone at the session's position (its KV window, so attention reads as much).
                let mut lm = Vec::new();
                for _ in 0..args.lm_frames.max(1) {
                    gen.seek_for_bench(sessions[pi].processed() as usize);
                    let f0 = minor_faults();
                    let d0 = pool.dispatches();
                    let t = Instant::now();
                    gen.step(&cpu_model, &user, &mut sampler, pool)?;
                    lm.push(t.elapsed().as_secs_f64() * 1e3);
                    c.lm_dispatches = pool.dispatches().wrapping_sub(d0);
                    c.lm_faults.push(minor_faults().saturating_sub(f0) as f64);
                }
                settle();
                let d0 = pool.dispatches();
                let mimi_frames = args.mimi_frames.max(1);
                let (e, d) = crate::mimi::time_frames(base.mimi(), mimi_frames, pool_of(pi))?;
                c.mimi_dispatches = pool.dispatches().wrapping_sub(d0) / mimi_frames as u32;
                let mimi: Vec<f64> = e.iter().zip(&d).map(|(a, b)| a + b).collect();
                settle();
                let first = c.phases.e2e.len();
                for k in 0..frames {
                    let f0 = minor_faults();
                    let (total, t) = sessions[pi].pass(&pcm)?;
                    c.pass_faults.push(minor_faults().saturating_sub(f0) as f64);
                    if args.per_frame {
                        eprintln!(
                            "frame format={label} threads={} round={round} i={k} {}",
                            args.threads[pi],
                            Phases::frame_text(total, &t)
                        );
                    }
                    c.phases.push(total, &t);
                }
                let e2e = &c.phases.e2e[first..];
                c.overhead
                    .push(stats(e2e).0 / (stats(&lm).0 + stats(&mimi).0));
                c.lm_alone.extend(lm);
                c.mimi_alone.extend(mimi);
            }
        }
        for (pi, c) in cells.iter().enumerate() {
            let p = &c.phases;
            let (m, lo, hi) = stats(&p.e2e);
            let (o, olo, ohi) = stats(&c.overhead);
            let med = |v: &[f64]| stats(v).0;
            let parts = med(&c.lm_alone) + med(&c.mimi_alone);
            println!(
                "result impl=ours what=duplex_frame format={label} threads={} kv={} output_rate={} ms={m:.1} min={lo:.1} \
                 max={hi:.1} n={} pass_ms={:.1} parts_ms={parts:.1} lm_alone_ms={:.1} mimi_alone_ms={:.2} \
                 overhead={o:.3} overhead_min={olo:.3} overhead_max={ohi:.3} rounds={} {} pos={} lm_dispatches={} \
                 mimi_dispatches={} lm_faults={} pass_faults={}",
                args.threads[pi],
                kv_name(kv),
                args.output_rate,
                p.e2e.len(),
                med(&p.pass),
                med(&c.lm_alone),
                med(&c.mimi_alone),
                c.overhead.len(),
                p.medians_text(),
                sessions[pi].processed(),
                c.lm_dispatches,
                c.mimi_dispatches,
                med(&c.lm_faults),
                med(&c.pass_faults),
            );
        }
        for feed in sessions {
            feed.stop()?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sum_matches_naive_wrapping_sum_at_every_tail_length() {
        let v: Vec<u64> = (0..1000u64)
            .map(|i| i.wrapping_mul(0x9E37_79B9_7F4A_7C15))
            .collect();
        for n in [0, 1, 7, 31, 32, 33, 64, 255, 1000] {
            let naive = v[..n].iter().fold(0u64, |a, &b| a.wrapping_add(b));
            assert_eq!(kernels::bench::sum_u64(&v[..n]), naive, "n = {n}");
        }
    }

    #[test]
    fn minor_faults_count_first_touches() {
        let before = minor_faults();
        assert!(before > 0, "a running process has faulted pages in");
        // 64 MiB of fresh pages, each written once (at least 16 faults even with 2 MiB huge pages).
        let mut v = vec![0u8; 64 << 20];
        for p in v.chunks_mut(4096) {
            p[0] = 1;
        }
        std::hint::black_box(&v);
        assert!(minor_faults() >= before + 16);
    }

    #[test]
    fn format_and_kv_names_parse() {
        assert_eq!(parse_format("q8_0").unwrap(), WeightFormat::Q8_0);
        assert_eq!(parse_format("Q4_0").unwrap(), WeightFormat::Q4_0);
        assert_eq!(
            parse_format("mlx-q4").unwrap(),
            WeightFormat::MlxAffine { bits: 4, group: 32 }
        );
        assert!(parse_format("q5_k").is_err());
        assert_eq!(parse_kv("bf16").unwrap(), KvDtype::Bf16);
        assert!(parse_kv("f16").is_err());
    }

    #[test]
    fn probe_reads_the_whole_buffer_on_any_pool() {
        let p = Probe::new(16);
        for t in [1, 2] {
            let g = p.measure(&Pool::new(t));
            assert!(g.is_finite() && g > 0.0);
        }
    }
}
