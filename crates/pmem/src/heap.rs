//! The public heap: a region plus its allocator, thread slots and recovery.

use crate::alloc::{AllocStats, Allocator, BlockKind, Covered};
use crate::error::{Error, Result};
use crate::layout::*;
use crate::persist::{Persister, Strategy};
use crate::pptr::PPtr;
use crate::region::{Access, CreateParams, Region};
use crate::sim::CrashSim;
use crate::tx;
use std::collections::{BTreeSet, HashMap, VecDeque};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Options for creating or opening a heap.
#[derive(Clone, Debug)]
pub struct HeapOptions {
    /// Size of a new heap in bytes (rounded up to whole chunks). Default 1 GiB.
    pub size: u64,
    /// Automatic growth limit in bytes; the heap grows online (doubling) up to this
    /// when an allocation does not fit. 0 = no automatic growth.
    pub max_size: u64,
    /// Virtual address space reserved at open, the most the heap can grow to in this
    /// process without reopening. 0 = max(64 GiB, max_size, 2 x size).
    pub reserve: u64,
    /// Format parameters of a new heap.
    pub geometry: Geometry,
    /// Persistence strategy.
    pub strategy: Strategy,
    /// Emulated extra latency per fence, in ns (0 = none; always reported).
    pub fence_ns: u64,
    /// Emulated extra latency per node an index reads while searching, in ns
    /// (0 = none): the papers' "persistent memory reads cost more than DRAM"
    /// setting. Only structures in the heap pay it (a DRAM frontend does not).
    pub read_ns: u64,
}

impl Default for HeapOptions {
    fn default() -> Self {
        Self {
            size: GIB,
            max_size: 0,
            reserve: 0,
            geometry: Geometry::default(),
            strategy: Strategy::detect(),
            fence_ns: 0,
            read_ns: 0,
        }
    }
}

impl HeapOptions {
    fn reserve_len(&self, size: u64) -> u64 {
        if self.reserve != 0 {
            self.reserve.max(size)
        } else {
            (64 * GIB).max(self.max_size).max(size.saturating_mul(2))
        }
    }

    /// Refuses options that cannot work: a strategy this CPU lacks (it would execute
    /// an unsupported instruction), no persistence on a writable heap, sizes beyond
    /// the address space.
    pub fn validate(&self) -> Result<()> {
        if !self.strategy.supported() {
            return Err(Error::StrategyUnsupported(self.strategy.name()));
        }
        if self.strategy == Strategy::None {
            return Err(Error::InvalidOptions(
                "persistence strategy 'none' is only for check-only views".into(),
            ));
        }
        const LIMIT: u64 = 1 << 46; // 64 TiB: well inside a 47-bit user address space
        for (what, v) in [
            ("size", self.size),
            ("max_size", self.max_size),
            ("reserve", self.reserve),
        ] {
            if v > LIMIT {
                return Err(Error::InvalidOptions(format!(
                    "{what} {v} exceeds {LIMIT} bytes"
                )));
            }
        }
        self.geometry.validate().map_err(Error::InvalidOptions)
    }
}

pub(crate) struct HeapInner {
    pub region: Region,
    pub alloc: Allocator,
    slots: Mutex<Vec<bool>>,
    recovering: std::sync::atomic::AtomicBool,
    /// Per live thread handle: blocks claimed from its slabs and not yet handed out.
    caches: Mutex<Vec<Arc<AtomicU64>>>,
    /// Until when (ms on `short_clock`) the heap counts as short of space: an
    /// allocation failed for lack of room less than `SHORT_FOR` ago.
    short_until: AtomicU64,
}

/// How long after a failed allocation the heap counts as short of space.
const SHORT_FOR: std::time::Duration = std::time::Duration::from_secs(2);

/// Milliseconds since the first call (a monotonic clock for `short_until`).
fn short_clock() -> u64 {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    START
        .get_or_init(std::time::Instant::now)
        .elapsed()
        .as_millis() as u64
}

