//! Tests of [`Ops::apply_batch`] on the log-free hash table, whose override (hash/batch.rs,
//! `Inner::apply_batch`, `init_buckets`, `init_round`) writes a batch in two
//! phases: new blocks for every put of a key that occurs once (and dummies for
//! missing buckets, by rounds), one fence, the links marked DIRTY and flushed, one
//! fence, the marks cleared; removes, repeated keys and puts whose link changed
//! between the phases follow one at a time, in batch order.
//!
//! - [`hash_fill_by_batches_cache`] / `_nocache`: 50,000 keys, from empty, only
//!   through batches of 256 (the table doubles many times on the way); every key
//!   read back, `verify`, the allocator's block count; a clean restart and the same
//!   again; then every key rewritten or removed by batches (with repeated keys),
//!   and again after a restart.
//! - [`hash_batches_deep_uninitialised_ancestors_cache`] / `_nocache`: a table whose
//!   keys all hash to bucket 0 (so that it grows to 1024 buckets with only bucket 0
//!   initialised, and every batch put into one chain conflicts with its
//!   neighbours), then batches of random keys, whose buckets have up to nine
//!   uninitialised ancestors each (several `init_round`s per batch).
//! - [`hash_concurrent_overlapping_batches_cache`] / `_nocache`: two threads run
//!   batches on overlapping key ranges at the same time; every key ends with the
//!   last value one of the threads wrote to it (or absent if that write was a
//!   remove), the structure verifies, nothing leaks, a restart changes nothing.
//! - [`hash_batch_crash_at_every_fence_cache`] / `_nocache`: a crash image at every
//!   fence of a batch (and its `sync`) and one after the `sync`: every image
//!   recovers to a structure that verifies, leaks nothing, and holds, per key, its
//!   value before the batch or the result of a prefix of the batch's writes to it;
//!   after the `sync` exactly the batch's result.
//! - [`hash_sparse_batch_links_runs_cache`] / `_nocache`: one batch of 700 new keys
//!   into a sparse table (1,024 buckets, under `msync`) costs at most 64 fences:
//!   keys and dummies that share a place are linked as runs, one CAS each, and
//!   the buckets are initialised once for the batch, not per part (before: about
//!   550–600).
//! - [`hash_sparse_batch_crash_at_every_fence_cache`] / `_nocache`: batches of new
//!   keys into a sparse table (runs of nodes and of dummies) with a crash image at
//!   every fence and after the sync, checked as above.
//! - [`hash_get_sees_only_durable_batch_inserts`]: a concurrent `get` must not
//!   return a batch's insert before it is durable (a crash image taken right after
//!   such a get must hold the key).

mod common;

use common::*;
use index::{HashOptions, Index, LfHash, Ops};
use pmem::{CrashSim, Heap, HeapOptions, Strategy};
use rand::rngs::SmallRng;
use rand::seq::SliceRandom;
use rand::{RngExt, SeedableRng};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, Mutex};

/// Key index → value id (see `common::value`).
type Model = BTreeMap<usize, u64>;

/// A batch item: key index and `Some(value id)` (put) or `None` (remove).
type Item = (usize, Option<u64>);

/// Heap options of the large tests (no crash simulator).
fn big_opts() -> HeapOptions {
    heap_opts(32 << 20, 1 << 30, Strategy::FenceOnly)
}

/// `n` distinct keys whose hash has its low `bits` bits zero: in bucket 0 of any
/// table of at most `2^bits` buckets.
fn zero_keys(n: usize, bits: u32, tag: &str) -> Vec<Vec<u8>> {
    let mask = (1u64 << bits) - 1;
    let mut out = Vec::with_capacity(n);
    let mut i = 0u64;
    while out.len() < n {
        let k = format!("{tag}{i}").into_bytes();
        if common::HASHER.hash(&k) & mask == 0 {
            out.push(k);
        }
        i += 1;
    }
    out
}

/// Applies a batch through the handle (keys by index into `keys`) and to the model.
fn apply(h: &mut dyn Ops, keys: &[Vec<u8>], items: &[Item], model: &mut Model) {
    let vals: Vec<Option<Vec<u8>>> = items.iter().map(|(_, v)| v.map(value)).collect();
    let batch: Vec<(&[u8], Option<&[u8]>)> = items
        .iter()
        .zip(&vals)
        .map(|((k, _), v)| (keys[*k].as_slice(), v.as_deref()))
        .collect();
    h.apply_batch(&batch).expect("apply_batch");
    for &(k, v) in items {
        match v {
            Some(v) => model.insert(k, v),
            None => model.remove(&k),
        };
    }
}

/// Reads every key of `keys` (key index → value id of what it holds).
fn read_all(t: &LfHash, keys: &[Vec<u8>]) -> Result<Model, String> {
    let mut h = Index::handle(t).map_err(|e| format!("handle: {e}"))?;
    let mut out = Vec::new();
    let mut s = Model::new();
    for (i, k) in keys.iter().enumerate() {
        if h.get(k, &mut out).map_err(|e| format!("get: {e}"))? {
            let id = value_id(&out).map_err(|e| format!("key {i}: {e}"))?;
            s.insert(i, id);
        }
    }
    Ok(s)
}

