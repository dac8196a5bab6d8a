//! Model-based tests of the persistent heap against a `BTreeMap` model, plus targeted
//! tests of the transaction, error, growth and lock contracts.
//!
//! The property test runs random sequences of operations on a table of slots (see
//! `common`): non-transactional insert / replace / delete, transactional replace,
//! transactional in-place rewrite, multi-slot transactions (with a flat-nested part),
//! aborted transactions, clean restarts, and simulated crashes (a `CrashSim` image
//! taken between operations, opened and recovered as the heap from then on). After
//! every operation: the structure equals the model, `check_heap` is clean, and the
//! allocated block count equals the reachable count.

mod common;

use common::*;
use pmem::{lock, CrashSim, Error, Heap, HeapOptions, PPtr, ThreadHeap, TxOutcome};
use proptest::prelude::*;
use std::path::{Path, PathBuf};
use std::sync::Arc;

const NSLOTS: usize = 12;
const HUGE_MIN: u64 = 15 * 65536;

fn opts() -> HeapOptions {
    small_opts(4 << 20, 48 << 20)
}

// ---- the property test ----

#[derive(Clone, Debug)]
enum Op {
    Insert(usize, u64),
    Delete(usize),
    TxReplace(usize, u64),
    TxUpdate(usize),
    TxMulti(Vec<(usize, u64)>),
    TxAbort(usize, u64),
    Restart,
    Crash(u64),
}

fn len_strategy() -> impl Strategy<Value = u64> {
    prop_oneof![
        60 => (B_HDR / 8..128u64).prop_map(|w| w * 8),
        20 => (128u64..8192).prop_map(|w| w * 8),
        12 => (8192u64..50_000).prop_map(|w| w * 8),
        5 => (HUGE_MIN / 8 + 1..300_000u64).prop_map(|w| w * 8),
    ]
}

fn small_len() -> impl Strategy<Value = u64> {
    prop_oneof![
        4 => (B_HDR / 8..128u64).prop_map(|w| w * 8),
        1 => (128u64..20_000).prop_map(|w| w * 8),
    ]
}

fn op_strategy() -> impl Strategy<Value = Op> {
    let slot = || 0..NSLOTS;
    prop_oneof![
        20 => (slot(), len_strategy()).prop_map(|(s, l)| Op::Insert(s, l)),
        10 => slot().prop_map(Op::Delete),
        15 => (slot(), len_strategy()).prop_map(|(s, l)| Op::TxReplace(s, l)),
        8 => slot().prop_map(Op::TxUpdate),
        10 => (
            proptest::sample::subsequence((0..NSLOTS).collect::<Vec<_>>(), 2..=3),
            proptest::collection::vec(small_len(), 3)
        )
            .prop_map(|(s, l)| Op::TxMulti(s.into_iter().zip(l).collect())),
        6 => (slot(), small_len()).prop_map(|(s, l)| Op::TxAbort(s, l)),
        4 => Just(Op::Restart),
        6 => any::<u64>().prop_map(Op::Crash),
    ]
}

/// A heap opened with a crash simulator attached, its thread handle and table.
struct Live {
    // Field order is drop order: the thread handle before the heap.
    th: ThreadHeap,
    heap: Heap,
    sim: Arc<CrashSim>,
    t: Table,
    path: PathBuf,
}

impl Live {
    fn open(path: &Path, seed: u64) -> Result<Live, String> {
        let sim = Arc::new(CrashSim::new(seed, 0));
        let rec = Heap::open_sim(path, &opts(), sim.clone()).map_err(|e| format!("open: {e}"))?;
        let reach = reachable_of(rec.heap());
        let (heap, _) = rec
            .finish(|b| reach.contains(&b.offset()))
            .map_err(|e| format!("recovery sweep: {e}"))?;
        let t = Table::open(&heap).ok_or("table lost")?;
        let th = heap.thread().map_err(|e| e.to_string())?;
        Ok(Live {
            th,
            heap,
            sim,
            t,
            path: path.to_path_buf(),
        })
    }

