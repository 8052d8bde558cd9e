//! The GPU profiler on any adapter (lavapipe here: structure, never speed): every launch of an LM
//! frame and of a Mimi frame is named and counted, the counts add up to the backends' own
//! dispatch counts, the printed lines have the documented fields, and a context without
//! profiling neither reports nor catches another context's launches.

mod common;

use std::collections::HashSet;

use gpu::{GpuContext, GpuLm, GpuMimi, GpuMimiWeights, GpuOptions, ProfileMode};
use model::lm::{Generator, LmError, LmFrame, NoObserver};
use model::mimi::CodecBackend;
use model::sampling::{Sampler, SamplerConfig};

fn profiling_context() -> Option<GpuContext> {
    common::context_with(GpuOptions {
        profile: true,
        ..Default::default()
    })
}

/// The names the LM's kernels may carry: every module the backend compiles.
fn lm_kernel_names() -> HashSet<String> {
    gpu::shaders::Module::all()
        .iter()
        .chain(&gpu::shaders::Module::subgroup_variants())
        .map(|m| format!("{m:?}").replace(' ', "_"))
        .collect()
}

/// Checks every `profile` line of `lines` (tag `tag`) and returns the kernel lines' calls summed.
fn check_lines(lines: &[String], tag: &str) -> f64 {
    let mut calls = 0.0;
    let mut phases = Vec::new();
    assert!(
        lines[0].starts_with(&format!("profile {tag} frames=")),
        "{}",
        lines[0]
    );
    for l in &lines[1..] {
        let rest = l
            .strip_prefix(&format!("profile {tag} "))
            .unwrap_or_else(|| panic!("line without its prefix: {l}"));
        if let Some(host) = rest.strip_prefix("host phase=") {
            let (phase, us) = host.split_once(" us=").unwrap_or_else(|| panic!("{l}"));
            assert!(us.parse::<f64>().unwrap() >= 0.0, "{l}");
            phases.push(phase.to_string());
            continue;
        }
        let kv: Vec<(&str, &str)> = rest
            .split(' ')
            .map(|f| {
                f.split_once('=')
                    .unwrap_or_else(|| panic!("field {f} in {l}"))
            })
            .collect();
        let keys: Vec<&str> = kv.iter().map(|(k, _)| *k).collect();
        assert_eq!(
            keys,
            ["kernel", "shape", "calls", "us", "bytes", "gbps"],
            "{l}"
        );
        let shape: Vec<u32> = kv[1].1.split('x').map(|d| d.parse().unwrap()).collect();
        assert!(shape.len() == 3 && shape.iter().all(|&d| d >= 1), "{l}");
        calls += kv[2].1.parse::<f64>().unwrap();
        for (_, v) in &kv[3..] {
            assert!(v.parse::<f64>().unwrap().is_finite(), "{l}");
        }
    }
    assert_eq!(
        phases,
        ["record", "submit", "wait"],
        "host phase lines: {lines:?}"
    );
    calls
}

