//! Kernel micro-benchmark: matvec GB/s per weight format next to a plain memory-read
//! probe measured in the same run (interleaved rounds, medians and spread).
//!
//! Run it with `cargo run --release -p moshi-kernels --example kernel_bench` (or call
//! [`run`] from a CLI command). Each sample streams a working set of several distinct
//! copies of the matrix (at least [`BenchOptions::working_set_mb`]) so the weights come
//! from memory, not from the last-level cache.

use std::time::Instant;

use crate::{Matrix, Pool, WeightFormat};

/// What to measure.
#[derive(Debug, Clone)]
pub struct BenchOptions {
    /// Formats to measure.
    pub formats: Vec<WeightFormat>,
    /// Matrix shapes `(rows, cols)`.
    pub shapes: Vec<(usize, usize)>,
    /// Thread counts.
    pub threads: Vec<usize>,
    /// Rounds (each round runs every configuration once, interleaved).
    pub rounds: usize,
    /// Minimum bytes streamed per sample, in MiB (distinct matrix copies).
    pub working_set_mb: usize,
}

impl Default for BenchOptions {
    fn default() -> Self {
        BenchOptions {
            formats: vec![
                WeightFormat::F32,
                WeightFormat::Bf16,
                WeightFormat::Q8_0,
                WeightFormat::Q4_0,
                WeightFormat::MlxAffine { bits: 4, group: 32 },
            ],
            shapes: vec![(4096, 4096), (4096, 11264)],
            threads: vec![1, 2],
            rounds: 9,
            working_set_mb: 384,
        }
    }
}

/// One measured configuration.
#[derive(Debug, Clone)]
pub struct BenchRow {
    /// Weight format.
    pub format: WeightFormat,
    /// `(rows, cols)`.
    pub shape: (usize, usize),
    /// Threads.
    pub threads: usize,
    /// Median weight-stream GB/s over the rounds.
    pub gbps_median: f64,
    /// Lowest and highest GB/s over the rounds.
    pub gbps_range: (f64, f64),
    /// Median microseconds per matvec.
    pub us_median: f64,
    /// Median read-probe GB/s with the same thread count, measured in the same rounds.
    pub read_gbps_median: f64,
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn synth(rows: usize, cols: usize, seed: u64) -> Vec<f32> {
    let mut s = seed | 1;
    (0..rows * cols)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.1
        })
        .collect()
}

/// Streaming read probe: sums `buf` split over the pool's threads; returns GB/s (the memory
/// bandwidth a weight-streaming kernel can reach with that many threads).
pub fn read_probe(pool: &Pool, buf: &[f32]) -> f64 {
    let t0 = Instant::now();
    let nt = pool.n_threads();
    let chunk = buf.len().div_ceil(nt);
    let sink = std::sync::atomic::AtomicU32::new(0);
    pool.run(nt, &|i| {
        let part = &buf[(i * chunk).min(buf.len())..((i + 1) * chunk).min(buf.len())];
        let s = crate::arch::sum_f32(part);
        sink.fetch_add(s.to_bits() & 1, std::sync::atomic::Ordering::Relaxed);
    });
    let dt = t0.elapsed().as_secs_f64();
    std::hint::black_box(sink.load(std::sync::atomic::Ordering::Relaxed));
    (buf.len() * 4) as f64 / dt / 1e9
}

