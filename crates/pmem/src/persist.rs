//! Persistence strategies: how a range of the mapping is made durable.
//!
//! A *flush* writes cache lines back towards the persistence domain; a *fence* waits
//! until every flush this thread issued before it is durable. Stores are durable only
//! after flush + fence (or, for `msync`, after the fence's `msync` of the dirty pages).

use crate::error::{Error, Result};
use crate::sim::CrashSim;
use std::cell::RefCell;
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, RwLock, Weak};

/// Cache line size assumed for flushes.
pub const LINE: usize = 64;

/// How writes reach the persistence domain.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Strategy {
    /// `clwb` per line + `sfence` (ADR platforms; keeps the line cached).
    Clwb,
    /// `clflushopt` per line + `sfence`.
    Clflushopt,
    /// `clflush` per line (ordered by itself) + `sfence`.
    Clflush,
    /// No flush, `sfence` only: for platforms whose caches are in the persistence
    /// domain (eADR, CXL GPF). Chosen by configuration only.
    FenceOnly,
    /// `msync(MS_SYNC)` of the pages flushed since the last fence: power-safe on an
    /// ordinary file system.
    Msync,
    /// Nothing is made durable (read-only check mappings, which are private copies).
    None,
}

impl Strategy {
    pub fn name(self) -> &'static str {
        match self {
            Strategy::Clwb => "clwb",
            Strategy::Clflushopt => "clflushopt",
            Strategy::Clflush => "clflush",
            Strategy::FenceOnly => "fence-only",
            Strategy::Msync => "msync",
            Strategy::None => "none",
        }
    }

    /// Parses a strategy name; `auto` picks the best cache-line flush this CPU has.
    pub fn parse(s: &str) -> Result<Strategy> {
        let st = match s {
            "auto" => return Ok(Strategy::detect()),
            "clwb" => Strategy::Clwb,
            "clflushopt" => Strategy::Clflushopt,
            "clflush" => Strategy::Clflush,
            "fence-only" | "eadr" => Strategy::FenceOnly,
            "msync" => Strategy::Msync,
            _ => return Err(Error::UnknownStrategy(s.to_string())),
        };
        if !st.supported() {
            return Err(Error::StrategyUnsupported(st.name()));
        }
        Ok(st)
    }

    /// Whether this CPU can run the strategy.
    pub fn supported(self) -> bool {
        let f = cpu_features();
        match self {
            Strategy::Clwb => f.clwb,
            Strategy::Clflushopt => f.clflushopt,
            Strategy::Clflush => f.clflush,
            _ => true,
        }
    }

    /// The best cache-line flush available: clwb, then clflushopt, then clflush; msync
    /// on a CPU with none of them.
    pub fn detect() -> Strategy {
        let f = cpu_features();
        if f.clwb {
            Strategy::Clwb
        } else if f.clflushopt {
            Strategy::Clflushopt
        } else if f.clflush {
            Strategy::Clflush
        } else {
            Strategy::Msync
        }
    }

    /// Whether a durable reply on an ordinary (non-DAX) file survives an OS crash or
    /// power loss in this mode.
    pub fn power_safe_on_ordinary_file(self) -> bool {
        matches!(self, Strategy::Msync)
    }
}

/// Cache-flush instructions this CPU supports (CPUID).
#[derive(Clone, Copy, Debug, Default)]
pub struct CpuFeatures {
    pub clflush: bool,
    pub clflushopt: bool,
    pub clwb: bool,
}

pub fn cpu_features() -> CpuFeatures {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{__cpuid, __cpuid_count};
        // CPUID is always available on x86_64.
        let max = __cpuid(0).eax;
        let l1 = __cpuid(1);
        let mut f = CpuFeatures {
            clflush: l1.edx & (1 << 19) != 0,
            ..Default::default()
        };
        if max >= 7 {
            let l7 = __cpuid_count(7, 0);
            f.clflushopt = l7.ebx & (1 << 23) != 0;
            f.clwb = l7.ebx & (1 << 24) != 0;
        }
        f
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        CpuFeatures::default()
    }
}

