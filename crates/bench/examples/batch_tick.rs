//! Benchmark of the batched LM step that `runtime::BatchRunner` runs once per tick: at full moshiko
//! dimensions with synthetic weights, one tick with 1 active slot vs all `--slots` active
//! (`LmBatchGen::step_active`), next to a plain single-session `LmGen::step`, interleaved within every
//! round, per weight format, thread count and KV position. Medians with min–max over all samples.
//!
//! ```text
//! flock /tmp/moshi-bench.lock cargo run --release -p moshi-bench --example batch_tick -- \
//!     --formats q8_0,q4_0 --threads 1,2 --positions 0,375 --rounds 5 --slots 4
//! ```
//!
//! The temporal KV rings are capped at `--context` entries (default 512 instead of 3000) so that the
//! batch's caches fit next to the weights; at the positions measured (< context) the work is identical.

use std::time::{Duration, Instant};

use bench::lm::SyntheticSource;
use kernels::attention::KvDtype;
use kernels::{Pool, WeightFormat};
use model::lm::{LmBatchGen, LmError, LmFrame, LmGen, LmModel, LmSpec};
use model::sampling::{Sampler, SamplerConfig};

fn arg<T: std::str::FromStr>(args: &[String], name: &str, default: &str) -> Vec<T> {
    let v = args
        .iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map(String::as_str)
        .unwrap_or(default);
    v.split(',')
        .map(|x| {
            x.parse()
                .unwrap_or_else(|_| panic!("{name}: cannot parse `{x}`"))
        })
        .collect()
}

fn format(s: &str) -> WeightFormat {
    match s {
        "q8_0" | "q8" => WeightFormat::Q8_0,
        "q4_0" | "q4" => WeightFormat::Q4_0,
        "bf16" => WeightFormat::Bf16,
        other => panic!("unknown format {other} (q8_0, q4_0, bf16)"),
    }
}

/// Median (mean of the two middle values for an even count), min, max.
fn stats(v: &[f64]) -> (f64, f64, f64) {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    let med = if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    };
    (med, s[0], s[n - 1])
}

fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

fn main() -> Result<(), LmError> {
    let args: Vec<String> = std::env::args().collect();
    let formats: Vec<String> = arg(&args, "--formats", "q8_0,q4_0");
    let threads: Vec<usize> = arg(&args, "--threads", "1,2");
    let positions: Vec<usize> = arg(&args, "--positions", "0,375");
    let rounds = arg::<usize>(&args, "--rounds", "5")[0];
    let frames = arg::<usize>(&args, "--frames", "2")[0];
    let slots = arg::<usize>(&args, "--slots", "4")[0];
    let context = arg::<usize>(&args, "--context", "512")[0];
    let pools: Vec<Pool> = threads.iter().map(|&t| Pool::new(t)).collect();
    let mut spec = LmSpec::moshiko();
    spec.context = context;
    let all: Vec<usize> = (0..slots).collect();
    println!(
        "# batched LM tick (LmBatchGen::step_active): 1 vs {slots} active slots, vs LmGen::step; \
         ms, median [min-max] over {rounds} rounds x {frames} frames; kv=bf16, context {context}"
    );
    for f in &formats {
        let t0 = Instant::now();
        let model = LmModel::from_source(
            &SyntheticSource {
                format: format(f),
                seed: 1,
            },
            spec.clone(),
        )?;
        eprintln!(
            "{f}: built in {:.1} s, {:.3} GB streamed per frame",
            t0.elapsed().as_secs_f64(),
            model.streamed_weight_bytes() as f64 / 1e9
        );
        let sampler = || Sampler::new(SamplerConfig::default(), spec.text_card, spec.card);
        let mut gen = LmGen::new(&model, KvDtype::Bf16)?;
        let mut s1 = sampler()?;
        let mut batch = LmBatchGen::new(&model, slots, KvDtype::Bf16)?;
        let mut samplers = (0..slots)
            .map(|_| sampler())
            .collect::<Result<Vec<_>, _>>()?;
        let user: Vec<u32> = (0..spec.n_user() as u32).map(|i| 100 + 37 * i).collect();
        let codes = user.repeat(slots);
        let mut out: Vec<Result<Option<LmFrame>, LmError>> = (0..slots).map(|_| Ok(None)).collect();
        // Warm-up on every pool.
        for pool in &pools {
            gen.step(&model, &user, &mut s1, pool)?;
            batch.step_active(&model, &all, &codes, &mut samplers, pool, None, &mut out)?;
        }
        // [position][pool] -> (single, tick1, tickN, tickN / single, tickN / tick1)
        let mut cells = vec![vec![[const { Vec::<f64>::new() }; 5]; pools.len()]; positions.len()];
        for _ in 0..rounds {
            for (pi, pool) in pools.iter().enumerate() {
                for (qi, &pos) in positions.iter().enumerate() {
                    gen.seek_for_bench(pos);
                    batch.seek_for_bench(pos);
                    std::thread::sleep(Duration::from_millis(3));
                    for _ in 0..frames {
                        let t = Instant::now();
                        gen.step(&model, &user, &mut s1, pool)?;
                        let single = ms(t);
                        let t = Instant::now();
                        batch.step_active(
                            &model,
                            &all[..1],
                            &codes[..user.len()],
                            &mut samplers,
                            pool,
                            None,
                            &mut out[..1],
                        )?;
                        let one = ms(t);
                        let t = Instant::now();
                        batch.step_active(
                            &model,
                            &all,
                            &codes,
                            &mut samplers,
                            pool,
                            None,
                            &mut out,
                        )?;
                        let many = ms(t);
                        let c = &mut cells[qi][pi];
                        for (k, v) in [single, one, many, many / single, many / one]
                            .into_iter()
                            .enumerate()
                        {
                            c[k].push(v);
                        }
                    }
                }
            }
        }
        for (qi, &pos) in positions.iter().enumerate() {
            for (pi, c) in cells[qi].iter().enumerate() {
                let [a, b, n, r1, r2] = [0, 1, 2, 3, 4].map(|k| stats(&c[k]));
                println!(
                    "result impl=ours what=lm_batch_tick format={f} threads={} pos={pos} slots={slots} \
                     single_ms={:.1} [{:.1}-{:.1}] tick1_ms={:.1} [{:.1}-{:.1}] tick{slots}_ms={:.1} [{:.1}-{:.1}] \
                     tick{slots}/single={:.2} [{:.2}-{:.2}] tick{slots}/tick1={:.2} [{:.2}-{:.2}] n={}",
                    threads[pi],
                    a.0, a.1, a.2, b.0, b.1, b.2, n.0, n.1, n.2, r1.0, r1.1, r1.2, r2.0, r2.1, r2.2,
                    c[0].len()
                );
            }
        }
    }
    Ok(())
}
