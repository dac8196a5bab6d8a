//! A real process crash: SIGKILL while two threads write, for each persistent store.
//!
//! The test binary re-executes itself as a child (`child_worker`, ignored when run
//! directly) that opens (or creates) the store in a heap file and runs two threads:
//! each increments shared counters and overwrites keys of its own. Before an
//! operation a thread prints `@@ do <tid> <op>`; after it returned (durable),
//! `@@ ack <tid> <op>`. The parent kills the child with SIGKILL at a random moment,
//! several rounds on the same file, and after each kill opens the heap, recovers
//! and checks:
//! - every counter is at least the increments acknowledged over all rounds and at
//!   most that plus the increments in flight (one per thread);
//! - every key holds its last acknowledged value, or the value of the put in
//!   flight on that key;
//! - for Bullet, after draining the logs the frontend equals the backend.
//!
//! `EMBER_ENGINE_SIGKILL_ROUNDS` (default 4).

mod common;

use common::*;
use engine::bullet::Variant;
use engine::direct::BackendKind;
use engine::Op;
use pmem::{Heap, HeapOptions, Strategy};
use std::collections::HashMap;
use std::io::Write;
use std::path::Path;
use std::time::Duration;

const ENV_HEAP: &str = "EMBER_ENGINE_SIGKILL_HEAP";
const ENV_KIND: &str = "EMBER_ENGINE_SIGKILL_KIND";
const COUNTERS: u64 = 4;
const KEYS: u64 = 8;
const LOG: u64 = 64 << 10;

fn kinds() -> Vec<Kind> {
    vec![
        Kind::Direct(BackendKind::LogFree),
        Kind::Bullet(Variant::Full, BackendKind::LogFree),
        Kind::Bullet(Variant::Full, BackendKind::PHash),
        Kind::Bullet(Variant::St, BackendKind::PHash),
    ]
}

fn opts() -> HeapOptions {
    heap_opts(8 << 20, 64 << 20, Strategy::detect())
}

fn open_store(kind: Kind, path: &Path) -> (AnyStore, Heap) {
    open_or_create_store(kind, path, &opts(), LOG)
}

