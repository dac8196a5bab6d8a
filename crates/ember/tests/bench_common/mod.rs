//! The `ember-bench` binary, for the tests that run `ember bench ...` (the
//! subcommand execs the harness found next to `ember`).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

/// `ember-bench` beside the `ember` under test, built first if it is missing.
///
/// Cargo puts the binaries of a build in one directory. `cargo test
/// --workspace` (scripts/test.sh) builds both, fresh; `cargo test -p ember`
/// builds only `ember`, so a missing harness is built here (`cargo build -p
/// ember-bench`, same profile). One already there is used as it is: rebuild it
/// after changing crates/bench when testing this package alone.
pub fn harness() -> PathBuf {
    static BUILDING: Mutex<()> = Mutex::new(());
    let _one = BUILDING.lock().unwrap_or_else(|e| e.into_inner());
    let dir = Path::new(env!("CARGO_BIN_EXE_ember"))
        .parent()
        .expect("the binaries' directory");
    let path = dir.join("ember-bench");
    if path.is_file() {
        return path;
    }
    // target/debug holds the test profile's binaries, target/release the
    // release profile's, target/NAME a custom profile's.
    let profile = match dir.file_name().and_then(|n| n.to_str()) {
        Some("debug") => "test",
        Some(p) => p,
        None => panic!("no profile directory in {}", dir.display()),
    };
    let out = Command::new(env!("CARGO"))
        .args(["build", "-p", "ember-bench", "--bin", "ember-bench"])
        .args(["--profile", profile])
        .output()
        .expect("run cargo");
    assert!(
        out.status.success() && path.is_file(),
        "cargo build -p ember-bench --profile {profile} did not give {}: {}",
        path.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    path
}
