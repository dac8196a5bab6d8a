//! Model-based test of every store against a `BTreeMap`.
//!
//! Random sequences of put / remove / incr / get on 12 keys, with clean restarts
//! (session dropped, store closed, heap dropped and reopened) and simulated crashes
//! (a `CrashSim::capture_now` image of the heap: the persisted image plus a random
//! subset of the cache lines not yet durable, opened and recovered as the heap from
//! then on). Every result is compared with the model's; after every restart or
//! crash every key must read back as the model says: every acknowledged operation
//! present, nothing invented. Bullet stores use four logs of 4 KiB, so records wrap
//! around, writers switch logs and wait for full logs (gleaning themselves), and
//! the epoch advancer (1 ms epochs) reclaims log space concurrently with the test.
//! `Drain` applies every record to the backend and then checks the frontend against
//! the backend. `Batch` applies several of the writes as one `WriteBatch`: in
//! the persistent stores all or nothing (an `Incr` on a non-integer fails the
//! whole batch, and a crash right after it finds it whole), in the volatile
//! store one by one (a failure leaves the prefix before it).
//!
//! `PutLeaf` and `Merge` are a collection's piece and its edits: a put of a
//! list leaf, and a merge operation carrying an edit of it (insert, remove or
//! replace an element at a position), which is not idempotent. The model
//! applies the edit with `engine::merge_value`; an edit that does not fit the
//! value (a position past the leaf's end, a value that is no leaf, an absent
//! key) fails in the store as in the model, and fails a whole batch.
//!
//! `EMBER_ENGINE_MODEL_CASES=n` sets the cases per kind (default 16).

mod common;

use common::*;
use engine::{Error, Op, Outcome, Session};
use pmem::{CrashSim, Heap};
use proptest::prelude::*;
use proptest::test_runner::Config;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

const NKEYS: usize = 12;
const LOG: u64 = 4096;

#[derive(Clone, Debug)]
enum TOp {
    Put(usize, u32),
    PutNum(usize, i64),
    Remove(usize),
    Incr(usize, i64),
    /// A list leaf of 1 to 4 elements.
    PutLeaf(usize, u8, u32),
    /// An edit of a leaf: kind (insert, remove, set), position, element.
    Merge(usize, u8, u32, u32),
    Get(usize),
    /// A `WriteBatch` of the operations above (keys may repeat).
    Batch(Vec<TOp>),
    Drain,
    Restart,
    Crash(u64),
}

fn op_strategy(persistent: bool) -> BoxedStrategy<TOp> {
    let k = || 0..NKEYS;
    let restart = if persistent { 3 } else { 0 };
    let crash = if persistent { 5 } else { 0 };
    let write = prop_oneof![
        3 => (k(), any::<u32>()).prop_map(|(k, v)| TOp::Put(k, v)),
        2 => (k(), -1000i64..1000).prop_map(|(k, v)| TOp::PutNum(k, v)),
        2 => k().prop_map(TOp::Remove),
        3 => (k(), -50i64..50).prop_map(|(k, d)| TOp::Incr(k, d)),
        3 => (k(), 1u8..5, any::<u32>()).prop_map(|(k, n, v)| TOp::PutLeaf(k, n, v)),
        4 => (k(), 0u8..3, 0u32..5, any::<u32>()).prop_map(|(k, e, p, v)| TOp::Merge(k, e, p, v)),
    ];
    prop_oneof![
        10 => proptest::collection::vec(write, 2..6).prop_map(TOp::Batch),
        25 => (k(), any::<u32>()).prop_map(|(k, v)| TOp::Put(k, v)),
        10 => (k(), -1000i64..1000).prop_map(|(k, v)| TOp::PutNum(k, v)),
        15 => k().prop_map(TOp::Remove),
        25 => (k(), -50i64..50).prop_map(|(k, d)| TOp::Incr(k, d)),
        45 => prop_oneof![
            15 => (k(), 1u8..5, any::<u32>()).prop_map(|(k, n, v)| TOp::PutLeaf(k, n, v)),
            30 => (k(), 0u8..3, 0u32..5, any::<u32>())
                .prop_map(|(k, e, p, v)| TOp::Merge(k, e, p, v)),
        ],
        15 => k().prop_map(TOp::Get),
        2 => Just(TOp::Drain),
        restart => Just(TOp::Restart),
        crash => any::<u64>().prop_map(TOp::Crash),
    ]
    .boxed()
}

