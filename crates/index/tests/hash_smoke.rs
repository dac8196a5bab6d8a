use index::{HashOptions, Index, LfHash, Ops};
use pmem::{Heap, HeapOptions};
use rand::{RngExt, SeedableRng};
use std::collections::BTreeMap;

fn run(cache: bool) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("h");
    let hopts = HeapOptions {
        size: 64 << 20,
        ..Default::default()
    };
    let heap = Heap::create(&path, &hopts).unwrap();
    let opts = HashOptions {
        initial_buckets: 4,
        link_cache: cache,
        ..Default::default()
    };
    let t = LfHash::create(&heap, &opts).unwrap();
    heap.set_root(t.root()).unwrap();
    let mut h = t.handle().unwrap();
    let mut model = BTreeMap::new();
    let mut rng = rand::rngs::SmallRng::seed_from_u64(7);
    let mut out = Vec::new();
    for i in 0..20000u64 {
        let k = format!("k{}", rng.random_range(0..500u32)).into_bytes();
        match rng.random_range(0..4u32) {
            0 | 1 => {
                let v = format!("v{i}").into_bytes();
                assert_eq!(h.put(&k, &v).unwrap(), model.insert(k.clone(), v).is_none());
            }
            2 => assert_eq!(h.remove(&k).unwrap(), model.remove(&k).is_some()),
            _ => {
                let got = h.get(&k, &mut out).unwrap();
                assert_eq!(got.then(|| out.clone()), model.get(&k).cloned());
            }
        }
    }
    drop(h);
    let v = t.verify(true).unwrap();
    assert_eq!(v.keys, model.len() as u64);
    assert!(t.buckets() > 4);
    t.close().unwrap();
    drop(t);
    drop(heap);
    let rec = Heap::open(&path, &hopts).unwrap();
    let t = LfHash::attach(rec.heap(), rec.heap().root(), &opts).unwrap();
    let (heap, st) = index::recover(rec, &[&t]).unwrap();
    eprintln!("recover: {st:?}");
    let mut h = t.handle().unwrap();
    for (k, v) in &model {
        assert!(h.get(k, &mut out).unwrap());
        assert_eq!(&out, v);
    }
    let v = t.verify(true).unwrap();
    assert_eq!(v.keys, model.len() as u64);
    let rep = pmem::check_heap(&heap);
    assert!(rep.ok(), "{rep:?}");
    assert_eq!(
        rep.blocks, v.blocks,
        "allocated blocks = reachable blocks (no leak)"
    );
}

#[test]
fn smoke_cache() {
    run(true)
}
#[test]
fn smoke_nocache() {
    run(false)
}
