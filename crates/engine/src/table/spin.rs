//! The bucket lock: a reader-writer spinlock in one word.

use std::hint;
use std::sync::atomic::{AtomicU32, Ordering};
use std::thread;

use super::SPIN_LIMIT;

pub(super) struct Backoff(pub(super) u32);

impl Backoff {
    pub(super) fn new() -> Self {
        Backoff(0)
    }

    pub(super) fn snooze(&mut self) {
        if self.0 < SPIN_LIMIT {
            self.0 += 1;
            hint::spin_loop();
        } else {
            thread::yield_now();
        }
    }
}

const WRITER: u32 = 1 << 31;
/// Set by a waiting writer: new readers hold back so writers are not starved.
const WRITER_WAITING: u32 = 1 << 30;
const READERS: u32 = WRITER_WAITING - 1;

/// A reader-writer spinlock in one word: a writer bit, a writer-waiting bit and a
/// reader count.
pub(super) struct RwSpin(AtomicU32);

impl RwSpin {
    pub(super) fn new() -> Self {
        RwSpin(AtomicU32::new(0))
    }

    pub(super) fn lock(&self) {
        let mut backoff = Backoff::new();
        loop {
            let s = self.0.load(Ordering::Relaxed);
            if s & (WRITER | READERS) == 0 {
                // Taking the lock also clears WRITER_WAITING: any other waiting
                // writer sets it again on its next round.
                if self
                    .0
                    .compare_exchange_weak(s, WRITER, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
                {
                    return;
                }
            } else if s & WRITER_WAITING == 0 {
                self.0.fetch_or(WRITER_WAITING, Ordering::Relaxed);
            }
            backoff.snooze();
        }
    }

    pub(super) fn unlock(&self) {
        self.0.fetch_and(!WRITER, Ordering::Release);
    }

    fn lock_shared(&self) {
        let mut backoff = Backoff::new();
        loop {
            let s = self.0.load(Ordering::Relaxed);
            if s & (WRITER | WRITER_WAITING) == 0
                && self
                    .0
                    .compare_exchange_weak(s, s + 1, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
            {
                return;
            }
            backoff.snooze();
        }
    }

    fn unlock_shared(&self) {
        self.0.fetch_sub(1, Ordering::Release);
    }

    pub(super) fn write(&self) -> WriteGuard<'_> {
        self.lock();
        WriteGuard(self)
    }

    pub(super) fn read(&self) -> ReadGuard<'_> {
        self.lock_shared();
        ReadGuard(self)
    }
}

pub(super) struct WriteGuard<'a>(&'a RwSpin);

impl Drop for WriteGuard<'_> {
    fn drop(&mut self) {
        self.0.unlock();
    }
}

pub(super) struct ReadGuard<'a>(&'a RwSpin);

impl Drop for ReadGuard<'_> {
    fn drop(&mut self) {
        self.0.unlock_shared();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;
    use std::sync::Arc;

    #[test]
    fn spinlock_excludes() {
        let lock = Arc::new(RwSpin::new());
        let counter = Arc::new(AtomicU64::new(0));
        let hs: Vec<_> = (0..4)
            .map(|i| {
                let lock = Arc::clone(&lock);
                let counter = Arc::clone(&counter);
                thread::spawn(move || {
                    for _ in 0..20_000 {
                        if i % 2 == 0 {
                            let _w = lock.write();
                            // Non-atomic read-modify-write: lost updates if two
                            // writers overlap.
                            let v = counter.load(Ordering::Relaxed);
                            hint::spin_loop();
                            counter.store(v + 1, Ordering::Relaxed);
                        } else {
                            let _r = lock.read();
                            let v = counter.load(Ordering::Relaxed);
                            hint::spin_loop();
                            assert_eq!(counter.load(Ordering::Relaxed), v, "writer inside read");
                        }
                    }
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
        assert_eq!(counter.load(Ordering::Relaxed), 40_000);
        assert_eq!(lock.0.load(Ordering::Relaxed) & (WRITER | READERS), 0);
    }
}
