//! Loom model of the `lentry` race between a log writer's append and a gleaner's
//! release (Bullet §2.3, §4.1), run against the real functions of
//! `engine::lentry`.
//! Run: `RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom cargo test -p engine --test loom_lentry --release`.
//!
//! A writer appends records 1..=N for one key, each under the key's bucket lock:
//! `prev = prev_for_append`, the record is written (its `prev`), `publish`. A
//! gleaner (one or two passes) walks from `chain_start` through `prev` to the first
//! applied record, applies the chain oldest first (a per-record count of
//! applications stands for the backend), sets the records' `applied` flags, then
//! `release`s. In every interleaving:
//! - while running, every record the gleaner applies is applied exactly once;
//! - at the end, every record not applied is reachable from `lentry` before the
//!   first applied record of the chain (so the next gleaner finds it), and a final
//!   gleaner pass leaves every record applied exactly once and `lentry` at 0 or at
//!   an applied record.
//!
//! Mutating `release` into a blind store of 0 makes both models fail (checked when
//! the model was written).
#![cfg(loom)]

use engine::lentry::{self, AtomicU64};
use loom::sync::atomic::{AtomicBool, AtomicUsize};
use loom::sync::{Arc, Mutex};
use std::sync::atomic::Ordering;

struct Key {
    lentry: AtomicU64,
    lock: Mutex<()>,
    /// Per record (index = record id; 0 unused): its `prev`, its `applied` flag, and
    /// how many times the backend applied it.
    prev: Vec<AtomicU64>,
    applied: Vec<AtomicBool>,
    count: Vec<AtomicUsize>,
}

impl Key {
    fn new(n: usize) -> Key {
        Key {
            lentry: AtomicU64::new(0),
            lock: Mutex::new(()),
            prev: (0..=n).map(|_| AtomicU64::new(0)).collect(),
            applied: (0..=n).map(|_| AtomicBool::new(false)).collect(),
            count: (0..=n).map(|_| AtomicUsize::new(0)).collect(),
        }
    }

    fn append(&self, r: u64) {
        let _g = self.lock.lock().unwrap();
        let prev = lentry::prev_for_append(&self.lentry);
        // The record is written and persisted before it is published.
        self.prev[r as usize].store(prev, Ordering::Relaxed);
        lentry::publish(&self.lentry, r);
    }

    /// One gleaner pass over the key (the gleaner holds the key's gleaner lock).
    fn glean(&self) {
        let start = lentry::chain_start(&self.lentry);
        let mut chain = Vec::new();
        let mut cur = start;
        while cur != 0 && !self.applied[cur as usize].load(Ordering::Acquire) {
            chain.push(cur);
            cur = self.prev[cur as usize].load(Ordering::Relaxed);
        }
        if chain.is_empty() {
            return;
        }
        for &r in chain.iter().rev() {
            let c = self.count[r as usize].fetch_add(1, Ordering::Relaxed);
            assert_eq!(c, 0, "record {r} applied twice");
        }
        for &r in &chain {
            self.applied[r as usize].store(true, Ordering::Release);
        }
        lentry::release(&self.lentry, chain[0]);
    }

    /// Reads of the final state (after every thread joined) are read-modify-writes:
    /// loom 0.7 lets a plain load after a join read a value older than the last in
    /// modification order (tokio-rs/loom#282, #389), which reports states no real
    /// execution reaches. An RMW reads the last value.
    fn check_reachable(&self, n: usize) {
        let mut reach = vec![false; n + 1];
        let mut cur = self.lentry.fetch_add(0, Ordering::AcqRel);
        while cur != 0 && !self.applied[cur as usize].fetch_or(false, Ordering::AcqRel) {
            reach[cur as usize] = true;
            cur = self.prev[cur as usize].fetch_add(0, Ordering::AcqRel);
        }
        for r in 1..=n {
            if !self.applied[r].fetch_or(false, Ordering::AcqRel) {
                assert!(
                    reach[r],
                    "unapplied record {r} is not reachable from lentry"
                );
            }
        }
    }
}

fn model(n: usize, passes: usize) {
    loom::model(move || {
        let k = Arc::new(Key::new(n));
        let w = {
            let k = k.clone();
            loom::thread::spawn(move || {
                for r in 1..=n as u64 {
                    k.append(r);
                }
            })
        };
        let g = {
            let k = k.clone();
            loom::thread::spawn(move || {
                for _ in 0..passes {
                    k.glean();
                }
            })
        };
        w.join().unwrap();
        g.join().unwrap();
        k.check_reachable(n);
        k.glean();
        for r in 1..=n {
            assert_eq!(k.count[r].load(Ordering::Relaxed), 1, "record {r}");
        }
        let l = k.lentry.fetch_add(0, Ordering::AcqRel);
        assert!(l == 0 || k.applied[l as usize].fetch_or(false, Ordering::AcqRel));
    });
}

#[test]
fn two_appends_one_glean() {
    model(2, 1);
}

#[test]
fn three_appends_two_gleans() {
    model(3, 2);
}
