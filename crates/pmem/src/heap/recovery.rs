//! The step between opening a heap and allocating from it: what recovery found
//! ([`RecoveryReport`]), the slots the layer above may repair, and the leak
//! sweep that ends recovery ([`Recovery::finish`]).

use super::Heap;
use crate::alloc::{BlockKind, Covered};
use crate::error::{Error, Result};
use crate::layout::*;
use crate::pptr::PPtr;
use std::collections::BTreeSet;
use std::sync::atomic::Ordering;

/// What recovery found and did.
#[derive(Clone, Debug, Default)]
pub struct RecoveryReport {
    /// Whether the previous run shut down cleanly.
    pub was_clean: bool,
    /// Committed redo logs replayed.
    pub txs_replayed: u64,
    /// Active pages (APT entries) scanned by the leak sweep.
    pub active_pages: u64,
    /// Allocated blocks found in active pages.
    pub active_blocks: u64,
    /// Unreachable blocks freed by the leak sweep.
    pub leaked_freed: u64,
    /// Reachable blocks whose allocation bit was not durable and was set again.
    pub revived: u64,
    /// Time spent in recovery.
    pub micros: u64,
}

/// A heap that has replayed its committed transactions but not yet swept leaks.
/// Allocation is not possible until [`Recovery::finish`].
pub struct Recovery {
    pub(super) heap: Heap,
    pub(super) report: RecoveryReport,
    pub(super) started: std::time::Instant,
}

impl Recovery {
    /// The heap, for reading (and repairing) persistent structures before the sweep.
    pub fn heap(&self) -> &Heap {
        &self.heap
    }
    pub fn report(&self) -> &RecoveryReport {
        &self.report
    }

    /// The distinct active pages (APT entries) of every thread slot.
    pub fn active_pages(&self) -> Vec<u64> {
        self.heap.active_pages()
    }

    /// Every allocated block covered by an active page table (before recovery
    /// recomputes the bits: informational).
    pub fn active_blocks(&self) -> Vec<PPtr<u8>> {
        let inner = &self.heap.inner;
        let region = &inner.region;
        let set: BTreeSet<u64> = self
            .active_pages()
            .into_iter()
            .flat_map(|e| inner.alloc.covered(region, e))
            .flat_map(|c| inner.alloc.allocated_in(region, &c))
            .collect();
        set.into_iter().map(PPtr::from_raw).collect()
    }

    /// Every block slot the leak sweep will ask about, with its size: each block of
    /// every slab covered by an active page table (allocated or not) and every
    /// covered page-run or huge block. The layer above uses it to repair its
    /// structures (e.g. physically unlink logically deleted nodes) before
    /// [`Recovery::finish`]. Sorted by offset, each slot once.
    pub fn covered_slots(&self) -> Vec<(PPtr<u8>, u64)> {
        let inner = &self.heap.inner;
        let region = &inner.region;
        let mut set = BTreeSet::new();
        for e in self.active_pages() {
            for c in inner.alloc.covered(region, e) {
                match c {
                    Covered::Block(b) => {
                        if let Ok(loc) = inner.alloc.locate(region, b) {
                            set.insert((b, inner.alloc.usable(&loc)));
                        }
                    }
                    Covered::Slab { chunk, head, class } => {
                        let base = inner.alloc.slab_base(chunk, head);
                        let size = CLASSES[class] as u64;
                        for i in 0..slab_blocks(class) {
                            set.insert((base + i * size, size));
                        }
                    }
                    Covered::Slot { class, off, .. } => {
                        set.insert((off, CLASSES[class] as u64));
                    }
                    Covered::Word {
                        chunk,
                        head,
                        class,
                        word,
                    } => {
                        let base = inner.alloc.slab_base(chunk, head);
                        let size = CLASSES[class] as u64;
                        for i in 64 * word..(64 * word + 64).min(slab_blocks(class)) {
                            set.insert((base + i * size, size));
                        }
                    }
                }
            }
        }
        set.into_iter()
            .map(|(b, n)| (PPtr::from_raw(b), n))
            .collect()
    }

