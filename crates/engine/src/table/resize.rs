//! Doubling in the background: the migration thread, the migration of one
//! bucket (also run by a writer that meets a pending bucket), and starting and
//! waiting for the thread (see "Doubling" in the module documentation).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, PoisonError};
use std::thread;

use crossbeam_epoch::{self as epoch, Guard, Owned, Pointable, Shared};

use super::spin::Backoff;
use super::{Array, Inner, Node, Table, TableValue};
use super::{LIVE, LOAD_FACTOR, MIGRATED, PENDING, SPIN_LIMIT};

/// Old buckets the migration thread moves per epoch pin.
const MIGRATE_BATCH: usize = 64;

/// Copies source bucket `i` of `old` into `new` (buckets `i` and `i + old.len()`)
/// unless that is done already.
pub(super) fn migrate_bucket<V: TableValue + ?Sized, M: Clone>(
    old: &Array<V, M>,
    i: usize,
    new: &Array<V, M>,
    g: &Guard,
) {
    let ob = &old.buckets[i];
    let _old_lock = ob.lock.write();
    if ob.status.load(Ordering::Acquire) == MIGRATED {
        return;
    }
    debug_assert_eq!(ob.status.load(Ordering::Relaxed), LIVE);
    let lo = &new.buckets[i];
    let hi = &new.buckets[i + old.len()];
    let lo_lock = lo.lock.write();
    let hi_lock = hi.lock.write();
    debug_assert_eq!(lo.status.load(Ordering::Relaxed), PENDING);
    debug_assert_eq!(hi.status.load(Ordering::Relaxed), PENDING);
    // Clone everything first: if a clone panics, the copies are dropped, the locks
    // released and the source is still live (nothing half-migrated remains).
    let mut copies = Vec::new();
    let mut cur = ob.head.load(Ordering::Acquire, g);
    // SAFETY: we hold the bucket's lock, so the chain is stable and its nodes are
    // alive (unlinking needs the lock); `g` is pinned.
    while let Some(n) = unsafe { cur.as_ref() } {
        copies.push(Owned::new(Node::new(
            n.hash,
            n.key.clone(),
            // The pointer's tag (a tombstone's `TOMB_TAG`) goes with the copy.
            n.value(g).clone_owned().with_tag(n.tagged(g)),
            n.meta.clone(),
        )));
        cur = n.next.load(Ordering::Acquire, g);
    }
    // Push in reverse so each target chain keeps the source's relative order.
    for copy in copies.into_iter().rev() {
        let target = if new.index(copy.hash) == i { lo } else { hi };
        copy.next
            .store(target.head.load(Ordering::Relaxed, g), Ordering::Relaxed);
        target.head.store(copy, Ordering::Release);
    }
    lo.status.store(LIVE, Ordering::Release);
    hi.status.store(LIVE, Ordering::Release);
    // Readers that see MIGRATED (Acquire) see the filled targets. It is stored
    // before the targets are unlocked: a writer that changes a target afterwards
    // must not be overtaken by a reader still reading the frozen source.
    ob.status.store(MIGRATED, Ordering::Release);
    drop(hi_lock);
    drop(lo_lock);
}

impl<V: ?Sized + Pointable, M> Inner<V, M> {
    fn needs_doubling(&self) -> bool {
        let g = epoch::pin();
        // SeqCst pairs with `insert`'s increment and `resizing`'s accesses: an
        // insert that still saw `resizing` set is seen by the worker's recheck.
        self.len.load(Ordering::SeqCst) > LOAD_FACTOR * self.newest(&g).len()
    }
}

