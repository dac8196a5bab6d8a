//! `ember bench ARGS` runs the harness binary `ember-bench` found next to
//! `ember`: it execs it with ARGS untouched (the same process: its id, signals
//! and exit status are the harness's), and without it says how to build it.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

mod bench_common;

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// A copy of the `ember` under test alone in `dir` (no harness beside it).
fn lone_ember(dir: &Path) -> PathBuf {
    let exe = dir.join("ember");
    std::fs::copy(env!("CARGO_BIN_EXE_ember"), &exe).unwrap();
    exe
}

/// Spawns `cmd`, retrying while the kernel says the executable is busy: a
/// file this test just wrote can still be open for writing in a child that
/// another test thread forked meanwhile (its descriptors live until its
/// `exec`), and exec of a file open for writing fails with ETXTBSY.
fn spawn(cmd: &mut Command) -> std::process::Child {
    let mut tries = 0;
    loop {
        match cmd.spawn() {
            Err(e) if e.kind() == std::io::ErrorKind::ExecutableFileBusy && tries < 100 => {
                tries += 1;
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            r => return r.expect("run ember"),
        }
    }
}

fn run(exe: &Path, args: &[&str]) -> Output {
    spawn(
        Command::new(exe)
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped()),
    )
    .wait_with_output()
    .unwrap()
}

#[test]
fn a_missing_harness_is_named_with_how_to_build_it() {
    let dir = tempfile::tempdir().unwrap();
    let exe = lone_ember(dir.path());
    for args in [&["bench", "alloc"][..], &["bench", "--help"], &["bench"]] {
        let out = run(&exe, args);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(out.stdout.is_empty(), "{args:?}: {}", text(&out.stdout));
        let harness = dir.path().join("ember-bench");
        assert!(
            err.starts_with("ember bench: ")
                && err.contains(&*harness.to_string_lossy())
                && err.contains("cargo build --release -p ember-bench"),
            "{args:?}: {err}"
        );
    }
}

#[test]
fn bench_execs_the_harness_with_its_arguments() {
    let dir = tempfile::tempdir().unwrap();
    let exe = lone_ember(dir.path());
    // A stand-in harness: prints its arguments one a line, then its process
    // id, and exits with a status of its own.
    let fake = dir.path().join("ember-bench");
    std::fs::write(
        &fake,
        "#!/bin/sh\nfor a in \"$@\"; do echo \"arg:$a\"; done\necho \"pid:$$\"\nexit 7\n",
    )
    .unwrap();
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
    let args = [
        "engine",
        "--help",
        "-V",
        "--seconds",
        "0.5",
        "two words",
        "--",
        "",
    ];
    let child = spawn(
        Command::new(&exe)
            .arg("bench")
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped()),
    );
    let pid = child.id();
    let out = child.wait_with_output().unwrap();
    let stdout = text(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(7),
        "{stdout}\n{}",
        text(&out.stderr)
    );
    let mut want: Vec<String> = args.iter().map(|a| format!("arg:{a}")).collect();
    // Exec, not a child process: the harness has the id `ember bench` had.
    want.push(format!("pid:{pid}"));
    assert_eq!(stdout.lines().collect::<Vec<_>>(), want);
}

/// The real harness: its help, named after the command the user typed.
#[test]
fn bench_help_is_the_harness_help() {
    bench_common::harness();
    let exe = env!("CARGO_BIN_EXE_ember");
    let out = run(Path::new(exe), &["bench", "--help"]);
    let s = text(&out.stdout);
    assert!(out.status.success(), "{s}\n{}", text(&out.stderr));
    assert!(s.contains("Usage: ember bench <COMMAND>"), "{s}");
    for c in [
        "alloc", "persist", "index", "recovery", "engine", "scenario",
    ] {
        assert!(s.contains(&format!("\n  {c} ")), "no {c} in {s}");
    }
    let out = run(Path::new(exe), &["bench", "scenario", "--help"]);
    let s = text(&out.stdout);
    assert!(out.status.success(), "{s}\n{}", text(&out.stderr));
    assert!(s.contains("Usage: ember bench scenario"), "{s}");
    assert!(s.contains("--ember <PATH>"), "{s}");
    // A usage error is the harness's (clap's status 2), naming the command.
    let out = run(Path::new(exe), &["bench", "no-such-bench"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("Usage: ember bench"));
}
