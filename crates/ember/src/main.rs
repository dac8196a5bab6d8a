//! `ember`: the command-line entry point. Thin: argument parsing and wiring only;
//! every subcommand lives in its own module.

mod bench;
mod check;
mod util;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

#[derive(Parser, Debug)]
#[command(
    name = "ember",
    version,
    about = "Ember: a key-value server whose data lives in a persistent heap"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Verify a heap file offline (read-only: recovery runs in a private copy).
    Check(check::CheckArgs),
    /// Micro-benchmarks of the persistent domain.
    Bench(bench::BenchArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Check(args) => check::run(&args),
        Command::Bench(args) => bench::run(&args),
    }
}
