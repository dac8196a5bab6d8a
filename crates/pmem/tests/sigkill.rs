//! A real process-crash test: the test binary re-executes itself as a child that
//! mutates a persistent structure in a loop, and the parent kills it with SIGKILL at a
//! random moment, then reopens the heap and checks it.
//!
//! The structure (see `common`): a root table of slots, each pointing to a
//! self-describing block (len, seq, slot, group, check, pattern). The child runs
//! random operations: non-transactional insert / replace / delete (NV-epoch style,
//! with free tickets) and batch delete (several tickets in flight, one batch free),
//! transactional replace, transactional in-place rewrite (logged writes),
//! multi-slot transactions (two or three slots plus the table counter, atomically,
//! one slot in a flat-nested transaction), aborted transactions, page-run and huge
//! (multi-chunk, growing the heap) blocks; `end_op` after each. Before an operation
//! the child prints `@@ do <n> <kind> <effects>`; after it, and after re-reading what
//! it wrote, `@@ ack <n>`. Set `PMEM_SIGKILL_SEED0` to repeat a run.
//!
//! After each kill the parent opens the heap (read-write recovery on most rounds, a
//! private check-only recovery on every third, which leaves the real recovery to the
//! next child), sweeps with the table's reachability and checks:
//!
//! - `check_heap` finds no problem and no committed log is left;
//! - every slot points to an allocated, intact block written for that slot, no two
//!   slots share a block;
//! - the structure equals the acknowledged state, or that state plus the one
//!   operation in flight — all of its slots and the counter together (atomicity;
//!   only a batch delete, which is not atomic, may be found partly done);
//! - the allocated block count equals the reachable count (no leak, no lost block);
//! - fresh allocations after recovery never overlap a reachable block.

mod common;

use common::*;
use pmem::{Error, Heap, PPtr};
use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const ENV_HEAP: &str = "PMEM_SIGKILL_HEAP";
const ENV_SEED: &str = "PMEM_SIGKILL_SEED";
const ENV_ROUND: &str = "PMEM_SIGKILL_ROUND";
const NSLOTS: usize = 24;
/// Blocks above this are huge (more than a small-geometry chunk's 15 data pages).
const HUGE_MIN: u64 = 15 * 65536;
const ROUNDS: u64 = 15;
const BUDGET: Duration = Duration::from_secs(20);

fn opts() -> pmem::HeapOptions {
    small_opts(4 << 20, 48 << 20)
}

fn pick_len(rng: &mut SmallRng, huge_ok: bool) -> u64 {
    let l = match rng.random_range(0..100u32) {
        0..=59 => rng.random_range(B_HDR..1024),
        60..=79 => rng.random_range(1024..65536),
        80..=93 => rng.random_range(65536..400_000),
        _ if huge_ok => rng.random_range(HUGE_MIN..2_500_000),
        _ => rng.random_range(B_HDR..4096),
    };
    l / 8 * 8
}

fn say(line: &str) {
    // One write per line (atomic on a pipe), flushed before the next step.
    let mut out = std::io::stdout().lock();
    out.write_all(format!("@@ {line}\n").as_bytes()).unwrap();
    out.flush().unwrap();
}

