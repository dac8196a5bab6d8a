//! A real process-crash test of the index structures (every [`Kind`]).
//!
//! The test binary re-executes itself as a child (`child_worker`, ignored when run
//! directly) that opens the heap file, recovers the structure, and runs random
//! put / insert / remove / get on 64 keys from two threads. Before an operation a
//! thread prints `@@ do <tid> <n> <op> <key> <value id>`; after the operation (and,
//! with the link cache, `sync`) returned, `@@ ack <tid> <n> <result> <value id seen by a get | ->`. Lines
//! are written whole under the stdout lock, so their order is a real-time order of
//! the events: a line's index is its timestamp. The parent kills the child with
//! SIGKILL at a random moment, several rounds on the same file, and after each kill
//! opens the heap, recovers and checks:
//!
//! - the heap does not claim a clean shutdown; recovery succeeds;
//! - `verify(true)` passes, `check_heap` finds no problem and its block count equals
//!   the structure's (no leak, no lost block);
//! - durable linearizability ([`common::check_durable`]): the content is the state
//!   after the previous round extended by a linearization of every acknowledged
//!   operation (with the results it returned) and any of the operations in flight;
//! - on the rounds that check a copy, random operations on the recovered copy work.
//!
//! Two rounds in three the parent recovers the real file (the next child opens a
//! cleanly closed heap); every third it checks a copy and leaves the crashed file to
//! the next child's own recovery (whose result the next round then checks).
//! Knobs: `EMBER_INDEX_SIGKILL_ROUNDS` (rounds per kind, default 8),
//! `EMBER_INDEX_SIGKILL_SEED` (repeat a run).

mod common;

use common::*;
use pmem::{Heap, HeapOptions, Strategy};
use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const ENV_HEAP: &str = "EMBER_IDX_SIGKILL_HEAP";
const ENV_KIND: &str = "EMBER_IDX_SIGKILL_KIND";
const ENV_SEED: &str = "EMBER_IDX_SIGKILL_SEED";
const ENV_ROUND: &str = "EMBER_IDX_SIGKILL_ROUND";
const NKEYS: usize = 64;
const THREADS: u64 = 2;
/// Wall-clock budget per kind (rounds stop early past it).
const BUDGET: Duration = Duration::from_secs(15);
/// A child left running on its own gives up after this.
const CHILD_LIFETIME: Duration = Duration::from_secs(60);

fn opts() -> HeapOptions {
    heap_opts(4 << 20, 64 << 20, Strategy::detect())
}

/// Opens the heap, waiting out a file lock held for a moment by another test's
/// child: a child forked while this test had the heap open inherits the locked
/// descriptor until it execs (tests of one binary run in parallel).
fn open(path: &Path) -> pmem::Result<pmem::Recovery> {
    let t0 = Instant::now();
    loop {
        match Heap::open(path, &opts()) {
            Err(pmem::Error::InUse { .. }) if t0.elapsed() < Duration::from_secs(5) => {
                std::thread::sleep(Duration::from_millis(5))
            }
            r => return r,
        }
    }
}

fn emit(line: &str) {
    // One write per line, under the stdout lock (one event, one timestamp).
    let mut out = std::io::stdout().lock();
    out.write_all(format!("@@ {line}\n").as_bytes()).unwrap();
    out.flush().unwrap();
}

/// The child: open (recover), then two threads mutate until killed.
#[test]
#[ignore = "child process of the sigkill_* tests"]
fn child_worker() {
    let Ok(path) = std::env::var(ENV_HEAP) else {
        return;
    };
    let kind = Kind::parse(&std::env::var(ENV_KIND).unwrap()).unwrap();
    let seed: u64 = std::env::var(ENV_SEED).unwrap().parse().unwrap();
    let round: u64 = std::env::var(ENV_ROUND).unwrap().parse().unwrap();
    std::thread::spawn(|| {
        std::thread::sleep(CHILD_LIFETIME);
        eprintln!("child: nobody killed me");
        std::process::exit(3);
    });
    // Terminate a partial line the harness may have printed.
    std::io::stdout().write_all(b"\n").unwrap();
    let rec = open(Path::new(&path)).expect("child: open");
    let (_heap, t, _) = recover(kind, rec).expect("child: recovery");
    emit("start");
    std::thread::scope(|s| {
        for tid in 0..THREADS {
            let t = &t;
            s.spawn(move || {
                let mut h = t.handle().expect("child: handle");
                let mut rng = SmallRng::seed_from_u64(mix(seed ^ tid));
                let mut out = Vec::new();
                for n in 0.. {
                    let op = OpKind::random(&mut rng);
                    let k = pick_key(&mut rng, NKEYS);
                    let val = vid(round + 1, tid, n);
                    emit(&format!("do {tid} {n} {} {k} {val}", op.name()));
                    let (r, got) = run_op(&mut *h, op, &key(k), val, &mut out)
                        .unwrap_or_else(|e| panic!("child: t{tid} op {n}: {e}"));
                    if !kind.durable_on_return() {
                        h.sync().expect("child: sync");
                    }
                    let got = got.map_or("-".to_string(), |g| g.to_string());
                    emit(&format!("ack {tid} {n} {r} {got}"));
                }
            });
        }
    });
}

