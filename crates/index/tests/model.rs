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
//! Batches ([`index::Ops::apply_batch`], the model applies the writes in order):
//! `Batch` writes 0 to 12 of the 20 keys (repeated keys and removes of absent keys
//! come naturally), `Bulk` 16 to 200 keys of one of two larger pools, with some
//! removes, repeats and a `sync` now and then: 256 ordinary keys, and 512 keys
//! whose hash is 0 modulo 1024, all in bucket 0 of the hash table at every size it
//! reaches here. The latter make the table double (the count grows) while leaving
//! its buckets uninitialised, so that a later batch of ordinary keys initialises
//! buckets with uninitialised ancestors (`init_buckets`, several rounds). After a
//! batch every key it wrote is read back. Every kind runs them: the hash table
//! with and without the link cache through its two-phase override, the skip list
//! and phash through the default implementation.
//!
//! `EMBER_INDEX_MODEL_CASES=n` sets the cases per kind (default 24). Failures are
//! not persisted to a regressions file; proptest prints the minimal failing input.

mod common;

use common::*;
use pmem::{CrashSim, Heap};
use proptest::prelude::*;
use proptest::test_runner::Config;
use rand::rngs::SmallRng;
use rand::seq::SliceRandom;
use rand::{RngExt, SeedableRng};
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

const NKEYS: usize = 20;
/// Ordinary keys of the bulk pool: keys `NKEYS..NKEYS + BULK`.
const BULK: usize = 256;
/// Keys whose hash is 0 modulo 1024: keys `NKEYS + BULK..NKEYS + BULK + ZERO`.
const ZERO: usize = 512;
const ALL: usize = NKEYS + BULK + ZERO;

/// The bytes of every key of the model: `common::key(i)` for the 20 keys and the
/// ordinary pool, then the keys of bucket 0.
fn universe() -> &'static [Vec<u8>] {
    static U: OnceLock<Vec<Vec<u8>>> = OnceLock::new();
    U.get_or_init(|| {
        let mut u: Vec<Vec<u8>> = (0..NKEYS + BULK).map(key).collect();
        let mut i = 0u64;
        while u.len() < ALL {
            let k = format!("zero{i}").into_bytes();
            if common::HASHER.hash(&k) & 1023 == 0 {
                u.push(k);
            }
            i += 1;
        }
        u
    })
}

#[derive(Clone, Debug)]
enum Op {
    Put(usize),
    Insert(usize),
    Remove(usize),
    Get(usize),
    Sync,
    Restart,
    Crash(u64),
    /// `apply_batch` on the 20 keys: (key, put?) in batch order.
    Batch(Vec<(usize, bool)>),
    /// `apply_batch` on `len` keys of a pool (`zero`: the keys of bucket 0, else
    /// the ordinary ones) from `start`; `seed` shuffles them and adds removes and
    /// repeated keys; then `sync` if `sync`.
    Bulk {
        zero: bool,
        start: usize,
        len: usize,
        seed: u64,
        sync: bool,
    },
}

/// The writes of a `Bulk` op: key and put? (value ids are given when applied).
fn bulk_items(zero: bool, start: usize, len: usize, seed: u64) -> Vec<(usize, bool)> {
    let (base, size) = if zero {
        (NKEYS + BULK, ZERO)
    } else {
        (NKEYS, BULK)
    };
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut items: Vec<(usize, bool)> = (start..(start + len).min(size))
        .map(|i| (base + i, !rng.random_bool(0.08)))
        .collect();
    items.shuffle(&mut rng);
    for _ in 0..rng.random_range(0..4) {
        if items.is_empty() {
            break;
        }
        let at = rng.random_range(0..items.len());
        let k = items[at].0;
        let put = rng.random_bool(0.5);
        items.insert(rng.random_range(at + 1..=items.len()), (k, put));
    }
    items
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
        20 => proptest::collection::vec((k(), proptest::bool::weighted(0.7)), 0..12)
            .prop_map(Op::Batch),
        8 => (any::<bool>(), 0..ZERO, 16..=200usize, any::<u64>(), any::<bool>()).prop_map(
            |(zero, start, len, seed, sync)| Op::Bulk {
                zero,
                start: if zero { start } else { start % BULK },
                len,
                seed,
                sync,
            }
        ),
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
        let s = read_universe(&*self.t).map_err(|e| format!("{what}: {e}"))?;
        if s != *model {
            return Err(format!(
                "{what}: content differs\nmodel: {model:?}\nfound: {s:?}"
            ));
        }
        Ok(())
    }
}

/// `common::read_state` over the whole [`universe`].
fn read_universe(t: &dyn DynIndex) -> Result<State, String> {
    read_keys(t, universe().iter().cloned())
}

/// Applies a batch (key, put?) through the handle, value ids `vid(1 + j, 0, op)`
/// for the write at position `j`, and to the model in order; then reads back every
/// key the batch wrote and checks the structure.
fn run_batch(
    live: &mut Live,
    model: &mut State,
    op: usize,
    items: &[(usize, bool)],
    what: &str,
) -> Result<(), String> {
    let u = universe();
    let ids: Vec<Option<u64>> = (0..items.len())
        .map(|j| items[j].1.then(|| vid(1 + j as u64, 0, op as u64)))
        .collect();
    let vals: Vec<Option<Vec<u8>>> = ids.iter().map(|v| v.map(value)).collect();
    let batch: Vec<(&[u8], Option<&[u8]>)> = items
        .iter()
        .zip(&vals)
        .map(|(&(k, _), v)| (u[k].as_slice(), v.as_deref()))
        .collect();
    let h = live.h.as_mut().unwrap();
    h.apply_batch(&batch)
        .map_err(|e| format!("{what}: apply_batch: {e}"))?;
    for (&(k, _), v) in items.iter().zip(&ids) {
        match v {
            Some(v) => model.insert(k, *v),
            None => model.remove(&k),
        };
    }
    let mut out = Vec::new();
    for &(k, _) in items {
        let got = if h
            .get(&u[k], &mut out)
            .map_err(|e| format!("{what}: get: {e}"))?
        {
            Some(value_id(&out).map_err(|e| format!("{what}: key {k}: {e}"))?)
        } else {
            None
        };
        if got != model.get(&k).copied() {
            return Err(format!(
                "{what}: after the batch key {k} holds {got:?}, the model says {:?}",
                model.get(&k)
            ));
        }
    }
    live.t
        .verify(false)
        .map_err(|e| format!("{what}: verify: {e}"))?;
    Ok(())
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
            Op::Batch(items) => run_batch(&mut live, &mut model, i, items, &what)?,
            Op::Bulk {
                zero,
                start,
                len,
                seed,
                sync,
            } => {
                let items = bulk_items(*zero, *start, *len, *seed);
                run_batch(&mut live, &mut model, i, &items, &what)?;
                if *sync {
                    live.h
                        .as_mut()
                        .unwrap()
                        .sync()
                        .map_err(|e| format!("{what}: sync: {e}"))?;
                }
            }
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
