//! Synthetic Mimi weights of realistic scale and a frame-timing helper for benchmarks.
//!
//! Used by `moshi-native bench mimi` and `cargo run --release -p moshi-bench --example
//! mimi_bench`; not part of the inference path.

use model::checkpoint::MimiConfig;
use model::mimi::{
    Mimi, MimiBatchDecoder, MimiBatchEncoder, MimiDecoder, MimiEncoder, MimiError, Pool,
};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

/// Named tensors, as [`model::mimi::MimiTensors`] accepts them.
pub type TensorMap = HashMap<String, (Vec<f32>, Vec<usize>)>;

/// A small deterministic generator (xorshift64*), uniform in [-1, 1).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> f32 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        let v = self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 40;
        (v as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }

    fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.next() * scale).collect()
    }
}

/// Random weights in Kyutai's names for `cfg`, all codebooks included. Conv and linear
/// weights are uniform with variance 1/fan_in (like trained nets keep activations O(1)),
/// norms near 1, LayerScale near 0.01, codebook centroids of magnitude ~1.
pub fn synthetic_tensors(cfg: &MimiConfig, seed: u64) -> TensorMap {
    let mut rng = Rng(seed.max(1));
    let mut m = TensorMap::new();
    let put = |m: &mut TensorMap, rng: &mut Rng, name: String, shape: Vec<usize>, fan_in: usize| {
        let n = shape.iter().product();
        let scale = (3.0 / fan_in as f32).sqrt();
        m.insert(name, (rng.vec(n, scale), shape));
    };
    let nf = cfg.seanet.n_filters;
    let conv = |m: &mut TensorMap, rng: &mut Rng, p: String, cin: usize, cout: usize, k: usize| {
        let n = cout * cin * k;
        let scale = (3.0 / (cin * k) as f32).sqrt();
        m.insert(
            format!("{p}.weight"),
            (rng.vec(n, scale), vec![cout, cin, k]),
        );
        m.insert(format!("{p}.bias"), (rng.vec(cout, 0.01), vec![cout]));
    };
    let res = |m: &mut TensorMap, rng: &mut Rng, p: &str, idx: usize, dim: usize| {
        for j in 0..cfg.seanet.n_residual_layers {
            let h = dim / cfg.seanet.compress;
            conv(
                m,
                rng,
                format!("{p}.{}.block.1.conv.conv", idx + j),
                dim,
                h,
                cfg.seanet.residual_kernel_size,
            );
            conv(
                m,
                rng,
                format!("{p}.{}.block.3.conv.conv", idx + j),
                h,
                dim,
                1,
            );
        }
    };
    conv(
        &mut m,
        &mut rng,
        "encoder.model.0.conv.conv".into(),
        cfg.channels,
        nf,
        cfg.seanet.kernel_size,
    );
    let (mut idx, mut mult) = (1, 1);
    for &r in cfg.seanet.ratios.iter().rev() {
        res(&mut m, &mut rng, "encoder.model", idx, mult * nf);
        idx += cfg.seanet.n_residual_layers + 1;
        conv(
            &mut m,
            &mut rng,
            format!("encoder.model.{idx}.conv.conv"),
            mult * nf,
            2 * mult * nf,
            2 * r,
        );
        idx += 1;
        mult *= 2;
    }
    idx += 1;
    conv(
        &mut m,
        &mut rng,
        format!("encoder.model.{idx}.conv.conv"),
        mult * nf,
        cfg.seanet.dimension,
        cfg.seanet.last_kernel_size,
    );
    conv(
        &mut m,
        &mut rng,
        "decoder.model.0.conv.conv".into(),
        cfg.seanet.dimension,
        mult * nf,
        cfg.seanet.kernel_size,
    );
    let mut idx = 1;
    for &r in &cfg.seanet.ratios {
        idx += 1;
        let (cin, cout) = (mult * nf, mult * nf / 2);
        let p = format!("decoder.model.{idx}.convtr.convtr");
        let scale = (3.0 / cin as f32).sqrt();
        m.insert(
            format!("{p}.weight"),
            (rng.vec(cin * cout * 2 * r, scale), vec![cin, cout, 2 * r]),
        );
        m.insert(format!("{p}.bias"), (rng.vec(cout, 0.01), vec![cout]));
        idx += 1;
        res(&mut m, &mut rng, "decoder.model", idx, cout);
        idx += cfg.seanet.n_residual_layers;
        mult /= 2;
    }
    idx += 1;
    conv(
        &mut m,
        &mut rng,
        format!("decoder.model.{idx}.conv.conv"),
        nf,
        cfg.channels,
        cfg.seanet.last_kernel_size,
    );
    let (d, ff) = (cfg.seanet.dimension, cfg.transformer.dim_feedforward);
    for tr in ["encoder_transformer", "decoder_transformer"] {
        for l in 0..cfg.transformer.num_layers {
            let p = format!("{tr}.transformer.layers.{l}.");
            for n in ["norm1", "norm2"] {
                let w: Vec<f32> = rng.vec(d, 0.1).into_iter().map(|v| 1.0 + v).collect();
                m.insert(format!("{p}{n}.weight"), (w, vec![d]));
                m.insert(format!("{p}{n}.bias"), (rng.vec(d, 0.05), vec![d]));
            }
            for n in ["layer_scale_1", "layer_scale_2"] {
                let w: Vec<f32> = rng.vec(d, 0.005).into_iter().map(|v| 0.01 + v).collect();
                m.insert(format!("{p}{n}.scale"), (w, vec![d]));
            }
            put(
                &mut m,
                &mut rng,
                format!("{p}self_attn.in_proj_weight"),
                vec![3 * d, d],
                d,
            );
            put(
                &mut m,
                &mut rng,
                format!("{p}self_attn.out_proj.weight"),
                vec![d, d],
                d,
            );
            put(
                &mut m,
                &mut rng,
                format!("{p}linear1.weight"),
                vec![ff, d],
                d,
            );
            put(
                &mut m,
                &mut rng,
                format!("{p}linear2.weight"),
                vec![d, ff],
                ff,
            );
        }
    }
    let s = cfg.resample_stride();
    put(
        &mut m,
        &mut rng,
        "downsample.conv.conv.conv.weight".into(),
        vec![d, d, 2 * s],
        d * 2 * s,
    );
    put(
        &mut m,
        &mut rng,
        "upsample.convtr.convtr.convtr.weight".into(),
        vec![d, 1, 2 * s],
        2,
    );
    let (cd, bins) = (cfg.quantizer.dimension, cfg.quantizer.bins);
    for (name, n) in [("rvq_first", 1), ("rvq_rest", cfg.quantizer.n_q - 1)] {
        let p = format!("quantizer.{name}");
        put(
            &mut m,
            &mut rng,
            format!("{p}.input_proj.weight"),
            vec![cd, d, 1],
            d,
        );
        put(
            &mut m,
            &mut rng,
            format!("{p}.output_proj.weight"),
            vec![d, cd, 1],
            cd,
        );
        for j in 0..n {
            let q = format!("{p}.vq.layers.{j}._codebook");
            let usage: Vec<f32> = rng.vec(bins, 0.5).into_iter().map(|v| 1.0 + v).collect();
            let mut sum = rng.vec(bins * cd, 1.0);
            for b in 0..bins {
                for v in &mut sum[b * cd..(b + 1) * cd] {
                    *v *= usage[b];
                }
            }
            m.insert(format!("{q}.embedding_sum"), (sum, vec![bins, cd]));
            m.insert(format!("{q}.cluster_usage"), (usage, vec![bins]));
            m.insert(format!("{q}._initialized"), (vec![1.0], vec![1]));
        }
    }
    m
}