/// The child: open (recover), then mutate forever, acknowledging each operation.
#[test]
#[ignore = "child process of sigkill_random_operations"]
fn child_worker() {
    let Ok(path) = std::env::var(ENV_HEAP) else {
        return;
    };
    let seed: u64 = std::env::var(ENV_SEED).unwrap().parse().unwrap();
    let round: u64 = std::env::var(ENV_ROUND).unwrap().parse().unwrap();
    // Terminate a partial line the harness may have printed.
    std::io::stdout().write_all(b"\n").unwrap();
    let heap = open_and_finish(Path::new(&path), &opts()).expect("child: open + recovery");
    let t = Table::open(&heap).expect("child: table");
    let mut state = read_state(&heap, &t, false).expect("child: state after recovery");
    let mut th = heap.thread().unwrap();
    let mut rng = SmallRng::seed_from_u64(seed);
    say("start");
    let mut n = 0u64;
    loop {
        n += 1;
        let seq0 = ((round + 1) << 40) | (n << 4);
        let slot = rng.random_range(0..NSLOTS);
        let cur = state.slots.get(&slot).copied();
        let huge_ok = state.slots.values().filter(|b| b.len > HUGE_MIN).count() < 3;
        let len = pick_len(&mut rng, huge_ok);
        let k = rng.random_range(0..100u32);
        let (kind, planned): (&str, Effects) = match k {
            0..=24 => (
                "insert",
                one(slot, Some(BlockInfo::new(len, seq0, slot, 0))),
            ),
            25..=36 if cur.is_some() => ("delete", one(slot, None)),
            37..=46 if cur.is_some_and(|b| b.len <= MAX_INPLACE) => (
                "tx-update",
                one(slot, Some(BlockInfo::new(cur.unwrap().len, seq0, slot, 0))),
            ),
            47..=64 => {
                let mut slots = vec![slot];
                let want = rng.random_range(2..=3usize);
                while slots.len() < want {
                    let s = rng.random_range(0..NSLOTS);
                    if !slots.contains(&s) {
                        slots.push(s);
                    }
                }
                let c = state.counter + 1;
                let eff = Effects {
                    slots: slots
                        .iter()
                        .enumerate()
                        .map(|(i, &s)| {
                            let l = pick_len(&mut rng, false);
                            (s, Some(BlockInfo::new(l, seq0 + i as u64, s, c)))
                        })
                        .collect(),
                    counter: Some(c),
                };
                ("tx-multi", eff)
            }
            65..=72 => ("tx-abort", Effects::default()),
            73..=76 => {
                let mut slots: Vec<usize> = state.slots.keys().copied().collect();
                slots.retain(|_| rng.random_bool(0.3));
                slots.truncate(6);
                (
                    "delete-batch",
                    Effects {
                        slots: slots.into_iter().map(|s| (s, None)).collect(),
                        counter: None,
                    },
                )
            }
            _ => (
                "tx-replace",
                one(slot, Some(BlockInfo::new(len, seq0, slot, 0))),
            ),
        };
        say(&format!("do {n} {kind} {}", planned.encode()));
        let r = match kind {
            "insert" => op_insert(&heap, &mut th, &t, slot, BlockInfo::new(len, seq0, slot, 0)),
            "delete" => op_delete(&heap, &mut th, &t, slot),
            "tx-update" => op_tx_update(&heap, &mut th, &t, slot, seq0),
            "tx-multi" => {
                let list: Vec<(usize, u64)> = planned
                    .slots
                    .iter()
                    .map(|(s, b)| (*s, b.unwrap().len))
                    .collect();
                op_tx_multi(&heap, &mut th, &t, &list, seq0)
            }
            "delete-batch" => {
                let list: Vec<usize> = planned.slots.iter().map(|(s, _)| *s).collect();
                op_delete_batch(&heap, &mut th, &t, &list)
            }
            "tx-abort" => op_tx_abort(&heap, &mut th, &t, slot, BlockInfo::new(len, seq0, slot, 0)),
            "tx-replace" => {
                op_tx_replace(&heap, &mut th, &t, slot, BlockInfo::new(len, seq0, slot, 0))
            }
            _ => unreachable!(),
        };
        match r {
            Ok(eff) => {
                assert_eq!(eff, planned, "op {n} {kind}: effects differ from the plan");
                state.apply(&eff);
                // Re-read what the op wrote before acknowledging it (this also widens
                // the window in which a kill finds an op durable but unacknowledged).
                for (s, b) in &eff.slots {
                    let p = t.get(heap.region(), *s);
                    match b {
                        Some(b) => assert_eq!(
                            read_block(heap.region(), p, b.len <= 65536).unwrap(),
                            *b,
                            "op {n} {kind}: slot {s} after the op"
                        ),
                        None => assert_eq!(p, 0, "op {n} {kind}: slot {s} not cleared"),
                    }
                }
                say(&format!("ack {n}"));
            }
            Err(e @ (Error::HeapFull { .. } | Error::ActivePagesFull(..))) => {
                say(&format!("fail {n} {}", e.to_string().replace(' ', "_")));
            }
            Err(e) => panic!("child: op {n} {kind} failed: {e}"),
        }
    }
}

