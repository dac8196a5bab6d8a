//! The granularity of the active page tables: word entries (64 blocks) for a
//! thread's allocations and its first few frees, block entries for the frees of
//! scattered blocks, and recovery that examines exactly what they cover.

mod common;

use common::*;
use pmem::{check_heap, Heap, PPtr, APT_BLOCK_FLAG};
use std::collections::BTreeSet;

/// Word entries a table makes for frees before block entries (heap/apt.rs `FREE_WORDS`).
const FREE_WORDS: usize = 8;
const WORD_FLAG: u64 = 4;

/// A new heap with 2000 blocks of 64 bytes allocated by a handle since dropped.
fn heap_with_blocks(path: &std::path::Path, opts: &pmem::HeapOptions) -> (Heap, Vec<PPtr<u8>>) {
    let heap = Heap::create(path, opts).unwrap();
    let mut th = heap.thread().unwrap();
    let blocks = (0..2000).map(|_| th.alloc(64).unwrap()).collect();
    th.end_op();
    drop(th);
    (heap, blocks)
}

/// A new 4 MiB msync heap in `dir`: (its path, a path for a crash copy,
/// options, heap).
fn msync_heap(
    dir: &tempfile::TempDir,
) -> (
    std::path::PathBuf,
    std::path::PathBuf,
    pmem::HeapOptions,
    Heap,
) {
    let path = dir.path().join("m.heap");
    let opts = pmem::HeapOptions {
        strategy: pmem::Strategy::Msync,
        ..small_opts(4 << 20, 0)
    };
    let heap = Heap::create(&path, &opts).unwrap();
    (path.clone(), dir.path().join("crashed.heap"), opts, heap)
}

#[test]
fn scattered_frees_get_block_entries_and_recovery_checks_only_them() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("h.heap");
    let copy = dir.path().join("crashed.heap");
    let opts = small_opts(4 << 20, 0);
    let (heap, blocks) = heap_with_blocks(&path, &opts);
    assert!(
        heap.active_pages().is_empty(),
        "a dropped handle trims its table: {:x?}",
        heap.active_pages()
    );

    // Twenty tickets, each in a word of its own (64-byte blocks: 64 per word).
    let mut th = heap.thread().unwrap();
    let words: BTreeSet<u64> = blocks.iter().map(|b| b.offset() / (64 * 64)).collect();
    assert!(words.len() >= 30, "blocks span {} words", words.len());
    let picked: Vec<PPtr<u8>> = words
        .iter()
        .take(20)
        .map(|w| {
            *blocks
                .iter()
                .find(|b| b.offset() / (64 * 64) == *w)
                .unwrap()
        })
        .collect();
    let mut tickets: Vec<_> = picked
        .iter()
        .map(|&b| th.prepare_free(b).unwrap())
        .collect();
    let entries = heap.active_pages();
    let block_entries = entries.iter().filter(|e| *e & APT_BLOCK_FLAG != 0).count();
    let word_entries = entries.iter().filter(|e| *e & WORD_FLAG != 0).count();
    assert_eq!(word_entries, FREE_WORDS, "{entries:x?}");
    assert_eq!(block_entries, 20 - FREE_WORDS, "{entries:x?}");

    // Redeem six of the block-entry tickets: their entries go.
    let redeemed: Vec<_> = tickets.drain(FREE_WORDS..FREE_WORDS + 6).collect();
    heap.free_tickets(redeemed).unwrap();
    let left = heap
        .active_pages()
        .iter()
        .filter(|e| *e & APT_BLOCK_FLAG != 0)
        .count();
    assert_eq!(left, 20 - FREE_WORDS - 6);

    // A SIGKILL now: the page cache's content. The 14 unredeemed blocks are
    // "unlinked" (unreachable), everything else reachable.
    std::fs::copy(&path, &copy).unwrap();
    let unlinked: BTreeSet<u64> = picked
        .iter()
        .enumerate()
        .filter(|(i, _)| !(FREE_WORDS..FREE_WORDS + 6).contains(i))
        .map(|(_, b)| b.offset())
        .collect();
    let freed: BTreeSet<u64> = picked[FREE_WORDS..FREE_WORDS + 6]
        .iter()
        .map(|b| b.offset())
        .collect();
    drop(tickets);
    drop(th);
    drop(heap);

    let rec = Heap::open(&copy, &opts).unwrap();
    let slots = rec.covered_slots();
    assert_eq!(
        slots.len(),
        FREE_WORDS * 64 + (20 - FREE_WORDS - 6),
        "8 words and 6 single blocks"
    );
    let (heap, report) = rec
        .finish(|p| {
            let o = p.offset();
            blocks.iter().any(|b| b.offset() == o) && !unlinked.contains(&o) && !freed.contains(&o)
        })
        .unwrap();
    assert_eq!(report.leaked_freed, unlinked.len() as u64, "{report:?}");
    let c = check_heap(&heap);
    assert!(c.ok(), "{c}");
    assert_eq!(c.blocks, 2000 - 20, "{c}");
    for b in &blocks {
        let o = b.offset();
        assert_eq!(
            heap.is_allocated(*b),
            !unlinked.contains(&o) && !freed.contains(&o),
            "block {o:#x}"
        );
    }
}

