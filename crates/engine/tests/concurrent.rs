//! Concurrent writers and gleaners on the same keys across logs: a non-idempotent
//! `Incr` must end exactly right.
//!
//! Three threads (on two cores) increment six shared counters and overwrite a few
//! other keys, through four logs of 4 KiB, so each counter's chain of records
//! criss-crosses the logs, logs fill and wrap, writers glean when every log is
//! full, dynamic variants switch sessions to gleaning (`maintain`), and the static
//! variant's gleaner thread and the epoch advancer run beside them. While the
//! threads run, the test takes crash images of the heap: a recovered image must
//! hold each counter between the increments acknowledged before the image and
//! those acknowledged after it (every acknowledged increment present, none
//! invented, none applied twice). At the end every counter must equal the number
//! of increments, before and after draining the logs into the backend, and after a
//! restart.
//!
//! The `merge` cases do the same with `Merge` operations: each "counter" is a
//! list leaf, and an update inserts an element (thread, sequence number) at
//! its front, an edit that is not idempotent. Besides the count bounds, every
//! leaf read must hold, for each thread, exactly its elements 0..m in order,
//! newest first: no acknowledged edit lost, none applied twice or out of order.

mod common;

use common::*;
use engine::bullet::Variant;
use engine::direct::BackendKind;
use engine::types::edit::Edit;
use engine::types::node::{Entry, Node};
use engine::{Op, Outcome};
use pmem::{CrashSim, Heap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

const COUNTERS: usize = 6;
const THREADS: usize = 3;
const OPS: usize = 4000;
const LOG: u64 = 4096;
/// Most updates a thread applies before it commits (group commit).
const SLACK: usize = 8;

fn counter(i: usize) -> Vec<u8> {
    format!("counter:{i}").into_bytes()
}

/// What the threads apply to the counters.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// `Incr(1)`.
    Incr,
    /// `Merge` of a list leaf: an element inserted at the front.
    Merge,
}

/// Thread `t`'s `n`th element of a counter in `Mode::Merge`.
fn element(t: usize, n: u64) -> Vec<u8> {
    format!("{t}.{n}").into_bytes()
}

/// The number of elements of a leaf in `Mode::Merge`, after checking that
/// each thread's elements are its first ones, in order, newest first (each
/// edit applied exactly once and in order).
fn leaf_count(v: &[u8]) -> i64 {
    let Node::Leaf(es) = Node::decode(v, false).expect("a counter holds a leaf") else {
        panic!("a counter holds an inner node")
    };
    let mut next: Vec<Option<u64>> = vec![None; THREADS];
    for e in &es {
        let s = std::str::from_utf8(&e.bytes).unwrap();
        let (t, n) = s.split_once('.').unwrap();
        let (t, n): (usize, u64) = (t.parse().unwrap(), n.parse().unwrap());
        // Newest first: each thread's sequence counts down to 0.
        let want = next[t].map_or(n, |m| m.wrapping_sub(1));
        assert_eq!(
            n, want,
            "thread {t}'s elements out of order or repeated: {s}"
        );
        next[t] = Some(n);
    }
    assert!(
        next.iter().all(|n| n.is_none_or(|n| n == 0)),
        "a thread's first elements are missing"
    );
    es.len() as i64
}

fn read_counters(s: &mut dyn engine::Session, mode: Mode) -> Vec<i64> {
    let mut out = Vec::new();
    (0..COUNTERS)
        .map(|i| {
            if !s.get(&counter(i), &mut out).unwrap() {
                0
            } else if mode == Mode::Incr {
                engine::parse_i64(&out).expect("a counter holds an integer")
            } else {
                leaf_count(&out)
            }
        })
        .collect()
}

fn run(kind: Kind) {
    run_mode(kind, Mode::Incr)
}

