//! Side-by-side baseline for `moshi-native bench`: Kyutai's Rust `moshi` crate 0.6.4 (candle 0.9),
//! built with `-C target-cpu=native` (see `.cargo/config.toml`), timing its own streaming steps on
//! the same synthetic weights `moshi-native synth` writes.
//!
//! ```text
//! moshi-native-baselines lm   --gguf BUNDLE/model.q8.gguf [--threads 1,2] [--frames 4] [--rounds 3] [--positions 0,375,3000]
//! moshi-native-baselines mimi --weights BUNDLE/tokenizer-...safetensors [--threads 1,2] [--frames 20] [--rounds 3]
//! ```
//!
//! Output (stdout), one line per timed frame and one summary line per configuration:
//! `frame impl=candle what=lm_frame threads=2 pos=375 round=0 ms=712.345`
//! `median impl=candle what=lm_frame threads=2 pos=375 ms=710.0 min=700.1 max=731.9 n=12`
//! Thread counts are interleaved inside each round (one rayon pool per count; candle's parallel
//! loops run in the pool they are called from).
//!
//! **KV positions** (`lm --positions`). Before every timed LM frame at position P the temporal
//! transformer's 32 per-layer KV caches are replaced by candle's own `RotatingKvCache` (context 3000,
//! as `moshi` builds it) into which one chunk of P zero keys and values (f32 `[1, 32, P, 128]`, the
//! dtype candle attends in on CPU) was appended: the cache then holds `min(P, 3000)` entries, its
//! write offset and length are what P single steps would leave, and the next step uses RoPE position
//! P and attends over all of them, like ours after `LmGen::seek_for_bench(P)` (also zero entries;
//! the values do not change the cost). The `moshi` crate keeps its caches private, so
//! `patch-moshi.sh` appends three small accessors to a copy of it (see there). The alternatives
//! cost far more: P real steps take P × ~1 s, and a P-token prefill is no cheaper because candle's
//! CPU q8_0 matmul streams the whole weight matrix once per token row
//! (`candle_core::quantized::k_quants::matmul`), i.e. ~P weight passes (~45 min for P = 3000).

use std::time::Instant;

use anyhow::{bail, Context, Result};
use candle::{DType, Device, Tensor};
use candle_transformers::generation::{LogitsProcessor, Sampling};
use moshi::streaming::{StreamMask, StreamTensor};

struct Opts {
    what: String,
    path: String,
    threads: Vec<usize>,
    frames: usize,
    rounds: usize,
    positions: Vec<usize>,
}

fn parse_args() -> Result<Opts> {
    let mut args = std::env::args().skip(1);
    let what = args
        .next()
        .context("usage: moshi-native-baselines lm|mimi ...")?;
    let mut o = Opts {
        what,
        path: String::new(),
        threads: vec![1, 2],
        frames: 0,
        rounds: 3,
        positions: vec![0],
    };
    while let Some(a) = args.next() {
        let mut val = || args.next().with_context(|| format!("{a} needs a value"));
        match a.as_str() {
            "--gguf" | "--weights" => o.path = val()?,
            "--threads" => {
                o.threads = val()?
                    .split(',')
                    .map(|s| s.trim().parse())
                    .collect::<Result<_, _>>()?
            }
            "--positions" => {
                o.positions = val()?
                    .split(',')
                    .map(|s| s.trim().parse())
                    .collect::<Result<_, _>>()?
            }
            "--frames" => o.frames = val()?.parse()?,
            "--rounds" => o.rounds = val()?.parse()?,
            other => bail!("unknown argument {other}"),
        }
    }
    if o.path.is_empty() {
        bail!("--gguf / --weights is required");
    }
    if o.frames == 0 {
        o.frames = if o.what == "lm" { 4 } else { 20 };
    }
    Ok(o)
}

fn stats(v: &mut [f64]) -> (f64, f64, f64) {
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    // Median: the mean of the two middle values for an even count.
    let med = if n % 2 == 1 {
        v[n / 2]
    } else {
        0.5 * (v[n / 2 - 1] + v[n / 2])
    };
    (med, v[0], v[n - 1])
}

fn report(what: &str, threads: &[usize], samples: &mut [Vec<f64>]) {
    report_at(what, threads, None, samples)
}