#[test]
fn a_transaction_frees_without_a_fence_and_its_block_entries_go_at_the_next_commit() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("h.heap");
    let opts = small_opts(4 << 20, 0);
    let (heap, blocks) = heap_with_blocks(&path, &opts);
    let mut th = heap.thread().unwrap();
    // Free one block per word, in transactions, until frees get block entries.
    let mut freed = 0;
    for chunk in blocks.chunks(64).take(FREE_WORDS + 4) {
        let mut tx = th.begin();
        tx.free(chunk[0]).unwrap();
        tx.commit().unwrap();
        freed += 1;
    }
    // The last transaction's block entry waits for the thread's next fence.
    let blocks_now = || {
        heap.active_pages()
            .iter()
            .filter(|e| *e & APT_BLOCK_FLAG != 0)
            .count()
    };
    assert_eq!(blocks_now(), 1, "{:x?}", heap.active_pages());
    let mut tx = th.begin();
    let p = tx.alloc(32).unwrap();
    tx.commit().unwrap();
    assert_eq!(blocks_now(), 0, "{:x?}", heap.active_pages());
    th.free(p).unwrap();
    drop(th);
    let c = check_heap(&heap);
    assert!(c.ok(), "{c}");
    assert_eq!(c.blocks, 2000 - freed, "{c}");
}

/// With the msync strategy every fence is a device flush, so an allocation
/// that needs a word entry also covers the next words of its slab in the same
/// fence: a thread allocating 16 words' worth of blocks pays a few fences, not
/// one per word. The entries ahead change nothing for recovery but what it
/// examines: after a crash (the page cache's content copied while the handle
/// is open, blocks claimed, some "linked", some not), recovery frees exactly
/// the unreachable blocks and leaves a consistent heap.
#[test]
fn msync_allocations_cover_the_next_words_in_the_same_fence() {
    let dir = tempfile::tempdir().unwrap();
    let (path, copy, opts, heap) = msync_heap(&dir);
    let mut th = heap.thread().unwrap();
    // A first block: the slab exists and its first word is covered.
    let first = th.alloc(64).unwrap();
    const WORDS: u64 = 16;
    let before = heap.region().persist_stats();
    let blocks: Vec<PPtr<u8>> = (0..WORDS * 64).map(|_| th.alloc(64).unwrap()).collect();
    let fences = heap.region().persist_stats().fences - before.fences;
    assert!(
        fences <= WORDS / 2,
        "{fences} fences to allocate {WORDS} words of blocks"
    );
    let words: BTreeSet<u64> = blocks.iter().map(|b| b.offset() / (64 * 64)).collect();
    assert!(
        words.len() as u64 >= WORDS,
        "blocks span {} words",
        words.len()
    );

    // Crash with the handle open: every other block was linked.
    std::fs::copy(&path, &copy).unwrap();
    let linked: BTreeSet<u64> = std::iter::once(first.offset())
        .chain(blocks.iter().step_by(2).map(|b| b.offset()))
        .collect();
    drop(th);
    drop(heap);
    let rec = Heap::open(&copy, &opts).unwrap();
    let (heap, report) = rec.finish(|p| linked.contains(&p.offset())).unwrap();
    // Freed: the unlinked blocks, and the bits of the last word claimed but
    // not yet handed out (a word is claimed whole).
    let claimed = (1 + blocks.len() as u64).div_ceil(64) * 64;
    assert_eq!(
        report.leaked_freed,
        claimed - linked.len() as u64,
        "{report:?}"
    );
    let c = check_heap(&heap);
    assert!(c.ok(), "{c}");
    assert_eq!(c.blocks, linked.len() as u64, "{c}");
    for b in &blocks {
        assert_eq!(heap.is_allocated(*b), linked.contains(&b.offset()));
    }
}

