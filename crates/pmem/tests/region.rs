//! Region and superblock: creation, refusal of bad files with named problems, the
//! A/B superblock fallback, the file lock, growth, strategies.

use pmem::layout::{Superblock, SB_A, SB_B, SB_LEN};
use pmem::{Error, Geometry, Heap, HeapOptions, Strategy};
use std::os::unix::fs::FileExt;
use std::path::Path;

fn opts() -> HeapOptions {
    HeapOptions {
        size: 3 << 20,
        geometry: Geometry::small(),
        ..Default::default()
    }
}

fn make(path: &Path) {
    let heap = Heap::create(path, &opts()).unwrap();
    let mut th = heap.thread().unwrap();
    let p = th.alloc(100).unwrap();
    heap.region().write_bytes(p.offset(), b"persisted");
    heap.region().persist(p.offset(), 9);
    heap.set_root(p).unwrap();
}

fn open_err(path: &Path) -> Error {
    match Heap::open(path, &opts()) {
        Ok(_) => panic!("{} opened", path.display()),
        Err(e) => e,
    }
}

fn current_sb_off(path: &Path) -> u64 {
    let f = std::fs::File::open(path).unwrap();
    let mut best = (0, SB_A);
    for off in [SB_A, SB_B] {
        let mut b = [0u8; SB_LEN];
        f.read_exact_at(&mut b, off).unwrap();
        if let Ok(Some(sb)) = Superblock::decode(path, &b) {
            if sb.seq >= best.0 {
                best = (sb.seq, off);
            }
        }
    }
    best.1
}

#[test]
fn create_reopen_and_generation() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("a.heap");
    make(&p);
    let g1 = {
        let (h, rep) = Heap::open(&p, &opts()).unwrap().finish_clean().unwrap();
        assert!(rep.was_clean);
        let mut b = [0u8; 9];
        h.region().read_bytes(h.root().offset(), &mut b);
        assert_eq!(&b, b"persisted");
        h.region().generation()
    };
    let (h, _) = Heap::open(&p, &opts()).unwrap().finish_clean().unwrap();
    assert_eq!(h.region().generation(), g1 + 1);
    // Creating over an existing file is refused.
    assert!(matches!(
        Heap::create(&p, &opts()),
        Err(Error::Exists { .. })
    ));
}

#[test]
fn refuses_foreign_empty_and_missing_files() {
    let d = tempfile::tempdir().unwrap();
    let foreign = d.path().join("foreign.txt");
    std::fs::write(&foreign, "hello world, this is not a heap\n".repeat(4096)).unwrap();
    let e = open_err(&foreign);
    assert!(matches!(e, Error::NotAHeap { .. }), "{e}");
    assert!(e.to_string().contains("foreign.txt"), "{e}");

    let empty = d.path().join("empty.heap");
    std::fs::write(&empty, b"").unwrap();
    assert!(matches!(open_err(&empty), Error::NotAHeap { .. }));

    assert!(matches!(
        open_err(&d.path().join("missing")),
        Error::Io { .. }
    ));
    assert!(matches!(
        open_err(d.path()),
        Error::Io { .. } | Error::NotAHeap { .. }
    ));
}

#[test]
fn refuses_truncated_heap() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("t.heap");
    make(&p);
    let f = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
    f.set_len(1 << 20).unwrap();
    let e = open_err(&p);
    assert!(matches!(e, Error::Truncated { .. }), "{e}");
    assert!(e.to_string().contains("truncated"), "{e}");
}

#[test]
fn refuses_newer_format_version() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("n.heap");
    make(&p);
    let off = current_sb_off(&p);
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&p)
        .unwrap();
    let mut b = [0u8; SB_LEN];
    f.read_exact_at(&mut b, off).unwrap();
    let mut sb = Superblock::decode(&p, &b).unwrap().unwrap();
    sb.version += 1;
    f.write_all_at(&sb.encode(), off).unwrap();
    let e = open_err(&p);
    assert!(matches!(e, Error::NewerVersion { .. }), "{e}");
}

#[test]
fn torn_superblock_falls_back_to_the_other_copy() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("s.heap");
    make(&p);
    let off = current_sb_off(&p);
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&p)
        .unwrap();
    f.write_all_at(&[0xAB; 40], off + 40).unwrap(); // tear the newest copy
    drop(f);
    let (h, _) = Heap::open(&p, &opts()).unwrap().finish_clean().unwrap();
    assert!(!h.root().is_null(), "root from the older copy");
    drop(h);
    // Both copies torn: refused as corrupt.
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&p)
        .unwrap();
    f.write_all_at(&[0xCD; 40], SB_A + 40).unwrap();
    f.write_all_at(&[0xCD; 40], SB_B + 40).unwrap();
    let e = open_err(&p);
    assert!(matches!(e, Error::Corrupt { .. }), "{e}");
}

#[test]
fn second_opener_gets_in_use() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("l.heap");
    make(&p);
    let (_h, _) = Heap::open(&p, &opts()).unwrap().finish_clean().unwrap();
    assert!(matches!(open_err(&p), Error::InUse { .. }));
    assert!(matches!(
        Heap::open_check(&p).err().unwrap(),
        Error::InUse { .. }
    ));
}

