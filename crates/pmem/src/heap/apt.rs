//! A thread slot's active page table (APT): the persistent entries naming the
//! pages, chunks, slab words and blocks whose allocation state recovery must
//! recompute, and their volatile mirror.

use super::{flush_covered, HeapInner};
use crate::alloc::{BlockKind, Covered};
use crate::error::{Error, Result};
use crate::layout::*;
use crate::region::Region;
use std::collections::HashMap;
use std::sync::atomic::Ordering;

/// The APT entry for word `w` of the slab headed at page offset `page`.
#[inline]
pub(super) fn word_entry(page: u64, w: u64) -> u64 {
    page | APT_WORD_FLAG | (w << APT_WORD_SHIFT)
}

/// The entry that covers a located block: its slab word's, or its page's (runs
/// and huge blocks).
pub(super) fn cover_key(inner: &HeapInner, loc: &crate::alloc::Loc) -> u64 {
    let page = inner.alloc.apt_page(loc);
    match loc.kind {
        BlockKind::Slab { index, .. } => word_entry(page, index / 64),
        _ => page,
    }
}

/// Low bit of an APT entry: the entry covers its whole chunk (the value is the
/// chunk's offset plus this flag), not one page.
pub const APT_CHUNK_FLAG: u64 = 1;

fn apt_chunk_entry(geo: &Geometry, page: u64) -> u64 {
    let c = (page - geo.header_size()) / geo.chunk_size();
    geo.chunk_off(c) | APT_CHUNK_FLAG
}

/// Entries kept before the table trims itself eagerly (bounds recovery work).
const APT_SOFT_LIMIT: usize = 8;

/// Words covered ahead of the one an allocation claims (msync only; see
/// `Apt::cover_ahead`, which leaves a quarter of the table free).
const AHEAD_WORDS: u64 = 7;

#[derive(Clone, Copy)]
pub(super) struct AptVol {
    entry: u64,
    pub(super) last_alloc_op: u64,
    /// A page or word entry made for a free (counted in `Apt::free_words`).
    for_free: bool,
}

/// One slot's active page table: the persistent entries and their volatile mirror.
pub(super) struct Apt {
    slot: usize,
    pub(super) base: u64,
    geo: Geometry,
    pub(super) entries: Vec<AptVol>,
    pub(super) index: HashMap<u64, usize>,
    pub(super) free: Vec<usize>,
    /// NV-epoch: bumped by `end_op`.
    pub(super) op: u64,
    /// Bumped whenever an entry is removed or replaced: cached indices of an older
    /// epoch must be looked up again.
    pub(super) epoch: u64,
    /// Direct-mapped cache in front of `index`: (page, entry index, epoch).
    hot: [(u64, usize, u64); HOT],
    /// Entries left by the last trim: the next eager trim waits until the table
    /// has grown past twice this (entries that cannot go are not rescanned on
    /// every miss).
    trim_floor: usize,
    /// Block entries in the table (free tickets' own; not in `index`). Whoever
    /// redeems the ticket zeroes the entry; this table reuses it once it reads 0.
    blocks: usize,
    /// Page and word entries made for frees (see `FREE_WORDS`).
    pub(super) free_words: usize,
    /// Own block entries whose blocks this table's thread freed (bit cleared and
    /// flushed): they go after the thread's next fence.
    pub(super) after_fence: Vec<usize>,
}

/// Word entries a table makes for frees before further frees in uncovered words
/// get block entries: a word entry serves every later free in its 64 blocks (frees
/// near one another, as in a small hot table, cost no new entry), a block entry
/// serves one but costs recovery one check instead of 64 (scattered frees).
pub(super) const FREE_WORDS: usize = 8;

const HOT: usize = 16;