fn key(k: usize) -> Vec<u8> {
    format!("key:{k}").into_bytes()
}

/// A value that is not an integer (so `Incr` on it must fail), of varying length.
fn text(v: u32) -> Vec<u8> {
    let mut s = format!("v{v:x}-").into_bytes();
    s.resize(4 + (v as usize % 90), b'x');
    s
}

struct Live {
    // Drop order: session, store, heap.
    sess: Option<Box<dyn Session>>,
    store: Option<AnyStore>,
    heap: Option<Heap>,
    sim: Arc<CrashSim>,
    path: PathBuf,
}

impl Live {
    fn sess(&mut self) -> &mut dyn Session {
        &mut **self.sess.as_mut().unwrap()
    }

    fn check_all(&mut self, model: &BTreeMap<usize, Vec<u8>>, what: &str) -> Result<(), String> {
        let mut out = Vec::new();
        for k in 0..NKEYS {
            let found = self
                .sess()
                .get(&key(k), &mut out)
                .map_err(|e| format!("{what}: get: {e}"))?;
            let got = found.then(|| out.clone());
            if got.as_ref() != model.get(&k) {
                return Err(format!(
                    "{what}: key {k} reads {:?}, the model has {:?}",
                    got.map(|v| String::from_utf8_lossy(&v).into_owned()),
                    model
                        .get(&k)
                        .map(|v| String::from_utf8_lossy(v).into_owned())
                ));
            }
        }
        Ok(())
    }

    fn shut(&mut self) {
        self.sess = None;
        if let Some(s) = self.store.take() {
            let _ = s.close();
        }
        self.heap = None;
    }
}