#[test]
fn grows_online_and_keeps_pointers() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("g.heap");
    let o = HeapOptions {
        max_size: 64 << 20,
        ..opts()
    };
    let heap = Heap::create(&p, &o).unwrap();
    let first = heap.region().size();
    let mut th = heap.thread().unwrap();
    let a = th.alloc(64).unwrap();
    heap.region().write(a.offset(), &0x1234u64);
    let atomic = heap.region().atomic_u64(a.offset());
    let mut blocks = Vec::new();
    for _ in 0..40 {
        blocks.push(th.alloc(500_000).unwrap());
    }
    assert!(heap.region().size() > first);
    // The same reference still reads the same word: the mapping never moved.
    assert_eq!(atomic.load(std::sync::atomic::Ordering::Relaxed), 0x1234);
    heap.grow(heap.region().size() + (8 << 20)).unwrap();
    let size = heap.region().size();
    assert_eq!(std::fs::metadata(&p).unwrap().len(), size);
    for b in &blocks {
        th.free(*b).unwrap();
    }
    drop(th);
    drop(heap);
    let (h, _) = Heap::open(&p, &o).unwrap().finish_clean().unwrap();
    assert_eq!(h.region().size(), size);
    assert!(pmem::check_heap(&h).ok());
}

#[test]
fn heap_full_is_an_error_and_recoverable() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("f.heap");
    let heap = Heap::create(&p, &opts()).unwrap();
    let mut th = heap.thread().unwrap();
    let mut v = Vec::new();
    let e = loop {
        match th.alloc(40_000) {
            Ok(b) => v.push(b),
            Err(e) => break e,
        }
    };
    assert!(matches!(e, Error::HeapFull { .. }), "{e}");
    assert!(matches!(
        th.alloc(1 << 40),
        Err(Error::TooLarge(_) | Error::HeapFull { .. })
    ));
    th.free(v.pop().unwrap()).unwrap();
    th.alloc(40_000).unwrap();
}

#[test]
fn every_supported_strategy_round_trips() {
    for st in [
        Strategy::Clwb,
        Strategy::Clflushopt,
        Strategy::Clflush,
        Strategy::FenceOnly,
        Strategy::Msync,
    ] {
        if !st.supported() {
            continue;
        }
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("s.heap");
        let o = HeapOptions {
            strategy: st,
            fence_ns: 50,
            ..opts()
        };
        let heap = Heap::create(&p, &o).unwrap();
        assert_eq!(heap.region().strategy(), st);
        let mut th = heap.thread().unwrap();
        let before = heap.region().persist_stats();
        let b = th.alloc(64).unwrap();
        heap.region().write_bytes(b.offset(), &[7u8; 64]);
        heap.region().persist(b.offset(), 64);
        let after = heap.region().persist_stats();
        assert!(after.fences > before.fences, "{st:?}");
        assert!(after.flushes > before.flushes, "{st:?}");
        if st == Strategy::Msync {
            assert!(after.msyncs > before.msyncs);
        }
        heap.set_root(b).unwrap();
        drop(th);
        drop(heap);
        let (h, _) = Heap::open(&p, &o).unwrap().finish_clean().unwrap();
        let mut buf = [0u8; 64];
        h.region().read_bytes(h.root().offset(), &mut buf);
        assert_eq!(buf, [7u8; 64], "{st:?}");
    }
}

/// The node-read emulation knob: the region reports it, and each charged read
/// waits at least that long (a lower bound, so it holds on a loaded machine);
/// without the knob nothing is charged.
#[test]
fn read_latency_emulation_charges_each_read() {
    let d = tempfile::tempdir().unwrap();
    let o = HeapOptions {
        read_ns: 20_000,
        ..opts()
    };
    let heap = Heap::create(&d.path().join("r.heap"), &o).unwrap();
    assert_eq!(heap.region().read_ns(), 20_000);
    let t = std::time::Instant::now();
    for _ in 0..10 {
        heap.region().emulate_read();
    }
    assert!(t.elapsed() >= std::time::Duration::from_micros(200));
    drop(heap);
    let plain = Heap::create(&d.path().join("p.heap"), &opts()).unwrap();
    assert_eq!(plain.region().read_ns(), 0);
}

/// Minor page faults this thread has taken so far.
fn thread_minor_faults() -> i64 {
    // SAFETY: `rusage` is plain C data, for which all zeroes is a valid value.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage only writes the struct it is given, a live local.
    assert_eq!(unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut ru) }, 0);
    ru.ru_minflt
}