    /// The leak sweep (NV-epochs, log-free paper §5.5), then opens the heap for
    /// allocation. `reachable(p)` must say exactly whether a block starting at `p`
    /// is reachable from the layer above's persistent structures; it is asked for
    /// every block slot of every slab covered by an active page table (allocated or
    /// not: small-block allocation bits in covered pages are not made durable per
    /// operation, so recovery sets each to "reachable") and for every page-run or
    /// huge block covered (freed if unreachable). Then the tables are cleared.
    pub fn finish(
        mut self,
        mut reachable: impl FnMut(PPtr<u8>) -> bool,
    ) -> Result<(Heap, RecoveryReport)> {
        let inner = self.heap.inner.clone();
        let region = &inner.region;
        let entries = self.active_pages();
        self.report.active_pages = entries.len() as u64;
        // Two entries may cover the same slab, word or block (a stale page entry
        // next to a chunk entry, a page now inside a run or huge block, a block entry
        // inside a covered word): each is recomputed once, at its widest cover.
        let mut slabs = BTreeSet::new();
        let mut words = BTreeSet::new();
        let mut large = BTreeSet::new();
        let mut slots = BTreeSet::new();
        for c in entries.iter().flat_map(|e| inner.alloc.covered(region, *e)) {
            match c {
                Covered::Slab { chunk, head, class } => {
                    slabs.insert((chunk, head, class));
                }
                Covered::Word {
                    chunk,
                    head,
                    class,
                    word,
                } => {
                    words.insert((chunk, head, class, word));
                }
                Covered::Block(b) => {
                    large.insert(b);
                }
                Covered::Slot { off, .. } => {
                    slots.insert(off);
                }
            }
        }
        let whole: BTreeSet<(u64, u64)> = slabs.iter().map(|&(c, h, _)| (c, h)).collect();
        let in_words: BTreeSet<(u64, u64, u64)> =
            words.iter().map(|&(c, h, _, w)| (c, h, w)).collect();
        let (mut blocks, mut freed, mut revived) = (0, 0, 0);
        let mut tally = |(k, f, r): (u64, u64, u64)| {
            blocks += k + r;
            freed += f;
            revived += r;
        };
        let mut reach = |b: u64| reachable(PPtr::from_raw(b));
        for (chunk, head, class) in slabs {
            tally(
                inner
                    .alloc
                    .recompute_slab(region, chunk, head, class, &mut reach),
            );
        }
        for (chunk, head, class, word) in words {
            if !whole.contains(&(chunk, head)) {
                tally(
                    inner
                        .alloc
                        .recompute_word(region, chunk, head, class, word, &mut reach),
                );
            }
        }
        for off in slots {
            let loc = inner.alloc.locate(region, off)?;
            let BlockKind::Slab { index, .. } = loc.kind else {
                continue;
            };
            if whole.contains(&(loc.chunk, loc.head))
                || in_words.contains(&(loc.chunk, loc.head, index / 64))
            {
                continue;
            }
            tally(inner.alloc.recompute_slot(region, off, reach(off))?);
        }
        for b in large {
            if reach(b) {
                tally((1, 0, 0));
            } else {
                let loc = inner.alloc.locate(region, b)?;
                inner.alloc.free_loc(region, &loc, b)?;
                tally((0, 1, 0));
            }
        }
        region.fence();
        self.report.active_blocks = blocks;
        self.report.leaked_freed = freed;
        self.report.revived = revived;
        // The recomputed state is durable; now forget the active pages.
        let geo = region.geometry();
        for s in 0..geo.nslots as usize {
            let base = geo.apt_off(s);
            for i in 0..geo.apt_entries {
                let a = region.atomic_u64(base + 8 * i);
                if a.load(Ordering::Relaxed) != 0 {
                    a.store(0, Ordering::Relaxed);
                    region.flush(base + 8 * i, 8);
                }
            }
        }
        region.fence();
        inner.recovering.store(false, Ordering::Release);
        self.report.micros = self.started.elapsed().as_micros() as u64;
        Ok((self.heap, self.report))
    }

    /// Finishes recovery of a heap that was shut down cleanly (no active pages to
    /// recompute). After a crash this refuses: use [`Recovery::finish`] with the
    /// layer above's reachability.
    pub fn finish_clean(self) -> Result<(Heap, RecoveryReport)> {
        if !self.active_pages().is_empty() {
            return Err(Error::InvalidOptions(
                "the heap has active pages (it was not shut down cleanly): recovery needs the reachability of its blocks".into(),
            ));
        }
        self.finish(|_| false)
    }
}
