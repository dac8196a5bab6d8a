//! Tests of the durable skip list (`index::skiplist`): a model check against a
//! `BTreeMap` (with the link cache on, off, and with a one-bucket cache that often
//! overflows), two threads on overlapping keys, reopening, attaching to garbage,
//! exact reachability, and crash images from the crash simulator (every image must
//! recover to a verified list with no leaked block and a state the history allows).

use index::skiplist::{node_size, SkipHandle};
use index::{Index, Ops, Recoverable, SkipList, SkipOptions};
use pmem::{CrashSim, Geometry, Heap, HeapOptions, PPtr, Strategy};
use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

fn heap_opts() -> HeapOptions {
    HeapOptions {
        size: 64 << 20,
        ..Default::default()
    }
}

fn opts(cache: bool) -> SkipOptions {
    SkipOptions {
        link_cache: cache,
        ..Default::default()
    }
}

fn new_list(path: &Path, o: &SkipOptions) -> (Heap, SkipList) {
    let heap = Heap::create(path, &heap_opts()).unwrap();
    let list = SkipList::create(&heap, o).unwrap();
    heap.set_root(list.root()).unwrap();
    (heap, list)
}

/// Opens the heap at `path`, attaches and recovers the list at its root.
fn reopen(
    path: &Path,
    hopts: &HeapOptions,
    o: &SkipOptions,
) -> (Heap, SkipList, index::RecoverStats) {
    let rec = Heap::open(path, hopts).unwrap();
    let root = rec.heap().root();
    let list = SkipList::attach(rec.heap(), root, o).unwrap();
    let (heap, st) = index::recover(rec, &[&list]).unwrap();
    (heap, list, st)
}

fn rand_key(rng: &mut SmallRng) -> Vec<u8> {
    const ALPHA: [u8; 4] = [0, 1, b'a', 0xff];
    let n = rng.random_range(0..6usize);
    (0..n).map(|_| ALPHA[rng.random_range(0..4usize)]).collect()
}

fn rand_value(rng: &mut SmallRng) -> Vec<u8> {
    let n = match rng.random_range(0..100u32) {
        0 => 70_000, // a page run
        1..=4 => rng.random_range(1000..5000usize),
        _ => rng.random_range(0..200usize),
    };
    let b: u8 = rng.random();
    (0..n).map(|i| b.wrapping_add(i as u8)).collect()
}

fn check_verify(list: &SkipList, model: &BTreeMap<Vec<u8>, Vec<u8>>) {
    let v = list.verify(true).unwrap();
    assert_eq!(v.keys, model.len() as u64, "keys");
    assert_eq!(v.blocks, 2 + 2 * model.len() as u64, "blocks");
    let payload: u64 = model.iter().map(|(k, v)| (k.len() + v.len()) as u64).sum();
    assert_eq!(v.payload_bytes, payload, "payload");
}

fn range_of(h: &mut SkipHandle, start: &[u8], limit: usize) -> Vec<(Vec<u8>, Vec<u8>)> {
    let mut out = Vec::new();
    let n = h
        .range(start, limit, |k, v| out.push((k.to_vec(), v.to_vec())))
        .unwrap();
    assert_eq!(n, out.len());
    out
}

