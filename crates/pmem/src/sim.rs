//! The crash simulator (tests).
//!
//! It keeps a *persisted image*: what the medium would hold. Every flush is recorded
//! for the flushing thread; at that thread's next fence the flushed lines are copied
//! from the mapping into the image. Before a fence applies, the simulator may take a
//! *crash image*: the persisted image plus a random subset of the cache lines that
//! still differ from the mapping (written but not yet durable: any of them may or
//! may not have reached the medium). Opening that image runs recovery on it.
//!
//! In its power-loss mode ([`CrashSim::power_loss`], for the msync strategy) it
//! models a file in the page cache instead: the *durable image* is what the
//! disk holds. A page becomes durable, with its content at that moment, when an
//! `msync` covering it runs (`Persister::sync`: a fence, a completed detached
//! fence, a thread's exit, a region's close), and every page does at an `fsync`
//! (`Region::sync_metadata`). Stores through the mapping and writes through the
//! file (`Region::write_through`, `pwrite`) change only the page cache. A crash
//! image is the durable image plus, for each page whose cached content differs
//! from it, one of: the durable content, the cached content, or a tear of the two
//! at 512-byte sectors (a random subset of the sectors new), as the kernel's own
//! write-back may have written any dirty page, whole or in part, before the power
//! went. A page synced and then dirtied again keeps its synced content durable.
//! A file extended since the last fsync may also come back at its old length.
//! Images are taken at random syncs (fences), before writes through the file and
//! fsyncs, and by `capture_now`.

use crate::persist::{os_page, LINE};
use crate::region::Region;
use rand::{RngExt, SeedableRng};
use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::thread::ThreadId;

/// A simulated crash: the bytes the medium would hold, and the tag the test set
/// when it was taken.
pub struct CrashImage {
    pub bytes: Vec<u8>,
    /// The tag when the image was complete: what the image holds was written
    /// by operations started before it.
    pub tag: u64,
    /// The tag before the image was built: operations completed before it are
    /// in the image.
    pub tag_before: u64,
    pub fence: u64,
}

struct State {
    /// Cache-line mode: the persisted image. Power-loss mode: the durable
    /// image (the disk).
    persisted: Vec<u8>,
    /// Power-loss mode: the file length an fsync made durable.
    durable_len: u64,
    /// Power-loss mode: the mapped size (the file's length in the page cache).
    size: u64,
    /// Power-loss mode: fixed chances (a page written since its sync is new or
    /// torn; of those, torn) instead of random ones per image.
    tear: Option<(f64, f64)>,
    pending: HashMap<ThreadId, Vec<u64>>,
    rng: rand::rngs::SmallRng,
    images: Vec<CrashImage>,
}

pub struct CrashSim {
    st: Mutex<State>,
    /// Power-loss mode (pages of a file) rather than cache lines.
    pages: bool,
    /// Probability (per million) that a fence takes a crash image first.
    capture_ppm: AtomicU64,
    tag: AtomicU64,
    fences: AtomicU64,
    captured: AtomicU64,
}

impl CrashSim {
    /// A cache-line simulator: images hold what fences persisted plus any
    /// subset of the lines flushed or stored since.
    pub fn new(seed: u64, capture_ppm: u64) -> Self {
        Self::with_mode(seed, capture_ppm, false)
    }

    /// A power-loss simulator of a file under the msync strategy (see the
    /// module documentation): images hold what msync and fsync made durable
    /// plus, per page changed since, its old or new content or a tear of both.
    pub fn power_loss(seed: u64, capture_ppm: u64) -> Self {
        Self::with_mode(seed, capture_ppm, true)
    }

    fn with_mode(seed: u64, capture_ppm: u64, pages: bool) -> Self {
        Self {
            pages,
            st: Mutex::new(State {
                durable_len: 0,
                size: 0,
                tear: None,
                persisted: Vec::new(),
                pending: HashMap::new(),
                rng: rand::rngs::SmallRng::seed_from_u64(seed),
                images: Vec::new(),
            }),
            capture_ppm: AtomicU64::new(capture_ppm),
            tag: AtomicU64::new(0),
            fences: AtomicU64::new(0),
            captured: AtomicU64::new(0),
        }
    }

    /// Whether this is the power-loss (page cache) simulator.
    pub fn is_power_loss(&self) -> bool {
        self.pages
    }

    /// Sets the tag recorded with images taken from now on (e.g. an operation number).
    pub fn set_tag(&self, tag: u64) {
        self.tag.store(tag, Ordering::SeqCst);
    }

    /// Advances the tag by one and returns its value before: a clock shared
    /// by threads, whose images record the clock when they were taken (an
    /// operation stamped `t` before an image tagged `g` has `t < g`).
    pub fn tick(&self) -> u64 {
        self.tag.fetch_add(1, Ordering::SeqCst)
    }