/// Runs the benchmark; returns one row per (format, shape, threads). Progress goes to
/// `log` (for example `|s| eprintln!("{s}")`).
pub fn run(opts: &BenchOptions, log: &dyn Fn(&str)) -> Vec<BenchRow> {
    let pools: Vec<Pool> = opts.threads.iter().map(|&t| Pool::new(t)).collect();
    let probe = vec![1.0f32; opts.working_set_mb * (1 << 20) / 4];
    let mut rows = Vec::new();
    for &format in &opts.formats {
        // Build the working sets of both shapes.
        let sets: Vec<(usize, usize, Vec<Matrix>)> = opts
            .shapes
            .iter()
            .map(|&(r, c)| {
                let vals = synth(r, c, 7);
                let first = Matrix::encode(format, r, c, &vals).expect("synthetic matrix");
                let per = first.weight_bytes();
                let copies = (opts.working_set_mb * (1 << 20)).div_ceil(per).max(2);
                let mut v = vec![first];
                for k in 1..copies {
                    let vals = synth(r, c, 7 + k as u64);
                    v.push(Matrix::encode(format, r, c, &vals).expect("synthetic matrix"));
                }
                (r, c, v)
            })
            .collect();
        log(&format!(
            "{format:?}: built {} matrices",
            sets.iter().map(|s| s.2.len()).sum::<usize>()
        ));
        let max_cols = opts.shapes.iter().map(|s| s.1).max().unwrap_or(0);
        let max_rows = opts.shapes.iter().map(|s| s.0).max().unwrap_or(0);
        let x = synth(1, max_cols, 99);
        let mut y = vec![0f32; max_rows];
        let n_cfg = sets.len() * pools.len();
        let mut samples = vec![Vec::new(); n_cfg];
        let mut probes = vec![Vec::new(); pools.len()];
        for round in 0..opts.rounds + 1 {
            for (pi, pool) in pools.iter().enumerate() {
                let g = read_probe(pool, &probe);
                if round > 0 {
                    probes[pi].push(g);
                }
                for (si, (r, c, ms)) in sets.iter().enumerate() {
                    let t0 = Instant::now();
                    for m in ms {
                        pool.matvec(m, &x[..*c], &mut y[..*r]);
                    }
                    let dt = t0.elapsed().as_secs_f64();
                    let bytes: usize = ms.iter().map(|m| m.weight_bytes()).sum();
                    if round > 0 {
                        samples[si * pools.len() + pi]
                            .push((bytes as f64 / dt / 1e9, dt / ms.len() as f64 * 1e6));
                    }
                }
            }
        }
        std::hint::black_box(&y);
        for (si, (r, c, _)) in sets.iter().enumerate() {
            for (pi, &t) in opts.threads.iter().enumerate() {
                let s = &samples[si * pools.len() + pi];
                let mut g: Vec<f64> = s.iter().map(|v| v.0).collect();
                let mut us: Vec<f64> = s.iter().map(|v| v.1).collect();
                let lo = g.iter().cloned().fold(f64::INFINITY, f64::min);
                let hi = g.iter().cloned().fold(0.0, f64::max);
                let row = BenchRow {
                    format,
                    shape: (*r, *c),
                    threads: t,
                    gbps_median: median(&mut g),
                    gbps_range: (lo, hi),
                    us_median: median(&mut us),
                    read_gbps_median: median(&mut probes[pi].clone()),
                };
                log(&format_row(&row));
                rows.push(row);
            }
        }
    }
    rows
}

fn fmt_name(f: WeightFormat) -> String {
    match f {
        WeightFormat::MlxAffine { bits, group } => format!("mlx-q{bits} g{group}"),
        other => format!("{other:?}").to_lowercase(),
    }
}

fn format_row(r: &BenchRow) -> String {
    format!(
        "| {} | {}x{} | {} | {:.1} | {:.1}–{:.1} | {:.0} | {:.1} | {:.0}% |",
        fmt_name(r.format),
        r.shape.0,
        r.shape.1,
        r.threads,
        r.gbps_median,
        r.gbps_range.0,
        r.gbps_range.1,
        r.us_median,
        r.read_gbps_median,
        100.0 * r.gbps_median / r.read_gbps_median
    )
}

/// A markdown table of the rows.
pub fn markdown(rows: &[BenchRow]) -> String {
    let mut s = String::from(
        "| format | rows x cols | threads | GB/s median | GB/s min–max | µs/matvec median | read probe GB/s | of probe |\n|---|---|---|---|---|---|---|---|\n",
    );
    for r in rows {
        s.push_str(&format_row(r));
        s.push('\n');
    }
    s
}

