//! Group commit, a log handed over: session A appends to a log without
//! committing and moves to another log; session B takes the log A left, appends
//! after A's records and commits. Recovery reads a log in order while its records
//! check, so B's acknowledged record survives a crash only if A's records before
//! it are durable too: B makes the log durable up to its tail when it takes it
//! (`BulletSession::ensure_space`). A's flushes are A's thread's, never fenced by
//! A here; the crash simulator persists a thread's flushes only at that thread's
//! fence, so without B's sync a crash image may lose any of A's lines.
//!
//! And the wait that `Pool::make_durable_to` does for a writer whose commit is
//! under way (and its fallback after 50 ms).

mod common;

use common::*;
use engine::bullet::{BulletOptions, BulletStore, Variant};
use engine::crl::Pool;
use engine::direct::BackendKind;
use engine::{Op, Session, Store};
use pmem::{CrashSim, Heap};
use std::path::Path;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

const LOG: u64 = 4096;

fn opts() -> BulletOptions {
    BulletOptions {
        logs: 2,
        group_commit: true,
        // Nothing else moves: no gleaning, no head advance during the test.
        epoch: Duration::from_secs(600),
        role_threads: 0,
        ..bullet_opts(Variant::Full, BackendKind::LogFree, LOG)
    }
}

/// Writes crash image `bytes` to `path` and recovers the store it holds.
fn recover(path: &Path, bytes: &[u8], o: &BulletOptions) -> BulletStore {
    recover_bullet(path, bytes, o, 0).0
}

/// One handover and one crash image (seeded); true when B's committed record
/// is found after recovery.
fn b_survives(seed: u64) -> bool {
    let dir = tempfile::tempdir_in(shm_dir()).unwrap();
    let (store, sim) = fresh(&dir.path().join("h"), seed);
    let (a_moved, a_moved_rx) = mpsc::channel();
    let (done, done_rx) = mpsc::channel::<()>();
    let image = std::thread::scope(|s| {
        let store = &store;
        s.spawn(move || {
            let mut a = store.session().unwrap();
            for i in 0..8 {
                a.apply(format!("a:{i}").as_bytes(), Op::Put(&[b'x'; 24]))
                    .unwrap();
            }
            // Too large for what is left of A's log, not for an empty one: A
            // gives its log up, uncommitted records and all, and takes the other.
            a.apply(b"big", Op::Put(&vec![b'y'; 3700])).unwrap();
            a_moved.send(()).unwrap();
            // Keep A (and its uncommitted records) until the image is taken:
            // dropping a session commits.
            done_rx.recv().unwrap();
        });
        a_moved_rx.recv().unwrap();
        let mut b = store.session().unwrap();
        b.apply(b"b", Op::Put(b"acknowledged")).unwrap();
        b.commit().unwrap();
        let img = sim.capture_now(store.heap().region());
        done.send(()).unwrap();
        drop(b);
        img
    });
    drop(store);
    let store = recover(&dir.path().join("crashed"), &image.bytes, &opts());
    let mut s = store.session().unwrap();
    let mut out = Vec::new();
    s.get(b"b", &mut out).unwrap() && out == b"acknowledged"
}

#[test]
fn a_commit_after_a_log_handover_survives_every_crash_image() {
    for seed in 0..24 {
        assert!(
            b_survives(seed),
            "seed {seed}: B's committed record was lost behind A's uncommitted ones"
        );
    }
}