/// Random operations from two handles (used alternately by one thread) against a
/// `BTreeMap`.
fn model_run(o: SkipOptions, seed: u64, ops: usize) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.heap");
    let (heap, list) = new_list(&path, &o);
    let mut hs = [list.handle().unwrap(), list.handle().unwrap()];
    let mut model: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut out = Vec::new();
    for i in 0..ops {
        let h = &mut hs[rng.random_range(0..2usize)];
        let k = rand_key(&mut rng);
        match rng.random_range(0..100u32) {
            0..35 => {
                let v = rand_value(&mut rng);
                let new = h.put(&k, &v).unwrap();
                assert_eq!(new, model.insert(k, v).is_none(), "put #{i}");
            }
            35..50 => {
                let v = rand_value(&mut rng);
                let new = h.insert(&k, &v).unwrap();
                assert_eq!(new, !model.contains_key(&k), "insert #{i}");
                model.entry(k).or_insert(v);
            }
            50..75 => {
                let was = h.remove(&k).unwrap();
                assert_eq!(was, model.remove(&k).is_some(), "remove #{i}");
            }
            75..90 => {
                let found = h.get(&k, &mut out).unwrap();
                match model.get(&k) {
                    Some(v) => assert!(found && out == *v, "get #{i}"),
                    None => assert!(!found && out.is_empty(), "get #{i}"),
                }
            }
            _ => {
                let limit = rng.random_range(0..20usize);
                let got = range_of(h, &k, limit);
                let want: Vec<_> = model
                    .range(k.clone()..)
                    .take(limit)
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect();
                assert_eq!(got, want, "range #{i}");
            }
        }
        if i % 500 == 499 {
            check_verify(&list, &model);
        }
    }
    let all = range_of(&mut hs[0], b"", usize::MAX);
    assert_eq!(all.len(), model.len());
    assert!(all
        .iter()
        .zip(model.iter())
        .all(|(a, b)| a.0 == *b.0 && a.1 == *b.1));
    for h in &mut hs {
        h.sync().unwrap();
    }
    if let Some(c) = list.link_cache() {
        c.flush_all(heap.region());
        assert_eq!(c.busy(), 0);
    }
    drop(hs);
    list.close().unwrap();
    assert_eq!(list.len_estimate(), model.len() as u64);
    check_verify(&list, &model);
    let rep = pmem::check_heap(&heap);
    assert!(rep.ok(), "{:?}", rep.problems);

    // Clean reopen: same contents, exact count, nothing leaked after recovery.
    drop(list);
    drop(heap);
    let (heap, list, st) = reopen(&path, &heap_opts(), &o);
    assert!(st.heap.was_clean);
    assert_eq!(list.len_estimate(), model.len() as u64);
    check_verify(&list, &model);
    let mut h = list.handle().unwrap();
    for (k, v) in &model {
        assert!(h.get(k, &mut out).unwrap());
        assert_eq!(&out, v);
    }
    drop(h);
    let rep = pmem::check_heap(&heap);
    assert!(rep.ok(), "{:?}", rep.problems);
    assert_eq!(rep.blocks, 2 + 2 * model.len() as u64, "leaked blocks");
}

#[test]
fn model_with_link_cache() {
    model_run(opts(true), 1, 6000);
}

#[test]
fn model_without_link_cache() {
    model_run(opts(false), 2, 6000);
}

#[test]
fn model_with_one_bucket_cache() {
    let o = SkipOptions {
        link_cache: true,
        cache_buckets: 1,
    };
    model_run(o, 3, 4000);
}

#[test]
fn rejects_oversized_keys_and_values() {
    let dir = tempfile::tempdir().unwrap();
    let (_heap, list) = new_list(&dir.path().join("o.heap"), &opts(true));
    let mut h = list.handle().unwrap();
    let big = vec![7u8; index::MAX_KEY + 1];
    assert!(matches!(
        h.put(&big, b"v"),
        Err(index::Error::KeyTooLarge(_))
    ));
    assert!(matches!(h.remove(&big), Err(index::Error::KeyTooLarge(_))));
    let mut out = Vec::new();
    assert!(matches!(
        h.get(&big, &mut out),
        Err(index::Error::KeyTooLarge(_))
    ));
    let maxk = vec![7u8; index::MAX_KEY];
    assert!(h.put(&maxk, b"v").unwrap());
    assert!(h.get(&maxk, &mut out).unwrap() && out == b"v");
    assert!(h.put(b"", b"empty key").unwrap());
    assert!(h.get(b"", &mut out).unwrap() && out == b"empty key");
    assert_eq!(list.verify(true).unwrap().keys, 2);
}