/// Counters of persistence work, one slot per live thread.
///
/// A slot is owned by one thread at a time, so its owner bumps it with a plain load
/// and store, never a locked read-modify-write: on x86 a locked instruction is
/// ordered after every earlier `clwb`/`clflushopt` of the thread and so waits for
/// their write-backs, which would turn every counted flush into a fence. (Profiling
/// the log-free hash table found half its time in such a `lock add`.) Threads beyond
/// `SLOTS` live at once share the last slot and bump it atomically.
pub struct Counters {
    shards: Box<[Shard]>,
}

#[repr(align(128))]
#[derive(Default)]
struct Shard {
    flushes: AtomicU64,
    fences: AtomicU64,
    msyncs: AtomicU64,
    writes_through: AtomicU64,
}

/// A snapshot of the persistence counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PersistStats {
    /// Cache lines the code asked to flush (counted for every strategy, including
    /// fence-only, which issues no flush instruction, and msync, which queues pages).
    pub flushes: u64,
    /// Fences (persist barriers).
    pub fences: u64,
    /// `msync` calls.
    pub msyncs: u64,
    /// Writes through the file rather than the mapping (`Region::write_through`:
    /// a group commit's log records under msync).
    pub writes_through: u64,
}

/// Slots owned by one thread each; slot `SLOTS` is the shared overflow slot.
const SLOTS: usize = 64;

/// Slot indices of threads that have exited, free for new threads.
static FREE_SLOTS: std::sync::Mutex<Vec<usize>> = std::sync::Mutex::new(Vec::new());
static NEXT_SLOT: AtomicU64 = AtomicU64::new(0);

/// This thread's slot; returned to `FREE_SLOTS` when the thread exits.
struct SlotGuard(usize);

impl Drop for SlotGuard {
    fn drop(&mut self) {
        if self.0 < SLOTS {
            if let Ok(mut free) = FREE_SLOTS.lock() {
                free.push(self.0);
            }
        }
    }
}

fn slot_index() -> usize {
    thread_local!(static SLOT: SlotGuard = {
        let reused = FREE_SLOTS.lock().ok().and_then(|mut f| f.pop());
        SlotGuard(reused.unwrap_or_else(|| {
            let n = NEXT_SLOT.fetch_add(1, Ordering::Relaxed) as usize;
            n.min(SLOTS)
        }))
    });
    // During thread teardown the slot may be gone: count in the shared slot.
    SLOT.try_with(|s| s.0).unwrap_or(SLOTS)
}

impl Shard {
    /// Adds `n` to `c`, which belongs to the slot `idx`.
    #[inline]
    fn bump(c: &AtomicU64, idx: usize, n: u64) {
        if idx < SLOTS {
            // Single writer: a plain load and store (no `lock` prefix).
            c.store(c.load(Ordering::Relaxed).wrapping_add(n), Ordering::Relaxed);
        } else {
            c.fetch_add(n, Ordering::Relaxed);
        }
    }
}

impl Counters {
    pub fn new() -> Self {
        Self {
            shards: (0..=SLOTS).map(|_| Shard::default()).collect(),
        }
    }
    #[inline]
    fn add(&self, which: fn(&Shard) -> &AtomicU64, n: u64) {
        let idx = slot_index();
        Shard::bump(which(&self.shards[idx]), idx, n);
    }
    pub fn snapshot(&self) -> PersistStats {
        let mut s = PersistStats::default();
        for sh in self.shards.iter() {
            s.flushes += sh.flushes.load(Ordering::Relaxed);
            s.fences += sh.fences.load(Ordering::Relaxed);
            s.msyncs += sh.msyncs.load(Ordering::Relaxed);
            s.writes_through += sh.writes_through.load(Ordering::Relaxed);
        }
        s
    }
}

impl Default for Counters {
    fn default() -> Self {
        Self::new()
    }
}