impl HeapInner {
    pub(crate) fn region_ref(&self) -> &Region {
        &self.region
    }
}

impl Drop for HeapInner {
    fn drop(&mut self) {
        if self.region.access() == Access::ReadWrite && !*self.recovering.get_mut() {
            self.close_tables();
            let _ = self.region.update_superblock(|sb| sb.clean = true);
        }
    }
}

impl HeapInner {
    /// Clean shutdown: make the bitmaps covered by every active page table durable,
    /// then clear the tables, so that the next open has nothing to recompute. Entries
    /// whose pages still have free tickets outstanding (dropped tickets) stay, and
    /// the next recovery frees those blocks if they are unreachable.
    fn close_tables(&self) {
        let region = &self.region;
        let geo = region.geometry();
        let mut clear = Vec::new();
        for s in 0..geo.nslots as usize {
            for i in 0..geo.apt_entries {
                let off = geo.apt_off(s) + 8 * i;
                let e = region.atomic_u64(off).load(Ordering::Acquire);
                if e == 0 {
                    continue;
                }
                let mut pending = 0;
                for c in self.alloc.covered(region, e) {
                    pending += self.alloc.pending_of(region, &c);
                    flush_covered(self, &c);
                }
                if pending == 0 {
                    clear.push(off);
                }
            }
        }
        region.fence();
        for off in clear {
            region.atomic_u64(off).store(0, Ordering::Release);
            region.flush(off, 8);
        }
        region.fence();
    }
}

/// A persistent heap. Cheap to clone (shared handle).
#[derive(Clone)]
pub struct Heap {
    pub(crate) inner: Arc<HeapInner>,
}

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
    heap: Heap,
    report: RecoveryReport,
    started: std::time::Instant,
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

impl Heap {
    /// Creates a new heap file.
    pub fn create(path: &Path, opts: &HeapOptions) -> Result<Heap> {
        opts.validate()?;
        let region = Region::create(
            path,
            &CreateParams {
                size: opts.size,
                geometry: opts.geometry,
            },
            opts.reserve_len(opts.size),
            Persister::new(opts.strategy, opts.fence_ns).with_read_ns(opts.read_ns),
        )?;
        Ok(Self::assemble(region, opts, false))
    }

    /// Opens an existing heap for reading and writing: replays committed
    /// transactions and returns the [`Recovery`] step for the leak sweep.
    pub fn open(path: &Path, opts: &HeapOptions) -> Result<Recovery> {
        opts.validate()?;
        Self::open_with(path, opts, Access::ReadWrite, None)
    }

    /// Opens a private copy-on-write view for checking: recovery runs in memory, the
    /// file is never written.
    pub fn open_check(path: &Path) -> Result<Recovery> {
        let opts = HeapOptions {
            strategy: Strategy::None,
            ..Default::default()
        };
        Self::open_with(path, &opts, Access::CheckOnly, None)
    }

    /// Opens a heap with a crash simulator attached (tests). The power-loss
    /// simulator ([`CrashSim::power_loss`]) models the msync strategy only.
    /// A simulator copies lines and pages while other threads may be writing
    /// them, a data race the access protocol otherwise excludes (`region.rs`,
    /// "Concurrent access"): for tests, never for a production heap.
    pub fn open_sim(path: &Path, opts: &HeapOptions, sim: Arc<CrashSim>) -> Result<Recovery> {
        if sim.is_power_loss() && opts.strategy != Strategy::Msync {
            return Err(Error::InvalidOptions(
                "the power-loss simulator models the msync strategy".into(),
            ));
        }
        Self::open_with(path, opts, Access::ReadWrite, Some(sim))
    }