    fn check(&self, model: &State, what: &str) -> Result<(), String> {
        let actual = read_state(&self.heap, &self.t, false).map_err(|e| format!("{what}: {e}"))?;
        if actual != *model {
            return Err(format!(
                "{what}: heap differs from the model\nmodel:  {model:?}\nheap:   {actual:?}"
            ));
        }
        check_allocator(&self.heap, &self.t).map_err(|e| format!("{what}: {e}"))?;
        Ok(())
    }
}

fn run_model(ops: &[Op]) -> Result<(), String> {
    let dir = tempfile::tempdir().unwrap();
    let mut gen = 0u32;
    let path0 = dir.path().join("m0.heap");
    {
        let heap = Heap::create(&path0, &opts()).unwrap();
        let mut th = heap.thread().unwrap();
        Table::create(&heap, &mut th, NSLOTS);
    }
    let mut live = Live::open(&path0, 1)?;
    let mut model = State::default();
    let mut seq = 0u64;
    for (i, op) in ops.iter().enumerate() {
        seq += 16;
        let what = format!("op {i} {op:?}");
        let Live { th, heap, t, .. } = &mut live;
        let r: Result<Effects, Error> = match op {
            Op::Insert(s, l) => op_insert(heap, th, t, *s, BlockInfo::new(*l, seq, *s, 0)),
            Op::Delete(s) => op_delete(heap, th, t, *s),
            Op::TxReplace(s, l) => op_tx_replace(heap, th, t, *s, BlockInfo::new(*l, seq, *s, 0)),
            Op::TxUpdate(s) => match model.slots.get(s) {
                Some(b) if b.len <= MAX_INPLACE => op_tx_update(heap, th, t, *s, seq),
                _ => Ok(Effects::default()),
            },
            Op::TxMulti(list) => op_tx_multi(heap, th, t, list, seq),
            Op::TxAbort(s, l) => op_tx_abort(heap, th, t, *s, BlockInfo::new(*l, seq, *s, 0)),
            Op::Restart => {
                let path = live.path.clone();
                drop(live);
                live = Live::open(&path, seq)?;
                if !live.heap.region().opened_clean() {
                    return Err(format!("{what}: not clean after a clean shutdown"));
                }
                Ok(Effects::default())
            }
            Op::Crash(seed) => {
                // The image's randomness comes from the live simulator's seed.
                let img = live.sim.capture_now(live.heap.region());
                gen += 1;
                let next = dir.path().join(format!("m{gen}.heap"));
                pmem::sim::write_image(&next, &img.bytes).unwrap();
                let old = live.path.clone();
                drop(live);
                std::fs::remove_file(&old).unwrap();
                live = Live::open(&next, *seed)?;
                if live.heap.region().opened_clean() {
                    return Err(format!("{what}: a crash image says clean"));
                }
                Ok(Effects::default())
            }
        };
        match r {
            Ok(eff) => model.apply(&eff),
            Err(Error::HeapFull { .. }) => {}
            Err(e) => return Err(format!("{what}: {e}")),
        }
        live.check(&model, &what)?;
    }
    // Finally a crash with nothing in flight, and a clean restart of the image.
    let img = live.sim.capture_now(live.heap.region());
    let next = dir.path().join("final.heap");
    pmem::sim::write_image(&next, &img.bytes).unwrap();
    drop(live);
    let live = Live::open(&next, 7)?;
    live.check(&model, "final crash image")?;
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig {
        // PMEM_MODEL_CASES=n for a longer soak.
        cases: std::env::var("PMEM_MODEL_CASES").ok().and_then(|s| s.parse().ok()).unwrap_or(64),
        max_shrink_iters: 400,
        ..ProptestConfig::default()
    })]

    #[test]
    fn heap_matches_model(ops in proptest::collection::vec(op_strategy(), 1..60)) {
        if let Err(e) = run_model(&ops) {
            prop_assert!(false, "{}", e);
        }
    }
}

// ---- targeted tests ----

fn new_heap(dir: &Path, opts: &HeapOptions) -> (PathBuf, Heap) {
    let path = dir.join("t.heap");
    let heap = Heap::create(&path, opts).unwrap();
    (path, heap)
}