#[test]
fn populate_maps_pages_writable_without_changing_them() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("pop.heap");
    let o = HeapOptions {
        size: 16 << 20,
        ..opts()
    };
    let heap = Heap::create(&p, &o).unwrap();
    let r = heap.region();
    let mut th = heap.thread().unwrap();
    const PAGES: u64 = 512;
    let a = th.alloc(PAGES * 4096).unwrap().offset();
    let b = th.alloc(PAGES * 4096).unwrap().offset();
    r.write_bytes(a + 100, b"kept");
    r.persist(a + 100, 4);

    // Outside the heap or empty: refused, nothing done.
    assert!(!r.populate(r.size() - 4096, 8192));
    assert!(!r.populate(a, 0));
    if !r.populate(a, PAGES * 4096) {
        eprintln!("populate: MADV_POPULATE_WRITE not supported by this kernel; skipped");
        return;
    }
    let mut kept = [0u8; 4];
    r.read_bytes(a + 100, &mut kept);
    assert_eq!(&kept, b"kept", "populate changed the heap's bytes");

    // Stores into populated pages take (almost) no faults; into untouched pages
    // of a sparse file, one each.
    let touch = |base: u64| {
        let before = thread_minor_faults();
        for i in 0..PAGES {
            r.write_bytes(base + i * 4096 + 8, &[1]);
        }
        thread_minor_faults() - before
    };
    let populated = touch(a);
    let cold = touch(b);
    assert!(
        populated < PAGES as i64 / 8,
        "{populated} faults writing {PAGES} populated pages"
    );
    assert!(
        cold >= PAGES as i64 / 2,
        "only {cold} faults writing {PAGES} untouched pages: the comparison says nothing"
    );
}

/// Bytes written through the file are what the mapping reads, take no page
/// fault in the writer, count as writes through, and become durable with a
/// flush and fence of their range (a copy of the file then holds them). Pages
/// populated read-only keep their bytes. A simulated region refuses.
#[test]
fn write_through_lands_in_the_page_cache_the_mapping_reads() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("wt.heap");
    let o = HeapOptions {
        size: 16 << 20,
        strategy: Strategy::Msync,
        ..opts()
    };
    let heap = Heap::create(&p, &o).unwrap();
    let r = heap.region();
    let mut th = heap.thread().unwrap();
    const PAGES: u64 = 64;
    let a = th.alloc(PAGES * 4096).unwrap().offset();
    r.write_bytes(a + 5000, b"kept");
    r.persist(a + 5000, 4);
    if r.populate_read(a, PAGES * 4096) {
        let mut kept = [0u8; 4];
        r.read_bytes(a + 5000, &mut kept);
        assert_eq!(&kept, b"kept", "populate_read changed the heap's bytes");
    }

    let data: Vec<u8> = (0..PAGES * 4096 - 8192).map(|i| (i % 251) as u8).collect();
    let before = r.persist_stats().writes_through;
    let faults = thread_minor_faults();
    r.write_through(a + 8192, &data).unwrap();
    assert!(
        thread_minor_faults() - faults < 4,
        "a write through the file faulted in the writer"
    );
    assert_eq!(r.persist_stats().writes_through, before + 1);
    let mut back = vec![0u8; data.len()];
    r.read_bytes(a + 8192, &mut back);
    assert!(back == data, "the mapping does not read what was written");
    r.flush(a + 8192, data.len());
    r.fence();
    r.health().unwrap();
    let copy = std::fs::read(&p).unwrap();
    let at = (a + 8192) as usize;
    assert!(
        copy[at..at + data.len()] == data[..],
        "the file lacks the bytes"
    );
    drop(th);
    drop(heap);

    // Under the crash simulator (which sees only stores and flushes): refused.
    let sim = std::sync::Arc::new(pmem::CrashSim::new(1, 0));
    let rec = Heap::open_sim(&p, &o, sim).unwrap();
    let r = rec.heap().region();
    assert!(r.simulated());
    assert!(matches!(r.write_through(a, b"no"), Err(Error::ReadOnly)));
}

#[test]
fn a_scratch_view_writes_in_memory_only() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("s.heap");
    make(&p);
    let before = std::fs::read(&p).unwrap();
    {
        let file_gen = {
            let (c, _) = Heap::open_check(&p).unwrap().finish_clean().unwrap();
            c.region().generation()
        };
        let (h, _) = Heap::open_scratch(&p).unwrap().finish_clean().unwrap();
        // One generation on, as a writable open would be: locks a crashed
        // process held are free here.
        assert_eq!(h.region().generation(), file_gen + 1);
        // Unlike a check view, it hands out thread heaps: allocations and
        // writes work, in the private mapping.
        let mut th = h.thread().unwrap();
        let q = th.alloc(64).unwrap();
        h.region().write_bytes(q.offset(), b"scratch");
        h.region().persist(q.offset(), 7);
        let mut b = [0u8; 7];
        h.region().read_bytes(q.offset(), &mut b);
        assert_eq!(&b, b"scratch");
        // A writable open is refused meanwhile (the shared lock is held).
        assert!(matches!(open_err(&p), Error::InUse { .. }));
    }
    assert_eq!(std::fs::read(&p).unwrap(), before, "the file was written");
    let (h, _) = Heap::open(&p, &opts()).unwrap().finish_clean().unwrap();
    let mut b = [0u8; 9];
    h.region().read_bytes(h.root().offset(), &mut b);
    assert_eq!(&b, b"persisted");
}