/// The size of the system's memory pages (`sysconf(_SC_PAGESIZE)`), read once:
/// what `msync` ranges must be aligned to (4 KiB on x86-64; 16 or 64 KiB on some
/// arm64 and POWER kernels, where a 4 KiB-aligned `msync` fails with EINVAL).
pub fn os_page() -> usize {
    static PAGE: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *PAGE.get_or_init(|| {
        // SAFETY: sysconf has no memory-safety preconditions.
        let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        if n > 0 && (n as usize).is_power_of_two() {
            n as usize
        } else {
            4096
        }
    })
}

/// One thread's msync ranges for one region (see `MSYNC_DIRTY`).
struct DirtyList {
    /// `Persister::id` of the region they belong to.
    pub(crate) id: u64,
    /// The region's persister, for the sync at thread exit.
    owner: Weak<Persister>,
    ranges: Vec<(usize, usize)>,
}

/// A thread's msync ranges, one list per region it flushed since its fences.
struct ThreadDirty(Vec<DirtyList>);

impl Drop for ThreadDirty {
    /// At thread exit the ranges flushed and never fenced are synced (for the
    /// regions still open), as a cache-line write-back issued and never fenced
    /// still completes: unfenced flushes end up durable under every strategy.
    fn drop(&mut self) {
        for l in self.0.drain(..) {
            if l.ranges.is_empty() {
                continue;
            }
            if let Some(p) = l.owner.upgrade() {
                p.sync_detached(l.ranges);
            }
        }
    }
}

thread_local! {
    /// Page ranges (absolute addresses) this thread flushed since its last fence,
    /// for the msync strategy, kept per region: a fence syncs only its own
    /// region's ranges (another heap's may be unmapped by now, and its errors
    /// belong to that heap).
    static MSYNC_DIRTY: RefCell<ThreadDirty> = const { RefCell::new(ThreadDirty(Vec::new())) };
}

/// Identities of persisters (never reused, unlike addresses).
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// Flushed ranges closer than this are synced by one `msync` over their hull. Each
/// `msync` call is a write-out and a wait of its own (a fraction of a millisecond
/// even for one page), while the kernel finds the dirty pages of a
/// range by their tags, so the clean pages of a gap cost next to nothing; a page
/// in the gap that another thread dirtied is written out early, which is never
/// wrong. A glean batch flags records scattered over a log: one call instead of
/// hundreds.
const MSYNC_GAP: usize = 1 << 20;

/// The persistence engine of one region.
pub struct Persister {
    pub(crate) strategy: Strategy,
    pub(crate) fence_ns: u64,
    /// Emulated extra latency per index node read (see `HeapOptions::read_ns`).
    pub(crate) read_ns: u64,
    pub(crate) counters: Counters,
    /// First errno of a failed `msync`, `fsync`, `pwrite` or file extension (0 =
    /// none): from then on durability is not guaranteed and `Region::health`
    /// reports it, so the layers above stop acknowledging writes. Never reset:
    /// Linux reports a write-back error once per open file, so a later sync
    /// that succeeds says nothing about the pages whose write-back failed
    /// (PostgreSQL's "fsyncgate").
    pub(crate) failed: AtomicI32,
    /// Identity of this persister in the threads' msync lists.
    pub(crate) id: u64,
    /// This persister, as the region's `Arc` holds it (`Region::map`): the
    /// threads' msync lists and detached fences hold it weakly, to sync at
    /// thread exit or drop what was flushed and never fenced.
    pub(crate) this: Weak<Persister>,
    /// The mapping's base address (0 until mapped).
    pub(crate) base: usize,
    /// False once the region is closing (set under the write lock before the
    /// mapping goes): a sync outside the region's own calls (thread exit, a
    /// dropped detached fence) holds the read lock and syncs only while true.
    pub(crate) live: RwLock<bool>,
    /// The power-loss simulator watching the file (tests), if any.
    pub(crate) sim: OnceLock<Arc<CrashSim>>,
    /// Tests: the errno the next fsync or file extension fails with (0 = none).
    pub(crate) inject: AtomicI32,
}

