//! `moshi-native duplex` and `moshi-native generate`: run the full-duplex frame loop on files.

use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use runtime::audio::WavFormat;
use runtime::{Session, SessionOptions, Step, FRAME_SIZE, SAMPLE_RATE};

use crate::common::{EngineArgs, SamplingArgs};

/// Flags of `moshi-native duplex`.
#[derive(Args, Debug, Clone)]
pub struct DuplexArgs {
    /// The user's side of the conversation: any common WAV (resampled to 24 kHz, downmixed to mono).
    #[arg(long = "in", value_name = "WAV")]
    pub input: PathBuf,
    /// Moshi's side of the conversation (24 kHz WAV, one output frame per input frame).
    #[arg(long, value_name = "WAV")]
    pub out: PathBuf,
    /// Also write Moshi's transcript (inner monologue) to this file.
    #[arg(long, value_name = "TXT")]
    pub text_out: Option<PathBuf>,
    /// Write a stereo WAV: user on the left, Moshi on the right.
    #[arg(long)]
    pub stereo: bool,
    #[command(flatten)]
    pub engine: EngineArgs,
    #[command(flatten)]
    pub sampling: SamplingArgs,
}

/// Flags of `moshi-native generate`.
#[derive(Args, Debug, Clone)]
pub struct GenerateArgs {
    /// Text forced into Moshi's text stream at the start (tokenized with the bundle's SentencePiece model).
    #[arg(long)]
    pub prompt: Option<String>,
    /// Output WAV (24 kHz mono).
    #[arg(long, value_name = "WAV")]
    pub out: PathBuf,
    /// Length of the generation in seconds.
    #[arg(long, default_value_t = 10.0)]
    pub seconds: f32,
    /// Also write the transcript to this file.
    #[arg(long, value_name = "TXT")]
    pub text_out: Option<PathBuf>,
    #[command(flatten)]
    pub engine: EngineArgs,
    #[command(flatten)]
    pub sampling: SamplingArgs,
}

/// What a run of the frame loop produced.
struct RunResult {
    moshi: Vec<f32>,
    text: String,
    frames: usize,
    elapsed: f64,
    dropped: u64,
}

/// Feeds `user` (24 kHz mono, a multiple of FRAME_SIZE long) frame by frame and collects Moshi's output,
/// aligned to the input: a frame without output (LMGen's first call) contributes silence.
fn run_frames(
    session: &mut Session,
    user: &[f32],
    progress: &ProgressBar,
    mut on_text: impl FnMut(&str),
) -> Result<RunResult> {
    let frames = user.len() / FRAME_SIZE;
    let mut moshi = Vec::with_capacity(user.len());
    let mut text = String::new();
    let start = Instant::now();
    let mut dropped = 0;
    let mut first_audio = true;
    for (i, frame) in user.chunks_exact(FRAME_SIZE).enumerate() {
        let report = session.push_pcm(frame).context("pushing input audio")?;
        dropped += u64::from(report.frames_dropped);
        loop {
            match session.step().context("frame pass failed")? {
                Step::Frame(out) => {
                    if out.pcm.is_empty() {
                        moshi.extend(std::iter::repeat_n(0.0, FRAME_SIZE));
                    } else {
                        if first_audio {
                            first_audio = false;
                            // `suspend` rather than `println`: a hidden bar (stderr not a
                            // terminal) drops `println` output.
                            let since_start = crate::common::process_start().elapsed();
                            progress.suspend(|| {
                                eprintln!(
                                    "moshi-native: first audio frame out {:.2} s after process start",
                                    since_start.as_secs_f64()
                                )
                            });
                        }
                        moshi.extend_from_slice(&out.pcm);
                    }
                    if !out.text.is_empty() {
                        text.push_str(&out.text);
                        on_text(&out.text);
                    }
                }
                Step::Idle => break,
                Step::Paused => bail!("session paused unexpectedly"),
                Step::Stopped(r) => bail!("session stopped unexpectedly ({r:?})"),
            }
        }
        let el = start.elapsed().as_secs_f64().max(1e-9);
        let done = (i + 1) as f64;
        progress.set_position(i as u64 + 1);
        progress.set_message(format!(
            "{:.1} frames/s, RTF {:.2}",
            done / el,
            el / (done * 0.08)
        ));
    }
    moshi.resize(frames * FRAME_SIZE, 0.0);
    Ok(RunResult {
        moshi,
        text,
        frames,
        elapsed: start.elapsed().as_secs_f64(),
        dropped,
    })
}

