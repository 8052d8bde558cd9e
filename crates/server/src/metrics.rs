//! Server counters, rendered as Prometheus text at `GET /metrics`.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use crate::backend::FrameEvent;
use crate::protocol::{RealtimeNotice, SessionCommand};

/// Upper bounds (seconds) of the latency histogram buckets: from a Mimi encode on many cores (a few ms)
/// to a q8 LM step on two (hundreds of ms); 0.08 is the real-time budget of a frame.
const BUCKETS: [f64; 14] = [
    0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.4, 0.6, 1.0,
];

/// A latency histogram over fixed buckets (2.5 ms to 1 s, and above): relaxed atomic adds only, so
/// recording never blocks or allocates, and a scrape sees each counter exact (the buckets of one
/// frame may be seen apart).
#[derive(Debug, Default)]
pub struct Histogram {
    /// Observations per bucket, not cumulative (index `BUCKETS.len()`: above the last bound).
    buckets: [AtomicU64; BUCKETS.len() + 1],
    count: AtomicU64,
    sum_us: AtomicU64,
}

impl Histogram {
    /// Records one observation of `micros` microseconds.
    pub fn observe_us(&self, micros: u64) {
        let s = micros as f64 * 1e-6;
        let i = BUCKETS
            .iter()
            .position(|&b| s <= b)
            .unwrap_or(BUCKETS.len());
        self.buckets[i].fetch_add(1, Relaxed);
        self.sum_us.fetch_add(micros, Relaxed);
        self.count.fetch_add(1, Relaxed);
    }

    /// Observations so far.
    pub fn count(&self) -> u64 {
        self.count.load(Relaxed)
    }

    /// The `_bucket`, `_sum` and `_count` lines of `name`, with `labels` (`key="value"` pairs, or "")
    /// before `le`.
    pub(crate) fn render(&self, s: &mut String, name: &str, labels: &str) {
        let sep = if labels.is_empty() { "" } else { "," };
        let mut cumulative = 0;
        for (i, b) in BUCKETS.iter().enumerate() {
            cumulative += self.buckets[i].load(Relaxed);
            let _ = writeln!(s, "{name}_bucket{{{labels}{sep}le=\"{b}\"}} {cumulative}");
        }
        cumulative += self.buckets[BUCKETS.len()].load(Relaxed);
        let _ = writeln!(s, "{name}_bucket{{{labels}{sep}le=\"+Inf\"}} {cumulative}");
        let braces = if labels.is_empty() {
            String::new()
        } else {
            format!("{{{labels}}}")
        };
        let _ = writeln!(
            s,
            "{name}_sum{braces} {}",
            self.sum_us.load(Relaxed) as f64 * 1e-6
        );
        let _ = writeln!(s, "{name}_count{braces} {cumulative}");
    }
}

/// The phases of a frame pass with a histogram each, in `moshi_phase_seconds{phase=...}`.
pub const PHASES: [&str; 3] = ["encode", "lm", "decode"];