impl Persister {
    /// With an emulated extra latency per index node read, in ns.
    pub fn with_read_ns(mut self, ns: u64) -> Self {
        self.read_ns = ns;
        self
    }

    pub fn new(strategy: Strategy, fence_ns: u64) -> Self {
        Self {
            strategy,
            fence_ns,
            read_ns: 0,
            counters: Counters::new(),
            failed: AtomicI32::new(0),
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            this: Weak::new(),
            base: 0,
            live: RwLock::new(true),
            sim: OnceLock::new(),
            inject: AtomicI32::new(0),
        }
    }

    /// Records `errno` as the first failure, if there was none (see `failed`).
    pub(crate) fn record_failure(&self, errno: i32) {
        let _ = self
            .failed
            .compare_exchange(0, errno, Ordering::SeqCst, Ordering::SeqCst);
    }

    /// Writes back the cache lines covering `[addr, addr + len)`.
    #[inline]
    pub(crate) fn flush(&self, addr: usize, len: usize) {
        if len == 0 {
            return;
        }
        let start = addr & !(LINE - 1);
        let end = addr + len;
        let lines = (end - start).div_ceil(LINE);
        match self.strategy {
            Strategy::Clwb | Strategy::Clflushopt | Strategy::Clflush => {
                self.write_back(start, end);
            }
            Strategy::Msync => {
                let pg = os_page();
                let ps = addr & !(pg - 1);
                let pe = (end + pg - 1) & !(pg - 1);
                MSYNC_DIRTY.with(|d| {
                    let mut d = d.borrow_mut();
                    let d = self.dirty_list(&mut d.0);
                    if let Some(last) = d.last_mut() {
                        if ps <= last.1 && pe >= last.0 {
                            last.0 = last.0.min(ps);
                            last.1 = last.1.max(pe);
                            return;
                        }
                    }
                    d.push((ps, pe));
                });
            }
            Strategy::FenceOnly | Strategy::None => {}
        }
        self.counters.add(|s| &s.flushes, lines as u64);
    }

