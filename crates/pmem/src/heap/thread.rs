//! [`ThreadHeap`]: one thread's slot, its slabs and its allocation, free and
//! transaction context.

use super::apt::{cover_key, word_entry, Apt, FREE_WORDS};
use super::{short_clock, take_ticket, FreeTicket, Heap, HeapInner, SHORT_FOR};
use crate::alloc::BlockKind;
use crate::error::{Error, Result};
use crate::layout::*;
use crate::persist::Strategy;
use crate::pptr::PPtr;
use crate::region::Region;
use crate::tx;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// The (slab, word) pairs holding claimed bits not yet handed out: their entries
/// must stay (recovery would give the bits back).
fn held_words(cur: &[Option<u64>], cursor: &[u64], claimed: &[u64]) -> Vec<(u64, u64)> {
    (0..cur.len())
        .filter_map(|c| match cur[c] {
            Some(slab) if claimed[c] != 0 => Some((slab, cursor[c])),
            _ => None,
        })
        .collect()
}

/// Which new active page table entries a free ticket's preparation leaves
/// unfenced (flushed only) for its caller to fence.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Unfenced {
    /// None: the ticket is durable when `prepare` returns.
    Nothing,
    /// A block entry (a transaction's commit fences before its commit record
    /// when it holds one; a word entry must be durable already).
    BlockEntries,
    /// Block and word entries (`prepare_free_unfenced`).
    Entries,
}

/// Spare slabs `ThreadHeap::reserve` takes ahead, per class.
const MAX_SPARE: usize = 8;

/// Takes a slab of `class` for a thread to own: a pooled one with room, else a
/// new one, else (no page left) any pooled one.
fn take_slab(inner: &HeapInner, class: usize) -> Result<u64> {
    let region = &inner.region;
    match inner.alloc.pop_pool(region, class, true) {
        Some(s) => Ok(s),
        None => match inner.alloc.new_slab(region, class) {
            Ok(s) => Ok(s),
            // No page for a new slab: any room will do.
            Err(e) => inner.alloc.pop_pool(region, class, false).ok_or(e),
        },
    }
}

/// One thread's allocation and transaction context, bound to a heap thread slot.
/// Not shareable between threads (it may move to another thread).
pub struct ThreadHeap {
    pub(crate) heap: Heap,
    pub(crate) slot: usize,
    apt: Apt,
    cur: Vec<Option<u64>>,
    cursor: Vec<u64>,
    /// Bits of word `cursor` claimed from the current slab and not yet handed out.
    claimed: Vec<u64>,
    /// (apt epoch, entry index) covering the current slab of each class.
    cur_apt: Vec<Option<(u64, usize)>>,
    /// Slabs of each class taken ahead by `reserve` (owned, their free words
    /// covered), used in order once the current slab is full.
    spare: Vec<VecDeque<u64>>,
    /// Total of `claimed` bits, published (owner-only store) for accounting.
    ncached: u64,
    cached: Arc<AtomicU64>,
    pub(crate) tx_state: tx::TxState,
}

impl ThreadHeap {
    pub(super) fn new(heap: Heap, slot: usize) -> Self {
        let region = &heap.inner.region;
        let apt = Apt::load(region, slot);
        let tx_state = tx::TxState::new(&region.geometry(), slot);
        let cached = Arc::new(AtomicU64::new(0));
        heap.inner.caches.lock().unwrap().push(cached.clone());
        ThreadHeap {
            heap,
            slot,
            apt,
            cur: vec![None; CLASSES.len()],
            cursor: vec![0; CLASSES.len()],
            claimed: vec![0; CLASSES.len()],
            cur_apt: vec![None; CLASSES.len()],
            spare: vec![VecDeque::new(); CLASSES.len()],
            ncached: 0,
            cached,
            tx_state,
        }
    }

    pub fn heap(&self) -> &Heap {
        &self.heap
    }
    pub fn region(&self) -> &Region {
        &self.heap.inner.region
    }
    pub fn slot(&self) -> usize {
        self.slot
    }

    /// Ends an operation (an NV-epoch boundary): every block allocated before this
    /// call must by now be durably reachable or freed. Pages whose allocations have
    /// all ended may then leave the active page table.
    pub fn end_op(&mut self) {
        self.apt.op += 1;
    }