/// All server counters. Everything is atomic; reading never blocks a session.
#[derive(Debug, Default)]
pub struct Metrics {
    /// Sessions currently holding a slot.
    pub sessions_active: AtomicU64,
    /// Clients waiting for a slot.
    pub sessions_waiting: AtomicU64,
    /// Sessions started since launch.
    pub sessions_total: AtomicU64,
    /// Clients refused (queue full, bad parameters, engine error).
    pub sessions_rejected: AtomicU64,
    /// WebSocket connections currently open (any state).
    pub connections_open: AtomicU64,
    /// Model frames completed from client audio (input side).
    pub frames_in: AtomicU64,
    /// Model frames processed (one LM step each).
    pub frames_processed: AtomicU64,
    /// Input frames dropped because the model fell behind real time.
    pub frames_dropped: AtomicU64,
    /// Outgoing messages dropped because a client read too slowly.
    pub messages_dropped: AtomicU64,
    /// Audio messages sent.
    pub audio_messages_out: AtomicU64,
    /// Text messages sent.
    pub text_messages_out: AtomicU64,
    /// Client messages ignored (unknown kinds, text frames, empty).
    pub messages_ignored: AtomicU64,
    /// Opus packets that could not be decoded, plus bytes of Ogg data skipped (as packets: see name).
    pub bad_opus_packets: AtomicU64,
    /// Bytes of client data skipped while resynchronising the Ogg stream.
    pub ogg_bytes_skipped: AtomicU64,
    /// `/api/chat` requests refused for a missing or wrong token (HTTP 401).
    pub unauthorized: AtomicU64,
    /// Sessions closed because their client sent no audio for the idle timeout.
    pub sessions_idle_closed: AtomicU64,
    /// Conversations admitted at once (`ServeConfig::max_sessions`; constant).
    pub sessions_max: AtomicU64,
    /// Commands received from clients, indexed by [`SessionCommand::index`].
    pub commands: [AtomicU64; 4],
    /// Largest input backlog (frames) over the active sessions at the last frame.
    pub lag_frames: AtomicU64,
    /// Largest input backlog (frames) ever observed.
    pub lag_frames_max: AtomicU64,
    /// Wall time of whole frame passes (encode + LM + decode).
    pub step: Histogram,
    /// Wall time of each phase of a frame pass, in the order of [`PHASES`].
    pub phases: [Histogram; PHASES.len()],
    /// From a frame's arrival (the client audio that completed it) to the end of its pass.
    pub lag: Histogram,
    /// The speech-to-text route's counters (`/api/asr-streaming`).
    pub stt: SttMetrics,
    /// The real-time verdict measured at start-up (set once; the same as the metadata message's).
    realtime: std::sync::OnceLock<RealtimeNotice>,
}

impl Metrics {
    /// Publishes the start-up real-time verdict as gauges (the first call wins: it is measured once).
    pub fn set_realtime(&self, notice: RealtimeNotice) {
        let _ = self.realtime.set(notice);
    }

    /// The `moshi_realtime_*` gauges of the start-up verdict, when one was measured.
    fn render_realtime(&self, s: &mut String) {
        let Some(r) = self.realtime.get() else {
            return;
        };
        let _ = writeln!(
            s,
            "# HELP moshi_realtime_frame_seconds One conversation's frame pass measured at start-up after \
             warm-up, at KV position 0 (kv=\"start\") and at the full context (kv=\"full\"); real time is 0.08.\n\
             # TYPE moshi_realtime_frame_seconds gauge\n\
             moshi_realtime_frame_seconds{{kv=\"start\"}} {}",
            r.frame_ms / 1e3
        );
        if let Some(full) = r.frame_full_ms {
            let _ = writeln!(
                s,
                "moshi_realtime_frame_seconds{{kv=\"full\"}} {}",
                full / 1e3
            );
        }
        let _ = writeln!(
            s,
            "# HELP moshi_realtime_holds 1 when one conversation keeps up with real time (with headroom) \
             through a full context, as measured at start-up.\n# TYPE moshi_realtime_holds gauge\n\
             moshi_realtime_holds {}",
            u8::from(r.holds)
        );
        if r.conversations.is_empty() {
            return;
        }
        let _ = writeln!(
            s,
            "# HELP moshi_realtime_conversations Conversations this server holds in real time at once, per \
             weight format (basis: measured for the served format, estimated from bytes per frame for \
             another), all at their start (kv=\"start\") or all at the full context (kv=\"full\").\n\
             # TYPE moshi_realtime_conversations gauge"
        );
        for c in &r.conversations {
            for (kv, n) in [("start", c.at_start), ("full", c.at_full)] {
                let _ = writeln!(
                    s,
                    "moshi_realtime_conversations{{format=\"{}\",basis=\"{}\",kv=\"{kv}\"}} {n}",
                    c.format, c.basis
                );
            }
        }
    }

    /// Records the wall time of one frame pass.
    pub fn observe_step(&self, micros: u64) {
        self.step.observe_us(micros);
    }

    /// Records every latency of one frame pass: the whole pass, each phase and the arrival-to-answer lag.
    pub fn observe_frame(&self, f: &FrameEvent) {
        let t = &f.timings;
        self.step.observe_us(u64::from(t.total_us));
        for (h, us) in self.phases.iter().zip([t.encode_us, t.lm_us, t.decode_us]) {
            h.observe_us(u64::from(us));
        }
        self.lag.observe_us(u64::from(t.lag_us));
    }