fn threads(o: SkipOptions, nthreads: u64, keys: u64, ops: u64) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.heap");
    let (heap, list) = new_list(&path, &o);
    std::thread::scope(|s| {
        for t in 0..nthreads {
            let list = list.clone();
            s.spawn(move || {
                let mut h = list.handle().unwrap();
                let mut rng = SmallRng::seed_from_u64(100 + t);
                let mut out = Vec::new();
                for n in 0..ops {
                    let k = rng.random_range(0..keys);
                    let key = format!("k{k:03}");
                    match rng.random_range(0..10u32) {
                        0..4 => {
                            let v = format!("{key}/t{t}/n{n}/{}", "x".repeat((n % 40) as usize));
                            h.put(key.as_bytes(), v.as_bytes()).unwrap();
                        }
                        4..5 => {
                            h.insert(key.as_bytes(), format!("{key}/t{t}/i{n}").as_bytes())
                                .unwrap();
                        }
                        5..8 => {
                            h.remove(key.as_bytes()).unwrap();
                        }
                        8 => {
                            if h.get(key.as_bytes(), &mut out).unwrap() {
                                assert!(out.starts_with(format!("{key}/").as_bytes()));
                            }
                        }
                        _ => {
                            let mut prev: Option<Vec<u8>> = None;
                            h.range(key.as_bytes(), 8, |k, v| {
                                assert!(k >= key.as_bytes());
                                assert!(v.starts_with(k) && v[k.len()] == b'/');
                                if let Some(p) = &prev {
                                    assert!(p.as_slice() < k, "range out of order");
                                }
                                prev = Some(k.to_vec());
                            })
                            .unwrap();
                        }
                    }
                }
            });
        }
    });
    let v = list.verify(true).unwrap();
    assert_eq!(v.keys, list.len_estimate());
    let mut h = list.handle().unwrap();
    let all = range_of(&mut h, b"", usize::MAX);
    assert_eq!(all.len() as u64, v.keys);
    for (k, val) in &all {
        assert!(val.starts_with(k));
    }
    drop(h);
    list.close().unwrap();
    drop(list);
    drop(heap);
    // After recovery every retired block is freed and nothing else is lost.
    let (heap, list, _) = reopen(&path, &heap_opts(), &o);
    let v2 = list.verify(true).unwrap();
    assert_eq!(v2, v);
    let rep = pmem::check_heap(&heap);
    assert!(rep.ok(), "{:?}", rep.problems);
    assert_eq!(rep.blocks, v2.blocks, "leaked blocks");
}

#[test]
fn two_threads_with_link_cache() {
    threads(opts(true), 2, 48, 20_000);
}

#[test]
fn two_threads_without_link_cache() {
    threads(opts(false), 2, 48, 20_000);
}

/// Four threads on eight keys: removals race insertions of the same key all the
/// time (the insert/remove hand-off), and a one-bucket cache overflows.
#[test]
fn four_threads_hot_keys() {
    let o = SkipOptions {
        link_cache: true,
        cache_buckets: 1,
    };
    threads(o, 4, 8, 10_000);
    threads(opts(false), 4, 8, 10_000);
}

#[test]
fn reopen_after_drop_without_close() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("r.heap");
    let o = opts(true);
    let (heap, list) = new_list(&path, &o);
    let mut h = list.handle().unwrap();
    let mut model = BTreeMap::new();
    for i in 0..300u32 {
        let k = format!("key{:05}", (i * 7919) % 1000).into_bytes();
        let v = format!("value-{i}").into_bytes();
        h.put(&k, &v).unwrap();
        model.insert(k, v);
        if i % 3 == 0 {
            let k = format!("key{:05}", (i * 31) % 1000).into_bytes();
            h.remove(&k).unwrap();
            model.remove(&k);
        }
    }
    drop(h); // syncs
    drop(list);
    drop(heap);
    let (heap, list, st) = reopen(&path, &heap_opts(), &o);
    eprintln!("recovery: {st:?}");
    check_verify(&list, &model);
    let mut h = list.handle().unwrap();
    let all = range_of(&mut h, b"", usize::MAX);
    let want: Vec<_> = model.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    assert_eq!(all, want);
    // The recovered list keeps working.
    assert!(h.put(b"after", b"reopen").unwrap());
    assert!(h.remove(&want[0].0).unwrap());
    drop(h);
    list.close().unwrap();
    let v = list.verify(true).unwrap();
    assert_eq!(v.keys, model.len() as u64);
    let rep = pmem::check_heap(&heap);
    assert!(rep.ok(), "{:?}", rep.problems);
}