/// `ThreadHeap::reserve` on an msync heap whose slabs have scattered free
/// blocks: one fence covers words of several slabs (taken as spares), the
/// allocations then make none, and a crash with the handle open recovers to
/// exactly the linked blocks. A handle dropped with spares gives them back.
#[test]
fn msync_reserve_covers_several_slabs_in_one_fence() {
    let dir = tempfile::tempdir().unwrap();
    let (path, copy, opts, heap) = msync_heap(&dir);
    // Three slabs of 64-byte blocks (1,024 a slab), two blocks in three kept.
    let mut th = heap.thread().unwrap();
    let all: Vec<PPtr<u8>> = (0..3072).map(|_| th.alloc(64).unwrap()).collect();
    th.end_op();
    let mut kept = Vec::new();
    for (i, b) in all.iter().enumerate() {
        if i % 3 == 0 {
            th.free(*b).unwrap();
        } else {
            kept.push(*b);
        }
    }
    th.end_op();
    drop(th);

    let mut th = heap.thread().unwrap();
    const N: u64 = 600;
    let f0 = heap.region().persist_stats().fences;
    th.reserve([(64, N)]).unwrap();
    let f1 = heap.region().persist_stats().fences;
    assert_eq!(f1 - f0, 1, "one fence for the whole reservation");
    let fresh: Vec<PPtr<u8>> = (0..N).map(|_| th.alloc(64).unwrap()).collect();
    let f2 = heap.region().persist_stats().fences;
    assert_eq!(f2 - f1, 0, "{N} reserved allocations made fences");
    let slabs: BTreeSet<u64> = fresh.iter().map(|b| b.offset() / (64 << 10)).collect();
    assert!(
        slabs.len() >= 2,
        "the blocks came from {} slab(s)",
        slabs.len()
    );
    for b in &fresh {
        assert!(!kept.contains(b), "a kept block was handed out again");
    }

    // Crash with the handle open: every other new block was linked.
    std::fs::copy(&path, &copy).unwrap();
    let linked: BTreeSet<u64> = kept
        .iter()
        .chain(fresh.iter().step_by(2))
        .map(|b| b.offset())
        .collect();
    {
        let rec = Heap::open(&copy, &opts).unwrap();
        let (crashed, _) = rec.finish(|p| linked.contains(&p.offset())).unwrap();
        let c = check_heap(&crashed);
        assert!(c.ok(), "{c}");
        assert_eq!(c.blocks, linked.len() as u64, "{c}");
        for b in kept.iter().chain(&fresh) {
            assert_eq!(crashed.is_allocated(*b), linked.contains(&b.offset()));
        }
    }

    // A handle dropped after a reservation gives its spares back: the next
    // handle allocates the remaining free blocks from them, and no more slabs
    // are made than the three for 3,072 blocks.
    drop(th);
    let free_left = 3 * 1024 - kept.len() as u64 - N;
    let mut th2 = heap.thread().unwrap();
    th2.reserve([(64, free_left)]).unwrap();
    drop(th2);
    let mut th = heap.thread().unwrap();
    let more: Vec<PPtr<u8>> = (0..free_left).map(|_| th.alloc(64).unwrap()).collect();
    let slabs: BTreeSet<u64> = kept
        .iter()
        .chain(&fresh)
        .chain(&more)
        .map(|b| b.offset() / (64 << 10))
        .collect();
    assert_eq!(slabs.len(), 3, "the freed blocks were all reused");
    th.end_op();
    drop(th);
    let c = check_heap(&heap);
    assert!(c.ok(), "{c}");
    assert_eq!(c.blocks, 3 * 1024, "{c}");
}
