//! A warmed-up LM step (temporal step, sampling, Depformer, LMGen bookkeeping) allocates nothing
//! on any thread: the stepping thread and the pool's workers. Counted with the all-thread counter,
//! so this binary holds a single test that runs the cases one after the other.

use std::path::Path;

use kernels::Pool;
use model::checkpoint::Component;
use model::checkpoint::LmConfig;
use model::checkpoint::Weights;
use model::lm::{KvDtype, LmGen, LmModel, NoObserver, StepOptions};
use model::sampling::{RepetitionPenalty, Sampler, SamplerConfig};

#[global_allocator]
static GLOBAL: testkit::CountingAlloc = testkit::CountingAlloc;

use testkit::all_thread_allocations_during as allocations;

#[test]
fn lm_steps_allocate_nothing_after_warmup_on_any_thread() {
    assert!(testkit::other_thread_probe(|f| testkit::all_thread_allocations_during(f)) >= 1);
    single_step();
    batched_step();
    long_context_step();
}

/// The tiny LM of `fixtures/lm`.
fn load_fixture_model() -> LmModel {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/lm");
    let cfg =
        LmConfig::from_json(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
    let w = Weights::open(&dir.join("model.safetensors"), Component::Lm).unwrap();
    LmModel::load(&w, &cfg).unwrap()
}

fn single_step() {
    let model = load_fixture_model();
    let pool = Pool::new(2);
    let mut cfg = SamplerConfig::seeded(5);
    cfg.pad_mult = Some(0.5);
    cfg.repetition_penalty = Some(RepetitionPenalty {
        penalty: 1.3,
        context: 16,
    });
    let mut sampler = Sampler::new(cfg, 128, 64).unwrap();
    for kv in [KvDtype::F32, KvDtype::Bf16] {
        let mut gen = LmGen::new(&model, kv).unwrap();
        // Warm-up: the pool's activation scratch grows on first use.
        for t in 0..3u32 {
            gen.step(&model, &[t; 8], &mut sampler, &pool).unwrap();
        }
        let forced = [1u32, 2, 3, 4, 5, 6, 7, 8];
        let n = allocations(|| {
            for t in 0..40u32 {
                let codes = [t % 64, 1, 2, 3, 4, 5, 6, 7];
                // None right after the reset below, Some otherwise.
                let out = gen.step(&model, &codes, &mut sampler, &pool).unwrap();
                assert_eq!(out.is_some(), t != 21);
                let codes_i64 = [-1i64, 0, 64, 3, 4, 5, 6, 7];
                let opts = StepOptions {
                    force_text: Some(5),
                    force_audio: Some(&forced),
                };
                gen.step_with(
                    &model,
                    &codes_i64,
                    &mut sampler,
                    &pool,
                    &opts,
                    &mut NoObserver,
                )
                .unwrap();
                if t == 20 {
                    gen.reset();
                    sampler.reset();
                }
            }
        });
        assert_eq!(n, 0, "allocations during 80 warmed-up steps ({kv:?})");
    }
}

fn batched_step() {
    let model = load_fixture_model();
    let pool = Pool::new(2);
    let n = 3;
    let mut batch = model::lm::LmBatchGen::new(&model, n, KvDtype::Bf16).unwrap();
    let mut samplers: Vec<Sampler> = (0..n)
        .map(|b| Sampler::new(SamplerConfig::seeded(b as u64), 128, 64).unwrap())
        .collect();
    let mut out = vec![None; n];
    let codes: Vec<u32> = (0..n as u32 * 8).map(|i| i % 64).collect();
    for _ in 0..3 {
        batch
            .step(&model, &codes, &mut samplers, &pool, &mut out)
            .unwrap();
    }
    let n = allocations(|| {
        for t in 0..30 {
            batch
                .step(&model, &codes, &mut samplers, &pool, &mut out)
                .unwrap();
            if t == 10 {
                batch.reset_session(1);
            }
        }
    });
    assert_eq!(n, 0, "batched steps");
}

fn long_context_step() {
    // Context above 16 so the temporal attention runs split over the pool (attend_pool), whose
    // score scratch grows once per thread count during the warm-up.
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/lm");
    let cfg =
        LmConfig::from_json(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
    let mut spec = model::lm::LmSpec::from_config(&cfg).unwrap();
    spec.context = 40;
    let src = bench::lm::SyntheticSource {
        format: kernels::WeightFormat::Q8_0,
        seed: 3,
    };
    let model = LmModel::from_source(&src, spec).unwrap();
    let pool = Pool::new(2);
    let mut sampler = Sampler::new(SamplerConfig::seeded(9), 128, 64).unwrap();
    let mut gen = LmGen::new(&model, KvDtype::Bf16).unwrap();
    for _ in 0..20 {
        gen.step(&model, &[1; 8], &mut sampler, &pool).unwrap();
    }
    let n = allocations(|| {
        for t in 0..60u32 {
            gen.step(&model, &[t % 64; 8], &mut sampler, &pool).unwrap();
        }
    });
    assert_eq!(n, 0, "long-context steps");
}