/// Every key holds what the model says, and the structure counts no other key.
fn check_content(t: &LfHash, keys: &[Vec<u8>], model: &Model, what: &str) {
    let s = read_all(t, keys).unwrap_or_else(|e| panic!("{what}: {e}"));
    if s != *model {
        let diff: Vec<String> = (0..keys.len())
            .filter(|k| s.get(k) != model.get(k))
            .take(10)
            .map(|k| format!("key {k}: found {:?}, want {:?}", s.get(&k), model.get(&k)))
            .collect();
        panic!(
            "{what}: content differs from the model ({} keys found, {} expected):\n{}",
            s.len(),
            model.len(),
            diff.join("\n")
        );
    }
    let v = Index::verify(t, false).unwrap_or_else(|e| panic!("{what}: verify: {e}"));
    assert_eq!(
        v.keys,
        model.len() as u64,
        "{what}: verify counts other keys"
    );
}

/// A hash table on a heap file, reopened on demand.
struct Table {
    t: LfHash,
    heap: Heap,
    path: PathBuf,
    cache: bool,
    opts: HeapOptions,
}

impl Table {
    fn create(path: &Path, cache: bool, opts: HeapOptions) -> Table {
        Table::create_with(path, cache, opts, hash_opts(cache))
    }

    fn create_with(path: &Path, cache: bool, opts: HeapOptions, hopts: HashOptions) -> Table {
        let heap = Heap::create(path, &opts).unwrap();
        let t = LfHash::create(&heap, &hopts).unwrap();
        heap.set_root(Index::root(&t)).unwrap();
        Table {
            t,
            heap,
            path: path.to_path_buf(),
            cache,
            opts,
        }
    }

    /// `verify`; every key as the model says; a clean restart; every key again.
    fn verify_restart(self, keys: &[Vec<u8>], model: &Model, what: &str) -> Table {
        Index::verify(&self.t, false).unwrap_or_else(|e| panic!("{what}: verify: {e}"));
        check_content(&self.t, keys, model, what);
        let tb = self.restart(what);
        check_content(&tb.t, keys, model, &format!("{what}, and a restart"));
        tb
    }

    /// Clean shutdown (every handle must be gone), the allocator check, reopen and
    /// recover, the allocator check again.
    fn restart(self, what: &str) -> Table {
        Index::close(&self.t).unwrap();
        check_recovered(&self.t, &self.heap)
            .unwrap_or_else(|e| panic!("{what}: before the restart: {e}"));
        let Table {
            t,
            heap,
            path,
            cache,
            opts,
        } = self;
        drop(t);
        drop(heap);
        let rec = Heap::open(&path, &opts).unwrap();
        assert!(rec.report().was_clean, "{what}: not clean after a close");
        let t = LfHash::attach(rec.heap(), rec.heap().root(), &hash_opts(cache)).unwrap();
        let (heap, _) = index::recover(rec, &[&t]).unwrap();
        check_recovered(&t, &heap).unwrap_or_else(|e| panic!("{what}: after the restart: {e}"));
        Table {
            t,
            heap,
            path,
            cache,
            opts,
        }
    }
}

/// Buckets whose slot is set (the descriptor layout of hash/mod.rs's module note:
/// `8` log2 of segment 0's buckets, `64` 48 segment pointers; a segment holds its
/// bucket slots from byte 16). A white-box count, to make sure a test really
/// starts from uninitialised buckets.
fn initialised_buckets(t: &LfHash, heap: &Heap) -> u64 {
    let r = heap.region();
    let root = Index::root(t).offset();
    let s0: u64 = r.read(root + 8);
    let mut n = 0;
    for i in 0..48u64 {
        let s: u64 = r.read(root + 64 + 8 * i);
        if s == 0 {
            continue;
        }
        let buckets = if i == 0 {
            1 << s0
        } else {
            1u64 << (s0 + i - 1)
        };
        n += (0..buckets)
            .filter(|j| r.read::<u64>(s + 16 + 8 * j) != 0)
            .count() as u64;
    }
    n
}

/// 50,000 keys from empty, through batches of 256 only (sync after each, as the
/// Bullet gleaner does): read back, verified, restarted; then rewritten or removed
/// by batches with repeated keys, and restarted again.
fn fill_by_batches(cache: bool) {
    const N: usize = 50_000;
    const BATCH: usize = 256;
    let dir = tempfile::tempdir_in(shm_dir()).unwrap();
    let keys: Vec<Vec<u8>> = (0..N).map(|i| format!("fill{i:05}").into_bytes()).collect();
    let mut tb = Table::create(&dir.path().join("fill.heap"), cache, big_opts());
    let mut rng = SmallRng::seed_from_u64(0xf111 ^ cache as u64);
    let mut model = Model::new();
    let mut order: Vec<usize> = (0..N).collect();
    order.shuffle(&mut rng);
    {
        let mut h = Index::handle(&tb.t).unwrap();
        for (b, chunk) in order.chunks(BATCH).enumerate() {
            let items: Vec<Item> = chunk
                .iter()
                .map(|&k| (k, Some(vid(0, 0, k as u64))))
                .collect();
            apply(&mut h, &keys, &items, &mut model);
            h.sync().unwrap();
            if b % 40 == 0 {
                Index::verify(&tb.t, false)
                    .unwrap_or_else(|e| panic!("after batch {b}: verify: {e}"));
            }
        }
    }
    assert_eq!(model.len(), N);
    // The table grew with the batches (4 buckets at creation, load 2).
    assert!(
        tb.t.buckets() >= (N / 4) as u64,
        "{} buckets for {N} keys: the table did not keep up with the batches",
        tb.t.buckets()
    );
    check_content(&tb.t, &keys, &model, "after the fill");
    tb = tb.restart("after the fill");
    check_content(&tb.t, &keys, &model, "after the fill and a restart");

    // Rewrite every key (present: a value swap in phase 2), remove a tenth, and
    // repeat a few keys inside their batch (applied alone, in order).
    order.shuffle(&mut rng);
    {
        let mut h = Index::handle(&tb.t).unwrap();
        let mut n = 0u64;
        for chunk in order.chunks(BATCH) {
            let mut items: Vec<Item> = Vec::with_capacity(chunk.len() + 4);
            for &k in chunk {
                n += 1;
                let v = (!rng.random_bool(0.1)).then(|| vid(1, 0, n));
                items.push((k, v));
            }
            for _ in 0..rng.random_range(0..4) {
                let k = items[rng.random_range(0..items.len())].0;
                n += 1;
                let v = (!rng.random_bool(0.3)).then(|| vid(1, 0, n));
                let at = rng.random_range(0..=items.len());
                items.insert(at, (k, v));
            }
            apply(&mut h, &keys, &items, &mut model);
            h.sync().unwrap();
        }
    }
    check_content(&tb.t, &keys, &model, "after the rewrite");
    tb = tb.restart("after the rewrite");
    check_content(&tb.t, &keys, &model, "after the rewrite and a restart");
}

