//! The persistent allocator.
//!
//! Persistent metadata is only: the chunk word, one descriptor per page, and one
//! allocation bitmap per slab (all in the chunk's header page), plus each thread
//! slot's active page table (APT). Everything else (free counts, pools, which slab a
//! thread allocates from) is volatile and rebuilt lazily, chunk by chunk, the first
//! time a chunk is touched after open.
//!
//! NV-epochs (log-free paper §5): a block's page is recorded durably in the
//! allocating (or freeing) thread's APT *before* its bitmap bit can change, so that a
//! crash between "allocated" and "linked" (or between "unlinked" and "freed") leaves
//! the block in an active page, and recovery finds it by scanning active pages only.
//! The common allocation and free therefore need no log record: one flush of the
//! bitmap word (allocation: no fence, the caller's fence before linking covers it).

use crate::error::{Error, Result};
use crate::layout::*;
use crate::region::Region;
use crate::slab_state::SlabState;
use std::collections::{BTreeSet, VecDeque};
use std::sync::atomic::{AtomicU16, AtomicU64, AtomicU8, Ordering};
use std::sync::{Mutex, OnceLock};

// Volatile chunk states.
const C_UNSCANNED: u8 = 0;
const C_NORMAL: u8 = 1;
const C_HUGE: u8 = 2;
const C_IN_HUGE: u8 = 3;
const C_BAD: u8 = 4;
/// A normal chunk whose descriptors are not loaded yet.
const C_PENDING: u8 = 5;

/// Slabs of one class with room: (head page offset, life it was pooled in).
type Pool = Mutex<Vec<(u64, u32)>>;
/// Pooled slabs set aside (FIFO), entries as in [`Pool`].
type Sparse = Mutex<VecDeque<(u64, u32)>>;

pub(crate) struct ChunkVol {
    state: AtomicU8,
    /// Chunks in the huge run headed here.
    huge: AtomicU64,
    /// Volatile copy of the page descriptors (written under the page lock).
    desc: [AtomicU64; MAX_CHUNK_PAGES as usize],
    pub slabs: [SlabState; MAX_CHUNK_PAGES as usize],
    /// Outstanding page- or word-covered free tickets per bitmap word of each slab
    /// (head page * 64 + word); `SlabState::pending` holds the slab's total. A
    /// word entry may leave its table only when its word has none.
    word_pending: Box<[AtomicU16]>,
}

impl ChunkVol {
    fn new() -> Self {
        Self {
            state: AtomicU8::new(C_UNSCANNED),
            huge: AtomicU64::new(0),
            desc: std::array::from_fn(|_| AtomicU64::new(0)),
            slabs: std::array::from_fn(|_| SlabState::new()),
            word_pending: (0..MAX_CHUNK_PAGES * 64)
                .map(|_| AtomicU16::new(0))
                .collect(),
        }
    }
}

/// Checks a chunk's page descriptors (after orphan repair): every head's span lies
/// in the chunk and is made of its continuations, classes and sizes are right, and
/// no continuation lies outside a head's span.
pub(crate) fn validate_descs(d: &[u64]) -> std::result::Result<(), String> {
    let np = d.len() as u64;
    let mut p = 1;
    while p < np {
        let x = d[p as usize];
        match pd_kind(x) {
            PD_FREE if x == 0 => p += 1,
            PD_SLAB | PD_RUN => {
                let pages = pd_pages(x);
                if x >> 24 != 0 || pages == 0 || p + pages > np {
                    return Err(format!("page {p}: head {x:#x} does not fit the chunk"));
                }
                if pd_kind(x) == PD_SLAB
                    && (pd_class(x) >= CLASSES.len() || pages != slab_pages(pd_class(x)))
                {
                    return Err(format!(
                        "page {p}: slab descriptor {x:#x} has a bad class or size"
                    ));
                }
                for q in p + 1..p + pages {
                    if d[q as usize] != pd_cont(p) {
                        return Err(format!("page {q}: not a continuation of page {p}"));
                    }
                }
                p += pages;
            }
            _ => {
                return Err(format!(
                    "page {p}: descriptor {x:#x} outside any head's span"
                ))
            }
        }
    }
    Ok(())
}

/// The bits of bitmap word `w` that lie beyond a slab's `nb` blocks.
#[inline]
pub(crate) fn beyond_blocks(nb: u64, w: u64) -> u64 {
    let valid = nb.saturating_sub(64 * w).min(64);
    if valid < 64 {
        !((1u64 << valid) - 1)
    } else {
        0
    }
}

/// The bits of bitmap word `w` of a slab (first block at `base`, blocks of `size`
/// bytes, `nb` of them) whose blocks are reachable: what recovery makes them.
fn reachable_bits(
    base: u64,
    size: u64,
    nb: u64,
    w: u64,
    reachable: &mut dyn FnMut(u64) -> bool,
) -> u64 {
    let mut new = 0u64;
    for bit in 0..(nb - 64 * w).min(64) {
        if reachable(base + (64 * w + bit) * size) {
            new |= 1 << bit;
        }
    }
    new
}

/// Whether page `p`'s descriptor (in `d`, a chunk's descriptors) is a continuation
/// whose head page does not cover it.
pub(crate) fn is_orphan(d: &[u64], p: u64) -> bool {
    let x = d[p as usize];
    if pd_kind(x) != PD_CONT {
        return false;
    }
    let h = pd_head(x);
    if h == 0 || h >= p {
        return true;
    }
    let hd = d[h as usize];
    !matches!(pd_kind(hd), PD_SLAB | PD_RUN) || h + pd_pages(hd) <= p
}

/// What an active page table entry covers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Covered {
    Slab {
        chunk: u64,
        head: u64,
        class: usize,
    },
    /// A page-run or huge block (allocation state in durable descriptors).
    Block(u64),
    /// One bitmap word of a slab (64 blocks), covered by a word entry (an
    /// allocating thread's): only its bits are in doubt.
    Word {
        chunk: u64,
        head: u64,
        class: usize,
        word: u64,
    },
    /// One block of a slab, covered by a block entry (a free ticket's): only its
    /// bit is in doubt.
    Slot {
        chunk: u64,
        head: u64,
        class: usize,
        off: u64,
    },
}

/// Where a block lives and what it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum BlockKind {
    Slab { class: usize, index: u64 },
    Run { pages: u64 },
    Huge { chunks: u64 },
}

#[derive(Clone, Copy, Debug)]
pub(crate) struct Loc {
    pub chunk: u64,
    /// Head page of the slab or run (0 for a huge run).
    pub head: u64,
    pub kind: BlockKind,
}

