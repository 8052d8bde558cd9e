//! The `moshi-native` binary: talk to Moshi, run Mimi, inspect and trace models.

mod cmd_inspect;
mod cmd_mimi;
mod cmd_synth;
#[allow(dead_code)] // `trace mimi`: to be folded into clap by the CLI owner (cmd_trace_mimi::run)
mod cmd_trace_mimi;
mod fetch;
#[allow(dead_code)] // used by the model-loading commands as they land
mod models;

use anyhow::Result;
use clap::{Parser, Subcommand};

/// Native inference engine for Kyutai's Moshi speech-to-speech model and its Mimi codec.
#[derive(Parser, Debug)]
#[command(name = "moshi-native", version, about, propagate_version = true)]
struct Cli {
    /// Print tracing logs (RUST_LOG overrides the filter).
    #[arg(long, short, global = true)]
    verbose: bool,
    #[command(subcommand)]
    cmd: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Download a released bundle into the Hugging Face cache (resumable).
    Fetch(fetch::FetchArgs),
    /// Inspect a weights file or bundle directory (format, variant, sizes, refusals).
    Inspect(cmd_inspect::InspectArgs),
    /// Write a bundle with random weights in a released layout (benchmarks).
    Synth(cmd_synth::SynthArgs),
    /// Encode a WAV into Mimi codes, or decode codes into a WAV.
    #[command(subcommand)]
    Mimi(cmd_mimi::MimiCmd),
}

fn init_logging(verbose: bool) {
    let default = if verbose { "debug" } else { "warn" };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

fn main() {
    let cli = Cli::parse();
    init_logging(cli.verbose);
    if let Err(e) = dispatch(cli.cmd) {
        // One clear line (plus any hint lines the error carries), non-zero exit.
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

fn dispatch(cmd: Command) -> Result<()> {
    match cmd {
        Command::Fetch(a) => fetch::run(&a),
        Command::Inspect(a) => cmd_inspect::run(&a),
        Command::Synth(a) => cmd_synth::run(&a),
        Command::Mimi(c) => cmd_mimi::run(&c),
    }
}
