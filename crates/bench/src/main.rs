//! `ember-bench`: Ember's benchmark harness, the micro-benchmarks of the
//! persistent domain and the papers' experiments as named scenarios, and the
//! helpers they share (machine description, medians, temporary heaps).
//!
//! A binary of its own, so that the server binary does not link the plotting,
//! fonts and progress bars; `ember bench ARGS` runs it (it execs the
//! `ember-bench` found next to `ember`). The scenarios that start servers run
//! `ember serve` from the `ember` binary next to this one (or `--ember PATH`).

// Unsafe code is confined to the modules that allow it below: the system
// allocator baseline, `getrusage`, and the child processes' `pre_exec` and
// `kill`.
#![deny(unsafe_code)]

#[allow(unsafe_code)]
mod alloc;
#[allow(unsafe_code)]
mod engine;
mod index;
mod persist;
#[allow(unsafe_code)]
mod recovery;
#[allow(unsafe_code)]
mod scenario;
mod util;

use clap::{Parser, Subcommand};
use pmem::{Heap, HeapOptions, PersistStats};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::{Mutex, Once};

// The usage lines say `ember bench` when `ember bench` started this binary
// (clap names the program after argv[0], which the dispatch sets to that), and
// `ember-bench` when it was run directly.
#[derive(Parser, Debug)]
#[command(
    name = "ember-bench",
    version,
    about = "Ember's benchmarks: micro-benchmarks of the persistent domain, and the papers' experiments"
)]
pub struct BenchArgs {
    #[command(subcommand)]
    pub which: Which,
}

#[derive(Subcommand, Debug)]
pub enum Which {
    /// Allocation + free throughput of the persistent allocator vs the system allocator.
    Alloc(alloc::AllocArgs),
    /// Cost of persisting a 64-byte record under each persistence strategy.
    ///
    /// Each strategy gets a heap file in the temp dir (ember-bench-PID-persist-*.heap),
    /// removed when it is measured, also when the bench is stopped by SIGINT,
    /// SIGTERM or SIGHUP or panics; a SIGKILL leaves it.
    Persist(persist::PersistArgs),
    /// Throughput and latency of an index structure (log-free paper workload).
    Index(index::IndexArgs),
    /// Recovery time of an index structure after a SIGKILL crash.
    Recovery(recovery::RecoveryArgs),
    /// Throughput and latency of a store (volatile, direct, Bullet and its
    /// variants) under a YCSB scrambled-zipfian get/put load (Bullet §7).
    Engine(engine::EngineArgs),
    /// The papers' experiments as named scenarios: CSV and chart (SVG, PNG) into
    /// --out DIR (--list names them; --quick is the short version CI runs).
    Scenario(scenario::ScenarioArgs),
    /// (internal) The process `bench recovery` builds a structure in and kills.
    #[command(hide = true, name = "recovery-fill")]
    RecoveryFill(recovery::FillArgs),
}

fn main() -> ExitCode {
    run(&BenchArgs::parse())
}