impl Apt {
    pub(super) fn load(region: &Region, slot: usize) -> Apt {
        let geo = region.geometry();
        let base = geo.apt_off(slot);
        let mut entries = Vec::with_capacity(geo.apt_entries as usize);
        let mut index = HashMap::new();
        let mut free = Vec::new();
        let mut blocks = 0;
        for i in 0..geo.apt_entries as usize {
            let v = region
                .atomic_u64(base + 8 * i as u64)
                .load(Ordering::Acquire);
            // Inherited from a previous handle of this slot: treated as allocated
            // from in the current operation (kept until this handle ends one).
            entries.push(AptVol {
                entry: v,
                last_alloc_op: 1,
                for_free: false,
            });
            if v == 0 {
                free.push(i);
            } else if v & APT_BLOCK_FLAG != 0 {
                blocks += 1;
            } else {
                index.insert(v, i);
            }
        }
        free.reverse();
        Apt {
            slot,
            base,
            geo,
            entries,
            index,
            free,
            op: 1,
            epoch: 1,
            hot: [(0, 0, 0); HOT],
            trim_floor: 0,
            blocks,
            free_words: 0,
            after_fence: Vec::new(),
        }
    }

    /// Block entries allowed at once: half the table, so that page entries always
    /// have room (tickets beyond fall back to page entries).
    fn block_cap(&self) -> usize {
        self.entries.len() / 2
    }

    /// Covers the slab block at `off` by an entry of its own, durably (flush +
    /// fence). Returns the entry's offset, or None when block entries are at their
    /// cap even after reusing the redeemed ones.
    pub(super) fn add_block(&mut self, region: &Region, off: u64, fence: bool) -> Option<u64> {
        if self.blocks >= self.block_cap() || self.free.is_empty() {
            self.reclaim_blocks(region);
            if self.blocks >= self.block_cap() || self.free.is_empty() {
                return None;
            }
        }
        let i = self.free.pop()?;
        let a = self.base + 8 * i as u64;
        let entry = off | APT_BLOCK_FLAG;
        region.atomic_u64(a).store(entry, Ordering::Release);
        region.flush(a, 8);
        if fence {
            region.fence();
        }
        self.entries[i] = AptVol {
            entry,
            last_alloc_op: 0,
            for_free: false,
        };
        self.blocks += 1;
        Some(a)
    }

    /// After a fence of this thread: the block entries of blocks it freed go.
    pub(super) fn fenced(&mut self, region: &Region) {
        for i in std::mem::take(&mut self.after_fence) {
            let a = self.base + 8 * i as u64;
            region.atomic_u64(a).store(0, Ordering::Release);
            region.flush(a, 8);
            self.entries[i].entry = 0;
            self.free.push(i);
            self.blocks -= 1;
        }
    }

    /// Takes back the block entries whose tickets were redeemed (zeroed).
    fn reclaim_blocks(&mut self, region: &Region) {
        for i in 0..self.entries.len() {
            if self.entries[i].entry & APT_BLOCK_FLAG != 0
                && region
                    .atomic_u64(self.base + 8 * i as u64)
                    .load(Ordering::Acquire)
                    == 0
            {
                self.entries[i].entry = 0;
                self.free.push(i);
                self.blocks -= 1;
            }
        }
    }

    /// The entry covering `key` (a page or word entry's value): the key's own
    /// entry, else its page's (for a word), else its chunk's.
    #[inline]
    pub(super) fn lookup(&mut self, key: u64) -> Option<usize> {
        let h = (((key >> 16) ^ (key >> APT_WORD_SHIFT)) as usize) % HOT;
        let (p, i, ep) = self.hot[h];
        if p == key && ep == self.epoch {
            return Some(i);
        }
        let page = key & !(PAGE - 1);
        let i = self
            .index
            .get(&key)
            .or_else(|| self.index.get(&page))
            .or_else(|| self.index.get(&apt_chunk_entry(&self.geo, page)))
            .copied()?;
        self.hot[h] = (key, i, self.epoch);
        Some(i)
    }