    /// Copies `src` to `addr` and flushes it, in one pass. Where the strategy
    /// writes cache lines back (clwb, clflushopt, clflush) the copy uses
    /// non-temporal stores: the bytes go to memory through the write-combining
    /// buffers without first reading the lines into the cache, which a store
    /// followed by a write-back would (a log append writes lines nobody reads
    /// soon). Either way the bytes are durable after this thread's next fence,
    /// and, non-temporal stores being weakly ordered, other threads are only
    /// sure to see them after it too. Bytes before the first 8-aligned address
    /// and after the last are stored plainly and flushed. Each line touched
    /// counts as a flush.
    #[inline]
    pub(crate) fn stream(&self, addr: usize, src: &[u8]) {
        if src.is_empty() {
            return;
        }
        if !matches!(
            self.strategy,
            Strategy::Clwb | Strategy::Clflushopt | Strategy::Clflush
        ) {
            // SAFETY: the caller bounds-checked `addr..addr+len` as mapped and
            // writable; `src` is a Rust buffer, so disjoint from the mapping; no
            // other thread accesses the range meanwhile (`Region::write_bytes`'s
            // requirement, which `Region::write_stream` shares).
            unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), addr as *mut u8, src.len()) };
            self.flush(addr, src.len());
            return;
        }
        let end = addr + src.len();
        let mid_start = ((addr + 7) & !7).min(end);
        let mid_end = (end & !7).max(mid_start);
        // SAFETY: as above for the whole range; the middle part,
        // `mid_start..mid_end`, is 8-aligned and a multiple of 8 long, as
        // `stream_copy` requires, and the two plain copies cover the ends.
        unsafe {
            let d = addr as *mut u8;
            std::ptr::copy_nonoverlapping(src.as_ptr(), d, mid_start - addr);
            if mid_end > mid_start {
                stream_copy(
                    mid_start as *mut u8,
                    src.as_ptr().add(mid_start - addr),
                    mid_end - mid_start,
                );
            }
            std::ptr::copy_nonoverlapping(
                src.as_ptr().add(mid_end - addr),
                mid_end as *mut u8,
                end - mid_end,
            );
        }
        let counted = |from: usize, to: usize| {
            let start = from & !(LINE - 1);
            (to - start).div_ceil(LINE) as u64
        };
        // The plainly stored ends (each within one line) are written back too.
        if mid_start > addr {
            self.write_back(addr, mid_start);
        }
        if end > mid_end {
            self.write_back(mid_end, end);
        }
        self.counters.add(|s| &s.flushes, counted(addr, end));
    }

    /// Writes back the lines from the one holding `start` to the one holding
    /// `end - 1`, with the strategy's instruction (clwb, clflushopt or clflush;
    /// nothing for the others). Counts nothing.
    #[inline]
    fn write_back(&self, start: usize, end: usize) {
        let mut p = start & !(LINE - 1);
        match self.strategy {
            Strategy::Clwb => {
                while p < end {
                    // SAFETY: `p` lies inside the mapping (callers bounds-check the
                    // range); clwb only writes back the line and never faults on a
                    // mapped address. The CPU supports it (checked at open).
                    unsafe { clwb(p) };
                    p += LINE;
                }
            }
            Strategy::Clflushopt => {
                while p < end {
                    // SAFETY: as for clwb.
                    unsafe { clflushopt(p) };
                    p += LINE;
                }
            }
            Strategy::Clflush => {
                while p < end {
                    // SAFETY: as for clwb.
                    unsafe { clflush(p) };
                    p += LINE;
                }
            }
            _ => {}
        }
    }

    /// Waits until this thread's earlier flushes are durable.
    #[inline]
    pub(crate) fn fence(&self) {
        match self.strategy {
            Strategy::Msync => self.sync(self.take_dirty()),
            Strategy::None => {}
            _ => sfence(),
        }
        self.counted_fence();
    }

    /// This thread's msync ranges for this region in `lists` (added if
    /// missing; lists of closed regions are dropped then: their regions synced
    /// the whole mapping when they closed).
    fn dirty_list<'a>(&self, lists: &'a mut Vec<DirtyList>) -> &'a mut Vec<(usize, usize)> {
        let i = match lists.iter().position(|l| l.id == self.id) {
            Some(i) => i,
            None => {
                lists.retain(|l| l.owner.strong_count() > 0);
                lists.push(DirtyList {
                    id: self.id,
                    owner: self.this.clone(),
                    ranges: Vec::new(),
                });
                lists.len() - 1
            }
        };
        &mut lists[i].ranges
    }

    /// The page ranges this thread flushed for this region since its last
    /// fence (msync strategy; empty for the others), taken: the thread's next
    /// fence no longer covers them, a `sync` of them does.
    pub(crate) fn take_dirty(&self) -> Vec<(usize, usize)> {
        if self.strategy != Strategy::Msync {
            return Vec::new();
        }
        MSYNC_DIRTY
            .try_with(|d| {
                d.borrow_mut()
                    .0
                    .iter_mut()
                    .find(|l| l.id == self.id)
                    .map(|l| std::mem::take(&mut l.ranges))
                    .unwrap_or_default()
            })
            .unwrap_or_default()
    }

    /// Syncs `ranges` of this region from outside the region's own calls (a
    /// thread's exit, a dropped detached fence): only while the region is
    /// open (`live`), which it stays until this returns.
    pub(crate) fn sync_detached(&self, ranges: Vec<(usize, usize)>) {
        let live = self.live.read().unwrap_or_else(|e| e.into_inner());
        if *live {
            self.sync(ranges);
        }
    }

    /// The region is closing: no sync from outside its calls starts from now
    /// on, and none is under way when this returns.
    pub(crate) fn close(&self) {
        *self.live.write().unwrap_or_else(|e| e.into_inner()) = false;
    }

    /// Counts a write through the file (`Region::write_through`).
    pub(crate) fn counted_write_through(&self) {
        self.counters.add(|s| &s.writes_through, 1);
    }

    /// Counts a fence, and waits the emulated fence latency.
    pub(crate) fn counted_fence(&self) {
        self.counters.add(|s| &s.fences, 1);
        if self.fence_ns > 0 {
            spin_ns(self.fence_ns);
        }
    }

    /// msyncs page ranges (from `take_dirty`), merging those closer than
    /// `MSYNC_GAP`; a failure is recorded (see `failed`). Any thread.
    pub(crate) fn sync(&self, ranges: Vec<(usize, usize)>) {
        let mut merged: Vec<(usize, usize)> = ranges;
        merged.sort_unstable();
        let mut i = 0;
        let mut out = Vec::new();
        while i < merged.len() {
            let (s, mut e) = merged[i];
            let mut j = i + 1;
            while j < merged.len() && merged[j].0 <= e + MSYNC_GAP {
                e = e.max(merged[j].1);
                j += 1;
            }
            out.push((s, e));
            i = j;
        }
        if let Some(sim) = self.sim.get() {
            let offs: Vec<(u64, u64)> = out
                .iter()
                .map(|&(s, e)| ((s - self.base) as u64, (e - s) as u64))
                .collect();
            sim.on_msync(&offs, &|off, dst| self.read_mapped(off, dst));
        }
        for (s, e) in out {
            // SAFETY: the range is page aligned and was flushed while mapped;
            // msync on a range that is no longer mapped fails with ENOMEM and
            // touches nothing; any failure is recorded (see `failed`).
            let rc = unsafe { libc::msync(s as *mut libc::c_void, e - s, libc::MS_SYNC) };
            if rc != 0 {
                let errno = std::io::Error::last_os_error()
                    .raw_os_error()
                    .unwrap_or(libc::EIO);
                self.record_failure(errno);
            }
            self.counters.add(|s| &s.msyncs, 1);
        }
    }

    /// Copies mapped bytes at offset `off` into `dst`, for the power-loss
    /// simulator, which sees the region only through its persister.
    ///
    /// The caller guarantees `[off, off + dst.len())` lies in the mapped
    /// part of the region and that the region is open (a region's own call,
    /// or `live` held).
    fn read_mapped(&self, off: u64, dst: &mut [u8]) {
        debug_assert!(self.base != 0);
        // SAFETY: by the caller's guarantee the range is mapped and stays so
        // for the copy; `dst` is a Rust buffer, disjoint from the mapping.
        // Other threads' stores may race with the copy, which sees them in
        // part as a write-back would: the simulators' exception to the access
        // protocol (`Region::read_racy`), which no production path takes.
        unsafe {
            std::ptr::copy_nonoverlapping(
                (self.base + off as usize) as *const u8,
                dst.as_mut_ptr(),
                dst.len(),
            )
        }
    }
}