    /// Records the current input backlog of one session.
    pub fn observe_lag(&self, frames: u64) {
        self.lag_frames.store(frames, Relaxed);
        self.lag_frames_max.fetch_max(frames, Relaxed);
    }

    /// Prometheus text exposition format.
    pub fn render(&self) -> String {
        let mut s = String::with_capacity(4096);
        let mut put = |name: &str, kind: &str, help: &str, v: u64| {
            let _ = writeln!(s, "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {v}");
        };
        put(
            "moshi_sessions_active",
            "gauge",
            "Sessions holding a slot.",
            self.sessions_active.load(Relaxed),
        );
        put(
            "moshi_sessions_waiting",
            "gauge",
            "Clients waiting for a slot.",
            self.sessions_waiting.load(Relaxed),
        );
        put(
            "moshi_sessions_total",
            "counter",
            "Sessions started.",
            self.sessions_total.load(Relaxed),
        );
        put(
            "moshi_sessions_rejected_total",
            "counter",
            "Clients refused.",
            self.sessions_rejected.load(Relaxed),
        );
        put(
            "moshi_connections_open",
            "gauge",
            "Open WebSocket connections.",
            self.connections_open.load(Relaxed),
        );
        put(
            "moshi_frames_in_total",
            "counter",
            "80 ms input frames received.",
            self.frames_in.load(Relaxed),
        );
        put(
            "moshi_frames_processed_total",
            "counter",
            "Model frames processed.",
            self.frames_processed.load(Relaxed),
        );
        put(
            "moshi_frames_dropped_total",
            "counter",
            "Input frames dropped because the model fell behind.",
            self.frames_dropped.load(Relaxed),
        );
        put(
            "moshi_messages_dropped_total",
            "counter",
            "Outgoing messages dropped for slow readers.",
            self.messages_dropped.load(Relaxed),
        );
        put(
            "moshi_audio_messages_out_total",
            "counter",
            "Audio messages sent.",
            self.audio_messages_out.load(Relaxed),
        );
        put(
            "moshi_text_messages_out_total",
            "counter",
            "Text messages sent.",
            self.text_messages_out.load(Relaxed),
        );
        put(
            "moshi_messages_ignored_total",
            "counter",
            "Client messages ignored.",
            self.messages_ignored.load(Relaxed),
        );
        put(
            "moshi_bad_opus_packets_total",
            "counter",
            "Undecodable client Opus packets.",
            self.bad_opus_packets.load(Relaxed),
        );
        put(
            "moshi_ogg_bytes_skipped_total",
            "counter",
            "Client bytes skipped resynchronising Ogg.",
            self.ogg_bytes_skipped.load(Relaxed),
        );
        put(
            "moshi_lag_frames",
            "gauge",
            "Input backlog in 80 ms frames at the last frame.",
            self.lag_frames.load(Relaxed),
        );
        put(
            "moshi_lag_frames_max",
            "gauge",
            "Largest input backlog seen, in 80 ms frames.",
            self.lag_frames_max.load(Relaxed),
        );
        put(
            "moshi_sessions_idle_closed_total",
            "counter",
            "Sessions closed because the client sent no audio for the idle timeout.",
            self.sessions_idle_closed.load(Relaxed),
        );
        put(
            "moshi_sessions_max",
            "gauge",
            "Conversations admitted at once.",
            self.sessions_max.load(Relaxed),
        );
        put(
            "moshi_unauthorized_total",
            "counter",
            "/api/chat requests refused for a missing or wrong token.",
            self.unauthorized.load(Relaxed),
        );
        let _ = writeln!(
            s,
            "# HELP moshi_session_commands_total Commands received from clients.\n# TYPE moshi_session_commands_total counter"
        );
        for c in SessionCommand::ALL {
            let _ = writeln!(
                s,
                "moshi_session_commands_total{{command=\"{}\"}} {}",
                c.name(),
                self.commands[c.index()].load(Relaxed)
            );
        }
        let _ = writeln!(
            s,
            "# HELP moshi_step_seconds Wall time of one frame pass (encode + LM + decode).\n# TYPE moshi_step_seconds histogram"
        );
        self.step.render(&mut s, "moshi_step_seconds", "");
        let _ = writeln!(
            s,
            "# HELP moshi_phase_seconds Wall time of each phase of a frame pass (encode: Mimi encode; lm: \
             temporal transformer, Depformer and sampling; decode: Mimi decode, detokenization, resampling).\n\
             # TYPE moshi_phase_seconds histogram"
        );
        for (h, phase) in self.phases.iter().zip(PHASES) {
            h.render(&mut s, "moshi_phase_seconds", &format!("phase=\"{phase}\""));
        }
        let _ = writeln!(
            s,
            "# HELP moshi_frame_lag_seconds From a frame's arrival (the client audio completing it) to the end \
             of its pass: queueing plus the pass.\n# TYPE moshi_frame_lag_seconds histogram"
        );
        self.lag.render(&mut s, "moshi_frame_lag_seconds", "");
        self.stt.render(&mut s);
        self.render_realtime(&mut s);
        s
    }
}