/// `Pool::make_durable_to` on a log whose writer is committing past the range
/// waits for that commit instead of syncing the range again; when the commit
/// does not come within 50 ms, it syncs the range itself.
#[test]
fn a_sync_waits_for_the_writer_committing_and_falls_back_after_50_ms() {
    use std::sync::atomic::Ordering::{Acquire, Relaxed};
    use std::time::Instant;
    let dir = tempfile::tempdir_in(shm_dir()).unwrap();
    let heap = Heap::create(&dir.path().join("h"), &sim_opts()).unwrap();
    let desc = Pool::create_desc(
        &heap,
        2,
        LOG,
        engine::crl::BACKEND_HASH,
        pmem::PPtr::from_raw(0),
    )
    .unwrap();
    let pool = Pool::attach(&heap, desc).unwrap();
    pool.group_commit.store(true, Relaxed);
    let flushes = || heap.region().persist_stats().flushes;
    let append = |n: u64| {
        for i in 0..n {
            pool.append(
                0,
                1,
                format!("k{i}").as_bytes(),
                &[1; 40],
                engine::crl::RecPtr(0),
                i,
            )
            .unwrap()
            .unwrap();
        }
        pool.logs[0].tail.load(Acquire)
    };

    // The writer announces its commit (which writes and flushes its records
    // on its thread), fences 5 ms later, then marks the log.
    let start = pool.logs[0].tail.load(Acquire);
    let end = append(3);
    assert!(pool.logs[0].durable.load(Acquire) < end);
    let (announced, wait) = std::sync::mpsc::channel();
    let mut before = 0;
    let mut t = Instant::now();
    std::thread::scope(|s| {
        s.spawn(|| {
            pool.committing(0, start, end).unwrap();
            announced.send(()).unwrap();
            std::thread::sleep(Duration::from_millis(5));
            pool.fence();
            pool.mark_durable(0, end);
        });
        wait.recv().unwrap();
        before = flushes();
        t = Instant::now();
        pool.make_durable_to(0, end).unwrap();
    });
    assert!(pool.logs[0].durable.load(Acquire) >= end);
    if t.elapsed() < Duration::from_millis(45) {
        assert_eq!(flushes(), before, "synced the range instead of waiting");
    }

    // A commit announced but never finished: after 50 ms, the caller syncs.
    let start = pool.logs[0].tail.load(Acquire);
    let end = append(3);
    pool.committing(0, start, end).unwrap();
    let before = flushes();
    let t = Instant::now();
    pool.make_durable_to(0, end).unwrap();
    assert!(t.elapsed() >= Duration::from_millis(50));
    assert!(flushes() > before, "returned without syncing");
    assert!(pool.logs[0].durable.load(Acquire) >= end);
}

/// Group commit: a record is applied to the backend only once it is durable.
/// Session A puts `k` = v1 and commits, then puts `k` = v2 and does not commit;
/// a drain then applies the logs while crash images are taken at every fence.
/// Had the drain's gleaner applied v2 (not durable) in one batch with v1, an
/// image taken after the backend's sync and before the flags' fence, missing
/// v2's record, would recover the frontend to v1 (v1 unflagged, v2 lost) over a
/// backend holding v2: after a drain the two tiers disagree, and `k` reads v1,
/// then v2.
#[test]
fn a_gleaner_applies_only_committed_records() {
    let o = BulletOptions {
        logs: 2,
        group_commit: true,
        // Nothing but the drain gleans.
        epoch: Duration::from_secs(600),
        role_threads: 0,
        ..bullet_opts(Variant::Dyn, BackendKind::PHash, LOG)
    };
    let mut bad = Vec::new();
    let mut checked = 0;
    for seed in 0..6u64 {
        let dir = tempfile::tempdir_in(shm_dir()).unwrap();
        let path = dir.path().join("h");
        {
            let heap = Heap::create(&path, &sim_opts()).unwrap();
            BulletStore::create(&heap, &o).unwrap().close().unwrap();
        }
        let (store, sim) = open_bullet_under_sim(&path, &o, seed);
        let images = std::thread::scope(|s| {
            let (appended, appended_rx) = mpsc::channel();
            let (done, done_rx) = mpsc::channel::<()>();
            let store = &store;
            s.spawn(move || {
                let mut a = store.session().unwrap();
                a.apply(b"k", Op::Put(b"v1")).unwrap();
                a.commit().unwrap();
                a.apply(b"k", Op::Put(b"v2")).unwrap();
                appended.send(()).unwrap();
                // A's thread never fences v2 until the images are taken.
                done_rx.recv().unwrap();
            });
            appended_rx.recv().unwrap();
            sim.set_capture_ppm(1_000_000);
            store.drain().unwrap();
            sim.set_capture_ppm(0);
            done.send(()).unwrap();
            sim.take_images()
        });
        assert!(!images.is_empty(), "no fence during the drain");
        drop(store);
        for (n, img) in images.iter().enumerate() {
            let p = dir.path().join(format!("img{n}"));
            let s2 = recover(&p, &img.bytes, &o);
            let mut r = s2.session().unwrap();
            let mut before = Vec::new();
            assert!(
                r.get(b"k", &mut before).unwrap(),
                "k lost (v1 was committed)"
            );
            s2.drain().unwrap();
            let mut after = Vec::new();
            r.get(b"k", &mut after).unwrap();
            checked += 1;
            if let Err(e) = s2.verify() {
                bad.push(format!("seed {seed} image {n}: {e}"));
            } else if before != after {
                bad.push(format!(
                    "seed {seed} image {n}: k read {:?}, then {:?} after a drain",
                    String::from_utf8_lossy(&before),
                    String::from_utf8_lossy(&after)
                ));
            }
            drop(r);
            drop(s2);
            let _ = std::fs::remove_file(&p);
        }
    }
    assert!(
        bad.is_empty(),
        "{} of {checked} images: {bad:#?}",
        bad.len()
    );
}