pub(crate) fn spin_ns(ns: u64) {
    let t = std::time::Instant::now();
    while (t.elapsed().as_nanos() as u64) < ns {
        std::hint::spin_loop();
    }
}

/// Writes back the cache line holding `p` (CLWB), leaving it cached.
///
/// # Safety
///
/// `p` must be an address of the region's mapping (mapped while the
/// instruction runs), and the CPU must support CLWB (`Strategy::supported`,
/// checked at open: without it the instruction faults).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn clwb(p: usize) {
    // SAFETY: caller guarantees `p` is a mapped address and the CPU has CLWB.
    unsafe {
        std::arch::asm!("clwb byte ptr [{0}]", in(reg) p, options(nostack, preserves_flags));
    }
}

/// Writes back and evicts the cache line holding `p` (CLFLUSHOPT).
///
/// # Safety
///
/// As for [`clwb`], with CLFLUSHOPT support.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn clflushopt(p: usize) {
    // SAFETY: caller guarantees `p` is a mapped address and the CPU has CLFLUSHOPT.
    unsafe {
        std::arch::asm!("clflushopt byte ptr [{0}]", in(reg) p, options(nostack, preserves_flags));
    }
}

/// Writes back and evicts the cache line holding `p` (CLFLUSH, serialising).
///
/// # Safety
///
/// `p` must be an address of the region's mapping (CLFLUSH is baseline
/// x86-64, so nothing else).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn clflush(p: usize) {
    // SAFETY: caller guarantees `p` is a mapped address; CLFLUSH is baseline x86_64.
    unsafe { std::arch::x86_64::_mm_clflush(p as *const u8) }
}