/// One convolution layer of the Mimi SEANet stack at 24 kHz, per 80 ms frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConvLayer {
    /// A `ConvTranspose1d` (upsampling) rather than a `Conv1d`.
    pub transpose: bool,
    /// Input channels.
    pub cin: usize,
    /// Output channels.
    pub cout: usize,
    /// Kernel size.
    pub k: usize,
    /// Stride.
    pub stride: usize,
    /// Output steps (Conv1d) or input steps (ConvTranspose1d) per frame.
    pub t: usize,
}

impl ConvLayer {
    /// Multiply-adds per frame, times two.
    pub fn flops(&self) -> f64 {
        2.0 * (self.cout * self.cin * self.k * self.t) as f64
    }

    /// The layer with synthetic weights (seed `seed`) and a constant bias, with a synthetic
    /// input of one frame and an output buffer of the right size.
    pub fn build(&self, seed: u64) -> BuiltConv {
        use crate::conv::{Conv1d, ConvTranspose1d};
        let w = synth(1, self.cout * self.cin * self.k, seed);
        let bias = Some(vec![0.1; self.cout]);
        let (conv, t_in, t_out) = if self.transpose {
            let m = ConvTranspose1d::new(w, bias, self.cin, self.cout, self.k, self.stride, 1)
                .expect("bench layer shape");
            let t_out = m.out_len(self.t);
            (AnyConv::T(m), self.t, t_out)
        } else {
            let m = Conv1d::new(w, bias, self.cin, self.cout, self.k, self.stride, 1, 1)
                .expect("bench layer shape");
            (AnyConv::C(m), (self.t - 1) * self.stride + self.k, self.t)
        };
        BuiltConv {
            conv,
            x: synth(self.cin, t_in, 5),
            y: vec![0f32; self.cout * t_out],
        }
    }
}

enum AnyConv {
    C(crate::conv::Conv1d),
    T(crate::conv::ConvTranspose1d),
}

/// A [`ConvLayer`] ready to run: the convolution, its input and its output buffer.
pub struct BuiltConv {
    conv: AnyConv,
    x: Vec<f32>,
    y: Vec<f32>,
}

impl BuiltConv {
    /// Runs the layer once on its input, on `pool` when given.
    pub fn forward(&mut self, pool: Option<&Pool>) {
        let (x, y) = (&self.x, &mut self.y);
        match (&self.conv, pool) {
            (AnyConv::C(m), Some(p)) => m.forward_pool(x, y, p),
            (AnyConv::C(m), None) => m.forward(x, y),
            (AnyConv::T(m), Some(p)) => m.forward_pool(x, y, p),
            (AnyConv::T(m), None) => m.forward(x, y),
        }
        .expect("bench conv");
    }
}

/// The convolution layers of the Mimi SEANet encoder and decoder, in order (some shapes occur
/// more than once).
pub fn mimi_layers() -> Vec<ConvLayer> {
    let c = |cin, cout, k, stride, t| ConvLayer {
        transpose: false,
        cin,
        cout,
        k,
        stride,
        t,
    };
    let ct = |cin, cout, k, stride, t| ConvLayer {
        transpose: true,
        cin,
        cout,
        k,
        stride,
        t,
    };
    vec![
        // encoder
        c(1, 64, 7, 1, 1920),
        c(64, 32, 3, 1, 1920),
        c(32, 64, 1, 1, 1920),
        c(64, 128, 8, 4, 480),
        c(128, 64, 3, 1, 480),
        c(64, 128, 1, 1, 480),
        c(128, 256, 10, 5, 96),
        c(256, 128, 3, 1, 96),
        c(128, 256, 1, 1, 96),
        c(256, 512, 12, 6, 16),
        c(512, 256, 3, 1, 16),
        c(256, 512, 1, 1, 16),
        c(512, 1024, 16, 8, 2),
        c(1024, 512, 3, 1, 2),
        // decoder
        c(512, 1024, 7, 1, 2),
        ct(1024, 512, 16, 8, 2),
        c(512, 256, 3, 1, 16),
        c(256, 512, 1, 1, 16),
        ct(512, 256, 12, 6, 16),
        c(256, 128, 3, 1, 96),
        c(128, 256, 1, 1, 96),
        ct(256, 128, 10, 5, 96),
        c(128, 64, 3, 1, 480),
        c(64, 128, 1, 1, 480),
        ct(128, 64, 8, 4, 480),
        c(64, 32, 3, 1, 1920),
        c(32, 64, 1, 1, 1920),
        c(64, 1, 3, 1, 1920),
    ]
}

