//! `cachealloc`: replay, compare, plot, check, import and generate
//! allocation traces.

mod backend;
mod cmd;
mod progress;
mod render;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "cachealloc",
    version,
    about = "Replay GPU allocation traces through a PyTorch-exact caching allocator"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Replay traces and report memory use, fragmentation and speed.
    Replay(cmd::replay::ReplayArgs),
    /// Replay traces under several configurations, side by side.
    Compare(cmd::compare::CompareArgs),
    /// Which allocator settings would have served a trace or snapshot best (and fit a capacity).
    Advise(cmd::advise::AdviseArgs),
    /// Draw live and reserved bytes and the segment map at the peak as SVG.
    Plot(cmd::plot::PlotArgs),
    /// Validate traces and print their statistics.
    Check(cmd::check::CheckArgs),
    /// Turn a PyTorch memory snapshot with its history into a trace.
    Import(cmd::import::ImportArgs),
    /// Write a synthetic trace (a training loop on a new stream every step).
    Generate(cmd::generate::GenerateArgs),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell).
    Completions(cmd::completions::CompletionsArgs),
}

fn main() -> ExitCode {
    let status = match Cli::parse().command {
        Command::Replay(a) => a.run(),
        Command::Compare(a) => a.run(),
        Command::Advise(a) => a.run(),
        Command::Plot(a) => a.run(),
        Command::Check(a) => a.run(),
        Command::Import(a) => a.run(),
        Command::Generate(a) => a.run(),
        Command::Completions(a) => a.run::<Cli>(),
    };
    ExitCode::from(status)
}