/// The history a child printed: operations with line indices as timestamps.
struct Log {
    started: bool,
    ops: Vec<OpRec>,
    acked: u64,
}

fn parse_lines(lines: &[String]) -> Result<Log, String> {
    let mut log = Log {
        started: false,
        ops: Vec::new(),
        acked: 0,
    };
    let mut open: std::collections::HashMap<u64, usize> = Default::default();
    for (i, line) in lines.iter().enumerate() {
        let Some(pos) = line.find("@@ ") else {
            continue;
        };
        let ts = i as u64 + 1;
        let w: Vec<&str> = line[pos + 3..].split_whitespace().collect();
        let bad = || format!("bad child line {line:?}");
        let num = |s: &str| s.parse::<u64>().map_err(|_| bad());
        match w.first().copied() {
            Some("start") => log.started = true,
            Some("do") if w.len() == 6 => {
                let tid = num(w[1])?;
                if open.contains_key(&tid) {
                    return Err(format!("two operations of t{tid} in flight: {line}"));
                }
                open.insert(tid, log.ops.len());
                log.ops.push(OpRec {
                    tid,
                    n: num(w[2])?,
                    kind: OpKind::parse(w[3]).ok_or_else(bad)?,
                    key: num(w[4])? as usize,
                    val: num(w[5])?,
                    inv: ts,
                    resp: None,
                    result: None,
                    got: None,
                });
            }
            Some("ack") if w.len() == 5 => {
                let tid = num(w[1])?;
                let i = open.remove(&tid).ok_or_else(bad)?;
                let o = &mut log.ops[i];
                if o.n != num(w[2])? {
                    return Err(format!("ack of another operation: {line}"));
                }
                o.resp = Some(ts);
                o.result = Some(w[3].parse().map_err(|_| bad())?);
                o.got = if w[4] == "-" { None } else { Some(num(w[4])?) };
                log.acked += 1;
            }
            _ => return Err(bad()),
        }
    }
    Ok(log)
}

/// Recovers the heap at `path` and checks it against `base` + `log`; returns the
/// recovered state. `exercise_it` also runs operations on it (a copy only).
fn verify(
    kind: Kind,
    path: &Path,
    base: &State,
    log: &Log,
    exercise_it: bool,
    rng: &mut SmallRng,
) -> Result<State, String> {
    let rec = open(path).map_err(|e| format!("open after kill: {e}"))?;
    // (A child killed before it opened the heap leaves it clean.)
    if log.started && rec.report().was_clean {
        return Err("heap says clean after SIGKILL".into());
    }
    let (heap, t, _) = recover(kind, rec).map_err(|e| format!("recovery: {e}"))?;
    let state = check_history(&*t, &heap, base, &log.ops, u64::MAX, NKEYS)?;
    if exercise_it {
        exercise(&*t, &heap, &state, NKEYS, 64, (1 << 20) - 1, rng)?;
    }
    t.close().map_err(|e| format!("close: {e}"))?;
    Ok(state)
}

/// Kills the child when dropped (a failing parent leaves no child behind).
struct Reap(Child);

