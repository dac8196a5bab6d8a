//! `ember`: the command-line entry point. Thin: argument parsing and wiring only;
//! every subcommand lives in its own module.

#![forbid(unsafe_code)]

mod bench;

use ember::{check, rdbio};

use clap::{Parser, Subcommand};
use std::ffi::OsString;
use std::process::ExitCode;

/// mimalloc instead of glibc's malloc: the collection paths allocate many
/// small, short-lived buffers per command (pieces copied, decoded, spliced),
/// where glibc's malloc spent a third of a worker's time (`perf`, LPUSH and
/// ZADD -P 16); see BENCHMARKS.md for the measured change.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

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
    /// Run the Redis-protocol server (defaults: heap file ember.heap in the
    /// working directory, 127.0.0.1:6379, engine bullet, durability pmem).
    Serve(Box<server::ServeArgs>),
    /// Verify a heap file offline (read-only: recovery runs in a private copy).
    Check(check::CheckArgs),
    /// Load a Redis RDB file into a heap, offline (every type, TTLs, all
    /// databases, function libraries).
    ///
    /// Each key is written as RESTORE writes it (keys whose TTL has passed
    /// are skipped, as Redis skips them when loading), the function
    /// libraries as FUNCTION RESTORE does. A key or library that already
    /// exists in the heap is an error (Redis's BUSYKEY) unless --replace;
    /// other keys of the heap are kept. The whole file (every record, the
    /// CRC-64) is checked before anything is written: a damaged or
    /// conflicting file imports nothing. The heap must not be open by a
    /// server.
    Import(rdbio::ImportArgs),
    /// Write a heap's keys and function libraries to an RDB file (version
    /// 10) that redis-server 7.0 loads, offline.
    ///
    /// The heap must not be open by a server, so the file is a consistent
    /// snapshot. It is written beside FILE and renamed into place at the
    /// end: a failed export leaves no partial FILE.
    Export(rdbio::ExportArgs),
    /// Benchmarks and the papers' experiments (`ember bench --help` lists them).
    ///
    /// Runs the ember-bench binary next to this one with ARGS.
    #[command(disable_help_flag = true)]
    Bench {
        #[arg(
            trailing_var_arg = true,
            allow_hyphen_values = true,
            value_name = "ARGS"
        )]
        args: Vec<OsString>,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Serve(args) => match server::serve(&args) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("ember serve: {e}");
                ExitCode::FAILURE
            }
        },
        Command::Check(args) => check::run(&args),
        Command::Import(args) => rdbio::import(&args),
        Command::Export(args) => rdbio::export(&args),
        Command::Bench { args } => bench::run(&args),
    }
}