#[test]
fn hash_fill_by_batches_cache() {
    fill_by_batches(true);
}

#[test]
fn hash_fill_by_batches_nocache() {
    fill_by_batches(false);
}

/// A table of 2048 keys of bucket 0 (1024 buckets, only bucket 0 initialised),
/// then batches of random keys: every batch initialises buckets whose ancestors are
/// uninitialised, in rounds.
fn deep_ancestors(cache: bool) {
    let dir = tempfile::tempdir_in(shm_dir()).unwrap();
    let mut keys = zero_keys(2048, 10, "z");
    let nzero = keys.len();
    keys.extend((0..4096).map(|i| format!("rnd{i}").into_bytes()));
    let mut tb = Table::create(&dir.path().join("deep.heap"), cache, big_opts());
    let mut rng = SmallRng::seed_from_u64(0xdee9 ^ cache as u64);
    let mut model = Model::new();
    {
        let mut h = Index::handle(&tb.t).unwrap();
        // Batches of 128 keys into the one chain: most links change between the
        // phases (a neighbour of the same batch took the gap first).
        let mut order: Vec<usize> = (0..nzero).collect();
        order.shuffle(&mut rng);
        for chunk in order.chunks(128) {
            let items: Vec<Item> = chunk
                .iter()
                .map(|&k| (k, Some(vid(0, 0, k as u64))))
                .collect();
            apply(&mut h, &keys, &items, &mut model);
            h.sync().unwrap();
        }
    }
    check_content(&tb.t, &keys, &model, "after the bucket-0 keys");
    assert_eq!(
        tb.t.buckets(),
        1024,
        "the table should have grown to 1024 buckets"
    );
    let before = initialised_buckets(&tb.t, &tb.heap);
    assert!(
        before <= 2,
        "{before} buckets initialised, expected bucket 0 only"
    );
    {
        let mut h = Index::handle(&tb.t).unwrap();
        let mut n = 0u64;
        let mut fresh = nzero..keys.len();
        for b in 0..24 {
            let mut items: Vec<Item> = Vec::new();
            // New random keys: their buckets and ancestors need initialising.
            for k in fresh.by_ref().take(if b < 4 { 16 } else { 160 }) {
                n += 1;
                items.push((k, Some(vid(1, 0, n))));
            }
            // Rewrites and removes of keys present (both kinds), removes of keys
            // absent, and a repeated key.
            let present: Vec<usize> = model.keys().copied().collect();
            for _ in 0..12 {
                let k = present[rng.random_range(0..present.len())];
                if items.iter().any(|&(i, _)| i == k) {
                    continue;
                }
                n += 1;
                let v = (!rng.random_bool(0.3)).then(|| vid(1, 0, n));
                items.push((k, v));
            }
            items.push((keys.len() - 1 - b, None));
            items.shuffle(&mut rng);
            if b % 3 == 0 {
                let k = items[0].0;
                n += 1;
                items.push((k, Some(vid(1, 0, n))));
            }
            apply(&mut h, &keys, &items, &mut model);
            if b % 2 == 0 {
                h.sync().unwrap();
            }
            Index::verify(&tb.t, false).unwrap_or_else(|e| panic!("after batch {b}: verify: {e}"));
            let mut out = Vec::new();
            for &(k, _) in &items {
                let got = h
                    .get(&keys[k], &mut out)
                    .unwrap()
                    .then(|| value_id(&out).unwrap());
                assert_eq!(got, model.get(&k).copied(), "after batch {b}: key {k}");
            }
        }
        h.sync().unwrap();
    }
    let after = initialised_buckets(&tb.t, &tb.heap);
    assert!(
        after > before + 200,
        "only {after} buckets initialised after the random batches"
    );
    check_content(&tb.t, &keys, &model, "after the random batches");
    tb = tb.restart("after the random batches");
    check_content(&tb.t, &keys, &model, "after a restart");
}

