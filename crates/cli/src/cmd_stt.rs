//! `moshi-native stt`: transcribe a WAV with one of Kyutai's streaming speech-to-text models (words with
//! timestamps; `--json` one JSON object per event; `--vad` end-of-turn events from the extra heads).

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use clap::Args;
use kernels::Pool;
use model::checkpoint::Bundle;
use model::lm::KvDtype;
use model::stt::{SttEvent, SttModel, SttStream};
use model::text::SentencePiece;

/// Arguments of `stt`.
#[derive(Args, Debug)]
pub struct SttArgs {
    /// The audio to transcribe: a 24 kHz mono WAV (16-bit PCM or 32-bit float).
    pub input: PathBuf,
    /// `stt-1b` (kyutai/stt-1b-en_fr) or `stt-2.6b` (kyutai/stt-2.6b-en), looked up in the Hugging
    /// Face cache (`moshi-native fetch --model stt-1b`); `demo-stt` selects the tiny random-weight
    /// STT model bundled with the binary.
    #[arg(long, value_name = "NAME")]
    pub model: Option<String>,
    /// Released weight format of `--model stt-…`: bf16 (PyTorch, default), candle-bf16, mlx-bf16.
    #[arg(long, value_enum)]
    pub preset: Option<crate::models::Preset>,
    /// An STT bundle directory (config.json with `stt_config`, weights, Mimi, tokenizer).
    #[arg(long, value_name = "DIR")]
    pub model_dir: Option<PathBuf>,
    /// One JSON object per line per event (Word, EndWord, and with --vad Step / EndOfTurn).
    #[arg(long)]
    pub json: bool,
    /// Report end of turn: the third extra head's no-voice probability above 0.5 (Kyutai's rule).
    #[arg(long)]
    pub vad: bool,
    /// Worker threads.
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// Where the temporal transformer runs (`--device gpu`: the LM step on the GPU, the extra heads
    /// and Mimi's 32-codebook encoder on the CPU threads).
    #[command(flatten)]
    pub device: crate::common::DeviceArgs,
}

/// The end-of-turn rule of Kyutai's scripts: head 2's class-0 probability above this.
const END_OF_TURN: f32 = 0.5;

/// Runs `stt`.
pub fn run(a: &SttArgs) -> Result<()> {
    let (dir, demo) = crate::models::resolve_stt(
        a.model.as_deref(),
        a.model_dir.as_deref(),
        a.preset,
        &crate::models::hub_cache_dir(),
    )?;
    if demo {
        eprintln!("{}", embed::demo_stt::LABEL);
    }
    let threads = a.threads.max(1);
    // A bad device flag fails before the weights are read.
    let device = a.device.resolve(threads)?;
    let bundle = Bundle::open(&dir).with_context(|| format!("opening {}", dir.display()))?;
    let pool = Arc::new(Pool::new(threads));
    let model = Arc::new(SttModel::load(&bundle, &pool)?);
    if a.vad && model.n_heads() < 3 {
        bail!(
            "--vad: this model has {} extra heads (needs 3 or more, as stt-1b)",
            model.n_heads()
        );
    }
    let spm = SentencePiece::load(&bundle.files.tokenizer)?;
    let pcm = crate::cmd_mimi::read_wav_24k_mono(&a.input)?;
    let batch = runtime::stt_batch(&model, 1, KvDtype::F32, device, pool.clone())
        .context("starting the speech-to-text step")?;
    if let runtime::Device::Gpu { .. } = device {
        eprintln!("moshi-native: device gpu: the LM step runs on the GPU, Mimi and the extra heads on the CPU");
    }
    let mut stream = SttStream::new(batch, pool);
    let mut out = Printer {
        spm: &spm,
        json: a.json,
        vad: a.vad,
        last_word: None,
        eot_shown: false,
        failed: None,
    };
    stream.push_pcm(&pcm, |_, ev| out.events(ev))?;
    stream.flush(|_, ev| out.events(ev))?;
    out.finish();
    if let Some(e) = out.failed {
        return Err(e);
    }
    Ok(())
}

/// Prints events as they come: a word is printed with its start and end once its end is known.
struct Printer<'a> {
    spm: &'a SentencePiece,
    json: bool,
    vad: bool,
    last_word: Option<(String, f64)>,
    eot_shown: bool,
    failed: Option<anyhow::Error>,
}

impl Printer<'_> {
    fn events(&mut self, events: &[SttEvent]) {
        for e in events {
            match e {
                SttEvent::Step { step_idx, .. } => {
                    let prs = e.prs();
                    if self.vad && self.json {
                        println!(
                            "{}",
                            serde_json::json!({"type": "Step", "step_idx": step_idx, "prs": prs})
                        );
                    }
                    if self.vad && prs[2] > END_OF_TURN && !self.eot_shown {
                        self.eot_shown = true;
                        if self.json {
                            println!(
                                "{}",
                                serde_json::json!({"type": "EndOfTurn", "step_idx": step_idx, "pr": prs[2]})
                            );
                        } else {
                            println!("<end of turn, p = {:.2}>", prs[2]);
                        }
                    }
                }
                SttEvent::Word { tokens, start_time } => {
                    self.eot_shown = false;
                    let text = match self.spm.decode(tokens) {
                        Ok(t) => t.trim().to_string(),
                        Err(err) => {
                            self.failed.get_or_insert_with(|| err.into());
                            String::new()
                        }
                    };
                    if self.json {
                        println!(
                            "{}",
                            serde_json::json!({"type": "Word", "text": text, "start_time": start_time})
                        );
                    } else {
                        // The previous word's end is this word's start when no EndWord came.
                        if let Some((w, s)) = self.last_word.take() {
                            println!("[{s:6.2} - {start_time:6.2}] {w}");
                        }
                    }
                    self.last_word = Some((text, *start_time));
                }
                SttEvent::EndWord { stop_time } => {
                    self.eot_shown = false;
                    if self.json {
                        println!(
                            "{}",
                            serde_json::json!({"type": "EndWord", "stop_time": stop_time})
                        );
                        self.last_word = None;
                    } else if let Some((w, s)) = self.last_word.take() {
                        println!("[{s:6.2} - {stop_time:6.2}] {w}");
                    }
                }
            }
        }
    }

    fn finish(&mut self) {
        if let Some((w, s)) = self.last_word.take() {
            if !self.json {
                println!("[{s:6.2} -       ] {w}");
            }
        }
    }
}