/// Result of [`run_mimi_convs`].
#[derive(Debug, Clone)]
pub struct ConvBenchRow {
    /// Threads.
    pub threads: usize,
    /// Median milliseconds per frame for all SEANet convolutions (encoder + decoder).
    pub ms_median: f64,
    /// Lowest and highest ms per frame.
    pub ms_range: (f64, f64),
    /// GFLOP/s at the median.
    pub gflops: f64,
}

/// Times the Mimi SEANet convolution stack (encoder + decoder, per 80 ms frame, the
/// `kernels::conv` GEMM paths; ELUs and transformers excluded) with each thread count.
pub fn run_mimi_convs(threads: &[usize], rounds: usize) -> Vec<ConvBenchRow> {
    let layers = mimi_layers();
    let flops: f64 = layers.iter().map(ConvLayer::flops).sum();
    let mut layers: Vec<BuiltConv> = (1..).zip(&layers).map(|(seed, l)| l.build(seed)).collect();
    let pools: Vec<Pool> = threads.iter().map(|&t| Pool::new(t)).collect();
    let mut samples = vec![Vec::new(); pools.len()];
    for round in 0..rounds + 1 {
        for (pi, pool) in pools.iter().enumerate() {
            let t0 = Instant::now();
            for l in layers.iter_mut() {
                l.forward(Some(pool));
            }
            if round > 0 {
                samples[pi].push(t0.elapsed().as_secs_f64() * 1e3);
            }
        }
    }
    threads
        .iter()
        .zip(samples)
        .map(|(&t, mut s)| {
            let lo = s.iter().cloned().fold(f64::INFINITY, f64::min);
            let hi = s.iter().cloned().fold(0.0, f64::max);
            let med = median(&mut s);
            ConvBenchRow {
                threads: t,
                ms_median: med,
                ms_range: (lo, hi),
                gflops: flops / med / 1e6,
            }
        })
        .collect()
}

/// CPU time consumed by the calling thread, in seconds (Linux `schedstat`; falls back to
/// `None` elsewhere).
fn thread_cpu_s() -> Option<f64> {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    let ns: u64 = s.split_whitespace().next()?.parse().ok()?;
    Some(ns as f64 * 1e-9)
}

/// Result of [`run_hot`]: kernel throughput with the weights cache-resident, per second
/// of the calling thread's CPU time (robust to other processes on a shared machine).
#[derive(Debug, Clone)]
pub struct HotRow {
    /// Weight format.
    pub format: WeightFormat,
    /// Activation rows per call.
    pub n: usize,
    /// Median weights·rows per CPU-second, in billions.
    pub gw_per_s: f64,
    /// The same as GB/s of weight data per CPU-second.
    pub gbps: f64,
}