fn run_mode(kind: Kind, mode: Mode) {
    let dir = tempfile::tempdir_in(shm_dir()).unwrap();
    let path = dir.path().join("c.heap");
    {
        let heap = Heap::create(&path, &sim_opts()).unwrap();
        create(kind, &heap, LOG).unwrap().close().unwrap();
    }
    // Besides the images the test takes, the simulator takes one at about 1 in 500
    // fences, in the middle of appends, glean batches and head advances.
    let sim = Arc::new(CrashSim::new(7, 2000));
    let (store, heap, _) = open_sim(kind, &path, sim.clone(), LOG).unwrap();
    if mode == Mode::Merge {
        let mut sess = store.session();
        let empty = Node::Leaf(Vec::new()).encode(false);
        let mut w = engine::WriteBatch::new();
        for c in 0..COUNTERS {
            w.put(&counter(c), &empty);
        }
        sess.apply_batch(&w, &mut Vec::new()).unwrap();
        sess.commit().unwrap();
    }
    let acked: Arc<Vec<AtomicU64>> = Arc::new((0..COUNTERS).map(|_| AtomicU64::new(0)).collect());
    let done = AtomicBool::new(false);
    let mut images = Vec::new();
    std::thread::scope(|s| {
        let mut hs = Vec::new();
        for t in 0..THREADS {
            let store = &store;
            let acked = acked.clone();
            hs.push(s.spawn(move || {
                let mut sess = store.session();
                let mut x = 0x2545_f491_4f6c_dd1du64 ^ (t as u64 + 1);
                let mut n = 0;
                // Increments are acknowledged at commit (group commit: one
                // fence per batch of up to SLACK updates; a no-op otherwise).
                let mut pending = [0u64; COUNTERS];
                let mut seq = [0u64; COUNTERS];
                let mut edit = Vec::new();
                let mut batch = 0;
                while n < OPS {
                    if batch > (x % SLACK as u64) as usize || n + 1 == OPS {
                        sess.commit().unwrap();
                        for (c, p) in pending.iter_mut().enumerate() {
                            acked[c].fetch_add(std::mem::take(p), Ordering::SeqCst);
                        }
                        batch = 0;
                    }
                    if sess.maintain().unwrap() {
                        continue;
                    }
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let c = (x % COUNTERS as u64) as usize;
                    if x.is_multiple_of(5) {
                        let k = format!("other:{}", x % 17);
                        sess.apply(k.as_bytes(), Op::Put(&x.to_le_bytes())).unwrap();
                    } else {
                        let op = match mode {
                            Mode::Incr => Op::Incr(1),
                            Mode::Merge => {
                                edit.clear();
                                Edit::LeafInsert {
                                    pos: 0,
                                    entry: Entry::new(0.0, element(t, seq[c])),
                                }
                                .encode(false, &mut edit);
                                seq[c] += 1;
                                Op::Merge(&edit)
                            }
                        };
                        match sess.apply(&counter(c), op).unwrap() {
                            Outcome::Int(_) | Outcome::Merged(_) => {}
                            o => panic!("{op:?} returned {o:?}"),
                        }
                        pending[c] += 1;
                    }
                    n += 1;
                    batch += 1;
                }
                sess.commit().unwrap();
                for (c, p) in pending.iter_mut().enumerate() {
                    acked[c].fetch_add(std::mem::take(p), Ordering::SeqCst);
                }
            }));
        }
        // Crash images while the threads run.
        while images.len() < 4 && !hs.iter().all(|h| h.is_finished()) {
            std::thread::sleep(std::time::Duration::from_micros(500));
            let before: Vec<u64> = acked.iter().map(|a| a.load(Ordering::SeqCst)).collect();
            let img = sim.capture_now(heap.region());
            let after: Vec<u64> = acked.iter().map(|a| a.load(Ordering::SeqCst)).collect();
            images.push((img, before, after));
        }
        done.store(true, Ordering::SeqCst);
        for h in hs {
            h.join().unwrap();
        }
    });
    assert!(done.load(Ordering::SeqCst));
    sim.set_capture_ppm(0);
    let fence_images = sim.take_images();
    assert!(
        fence_images.len() >= 2,
        "{}: {} images in fences",
        kind.name(),
        fence_images.len()
    );
    assert!(
        !images.is_empty(),
        "no crash image taken while the threads ran"
    );
    if let Some(b) = store.bullet() {
        use engine::Store;
        let st = b.stats();
        // Four 4 KiB logs hold ~250 records: the run must have wrapped them.
        assert!(st.records_appended > 2000, "{st:?}");
    }
    let total: Vec<i64> = acked
        .iter()
        .map(|a| a.load(Ordering::SeqCst) as i64)
        .collect();
    let mut sess = store.session();
    assert_eq!(
        read_counters(&mut *sess, mode),
        total,
        "{}: live",
        kind.name()
    );
    if let Some(b) = store.bullet() {
        b.drain().unwrap();
        b.verify().unwrap();
        assert_eq!(
            read_counters(&mut *sess, mode),
            total,
            "{}: drained",
            kind.name()
        );
    }
    drop(sess);
    store.close().unwrap();
    drop(store);
    drop(heap);
    // Restart.
    let (store, heap, clean) = open_sim(kind, &path, Arc::new(CrashSim::new(1, 0)), LOG).unwrap();
    assert!(clean);
    assert_eq!(
        read_counters(&mut *store.session(), mode),
        total,
        "{}: restarted",
        kind.name()
    );
    store.close().unwrap();
    drop(store);
    drop(heap);
    // Images taken inside fences (at most eight, spread over the run).
    let step = fence_images.len().div_ceil(8).max(1);
    // (no acknowledged-count bounds are known for them: 0..=total).
    let zero = vec![0; COUNTERS];
    for (n, img) in fence_images.iter().step_by(step).enumerate() {
        check_image(
            kind,
            mode,
            dir.path(),
            &format!("fence image {n}"),
            img,
            &zero,
            &total,
        );
    }
    // The crash images, with the acknowledged counts around each.
    for (n, (img, before, after)) in images.into_iter().enumerate() {
        let lo: Vec<i64> = before.iter().map(|&b| b as i64).collect();
        let hi: Vec<i64> = after
            .iter()
            .map(|&a| a as i64 + (THREADS * SLACK) as i64)
            .collect();
        check_image(
            kind,
            mode,
            dir.path(),
            &format!("image {n}"),
            &img,
            &lo,
            &hi,
        );
    }
}