struct PageState {
    /// Chunks scanned so far (chunks below are known; some above may be too).
    frontier: u64,
    /// Chunks whose kind (normal, huge, inside a huge run, bad) is known.
    kinds: u64,
    /// Chunks with free pages, by index.
    with_free: BTreeSet<u64>,
    /// Free page count per scanned chunk.
    free_pages: Vec<u16>,
}

pub(crate) struct Allocator {
    geo: Geometry,
    /// Start of the chunk area and log2 of the chunk size (hot-path constants).
    hs: u64,
    shift: u32,
    chunks: Box<[OnceLock<Box<ChunkVol>>]>,
    frontier: AtomicU64,
    nchunks: AtomicU64,
    pages: Mutex<PageState>,
    /// Per class: slabs with room, with the life they were pooled in.
    pools: Box<[Pool]>,
    /// Per class: pooled slabs set aside with too little room to be worth an
    /// owner (and an active page table entry); revisited when the pool runs dry,
    /// taken whatever their room when the heap has no page for a new slab.
    sparse: Box<[Sparse]>,
    pub max_size: u64,
}

/// Statistics of the allocator (volatile view).
#[derive(Clone, Copy, Debug, Default)]
pub struct AllocStats {
    pub chunks: u64,
    pub chunks_scanned: u64,
    pub free_pages_scanned: u64,
}

impl Allocator {
    pub fn new(region: &Region, max_size: u64) -> Self {
        let geo = region.geometry();
        let cap = (region.reserved().max(region.size()) / geo.chunk_size()) + 1;
        Self {
            geo,
            hs: geo.header_size(),
            shift: geo.chunk_shift(),
            chunks: (0..cap).map(|_| OnceLock::new()).collect(),
            frontier: AtomicU64::new(0),
            nchunks: AtomicU64::new(geo.chunks_in(region.size())),
            pages: Mutex::new(PageState {
                frontier: 0,
                kinds: 0,
                with_free: BTreeSet::new(),
                free_pages: Vec::new(),
            }),
            pools: (0..CLASSES.len()).map(|_| Mutex::new(Vec::new())).collect(),
            sparse: (0..CLASSES.len())
                .map(|_| Mutex::new(VecDeque::new()))
                .collect(),
            max_size,
        }
    }

    pub fn geometry(&self) -> &Geometry {
        &self.geo
    }

    /// Offset of chunk `c`.
    #[inline]
    pub fn coff(&self, c: u64) -> u64 {
        self.hs + (c << self.shift)
    }

    /// The APT entry covering a located block: its head page (the chunk header
    /// page for huge runs).
    #[inline]
    pub fn apt_page(&self, loc: &Loc) -> u64 {
        self.coff(loc.chunk) + loc.head * PAGE
    }

    pub fn stats(&self) -> AllocStats {
        let ps = self.pages.lock().unwrap();
        AllocStats {
            chunks: self.nchunks.load(Ordering::Acquire),
            chunks_scanned: ps.frontier,
            free_pages_scanned: ps.free_pages.iter().map(|&x| x as u64).sum(),
        }
    }

    fn cv(&self, c: u64) -> &ChunkVol {
        self.chunks[c as usize].get_or_init(|| Box::new(ChunkVol::new()))
    }

    pub fn slab_vol(&self, chunk: u64, page: u64) -> &SlabState {
        &self.cv(chunk).slabs[page as usize]
    }

    fn bitmap_off(&self, chunk: u64, head: u64) -> u64 {
        self.coff(chunk) + BITMAP_BASE + BITMAP_BYTES * head
    }

    fn desc_off(&self, chunk: u64, page: u64) -> u64 {
        self.coff(chunk) + DESC_BASE + 8 * page
    }

    /// Makes chunk `c` known: the kinds of chunks up to `c` (in order: a huge run
    /// hides the headers of the chunks it spans), then `c`'s own descriptors and
    /// slabs. Chunks in between are not scanned: recovery touches only the chunks
    /// its active pages lie in (one chunk-word read per chunk below them).
    pub fn ensure_scanned(&self, region: &Region, c: u64) {
        if c < self.frontier.load(Ordering::Acquire) {
            return;
        }
        if let Some(cv) = self.chunks.get(c as usize).and_then(|x| x.get()) {
            if !matches!(cv.state.load(Ordering::Acquire), C_UNSCANNED | C_PENDING) {
                return;
            }
        }
        let mut ps = self.pages.lock().unwrap();
        self.scan_kinds_locked(region, &mut ps, c);
        if c < self.nchunks.load(Ordering::Acquire)
            && self.cv(c).state.load(Ordering::Acquire) == C_PENDING
        {
            self.scan_chunk_locked(region, &mut ps, c);
        }
    }

    /// Scans every chunk up to and including `c` (in order; chunks scanned out of
    /// order before are skipped), advancing the frontier.
    fn scan_locked(&self, region: &Region, ps: &mut PageState, c: u64) {
        let n = self.nchunks.load(Ordering::Acquire);
        self.scan_kinds_locked(region, ps, c);
        while ps.frontier <= c && ps.frontier < n {
            let i = ps.frontier;
            let cv = self.cv(i);
            match cv.state.load(Ordering::Acquire) {
                C_PENDING => {
                    self.scan_chunk_locked(region, ps, i);
                    ps.frontier += 1;
                }
                C_HUGE => ps.frontier += cv.huge.load(Ordering::Relaxed).max(1),
                _ => ps.frontier += 1,
            }
        }
        self.frontier.store(ps.frontier, Ordering::Release);
    }

    /// Learns the kinds of chunks up to and including `c` from their chunk words:
    /// huge runs (and the chunks inside them), bad chunks, and normal chunks, left
    /// pending until [`Self::scan_chunk_locked`].
    fn scan_kinds_locked(&self, region: &Region, ps: &mut PageState, c: u64) {
        let n = self.nchunks.load(Ordering::Acquire);
        while ps.kinds <= c && ps.kinds < n {
            let i = ps.kinds;
            let cv = self.cv(i);
            let w: u64 = region.read(self.coff(i));
            if ps.free_pages.len() <= i as usize {
                ps.free_pages.resize(i as usize + 1, 0);
            }
            ps.kinds += 1;
            if cv.state.load(Ordering::Acquire) != C_UNSCANNED {
                continue; // grown and scanned already
            }
            if w & CHUNK_MAGIC_MASK != CHUNK_MAGIC {
                cv.state.store(C_BAD, Ordering::Release);
                continue;
            }
            match w & 0xff {
                CHUNK_HUGE => {
                    let cnt = (w >> 8) & 0xff_ffff;
                    if cnt == 0 || i + cnt > n {
                        cv.state.store(C_BAD, Ordering::Release);
                        continue;
                    }
                    cv.huge.store(cnt, Ordering::Relaxed);
                    cv.state.store(C_HUGE, Ordering::Release);
                    for j in 1..cnt {
                        self.cv(i + j).state.store(C_IN_HUGE, Ordering::Release);
                    }
                    if ps.free_pages.len() < (i + cnt) as usize {
                        ps.free_pages.resize((i + cnt) as usize, 0);
                    }
                    ps.kinds = i + cnt;
                }
                CHUNK_NORMAL => cv.state.store(C_PENDING, Ordering::Release),
                _ => cv.state.store(C_BAD, Ordering::Release),
            }
        }
    }

