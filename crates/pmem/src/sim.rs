//! The crash simulator (tests).
//!
//! It keeps a *persisted image*: what the medium would hold. Every flush is recorded
//! for the flushing thread; at that thread's next fence the flushed lines are copied
//! from the mapping into the image. Before a fence applies, the simulator may take a
//! *crash image*: the persisted image plus a random subset of the cache lines that
//! still differ from the mapping (written but not yet durable: any of them may or
//! may not have reached the medium). Opening that image runs recovery on it.

use crate::persist::LINE;
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
    pub tag: u64,
    pub fence: u64,
}

struct State {
    persisted: Vec<u8>,
    pending: HashMap<ThreadId, Vec<u64>>,
    rng: rand::rngs::SmallRng,
    images: Vec<CrashImage>,
}

pub struct CrashSim {
    st: Mutex<State>,
    /// Probability (per million) that a fence takes a crash image first.
    capture_ppm: AtomicU64,
    tag: AtomicU64,
    fences: AtomicU64,
    captured: AtomicU64,
}

impl CrashSim {
    pub fn new(seed: u64, capture_ppm: u64) -> Self {
        Self {
            st: Mutex::new(State {
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

    /// Sets the tag recorded with images taken from now on (e.g. an operation number).
    pub fn set_tag(&self, tag: u64) {
        self.tag.store(tag, Ordering::SeqCst);
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
        st.pending.clear();
    }

    pub(crate) fn on_flush(&self, off: u64, len: usize) {
        if len == 0 {
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
            let img = Self::build(&mut st, region);
            st.images.push(CrashImage {
                bytes: img,
                tag: self.tag.load(Ordering::SeqCst),
                fence,
            });
            self.captured.fetch_add(1, Ordering::SeqCst);
        }
        let size = region.size();
        for l in lines {
            if l + LINE as u64 <= size && l as usize + LINE <= st.persisted.len() {
                let mut buf = [0u8; LINE];
                region.read_bytes(l, &mut buf);
                st.persisted[l as usize..l as usize + LINE].copy_from_slice(&buf);
            }
        }
    }

    /// Takes a crash image now (outside a fence), tagged with the current tag.
    pub fn capture_now(&self, region: &Region) -> CrashImage {
        let mut st = self.st.lock().unwrap();
        let bytes = Self::build(&mut st, region);
        self.captured.fetch_add(1, Ordering::SeqCst);
        CrashImage {
            bytes,
            tag: self.tag.load(Ordering::SeqCst),
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
                region.read_bytes(off, &mut img[i * LINE..(i + 1) * LINE]);
            }
        }
        img
    }

    pub(crate) fn on_grow(&self, _region: &Region, _old: u64, new: u64) {
        let mut st = self.st.lock().unwrap();
        if (st.persisted.len() as u64) < new {
            st.persisted.resize(new as usize, 0);
        }
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