/// One LM frame (a sampled step: temporal transformer, text sampling, 8 Depformer steps with their
/// sampling): every launch is counted under a kernel the backend compiles, the calls add up to
/// `dispatches_per_frame`, and with timestamps the device time is positive.
#[test]
fn lm_frame_profile_names_and_counts_every_launch() {
    let Some(ctx) = profiling_context() else {
        return;
    };
    assert!(ctx.profiling());
    let weights = common::fixture_lm(&ctx, "lm");
    let spec = weights.spec().clone();
    let lm = GpuLm::new(weights, 1).unwrap();
    let per_frame = lm.dispatches_per_frame();
    let mut gen = Generator::new(Box::new(lm)).unwrap();
    let mut samplers = [Sampler::new(SamplerConfig::default(), spec.text_card, spec.card).unwrap()];
    let user: Vec<u32> = (0..spec.n_user() as u32)
        .map(|i| (3 + 5 * i) % spec.card as u32)
        .collect();
    let mut out: [Result<Option<LmFrame>, LmError>; 1] = [Ok(None)];
    let mut step = |gen: &mut Generator<GpuLm>| {
        gen.step(&[0], &user, &mut samplers, None, &mut out, &mut NoObserver)
            .unwrap();
    };
    step(&mut gen);
    ctx.profile_frame().unwrap();
    ctx.profile_reset();
    let frames = 3;
    for _ in 0..frames {
        step(&mut gen);
        ctx.profile_frame().unwrap();
    }
    let r = ctx.profile_report().unwrap();
    assert_eq!(r.frames, frames);
    assert_eq!(r.calls_per_frame(), per_frame as f64, "{r:#?}");
    assert_eq!(r.untimed, 0);
    let names = lm_kernel_names();
    for k in &r.kernels {
        assert!(names.contains(&k.kernel), "unknown kernel {}", k.kernel);
        assert_eq!(k.calls % frames, 0, "{k:?}: a launch missing in some frame");
    }
    assert!(
        r.kernels
            .iter()
            .any(|k| k.kernel.starts_with("Matmul") && k.bytes > 0),
        "{r:#?}"
    );
    if r.mode == ProfileMode::PerDispatch {
        assert!(r.gpu_us_per_frame() > 0.0, "{r:#?}");
    }
    assert!(r.host.wait > std::time::Duration::ZERO, "{r:#?}");
    let lines = r.lines("what=lm");
    for l in &lines {
        println!("{l}");
    }
    assert_eq!(check_lines(&lines, "what=lm"), per_frame as f64);
}

/// One Mimi frame (encode, then decode its codes): every launch is counted under a Mimi kernel
/// and the calls add up to the codec's launches per frame.
#[test]
fn mimi_frame_profile_counts_every_launch() {
    let Some(ctx) = profiling_context() else {
        return;
    };
    let m = common::mimi_fixture_codec();
    let mut codec = GpuMimi::new(GpuMimiWeights::upload(&ctx, m.clone()).unwrap(), 1).unwrap();
    let (dec, enc) = codec.launches_per_call();
    let pcm = common::mimi_input_frames(m.frame_size());
    let fs = m.frame_size();
    let mut out = vec![0.0; fs];
    ctx.profile_reset();
    let frames = 2;
    for f in 0..frames {
        let codes = codec
            .encode_frames(&[0], &pcm[f * fs..(f + 1) * fs])
            .unwrap()
            .to_vec();
        codec.decode_frames(&[0], &codes, &mut out).unwrap();
        ctx.profile_frame().unwrap();
    }
    assert_eq!(codec.host_decisions(), 0, "a host decision adds launches");
    let r = ctx.profile_report().unwrap();
    assert_eq!(r.frames, frames as u64);
    assert_eq!(r.calls_per_frame(), (enc + dec) as f64, "{r:#?}");
    assert!(
        r.kernels.iter().all(|k| k.kernel.starts_with("mimi_")),
        "{r:#?}"
    );
    let lines = r.lines("what=mimi");
    for l in &lines {
        println!("{l}");
    }
    assert_eq!(check_lines(&lines, "what=mimi"), (enc + dec) as f64);
}

/// Without `profile` a context has no profiler, and its launches do not land in the profile of
/// another context of the process that has one.
#[test]
fn unprofiled_context_reports_nothing_and_is_not_caught() {
    let Some(profiled) = profiling_context() else {
        return;
    };
    let plain = common::context().unwrap();
    assert!(!plain.profiling() && plain.profile_report().is_none());
    plain.profile_frame().unwrap();
    let m = common::mimi_fixture_codec();
    let mut codec = GpuMimi::new(GpuMimiWeights::upload(&plain, m.clone()).unwrap(), 1).unwrap();
    let pcm = vec![0.1f32; m.frame_size()];
    profiled.profile_reset();
    codec.encode_frames(&[0], &pcm).unwrap();
    profiled.profile_frame().unwrap();
    let r = profiled.profile_report().unwrap();
    assert_eq!((r.frames, r.kernels.len()), (0, 0), "{r:#?}");
}