    /// Power-loss mode: from now on each page written since its last sync is
    /// written back (whole or torn) with probability `p_new`, and of those torn
    /// at sectors with probability `p_torn` (by default both are drawn per
    /// image). For tests that want many torn pages.
    pub fn set_tear(&self, p_new: f64, p_torn: f64) {
        self.st.lock().unwrap().tear = Some((p_new, p_torn));
    }

    /// Power-loss mode: the offsets of the pages whose cached content differs
    /// from the durable image (written and not synced since).
    pub fn pending_pages(&self, region: &Region) -> Vec<u64> {
        let st = self.st.lock().unwrap();
        let pg = os_page();
        let mut buf = vec![0u8; pg];
        let mut out = Vec::new();
        let n = (region.size() as usize).min(st.persisted.len()) / pg;
        for i in 0..n {
            region.read_racy((i * pg) as u64, &mut buf);
            if buf[..] != st.persisted[i * pg..(i + 1) * pg] {
                out.push((i * pg) as u64);
            }
        }
        out
    }
    pub fn set_capture_ppm(&self, ppm: u64) {
        self.capture_ppm.store(ppm, Ordering::SeqCst);
    }
    pub fn fences(&self) -> u64 {
        self.fences.load(Ordering::SeqCst)
    }
    pub fn captured(&self) -> u64 {
        self.captured.load(Ordering::SeqCst)
    }

    /// Takes the crash images collected so far.
    pub fn take_images(&self) -> Vec<CrashImage> {
        std::mem::take(&mut self.st.lock().unwrap().images)
    }

    pub(crate) fn reset_from(&self, region: &Region) {
        let mut st = self.st.lock().unwrap();
        st.persisted = region.snapshot();
        st.size = region.size();
        st.durable_len = region.size();
        st.pending.clear();
    }