/// One batch of 700 new keys into a sparse table: 1,024 buckets, only bucket 0
/// initialised. About 200 pairs of the keys share a bucket (so the same gap of
/// the list), and sibling buckets initialised in one round share a gap too; each
/// group is linked as one run with one CAS. The batch costs two fences per round
/// of bucket initialisation (a round per level of ancestors, at most 11), two for
/// its blocks and links, and the allocator's: not two more for every key or
/// dummy that shares its place with another (about 500 more before runs).
fn sparse_batch(cache: bool) {
    const N: usize = 700;
    let dir = tempfile::tempdir_in(shm_dir()).unwrap();
    let keys: Vec<Vec<u8>> = (0..N).map(|i| format!("sparse{i}").into_bytes()).collect();
    let hopts = HashOptions {
        initial_buckets: 1024,
        ..hash_opts(cache)
    };
    // `msync`, whose allocator covers the batch's blocks with one fence
    // (`ThreadHeap::reserve`), so that the count is the links', and the default
    // geometry: parts of 256 writes.
    let opts = HeapOptions {
        geometry: Default::default(),
        ..heap_opts(64 << 20, 1 << 30, Strategy::Msync)
    };
    let tb = Table::create_with(&dir.path().join("sparse.heap"), cache, opts, hopts);
    let mut model = Model::new();
    let items: Vec<Item> = (0..N).map(|k| (k, Some(vid(0, 0, k as u64)))).collect();
    let fences = {
        let mut h = Index::handle(&tb.t).unwrap();
        let f0 = tb.heap.region().persist_stats().fences;
        apply(&mut h, &keys, &items, &mut model);
        let f = tb.heap.region().persist_stats().fences - f0;
        h.sync().unwrap();
        f
    };
    assert!(
        fences <= 64,
        "{fences} fences for one batch of {N} new keys into a sparse table"
    );
    assert_eq!(tb.t.buckets(), 1024, "the table should not have grown");
    tb.verify_restart(&keys, &model, "after the batch");
}

#[test]
fn hash_sparse_batch_links_runs_cache() {
    sparse_batch(true);
}

#[test]
fn hash_sparse_batch_links_runs_nocache() {
    sparse_batch(false);
}

#[test]
fn hash_batches_deep_uninitialised_ancestors_cache() {
    deep_ancestors(true);
}

#[test]
fn hash_batches_deep_uninitialised_ancestors_nocache() {
    deep_ancestors(false);
}