impl<V: TableValue + ?Sized, M: Clone> Inner<V, M> {
    /// One doubling; false when stopped before the end.
    fn double(&self) -> bool {
        let n = {
            let g = epoch::pin();
            let old_ptr = self.array.load(Ordering::Acquire, &g);
            // SAFETY: the base is never null and alive while pinned.
            let old = unsafe { old_ptr.deref() };
            debug_assert!(old.next.load(Ordering::Relaxed, &g).is_null());
            let new = Array::new(old.len() * 2, PENDING);
            new.prev.store(old_ptr, Ordering::Relaxed);
            old.next.store(Owned::new(new), Ordering::Release);
            old.len()
        };
        let mut i = 0;
        while i < n {
            if self.stop.load(Ordering::Relaxed) {
                return false;
            }
            let g = epoch::pin();
            let old = self.base(&g);
            let new = old.next_array(&g);
            for j in i..(i + MIGRATE_BATCH).min(n) {
                migrate_bucket(old, j, new, &g);
            }
            i += MIGRATE_BATCH;
        }
        let g = epoch::pin();
        let old_ptr = self.array.load(Ordering::Acquire, &g);
        // SAFETY: the base is never null and alive while pinned.
        let old = unsafe { old_ptr.deref() };
        let new_ptr = old.next.load(Ordering::Acquire, &g);
        // SAFETY: installed above and retired only by this thread, later.
        unsafe { new_ptr.deref() }
            .prev
            .store(Shared::null(), Ordering::Relaxed);
        self.array.store(new_ptr, Ordering::Release);
        // SAFETY: the old array is no longer the base and every bucket of it is
        // migrated, so no writer touches it and no reader pinned from now on can
        // reach it; readers pinned earlier are covered by the grace period. Its
        // drop frees only its own (frozen) chains.
        unsafe { g.defer_destroy(old_ptr) };
        g.flush();
        true
    }

    fn resize_worker(self: Arc<Self>) {
        /// Clears `resizing` if the worker unwinds, so `wait_resize` cannot hang.
        struct OnPanic<'a>(&'a AtomicBool);
        impl Drop for OnPanic<'_> {
            fn drop(&mut self) {
                if thread::panicking() {
                    self.0.store(false, Ordering::Release);
                }
            }
        }
        let _on_panic = OnPanic(&self.resizing);
        loop {
            while !self.stop.load(Ordering::Acquire) && self.needs_doubling() {
                if !self.double() {
                    break;
                }
            }
            self.resizing.store(false, Ordering::SeqCst);
            // An insert may have crossed the threshold after our last check while
            // it still saw `resizing`: look again before leaving.
            if self.stop.load(Ordering::Acquire)
                || !self.needs_doubling()
                || self.resizing.swap(true, Ordering::SeqCst)
            {
                return;
            }
        }
    }
}

impl<V: TableValue + ?Sized, M: Clone + Send + Sync + 'static> Table<V, M> {
    /// Whether a background doubling is running (tests).
    pub fn resizing(&self) -> bool {
        self.inner.resizing.load(Ordering::Acquire)
    }

    /// Blocks until no doubling is running (tests, benchmarks' prefill).
    pub fn wait_resize(&self) {
        let mut backoff = Backoff::new();
        while self.inner.resizing.load(Ordering::Acquire) {
            if backoff.0 < SPIN_LIMIT {
                backoff.snooze();
            } else {
                thread::sleep(std::time::Duration::from_micros(100));
            }
        }
    }

    /// Starts the migration thread if the table is over its load and none runs.
    pub(super) fn maybe_resize(&self) {
        let inner = &self.inner;
        if inner.resizing.load(Ordering::SeqCst) || !inner.needs_doubling() {
            return;
        }
        let mut worker = self.worker.lock().unwrap_or_else(PoisonError::into_inner);
        if inner.resizing.swap(true, Ordering::SeqCst) {
            return;
        }
        // A previous worker has cleared `resizing` and lost the race to take it
        // again: it is exiting without taking any lock, so joining is quick.
        if let Some(h) = worker.take() {
            let _ = h.join();
        }
        let shared = Arc::clone(inner);
        match thread::Builder::new()
            .name("table-resize".into())
            .spawn(move || shared.resize_worker())
        {
            Ok(h) => *worker = Some(h),
            Err(_) => inner.resizing.store(false, Ordering::Release),
        }
    }
}
