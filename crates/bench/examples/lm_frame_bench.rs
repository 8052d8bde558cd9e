//! LM frame benchmark at full moshiko dimensions with synthetic weights.
//!
//! One frame = `LmGen::step`: temporal step (32 layers + text head), text sampling, 8 Depformer
//! steps with audio sampling. Measured at KV positions ~0, ~375 and ~3000 (bf16 KV cache), with 1
//! and 2 threads, interleaved round by round with a memory-read probe using the same thread count.
//!
//! ```text
//! cargo run --release -p moshi-bench --example lm_frame_bench -- [FORMATS] [ROUNDS] [POSITIONS] [THREADS]
//! cargo run --release -p moshi-bench --example lm_frame_bench -- bf16,q8_0,q4_0 5 0,375,3000 1,2
//! ```
//! Prints a Markdown table (medians and min–max over the rounds).

use std::time::Instant;

use bench::lm::SyntheticSource;
use kernels::bench::read_probe;
use kernels::{Pool, WeightFormat};
use model::lm::{KvDtype, LmGen, LmModel, LmSpec};
use model::sampling::{Sampler, SamplerConfig};

fn parse_format(s: &str) -> WeightFormat {
    match s {
        "f32" => WeightFormat::F32,
        "bf16" => WeightFormat::Bf16,
        "f16" => WeightFormat::F16,
        "q8_0" | "q8" => WeightFormat::Q8_0,
        "q4_0" | "q4" => WeightFormat::Q4_0,
        "mlx-q4" => WeightFormat::MlxAffine { bits: 4, group: 32 },
        "mlx-q8" => WeightFormat::MlxAffine { bits: 8, group: 64 },
        o => panic!("unknown format {o}"),
    }
}

fn list<T: std::str::FromStr>(s: &str) -> Vec<T>
where
    T::Err: std::fmt::Debug,
{
    s.split(',').map(|x| x.trim().parse().unwrap()).collect()
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        0.5 * (v[n / 2 - 1] + v[n / 2])
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let formats: Vec<WeightFormat> = args
        .first()
        .map_or("bf16,q8_0,q4_0", |s| s.as_str())
        .split(',')
        .map(parse_format)
        .collect();
    let rounds: usize = args.get(1).map_or(5, |s| s.parse().unwrap());
    let positions: Vec<usize> = list(args.get(2).map_or("0,375,3000", |s| s.as_str()));
    let threads: Vec<usize> = list(args.get(3).map_or("1,2", |s| s.as_str()));
    let spec = LmSpec::moshiko();
    let pools: Vec<Pool> = threads.iter().map(|&t| Pool::new(t)).collect();
    let probe_buf = vec![1.0f32; 512 << 18]; // 512 MiB
    println!("| format | KV position | threads | ms/frame median | ms/frame min–max | read probe GB/s (median) | weight + bf16 KV GB/frame | roofline ms ((weights + KV) ÷ probe) | roofline ÷ measured |");
    println!("|---|---|---|---|---|---|---|---|---|");
    for &format in &formats {
        let t0 = Instant::now();
        let src = SyntheticSource { format, seed: 7 };
        let model = LmModel::from_source(&src, spec.clone()).expect("synthetic model");
        let wbytes = model.streamed_weight_bytes() as f64;
        eprintln!(
            "{format:?}: built in {:.1} s, {:.2} GB streamed per frame",
            t0.elapsed().as_secs_f64(),
            wbytes / 1e9
        );
        let mut gen = LmGen::new(&model, KvDtype::Bf16).expect("state");
        let mut sampler =
            Sampler::new(SamplerConfig::default(), spec.text_card, spec.card).expect("sampler");
        let codes = [5u32; 8];
        for &pos in &positions {
            gen.seek_for_bench(pos);
            // Warm-up (scratch growth, page faults of the weights).
            gen.step(&model, &codes, &mut sampler, &pools[0]).unwrap();
            let mut times = vec![Vec::new(); pools.len()];
            let mut probes = vec![Vec::new(); pools.len()];
            for _ in 0..rounds {
                for (i, pool) in pools.iter().enumerate() {
                    probes[i].push(read_probe(pool, &probe_buf));
                    let t = Instant::now();
                    gen.step(&model, &codes, &mut sampler, pool).unwrap();
                    times[i].push(t.elapsed().as_secs_f64() * 1e3);
                }
            }
            for (i, pool) in pools.iter().enumerate() {
                let lo = times[i].iter().copied().fold(f64::INFINITY, f64::min);
                let hi = times[i].iter().copied().fold(0.0, f64::max);
                let ms = median(&mut times[i]);
                let gbps = median(&mut probes[i]);
                // bf16 K and V of every layer over the attended window.
                let kv_bytes = (spec.num_layers * 2 * pos.min(spec.context) * spec.dim * 2) as f64;
                let bytes = wbytes + kv_bytes;
                let floor = bytes / (gbps * 1e9) * 1e3;
                println!(
                    "| {format:?} | {pos} | {} | {ms:.0} | {lo:.0}–{hi:.0} | {gbps:.1} | {:.2} | {floor:.0} | {:.2} |",
                    pool.n_threads(),
                    bytes / 1e9,
                    floor / ms
                );
            }
        }
    }
}
