//! Tests of `phash`, the lock-based baseline hash table. They cover:
//!
//! - random operations checked against a `BTreeMap` model, with `verify` counts;
//! - two threads with their own handles updating overlapping keys;
//! - reopening after a clean close or a drop keeps every pair;
//! - `attach` on a garbage or inconsistent descriptor returns an error;
//! - corrupt chains give errors, not panics;
//! - `reachable` is exact for live, freed and arbitrary offsets;
//! - crash images from the crash simulator recover to the state before or after
//!   the operation in flight, with no leaked block.

use index::phash::{self, BUCKET_SIZE, B_HEAD, NODE_HDR, N_KLEN, N_NEXT, N_VALUE};
use index::{Error, Index, Ops, PHash, PHashOptions, Recoverable};
use pmem::{CrashSim, Geometry, Heap, HeapOptions, PPtr, Strategy};
use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;

type Model = BTreeMap<Vec<u8>, Vec<u8>>;

fn opts() -> HeapOptions {
    HeapOptions {
        size: 64 << 20,
        ..Default::default()
    }
}

fn new_table(path: &Path, buckets: u64) -> (Heap, PHash) {
    let heap = Heap::create(path, &opts()).unwrap();
    let t = PHash::create(
        &heap,
        &PHashOptions {
            buckets,
            ..Default::default()
        },
    )
    .unwrap();
    heap.set_root(t.root()).unwrap();
    (heap, t)
}

fn key_of(i: u64) -> Vec<u8> {
    match i % 7 {
        0 => i.to_le_bytes().to_vec(),
        1 => format!("k{i}").into_bytes(),
        2 => format!(
            "a-much-longer-key-number-{i}-{}",
            "x".repeat((i % 50) as usize)
        )
        .into_bytes(),
        _ => format!("key:{i:05}").into_bytes(),
    }
}

fn random_value(rng: &mut SmallRng) -> Vec<u8> {
    let len = match rng.random_range(0..100u32) {
        0..=79 => rng.random_range(0..120usize),
        80..=97 => rng.random_range(120..6000usize),
        _ => rng.random_range(60_000..100_000usize),
    };
    let seed: u8 = rng.random_range(0..=255);
    (0..len)
        .map(|i| seed.wrapping_add((i * 31 % 251) as u8))
        .collect()
}

/// Every block of the table, from a traversal of the documented layout.
fn blocks_of(t: &PHash) -> BTreeSet<u64> {
    let r = t.heap().region();
    let mut s = BTreeSet::new();
    s.insert(t.root().offset());
    s.insert(t.array().offset());
    for b in 0..t.nbuckets() {
        let mut cur: u64 = r.read(t.array().offset() + BUCKET_SIZE * b + B_HEAD);
        while cur != 0 {
            s.insert(cur);
            s.insert(r.read::<u64>(cur + N_VALUE));
            cur = r.read(cur + N_NEXT);
        }
    }
    s
}

/// The table's contents, from a traversal of the documented layout.
fn contents_of(t: &PHash) -> Model {
    let r = t.heap().region();
    let mut m = Model::new();
    for b in 0..t.nbuckets() {
        let mut cur: u64 = r.read(t.array().offset() + BUCKET_SIZE * b + B_HEAD);
        while cur != 0 {
            let klen = r.read::<u32>(cur + N_KLEN) as usize;
            let mut k = vec![0u8; klen];
            r.read_bytes(cur + NODE_HDR, &mut k);
            let v: u64 = r.read(cur + N_VALUE);
            let vlen = r.read::<u32>(v + 4) as usize;
            let mut val = vec![0u8; vlen];
            r.read_bytes(v + index::blob::HDR, &mut val);
            assert!(m.insert(k, val).is_none(), "a key appears twice");
            cur = r.read(cur + N_NEXT);
        }
    }
    m
}

fn check_against(t: &PHash, model: &Model) {
    let v = t.verify(true).unwrap();
    assert_eq!(v.keys, model.len() as u64);
    assert_eq!(v.blocks, 2 + 2 * model.len() as u64);
    let payload: u64 = model.iter().map(|(k, v)| (k.len() + v.len()) as u64).sum();
    assert_eq!(v.payload_bytes, payload);
    assert_eq!(t.len_estimate(), model.len() as u64);
    assert_eq!(&contents_of(t), model);
    // No leak: the heap holds exactly the table's blocks (blocks cached by live
    // thread handles are not counted as allocated).
    let rep = pmem::check_heap(t.heap());
    assert!(rep.ok(), "{rep}");
    assert_eq!(rep.blocks, v.blocks, "heap blocks vs table blocks");
}