/// A zeroed, persisted block of `len` bytes.
fn zeroed(heap: &Heap, th: &mut ThreadHeap, len: u64) -> u64 {
    let p = th.alloc_zeroed(len).unwrap();
    heap.region().fence();
    th.end_op();
    p.offset()
}

fn image_value(dir: &Path, name: &str, sim: &CrashSim, heap: &Heap, off: u64) -> u64 {
    let img = sim.capture_now(heap.region());
    let p = dir.join(name);
    pmem::sim::write_image(&p, &img.bytes).unwrap();
    let (h, _) = Heap::open(&p, &small_opts(4 << 20, 0))
        .unwrap()
        .finish_clean()
        .unwrap();
    h.region().read(off)
}

#[test]
fn flat_nesting_commits_only_at_the_outermost_level() {
    let dir = tempfile::tempdir().unwrap();
    let (path, heap) = new_heap(dir.path(), &small_opts(4 << 20, 0));
    let x = {
        let mut th = heap.thread().unwrap();
        let x = zeroed(&heap, &mut th, 64);
        heap.region().write(x, &1u64);
        heap.region().persist(x, 8);
        x
    };
    drop(heap);
    let sim = Arc::new(CrashSim::new(5, 0));
    let (heap, _) = Heap::open_sim(&path, &small_opts(4 << 20, 0), sim.clone())
        .unwrap()
        .finish_clean()
        .unwrap();
    let mut th = heap.thread().unwrap();
    let r = heap.region();

    let mut tx = th.begin();
    assert!(
        matches!(tx.commit_nested(), Err(Error::TxNesting)),
        "commit_nested at depth 0"
    );
    tx.begin_nested();
    tx.write_u64(x, 2).unwrap();
    assert_eq!(tx.commit_nested().unwrap(), TxOutcome::Nested);
    // An inner commit made nothing visible or durable.
    assert_eq!(r.read::<u64>(x), 1);
    assert_eq!(tx.read_u64(x).unwrap(), 2);
    for i in 0..4 {
        assert_eq!(
            image_value(dir.path(), &format!("n{i}.heap"), &sim, &heap, x),
            1
        );
    }
    let out = tx.nested(|tx| {
        tx.nested(|tx| tx.write_u64(x + 8, 3))?;
        Ok(7)
    });
    assert_eq!(out.unwrap(), 7);
    assert_eq!(r.read::<u64>(x + 8), 0);
    assert!(matches!(tx.commit_nested(), Err(Error::TxNesting)));
    assert_eq!(tx.commit().unwrap(), TxOutcome::Committed);
    assert_eq!((r.read::<u64>(x), r.read::<u64>(x + 8)), (2, 3));
    assert_eq!(image_value(dir.path(), "after.heap", &sim, &heap, x + 8), 3);

    // An outer commit while an inner transaction is open is refused (and the whole
    // transaction is abandoned).
    let mut tx = th.begin();
    tx.write_u64(x, 9).unwrap();
    tx.begin_nested();
    assert!(matches!(tx.commit(), Err(Error::TxNesting)));
    assert_eq!(r.read::<u64>(x), 2);
    // An inner failure aborts the whole (flat) transaction.
    let mut tx = th.begin();
    tx.write_u64(x, 10).unwrap();
    let e = tx.nested(|tx| -> pmem::Result<()> {
        tx.write_u64(x, 11)?;
        Err(Error::TxLogFull(0))
    });
    assert!(e.is_err());
    assert!(tx.commit().is_err());
    assert_eq!(r.read::<u64>(x), 2);
    drop(th);
    drop(heap);
    let (heap, _) = Heap::open(&path, &small_opts(4 << 20, 0))
        .unwrap()
        .finish_clean()
        .unwrap();
    assert_eq!(heap.region().read::<u64>(x), 2);
}