impl Drop for Reap {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn sigkill(kind: Kind) {
    if std::env::var(ENV_HEAP).is_ok() {
        return; // never recurse
    }
    let seed0 = std::env::var("EMBER_INDEX_SIGKILL_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        });
    let rounds = env_u64("EMBER_INDEX_SIGKILL_ROUNDS", 8);
    let mut rng = SmallRng::seed_from_u64(seed0 ^ kind.id());
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kill.heap");
    let copy = dir.path().join("copy.heap");
    {
        let heap = Heap::create(&path, &opts()).unwrap();
        let t = create(kind, &heap).unwrap();
        t.close().unwrap();
    }
    let exe = std::env::current_exe().unwrap();
    let started = Instant::now();
    let mut base = State::new();
    let (mut done, mut acked, mut in_flight) = (0u64, 0u64, 0u64);
    for round in 0..rounds {
        if started.elapsed() > BUDGET && done >= 3 {
            break;
        }
        let errf = dir.path().join(format!("child{round}.err"));
        let mut child = Command::new(&exe)
            .args([
                "--exact",
                "child_worker",
                "--nocapture",
                "--include-ignored",
            ])
            .env(ENV_HEAP, &path)
            .env(ENV_KIND, kind.name())
            .env(ENV_SEED, mix(seed0 ^ round).to_string())
            .env(ENV_ROUND, round.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&errf).unwrap())
            .spawn()
            .expect("spawn child");
        let out = child.stdout.take().unwrap();
        let mut child = Reap(child);
        let reader = std::thread::spawn(move || {
            let mut r = BufReader::new(out);
            let mut lines = Vec::new();
            let mut buf = Vec::new();
            loop {
                buf.clear();
                match r.read_until(b'\n', &mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(_) if buf.ends_with(b"\n") => {
                        lines.push(String::from_utf8_lossy(&buf).trim_end().to_string())
                    }
                    Ok(_) => break, // a partial last line: the child died writing it
                }
            }
            lines
        });
        let nap = rng.random_range(30..300u64);
        std::thread::sleep(Duration::from_millis(nap));
        let stderr = || std::fs::read_to_string(&errf).unwrap_or_default();
        if let Some(st) = child.0.try_wait().unwrap() {
            let _ = reader.join();
            panic!(
                "{kind} round {round}: child exited by itself ({st}):\n{}",
                stderr()
            );
        }
        child.0.kill().expect("SIGKILL");
        let st = child.0.wait().unwrap();
        assert!(!st.success(), "child not killed: {st}");
        let lines = reader.join().unwrap();
        let log = parse_lines(&lines).unwrap_or_else(|e| panic!("{kind} round {round}: {e}"));
        // Every third round checks a copy and leaves the crash to the next child.
        let on_copy = round % 3 == 2;
        let target = if on_copy {
            std::fs::copy(&path, &copy).unwrap();
            &copy
        } else {
            &path
        };
        match verify(kind, target, &base, &log, on_copy, &mut rng) {
            Ok(state) => {
                let vals: std::collections::HashSet<u64> = state.values().copied().collect();
                in_flight += log
                    .ops
                    .iter()
                    .filter(|o| o.resp.is_none() && o.kind != OpKind::Get && vals.contains(&o.val))
                    .count() as u64;
                base = state;
            }
            Err(e) => {
                panic!(
                "{kind} round {round} (EMBER_INDEX_SIGKILL_SEED={seed0}, killed after {nap} ms, \
                 {} acks, started {}, {}): {e}\nchild stderr:\n{}",
                log.acked,
                log.started,
                if on_copy { "checked a copy" } else { "recovered the file" },
                stderr()
            )
            }
        }
        if on_copy {
            let _ = std::fs::remove_file(&copy);
        }
        done += 1;
        acked += log.acked;
    }
    say(&format!(
        "index sigkill {kind}: {done} rounds, {acked} acknowledged ops verified, {} keys at the \
         end, {in_flight} values of unacknowledged ops found, seed {seed0}, {:.1} s",
        base.len(),
        started.elapsed().as_secs_f64()
    ));
    assert!(done >= 3, "too few rounds in the time budget");
    assert!(acked > 0, "no operation acknowledged");
}

#[test]
fn sigkill_hash() {
    sigkill(Kind::Hash);
}

#[test]
fn sigkill_hash_nocache() {
    sigkill(Kind::HashNoCache);
}

#[test]
fn sigkill_skip() {
    sigkill(Kind::Skip);
}

#[test]
fn sigkill_skip_nocache() {
    sigkill(Kind::SkipNoCache);
}

#[test]
fn sigkill_phash() {
    sigkill(Kind::PHash);
}
