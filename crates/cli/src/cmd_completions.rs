//! `moshi-native completions bash|zsh|fish`: the shell completion script, on stdout.

use anyhow::Result;
use clap::{Args, ValueEnum};

/// Shells with a completion script.
#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
pub enum Shell {
    /// bash: `moshi-native completions bash > ~/.local/share/bash-completion/completions/moshi-native`.
    Bash,
    /// zsh: `moshi-native completions zsh > ~/.zfunc/_moshi-native` (with `~/.zfunc` in `fpath`).
    Zsh,
    /// fish: `moshi-native completions fish > ~/.config/fish/completions/moshi-native.fish`.
    Fish,
}

/// Flags of `completions`.
#[derive(Args, Debug)]
pub struct CompletionsArgs {
    /// The shell to write the script for.
    #[arg(value_enum)]
    pub shell: Shell,
}

/// Writes the completion script of `cmd` for the chosen shell to stdout.
pub fn run(a: &CompletionsArgs, cmd: &mut clap::Command) -> Result<()> {
    let shell = match a.shell {
        Shell::Bash => clap_complete::Shell::Bash,
        Shell::Zsh => clap_complete::Shell::Zsh,
        Shell::Fish => clap_complete::Shell::Fish,
    };
    let name = cmd.get_name().to_string();
    clap_complete::generate(shell, cmd, name, &mut std::io::stdout());
    Ok(())
}
