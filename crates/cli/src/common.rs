//! Flags shared by the commands that run the model (duplex, generate, serve, trace).

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use model::sampling::{SamplerConfig, SamplingParams};

use crate::models::{ModelArgs, ModelSource};

/// Sampling flags. Their defaults are [`SamplingParams`]'s (Python `LMGen`'s: text 0.7/25,
/// audio 0.8/250), read from it so that they are written in one place.
#[derive(Args, Clone, Debug)]
pub struct SamplingArgs {
    /// Argmax for text and audio (overrides temperatures).
    #[arg(long)]
    pub greedy: bool,
    /// Seed of the random streams (text and audio streams are derived from it).
    #[arg(long, default_value_t = SamplingParams::default().seed)]
    pub seed: u64,
    /// Text temperature (0 = argmax).
    #[arg(long, default_value_t = SamplingParams::default().text_temperature)]
    pub text_temperature: f32,
    /// Text top-k (0 = all).
    #[arg(long, default_value_t = SamplingParams::default().text_top_k)]
    pub text_topk: usize,
    /// Audio temperature (0 = argmax).
    #[arg(long, default_value_t = SamplingParams::default().audio_temperature)]
    pub audio_temperature: f32,
    /// Audio top-k (0 = all).
    #[arg(long, default_value_t = SamplingParams::default().audio_top_k)]
    pub audio_topk: usize,
    /// Multiply the text PAD probability by exp(pad_mult).
    #[arg(long)]
    pub pad_mult: Option<f32>,
    /// Repetition penalty on recent text tokens (1.0 = off).
    #[arg(long)]
    pub repetition_penalty: Option<f32>,
    /// Number of recent text tokens the repetition penalty looks at.
    #[arg(long, default_value_t = SamplingParams::default().repetition_penalty_context)]
    pub repetition_penalty_context: usize,
}

impl SamplingArgs {
    /// The sampler configuration these flags describe.
    pub fn config(&self) -> Result<SamplerConfig> {
        for (name, v) in [
            ("--text-temperature", self.text_temperature),
            ("--audio-temperature", self.audio_temperature),
        ] {
            if !v.is_finite() || v < 0.0 {
                bail!("{name} must be a finite number >= 0 (got {v})");
            }
        }
        if let Some(p) = self.pad_mult {
            if !p.is_finite() {
                bail!("--pad-mult must be finite (got {p})");
            }
        }
        if let Some(p) = self.repetition_penalty {
            if !p.is_finite() || p <= 0.0 {
                bail!("--repetition-penalty must be a finite number > 0 (got {p})");
            }
        }
        Ok(SamplingParams {
            greedy: self.greedy,
            seed: self.seed,
            text_temperature: self.text_temperature,
            text_top_k: self.text_topk,
            audio_temperature: self.audio_temperature,
            audio_top_k: self.audio_topk,
            pad_mult: self.pad_mult,
            repetition_penalty: self.repetition_penalty,
            repetition_penalty_context: self.repetition_penalty_context,
        }
        .config())
    }
}

/// KV cache element type.
#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
pub enum KvDtypeArg {
    /// float32: the oracle's arithmetic (what the parity traces use).
    F32,
    /// bfloat16, rounded to nearest even: half the bytes of the KV caches (the default).
    Bf16,
}

/// Where the LM and Mimi run.
#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
pub enum DeviceArg {
    /// A discrete or integrated GPU when one is present, else the CPU (software adapters such as
    /// Mesa's lavapipe are never taken: they are slower than the CPU backend).
    Auto,
    /// The CPU.
    Cpu,
    /// The GPU: adapter `--gpu N`, or the best adapter of any type (software ones included).
    Gpu,
}

/// Engine flags: model selection, threads, KV dtype, device.
#[derive(Args, Clone, Debug)]
pub struct EngineArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Threads per session, shared by Mimi and the LM (default: one per physical core; `serve`: threads
    /// per worker, default the physical cores divided by its workers, see `serve --help`).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Element type of the LM's KV caches. bf16 (the default) reads half the bytes of f32 per
    /// frame, which halves the cost that grows with the conversation's length; keys and values are
    /// rounded to 8 significant bits. Measured against the f32 oracle with the same tokens fed to
    /// both: the logits move by 0.1-0.25 % of their spread (RMS; at most 1.5 %), and the top
    /// choice changes at about 1 step and head in 100 (docs/CONTRACTS.md). f32 computes as the
    /// oracle does (the default of `trace lm` / `trace duplex`).
    #[arg(long, value_enum, default_value_t = KvDtypeArg::Bf16)]
    pub kv_dtype: KvDtypeArg,
    /// Where the LM and Mimi run (on the GPU, with --batch too: all slots' codecs in one
    /// submission per tick).
    #[command(flatten)]
    pub device: DeviceArgs,
}

