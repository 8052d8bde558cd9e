//! The flags of `moshi-native bench` and the small helpers every bench part shares (statistics, the pool
//! settle). A leaf module: the bench parts (`drivers`, `batch`, `on_gpu`) import it, it imports
//! none of them.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, ValueEnum};

/// What `moshi-native bench` measures.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum What {
    /// Everything below except `batch`, `duplex` and `stt`, in one run.
    All,
    /// Streaming read bandwidth only.
    Probe,
    /// Kernel matvec GB/s and the Mimi conv stack.
    Kernels,
    /// LM frame per format, thread count and KV position.
    Lm,
    /// Mimi encode/decode per frame.
    Mimi,
    /// Conversation slots coded together against one by one (`--slots`; the server tick with `--bundle`).
    Batch,
    /// The whole frame pass through the runtime's session, worker thread and input ring, per phase, with
    /// its overhead over the LM frame and the Mimi encode + decode timed alone.
    Duplex,
    /// Speech-to-text: the batched tick (32-codebook Mimi encode + STT step) of `--streams` streams
    /// against the same streams one at a time, and the real-time streams per variant and format.
    Stt,
}

/// Flags of `moshi-native bench`.
#[derive(Args, Debug, Clone)]
pub struct BenchArgs {
    /// What to measure.
    #[arg(value_enum, default_value = "all")]
    pub what: What,
    /// Thread counts (interleaved within each round).
    #[arg(long, value_delimiter = ',', default_value = "1,2")]
    pub threads: Vec<usize>,
    /// LM weight formats (synthetic, in memory): q8_0, q4_0, bf16, f32, mlx-q4, mlx-q8.
    /// Ignored with `--bundle`.
    #[arg(long, value_delimiter = ',', default_value = "q8_0,q4_0,bf16")]
    pub formats: Vec<String>,
    /// Temporal KV positions to time the LM frame at (the generator jumps there with
    /// `LmGen::seek_for_bench`: the KV rings hold that many entries, so attention reads the real
    /// window).
    #[arg(long, value_delimiter = ',', default_value = "0,375,3000")]
    pub positions: Vec<usize>,
    /// Temporal KV cache element types, each timed with its own generator: bf16, f32 (the runtime
    /// default; a 3000-entry cache is 3.1 GB).
    #[arg(long, value_delimiter = ',', default_value = "bf16")]
    pub kv: Vec<String>,
    /// Rounds (each round runs every thread count once).
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// Timed LM frames per (round, threads).
    #[arg(long, default_value_t = 2)]
    pub lm_frames: usize,
    /// Timed Mimi frames per (round, threads).
    #[arg(long, default_value_t = 20)]
    pub mimi_frames: usize,
    /// Load the LM and Mimi from this bundle (e.g. written by `moshi-native synth`) instead of
    /// building synthetic weights in memory.
    #[arg(long, value_name = "DIR")]
    pub bundle: Option<PathBuf>,
    /// Sessions in the batched LM step (`LmBatchGen`), timed interleaved with the single-session
    /// frame and reported as a ratio to it; 0 or 1 = skip. Only for formats of at most 8.5 bits
    /// per weight (the batch's KV caches cost 1.6 GB per session in bf16).
    #[arg(long, default_value_t = 4)]
    pub batch: usize,
    /// `bench batch` (and `bench mimi|duplex --device gpu`, 0 or 1 = skip): conversation slots per tick.
    #[arg(long, default_value_t = 4)]
    pub slots: usize,
    /// `bench stt`: stream counts of the tick.
    #[arg(long, value_delimiter = ',', default_value = "1,8,32,64")]
    pub streams: Vec<usize>,
    /// `bench stt`: released STT models to synthesise (stt-1b, stt-2.6b); ignored with `--bundle`.
    #[arg(long, value_delimiter = ',', default_value = "stt-1b")]
    pub stt_variants: Vec<String>,
    /// `bench stt`: KV position of every stream (absent: the full context window, the steady state
    /// of a stream older than the context).
    #[arg(long, value_name = "STEPS")]
    pub stt_position: Option<usize>,
    /// `bench stt`: skip the cells whose KV caches would take more than this many GB.
    #[arg(long, default_value_t = 8.0)]
    pub stt_max_kv_gb: f64,
    /// Read-probe buffer size in MiB (well above the last-level cache).
    #[arg(long, default_value_t = 512)]
    pub probe_mb: usize,
    /// Duplex: frames through the session per (round, threads).
    #[arg(long, default_value_t = 6)]
    pub duplex_frames: usize,
    /// Duplex: output rate of the session (24000 = the model's, no resampling, as `serve` and
    /// `duplex` run).
    #[arg(long, default_value_t = 24_000)]
    pub output_rate: u32,
    /// Duplex: print every frame's phases (stderr).
    #[arg(long)]
    pub per_frame: bool,
    /// LM and Mimi: time every cell twice per round, with the AVX-512 kernels allowed and forbidden
    /// (`kernels::set_avx512_allowed`, interleaved), reported as `simd=avx512` / `simd=avx2`.
    #[arg(long)]
    pub ab_avx512: bool,
    /// With `--device gpu`: time every kernel launch with device timestamps (where the adapter has
    /// them inside compute passes; else launches are counted, untimed) and print, per cell, figures
    /// per frame: `profile kernel=NAME shape=XxYxZ calls=N us=T bytes=B gbps=G` (shape = workgroups
    /// per launch, bytes = storage bound) and `profile host phase=record|submit|wait us=T`. The
    /// timed frames then include the timestamps' own cost.
    #[arg(long)]
    pub profile: bool,
}

/// Median (mean of the two middle values for an even count), min and max.
pub(crate) fn stats(v: &[f64]) -> (f64, f64, f64) {
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    if s.is_empty() {
        return (f64::NAN, f64::NAN, f64::NAN);
    }
    let n = s.len();
    let med = if n % 2 == 1 {
        s[n / 2]
    } else {
        0.5 * (s[n / 2 - 1] + s[n / 2])
    };
    (med, s[0], s[n - 1])
}

/// A result line's fields for the per-round ratios `v`: ` {median}=… {min}=… {max}=…` (three
/// decimals) under the three names given, or nothing when no ratio was taken.
pub(crate) fn ratio_fields(v: &[f64], [median, min, max]: [&str; 3]) -> String {
    if v.is_empty() {
        return String::new();
    }
    let (r, lo, hi) = stats(v);
    format!(" {median}={r:.3} {min}={lo:.3} {max}={hi:.3}")
}

/// Lets a multi-thread pool's worker finish spinning and park before a 1-thread measurement.
pub(crate) fn settle() {
    std::thread::sleep(Duration::from_millis(3));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_are_median_min_max() {
        assert_eq!(stats(&[3.0, 1.0, 2.0]), (2.0, 1.0, 3.0));
        assert_eq!(stats(&[4.0, 1.0]), (2.5, 1.0, 4.0));
        assert!(stats(&[]).0.is_nan());
    }
}
