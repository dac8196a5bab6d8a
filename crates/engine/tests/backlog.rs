//! Bullet's backlog bound (`BulletOptions::backlog_limit`): the bytes of log
//! between heads and tails, which a restart after a crash reads and replays,
//! stay within the bound while writers outrun the gleaners, and a crash while
//! writers wait at the bound (gleaning themselves, or for a background
//! gleaner) loses no acknowledged write.
//!
//! - `the_backlog_stays_within_its_bound`: one session and no gleaner thread
//!   (the writer must glean to go on), puts and increments far beyond the
//!   bound; after every write the logs hold at most the bound. The store is
//!   then dropped without closing (a crash: the logs are not drained), and the
//!   reopened store read at most the bound of log and holds every write.
//! - `sigkill_at_the_bound_keeps_every_acknowledged_write`: a child process
//!   writes from two threads with a background gleaner role (as `ember serve`
//!   with one worker) and is killed with SIGKILL at a random moment, several
//!   rounds on one heap file; after each kill, every acknowledged write is
//!   there, recovery read at most the bound, and after a drain the frontend
//!   equals the backend.

mod common;

use common::*;
use engine::bullet::{BulletOptions, BulletStore, Variant};
use engine::direct::BackendKind;
use engine::{Op, Session, Store};
use pmem::{Heap, HeapOptions, Strategy};
use std::collections::HashMap;
use std::io::Write;
use std::path::Path;
use std::time::Duration;

const ENV_HEAP: &str = "EMBER_ENGINE_BACKLOG_HEAP";
const LOG: u64 = 1 << 20;
/// The bound: 64 KiB per log over 4 logs, a sixteenth of their capacity.
const LIMIT: u64 = 4 * (64 << 10);
const COUNTERS: u64 = 4;
const KEYS: u64 = 64;

fn opts(role_threads: usize) -> BulletOptions {
    BulletOptions {
        backlog_limit: LIMIT,
        role_threads,
        static_gleaners: 0,
        epoch: Duration::from_millis(2),
        ..bullet_opts(Variant::Full, BackendKind::LogFree, LOG)
    }
}

fn heap_opts_() -> HeapOptions {
    heap_opts(16 << 20, 256 << 20, Strategy::detect())
}

fn value(t: u64, n: u64) -> Vec<u8> {
    let mut v = format!("{t}-{n}-").into_bytes();
    v.resize(200, b'x');
    v
}

#[test]
fn the_backlog_stays_within_its_bound() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("b.heap");
    let mut model: HashMap<Vec<u8>, Vec<u8>> = HashMap::new();
    {
        let heap = Heap::create(&path, &heap_opts_()).unwrap();
        let st = BulletStore::create(&heap, &opts(0)).unwrap();
        let mut s = st.session().unwrap();
        let mut most = 0;
        // About 2.5 MB of records: ten times the bound, and more than the
        // logs hold.
        for n in 0..12_000u64 {
            let key = format!("k{}", n % 3_000).into_bytes();
            let v = value(0, n);
            s.apply(&key, Op::Put(&v)).unwrap();
            model.insert(key, v);
            if n % 7 == 0 {
                let c = format!("c{}", n % COUNTERS).into_bytes();
                s.apply(&c, Op::Incr(1)).unwrap();
                let old = model.get(&c).map_or(0, |v| {
                    std::str::from_utf8(v).unwrap().parse::<i64>().unwrap()
                });
                model.insert(c, (old + 1).to_string().into_bytes());
            }
            let (used, _) = st.log_occupancy_bytes();
            most = most.max(used);
            assert!(
                used <= LIMIT,
                "write {n}: {used} bytes of log, bound {LIMIT}"
            );
        }
        assert!(most > LIMIT / 2, "the bound was never approached: {most}");
        drop(s);
        // Dropped without `close`: the logs keep their backlog, as after a crash.
    }
    let rec = Heap::open(&path, &heap_opts_()).unwrap();
    let (st, stats) = BulletStore::open(rec, &opts(0)).unwrap();
    assert!(
        stats.log_bytes <= LIMIT,
        "recovery read {} bytes of log, bound {LIMIT}",
        stats.log_bytes
    );
    let mut s = st.session().unwrap();
    let mut out = Vec::new();
    for (k, v) in &model {
        assert!(
            s.get(k, &mut out).unwrap(),
            "{:?} lost",
            String::from_utf8_lossy(k)
        );
        assert_eq!(&out, v, "{:?}", String::from_utf8_lossy(k));
    }
    drop(s);
    st.drain().unwrap();
    st.verify().unwrap();
    st.close().unwrap();
}

/// Opens (or creates) the child's store, retrying while a killed child's lock
/// is still held.
fn open_store(path: &Path) -> (BulletStore, engine::bullet::BulletRecovery, Heap) {
    if !path.exists() {
        let heap = Heap::create(path, &heap_opts_()).unwrap();
        BulletStore::create(&heap, &opts(1))
            .unwrap()
            .close()
            .unwrap();
    }
    let t0 = std::time::Instant::now();
    loop {
        match Heap::open(path, &heap_opts_()) {
            Ok(rec) => {
                let heap = rec.heap().clone();
                let (st, stats) = BulletStore::open(rec, &opts(1)).unwrap();
                return (st, stats, heap);
            }
            Err(pmem::Error::InUse { .. }) if t0.elapsed() < Duration::from_secs(5) => {
                std::thread::sleep(Duration::from_millis(20))
            }
            Err(e) => panic!("open: {e}"),
        }
    }
}

