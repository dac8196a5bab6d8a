//! `ember bench ARGS`: runs the benchmark harness, the `ember-bench` binary
//! (crates/bench), which lives next to this one. A binary of its own so that
//! the server binary does not link the harness's plotting, fonts and progress
//! bars; this subcommand keeps the documented `ember bench ...` commands.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, ExitCode};

/// The name of the harness binary, looked up next to this executable.
pub const HARNESS: &str = "ember-bench";

/// Exit code when the harness cannot be started (missing, or exec failed),
/// as for a usage error: nothing ran.
const NOT_RUN: u8 = 2;

/// Where the harness should be: beside this executable (its real path, with
/// symbolic links resolved, so a linked `ember` finds its build's harness).
fn harness() -> Result<PathBuf, String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this executable: {e}"))?;
    Ok(exe.with_file_name(HARNESS))
}

/// Replaces this process with `ember-bench ARGS` (exec: the process keeps its
/// id, so signals sent to `ember bench` reach the harness, and its exit status
/// is the harness's). Returns only when that is impossible.
pub fn run(args: &[OsString]) -> ExitCode {
    let path = match harness() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("ember bench: {e}");
            return ExitCode::from(NOT_RUN);
        }
    };
    if !path.is_file() {
        eprintln!(
            "ember bench: the benchmarks are a separate binary, {HARNESS}, and there is none at {}; \
             build it next to ember with `cargo build --release -p {HARNESS}` (or the whole \
             workspace: `cargo build --release --workspace`)",
            path.display()
        );
        return ExitCode::from(NOT_RUN);
    }
    // argv[0] `ember bench`: the harness's usage lines then name the command
    // the user typed.
    let err = Command::new(&path).arg0("ember bench").args(args).exec();
    eprintln!("ember bench: cannot run {}: {err}", path.display());
    ExitCode::from(NOT_RUN)
}