    /// With the msync strategy, where each fence is a device flush: prepares
    /// this thread to allocate `wants` (pairs of size and count) with no fence
    /// of their own. For each small class, entries for enough words with free
    /// blocks (of the current slab, then of further slabs taken now and kept
    /// as spares) are stored and flushed, and one fence makes them all durable,
    /// as `ensure` would have one word at a time (each entry is durable before
    /// any bit of its word is claimed). A glean batch's allocations from slabs
    /// with scattered free blocks had made one fence per slab or less. Stops
    /// early, without error, when the table is three quarters full, a class
    /// has `MAX_SPARE` spares, or no slab is left (`alloc` then works as
    /// usual). Entries for words nobody claims go at a trim like any other.
    /// Other strategies: nothing to do (`wants` is not even iterated).
    pub fn reserve(&mut self, wants: impl IntoIterator<Item = (u64, u64)>) -> Result<()> {
        let inner = &*self.heap.inner;
        let region = &inner.region;
        if region.strategy() != Strategy::Msync {
            return Ok(());
        }
        let mut need = [0u64; CLASSES.len()];
        for (size, n) in wants {
            if let Some(c) = class_of(size) {
                need[c] += n;
            }
        }
        let mut stored = false;
        let mut full = false;
        for (class, &n) in need.iter().enumerate() {
            let mut want = n.saturating_sub(u64::from(self.claimed[class].count_ones()));
            let words = slab_blocks(class).div_ceil(64);
            let mut k = 0;
            while want > 0 && !full {
                // The current slab, the spares in the order they will serve,
                // then new spares.
                let slab = if k == 0 && self.cur[class].is_some() {
                    self.cur[class]
                } else {
                    let j = k - usize::from(self.cur[class].is_some());
                    match self.spare[class].get(j) {
                        Some(&s) => Some(s),
                        None if self.spare[class].len() < MAX_SPARE => {
                            match take_slab(inner, class) {
                                Ok(s) => {
                                    self.spare[class].push_back(s);
                                    Some(s)
                                }
                                Err(_) => None,
                            }
                        }
                        None => None,
                    }
                };
                let Some(slab) = slab else {
                    break;
                };
                k += 1;
                for w in 0..words {
                    let free = inner.alloc.free_in_word(region, slab, class, w);
                    if free == 0 {
                        continue;
                    }
                    let key = word_entry(slab, w);
                    if self.apt.lookup(key).is_none() {
                        if self.apt.free.len() <= self.apt.entries.len() / 4 {
                            full = true;
                            break;
                        }
                        let Some(i) = self.apt.free.pop() else {
                            full = true;
                            break;
                        };
                        self.apt.put(region, i, key, self.apt.op);
                        stored = true;
                    }
                    want = want.saturating_sub(u64::from(free));
                    if want == 0 {
                        break;
                    }
                }
            }
        }
        if stored {
            region.fence();
        }
        Ok(())
    }

    /// Allocates `size` bytes (16-byte aligned). The contents are unspecified. The
    /// caller initialises the block and makes it durable (flush + fence) before
    /// linking it anywhere, and ends the operation (`end_op`) once it is linked.
    pub fn alloc(&mut self, size: u64) -> Result<PPtr<u8>> {
        let r = self.alloc_inner(size);
        if let Err(e) = &r {
            if e.is_full() {
                let until = short_clock() + SHORT_FOR.as_millis() as u64;
                self.heap
                    .inner
                    .short_until
                    .fetch_max(until, Ordering::Relaxed);
            }
        }
        r
    }