/// Recovers crash image `img` and checks every counter is within `lo..=hi`; for
/// Bullet, after draining the frontend equals the backend and the counters hold.
fn check_image(
    kind: Kind,
    mode: Mode,
    dir: &std::path::Path,
    what: &str,
    img: &pmem::CrashImage,
    lo: &[i64],
    hi: &[i64],
) {
    let p = dir.join(format!("{}.heap", what.replace(' ', "-")));
    pmem::sim::write_image(&p, &img.bytes).unwrap();
    let (store, heap, clean) = open_sim(kind, &p, Arc::new(CrashSim::new(3, 0)), LOG)
        .unwrap_or_else(|e| panic!("{}: {what}: {e}", kind.name()));
    assert!(!clean, "{}: {what} says clean", kind.name());
    let got = read_counters(&mut *store.session(), mode);
    for c in 0..COUNTERS {
        assert!(
            got[c] >= lo[c] && got[c] <= hi[c],
            "{}: {what}: counter {c} = {}, expected {}..={}",
            kind.name(),
            got[c],
            lo[c],
            hi[c]
        );
    }
    if let Some(b) = store.bullet() {
        b.drain().unwrap();
        b.verify().unwrap();
        assert_eq!(read_counters(&mut *store.session(), mode), got);
    }
    store.close().unwrap();
    drop(store);
    drop(heap);
    let _ = std::fs::remove_file(&p);
}

#[test]
fn bullet_full_logfree_counts_exactly() {
    run(Kind::Bullet(Variant::Full, BackendKind::LogFree));
}

#[test]
fn bullet_full_phash_counts_exactly() {
    run(Kind::Bullet(Variant::Full, BackendKind::PHash));
}

#[test]
fn bullet_dyn_logfree_counts_exactly() {
    run(Kind::Bullet(Variant::Dyn, BackendKind::LogFree));
}

#[test]
fn bullet_st_phash_counts_exactly() {
    run(Kind::Bullet(Variant::St, BackendKind::PHash));
}

#[test]
fn direct_logfree_counts_exactly() {
    run(Kind::Direct(BackendKind::LogFree));
}

#[test]
fn bullet_full_group_commit_counts_exactly() {
    run(Kind::BulletGroup(Variant::Full, BackendKind::LogFree));
}

#[test]
fn bullet_dyn_phash_group_commit_counts_exactly() {
    run(Kind::BulletGroup(Variant::Dyn, BackendKind::PHash));
}

#[test]
fn direct_phash_counts_exactly() {
    run(Kind::Direct(BackendKind::PHash));
}

#[test]
fn bullet_full_logfree_merges_exactly() {
    run_mode(
        Kind::Bullet(Variant::Full, BackendKind::LogFree),
        Mode::Merge,
    );
}

#[test]
fn bullet_st_phash_merges_exactly() {
    run_mode(Kind::Bullet(Variant::St, BackendKind::PHash), Mode::Merge);
}

#[test]
fn bullet_dyn_phash_group_commit_merges_exactly() {
    run_mode(
        Kind::BulletGroup(Variant::Dyn, BackendKind::PHash),
        Mode::Merge,
    );
}

#[test]
fn direct_logfree_merges_exactly() {
    run_mode(Kind::Direct(BackendKind::LogFree), Mode::Merge);
}