#[test]
fn transaction_reads_its_own_writes() {
    let dir = tempfile::tempdir().unwrap();
    let (_path, heap) = new_heap(dir.path(), &small_opts(4 << 20, 0));
    let mut th = heap.thread().unwrap();
    let a = zeroed(&heap, &mut th, 256);
    let r = heap.region();
    r.write_bytes(a, &[1u8; 64]);
    r.persist(a, 64);
    let mut tx = th.begin();
    tx.write(a + 8, &[2u8; 16]).unwrap();
    tx.write(a + 12, &[3u8; 4]).unwrap();
    tx.write_u64(a + 40, 0xabcd).unwrap();
    let mut buf = [0u8; 64];
    tx.read(a, &mut buf).unwrap();
    let mut want = [1u8; 64];
    want[8..24].fill(2);
    want[12..16].fill(3);
    want[40..48].copy_from_slice(&0xabcdu64.to_le_bytes());
    assert_eq!(buf, want, "read sees the logged writes, later over earlier");
    // A read straddling the end of a logged write.
    let mut b2 = [0u8; 8];
    tx.read(a + 20, &mut b2).unwrap();
    assert_eq!(b2, [2, 2, 2, 2, 1, 1, 1, 1]);
    // The home locations are untouched until commit.
    let mut home = [0u8; 64];
    r.read_bytes(a, &mut home);
    assert_eq!(home, [1u8; 64]);
    // Fresh blocks: written in place, read back.
    let f = tx.alloc(100).unwrap();
    tx.write(f.offset(), &[9u8; 100]).unwrap();
    let mut fb = [0u8; 100];
    tx.read(f.offset(), &mut fb).unwrap();
    assert_eq!(fb, [9u8; 100]);
    // (A PPtr's offset is 16-aligned: its low four bits are marks.)
    tx.write_val(PPtr::<u64>::from_raw(a + 48), &f.offset())
        .unwrap();
    assert_eq!(
        tx.read_val(PPtr::<u64>::from_raw(a + 48)).unwrap(),
        f.offset()
    );
    assert_eq!(tx.commit().unwrap(), TxOutcome::Committed);
    want[48..56].copy_from_slice(&f.offset().to_le_bytes());
    r.read_bytes(a, &mut home);
    assert_eq!(home, want, "committed");
    assert_eq!(r.read::<[u8; 16]>(f.offset()), [9u8; 16]);
}

#[test]
fn tx_free_of_a_block_allocated_in_the_same_tx() {
    let dir = tempfile::tempdir().unwrap();
    let (path, heap) = new_heap(dir.path(), &small_opts(4 << 20, 0));
    let mut th = heap.thread().unwrap();
    let t = Table::create(&heap, &mut th, 4);
    let before = pmem::check_heap(&heap).blocks;
    for commit in [true, false] {
        let mut tx = th.begin();
        let p = tx.alloc(300).unwrap();
        tx.write(p.offset(), &[7u8; 300]).unwrap();
        tx.free(p).unwrap();
        assert!(!heap.is_allocated(p), "freed at once: nothing can reach it");
        let q = tx.alloc(5000).unwrap();
        tx.write_u64(q.offset(), 1).unwrap();
        tx.free(q).unwrap();
        if commit {
            tx.commit().unwrap();
        } else {
            tx.abort();
        }
        assert!(!heap.is_allocated(p) && !heap.is_allocated(q));
        assert_eq!(pmem::check_heap(&heap).blocks, before, "commit={commit}");
    }
    drop(th);
    drop(heap);
    let heap = open_and_finish(&path, &small_opts(4 << 20, 0)).unwrap();
    check_allocator(&heap, &t).unwrap();
}

