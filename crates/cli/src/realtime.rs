//! The start-up real-time notice of `duplex` and `serve`: time a warm-up frame pass and say plainly whether
//! this model, weight format and thread count keep up with speech here (80 ms per frame), and what would.

use anyhow::{Context, Result};
use kernels::WeightFormat;
use runtime::realtime::{warm_up, RealtimeCheck, FRAME_BUDGET_MS};
use runtime::Engine;

/// Bits a weight format stores per weight (scales included): the LM step reads about this many bits per
/// weight per frame, so its time scales with it.
fn bits_per_weight(f: WeightFormat) -> f64 {
    match f {
        WeightFormat::F32 => 32.0,
        WeightFormat::Bf16 | WeightFormat::F16 => 16.0,
        WeightFormat::Q8_0 => 8.5,
        WeightFormat::Q4_0 => 4.5,
        WeightFormat::MlxAffine { bits, group } => f64::from(bits) + 32.0 / group as f64,
    }
}

fn format_name(f: WeightFormat) -> String {
    match f {
        WeightFormat::F32 => "f32".into(),
        WeightFormat::Bf16 => "bf16".into(),
        WeightFormat::F16 => "f16".into(),
        WeightFormat::Q8_0 => "q8_0".into(),
        WeightFormat::Q4_0 => "q4_0".into(),
        WeightFormat::MlxAffine { bits, .. } => format!("mlx-q{bits}"),
    }
}

/// What was measured, for the notice.
#[derive(Clone, Copy, Debug)]
pub struct Measured {
    /// The full frame pass.
    pub frame: runtime::FrameTimings,
    /// Weight format of the LM.
    pub format: WeightFormat,
    /// Threads per session.
    pub threads: usize,
    /// Physical cores of this machine.
    pub cores: usize,
}

/// The notice text for a measured frame pass: the verdict, then (when it does not hold) what would.
pub fn notice(m: &Measured) -> String {
    let check = RealtimeCheck::new(&m.frame);
    let ms = check.frame_ms;
    let fmt = format_name(m.format);
    let head = format!(
        "real time: a frame pass (80 ms of audio) takes {ms:.0} ms here ({fmt} weights, {} thread{}",
        m.threads,
        if m.threads == 1 { "" } else { "s" }
    );
    if check.holds() {
        return format!(
            "{head}), {:.0} % of the budget: this machine keeps up.",
            100.0 * check.load()
        );
    }
    let mut helps = Vec::new();
    if m.threads < m.cores {
        helps.push(format!(
            "more threads (--threads {}: this machine has {} physical cores; the LM step is bound by memory \
             bandwidth, so the gain stops where the bandwidth is used up)",
            m.cores, m.cores
        ));
    }
    let bits = bits_per_weight(m.format);
    if bits > 5.0 {
        // The LM step reads its weights once per frame; at 4.5 bits per weight it reads 4.5 / bits as much.
        let lm = f64::from(m.frame.lm_us) / 1e3;
        let est = ms - lm + lm * 4.5 / bits;
        helps.push(format!(
            "a 4-bit bundle (q4_0 reads {:.0} % of the bytes of {fmt} per frame: about {est:.0} ms here, \
             estimated)",
            100.0 * 4.5 / bits
        ));
    }
    helps.push("a GPU (--device gpu, where this build and machine have one)".into());
    format!(
        "{head}), {:.1}x the 80 ms a frame lasts: this machine does NOT keep up. Input will queue, the oldest \
         frames will be dropped and the answer will come late and broken. What would help: {}.",
        ms / FRAME_BUDGET_MS,
        helps.join("; ")
    )
}

/// What was measured for a frame pass `frame` of a session of `engine`.
pub fn measured(engine: &Engine, frame: runtime::FrameTimings) -> Measured {
    Measured {
        frame,
        format: engine.lm().weight_format(),
        threads: engine.options().device.threads(),
        cores: runtime::physical_cores(),
    }
}

/// Times one frame pass of a short-lived session of `engine` (no session exists yet: `serve` at
/// start-up) and returns what was measured (the caller prints the notice).
pub fn measure(engine: &std::sync::Arc<Engine>) -> Result<Measured> {
    let frame = warm_up(engine).context("timing a warm-up frame")?;
    Ok(measured(engine, frame))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn measured(total_ms: u32, lm_ms: u32, format: WeightFormat, threads: usize) -> Measured {
        Measured {
            frame: runtime::FrameTimings {
                total_us: total_ms * 1000,
                lm_us: lm_ms * 1000,
                ..Default::default()
            },
            format,
            threads,
            cores: 8,
        }
    }

    #[test]
    fn a_fast_machine_is_told_it_keeps_up() {
        let t = notice(&measured(50, 40, WeightFormat::Q8_0, 8));
        assert!(t.contains("keeps up") && !t.contains("NOT"), "{t}");
        assert!(t.contains("50 ms") && t.contains("q8_0"), "{t}");
    }

    #[test]
    fn a_slow_machine_is_told_what_would_help() {
        let t = notice(&measured(380, 340, WeightFormat::Q8_0, 2));
        assert!(t.contains("NOT keep up") && t.contains("4.8x"), "{t}");
        assert!(t.contains("--threads 8"), "{t}");
        // 380 − 340 + 340 × 4.5 / 8.5 = 220 ms.
        assert!(t.contains("about 220 ms"), "{t}");
        assert!(t.contains("--device gpu"), "{t}");
        // Already 4-bit on every core: only the GPU is left to suggest.
        let t = notice(&measured(200, 150, WeightFormat::Q4_0, 8));
        assert!(
            !t.contains("--threads") && !t.contains("4-bit bundle"),
            "{t}"
        );
        assert!(t.contains("--device gpu"), "{t}");
    }
}