/// Counters of `/api/asr-streaming`, rendered with the others at `/metrics`.
#[derive(Debug, Default)]
pub struct SttMetrics {
    /// Streams holding a slot.
    pub streams_active: AtomicU64,
    /// Clients waiting for a slot.
    pub streams_waiting: AtomicU64,
    /// Streams started.
    pub streams_total: AtomicU64,
    /// Clients refused (queue full, bad messages, the model failed).
    pub streams_rejected: AtomicU64,
    /// Streams admitted at once (constant; 0 without a speech-to-text model).
    pub streams_max: AtomicU64,
    /// Model steps run over all streams (one 80 ms frame each).
    pub steps: AtomicU64,
    /// Words sent.
    pub words: AtomicU64,
    /// Markers echoed.
    pub markers: AtomicU64,
    /// Requests refused for a missing or wrong token.
    pub unauthorized: AtomicU64,
    /// Wall time of the batched tick that ran each stream's step.
    pub tick: Histogram,
}

impl SttMetrics {
    /// Appends the Prometheus lines.
    pub fn render(&self, s: &mut String) {
        let mut put = |name: &str, kind: &str, help: &str, v: &AtomicU64| {
            let _ = writeln!(
                s,
                "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {}",
                v.load(Relaxed)
            );
        };
        put(
            "moshi_stt_streams_active",
            "gauge",
            "Speech-to-text streams holding a slot.",
            &self.streams_active,
        );
        put(
            "moshi_stt_streams_waiting",
            "gauge",
            "Speech-to-text clients waiting for a slot.",
            &self.streams_waiting,
        );
        put(
            "moshi_stt_streams_total",
            "counter",
            "Speech-to-text streams started.",
            &self.streams_total,
        );
        put(
            "moshi_stt_streams_rejected_total",
            "counter",
            "Speech-to-text clients refused.",
            &self.streams_rejected,
        );
        put(
            "moshi_stt_streams_max",
            "gauge",
            "Speech-to-text streams admitted at once.",
            &self.streams_max,
        );
        put(
            "moshi_stt_steps_total",
            "counter",
            "Speech-to-text model steps (80 ms frames) over all streams.",
            &self.steps,
        );
        put(
            "moshi_stt_words_total",
            "counter",
            "Words sent.",
            &self.words,
        );
        put(
            "moshi_stt_markers_total",
            "counter",
            "Markers echoed.",
            &self.markers,
        );
        put(
            "moshi_stt_unauthorized_total",
            "counter",
            "/api/asr-streaming requests refused for a missing or wrong token.",
            &self.unauthorized,
        );
        let _ = writeln!(
            s,
            "# HELP moshi_stt_tick_seconds Wall time of the batched tick (Mimi encode + LM step of every \
             stream stepped together), once per stream step.\n# TYPE moshi_stt_tick_seconds histogram"
        );
        self.tick.render(s, "moshi_stt_tick_seconds", "");
    }
}

/// Holds a gauge one higher while it lives: the count of what is in some state (open, waiting,
/// active) stays right on every way out of that state, an early return or a dropped future included.
pub(crate) struct Gauge<'a>(&'a AtomicU64);

impl<'a> Gauge<'a> {
    /// Raises `a` by one until the guard drops.
    pub(crate) fn inc(a: &'a AtomicU64) -> Self {
        Gauge::join(a).0
    }

