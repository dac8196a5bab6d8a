//! Offline verification of a heap's persistent metadata (`ember check`).
//!
//! The checker reads the persistent format directly, independent of the allocator's
//! volatile state, so that it can judge a heap the allocator would misread.

use crate::heap::Heap;
use crate::layout::*;
use crate::tx;
use std::fmt;

/// What the checker found.
#[derive(Clone, Debug, Default)]
pub struct CheckReport {
    pub heap_bytes: u64,
    pub chunks: u64,
    pub huge_runs: u64,
    pub slabs: u64,
    pub runs: u64,
    pub free_pages: u64,
    pub blocks: u64,
    pub allocated_bytes: u64,
    pub active_pages: u64,
    pub pending_logs: u64,
    /// Continuation pages left by a page allocation or free that a crash interrupted;
    /// legitimate after a crash, freed when the allocator first scans the chunk.
    pub orphan_pages: u64,
    /// Blocks claimed by live thread handles and not yet handed out (excluded from
    /// `blocks`).
    pub cached_blocks: u64,
    pub problems: Vec<String>,
}

impl CheckReport {
    pub fn ok(&self) -> bool {
        self.problems.is_empty()
    }
}

impl fmt::Display for CheckReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "heap: {} bytes, {} chunks ({} huge runs), {} slabs, {} page runs, {} free pages",
            self.heap_bytes, self.chunks, self.huge_runs, self.slabs, self.runs, self.free_pages
        )?;
        writeln!(
            f,
            "allocated: {} blocks, {} bytes; active pages: {}; committed logs awaiting replay: {}; orphan pages to free at next open: {}",
            self.blocks, self.allocated_bytes, self.active_pages, self.pending_logs, self.orphan_pages
        )?;
        for p in &self.problems {
            writeln!(f, "problem: {p}")?;
        }
        Ok(())
    }
}

/// Verifies the allocator metadata, the thread slots and the root pointer.
pub fn check_heap(heap: &Heap) -> CheckReport {
    let region = heap.region();
    let geo = region.geometry();
    let mut r = CheckReport {
        heap_bytes: region.size(),
        ..Default::default()
    };
    let n = geo.chunks_in(region.size());
    r.chunks = n;
    let mut c = 0;
    let mut huge_heads = std::collections::BTreeSet::new();
    while c < n {
        let off = geo.chunk_off(c);
        let w: u64 = region.read(off);
        if w & CHUNK_MAGIC_MASK != CHUNK_MAGIC {
            r.problems
                .push(format!("chunk {c} at {off:#x}: bad chunk word {w:#x}"));
            c += 1;
            continue;
        }
        match w & 0xff {
            CHUNK_HUGE => {
                let cnt = (w >> 8) & 0xff_ffff;
                if cnt == 0 || c + cnt > n {
                    r.problems.push(format!(
                        "chunk {c}: huge run of {cnt} chunks does not fit the heap ({n} chunks)"
                    ));
                    c += 1;
                    continue;
                }
                for p in 1..geo.chunk_pages {
                    let d: u64 = region.read(off + DESC_BASE + 8 * p);
                    if d != 0 {
                        r.problems.push(format!(
                            "chunk {c}: huge head has a page descriptor {d:#x} at page {p}"
                        ));
                        break;
                    }
                }
                r.huge_runs += 1;
                r.blocks += 1;
                r.allocated_bytes += cnt * geo.chunk_size() - PAGE;
                huge_heads.insert(off + PAGE);
                c += cnt;
                continue;
            }
            CHUNK_NORMAL => {
                if (w >> 8) & 0xff_ffff != 0 {
                    r.problems.push(format!(
                        "chunk {c}: normal chunk word carries a count ({w:#x})"
                    ));
                }
            }
            k => {
                r.problems
                    .push(format!("chunk {c}: unknown chunk kind {k}"));
                c += 1;
                continue;
            }
        }
        check_chunk(heap, c, &mut r);
        c += 1;
    }
    // Thread slots: active page tables and redo logs.
    for s in 0..geo.nslots as usize {
        for i in 0..geo.apt_entries {
            let v: u64 = region.read(geo.apt_off(s) + 8 * i);
            if v == 0 {
                continue;
            }
            r.active_pages += 1;
            if v & APT_BLOCK_FLAG != 0 {
                // A free ticket's block entry: a block of a slab (allocated or not).
                let b = v & !APT_BLOCK_FLAG;
                if b & 1 != 0 || heap.inner.alloc.locate(region, b).is_err() {
                    r.problems.push(format!(
                        "slot {s}: active page table entry {i} = {v:#x} is not a slab block"
                    ));
                }
                continue;
            }
            let hs = geo.header_size();
            let (base, unit) = if v & APT_WORD_FLAG != 0 {
                // One bitmap word of the slab headed at this page.
                (v & !(PAGE - 1), PAGE)
            } else if v & 1 != 0 {
                (v - 1, geo.chunk_size())
            } else {
                (v, PAGE)
            };
            if base < hs || !(base - hs).is_multiple_of(unit) || !region.contains(base, PAGE) {
                r.problems.push(format!(
                    "slot {s}: active page table entry {i} = {v:#x} is not a heap page"
                ));
            }
        }
        if tx::pending_log(heap, s) {
            r.pending_logs += 1;
        }
    }
    r.cached_blocks = heap.cached_blocks();
    r.blocks = r.blocks.saturating_sub(r.cached_blocks);
    let root = region.superblock().root;
    if root != 0 && !heap.is_allocated(crate::PPtr::from_raw(root)) && !huge_heads.contains(&root) {
        r.problems
            .push(format!("root pointer {root:#x} is not an allocated block"));
    }
    r
}