#[test]
fn tx_log_full_is_an_error_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (path, heap) = new_heap(dir.path(), &small_opts(4 << 20, 0));
    let mut th = heap.thread().unwrap();
    let t = Table::create(&heap, &mut th, 8);
    for s in 0..4 {
        op_insert(
            &heap,
            &mut th,
            &t,
            s,
            BlockInfo::new(2048, s as u64 + 1, s, 0),
        )
        .unwrap();
    }
    let state = read_state(&heap, &t, true).unwrap();
    let blocks = pmem::check_heap(&heap).blocks;
    let log = heap.region().geometry().log_size as usize;
    // Many records until the log is full.
    {
        let mut tx = th.begin();
        let p = tx.alloc(1000).unwrap();
        tx.write_u64(t.slot_off(5), p.offset()).unwrap();
        let victim = t.get(heap.region(), 0);
        let mut err = None;
        for i in 0..100 {
            if let Err(e) = tx.write(victim + 40, &[i as u8; 1024]) {
                err = Some(e);
                break;
            }
        }
        assert!(
            matches!(err, Some(Error::TxLogFull(n)) if n == log),
            "{err:?}"
        );
        // dropped: aborted
    }
    // One record larger than the log.
    {
        let mut tx = th.begin();
        let victim = t.get(heap.region(), 1);
        let e = tx.write(victim, &vec![0u8; log]).unwrap_err();
        assert!(matches!(e, Error::TxLogFull(_)), "{e:?}");
        tx.abort();
    }
    th.end_op();
    assert_eq!(read_state(&heap, &t, true).unwrap(), state);
    assert_eq!(pmem::check_heap(&heap).blocks, blocks);
    // The thread's log still works afterwards.
    op_tx_update(&heap, &mut th, &t, 2, 99).unwrap();
    let mut state = state;
    state.slots.insert(2, BlockInfo::new(2048, 99, 2, 0));
    drop(th);
    drop(heap);
    let heap = open_and_finish(&path, &small_opts(4 << 20, 0)).unwrap();
    assert_eq!(read_state(&heap, &t, true).unwrap(), state);
    check_allocator(&heap, &t).unwrap();
}

#[test]
fn heap_full_is_an_error_and_the_heap_stays_usable() {
    let dir = tempfile::tempdir().unwrap();
    let (path, heap) = new_heap(dir.path(), &small_opts(2 << 20, 0));
    let mut th = heap.thread().unwrap();
    let t = Table::create(&heap, &mut th, 4);
    let base = pmem::check_heap(&heap).blocks;
    for size in [1000u64, 70_000, 300_000, 1_500_000, 3_000_000] {
        let mut got = Vec::new();
        let err = loop {
            match th.alloc(size) {
                Ok(p) => {
                    got.push(p);
                    th.end_op();
                }
                Err(e) => break e,
            }
            assert!(got.len() < 100_000);
        };
        assert!(
            matches!(err, Error::HeapFull { .. }),
            "size {size}: {err:?}"
        );
        assert!(pmem::check_heap(&heap).ok());
        for p in got.drain(..) {
            th.free(p).unwrap();
        }
        th.end_op();
        assert_eq!(pmem::check_heap(&heap).blocks, base, "size {size}");
        // Usable again.
        let p = th.alloc(size.min(500_000)).unwrap();
        th.free(p).unwrap();
        th.end_op();
    }
    assert!(matches!(th.alloc(1 << 50), Err(Error::TooLarge(_))));
    // Fill with small blocks, then the structure still works after freeing some.
    let mut small = Vec::new();
    while let Ok(p) = th.alloc(48) {
        small.push(p);
        th.end_op();
    }
    assert!(matches!(
        op_insert(&heap, &mut th, &t, 0, BlockInfo::new(200_000, 1, 0, 0)),
        Err(Error::HeapFull { .. })
    ));
    for p in small.drain(..) {
        th.free(p).unwrap();
    }
    th.end_op();
    op_insert(&heap, &mut th, &t, 0, BlockInfo::new(200_000, 1, 0, 0)).unwrap();
    drop(th);
    drop(heap);
    let heap = open_and_finish(&path, &small_opts(2 << 20, 0)).unwrap();
    assert_eq!(read_state(&heap, &t, true).unwrap().slots.len(), 1);
    check_allocator(&heap, &t).unwrap();
}