#[test]
#[ignore]
fn child_worker() {
    let Some((path, kind)) = child_args(ENV_HEAP, ENV_KIND, &kinds()) else {
        return;
    };
    let (store, _heap) = open_store(kind, Path::new(&path));
    let round = std::process::id() as u64;
    std::thread::scope(|s| {
        for t in 0..2u64 {
            let store = &store;
            s.spawn(move || {
                let mut sess = store.session();
                let mut x = round.wrapping_mul(0x9e37_79b9) ^ (t + 1);
                for n in 0.. {
                    if sess.maintain().unwrap() {
                        continue;
                    }
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let line = if x.is_multiple_of(2) {
                        let c = x % COUNTERS;
                        say(&format!("@@ do {t} incr {c}"));
                        sess.apply(format!("c{c}").as_bytes(), Op::Incr(1)).unwrap();
                        format!("@@ ack {t} incr {c}")
                    } else {
                        let k = x % KEYS;
                        let v = format!("{round}-{t}-{n}");
                        say(&format!("@@ do {t} put {k} {v}"));
                        sess.apply(format!("t{t}k{k}").as_bytes(), Op::Put(v.as_bytes()))
                            .unwrap();
                        format!("@@ ack {t} put {k} {v}")
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

#[derive(Default)]
struct Expect {
    counters: HashMap<u64, i64>,
    /// Per (thread, key): the last acknowledged value.
    puts: HashMap<(u64, u64), String>,
}

fn check(kind: Kind, path: &Path, exp: &Expect, inflight: &[Option<String>]) {
    let (store, _heap) = open_store(kind, path);
    let mut s = store.session();
    let mut out = Vec::new();
    for c in 0..COUNTERS {
        let got = if s.get(format!("c{c}").as_bytes(), &mut out).unwrap() {
            engine::parse_i64(&out).unwrap()
        } else {
            0
        };
        let acked = exp.counters.get(&c).copied().unwrap_or(0);
        let flying = inflight
            .iter()
            .flatten()
            .filter(|l| l.as_str() == format!("incr {c}"))
            .count() as i64;
        assert!(
            got >= acked && got <= acked + flying,
            "{}: counter {c} = {got}, acknowledged {acked}, in flight {flying}",
            kind.name()
        );
    }
    for t in 0..2u64 {
        for k in 0..KEYS {
            let found = s.get(format!("t{t}k{k}").as_bytes(), &mut out).unwrap();
            let got = found.then(|| String::from_utf8(out.clone()).unwrap());
            let acked = exp.puts.get(&(t, k)).cloned();
            let flying = inflight[t as usize]
                .as_ref()
                .and_then(|l| l.strip_prefix(&format!("put {k} ")).map(str::to_string));
            assert!(
                got == acked || (got.is_some() && got == flying),
                "{}: t{t}k{k} = {got:?}, acknowledged {acked:?}, in flight {flying:?}",
                kind.name()
            );
        }
    }
    drop(s);
    if let Some(b) = store.bullet() {
        b.drain().unwrap();
        b.verify().unwrap();
    }
    store.close().unwrap();
}

fn run(kind: Kind, rounds: u32) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("k.heap");
    let mut exp = Expect::default();
    let mut rng = std::process::id() as u64 ^ 0x5eed;
    for round in 0..rounds {
        let lines = run_and_kill(
            "child_worker",
            &[
                (ENV_HEAP, path.display().to_string()),
                (ENV_KIND, kind.name()),
            ],
            Duration::from_millis(150 + xorshift(&mut rng) % 250),
        );
        let acks = lines.iter().filter(|l| l.starts_with("@@ ack")).count();
        let mut inflight: Vec<Option<String>> = vec![None, None];
        for l in &lines {
            let Some(rest) = l.strip_prefix("@@ ") else {
                continue;
            };
            let mut w = rest.splitn(3, ' ');
            let (what, t, op) = (w.next().unwrap(), w.next(), w.next());
            let (Some(t), Some(op)) = (t, op) else {
                continue; // a torn last line
            };
            let t: usize = t.parse().unwrap();
            match what {
                "do" => inflight[t] = Some(op.to_string()),
                "ack" => {
                    inflight[t] = None;
                    let p: Vec<&str> = op.split(' ').collect();
                    match p[0] {
                        "incr" => *exp.counters.entry(p[1].parse().unwrap()).or_default() += 1,
                        "put" => {
                            exp.puts
                                .insert((t as u64, p[1].parse().unwrap()), p[2].to_string());
                        }
                        _ => panic!("{l}"),
                    }
                }
                _ => {}
            }
        }
        check(kind, &path, &exp, &inflight);
        // What was in flight may or may not have happened: adopt what the heap says.
        let (store, _heap) = open_store(kind, &path);
        let mut s = store.session();
        let mut out = Vec::new();
        for c in 0..COUNTERS {
            let v = if s.get(format!("c{c}").as_bytes(), &mut out).unwrap() {
                engine::parse_i64(&out).unwrap()
            } else {
                0
            };
            exp.counters.insert(c, v);
        }
        for t in 0..2u64 {
            for k in 0..KEYS {
                if s.get(format!("t{t}k{k}").as_bytes(), &mut out).unwrap() {
                    exp.puts
                        .insert((t, k), String::from_utf8(out.clone()).unwrap());
                }
            }
        }
        drop(s);
        store.close().unwrap();
        eprintln!(
            "{} round {round}: {acks} acknowledged operations",
            kind.name()
        );
    }
}

#[test]
fn sigkill_keeps_every_acknowledged_write() {
    for k in kinds() {
        run(k, sigkill_rounds());
    }
}
