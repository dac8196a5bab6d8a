//! The table against a `HashMap`, every edit applied through its encoding;
//! scans interleaved with writes return every field present throughout.

use super::super::tree::mem::MemPieces;
use super::*;
use proptest::prelude::*;
use std::collections::{BTreeSet, HashMap};

/// Checks the table's pieces against the model: every field in the bucket
/// its hash names, no empty bucket stored, no bucket past the table.
fn check(p: &MemPieces, meta: &Meta, model: &HashMap<Vec<u8>, Vec<u8>>) {
    let mut seen = HashMap::new();
    for (&id, bytes) in &p.0 {
        assert!(id & BUCKET_ID != 0);
        let b = id & !BUCKET_ID;
        assert!(b < meta.buckets(), "bucket {b} past {}", meta.buckets());
        let bucket = Bucket::decode(bytes).unwrap();
        assert!(!bucket.0.is_empty(), "empty bucket {b} stored");
        for (f, v) in bucket.0 {
            assert_eq!(meta.bucket_of(meta.hash(&f)), b);
            assert!(seen.insert(f, v).is_none());
        }
    }
    assert_eq!(&seen, model);
    assert_eq!(meta.count as usize, model.len());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn table_matches_a_map(ops in proptest::collection::vec((0u8..10, 0u16..1500, any::<u8>()), 1..4000)) {
        let mut p = MemPieces::default();
        let mut meta = Meta::new(0x1234_5678_9abc_def0);
        let mut model: HashMap<Vec<u8>, Vec<u8>> = HashMap::new();
        // A scan in progress: its cursor, what it returned, and the fields
        // present since it began.
        let mut cursor = None;
        let mut returned = BTreeSet::new();
        let mut throughout: BTreeSet<Vec<u8>> = BTreeSet::new();
        for (i, (kind, k, v)) in ops.into_iter().enumerate() {
            let field = format!("f{k}").into_bytes();
            let mut t = Table::new(&mut p, &mut meta);
            match kind {
                0..=4 => {
                    let created = t.set(&field, &[v]).unwrap();
                    prop_assert_eq!(created, model.insert(field, vec![v]).is_none());
                }
                5..=7 => {
                    let removed = t.del(&field).unwrap();
                    prop_assert_eq!(removed, model.remove(&field).is_some());
                    throughout.remove(&field);
                }
                8 => prop_assert_eq!(t.get(&field).unwrap(), model.get(&field).cloned()),
                _ => {
                    let c = match cursor {
                        None => {
                            returned.clear();
                            throughout = model.keys().cloned().collect();
                            0
                        }
                        Some(c) => c,
                    };
                    let next = t.scan(c, |f, _| { returned.insert(f.to_vec()); }).unwrap();
                    if next == 0 {
                        for f in &throughout {
                            prop_assert!(returned.contains(f), "scan missed {:?}", f);
                        }
                        cursor = None;
                    } else {
                        cursor = Some(next);
                    }
                }
            }
            if i % 97 == 0 {
                check(&p, &meta, &model);
            }
        }
        check(&p, &meta, &model);
        let mut t = Table::new(&mut p, &mut meta);
        let mut all = HashMap::new();
        t.for_each(|f, v| { all.insert(f.to_vec(), v.to_vec()); }).unwrap();
        prop_assert_eq!(&all, &model);
        if !model.is_empty() {
            let mut x = 7u64;
            let (f, v) = t.random(|n| { x = x.wrapping_mul(6364136223846793005).wrapping_add(1); (x >> 33) % n }).unwrap().unwrap();
            prop_assert_eq!(model.get(&f), Some(&v));
        }
        let ids = t.pieces().unwrap();
        prop_assert_eq!(ids.len(), p.0.len());
    }
}

#[test]
fn a_big_table_grows_and_shrinks_back_to_one_bucket() {
    let mut p = MemPieces::default();
    let mut meta = Meta::new(42);
    let mut t = Table::new(&mut p, &mut meta);
    for i in 0..100_000u32 {
        assert!(t.set(&i.to_le_bytes(), b"v").unwrap());
    }
    let buckets = t.meta.buckets();
    assert!(
        (100_000 / GROW_LOAD..=100_000 * 2 / GROW_LOAD).contains(&buckets),
        "{buckets}"
    );
    // No bucket far above the average (a bucket piece stays small).
    let biggest =
        p.0.values()
            .map(|b| Bucket::decode(b).unwrap().0.len())
            .max()
            .unwrap();
    assert!(biggest < 4 * GROW_LOAD as usize, "a bucket of {biggest}");
    let mut t = Table::new(&mut p, &mut meta);
    for i in 0..100_000u32 {
        assert!(t.del(&i.to_le_bytes()).unwrap());
    }
    assert_eq!(meta.buckets(), 1);
    assert_eq!(meta.count, 0);
    assert!(p.0.is_empty());
}

#[test]
fn corrupt_buckets_are_errors() {
    let mut p = MemPieces::default();
    let mut meta = Meta::new(1);
    let mut t = Table::new(&mut p, &mut meta);
    for i in 0..500u32 {
        t.set(&i.to_le_bytes(), b"value").unwrap();
    }
    for id in p.0.keys().copied().collect::<Vec<_>>() {
        for bad in [vec![], vec![3, 9, 0], vec![1, 0, 0], vec![3, 1, 0, 0xff]] {
            let mut q = p.clone();
            let mut m = meta;
            q.0.insert(id, bad);
            let mut t = Table::new(&mut q, &mut m);
            let _ = t.for_each(|_, _| {});
            let _ = t.scan(0, |_, _| {});
            for i in 0..500u32 {
                let _ = t.get(&i.to_le_bytes());
            }
            assert!(t.for_each(|_, _| {}).is_err());
            for i in 0..50u32 {
                let _ = t.set(&(i * 7).to_le_bytes(), b"w");
                let _ = t.del(&(i * 3).to_le_bytes());
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    /// A bulk-loaded table holds exactly its pairs in the right buckets, at
    /// most the growth load per bucket, and sets and deletes after work on it.
    #[test]
    fn a_bulk_loaded_table_is_a_valid_table(
        n in 0u32..5000,
        later in proptest::collection::vec((any::<bool>(), 0u32..6000), 0..200),
    ) {
        let mut p = MemPieces::default();
        let mut meta = Meta::new(7);
        let pairs: Vec<Pair> = (0..n).map(|i| (format!("f{i}").into_bytes(), vec![i as u8])).collect();
        let mut model: HashMap<Vec<u8>, Vec<u8>> = pairs.iter().cloned().collect();
        Table::new(&mut p, &mut meta).bulk_load(pairs).unwrap();
        prop_assert!(meta.count <= GROW_LOAD * meta.buckets());
        check(&p, &meta, &model);
        for (set, k) in later {
            let f = format!("f{k}").into_bytes();
            let mut t = Table::new(&mut p, &mut meta);
            if set {
                prop_assert_eq!(t.set(&f, b"v").unwrap(), model.insert(f, b"v".to_vec()).is_none());
            } else {
                prop_assert_eq!(t.del(&f).unwrap(), model.remove(&f).is_some());
            }
        }
        check(&p, &meta, &model);
    }
}
