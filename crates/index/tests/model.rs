//! Model-based test of the index structures (every [`Kind`]) against a `BTreeMap`.
//!
//! Random sequences of put / insert / remove / get on 20 keys, `sync`, clean
//! restarts (handles dropped, `close`, heap dropped, reopened, recovered) and
//! simulated crashes (a `CrashSim::capture_now` image of the heap, after a `sync`
//! for the kinds with the link cache, without one for the others, whose updates
//! are durable when they return:
//! the persisted image plus a random subset of the lines not yet durable, opened
//! and recovered as the heap from then on). After every operation its result is
//! compared with the model's and `verify(false)` must pass; after every restart or
//! crash the whole content (a get of every key, `verify(true).keys`) must equal the
//! model, and `check_heap` must count exactly the structure's blocks.
//!
//! `EMBER_INDEX_MODEL_CASES=n` sets the cases per kind (default 24). Failures are
//! not persisted to a regressions file; proptest prints the minimal failing input.

mod common;

use common::*;
use pmem::{CrashSim, Heap};
use proptest::prelude::*;
use proptest::test_runner::Config;
use std::path::{Path, PathBuf};
use std::sync::Arc;

const NKEYS: usize = 20;

#[derive(Clone, Debug)]
enum Op {
    Put(usize),
    Insert(usize),
    Remove(usize),
    Get(usize),
    Sync,
    Restart,
    Crash(u64),
}

fn op_strategy() -> impl Strategy<Value = Op> {
    let k = || 0..NKEYS;
    prop_oneof![
        30 => k().prop_map(Op::Put),
        15 => k().prop_map(Op::Insert),
        20 => k().prop_map(Op::Remove),
        15 => k().prop_map(Op::Get),
        3 => Just(Op::Sync),
        4 => Just(Op::Restart),
        6 => any::<u64>().prop_map(Op::Crash),
    ]
}

/// A structure on a heap opened through the crash simulator, and one handle.
struct Live {
    // Field order is drop order: the handle, the structure, then the heap.
    h: Option<Box<dyn index::Ops>>,
    t: Idx,
    heap: Heap,
    sim: Arc<CrashSim>,
    path: PathBuf,
}

impl Live {
    fn open(kind: Kind, path: &Path, seed: u64) -> Result<(Live, bool), String> {
        let sim = Arc::new(CrashSim::new(seed, 0));
        let rec =
            Heap::open_sim(path, &sim_opts(), sim.clone()).map_err(|e| format!("open: {e}"))?;
        let clean = rec.report().was_clean;
        let (heap, t, _) = recover(kind, rec).map_err(|e| format!("recover: {e}"))?;
        let h = Some(t.handle().map_err(|e| format!("handle: {e}"))?);
        Ok((
            Live {
                h,
                t,
                heap,
                sim,
                path: path.to_path_buf(),
            },
            clean,
        ))
    }

    /// The whole content against the model, the structure and the allocator.
    fn check_all(&self, model: &State, what: &str) -> Result<(), String> {
        check_recovered(&*self.t, &self.heap).map_err(|e| format!("{what}: {e}"))?;
        let s = read_state(&*self.t, NKEYS).map_err(|e| format!("{what}: {e}"))?;
        if s != *model {
            return Err(format!(
                "{what}: content differs\nmodel: {model:?}\nfound: {s:?}"
            ));
        }
        Ok(())
    }
}

