//! The public heap: a region plus its allocator, thread slots and recovery.

use crate::alloc::{AllocStats, Allocator};
use crate::error::{Error, Result};
use crate::layout::*;
use crate::persist::{Persister, Strategy};
use crate::pptr::PPtr;
use crate::region::{Access, CreateParams, Region};
use crate::sim::CrashSim;
use crate::tx;
use std::collections::{BTreeSet, HashMap};
use std::path::Path;
use std::sync::atomic::Ordering;
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
        }
    }
}

impl HeapOptions {
    fn reserve_len(&self, size: u64) -> u64 {
        if self.reserve != 0 {
            self.reserve.max(size)
        } else {
            (64 * GIB).max(self.max_size).max(2 * size)
        }
    }
}

pub(crate) struct HeapInner {
    pub region: Region,
    pub alloc: Allocator,
    slots: Mutex<Vec<bool>>,
    recovering: std::sync::atomic::AtomicBool,
}

impl HeapInner {
    pub(crate) fn region_ref(&self) -> &Region {
        &self.region
    }
}

impl Drop for HeapInner {
    fn drop(&mut self) {
        if self.region.access() == Access::ReadWrite && !*self.recovering.get_mut() {
            let _ = self.region.update_superblock(|sb| sb.clean = true);
        }
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

    /// Every allocated block in an active page: the candidates for the leak sweep.
    pub fn active_blocks(&self) -> Vec<PPtr<u8>> {
        let inner = &self.heap.inner;
        let set: BTreeSet<u64> = self
            .active_pages()
            .into_iter()
            .flat_map(|p| inner.alloc.blocks_of_page(&inner.region, p))
            .collect();
        set.into_iter().map(PPtr::from_raw).collect()
    }

    /// Frees every block in an active page for which `reachable` is false, clears the
    /// active page tables and opens the heap for allocation.
    pub fn finish(
        mut self,
        mut reachable: impl FnMut(PPtr<u8>) -> bool,
    ) -> Result<(Heap, RecoveryReport)> {
        let inner = self.heap.inner.clone();
        let region = &inner.region;
        let pages = self.active_pages();
        self.report.active_pages = pages.len() as u64;
        // Two entries may resolve to one block (a stale entry for a page that is now
        // inside a run or huge block), so collect the distinct blocks first.
        let blocks: BTreeSet<u64> = pages
            .iter()
            .flat_map(|p| inner.alloc.blocks_of_page(region, *p))
            .collect();
        self.report.active_blocks = blocks.len() as u64;
        let mut freed = 0;
        for b in blocks {
            if !reachable(PPtr::from_raw(b)) {
                let loc = inner.alloc.locate(region, b)?;
                inner.alloc.free_loc(region, &loc, b)?;
                freed += 1;
            }
        }
        region.fence();
        self.report.leaked_freed = freed;
        // The sweep is durable; now forget the active pages.
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

    /// Finishes recovery treating every allocated block as reachable (no sweep).
    /// Only for users whose every allocation is made reachable inside a transaction.
    pub fn finish_keep_all(self) -> Result<(Heap, RecoveryReport)> {
        self.finish(|_| true)
    }
}

impl Heap {
    /// Creates a new heap file.
    pub fn create(path: &Path, opts: &HeapOptions) -> Result<Heap> {
        let region = Region::create(
            path,
            &CreateParams {
                size: opts.size,
                geometry: opts.geometry,
            },
            opts.reserve_len(opts.size),
            Persister::new(opts.strategy, opts.fence_ns),
        )?;
        Ok(Self::assemble(region, opts, false))
    }

    /// Opens an existing heap for reading and writing: replays committed
    /// transactions and returns the [`Recovery`] step for the leak sweep.
    pub fn open(path: &Path, opts: &HeapOptions) -> Result<Recovery> {
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

    /// Opens a heap with a crash simulator attached (tests).
    pub fn open_sim(path: &Path, opts: &HeapOptions, sim: Arc<CrashSim>) -> Result<Recovery> {
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
            Persister::new(opts.strategy, opts.fence_ns),
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
            }),
        }
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
    /// (from any thread, e.g. an epoch-reclamation callback). Flush + fence.
    pub fn free_ticket(&self, t: FreeTicket) -> Result<()> {
        self.free_tickets(std::iter::once(t))
    }

    /// Frees a batch of announced blocks with one fence.
    pub fn free_tickets(&self, ts: impl IntoIterator<Item = FreeTicket>) -> Result<()> {
        let inner = &self.inner;
        let mut done = Vec::new();
        let mut first_err = None;
        for t in ts {
            let off = t.off;
            std::mem::forget(t);
            match inner.alloc.locate(&inner.region, off) {
                Ok(loc) => {
                    if let Err(e) = inner.alloc.free_loc(&inner.region, &loc, off) {
                        first_err.get_or_insert(e);
                    }
                    done.push(loc);
                }
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        inner.region.fence();
        for loc in done {
            inner
                .alloc
                .slab_vol(loc.chunk, loc.head)
                .pending
                .fetch_sub(1, Ordering::AcqRel);
        }
        first_err.map_or(Ok(()), Err)
    }

    /// Withdraws a ticket without freeing (an aborted transaction's free).
    pub fn cancel_ticket(&self, t: FreeTicket) {
        let off = t.off;
        std::mem::forget(t);
        if let Ok(loc) = self.inner.alloc.locate(&self.inner.region, off) {
            self.inner
                .alloc
                .slab_vol(loc.chunk, loc.head)
                .pending
                .fetch_sub(1, Ordering::AcqRel);
        }
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

/// A promise to free one block, made before the block is unlinked (so that its page
/// is durably active). Redeem it with [`Heap::free_ticket`] from any thread once no
/// reader can reach the block. Dropping a ticket unredeemed leaves the block
/// allocated (and its page active) until the next recovery's sweep.
#[derive(Debug)]
pub struct FreeTicket {
    off: u64,
}

impl FreeTicket {
    pub fn ptr(&self) -> PPtr<u8> {
        PPtr::from_raw(self.off)
    }
}

/// Low bit of an APT entry: the entry covers its whole chunk (the value is the
/// chunk's offset plus this flag), not one page.
pub const APT_CHUNK_FLAG: u64 = 1;

fn apt_chunk_entry(geo: &Geometry, page: u64) -> u64 {
    let c = (page - geo.header_size()) / geo.chunk_size();
    geo.chunk_off(c) | APT_CHUNK_FLAG
}

struct AptVol {
    page: u64,
    last_alloc_op: u64,
}

/// One thread's allocation and transaction context, bound to a heap thread slot.
/// Not shareable between threads (it may move to another thread).
pub struct ThreadHeap {
    pub(crate) heap: Heap,
    pub(crate) slot: usize,
    /// NV-epoch: bumped by [`ThreadHeap::end_op`].
    op: u64,
    cur: Vec<Option<u64>>,
    cursor: Vec<u64>,
    cur_apt: Vec<Option<usize>>,
    apt: Vec<AptVol>,
    apt_index: HashMap<u64, usize>,
    apt_free: Vec<usize>,
    pub(crate) tx_state: tx::TxState,
}

impl ThreadHeap {
    fn new(heap: Heap, slot: usize) -> Self {
        let region = &heap.inner.region;
        let geo = region.geometry();
        let mut apt = Vec::with_capacity(geo.apt_entries as usize);
        let mut apt_index = HashMap::new();
        let mut apt_free = Vec::new();
        for i in 0..geo.apt_entries as usize {
            let v = region
                .atomic_u64(geo.apt_off(slot) + 8 * i as u64)
                .load(Ordering::Acquire);
            apt.push(AptVol {
                page: v,
                last_alloc_op: 0,
            });
            if v == 0 {
                apt_free.push(i);
            } else {
                apt_index.insert(v, i);
            }
        }
        apt_free.reverse();
        let tx_state = tx::TxState::new(&geo, slot);
        ThreadHeap {
            heap,
            slot,
            op: 1,
            cur: vec![None; CLASSES.len()],
            cursor: vec![0; CLASSES.len()],
            cur_apt: vec![None; CLASSES.len()],
            apt,
            apt_index,
            apt_free,
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
        self.op += 1;
    }

    /// Allocates `size` bytes (16-byte aligned). The contents are unspecified; the
    /// allocation is durable once the caller fences, which it must do before linking
    /// the block anywhere.
    pub fn alloc(&mut self, size: u64) -> Result<PPtr<u8>> {
        let inner = self.heap.inner.clone();
        let region = &inner.region;
        let geo = *inner.alloc.geometry();
        if let Some(class) = class_of(size) {
            loop {
                if let Some(slab) = self.cur[class] {
                    let mut cursor = self.cursor[class];
                    let need_apt = self.cur_apt[class].is_none();
                    let got = if need_apt {
                        let mut idx = None;
                        let r = {
                            let this = &mut *self;
                            let mut before = || -> Result<()> {
                                idx = Some(this.ensure_apt(slab, true)?);
                                Ok(())
                            };
                            inner
                                .alloc
                                .take_block(region, slab, class, &mut cursor, &mut before)
                        };
                        if let Some(i) = idx {
                            self.cur_apt[class] = Some(i);
                        }
                        r?
                    } else {
                        let i = self.cur_apt[class].unwrap();
                        self.apt[i].last_alloc_op = self.op;
                        inner
                            .alloc
                            .take_block(region, slab, class, &mut cursor, &mut || Ok(()))?
                    };
                    self.cursor[class] = cursor;
                    if let Some(off) = got {
                        return Ok(PPtr::from_raw(off));
                    }
                    inner.alloc.detach(slab, class);
                    self.cur[class] = None;
                    self.cur_apt[class] = None;
                }
                let slab = match inner.alloc.pop_pool(class) {
                    Some(s) => s,
                    None => inner.alloc.new_slab(region, class)?,
                };
                self.cur[class] = Some(slab);
                self.cursor[class] = 0;
                self.cur_apt[class] = None;
            }
        } else if size <= (geo.chunk_pages - 1) * PAGE {
            let mut before = |page: u64| self.ensure_apt(page, true).map(|_| ());
            Ok(PPtr::from_raw(inner.alloc.alloc_run(
                region,
                size,
                &mut before,
            )?))
        } else {
            let mut before = |page: u64| self.ensure_apt(page, true).map(|_| ());
            Ok(PPtr::from_raw(inner.alloc.alloc_huge(
                region,
                size,
                &mut before,
            )?))
        }
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
    /// durably active (and stays so until the ticket is redeemed).
    pub fn prepare_free(&mut self, p: PPtr<u8>) -> Result<FreeTicket> {
        let inner = self.heap.inner.clone();
        let loc = inner.alloc.locate(&inner.region, p.offset())?;
        if !inner.alloc.is_allocated(&inner.region, &loc) {
            return Err(Error::DoubleFree(p.offset()));
        }
        self.ensure_apt(loc.apt_page(inner.alloc.geometry()), false)?;
        inner
            .alloc
            .slab_vol(loc.chunk, loc.head)
            .pending
            .fetch_add(1, Ordering::AcqRel);
        Ok(FreeTicket { off: p.offset() })
    }

    /// Frees a block now (flush + fence). The block must not be reachable from any
    /// persistent structure (or its unlink must not yet be durable).
    pub fn free(&mut self, p: PPtr<u8>) -> Result<()> {
        let t = self.prepare_free(p)?;
        self.heap.free_ticket(t)
    }

    /// Makes `page` covered by this slot's APT, durably: by an entry for the page
    /// itself or for its whole chunk.
    fn ensure_apt(&mut self, page: u64, alloc: bool) -> Result<usize> {
        let geo = *self.heap.inner.alloc.geometry();
        let chunk_entry = apt_chunk_entry(&geo, page);
        let hit = self
            .apt_index
            .get(&page)
            .or_else(|| self.apt_index.get(&chunk_entry))
            .copied();
        if let Some(i) = hit {
            if alloc {
                self.apt[i].last_alloc_op = self.op;
            }
            return Ok(i);
        }
        if self.apt_free.is_empty() {
            self.trim_apt();
        }
        if self.apt_free.is_empty() {
            self.coalesce_apt();
            if let Some(&i) = self.apt_index.get(&chunk_entry) {
                if alloc {
                    self.apt[i].last_alloc_op = self.op;
                }
                return Ok(i);
            }
        }
        let Some(i) = self.apt_free.pop() else {
            return Err(Error::ActivePagesFull(self.slot, self.apt.len()));
        };
        self.set_apt(i, page, if alloc { self.op } else { 0 });
        Ok(i)
    }

    fn set_apt(&mut self, i: usize, entry: u64, last_alloc_op: u64) {
        let region = &self.heap.inner.region;
        let off = region.geometry().apt_off(self.slot) + 8 * i as u64;
        region.atomic_u64(off).store(entry, Ordering::Release);
        region.persist(off, 8);
        self.apt[i] = AptVol {
            page: entry,
            last_alloc_op,
        };
        self.apt_index.insert(entry, i);
    }

    fn clear_apt(&mut self, i: usize) {
        let region = &self.heap.inner.region;
        let off = region.geometry().apt_off(self.slot) + 8 * i as u64;
        region.atomic_u64(off).store(0, Ordering::Release);
        region.flush(off, 8);
        let entry = std::mem::replace(&mut self.apt[i].page, 0);
        self.apt_index.remove(&entry);
        self.apt_free.push(i);
        // Cached entry indices of the current slabs may name this entry.
        for c in 0..self.cur_apt.len() {
            if self.cur_apt[c] == Some(i) {
                self.cur_apt[c] = None;
            }
        }
    }

    /// Drops APT entries whose allocations have ended and which have no free
    /// tickets outstanding. Removal needs no fence: a stale entry only makes the
    /// next recovery scan one more page.
    fn trim_apt(&mut self) {
        let inner = self.heap.inner.clone();
        let region = &inner.region;
        let geo = *inner.alloc.geometry();
        for i in 0..self.apt.len() {
            let entry = self.apt[i].page;
            if entry == 0 || self.apt[i].last_alloc_op >= self.op {
                continue;
            }
            let pending: u32 = if entry & APT_CHUNK_FLAG != 0 {
                let chunk = (entry - APT_CHUNK_FLAG - geo.header_size()) / geo.chunk_size();
                (0..geo.chunk_pages)
                    .map(|p| {
                        inner
                            .alloc
                            .slab_vol(chunk, p)
                            .pending
                            .load(Ordering::Acquire)
                    })
                    .sum()
            } else {
                match inner.alloc.locate_page(region, entry) {
                    Ok(loc) => inner
                        .alloc
                        .slab_vol(loc.chunk, loc.head)
                        .pending
                        .load(Ordering::Acquire),
                    Err(_) => 0,
                }
            };
            if pending == 0 {
                self.clear_apt(i);
            }
        }
    }

    /// When the table is full of pages with operations in flight (typically free
    /// tickets for blocks scattered over many pages), replaces the page entries of
    /// the chunk with the most of them by one entry for the whole chunk (log-free
    /// paper §5.3: the tracking granularity is a choice). Recovery then scans that
    /// chunk whole. The chunk entry is durable before the page entries go.
    fn coalesce_apt(&mut self) {
        let geo = *self.heap.inner.alloc.geometry();
        let mut by_chunk: HashMap<u64, Vec<usize>> = HashMap::new();
        for (i, a) in self.apt.iter().enumerate() {
            if a.page != 0 && a.page & APT_CHUNK_FLAG == 0 {
                by_chunk
                    .entry(apt_chunk_entry(&geo, a.page))
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
            .map(|&i| self.apt[i].last_alloc_op)
            .max()
            .unwrap_or(0);
        let keep = idxs[0];
        let old = self.apt[keep].page;
        self.apt_index.remove(&old);
        self.set_apt(keep, entry, last);
        for &i in &idxs[1..] {
            self.clear_apt(i);
        }
        for c in 0..self.cur_apt.len() {
            if self.cur_apt[c] == Some(keep) {
                self.cur_apt[c] = None;
            }
        }
    }

    /// Number of pages in this slot's active page table.
    pub fn active_page_count(&self) -> usize {
        self.apt_index.len()
    }

    /// Kind and size of the block (tests, tools).
    pub fn block_size(&self, p: PPtr<u8>) -> Result<u64> {
        self.heap.usable_size(p)
    }
}

impl Drop for ThreadHeap {
    fn drop(&mut self) {
        let inner = self.heap.inner.clone();
        for class in 0..self.cur.len() {
            if let Some(slab) = self.cur[class].take() {
                inner.alloc.release_owned(slab, class);
            }
        }
        inner.slots.lock().unwrap()[self.slot] = false;
    }
}