#[test]
fn options_round_to_powers_of_two() {
    let e = |b| {
        PHashOptions {
            buckets: b,
            ..Default::default()
        }
        .effective_buckets()
    };
    assert_eq!(PHashOptions::default().buckets, 1 << 16);
    assert_eq!(e(0), 1);
    assert_eq!(e(1), 1);
    assert_eq!(e(3), 4);
    assert_eq!(e(1000), 1024);
    assert_eq!(e(1 << 40), 1 << 32);
    assert_eq!(e(u64::MAX), 1 << 32);
}

#[test]
fn random_ops_match_model() {
    let dir = tempfile::tempdir().unwrap();
    // Few buckets: long chains, removals from the middle of chains.
    let (_heap, t) = new_table(&dir.path().join("h.heap"), 16);
    assert_eq!(t.nbuckets(), 16);
    let mut h = t.handle().unwrap();
    let mut model = Model::new();
    let mut rng = SmallRng::seed_from_u64(0x5eed);
    let mut out = Vec::new();
    for step in 0..20_000u64 {
        let k = key_of(rng.random_range(0..300));
        match rng.random_range(0..10u32) {
            0..=2 => {
                let v = random_value(&mut rng);
                let new = h.put(&k, &v).unwrap();
                assert_eq!(new, model.insert(k, v).is_none(), "put at step {step}");
            }
            3..=4 => {
                let v = random_value(&mut rng);
                let inserted = h.insert(&k, &v).unwrap();
                assert_eq!(inserted, !model.contains_key(&k), "insert at step {step}");
                model.entry(k).or_insert(v);
            }
            5..=6 => {
                let present = h.remove(&k).unwrap();
                assert_eq!(present, model.remove(&k).is_some(), "remove at step {step}");
            }
            _ => {
                out.extend_from_slice(b"stale");
                let found = h.get(&k, &mut out).unwrap();
                match model.get(&k) {
                    Some(v) => {
                        assert!(found, "get at step {step}");
                        assert_eq!(&out, v);
                    }
                    None => {
                        assert!(!found, "get at step {step}");
                        assert!(out.is_empty(), "out is cleared");
                    }
                }
            }
        }
        if step % 2500 == 0 {
            check_against(&t, &model);
        }
    }
    check_against(&t, &model);
    h.sync().unwrap();
    // Empty key and empty value are ordinary pairs.
    assert!(h.put(b"", b"").unwrap());
    assert!(h.get(b"", &mut out).unwrap());
    assert!(out.is_empty());
    assert!(!h.insert(b"", b"x").unwrap());
    assert!(h.remove(b"").unwrap());
    assert!(!h.remove(b"").unwrap());
    check_against(&t, &model);
}

#[test]
fn size_limits_are_errors() {
    let dir = tempfile::tempdir().unwrap();
    let (_heap, t) = new_table(&dir.path().join("h.heap"), 64);
    let mut h = t.handle().unwrap();
    let big_key = vec![7u8; index::MAX_KEY + 1];
    assert!(matches!(h.put(&big_key, b"v"), Err(Error::KeyTooLarge(_))));
    assert!(matches!(
        h.get(&big_key, &mut Vec::new()),
        Err(Error::KeyTooLarge(_))
    ));
    assert!(matches!(h.remove(&big_key), Err(Error::KeyTooLarge(_))));
    // Zeroed and never touched: costs address space, not memory.
    let big_value = vec![0u8; index::MAX_VALUE + 1];
    assert!(matches!(
        h.insert(b"k", &big_value),
        Err(Error::ValueTooLarge(_))
    ));
    // The largest key works.
    let max_key = vec![9u8; index::MAX_KEY];
    assert!(h.put(&max_key, b"v").unwrap());
    let mut out = Vec::new();
    assert!(h.get(&max_key, &mut out).unwrap());
    assert_eq!(out, b"v");
    // A value larger than the heap fails cleanly and leaves the table unchanged.
    let huge = vec![1u8; 100 << 20];
    assert!(matches!(h.put(b"huge", &huge), Err(Error::Heap(_))));
    assert!(!h.get(b"huge", &mut out).unwrap());
    let v = t.verify(true).unwrap();
    assert_eq!(v.keys, 1);
    assert_eq!(t.len_estimate(), 1);
}