#[test]
fn active_page_table_full_is_an_error() {
    // Page runs that fill a whole chunk each: every one needs an APT entry in a
    // different chunk, so the table cannot coalesce entries and runs out.
    let dir = tempfile::tempdir().unwrap();
    let (_path, heap) = new_heap(dir.path(), &small_opts(80 << 20, 0));
    let mut th = heap.thread().unwrap();
    let apt = heap.region().geometry().apt_entries as usize;
    let mut held = Vec::new();
    let err = loop {
        match th.alloc(15 * 65536) {
            Ok(p) => held.push(p),
            Err(e) => break e,
        }
        assert!(held.len() <= apt + 8, "no limit on pages in flight");
    };
    assert!(
        matches!(err, Error::ActivePagesFull(..)),
        "{err:?} after {}",
        held.len()
    );
    assert!(held.len() >= apt, "only {} pages in flight", held.len());
    // Once the operation ends, entries are trimmed and allocation works again.
    heap.region().fence();
    th.end_op();
    let more: Vec<_> = (0..4).map(|_| th.alloc(15 * 65536).unwrap()).collect();
    th.end_op();
    for p in held.into_iter().chain(more) {
        th.free(p).unwrap();
    }
    th.end_op();
    assert!(pmem::check_heap(&heap).ok());
    assert_eq!(pmem::check_heap(&heap).blocks, 0);
}

/// NV-epoch safety with more pages in flight than the active page table has entries
/// (the table coalesces page entries into chunk entries): one unfinished operation
/// announces and unlinks many blocks (free tickets not yet redeemed) and allocates
/// many unlinked blocks over many pages; a crash image then recovers with exactly the
/// linked blocks allocated.
#[test]
fn many_pages_in_flight_are_swept_after_a_crash() {
    let dir = tempfile::tempdir().unwrap();
    let o = small_opts(32 << 20, 0);
    let path = dir.path().join("t.heap");
    // Few blocks per slab (8 per slab from 8 KiB up) and page runs: many pages.
    let sizes: Vec<u64> = vec![8192, 16384, 32768, 65536, 70_000, 96, 1000];
    const N: usize = 300;
    let t = {
        let heap = Heap::create(&path, &o).unwrap();
        let mut th = heap.thread().unwrap();
        let t = Table::create(&heap, &mut th, N);
        for s in 0..N {
            let len = sizes[s % sizes.len()];
            op_insert(
                &heap,
                &mut th,
                &t,
                s,
                BlockInfo::new(len, s as u64 + 1, s, 0),
            )
            .unwrap();
        }
        t
    };
    let sim = Arc::new(CrashSim::new(3, 0));
    let rec = Heap::open_sim(&path, &o, sim.clone()).unwrap();
    let (heap, _) = rec.finish_clean().unwrap();
    let mut th = heap.thread().unwrap();
    let r = heap.region();
    // One operation: unlink 200 blocks (announced first), allocate 100 more.
    let mut tickets = Vec::new();
    let mut unlinked = 0;
    for s in (0..N).filter(|s| s % 3 != 0) {
        let p = t.get(r, s);
        match th.prepare_free(PPtr::from_raw(p)) {
            Ok(tk) => tickets.push(tk),
            Err(Error::ActivePagesFull(..)) => break,
            Err(e) => panic!("prepare_free: {e}"),
        }
        r.write(t.slot_off(s), &0u64);
        r.persist(t.slot_off(s), 8);
        unlinked += 1;
    }
    let mut fresh = 0;
    for (i, len) in sizes.iter().cycle().take(100).enumerate() {
        match th.alloc(*len) {
            Ok(p) => {
                r.write(p.offset(), &(9000 + i as u64));
                fresh += 1;
            }
            Err(Error::ActivePagesFull(..)) => break,
            Err(e) => panic!("alloc: {e}"),
        }
    }
    r.fence();
    let entries = heap.active_pages();
    eprintln!(
        "{unlinked} unlinked, {fresh} fresh blocks in one operation; {} APT entries, {} for \
         whole chunks",
        entries.len(),
        entries.iter().filter(|&&e| e & 1 != 0).count()
    );
    assert!(
        entries.iter().any(|&e| e & 1 != 0) || unlinked < N * 2 / 3 || fresh < 100,
        "more pages in flight than APT entries: chunk entries or ActivePagesFull expected"
    );
    let imgs: Vec<_> = (0..4).map(|_| sim.capture_now(r)).collect();
    drop(tickets);
    drop(th);
    drop(heap);
    for (k, img) in imgs.iter().enumerate() {
        let ipath = dir.path().join(format!("img{k}.heap"));
        pmem::sim::write_image(&ipath, &img.bytes).unwrap();
        let heap = open_and_finish(&ipath, &o).unwrap();
        let state = read_state(&heap, &t, true).unwrap();
        assert_eq!(state.slots.len(), N - unlinked, "image {k}");
        check_allocator(&heap, &t).unwrap_or_else(|e| panic!("image {k}: {e}"));
        drop(heap);
        std::fs::remove_file(&ipath).unwrap();
    }
}