/// Two threads, batches on overlapping key ranges at the same time (thread 0 keys
/// `0..2000`, thread 1 keys `1000..3000`), from an empty table that grows under
/// them. Afterwards each key holds the value of the last write one of the threads
/// made to it (absent if that write was a remove).
fn concurrent_overlapping(cache: bool) {
    const NK: usize = 3000;
    const ROUNDS: u64 = 12;
    let dir = tempfile::tempdir_in(shm_dir()).unwrap();
    let keys: Vec<Vec<u8>> = (0..NK).map(|i| format!("ov{i:04}").into_bytes()).collect();
    let mut tb = Table::create(&dir.path().join("ov.heap"), cache, big_opts());
    let ranges = [0..2000usize, 1000..NK];
    let barrier = Barrier::new(2);
    // Per thread: key → its last write.
    let lasts: Vec<HashMap<usize, Option<u64>>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..2u64)
            .map(|tid| {
                let (t, keys, range, barrier) =
                    (&tb.t, &keys, ranges[tid as usize].clone(), &barrier);
                s.spawn(move || {
                    let mut rng = SmallRng::seed_from_u64(0x0e1a ^ tid ^ (cache as u64) << 8);
                    let mut h = Index::handle(t).unwrap();
                    let mut last: HashMap<usize, Option<u64>> = HashMap::new();
                    let mut scratch = Model::new();
                    let mut n = 0u64;
                    barrier.wait();
                    for round in 0..ROUNDS {
                        let mut order: Vec<usize> = range.clone().collect();
                        order.shuffle(&mut rng);
                        for chunk in order.chunks(rng.random_range(16..200)) {
                            let mut items: Vec<Item> = chunk
                                .iter()
                                .map(|&k| {
                                    n += 1;
                                    let put = round == 0 || !rng.random_bool(0.15);
                                    (k, put.then(|| vid(round, tid, n)))
                                })
                                .collect();
                            if rng.random_bool(0.2) {
                                let k = items[rng.random_range(0..items.len())].0;
                                n += 1;
                                let v = (!rng.random_bool(0.3)).then(|| vid(round, tid, n));
                                items.insert(rng.random_range(0..=items.len()), (k, v));
                            }
                            apply(&mut h, keys, &items, &mut scratch);
                            h.sync().unwrap();
                            for &(k, v) in &items {
                                last.insert(k, v);
                            }
                        }
                    }
                    last
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    Index::verify(&tb.t, true).unwrap_or_else(|e| panic!("after the threads: verify: {e}"));
    let found = read_all(&tb.t, &keys).unwrap();
    let mut bad = Vec::new();
    for k in 0..NK {
        let allowed: Vec<Option<u64>> = lasts.iter().filter_map(|l| l.get(&k).copied()).collect();
        let got = found.get(&k).copied();
        if !allowed.contains(&got) {
            bad.push(format!("key {k}: holds {got:?}, last writes {allowed:?}"));
        }
    }
    assert!(
        bad.is_empty(),
        "{} keys hold no thread's last write:\n{}",
        bad.len(),
        bad.iter().take(10).cloned().collect::<Vec<_>>().join("\n")
    );
    check_content(&tb.t, &keys, &found, "after the threads");
    tb = tb.restart("after the threads");
    check_content(&tb.t, &keys, &found, "after a restart");
}

#[test]
fn hash_concurrent_overlapping_batches_cache() {
    concurrent_overlapping(true);
}

#[test]
fn hash_concurrent_overlapping_batches_nocache() {
    concurrent_overlapping(false);
}

/// Per key of the universe, what a crash image taken during a batch may hold: its
/// value before the batch, or the result of a prefix of the batch's writes to it.
fn allowed_during(before: &Model, items: &[Item], nkeys: usize) -> Vec<Vec<Option<u64>>> {
    let mut allowed: Vec<Vec<Option<u64>>> =
        (0..nkeys).map(|k| vec![before.get(&k).copied()]).collect();
    for &(k, v) in items {
        allowed[k].push(v);
    }
    allowed
}

/// Recovers an image and checks it: recovery, `verify(true)`, the allocator's block
/// count, and every key's value against `allowed`.
fn check_crash_image(
    kind: Kind,
    path: &Path,
    bytes: &[u8],
    keys: &[Vec<u8>],
    allowed: &[Vec<Option<u64>>],
) -> Result<(), String> {
    pmem::sim::write_image(path, bytes).map_err(|e| format!("write image: {e}"))?;
    let rec = Heap::open(path, &sim_opts()).map_err(|e| format!("open: {e}"))?;
    let (heap, t, _) = recover(kind, rec).map_err(|e| format!("recover: {e}"))?;
    let v = check_recovered(&*t, &heap)?;
    let mut h = t.handle().map_err(|e| format!("handle: {e}"))?;
    let mut out = Vec::new();
    let mut found = 0;
    for (k, kb) in keys.iter().enumerate() {
        let got = if h.get(kb, &mut out).map_err(|e| format!("get: {e}"))? {
            found += 1;
            Some(value_id(&out).map_err(|e| format!("key {k}: {e}"))?)
        } else {
            None
        };
        if !allowed[k].contains(&got) {
            return Err(format!(
                "key {k}: recovered {got:?}, allowed {:?}",
                allowed[k]
            ));
        }
    }
    if v.keys != found {
        return Err(format!("verify counts {} keys, gets find {found}", v.keys));
    }
    Ok(())
}

/// A crash-imaged run of batches: the simulator, the heap, where images go, and
/// the tally (images checked, descriptions of the bad ones).
struct Imaging<'a> {
    kind: Kind,
    sim: &'a CrashSim,
    heap: &'a Heap,
    img_path: &'a Path,
    keys: &'a [Vec<u8>],
    images: u64,
    bad: Vec<String>,
}

impl<'a> Imaging<'a> {
    fn new(
        kind: Kind,
        sim: &'a CrashSim,
        heap: &'a Heap,
        img_path: &'a Path,
        keys: &'a [Vec<u8>],
    ) -> Self {
        Imaging {
            kind,
            sim,
            heap,
            img_path,
            keys,
            images: 0,
            bad: Vec::new(),
        }
    }

    /// Applies `items` and syncs, with a crash image at every fence and one after
    /// the sync. Each image taken during the batch must recover to what
    /// `allowed_during` allows, the one after it to exactly the model. Returns
    /// the number of images taken during the batch.
    fn batch(&mut self, h: &mut dyn Ops, items: &[Item], model: &mut Model, what: &str) -> u64 {
        let (kind, keys) = (self.kind, self.keys);
        let allowed = allowed_during(model, items, keys.len());
        self.sim.set_capture_ppm(1_000_000);
        apply(h, keys, items, model);
        h.sync().unwrap();
        self.sim.set_capture_ppm(0);
        let during = self.sim.take_images();
        let after = self.sim.capture_now(self.heap.region());
        let exact: Vec<Vec<Option<u64>>> = (0..keys.len())
            .map(|k| vec![model.get(&k).copied()])
            .collect();
        for img in &during {
            if let Err(e) = check_crash_image(kind, self.img_path, &img.bytes, keys, &allowed) {
                self.bad
                    .push(format!("{what}, image at fence {}: {e}", img.fence));
            }
        }
        if let Err(e) = check_crash_image(kind, self.img_path, &after.bytes, keys, &exact) {
            self.bad.push(format!("{what}, image after its sync: {e}"));
        }
        self.images += during.len() as u64 + 1;
        during.len() as u64
    }

    /// Reports the images checked, fails on any bad one, and closes the
    /// structure (its handles gone) with the allocator check.
    fn finish(self, label: &str, t: &Idx) {
        let (kind, bad) = (self.kind, &self.bad);
        say(&format!(
            "{label} ({kind}): {} checked, {} bad",
            self.images,
            bad.len()
        ));
        assert!(
            bad.is_empty(),
            "{kind}: {} bad images:\n{}",
            bad.len(),
            bad.join("\n")
        );
        t.close().unwrap();
        check_recovered(&**t, self.heap).unwrap();
    }
}

/// Batches (new keys in uninitialised buckets with uninitialised ancestors,
/// rewrites, removes, repeated keys, and batches of distinct puts only, after which
/// nothing else fences) with a crash image at every fence and one after the sync.
fn crash_at_every_fence(kind: Kind) {
    let dir = tempfile::tempdir_in(shm_dir()).unwrap();
    let path = dir.path().join("t.heap");
    let img_path = dir.path().join("img.heap");
    // 512 keys of bucket 0 (the table grows to 256 buckets, only bucket 0 in
    // use), then fresh random keys.
    let mut keys = zero_keys(512, 8, "zc");
    let nzero = keys.len();
    keys.extend((0..400).map(|i| format!("cr{i}").into_bytes()));
    {
        let heap = Heap::create(&path, &sim_opts()).unwrap();
        let t = create(kind, &heap).unwrap();
        t.close().unwrap();
    }
    let sim = Arc::new(CrashSim::new(0xc7a5 ^ kind.id(), 0));
    let rec = Heap::open_sim(&path, &sim_opts(), sim.clone()).unwrap();
    let (heap, t, _) = recover(kind, rec).unwrap();
    let mut rng = SmallRng::seed_from_u64(0xfe9ce ^ kind.id());
    let mut model = Model::new();
    let mut h = t.handle().unwrap();
    // The keys of bucket 0, by batches (not imaged).
    for chunk in (0..nzero).collect::<Vec<_>>().chunks(64) {
        let items: Vec<Item> = chunk
            .iter()
            .map(|&k| (k, Some(vid(0, 0, k as u64))))
            .collect();
        apply(&mut *h, &keys, &items, &mut model);
        h.sync().unwrap();
    }
    let _ = sim.take_images();
    let mut im = Imaging::new(kind, &sim, &heap, &img_path, &keys);
    let mut fresh = nzero..keys.len();
    let mut n = 0u64;
    for b in 0..10 {
        let pure = b % 2 == 1;
        let mut items: Vec<Item> = Vec::new();
        for k in fresh.by_ref().take(20) {
            n += 1;
            items.push((k, Some(vid(1, 0, n))));
        }
        let present: Vec<usize> = model.keys().copied().collect();
        for _ in 0..10 {
            let k = present[rng.random_range(0..present.len())];
            if items.iter().any(|&(i, _)| i == k) {
                continue;
            }
            n += 1;
            let v = (pure || !rng.random_bool(0.3)).then(|| vid(1, 0, n));
            items.push((k, v));
        }
        if !pure {
            // A remove of a key absent, a repeated key (put, remove, put).
            items.push((keys.len() - 1 - b, None));
            let k = items[0].0;
            n += 1;
            items.push((k, None));
            n += 1;
            items.push((k, Some(vid(1, 0, n))));
        }
        items.shuffle(&mut rng);
        let what = format!("batch {b} (pure puts: {pure})");
        let during = im.batch(&mut *h, &items, &mut model, &what);
        assert!(during > 0, "batch {b} fenced nothing");
        if im.bad.len() >= 5 {
            break;
        }
    }
    drop(h);
    im.finish("batch crash images", &t);
}

/// Batches of new keys into a sparse table (16 buckets at creation, only bucket 0
/// initialised, so most buckets wait for their dummy and many keys of a part
/// share a bucket) with a crash image at every fence and one after the sync:
/// runs of dummies and of new nodes, each linked by one CAS, recover whole or
/// not at all, and leak nothing.
fn crash_at_every_fence_sparse(kind: Kind) {
    let dir = tempfile::tempdir_in(shm_dir()).unwrap();
    let path = dir.path().join("t.heap");
    let img_path = dir.path().join("img.heap");
    let keys: Vec<Vec<u8>> = (0..96).map(|i| format!("sp{i}").into_bytes()).collect();
    {
        let heap = Heap::create(&path, &sim_opts()).unwrap();
        let hopts = HashOptions {
            initial_buckets: 16,
            ..hash_opts(kind == Kind::Hash)
        };
        let t = LfHash::create(&heap, &hopts).unwrap();
        heap.set_root(Index::root(&t)).unwrap();
        Index::close(&t).unwrap();
    }
    let sim = Arc::new(CrashSim::new(0x5ba7 ^ kind.id(), 0));
    let rec = Heap::open_sim(&path, &sim_opts(), sim.clone()).unwrap();
    let (heap, t, _) = recover(kind, rec).unwrap();
    let mut model = Model::new();
    let mut h = t.handle().unwrap();
    let mut im = Imaging::new(kind, &sim, &heap, &img_path, &keys);
    for (b, chunk) in (0..keys.len()).collect::<Vec<_>>().chunks(24).enumerate() {
        let items: Vec<Item> = chunk
            .iter()
            .map(|&k| (k, Some(vid(2, 0, k as u64))))
            .collect();
        im.batch(&mut *h, &items, &mut model, &format!("batch {b}"));
    }
    drop(h);
    im.finish("sparse batch crash images", &t);
}

#[test]
fn hash_sparse_batch_crash_at_every_fence_cache() {
    crash_at_every_fence_sparse(Kind::Hash);
}

#[test]
fn hash_sparse_batch_crash_at_every_fence_nocache() {
    crash_at_every_fence_sparse(Kind::HashNoCache);
}

#[test]
fn hash_batch_crash_at_every_fence_cache() {
    crash_at_every_fence(Kind::Hash);
}

#[test]
fn hash_batch_crash_at_every_fence_nocache() {
    crash_at_every_fence(Kind::HashNoCache);
}

/// A reader that finds a key a concurrent batch is inserting must find a durable
/// insert: a crash image taken right after its `get` returned must hold the key
/// (durable linearizability; the `Ops` note: "a key is returned only if its
/// insertion is durable"). The writer's batches put new keys into a few long
/// chains (keys of bucket 0 mod 16) without the link cache, so each insert is
/// linked DIRTY in phase 2 and made durable by the fence that ends the phase;
/// the reader polls the first keys of the batch in flight with `get`, and takes a
/// crash image when it finds one.
///
/// This caught `Inner::get` settling only the first link of the chain and following
/// the others with a plain `load`, so that it returned a node whose incoming link
/// was still DIRTY (not durable). With single puts the window is one flush wide and
/// practically never seen; a batch's phase 2 keeps every link DIRTY until the
/// fence after the last CAS, and about half of the images taken after such a get
/// lost the key. `get` now settles every link it follows, as `find` and
/// `scan_keys` do.
#[test]
fn hash_get_sees_only_durable_batch_inserts() {
    let kind = Kind::HashNoCache;
    let dir = tempfile::tempdir_in(shm_dir()).unwrap();
    let path = dir.path().join("g.heap");
    let img_path = dir.path().join("img.heap");
    const BATCH: usize = 64;
    const BATCHES: usize = 120;
    let keys = zero_keys(BATCH * BATCHES, 4, "g");
    let (sim, heap, t) = fresh_under_sim(kind, &path, 5);
    // (key, image taken right after a get found it, whether its batch had not
    // returned when the get did).
    let hits: Mutex<Vec<(usize, pmem::CrashImage, bool)>> = Mutex::new(Vec::new());
    // Batch number in flight (started; `done` = returned and synced) + 1.
    let started = AtomicUsize::new(0);
    let done = AtomicUsize::new(0);
    let watching = AtomicUsize::new(0);
    let ready = Barrier::new(2);
    std::thread::scope(|s| {
        s.spawn(|| {
            let mut h = t.handle().unwrap();
            ready.wait();
            batch_writer(&mut *h, &keys, BATCH, &started, &done, &watching);
        });
        s.spawn(|| {
            let mut h = t.handle().unwrap();
            let mut out = Vec::new();
            ready.wait();
            // One image per batch (each costs a copy of the heap).
            let mut imaged = [false; BATCHES];
            let (mut polls, mut idle) = (0u64, 0u64);
            while done.load(Ordering::SeqCst) < BATCHES {
                let b = started.load(Ordering::SeqCst);
                watching.store(b, Ordering::SeqCst);
                if b == 0 || done.load(Ordering::SeqCst) == b || imaged[b - 1] {
                    std::hint::spin_loop();
                    idle += 1;
                    continue;
                }
                polls += 1;
                // Batch b - 1 is in flight: poll its first keys (phase 2 links
                // them first, so their links stay not durable the longest).
                for (k, kb) in keys.iter().enumerate().skip((b - 1) * BATCH).take(4) {
                    if !h.get(kb, &mut out).unwrap() {
                        continue;
                    }
                    let in_flight = done.load(Ordering::SeqCst) < b;
                    let img = sim.capture_now(heap.region());
                    imaged[b - 1] = true;
                    hits.lock().unwrap().push((k, img, in_flight));
                    break;
                }
            }
            say(&format!(
                "reader: {polls} polls of a batch in flight, {idle} idle"
            ));
        });
    });
    let hits = hits.into_inner().unwrap();
    let in_flight = hits.iter().filter(|h| h.2).count();
    let mut bad = Vec::new();
    for (k, img, fl) in &hits {
        let mut allowed: Vec<Vec<Option<u64>>> = (0..keys.len())
            .map(|i| vec![None, Some(vid(0, 0, i as u64))])
            .collect();
        allowed[*k] = vec![Some(vid(0, 0, *k as u64))];
        if let Err(e) = check_crash_image(kind, &img_path, &img.bytes, &keys, &allowed) {
            bad.push(format!(
                "image after a get of key {k} (batch {}, in flight: {fl}, fence {}): {e}",
                k / BATCH,
                img.fence
            ));
        }
    }
    say(&format!(
        "get-durability: {} get hits imaged ({in_flight} during their batch), {} bad",
        hits.len(),
        bad.len()
    ));
    assert!(
        bad.is_empty(),
        "{} of {} images lose a key a completed get had returned:\n{}",
        bad.len(),
        hits.len(),
        bad.iter().take(5).cloned().collect::<Vec<_>>().join("\n")
    );
}

/// A writer whose insert depends on a link of a concurrent batch must make that link
/// durable first (the DIRTY mark is there for it): thread B puts, while a batch of
/// thread A is in flight, a key whose place in the split order is right after the
/// first key of A's batch, once a `get` sees that key linked; a crash image taken
/// right after B's put returned must hold B's key. Were A's phase-2 links not
/// marked DIRTY, B's `find` would not settle the link to A's node, B's own link
/// (from A's node) would be durable before A's, and a crash before A's fence would
/// lose B's completed put. Keys of bucket 0 mod 16, no link cache, batches of 512
/// (phase 2 must last longer than B's get and put for B to get in).
#[test]
fn hash_put_behind_a_batch_insert_is_durable() {
    let kind = Kind::HashNoCache;
    let dir = tempfile::tempdir_in(shm_dir()).unwrap();
    let path = dir.path().join("p.heap");
    let img_path = dir.path().join("img.heap");
    const BATCH: usize = 512;
    const BATCHES: usize = 40;
    let a_keys = zero_keys(BATCH * BATCHES, 4, "a");
    // For the first key of each batch, the key of a large pool that comes next in
    // split order (`scan_pos` of the hash): B's key for that batch.
    let so = |k: &[u8]| index::scan_pos(common::HASHER.hash(k));
    let mut pool: Vec<(u64, Vec<u8>)> = zero_keys(60_000, 4, "b")
        .into_iter()
        .map(|k| (so(&k), k))
        .collect();
    pool.sort();
    let b_keys: Vec<Vec<u8>> = (0..BATCHES)
        .map(|i| {
            let a = so(&a_keys[i * BATCH]);
            let j = pool.partition_point(|(s, _)| *s <= a).min(pool.len() - 1);
            pool.remove(j).1
        })
        .collect();
    let (sim, heap, t) = fresh_under_sim(kind, &path, 9);
    // (batch, image taken after B's put of that batch's key returned).
    let images: Mutex<Vec<(usize, pmem::CrashImage)>> = Mutex::new(Vec::new());
    let started = AtomicUsize::new(0);
    let done = AtomicUsize::new(0);
    let watching = AtomicUsize::new(0);
    let ready = Barrier::new(2);
    std::thread::scope(|s| {
        s.spawn(|| {
            let mut h = t.handle().unwrap();
            ready.wait();
            batch_writer(&mut *h, &a_keys, BATCH, &started, &done, &watching);
        });
        s.spawn(|| {
            let mut h = t.handle().unwrap();
            let mut out = Vec::new();
            ready.wait();
            let mut put = [false; BATCHES];
            while done.load(Ordering::SeqCst) < BATCHES {
                let b = started.load(Ordering::SeqCst);
                watching.store(b, Ordering::SeqCst);
                if b == 0 || done.load(Ordering::SeqCst) == b || put[b - 1] {
                    std::hint::spin_loop();
                    continue;
                }
                // A's batch b - 1 is in flight: once its first key is linked,
                // insert behind it.
                if !h.get(&a_keys[(b - 1) * BATCH], &mut out).unwrap() {
                    continue;
                }
                h.put(&b_keys[b - 1], &value(vid(1, 1, (b - 1) as u64)))
                    .unwrap();
                h.sync().unwrap();
                put[b - 1] = true;
                let img = sim.capture_now(heap.region());
                images.lock().unwrap().push((b - 1, img));
            }
        });
    });
    let images = images.into_inner().unwrap();
    // The universe: A's keys, then B's.
    let keys: Vec<Vec<u8>> = a_keys.iter().chain(&b_keys).cloned().collect();
    let mut bad = Vec::new();
    for (i, img) in &images {
        let mut allowed: Vec<Vec<Option<u64>>> = (0..a_keys.len())
            .map(|k| vec![None, Some(vid(0, 0, k as u64))])
            .collect();
        // B's keys put so far are durable, the others absent.
        let done_b: Vec<usize> = images.iter().map(|(j, _)| *j).filter(|j| j <= i).collect();
        allowed.extend((0..BATCHES).map(|j| {
            if done_b.contains(&j) {
                vec![Some(vid(1, 1, j as u64))]
            } else {
                vec![None]
            }
        }));
        if let Err(e) = check_crash_image(kind, &img_path, &img.bytes, &keys, &allowed) {
            bad.push(format!(
                "image after B's put behind batch {i} (fence {}): {e}",
                img.fence
            ));
        }
    }
    say(&format!(
        "put-behind-batch: {} puts imaged, {} bad",
        images.len(),
        bad.len()
    ));
    assert!(
        bad.is_empty(),
        "{} of {} images lose a completed put:\n{}",
        bad.len(),
        images.len(),
        bad.iter().take(5).cloned().collect::<Vec<_>>().join("\n")
    );
}

/// One batch far larger than the thread's active page table (64 entries in the
/// test geometry) and than the table: 20,000 inserts from empty, then one batch
/// overwriting them all, with no sync in between. It must not fail for want of
/// active-page entries (a batch is applied in parts, each part's tickets inside
/// the table), and the table must grow with it (the count is published per part).
fn huge_batches(cache: bool) {
    const N: usize = 20_000;
    let dir = tempfile::tempdir_in(shm_dir()).unwrap();
    let keys: Vec<Vec<u8>> = (0..N).map(|i| format!("huge{i:05}").into_bytes()).collect();
    let tb = Table::create(&dir.path().join("huge.heap"), cache, big_opts());
    let mut model = Model::new();
    {
        let mut h = Index::handle(&tb.t).unwrap();
        let fill: Vec<Item> = (0..N).map(|k| (k, Some(vid(0, 0, k as u64)))).collect();
        apply(&mut h, &keys, &fill, &mut model);
        assert!(
            tb.t.buckets() >= (N / 4) as u64,
            "{} buckets for {N} keys after one batch: the table did not grow with it",
            tb.t.buckets()
        );
        let over: Vec<Item> = (0..N).map(|k| (k, Some(vid(1, 0, k as u64)))).collect();
        apply(&mut h, &keys, &over, &mut model);
        h.sync().unwrap();
    }
    tb.verify_restart(&keys, &model, "after the huge batches");
}

#[test]
fn hash_huge_batches_cache() {
    huge_batches(true);
}

#[test]
fn hash_huge_batches_nocache() {
    huge_batches(false);
}

/// The writer of the two concurrent crash tests: inserts `keys` by batches of
/// `batch`, each followed by a sync. Before batch `i` it stores `i + 1` in
/// `started` and waits (up to 20 ms) for the watcher to store the same in
/// `watching`; once the batch has returned and synced it stores `i + 1` in `done`.
fn batch_writer(
    h: &mut dyn Ops,
    keys: &[Vec<u8>],
    batch: usize,
    started: &AtomicUsize,
    done: &AtomicUsize,
    watching: &AtomicUsize,
) {
    let mut model = Model::new();
    for (i, chunk) in (0..keys.len())
        .collect::<Vec<_>>()
        .chunks(batch)
        .enumerate()
    {
        let items: Vec<Item> = chunk
            .iter()
            .map(|&k| (k, Some(vid(0, 0, k as u64))))
            .collect();
        started.store(i + 1, Ordering::SeqCst);
        let t0 = std::time::Instant::now();
        while watching.load(Ordering::SeqCst) != i + 1
            && t0.elapsed() < std::time::Duration::from_millis(20)
        {
            std::thread::yield_now();
        }
        apply(h, keys, &items, &mut model);
        h.sync().unwrap();
        done.store(i + 1, Ordering::SeqCst);
        // Let the watcher look at an idle table now and then.
        std::thread::yield_now();
    }
}

/// A new empty structure at `path`, reopened under a crash simulator (seed `seed`,
/// no automatic images): the simulator, the heap and the structure.
fn fresh_under_sim(kind: Kind, path: &Path, seed: u64) -> (Arc<CrashSim>, Heap, Idx) {
    {
        let heap = Heap::create(path, &sim_opts()).unwrap();
        let t = create(kind, &heap).unwrap();
        t.close().unwrap();
    }
    let sim = Arc::new(CrashSim::new(seed, 0));
    let rec = Heap::open_sim(path, &sim_opts(), sim.clone()).unwrap();
    let (heap, t, _) = recover(kind, rec).unwrap();
    (sim, heap, t)
}
