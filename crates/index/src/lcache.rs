//! The link cache (log-free paper §4): a small, best-effort, volatile table of links
//! whose new value is not yet durable. An update that gets an entry does not wait
//! for its link's write-back; the write-backs of a whole bucket are issued together
//! (one fence) when an operation depends on one of them ([`LinkCache::scan`]) or the
//! writer syncs ([`LinkCache::flush_buckets`]).
//!
//! A bucket is one cache line: a control word (16 bits of flushing count, six 2-bit
//! entry states: free, pending, busy), six 16-bit tags (a hash of the node the link
//! concerns) and six link addresses. Protocol of [`LinkCache::try_link`]:
//!
//! 1. reserve a free entry (free → pending) with one CAS on the control word, which
//!    fails if the bucket is being flushed; any failure: the caller persists its
//!    link itself (best effort, constant time);
//! 2. write the tag and link address into the entry;
//! 3. CAS the link to its new value marked DIRTY (readers help persist a DIRTY
//!    link); if that fails, free the entry and report the failure;
//! 4. pending → busy (publishes tag and address), then clear DIRTY: from here on a
//!    reader sees a clean-looking link whose durability is owed by the cache.
//!
//! An operation that depends on a link concerning node `n` calls `scan(n)` after
//! reading the link: a busy entry with `n`'s tag triggers a flush of its bucket. A
//! flush raises the flushing count (no reservation succeeds meanwhile, so no entry
//! it collected can be reused under it), writes back every busy entry's link,
//! fences, and only then frees those entries: an entry leaves the cache only after
//! its link is durable.

#[cfg(loom)]
use loom::sync::atomic::{AtomicU16, AtomicU32, AtomicU64};
use std::sync::atomic::Ordering;
#[cfg(not(loom))]
use std::sync::atomic::{AtomicU16, AtomicU32, AtomicU64};

use crate::link::{LinkMem, DIRTY};

/// Entries per bucket.
pub const ENTRIES: usize = 6;
const FREE: u32 = 0;
const PENDING: u32 = 1;
const BUSY: u32 = 2;
const FLUSH_ONE: u32 = 1 << 16;
/// Most buckets a cache may have (a handle remembers its buckets in a `u64`).
pub const MAX_BUCKETS: usize = 64;

#[repr(C, align(64))]
struct Bucket {
    ctl: AtomicU32,
    tags: [AtomicU16; ENTRIES],
    links: [AtomicU64; ENTRIES],
}

impl Bucket {
    fn new() -> Self {
        Bucket {
            ctl: AtomicU32::new(0),
            tags: std::array::from_fn(|_| AtomicU16::new(0)),
            links: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }
}

#[inline]
fn state(ctl: u32, i: usize) -> u32 {
    (ctl >> (2 * i)) & 3
}

/// Result of [`LinkCache::try_link`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Added {
    /// The link holds the new value and the cache owes its durability.
    Linked,
    /// The link no longer held the expected value: nothing changed.
    CasFailed,
    /// No entry on the first try: persist the link yourself.
    NoRoom,
}

/// Counters (best effort, for benchmarks).
#[derive(Clone, Copy, Debug, Default)]
pub struct CacheStats {
    pub added: u64,
    pub no_room: u64,
    pub flushes: u64,
}

pub struct LinkCache {
    buckets: Box<[Bucket]>,
    shift: u32,
}

impl LinkCache {
    /// A cache of `buckets` buckets (a power of two, 1..=64; the paper uses 32).
    pub fn new(buckets: usize) -> Self {
        let n = buckets.clamp(1, MAX_BUCKETS).next_power_of_two();
        LinkCache {
            buckets: (0..n).map(|_| Bucket::new()).collect(),
            shift: 64 - n.trailing_zeros(),
        }
    }

    pub fn buckets(&self) -> usize {
        self.buckets.len()
    }

    /// Bucket index and tag of the node a link concerns.
    #[inline]
    pub fn slot_of(&self, node: u64) -> (usize, u16) {
        let h = (node >> 4).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let b = if self.shift >= 64 {
            0
        } else {
            (h >> self.shift) as usize
        };
        (b, (h >> 8) as u16)
    }

