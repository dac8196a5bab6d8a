//! Recovery work is bounded by the active page tables, not by the number of keys.
//!
//! Two threads fill a structure with `KEYS` keys and then update random keys (the
//! frees of scattered blocks are what used to spread the tables over thousands of
//! slots). At a quiescent moment, with the handles still open (tickets awaiting
//! their grace period, pages still active), the heap file is copied: the page
//! cache's content, what a SIGKILL at that moment leaves. Recovery of the copy must
//! examine at most `MAX_SLOTS` block slots — a count, not a time, so the test is
//! exact on a noisy machine — and leave a consistent, leak-free structure holding
//! every key.
//!
//! The bound follows from the heap's policies (word entries of 64 blocks for
//! allocation and for a few frees per thread, block entries for the rest of the
//! frees, `index::reclaim` throttling a thread at 512 outstanding tickets); a
//! regression to page- or chunk-granular tables examines tens of thousands.

mod common;

use common::*;
use pmem::{Heap, HeapOptions, Strategy};
use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};
use std::sync::{Arc, Barrier};

const KEYS: usize = 60_000;
const UPDATES: usize = 20_000;
const THREADS: usize = 2;
const MAX_SLOTS: u64 = 12_000;

fn opts() -> HeapOptions {
    HeapOptions {
        size: 64 << 20,
        max_size: 1 << 30,
        reserve: 1 << 30,
        strategy: Strategy::FenceOnly,
        ..Default::default()
    }
}

fn k(i: usize) -> Vec<u8> {
    format!("bound-key-{i:08}").into_bytes()
}

fn v(i: usize, round: usize) -> Vec<u8> {
    format!("value-{i}-{round}-{}", "x".repeat(i % 40)).into_bytes()
}

fn run(kind: Kind) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("live.heap");
    let copy = dir.path().join("crashed.heap");
    let heap = Heap::create(&path, &opts()).unwrap();
    let t = create(kind, &heap).unwrap();
    let quiet = Arc::new(Barrier::new(THREADS + 1));
    let copied = Arc::new(Barrier::new(THREADS + 1));
    let workers: Vec<_> = (0..THREADS)
        .map(|tid| {
            let (t, quiet, copied) = (t.clone(), quiet.clone(), copied.clone());
            std::thread::spawn(move || {
                let mut h = t.handle().unwrap();
                for i in (tid..KEYS).step_by(THREADS) {
                    h.put(&k(i), &v(i, 0)).unwrap();
                }
                let mut rng = SmallRng::seed_from_u64(0xb0b0 + tid as u64);
                for n in 0..UPDATES {
                    // Each thread updates its own keys: every key's last value is known.
                    let i = rng.random_range(0..KEYS / THREADS) * THREADS + tid;
                    h.put(&k(i), &v(i, n + 1)).unwrap();
                }
                h.sync().unwrap();
                quiet.wait();
                copied.wait();
            })
        })
        .collect();
    quiet.wait();
    std::fs::copy(&path, &copy).unwrap();
    copied.wait();
    for w in workers {
        w.join().unwrap();
    }
    drop(t);
    drop(heap);

    let rec = Heap::open(&copy, &opts()).unwrap();
    assert!(
        !rec.report().was_clean,
        "the copy was taken from a live heap"
    );
    let (heap, t, stats) = recover(kind, rec).unwrap();
    say(&format!(
        "recovery bound {kind:?}: {KEYS} keys, {} active page table entries, {} slots examined \
         (bound {MAX_SLOTS}), {} leaked blocks freed, {} us",
        stats.heap.active_pages, stats.slots, stats.heap.leaked_freed, stats.micros
    ));
    assert!(
        stats.slots <= MAX_SLOTS,
        "{kind:?}: recovery examined {} slots for {} active entries (bound {MAX_SLOTS})",
        stats.slots,
        stats.heap.active_pages
    );
    let verified = check_recovered(&*t, &heap).unwrap();
    assert_eq!(
        verified.keys, KEYS as u64,
        "{kind:?}: keys lost or invented"
    );
    let mut h = t.handle().unwrap();
    let mut out = Vec::new();
    for i in (0..KEYS).step_by(997) {
        assert!(h.get(&k(i), &mut out).unwrap(), "{kind:?}: key {i} lost");
    }
}

#[test]
fn recovery_bound_hash() {
    run(Kind::Hash);
}

#[test]
fn recovery_bound_hash_nocache() {
    run(Kind::HashNoCache);
}

#[test]
fn recovery_bound_skiplist() {
    run(Kind::Skip);
}

#[test]
fn recovery_bound_phash() {
    run(Kind::PHash);
}
