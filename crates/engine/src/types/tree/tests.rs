//! The tree against models (a vector for lists, a sorted vector for sorted
//! sets), with small limits so that splits, emptied nodes and root changes
//! happen every few operations; every edit goes through its encoding and is
//! applied as a merge, as a store would apply it.

use super::mem::MemPieces;
use super::*;
use proptest::prelude::*;
use std::collections::{BTreeMap, BTreeSet};

const SMALL: Limits = Limits {
    leaf_entries: 4,
    leaf_bytes: 40,
    fanout: 4,
};

/// Walks the whole tree checking its invariants; returns the elements in order.
fn check(p: &MemPieces, meta: &Meta, ordered: bool) -> Vec<Entry> {
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    fn walk(
        p: &MemPieces,
        id: u64,
        depth: u32,
        height: u32,
        ordered: bool,
        seen: &mut BTreeSet<u64>,
        out: &mut Vec<Entry>,
    ) -> u64 {
        assert!(seen.insert(id), "piece {id} reached twice");
        let node = Node::decode(&p.0[&id], ordered).unwrap();
        assert!(!node.is_empty(), "empty piece {id}");
        match node {
            Node::Leaf(v) => {
                assert_eq!(depth, height, "leaf {id} at the wrong depth");
                out.extend(v.iter().cloned());
                v.len() as u64
            }
            Node::Inner(children) => {
                assert!(depth < height);
                let mut total = 0;
                for (i, c) in children.iter().enumerate() {
                    let start = out.len();
                    let n = walk(p, c.id, depth + 1, height, ordered, seen, out);
                    assert_eq!(n, c.count, "count of child {i} of {id}");
                    if ordered && i > 0 {
                        let low = &c.low;
                        assert!(out[start..]
                            .iter()
                            .all(|e| e.cmp_key(low.score, &low.bytes) != Ordering::Less));
                        assert!(out[..start]
                            .iter()
                            .all(|e| e.cmp_key(low.score, &low.bytes) == Ordering::Less));
                    }
                    total += n;
                }
                total
            }
        }
    }
    if meta.root == 0 {
        assert_eq!(meta.height, 0);
        assert_eq!(meta.count, 0);
    } else {
        let n = walk(p, meta.root, 1, meta.height, ordered, &mut seen, &mut out);
        assert_eq!(n, meta.count);
    }
    let stored: BTreeSet<u64> = p.0.keys().copied().collect();
    assert_eq!(
        stored, seen,
        "pieces stored but not reachable (or the reverse)"
    );
    if ordered {
        assert!(out
            .windows(2)
            .all(|w| w[0].cmp_key(w[1].score, &w[1].bytes) == Ordering::Less));
    }
    out
}

#[derive(Clone, Debug)]
enum ListOp {
    Insert(u16, u8, u8),
    Remove(u16),
    Set(u16, u8),
    Range(u16, u16, bool),
}