/// `--device` / `--gpu N`, the same pair on every command that can run on a GPU (each command's
/// help says which of its parts move to the GPU).
#[derive(Args, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeviceArgs {
    /// Where the LM and Mimi run (`trace duplex`: the LM only; `serve --batch`: all slots' codecs in
    /// one submission per tick; `bench`: see its help). Default: cpu, or gpu when --gpu is given.
    #[arg(long, value_enum)]
    pub device: Option<DeviceArg>,
    /// GPU adapter number (`moshi-native devices` lists them); implies --device gpu.
    #[arg(long = "gpu", value_name = "N")]
    pub gpu: Option<usize>,
}

impl DeviceArgs {
    /// `--device gpu` on the best adapter (tests).
    #[cfg(test)]
    pub fn gpu() -> DeviceArgs {
        DeviceArgs {
            device: Some(DeviceArg::Gpu),
            gpu: None,
        }
    }

    /// The device the flags name, for `threads` CPU threads, with `auto` resolved (and said)
    /// here: `--gpu` alone means the GPU.
    pub fn resolve(&self, threads: usize) -> Result<runtime::Device> {
        resolve_device(self.device, self.gpu, threads)
    }
}

/// An opened engine and whether it is the demo model.
pub struct Opened {
    /// The resident engine.
    pub engine: Arc<runtime::Engine>,
    /// True for `--model demo` (outputs must say so).
    pub demo: bool,
    /// The bundle directory.
    pub dir: PathBuf,
}

impl EngineArgs {
    /// The bundle directory the model flags name, and whether it is the demo model (written to
    /// its cache folder on first use).
    pub fn locate(&self) -> Result<(PathBuf, bool)> {
        Ok(match self.model.resolve()? {
            ModelSource::Demo => (embed::demo::materialize()?, true),
            ModelSource::Dir(d) => (d, false),
        })
    }

    /// The default thread count of one conversation that has the machine to itself: one per physical core.
    pub fn all_cores() -> usize {
        runtime::physical_cores()
    }

    /// `--threads`, or `default` when not given.
    pub fn threads(&self, default: usize) -> usize {
        self.threads.unwrap_or(default)
    }

    /// The device the flags name, with `auto` resolved (and said) here.
    pub fn device(&self, threads: usize) -> Result<runtime::Device> {
        self.device.resolve(threads)
    }

    /// Checks the flags that need no model (thread count, device): `open` calls it first, and a command
    /// with other early checks calls it before them, so a bad flag fails before the weights are read.
    /// Returns the resolved device for `threads` threads.
    pub fn check(&self, threads: usize) -> Result<runtime::Device> {
        if threads == 0 || threads > 256 {
            bail!("--threads must be between 1 and 256 (got {threads})");
        }
        let device = self.device(threads)?;
        // The device is opened again when the engine uploads the weights; asking now names a missing
        // GPU as such, before a multi-gigabyte read.
        device
            .check()
            .with_context(|| format!("--device {}", device.name()))?;
        Ok(device)
    }

    /// Resolves the model and opens the engine (`--threads` or `default_threads` per session, printed),
    /// printing the demo label when relevant.
    pub fn open(&self, default_threads: usize) -> Result<Opened> {
        let threads = self.threads(default_threads);
        let device = self.check(threads)?;
        eprintln!(
            "moshi-native: {} per session for Mimi and the LM ({})",
            crate::models::count(threads, "thread"),
            crate::models::count(runtime::physical_cores(), "physical core")
        );
        warn_threads(threads);
        let (dir, demo) = self.locate()?;
        if demo {
            eprintln!("{}", embed::demo::LABEL);
        }
        let opts = runtime::EngineOptions {
            device,
            kv_dtype: match self.kv_dtype {
                KvDtypeArg::F32 => model::lm::KvDtype::F32,
                KvDtypeArg::Bf16 => model::lm::KvDtype::Bf16,
            },
        };
        let gpu = matches!(opts.device, runtime::Device::Gpu { .. });
        let open = || runtime::Engine::open_timed(&dir, opts);
        let opened = if gpu {
            crate::loader_noise::quiet(open)
        } else {
            open()
        };
        let (engine, timings) = opened.map_err(|e| {
            // A device that fails while the weights are uploaded is not a bad bundle.
            let what = match e {
                runtime::RuntimeError::Device(_) => "cannot start the compute device".to_string(),
                _ => format!("cannot open the model bundle {}", dir.display()),
            };
            anyhow::Error::new(e).context(what)
        })?;
        eprintln!("moshi-native: {}", load_line(&timings));
        match engine.gpu_adapter() {
            Some(a) => eprintln!("moshi-native: device gpu: the LM and Mimi run on adapter {a}"),
            None => eprintln!("moshi-native: device cpu"),
        }
        Ok(Opened { engine, demo, dir })
    }
}

