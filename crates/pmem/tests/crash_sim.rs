//! Crash-simulator test of the allocator and transactions.
//!
//! A workload of non-transactional inserts and deletes (NV-epoch style: unlinked
//! blocks are freed later through tickets), transactional replaces, multi-slot atomic
//! transactions, in-place transactional updates, aborted transactions, page runs and
//! huge blocks (with online growth) runs on a heap with the crash simulator attached.
//! At fences the simulator takes crash images (the persisted image plus a random
//! subset of the cache lines not yet durable). Every image is opened, recovered
//! (redo-log replay, leak sweep with the workload's reachability) and checked:
//!
//! - the allocator metadata passes `check_heap`;
//! - every slot holds either its state before or after the operation in flight (all
//!   slots of a multi-slot transaction together), so every completed operation is
//!   present and none is torn;
//! - every reachable block is allocated (no double free) and the allocated block
//!   count equals the reachable count (no leak);
//! - fresh allocations on the recovered heap never overlap a reachable block.
//!
//! Prints `crash-sim: N images, M inconsistent`; fails unless N >= 10,000 and M = 0.
//!
//! The same workload and checks run under the msync strategy with the power-loss
//! simulator (`CrashSim::power_loss`: images hold the pages msync and fsync made
//! durable plus, per page written since, its old or new content or a tear of both
//! at 512-byte sectors), including online growth (`set_len`, fsync). Prints
//! `power-loss-sim: N images, M inconsistent (pmem heap: ...)`.

use pmem::{CrashSim, Geometry, Heap, HeapOptions, PPtr, Strategy, ThreadHeap};
use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};
use std::path::{Path, PathBuf};
use std::sync::Arc;

const SLOTS: usize = 24;
const HDR: u64 = 32; // len, seq, birth, crc
const MIN_IMAGES: u64 = 10_000;
/// Power-loss images of this test (the engine's power-loss test adds its own).
const MIN_POWER_LOSS_IMAGES: u64 = 6_000;