fn run_model(kind: Kind, ops: &[TOp]) -> Result<(), String> {
    let dir = tempfile::tempdir_in(shm_dir()).unwrap();
    let path0 = dir.path().join("m0.heap");
    let persistent = kind != Kind::Volatile;
    let mut live = if persistent {
        {
            let heap = Heap::create(&path0, &sim_opts()).unwrap();
            let s = create(kind, &heap, LOG).map_err(|e| format!("create: {e}"))?;
            s.close().map_err(|e| format!("close: {e}"))?;
        }
        let sim = Arc::new(CrashSim::new(1, 0));
        let (store, heap, _) =
            open_sim(kind, &path0, sim.clone(), LOG).map_err(|e| format!("open: {e}"))?;
        Live {
            sess: Some(store.session()),
            store: Some(store),
            heap: Some(heap),
            sim,
            path: path0.clone(),
        }
    } else {
        let heap = Heap::create(&path0, &sim_opts()).unwrap();
        let store = create(kind, &heap, LOG).unwrap();
        Live {
            sess: Some(store.session()),
            store: Some(store),
            heap: Some(heap),
            sim: Arc::new(CrashSim::new(1, 0)),
            path: path0.clone(),
        }
    };
    let mut model: BTreeMap<usize, Vec<u8>> = BTreeMap::new();
    let mut out = Vec::new();
    let mut gen = 0u32;
    for (i, op) in ops.iter().enumerate() {
        let what = format!("{} op {i} {op:?}", kind.name());
        match op {
            TOp::Put(..) | TOp::PutNum(..) | TOp::PutLeaf(..) => {
                let (k, val) = match op {
                    TOp::PutNum(k, n) => (k, n.to_string().into_bytes()),
                    TOp::Put(k, v) => (k, text(*v)),
                    TOp::PutLeaf(k, n, v) => (k, leaf_piece(*n, *v)),
                    _ => unreachable!(),
                };
                let r = live
                    .sess()
                    .apply(&key(*k), Op::Put(&val))
                    .map_err(|e| format!("{what}: {e}"))?;
                let old = model.insert(*k, val);
                let want = Outcome::Put {
                    created: old.is_none(),
                    old_first: old.and_then(|v| v.first().copied()),
                };
                if r != want {
                    return Err(format!("{what}: {r:?}, the model says {want:?}"));
                }
            }
            TOp::Remove(k) => {
                let r = live
                    .sess()
                    .apply(&key(*k), Op::Remove)
                    .map_err(|e| format!("{what}: {e}"))?;
                let want = Outcome::Removed(model.remove(k).is_some());
                if r != want {
                    return Err(format!("{what}: {r:?}, the model says {want:?}"));
                }
            }
            TOp::Incr(k, d) => {
                let r = live.sess().apply(&key(*k), Op::Incr(*d));
                let want = engine::incr_value(model.get(k).map(|v| v.as_slice()), *d);
                match (r, want) {
                    (Ok(Outcome::Int(n)), Ok(m)) if n == m => {
                        model.insert(*k, n.to_string().into_bytes());
                    }
                    (Err(Error::NotInteger), Err(Error::NotInteger)) => {}
                    (r, w) => return Err(format!("{what}: {r:?}, the model says {w:?}")),
                }
            }
            TOp::Merge(k, e, p, v) => {
                let payload = leaf_edit(*e, *p, *v);
                let r = live.sess().apply(&key(*k), Op::Merge(&payload));
                let want = engine::merge_value(model.get(k).map(|v| v.as_slice()), &payload);
                match (r, want) {
                    (Ok(Outcome::Merged(n)), Ok(new)) if n == new.len() => {
                        model.insert(*k, new);
                    }
                    (Err(_), Err(_)) => {}
                    (r, w) => return Err(format!("{what}: {r:?}, the model says {w:?}")),
                }
            }
            TOp::Batch(ops) => {
                let mut w = engine::WriteBatch::new();
                let mut after = model.clone();
                let mut want = Vec::new();
                let mut fails = false;
                for o in ops {
                    match o {
                        TOp::Put(k, v) => w.put(&key(*k), &text(*v)),
                        TOp::PutNum(k, n) => w.put(&key(*k), n.to_string().as_bytes()),
                        TOp::Remove(k) => w.remove(&key(*k)),
                        TOp::Incr(k, d) => w.incr(&key(*k), *d),
                        TOp::PutLeaf(k, n, v) => w.put(&key(*k), &leaf_piece(*n, *v)),
                        TOp::Merge(k, e, p, v) => w.merge(&key(*k), &leaf_edit(*e, *p, *v)),
                        _ => unreachable!("batches hold writes"),
                    }
                    if fails {
                        continue;
                    }
                    let o = match o {
                        TOp::Put(k, _) | TOp::PutNum(k, _) | TOp::PutLeaf(k, ..) => {
                            let val = match o {
                                TOp::PutNum(_, n) => n.to_string().into_bytes(),
                                TOp::Put(_, v) => text(*v),
                                TOp::PutLeaf(_, n, v) => leaf_piece(*n, *v),
                                _ => unreachable!(),
                            };
                            let old = after.insert(*k, val);
                            Outcome::Put {
                                created: old.is_none(),
                                old_first: old.and_then(|v| v.first().copied()),
                            }
                        }
                        TOp::Remove(k) => Outcome::Removed(after.remove(k).is_some()),
                        TOp::Incr(k, d) => {
                            match engine::incr_value(after.get(k).map(|v| v.as_slice()), *d) {
                                Ok(n) => {
                                    after.insert(*k, n.to_string().into_bytes());
                                    Outcome::Int(n)
                                }
                                Err(_) => {
                                    fails = true;
                                    continue;
                                }
                            }
                        }
                        TOp::Merge(k, e, p, v) => {
                            let payload = leaf_edit(*e, *p, *v);
                            match engine::merge_value(after.get(k).map(|v| v.as_slice()), &payload)
                            {
                                Ok(new) => {
                                    let n = new.len();
                                    after.insert(*k, new);
                                    Outcome::Merged(n)
                                }
                                Err(_) => {
                                    fails = true;
                                    continue;
                                }
                            }
                        }
                        _ => unreachable!(),
                    };
                    if !fails {
                        // Applied so far (what the volatile store leaves).
                        want.push(o);
                        if !persistent {
                            model = after.clone();
                        }
                    }
                }
                let mut got = Vec::new();
                let r = live.sess().apply_batch(&w, &mut got);
                match (r, fails) {
                    (Ok(()), false) if got == want => model = after,
                    (Err(_), true) if !persistent || got.is_empty() => {
                        if !persistent && got != want {
                            return Err(format!("{what}: applied {got:?}, the model {want:?}"));
                        }
                    }
                    (r, f) => {
                        return Err(format!(
                            "{what}: {r:?} with {got:?}, the model {want:?} (fails: {f})"
                        ))
                    }
                }
            }
            TOp::Get(k) => {
                let found = live
                    .sess()
                    .get(&key(*k), &mut out)
                    .map_err(|e| format!("{what}: {e}"))?;
                let got = found.then(|| out.clone());
                if got.as_ref() != model.get(k) {
                    return Err(format!("{what}: {got:?}, the model has {:?}", model.get(k)));
                }
            }
            TOp::Drain => {
                if let Some(b) = live.store.as_ref().unwrap().bullet() {
                    b.drain().map_err(|e| format!("{what}: drain: {e}"))?;
                    b.verify().map_err(|e| format!("{what}: verify: {e}"))?;
                }
            }
            TOp::Restart => {
                live.shut();
                let sim = Arc::new(CrashSim::new(i as u64, 0));
                let (store, heap, clean) = open_sim(kind, &live.path, sim.clone(), LOG)
                    .map_err(|e| format!("{what}: reopen: {e}"))?;
                if !clean {
                    return Err(format!("{what}: a closed heap is not clean"));
                }
                live.sess = Some(store.session());
                live.store = Some(store);
                live.heap = Some(heap);
                live.sim = sim;
                live.check_all(&model, &what)?;
            }
            TOp::Crash(seed) => {
                let img = live.sim.capture_now(live.heap.as_ref().unwrap().region());
                gen += 1;
                let next = dir.path().join(format!("m{gen}.heap"));
                pmem::sim::write_image(&next, &img.bytes).unwrap();
                let old = live.path.clone();
                live.shut();
                std::fs::remove_file(&old).unwrap();
                let sim = Arc::new(CrashSim::new(*seed, 0));
                let (store, heap, clean) = open_sim(kind, &next, sim.clone(), LOG)
                    .map_err(|e| format!("{what}: recover: {e}"))?;
                if clean {
                    return Err(format!("{what}: a crash image says clean"));
                }
                live.sess = Some(store.session());
                live.store = Some(store);
                live.heap = Some(heap);
                live.sim = sim;
                live.path = next;
                live.check_all(&model, &what)?;
            }
        }
    }
    live.check_all(&model, "end")?;
    if let Some(b) = live.store.as_ref().unwrap().bullet() {
        b.drain().map_err(|e| format!("end: drain: {e}"))?;
        b.verify().map_err(|e| format!("end: verify: {e}"))?;
    }
    live.shut();
    Ok(())
}

