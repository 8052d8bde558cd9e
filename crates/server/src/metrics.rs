//! Server counters, rendered as Prometheus text at `GET /metrics`.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use crate::protocol::SessionCommand;

/// Upper bounds (seconds) of the frame step-time histogram buckets.
const STEP_BUCKETS: [f64; 10] = [0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.4, 1.0];

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
    /// Commands received from clients, indexed by [`SessionCommand::index`].
    pub commands: [AtomicU64; 4],
    /// Largest input backlog (frames) over the active sessions at the last frame.
    pub lag_frames: AtomicU64,
    /// Largest input backlog (frames) ever observed.
    pub lag_frames_max: AtomicU64,
    step_buckets: [AtomicU64; STEP_BUCKETS.len()],
    step_count: AtomicU64,
    step_sum_us: AtomicU64,
}

impl Metrics {
    /// Records the wall time of one frame pass.
    pub fn observe_step(&self, micros: u64) {
        let s = micros as f64 * 1e-6;
        for (i, &b) in STEP_BUCKETS.iter().enumerate() {
            if s <= b {
                self.step_buckets[i].fetch_add(1, Relaxed);
            }
        }
        self.step_count.fetch_add(1, Relaxed);
        self.step_sum_us.fetch_add(micros, Relaxed);
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
            "# HELP moshi_step_seconds Wall time of one frame pass.\n# TYPE moshi_step_seconds histogram"
        );
        for (i, b) in STEP_BUCKETS.iter().enumerate() {
            let _ = writeln!(
                s,
                "moshi_step_seconds_bucket{{le=\"{b}\"}} {}",
                self.step_buckets[i].load(Relaxed)
            );
        }
        let count = self.step_count.load(Relaxed);
        let _ = writeln!(s, "moshi_step_seconds_bucket{{le=\"+Inf\"}} {count}");
        let _ = writeln!(
            s,
            "moshi_step_seconds_sum {}",
            self.step_sum_us.load(Relaxed) as f64 * 1e-6
        );
        let _ = writeln!(s, "moshi_step_seconds_count {count}");
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
