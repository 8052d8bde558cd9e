//! `verify` on a speech-to-text bundle: after the static checks every bundle gets, the model is
//! loaded, the clip is transcribed (prefix, audio, flush: the whole stream plan), and the output is
//! checked: one step per frame, voice-activity probabilities in [0, 1] when the model has extra
//! heads, words in the transcript and an end of turn after the clip (speech checks: only a trained
//! model can pass them), then the Mimi round trip.

use std::sync::Arc;
use std::time::Instant;

use kernels::Pool;
use model::checkpoint::Bundle;
use model::stt::{SttEvent, SttModel, SttStream};
use model::text::SentencePiece;

use crate::verify_report::{mimi_check, Report, Verdict};

/// Kyutai's end-of-turn rule: head 2's no-voice probability above this.
const END_OF_TURN: f32 = 0.5;

/// What transcribing the clip gave.
#[derive(Default)]
struct Transcript {
    steps: usize,
    words: Vec<String>,
    /// Class-0 probabilities of head 2 per step (empty without 3 heads).
    head2: Vec<f32>,
    /// Step events seen, and how many carried a probability outside [0, 1] or not finite.
    step_events: usize,
    bad_probs: usize,
}

/// The checks after the static ones, on the bundle's speech-to-text model with `threads` threads.
pub(crate) fn stt_checks(mut r: Report, bundle: &Bundle, clip: &[f32], threads: usize) -> Report {
    let t = Instant::now();
    let pool = Arc::new(Pool::new(threads.max(1)));
    let loaded = SttModel::load(bundle, &pool)
        .map_err(anyhow::Error::from)
        .and_then(|m| Ok((m, SentencePiece::load(&bundle.files.tokenizer)?)));
    let (model, spm) = match loaded {
        Ok((m, s)) => (Arc::new(m), s),
        Err(e) => {
            r.push("engine", Verdict::Fail, format!("{e:#}"));
            return r;
        }
    };
    r.load_s = Some(t.elapsed().as_secs_f64());
    let plan = model.plan();
    r.push(
        "engine",
        Verdict::Pass,
        format!(
            "speech-to-text, {} thread(s): delay {} steps, prefix {} frames, {} extra heads",
            threads.max(1),
            plan.delay_tokens,
            plan.prefix_frames,
            model.n_heads()
        ),
    );
    let frames = clip.len().div_ceil(model.mimi().frame_size());
    let want_steps = plan.prefix_frames + frames + plan.flush_frames;
    match transcribe(&model, &spm, clip, pool, &mut r) {
        Ok(tr) => judge(&mut r, &model, &tr, want_steps, frames),
        Err(e) => r.push("transcription", Verdict::Fail, format!("{e:#}")),
    }
    if let Err(e) = mimi_check(&mut r, model.mimi(), clip) {
        r.push("Mimi round trip", Verdict::Fail, format!("{e:#}"));
    }
    r
}

/// Streams the clip through the model, timing each step after the first two (warm-up).
fn transcribe(
    model: &Arc<SttModel>,
    spm: &SentencePiece,
    clip: &[f32],
    pool: Arc<Pool>,
    r: &mut Report,
) -> anyhow::Result<Transcript> {
    let mut stream = SttStream::cpu(model, pool)?;
    let mut tr = Transcript::default();
    let mut tokens: Vec<Vec<u32>> = Vec::new();
    let mut last = Instant::now();
    let (mut total_s, mut timed) = (0f64, 0usize);
    let mut on_step = |_: &_, events: &[SttEvent]| {
        let now = Instant::now();
        if tr.steps >= 2 {
            total_s += (now - last).as_secs_f64();
            timed += 1;
        }
        last = now;
        tr.steps += 1;
        for e in events {
            match e {
                SttEvent::Step { .. } => {
                    let prs = e.prs();
                    tr.step_events += 1;
                    if prs.iter().any(|p| !(0.0..=1.0).contains(p)) {
                        tr.bad_probs += 1;
                    }
                    if let Some(&p) = prs.get(2) {
                        tr.head2.push(p);
                    }
                }
                SttEvent::Word { tokens: t, .. } => tokens.push(t.to_vec()),
                SttEvent::EndWord { .. } => {}
            }
        }
    };
    stream.push_pcm(clip, &mut on_step)?;
    stream.flush(&mut on_step)?;
    if timed > 0 {
        r.stt_frame_ms = Some((total_s * 1e3 / timed as f64, timed));
    }
    for t in &tokens {
        tr.words.push(spm.decode(t)?.trim().to_string());
    }
    Ok(tr)
}

/// The verdicts on a transcript of `frames` frames of clip that should have run `want_steps` steps.
fn judge(r: &mut Report, model: &SttModel, tr: &Transcript, want_steps: usize, frames: usize) {
    let ok = tr.steps == want_steps;
    r.push(
        "transcription",
        if ok { Verdict::Pass } else { Verdict::Fail },
        format!(
            "{} steps for {} frames of clip (prefix + clip + flush = {want_steps}), {} words",
            tr.steps,
            frames,
            tr.words.len()
        ),
    );
    if model.n_heads() > 0 {
        let ok = tr.step_events == tr.steps && tr.bad_probs == 0;
        r.push(
            "voice activity",
            if ok { Verdict::Pass } else { Verdict::Fail },
            format!(
                "{} Step events of {} probabilities for {} steps, {} outside [0, 1]",
                tr.step_events,
                model.n_heads(),
                tr.steps,
                tr.bad_probs
            ),
        );
    }
    let words: Vec<&String> = tr
        .words
        .iter()
        .filter(|w| w.chars().filter(|c| c.is_alphabetic()).count() >= 2)
        .collect();
    let shown: String = tr.words.join(" ").chars().take(60).collect();
    r.speech(
        "text decodes to words",
        !words.is_empty(),
        format!("{} words: \"{shown}\"", words.len()),
    );
    if model.n_heads() >= 3 {
        // After the clip and the model's delay, only silence is fed: a trained voice-activity head
        // says the turn ended.
        let after = model.plan().prefix_frames + frames + model.plan().delay_tokens;
        let peak = tr.head2.iter().skip(after).copied().fold(0f32, f32::max);
        r.speech(
            "end of turn after the clip",
            peak > END_OF_TURN,
            format!("head 2 reaches {peak:.2} in the flush (end of turn above {END_OF_TURN})"),
        );
    }
}
