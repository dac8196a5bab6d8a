//! Epoch-based reclamation of unlinked blocks (log-free paper §5.2) on
//! crossbeam-epoch, feeding the heap's NV-epochs free tickets.
//!
//! A block about to be unlinked gets a [`FreeTicket`] first (the block becomes
//! covered by the thread's active page table, durably), so that a crash between the unlink and the
//! free leaves it to the leak sweep. After the unlink, the ticket is retired here;
//! a batch of tickets is freed once every thread pinned at retirement has unpinned.
//!
//! Operations fence before unpinning when they wrote links with
//! [`crate::link::cas_flush`]; hence every unlink that preceded a retirement is
//! durable before the block it unlinked is freed and reused.

use crossbeam_epoch::{Collector, Guard, LocalHandle};
use pmem::{FreeTicket, Heap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Tickets retired per deferred batch.
const BATCH: usize = 64;

/// Unredeemed tickets of one participant above which [`Participant::throttle`]
/// waits for the grace period. Each ticket holds an active page table entry (a
/// block entry: one reachability check at recovery); a thread pinned and
/// preempted stalls every grace period, and without a bound the tickets would
/// outgrow the table's block entries and fall back to whole pages (thousands of
/// checks each). Below the heap's default block-entry cap (1024 per slot).
const THROTTLE_HIGH: usize = 512;
/// Where a throttled thread resumes.
const THROTTLE_LOW: usize = 128;
/// Longest wait: a participant pinned for longer (a long scan) must not stall
/// writers; the tickets then fall back to page entries (recovery scans more).
const THROTTLE_MAX_WAIT: Duration = Duration::from_millis(20);

/// One structure's epoch domain.
#[derive(Clone)]
pub struct Domain {
    collector: Collector,
    heap: Heap,
}

impl Domain {
    pub fn new(heap: Heap) -> Self {
        Domain {
            collector: Collector::new(),
            heap,
        }
    }

    pub fn participant(&self) -> Participant {
        Participant {
            local: self.collector.register(),
            batch: Vec::new(),
            heap: self.heap.clone(),
            outstanding: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// Runs deferred frees that are ready (best effort; clean shutdown).
    pub fn collect(&self) {
        let h = self.collector.register();
        for _ in 0..8 {
            h.pin().flush();
        }
    }
}

/// One thread's membership in a [`Domain`].
pub struct Participant {
    local: LocalHandle,
    batch: Vec<FreeTicket>,
    heap: Heap,
    /// Tickets retired and not yet redeemed (batched or deferred).
    outstanding: Arc<AtomicUsize>,
}

impl Participant {
    #[inline]
    pub fn pin(&self) -> Guard {
        self.local.pin()
    }

    /// Retires tickets of blocks this thread unlinked.
    pub fn retire(&mut self, guard: &Guard, tickets: impl IntoIterator<Item = FreeTicket>) {
        let before = self.batch.len();
        self.batch.extend(tickets);
        self.outstanding
            .fetch_add(self.batch.len() - before, Ordering::Relaxed);
        // Batched, unless the heap is short of space: then a writer waits
        // for these blocks, and a batch might not fill for a long time.
        if self.batch.len() >= BATCH || self.heap.short_of_space() {
            self.defer_batch(guard);
        }
    }

    fn defer_batch(&mut self, guard: &Guard) {
        if self.batch.is_empty() {
            return;
        }
        let batch = std::mem::take(&mut self.batch);
        let heap = self.heap.clone();
        let outstanding = self.outstanding.clone();
        guard.defer(move || {
            let n = batch.len();
            let r = heap.free_tickets(batch);
            debug_assert!(r.is_ok(), "deferred free failed: {r:?}");
            outstanding.fetch_sub(n, Ordering::Relaxed);
        });
        guard.flush();
    }

    /// Hands the tickets retired so far to the epoch and helps it along until
    /// they are redeemed, for at most [`THROTTLE_MAX_WAIT`]: for a writer that
    /// found the heap full, whose removes' blocks would otherwise wait for a
    /// batch of [`BATCH`] tickets. Call with nothing pinned.
    pub fn release_now(&mut self) {
        {
            let g = self.local.pin();
            self.defer_batch(&g);
        }
        let start = Instant::now();
        while self.outstanding() > 0 && start.elapsed() < THROTTLE_MAX_WAIT {
            self.local.pin().flush();
            std::thread::yield_now();
        }
    }

    /// Hands the tickets retired so far to the epoch now (tests).
    #[cfg(test)]
    pub(crate) fn hand_over(&mut self) {
        let g = self.local.pin();
        self.defer_batch(&g);
    }

    /// Tickets retired and not yet redeemed.
    pub fn outstanding(&self) -> usize {
        self.outstanding.load(Ordering::Relaxed)
    }

    /// Called between operations (nothing pinned): when too many tickets await
    /// their grace period, hands the batch over and helps the epoch along until
    /// they are redeemed, yielding the CPU (on a small machine the thread holding
    /// the epoch back is often waiting for it), for at most
    /// [`THROTTLE_MAX_WAIT`]. Bounds the active page table entries that recovery
    /// checks.
    pub fn throttle(&mut self) {
        if self.outstanding() <= THROTTLE_HIGH {
            return;
        }
        {
            let g = self.local.pin();
            self.defer_batch(&g);
        }
        let start = Instant::now();
        while self.outstanding() > THROTTLE_LOW && start.elapsed() < THROTTLE_MAX_WAIT {
            self.local.pin().flush();
            std::thread::yield_now();
        }
    }
}

impl Drop for Participant {
    fn drop(&mut self) {
        let g = self.local.pin();
        self.defer_batch(&g);
    }
}