    /// Makes `page` covered by this table, durably: by an entry for the page itself
    /// or for its whole chunk.
    pub(super) fn ensure(
        &mut self,
        inner: &HeapInner,
        current: &[(u64, u64)],
        page: u64,
        alloc: bool,
    ) -> Result<usize> {
        self.ensure_with(inner, current, page, alloc, true)
    }

    /// [`Self::ensure`]; without `fence`, a new entry is flushed only (the
    /// caller fences before anything the entry covers can become durable).
    pub(super) fn ensure_with(
        &mut self,
        inner: &HeapInner,
        current: &[(u64, u64)],
        page: u64,
        alloc: bool,
        fence: bool,
    ) -> Result<usize> {
        if let Some(i) = self.lookup(page) {
            if alloc {
                self.entries[i].last_alloc_op = self.op;
            }
            return Ok(i);
        }
        let eager = self.index.len() >= APT_SOFT_LIMIT.max(2 * self.trim_floor);
        if eager || self.free.is_empty() {
            self.trim(inner, current);
            self.trim_floor = self.index.len();
        }
        if self.free.is_empty() {
            self.reclaim_blocks(&inner.region);
        }
        if self.free.is_empty() {
            self.coalesce(inner);
            if let Some(i) = self.lookup(page) {
                if alloc {
                    self.entries[i].last_alloc_op = self.op;
                }
                return Ok(i);
            }
        }
        let Some(i) = self.free.pop() else {
            return Err(Error::ActivePagesFull(self.slot, self.entries.len()));
        };
        let last = if alloc { self.op } else { 0 };
        if fence {
            self.set(&inner.region, i, page, last);
        } else {
            self.put(&inner.region, i, page, last);
        }
        Ok(i)
    }

    /// Writes entry `i` durably (flush + fence).
    fn set(&mut self, region: &Region, i: usize, entry: u64, last_alloc_op: u64) {
        self.put(region, i, entry, last_alloc_op);
        region.fence();
    }

    /// Writes entry `i` and flushes it, without the fence.
    pub(super) fn put(&mut self, region: &Region, i: usize, entry: u64, last_alloc_op: u64) {
        let off = self.base + 8 * i as u64;
        region.atomic_u64(off).store(entry, Ordering::Release);
        region.flush(off, 8);
        let for_free = last_alloc_op == 0 && entry & APT_CHUNK_FLAG == 0;
        self.free_words += for_free as usize;
        self.entries[i] = AptVol {
            entry,
            last_alloc_op,
            for_free,
        };
        self.index.insert(entry, i);
    }

    /// With the msync strategy, where each fence is a device flush: entries for
    /// the next `AHEAD_WORDS` words of the slab after word `w` (`words` in
    /// all), stored and flushed but not fenced, right before `w`'s own entry is
    /// made durable (`ensure`): that fence makes these durable too, and the
    /// thread's allocations from the next words then cost no fence of their
    /// own (a glean batch's allocations made one `msync` per 64 blocks). An
    /// entry is durable before any bit of its word is claimed, as `ensure`
    /// promises. An entry for a word nobody claims costs recovery one word's
    /// check (nothing there is reachable, so nothing changes) and goes at a
    /// trim like any other. Leaves a quarter of the table's entries free.
    pub(super) fn cover_ahead(&mut self, inner: &HeapInner, slab: u64, class: usize, w: u64) {
        let words = slab_blocks(class).div_ceil(64);
        let mut covered = 0;
        for n in w + 1..words {
            if covered >= AHEAD_WORDS {
                return;
            }
            if inner.alloc.free_in_word(&inner.region, slab, class, n) == 0 {
                continue;
            }
            let key = word_entry(slab, n);
            if self.lookup(key).is_some() {
                continue;
            }
            if self.free.len() <= self.entries.len() / 4 {
                return;
            }
            let Some(i) = self.free.pop() else {
                return;
            };
            self.put(&inner.region, i, key, self.op);
            covered += 1;
        }
    }

