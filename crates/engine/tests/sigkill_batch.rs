//! A real process crash in the middle of batches: SIGKILL while two threads
//! apply `Session::apply_batch`, for the Bullet and direct stores.
//!
//! The test binary re-executes itself as a child (`child_batches`, ignored
//! when run directly) that opens (or creates) the store in a heap file and
//! runs two threads, each on key groups of its own: batch `v` on group `g`
//! is `a_g := v`, `b_g := v`, `c_g += 1` and `e_g`, an inner node of a
//! collection's tree, merged with `ChildAdd(0, +1)` (`v` grows: round and
//! sequence number; `e_g` is put before the group's first batch). Before a batch a thread prints `@@ do <g> <v>`; after it returned
//! (and its commit, under group commit), `@@ ack <g> <v>`. The parent kills
//! the child with SIGKILL at a random moment, several rounds on one file, and
//! after each kill recovers and checks every group: `a_g` and `b_g` hold the
//! same `v`, not older than the last acknowledged batch; `c_g` counts exactly
//! the batches up to that one, and so does `e_g`'s count (every merge applied
//! once); for Bullet, after draining the logs the
//! frontend equals the backend.
//!
//! `EMBER_ENGINE_SIGKILL_ROUNDS` (default 4).

mod common;

use common::*;
use engine::bullet::Variant;
use engine::direct::BackendKind;
use engine::types::edit::Edit;
use engine::types::node::{Child, Entry, Node};
use engine::WriteBatch;
use pmem::{Heap, HeapOptions, Strategy};
use std::collections::HashMap;
use std::io::Write;
use std::path::Path;
use std::time::Duration;

const ENV_HEAP: &str = "EMBER_ENGINE_SIGKILL_BATCH_HEAP";
const ENV_KIND: &str = "EMBER_ENGINE_SIGKILL_BATCH_KIND";
const ENV_ROUND: &str = "EMBER_ENGINE_SIGKILL_BATCH_ROUND";
/// Groups per thread.
const GROUPS: u64 = 4;
const LOG: u64 = 64 << 10;

fn kinds() -> Vec<Kind> {
    vec![
        Kind::Direct(BackendKind::LogFree),
        Kind::Direct(BackendKind::PHash),
        Kind::Bullet(Variant::Full, BackendKind::LogFree),
        Kind::Bullet(Variant::Full, BackendKind::PHash),
        // Under msync: records staged and written through the file at the
        // commit (`Pool::stages`).
        Kind::BulletGroup(Variant::Full, BackendKind::LogFree),
    ]
}

fn opts(kind: Kind) -> HeapOptions {
    let strategy = match kind {
        Kind::BulletGroup(..) => Strategy::Msync,
        _ => Strategy::detect(),
    };
    heap_opts(8 << 20, 64 << 20, strategy)
}

fn open_store(kind: Kind, path: &Path) -> (AnyStore, Heap) {
    open_or_create_store(kind, path, &opts(kind), LOG)
}

fn key(k: &str, g: u64) -> Vec<u8> {
    format!("{k}{g}").into_bytes()
}

/// An inner node with one child of count `n`.
fn inner(n: u64) -> Vec<u8> {
    Node::Inner(vec![Child {
        id: 1,
        count: n,
        low: Entry::new(0.0, Vec::new()),
    }])
    .encode(false)
}

/// The count of `inner`'s child.
fn inner_count(v: &[u8]) -> i64 {
    match Node::decode(v, false) {
        Ok(Node::Inner(c)) if c.len() == 1 => c[0].count as i64,
        x => panic!("e holds {x:?}"),
    }
}