#[test]
fn attach_rejects_garbage() {
    let dir = tempfile::tempdir().unwrap();
    let (heap, list) = new_list(&dir.path().join("g.heap"), &opts(true));
    let o = opts(true);
    let r = heap.region();
    let root = list.root();
    let corrupt = |p: PPtr<u8>| match SkipList::attach(&heap, p, &o) {
        Err(index::Error::Corrupt(m)) => m,
        Err(e) => panic!("unexpected error {e}"),
        Ok(_) => panic!("attached to garbage at {p:?}"),
    };
    corrupt(PPtr::NULL);
    corrupt(PPtr::from_raw(root.offset() + 8));
    corrupt(PPtr::from_raw(root.offset() | 1));
    corrupt(PPtr::from_raw(heap.region().size() + 4096));
    corrupt(PPtr::from_raw(!15));
    corrupt(PPtr::from_raw(64));
    let mut th = heap.thread().unwrap();
    let mut rng = SmallRng::seed_from_u64(9);
    for size in [16u64, 24, 32, 300, 5000] {
        let b = th.alloc(size).unwrap();
        let junk: Vec<u8> = (0..size).map(|_| rng.random()).collect();
        r.write_bytes(b.offset(), &junk);
        corrupt(b);
    }
    // A plausible descriptor with a bad version, then with bad heads.
    let d = th.alloc(32).unwrap().offset();
    let head: u64 = r.read(root.offset() + 8);
    r.write_bytes(d, &r.read::<[u8; 24]>(root.offset()));
    assert!(SkipList::attach(&heap, PPtr::from_raw(d), &o).is_ok());
    r.write::<u32>(d + 4, &7);
    corrupt(PPtr::from_raw(d));
    r.write::<u32>(d + 4, &1);
    for bad_head in [0, head + 16, head | 2, u64::MAX - 15, d, root.offset()] {
        r.write::<u64>(d + 8, &bad_head);
        corrupt(PPtr::from_raw(d));
    }
    let b = th.alloc(node_size(32, 0)).unwrap().offset();
    r.fill(b, node_size(32, 0) as usize, 0);
    r.write::<u64>(d + 8, &b);
    corrupt(PPtr::from_raw(d)); // zeroes: no head tag
    r.write_bytes(b, &r.read::<[u8; 24]>(head));
    r.write::<u32>(b + 8, &31);
    corrupt(PPtr::from_raw(d)); // wrong height
    r.write::<u32>(b + 8, &32);
    assert!(SkipList::attach(&heap, PPtr::from_raw(d), &o).is_ok());
    // The real one still attaches.
    assert!(SkipList::attach(&heap, root, &o).is_ok());
}