/// Warns when `threads` is more than the machine's physical cores: the extra threads wait for each
/// other at every step, which makes a frame slower, not faster.
pub fn warn_threads(threads: usize) {
    let cores = runtime::physical_cores();
    if threads > cores {
        eprintln!(
            "moshi-native: warning: --threads {threads} is more than the {} here: threads beyond one per core wait for each other (slower, not faster)",
            crate::models::count(cores, "physical core")
        );
    }
}

/// When this process started, as near as the program can tell: `main` calls this first, so later calls
/// return that instant (what the time-to-first-audio lines count from).
pub fn process_start() -> std::time::Instant {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    *START.get_or_init(std::time::Instant::now)
}

/// The load-time line `duplex`, `generate` and `serve` print: each phase of the load, the LM's read
/// rate and the time since the process started.
pub fn load_line(t: &model::LoadTimings) -> String {
    let s = |d: std::time::Duration| d.as_secs_f64();
    format!(
        "model loaded in {:.2} s: map + check {:.2} s, LM read + repack {:.2} s on {} thread(s) \
         ({:.2} GB file{}, {:.2} GB/s), Mimi {:.2} s, tokenizer {:.2} s; {:.2} s since process start",
        s(t.total()),
        s(t.map),
        s(t.lm),
        t.threads,
        t.lm_file_bytes as f64 / 1e9,
        t.lm_resident
            .map(|r| format!(", {:.0} % in the page cache", 100.0 * r))
            .unwrap_or_default(),
        t.lm_file_bytes as f64 / 1e9 / s(t.lm).max(1e-9),
        s(t.mimi),
        s(t.tokenizer),
        s(process_start().elapsed()),
    ) + &kernels::huge_page_share()
}

/// The device `--device` / `--gpu N` name ([`DeviceArgs::resolve`]).
fn resolve_device(
    device: Option<DeviceArg>,
    adapter: Option<usize>,
    threads: usize,
) -> Result<runtime::Device> {
    let want = device.unwrap_or(if adapter.is_some() {
        DeviceArg::Gpu
    } else {
        DeviceArg::Cpu
    });
    Ok(match want {
        DeviceArg::Cpu if adapter.is_some() => {
            bail!("--gpu N selects a GPU adapter: use it with --device gpu or auto")
        }
        DeviceArg::Cpu => runtime::Device::Cpu { threads },
        DeviceArg::Gpu => runtime::Device::Gpu { adapter, threads },
        DeviceArg::Auto => {
            let list = crate::loader_noise::quiet(gpu::adapters);
            let pick = match adapter {
                Some(i) => list.get(i).filter(|a| a.is_hardware_gpu()).map(|a| a.index),
                None => gpu::choose_adapter(&list, gpu::AdapterChoice::Auto)?,
            };
            match pick {
                Some(i) => runtime::Device::Gpu {
                    adapter: Some(i),
                    threads,
                },
                None => {
                    eprintln!(
                        "moshi-native: --device auto: no discrete or integrated GPU among {} adapter(s); the LM and Mimi run on the CPU",
                        list.len()
                    );
                    runtime::Device::Cpu { threads }
                }
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::{SamplingArgs, SamplingParams};

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        sampling: SamplingArgs,
    }

    /// No sampling flag means the sampler every other front end starts from (the C ABI, the Python
    /// package, `SamplingParams::default()`): the defaults are read, not written again.
    #[test]
    fn no_flags_give_the_default_sampler() {
        let a = Cli::try_parse_from(["duplex"]).unwrap().sampling;
        assert_eq!(a.config().unwrap(), SamplingParams::default().config());
        assert_eq!(
            a.repetition_penalty_context,
            model::sampling::RepetitionPenalty::DEFAULT_CONTEXT
        );
    }
}
