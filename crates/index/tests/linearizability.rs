//! Linearizability of the index structures (every [`Kind`]) on small concurrent
//! histories.
//!
//! Many rounds on one structure: thread 0 sets two keys to a known state, then
//! three threads each run three random operations (put / insert / remove / get) on
//! the two keys, with random short delays, after a spinning barrier (the first
//! thread out of it waits for a second, so that two start together; the kinds run
//! one at a time).
//! Each operation takes an invocation and a response timestamp from one global
//! atomic counter. After the round thread 0 reads both keys (two more operations).
//! The history is checked by a brute-force Wing–Gong search for a linearization
//! against a sequential map: every operation's result (and the value a get
//! returned) must match the map at its linearization point, and the order must
//! respect real time. A round without one fails the test with its history.
//!
//! How often operations really overlap depends on the scheduler (three threads,
//! maybe two cores, other load): each kind runs at least `EMBER_INDEX_LIN_ROUNDS`
//! rounds (default 2000) and goes on until `EMBER_INDEX_LIN_CONCURRENT` histories
//! (default 300) had operations of two threads on one key overlapping in time, or
//! for at most `EMBER_INDEX_LIN_SECS` seconds (default 3). The summary line says
//! how many histories were concurrent: on a machine with one free core, few are.

mod common;

use common::*;
use pmem::{Heap, Strategy};
use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};
use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;

const THREADS: usize = 3;
const OPS: usize = 3;
const KEYS: usize = 2;

/// A barrier whose waiters spin (and yield), so that threads leave it together.
struct SpinBarrier {
    n: usize,
    count: AtomicUsize,
    gen: AtomicUsize,
}

impl SpinBarrier {
    fn new(n: usize) -> Self {
        SpinBarrier {
            n,
            count: AtomicUsize::new(0),
            gen: AtomicUsize::new(0),
        }
    }

