//! Link-and-persist (log-free paper §3).
//!
//! A link is a `u64` word in the heap holding a [`pmem::PPtr`] with two mark bits:
//!
//! - [`DEL`]: on a `next` link, the node holding it is being unlinked (Harris'
//!   deletion mark); on a `value` link, the node is logically deleted (the value is
//!   frozen: the remove's linearization point).
//! - [`DIRTY`]: the link's current value may not be durable yet. The writer installs
//!   the new value with DIRTY set, flushes the word, fences, and clears DIRTY. Any
//!   operation that reads a DIRTY link it depends on does the same itself
//!   ([`settle`]): helping, without blocking.
//!
//! Links whose durability no result depends on (physical unlinks, skip-list upper
//! levels) are written with [`cas_flush`]: the word is flushed but not fenced; the
//! operation fences before it releases its epoch guard ([`crate::reclaim`]), so every
//! such write is durable before any block it unlinked can be freed.

use pmem::Region;
use std::sync::atomic::Ordering;

/// The memory links live in: the heap region, or a model of it (loom tests).
pub trait LinkMem {
    fn load(&self, addr: u64) -> u64;
    /// Compare-and-swap (AcqRel); true on success.
    fn cas(&self, addr: u64, old: u64, new: u64) -> bool;
    /// Starts the write-back of the line holding `addr` (no ordering).
    fn flush(&self, addr: u64);
    /// Waits for this thread's write-backs.
    fn fence(&self);
}

impl LinkMem for Region {
    #[inline]
    fn load(&self, addr: u64) -> u64 {
        self.atomic_u64(addr).load(Ordering::Acquire)
    }
    #[inline]
    fn cas(&self, addr: u64, old: u64, new: u64) -> bool {
        self.atomic_u64(addr)
            .compare_exchange(old, new, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }
    #[inline]
    fn flush(&self, addr: u64) {
        Region::flush(self, addr, 8)
    }
    #[inline]
    fn fence(&self) {
        Region::fence(self)
    }
}

/// Deletion mark.
pub const DEL: u64 = 1;
/// "Not yet durable" mark.
pub const DIRTY: u64 = 2;
/// Both marks.
pub const MARKS: u64 = DEL | DIRTY;

/// Strips the marks.
#[inline]
pub fn ptr(v: u64) -> u64 {
    v & !pmem::pptr::MARK_MASK
}

/// Loads a link.
#[inline]
pub fn load<M: LinkMem + ?Sized>(m: &M, addr: u64) -> u64 {
    m.load(addr)
}

/// Makes the link at `addr` durable if its observed value `v` is DIRTY (flush,
/// fence, clear the mark) and returns the value without DIRTY. A failed clear means
/// the link changed since: its new writer settled this value before changing it.
#[inline]
pub fn settle<M: LinkMem + ?Sized>(m: &M, addr: u64, v: u64) -> u64 {
    if v & DIRTY != 0 {
        m.flush(addr);
        m.fence();
        let _ = m.cas(addr, v, v & !DIRTY);
    }
    v & !DIRTY
}

/// Loads a link and settles it.
#[inline]
pub fn load_settled<M: LinkMem + ?Sized>(m: &M, addr: u64) -> u64 {
    settle(m, addr, m.load(addr))
}

/// Link-and-persist: installs `new` over `old` (both without DIRTY) marked DIRTY,
/// persists it, clears the mark. False if the link no longer held `old`.
#[inline]
pub fn cas_persist<M: LinkMem + ?Sized>(m: &M, addr: u64, old: u64, new: u64) -> bool {
    debug_assert!(old & DIRTY == 0 && new & DIRTY == 0);
    if !m.cas(addr, old, new | DIRTY) {
        return false;
    }
    settle(m, addr, new | DIRTY);
    true
}

/// Installs `new` over `old` and flushes the word without fencing (see the module
/// note: the caller fences before releasing its epoch guard).
#[inline]
pub fn cas_flush<M: LinkMem + ?Sized>(m: &M, addr: u64, old: u64, new: u64) -> bool {
    let ok = m.cas(addr, old, new);
    if ok {
        m.flush(addr);
    }
    ok
}