    /// Installs `new` over `old` in the link at `addr` (concerning `node`) and hands
    /// its durability to the cache. See the module note.
    pub fn try_link<M: LinkMem + ?Sized>(
        &self,
        m: &M,
        node: u64,
        addr: u64,
        old: u64,
        new: u64,
    ) -> (Added, usize) {
        debug_assert!(old & DIRTY == 0 && new & DIRTY == 0);
        let (bi, tag) = self.slot_of(node);
        let b = &self.buckets[bi];
        let c = b.ctl.load(Ordering::Acquire);
        if c >= FLUSH_ONE {
            return (Added::NoRoom, bi);
        }
        let Some(i) = (0..ENTRIES).find(|&i| state(c, i) == FREE) else {
            return (Added::NoRoom, bi);
        };
        if b.ctl
            .compare_exchange(
                c,
                c | (PENDING << (2 * i)),
                Ordering::AcqRel,
                Ordering::Relaxed,
            )
            .is_err()
        {
            return (Added::NoRoom, bi);
        }
        b.tags[i].store(tag, Ordering::Relaxed);
        b.links[i].store(addr, Ordering::Relaxed);
        if !m.cas(addr, old, new | DIRTY) {
            b.ctl.fetch_and(!(3 << (2 * i)), Ordering::AcqRel);
            return (Added::CasFailed, bi);
        }
        b.ctl
            .fetch_xor((PENDING ^ BUSY) << (2 * i), Ordering::AcqRel);
        let _ = m.cas(addr, new | DIRTY, new);
        (Added::Linked, bi)
    }

    /// Makes durable every cached link concerning `node` (and, with it, the rest of
    /// its bucket). Call after reading the links the operation depends on.
    #[inline]
    pub fn scan<M: LinkMem + ?Sized>(&self, m: &M, node: u64) {
        let (bi, tag) = self.slot_of(node);
        let b = &self.buckets[bi];
        let c = b.ctl.load(Ordering::Acquire);
        if c & 0xfff == 0 {
            return;
        }
        let hit =
            (0..ENTRIES).any(|i| state(c, i) == BUSY && b.tags[i].load(Ordering::Relaxed) == tag);
        if hit {
            self.flush_buckets(m, 1u64 << bi);
        }
    }

    /// Writes back every busy entry of the buckets in `mask` (bit i = bucket i), one
    /// fence for all, then frees those entries.
    pub fn flush_buckets<M: LinkMem + ?Sized>(&self, m: &M, mask: u64) {
        let mut done = [0u32; MAX_BUCKETS];
        let mut any = false;
        // Every bucket is raised before any link is flushed: on x86 a locked
        // instruction waits for the thread's earlier write-backs, so raising
        // and flushing bucket by bucket would wait for each bucket's flushes
        // in turn; this way they overlap and the fence below waits once.
        for (bi, d) in done.iter_mut().enumerate().take(self.buckets.len()) {
            if mask & (1 << bi) == 0 {
                continue;
            }
            let b = &self.buckets[bi];
            if b.ctl.load(Ordering::Acquire) & 0xfff == 0 {
                continue;
            }
            b.ctl.fetch_add(FLUSH_ONE, Ordering::AcqRel);
            *d = 1 << 31; // "raised"
        }
        for (bi, d) in done.iter_mut().enumerate().take(self.buckets.len()) {
            if *d == 0 {
                continue;
            }
            let b = &self.buckets[bi];
            loop {
                let c = b.ctl.load(Ordering::Acquire);
                let mut new = false;
                for i in 0..ENTRIES {
                    if state(c, i) == BUSY && *d & (1 << i) == 0 {
                        m.flush(b.links[i].load(Ordering::Relaxed));
                        *d |= 1 << i;
                        new = true;
                        any = true;
                    }
                }
                if !new {
                    break;
                }
            }
        }
        if any {
            m.fence();
        }
        for (bi, &d) in done.iter().enumerate().take(self.buckets.len()) {
            if d == 0 {
                continue;
            }
            let b = &self.buckets[bi];
            let _ = b
                .ctl
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |c| {
                    let mut n = c;
                    for i in 0..ENTRIES {
                        if d & (1 << i) != 0 && state(n, i) == BUSY {
                            n &= !(3 << (2 * i));
                        }
                    }
                    Some(n - FLUSH_ONE)
                });
        }
    }

    /// Flushes every bucket.
    pub fn flush_all<M: LinkMem + ?Sized>(&self, m: &M) {
        let mask = if self.buckets.len() >= 64 {
            u64::MAX
        } else {
            (1u64 << self.buckets.len()) - 1
        };
        self.flush_buckets(m, mask);
    }

    /// Entries currently busy (tests).
    pub fn busy(&self) -> usize {
        self.buckets
            .iter()
            .map(|b| {
                let c = b.ctl.load(Ordering::Acquire);
                (0..ENTRIES).filter(|&i| state(c, i) == BUSY).count()
            })
            .sum()
    }
}
