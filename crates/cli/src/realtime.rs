//! The start-up real-time notice of `duplex` and `serve`: time a warm-up frame pass and say plainly whether
//! this model, weight format and thread count keep up with speech here (80 ms per frame), and what would.

use anyhow::{Context, Result};
use kernels::WeightFormat;
use runtime::realtime::{time_passes, RealtimeCheck, FRAME_BUDGET_MS};
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

/// The short name of a weight format (`q8_0`, `mlx-q4`, ...).
pub(crate) fn format_name(f: WeightFormat) -> String {
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
    /// Whether the LM and Mimi run on a GPU (then CPU threads are not what would help).
    pub gpu: bool,
}

/// The notice text for a measured frame pass: the verdict, then (when it does not hold) what would. The
/// verdict and the ratio never contradict each other: under 90 % of the 80 ms budget it keeps up, up to
/// 100 % it is at the limit (it keeps up only while nothing else runs), above it it does not.
pub fn notice(m: &Measured) -> String {
    let check = RealtimeCheck::new(&m.frame);
    let ms = check.frame_ms;
    let fmt = format_name(m.format);
    let on = if m.gpu {
        "on the GPU".to_string()
    } else {
        format!(
            "{} thread{}",
            m.threads,
            if m.threads == 1 { "" } else { "s" }
        )
    };
    let head = format!(
        "real time: a frame pass (80 ms of audio) takes {ms:.0} ms here at the start of a conversation \
         ({fmt} weights, {on}; median of warm passes)"
    );
    if check.holds() {
        return format!(
            "{head}, {:.0} % of the budget: this machine keeps up (a long context adds to it).",
            100.0 * check.load()
        );
    }
    let mut helps = Vec::new();
    if !m.gpu && m.threads < m.cores {
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
    if m.gpu {
        helps.push("a faster GPU".into());
    } else {
        helps.push("a GPU (--device gpu, where this build and machine have one)".into());
    }
    let verdict = if check.load() <= 1.0 {
        format!(
            "{:.0} % of the 80 ms a frame lasts: at the limit, this machine keeps up only while nothing else \
             runs (under {:.0} ms leaves room for the rest). Frames will be dropped at the slightest load.",
            100.0 * check.load(),
            FRAME_BUDGET_MS * runtime::realtime::HEADROOM
        )
    } else {
        format!(
            "{:.1}x the 80 ms a frame lasts: this machine does NOT keep up. Input will queue, the oldest \
             frames will be dropped and the answer will come late and broken.",
            check.load()
        )
    };
    format!("{head}, {verdict} What would help: {}.", helps.join("; "))
}

/// What was measured for a frame pass `frame` of a session of `engine`.
pub fn measured(engine: &Engine, frame: runtime::FrameTimings) -> Measured {
    Measured {
        frame,
        format: engine.lm().weight_format(),
        threads: engine.options().device.threads(),
        cores: runtime::physical_cores(),
        gpu: engine.gpu_adapter().is_some(),
    }
}

/// Frame passes `serve` times at start-up after the first (which compiles GPU pipelines and faults in
/// the weights, and is not counted).
pub const TIMED_PASSES: usize = 5;

/// Times frame passes of a short-lived session of `engine` (no session exists yet: `serve` at
/// start-up): the median of [`TIMED_PASSES`] after a first, uncounted one; returns what was measured
/// (the caller prints the notice).
pub fn measure(engine: &std::sync::Arc<Engine>) -> Result<Measured> {
    let frame = time_passes(engine, TIMED_PASSES).context("timing warm-up frames")?;
    Ok(measured(engine, frame))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn measured(
        total_ms: u32,
        lm_ms: u32,
        format: WeightFormat,
        threads: usize,
        cores: usize,
        gpu: bool,
    ) -> Measured {
        Measured {
            frame: runtime::FrameTimings {
                total_us: total_ms * 1000,
                lm_us: lm_ms * 1000,
                ..Default::default()
            },
            format,
            threads,
            cores,
            gpu,
        }
    }

    #[test]
    fn a_16_core_host_with_q4_is_told_it_keeps_up() {
        // Issue 30's 16-core Xeon: q4_0 40 ms LM at KV position 0, ~48 ms a whole pass.
        let t = notice(&measured(48, 40, WeightFormat::Q4_0, 16, 16, false));
        assert!(
            t.contains("keeps up") && !t.contains("NOT") && !t.contains("help"),
            "{t}"
        );
        assert!(
            t.contains("48 ms") && t.contains("q4_0") && t.contains("16 threads"),
            "{t}"
        );
        assert!(t.contains("60 % of the budget"), "{t}");
    }

    #[test]
    fn a_2_core_host_with_q8_is_told_it_does_not_keep_up_and_what_would_help() {
        let t = notice(&measured(380, 340, WeightFormat::Q8_0, 2, 2, false));
        assert!(t.contains("NOT keep up") && t.contains("4.8x"), "{t}");
        // Already on every core: threads are not suggested.
        assert!(!t.contains("--threads"), "{t}");
        // 380 − 340 + 340 × 4.5 / 8.5 = 220 ms.
        assert!(t.contains("about 220 ms"), "{t}");
        assert!(t.contains("--device gpu"), "{t}");
        // Fewer threads than cores: more threads are suggested.
        let t = notice(&measured(380, 340, WeightFormat::Q8_0, 2, 8, false));
        assert!(t.contains("--threads 8"), "{t}");
    }

    #[test]
    fn between_90_and_100_percent_the_verdict_does_not_contradict_the_ratio() {
        // Issue 30: "takes 73 ms … 0.9x the 80 ms a frame lasts: this machine does NOT keep up".
        let t = notice(&measured(73, 65, WeightFormat::Q8_0, 16, 16, false));
        assert!(!t.contains("NOT") && !t.contains("0.9x"), "{t}");
        assert!(
            t.contains("91 % of the 80 ms") && t.contains("at the limit"),
            "{t}"
        );
    }

    #[test]
    fn on_a_gpu_the_advice_never_names_the_gpu_or_threads() {
        let t = notice(&measured(110, 95, WeightFormat::Q8_0, 1, 16, true));
        assert!(t.contains("on the GPU") && t.contains("NOT keep up"), "{t}");
        assert!(
            !t.contains("--device gpu") && !t.contains("--threads"),
            "{t}"
        );
        assert!(
            t.contains("a faster GPU") && t.contains("4-bit bundle"),
            "{t}"
        );
        let t = notice(&measured(30, 25, WeightFormat::Q4_0, 1, 16, true));
        assert!(t.contains("keeps up") && t.contains("on the GPU"), "{t}");
    }
}