fn min_images(floor: u64) -> u64 {
    std::env::var("EMBER_CRASH_IMAGES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(floor)
        .max(floor)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct SlotState {
    seq: u64,
    len: u64,
    birth: u64,
}

type Model = Vec<Option<SlotState>>;

fn opts() -> HeapOptions {
    HeapOptions {
        size: 2 << 20,
        max_size: 8 << 20,
        geometry: Geometry::small(),
        strategy: Strategy::FenceOnly,
        ..Default::default()
    }
}

fn msync_opts() -> HeapOptions {
    HeapOptions {
        strategy: Strategy::Msync,
        ..opts()
    }
}

fn crc(len: u64, seq: u64, birth: u64) -> u64 {
    let mut h =
        len.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ seq.rotate_left(17) ^ birth.rotate_left(41);
    h ^= h >> 31;
    h.wrapping_mul(0xBF58_476D_1CE4_E5B9) | 1
}

fn pattern_byte(birth: u64, i: u64) -> u8 {
    (birth.wrapping_mul(31).wrapping_add(i.wrapping_mul(7)) >> 3) as u8
}

/// Bytes of pattern written (and verified) after the header: all of it for small
/// blocks, a prefix and a suffix for large ones.
fn pattern_ranges(len: u64) -> Vec<(u64, u64)> {
    let body = len - HDR;
    if body <= 512 {
        vec![(HDR, len)]
    } else {
        vec![(HDR, HDR + 256), (len - 256, len)]
    }
}

fn content(len: u64, seq: u64, birth: u64) -> Vec<(u64, Vec<u8>)> {
    let mut hdr = Vec::with_capacity(32);
    for w in [len, seq, birth, crc(len, seq, birth)] {
        hdr.extend_from_slice(&w.to_le_bytes());
    }
    let mut out = vec![(0, hdr)];
    for (s, e) in pattern_ranges(len) {
        out.push((s, (s..e).map(|i| pattern_byte(birth, i)).collect()));
    }
    out
}

struct Work {
    heap: Heap,
    th: ThreadHeap,
    table: u64,
    model: Model,
    limbo: Vec<pmem::FreeTicket>,
    seq: u64,
    rng: SmallRng,
}

fn slot_off(table: u64, i: usize) -> u64 {
    table + 8 * i as u64
}

fn pick_len(rng: &mut SmallRng) -> u64 {
    match rng.random_range(0..100u32) {
        0..=69 => rng.random_range(HDR..600),
        70..=89 => rng.random_range(600..70_000),
        90..=98 => rng.random_range(70_000..400_000),
        _ => rng.random_range(1_000_000..1_500_000), // huge: more than a 1 MiB chunk's pages
    }
}

impl Work {
    fn write_block(&self, p: u64, st: SlotState) {
        let r = self.heap.region();
        for (o, bytes) in content(st.len, st.seq, st.birth) {
            r.write_bytes(p + o, &bytes);
            r.flush(p + o, bytes.len());
        }
    }

    fn slot_ptr(&self, i: usize) -> u64 {
        self.heap.region().read(slot_off(self.table, i))
    }

    /// Runs one random operation; returns the slots it touches (for the atomicity
    /// check) and the model after it.
    fn step(&mut self) -> Result<(), pmem::Error> {
        let i = self.rng.random_range(0..SLOTS);
        let op = self.rng.random_range(0..100u32);
        self.seq += 1;
        let seq = self.seq;
        match (op, self.model[i]) {
            // Non-transactional insert into an empty slot.
            (0..=24, None) => {
                let len = pick_len(&mut self.rng);
                let p = self.th.alloc(len)?;
                let st = SlotState {
                    seq,
                    len,
                    birth: seq,
                };
                self.write_block(p.offset(), st);
                self.heap.region().fence();
                let so = slot_off(self.table, i);
                self.heap.region().write(so, &p.offset());
                self.heap.region().persist(so, 8);
                self.model[i] = Some(st);
            }
            // Non-transactional delete: announce, unlink durably, free later.
            (0..=24, Some(_)) => {
                let p = PPtr::from_raw(self.slot_ptr(i));
                let t = self.th.prepare_free(p)?;
                let so = slot_off(self.table, i);
                self.heap.region().write(so, &0u64);
                self.heap.region().persist(so, 8);
                self.limbo.push(t);
                self.model[i] = None;
            }
            // Transactional replace (or insert).
            (25..=49, old) => {
                let len = pick_len(&mut self.rng);
                let st = SlotState {
                    seq,
                    len,
                    birth: seq,
                };
                let mut tx = self.th.begin();
                let nb = tx.alloc(len)?;
                for (o, bytes) in content(len, seq, seq) {
                    tx.write(nb.offset() + o, &bytes)?;
                }
                tx.write_u64(slot_off(self.table, i), nb.offset())?;
                if old.is_some() {
                    let oldp: u64 = tx.read_u64(slot_off(self.table, i))?;
                    debug_assert_eq!(oldp, nb.offset());
                    tx.free(PPtr::from_raw(
                        self.heap.region().read(slot_off(self.table, i)),
                    ))?;
                }
                tx.commit()?;
                self.model[i] = Some(st);
            }
            // Multi-slot atomic transaction: up to 4 slots change together.
            (50..=64, _) => {
                let k = self.rng.random_range(2..=4usize);
                let mut slots: Vec<usize> =
                    (0..k).map(|_| self.rng.random_range(0..SLOTS)).collect();
                slots.sort();
                slots.dedup();
                let mut tx = self.th.begin();
                let mut news = Vec::new();
                for &s in &slots {
                    tx.begin_nested();
                    let len = self.rng.random_range(HDR..2000);
                    let st = SlotState {
                        seq,
                        len,
                        birth: seq * 64 + s as u64,
                    };
                    let nb = tx.alloc(len)?;
                    for (o, bytes) in content(st.len, st.seq, st.birth) {
                        tx.write(nb.offset() + o, &bytes)?;
                    }
                    let so = slot_off(self.table, s);
                    let old: u64 = self.heap.region().read(so);
                    tx.write_u64(so, nb.offset())?;
                    if old != 0 {
                        tx.free(PPtr::from_raw(old))?;
                    }
                    tx.commit_nested()?;
                    news.push((s, st));
                }
                tx.commit()?;
                for (s, st) in news {
                    self.model[s] = Some(st);
                }
            }
            // In-place transactional update of an existing block's header.
            (65..=79, Some(cur)) => {
                let p = self.slot_ptr(i);
                let st = SlotState { seq, ..cur };
                let mut tx = self.th.begin();
                let (_, hdr) = content(st.len, st.seq, st.birth).swap_remove(0);
                tx.write(p + 8, &hdr[8..16])?; // seq
                tx.write(p + 24, &hdr[24..32])?; // crc
                tx.commit()?;
                self.model[i] = Some(st);
            }
            // Aborted transaction: allocates, writes, frees, then gives up.
            (80..=87, old) => {
                let mut tx = self.th.begin();
                let nb = tx.alloc(100)?;
                tx.write_u64(slot_off(self.table, i), nb.offset())?;
                if old.is_some() {
                    tx.free(PPtr::from_raw(
                        self.heap.region().read(slot_off(self.table, i)),
                    ))?;
                }
                tx.abort();
            }
            // Reclaim: free the limbo list with one fence.
            _ => {
                let ts = std::mem::take(&mut self.limbo);
                self.heap.free_tickets(ts)?;
            }
        }
        self.th.end_op();
        Ok(())
    }
}

/// Verifies one crash image; returns a description of the first problem.
fn verify(
    path: &Path,
    img: &pmem::CrashImage,
    before: &Model,
    after: &Model,
    touched_all: bool,
) -> Result<(), String> {
    pmem::sim::write_image(path, &img.bytes).map_err(|e| e.to_string())?;
    let rec = Heap::open(path, &opts()).map_err(|e| format!("open: {e}"))?;
    let h = rec.heap().clone();
    let table = h.root().offset();
    if table == 0 {
        return Err("root lost".into());
    }
    let slots: Vec<u64> = (0..SLOTS)
        .map(|i| h.region().read(slot_off(table, i)))
        .collect();
    let mut reach: std::collections::HashSet<u64> =
        slots.iter().copied().filter(|&p| p != 0).collect();
    reach.insert(table);
    drop(h);
    let (heap, _rep) = rec
        .finish(|b| reach.contains(&b.offset()))
        .map_err(|e| format!("finish: {e}"))?;
    let rep = pmem::check_heap(&heap);
    if !rep.ok() {
        return Err(format!("check: {}", rep.problems.join("; ")));
    }
    let r = heap.region();
    let mut img_state: Model = vec![None; SLOTS];
    for (i, &p) in slots.iter().enumerate() {
        if p == 0 {
            continue;
        }
        if !heap.is_allocated(PPtr::from_raw(p)) {
            let loc = heap.usable_size(PPtr::from_raw(p));
            return Err(format!(
                "slot {i} points to free block {p:#x} ({loc:?}) before={:?} after={:?}",
                before[i], after[i]
            ));
        }
        let len: u64 = r.read(p);
        let seq: u64 = r.read(p + 8);
        let birth: u64 = r.read(p + 16);
        let c: u64 = r.read(p + 24);
        if c != crc(len, seq, birth)
            || len < HDR
            || heap.usable_size(PPtr::from_raw(p)).unwrap_or(0) < len
        {
            return Err(format!("slot {i}: torn header at {p:#x}"));
        }
        for (s, e) in pattern_ranges(len) {
            let mut buf = vec![0u8; (e - s) as usize];
            r.read_bytes(p + s, &mut buf);
            if buf
                .iter()
                .enumerate()
                .any(|(k, &b)| b != pattern_byte(birth, s + k as u64))
            {
                return Err(format!("slot {i}: torn contents at {p:#x}"));
            }
        }
        img_state[i] = Some(SlotState { seq, len, birth });
    }
    if rep.blocks != reach.len() as u64 {
        return Err(format!(
            "{} blocks allocated but {} reachable (leak)",
            rep.blocks,
            reach.len()
        ));
    }
    let mut side = None; // all-before / all-after for the multi-slot case
    for i in 0..SLOTS {
        let b = img_state[i] == before[i];
        let a = img_state[i] == after[i];
        if !a && !b {
            return Err(format!(
                "slot {i}: {:?} is neither before {:?} nor after {:?}",
                img_state[i], before[i], after[i]
            ));
        }
        if touched_all && before[i] != after[i] {
            match side {
                None => side = Some(a),
                Some(s) if s != a => return Err(format!("slot {i}: multi-slot transaction torn")),
                _ => {}
            }
        }
    }
    // The recovered heap must allocate without handing out anything reachable.
    if img.fence.is_multiple_of(7) {
        let mut th = heap.thread().map_err(|e| e.to_string())?;
        let mut ranges: Vec<(u64, u64)> = reach
            .iter()
            .map(|&p| (p, p + heap.usable_size(PPtr::from_raw(p)).unwrap()))
            .collect();
        ranges.sort();
        for k in 0..40u64 {
            let sz = [24, 100, 700, 5000, 90_000][k as usize % 5];
            let p = th
                .alloc(sz)
                .map_err(|e| format!("alloc after recovery: {e}"))?;
            let (s, e) = (p.offset(), p.offset() + sz);
            if ranges.iter().any(|&(a, b)| s < b && a < e) {
                return Err(format!("allocation {s:#x} overlaps a reachable block"));
            }
            ranges.push((s, e));
        }
    }
    Ok(())
}

fn shm_dir() -> PathBuf {
    let d = Path::new("/dev/shm");
    if d.is_dir() {
        d.to_path_buf()
    } else {
        std::env::temp_dir()
    }
}

#[test]
fn crash_sim_allocator_and_transactions() {
    run_sim(false);
}

#[test]
fn power_loss_sim_allocator_and_transactions() {
    run_sim(true);
}

/// The workload under the cache-line simulator (fence-only strategy) or the
/// power-loss simulator (msync).
fn run_sim(power_loss: bool) {
    let run_opts = if power_loss { msync_opts() } else { opts() };
    let dir = tempfile::tempdir_in(shm_dir()).unwrap();
    let img_path = dir.path().join("image.heap");
    let mut images = 0u64;
    let mut bad = 0u64;
    // EMBER_CRASH_FIRST_RUN replays from a given run (seeds are per run);
    // EMBER_CRASH_KEEP=DIR saves failing images there.
    let mut run: u64 = std::env::var("EMBER_CRASH_FIRST_RUN")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .map_or(0, |r| r.saturating_sub(1));
    let keep = std::env::var_os("EMBER_CRASH_KEEP").map(PathBuf::from);
    let started = std::time::Instant::now();
    let target = min_images(if power_loss {
        MIN_POWER_LOSS_IMAGES
    } else {
        MIN_IMAGES
    });
    while images < target {
        run += 1;
        let path = dir.path().join(format!("run{run}.heap"));
        // Set up the root table, then reopen with the simulator attached.
        {
            let heap = Heap::create(&path, &run_opts).unwrap();
            let mut th = heap.thread().unwrap();
            let t = th.alloc_zeroed(8 * SLOTS as u64).unwrap();
            heap.region().fence();
            heap.set_root(t).unwrap();
        }
        let sim = Arc::new(if power_loss {
            CrashSim::power_loss(run, 0)
        } else {
            CrashSim::new(run, 0)
        });
        let (heap, _) = Heap::open_sim(&path, &run_opts, sim.clone())
            .unwrap()
            .finish_clean()
            .unwrap();
        let th = heap.thread().unwrap();
        let table = heap.root().offset();
        let mut w = Work {
            heap: heap.clone(),
            th,
            table,
            model: vec![None; SLOTS],
            limbo: Vec::new(),
            seq: 0,
            rng: SmallRng::seed_from_u64(run * 7919),
        };
        sim.set_capture_ppm(400_000);
        for op in 1..=300u64 {
            sim.set_tag(op);
            let before = w.model.clone();
            match w.step() {
                Ok(()) => {}
                Err(pmem::Error::HeapFull { .. }) => {
                    // A full heap is a clean error; make room and go on.
                    let ts = std::mem::take(&mut w.limbo);
                    w.heap.free_tickets(ts).unwrap();
                }
                Err(e) => panic!("run {run} op {op}: {e}"),
            }
            let after = w.model.clone();
            let touched_all = true;
            for img in sim.take_images() {
                images += 1;
                if let Err(e) = verify(&img_path, &img, &before, &after, touched_all) {
                    bad += 1;
                    if let Some(k) = &keep {
                        let _ = pmem::sim::write_image(
                            &k.join(format!("fail-{run}-{op}-{}.heap", img.fence)),
                            &img.bytes,
                        );
                    }
                    if bad <= 5 {
                        eprintln!("run {run} op {op} fence {}: {e}", img.fence);
                    }
                }
            }
        }
        drop(w);
        drop(heap);
        let _ = std::fs::remove_file(&path);
    }
    // Written to the process's stderr directly so that it shows in the test log
    // (the harness captures only the print macros).
    use std::io::Write;
    let name = if power_loss {
        "power-loss-sim"
    } else {
        "crash-sim"
    };
    let detail = if power_loss { "pmem heap: " } else { "" };
    let _ = writeln!(
        std::io::stderr(),
        "{name}: {images} images, {bad} inconsistent ({detail}{run} runs, {:.1} s)",
        started.elapsed().as_secs_f64()
    );
    assert_eq!(bad, 0, "{name} found inconsistent images");
    assert!(images >= target);
}