    fn open_with(
        path: &Path,
        opts: &HeapOptions,
        access: Access,
        sim: Option<Arc<CrashSim>>,
    ) -> Result<Recovery> {
        let started = std::time::Instant::now();
        let mut region = Region::open(
            path,
            access,
            opts.reserve_len(0),
            Persister::new(opts.strategy, opts.fence_ns).with_read_ns(opts.read_ns),
        )?;
        if let Some(sim) = sim {
            region.attach_sim(sim);
        }
        let was_clean = region.opened_clean();
        let heap = Self::assemble(region, opts, true);
        let txs_replayed = tx::recover_all(&heap)?;
        Ok(Recovery {
            heap,
            report: RecoveryReport {
                was_clean,
                txs_replayed,
                ..Default::default()
            },
            started,
        })
    }

    /// Creates the heap if the file does not exist, otherwise opens it.
    pub fn open_or_create(path: &Path, opts: &HeapOptions) -> Result<Recovery> {
        if path.exists() {
            Self::open(path, opts)
        } else {
            let h = Self::create(path, opts)?;
            h.inner.recovering.store(true, Ordering::Release);
            Ok(Recovery {
                heap: h,
                report: RecoveryReport {
                    was_clean: true,
                    ..Default::default()
                },
                started: std::time::Instant::now(),
            })
        }
    }

    fn assemble(region: Region, opts: &HeapOptions, recovering: bool) -> Heap {
        let max = if opts.max_size == 0 {
            region.size()
        } else {
            opts.max_size
        };
        let alloc = Allocator::new(&region, max);
        let nslots = region.geometry().nslots as usize;
        Heap {
            inner: Arc::new(HeapInner {
                region,
                alloc,
                slots: Mutex::new(vec![false; nslots]),
                recovering: std::sync::atomic::AtomicBool::new(recovering),
                caches: Mutex::new(Vec::new()),
                short_until: AtomicU64::new(0),
            }),
        }
    }

    /// Whether an allocation failed for lack of room (`Error::is_full`) in the
    /// last two seconds. Structures that free blocks after a grace period free
    /// them without delay then (the index's retired blocks: `index::reclaim`),
    /// so that a writer retrying finds the room removes made.
    pub fn short_of_space(&self) -> bool {
        short_clock() < self.inner.short_until.load(Ordering::Relaxed)
    }

    /// The mapped region (all raw reads, writes, flushes and fences).
    pub fn region(&self) -> &Region {
        &self.inner.region
    }

    pub fn root(&self) -> PPtr<u8> {
        PPtr::from_raw(self.inner.region.superblock().root)
    }

    /// Sets the root pointer (durably, through the superblock).
    pub fn set_root(&self, root: PPtr<u8>) -> Result<()> {
        if self.inner.region.access() != Access::ReadWrite {
            return Err(Error::ReadOnly);
        }
        self.inner
            .region
            .update_superblock(|sb| sb.root = root.raw())
    }

    /// Claims a thread slot: the handle through which a thread allocates, frees and
    /// runs transactions. Slots are released when the handle drops.
    pub fn thread(&self) -> Result<ThreadHeap> {
        if self.inner.recovering.load(Ordering::Acquire) {
            return Err(Error::InvalidOptions(
                "heap is still recovering: call Recovery::finish first".into(),
            ));
        }
        if self.inner.region.access() != Access::ReadWrite {
            return Err(Error::ReadOnly);
        }
        let slot = {
            let mut s = self.inner.slots.lock().unwrap();
            let n = s.len();
            let i = s.iter().position(|b| !b).ok_or(Error::NoThreadSlot(n))?;
            s[i] = true;
            i
        };
        Ok(ThreadHeap::new(self.clone(), slot))
    }

    /// Usable size of an allocated block.
    pub fn usable_size(&self, p: PPtr<u8>) -> Result<u64> {
        let loc = self.inner.alloc.locate(&self.inner.region, p.offset())?;
        Ok(self.inner.alloc.usable(&loc))
    }

    /// Whether `p` is the start of a currently allocated block.
    pub fn is_allocated(&self, p: PPtr<u8>) -> bool {
        match self.inner.alloc.locate(&self.inner.region, p.offset()) {
            Ok(loc) => self.inner.alloc.is_allocated(&self.inner.region, &loc),
            Err(_) => false,
        }
    }