    fn alloc_inner(&mut self, size: u64) -> Result<PPtr<u8>> {
        let inner = &*self.heap.inner;
        let region = &inner.region;
        if let Some(class) = class_of(size) {
            loop {
                if let Some(slab) = self.cur[class] {
                    if self.claimed[class] == 0 {
                        let Some(w) =
                            inner
                                .alloc
                                .next_free_word(region, slab, class, self.cursor[class])
                        else {
                            inner.alloc.detach(region, slab, class);
                            self.cur[class] = None;
                            self.cur_apt[class] = None;
                            continue;
                        };
                        // The word is covered, durably, before any of its bits is set.
                        let held = held_words(&self.cur, &self.cursor, &self.claimed);
                        if region.strategy() == Strategy::Msync
                            && self.apt.lookup(word_entry(slab, w)).is_none()
                        {
                            self.apt.cover_ahead(inner, slab, class, w);
                        }
                        let i = self.apt.ensure(inner, &held, word_entry(slab, w), true)?;
                        self.cur_apt[class] = Some((self.apt.epoch, i));
                        self.cursor[class] = w;
                        let got = inner.alloc.claim_at(region, slab, class, w);
                        self.claimed[class] = got;
                        self.ncached += got.count_ones() as u64;
                        if got == 0 {
                            continue;
                        }
                    } else {
                        match self.cur_apt[class] {
                            Some((ep, i)) if ep == self.apt.epoch => {
                                self.apt.entries[i].last_alloc_op = self.apt.op;
                            }
                            _ => {
                                let held = held_words(&self.cur, &self.cursor, &self.claimed);
                                let key = word_entry(slab, self.cursor[class]);
                                let i = self.apt.ensure(inner, &held, key, true)?;
                                self.cur_apt[class] = Some((self.apt.epoch, i));
                            }
                        }
                    }
                    let c = &mut self.claimed[class];
                    let bit = c.trailing_zeros() as u64;
                    *c &= *c - 1;
                    self.ncached -= 1;
                    self.cached.store(self.ncached, Ordering::Relaxed);
                    let off = inner.alloc.block_at(slab, class, self.cursor[class], bit);
                    return Ok(PPtr::from_raw(off));
                }
                let slab = match self.spare[class].pop_front() {
                    Some(s) => s,
                    None => take_slab(inner, class)?,
                };
                self.cur[class] = Some(slab);
                self.cursor[class] = 0;
                self.claimed[class] = 0;
                self.cur_apt[class] = None;
            }
        }
        let held = held_words(&self.cur, &self.cursor, &self.claimed);
        let apt = &mut self.apt;
        let mut before = |page: u64| apt.ensure(inner, &held, page, true).map(|_| ());
        let off = if size <= (inner.alloc.geometry().chunk_pages - 1) * PAGE {
            inner.alloc.alloc_run(region, size, &mut before)?
        } else {
            inner.alloc.alloc_huge(region, size, &mut before)?
        };
        Ok(PPtr::from_raw(off))
    }

    /// Allocates and zeroes `size` bytes (zeroes flushed, not fenced).
    pub fn alloc_zeroed(&mut self, size: u64) -> Result<PPtr<u8>> {
        let p = self.alloc(size)?;
        let r = self.region();
        r.fill(p.offset(), size as usize, 0);
        r.flush(p.offset(), size as usize);
        Ok(p)
    }

    /// Announces that the block at `p` is about to be unlinked: its page becomes
    /// durably covered by this slot's active page table, and stays so until the
    /// ticket is redeemed.
    pub fn prepare_free(&mut self, p: PPtr<u8>) -> Result<FreeTicket> {
        self.prepare(p, Unfenced::Nothing)
    }

    /// [`Self::prepare_free`] without its fence: a new entry (block or word) is
    /// flushed only, so the caller must fence before it stores the unlink (or
    /// swap) that the ticket covers. For writers that prepare many unlinks and
    /// fence once (under msync a fence per word entry was a device flush each).
    pub fn prepare_free_unfenced(&mut self, p: PPtr<u8>) -> Result<FreeTicket> {
        self.prepare(p, Unfenced::Entries)
    }

    /// [`Self::prepare_free`] inside a transaction: a new block entry is flushed,
    /// not fenced (the commit fences before its commit record); a new word
    /// entry is persisted as in `prepare_free` (no such fence covers it).
    pub(crate) fn prepare_free_in_tx(&mut self, p: PPtr<u8>) -> Result<FreeTicket> {
        self.prepare(p, Unfenced::BlockEntries)
    }