#[test]
#[ignore]
fn child_backlog_writer() {
    let Ok(path) = std::env::var(ENV_HEAP) else {
        return;
    };
    let (st, _, _heap) = open_store(Path::new(&path));
    let round = std::process::id() as u64;
    std::thread::scope(|sc| {
        for t in 0..2u64 {
            let st = &st;
            sc.spawn(move || {
                let mut s = st.session().unwrap();
                let mut x = round.wrapping_mul(0x9e37_79b9) ^ (t + 1);
                for n in 0.. {
                    let r = xorshift(&mut x);
                    let line = if r.is_multiple_of(8) {
                        let c = r % COUNTERS;
                        say(&format!("@@ do {t} incr {c}"));
                        s.apply(format!("c{c}").as_bytes(), Op::Incr(1)).unwrap();
                        format!("@@ ack {t} incr {c}")
                    } else {
                        let k = r % KEYS;
                        let v = value(round, n);
                        say(&format!("@@ do {t} put {k} {}", head_of(&v)));
                        s.apply(format!("t{t}k{k}").as_bytes(), Op::Put(&v))
                            .unwrap();
                        format!("@@ ack {t} put {k} {}", head_of(&v))
                    };
                    say(&line);
                }
            });
        }
    });
}

fn say(l: &str) {
    let out = std::io::stdout();
    let mut o = out.lock();
    let _ = writeln!(o, "{l}");
    let _ = o.flush();
}

/// What a value's head (`value`'s text before the fill) stands for.
fn head_of(v: &[u8]) -> String {
    let end = v.iter().position(|&b| b == b'x').unwrap_or(v.len());
    String::from_utf8_lossy(&v[..end]).into_owned()
}

#[test]
fn sigkill_at_the_bound_keeps_every_acknowledged_write() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("k.heap");
    let mut counters: HashMap<u64, i64> = HashMap::new();
    let mut puts: HashMap<(u64, u64), String> = HashMap::new();
    let mut rng = std::process::id() as u64 ^ 0xb0b;
    for round in 0..sigkill_rounds() {
        let lines = run_and_kill(
            "child_backlog_writer",
            &[(ENV_HEAP, path.display().to_string())],
            Duration::from_millis(300 + xorshift(&mut rng) % 400),
        );
        let mut inflight: Vec<Option<String>> = vec![None, None];
        let mut acks = 0;
        for l in &lines {
            let Some(rest) = l.strip_prefix("@@ ") else {
                continue;
            };
            let mut w = rest.splitn(3, ' ');
            let (what, t, op) = (w.next().unwrap(), w.next(), w.next());
            let (Some(t), Some(op)) = (t, op) else {
                continue; // a torn last line
            };
            let Ok(t) = t.parse::<usize>() else { continue };
            match what {
                "do" => inflight[t] = Some(op.to_string()),
                "ack" => {
                    acks += 1;
                    inflight[t] = None;
                    let p: Vec<&str> = op.split(' ').collect();
                    match p[0] {
                        "incr" => *counters.entry(p[1].parse().unwrap()).or_default() += 1,
                        "put" => {
                            puts.insert((t as u64, p[1].parse().unwrap()), p[2].to_string());
                        }
                        _ => panic!("{l}"),
                    }
                }
                _ => {}
            }
        }
        let (st, stats, _heap) = open_store(&path);
        assert!(
            stats.log_bytes <= LIMIT,
            "round {round}: recovery read {} bytes of log, bound {LIMIT}",
            stats.log_bytes
        );
        let mut s = st.session().unwrap();
        let mut out = Vec::new();
        for c in 0..COUNTERS {
            let got = if s.get(format!("c{c}").as_bytes(), &mut out).unwrap() {
                engine::parse_i64(&out).unwrap()
            } else {
                0
            };
            let acked = counters.get(&c).copied().unwrap_or(0);
            let flying = inflight
                .iter()
                .flatten()
                .filter(|l| l.as_str() == format!("incr {c}"))
                .count() as i64;
            assert!(
                got >= acked && got <= acked + flying,
                "round {round}: counter {c} = {got}, acknowledged {acked}, in flight {flying}"
            );
            // What was in flight may or may not have happened: adopt it.
            counters.insert(c, got);
        }
        for t in 0..2u64 {
            for k in 0..KEYS {
                let found = s.get(format!("t{t}k{k}").as_bytes(), &mut out).unwrap();
                let got = found.then(|| head_of(&out));
                let acked = puts.get(&(t, k)).cloned();
                let flying = inflight[t as usize]
                    .as_ref()
                    .and_then(|l| l.strip_prefix(&format!("put {k} ")).map(str::to_string));
                assert!(
                    got == acked || (got.is_some() && got == flying),
                    "round {round}: t{t}k{k} = {got:?}, acknowledged {acked:?}, in flight {flying:?}"
                );
                if let Some(g) = got {
                    puts.insert((t, k), g);
                }
            }
        }
        drop(s);
        st.drain().unwrap();
        st.verify().unwrap();
        st.close().unwrap();
        eprintln!(
            "backlog round {round}: {acks} acknowledged writes, {} bytes of log replayed",
            stats.log_bytes
        );
        assert!(acks > 0, "round {round}: the child acknowledged nothing");
    }
}
