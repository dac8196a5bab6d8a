//! The msync strategy's smaller hazards:
//!
//! - an I/O error of an fsync or a file extension is recorded in the region's
//!   failed state (`health`), as an msync's is: Linux reports a write-back error
//!   once per open file, so a later msync over the failed page says nothing;
//! - a thread's msync list is kept per region: a fence on heap A syncs only A's
//!   ranges (B's may be unmapped, and B's errors are B's);
//! - flushes never fenced end up synced: at the flushing thread's exit, and when
//!   a detached fence is dropped.
//!
//! The power-loss simulator (`CrashSim::power_loss`) says which pages are not yet
//! durable (`pending_pages`).

use pmem::{CrashSim, Geometry, Heap, HeapOptions, Strategy};
use std::path::Path;
use std::sync::mpsc;
use std::sync::Arc;

fn opts() -> HeapOptions {
    HeapOptions {
        size: 3 << 20,
        max_size: 16 << 20,
        geometry: Geometry::small(),
        strategy: Strategy::Msync,
        ..Default::default()
    }
}

fn dir() -> tempfile::TempDir {
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        tempfile::tempdir_in(shm).unwrap()
    } else {
        tempfile::tempdir().unwrap()
    }
}

/// A heap with one allocated block; returns the heap and the block's offset.
fn heap_with_block(path: &Path, sim: Option<Arc<CrashSim>>) -> (Heap, u64) {
    Heap::create(path, &opts()).unwrap();
    let rec = match sim {
        Some(s) => Heap::open_sim(path, &opts(), s).unwrap(),
        None => Heap::open(path, &opts()).unwrap(),
    };
    let (heap, _) = rec.finish_clean().unwrap();
    let mut th = heap.thread().unwrap();
    let p = th.alloc(20_000).unwrap();
    heap.region().fence();
    (heap, p.offset())
}

#[test]
fn an_fsync_failure_is_recorded() {
    let d = dir();
    let path = d.path().join("h");
    let (heap, _) = heap_with_block(&path, None);
    // The file is already long enough: growing the heap only fsyncs it.
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(8 << 20)
        .unwrap();
    heap.region().fail_next_file_op(libc::EIO);
    assert!(heap.grow(6 << 20).is_err());
    let e = heap.region().health().unwrap_err();
    assert!(e.to_string().contains("Input/output error"), "{e}");
    // A later fence (msync) that succeeds does not clear it.
    heap.region().persist(0, 8);
    assert!(heap.region().health().is_err());
}

#[test]
fn a_file_extension_failure_is_recorded() {
    let d = dir();
    let path = d.path().join("h");
    let (heap, _) = heap_with_block(&path, None);
    heap.region().fail_next_file_op(libc::EIO);
    assert!(heap.grow(6 << 20).is_err());
    assert!(heap.region().health().is_err());
}

/// A file system with no room for the growth fails the growth (the write
/// that needed it gets an error) but loses nothing written before: the heap
/// stays healthy, and grows once room is found.
#[test]
fn no_room_to_extend_is_not_a_failed_persist() {
    let d = dir();
    let path = d.path().join("h");
    let (heap, _) = heap_with_block(&path, None);
    heap.region().fail_next_file_op(libc::ENOSPC);
    let e = heap.grow(6 << 20).unwrap_err();
    assert!(matches!(e, pmem::Error::NoSpace { .. }), "{e}");
    heap.region().health().unwrap();
    heap.grow(6 << 20).unwrap();
    heap.region().health().unwrap();
}

/// Runs `f` on a new thread, one step per message, in lockstep with the caller.
type Stepper = (
    mpsc::Sender<u32>,
    mpsc::Receiver<()>,
    std::thread::JoinHandle<()>,
);

fn stepper<F: FnMut(u32) + Send + 'static>(mut f: F) -> Stepper {
    let (go, go_rx) = mpsc::channel::<u32>();
    let (done, done_rx) = mpsc::channel();
    let t = std::thread::spawn(move || {
        while let Ok(step) = go_rx.recv() {
            f(step);
            if done.send(()).is_err() {
                break;
            }
        }
    });
    (go, done_rx, t)
}

