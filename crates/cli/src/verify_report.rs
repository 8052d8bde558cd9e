//! The verdict screen of `moshi-native verify` ([`Report`]: one [`Verdict`] per check) and the
//! Mimi round-trip check, shared by the Moshi checks (`cmd_verify`) and the speech-to-text ones
//! (`verify_stt`), which both write into one report.

use anyhow::Result;
use std::path::PathBuf;

use model::mimi::{Mimi, MimiDecoder, MimiEncoder};
use runtime::FRAME_SIZE;

/// Least correlation of the 20 ms energy envelopes (dB) of the clip and its Mimi round trip.
const MIN_ENVELOPE_CORRELATION: f64 = 0.7;
/// Largest level difference between the clip and its Mimi round trip (dB).
const MAX_LEVEL_DIFFERENCE_DB: f64 = 10.0;

/// Outcome of one check.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// The check passed.
    Pass,
    /// The check failed.
    Fail,
    /// Not applicable to random weights (value reported for information).
    RandomWeights,
}

/// One line of the report.
#[derive(Debug, Clone)]
pub struct Check {
    /// What was checked.
    pub name: &'static str,
    /// Outcome.
    pub verdict: Verdict,
    /// Measured values, or the cause of a failure.
    pub detail: String,
}

/// Everything `verify` found.
#[derive(Debug, Default)]
pub struct Report {
    /// Bundle directory.
    pub dir: PathBuf,
    /// Weight file format of the LM and of Mimi.
    pub format: String,
    /// Storage variant of the LM (e.g. `candle-q8_0`).
    pub variant: String,
    /// Engine load time (s).
    pub load_s: Option<f64>,
    /// Mean LM and Mimi (encode + decode) time per frame (ms), and the frames they cover.
    pub per_frame_ms: Option<(f64, f64, usize)>,
    /// Speech-to-text: mean time per frame of Mimi encode + model step (ms), and the frames.
    pub stt_frame_ms: Option<(f64, usize)>,
    /// Whether the weights were treated as random.
    pub random: bool,
    /// The checks, in the order they ran.
    pub checks: Vec<Check>,
}

impl Report {
    pub(crate) fn push(&mut self, name: &'static str, verdict: Verdict, detail: impl Into<String>) {
        self.checks.push(Check {
            name,
            verdict,
            detail: detail.into(),
        });
    }

    pub(crate) fn speech(&mut self, name: &'static str, ok: bool, detail: String) {
        let verdict = match (self.random, ok) {
            (true, _) => Verdict::RandomWeights,
            (false, true) => Verdict::Pass,
            (false, false) => Verdict::Fail,
        };
        self.push(name, verdict, detail);
    }

    /// The checks that failed.
    pub fn failures(&self) -> Vec<&Check> {
        self.checks
            .iter()
            .filter(|c| c.verdict == Verdict::Fail)
            .collect()
    }

    pub(crate) fn print(&self) {
        println!("moshi-native verify: {}", self.dir.display());
        println!("  format        {}", self.format);
        println!("  variant       {}", self.variant);
        match self.load_s {
            Some(s) => println!("  load time     {s:.2} s"),
            None => println!("  load time     (not loaded)"),
        }
        match (self.per_frame_ms, self.stt_frame_ms) {
            (Some((lm, mimi, n)), _) => println!(
                "  ms per frame  LM {lm:.2}, Mimi {mimi:.2} (encode + decode), over {n} frames of 80 ms"
            ),
            (None, Some((ms, n))) => println!(
                "  ms per frame  {ms:.2} (speech-to-text: Mimi encode + model step), over {n} frames of 80 ms"
            ),
            (None, None) => println!("  ms per frame  (not run)"),
        }
        println!("  checks");
        for c in &self.checks {
            let v = match c.verdict {
                Verdict::Pass => "PASS",
                Verdict::Fail => "FAIL",
                Verdict::RandomWeights => "random weights",
            };
            println!("    {v:<15} {:<26} {}", c.name, c.detail);
        }
        let failed = self.failures().len();
        let marked = self
            .checks
            .iter()
            .filter(|c| c.verdict == Verdict::RandomWeights)
            .count();
        let passed = self.checks.len() - failed - marked;
        if failed > 0 {
            println!("verdict: FAILED ({failed} failed, {passed} passed)");
        } else if marked > 0 {
            println!(
                "verdict: OK for random weights ({passed} passed; {marked} speech checks need trained weights)"
            );
        } else {
            println!("verdict: OK ({passed} passed)");
        }
    }
}