#[test]
#[ignore]
fn child_batches() {
    let Some((path, kind)) = child_args(ENV_HEAP, ENV_KIND, &kinds()) else {
        return;
    };
    let round: u64 = std::env::var(ENV_ROUND).unwrap().parse().unwrap();
    let (store, _heap) = open_store(kind, Path::new(&path));
    std::thread::scope(|s| {
        for t in 0..2u64 {
            let store = &store;
            s.spawn(move || {
                let mut sess = store.session();
                let mut out = Vec::new();
                let mut buf = Vec::new();
                for g in t * GROUPS..(t + 1) * GROUPS {
                    if !sess.get(&key("e", g), &mut buf).unwrap() {
                        sess.apply(&key("e", g), engine::Op::Put(&inner(0)))
                            .unwrap();
                    }
                }
                sess.commit().unwrap();
                let mut add = Vec::new();
                Edit::ChildAdd { idx: 0, delta: 1 }.encode(false, &mut add);
                let mut w = WriteBatch::new();
                for n in 0u64.. {
                    if sess.maintain().unwrap() {
                        continue;
                    }
                    let g = t * GROUPS + n % GROUPS;
                    // Fixed width: newer batches compare greater.
                    let v = format!("{round:04}-{n:010}-{}", "v".repeat((n % 64) as usize));
                    w.clear();
                    w.put(&key("a", g), v.as_bytes());
                    w.incr(&key("c", g), 1);
                    w.merge(&key("e", g), &add);
                    w.put(&key("b", g), v.as_bytes());
                    say(&format!("@@ do {g} {v}"));
                    out.clear();
                    sess.apply_batch(&w, &mut out).unwrap();
                    sess.commit().unwrap();
                    say(&format!("@@ ack {g} {v}"));
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

/// What the heap held after the previous round, per group: `v` and `c`.
type State = HashMap<u64, (Option<String>, i64)>;

fn read(kind: Kind, path: &Path) -> (State, Result<(), String>) {
    let (store, _heap) = open_store(kind, path);
    let mut s = store.session();
    let mut out = Vec::new();
    let mut st = State::new();
    let mut err = Ok(());
    for g in 0..2 * GROUPS {
        let mut get = |k: &str| {
            s.get(&key(k, g), &mut out)
                .unwrap()
                .then(|| String::from_utf8(out.clone()).unwrap())
        };
        let (a, b, c) = (get("a"), get("b"), get("c"));
        if a != b {
            err = Err(format!("{}: group {g}: a {a:?} b {b:?}", kind.name()));
        }
        let c = c.map_or(0, |c| c.parse().unwrap());
        let e = if s.get(&key("e", g), &mut out).unwrap() {
            inner_count(&out)
        } else {
            0
        };
        if e != c {
            err = Err(format!("{}: group {g}: c {c}, e counts {e}", kind.name()));
        }
        st.insert(g, (a, c));
    }
    drop(s);
    if let Some(b) = store.bullet() {
        b.drain().unwrap();
        b.verify().unwrap();
    }
    store.close().unwrap();
    (st, err)
}

fn run(kind: Kind, rounds: u32) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kb.heap");
    let mut before: State = (0..2 * GROUPS).map(|g| (g, (None, 0))).collect();
    let mut rng = std::process::id() as u64 ^ 0xba7c;
    for round in 0..rounds {
        let lines = run_and_kill(
            "child_batches",
            &[
                (ENV_HEAP, path.display().to_string()),
                (ENV_KIND, kind.name()),
                (ENV_ROUND, round.to_string()),
            ],
            Duration::from_millis(150 + xorshift(&mut rng) % 250),
        );
        // Per group: the batches started this round, and the last acknowledged.
        let mut started: HashMap<u64, Vec<String>> = HashMap::new();
        let mut acked: HashMap<u64, String> = HashMap::new();
        for l in &lines {
            let Some(rest) = l.strip_prefix("@@ ") else {
                continue;
            };
            let p: Vec<&str> = rest.split(' ').collect();
            if p.len() != 3 {
                continue; // a torn last line
            }
            let g: u64 = p[1].parse().unwrap();
            match p[0] {
                "do" => started.entry(g).or_default().push(p[2].to_string()),
                "ack" => {
                    acked.insert(g, p[2].to_string());
                }
                _ => {}
            }
        }
        let (after, pairs) = read(kind, &path);
        pairs.unwrap();
        for g in 0..2 * GROUPS {
            let (v0, c0) = before[&g].clone();
            let (v, c) = after[&g].clone();
            let mine = started.get(&g).map_or(&[][..], |v| v.as_slice());
            if let Some(a) = acked.get(&g) {
                assert!(
                    v.as_ref() >= Some(a),
                    "{}: group {g} holds {v:?}, {a} was acknowledged",
                    kind.name()
                );
            }
            // The batches of this round the heap holds: those up to `v`.
            let applied = match &v {
                Some(v) if Some(v) != v0.as_ref() => {
                    assert!(
                        mine.contains(v),
                        "{}: group {g} holds {v:?}, never written",
                        kind.name()
                    );
                    mine.iter().filter(|x| *x <= v).count() as i64
                }
                _ => 0,
            };
            assert_eq!(
                c,
                c0 + applied,
                "{}: group {g}: c = {c}, {c0} before this round and {applied} batches up to {v:?}",
                kind.name()
            );
        }
        let acks = lines.iter().filter(|l| l.starts_with("@@ ack")).count();
        eprintln!("{} round {round}: {acks} acknowledged batches", kind.name());
        before = after;
    }
}

#[test]
fn sigkill_leaves_batches_whole() {
    for k in kinds() {
        run(k, sigkill_rounds());
    }
}