#[test]
fn a_fence_syncs_only_its_own_heap() {
    let d = dir();
    let (a, pa) = heap_with_block(&d.path().join("a"), None);
    let sim = Arc::new(CrashSim::power_loss(1, 0));
    let (b, pb) = heap_with_block(&d.path().join("b"), Some(sim.clone()));
    let page = pb & !(pmem::persist::os_page() as u64 - 1);

    // One thread flushes on B, fences on A: B's page is still pending; then
    // fences on B: synced.
    let (a2, b2) = (a.clone(), b.clone());
    let (go, done, t) = stepper(move |step| match step {
        0 => {
            b2.region().write_bytes(pb, b"B's bytes");
            b2.region().flush(pb, 9);
        }
        1 => a2.region().persist(pa, 8),
        2 => b2.region().fence(),
        _ => {}
    });
    for step in 0..3 {
        go.send(step).unwrap();
        done.recv().unwrap();
        let pending = sim.pending_pages(b.region()).contains(&page);
        assert_eq!(pending, step < 2, "step {step}");
    }
    a.region().health().unwrap();
    b.region().health().unwrap();
    drop(go);
    t.join().unwrap();

    // The thread flushes on B again; B is closed (by another thread); the
    // thread's fence on A leaves A healthy (it does not msync B's ranges,
    // which are unmapped now).
    let b3 = b.clone();
    let a3 = a.clone();
    let mut b3 = Some(b3);
    let (go, done, _t) = stepper(move |step| match step {
        0 => {
            let b = b3.take().unwrap();
            b.region().write_bytes(pb, b"again");
            b.region().flush(pb, 5);
        }
        1 => a3.region().persist(pa, 8),
        _ => {}
    });
    go.send(0).unwrap();
    done.recv().unwrap();
    drop(b);
    go.send(1).unwrap();
    done.recv().unwrap();
    a.region().health().unwrap();
}

#[test]
fn unfenced_flushes_are_synced_at_thread_exit() {
    let d = dir();
    let sim = Arc::new(CrashSim::power_loss(2, 0));
    let (heap, p) = heap_with_block(&d.path().join("h"), Some(sim.clone()));
    let page = p & !(pmem::persist::os_page() as u64 - 1);
    let (flushed, flushed_rx) = mpsc::channel();
    let (exit, exit_rx) = mpsc::channel::<()>();
    let h2 = heap.clone();
    let t = std::thread::spawn(move || {
        h2.region().write_bytes(p, b"never fenced");
        h2.region().flush(p, 12);
        flushed.send(()).unwrap();
        exit_rx.recv().unwrap();
    });
    flushed_rx.recv().unwrap();
    assert!(sim.pending_pages(heap.region()).contains(&page));
    exit.send(()).unwrap();
    t.join().unwrap();
    assert!(
        !sim.pending_pages(heap.region()).contains(&page),
        "a thread's unfenced flush was not synced at its exit"
    );
    heap.region().health().unwrap();
}

#[test]
fn a_dropped_detached_fence_syncs() {
    let d = dir();
    let sim = Arc::new(CrashSim::power_loss(3, 0));
    let (heap, p) = heap_with_block(&d.path().join("h"), Some(sim.clone()));
    let page = p & !(pmem::persist::os_page() as u64 - 1);
    let r = heap.region();
    r.write_bytes(p, b"detached");
    r.flush(p, 8);
    let f = r.detach_fence();
    // Detached: this thread's next fence no longer covers it.
    r.fence();
    assert!(sim.pending_pages(r).contains(&page));
    drop(f);
    assert!(
        !sim.pending_pages(r).contains(&page),
        "a dropped detached fence lost its ranges"
    );
    r.health().unwrap();
}

#[test]
fn the_power_loss_sim_keeps_a_synced_page_value_and_tears_unsynced_pages() {
    let d = dir();
    let sim = Arc::new(CrashSim::power_loss(4, 0));
    let (heap, p) = heap_with_block(&d.path().join("h"), Some(sim.clone()));
    let pg = pmem::persist::os_page() as u64;
    let page = (p + pg - 1) & !(pg - 1);
    let r = heap.region();
    // Synced with 1s, then written with 2s and not synced.
    r.fill(page, pg as usize, 1);
    r.persist(page, pg as usize);
    r.fill(page, pg as usize, 2);
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..200 {
        let img = sim.capture_now(r);
        let bytes = &img.bytes[page as usize..(page + pg) as usize];
        // Sector by sector: old or new, never anything else.
        let sectors: Vec<u8> = bytes
            .chunks(512)
            .map(|s| {
                assert!(s.iter().all(|&b| b == s[0]), "a sector torn inside");
                assert!(s[0] == 1 || s[0] == 2, "a value never synced nor written");
                s[0]
            })
            .collect();
        let kind = if sectors.iter().all(|&s| s == 1) {
            "old"
        } else if sectors.iter().all(|&s| s == 2) {
            "new"
        } else {
            "torn"
        };
        seen.insert(kind);
    }
    assert_eq!(seen.len(), 3, "only {seen:?} seen");
}