/// A released-size Mimi with synthetic weights.
pub fn synthetic_mimi(n_codebooks: usize, seed: u64) -> Result<Arc<Mimi>, MimiError> {
    synthetic_mimi_with(n_codebooks, seed, &model::mimi::MimiOptions::default())
}

/// [`synthetic_mimi`] with explicit load options.
pub fn synthetic_mimi_with(
    n_codebooks: usize,
    seed: u64,
    opts: &model::mimi::MimiOptions,
) -> Result<Arc<Mimi>, MimiError> {
    let cfg = MimiConfig::v0_1();
    let t = synthetic_tensors(&cfg, seed);
    Ok(Arc::new(Mimi::from_tensors_with(
        &t,
        &cfg,
        n_codebooks,
        opts,
    )?))
}

/// A deterministic test signal: a chirp 100 Hz → 4 kHz at amplitude 0.5 plus a little noise.
pub fn test_signal(n: usize, sample_rate: usize) -> Vec<f32> {
    let mut rng = Rng(12345);
    let dur = n as f64 / sample_rate as f64;
    (0..n)
        .map(|i| {
            let t = i as f64 / sample_rate as f64;
            let f = 100.0 + (4000.0 - 100.0) * t / dur.max(1e-9) / 2.0;
            (0.5 * (2.0 * std::f64::consts::PI * f * t).sin()) as f32 + 0.01 * rng.next()
        })
        .collect()
}

