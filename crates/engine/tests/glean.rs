//! Gleaners walk the chains of a group of records in step (up to 16 records of
//! distinct keys; a key seen again ends the group). Logs where keys repeat
//! inside a group, and where more keys than a group interleave, must end with
//! every record applied exactly once and flagged, with and without put
//! collapsing, on both backends.

mod common;

use common::*;
use engine::bullet::{check_logs, BulletStore, Variant};
use engine::direct::BackendKind;
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

#[test]
fn grouped_walks_apply_every_record_once() {
    for v in [Variant::Full, Variant::Dyn] {
        for b in [BackendKind::LogFree, BackendKind::PHash] {
            let dir = tempfile::tempdir_in(shm_dir()).unwrap();
            let path = dir.path().join("h");
            let hopts = heap_opts(64 << 20, 256 << 20, Strategy::FenceOnly);
            let mut o = bullet_opts(v, b, 256 << 10);
            // Only the drain gleans (no advancer epoch ends during the writes).
            o.static_gleaners = 0;
            o.epoch = std::time::Duration::from_secs(60);
            let mut model: BTreeMap<Vec<u8>, i64> = BTreeMap::new();
            {
                let heap = Heap::create(&path, &hopts).unwrap();
                let st = BulletStore::create(&heap, &o).unwrap();
                let mut s = st.session().unwrap();
                for i in 0..3040u64 {
                    let (key, op) = op(i);
                    match op {
                        Op::Remove => {
                            model.remove(&key);
                        }
                        Op::Put(_) => {
                            model.insert(key.clone(), 100);
                        }
                        Op::Incr(d) => *model.entry(key.clone()).or_insert(0) += d,
                    }
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
                        assert_eq!(out, n.to_string().as_bytes(), "{v:?} {b:?}: key k{k:03}");
                    }
                    None => assert!(!found, "{v:?} {b:?}: key k{k:03} invented"),
                }
            }
            drop(s);
            st.close().unwrap();
        }
    }
}