/// Copies `len` bytes (a multiple of 8) to the 8-aligned `dst` with
/// non-temporal stores: 16 bytes at a time once `dst` is 16-aligned.
///
/// # Safety
///
/// `dst..dst + len` must be mapped writable and 8-aligned, `len` a multiple
/// of 8, `src..src + len` readable and not overlapping it; no other thread
/// may access `dst..dst + len` during the copy (`Region::write_bytes`'s
/// requirement). The stores are weakly ordered: the caller fences before
/// publishing the bytes.
#[cfg(target_arch = "x86_64")]
#[inline]
unsafe fn stream_copy(dst: *mut u8, src: *const u8, len: usize) {
    use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_stream_si128, _mm_stream_si64};
    debug_assert!((dst as usize).is_multiple_of(8) && len.is_multiple_of(8));
    let mut i = 0;
    // SAFETY: the caller guarantees `dst..dst+len` is mapped writable and
    // 8-aligned, and `src..src+len` readable: the first 8-byte store (if `dst`
    // is not 16-aligned) is aligned, then each 16-byte store is at a 16-aligned
    // `dst + i` with `i + 16 <= len`, and the last 8-byte one ends at `len`;
    // the loads are unaligned loads inside `src..src+len`. SSE2 (MOVNTDQ,
    // MOVNTI) is baseline x86_64.
    unsafe {
        if !(dst as usize).is_multiple_of(16) && len >= 8 {
            _mm_stream_si64(dst as *mut i64, std::ptr::read_unaligned(src as *const i64));
            i = 8;
        }
        while i + 16 <= len {
            let v = _mm_loadu_si128(src.add(i) as *const __m128i);
            _mm_stream_si128(dst.add(i) as *mut __m128i, v);
            i += 16;
        }
        if i < len {
            _mm_stream_si64(
                dst.add(i) as *mut i64,
                std::ptr::read_unaligned(src.add(i) as *const i64),
            );
        }
    }
}

/// A plain copy where non-temporal stores are not used.
///
/// # Safety
///
/// As for the x86_64 version.
#[cfg(not(target_arch = "x86_64"))]
unsafe fn stream_copy(dst: *mut u8, src: *const u8, len: usize) {
    // SAFETY: the caller guarantees both ranges valid and disjoint.
    unsafe { std::ptr::copy_nonoverlapping(src, dst, len) }
}

#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn sfence() {
    // SAFETY: SFENCE is baseline x86_64 (SSE) and has no memory-safety preconditions.
    unsafe { std::arch::x86_64::_mm_sfence() }
}

