//! How far the fast path (8-bit activations) drifts from the exact mode (f32 activations,
//! `MOSHI_KERNELS_F32_ACTIVATIONS=1`) on the full-size moshiko LM with synthetic weights: the same
//! teacher-forced tokens through both, text and Depformer logits compared step by step. A
//! measurement, not a regression test (it holds the full model: 4–8 GB): run it alone with
//!
//! ```sh
//! flock /tmp/moshi-bench.lock cargo test --release -p moshi-model --test fast_path_drift -- --ignored --nocapture
//! ```
//!
//! `MOSHI_DRIFT_FORMATS` (comma list of `q8_0`, `q4_0`, `mlx-q4`, `mlx-q8`; default `q8_0,mlx-q4`)
//! and `MOSHI_DRIFT_STEPS` (default 8) choose what runs.

use bench::lm::SyntheticSource;
use kernels::{Pool, WeightFormat};
use model::checkpoint::LmConfig;
use model::lm::{KvDtype, LmGen, LmModel, LmRecorder, LmSpec, StepOptions};
use model::sampling::{Sampler, SamplerConfig};

fn run(model: &LmModel, steps: usize, pool: &Pool) -> LmRecorder {
    let spec = model.spec();
    let mut sampler = Sampler::new(SamplerConfig::greedy(), spec.text_card, spec.card).unwrap();
    let mut gen = LmGen::new(model, KvDtype::F32).unwrap();
    let mut rec = LmRecorder::default();
    for t in 0..steps {
        let user: Vec<i64> = (0..8).map(|k| ((t * 37 + k * 101) % 2048) as i64).collect();
        let audio: Vec<u32> = (0..8).map(|k| ((t * 13 + k * 7) % 2048) as u32).collect();
        let opts = StepOptions {
            force_text: Some(((t * 131) % 32000) as u32),
            force_audio: Some(&audio),
        };
        gen.step_with(model, &user, &mut sampler, pool, &opts, &mut rec)
            .unwrap();
    }
    rec
}

/// (max |Δ|, RMS Δ / std of the exact run) of two logit sets.
fn drift(fast: &[f32], exact: &[f32]) -> (f32, f32) {
    testkit::compare::diff_stats(fast, exact)
}

/// Fraction of steps whose argmax differs.
fn argmax_changes(fast: &[f32], exact: &[f32], width: usize) -> f32 {
    let argmax = |v: &[f32]| {
        v.iter()
            .enumerate()
            .fold((0, f32::MIN), |a, (i, &x)| if x > a.1 { (i, x) } else { a })
            .0
    };
    let rows = exact.len() / width;
    let changed = (0..rows)
        .filter(|&r| {
            argmax(&fast[r * width..(r + 1) * width]) != argmax(&exact[r * width..(r + 1) * width])
        })
        .count();
    changed as f32 / rows as f32
}

#[test]
#[ignore = "measurement on the full-size model (4-8 GB); run alone, see the module docs"]
fn fast_path_drift_on_full_size_model() {
    let formats = std::env::var("MOSHI_DRIFT_FORMATS").unwrap_or_else(|_| "q8_0,mlx-q4".into());
    let steps: usize = std::env::var("MOSHI_DRIFT_STEPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(8);
    let spec = LmSpec::from_config(&LmConfig::moshiko_v0_1()).unwrap();
    let pool = Pool::new(std::thread::available_parallelism().map_or(1, |n| n.get()));
    for name in formats.split(',') {
        let format = match name {
            "q8_0" => WeightFormat::Q8_0,
            "q4_0" => WeightFormat::Q4_0,
            "mlx-q4" => WeightFormat::MlxAffine { bits: 4, group: 32 },
            "mlx-q8" => WeightFormat::MlxAffine { bits: 8, group: 64 },
            other => panic!("unknown format {other}"),
        };
        let model =
            LmModel::from_source(&SyntheticSource { format, seed: 1 }, spec.clone()).unwrap();
        kernels::set_f32_activations(true);
        let exact = run(&model, steps, &pool);
        kernels::set_f32_activations(false);
        let fast = run(&model, steps, &pool);
        let (tmax, trel) = drift(&fast.text_logits, &exact.text_logits);
        let (dmax, drel) = drift(&fast.depformer_logits, &exact.depformer_logits);
        let tstd = {
            let v = &exact.text_logits;
            let m = v.iter().map(|&x| x as f64).sum::<f64>() / v.len() as f64;
            (v.iter().map(|&x| (x as f64 - m).powi(2)).sum::<f64>() / v.len() as f64).sqrt()
        };
        println!(
            "{name}: {steps} steps; text logits (std {tstd:.3}): max |Δ| {tmax:.4}, RMS/std {trel:.4}, \
             argmax changed {:.1} %; depformer logits: max |Δ| {dmax:.4}, RMS/std {drel:.4}, argmax changed {:.1} %",
            100.0 * argmax_changes(&fast.text_logits, &exact.text_logits, spec.text_card),
            100.0 * argmax_changes(&fast.depformer_logits, &exact.depformer_logits, spec.card),
        );
    }
}