#[test]
fn online_growth_up_to_max_size() {
    let dir = tempfile::tempdir().unwrap();
    let o = small_opts(2 << 20, 24 << 20);
    let (path, heap) = new_heap(dir.path(), &o);
    let size0 = heap.region().size();
    let len0 = std::fs::metadata(&path).unwrap().len();
    let mut th = heap.thread().unwrap();
    let t = Table::create(&heap, &mut th, 64);
    let mut total = 0;
    for (i, len) in [1_500_000u64, 300_000, 2_000_000, 50_000, 1_000]
        .iter()
        .cycle()
        .take(40)
        .enumerate()
    {
        if total + len > 14 << 20 {
            break;
        }
        op_insert(
            &heap,
            &mut th,
            &t,
            i,
            BlockInfo::new(*len, i as u64 + 1, i, 0),
        )
        .unwrap_or_else(|e| panic!("alloc {i} of {len} after {total} bytes: {e}"));
        total += len;
    }
    let grown = heap.region().size();
    assert!(
        grown > size0 + (8 << 20),
        "heap grew from {size0} to {grown}"
    );
    assert!(std::fs::metadata(&path).unwrap().len() >= grown);
    assert!(std::fs::metadata(&path).unwrap().len() > len0);
    assert!(grown <= 24 << 20);
    let state = read_state(&heap, &t, true).unwrap();
    check_allocator(&heap, &t).unwrap();
    // Beyond the limit: an error.
    assert!(matches!(th.alloc(20 << 20), Err(Error::HeapFull { .. })));
    drop(th);
    drop(heap);
    let heap = open_and_finish(&path, &o).unwrap();
    assert_eq!(heap.region().size(), grown);
    assert_eq!(read_state(&heap, &t, true).unwrap(), state);
    check_allocator(&heap, &t).unwrap();
    // Reopened without a growth limit, the heap is exactly as big as it grew.
    drop(heap);
    let heap = open_and_finish(&path, &small_opts(2 << 20, 0)).unwrap();
    assert_eq!(heap.region().size(), grown);
}

#[test]
fn generation_locks() {
    let dir = tempfile::tempdir().unwrap();
    let (path, heap) = new_heap(dir.path(), &small_opts(4 << 20, 0));
    let (l1, l2, counter) = {
        let mut th = heap.thread().unwrap();
        let b = zeroed(&heap, &mut th, 64);
        heap.set_root(PPtr::from_raw(b)).unwrap();
        (b, b + 8, b + 16)
    };
    let r = heap.region();
    assert!(!lock::is_locked(r, l1));
    {
        let g = lock::lock(r, l1);
        assert!(lock::is_locked(r, l1));
        assert!(lock::try_lock(r, l1).is_none());
        drop(g);
    }
    assert!(!lock::is_locked(r, l1));
    // Contention: two threads increment a heap word under the lock.
    const N: u64 = 20_000;
    std::thread::scope(|s| {
        for _ in 0..2 {
            let h = heap.clone();
            s.spawn(move || {
                for _ in 0..N {
                    let _g = lock::lock(h.region(), l2);
                    let v: u64 = h.region().read(counter);
                    std::hint::spin_loop();
                    h.region().write(counter, &(v + 1));
                }
            });
        }
    });
    assert_eq!(r.read::<u64>(counter), 2 * N);
    assert!(!lock::is_locked(r, l2));
    // A lock held when the process "dies" (never released, and persisted held).
    std::mem::forget(lock::lock(r, l1));
    r.persist(l1, 8);
    assert!(lock::is_locked(r, l1));
    let gen = r.generation();
    drop(heap);
    let (heap, _) = Heap::open(&path, &small_opts(4 << 20, 0))
        .unwrap()
        .finish_clean()
        .unwrap();
    let r = heap.region();
    assert!(r.generation() > gen);
    assert_eq!(
        r.read::<u64>(l1) & 1,
        1,
        "the held bit is still in the word"
    );
    assert!(!lock::is_locked(r, l1), "a lock of a previous open is free");
    let g = lock::try_lock(r, l1).expect("free after reopen");
    assert!(lock::is_locked(r, l1));
    drop(g);
    assert!(!lock::is_locked(r, l1));
}