/// Milliseconds per frame for `frames` streaming frames: (encode, decode) per frame.
pub fn time_frames(
    mimi: &Arc<Mimi>,
    frames: usize,
    pool: Option<&Pool>,
) -> Result<(Vec<f64>, Vec<f64>), MimiError> {
    let fs = mimi.frame_size();
    let pcm = test_signal(frames * fs, mimi.config().sample_rate);
    let mut enc = MimiEncoder::new(mimi.clone());
    let mut dec = MimiDecoder::new(mimi.clone());
    let mut out = vec![0.0; fs];
    let mut codes = vec![0u32; mimi.n_codebooks()];
    let (mut te, mut td) = (Vec::new(), Vec::new());
    for f in 0..frames {
        let t0 = Instant::now();
        codes.copy_from_slice(enc.encode_frame_with(&pcm[f * fs..(f + 1) * fs], pool, None)?);
        let t1 = Instant::now();
        dec.decode_frame_with(&codes, &mut out, pool, None)?;
        let t2 = Instant::now();
        te.push((t1 - t0).as_secs_f64() * 1e3);
        td.push((t2 - t1).as_secs_f64() * 1e3);
    }
    Ok((te, td))
}

/// How a tick of several streams is coded in [`time_slot_ticks`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SlotMode {
    /// One [`MimiBatchEncoder`] / [`MimiBatchDecoder`] call per tick for all streams.
    Joint,
    /// One [`MimiEncoder`] / [`MimiDecoder`] per stream, called one after the other.
    Sequential,
}

/// Milliseconds per tick in which each of `slots` streams encodes and decodes one frame
/// (distinct signals per stream): (encode, decode) per tick, `ticks` ticks.
pub fn time_slot_ticks(
    mimi: &Arc<Mimi>,
    slots: usize,
    mode: SlotMode,
    ticks: usize,
    pool: Option<&Pool>,
) -> Result<(Vec<f64>, Vec<f64>), MimiError> {
    let (fs, nq) = (mimi.frame_size(), mimi.n_codebooks());
    let slots = slots.max(1);
    let signal = test_signal((ticks + slots) * fs, mimi.config().sample_rate);
    // Stream j's frame of tick k: the signal from frame k + j on (different audio per stream).
    let frame = |j: usize, k: usize| &signal[(k + j) * fs..(k + j + 1) * fs];
    let active: Vec<usize> = (0..slots).collect();
    let mut pcm = vec![0.0; slots * fs];
    let mut codes = vec![0u32; slots * nq];
    let mut out = vec![0.0; slots * fs];
    let (mut te, mut td) = (Vec::new(), Vec::new());
    let mut joint = (mode == SlotMode::Joint).then(|| {
        (
            MimiBatchEncoder::new(mimi.clone(), slots),
            MimiBatchDecoder::new(mimi.clone(), slots),
        )
    });
    let mut alone: Vec<(MimiEncoder, MimiDecoder)> = match mode {
        SlotMode::Joint => Vec::new(),
        SlotMode::Sequential => (0..slots)
            .map(|_| {
                (
                    MimiEncoder::new(mimi.clone()),
                    MimiDecoder::new(mimi.clone()),
                )
            })
            .collect(),
    };
    for k in 0..ticks {
        for j in 0..slots {
            pcm[j * fs..(j + 1) * fs].copy_from_slice(frame(j, k));
        }
        let t0 = Instant::now();
        if let Some((enc, _)) = joint.as_mut() {
            codes.copy_from_slice(enc.encode_frames(&active, &pcm, pool)?);
        }
        for (j, (enc, _)) in alone.iter_mut().enumerate() {
            let c = enc.encode_frame_with(&pcm[j * fs..(j + 1) * fs], pool, None)?;
            codes[j * nq..(j + 1) * nq].copy_from_slice(c);
        }
        let t1 = Instant::now();
        if let Some((_, dec)) = joint.as_mut() {
            dec.decode_frames(&active, &codes, &mut out, pool)?;
        }
        for (j, (_, dec)) in alone.iter_mut().enumerate() {
            dec.decode_frame_with(
                &codes[j * nq..(j + 1) * nq],
                &mut out[j * fs..(j + 1) * fs],
                pool,
                None,
            )?;
        }
        let t2 = Instant::now();
        te.push((t1 - t0).as_secs_f64() * 1e3);
        td.push((t2 - t1).as_secs_f64() * 1e3);
    }
    Ok((te, td))
}

fn median_spread(v: &mut [f64]) -> (f64, f64, f64) {
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n == 0 {
        return (0.0, 0.0, 0.0);
    }
    (v[n / 2], v[n / 10], v[(n * 9 / 10).min(n - 1)])
}