/// Compute ceiling of each matvec kernel: a 256×4096 matrix (cache-resident) multiplied
/// repeatedly on one thread, timed in thread CPU time (wall time when unavailable).
pub fn run_hot(formats: &[WeightFormat], ns: &[usize], rounds: usize) -> Vec<HotRow> {
    let (rows, cols) = (256usize, 4096usize);
    let vals = synth(rows, cols, 3);
    let ms: Vec<Matrix> = formats
        .iter()
        .map(|&f| Matrix::encode(f, rows, cols, &vals).expect("synthetic matrix"))
        .collect();
    let nmax = ns.iter().copied().max().unwrap_or(1);
    let x = synth(nmax, cols, 4);
    let mut y = vec![0f32; nmax * rows];
    let mut sc = crate::Scratch::new();
    let mut samples = vec![Vec::new(); ms.len() * ns.len()];
    let t_wall = Instant::now();
    let clock = |cpu: Option<f64>| cpu.unwrap_or_else(|| t_wall.elapsed().as_secs_f64());
    for round in 0..rounds + 1 {
        for (ni, &n) in ns.iter().enumerate() {
            for (mi, m) in ms.iter().enumerate() {
                // At least 200 ms of CPU time per sample (schedstat advances in scheduler
                // ticks on some kernels, so short samples would be quantized).
                let t0 = clock(thread_cpu_s());
                let mut it = 0usize;
                let mut el = 0.0;
                while it < 200 || el < 0.2 {
                    for _ in 0..50 {
                        m.matmul(&x[..n * cols], n, &mut y[..n * rows], &mut sc);
                    }
                    it += 50;
                    el = clock(thread_cpu_s()) - t0;
                }
                let dt = el / it as f64;
                if round > 0 && dt > 0.0 {
                    samples[ni * ms.len() + mi].push((
                        (rows * cols * n) as f64 / dt / 1e9,
                        m.weight_bytes() as f64 / dt / 1e9,
                    ));
                }
            }
        }
    }
    std::hint::black_box(&y);
    let mut out = Vec::new();
    for (ni, &n) in ns.iter().enumerate() {
        for (mi, &f) in formats.iter().enumerate() {
            let s = &samples[ni * ms.len() + mi];
            let mut a: Vec<f64> = s.iter().map(|v| v.0).collect();
            let mut b: Vec<f64> = s.iter().map(|v| v.1).collect();
            if a.is_empty() {
                continue;
            }
            out.push(HotRow {
                format: f,
                n,
                gw_per_s: median(&mut a),
                gbps: median(&mut b),
            });
        }
    }
    out
}

/// A markdown table of [`run_hot`] rows.
pub fn markdown_hot(rows: &[HotRow]) -> String {
    let mut s = String::from("| format | activation rows | Gweight·rows per CPU-s | weight GB per CPU-s |\n|---|---|---|---|\n");
    for r in rows {
        s.push_str(&format!(
            "| {} | {} | {:.1} | {:.1} |\n",
            fmt_name(r.format),
            r.n,
            r.gw_per_s,
            r.gbps
        ));
    }
    s
}

/// Pool hand-off latency with `threads` threads: medians and 90th percentiles (µs) of an
/// empty `Pool::run` called back to back (worker spinning) and after 2 ms of idleness
/// (worker parked). Returns `(warm_median, warm_p90, idle_median, idle_p90)`.
pub fn run_pool_latency(threads: usize, calls: usize) -> (f64, f64, f64, f64) {
    let pool = Pool::new(threads);
    let noop = |_: usize| {};
    let n = pool.n_threads();
    let pct = |v: &mut Vec<f64>, p: f64| {
        v.sort_by(|a, b| a.total_cmp(b));
        v[((v.len() - 1) as f64 * p) as usize]
    };
    let mut warm = Vec::with_capacity(calls);
    for _ in 0..calls {
        let t = Instant::now();
        pool.run(n, &noop);
        warm.push(t.elapsed().as_secs_f64() * 1e6);
    }
    let mut idle = Vec::with_capacity(calls / 10 + 1);
    for _ in 0..calls / 10 + 1 {
        std::thread::sleep(std::time::Duration::from_millis(2));
        let t = Instant::now();
        pool.run(n, &noop);
        idle.push(t.elapsed().as_secs_f64() * 1e6);
    }
    (
        pct(&mut warm, 0.5),
        pct(&mut warm, 0.9),
        pct(&mut idle, 0.5),
        pct(&mut idle, 0.9),
    )
}