fn one(slot: usize, b: Option<BlockInfo>) -> Effects {
    Effects {
        slots: vec![(slot, b)],
        counter: None,
    }
}

struct Log {
    acked: u64,
    failed: u64,
    started: bool,
    pending: Option<(u64, String, Effects)>,
}

/// Applies the child's acknowledged operations to the model; returns what was left in
/// flight.
fn apply_lines(model: &mut State, lines: &[String]) -> Log {
    let mut log = Log {
        acked: 0,
        failed: 0,
        started: false,
        pending: None,
    };
    for line in lines {
        let Some(pos) = line.find("@@ ") else {
            continue;
        };
        let w: Vec<&str> = line[pos + 3..].split_whitespace().collect();
        match w.first().copied() {
            Some("start") => log.started = true,
            Some("do") => {
                assert!(log.pending.is_none(), "two ops in flight: {line}");
                let n: u64 = w[1].parse().unwrap();
                let eff = Effects::decode(&w[3..]).unwrap_or_else(|| panic!("bad line {line}"));
                log.pending = Some((n, w[2].to_string(), eff));
            }
            Some("ack") => {
                let n: u64 = w[1].parse().unwrap();
                let (pn, _, eff) = log.pending.take().expect("ack without do");
                assert_eq!(n, pn, "ack of another op: {line}");
                model.apply(&eff);
                log.acked += 1;
            }
            Some("fail") => {
                log.pending = None;
                log.failed += 1;
            }
            _ => panic!("unknown child line {line:?}"),
        }
    }
    log
}

/// Checks the heap after a kill; returns the state found.
fn verify(
    path: &Path,
    model: &State,
    log: &Log,
    read_write: bool,
    rng: &mut SmallRng,
) -> Result<State, String> {
    let rec = if read_write {
        Heap::open(path, &opts())
    } else {
        Heap::open_check(path)
    }
    .map_err(|e| format!("open after kill: {e}"))?;
    // (A child killed before it got to open the heap leaves it clean.)
    if read_write && log.started && rec.report().was_clean {
        return Err("heap says clean after SIGKILL".into());
    }
    let reach = reachable_of(rec.heap());
    let (heap, rep) = rec
        .finish(|b| reach.contains(&b.offset()))
        .map_err(|e| format!("recovery sweep failed: {e}"))?;
    let t = Table::open(&heap).ok_or("table lost")?;
    let actual = read_state(&heap, &t, true)?;
    let after = log.pending.as_ref().map(|(_, _, eff)| {
        let mut m = model.clone();
        m.apply(eff);
        m
    });
    // A batch delete is not atomic: each of its slots is old or deleted.
    let partial_ok = match &log.pending {
        Some((_, kind, eff)) if kind == "delete-batch" => {
            let touched: Vec<usize> = eff.slots.iter().map(|(s, _)| *s).collect();
            actual.counter == model.counter
                && (0..NSLOTS).all(|s| {
                    let a = actual.slots.get(&s);
                    a == model.slots.get(&s) || (a.is_none() && touched.contains(&s))
                })
        }
        _ => false,
    };
    if actual != *model && after.as_ref() != Some(&actual) && !partial_ok {
        return Err(format!(
            "state after kill matches neither the acknowledged state nor it plus the op in \
             flight {:?}\nacknowledged: {model:?}\nactual: {actual:?}",
            log.pending.as_ref().map(|(n, k, _)| (n, k))
        ));
    }
    check_allocator(&heap, &t)?;
    if read_write {
        // Fresh allocations never overlap a reachable block.
        let mut ranges: Vec<(u64, u64)> = t
            .reachable(heap.region())
            .into_iter()
            .map(|p| (p, p + heap.usable_size(PPtr::from_raw(p)).unwrap()))
            .collect();
        let mut th = heap.thread().map_err(|e| e.to_string())?;
        let mut fresh = Vec::new();
        for _ in 0..40 {
            let len = pick_len(rng, false);
            let p = match th.alloc(len) {
                Ok(p) => p,
                Err(Error::HeapFull { .. }) => break,
                Err(e) => return Err(format!("fresh alloc: {e}")),
            };
            let end = p.offset() + heap.usable_size(p).unwrap();
            if let Some(r) = ranges.iter().find(|r| p.offset() < r.1 && r.0 < end) {
                return Err(format!(
                    "fresh block [{:#x}, {end:#x}) overlaps [{:#x}, {:#x})",
                    p.offset(),
                    r.0,
                    r.1
                ));
            }
            ranges.push((p.offset(), end));
            fresh.push(p);
            th.end_op();
        }
        for p in fresh {
            th.free(p).map_err(|e| format!("free fresh: {e}"))?;
        }
        th.end_op();
        check_allocator(&heap, &t)?;
    }
    let _ = rep;
    Ok(actual)
}