    /// Frees a block whose unlink was announced with [`ThreadHeap::prepare_free`]
    /// (from any thread, e.g. an epoch-reclamation callback).
    pub fn free_ticket(&self, t: FreeTicket) -> Result<()> {
        self.free_tickets(std::iter::once(t))
    }

    /// Frees a batch of announced blocks. A small block whose ticket has a page
    /// entry costs no flush and no fence (the page stays covered until the ticket is
    /// redeemed); one with a block entry has its bitmap word flushed, and its entry
    /// cleared after the batch's fence; page runs and huge blocks are freed durably
    /// with that one fence.
    pub fn free_tickets(&self, ts: impl IntoIterator<Item = FreeTicket>) -> Result<()> {
        let inner = &*self.inner;
        let region = &inner.region;
        let mut first_err = None;
        let mut large = Vec::new();
        let mut entries: Vec<u64> = Vec::new();
        for t in ts {
            let (off, apt) = take_ticket(t);
            match inner.alloc.locate(region, off) {
                Ok(loc) => {
                    if let Err(e) = inner.alloc.free_loc(region, &loc, off) {
                        first_err.get_or_insert(e);
                    }
                    if apt != 0 {
                        // Its block entry goes once the cleared bit is durable.
                        inner.alloc.flush_bit(region, &loc);
                        entries.push(apt);
                    } else if matches!(loc.kind, BlockKind::Slab { .. }) {
                        inner.alloc.pend(&loc, false);
                    } else {
                        large.push(loc);
                    }
                }
                Err(e) => {
                    first_err.get_or_insert(e);
                    if apt != 0 {
                        entries.push(apt);
                    }
                }
            }
        }
        if !large.is_empty() || !entries.is_empty() {
            region.fence();
            for loc in large {
                inner.alloc.pend(&loc, false);
            }
            // Cleared, not fenced: an entry that outlives a crash only costs
            // recovery one reachability check. The owner reuses it once it reads 0.
            for a in entries {
                region.atomic_u64(a).store(0, Ordering::Release);
                region.flush(a, 8);
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    /// Withdraws a ticket without freeing (an aborted transaction's free).
    pub fn cancel_ticket(&self, t: FreeTicket) {
        let (off, apt) = take_ticket(t);
        if apt != 0 {
            // The block stays allocated and linked: its entry can go.
            let region = &self.inner.region;
            region.atomic_u64(apt).store(0, Ordering::Release);
            region.flush(apt, 8);
            return;
        }
        if let Ok(loc) = self.inner.alloc.locate(&self.inner.region, off) {
            self.inner.alloc.pend(&loc, false);
        }
    }

    /// Blocks that live thread handles have claimed from their slabs but not yet
    /// handed out (their bits are set; they are nobody's yet).
    pub fn cached_blocks(&self) -> u64 {
        self.inner
            .caches
            .lock()
            .unwrap()
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .sum()
    }

    /// Grows the heap to at least `size` bytes, online.
    pub fn grow(&self, size: u64) -> Result<()> {
        self.inner.alloc.grow_to(&self.inner.region, size)
    }

    pub fn alloc_stats(&self) -> AllocStats {
        self.inner.alloc.stats()
    }

    /// Distinct nonzero APT entries of all slots.
    pub fn active_pages(&self) -> Vec<u64> {
        let region = &self.inner.region;
        let geo = region.geometry();
        let mut set = BTreeSet::new();
        for s in 0..geo.nslots as usize {
            let base = geo.apt_off(s);
            for i in 0..geo.apt_entries {
                let v = region.atomic_u64(base + 8 * i).load(Ordering::Acquire);
                if v != 0 {
                    set.insert(v);
                }
            }
        }
        set.into_iter().collect()
    }
}

/// A promise to free one block, made before the block is unlinked (so that the
/// block is covered by an active page table until it is freed: by a block entry of
/// its own, or by its page's entry). Redeem it with [`Heap::free_tickets`] from any
/// thread once no reader can reach the block. Dropping a ticket unredeemed leaves
/// the block allocated (and covered) until the next recovery, which frees it if it
/// is unreachable.
#[derive(Debug)]
pub struct FreeTicket {
    pub(crate) off: u64,
    /// Offset of the block entry in the preparing slot's APT (0: a page entry
    /// covers the block, and the slab's pending count holds the ticket).
    pub(crate) apt: u64,
}

/// Consumes a ticket: (block, block entry or 0). Redeeming or cancelling it is
/// what clears its block entry or adjusts the page's pending count.
fn take_ticket(t: FreeTicket) -> (u64, u64) {
    (t.off, t.apt)
}

impl FreeTicket {
    pub fn ptr(&self) -> PPtr<u8> {
        PPtr::from_raw(self.off)
    }
}

/// Flushes the bitmap lines a covered item's entry answers for (no fence).
fn flush_covered(inner: &HeapInner, c: &Covered) {
    match *c {
        Covered::Slab { chunk, head, class } => {
            inner.alloc.flush_bitmap(&inner.region, chunk, head, class)
        }
        Covered::Word {
            chunk, head, word, ..
        } => inner.alloc.flush_word(&inner.region, chunk, head, word),
        Covered::Block(_) | Covered::Slot { .. } => {}
    }
}

/// The APT entry for word `w` of the slab headed at page offset `page`.
#[inline]
fn word_entry(page: u64, w: u64) -> u64 {
    page | APT_WORD_FLAG | (w << APT_WORD_SHIFT)
}

/// The entry that covers a located block: its slab word's, or its page's (runs
/// and huge blocks).
fn cover_key(inner: &HeapInner, loc: &crate::alloc::Loc) -> u64 {
    let page = inner.alloc.apt_page(loc);
    match loc.kind {
        BlockKind::Slab { index, .. } => word_entry(page, index / 64),
        _ => page,
    }
}

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
struct AptVol {
    entry: u64,
    last_alloc_op: u64,
    /// A page or word entry made for a free (counted in `Apt::free_words`).
    for_free: bool,
}

/// One slot's active page table: the persistent entries and their volatile mirror.
struct Apt {
    slot: usize,
    base: u64,
    geo: Geometry,
    entries: Vec<AptVol>,
    index: HashMap<u64, usize>,
    free: Vec<usize>,
    /// NV-epoch: bumped by `end_op`.
    op: u64,
    /// Bumped whenever an entry is removed or replaced: cached indices of an older
    /// epoch must be looked up again.
    epoch: u64,
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
    free_words: usize,
    /// Own block entries whose blocks this table's thread freed (bit cleared and
    /// flushed): they go after the thread's next fence.
    after_fence: Vec<usize>,
}

/// Word entries a table makes for frees before further frees in uncovered words
/// get block entries: a word entry serves every later free in its 64 blocks (frees
/// near one another, as in a small hot table, cost no new entry), a block entry
/// serves one but costs recovery one check instead of 64 (scattered frees).
const FREE_WORDS: usize = 8;

const HOT: usize = 16;

impl Apt {
    fn load(region: &Region, slot: usize) -> Apt {
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
    fn add_block(&mut self, region: &Region, off: u64, fence: bool) -> Option<u64> {
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
    fn fenced(&mut self, region: &Region) {
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
    fn lookup(&mut self, key: u64) -> Option<usize> {
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
    fn ensure(
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
    fn ensure_with(
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
    fn put(&mut self, region: &Region, i: usize, entry: u64, last_alloc_op: u64) {
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
    fn cover_ahead(&mut self, inner: &HeapInner, slab: u64, class: usize, w: u64) {
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
    fn trim(&mut self, inner: &HeapInner, current: &[(u64, u64)]) {
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
    fn new(heap: Heap, slot: usize) -> Self {
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