    /// Removes entries (no fence needed: a stale entry only costs recovery a page).
    fn clear(&mut self, region: &Region, idxs: &[usize]) {
        for &i in idxs {
            let off = self.base + 8 * i as u64;
            region.atomic_u64(off).store(0, Ordering::Release);
            region.flush(off, 8);
            let e = std::mem::replace(&mut self.entries[i].entry, 0);
            if std::mem::take(&mut self.entries[i].for_free) {
                self.free_words -= 1;
            }
            self.index.remove(&e);
            self.free.push(i);
        }
        if !idxs.is_empty() {
            self.epoch += 1;
        }
    }

    /// Removes the entries whose allocations have ended (no allocation from them in
    /// the current operation) and which have no free tickets outstanding. The
    /// bitmaps they cover are made durable first (flush + one fence): from then on
    /// nothing recomputes them.
    pub(super) fn trim(&mut self, inner: &HeapInner, current: &[(u64, u64)]) {
        let region = &inner.region;
        let mut victims = Vec::new();
        // The page, word and chunk entries (block entries are not in `index`):
        // the work follows the entries in use, not the table's size.
        let mut used: Vec<usize> = self.index.values().copied().collect();
        used.sort_unstable();
        for i in used {
            let a = self.entries[i];
            if a.entry == 0 || a.entry & APT_BLOCK_FLAG != 0 || a.last_alloc_op >= self.op {
                continue;
            }
            let covered = inner.alloc.covered(region, a.entry);
            // This thread's current slabs may hold claimed bits not yet handed
            // out: they must stay covered (recomputed if we crash).
            let holds_current = covered.iter().any(|c| match *c {
                Covered::Slab { chunk, head, .. } => {
                    let slab = inner.alloc.slab_base(chunk, head);
                    current.iter().any(|&(s, _)| s == slab)
                }
                Covered::Word {
                    chunk, head, word, ..
                } => current.contains(&(inner.alloc.slab_base(chunk, head), word)),
                Covered::Block(_) | Covered::Slot { .. } => false,
            });
            if holds_current {
                continue;
            }
            let pending: u32 = covered
                .iter()
                .map(|c| inner.alloc.pending_of(region, c))
                .sum();
            if pending != 0 {
                continue;
            }
            for c in covered {
                flush_covered(inner, &c);
            }
            victims.push(i);
        }
        if !victims.is_empty() || !self.after_fence.is_empty() {
            region.fence();
            self.clear(region, &victims);
            self.fenced(region);
        }
    }

    /// When the table is full of pages with operations in flight (typically free
    /// tickets for blocks scattered over many pages), replaces the page entries of
    /// the chunk with the most of them by one entry for the whole chunk (log-free
    /// paper §5.3: the tracking granularity is a choice). Recovery then covers that
    /// chunk whole. The chunk entry is durable before the page entries go.
    fn coalesce(&mut self, inner: &HeapInner) {
        let mut by_chunk: HashMap<u64, Vec<usize>> = HashMap::new();
        for (i, a) in self.entries.iter().enumerate() {
            if a.entry != 0 && a.entry & (APT_CHUNK_FLAG | APT_BLOCK_FLAG) == 0 {
                by_chunk
                    .entry(apt_chunk_entry(&self.geo, a.entry))
                    .or_default()
                    .push(i);
            }
        }
        let Some((entry, idxs)) = by_chunk.into_iter().max_by_key(|(_, v)| v.len()) else {
            return;
        };
        if idxs.len() < 2 {
            return;
        }
        let last = idxs
            .iter()
            .map(|&i| self.entries[i].last_alloc_op)
            .max()
            .unwrap_or(0);
        let keep = idxs[0];
        let old = self.entries[keep].entry;
        self.index.remove(&old);
        self.set(&inner.region, keep, entry, last);
        self.clear(&inner.region, &idxs[1..]);
        self.epoch += 1;
    }
}