fn seed() -> u64 {
    match std::env::var("PMEM_SIGKILL_SEED0") {
        Ok(s) => s.parse().unwrap(),
        Err(_) => std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64,
    }
}

#[test]
fn sigkill_random_operations() {
    if std::env::var(ENV_HEAP).is_ok() {
        return; // never recurse
    }
    let seed0 = seed();
    eprintln!("sigkill: seed {seed0} (set PMEM_SIGKILL_SEED0 to repeat)");
    let mut rng = SmallRng::seed_from_u64(seed0);
    let dir = tempfile::tempdir().unwrap();
    let path: PathBuf = dir.path().join("kill.heap");
    {
        let heap = Heap::create(&path, &opts()).unwrap();
        let mut th = heap.thread().unwrap();
        Table::create(&heap, &mut th, NSLOTS);
    }
    let exe = std::env::current_exe().unwrap();
    let started = Instant::now();
    let mut model = State::default();
    let (mut rounds, mut acked, mut failed, mut in_flight_applied) = (0u64, 0u64, 0u64, 0u64);
    for round in 0..ROUNDS {
        if started.elapsed() > BUDGET {
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
            .env(ENV_SEED, (seed0 ^ mix(round)).to_string())
            .env(ENV_ROUND, round.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&errf).unwrap())
            .spawn()
            .expect("spawn child");
        let out = child.stdout.take().unwrap();
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
        let nap = rng.random_range(50..400u64);
        std::thread::sleep(Duration::from_millis(nap));
        if let Some(st) = child.try_wait().unwrap() {
            let _ = reader.join();
            panic!(
                "round {round}: child exited by itself ({st}):\n{}",
                std::fs::read_to_string(&errf).unwrap_or_default()
            );
        }
        child.kill().expect("SIGKILL");
        let st = child.wait().unwrap();
        assert!(!st.success(), "child not killed: {st}");
        let lines = reader.join().unwrap();
        let before = model.clone();
        let log = apply_lines(&mut model, &lines);
        let read_write = round % 3 != 2;
        match verify(&path, &model, &log, read_write, &mut rng) {
            Ok(actual) => {
                if actual != model {
                    in_flight_applied += 1;
                }
                model = actual;
            }
            Err(e) => panic!(
                "round {round} (seed {seed0}, killed after {nap} ms, {} acks, started {}, \
                 {} mode): {e}\nstate before the round: {before:?}\nchild stderr:\n{}",
                log.acked,
                log.started,
                if read_write {
                    "read-write"
                } else {
                    "check-only"
                },
                std::fs::read_to_string(&errf).unwrap_or_default()
            ),
        }
        rounds += 1;
        acked += log.acked;
        failed += log.failed;
    }
    eprintln!(
        "sigkill: {rounds} rounds, {acked} acknowledged ops verified ({failed} failed with \
         heap full, {in_flight_applied} in-flight ops found applied), {} slots occupied \
         ({} huge), counter {}, heap file {} MiB, {:.1} s",
        model.slots.len(),
        model.slots.values().filter(|b| b.len > HUGE_MIN).count(),
        model.counter,
        std::fs::metadata(&path).unwrap().len() >> 20,
        started.elapsed().as_secs_f64()
    );
    assert!(rounds >= 5, "too few rounds in the time budget");
    assert!(acked > 0, "no operation acknowledged");
}