#[test]
fn double_free_and_invalid_pointers_are_errors() {
    let dir = tempfile::tempdir().unwrap();
    let (_path, heap) = new_heap(dir.path(), &small_opts(4 << 20, 0));
    let mut th = heap.thread().unwrap();
    let p = th.alloc(64).unwrap();
    let keep = th.alloc(64).unwrap();
    let run = th.alloc(200_000).unwrap();
    let huge = th.alloc(1_500_000).unwrap();
    heap.region().fence();
    th.end_op();
    th.free(p).unwrap();
    assert!(matches!(th.free(p), Err(Error::DoubleFree(x)) if x == p.offset()));
    assert!(matches!(th.prepare_free(p), Err(Error::DoubleFree(_))));
    {
        let mut tx = th.begin();
        assert!(matches!(tx.free(p), Err(Error::DoubleFree(_))));
    }
    let size = heap.region().size();
    let hs = heap.region().geometry().header_size();
    let geo = heap.region().geometry();
    for (bad, why) in [
        (0u64, "null"),
        (8, "superblock"),
        (hs - 16, "thread slots"),
        (geo.chunk_off(0), "chunk header"),
        (keep.offset() + 16, "inside a slab block"),
        (keep.offset() + 32 + 8, "inside a slab block, 8-aligned"),
        (run.offset() + 65536, "inside a page run"),
        (huge.offset() + 65536, "inside a huge block"),
        (size, "end of the heap"),
        (size + (1 << 30), "far beyond the heap"),
        (geo.chunk_off(3) + 5 * 65536, "a free page"),
    ] {
        let e = th.free(PPtr::from_raw(bad)).unwrap_err();
        assert!(matches!(e, Error::InvalidPointer(..)), "{why}: {e:?}");
        assert!(!heap.is_allocated(PPtr::from_raw(bad)), "{why}");
    }
    assert!(heap.is_allocated(keep) && heap.is_allocated(run) && heap.is_allocated(huge));
    assert!(pmem::check_heap(&heap).ok());
    assert_eq!(pmem::check_heap(&heap).blocks, 3);
}

#[test]
fn thread_slots_run_out_and_check_views_are_read_only() {
    let dir = tempfile::tempdir().unwrap();
    let (path, heap) = new_heap(dir.path(), &small_opts(4 << 20, 0));
    let n = heap.region().geometry().nslots as usize;
    let mut ths: Vec<ThreadHeap> = (0..n).map(|_| heap.thread().unwrap()).collect();
    assert!(matches!(heap.thread(), Err(Error::NoThreadSlot(k)) if k == n));
    let t = Table::create(&heap, &mut ths[0], 2);
    ths.pop();
    let mut th = heap.thread().expect("a released slot is reusable");
    op_insert(&heap, &mut th, &t, 1, BlockInfo::new(64, 1, 1, 0)).unwrap();
    drop(th);
    drop(ths);
    // Not finished recovery: no allocation yet.
    drop(heap);
    let rec = Heap::open(&path, &small_opts(4 << 20, 0)).unwrap();
    assert!(
        rec.heap().thread().is_err(),
        "thread() before Recovery::finish"
    );
    drop(rec);
    // A check-only view recovers in memory and refuses writes.
    let (view, _) = Heap::open_check(&path).unwrap().finish_clean().unwrap();
    assert!(matches!(view.thread(), Err(Error::ReadOnly)));
    assert!(matches!(view.set_root(PPtr::NULL), Err(Error::ReadOnly)));
    let t2 = Table::open(&view).unwrap();
    assert_eq!(read_state(&view, &t2, true).unwrap().slots.len(), 1);
    check_allocator(&view, &t2).unwrap();
}