#[test]
fn reachable_is_exact() {
    let dir = tempfile::tempdir().unwrap();
    let o = opts(true);
    let (heap, list) = new_list(&dir.path().join("x.heap"), &o);
    let r = heap.region();
    let mut h = list.handle().unwrap();
    for i in 0..64 {
        h.put(format!("k{i:02}").as_bytes(), format!("v{i}").as_bytes())
            .unwrap();
    }
    let root = list.root();
    let head = PPtr::from_raw(r.read::<u64>(root.offset() + 8));
    assert!(list.reachable(root));
    assert!(list.reachable(head));
    let (n10, v10) = h.locate(b"k10").unwrap();
    assert!(list.reachable(n10) && list.reachable(v10));
    assert!(!list.reachable(PPtr::from_raw(n10.offset() + 16)));
    assert!(!list.reachable(PPtr::from_raw(12345)));
    assert!(!list.reachable(PPtr::from_raw(r.size() + (1 << 20))));

    // Update: the new value block is reachable, the old one no longer.
    h.put(b"k10", b"new value").unwrap();
    let (n10b, v10b) = h.locate(b"k10").unwrap();
    assert_eq!(n10b, n10);
    assert!(list.reachable(v10b));
    assert!(!list.reachable(v10));

    // Remove: neither node nor value is reachable (before and after they are freed,
    // and whatever reuses their slots).
    let (n11, v11) = h.locate(b"k11").unwrap();
    assert!(h.remove(b"k11").unwrap());
    assert!(h.locate(b"k11").is_none());
    assert!(!list.reachable(n11) && !list.reachable(v11));
    h.sync().unwrap();
    list.close().unwrap(); // runs the deferred frees
    assert!(!list.reachable(n11) && !list.reachable(v11));
    assert!(h.insert(b"k11", b"again").unwrap());
    let (n11b, v11b) = h.locate(b"k11").unwrap();
    assert!(list.reachable(n11b) && list.reachable(v11b));
    assert_eq!(list.reachable(n11), n11 == n11b);
    assert_eq!(list.reachable(v11), v11 == v11b);

    // Forged copies of a live node and of its value block are not reachable.
    let mut th = heap.thread().unwrap();
    let [klen, height] = r.read::<[u32; 2]>(n10.offset() + 4);
    let nsize = node_size(height as usize, klen as usize);
    let copy = th.alloc(nsize).unwrap();
    let mut bytes = vec![0u8; nsize as usize];
    r.read_bytes(n10.offset(), &mut bytes);
    r.write_bytes(copy.offset(), &bytes);
    assert!(!list.reachable(copy));
    let vcopy = th.alloc(16 + 9).unwrap();
    let mut vb = vec![0u8; 16 + 9];
    r.read_bytes(v10b.offset(), &mut vb);
    r.write_bytes(vcopy.offset(), &vb);
    assert!(!list.reachable(vcopy));
    // A value block naming a node that does not link it, or a non-node owner.
    r.write::<u64>(vcopy.offset() + 8, &head.offset());
    assert!(!list.reachable(vcopy));
    r.write::<u64>(vcopy.offset() + 8, &(u64::MAX - 7));
    assert!(!list.reachable(vcopy));
    // Garbage of every shape, then the same slots freed.
    let mut rng = SmallRng::seed_from_u64(5);
    let mut junk = Vec::new();
    for i in 0..200u64 {
        let size = 16 + (i * 37) % 700;
        let b = th.alloc(size).unwrap();
        let mut bytes: Vec<u8> = (0..size).map(|_| rng.random()).collect();
        match i % 4 {
            0 => bytes[..4].copy_from_slice(b"ESLN"),
            1 => bytes[..4].copy_from_slice(b"EVAL"),
            2 => {
                bytes[..4].copy_from_slice(b"ESLN");
                bytes[4..8].copy_from_slice(&3u32.to_le_bytes());
                bytes[8..12].copy_from_slice(&((i % 33) as u32).to_le_bytes());
            }
            _ => {}
        }
        r.write_bytes(b.offset(), &bytes);
        assert!(!list.reachable(b), "garbage block {i} reachable");
        junk.push(b);
    }
    for b in junk {
        th.free(b).unwrap();
        assert!(!list.reachable(b));
    }
    drop(th);
    list.verify(true).unwrap();
}

// ---- crash images ----

fn sim_opts() -> HeapOptions {
    HeapOptions {
        size: 2 << 20,
        max_size: 16 << 20,
        reserve: 16 << 20,
        geometry: Geometry::small(),
        strategy: Strategy::FenceOnly,
        ..Default::default()
    }
}

type Model = BTreeMap<Vec<u8>, Vec<u8>>;

/// Recovers one crash image and checks it: recovery succeeds, the list verifies as
/// quiescent, no block is leaked, every key holds a state that some allowed model
/// gives it (`allowed` = the models a crash during the op may leave), and the
/// recovered list accepts more operations.
fn check_image(
    bytes: &[u8],
    path: &Path,
    o: &SkipOptions,
    allowed: &[&Model],
    per_key: bool,
) -> Result<index::RecoverStats, String> {
    pmem::sim::write_image(path, bytes).map_err(|e| e.to_string())?;
    let rec = Heap::open(path, &sim_opts()).map_err(|e| format!("open: {e}"))?;
    let root = rec.heap().root();
    let list = SkipList::attach(rec.heap(), root, o).map_err(|e| format!("attach: {e}"))?;
    let (heap, st) = index::recover(rec, &[&list]).map_err(|e| format!("recover: {e}"))?;
    let v = list.verify(true)?;
    let rep = pmem::check_heap(&heap);
    if !rep.ok() {
        return Err(format!("check_heap: {:?}", rep.problems));
    }
    if rep.blocks != v.blocks {
        return Err(format!(
            "{} blocks allocated, {} reachable",
            rep.blocks, v.blocks
        ));
    }
    let mut h = list.handle().map_err(|e| e.to_string())?;
    let mut state = Model::new();
    h.range(b"", usize::MAX, |k, v| {
        state.insert(k.to_vec(), v.to_vec());
    })
    .map_err(|e| e.to_string())?;
    if per_key {
        let keys: std::collections::BTreeSet<&Vec<u8>> = allowed
            .iter()
            .flat_map(|m| m.keys())
            .chain(state.keys())
            .collect();
        for k in keys {
            let got = state.get(k);
            if !allowed.iter().any(|m| m.get(k) == got) {
                return Err(format!(
                    "key {:?}: recovered {:?}, not in any allowed state",
                    String::from_utf8_lossy(k),
                    got.map(|v| v.len())
                ));
            }
        }
    } else if !allowed.iter().any(|m| **m == state) {
        return Err(format!(
            "recovered state of {} keys is neither before nor after the op",
            state.len()
        ));
    }
    for i in 0..20u32 {
        let k = format!("post{i}");
        h.put(k.as_bytes(), b"x").map_err(|e| e.to_string())?;
        if i % 2 == 0 {
            h.remove(k.as_bytes()).map_err(|e| e.to_string())?;
        }
    }
    drop(h);
    list.verify(true)?;
    Ok(st)
}

