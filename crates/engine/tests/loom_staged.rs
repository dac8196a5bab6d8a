//! Loom model of a log's staged run (`Pool::stage`, `write_staged`,
//! `read_staged`; ARCHITECTURE.md "Log writes under msync"): the lock-free
//! read path, where a reader below `staged_from` reads the file without the
//! run's mutex. A model of the protocol, not the pool itself (which needs a
//! mapped heap): the same steps, in the same order, with the same orderings.
//! Run: `RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom cargo test -p engine --test loom_staged --release`.
//!
//! The log's writer appends records 0..N (record `p`'s bytes: `p + 100`): it
//! stages each (under the mutex; `staged_from` set when the run starts), then
//! publishes the tail (Release), and commits after some (writes the run out).
//! Another thread writes the run out when it needs the log durable
//! (`make_durable_to`). A reader reads the tail (Acquire), then every record
//! below it, each from the run or from the file as `read_staged` decides. The
//! file is modelled as relaxed atomics, weaker than a `pwrite` (a system
//! call): in every interleaving the reader must read every record's bytes.
//!
//! Mutating the write-out to clear `staged_from` before writing the file, or
//! the writer to publish the tail before it stages the record, makes both
//! models fail (checked when the model was written).
#![cfg(loom)]

use loom::sync::atomic::AtomicU64;
use loom::sync::{Arc, Mutex};
use std::sync::atomic::Ordering;

const N: u64 = 2;
const NONE: u64 = u64::MAX;

struct Log {
    /// The file's bytes of each position (0 = never written).
    file: Vec<AtomicU64>,
    /// The run: its first position and the staged bytes.
    run: Mutex<(u64, Vec<u64>)>,
    staged_from: AtomicU64,
    tail: AtomicU64,
}

impl Log {
    fn new() -> Log {
        Log {
            file: (0..N).map(|_| AtomicU64::new(0)).collect(),
            run: Mutex::new((0, Vec::new())),
            staged_from: AtomicU64::new(NONE),
            tail: AtomicU64::new(0),
        }
    }

    /// `Pool::stage` (a run always continues here: no wrap in the model).
    fn stage(&self, pos: u64) {
        let mut run = self.run.lock().unwrap();
        if run.1.is_empty() {
            run.0 = pos;
            self.staged_from.store(pos, Ordering::Release);
        }
        run.1.push(pos + 100);
    }

    /// `Pool::write_staged`.
    fn write_staged(&self) {
        if self.staged_from.load(Ordering::Acquire) == NONE {
            return;
        }
        let mut run = self.run.lock().unwrap();
        if run.1.is_empty() {
            return;
        }
        for (i, v) in run.1.iter().enumerate() {
            self.file[(run.0 + i as u64) as usize].store(*v, Ordering::Relaxed);
        }
        self.staged_from.store(NONE, Ordering::Release);
        run.1.clear();
    }

    /// `Pool::read_record` of record `p`.
    fn read(&self, p: u64) -> u64 {
        if p + 1 > self.staged_from.load(Ordering::Acquire) {
            let run = self.run.lock().unwrap();
            if p >= run.0 && p < run.0 + run.1.len() as u64 {
                return run.1[(p - run.0) as usize];
            }
        }
        self.file[p as usize].load(Ordering::Relaxed)
    }
}

fn model(commit_after: u64) {
    loom::model(move || {
        let log = Arc::new(Log::new());
        let w = {
            let log = log.clone();
            loom::thread::spawn(move || {
                for p in 0..N {
                    log.stage(p);
                    log.tail.store(p + 1, Ordering::Release);
                    if p == commit_after {
                        log.write_staged();
                    }
                }
            })
        };
        let other = {
            let log = log.clone();
            loom::thread::spawn(move || log.write_staged())
        };
        let t = log.tail.load(Ordering::Acquire);
        for p in 0..t {
            assert_eq!(log.read(p), p + 100, "record {p} of {t} read wrong");
        }
        w.join().unwrap();
        other.join().unwrap();
        // After a final write-out, everything is in the file.
        log.write_staged();
        for p in 0..N {
            assert_eq!(log.file[p as usize].load(Ordering::Relaxed), p + 100);
            assert_eq!(log.read(p), p + 100);
        }
    });
}

#[test]
fn staged_records_read_back_with_a_commit_after_the_first() {
    model(0);
}

#[test]
fn staged_records_read_back_with_a_commit_after_the_second() {
    model(1);
}