/// Median lines; `pos` (LM KV position) is printed when given.
fn report_at(what: &str, threads: &[usize], pos: Option<usize>, samples: &mut [Vec<f64>]) {
    let pos = pos.map(|p| format!(" pos={p}")).unwrap_or_default();
    for (t, s) in threads.iter().zip(samples.iter_mut()) {
        if s.is_empty() {
            continue;
        }
        let n = s.len();
        let (m, lo, hi) = stats(s);
        println!(
            "median impl=candle what={what} threads={t}{pos} ms={m:.3} min={lo:.3} max={hi:.3} n={n}"
        );
    }
}

/// Puts the temporal transformer at KV position `pos`: every layer gets a fresh `RotatingKvCache`
/// (candle's own type, context as configured) holding `pos` zero entries appended as one chunk
/// (see the module docs). `pos = 0` is an empty cache, as after `reset_state`. Returns the cache
/// length the transformer reports afterwards (its next RoPE position).
fn seek_kv(state: &mut moshi::lm_generate_multistream::State, pos: usize) -> Result<usize> {
    let tr = state
        .bench_model_mut()
        .bench_temporal_mut()
        .context("the model has no (non-batched) temporal transformer")?;
    let (layers, heads, context) = tr.bench_dims();
    // moshiko: d_model 4096 over 32 heads; K/V are f32 on CPU (candle's matmul dtype there).
    let head_dim = 4096 / heads;
    let zeros = if pos > 0 {
        Some(Tensor::zeros(
            (1, heads, pos, head_dim),
            DType::F32,
            &Device::Cpu,
        )?)
    } else {
        None
    };
    tr.bench_set_kv_caches(|_layer| {
        let mut c = candle_nn::kv_cache::RotatingKvCache::new(2, context);
        if let Some(z) = &zeros {
            c.append(z, z)?;
        }
        Ok(moshi::kv_cache::KvCache::Rotating(c))
    })?;
    let len = tr.bench_kv_len();
    if len != pos {
        bail!("KV caches hold {len} entries after seeking to {pos} ({layers} layers)");
    }
    Ok(len)
}

fn pools(threads: &[usize]) -> Result<Vec<rayon::ThreadPool>> {
    threads
        .iter()
        .map(|&n| {
            rayon::ThreadPoolBuilder::new()
                .num_threads(n)
                .build()
                .map_err(anyhow::Error::from)
        })
        .collect()
}

fn bench_lm(o: &Opts) -> Result<()> {
    let dev = Device::Cpu;
    let t0 = Instant::now();
    // Moshi's released streaming configuration: 8 generated + 8 user codebooks, 8 Depformer slices.
    let cfg = moshi::lm::Config::v0_1_streaming(8);
    let model = moshi::lm::load_lm_model(cfg, &o.path, DType::F32, &dev)?;
    eprintln!(
        "candle lm: loaded {} in {:.1} s",
        o.path,
        t0.elapsed().as_secs_f64()
    );
    let total = (o.rounds * o.positions.len() + 1) * o.threads.len() * o.frames + 8;
    // Python/server defaults: text top-k 25 at 0.7, audio top-k 250 at 0.8.
    let audio_lp = LogitsProcessor::from_sampling(
        42,
        Sampling::TopK {
            k: 250,
            temperature: 0.8,
        },
    );
    let text_lp = LogitsProcessor::from_sampling(
        43,
        Sampling::TopK {
            k: 25,
            temperature: 0.7,
        },
    );
    let mut state = moshi::lm_generate_multistream::State::new(
        model,
        total,
        audio_lp,
        text_lp,
        None,
        None,
        None,
        moshi::lm_generate_multistream::Config::v0_1(),
    );
    let pools = pools(&o.threads)?;
    let user: Vec<u32> = (0..8).map(|i| 100 + 37 * i).collect();
    let mut text = 32000u32;
    // samples[position][thread count]
    let mut samples = vec![vec![Vec::new(); o.threads.len()]; o.positions.len()];
    // Round 0 is warm-up (one frame per thread count, at the first position). Every timed frame
    // starts from caches holding exactly its position's entries (`seek_kv`, not timed).
    for round in 0..=o.rounds {
        for (qi, &pos) in o.positions.iter().enumerate() {
            if round == 0 && qi > 0 {
                break;
            }
            for (pi, pool) in pools.iter().enumerate() {
                let n = if round == 0 { 1 } else { o.frames };
                for _ in 0..n {
                    let t = Instant::now();
                    let at = seek_kv(&mut state, pos)?;
                    let seek_ms = t.elapsed().as_secs_f64() * 1e3;
                    let t = Instant::now();
                    text = pool.install(|| state.step(text, &user, None, None))?;
                    let ms = t.elapsed().as_secs_f64() * 1e3;
                    if round > 0 {
                        println!(
                            "frame impl=candle what=lm_frame threads={} pos={pos} round={} kv_len={at} step_idx={} seek_ms={seek_ms:.1} ms={ms:.3}",
                            o.threads[pi],
                            round - 1,
                            state.step_idx() - 1
                        );
                        samples[qi][pi].push(ms);
                    }
                }
            }
        }
    }
    for (qi, &pos) in o.positions.iter().enumerate() {
        report_at("lm_frame", &o.threads, Some(pos), &mut samples[qi]);
    }
    Ok(())
}