/// Result of [`run_attention`]: one head-split attention call over a full KV window.
#[derive(Debug, Clone)]
pub struct AttnRow {
    /// KV element type.
    pub dtype: crate::attention::KvDtype,
    /// Kernel path: "avx512", "avx512-nopf" (software prefetch off), "avx2" or "scalar".
    pub path: &'static str,
    /// Median ms per 32 layers (one temporal-transformer frame's attention).
    pub ms_per_frame: f64,
    /// Lowest and highest over the rounds.
    pub range: (f64, f64),
    /// KV GB/s read (keys and values of the window).
    pub gbps: f64,
}

/// Attention over full KV rings at moshiko's temporal shapes (32 heads × 128, window
/// `window`), `layers` distinct rings (more than the last-level cache), one thread,
/// interleaved rounds per (dtype, path). Reported per 32 layers.
pub fn run_attention(window: usize, layers: usize, rounds: usize) -> Vec<AttnRow> {
    use crate::attention::{KvDtype, KvRing};
    let (nh, hd) = (32usize, 128usize);
    let d = nh * hd;
    let kv: Vec<f32> = synth(1, d * 16, 11).iter().map(|v| v * 20.0).collect();
    let q: Vec<f32> = synth(1, d, 12).iter().map(|v| v * 20.0).collect();
    let mut out = vec![0f32; d];
    let mut cfgs: Vec<(KvDtype, &'static str, Vec<KvRing>)> = Vec::new();
    for dtype in [KvDtype::Bf16, KvDtype::F32] {
        let rings: Vec<KvRing> = (0..layers)
            .map(|l| {
                let mut r = KvRing::new(window, nh, hd, dtype).expect("ring");
                for t in 0..window {
                    let o = ((t * 7 + l) % 16) * d;
                    r.push(&kv[o..o + d], &kv[(o + d) % (16 * d)..][..d]);
                }
                r
            })
            .collect();
        cfgs.push((dtype, "", rings));
    }
    let paths: &[&'static str] = if crate::kernel_set() == crate::KernelSet::Avx512 {
        &["avx512", "avx512-nopf", "avx2", "scalar"]
    } else {
        &["avx2", "scalar"]
    };
    let mut samples = vec![Vec::new(); cfgs.len() * paths.len()];
    for round in 0..rounds + 1 {
        for (ci, (_, _, rings)) in cfgs.iter_mut().enumerate() {
            for (pi, &path) in paths.iter().enumerate() {
                crate::set_avx512_allowed(path.starts_with("avx512"));
                crate::set_prefetch_distance(if path == "avx512-nopf" { 0 } else { 4096 });
                let t0 = Instant::now();
                for r in rings.iter_mut() {
                    if path == "scalar" {
                        r.attend_reference(&q, &mut out, window);
                    } else {
                        r.attend(&q, &mut out, window);
                    }
                }
                let dt = t0.elapsed().as_secs_f64() / rings.len() as f64 * 32.0;
                if round > 0 {
                    samples[ci * paths.len() + pi].push(dt * 1e3);
                }
            }
        }
    }
    crate::set_avx512_allowed(true);
    crate::set_prefetch_distance(4096);
    std::hint::black_box(&out);
    let mut rows = Vec::new();
    for (ci, (dtype, _, _)) in cfgs.iter().enumerate() {
        for (pi, &path) in paths.iter().enumerate() {
            let s = &mut samples[ci * paths.len() + pi];
            let lo = s.iter().cloned().fold(f64::INFINITY, f64::min);
            let hi = s.iter().cloned().fold(0.0, f64::max);
            let med = median(s);
            let es = if *dtype == KvDtype::Bf16 { 2.0 } else { 4.0 };
            let bytes = 32.0 * window as f64 * d as f64 * 2.0 * es;
            rows.push(AttnRow {
                dtype: *dtype,
                path,
                ms_per_frame: med,
                range: (lo, hi),
                gbps: bytes / (med * 1e-3) / 1e9,
            });
        }
    }
    rows
}

/// Wrapping sum of `v` (the roofline read probe of `moshi-native bench`): SIMD with software
/// prefetch where the CPU has it, memory-bound on buffers well above the last-level cache.
pub fn sum_u64(v: &[u64]) -> u64 {
    crate::arch::sum_u64(v)
}
