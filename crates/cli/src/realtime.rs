//! The start-up real-time notice of `duplex` and `serve`: from frame passes timed after warm-up, say
//! plainly whether this model, weight format and device keep up with speech here (80 ms per frame), at
//! the start of a conversation and at its full context, how many conversations this machine holds at
//! once (measured for the loaded weight format, estimated from bytes per frame for the other), and,
//! when one does not keep up, what would help that is not already in use.

use anyhow::{Context, Result};
use kernels::WeightFormat;
use model::lm::KvDtype;
use runtime::realtime::{Probe, FRAME_BUDGET_MS, HEADROOM};
use runtime::Engine;

/// Bits a weight format stores per weight (scales included): the LM step reads about this many bits per
/// weight per frame, so its weight-bound part scales with it.
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
    /// The timed passes (medians after warm-up).
    pub probe: Probe,
    /// Whether the probe's full-context and batched figures were measured (`serve`); `duplex` times
    /// only its own session's first pass, at position 0.
    pub full: bool,
    /// Weight format of the LM.
    pub format: WeightFormat,
    /// Element type of the LM's KV caches.
    pub kv: KvDtype,
    /// CPU threads of each worker.
    pub threads: usize,
    /// Workers stepping at the same time (`serve --batch N` below the session limit: several).
    pub workers: usize,
    /// Physical cores of this machine.
    pub cores: usize,
    /// Whether the LM and Mimi run on a GPU (then CPU threads are not what would help).
    pub gpu: bool,
}

/// Conversations held in real time at once with one weight format.
#[derive(Clone, Debug, PartialEq)]
pub struct Capacity {
    /// Weight format name (`q8_0`, `q4_0`, ...).
    pub format: String,
    /// True for the loaded format (timed); false for an estimate from its bytes per frame.
    pub measured: bool,
    /// Conversations at once while all are at the start (KV position 0).
    pub at_start: usize,
    /// Conversations at once with all at the full context (every KV cache full): the whole length.
    pub at_full: usize,
}

/// The notice and the figures it states, for the start-up line, `/metrics` and the metadata message.
#[derive(Clone, Debug, PartialEq)]
pub struct Verdict {
    /// The paragraph for the user.
    pub text: String,
    /// One conversation's frame pass at KV position 0, ms.
    pub start_ms: f64,
    /// One conversation's frame pass at the full context, ms (`None` when not measured).
    pub full_ms: Option<f64>,
    /// Whether one conversation keeps up (with headroom) through a full context, or at its start when
    /// the full context was not measured.
    pub holds: bool,
    /// Conversations held at once: the loaded format (measured) and the other of q8_0 / q4_0
    /// (estimated); empty when the full context was not measured.
    pub capacity: Vec<Capacity>,
}

/// The frame pass a conversation may take and still be called real time, ms.
fn limit_ms() -> f64 {
    FRAME_BUDGET_MS * HEADROOM
}

/// The linear model of a batched tick behind the capacity figures, from the probe (ms).
struct Model {
    /// Encode + decode of one conversation (each conversation's Mimi pass counted whole).
    codec: f64,
    /// LM step of one conversation at position 0: the weight-bound part a format change scales.
    lm0: f64,
    rows: usize,
    /// LM step of 1 and of `rows` conversations, at the start and at the full context.
    start: (f64, f64),
    full: (f64, f64),
}

impl Model {
    fn new(p: &Probe) -> Model {
        let ms = |us: u32| f64::from(us) / 1e3;
        Model {
            codec: ms(p.start.encode_us) + ms(p.start.decode_us),
            lm0: ms(p.start.lm_us),
            rows: p.rows.max(1),
            start: (ms(p.start.lm_us), ms(p.rows_start_lm_us)),
            full: (ms(p.full_lm_us), ms(p.rows_full_lm_us)),
        }
    }

    /// A tick of `n` conversations (1..=rows), all at the start or all at the full context, with the
    /// weights' bytes scaled by `ratio` (1 for the loaded format): n codec passes plus the LM step,
    /// interpolated linearly between the timed 1 and `rows`.
    fn tick(&self, n: usize, full: bool, ratio: f64) -> f64 {
        let (one, many) = if full { self.full } else { self.start };
        let lm = if self.rows > 1 {
            one + (n - 1) as f64 * (many - one) / (self.rows - 1) as f64
        } else {
            one
        };
        n as f64 * self.codec + lm - self.lm0 * (1.0 - ratio)
    }