fn run(args: &BenchArgs) -> ExitCode {
    // A benchmark thread that panics leaves its peers waiting at their
    // barriers (start, stop): the process would hang until killed, with the
    // panic's message lost. Its figures are void anyway: print the message
    // (the default hook) and exit at once, failed.
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        default_hook(info);
        eprintln!("ember bench: a benchmark thread panicked; exiting");
        std::process::exit(101);
    }));
    let r = match &args.which {
        Which::Alloc(a) => alloc::run(a),
        Which::Persist(a) => persist::run(a),
        Which::Index(a) => index::run(a),
        Which::Recovery(a) => recovery::run(a),
        Which::Engine(a) => engine::run(a),
        Which::Scenario(a) => scenario::run(a),
        Which::RecoveryFill(a) => recovery::fill(a),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ember bench: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Errors of the benchmarks: pmem errors and invalid arguments, as text.
pub type BenchResult<T> = Result<T, String>;

/// Joins benchmark threads; a thread that panicked becomes an error result.
pub fn join_all<T>(
    hs: Vec<std::thread::ScopedJoinHandle<'_, BenchResult<T>>>,
) -> Vec<BenchResult<T>> {
    hs.into_iter()
        .map(|h| {
            h.join()
                .unwrap_or_else(|_| Err("benchmark thread panicked".into()))
        })
        .collect()
}

/// What machine the numbers come from.
#[derive(Clone, Debug)]
pub struct Machine {
    pub cpu: String,
    /// CPUs this process may run on.
    pub cores: usize,
    /// CPUs the kernel lists in /proc/cpuinfo.
    pub cpus_online: usize,
}

impl Machine {
    pub fn detect() -> Machine {
        let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu = info
            .lines()
            .find(|l| l.starts_with("model name"))
            .and_then(|l| l.split_once(':'))
            .map(|(_, v)| v.trim().to_string())
            .unwrap_or_else(|| "unknown".into());
        let cpus_online = info.lines().filter(|l| l.starts_with("processor")).count();
        let cores = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(cpus_online.max(1));
        Machine {
            cpu,
            cores,
            cpus_online,
        }
    }

    pub fn to_json(&self) -> Value {
        json!({ "cpu": self.cpu, "cores": self.cores, "cpus_online": self.cpus_online })
    }

    pub fn line(&self) -> String {
        format!(
            "{} ({} cores available, {} online)",
            self.cpu, self.cores, self.cpus_online
        )
    }
}

/// The median of `v` (mean of the middle two for an even count; 0 when empty).
pub fn median(v: &[f64]) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    let n = s.len();
    if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    }
}

/// The persistence work done between two snapshots.
pub fn delta(a: PersistStats, b: PersistStats) -> PersistStats {
    PersistStats {
        flushes: b.flushes.saturating_sub(a.flushes),
        fences: b.fences.saturating_sub(a.fences),
        msyncs: b.msyncs.saturating_sub(a.msyncs),
        writes_through: b.writes_through.saturating_sub(a.writes_through),
    }
}

/// `12345678.0` -> `12.35 M`.
pub fn si(v: f64) -> String {
    if v >= 1e9 {
        format!("{:.2} G", v / 1e9)
    } else if v >= 1e6 {
        format!("{:.2} M", v / 1e6)
    } else if v >= 1e3 {
        format!("{:.2} k", v / 1e3)
    } else {
        format!("{v:.2} ")
    }
}

/// A heap in a file of its own that is removed when this value drops (also when
/// the benchmark fails half way), and when the process is stopped by SIGINT,
/// SIGTERM or SIGHUP or panics (see [`TempPath`]). The heap itself drops first.
pub struct TempHeap {
    pub heap: Heap,
    _file: TempPath,
}

/// Temporary files of this process, removed by the cleanup thread on SIGINT,
/// SIGTERM and SIGHUP and by the panic hook (release builds abort on a panic,
/// so destructors do not run). A SIGKILL leaves them behind.
static TEMP_FILES: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());
static CLEANUP: Once = Once::new();

fn temp_files() -> std::sync::MutexGuard<'static, Vec<PathBuf>> {
    TEMP_FILES.lock().unwrap_or_else(|e| e.into_inner())
}

fn remove_all(files: &[PathBuf]) {
    for f in files {
        let _ = std::fs::remove_file(f);
    }
}

/// Installs (once) what removes the registered files when the process is
/// stopped by a signal or panics: a thread that waits for SIGINT, SIGTERM or
/// SIGHUP, removes them and then ends the process as the signal would have;
/// and (with panic = abort) a panic hook.
fn install_cleanup() {
    #[cfg(panic = "abort")]
    {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            previous(info);
            // try_lock: never block a panicking thread (the lock is only held
            // for a push or a retain, never across a panic point).
            if let Ok(files) = TEMP_FILES.try_lock() {
                remove_all(&files);
            }
        }));
    }
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
    let mut signals = match signal_hook::iterator::Signals::new([SIGINT, SIGTERM, SIGHUP]) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("ember bench: cannot handle signals ({e}): an interrupted run leaves its heap file behind");
            return;
        }
    };
    let spawned = std::thread::Builder::new()
        .name("bench-cleanup".into())
        .spawn(move || {
            if let Some(sig) = signals.forever().next() {
                let files = std::mem::take(&mut *temp_files());
                remove_all(&files);
                // Dies of the signal (default action), as without the handler.
                let _ = signal_hook::low_level::emulate_default_handler(sig);
                std::process::exit(128 + sig);
            }
        });
    if let Err(e) = spawned {
        eprintln!("ember bench: cannot start the cleanup thread ({e}): an interrupted run leaves its heap file behind");
    }
}

