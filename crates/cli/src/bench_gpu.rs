//! `moshi-native bench lm --device gpu`: the LM frame on a GPU adapter, one
//! [`LmBackend::sampled_step`](model::lm::LmBackend::sampled_step) per frame (one submission),
//! against a same-run device bandwidth probe (a copy kernel) as the roofline.

use std::time::Instant;

use anyhow::Result;
use model::lm::{Generator, LmError, LmFrame, LmModel, NoObserver};
use model::sampling::{Sampler, SamplerConfig};

use crate::bench_args::{stats, BenchArgs};

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
}

/// Times `model` on the adapter (`None`: the best of any type) and prints one `result` line per
/// KV position.
pub(crate) fn bench_lm_gpu(
    args: &BenchArgs,
    adapter: Option<usize>,
    label: &str,
    model: LmModel,
) -> Result<Vec<GpuLmCell>> {
    let ctx = gpu::GpuContext::new(gpu::AdapterChoice::Gpu(adapter), gpu::GpuOptions::default())?;
    let probe = gpu::BandwidthProbe::new(&ctx, args.probe_mb)?;
    let spec = model.spec().clone();
    let weight_bytes = model.streamed_weight_bytes();
    let t0 = Instant::now();
    let weights = gpu::GpuLmWeights::upload(&ctx, &model)?;
    drop(model);
    let lm = gpu::GpuLm::new(weights, 1)?;
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
            }
        })
        .collect();
    let mut subs = vec![0u64; positions.len()];
    for _ in 0..args.rounds {
        let bw = probe.measure()?;
        for (c, s) in cells.iter_mut().zip(&mut subs) {
            gen.seek_for_bench(c.pos);
            for _ in 0..args.lm_frames {
                let before = gen.backend().submissions();
                let t = Instant::now();
                step(&mut gen)?;
                c.ms.push(t.elapsed().as_secs_f64() * 1e3);
                *s += gen.backend().submissions() - before;
                c.probe.push(bw);
            }
        }
    }
    for (c, s) in cells.iter_mut().zip(subs) {
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
    }
    Ok(cells)
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

    /// The GPU frame bench on the fixture LM: every frame is one submission, the dispatch count is
    /// the backend's, a probe bandwidth and a time come out (any adapter: lavapipe here; skipped
    /// without one unless `MOSHI_REQUIRE_GPU=1`).
    #[test]
    fn gpu_lm_bench_is_one_submission_per_frame() {
        if gpu::adapters().is_empty() {
            assert!(!gpu::gpu_required(), "MOSHI_REQUIRE_GPU=1 but no adapter");
            eprintln!("skipping: no GPU adapter");
            return;
        }
        let args = Cli::parse_from([
            "bench",
            "lm",
            "--device",
            "gpu",
            "--rounds",
            "2",
            "--lm-frames",
            "3",
            "--positions",
            "0,25",
            "--probe-mb",
            "4",
        ])
        .bench;
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/lm");
        let model = model::MoshiModel::open(&dir).unwrap().lm;
        let ctx = gpu::GpuContext::new(gpu::AdapterChoice::Gpu(None), gpu::GpuOptions::default())
            .unwrap();
        let expected = gpu::GpuLm::new(gpu::GpuLmWeights::upload(&ctx, &model).unwrap(), 1)
            .unwrap()
            .dispatches_per_frame();
        let cells = bench_lm_gpu(&args, None, "fixture", model).unwrap();
        assert_eq!(cells.len(), 2);
        for c in &cells {
            assert_eq!(c.submissions_per_frame, 1.0, "{c:?}");
            assert_eq!(c.dispatches, expected);
            assert_eq!(c.ms.len(), 6);
            assert!(c.ms.iter().all(|&m| m > 0.0) && c.probe.iter().all(|&b| b > 0.0));
        }
        assert!(cells[1].kv_bytes > cells[0].kv_bytes);
    }
}