    /// The most conversations (up to `rows`, the most timed) whose tick fits the limit.
    fn capacity(&self, full: bool, ratio: f64) -> usize {
        (1..=self.rows)
            .take_while(|&n| self.tick(n, full, ratio) <= limit_ms())
            .last()
            .unwrap_or(0)
    }
}

/// The notice for what was measured: the frame pass at the start and at the full context against the
/// 80 ms a frame lasts, how many conversations this machine holds, and (when one does not keep up)
/// what would help. The verdict and the ratio never contradict each other: under 90 % of the budget it
/// keeps up, up to 100 % it is at the limit (it keeps up only while nothing else runs), above it it
/// does not.
pub fn verdict(m: &Measured) -> Verdict {
    let model = Model::new(&m.probe);
    let start = f64::from(m.probe.start.total_us) / 1e3;
    let full = m.full.then(|| model.tick(1, true, 1.0));
    let fmt = format_name(m.format);
    let kv = match m.kv {
        KvDtype::F32 => "f32",
        KvDtype::Bf16 => "bf16",
    };
    let on = if m.gpu {
        "on the GPU".to_string()
    } else {
        crate::models::count(m.threads, "thread")
    };
    let mut text = format!(
        "real time: a frame pass (80 ms of audio) takes {start:.0} ms here at the start of a conversation"
    );
    if let Some(f) = full {
        let minutes = m.probe.context as f64 * FRAME_BUDGET_MS / 60e3;
        text += &format!(
            " and {f:.0} ms at its full context ({} frames, {minutes:.0} min)",
            m.probe.context
        );
    }
    text += &format!(" ({fmt} weights, {kv} KV, {on}; medians of passes after warm-up). ");
    let worst = full.unwrap_or(start);
    let pct = |ms: f64| 100.0 * ms / FRAME_BUDGET_MS;
    let holds = worst <= limit_ms();
    if holds {
        text += &format!(
            "{:.0} % of the 80 ms budget{}: one conversation keeps up.",
            pct(worst),
            if full.is_some() {
                " at the full context"
            } else {
                " (a long context adds to it)"
            }
        );
    } else if start > FRAME_BUDGET_MS {
        text += &format!(
            "{:.1}x the 80 ms a frame lasts from the start: this machine does NOT keep up. Input will \
             queue, the oldest frames will be dropped and the answer will come late and broken.",
            start / FRAME_BUDGET_MS
        );
    } else if start > limit_ms() {
        text += &format!(
            "{:.0} % of the 80 ms a frame lasts from the start: at the limit, this machine keeps up only \
             while nothing else runs (under {:.0} ms leaves room for the rest), and a long context adds \
             to it.",
            pct(start),
            limit_ms()
        );
    } else if worst <= FRAME_BUDGET_MS {
        text += &format!(
            "One conversation keeps up, but at the full context it takes {:.0} % of the 80 ms a frame \
             lasts: at the limit, frames will be dropped at the slightest load late in a conversation.",
            pct(worst)
        );
    } else {
        // Keeps up at the start, not at the full context: the LM grows with the keys it reads.
        let grow = (worst - start).max(f64::MIN_POSITIVE);
        let frames = ((limit_ms() - start) / grow * m.probe.context as f64).max(0.0);
        text += &format!(
            "One conversation keeps up for about its first {:.1} min, then needs up to {:.1}x the 80 ms a \
             frame lasts: this machine does NOT keep up with a long conversation (input will queue and \
             the oldest frames will be dropped).",
            frames * FRAME_BUDGET_MS / 60e3,
            worst / FRAME_BUDGET_MS
        );
    }
    let bits = bits_per_weight(m.format);
    let other = if m.format == WeightFormat::Q4_0 {
        WeightFormat::Q8_0
    } else {
        WeightFormat::Q4_0
    };
    let ratio = bits_per_weight(other) / bits;
    let mut capacity = Vec::new();
    if m.full {
        capacity.push(Capacity {
            format: fmt.clone(),
            measured: true,
            at_start: model.capacity(false, 1.0),
            at_full: model.capacity(true, 1.0),
        });
        capacity.push(Capacity {
            format: format_name(other),
            measured: false,
            at_start: model.capacity(false, ratio),
            at_full: model.capacity(true, ratio),
        });
        let says = |c: &Capacity| {
            let n = |k: usize| match k {
                0 => "none".to_string(),
                k if k == model.rows && model.rows > 1 => format!("{k} (every slot timed)"),
                k => k.to_string(),
            };
            format!(
                "{} ({}): {} through a full context, {} at their start",
                c.format,
                if c.measured {
                    "measured".to_string()
                } else {
                    format!(
                        "estimated from {:.0} % of the bytes per frame",
                        100.0 * ratio
                    )
                },
                n(c.at_full),
                n(c.at_start)
            )
        };
        let workers = if m.workers > 1 {
            format!(
                " per worker ({} workers step at once and share the memory bandwidth, so all of them \
                 together hold less than {} times that)",
                m.workers, m.workers
            )
        } else {
            String::new()
        };
        text += &format!(
            " Conversations at once in real time here{workers}, in one batched step (Mimi counted whole \
             per conversation: an upper bound): {}; {}.",
            says(&capacity[0]),
            says(&capacity[1])
        );
    }
    if !holds {
        let mut helps = Vec::new();
        if !m.gpu && m.threads * m.workers < m.cores {
            helps.push(format!(
                "more threads (--threads {}: this machine has {} physical cores; the LM step is bound by \
                 memory bandwidth, so the gain stops where the bandwidth is used up)",
                m.cores / m.workers.max(1),
                m.cores
            ));
        }
        if m.kv == KvDtype::F32 {
            helps.push(
                "--kv-dtype bf16, the default that --kv-dtype f32 replaced (half the bytes of the KV \
                 caches: the long-context cost halves)"
                    .into(),
            );
        }
        if bits > 5.0 {
            // The LM step reads its weights once per frame; q4_0 reads `ratio` of them.
            helps.push(format!(
                "a 4-bit bundle (q4_0 reads {:.0} % of the bytes of {fmt} per frame: about {:.0} ms here \
                 at the start{}, estimated)",
                100.0 * ratio,
                start - model.lm0 * (1.0 - ratio),
                match full {
                    Some(_) => format!(
                        " and {:.0} ms at the full context",
                        model.tick(1, true, ratio)
                    ),
                    None => String::new(),
                }
            ));
        }
        if m.gpu {
            helps.push("a faster GPU".into());
        } else {
            helps.push("a GPU (--device gpu, where this build and machine have one)".into());
        }
        text += &format!(" What would help: {}.", helps.join("; "));
    }
    Verdict {
        text,
        start_ms: start,
        full_ms: full,
        holds,
        capacity,
    }
}