/// A temporary file's path: removed when the value drops (unless kept), or
/// when the process is stopped by SIGINT, SIGTERM or SIGHUP or panics. A
/// SIGKILL leaves the file (the scenario runner gives its children a scratch
/// directory that it removes itself).
pub struct TempPath {
    path: PathBuf,
    keep: bool,
}

impl TempPath {
    /// Registers `path` for removal. Register only a path this process created
    /// (or is about to create and has checked was absent).
    pub fn new(path: PathBuf) -> TempPath {
        CLEANUP.call_once(install_cleanup);
        temp_files().push(path.clone());
        TempPath { path, keep: false }
    }

    /// Keep the file when the value drops (it is still removed if the process
    /// is stopped by a signal first).
    pub fn keep(&mut self) {
        self.keep = true;
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for TempPath {
    fn drop(&mut self) {
        let mut files = temp_files();
        if let Some(i) = files.iter().position(|p| *p == self.path) {
            files.swap_remove(i);
        }
        if !self.keep {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

impl TempHeap {
    /// Creates a heap at `path` (default: `<tmp>/ember-bench-<pid><tag>.heap`). The
    /// file must not exist yet; it is removed again when the value drops.
    pub fn create(path: Option<&Path>, tag: &str, opts: &HeapOptions) -> BenchResult<TempHeap> {
        let path = match path {
            Some(p) => p.to_path_buf(),
            None => {
                std::env::temp_dir().join(format!("ember-bench-{}{tag}.heap", std::process::id()))
            }
        };
        // Registered for removal before it is created, so that a signal that
        // comes while the heap is being created (which takes a while on a
        // loaded machine) removes it too; but only a file this process creates
        // is ever removed: an existing one is refused first, and if the
        // creation fails the file is left as it is.
        if path.exists() {
            return Err(format!("{}: the heap file exists already", path.display()));
        }
        let mut file = TempPath::new(path.clone());
        match Heap::create(&path, opts) {
            Ok(heap) => Ok(TempHeap { heap, _file: file }),
            Err(e) => {
                file.keep();
                Err(e.to_string())
            }
        }
    }

    pub fn path(&self) -> &Path {
        self._file.path()
    }

    /// Closes the heap (a clean shutdown) and keeps the file, which is removed
    /// when the returned value drops (to reopen it, e.g. to time a recovery).
    pub fn close(self) -> TempFile {
        let TempHeap { heap, _file } = self;
        drop(heap);
        TempFile(_file)
    }
}

/// A heap file (closed) that is removed when this value drops.
pub struct TempFile(TempPath);

impl TempFile {
    pub fn path(&self) -> &Path {
        self.0.path()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians() {
        assert_eq!(median(&[]), 0.0);
        assert_eq!(median(&[3.0]), 3.0);
        assert_eq!(median(&[5.0, 1.0, 3.0]), 3.0);
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), 2.5);
    }

    #[test]
    fn temp_paths_are_removed_unless_kept() {
        let dir = std::env::temp_dir().join(format!("ember-temppath-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (a, b) = (dir.join("a"), dir.join("b"));
        std::fs::write(&a, b"x").unwrap();
        std::fs::write(&b, b"x").unwrap();
        let ta = TempPath::new(a.clone());
        let mut tb = TempPath::new(b.clone());
        tb.keep();
        assert!(temp_files().contains(&a) && temp_files().contains(&b));
        drop(ta);
        drop(tb);
        assert!(!a.exists() && b.exists());
        assert!(!temp_files().contains(&a) && !temp_files().contains(&b));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn machine_is_described() {
        let m = Machine::detect();
        assert!(m.cores >= 1);
        assert!(!m.cpu.is_empty());
    }
}