/// Benchmarks a released-size synthetic Mimi: for each round, and for 1 and 2 threads
/// interleaved (A/B in the same process), `frames` streaming frames after a warm-up frame.
/// Returns a printable report: median and p10–p90 of milliseconds per 80 ms frame, encode
/// and decode separately, per thread count.
pub fn run(frames: usize, rounds: usize, thread_counts: &[usize]) -> Result<String, MimiError> {
    let mimi = synthetic_mimi(8, 42)?;
    let pools: Vec<(usize, Option<Pool>)> = thread_counts
        .iter()
        .map(|&n| (n, if n > 1 { Some(Pool::new(n)) } else { None }))
        .collect();
    for (_, p) in &pools {
        let _ = time_frames(&mimi, 1, p.as_ref())?;
    }
    let mut acc: Vec<(Vec<f64>, Vec<f64>)> =
        pools.iter().map(|_| (Vec::new(), Vec::new())).collect();
    for _ in 0..rounds.max(1) {
        for ((_, p), (e, d)) in pools.iter().zip(acc.iter_mut()) {
            let (te, td) = time_frames(&mimi, frames, p.as_ref())?;
            e.extend(te);
            d.extend(td);
        }
    }
    let mut out = format!(
        "mimi, released dimensions, synthetic weights, 8 codebooks, {frames} frames x {} rounds (threads interleaved)\n",
        rounds.max(1)
    );
    for ((n, _), (e, d)) in pools.iter().zip(acc.iter_mut()) {
        let (em, e10, e90) = median_spread(e);
        let (dm, d10, d90) = median_spread(d);
        out += &format!(
            "{n} thread(s): encode median {em:.2} ms/frame (p10 {e10:.2}, p90 {e90:.2}); \
             decode median {dm:.2} ms/frame (p10 {d10:.2}, p90 {d90:.2}); encode+decode {:.2} ms per 80 ms frame\n",
            em + dm
        );
    }
    Ok(out)
}

/// [`stage_breakdown`] of a tick of `slots` streams coded jointly: mean milliseconds per tick in
/// each stage.
pub fn stage_breakdown_slots(
    mimi: &Arc<Mimi>,
    slots: usize,
    ticks: usize,
    pool: Option<&Pool>,
) -> Result<Vec<(&'static str, f64)>, MimiError> {
    use model::mimi::Stage;
    let (fs, nq) = (mimi.frame_size(), mimi.n_codebooks());
    let signal = test_signal((ticks + slots) * fs, mimi.config().sample_rate);
    let active: Vec<usize> = (0..slots).collect();
    let mut enc = MimiBatchEncoder::new(mimi.clone(), slots);
    let mut dec = MimiBatchDecoder::new(mimi.clone(), slots);
    let mut pcm = vec![0.0; slots * fs];
    let mut codes = vec![0u32; slots * nq];
    let mut out = vec![0.0; slots * fs];
    let mut acc = [0f64; 8];
    for k in 0..ticks {
        for j in 0..slots {
            pcm[j * fs..(j + 1) * fs].copy_from_slice(&signal[(k + j) * fs..(k + j + 1) * fs]);
        }
        let t0 = Instant::now();
        let mut marks = [Instant::now(); 9];
        {
            let mut cb = |s: Stage, _: &[f32]| {
                let i = match s {
                    Stage::EncSeanet => 1,
                    Stage::EncTransformer => 2,
                    Stage::Latent => 3,
                    Stage::DecLatent => 5,
                    Stage::DecUpsample => 6,
                    Stage::DecTransformer => 7,
                };
                marks[i] = Instant::now();
            };
            codes.copy_from_slice(enc.encode_frames_with(&active, &pcm, pool, Some(&mut cb))?);
            let t4 = Instant::now();
            dec.decode_frames_with(&active, &codes, &mut out, pool, Some(&mut cb))?;
            let t8 = Instant::now();
            marks[4] = t4;
            marks[8] = t8;
        }
        marks[0] = t0;
        for i in 0..8 {
            acc[i] += (marks[i + 1] - marks[i]).as_secs_f64() * 1e3;
        }
    }
    let names = [
        "enc seanet",
        "enc transformer",
        "downsample",
        "quantize",
        "dequantize",
        "upsample",
        "dec transformer",
        "dec seanet",
    ];
    Ok(names
        .iter()
        .zip(acc)
        .map(|(n, a)| (*n, a / ticks.max(1) as f64))
        .collect())
}

/// Mean milliseconds per frame spent in each stage (via the trace hook timestamps):
/// encoder SEANet, encoder transformer, downsample, quantizer encode; quantizer decode,
/// upsample, decoder transformer, decoder SEANet.
pub fn stage_breakdown(
    mimi: &Arc<Mimi>,
    frames: usize,
    pool: Option<&Pool>,
) -> Result<Vec<(&'static str, f64)>, MimiError> {
    // One stream coded alone runs exactly the single-stream path.
    stage_breakdown_slots(mimi, 1, frames, pool)
}