/// No cache-line write-back outside x86_64 (the strategies that use one are
/// unsupported there).
///
/// # Safety
///
/// None needed; `unsafe` to match the x86_64 signature.
#[cfg(not(target_arch = "x86_64"))]
unsafe fn clwb(_p: usize) {}
/// As [`clwb`].
///
/// # Safety
///
/// None needed.
#[cfg(not(target_arch = "x86_64"))]
unsafe fn clflushopt(_p: usize) {}
/// As [`clwb`].
///
/// # Safety
///
/// None needed.
#[cfg(not(target_arch = "x86_64"))]
unsafe fn clflush(_p: usize) {}
#[cfg(not(target_arch = "x86_64"))]
fn sfence() {
    std::sync::atomic::fence(Ordering::SeqCst)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_names() {
        assert_eq!(Strategy::parse("msync").unwrap(), Strategy::Msync);
        assert_eq!(Strategy::parse("fence-only").unwrap(), Strategy::FenceOnly);
        assert!(matches!(
            Strategy::parse("bogus"),
            Err(Error::UnknownStrategy(_))
        ));
        let auto = Strategy::parse("auto").unwrap();
        assert!(auto.supported());
    }

    #[test]
    fn msync_ranges_are_aligned_to_the_system_page() {
        // SAFETY: sysconf has no preconditions.
        let sys = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
        assert_eq!(os_page(), sys);
        let p = Persister::new(Strategy::Msync, 0);
        let buf = vec![0u8; 4 * sys];
        let at = buf.as_ptr() as usize + sys + 100;
        p.flush(at, 10);
        p.flush(at + sys, 1);
        let ranges = p.take_dirty();
        assert_eq!(ranges.len(), 1, "adjacent pages merge: {ranges:?}");
        let (s, e) = ranges[0];
        assert_eq!((s % sys, e % sys), (0, 0));
        assert!(s <= at && e > at + sys && e - s == 2 * sys, "{ranges:?}");
        assert!(p.take_dirty().is_empty());
    }

    #[test]
    fn every_supported_strategy_flushes_and_counts() {
        let buf = vec![0u8; 4096 * 3];
        for st in [
            Strategy::Clwb,
            Strategy::Clflushopt,
            Strategy::Clflush,
            Strategy::FenceOnly,
        ] {
            if !st.supported() {
                continue;
            }
            let p = Persister::new(st, 0);
            p.flush(buf.as_ptr() as usize + 10, 130);
            p.fence();
            let s = p.counters.snapshot();
            assert_eq!(s.flushes, 3, "{st:?}: bytes 10..140 span lines 0,1,2");
            assert_eq!(s.fences, 1);
        }
    }

    #[test]
    fn stream_copies_exactly_and_counts_lines() {
        let src: Vec<u8> = (0..300u32).map(|i| (i * 7 + 3) as u8).collect();
        for st in [
            Strategy::Clwb,
            Strategy::Clflushopt,
            Strategy::Clflush,
            Strategy::FenceOnly,
            Strategy::None,
        ] {
            if !st.supported() {
                continue;
            }
            let p = Persister::new(st, 0);
            // A line-aligned buffer, so that the expected line counts are exact.
            let mut buf = vec![0u64; 1024];
            let base = buf.as_mut_ptr() as usize;
            assert_eq!(base % 8, 0);
            let base = (base + LINE - 1) & !(LINE - 1);
            for off in [0usize, 1, 5, 8, 13, 16, 24, 63, 64, 100] {
                for len in [0usize, 1, 7, 8, 9, 15, 16, 17, 40, 64, 65, 129, 200, 300] {
                    let dst = base + off;
                    // SAFETY: `dst..dst+len` lies inside `buf` (base + 100 + 300 <
                    // 8 KiB - 64).
                    unsafe { std::ptr::write_bytes(dst as *mut u8, 0xEE, len + 16) };
                    let before = p.counters.snapshot().flushes;
                    p.stream(dst, &src[..len]);
                    p.fence();
                    // SAFETY: as above.
                    let got = unsafe { std::slice::from_raw_parts(dst as *const u8, len + 16) };
                    assert_eq!(&got[..len], &src[..len], "{st:?} off {off} len {len}");
                    assert!(
                        got[len..].iter().all(|&b| b == 0xEE),
                        "{st:?} off {off} len {len}: wrote past the end"
                    );
                    let lines = if len == 0 {
                        0
                    } else {
                        ((dst + len) - (dst & !(LINE - 1))).div_ceil(LINE) as u64
                    };
                    let counted = p.counters.snapshot().flushes - before;
                    assert_eq!(counted, lines, "{st:?} off {off} len {len}");
                }
            }
        }
    }
}
