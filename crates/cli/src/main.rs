//! The `moshi-native` binary: talk to Moshi, run Mimi, inspect and trace models.

mod cmd_completions;
mod cmd_devices;
mod cmd_inspect;
mod cmd_list;
mod cmd_mimi;
mod cmd_serve;
mod cmd_stt;
mod cmd_synth;
mod cmd_trace_duplex;
mod cmd_trace_lm;
mod cmd_trace_mimi;
mod cmd_verify;
mod common;
mod duplex;
mod fetch;
mod loader_noise;
mod logging;
mod models;
mod realtime;
mod serve_stt;
mod verify_report;
mod verify_stt;

use anyhow::Result;
use clap::{CommandFactory, Parser, Subcommand};

/// Native inference engine for Kyutai's Moshi speech-to-speech model and its Mimi codec.
#[derive(Parser, Debug)]
#[command(name = "moshi-native", version, about, propagate_version = true)]
struct Cli {
    /// Print tracing logs (RUST_LOG overrides the filter).
    #[arg(long, short, global = true)]
    verbose: bool,
    /// Log line format (`json`: one object per line, for log collectors).
    #[arg(long, value_enum, global = true, default_value_t = logging::LogFormat::Text)]
    log_format: logging::LogFormat,
    #[command(subcommand)]
    cmd: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Full duplex on a WAV file: you speak (the input), Moshi answers on its own channel.
    Duplex(duplex::DuplexArgs),
    /// One-way generation with a silent user stream, optionally starting from a text prompt.
    Generate(duplex::GenerateArgs),
    /// Serve conversations over WebSocket (Kyutai's /api/chat protocol) with a built-in web page.
    Serve(cmd_serve::ServeArgs),
    /// Download a released bundle into the Hugging Face cache (resumable).
    Fetch(fetch::FetchArgs),
    /// Check a bundle end to end (tensors, a spoken clip through full duplex, Mimi round trip):
    /// the first thing to run after `fetch`. Exits non-zero on failure.
    Verify(cmd_verify::VerifyArgs),
    /// Inspect a weights file or bundle directory (format, variant, sizes, refusals).
    Inspect(cmd_inspect::InspectArgs),
    /// Write a bundle with random weights in a released layout (benchmarks).
    Synth(cmd_synth::SynthArgs),
    /// Encode a WAV into Mimi codes, or decode codes into a WAV.
    #[command(subcommand)]
    Mimi(cmd_mimi::MimiCmd),
    /// Benchmarks at full moshiko dimensions with synthetic weights (ratios to the same-run roofline).
    ///
    /// With `--device gpu`, `bench lm` / `bench mimi` time the adapter: one submission per LM frame
    /// or per Mimi direction, against a device copy kernel.
    Bench(BenchCmd),
    /// Transcribe a WAV with a Kyutai speech-to-text model (words with timestamps; --json, --vad).
    Stt(cmd_stt::SttArgs),
    /// List the GPU adapters (numbers for --gpu N) and what --device auto takes.
    Devices(cmd_devices::DevicesArgs),
    /// The released bundles already in the Hugging Face cache: variant, preset, size, complete or partial.
    List(cmd_list::ListArgs),
    /// Print the shell completion script (bash, zsh or fish) on stdout.
    Completions(cmd_completions::CompletionsArgs),
    /// Dump every intermediate of a component for parity checks against Kyutai's Python package.
    #[command(subcommand)]
    Trace(TraceCmd),
}

/// `moshi-native bench`: the benchmark drivers' flags (crate `moshi-bench`) and the device pair every
/// command that can run on a GPU takes.
#[derive(clap::Args, Debug)]
struct BenchCmd {
    #[command(flatten)]
    bench: bench::drivers::BenchArgs,
    /// Where `bench lm` / `bench mimi` / `bench duplex` run (`gpu`: on the adapter, one submission per
    /// LM frame or per Mimi direction, against a device copy kernel).
    #[command(flatten)]
    device: common::DeviceArgs,
}

#[derive(Subcommand, Debug)]
enum TraceCmd {
    /// Streaming Mimi encode then decode, with intermediates.
    Mimi(cmd_trace_mimi::TraceMimiArgs),
    /// LMGen steps on recorded user codes, with logits and returned tokens.
    Lm(cmd_trace_lm::TraceLmArgs),
    /// The server-style full-duplex loop on a WAV (first-frame rule included).
    Duplex(cmd_trace_duplex::TraceDuplexArgs),
}

fn main() {
    common::process_start();
    let cli = Cli::parse();
    // `serve` logs each session's start and end at INFO by default; other commands only warnings.
    let default = match (&cli.cmd, cli.verbose) {
        (_, true) => "debug",
        (Command::Serve(_), false) => "warn,server=info",
        _ => "warn",
    };
    logging::init(default, cli.log_format);
    if let Err(e) = dispatch(cli.cmd) {
        if is_broken_pipe(&e) {
            // The reader went away (`inspect … | head`): what it wanted was written; no message.
            std::process::exit(0);
        }
        eprintln!("{}", render_error(&e));
        std::process::exit(1);
    }
}

/// Whether `e` is a write to a closed pipe (EPIPE), anywhere in its chain.
fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

/// One clear line (the context chain, causes repeated by their wrapper skipped), then any
/// `hint:` lines the chain carries.
fn render_error(e: &anyhow::Error) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut hints: Vec<String> = Vec::new();
    for cause in e.chain() {
        let text = cause.to_string();
        let mut lines = text.lines();
        let head = lines.next().unwrap_or("").trim().to_string();
        for l in lines {
            if l.trim_start().starts_with("hint:") {
                hints.push(l.trim().to_string());
            } else if !l.trim().is_empty() {
                parts.push(l.trim().to_string());
            }
        }
        if !head.is_empty() && !parts.last().is_some_and(|p| p.contains(&head)) {
            parts.push(head);
        }
    }
    let mut out = format!("error: {}", parts.join(": "));
    for h in hints {
        out.push('\n');
        out.push_str(&h);
    }
    out
}

fn dispatch(cmd: Command) -> Result<()> {
    match cmd {
        Command::Duplex(a) => duplex::run_duplex(&a),
        Command::Generate(a) => duplex::run_generate(&a),
        // A speech-to-text model (`--model demo-stt`, an STT bundle) serves /api/asr-streaming instead.
        Command::Serve(a) => match serve_stt::stt_model(&a)? {
            Some((dir, demo)) => serve_stt::run(&a, dir, demo),
            None => cmd_serve::run(&a),
        },
        Command::Fetch(a) => fetch::run(&a),
        Command::Verify(a) => cmd_verify::run(&a),
        Command::Inspect(a) => cmd_inspect::run(&a),
        Command::Synth(a) => cmd_synth::run(&a),
        Command::Mimi(c) => cmd_mimi::run(&c),
        Command::Bench(a) => bench::drivers::run(&a.bench, &a.device.resolve(1)?),
        Command::Devices(a) => cmd_devices::run(&a),
        Command::Stt(a) => cmd_stt::run(&a),
        Command::List(a) => cmd_list::run(&a),
        Command::Completions(a) => cmd_completions::run(&a, &mut Cli::command()),
        Command::Trace(TraceCmd::Mimi(a)) => cmd_trace_mimi::run(&a),
        Command::Trace(TraceCmd::Lm(a)) => cmd_trace_lm::run(&a),
        Command::Trace(TraceCmd::Duplex(a)) => cmd_trace_duplex::run(&a),
    }
}
