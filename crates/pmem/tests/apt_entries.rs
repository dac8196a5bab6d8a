//! The granularity of the active page tables: word entries (64 blocks) for a
//! thread's allocations and its first few frees, block entries for the frees of
//! scattered blocks, and recovery that examines exactly what they cover.

mod common;

use common::*;
use pmem::{check_heap, Heap, PPtr, APT_BLOCK_FLAG};
use std::collections::BTreeSet;

/// Word entries a table makes for frees before block entries (heap.rs `FREE_WORDS`).
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
    let path = dir.path().join("m.heap");
    let copy = dir.path().join("crashed.heap");
    let opts = pmem::HeapOptions {
        strategy: pmem::Strategy::Msync,
        ..small_opts(4 << 20, 0)
    };
    let heap = Heap::create(&path, &opts).unwrap();
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
