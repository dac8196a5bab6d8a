//! Gleaners walk the chains of a group of records in step (up to 16 records of
//! distinct keys; a key seen again ends the group). Logs where keys repeat
//! inside a group, and where more keys than a group interleave, must end with
//! every record applied exactly once and flagged, with and without put
//! collapsing, on both backends: with increments, and with merges (a list
//! leaf's front inserts, after a put of the empty leaf) as the records that
//! are not idempotent.

mod common;

use common::*;
use engine::bullet::{check_logs, BulletStore, Variant};
use engine::direct::BackendKind;
use engine::types::edit::Edit;
use engine::types::node::{Entry, Node};
use engine::{Op, Session, Store};
use pmem::{Heap, Strategy};
use std::collections::BTreeMap;

/// Operation `i`: its key and its operation. The first 1,500 cycle through 37
/// keys (more than a group, none repeated within one); the next 1,500 through 5
/// (repeated within every group); the last 40 each have a key of their own (no
/// later record's chain leads to them). Mostly increments, with puts and
/// removes.
fn op(i: u64) -> (Vec<u8>, Op<'static>) {
    let k = match i {
        0..1500 => i % 37,
        1500..3000 => i % 5,
        _ => 100 + i - 3000,
    };
    let key = format!("k{k:03}").into_bytes();
    let op = if i.is_multiple_of(29) {
        Op::Remove
    } else if i.is_multiple_of(11) {
        Op::Put(b"100")
    } else {
        Op::Incr((i % 3 + 1) as i64)
    };
    (key, op)
}

/// `op(i)` with its increments made merges: a put of the empty leaf when
/// the key is absent or `op` puts, else the insert of element `i` at the
/// leaf's front (payload written to `buf`).
fn merge_op<'b>(i: u64, live: bool, buf: &'b mut Vec<u8>) -> (Vec<u8>, Op<'b>) {
    let (key, op) = op(i);
    let op = match op {
        Op::Remove => Op::Remove,
        Op::Incr(_) if live => {
            buf.clear();
            Edit::LeafInsert {
                pos: 0,
                entry: Entry::new(0.0, i.to_string().into_bytes()),
            }
            .encode(false, buf);
            Op::Merge(buf)
        }
        _ => {
            *buf = Node::Leaf(Vec::new()).encode(false);
            Op::Put(buf)
        }
    };
    (key, op)
}

#[test]
fn grouped_walks_apply_every_record_once() {
    grouped_walks(false);
}

#[test]
fn grouped_walks_apply_every_merge_once() {
    grouped_walks(true);
}

fn grouped_walks(merges: bool) {
    for v in [Variant::Full, Variant::Dyn] {
        for b in [BackendKind::LogFree, BackendKind::PHash] {
            let dir = tempfile::tempdir_in(shm_dir()).unwrap();
            let path = dir.path().join("h");
            let hopts = heap_opts(64 << 20, 256 << 20, Strategy::FenceOnly);
            let mut o = bullet_opts(v, b, 256 << 10);
            // Only the drain gleans (no advancer epoch ends during the writes).
            o.static_gleaners = 0;
            o.epoch = std::time::Duration::from_secs(60);
            let mut model: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
            let mut buf = Vec::new();
            {
                let heap = Heap::create(&path, &hopts).unwrap();
                let st = BulletStore::create(&heap, &o).unwrap();
                let mut s = st.session().unwrap();
                for i in 0..3040u64 {
                    let (key, op) = if merges {
                        let live = model.contains_key(&op(i).0);
                        merge_op(i, live, &mut buf)
                    } else {
                        op(i)
                    };
                    let old = model.get(&key).map(|v| v.as_slice());
                    let new = match op {
                        Op::Remove => None,
                        Op::Put(v) => Some(v.to_vec()),
                        Op::Incr(d) => {
                            Some(engine::incr_value(old, d).unwrap().to_string().into_bytes())
                        }
                        Op::Merge(p) => Some(engine::merge_value(old, p).unwrap()),
                    };
                    match new {
                        Some(n) => model.insert(key.clone(), n),
                        None => model.remove(&key),
                    };
                    s.apply(&key, op).unwrap();
                }
                drop(s);
                assert!(st.log_occupancy_bytes().0 > 0);
                assert!(drain_within(&st, 30), "{v:?} {b:?}: drain did not finish");
                assert_eq!(st.log_occupancy_bytes().0, 0, "{v:?} {b:?}");
                st.verify().unwrap();
                st.close().unwrap();
            }
            // Every record left in the logs is flagged, and the backend alone
            // (logs empty) holds the model's values after a restart.
            let rec = Heap::open(&path, &hopts).unwrap();
            let facts = check_logs(rec.heap(), rec.heap().root()).unwrap();
            assert_eq!(facts.unapplied, 0, "{v:?} {b:?}: {facts:?}");
            let (st, r) = BulletStore::open(rec, &o).unwrap();
            assert_eq!(r.replayed, 0, "{v:?} {b:?}: {r:?}");
            let mut s = st.session().unwrap();
            let mut out = Vec::new();
            for k in (0..37u64).chain(100..140) {
                let key = format!("k{k:03}").into_bytes();
                let found = s.get(&key, &mut out).unwrap();
                match model.get(&key) {
                    Some(n) => {
                        assert!(found, "{v:?} {b:?}: key k{k:03} lost");
                        assert_eq!(&out, n, "{v:?} {b:?}: key k{k:03}");
                    }
                    None => assert!(!found, "{v:?} {b:?}: key k{k:03} invented"),
                }
            }
            drop(s);
            st.close().unwrap();
        }
    }
}