fn bench_mimi(o: &Opts) -> Result<()> {
    let dev = Device::Cpu;
    let t0 = Instant::now();
    let mut mimi = moshi::mimi::load(&o.path, Some(8), &dev)?;
    eprintln!(
        "candle mimi: loaded {} in {:.1} s",
        o.path,
        t0.elapsed().as_secs_f64()
    );
    let pools = pools(&o.threads)?;
    let fs = 1920usize;
    // A deterministic chirp, like ours (the values do not change the cost).
    let n = fs * o.frames.max(1);
    let pcm: Vec<f32> = (0..n)
        .map(|i| {
            let t = i as f64 / 24000.0;
            (0.5 * (2.0 * std::f64::consts::PI * (100.0 + 1000.0 * t) * t).sin()) as f32
        })
        .collect();
    let mask = StreamMask::empty();
    let mut enc = vec![Vec::new(); o.threads.len()];
    let mut dec = vec![Vec::new(); o.threads.len()];
    for round in 0..=o.rounds {
        for (pi, pool) in pools.iter().enumerate() {
            // Each (round, threads) block is a fresh stream, as ours is.
            mimi.reset_state();
            let frames = if round == 0 { 2 } else { o.frames };
            for f in 0..frames {
                let x =
                    Tensor::from_slice(&pcm[(f % o.frames.max(1)) * fs..][..fs], (1, 1, fs), &dev)?;
                let (te, td) = pool.install(|| -> Result<(f64, f64)> {
                    let t = Instant::now();
                    let codes = mimi.encode_step(&StreamTensor::from_tensor(x), &mask)?;
                    let te = t.elapsed().as_secs_f64() * 1e3;
                    let t = Instant::now();
                    let out = mimi.decode_step(&codes, &mask)?;
                    if let Some(o) = out.as_option() {
                        // Force the result (candle is eager; this is a no-op copy check).
                        std::hint::black_box(o.dims());
                    }
                    Ok((te, t.elapsed().as_secs_f64() * 1e3))
                })?;
                if round > 0 {
                    let th = o.threads[pi];
                    println!(
                        "frame impl=candle what=mimi_encode threads={th} round={} ms={te:.3}",
                        round - 1
                    );
                    println!(
                        "frame impl=candle what=mimi_decode threads={th} round={} ms={td:.3}",
                        round - 1
                    );
                    enc[pi].push(te);
                    dec[pi].push(td);
                }
            }
        }
    }
    report("mimi_encode", &o.threads, &mut enc);
    report("mimi_decode", &o.threads, &mut dec);
    let mut sum: Vec<Vec<f64>> = enc
        .iter()
        .zip(&dec)
        .map(|(e, d)| e.iter().zip(d).map(|(a, b)| a + b).collect())
        .collect();
    report("mimi_encdec", &o.threads, &mut sum);
    Ok(())
}

fn main() -> Result<()> {
    let o = parse_args()?;
    match o.what.as_str() {
        "lm" => bench_lm(&o),
        "mimi" => bench_mimi(&o),
        w => bail!("unknown benchmark {w} (lm, mimi)"),
    }
}
