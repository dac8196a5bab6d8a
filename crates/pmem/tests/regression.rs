//! Regression tests for pmem bugs found while writing the SIGKILL and model tests,
//! each with a short post-mortem: what was wrong, and how it was fixed.

mod common;

use common::*;
use pmem::{Error, Heap, PPtr};

/// Fixed (sweep resolves entries through the located block). Was: `Allocator::blocks_of_page` (alloc.rs, the `BlockKind::Huge` arm) returns
/// `page + PAGE` for a huge block, assuming the APT entry is the huge head chunk's
/// header page. But a *stale* APT entry can be page 1 of a chunk that has since become
/// a huge head (a slab or run used to start there): `locate_page(page1)` resolves to
/// the huge block (whose address is exactly page 1), and `blocks_of_page` then reports
/// page 2 of the chunk, which is not a block. `Recovery::finish` hands that bogus
/// pointer to the reachability callback and, when it is (rightly) called unreachable,
/// `locate` fails with `InvalidPointer(.., "inside a huge block")` and the whole
/// recovery fails: the heap cannot be opened. Found by `sigkill_random_operations`;
/// fixed in a3be29d (`blocks_of_page` reports the located block's own address).
#[test]
fn huge_block_over_stale_page1_apt_entry_recovers() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("h.heap");
    let opts = small_opts(4 << 20, 0);
    {
        let heap = Heap::create(&path, &opts).unwrap();
        let mut th = heap.thread().unwrap();
        // A page run at chunk 0, page 1: its head page enters this slot's APT.
        let run = th.alloc(200_000).unwrap();
        let geo = heap.region().geometry();
        assert_eq!(
            run.offset(),
            geo.chunk_off(0) + 65536,
            "run at chunk 0 page 1"
        );
        th.free(run).unwrap();
        th.end_op();
        // A huge block over chunks 0 and 1: it starts exactly at chunk 0 page 1.
        let huge = th.alloc(1_500_000).unwrap();
        assert_eq!(huge.offset(), run.offset(), "huge block at chunk 0");
        let b = BlockInfo::new(1_500_000, 1, 0, 0);
        heap.region().write_bytes(huge.offset(), &b.bytes());
        heap.region().persist(huge.offset(), b.len as usize);
        heap.set_root(huge).unwrap();
        th.end_op();
    } // clean shutdown; the APT keeps both entries (chunk 0 header, chunk 0 page 1)
    let rec = Heap::open(&path, &opts).unwrap();
    let root = rec.heap().root().offset();
    let blocks: Vec<u64> = rec.active_blocks().iter().map(|p| p.offset()).collect();
    for &b in &blocks {
        assert!(
            rec.heap().is_allocated(PPtr::from_raw(b)),
            "Recovery::active_blocks reports {b:#x}, which is not a block (root {root:#x}, all {blocks:#x?})"
        );
    }
    let (heap, _) = rec
        .finish(|b| b.offset() == root)
        .expect("recovery sweep with exact reachability");
    assert!(heap.is_allocated(PPtr::from_raw(root)));
    assert_eq!(
        read_block(heap.region(), root, true).unwrap().len,
        1_500_000
    );
    let rep = pmem::check_heap(&heap);
    assert!(rep.ok(), "{rep}");
    assert_eq!(rep.blocks, 1);
}

/// Fixed (the read-modify-write runs under one lock). Was: `Region::update_superblock` (region.rs) is a read-modify-write that is not
/// atomic: it copies the superblock under the mutex, releases it, applies the closure
/// and only then `write_superblock` takes the mutex again. Two concurrent updates
/// (e.g. `Heap::set_root` in one thread and online growth — `grow_to`/`grow_locked`
/// updating `size` — in another) can interleave so that the later write carries the
/// other's stale field: the heap size goes back (the next open maps fewer chunks than
/// the allocator handed out) or the root update is lost.
#[test]
fn concurrent_set_root_and_growth_keep_both_updates() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("h.heap");
    let opts = small_opts(2 << 20, 0);
    let heap = Heap::create(&path, &opts).unwrap();
    let roots: Vec<PPtr<u8>> = {
        let mut th = heap.thread().unwrap();
        (0..2)
            .map(|_| {
                let p = th.alloc_zeroed(64).unwrap();
                th.end_op();
                p
            })
            .collect()
    };
    heap.region().fence();
    let stop = std::sync::atomic::AtomicBool::new(false);
    let geo = heap.region().geometry();
    let mut lost_size = 0;
    std::thread::scope(|s| {
        let h2 = heap.clone();
        let stop = &stop;
        let roots = &roots;
        let setter = s.spawn(move || {
            let mut i = 0usize;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                h2.set_root(roots[i % 2]).unwrap();
                i += 1;
            }
            i
        });
        for c in 3..300u64 {
            heap.grow(geo.size_for_chunks(c)).unwrap();
            // Right after growth returned, the superblock must record the new size.
            if heap.region().superblock().size != heap.region().size() {
                lost_size += 1;
            }
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let n = setter.join().unwrap();
        eprintln!("{n} root updates during 297 growth steps");
    });
    assert_eq!(
        lost_size, 0,
        "growth steps after which the superblock size was behind the mapped size (a \
         concurrent set_root wrote back the old size): a crash then loses the grown chunks"
    );
}

/// Not a corruption, an inconsistency of the error contract: a second free of a slab
/// block reports `DoubleFree`, but a second free of a page run or a huge block reports
/// `InvalidPointer(.., "in a free page")` because `locate` (alloc.rs) rejects the
/// freed page before `free_loc`'s `DoubleFree` check can run.
#[test]
fn double_free_is_reported_as_double_free_for_every_kind() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("h.heap");
    let heap = Heap::create(&path, &small_opts(4 << 20, 0)).unwrap();
    let mut th = heap.thread().unwrap();
    for size in [100u64, 200_000, 1_500_000] {
        let p = th.alloc(size).unwrap();
        th.end_op();
        th.free(p).unwrap();
        let e = th.free(p).unwrap_err();
        assert!(
            matches!(e, Error::DoubleFree(x) if x == p.offset())
                || matches!(e, Error::InvalidPointer(x, _) if x == p.offset()),
            "second free of a {size}-byte block: {e:?}"
        );
    }
}

/// Fixed (growth of a check-only mapping is refused with `ReadOnly`). Was: `Heap::grow` on a heap opened with `Heap::open_check` (a private read-only
/// view) does not refuse (`Error::ReadOnly`): `Region::extend_mapping` skips the
/// `set_len` for `CheckOnly` but still maps the file beyond its end and `grow_to`
/// writes chunk words there, so the process dies of SIGBUS. Run in a child process.
#[test]
fn grow_on_check_only_heap_is_an_error_not_a_crash() {
    const ENV: &str = "PMEM_REGRESSION_GROW_CHILD";
    if let Ok(p) = std::env::var(ENV) {
        let (heap, _) = Heap::open_check(std::path::Path::new(&p))
            .unwrap()
            .finish_clean()
            .unwrap();
        let r = heap.grow(heap.region().size() + (4 << 20));
        println!("grow on a check-only heap: {r:?}");
        assert!(r.is_err(), "grow on a check-only heap succeeded");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("h.heap");
    drop(Heap::create(&path, &small_opts(2 << 20, 0)).unwrap());
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "grow_on_check_only_heap_is_an_error_not_a_crash",
            "--nocapture",
        ])
        .env(ENV, &path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "child: {}\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