fn crash_run(cache: bool, seed: u64) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.heap");
    let ipath = dir.path().join("img.heap");
    let o = opts(cache);
    {
        let heap = Heap::create(&path, &sim_opts()).unwrap();
        let list = SkipList::create(&heap, &o).unwrap();
        heap.set_root(list.root()).unwrap();
    }
    let sim = Arc::new(CrashSim::new(seed, 0));
    let (heap, _) = Heap::open_sim(&path, &sim_opts(), sim.clone())
        .unwrap()
        .finish_clean()
        .unwrap();
    let list = SkipList::attach(&heap, heap.root(), &o).unwrap();
    let mut h = list.handle().unwrap();
    let mut rng = SmallRng::seed_from_u64(seed);
    // models[j]: the state after j operations; synced[j]: the last model made
    // durable by a sync before operation j started.
    let mut models: Vec<Model> = vec![Model::new()];
    let mut synced: Vec<usize> = Vec::new();
    let mut last_sync = 0;
    let (mut images, mut bad) = (0u64, Vec::new());
    let (mut repaired, mut swept) = (0u64, 0u64);
    let ops = 700usize;
    sim.set_capture_ppm(150_000);
    for i in 0..ops {
        synced.push(last_sync);
        sim.set_tag(i as u64);
        let mut m = models[i].clone();
        let k = format!("key{:02}", rng.random_range(0..24u32)).into_bytes();
        match rng.random_range(0..10u32) {
            0..5 => {
                let n = if rng.random_range(0..20u32) == 0 {
                    1500
                } else {
                    rng.random_range(0..60usize)
                };
                let v: Vec<u8> = (0..n).map(|j| (i + j) as u8).collect();
                h.put(&k, &v).unwrap();
                m.insert(k, v);
            }
            5..8 => {
                h.remove(&k).unwrap();
                m.remove(&k);
            }
            _ => {
                let mut out = Vec::new();
                h.get(&k, &mut out).unwrap();
            }
        }
        models.push(m);
        if cache && rng.random_range(0..8u32) == 0 {
            h.sync().unwrap();
            last_sync = i + 1;
        }
        if i % 50 == 49 || i == ops - 1 {
            for img in sim.take_images() {
                images += 1;
                let t = img.tag as usize;
                let r = if cache {
                    let allowed: Vec<&Model> = models[synced[t]..=t + 1].iter().collect();
                    check_image(&img.bytes, &ipath, &o, &allowed, true)
                } else {
                    check_image(&img.bytes, &ipath, &o, &[&models[t], &models[t + 1]], false)
                };
                match r {
                    Ok(st) => {
                        repaired += st.repaired;
                        swept += st.heap.leaked_freed;
                    }
                    Err(e) => bad.push(format!("image at op {t} (fence {}): {e}", img.fence)),
                }
            }
        }
    }
    eprintln!(
        "skiplist crash-sim (cache {cache}): {images} images, {} inconsistent; \
         {repaired} nodes repaired, {swept} leaked blocks swept",
        bad.len()
    );
    assert!(swept > 0, "no crash image left a block to sweep");
    assert!(bad.is_empty(), "{}", bad.join("\n"));
    assert!(images >= 80, "only {images} crash images");
}

#[test]
fn crash_images_with_link_cache() {
    crash_run(true, 11);
}

#[test]
fn crash_images_without_link_cache() {
    crash_run(false, 12);
}