/// A fresh store at `path`, opened under a simulator. Both log buffers exist
/// before the test: allocating one persists its descriptor field, a fence that
/// would make a session's earlier records durable on its own thread.
fn fresh(path: &Path, seed: u64) -> (BulletStore, Arc<CrashSim>) {
    {
        let heap = Heap::create(path, &sim_opts()).unwrap();
        BulletStore::create(&heap, &opts())
            .unwrap()
            .close()
            .unwrap();
        let pool = Pool::attach(&heap, heap.root().raw()).unwrap();
        pool.ensure_buffer(0).unwrap();
        pool.ensure_buffer(1).unwrap();
    }
    open_bullet_under_sim(path, &opts(), seed)
}

/// Puts each key with itself as value.
fn put_all(s: &mut impl Session, keys: &[String]) {
    for k in keys {
        s.apply(k.as_bytes(), Op::Put(k.as_bytes())).unwrap();
    }
}

/// How many of `keys` read their value after recovering `img`.
fn found(dir: &Path, img: &pmem::CrashImage, keys: &[String]) -> usize {
    let store = recover(&dir.join("crashed"), &img.bytes, &opts());
    let mut s = store.session().unwrap();
    let mut out = Vec::new();
    keys.iter()
        .filter(|k| s.get(k.as_bytes(), &mut out).unwrap() && out == k.as_bytes())
        .count()
}

/// A pipelined group commit: the session detaches its batch's fence and goes
/// on writing; another thread completes it. The batch survives every crash
/// image taken after the completion, and before it some image loses part of it
/// (the completion is what made it durable, not something else on the way).
#[test]
fn a_detached_commit_completed_on_another_thread_survives_every_crash_image() {
    let keys: Vec<String> = (0..8).map(|i| format!("key-{i}")).collect();
    let mut lost_before = 0;
    for seed in 0..24 {
        let dir = tempfile::tempdir_in(shm_dir()).unwrap();
        let (store, sim) = fresh(&dir.path().join("h"), seed);
        let mut s = store.session().unwrap();
        put_all(&mut s, &keys);
        let pending = s.commit_detached().unwrap().expect("a batch to commit");
        assert!(s.commit_detached().unwrap().is_none(), "nothing new since");
        // The next batch, on this thread, while the first is in flight.
        s.apply(b"later", Op::Put(b"not covered")).unwrap();
        let before = sim.capture_now(store.heap().region());
        std::thread::scope(|t| {
            t.spawn(|| pending.complete().unwrap());
        });
        let after = sim.capture_now(store.heap().region());
        drop(s);
        drop(store);
        assert_eq!(
            found(dir.path(), &after, &keys),
            keys.len(),
            "seed {seed}: a record of the completed batch was lost"
        );
        if found(dir.path(), &before, &keys) < keys.len() {
            lost_before += 1;
        }
    }
    assert!(
        lost_before > 0,
        "no image before the completion lost anything: the test shows nothing"
    );
}

/// A plain commit while a detached one is still in flight makes both
/// batches durable: the detached batch's records sit before the new ones in
/// the same log, so the commit cannot just fence its own flushes.
#[test]
fn a_commit_behind_a_detached_one_in_flight_covers_both_batches() {
    let first: Vec<String> = (0..6).map(|i| format!("first-{i}")).collect();
    let second: Vec<String> = (0..6).map(|i| format!("second-{i}")).collect();
    for seed in 0..24 {
        let dir = tempfile::tempdir_in(shm_dir()).unwrap();
        let (store, sim) = fresh(&dir.path().join("h"), seed);
        let mut s = store.session().unwrap();
        put_all(&mut s, &first);
        let pending = s.commit_detached().unwrap().expect("a batch to commit");
        put_all(&mut s, &second);
        s.commit().unwrap();
        let img = sim.capture_now(store.heap().region());
        pending.complete().unwrap();
        drop(s);
        drop(store);
        let all: Vec<String> = first.iter().chain(&second).cloned().collect();
        assert_eq!(
            found(dir.path(), &img, &all),
            all.len(),
            "seed {seed}: a committed record was lost"
        );
    }
}