#[test]
fn two_threads_overlapping_keys() {
    let dir = tempfile::tempdir().unwrap();
    let (_heap, t) = new_table(&dir.path().join("h.heap"), 8);
    const N: u64 = 3000;
    // Phases are separated by barriers: every put happens before any removal, so
    // each key of 0..N is new to exactly one put.
    let barrier = std::sync::Barrier::new(2);
    let results: Vec<(u64, u64)> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..2u64)
            .map(|id| {
                let t = t.clone();
                let barrier = &barrier;
                s.spawn(move || {
                    let mut h = t.handle().unwrap();
                    let tag = [b'a' + id as u8];
                    let (lo, hi) = if id == 0 { (0, 2 * N / 3) } else { (N / 3, N) };
                    let mut new_puts = 0;
                    for i in lo..hi {
                        if h.put(&key_of(i), &tag).unwrap() {
                            new_puts += 1;
                        }
                    }
                    barrier.wait();
                    // Both remove every third key of their range (the overlap twice).
                    for i in (lo..hi).filter(|i| i % 3 == 0) {
                        h.remove(&key_of(i)).unwrap();
                    }
                    barrier.wait();
                    // Both race to insert the same keys: exactly one wins each.
                    let mut won = 0;
                    for i in N..N + 1000 {
                        if h.insert(&key_of(i), &tag).unwrap() {
                            won += 1;
                        }
                    }
                    // Concurrent readers see whole values.
                    let mut out = Vec::new();
                    for i in N..N + 1000 {
                        assert!(h.get(&key_of(i), &mut out).unwrap());
                        assert!(out == b"a" || out == b"b");
                    }
                    (new_puts, won)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    // Every key of 0..N was new to exactly one put.
    assert_eq!(results[0].0 + results[1].0, N);
    assert_eq!(results[0].1 + results[1].1, 1000);
    let got = contents_of(&t);
    let expected: BTreeSet<Vec<u8>> = (0..N)
        .filter(|i| i % 3 != 0)
        .chain(N..N + 1000)
        .map(key_of)
        .collect();
    assert_eq!(got.keys().cloned().collect::<BTreeSet<_>>(), expected);
    for i in (0..N).filter(|i| i % 3 != 0) {
        let v = &got[&key_of(i)];
        if i < N / 3 {
            assert_eq!(v, b"a");
        } else if i >= 2 * N / 3 {
            assert_eq!(v, b"b");
        } else {
            assert!(v == b"a" || v == b"b");
        }
    }
    let v = t.verify(false).unwrap();
    assert_eq!(v.keys, expected.len() as u64);
    assert_eq!(t.len_estimate(), expected.len() as u64);
}

#[test]
fn reopen_keeps_data() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("h.heap");
    let mut model = Model::new();
    let mut rng = SmallRng::seed_from_u64(42);
    {
        let (heap, t) = new_table(&path, 256);
        let mut h = t.handle().unwrap();
        for i in 0..2000 {
            let v = random_value(&mut rng);
            h.put(&key_of(i), &v).unwrap();
            model.insert(key_of(i), v);
        }
        for i in (0..2000).step_by(5) {
            h.remove(&key_of(i)).unwrap();
            model.remove(&key_of(i));
        }
        t.close().unwrap();
        drop(h);
        drop(t);
        drop(heap);
    }
    // Reopen, attach, recover, change more, and this time drop without close().
    {
        let rec = Heap::open(&path, &opts()).unwrap();
        let t = PHash::attach(rec.heap(), rec.heap().root()).unwrap();
        assert_eq!(t.nbuckets(), 256);
        // close() persisted the exact count.
        assert_eq!(t.len_estimate(), model.len() as u64);
        let (_heap, stats) = index::recover(rec, &[&t]).unwrap();
        assert_eq!(stats.repaired, 0);
        check_against(&t, &model);
        let mut h = t.handle().unwrap();
        let mut out = Vec::new();
        for (k, v) in &model {
            assert!(h.get(k, &mut out).unwrap());
            assert_eq!(&out, v);
        }
        for i in 1000..2500 {
            h.put(&key_of(i), b"later").unwrap();
            model.insert(key_of(i), b"later".to_vec());
        }
    }
    {
        let rec = Heap::open(&path, &opts()).unwrap();
        let t = PHash::attach(rec.heap(), rec.heap().root()).unwrap();
        let (heap, _) = index::recover(rec, &[&t]).unwrap();
        let v = t.verify(true).unwrap();
        assert_eq!(v.keys, model.len() as u64);
        assert_eq!(contents_of(&t), model);
        // No block of the heap is outside the table.
        let rep = pmem::check_heap(&heap);
        assert!(rep.ok(), "{rep}");
        assert_eq!(rep.blocks, v.blocks);
    }
}

#[test]
fn attach_rejects_garbage() {
    let dir = tempfile::tempdir().unwrap();
    let (heap, t) = new_table(&dir.path().join("h.heap"), 64);
    let r = heap.region();
    let is_corrupt = |root: u64| {
        matches!(
            PHash::attach(&heap, PPtr::from_raw(root)),
            Err(Error::Corrupt(_))
        )
    };
    assert!(is_corrupt(0));
    assert!(is_corrupt(t.root().offset() + 8)); // misaligned
    assert!(is_corrupt(r.size() - 16)); // descriptor overruns the heap
    assert!(is_corrupt(r.size() + 4096));
    assert!(is_corrupt(!15u64));
    assert!(is_corrupt(16)); // superblock
    assert!(PHash::attach(&heap, t.root()).is_ok());

    let mut th = heap.thread().unwrap();
    let mut rng = SmallRng::seed_from_u64(7);
    // Random bytes.
    for _ in 0..200 {
        let p = th.alloc(64).unwrap().offset();
        let bytes: Vec<u8> = (0..64).map(|_| rng.random_range(0..=255u8)).collect();
        r.write_bytes(p, &bytes);
        assert!(is_corrupt(p));
    }
    // A copy of a good descriptor with one field broken at a time.
    let good = {
        let mut b = [0u8; phash::DESC_SIZE as usize];
        r.read_bytes(t.root().offset(), &mut b);
        b
    };
    let d = th.alloc(phash::DESC_SIZE).unwrap().offset();
    let array = t.array().offset();
    let put = |field: u64, v: u64, width: usize| {
        r.write_bytes(d, &good);
        r.write_bytes(d + field, &v.to_le_bytes()[..width]);
        d
    };
    assert!(PHash::attach(&heap, PPtr::from_raw(put(0, 0, 0))).is_ok());
    assert!(is_corrupt(put(phash::D_TAG, 0x1234, 4)));
    assert!(is_corrupt(put(phash::D_VERSION, 0, 4)));
    assert!(is_corrupt(put(phash::D_VERSION, 3, 4)));
    for n in [0, 3, 100, (1 << 32) + 1, 1 << 33, u64::MAX] {
        assert!(is_corrupt(put(phash::D_NBUCKETS, n, 8)), "nbuckets {n}");
    }
    // More buckets than the array block holds.
    assert!(is_corrupt(put(phash::D_NBUCKETS, 128, 8)));
    assert!(is_corrupt(put(phash::D_NBUCKETS, 1 << 32, 8)));
    for a in [0, array + 8, array + 16, d, r.size(), u64::MAX - 15, 65536] {
        assert!(is_corrupt(put(phash::D_ARRAY, a, 8)), "array {a:#x}");
    }
    // A huge count is only an estimate: accepted.
    let t2 = PHash::attach(&heap, PPtr::from_raw(put(phash::D_COUNT, u64::MAX, 8))).unwrap();
    assert_eq!(t2.len_estimate(), i64::MAX as u64);
}

#[test]
fn corrupt_chains_are_errors_not_panics() {
    let dir = tempfile::tempdir().unwrap();
    let (heap, t) = new_table(&dir.path().join("h.heap"), 1);
    let r = heap.region();
    let mut h = t.handle().unwrap();
    for i in 0..10 {
        h.put(&key_of(i), b"value").unwrap();
    }
    t.verify(true).unwrap();
    // With one bucket, the chain is head -> 9 -> 8 -> ... -> 0.
    let head_off = t.array().offset() + B_HEAD;
    let first: u64 = r.read(head_off);
    let second: u64 = r.read(first + N_NEXT);
    let saved: u64 = r.read(second + N_NEXT);
    let mut out = Vec::new();
    for bad in [r.size() + 64, 0x000d_eadb_eef0, 24, second, first] {
        // `second` / `first`: a cycle.
        r.write(second + N_NEXT, &bad);
        assert!(
            matches!(h.get(&key_of(0), &mut out), Err(Error::Corrupt(_))),
            "{bad:#x}"
        );
        assert!(matches!(h.put(&key_of(100), b"x"), Err(Error::Corrupt(_))));
        assert!(matches!(h.remove(&key_of(0)), Err(Error::Corrupt(_))));
        assert!(t.verify(true).is_err());
        assert!(t.verify(false).is_err());
        // Keys before the break still work.
        assert!(h.get(&key_of(9), &mut out).unwrap());
        for p in blocks_of_bounded(&t, 20) {
            let _ = t.reachable(PPtr::from_raw(p));
        }
    }
    r.write(second + N_NEXT, &saved);
    t.verify(true).unwrap();
    // A bad value pointer and a bad hash.
    let v: u64 = r.read(first + N_VALUE);
    r.write(first + N_VALUE, &(r.size() - 8));
    assert!(matches!(
        h.get(&key_of(9), &mut out),
        Err(Error::Corrupt(_))
    ));
    assert!(t.verify(true).is_err());
    r.write(first + N_VALUE, &v);
    let hash: u64 = r.read(first + phash::N_HASH);
    r.write(first + phash::N_HASH, &(hash ^ 1));
    assert!(t.verify(true).is_err());
    r.write(first + phash::N_HASH, &hash);
    let tag: u32 = r.read(first);
    r.write(first, &0u32);
    assert!(t.verify(true).is_err());
    assert!(matches!(
        h.get(&key_of(0), &mut out),
        Err(Error::Corrupt(_))
    ));
    r.write(first, &tag);
    let v = t.verify(true).unwrap();
    assert_eq!(v.keys, 10);
}

/// Up to `max` nodes of each bucket, stopping at anything outside the heap.
fn blocks_of_bounded(t: &PHash, max: usize) -> Vec<u64> {
    let r = t.heap().region();
    let mut v = Vec::new();
    for b in 0..t.nbuckets() {
        let mut cur: u64 = r.read(t.array().offset() + BUCKET_SIZE * b + B_HEAD);
        for _ in 0..max {
            if cur == 0 || !r.contains(cur, NODE_HDR) {
                break;
            }
            v.push(cur);
            cur = r.read(cur + N_NEXT);
        }
    }
    v
}

#[test]
fn reachable_is_exact() {
    let dir = tempfile::tempdir().unwrap();
    let (heap, t) = new_table(&dir.path().join("h.heap"), 32);
    let r = heap.region();
    let mut h = t.handle().unwrap();
    let mut rng = SmallRng::seed_from_u64(99);
    for i in 0..1500 {
        h.put(&key_of(i), &random_value(&mut rng)).unwrap();
    }
    let before = blocks_of(&t);
    assert_eq!(before.len(), 2 + 2 * 1500);
    for &p in &before {
        assert!(t.reachable(PPtr::from_raw(p)), "live block {p:#x}");
    }
    // Updates free old values, removals free nodes and values.
    for i in 0..1500 {
        match i % 3 {
            0 => assert!(h.remove(&key_of(i)).unwrap()),
            1 => assert!(!h.put(&key_of(i), &random_value(&mut rng)).unwrap()),
            _ => {}
        }
    }
    let after = blocks_of(&t);
    assert_eq!(after.len(), 2 + 2 * 1000);
    for &p in &after {
        assert!(t.reachable(PPtr::from_raw(p)), "live block {p:#x}");
    }
    // Freed blocks may have been reused by later allocations: those are live again.
    let gone: Vec<u64> = before.difference(&after).copied().collect();
    assert!(gone.len() >= 500, "{} blocks gone", gone.len());
    for &p in &gone {
        // (Its allocation bit may be set again: a thread cache can have claimed it.)
        assert!(!t.reachable(PPtr::from_raw(p)), "freed block {p:#x}");
    }
    // Offsets inside live blocks, and arbitrary offsets (aligned or not) anywhere in
    // or beyond the heap: false unless they are a live block, and never a panic.
    for &p in &after {
        for d in [8, 16, 24, 32] {
            if !after.contains(&(p + d)) {
                assert!(!t.reachable(PPtr::from_raw(p + d)));
            }
        }
    }
    let size = r.size();
    for _ in 0..200_000 {
        let p = rng.random_range(0..size + (1 << 20));
        let p = if rng.random_bool(0.8) { p & !15 } else { p };
        assert_eq!(
            t.reachable(PPtr::from_raw(p)),
            after.contains(&p),
            "offset {p:#x}"
        );
    }
    for p in [0, u64::MAX, !15u64, size - 16, size - 8, size] {
        assert_eq!(t.reachable(PPtr::from_raw(p)), after.contains(&p));
    }
    // A garbage slot crafted to look like a node or value of a live key.
    let mut th = heap.thread().unwrap();
    let fake = th.alloc(NODE_HDR + 64).unwrap().offset();
    let real = *after
        .iter()
        .find(|&&p| {
            p != t.root().offset() && p != t.array().offset() && r.read::<u32>(p) == phash::NODE_TAG
        })
        .unwrap();
    let mut buf = vec![0u8; (NODE_HDR + 16) as usize];
    r.read_bytes(real, &mut buf);
    r.write_bytes(fake, &buf);
    assert!(
        !t.reachable(PPtr::from_raw(fake)),
        "a copy of a node is not linked"
    );
    let real_value: u64 = r.read(real + N_VALUE);
    let mut vbuf = [0u8; 16];
    r.read_bytes(real_value, &mut vbuf);
    r.write_bytes(fake, &vbuf);
    assert!(
        !t.reachable(PPtr::from_raw(fake)),
        "a copy of a value header is not linked"
    );
}

/// A reader racing with an updater of the same keys always sees a whole value:
/// `get` takes the bucket lock, so the old value block cannot be freed and reused
/// under it.
#[test]
fn readers_never_see_freed_values() {
    let dir = tempfile::tempdir().unwrap();
    let (_heap, t) = new_table(&dir.path().join("h.heap"), 4);
    // Small values from several size classes, and page runs (freed and reused
    // at once by the next large allocation: the widest window for a torn read).
    let value = |b: u8| {
        if b.is_multiple_of(2) {
            vec![b; 70_000 + (b as usize % 5) * 1000]
        } else {
            vec![b; 16 + (b as usize % 61) * 8]
        }
    };
    let mut h = t.handle().unwrap();
    for k in 0..8u64 {
        h.put(&key_of(k), &value(0)).unwrap();
    }
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        let writer = s.spawn(|| {
            let mut h = t.handle().unwrap();
            for i in 0..20_000u64 {
                h.put(&key_of(i % 2), &value((i % 251) as u8)).unwrap();
            }
            stop.store(true, std::sync::atomic::Ordering::Release);
        });
        let mut h = t.handle().unwrap();
        let mut out = Vec::new();
        let mut reads = 0u64;
        while !stop.load(std::sync::atomic::Ordering::Acquire) {
            let k = key_of(reads % 2);
            assert!(h.get(&k, &mut out).unwrap());
            let b = out[0];
            assert_eq!(out, value(b), "torn value after {reads} reads");
            reads += 1;
        }
        writer.join().unwrap();
    });
    let v = t.verify(true).unwrap();
    assert_eq!(v.keys, 8);
}