fn cases() -> u32 {
    std::env::var("EMBER_ENGINE_MODEL_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(16)
}

fn run_kind(kind: Kind) {
    let mut runner = proptest::test_runner::TestRunner::new(Config {
        cases: cases(),
        failure_persistence: None,
        ..Config::default()
    });
    let persistent = kind != Kind::Volatile;
    let strat = proptest::collection::vec(op_strategy(persistent), 1..160);
    runner
        .run(&strat, |ops| {
            run_model(kind, &ops).map_err(TestCaseError::fail)?;
            Ok(())
        })
        .unwrap();
}

#[test]
fn volatile_matches_model() {
    run_kind(Kind::Volatile);
}

#[test]
fn direct_logfree_matches_model() {
    run_kind(Kind::PERSISTENT[0]);
}

#[test]
fn direct_phash_matches_model() {
    run_kind(Kind::PERSISTENT[1]);
}

#[test]
fn bullet_full_logfree_matches_model() {
    run_kind(Kind::PERSISTENT[2]);
}

#[test]
fn bullet_full_phash_matches_model() {
    run_kind(Kind::PERSISTENT[3]);
}

#[test]
fn bullet_dyn_matches_model() {
    run_kind(Kind::PERSISTENT[4]);
}

#[test]
fn bullet_st_matches_model() {
    run_kind(Kind::PERSISTENT[5]);
}

#[test]
fn bullet_opt_matches_model() {
    run_kind(Kind::PERSISTENT[6]);
}