/// The notice text alone (see [`verdict`]).
pub fn notice(m: &Measured) -> String {
    verdict(m).text
}

/// What was measured for `probe` of `engine`, whose workers are `workers` (`full`: see
/// [`Measured::full`]).
pub fn measured(engine: &Engine, probe: Probe, full: bool, workers: usize) -> Measured {
    Measured {
        probe,
        full,
        format: engine.weight_format(),
        kv: engine.options().kv_dtype,
        threads: engine.options().device.threads(),
        workers: workers.max(1),
        cores: runtime::physical_cores(),
        gpu: engine.gpu_adapter().is_some(),
    }
}

/// What `duplex` measured: its own session's first pass at position 0.
pub fn measured_start(engine: &Engine, start: runtime::FrameTimings) -> Measured {
    let probe = Probe {
        start,
        rows: 1,
        rows_start_lm_us: start.lm_us,
        ..Probe::default()
    };
    measured(engine, probe, false, 1)
}

/// Passes `serve` times per shape at start-up after an uncounted first one (which compiles GPU
/// pipelines and faults in the weights).
pub const TIMED_PASSES: usize = 3;

/// Times what the notice of `serve` needs ([`runtime::realtime::probe`]) with `rows` conversations in
/// the batched step of each of `workers` workers: the rows' full-context KV caches are allocated
/// for the probe and freed before it returns.
pub fn measure(engine: &std::sync::Arc<Engine>, rows: usize, workers: usize) -> Result<Measured> {
    let probe = runtime::realtime::probe(engine, rows, TIMED_PASSES)
        .context("timing frames after warm-up")?;
    Ok(measured(engine, probe, true, workers))
}

#[cfg(test)]
#[path = "realtime_tests.rs"]
mod tests;