fn check_chunk(heap: &Heap, c: u64, r: &mut CheckReport) {
    let region = heap.region();
    let geo = region.geometry();
    let off = geo.chunk_off(c);
    let np = geo.chunk_pages;
    let descs: Vec<u64> = (0..np)
        .map(|p| {
            if p == 0 {
                0
            } else {
                region.read(off + DESC_BASE + 8 * p)
            }
        })
        .collect();
    let mut bitmap_owner = vec![false; np as usize];
    let mut p = 1;
    while p < np {
        let d = descs[p as usize];
        match pd_kind(d) {
            PD_FREE => {
                if d != 0 {
                    r.problems.push(format!(
                        "chunk {c} page {p}: free descriptor with stray bits {d:#x}"
                    ));
                }
                r.free_pages += 1;
                p += 1;
            }
            PD_SLAB | PD_RUN => {
                let pages = pd_pages(d);
                let is_slab = pd_kind(d) == PD_SLAB;
                if is_slab {
                    let class = pd_class(d);
                    if class >= CLASSES.len() {
                        r.problems
                            .push(format!("chunk {c} page {p}: slab of unknown class {class}"));
                        p += 1;
                        continue;
                    }
                    if pages != slab_pages(class) {
                        r.problems.push(format!(
                            "chunk {c} page {p}: slab of class {} B spans {pages} pages, expected {}",
                            CLASSES[class],
                            slab_pages(class)
                        ));
                    }
                } else if pages == 0 {
                    r.problems
                        .push(format!("chunk {c} page {p}: page run of 0 pages"));
                    p += 1;
                    continue;
                }
                if d >> 24 != 0 {
                    r.problems.push(format!(
                        "chunk {c} page {p}: descriptor has stray high bits {d:#x}"
                    ));
                }
                if p + pages > np {
                    r.problems.push(format!(
                        "chunk {c} page {p}: {pages} pages run past the chunk end"
                    ));
                    p += 1;
                    continue;
                }
                for q in p + 1..p + pages {
                    if descs[q as usize] != pd_cont(p) {
                        r.problems.push(format!(
                            "chunk {c} page {q}: expected continuation of page {p}, found {:#x}",
                            descs[q as usize]
                        ));
                    }
                }
                if is_slab {
                    r.slabs += 1;
                    bitmap_owner[p as usize] = true;
                    let class = pd_class(d);
                    let nb = slab_blocks(class);
                    let bm = off + BITMAP_BASE + BITMAP_BYTES * p;
                    for w in 0..BITMAP_BYTES / 8 {
                        let v: u64 = region.read(bm + 8 * w);
                        let stray = v & crate::alloc::beyond_blocks(nb, w);
                        if stray != 0 {
                            r.problems.push(format!(
                                "chunk {c} slab {p}: bitmap bits set beyond its {nb} blocks"
                            ));
                        }
                        let used = (v & !stray).count_ones() as u64;
                        r.blocks += used;
                        r.allocated_bytes += used * CLASSES[class] as u64;
                    }
                } else {
                    r.runs += 1;
                    r.blocks += 1;
                    r.allocated_bytes += pages * PAGE;
                }
                p += pages.max(1);
            }
            PD_CONT if crate::alloc::is_orphan(&descs, p) => {
                r.orphan_pages += 1;
                p += 1;
            }
            PD_CONT => {
                r.problems.push(format!(
                    "chunk {c} page {p}: continuation page {d:#x} outside its head's span"
                ));
                p += 1;
            }
            k => {
                r.problems.push(format!(
                    "chunk {c} page {p}: unknown descriptor kind {k} ({d:#x})"
                ));
                p += 1;
            }
        }
    }
    for p in 0..np {
        if bitmap_owner[p as usize] {
            continue;
        }
        let bm = off + BITMAP_BASE + BITMAP_BYTES * p;
        let mut any = false;
        for w in 0..BITMAP_BYTES / 8 {
            let v: u64 = region.read(bm + 8 * w);
            any |= v != 0;
        }
        if any {
            r.problems.push(format!(
                "chunk {c} page {p}: allocation bits set on a page that is not a slab head"
            ));
        }
    }
}
