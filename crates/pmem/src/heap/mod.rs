//! The public heap: a region plus its allocator, thread slots and recovery.

mod apt;
mod recovery;
mod thread;

use crate::alloc::{AllocStats, Allocator, BlockKind, Covered};
use crate::error::{Error, Result};
use crate::layout::*;
use crate::persist::{Persister, Strategy};
use crate::pptr::PPtr;
use crate::region::{Access, CreateParams, Region};
use crate::sim::CrashSim;
use crate::tx;
use std::collections::BTreeSet;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

pub use apt::APT_CHUNK_FLAG;
pub use recovery::{Recovery, RecoveryReport};
pub use thread::ThreadHeap;

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
    /// A private view whose thread heaps may write ([`Heap::open_scratch`]).
    scratch: std::sync::atomic::AtomicBool,
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
        Self::open_with(path, opts, Access::ReadWrite, None, false)
    }

    /// Opens a private copy-on-write view for checking: recovery runs in memory, the
    /// file is never written.
    pub fn open_check(path: &Path) -> Result<Recovery> {
        Self::open_private(path, false)
    }

    fn open_private(path: &Path, scratch: bool) -> Result<Recovery> {
        let opts = HeapOptions {
            strategy: Strategy::None,
            ..Default::default()
        };
        Self::open_with(path, &opts, Access::CheckOnly, None, scratch)
    }

    /// Opens a private copy-on-write view in which a store can be opened and
    /// used offline as the server would use it: like [`Heap::open_check`]
    /// (recovery in memory, a shared file lock, the file never written, no
    /// growth), except that thread heaps may be claimed, so allocations and
    /// writes land in the private mapping, and are gone when it is dropped.
    /// Its open generation is one past the file's, as a writable open's is
    /// (in memory only), so that locks a crashed process held are free here
    /// as they would be for the server. For reading a store through its
    /// sessions (`ember check`).
    pub fn open_scratch(path: &Path) -> Result<Recovery> {
        Self::open_private(path, true)
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
        Self::open_with(path, opts, Access::ReadWrite, Some(sim), false)
    }

    fn open_with(
        path: &Path,
        opts: &HeapOptions,
        access: Access,
        sim: Option<Arc<CrashSim>>,
        scratch: bool,
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
        if scratch {
            region.next_generation_in_memory()?;
        }
        let was_clean = region.opened_clean();
        let heap = Self::assemble(region, opts, true);
        heap.inner.scratch.store(scratch, Ordering::Release);
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
                scratch: std::sync::atomic::AtomicBool::new(false),
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
        if self.inner.region.access() != Access::ReadWrite
            && !self.inner.scratch.load(Ordering::Acquire)
        {
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

    /// Returns the pages of empty slabs to the page allocator (which does so
    /// itself only when it finds no free page), so that [`AllocStats`] stops
    /// counting them; returns how many slabs it freed. A cache calls it when
    /// over its memory limit, before it evicts.
    pub fn reclaim_empty_slabs(&self) -> u64 {
        self.inner.alloc.reclaim_empty_slabs(&self.inner.region)
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