fn progress_bar(frames: usize) -> ProgressBar {
    let bar = ProgressBar::new(frames as u64);
    bar.set_style(
        ProgressStyle::with_template("{elapsed_precise} [{bar:30}] {pos}/{len} frames  {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar
}

fn session(
    opened: &crate::common::Opened,
    sampling: &SamplingArgs,
    frames: usize,
) -> Result<Session> {
    let opts = SessionOptions {
        sampling: sampling.config()?,
        // Files are fed frame by frame with a step after each, so nothing ever queues up.
        max_queued_frames: 4,
        output_rate: SAMPLE_RATE,
        max_steps: Some(frames as u64 + 1),
        ..SessionOptions::default()
    };
    Session::new(opened.engine.clone(), opts).context("cannot create a session")
}

/// Writes the transcript to `path` when one is given (`--text-out`), ending with a newline as text
/// files do.
fn write_text(path: Option<&std::path::Path>, text: &str) -> Result<()> {
    let Some(path) = path else {
        return Ok(());
    };
    let mut t = text.to_string();
    if !t.ends_with('\n') {
        t.push('\n');
    }
    std::fs::write(path, t).with_context(|| format!("cannot write {}", path.display()))
}

fn summary(label: &str, demo: bool, r: &RunResult, out: &std::path::Path) {
    eprintln!(
        "{label}: {} ({:.2} s of audio) in {:.2} s, {:.1} frames/s, real-time factor {:.2}, {} dropped -> {}{}",
        crate::models::count(r.frames, "frame"),
        r.frames as f64 * 0.08,
        r.elapsed,
        r.frames as f64 / r.elapsed.max(1e-9),
        r.elapsed / (r.frames as f64 * 0.08).max(1e-9),
        r.dropped,
        out.display(),
        if demo { "  [DEMO MODEL: random weights]" } else { "" }
    );
}

/// Fails unless `path` can be written (an existing file opened for writing, untouched; a missing one
/// created and removed again), so a bad output path is reported before the model loads and the whole
/// input is processed, not after. `flag` names it in the message.
pub fn check_writable(path: &std::path::Path, flag: &str) -> Result<()> {
    let fail = |e: std::io::Error| {
        anyhow::Error::new(e).context(format!("{flag} {}: cannot write there", path.display()))
    };
    if path.is_dir() {
        bail!("{flag} {}: is a directory", path.display());
    }
    if path.exists() {
        // Append mode: the check must not truncate what is there.
        std::fs::OpenOptions::new()
            .append(true)
            .open(path)
            .map_err(fail)?;
        return Ok(());
    }
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
        .map_err(fail)?;
    std::fs::remove_file(path).map_err(fail)?;
    Ok(())
}

/// Runs `duplex`.
pub fn run_duplex(a: &DuplexArgs) -> Result<()> {
    // What can fail without the model fails before it loads.
    a.sampling.config()?;
    check_writable(&a.out, "--out")?;
    if let Some(t) = &a.text_out {
        check_writable(t, "--text-out")?;
    }
    let mut user = runtime::audio::read_wav(&a.input).map(|w| w.samples)
        .with_context(|| {
            format!(
                "cannot read {}\nhint: --in takes a WAV file (8/16/24/32-bit PCM or 32-bit float, any rate, mono or stereo)",
                a.input.display()
            )
        })?;
    if user.is_empty() {
        bail!("{} holds no audio samples", a.input.display());
    }
    let frames = user.len().div_ceil(FRAME_SIZE);
    user.resize(frames * FRAME_SIZE, 0.0);
    let opened = a.engine.open(EngineArgs::all_cores())?;
    let t0 = Instant::now();
    let mut s = session(&opened, &a.sampling, frames)?;
    let created = t0.elapsed();
    // The real-time check times one frame of the session that will run, which also faults in what
    // its first frame touches; the session is back at its start afterwards.
    let warm = s.warm_up().context("timing a warm-up frame")?;
    eprintln!(
        "moshi-native: session created in {:.2} s (its KV cache backed), warm-up frame {:.2} s; {:.2} s since \
         process start",
        created.as_secs_f64(),
        f64::from(warm.lag_us) / 1e6,
        crate::common::process_start().elapsed().as_secs_f64()
    );
    let measured = crate::realtime::measured_start(&opened.engine, warm);
    eprintln!("moshi-native: {}", crate::realtime::notice(&measured));
    let bar = progress_bar(frames);
    let r = run_frames(&mut s, &user, &bar, |_| {})?;
    bar.finish_and_clear();
    if a.stereo {
        runtime::audio::write_wav_stereo(&a.out, &user, &r.moshi, SAMPLE_RATE, WavFormat::I16)
    } else {
        runtime::audio::write_wav_mono(&a.out, &r.moshi, SAMPLE_RATE, WavFormat::I16)
    }
    .with_context(|| format!("cannot write {}", a.out.display()))?;
    write_text(a.text_out.as_deref(), &r.text)?;
    summary("duplex", opened.demo, &r, &a.out);
    if !r.text.is_empty() {
        eprintln!("transcript: {}", r.text.trim());
    }
    Ok(())
}

/// Runs `generate`: a silent user stream, with the prompt forced into the text stream at the start.
pub fn run_generate(a: &GenerateArgs) -> Result<()> {
    if !a.seconds.is_finite() || a.seconds <= 0.0 || a.seconds > 3600.0 {
        bail!("--seconds must be in (0, 3600] (got {})", a.seconds);
    }
    let frames = ((a.seconds / 0.08).ceil() as usize).max(1);
    a.sampling.config()?;
    check_writable(&a.out, "--out")?;
    if let Some(t) = &a.text_out {
        check_writable(t, "--text-out")?;
    }
    let opened = a.engine.open(EngineArgs::all_cores())?;
    let mut s = session(&opened, &a.sampling, frames)?;
    if let Some(p) = &a.prompt {
        let tok = opened
            .engine
            .tokenizer()
            .context("this bundle has no SentencePiece tokenizer, so --prompt cannot be used")?;
        let ids = tok.encode(p);
        // One prompt token per frame: what does not fit in --seconds is never said.
        if ids.len() > frames {
            eprintln!(
                "moshi-native: warning: the prompt is {} but --seconds {} allows {} (one token per 80 ms frame): only its start is used; give --seconds {:.1} or more for all of it",
                crate::models::count(ids.len(), "token"),
                a.seconds,
                crate::models::count(frames, "frame"),
                ids.len() as f64 * 0.08
            );
        }
        s.force_text(&ids).context("cannot force the prompt")?;
    }
    let user = vec![0.0f32; frames * FRAME_SIZE];
    let bar = progress_bar(frames);
    let stdout = std::io::stdout();
    let r = run_frames(&mut s, &user, &bar, |t| {
        bar.suspend(|| {
            let mut o = stdout.lock();
            let _ = o.write_all(t.as_bytes());
            let _ = o.flush();
        })
    })?;
    bar.finish_and_clear();
    println!();
    runtime::audio::write_wav_mono(&a.out, &r.moshi, SAMPLE_RATE, WavFormat::I16)
        .with_context(|| format!("cannot write {}", a.out.display()))?;
    write_text(a.text_out.as_deref(), &r.text)?;
    summary("generate", opened.demo, &r, &a.out);
    Ok(())
}
