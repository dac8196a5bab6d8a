//! Gleaners walk the chains of a group of records in step (up to 16 records of
//! distinct keys; a key seen again ends the group). Logs where keys repeat
//! inside a group, and where more keys than a group interleave, must end with
//! every record applied exactly once and flagged, with and without put
//! collapsing, on both backends.

mod common;

use common::*;
use engine::bullet::{check_logs, BulletStore, Variant};
use engine::direct::BackendKind;
use engine::{Op, Session, Store};
use pmem::{Heap, Strategy};
use std::collections::BTreeMap;

/// Operation `i`: its key and its operation. The first 1,500 cycle through 37
/// keys (more than a group, none repeated within one); the next 1,500 through 5
/// (repeated within every group); the last 40 each have a key of their own (no
/// later record's chain leads to them). Mostly increments, with puts and
/// removes.
fn op(i: u64) -> (Vec<u8>, Op<'static>) {
    let k = match i {
        0..1500 => i % 37,
        1500..3000 => i % 5,
        _ => 100 + i - 3000,
    };
    let key = format!("k{k:03}").into_bytes();
    let op = if i.is_multiple_of(29) {
        Op::Remove
    } else if i.is_multiple_of(11) {
        Op::Put(b"100")
    } else {
        Op::Incr((i % 3 + 1) as i64)
    };
    (key, op)
}

#[test]
fn grouped_walks_apply_every_record_once() {
    for v in [Variant::Full, Variant::Dyn] {
        for b in [BackendKind::LogFree, BackendKind::PHash] {
            let dir = tempfile::tempdir_in(shm_dir()).unwrap();
            let path = dir.path().join("h");
            let hopts = heap_opts(64 << 20, 256 << 20, Strategy::FenceOnly);
            let mut o = bullet_opts(v, b, 256 << 10);
            // Only the drain gleans (no advancer epoch ends during the writes).
            o.static_gleaners = 0;
            o.epoch = std::time::Duration::from_secs(60);
            let mut model: BTreeMap<Vec<u8>, i64> = BTreeMap::new();
            {
                let heap = Heap::create(&path, &hopts).unwrap();
                let st = BulletStore::create(&heap, &o).unwrap();
                let mut s = st.session().unwrap();
                for i in 0..3040u64 {
                    let (key, op) = op(i);
                    match op {
                        Op::Remove => {
                            model.remove(&key);
                        }
                        Op::Put(_) => {
                            model.insert(key.clone(), 100);
                        }
                        Op::Incr(d) => *model.entry(key.clone()).or_insert(0) += d,
                    }
                    s.apply(&key, op).unwrap();
                }
                drop(s);
                assert!(st.log_occupancy_bytes().0 > 0);
                let st2 = st.clone();
                let (tx, rx) = std::sync::mpsc::channel();
                std::thread::spawn(move || {
                    let _ = tx.send(st2.drain().is_ok());
                });
                let done = rx.recv_timeout(std::time::Duration::from_secs(30));
                assert_eq!(done, Ok(true), "{v:?} {b:?}: drain did not finish");
                assert_eq!(st.log_occupancy_bytes().0, 0, "{v:?} {b:?}");
                st.verify().unwrap();
                st.close().unwrap();
            }
            // Every record left in the logs is flagged, and the backend alone
            // (logs empty) holds the model's values after a restart.
            let rec = Heap::open(&path, &hopts).unwrap();
            let facts = check_logs(rec.heap(), rec.heap().root()).unwrap();
            assert_eq!(facts.unapplied, 0, "{v:?} {b:?}: {facts:?}");
            let (st, r) = BulletStore::open(rec, &o).unwrap();
            assert_eq!(r.replayed, 0, "{v:?} {b:?}: {r:?}");
            let mut s = st.session().unwrap();
            let mut out = Vec::new();
            for k in (0..37u64).chain(100..140) {
                let key = format!("k{k:03}").into_bytes();
                let found = s.get(&key, &mut out).unwrap();
                match model.get(&key) {
                    Some(n) => {
                        assert!(found, "{v:?} {b:?}: key k{k:03} lost");
                        assert_eq!(out, n.to_string().as_bytes(), "{v:?} {b:?}: key k{k:03}");
                    }
                    None => assert!(!found, "{v:?} {b:?}: key k{k:03} invented"),
                }
            }
            drop(s);
            st.close().unwrap();
        }
    }
}

/// Polls `f` (doing `work` between polls) until it holds, for at most 10 s.
fn until(what: &str, mut work: impl FnMut(), f: impl Fn() -> bool) {
    let t = std::time::Instant::now();
    while !f() {
        assert!(t.elapsed().as_secs() < 10, "timed out waiting for {what}");
        work();
    }
}

/// A background gleaner thread is paced while sessions only read (and the logs
/// have room), still drains the logs meanwhile, and is not paced once writes
/// come back or requests stop.
#[test]
fn background_gleaning_is_paced_while_sessions_only_read() {
    let dir = tempfile::tempdir_in(shm_dir()).unwrap();
    let hopts = heap_opts(64 << 20, 256 << 20, Strategy::FenceOnly);
    let heap = Heap::create(&dir.path().join("h"), &hopts).unwrap();
    // Logs large enough that a gleaner at full speed takes several epochs to
    // empty them: the paced gleaner does most of that work.
    let mut o = bullet_opts(Variant::Full, BackendKind::LogFree, 1 << 20);
    o.role_threads = 1;
    let st = BulletStore::create(&heap, &o).unwrap();
    let mut s = st.session().unwrap();
    let val = [b'v'; 100];
    let mut n = 0u64;
    let mut put = |s: &mut engine::bullet::BulletSession| {
        s.apply(format!("key:{:05}", n % 5000).as_bytes(), Op::Put(&val))
            .unwrap();
        n += 1;
    };
    // Writes: never paced. Fill the logs past the point where a gleaner starts.
    while st.log_occupancy_bytes().0 * 10 < st.log_occupancy_bytes().1 * 7 {
        put(&mut s);
    }
    assert!(!st.stats().gleaning_paced);
    // Reads only: paced, and the paced gleaner still empties the logs.
    let mut out = Vec::new();
    let mut i = 0u64;
    let mut get = |s: &mut engine::bullet::BulletSession| {
        assert!(s
            .get(format!("key:{:05}", i % 5000).as_bytes(), &mut out)
            .unwrap());
        assert_eq!(out, val);
        i += 1;
    };
    until(
        "pacing under reads",
        || get(&mut s),
        || st.stats().gleaning_paced,
    );
    until(
        "the paced gleaner to drain the logs below 30%",
        || get(&mut s),
        || {
            let (used, cap) = st.log_occupancy_bytes();
            used * 10 < cap * 3
        },
    );
    // Writes again: not paced.
    until(
        "writes to end pacing",
        || put(&mut s),
        || !st.stats().gleaning_paced,
    );
    // Reads, then nothing at all: not paced (an idle store drains at full speed).
    until(
        "pacing under reads",
        || get(&mut s),
        || st.stats().gleaning_paced,
    );
    until(
        "idleness to end pacing",
        || std::thread::sleep(std::time::Duration::from_millis(1)),
        || !st.stats().gleaning_paced,
    );
    drop(s);
    st.drain().unwrap();
    st.verify().unwrap();
    st.close().unwrap();
}