    /// Raises `a` by one until the guard drops, and says what it was before (the place in a queue).
    pub(crate) fn join(a: &'a AtomicU64) -> (Self, u64) {
        let before = a.fetch_add(1, Relaxed);
        (Gauge(a), before)
    }
}

impl Drop for Gauge<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every histogram of a frame counts it once; each phase lands in its own bucket.
    #[test]
    fn a_frame_counts_once_in_every_histogram() {
        let m = Metrics::default();
        let f = FrameEvent {
            timings: runtime::FrameTimings {
                total_us: 90_000,
                encode_us: 3_000,
                lm_us: 70_000,
                decode_us: 17_000,
                lag_us: 250_000,
                ..Default::default()
            },
            ..Default::default()
        };
        m.observe_frame(&f);
        m.observe_frame(&f);
        let t = m.render();
        for name in [
            "moshi_step_seconds_count 2",
            "moshi_phase_seconds_count{phase=\"encode\"} 2",
            "moshi_phase_seconds_count{phase=\"lm\"} 2",
            "moshi_phase_seconds_count{phase=\"decode\"} 2",
            "moshi_frame_lag_seconds_count 2",
            "moshi_phase_seconds_bucket{phase=\"encode\",le=\"0.0025\"} 0",
            "moshi_phase_seconds_bucket{phase=\"encode\",le=\"0.005\"} 2",
            "moshi_phase_seconds_bucket{phase=\"lm\",le=\"0.06\"} 0",
            "moshi_phase_seconds_bucket{phase=\"lm\",le=\"0.08\"} 2",
            "moshi_frame_lag_seconds_bucket{le=\"0.2\"} 0",
            "moshi_frame_lag_seconds_bucket{le=\"0.3\"} 2",
            "moshi_step_seconds_bucket{le=\"0.1\"} 2",
        ] {
            assert!(t.contains(name), "missing `{name}` in\n{t}");
        }
    }

    /// The start-up verdict is published as the metadata carries it: both frame times, the verdict and
    /// every format's conversation counts; nothing before it is set.
    #[test]
    fn the_realtime_verdict_is_published_as_gauges() {
        let m = Metrics::default();
        assert!(!m.render().contains("moshi_realtime"));
        m.set_realtime(RealtimeNotice {
            frame_ms: 46.0,
            frame_full_ms: Some(64.0),
            holds: true,
            conversations: vec![
                crate::protocol::RealtimeCapacity {
                    format: "q4_0".into(),
                    basis: "measured",
                    at_start: 4,
                    at_full: 1,
                },
                crate::protocol::RealtimeCapacity {
                    format: "q8_0".into(),
                    basis: "estimated",
                    at_start: 0,
                    at_full: 0,
                },
            ],
            text: String::new(),
        });
        let t = m.render();
        for line in [
            "moshi_realtime_frame_seconds{kv=\"start\"} 0.046",
            "moshi_realtime_frame_seconds{kv=\"full\"} 0.064",
            "moshi_realtime_holds 1",
            "moshi_realtime_conversations{format=\"q4_0\",basis=\"measured\",kv=\"start\"} 4",
            "moshi_realtime_conversations{format=\"q4_0\",basis=\"measured\",kv=\"full\"} 1",
            "moshi_realtime_conversations{format=\"q8_0\",basis=\"estimated\",kv=\"full\"} 0",
        ] {
            assert!(t.contains(line), "missing `{line}` in\n{t}");
        }
    }

    #[test]
    fn histogram_is_cumulative() {
        let m = Metrics::default();
        m.observe_step(15_000);
        m.observe_step(70_000);
        m.observe_step(5_000_000);
        let t = m.render();
        assert!(t.contains("moshi_step_seconds_bucket{le=\"0.01\"} 0"));
        assert!(t.contains("moshi_step_seconds_bucket{le=\"0.02\"} 1"));
        assert!(t.contains("moshi_step_seconds_bucket{le=\"0.08\"} 2"));
        assert!(t.contains("moshi_step_seconds_bucket{le=\"+Inf\"} 3"));
        assert!(t.contains("moshi_step_seconds_count 3"));
    }
}