    /// Scans a pending normal chunk: repairs orphan descriptors, validates them,
    /// loads them, counts its free pages and pools its slabs with room.
    fn scan_chunk_locked(&self, region: &Region, ps: &mut PageState, i: u64) {
        let cv = self.cv(i);
        let mut free = 0u16;
        self.repair_orphans(region, i);
        let descs: Vec<u64> = (0..self.geo.chunk_pages)
            .map(|p| {
                if p == 0 {
                    0
                } else {
                    region.read(self.desc_off(i, p))
                }
            })
            .collect();
        if let Err(_why) = validate_descs(&descs) {
            // Corrupt metadata: never allocate from or free into this chunk
            // (`ember check` names the problem).
            cv.state.store(C_BAD, Ordering::Release);
            return;
        }
        for p in 1..self.geo.chunk_pages {
            let d = descs[p as usize];
            cv.desc[p as usize].store(d, Ordering::Relaxed);
            match pd_kind(d) {
                PD_FREE => free += 1,
                PD_SLAB => {
                    let class = pd_class(d);
                    if class < CLASSES.len() {
                        let used = self.count_bits(region, i, p, class);
                        let room = used < slab_blocks(class);
                        let sv = &cv.slabs[p as usize];
                        if let Some(life) = sv.scanned(room) {
                            self.pools[class]
                                .lock()
                                .unwrap()
                                .push((self.coff(i) + p * PAGE, life));
                        }
                    }
                }
                _ => {}
            }
        }
        ps.free_pages[i as usize] = free;
        if free > 0 {
            ps.with_free.insert(i);
        }
        cv.state.store(C_NORMAL, Ordering::Release);
    }

    /// Frees continuation descriptors whose head does not cover them: the trace of a
    /// page allocation or free interrupted by a crash (see `alloc_pages`).
    fn repair_orphans(&self, region: &Region, chunk: u64) -> u64 {
        let np = self.geo.chunk_pages;
        let d: Vec<u64> = (0..np)
            .map(|p| {
                if p == 0 {
                    0
                } else {
                    region.read(self.desc_off(chunk, p))
                }
            })
            .collect();
        let mut fixed = 0;
        for p in 1..np {
            if !is_orphan(&d, p) {
                continue;
            }
            region.write(self.desc_off(chunk, p), &0u64);
            region.flush(self.desc_off(chunk, p), 8);
            fixed += 1;
        }
        if fixed > 0 {
            region.fence();
        }
        fixed
    }

    /// The allocated blocks of a slab, by its bits. Frees from any thread
    /// change the bits meanwhile (`fetch_and`), so they are read atomically.
    fn count_bits(&self, region: &Region, chunk: u64, head: u64, class: usize) -> u64 {
        let bm = self.bitmap_off(chunk, head);
        let nb = slab_blocks(class);
        let mut n = 0;
        for w in 0..nb.div_ceil(64) {
            let v = region.atomic_u64(bm + 8 * w).load(Ordering::Acquire);
            n += (v & !beyond_blocks(nb, w)).count_ones() as u64;
        }
        n
    }

    /// Finds the block a pointer designates, validating it.
    pub fn locate(&self, region: &Region, off: u64) -> Result<Loc> {
        let hs = self.hs;
        if off < hs || !off.is_multiple_of(16) || !region.contains(off, 16) {
            return Err(Error::InvalidPointer(off, "outside the chunk area"));
        }
        let chunk = (off - hs) >> self.shift;
        if chunk >= self.nchunks.load(Ordering::Acquire) {
            return Err(Error::InvalidPointer(off, "beyond the last chunk"));
        }
        self.ensure_scanned(region, chunk);
        let cv = self.cv(chunk);
        let coff = self.coff(chunk);
        match cv.state.load(Ordering::Acquire) {
            C_HUGE => {
                if off != coff + PAGE {
                    return Err(Error::InvalidPointer(off, "inside a huge block"));
                }
                return Ok(Loc {
                    chunk,
                    head: 0,
                    kind: BlockKind::Huge {
                        chunks: cv.huge.load(Ordering::Relaxed),
                    },
                });
            }
            C_NORMAL => {}
            C_IN_HUGE => return Err(Error::InvalidPointer(off, "inside a huge block")),
            _ => return Err(Error::InvalidPointer(off, "in a corrupt chunk")),
        }
        let page = (off - coff) / PAGE;
        if page == 0 {
            return Err(Error::InvalidPointer(off, "in a chunk header"));
        }
        let mut d = cv.desc[page as usize].load(Ordering::Acquire);
        let mut head = page;
        if pd_kind(d) == PD_CONT {
            head = pd_head(d);
            if head == 0 || head >= page {
                return Err(Error::InvalidPointer(off, "bad continuation page"));
            }
            d = cv.desc[head as usize].load(Ordering::Acquire);
        }
        match pd_kind(d) {
            PD_SLAB => {
                let class = pd_class(d);
                if class >= CLASSES.len() {
                    return Err(Error::InvalidPointer(off, "slab of unknown class"));
                }
                let rel = off - (coff + head * PAGE);
                let b = CLASSES[class] as u64;
                let index = div_by_class(rel, class);
                if index * b != rel || index >= slab_blocks(class) {
                    return Err(Error::InvalidPointer(off, "not the start of a block"));
                }
                Ok(Loc {
                    chunk,
                    head,
                    kind: BlockKind::Slab { class, index },
                })
            }
            PD_RUN => {
                if off != coff + head * PAGE {
                    return Err(Error::InvalidPointer(off, "inside a large block"));
                }
                Ok(Loc {
                    chunk,
                    head,
                    kind: BlockKind::Run { pages: pd_pages(d) },
                })
            }
            _ => Err(Error::InvalidPointer(off, "in a free page")),
        }
    }

    /// Usable bytes of the block at `loc`.
    pub fn usable(&self, loc: &Loc) -> u64 {
        match loc.kind {
            BlockKind::Slab { class, .. } => CLASSES[class] as u64,
            BlockKind::Run { pages } => pages * PAGE,
            BlockKind::Huge { chunks } => chunks * self.geo.chunk_size() - PAGE,
        }
    }

