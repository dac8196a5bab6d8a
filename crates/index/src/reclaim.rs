//! Epoch-based reclamation of unlinked blocks (log-free paper §5.2) on
//! crossbeam-epoch, feeding the heap's NV-epochs free tickets.
//!
//! A block about to be unlinked gets a [`FreeTicket`] first (its page joins the
//! thread's active page table, durably), so that a crash between the unlink and the
//! free leaves it to the leak sweep. After the unlink, the ticket is retired here;
//! a batch of tickets is freed once every thread pinned at retirement has unpinned.
//!
//! Operations fence before unpinning when they wrote links with
//! [`crate::link::cas_flush`]; hence every unlink that preceded a retirement is
//! durable before the block it unlinked is freed and reused.

use crossbeam_epoch::{Collector, Guard, LocalHandle};
use pmem::{FreeTicket, Heap};

/// Tickets retired per deferred batch.
const BATCH: usize = 64;

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
}

impl Participant {
    #[inline]
    pub fn pin(&self) -> Guard {
        self.local.pin()
    }

    /// Retires tickets of blocks this thread unlinked.
    pub fn retire(&mut self, guard: &Guard, tickets: impl IntoIterator<Item = FreeTicket>) {
        self.batch.extend(tickets);
        if self.batch.len() >= BATCH {
            self.defer_batch(guard);
        }
    }

    fn defer_batch(&mut self, guard: &Guard) {
        if self.batch.is_empty() {
            return;
        }
        let batch = std::mem::take(&mut self.batch);
        let heap = self.heap.clone();
        guard.defer(move || {
            let r = heap.free_tickets(batch);
            debug_assert!(r.is_ok(), "deferred free failed: {r:?}");
        });
        guard.flush();
    }
}

impl Drop for Participant {
    fn drop(&mut self) {
        let g = self.local.pin();
        self.defer_batch(&g);
    }
}