/// Streaming Mimi encode then decode of the clip, compared with the input.
pub(crate) fn mimi_check(r: &mut Report, mimi: &std::sync::Arc<Mimi>, clip: &[f32]) -> Result<()> {
    let fs = mimi.frame_size();
    let frames = clip.len().div_ceil(fs);
    let mut input = clip.to_vec();
    input.resize(frames * fs, 0.0);
    let mut enc = MimiEncoder::new(mimi.clone());
    let mut dec = MimiDecoder::new(mimi.clone());
    let mut out = vec![0.0f32; input.len()];
    let mut codes = Vec::new();
    for (i, frame) in input.chunks_exact(fs).enumerate() {
        codes.clear();
        codes.extend_from_slice(enc.encode_frame(frame)?);
        dec.decode_frame(&codes, &mut out[i * fs..(i + 1) * fs])?;
    }
    let cmp = compare(&input, &out);
    let ok = cmp.envelope_correlation >= MIN_ENVELOPE_CORRELATION
        && cmp.level_db.abs() <= MAX_LEVEL_DIFFERENCE_DB;
    r.speech(
        "Mimi round trip",
        ok,
        format!(
            "envelope correlation {:.2} (min {MIN_ENVELOPE_CORRELATION}), level {:+.1} dB, waveform SNR {:.1} dB at lag {} samples",
            cmp.envelope_correlation, cmp.level_db, cmp.snr_db, cmp.lag
        ),
    );
    Ok(())
}

pub(crate) fn rms(x: &[f32]) -> f64 {
    if x.is_empty() {
        return 0.0;
    }
    (x.iter().map(|&v| f64::from(v) * f64::from(v)).sum::<f64>() / x.len() as f64).sqrt()
}

pub(crate) fn db(rms: f64) -> f64 {
    20.0 * rms.max(1e-12).log10()
}

/// How a decoded signal compares with its input.
#[derive(Debug, Clone, Copy)]
struct Comparison {
    /// Waveform SNR at the best lag (dB). A neural codec at 1.1 kbit/s keeps the sound, not the
    /// exact waveform, so this is reported but not gated.
    snr_db: f64,
    /// The lag (samples) of `snr_db`.
    lag: usize,
    /// Pearson correlation of the 20 ms frame energies in dB, at that lag.
    envelope_correlation: f64,
    /// Output level minus input level (dB).
    level_db: f64,
}

fn compare(input: &[f32], output: &[f32]) -> Comparison {
    // Mimi's streaming delay is under one 80 ms frame; search up to two.
    let max_lag = (2 * FRAME_SIZE).min(output.len() / 2);
    let mut best = (f64::NEG_INFINITY, 0);
    for lag in (0..=max_lag).step_by(8) {
        let n = (output.len() - lag).min(input.len());
        let (x, y) = (&input[..n], &output[lag..lag + n]);
        let sig: f64 = x.iter().map(|&v| f64::from(v).powi(2)).sum();
        let err: f64 = x
            .iter()
            .zip(y)
            .map(|(&a, &b)| (f64::from(a) - f64::from(b)).powi(2))
            .sum();
        let snr = 10.0 * (sig.max(1e-20) / err.max(1e-20)).log10();
        if snr > best.0 {
            best = (snr, lag);
        }
    }
    let lag = best.1;
    let n = (output.len() - lag).min(input.len());
    let envelope = |x: &[f32]| -> Vec<f64> {
        x.chunks_exact(480)
            .map(|c| db(rms(c) + 1e-6))
            .collect::<Vec<f64>>()
    };
    let (ex, ey) = (envelope(&input[..n]), envelope(&output[lag..lag + n]));
    Comparison {
        snr_db: best.0,
        lag,
        envelope_correlation: pearson(&ex, &ey),
        level_db: db(rms(&output[lag..lag + n])) - db(rms(&input[..n])),
    }
}

fn pearson(a: &[f64], b: &[f64]) -> f64 {
    let n = a.len().min(b.len());
    if n < 2 {
        return 0.0;
    }
    let (ma, mb) = (
        a[..n].iter().sum::<f64>() / n as f64,
        b[..n].iter().sum::<f64>() / n as f64,
    );
    let (mut sab, mut saa, mut sbb) = (0.0, 0.0, 0.0);
    for i in 0..n {
        let (x, y) = (a[i] - ma, b[i] - mb);
        sab += x * y;
        saa += x * x;
        sbb += y * y;
    }
    if saa <= 0.0 || sbb <= 0.0 {
        return 0.0;
    }
    sab / (saa * sbb).sqrt()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn comparison_finds_delay_and_level() {
        let x: Vec<f32> = (0..24_000)
            .map(|i| ((i as f32 * 0.05).sin() * ((i / 2400) % 2) as f32) * 0.3)
            .collect();
        let mut y = vec![0.0; 800];
        y.extend(x.iter().map(|v| v * 0.5));
        y.truncate(x.len());
        let c = compare(&x, &y);
        assert_eq!(c.lag, 800);
        assert!((c.level_db + 6.02).abs() < 0.2, "{c:?}");
        assert!(c.envelope_correlation > 0.99, "{c:?}");
    }
}