// --- Crash simulation -------------------------------------------------------------

fn sim_opts() -> HeapOptions {
    HeapOptions {
        size: 8 << 20,
        max_size: 32 << 20,
        geometry: Geometry::small(),
        strategy: Strategy::FenceOnly,
        ..Default::default()
    }
}

fn crash_images_target() -> u64 {
    std::env::var("EMBER_PHASH_CRASH_IMAGES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(400)
}

/// Opens a crash image, recovers it and checks it against the states before and
/// after the operation in flight.
fn check_image(
    path: &Path,
    img: &pmem::CrashImage,
    before: &Model,
    after: &Model,
    probe: bool,
) -> Result<(), String> {
    pmem::sim::write_image(path, &img.bytes).map_err(|e| e.to_string())?;
    let rec = Heap::open(path, &sim_opts()).map_err(|e| format!("open: {e}"))?;
    let t = PHash::attach(rec.heap(), rec.heap().root()).map_err(|e| format!("attach: {e}"))?;
    let (heap, _) = index::recover(rec, &[&t]).map_err(|e| format!("recover: {e}"))?;
    let v = t.verify(true)?;
    let rep = pmem::check_heap(&heap);
    if !rep.ok() {
        return Err(format!("check_heap: {}", rep.problems.join("; ")));
    }
    if rep.blocks != v.blocks {
        return Err(format!(
            "{} blocks allocated, the table owns {} (leak or lost block)",
            rep.blocks, v.blocks
        ));
    }
    let got = contents_of(&t);
    if &got != before && &got != after {
        return Err(format!(
            "contents ({} keys) are neither the state before ({}) nor after ({})",
            got.len(),
            before.len(),
            after.len()
        ));
    }
    if probe {
        // The recovered table takes updates, and its new blocks overlap nothing.
        let mut h = t.handle().map_err(|e| e.to_string())?;
        let mut model = got;
        for i in 0..20u64 {
            let k = key_of(1000 + i);
            let val = vec![i as u8; 40 + 100 * i as usize];
            h.put(&k, &val).map_err(|e| e.to_string())?;
            model.insert(k, val);
        }
        for k in model.keys().take(5).cloned().collect::<Vec<_>>() {
            h.remove(&k).map_err(|e| e.to_string())?;
            model.remove(&k);
        }
        let v = t.verify(true)?;
        if contents_of(&t) != model || v.keys != model.len() as u64 {
            return Err("updates after recovery went wrong".into());
        }
    }
    Ok(())
}

#[test]
fn crash_images_recover_before_or_after() {
    let dir = tempfile::tempdir().unwrap();
    let img_path = dir.path().join("image.heap");
    let target = crash_images_target();
    let (mut images, mut bad, mut run) = (0u64, 0u64, 0u64);
    while images < target {
        run += 1;
        let path = dir.path().join(format!("run{run}.heap"));
        {
            let heap = Heap::create(&path, &sim_opts()).unwrap();
            let t = PHash::create(
                &heap,
                &PHashOptions {
                    buckets: 8,
                    ..Default::default()
                },
            )
            .unwrap();
            heap.set_root(t.root()).unwrap();
        }
        let sim = Arc::new(CrashSim::new(run, 0));
        let (heap, _) = Heap::open_sim(&path, &sim_opts(), sim.clone())
            .unwrap()
            .finish_clean()
            .unwrap();
        let t = PHash::attach(&heap, heap.root()).unwrap();
        let mut h = t.handle().unwrap();
        let mut rng = SmallRng::seed_from_u64(run * 7919);
        let mut model = Model::new();
        sim.set_capture_ppm(120_000);
        for op in 1..=150u64 {
            sim.set_tag(op);
            let before = model.clone();
            let k = key_of(rng.random_range(0..40));
            let v = if rng.random_range(0..30) == 0 {
                vec![op as u8; 70_000] // a page run: freed durably
            } else {
                vec![op as u8; rng.random_range(0..300usize)]
            };
            match rng.random_range(0..4u32) {
                0 | 1 => {
                    h.put(&k, &v).unwrap();
                    model.insert(k, v);
                }
                2 => {
                    if h.insert(&k, &v).unwrap() {
                        model.insert(k, v);
                    }
                }
                _ => {
                    h.remove(&k).unwrap();
                    model.remove(&k);
                }
            }
            for img in sim.take_images() {
                images += 1;
                let probe = img.fence.is_multiple_of(5);
                if let Err(e) = check_image(&img_path, &img, &before, &model, probe) {
                    bad += 1;
                    if bad <= 5 {
                        eprintln!("run {run} op {op} fence {}: {e}", img.fence);
                    }
                }
            }
        }
        drop(h);
        drop(t);
        drop(heap);
        let _ = std::fs::remove_file(&path);
    }
    use std::io::Write;
    let _ = writeln!(
        std::io::stderr(),
        "phash crash-sim: {images} images, {bad} inconsistent ({run} runs)"
    );
    assert_eq!(bad, 0, "crash images that did not recover correctly");
}