    /// Frees blocks of this thread's committed transaction (unlinks durable).
    /// Blocks with block entries of this table have their bits cleared and flushed;
    /// the entries go after the thread's next fence (its next commit), so a free
    /// costs no fence of its own. Other tickets are redeemed as usual.
    pub(crate) fn redeem_own(&mut self, ts: Vec<FreeTicket>) -> Result<()> {
        let inner = &*self.heap.inner;
        let region = &inner.region;
        let (base, n) = (self.apt.base, self.apt.entries.len() as u64);
        let mut rest = Vec::new();
        let mut first_err = None;
        for t in ts {
            let own = t.apt >= base && t.apt < base + 8 * n;
            if !own {
                rest.push(t);
                continue;
            }
            let (off, apt) = take_ticket(t);
            match inner.alloc.locate(region, off) {
                Ok(loc) => {
                    if let Err(e) = inner.alloc.free_loc(region, &loc, off) {
                        first_err.get_or_insert(e);
                    }
                    inner.alloc.flush_bit(region, &loc);
                }
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
            self.apt.after_fence.push(((apt - base) / 8) as usize);
        }
        if !rest.is_empty() {
            if let Err(e) = self.heap.free_tickets(rest) {
                first_err.get_or_insert(e);
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    /// The caller (a transaction's commit) has just fenced.
    pub(crate) fn fenced(&mut self) {
        if !self.apt.after_fence.is_empty() {
            self.apt.fenced(&self.heap.inner.region);
        }
    }

    fn prepare(&mut self, p: PPtr<u8>, unfenced: Unfenced) -> Result<FreeTicket> {
        let inner = &*self.heap.inner;
        let loc = inner.alloc.locate(&inner.region, p.offset())?;
        if !inner.alloc.is_allocated(&inner.region, &loc) {
            return Err(Error::DoubleFree(p.offset()));
        }
        let key = cover_key(inner, &loc);
        // A slab block whose word is not covered yet, once the table has its share
        // of word entries for frees, gets an entry of its own, so that recovery
        // checks this block, not its neighbours (frees of scattered blocks would
        // otherwise cover many words).
        let covered = self.apt.lookup(key).is_some();
        if !covered
            && matches!(loc.kind, BlockKind::Slab { .. })
            && self.apt.free_words >= FREE_WORDS
        {
            let fence = unfenced == Unfenced::Nothing;
            if let Some(apt) = self.apt.add_block(&inner.region, p.offset(), fence) {
                return Ok(FreeTicket {
                    off: p.offset(),
                    apt,
                });
            }
        }
        if !covered {
            // Not on the hot path (a covered key skips this and its allocation).
            let held = held_words(&self.cur, &self.cursor, &self.claimed);
            self.apt.ensure_with(inner, &held, key, false, true)?;
        }
        inner.alloc.pend(&loc, true);
        Ok(FreeTicket {
            off: p.offset(),
            apt: 0,
        })
    }

    /// Frees a block now. The block must not be durably reachable from any
    /// persistent structure (or its unlink must not yet be durable). A small block
    /// costs no flush and no fence (its page is covered by the active page table);
    /// a page run or huge block is freed durably (flush + fence).
    pub fn free(&mut self, p: PPtr<u8>) -> Result<()> {
        let inner = &*self.heap.inner;
        let region = &inner.region;
        let loc = inner.alloc.locate(region, p.offset())?;
        let key = cover_key(inner, &loc);
        if self.apt.lookup(key).is_none() {
            // Not on the hot path (a covered key skips this and its allocation).
            let held = held_words(&self.cur, &self.cursor, &self.claimed);
            self.apt.ensure(inner, &held, key, false)?;
        }
        inner.alloc.free_loc(region, &loc, p.offset())?;
        if !matches!(loc.kind, BlockKind::Slab { .. }) {
            region.fence();
        }
        Ok(())
    }

    /// Number of entries in this slot's active page table.
    pub fn active_page_count(&self) -> usize {
        self.apt.index.len()
    }

    /// Usable size of the block (tests, tools).
    pub fn block_size(&self, p: PPtr<u8>) -> Result<u64> {
        self.heap.usable_size(p)
    }
}

impl Drop for ThreadHeap {
    fn drop(&mut self) {
        let inner = &*self.heap.inner;
        for class in 0..self.cur.len() {
            if let Some(slab) = self.cur[class].take() {
                let claimed = std::mem::take(&mut self.claimed[class]);
                inner
                    .alloc
                    .unclaim(&inner.region, slab, self.cursor[class], claimed);
                inner.alloc.release_owned(slab, class);
            }
            for slab in std::mem::take(&mut self.spare[class]) {
                inner.alloc.release_owned(slab, class);
            }
        }
        // The handle's operations are over: its entries go now (bitmaps made
        // durable first) rather than stay until the slot's next handle.
        self.apt.op += 1;
        self.apt.trim(inner, &[]);
        inner
            .caches
            .lock()
            .unwrap()
            .retain(|c| !Arc::ptr_eq(c, &self.cached));
        inner.slots.lock().unwrap()[self.slot] = false;
    }
}