    /// Maybe takes a crash image now (at the capture rate); `read` copies the
    /// mapping's bytes (power-loss mode).
    fn maybe_capture(&self, st: &mut State, read: &dyn Fn(u64, &mut [u8])) {
        let ppm = self.capture_ppm.load(Ordering::Relaxed);
        if ppm > 0 && st.rng.random_range(0..1_000_000) < ppm {
            let tag_before = self.tag.load(Ordering::SeqCst);
            let bytes = Self::build_pages(st, read);
            st.images.push(CrashImage {
                bytes,
                tag: self.tag.load(Ordering::SeqCst),
                tag_before,
                fence: self.fences.load(Ordering::SeqCst),
            });
            self.captured.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// Power-loss mode: an msync of `ranges` (offset, length; page aligned)
    /// is about to run. Maybe a crash image first; then the pages in the
    /// ranges are durable with their content now.
    pub(crate) fn on_msync(&self, ranges: &[(u64, u64)], read: &dyn Fn(u64, &mut [u8])) {
        self.fences.fetch_add(1, Ordering::SeqCst);
        let mut st = self.st.lock().unwrap();
        self.maybe_capture(&mut st, read);
        for &(off, len) in ranges {
            let end = (off + len).min(st.size).min(st.persisted.len() as u64);
            if off < end {
                read(off, &mut st.persisted[off as usize..end as usize]);
            }
        }
    }

    /// Power-loss mode: a write through the file is about to change the page
    /// cache (maybe a crash image first).
    pub(crate) fn on_write_through(&self, region: &Region) {
        let mut st = self.st.lock().unwrap();
        self.maybe_capture(&mut st, &|o, b| region.read_racy(o, b));
    }

    /// Power-loss mode: an fsync is about to run (maybe a crash image first);
    /// then every page, and the file's length, are durable.
    pub(crate) fn on_fsync(&self, region: &Region) {
        let mut st = self.st.lock().unwrap();
        self.maybe_capture(&mut st, &|o, b| region.read_racy(o, b));
        let size = st.size.min(region.size());
        if st.persisted.len() < size as usize {
            st.persisted.resize(size as usize, 0);
        }
        region.read_racy(0, &mut st.persisted[..size as usize]);
        st.durable_len = size;
    }

    /// Power-loss mode: a crash image from the durable image and the mapping
    /// (`read`).
    fn build_pages(st: &mut State, read: &dyn Fn(u64, &mut [u8])) -> Vec<u8> {
        const SECTOR: usize = 512;
        let pg = os_page();
        let size = st.size as usize;
        let mut img = st.persisted.clone();
        img.resize(size, 0);
        // Vary how much of the unsynced state survives, as the cache-line
        // mode does: none, all, or a random subset of a random density; and
        // how many of the pages written back were torn.
        let p_new: f64 = match st.rng.random_range(0..4u32) {
            0 => 0.0,
            1 => 1.0,
            2 => 0.5,
            _ => st.rng.random_range(0.0..1.0),
        };
        let p_torn: f64 = [0.0, 0.1, 0.5][st.rng.random_range(0..3usize)];
        let (p_new, p_torn) = st.tear.unwrap_or((p_new, p_torn));
        let mut cur = vec![0u8; pg];
        for i in 0..size / pg {
            let at = i * pg;
            read(at as u64, &mut cur);
            if cur[..] == img[at..at + pg] {
                continue;
            }
            if p_new <= 0.0 || (p_new < 1.0 && !st.rng.random_bool(p_new)) {
                continue;
            }
            if p_torn > 0.0 && st.rng.random_bool(p_torn) {
                for s in 0..pg / SECTOR {
                    if st.rng.random_bool(0.5) {
                        let r = s * SECTOR..(s + 1) * SECTOR;
                        img[at + r.start..at + r.end].copy_from_slice(&cur[r]);
                    }
                }
            } else {
                img[at..at + pg].copy_from_slice(&cur);
            }
        }
        // A length not yet made durable by an fsync may be lost.
        if (st.durable_len as usize) < size && st.rng.random_bool(0.5) {
            img.truncate(st.durable_len as usize);
        }
        img
    }

    pub(crate) fn on_flush(&self, off: u64, len: usize) {
        if len == 0 || self.pages {
            return;
        }
        let first = off / LINE as u64;
        let last = (off + len as u64 - 1) / LINE as u64;
        let mut st = self.st.lock().unwrap();
        let v = st.pending.entry(std::thread::current().id()).or_default();
        for l in first..=last {
            v.push(l * LINE as u64);
        }
    }

    pub(crate) fn on_fence(&self, region: &Region) {
        let lines = self.detach();
        self.on_fence_lines(region, lines);
    }

    /// Takes the lines the calling thread flushed since its last fence, for a
    /// fence completed later, maybe by another thread (`Region::detach_fence`).
    pub(crate) fn detach(&self) -> Vec<u64> {
        let mut st = self.st.lock().unwrap();
        st.pending
            .remove(&std::thread::current().id())
            .unwrap_or_default()
    }

    /// A fence over `lines`: maybe a crash image first (the lines not yet
    /// persisted), then the lines' current bytes persist.
    pub(crate) fn on_fence_lines(&self, region: &Region, lines: Vec<u64>) {
        let fence = self.fences.fetch_add(1, Ordering::SeqCst) + 1;
        let mut st = self.st.lock().unwrap();
        let ppm = self.capture_ppm.load(Ordering::Relaxed);
        if ppm > 0 && st.rng.random_range(0..1_000_000) < ppm {
            let tag_before = self.tag.load(Ordering::SeqCst);
            let img = Self::build(&mut st, region);
            st.images.push(CrashImage {
                bytes: img,
                tag: self.tag.load(Ordering::SeqCst),
                tag_before,
                fence,
            });
            self.captured.fetch_add(1, Ordering::SeqCst);
        }
        let size = region.size();
        for l in lines {
            if l + LINE as u64 <= size && l as usize + LINE <= st.persisted.len() {
                let mut buf = [0u8; LINE];
                region.read_racy(l, &mut buf);
                st.persisted[l as usize..l as usize + LINE].copy_from_slice(&buf);
            }
        }
    }

    /// Takes a crash image now (outside a fence), tagged with the current tag.
    pub fn capture_now(&self, region: &Region) -> CrashImage {
        let mut st = self.st.lock().unwrap();
        let tag_before = self.tag.load(Ordering::SeqCst);
        let bytes = if self.pages {
            Self::build_pages(&mut st, &|o, b| region.read_racy(o, b))
        } else {
            Self::build(&mut st, region)
        };
        self.captured.fetch_add(1, Ordering::SeqCst);
        CrashImage {
            bytes,
            tag: self.tag.load(Ordering::SeqCst),
            tag_before,
            fence: self.fences(),
        }
    }

    fn build(st: &mut State, region: &Region) -> Vec<u8> {
        let mut img = st.persisted.clone();
        // Vary how much of the unpersisted state survives: none, all, or a random
        // subset with a random density.
        let mode = st.rng.random_range(0..4u32);
        let p: f64 = match mode {
            0 => 0.0,
            1 => 1.0,
            2 => 0.5,
            _ => st.rng.random_range(0.0..1.0),
        };
        let n = (img.len().min(region.size() as usize)) / LINE;
        for i in 0..n {
            let off = (i * LINE) as u64;
            if region.line_differs(off, &img) && (p >= 1.0 || (p > 0.0 && st.rng.random_bool(p))) {
                region.read_racy(off, &mut img[i * LINE..(i + 1) * LINE]);
            }
        }
        img
    }

    pub(crate) fn on_grow(&self, _region: &Region, _old: u64, new: u64) {
        let mut st = self.st.lock().unwrap();
        if (st.persisted.len() as u64) < new {
            // The file's new pages are a hole: zeros, in memory and on disk.
            st.persisted.resize(new as usize, 0);
        }
        st.size = st.size.max(new);
    }
}

/// Writes a crash image to a (sparse) file so that it can be opened as a heap.
pub fn write_image(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .open(path)?;
    f.set_len(bytes.len() as u64)?;
    for (i, page) in bytes.chunks(4096).enumerate() {
        if page.iter().any(|&b| b != 0) {
            f.write_all_at(page, (i * 4096) as u64)?;
        }
    }
    Ok(())
}