    /// Waits for the others; false if `abort` was raised meanwhile.
    fn wait(&self, abort: &AtomicBool) -> bool {
        let g = self.gen.load(Ordering::Acquire);
        if self.count.fetch_add(1, Ordering::AcqRel) + 1 == self.n {
            self.count.store(0, Ordering::Release);
            self.gen.fetch_add(1, Ordering::AcqRel);
            return true;
        }
        let mut spins = 0u32;
        while self.gen.load(Ordering::Acquire) == g {
            if abort.load(Ordering::Acquire) {
                return false;
            }
            spins += 1;
            if spins < 2_000 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
        true
    }
}

/// The sequential map: applies `o` to `s`; false if the result `o` returned (or
/// the value its get saw) is not what the map gives.
fn apply(s: &mut State, o: &OpRec) -> bool {
    let cur = s.get(&o.key).copied();
    let r = o.result.unwrap();
    match o.kind {
        OpKind::Get => r == cur.is_some() && o.got == cur,
        OpKind::Put => {
            s.insert(o.key, o.val);
            r == cur.is_none()
        }
        OpKind::Insert => {
            if cur.is_none() {
                s.insert(o.key, o.val);
            }
            r == cur.is_none()
        }
        OpKind::Remove => {
            s.remove(&o.key);
            r == cur.is_some()
        }
    }
}

/// Wing–Gong: is there an order of `ops` (all completed) that respects real time
/// (`a.resp < b.inv` puts a before b) in which every result matches the map that
/// starts at `init`?
fn linearizable(init: &State, ops: &[OpRec]) -> bool {
    fn search(
        ops: &[OpRec],
        left: u32,
        s: &State,
        seen: &mut HashSet<(u32, Vec<(usize, u64)>)>,
    ) -> bool {
        if left == 0 {
            return true;
        }
        if !seen.insert((left, s.iter().map(|(&k, &v)| (k, v)).collect())) {
            return false;
        }
        // The earliest response among the remaining operations: an operation invoked
        // after it cannot come next.
        let min_resp = (0..ops.len())
            .filter(|i| left & (1 << i) != 0)
            .map(|i| ops[i].resp.unwrap())
            .min()
            .unwrap();
        for i in 0..ops.len() {
            if left & (1 << i) == 0 || ops[i].inv > min_resp {
                continue;
            }
            let mut s2 = s.clone();
            if apply(&mut s2, &ops[i]) && search(ops, left & !(1 << i), &s2, seen) {
                return true;
            }
        }
        false
    }
    assert!(ops.len() < 32);
    search(ops, (1u32 << ops.len()) - 1, init, &mut HashSet::new())
}

struct Shared {
    clock: AtomicU64,
    start: SpinBarrier,
    end: SpinBarrier,
    history: Mutex<Vec<OpRec>>,
    /// Set by thread 0 after the last round.
    stop: AtomicBool,
    /// Set by a thread that failed.
    abort: AtomicBool,
    /// Histories in which two threads' operations on one key overlapped in time.
    overlapping: AtomicU64,
    /// Threads out of the start barrier this round.
    ready: AtomicUsize,
    t0: std::time::Instant,
}

fn stamp(sh: &Shared) -> u64 {
    sh.clock.fetch_add(1, Ordering::SeqCst) + 1
}

fn thread_main(
    sh: &Shared,
    t: &Idx,
    kind: Kind,
    tid: usize,
    limits: (u64, u64, f64),
    seed: u64,
) -> Result<u64, String> {
    let mut h = t.handle().map_err(|e| format!("handle: {e}"))?;
    let mut rng = SmallRng::seed_from_u64(mix(seed ^ tid as u64));
    let mut out = Vec::new();
    let mut init = State::new();
    let mut checked = 0;
    let (min_rounds, want_concurrent, secs) = limits;
    for round in 0.. {
        if tid == 0 {
            if round > 0 {
                // Final reads, then the check of the previous round.
                let mut hist = std::mem::take(&mut *sh.history.lock().unwrap());
                for k in 0..KEYS {
                    let inv = stamp(sh);
                    let (r, got) = run_op(&mut *h, OpKind::Get, &key(k), 0, &mut out)?;
                    let resp = stamp(sh);
                    hist.push(OpRec {
                        tid: THREADS as u64,
                        n: k as u64,
                        kind: OpKind::Get,
                        key: k,
                        val: 0,
                        inv,
                        resp: Some(resp),
                        result: Some(r),
                        got,
                    });
                }
                hist.sort_by_key(|o| o.inv);
                checked += 1;
                if hist.iter().any(|a| {
                    hist.iter().any(|b| {
                        a.tid != b.tid && a.key == b.key && a.inv < b.inv && b.inv < a.resp.unwrap()
                    })
                }) {
                    sh.overlapping.fetch_add(1, Ordering::Relaxed);
                }
                if !linearizable(&init, &hist) {
                    let mut msg = format!(
                        "{kind} round {} (seed {seed:#x}): no linearization; initial state {init:?}\n",
                        round - 1
                    );
                    for o in &hist {
                        msg.push_str(&format!("  {o}\n"));
                    }
                    return Err(msg);
                }
            }
            let enough = round >= min_rounds
                && (sh.overlapping.load(Ordering::Relaxed) >= want_concurrent
                    || sh.t0.elapsed().as_secs_f64() > secs);
            if enough || round >= (1 << 20) - 1 {
                sh.stop.store(true, Ordering::Release);
            } else {
                // A known initial state for the round.
                init.clear();
                for k in 0..KEYS {
                    if rng.random_bool(0.6) {
                        let v = vid(round, 7, k as u64);
                        h.put(&key(k), &value(v)).map_err(|e| e.to_string())?;
                        init.insert(k, v);
                    } else {
                        h.remove(&key(k)).map_err(|e| e.to_string())?;
                    }
                }
            }
        }
        if tid == 0 {
            sh.ready.store(0, Ordering::Release);
        }
        if !sh.start.wait(&sh.abort) {
            return Err("aborted".into());
        }
        if sh.stop.load(Ordering::Acquire) {
            break;
        }
        // The first thread out of the barrier waits for a second one (both are
        // running then), so that at least two start together.
        if sh.ready.fetch_add(1, Ordering::AcqRel) == 0 {
            let mut spins = 0u32;
            while sh.ready.load(Ordering::Acquire) < 2 && !sh.abort.load(Ordering::Relaxed) {
                spins += 1;
                if spins.is_multiple_of(4096) {
                    std::thread::yield_now();
                } else {
                    std::hint::spin_loop();
                }
            }
        }
        let mut mine = Vec::with_capacity(OPS);
        for n in 0..OPS {
            for _ in 0..rng.random_range(0..[8u32, 60, 300][n % 3]) {
                std::hint::spin_loop();
            }
            let kind = OpKind::random(&mut rng);
            let k = rng.random_range(0..KEYS);
            let val = vid(round, tid as u64, n as u64);
            let inv = stamp(sh);
            let (r, got) = run_op(&mut *h, kind, &key(k), val, &mut out)?;
            if rng.random_range(0..4u32) == 0 {
                h.sync().map_err(|e| e.to_string())?;
            }
            let resp = stamp(sh);
            mine.push(OpRec {
                tid: tid as u64,
                n: n as u64,
                kind,
                key: k,
                val,
                inv,
                resp: Some(resp),
                result: Some(r),
                got,
            });
        }
        sh.history.lock().unwrap().extend(mine);
        if !sh.end.wait(&sh.abort) {
            return Err("aborted".into());
        }
    }
    Ok(checked)
}

/// The kinds run one at a time: the harness runs tests in parallel, and six
/// threads on two cores rarely overlap their operations.
static SERIAL: Mutex<()> = Mutex::new(());

fn lin(kind: Kind) {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let limits = (
        env_u64("EMBER_INDEX_LIN_ROUNDS", 2000),
        env_u64("EMBER_INDEX_LIN_CONCURRENT", 300),
        env_u64("EMBER_INDEX_LIN_SECS", 3) as f64,
    );
    let seed = env_u64("EMBER_INDEX_LIN_SEED", 0x11ea) ^ kind.id();
    let dir = tempfile::tempdir_in(shm_dir()).unwrap();
    let path = dir.path().join("lin.heap");
    let heap = Heap::create(&path, &heap_opts(4 << 20, 64 << 20, Strategy::FenceOnly)).unwrap();
    let t = create(kind, &heap).unwrap();
    let sh = Shared {
        clock: AtomicU64::new(0),
        start: SpinBarrier::new(THREADS),
        end: SpinBarrier::new(THREADS),
        history: Mutex::new(Vec::new()),
        stop: AtomicBool::new(false),
        abort: AtomicBool::new(false),
        overlapping: AtomicU64::new(0),
        ready: AtomicUsize::new(0),
        t0: std::time::Instant::now(),
    };
    let started = std::time::Instant::now();
    let results: Vec<Result<u64, String>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..THREADS)
            .map(|tid| {
                let (sh, t) = (&sh, &t);
                s.spawn(move || {
                    let r = thread_main(sh, t, kind, tid, limits, seed);
                    if r.is_err() {
                        sh.abort.store(true, Ordering::Release);
                    }
                    r
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut checked = 0;
    let errors: Vec<&String> = results
        .iter()
        .filter_map(|r| r.as_ref().err())
        .filter(|e| *e != "aborted")
        .collect();
    assert!(errors.is_empty(), "{}", errors[0]);
    for r in &results {
        checked += r.as_ref().unwrap();
    }
    say(&format!(
        "index linearizability {kind}: {checked} histories of {THREADS}x{OPS} ops on {KEYS} keys, \
         all linearizable, {} with concurrent ops on one key ({:.1} s)",
        sh.overlapping.load(Ordering::Relaxed),
        started.elapsed().as_secs_f64()
    ));
    assert!(checked >= limits.0);
    t.verify(false).unwrap();
}

#[test]
fn linearizability_hash() {
    lin(Kind::Hash);
}

#[test]
fn linearizability_hash_nocache() {
    lin(Kind::HashNoCache);
}

#[test]
fn linearizability_skip() {
    lin(Kind::Skip);
}

#[test]
fn linearizability_skip_nocache() {
    lin(Kind::SkipNoCache);
}

#[test]
fn linearizability_phash() {
    lin(Kind::PHash);
}

/// The Wing–Gong checker itself must reject non-linearizable histories.
#[test]
fn checker_rejects_non_linearizable_histories() {
    let op = |tid, kind, key, val, inv, resp, result, got| OpRec {
        tid,
        n: 0,
        kind,
        key,
        val,
        inv,
        resp: Some(resp),
        result: Some(result),
        got,
    };
    let empty = State::new();
    // put then a later get that misses it.
    let h = [
        op(0, OpKind::Put, 0, 5, 1, 2, true, None),
        op(1, OpKind::Get, 0, 0, 3, 4, false, None),
    ];
    assert!(!linearizable(&empty, &h));
    // The same get overlapping the put may miss it.
    let h = [
        op(0, OpKind::Put, 0, 5, 1, 3, true, None),
        op(1, OpKind::Get, 0, 0, 2, 4, false, None),
    ];
    assert!(linearizable(&empty, &h));
    // Two successful inserts of one key with no remove between them.
    let h = [
        op(0, OpKind::Insert, 0, 5, 1, 3, true, None),
        op(1, OpKind::Insert, 0, 6, 2, 4, true, None),
    ];
    assert!(!linearizable(&empty, &h));
    // A get returning a value that was overwritten before it began.
    let h = [
        op(0, OpKind::Put, 1, 5, 1, 2, true, None),
        op(0, OpKind::Put, 1, 6, 3, 4, false, None),
        op(1, OpKind::Get, 1, 0, 5, 6, true, Some(5)),
    ];
    assert!(!linearizable(&empty, &h));
    // Keys are independent; the initial state counts.
    let init = State::from([(1, 9)]);
    let h = [
        op(0, OpKind::Remove, 1, 0, 1, 2, true, None),
        op(1, OpKind::Insert, 0, 5, 1, 2, true, None),
    ];
    assert!(linearizable(&init, &h));
    assert!(!linearizable(&empty, &h));
}
