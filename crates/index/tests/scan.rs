//! Cursor scans of the hash structures ([`index::Ops::scan`], Redis's `SCAN`):
//! exact key sets, the cursor's meaning (every key of a step lies in
//! `[cursor, next)`), scans from any cursor, scans across growth and under
//! concurrent updates, and the durability of what a scan returns.

mod common;

use common::{create, heap_opts, Idx, Kind};
use index::{scan_pos, Error, HashOptions, Index, LfHash, Ops};
use pmem::{Heap, Strategy};
use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};
use std::collections::{BTreeSet, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

const HASHES: [Kind; 3] = [Kind::Hash, Kind::HashNoCache, Kind::PHash];

fn heap(dir: &std::path::Path) -> Heap {
    Heap::create(
        &dir.join("h"),
        &heap_opts(8 << 20, 256 << 20, Strategy::FenceOnly),
    )
    .unwrap()
}

fn key(i: u64) -> Vec<u8> {
    format!("key:{i}").into_bytes()
}

/// The position of `k` in every table of these tests (they hash with
/// [`common::HASHER`]).
fn pos(k: &[u8]) -> u64 {
    scan_pos(common::HASHER.hash(k))
}

/// Runs a full scan from `start`, checking each step: every key returned lies in
/// `[cursor, next)` (so the cursor is a position, the same at every level), the
/// cursor grows, and a step returns at most `max_step` keys. Returns every key
/// returned, with repetitions, and the number of steps.
fn full_scan(h: &mut dyn Ops, start: u64, count: usize, max_step: usize) -> (Vec<Vec<u8>>, usize) {
    let mut all = Vec::new();
    let mut cursor = start;
    let mut steps = 0;
    loop {
        let mut out = Vec::new();
        let next = h.scan(cursor, count, &mut out).unwrap();
        steps += 1;
        assert!(
            out.len() <= max_step,
            "a step of count {count} returned {} keys",
            out.len()
        );
        for k in &out {
            let p = pos(k);
            assert!(
                p >= cursor && (next == 0 || p < next),
                "key {:?} at {p:#x} outside the step [{cursor:#x}, {next:#x})",
                String::from_utf8_lossy(k)
            );
        }
        all.extend(out);
        if next == 0 {
            return (all, steps);
        }
        assert!(next > cursor, "no progress: {cursor:#x} -> {next:#x}");
        cursor = next;
        assert!(steps < 10_000_000, "the scan does not end");
    }
}

fn as_set(keys: &[Vec<u8>]) -> BTreeSet<Vec<u8>> {
    keys.iter().cloned().collect()
}

/// Random inserts and removes, then full scans with several counts: exactly the
/// live keys (here, with no concurrent update, each once), from cursor 0 and from
/// arbitrary cursors.
#[test]
fn full_scan_returns_exactly_the_keys() {
    for kind in HASHES {
        let dir = tempfile::tempdir().unwrap();
        let heap = heap(dir.path());
        let t = create(kind, &heap).unwrap();
        let mut h = t.handle().unwrap();
        // Empty: one step, nothing.
        let (keys, _) = full_scan(&mut *h, 0, 10, 0);
        assert!(keys.is_empty());
        let mut rng = SmallRng::seed_from_u64(11 + kind.id());
        let mut model = BTreeSet::new();
        for _ in 0..6000 {
            let k = key(rng.random_range(0..4000u64));
            if rng.random_range(0..4u32) == 0 {
                assert_eq!(h.remove(&k).unwrap(), model.remove(&k), "{kind}");
            } else {
                h.put(&k, b"v").unwrap();
                model.insert(k);
            }
        }
        h.sync().unwrap();
        assert!(model.len() > 1000);
        for count in [1usize, 3, 10, 100, 100_000] {
            // A step returns count keys plus the rest of its group: one position
            // in the log-free table, one bucket (8 in the tests' phash) in phash.
            let max_step = match kind {
                Kind::PHash => count + model.len(),
                _ => count + 2,
            };
            let (keys, steps) = full_scan(&mut *h, 0, count, max_step);
            assert_eq!(keys.len(), model.len(), "{kind} count {count}: duplicates");
            assert_eq!(as_set(&keys), model, "{kind} count {count}");
            if kind != Kind::PHash {
                assert!(
                    steps >= model.len() / (count + 2),
                    "{kind} count {count}: {steps} steps"
                );
            }
        }
        // From any cursor: exactly the keys at or past it.
        for _ in 0..20 {
            let c: u64 = rng.random();
            let (keys, _) = full_scan(&mut *h, c, 7, usize::MAX);
            let want: BTreeSet<Vec<u8>> = model.iter().filter(|k| pos(k) >= c).cloned().collect();
            assert_eq!(as_set(&keys), want, "{kind} from {c:#x}");
        }
        drop(h);
        assert_eq!(t.verify(true).unwrap().keys, model.len() as u64);
    }
}

/// A scan that continues while the log-free table doubles several times: every
/// key present throughout is returned (nodes never move, so no key is lost at a
/// split), and a step of a grown table still covers `[cursor, next)` only.
#[test]
fn scan_across_growth() {
    for kind in [Kind::Hash, Kind::HashNoCache] {
        let dir = tempfile::tempdir().unwrap();
        let heap = heap(dir.path());
        let t = LfHash::create(
            &heap,
            &HashOptions {
                initial_buckets: 2,
                max_load: 1,
                link_cache: kind == Kind::Hash,
                hasher: Some(common::HASHER),
                ..Default::default()
            },
        )
        .unwrap();
        let mut h = t.handle().unwrap();
        let old: BTreeSet<Vec<u8>> = (0..200).map(key).collect();
        for k in &old {
            h.put(k, b"v").unwrap();
        }
        h.sync().unwrap();
        let before = t.buckets();
        let mut seen = Vec::new();
        let mut cursor = 0;
        let mut fresh = 200u64;
        loop {
            let mut out = Vec::new();
            let next = h.scan(cursor, 5, &mut out).unwrap();
            for k in &out {
                assert!(pos(k) >= cursor && (next == 0 || pos(k) < next));
            }
            seen.extend(out);
            if next == 0 {
                break;
            }
            cursor = next;
            // Grow between the first steps: new keys on both sides of the cursor.
            if fresh >= 200 + 4000 {
                continue;
            }
            for _ in 0..100 {
                h.put(&key(fresh), b"v").unwrap();
                fresh += 1;
            }
        }
        h.sync().unwrap();
        assert!(
            t.buckets() >= before * 16,
            "{kind}: {before} -> {} buckets",
            t.buckets()
        );
        let seen = as_set(&seen);
        let missing: Vec<_> = old.difference(&seen).collect();
        assert!(missing.is_empty(), "{kind}: missing {missing:?}");
        for k in &seen {
            let i: u64 = std::str::from_utf8(&k[4..]).unwrap().parse().unwrap();
            assert!(i < fresh, "{kind}: invented {k:?}");
        }
    }
}

/// One thread scans again and again with small counts while others insert and
/// remove other keys (the log-free table grows meanwhile): every full scan returns
/// every stable key, and nothing that was never written.
#[test]
fn scan_during_concurrent_updates() {
    const STABLE: u64 = 2000;
    const CHURN: u64 = 6000;
    for kind in HASHES {
        let dir = tempfile::tempdir().unwrap();
        let heap = heap(dir.path());
        let t: Idx = create(kind, &heap).unwrap();
        {
            let mut h = t.handle().unwrap();
            for i in 0..STABLE {
                h.put(&key(i), b"stable").unwrap();
            }
            h.sync().unwrap();
        }
        let done = Arc::new(AtomicBool::new(false));
        let ops = Arc::new(AtomicU64::new(0));
        let writers: Vec<_> = (0..2u64)
            .map(|w| {
                let t = t.clone();
                let done = done.clone();
                let ops = ops.clone();
                std::thread::spawn(move || {
                    let mut h = t.handle().unwrap();
                    let mut rng = SmallRng::seed_from_u64(w);
                    let mut n = 0u64;
                    // Churn keys of writer w: STABLE + 2j + w.
                    while !done.load(Ordering::Acquire) || n < 20_000 {
                        let j = rng.random_range(0..CHURN / 2);
                        let k = key(STABLE + 2 * j + w);
                        if rng.random_range(0..3u32) == 0 {
                            h.remove(&k).unwrap();
                        } else {
                            h.put(&k, b"churn").unwrap();
                        }
                        n += 1;
                        ops.fetch_add(1, Ordering::Relaxed);
                    }
                })
            })
            .collect();
        let stable: HashSet<Vec<u8>> = (0..STABLE).map(key).collect();
        let mut h = t.handle().unwrap();
        let mut rounds = 0;
        let start = ops.load(Ordering::Relaxed);
        while rounds < 5 || ops.load(Ordering::Relaxed) - start < 20_000 {
            let count = [1usize, 4, 16][rounds % 3];
            let (keys, _) = full_scan(&mut *h, 0, count, usize::MAX);
            let got: HashSet<Vec<u8>> = keys.into_iter().collect();
            let missing = stable.difference(&got).count();
            assert_eq!(
                missing, 0,
                "{kind} round {rounds}: {missing} stable keys missed"
            );
            for k in &got {
                let i: u64 = std::str::from_utf8(&k[4..]).unwrap().parse().unwrap();
                assert!(i < STABLE + CHURN, "{kind}: invented {k:?}");
            }
            rounds += 1;
            assert!(rounds < 100_000);
        }
        done.store(true, Ordering::Release);
        for w in writers {
            w.join().unwrap();
        }
        // Quiescent: exactly the keys a get finds.
        let (keys, _) = full_scan(&mut *h, 0, 50, usize::MAX);
        let got = as_set(&keys);
        let mut out = Vec::new();
        for i in 0..STABLE + CHURN {
            assert_eq!(
                h.get(&key(i), &mut out).unwrap(),
                got.contains(&key(i)),
                "{kind} key {i}"
            );
        }
        drop(h);
        assert_eq!(t.verify(true).unwrap().keys, got.len() as u64);
    }
}

/// With the link cache, a key whose link still sits in the cache is returned
/// only after the scan has flushed it (as `get` does): a scan that returns every
/// key leaves no busy entry behind.
#[test]
fn scan_settles_cached_links() {
    let dir = tempfile::tempdir().unwrap();
    let heap = heap(dir.path());
    let t = LfHash::create(
        &heap,
        &HashOptions {
            hasher: Some(common::HASHER),
            ..Default::default()
        },
    )
    .unwrap();
    let mut w = t.handle().unwrap();
    for i in 0..20 {
        w.put(&key(i), b"v").unwrap();
    }
    let lc = t.link_cache().unwrap();
    assert!(lc.busy() > 0, "no link was cached");
    let mut r = t.handle().unwrap();
    let (keys, _) = full_scan(&mut r, 0, 1000, usize::MAX);
    assert_eq!(keys.len(), 20);
    assert_eq!(lc.busy(), 0, "a returned key's link is still in the cache");
    drop(w);
}

/// Large tables: a step is bounded by what it covers, not by the table (phash's
/// empty buckets and the log-free table's dummies count toward a budget).
#[test]
fn steps_are_bounded_on_sparse_tables() {
    let dir = tempfile::tempdir().unwrap();
    let heap = heap(dir.path());
    // phash with many buckets and few keys: a step visits at most 10 x count
    // buckets, so an empty table takes nbuckets / (10 x count) steps.
    let p = index::PHash::create(
        &heap,
        &index::PHashOptions {
            buckets: 1 << 12,
            hasher: Some(common::HASHER),
        },
    )
    .unwrap();
    let mut h = p.handle().unwrap();
    let (keys, steps) = full_scan(&mut h, 0, 4, usize::MAX);
    assert!(keys.is_empty());
    assert_eq!(steps, (1 << 12) / 40 + 1);
    h.put(b"only", b"v").unwrap();
    let (keys, _) = full_scan(&mut h, 0, 4, usize::MAX);
    assert_eq!(keys, vec![b"only".to_vec()]);
    // Log-free table grown to many buckets, then emptied: the dummies stay.
    let t = LfHash::create(
        &heap,
        &HashOptions {
            initial_buckets: 2,
            link_cache: false,
            hasher: Some(common::HASHER),
            ..Default::default()
        },
    )
    .unwrap();
    let mut h = t.handle().unwrap();
    for i in 0..3000 {
        h.put(&key(i), b"v").unwrap();
    }
    for i in 0..3000 {
        h.remove(&key(i)).unwrap();
    }
    h.sync().unwrap();
    let (keys, steps) = full_scan(&mut h, 0, 2, usize::MAX);
    assert!(keys.is_empty());
    assert!(steps > 10, "{steps} steps over {} buckets", t.buckets());
}

#[test]
fn skip_list_refuses() {
    let dir = tempfile::tempdir().unwrap();
    let heap = heap(dir.path());
    let t = create(Kind::Skip, &heap).unwrap();
    let mut h = t.handle().unwrap();
    h.put(b"k", b"v").unwrap();
    let mut out = Vec::new();
    let e = h.scan(0, 10, &mut out).unwrap_err();
    assert!(matches!(e, Error::Unsupported(_)), "{e}");
    assert!(e.to_string().contains("skip list"), "{e}");
}

/// The position helpers agree with bucket placement by low hash bits.
#[test]
fn positions_and_buckets() {
    let mut rng = SmallRng::seed_from_u64(3);
    for _ in 0..100_000 {
        let h: u64 = rng.random();
        let k = rng.random_range(0..40u32);
        let p = scan_pos(h);
        assert_eq!(p & 1, 1);
        let b = h & ((1u64 << k) - 1);
        assert_eq!(index::pos_bucket(p, k), b);
        let end = index::bucket_end_pos(b, k);
        assert!(index::bucket_pos(b) <= p && (end == 0 || p < end));
        // Doubling splits the range in two halves.
        let lo = index::bucket_end_pos(b, k + 1);
        assert_eq!(lo, index::bucket_pos(b | 1 << k));
        assert_eq!(index::bucket_end_pos(b | 1 << k, k + 1), end);
    }
    assert_eq!(index::bucket_end_pos(0, 0), 0);
    assert_eq!(index::bucket_end_pos(1, 1), 0);
    assert_eq!(index::bucket_end_pos(0, 1), 1 << 63);
}
