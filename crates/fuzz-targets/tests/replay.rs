//! Replays every file of every corpus (`fuzz/corpus/NAME/` at the repository
//! root) through its target, as part of the normal test suite: what the
//! fuzzer found once (crashes fixed since, kept as corpus files) and the
//! coverage it reached stay checked without libFuzzer or a nightly compiler.
//!
//! Each target runs on its own thread under a deadline: an input that hangs
//! fails the test naming the file, instead of stalling the suite. A target
//! added to `ember_fuzz_targets::TARGETS` is replayed with no change here.

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ember_fuzz_targets::Target;

/// The longest the corpora may take (they take seconds).
const DEADLINE: Duration = Duration::from_secs(120);

fn corpus_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus")
}

fn files(target: &str) -> Vec<PathBuf> {
    let dir = corpus_root().join(target);
    let mut v: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("corpus entry").path())
        .filter(|p| p.is_file())
        .collect();
    v.sort();
    v
}

/// Replays `target`'s corpus on a thread of its own; the receiver gets the
/// outcome (the file that failed, if one did).
fn replay(
    target: &'static str,
    f: Target,
) -> (mpsc::Receiver<Result<usize, PathBuf>>, Arc<Mutex<PathBuf>>) {
    let files = files(target);
    assert!(!files.is_empty(), "the {target} corpus is empty");
    let current = Arc::new(Mutex::new(PathBuf::new()));
    let (tx, rx) = mpsc::channel();
    let cur = current.clone();
    std::thread::spawn(move || {
        let n = files.len();
        for p in files {
            let data = std::fs::read(&p).expect("read a corpus file");
            *cur.lock().unwrap() = p.clone();
            let t = Instant::now();
            let r = std::panic::catch_unwind(|| f(&data));
            if std::env::var_os("FUZZ_REPLAY_TIMES").is_some() {
                eprintln!("{target}: {} {:.2?}", p.display(), t.elapsed());
            }
            if r.is_err() {
                let _ = tx.send(Err(p));
                return;
            }
        }
        let _ = tx.send(Ok(n));
    });
    (rx, current)
}

/// Every target's corpus, the targets in parallel (each keeps its server or
/// heap in thread-local state), each under [`DEADLINE`].
#[test]
fn every_corpus() {
    let t0 = Instant::now();
    let runs: Vec<_> = ember_fuzz_targets::TARGETS
        .iter()
        .map(|&(name, f)| (name, replay(name, f)))
        .collect();
    let mut failed = Vec::new();
    for (name, (rx, current)) in runs {
        let left = DEADLINE.saturating_sub(t0.elapsed());
        match rx.recv_timeout(left) {
            Ok(Ok(n)) => eprintln!("{name}: {n} inputs, done after {:.2?}", t0.elapsed()),
            Ok(Err(p)) => failed.push(format!(
                "{name}: {} fails (the panic is above)",
                p.display()
            )),
            Err(_) => failed.push(format!(
                "{name}: not done after {DEADLINE:?}; running {}",
                current.lock().unwrap().display()
            )),
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}

/// Every corpus directory belongs to a target, and every target has one:
/// a corpus nothing replays would be dead weight.
#[test]
fn corpora_match_targets() {
    let mut dirs: Vec<String> = std::fs::read_dir(corpus_root())
        .expect("fuzz/corpus")
        .map(|e| e.expect("entry"))
        .filter(|e| e.path().is_dir())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    dirs.sort();
    let mut names: Vec<String> = ember_fuzz_targets::TARGETS
        .iter()
        .map(|(n, _)| n.to_string())
        .collect();
    names.sort();
    assert_eq!(dirs, names);
}