fn list_op() -> impl Strategy<Value = ListOp> {
    prop_oneof![
        4 => (any::<u16>(), any::<u8>(), 0u8..20).prop_map(|(p, b, l)| ListOp::Insert(p, b, l)),
        2 => any::<u16>().prop_map(ListOp::Remove),
        1 => (any::<u16>(), any::<u8>()).prop_map(|(p, b)| ListOp::Set(p, b)),
        1 => (any::<u16>(), any::<u16>(), any::<bool>()).prop_map(|(a, b, r)| ListOp::Range(a, b, r)),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn list_tree_matches_a_vector(ops in proptest::collection::vec(list_op(), 1..300)) {
        let mut p = MemPieces::default();
        let mut meta = Meta::new();
        let mut model: Vec<Vec<u8>> = Vec::new();
        for op in ops {
            let mut t = Tree::new(&mut p, &mut meta, false);
            t.lim = SMALL;
            let n = model.len() as u64;
            match op {
                ListOp::Insert(pos, b, len) => {
                    let pos = pos as u64 % (n + 1);
                    let v = vec![b; len as usize];
                    t.insert_at(pos, v.clone()).unwrap();
                    model.insert(pos as usize, v);
                }
                ListOp::Remove(pos) if n > 0 => {
                    let pos = pos as u64 % n;
                    let got = t.remove_at(pos).unwrap();
                    prop_assert_eq!(got, model.remove(pos as usize));
                }
                ListOp::Set(pos, b) if n > 0 => {
                    let pos = pos as u64 % n;
                    t.set_at(pos, vec![b]).unwrap();
                    model[pos as usize] = vec![b];
                    prop_assert_eq!(t.get_at(pos).unwrap().bytes, vec![b]);
                }
                ListOp::Range(a, b, rev) if n > 0 => {
                    let (a, b) = ((a as u64 % n), (b as u64 % n));
                    let (a, b) = (a.min(b), a.max(b));
                    let mut got = Vec::new();
                    t.for_range(a, b, rev, |e| { got.push(e.bytes.clone()); true }).unwrap();
                    let mut want: Vec<Vec<u8>> = model[a as usize..=b as usize].to_vec();
                    if rev { want.reverse(); }
                    prop_assert_eq!(got, want);
                }
                _ => {}
            }
            let all: Vec<Vec<u8>> = check(&p, &meta, false).into_iter().map(|e| e.bytes).collect();
            prop_assert_eq!(&all, &model);
        }
    }

    #[test]
    fn ordered_tree_matches_a_sorted_vector(
        ops in proptest::collection::vec((0u8..4, 0u8..12, 0u8..30), 1..300)
    ) {
        const SCORES: [f64; 12] = [f64::NEG_INFINITY, -3.5, -1.0, -0.0, 0.0, 0.5, 1.0, 2.0, 2.0, 7.25, 1e300, f64::INFINITY];
        let mut p = MemPieces::default();
        let mut meta = Meta::new();
        // The model: member -> score, and the order derived from it.
        let mut model: BTreeMap<Vec<u8>, f64> = BTreeMap::new();
        let sorted = |m: &BTreeMap<Vec<u8>, f64>| {
            let mut v: Vec<Entry> = m.iter().map(|(k, s)| Entry::new(*s, k.clone())).collect();
            v.sort_by(|a, b| a.cmp_key(b.score, &b.bytes));
            v
        };
        for (kind, s, m) in ops {
            let mut t = Tree::new(&mut p, &mut meta, true);
            t.lim = SMALL;
            let member = vec![b'a' + m % 26; 1 + (m as usize % 7)];
            let score = SCORES[s as usize];
            match kind {
                0 | 1 => {
                    // ZADD: replace the member's old position.
                    if let Some(old) = model.get(&member) {
                        prop_assert!(t.remove_key(*old, &member).unwrap());
                    }
                    let rank = t.insert_key(score, &member).unwrap();
                    model.insert(member.clone(), score);
                    let want = sorted(&model).iter().position(|e| e.bytes == member).unwrap() as u64;
                    prop_assert_eq!(rank, want);
                    prop_assert_eq!(t.rank_of(score, &member).unwrap(), Some(want));
                }
                2 => {
                    let present = model.get(&member).copied();
                    let removed = match present {
                        Some(sc) => t.remove_key(sc, &member).unwrap(),
                        None => t.remove_key(score, &member).unwrap(),
                    };
                    prop_assert_eq!(removed, present.is_some());
                    model.remove(&member);
                }
                _ => {
                    let want = sorted(&model);
                    let below = want.iter().filter(|e| e.score < score).count() as u64;
                    prop_assert_eq!(t.count_before(|e| e.score < score).unwrap(), below);
                    let upto = want.iter().filter(|e| e.score <= score).count() as u64;
                    prop_assert_eq!(t.count_before(|e| e.score <= score).unwrap(), upto);
                    if !want.is_empty() {
                        let r = m as u64 % want.len() as u64;
                        prop_assert_eq!(&t.get_at(r).unwrap(), &want[r as usize]);
                        if s % 3 == 0 {
                            let e = t.remove_rank(r).unwrap();
                            model.remove(&e.bytes);
                        }
                    }
                }
            }
            prop_assert_eq!(check(&p, &meta, true), sorted(&model));
        }
    }
}

#[test]
fn a_big_list_stays_shallow_and_frees_every_piece() {
    let mut p = MemPieces::default();
    let mut meta = Meta::new();
    let mut t = Tree::new(&mut p, &mut meta, false);
    for i in 0..20_000u32 {
        t.insert_at(t.meta.count, i.to_le_bytes().to_vec()).unwrap();
    }
    // 20,000 elements of 5 bytes: leaves of up to 128, 64 children: 3 levels.
    assert!(t.meta.height <= 3, "height {}", t.meta.height);
    assert_eq!(t.get_at(12_345).unwrap().bytes, 12_345u32.to_le_bytes());
    let ids = t.pieces().unwrap();
    assert_eq!(ids.len(), t.p.0.len());
    for i in 0..20_000u32 {
        assert_eq!(t.remove_at(0).unwrap(), i.to_le_bytes());
    }
    assert_eq!(
        *t.meta,
        Meta {
            next_id: t.meta.next_id,
            ..Meta::new()
        }
    );
    assert!(p.0.is_empty());
}

#[test]
fn a_corrupt_piece_is_an_error_not_a_panic() {
    for ordered in [false, true] {
        let mut good = MemPieces::default();
        let mut good_meta = Meta::new();
        let mut t = Tree::new(&mut good, &mut good_meta, ordered);
        for i in 0..1000u32 {
            if ordered {
                t.insert_key(i as f64, &i.to_be_bytes()).unwrap();
            } else {
                t.insert_at(0, i.to_le_bytes().to_vec()).unwrap();
            }
        }
        let ids = t.pieces().unwrap();
        for (n, id) in ids.iter().enumerate() {
            for garbage in [None, Some(vec![2, 1, 0]), Some(vec![1, 0xff, 0xff])] {
                let mut p = MemPieces(good.0.clone());
                let mut meta = good_meta;
                let b = p.0.get_mut(id).unwrap();
                match garbage {
                    None => {
                        let i = (n * 7) % b.len();
                        b[i] ^= 0x5a;
                    }
                    Some(ref g) => *b = g.clone(),
                }
                let mut t = Tree::new(&mut p, &mut meta, ordered);
                let whole = t.for_range(0, 999, false, |_| true);
                let _ = t.for_range(0, 999, true, |_| true);
                if garbage.is_some() {
                    assert!(whole.is_err());
                }
                for pos in [0, 500, 999] {
                    let _ = t.get_at(pos);
                }
                if ordered {
                    let _ = t.insert_key(500.5, b"x");
                    let _ = t.remove_key(3.0, &3u32.to_be_bytes());
                    let _ = t.count_before(|e| e.score < 700.0);
                    let _ = t.rank_of(999.0, &999u32.to_be_bytes());
                } else {
                    let _ = t.insert_at(t.meta.count.min(600), vec![1]);
                    let _ = t.remove_at(0);
                    let _ = t.set_at(10, vec![2]);
                }
                let _ = t.pieces();
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// A bulk-loaded tree (of any size, small or default limits) is a valid
    /// tree holding exactly its entries, and later inserts and removes work
    /// on it as on one built element by element.
    #[test]
    fn a_bulk_loaded_tree_is_a_valid_tree(
        n in 0usize..3000,
        small in any::<bool>(),
        ordered in any::<bool>(),
        later in proptest::collection::vec((any::<bool>(), 0u32..4000), 0..60),
    ) {
        let mut p = MemPieces::default();
        let mut meta = Meta::new();
        let entries: Vec<Entry> = (0..n as u32)
            .map(|i| Entry::new(if ordered { i as f64 } else { 0.0 }, format!("m{i:05}").into_bytes()))
            .collect();
        let mut t = Tree::new(&mut p, &mut meta, ordered);
        if small {
            t.lim = SMALL;
        }
        t.bulk_load(entries.clone()).unwrap();
        prop_assert_eq!(t.meta.count, n as u64);
        prop_assert_eq!(check(&p, &meta, ordered), entries.clone());
        let mut model = entries;
        for (insert, x) in later {
            let mut t = Tree::new(&mut p, &mut meta, ordered);
            if small {
                t.lim = SMALL;
            }
            if insert || model.is_empty() {
                let e = Entry::new(if ordered { x as f64 + 0.5 } else { 0.0 }, format!("x{x}").into_bytes());
                if ordered {
                    if model.iter().any(|m| m.bytes == e.bytes) {
                        continue;
                    }
                    t.insert_key(e.score, &e.bytes).unwrap();
                    let at = model.partition_point(|m| m.cmp_key(e.score, &e.bytes).is_lt());
                    model.insert(at, e);
                } else {
                    let at = x as usize % (model.len() + 1);
                    t.insert_at(at as u64, e.bytes.clone()).unwrap();
                    model.insert(at, e);
                }
            } else {
                let at = x as usize % model.len();
                if ordered {
                    t.remove_rank(at as u64).unwrap();
                } else {
                    t.remove_at(at as u64).unwrap();
                }
                model.remove(at);
            }
            prop_assert_eq!(check(&p, &meta, ordered), model.clone());
        }
    }
}

#[test]
fn bulk_load_refuses_a_non_empty_tree() {
    let mut p = MemPieces::default();
    let mut meta = Meta::new();
    let mut t = Tree::new(&mut p, &mut meta, false);
    t.insert_at(0, b"a".to_vec()).unwrap();
    assert!(t.bulk_load(vec![Entry::new(0.0, b"b".to_vec())]).is_err());
}