    /// Whether the block is currently allocated.
    pub fn is_allocated(&self, region: &Region, loc: &Loc) -> bool {
        match loc.kind {
            BlockKind::Slab { index, .. } => {
                let w = region
                    .atomic_u64(self.bitmap_off(loc.chunk, loc.head) + 8 * (index / 64))
                    .load(Ordering::Acquire);
                w & (1 << (index % 64)) != 0
            }
            _ => true, // runs and huge blocks exist only while allocated
        }
    }

    /// A page- or word-covered free ticket for the block at `loc` is taken (`add`)
    /// or redeemed / withdrawn.
    pub fn pend(&self, loc: &Loc, add: bool) {
        let sv = self.slab_vol(loc.chunk, loc.head);
        let word = match loc.kind {
            BlockKind::Slab { index, .. } => {
                Some(&self.cv(loc.chunk).word_pending[(loc.head * 64 + index / 64) as usize])
            }
            _ => None,
        };
        if add {
            sv.pending.fetch_add(1, Ordering::AcqRel);
            if let Some(w) = word {
                w.fetch_add(1, Ordering::AcqRel);
            }
        } else {
            if let Some(w) = word {
                w.fetch_sub(1, Ordering::AcqRel);
            }
            sv.pending.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// Pending free tickets for the blocks a covered item holds.
    pub fn pending_of(&self, region: &Region, c: &Covered) -> u32 {
        match *c {
            Covered::Slab { chunk, head, .. } => {
                self.slab_vol(chunk, head).pending.load(Ordering::Acquire)
            }
            Covered::Block(b) => match self.locate(region, b) {
                Ok(l) => self
                    .slab_vol(l.chunk, l.head)
                    .pending
                    .load(Ordering::Acquire),
                Err(_) => 0,
            },
            Covered::Word {
                chunk, head, word, ..
            } => self.cv(chunk).word_pending[(head * 64 + word) as usize].load(Ordering::Acquire)
                as u32,
            // A block entry is its ticket: it is outstanding while the entry exists.
            Covered::Slot { .. } => 1,
        }
    }

    /// Offset of the first block of the slab whose head page is `head`.
    pub fn slab_base(&self, chunk: u64, head: u64) -> u64 {
        self.coff(chunk) + head * PAGE
    }

    /// The allocated blocks of a covered item (informational: before recovery
    /// recomputes a slab's bits, these are its in-memory bits).
    pub fn allocated_in(&self, region: &Region, c: &Covered) -> Vec<u64> {
        match *c {
            Covered::Block(b) => vec![b],
            Covered::Slot { off, .. } => match self.locate(region, off) {
                Ok(loc) if self.is_allocated(region, &loc) => vec![off],
                _ => vec![],
            },
            Covered::Word {
                chunk,
                head,
                class,
                word,
            } => {
                let v = region
                    .atomic_u64(self.bitmap_off(chunk, head) + 8 * word)
                    .load(Ordering::Acquire);
                let base = self.slab_base(chunk, head);
                (0..64)
                    .filter(|b| v & (1 << b) != 0 && 64 * word + b < slab_blocks(class))
                    .map(|b| base + (64 * word + b) * CLASSES[class] as u64)
                    .collect()
            }
            Covered::Slab { chunk, head, class } => {
                let bm = self.bitmap_off(chunk, head);
                let nb = slab_blocks(class);
                let base = self.slab_base(chunk, head);
                (0..nb)
                    .filter(|i| {
                        region.atomic_u64(bm + 8 * (i / 64)).load(Ordering::Acquire)
                            & (1 << (i % 64))
                            != 0
                    })
                    .map(|i| base + i * CLASSES[class] as u64)
                    .collect()
            }
        }
    }

    // ---- allocation of blocks from a slab (owner thread only) ----

    /// The first bitmap word of `slab` at or after `from` (cyclically) with a free
    /// block, or None when the slab is full.
    pub fn next_free_word(
        &self,
        region: &Region,
        slab: u64,
        class: usize,
        from: u64,
    ) -> Option<u64> {
        let (chunk, head) = self.split(slab);
        let bm = self.bitmap_off(chunk, head);
        let nb = slab_blocks(class);
        let words = nb.div_ceil(64);
        (0..words).map(|k| (from + k) % words).find(|&w| {
            let v = region.atomic_u64(bm + 8 * w).load(Ordering::SeqCst);
            !(v | beyond_blocks(nb, w)) != 0
        })
    }

    /// How many blocks of bitmap word `w` of `slab` are free now.
    pub fn free_in_word(&self, region: &Region, slab: u64, class: usize, w: u64) -> u32 {
        let (chunk, head) = self.split(slab);
        let v = region
            .atomic_u64(self.bitmap_off(chunk, head) + 8 * w)
            .load(Ordering::SeqCst);
        (!(v | beyond_blocks(slab_blocks(class), w))).count_ones()
    }

    /// Claims every free block of bitmap word `w` with one `fetch_or` (owner only:
    /// only the owner sets bits, so what is free now is ours). Nothing is flushed:
    /// the caller has made the word covered by its active page table first, and
    /// recovery recomputes covered words from reachability (claimed bits not yet
    /// handed out are unreachable and come back); the word is made durable when
    /// its entry leaves the table. Returns the claimed bits.
    pub fn claim_at(&self, region: &Region, slab: u64, class: usize, w: u64) -> u64 {
        let (chunk, head) = self.split(slab);
        let nb = slab_blocks(class);
        let a = region.atomic_u64(self.bitmap_off(chunk, head) + 8 * w);
        let free = !(a.load(Ordering::SeqCst) | beyond_blocks(nb, w));
        if free == 0 {
            return 0;
        }
        let old = a.fetch_or(free, Ordering::SeqCst);
        debug_assert_eq!(old & free, 0, "only the owner sets bits");
        free & !old
    }

    /// Offset of block `bit` of word `w` of `slab`.
    #[inline]
    pub fn block_at(&self, slab: u64, class: usize, w: u64, bit: u64) -> u64 {
        slab + (64 * w + bit) * CLASSES[class] as u64
    }

    /// Returns claimed-but-unused bits of word `cursor` (the owner lets go of a slab).
    pub fn unclaim(&self, region: &Region, slab: u64, cursor: u64, claimed: u64) {
        if claimed == 0 {
            return;
        }
        let (chunk, head) = self.split(slab);
        let a = region.atomic_u64(self.bitmap_off(chunk, head) + 8 * cursor);
        a.fetch_and(!claimed, Ordering::SeqCst);
    }

    /// Whether the slab's bitmap has a free block (SeqCst reads).
    fn has_room(&self, region: &Region, chunk: u64, head: u64, class: usize) -> bool {
        let bm = self.bitmap_off(chunk, head);
        let nb = slab_blocks(class);
        (0..nb.div_ceil(64)).any(|w| {
            let v = region.atomic_u64(bm + 8 * w).load(Ordering::SeqCst);
            v | beyond_blocks(nb, w) != u64::MAX
        })
    }

    fn is_empty_slab(&self, region: &Region, chunk: u64, head: u64, class: usize) -> bool {
        let bm = self.bitmap_off(chunk, head);
        (0..slab_blocks(class).div_ceil(64))
            .all(|w| region.atomic_u64(bm + 8 * w).load(Ordering::SeqCst) == 0)
    }

    /// What an APT entry covers: slabs (whose bits recovery recomputes) and page-run
    /// or huge blocks (whose descriptors are durable). A stale entry resolves to
    /// whatever now holds its page.
    pub fn covered(&self, region: &Region, entry: u64) -> Vec<Covered> {
        let mut out = Vec::new();
        if entry & APT_BLOCK_FLAG != 0 {
            let off = entry & !APT_BLOCK_FLAG;
            if let Ok(Loc {
                chunk,
                head,
                kind: BlockKind::Slab { class, .. },
            }) = self.locate(region, off)
            {
                out.push(Covered::Slot {
                    chunk,
                    head,
                    class,
                    off,
                });
            }
            return out;
        }
        if entry & APT_WORD_FLAG != 0 {
            // One word of the slab headed at the entry's page (a stale entry whose
            // page heads something else now covers nothing).
            let word = (entry & (PAGE - 1)) >> APT_WORD_SHIFT;
            let page = entry & !(PAGE - 1);
            for c in self.covered(region, page) {
                if let Covered::Slab { chunk, head, class } = c {
                    if self.coff(chunk) + head * PAGE == page
                        && word < slab_blocks(class).div_ceil(64)
                    {
                        out.push(Covered::Word {
                            chunk,
                            head,
                            class,
                            word,
                        });
                    }
                }
            }
            return out;
        }
        let hs = self.hs;
        let n = self.nchunks.load(Ordering::Acquire);
        let whole = entry & 1 != 0;
        let base = entry & !1;
        let unit = if whole { self.geo.chunk_size() } else { PAGE };
        if base < hs || !(base - hs).is_multiple_of(unit) {
            return out;
        }
        let rel = base - hs;
        let chunk = rel / self.geo.chunk_size();
        if chunk >= n {
            return out;
        }
        let pages: Vec<u64> = if whole {
            (0..self.geo.chunk_pages).collect()
        } else {
            vec![(rel % self.geo.chunk_size()) / PAGE]
        };
        self.ensure_scanned(region, chunk);
        let cv = self.cv(chunk);
        let coff = self.coff(chunk);
        match cv.state.load(Ordering::Acquire) {
            C_HUGE => out.push(Covered::Block(coff + PAGE)),
            C_NORMAL => {
                for p in pages {
                    if p == 0 {
                        continue;
                    }
                    let mut head = p;
                    let mut d = cv.desc[p as usize].load(Ordering::Acquire);
                    if pd_kind(d) == PD_CONT {
                        if whole {
                            continue; // its head is visited itself
                        }
                        head = pd_head(d);
                        if head == 0 || head >= p {
                            continue;
                        }
                        d = cv.desc[head as usize].load(Ordering::Acquire);
                    }
                    match pd_kind(d) {
                        PD_SLAB if pd_class(d) < CLASSES.len() => out.push(Covered::Slab {
                            chunk,
                            head,
                            class: pd_class(d),
                        }),
                        PD_RUN => out.push(Covered::Block(coff + head * PAGE)),
                        _ => {}
                    }
                }
            }
            _ => {}
        }
        out
    }

    /// Recovery of one block entry's block (its slab not recomputed whole): sets its
    /// bit to `reachable`, through the free path when it goes (the slab's volatile
    /// state follows), and flushes the word (no fence). Returns (kept, freed,
    /// revived) as 0/1.
    pub fn recompute_slot(
        &self,
        region: &Region,
        off: u64,
        reachable: bool,
    ) -> Result<(u64, u64, u64)> {
        let loc = self.locate(region, off)?;
        let BlockKind::Slab { index, .. } = loc.kind else {
            return Ok((0, 0, 0));
        };
        let word = self.bitmap_off(loc.chunk, loc.head) + 8 * (index / 64);
        let bit = 1u64 << (index % 64);
        let set = region.atomic_u64(word).load(Ordering::Acquire) & bit != 0;
        let r = match (set, reachable) {
            (true, true) => (1, 0, 0),
            (true, false) => {
                self.free_loc(region, &loc, off)?;
                (0, 1, 0)
            }
            (false, true) => {
                region.atomic_u64(word).fetch_or(bit, Ordering::SeqCst);
                (0, 0, 1)
            }
            (false, false) => (0, 0, 0),
        };
        if r != (1, 0, 0) {
            region.flush(word, 8);
        }
        Ok(r)
    }

    /// Recovery of one word entry's word (its slab not recomputed whole): sets each
    /// bit to `reachable(block)`, flushes the word if it changed (no fence), and
    /// pools the slab if it gained room. Returns (kept, freed, revived).
    pub fn recompute_word(
        &self,
        region: &Region,
        chunk: u64,
        head: u64,
        class: usize,
        word: u64,
        reachable: &mut dyn FnMut(u64) -> bool,
    ) -> (u64, u64, u64) {
        let nb = slab_blocks(class);
        let base = self.slab_base(chunk, head);
        let size = CLASSES[class] as u64;
        let a = region.atomic_u64(self.bitmap_off(chunk, head) + 8 * word);
        let old = a.load(Ordering::Acquire);
        let new = reachable_bits(base, size, nb, word, reachable);
        if new != old {
            a.store(new, Ordering::SeqCst);
            region.flush(self.bitmap_off(chunk, head) + 8 * word, 8);
            if old & !new != 0 {
                if let Some(life) = self.slab_vol(chunk, head).freed_block() {
                    self.pools[class].lock().unwrap().push((base, life));
                }
            }
        }
        (
            (old & new).count_ones() as u64,
            (old & !new).count_ones() as u64,
            (new & !old).count_ones() as u64,
        )
    }

    /// Flushes one bitmap word of a slab (no fence).
    pub fn flush_word(&self, region: &Region, chunk: u64, head: u64, word: u64) {
        region.flush(self.bitmap_off(chunk, head) + 8 * word, 8);
    }

    /// Flushes the bitmap word holding the bit of the slab block at `loc` (no fence).
    pub fn flush_bit(&self, region: &Region, loc: &Loc) {
        if let BlockKind::Slab { index, .. } = loc.kind {
            region.flush(self.bitmap_off(loc.chunk, loc.head) + 8 * (index / 64), 8);
        }
    }

    /// Flushes the bitmap lines of a slab (no fence).
    pub fn flush_bitmap(&self, region: &Region, chunk: u64, head: u64, class: usize) {
        let bytes = slab_blocks(class).div_ceil(64) * 8;
        region.flush(self.bitmap_off(chunk, head), bytes as usize);
    }

    /// Recovery: sets the allocation bit of every block slot of a covered slab to
    /// `reachable(block)`, flushes changed lines (no fence), and re-registers the
    /// slab's volatile state. Returns (blocks kept, blocks freed, blocks revived).
    pub fn recompute_slab(
        &self,
        region: &Region,
        chunk: u64,
        head: u64,
        class: usize,
        reachable: &mut dyn FnMut(u64) -> bool,
    ) -> (u64, u64, u64) {
        let bm = self.bitmap_off(chunk, head);
        let nb = slab_blocks(class);
        let base = self.slab_base(chunk, head);
        let size = CLASSES[class] as u64;
        let (mut kept, mut freed, mut revived) = (0, 0, 0);
        for w in 0..nb.div_ceil(64) {
            let a = region.atomic_u64(bm + 8 * w);
            let old = a.load(Ordering::Acquire);
            let new = reachable_bits(base, size, nb, w, reachable);
            kept += (old & new).count_ones() as u64;
            freed += (old & !new).count_ones() as u64;
            revived += (new & !old).count_ones() as u64;
            if new != old {
                a.store(new, Ordering::Release);
                region.flush(bm + 8 * w, 8);
            }
        }
        let used = self.count_bits(region, chunk, head, class);
        if let Some(life) = self.slab_vol(chunk, head).scanned(used < nb) {
            self.pools[class].lock().unwrap().push((base, life));
        }
        (kept, freed, revived)
    }

    fn split(&self, page_off: u64) -> (u64, u64) {
        let rel = page_off - self.hs;
        (rel >> self.shift, (rel & ((1 << self.shift) - 1)) / PAGE)
    }

    /// The owner found `slab` full and drops it.
    pub fn detach(&self, region: &Region, slab: u64, class: usize) {
        let (chunk, head) = self.split(slab);
        if let Some(life) = self
            .slab_vol(chunk, head)
            .owner_detach(|| self.has_room(region, chunk, head, class))
        {
            self.pools[class].lock().unwrap().push((slab, life));
        }
    }

    /// A thread gives up ownership of a slab that may still have room.
    pub fn release_owned(&self, slab: u64, class: usize) {
        let (chunk, head) = self.split(slab);
        if let Some(life) = self.slab_vol(chunk, head).release_owned() {
            self.pools[class].lock().unwrap().push((slab, life));
        }
    }

    /// Takes ownership of a pooled slab of `class`. When `picky`, only a slab with
    /// at least 1/16 of its blocks free: a nearly full slab would cost its owner an
    /// active page table entry (and recovery a scan of its slots) for a handful of
    /// blocks. Those wait aside until frees give them room; they are taken as they
    /// are (`picky` false) only when the heap has no page for a new slab, so at
    /// most 1/16 of slab memory idles.
    pub fn pop_pool(&self, region: &Region, class: usize, picky: bool) -> Option<u64> {
        let min = if picky {
            (slab_blocks(class) / 16).max(1)
        } else {
            1
        };
        let room = |slab: u64| {
            let (chunk, head) = self.split(slab);
            slab_blocks(class) - self.count_bits(region, chunk, head, class)
        };
        // Whether the entry is current; an entry from an earlier life of the page,
        // or of a slab taken since, is dropped (try_own would fail on its tag).
        let live = |slab: u64, life: u32| {
            let (chunk, head) = self.split(slab);
            let sv = self.slab_vol(chunk, head);
            sv.life() == life && sv.state() == crate::slab_state::POOLED
        };
        let own = |slab: u64, life: u32| {
            let (chunk, head) = self.split(slab);
            self.slab_vol(chunk, head).try_own(life)
        };
        {
            let mut pool = self.pools[class].lock().unwrap();
            while let Some((slab, life)) = pool.pop() {
                if !live(slab, life) {
                    continue;
                }
                if room(slab) < min {
                    self.sparse[class].lock().unwrap().push_back((slab, life));
                    continue;
                }
                if own(slab, life) {
                    return Some(slab);
                }
            }
        }
        let mut sparse = self.sparse[class].lock().unwrap();
        let tries = if picky {
            sparse.len().min(8)
        } else {
            sparse.len()
        };
        for _ in 0..tries {
            let (slab, life) = sparse.pop_front()?;
            if !live(slab, life) {
                continue;
            }
            if room(slab) >= min && own(slab, life) {
                return Some(slab);
            }
            sparse.push_back((slab, life));
        }
        None
    }

    // ---- page-level allocation ----

    /// Allocates `n` contiguous pages in one chunk; returns (chunk, head page).
    /// `describe` writes the descriptors (under the page lock).
    fn alloc_pages(
        &self,
        region: &Region,
        n: u64,
        before_publish: &mut dyn FnMut(u64) -> Result<()>,
        descs: &dyn Fn(u64) -> Vec<u64>,
    ) -> Result<(u64, u64)> {
        let mut ps = self.pages.lock().unwrap();
        let mut tried_reclaim = false;
        loop {
            let candidates: Vec<u64> = ps.with_free.iter().copied().collect();
            for c in candidates {
                if (ps.free_pages[c as usize] as u64) < n {
                    continue;
                }
                let cv = self.cv(c);
                let mut run = 0;
                for p in 1..self.geo.chunk_pages {
                    if pd_kind(cv.desc[p as usize].load(Ordering::Relaxed)) == PD_FREE {
                        run += 1;
                        if run == n {
                            let head = p + 1 - n;
                            before_publish(self.coff(c) + head * PAGE)?;
                            let ds = descs(head);
                            // Continuations first, then the head: a durable head
                            // implies durable continuations; orphan continuations
                            // (head never written) are freed by the chunk scan.
                            if n > 1 {
                                for (i, d) in ds.iter().enumerate().skip(1) {
                                    let pg = head + i as u64;
                                    cv.desc[pg as usize].store(*d, Ordering::Release);
                                    region.write(self.desc_off(c, pg), d);
                                }
                                region.flush(self.desc_off(c, head + 1), 8 * (n - 1) as usize);
                                region.fence();
                            }
                            if pd_kind(ds[0]) == PD_SLAB {
                                // A fresh slab's bitmap is zero, durably, before the
                                // head descriptor is (no stale bits can surface).
                                let bm = self.bitmap_off(c, head);
                                region.fill(bm, BITMAP_BYTES as usize, 0);
                                region.flush(bm, BITMAP_BYTES as usize);
                            }
                            cv.desc[head as usize].store(ds[0], Ordering::Release);
                            region.write(self.desc_off(c, head), &ds[0]);
                            // Durable before any block of the page can be handed out.
                            region.persist(self.desc_off(c, head), 8);
                            ps.free_pages[c as usize] -= n as u16;
                            if ps.free_pages[c as usize] == 0 {
                                ps.with_free.remove(&c);
                            }
                            return Ok((c, head));
                        }
                    } else {
                        run = 0;
                    }
                }
            }
            let nch = self.nchunks.load(Ordering::Acquire);
            if ps.frontier < nch {
                let f = ps.frontier;
                self.scan_locked(region, &mut ps, f);
                continue;
            }
            if !tried_reclaim {
                tried_reclaim = true;
                drop(ps);
                self.reclaim_empty_slabs(region);
                ps = self.pages.lock().unwrap();
                continue;
            }
            self.grow_locked(region, &mut ps, 1, n * PAGE)?;
        }
    }

    /// Returns empty pooled slabs' pages to the page allocator.
    pub fn reclaim_empty_slabs(&self, region: &Region) -> u64 {
        let mut freed = 0;
        for class in 0..CLASSES.len() {
            let mut slabs: Vec<(u64, u32)> =
                std::mem::take(&mut *self.pools[class].lock().unwrap());
            slabs.extend(std::mem::take(&mut *self.sparse[class].lock().unwrap()));
            let mut keep = Vec::new();
            for (slab, life) in slabs {
                let (chunk, head) = self.split(slab);
                let sv = self.slab_vol(chunk, head);
                if sv.try_retire_empty(life, || self.is_empty_slab(region, chunk, head, class)) {
                    self.free_pages(region, chunk, head, slab_pages(class));
                    freed += 1;
                } else if sv.state() == crate::slab_state::POOLED && sv.life() == life {
                    keep.push((slab, life));
                }
            }
            self.pools[class].lock().unwrap().extend(keep);
        }
        freed
    }

    /// Returns an empty slab's pages. Its bitmap is zero in memory but may not be
    /// durably so (bits of covered pages are not flushed per operation): make the
    /// zeroes durable before the page stops being a slab.
    fn free_pages(&self, region: &Region, chunk: u64, head: u64, n: u64) {
        let mut ps = self.pages.lock().unwrap();
        region.flush(self.bitmap_off(chunk, head), BITMAP_BYTES as usize);
        region.fence();
        self.clear_descs(region, chunk, head, n);
        ps.free_pages[chunk as usize] += n as u16;
        ps.with_free.insert(chunk);
    }

    /// Clears the descriptors of pages `head..head+n`: the head first (durably), then
    /// the continuations (durably), before anyone can reuse the pages (the caller
    /// publishes them as free only after this returns).
    fn clear_descs(&self, region: &Region, chunk: u64, head: u64, n: u64) {
        let cv = self.cv(chunk);
        cv.desc[head as usize].store(0, Ordering::Release);
        region.write(self.desc_off(chunk, head), &0u64);
        region.persist(self.desc_off(chunk, head), 8);
        if n > 1 {
            for p in head + 1..head + n {
                cv.desc[p as usize].store(0, Ordering::Release);
                region.write(self.desc_off(chunk, p), &0u64);
            }
            region.persist(self.desc_off(chunk, head + 1), 8 * (n - 1) as usize);
        }
    }

    /// Grows the heap by at least `min_chunks` (called with the page lock held).
    fn grow_locked(
        &self,
        region: &Region,
        ps: &mut PageState,
        min_chunks: u64,
        want: u64,
    ) -> Result<()> {
        let cur = region.size();
        let nch = self.nchunks.load(Ordering::Acquire);
        let max = self.max_size.min(region.reserved());
        let room = self.geo.chunks_in(max).saturating_sub(nch);
        if room < min_chunks {
            return Err(Error::HeapFull {
                requested: want,
                heap_size: cur,
                max_size: self.max_size.max(cur),
            });
        }
        // Double, within the limit.
        let mut add = nch.max(min_chunks).min(room);
        let mut new_size = self.geo.size_for_chunks(nch + add);
        if let Err(e) = region.extend_mapping(new_size) {
            // The file system has no room for the doubling: the least growth
            // that serves this allocation may still fit.
            if !matches!(e, Error::NoSpace { .. }) || add == min_chunks {
                return Err(e);
            }
            add = min_chunks;
            new_size = self.geo.size_for_chunks(nch + add);
            region.extend_mapping(new_size)?;
        }
        for c in nch..nch + add {
            let off = self.coff(c);
            region.write(off, &chunk_word(CHUNK_NORMAL, 0));
            region.flush(off, 8);
        }
        region.fence();
        region.sync_metadata()?;
        region.update_superblock(|sb| sb.size = new_size)?;
        self.nchunks.store(nch + add, Ordering::Release);
        let f = ps.frontier;
        self.scan_locked(region, ps, f.max(nch + add - 1));
        Ok(())
    }

    /// Grows the heap explicitly to at least `new_size` bytes.
    pub fn grow_to(&self, region: &Region, new_size: u64) -> Result<()> {
        if new_size > region.reserved() {
            return Err(Error::HeapFull {
                requested: new_size.saturating_sub(region.size()),
                heap_size: region.size(),
                max_size: region.reserved(),
            });
        }
        let mut ps = self.pages.lock().unwrap();
        let nch = self.nchunks.load(Ordering::Acquire);
        let want = self.geo.chunks_in(self.geo.round_size(new_size));
        if want <= nch {
            return Ok(());
        }
        let new_size = self.geo.size_for_chunks(want);
        if new_size > region.reserved() {
            return Err(Error::HeapFull {
                requested: new_size - region.size(),
                heap_size: region.size(),
                max_size: region.reserved(),
            });
        }
        region.extend_mapping(new_size)?;
        for c in nch..want {
            let off = self.coff(c);
            region.write(off, &chunk_word(CHUNK_NORMAL, 0));
            region.flush(off, 8);
        }
        region.fence();
        region.sync_metadata()?;
        region.update_superblock(|sb| sb.size = new_size)?;
        self.nchunks.store(want, Ordering::Release);
        let f = ps.frontier;
        self.scan_locked(region, &mut ps, f.max(want - 1));
        Ok(())
    }

    /// A fresh slab of `class`, owned by the caller.
    pub fn new_slab(&self, region: &Region, class: usize) -> Result<u64> {
        let n = slab_pages(class);
        let (c, head) = self.alloc_pages(region, n, &mut |_| Ok(()), &|head| {
            let mut v = vec![pd_slab(class, n)];
            v.extend((1..n).map(|_| pd_cont(head)));
            v
        })?;
        self.slab_vol(c, head).fresh_owned();
        Ok(self.coff(c) + head * PAGE)
    }

    /// A run of pages for a large block; `before_publish(head_page_off)` runs before
    /// the descriptors are written (the APT insertion).
    pub fn alloc_run(
        &self,
        region: &Region,
        bytes: u64,
        before_publish: &mut dyn FnMut(u64) -> Result<()>,
    ) -> Result<u64> {
        let n = bytes.div_ceil(PAGE);
        let (c, head) = self.alloc_pages(region, n, before_publish, &|head| {
            let mut v = vec![pd_run(n)];
            v.extend((1..n).map(|_| pd_cont(head)));
            v
        })?;
        Ok(self.coff(c) + head * PAGE)
    }

    /// Whole chunks for a block larger than a chunk's pages.
    pub fn alloc_huge(
        &self,
        region: &Region,
        bytes: u64,
        before_publish: &mut dyn FnMut(u64) -> Result<()>,
    ) -> Result<u64> {
        let Some(n) = bytes
            .checked_add(PAGE)
            .map(|b| b.div_ceil(self.geo.chunk_size()))
        else {
            return Err(Error::TooLarge(bytes));
        };
        if n > 0xff_ffff || self.geo.size_for_chunks(n) > region.reserved().max(self.max_size) {
            return Err(Error::TooLarge(bytes));
        }
        let mut ps = self.pages.lock().unwrap();
        loop {
            let nch = self.nchunks.load(Ordering::Acquire);
            let f = ps.frontier;
            self.scan_locked(region, &mut ps, f.max(nch.saturating_sub(1)));
            let full_free = (self.geo.chunk_pages - 1) as u16;
            let mut start = 0;
            let mut run = 0;
            let mut c = 0;
            while c < nch {
                let cv = self.cv(c);
                let st = cv.state.load(Ordering::Acquire);
                if st == C_NORMAL && ps.free_pages[c as usize] == full_free {
                    if run == 0 {
                        start = c;
                    }
                    run += 1;
                    if run == n {
                        break;
                    }
                    c += 1;
                } else {
                    run = 0;
                    c += if st == C_HUGE {
                        cv.huge.load(Ordering::Relaxed).max(1)
                    } else {
                        1
                    };
                }
            }
            if run == n {
                let off = self.coff(start);
                before_publish(off)?;
                region.write(off, &chunk_word(CHUNK_HUGE, n));
                // Durable before the caller writes over the next chunks' headers.
                region.persist(off, 8);
                let cv = self.cv(start);
                cv.huge.store(n, Ordering::Relaxed);
                cv.state.store(C_HUGE, Ordering::Release);
                for j in start..start + n {
                    ps.free_pages[j as usize] = 0;
                    ps.with_free.remove(&j);
                    if j > start {
                        self.cv(j).state.store(C_IN_HUGE, Ordering::Release);
                    }
                }
                return Ok(off + PAGE);
            }
            // Need room at the end: grow by enough chunks for a run at the tail.
            let tail_free = run;
            self.grow_locked(region, &mut ps, n - tail_free, bytes)?;
        }
    }

    /// Frees a located block: clears its allocation state and flushes (no fence:
    /// callers fence, once for a batch).
    pub fn free_loc(&self, region: &Region, loc: &Loc, off: u64) -> Result<()> {
        match loc.kind {
            BlockKind::Slab { class, index } => {
                let a = region.atomic_u64(self.bitmap_off(loc.chunk, loc.head) + 8 * (index / 64));
                // SeqCst: the clear is ordered before the state read in freed_block
                // (see slab_state).
                let old = a.fetch_and(!(1 << (index % 64)), Ordering::SeqCst);
                if old & (1 << (index % 64)) == 0 {
                    return Err(Error::DoubleFree(off));
                }
                // Not flushed: the page is covered by an active page table entry
                // (see take_block).
                if let Some(life) = self.slab_vol(loc.chunk, loc.head).freed_block() {
                    let slab = self.coff(loc.chunk) + loc.head * PAGE;
                    self.pools[class].lock().unwrap().push((slab, life));
                }
                Ok(())
            }
            BlockKind::Run { pages } => {
                let mut ps = self.pages.lock().unwrap();
                let cv = self.cv(loc.chunk);
                if pd_kind(cv.desc[loc.head as usize].load(Ordering::Acquire)) != PD_RUN {
                    return Err(Error::DoubleFree(off));
                }
                self.clear_descs(region, loc.chunk, loc.head, pages);
                ps.free_pages[loc.chunk as usize] += pages as u16;
                ps.with_free.insert(loc.chunk);
                Ok(())
            }
            BlockKind::Huge { chunks } => {
                let mut ps = self.pages.lock().unwrap();
                let head = self.cv(loc.chunk);
                if head.state.load(Ordering::Acquire) != C_HUGE {
                    return Err(Error::DoubleFree(off));
                }
                // Re-format the chunk headers the block overwrote, then un-huge the head.
                let hdr_len = (BITMAP_BASE + BITMAP_BYTES * self.geo.chunk_pages) as usize;
                for j in loc.chunk + 1..loc.chunk + chunks {
                    let o = self.coff(j);
                    region.fill(o, hdr_len, 0);
                    region.write(o, &chunk_word(CHUNK_NORMAL, 0));
                    region.flush(o, hdr_len);
                }
                region.fence();
                let o = self.coff(loc.chunk);
                region.write(o, &chunk_word(CHUNK_NORMAL, 0));
                // Durable before the chunks are published as free: another thread's
                // fence would not cover our flush.
                region.persist(o, 8);
                let full_free = (self.geo.chunk_pages - 1) as u16;
                for j in loc.chunk..loc.chunk + chunks {
                    let cv = self.cv(j);
                    for p in 0..MAX_CHUNK_PAGES as usize {
                        cv.desc[p].store(0, Ordering::Relaxed);
                    }
                    cv.huge.store(0, Ordering::Relaxed);
                    cv.state.store(C_NORMAL, Ordering::Release);
                    ps.free_pages[j as usize] = full_free;
                    ps.with_free.insert(j);
                }
                Ok(())
            }
        }
    }
}