fn run_model(kind: Kind, ops: &[Op]) -> Result<(), String> {
    let dir = tempfile::tempdir_in(shm_dir()).unwrap();
    let path0 = dir.path().join("m0.heap");
    {
        let heap = Heap::create(&path0, &sim_opts()).unwrap();
        let t = create(kind, &heap).map_err(|e| format!("create: {e}"))?;
        t.close().map_err(|e| format!("close: {e}"))?;
    }
    let (mut live, _) = Live::open(kind, &path0, 1)?;
    let mut model = State::new();
    let mut out = Vec::new();
    let mut gen = 0u32;
    for (i, op) in ops.iter().enumerate() {
        let what = format!("op {i} {op:?}");
        let val = vid(0, 0, i as u64);
        let kv = match op {
            Op::Put(k) => Some((OpKind::Put, *k)),
            Op::Insert(k) => Some((OpKind::Insert, *k)),
            Op::Remove(k) => Some((OpKind::Remove, *k)),
            Op::Get(k) => Some((OpKind::Get, *k)),
            _ => None,
        };
        if let Some((kind_, k)) = kv {
            let h = live.h.as_mut().unwrap();
            let (r, got) = run_op(&mut **h, kind_, &key(k), val, &mut out)
                .map_err(|e| format!("{what}: {e}"))?;
            let want = match kind_ {
                OpKind::Get => model.contains_key(&k),
                OpKind::Put => model.insert(k, val).is_none(),
                OpKind::Insert => {
                    let new = !model.contains_key(&k);
                    if new {
                        model.insert(k, val);
                    }
                    new
                }
                OpKind::Remove => model.remove(&k).is_some(),
            };
            if r != want || (kind_ == OpKind::Get && got != model.get(&k).copied()) {
                return Err(format!(
                    "{what}: returned {r} {got:?}, the model says {want} {:?}",
                    model.get(&k)
                ));
            }
            live.t
                .verify(false)
                .map_err(|e| format!("{what}: verify: {e}"))?;
            continue;
        }
        match op {
            Op::Sync => {
                live.h
                    .as_mut()
                    .unwrap()
                    .sync()
                    .map_err(|e| format!("{what}: {e}"))?;
            }
            Op::Restart => {
                live.h = None;
                live.t.close().map_err(|e| format!("{what}: close: {e}"))?;
                let path = live.path.clone();
                drop(live);
                let (l, clean) = Live::open(kind, &path, i as u64)?;
                live = l;
                if !clean {
                    return Err(format!("{what}: not clean after a clean shutdown"));
                }
                live.check_all(&model, &what)?;
            }
            Op::Crash(seed) => {
                // Without the link cache every update is durable when it returns.
                if !kind.durable_on_return() {
                    live.h
                        .as_mut()
                        .unwrap()
                        .sync()
                        .map_err(|e| format!("{what}: sync: {e}"))?;
                }
                let img = live.sim.capture_now(live.heap.region());
                gen += 1;
                let next = dir.path().join(format!("m{gen}.heap"));
                pmem::sim::write_image(&next, &img.bytes).unwrap();
                let old = live.path.clone();
                drop(live);
                std::fs::remove_file(&old).unwrap();
                let (l, clean) = Live::open(kind, &next, *seed)?;
                live = l;
                if clean {
                    return Err(format!("{what}: a crash image says clean"));
                }
                live.check_all(&model, &what)?;
            }
            _ => unreachable!(),
        }
    }
    // Finally a crash (after a sync if needed).
    if !kind.durable_on_return() {
        live.h
            .as_mut()
            .unwrap()
            .sync()
            .map_err(|e| format!("final sync: {e}"))?;
    }
    let img = live.sim.capture_now(live.heap.region());
    let next = dir.path().join("final.heap");
    pmem::sim::write_image(&next, &img.bytes).unwrap();
    drop(live);
    let (live, _) = Live::open(kind, &next, 7)?;
    live.check_all(&model, "final crash image")?;
    Ok(())
}

fn config() -> Config {
    Config {
        cases: env_u64("EMBER_INDEX_MODEL_CASES", 24) as u32,
        max_shrink_iters: 400,
        failure_persistence: None,
        ..Config::default()
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn model_hash(ops in proptest::collection::vec(op_strategy(), 1..80)) {
        if let Err(e) = run_model(Kind::Hash, &ops) {
            prop_assert!(false, "{}", e);
        }
    }

    #[test]
    fn model_hash_nocache(ops in proptest::collection::vec(op_strategy(), 1..80)) {
        if let Err(e) = run_model(Kind::HashNoCache, &ops) {
            prop_assert!(false, "{}", e);
        }
    }

    #[test]
    fn model_skip(ops in proptest::collection::vec(op_strategy(), 1..80)) {
        if let Err(e) = run_model(Kind::Skip, &ops) {
            prop_assert!(false, "{}", e);
        }
    }

    #[test]
    fn model_skip_nocache(ops in proptest::collection::vec(op_strategy(), 1..80)) {
        if let Err(e) = run_model(Kind::SkipNoCache, &ops) {
            prop_assert!(false, "{}", e);
        }
    }

    #[test]
    fn model_phash(ops in proptest::collection::vec(op_strategy(), 1..80)) {
        if let Err(e) = run_model(Kind::PHash, &ops) {
            prop_assert!(false, "{}", e);
        }
    }
}
