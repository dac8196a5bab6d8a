//! Crash-simulator test of the index structures (every [`Kind`]).
//!
//! A structure lives on a heap opened through the crash simulator. Two threads run
//! random put / insert / remove / get on 64 keys, half of the operations on four hot
//! keys (every written value is unique and names its operation); with the link cache
//! each thread calls `sync` after every operation, without it the operation itself
//! must be durable when it returns. Every operation is logged with two instants of
//! one clock that is also the simulator's tag: `inv`, taken before the operation
//! starts, and `resp`, taken after it (and `sync`) returned. The simulator takes
//! crash images at random fences (the persisted image plus a random subset of the
//! lines not yet durable), and the main thread forces more at random moments
//! (`capture_now`). An image's tag is the clock when it was taken, so the operations
//! with `resp <= tag` had completed before the crash, those with `inv <= tag` and no
//! earlier response were in flight, and the others had not started.
//!
//! Every image is written to a file, opened, attached and recovered, and then:
//!
//! - recovery succeeds, `verify(true)` passes, `check_heap` finds no problem and no
//!   pending log, and its block count equals the structure's (no leak, no lost
//!   block);
//! - durable linearizability ([`common::check_durable`]): per key, the recovered
//!   value is the end of a linearization of every completed operation (with the
//!   results they returned, gets included) and any of those in flight; every value
//!   is intact and no key outside the key space exists;
//! - every second image: random operations on the recovered structure, checked
//!   against a model, then the structure and the allocator again (fresh
//!   allocations overlap nothing live, nothing leaks);
//! - every tenth image: a second crash ([`second_crash`]): recovered again under a
//!   second simulator, whose images, taken during that recovery and during a short
//!   workload after it, are checked the same way.
//!
//! At the end of each run, a final image and the live structure (after a clean
//! `close`) must hold exactly what the history says.
//!
//! The batch runs (`crash_sim_*_batches`) add [`index::Ops::apply_batch`] to the
//! workload: about 45% of the operations are batches of 1 to 12 writes (one in ten
//! of 24 to 48) on 96 keys, puts of keys present and absent and removes, distinct
//! keys except that one batch in six repeats one, each batch followed by `sync`
//! (the batch is acknowledged then). A batch is logged as one write per item, all
//! with the batch's `inv` and `resp` and no result; the check
//! ([`check_durable_with`]) is the same durable linearizability, where a batch in
//! flight at the crash may have applied any prefix of its writes to each key, and a
//! completed one all of them. The second crashes' workload and the operations on
//! recovered structures include batches too.
//!
//! Knobs: `EMBER_INDEX_CRASH_IMAGES` (images per kind, default 250),
//! `EMBER_INDEX_CRASH_SEED` (workload seeds), `EMBER_CRASH_KEEP=DIR` (failing images
//! are saved there; `replay_kept_image` recovers one). A failure says whether a
//! second recovery of the same image fails too. Each kind prints `index crash-sim:
//! N images, M inconsistent (kind: ...)` (scripts/test.sh requires the line).

mod common;

use common::*;
use index::Ops;
use pmem::{CrashImage, CrashSim, Heap};
use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const NKEYS: usize = 64;
/// Keys of the batch runs (more, so that the hash table grows further and batches
/// initialise buckets).
const NKEYS_BATCHES: usize = 96;
/// Value ids of batch items: `vid(BATCH_ROUND + position in the batch, tid, n)`
/// (round 0 is the workers' single operations, 1 `exercise`, 2 the second crashes'
/// single operations). The second crashes' batches use tid `GEN2_BATCH_TID`.
const BATCH_ROUND: u64 = 16;
const GEN2_BATCH_TID: u64 = 7;
const THREADS: u64 = 2;
const OPS_PER_THREAD: u64 = 300;
/// Chance (per million) that a fence takes an image.
const CAPTURE_PPM: u64 = 30_000;
/// Workers wait while this many images are not yet checked (memory).
const BACKLOG: u64 = 12;
/// Second crashes: one image in `GEN2_EVERY` is recovered under a simulator that
/// takes images at this rate during recovery and a workload of `GEN2_OPS`; at most
/// `GEN2_CHECK` of them are checked.
const GEN2_EVERY: u64 = 10;
const GEN2_PPM: u64 = 150_000;
const GEN2_OPS: u64 = 30;
const GEN2_CHECK: usize = 12;

/// What the workers do.
#[derive(Clone, Copy)]
struct Workload {
    /// The key space: keys `0..nkeys`.
    nkeys: usize,
    /// Whether about 45% of the operations are `apply_batch` calls.
    batches: bool,
    /// The heap's persistence strategy: fence-only, or msync (whose batch
    /// allocations cover their words ahead, `ThreadHeap::reserve`).
    msync: bool,
}

impl Workload {
    fn opts(self) -> pmem::HeapOptions {
        if self.msync {
            heap_opts(2 << 20, 16 << 20, pmem::Strategy::Msync)
        } else {
            sim_opts()
        }
    }
}

const SINGLES: Workload = Workload {
    nkeys: NKEYS,
    batches: false,
    msync: false,
};
const BATCHES: Workload = Workload {
    nkeys: NKEYS_BATCHES,
    batches: true,
    msync: false,
};

/// One step of a workload: a single operation (kind, key, value id), or a batch of
/// writes (key, `Some` value id = put, `None` = remove).
enum Step {
    Single(OpKind, usize, u64),
    Batch(Vec<(usize, Option<u64>)>),
}

/// A random step. Without batches, a single operation as the workers always did.
/// With batches, about 45% are batches of 1 to 12 writes (one in ten of 24 to 48),
/// a quarter of them removes, on distinct keys except that one batch in six
/// repeats one of its keys later in the batch.
fn random_step(rng: &mut SmallRng, wl: Workload, tid: u64, n: u64, single_round: u64) -> Step {
    if !wl.batches || rng.random_bool(0.55) {
        return Step::Single(
            OpKind::random(rng),
            pick_key(rng, wl.nkeys),
            vid(single_round, tid, n),
        );
    }
    let len = if rng.random_bool(0.1) {
        rng.random_range(24..=48)
    } else {
        rng.random_range(1..=12)
    };
    let mut items: Vec<(usize, Option<u64>)> = Vec::with_capacity(len + 1);
    for j in 0..len as u64 {
        let mut k = pick_key(rng, wl.nkeys);
        let mut tries = 0;
        while items.iter().any(|&(i, _)| i == k) && tries < 16 {
            k = rng.random_range(0..wl.nkeys);
            tries += 1;
        }
        if tries == 16 {
            continue;
        }
        let v = (!rng.random_bool(0.25)).then(|| vid(BATCH_ROUND + j, tid, n));
        items.push((k, v));
    }
    if rng.random_bool(1.0 / 6.0) {
        let at = rng.random_range(0..items.len());
        let k = items[at].0;
        let v = (!rng.random_bool(0.3)).then(|| vid(BATCH_ROUND + len as u64, tid, n));
        items.insert(rng.random_range(at + 1..=items.len()), (k, v));
    }
    Step::Batch(items)
}

/// The records of a step invoked at `inv` (a batch: one per write, no result).
fn step_records(step: &Step, tid: u64, n: u64, inv: u64) -> Vec<OpRec> {
    let rec = |kind, key, val| OpRec {
        tid,
        n,
        kind,
        key,
        val,
        inv,
        resp: None,
        result: None,
        got: None,
    };
    match step {
        Step::Single(kind, k, v) => vec![rec(*kind, *k, *v)],
        Step::Batch(items) => items
            .iter()
            .map(|&(k, v)| match v {
                Some(v) => rec(OpKind::Put, k, v),
                None => rec(OpKind::Remove, k, 0),
            })
            .collect(),
    }
}

/// Runs a step: a single operation (then `sync` if `sync`), or a batch (then
/// `sync`, always: a batch is durable at the next sync). Returns the result and the
/// value id found of a single operation, `None` for a batch.
fn run_step(
    h: &mut dyn Ops,
    step: &Step,
    sync: bool,
    out: &mut Vec<u8>,
) -> Result<Option<(bool, Option<u64>)>, String> {
    match step {
        Step::Single(kind, k, v) => {
            let r = run_op(h, *kind, &key(*k), *v, out)?;
            if sync {
                h.sync().map_err(|e| format!("sync: {e}"))?;
            }
            Ok(Some(r))
        }
        Step::Batch(items) => {
            let vals: Vec<Option<Vec<u8>>> = items.iter().map(|(_, v)| v.map(value)).collect();
            let keys: Vec<Vec<u8>> = items.iter().map(|(k, _)| key(*k)).collect();
            let batch: Vec<(&[u8], Option<&[u8]>)> = keys
                .iter()
                .zip(&vals)
                .map(|(k, v)| (k.as_slice(), v.as_deref()))
                .collect();
            h.apply_batch(&batch)
                .map_err(|e| format!("apply_batch of {} writes failed: {e}", batch.len()))?;
            h.sync().map_err(|e| format!("sync after a batch: {e}"))?;
            Ok(None)
        }
    }
}

/// The checks of a recovered structure against a history: [`check_history`], or
/// for a history with batches the same with [`check_durable_with`].
fn check_history_wl(
    t: &dyn DynIndex,
    heap: &Heap,
    base: &State,
    ops: &[OpRec],
    cut: u64,
    wl: Workload,
) -> Result<State, String> {
    if !wl.batches {
        return check_history(t, heap, base, ops, cut, wl.nkeys);
    }
    check_recovered(t, heap)?;
    let s = read_state(t, wl.nkeys)?;
    check_durable_with(base, ops, cut, &s, wl.nkeys, true)?;
    Ok(s)
}

/// Batches on a recovered structure, single-threaded, checked against a model that
/// starts at `state` (keys `0..nkeys + 8`, value ids `vid(1, 254, i)`, repeated
/// keys and removes of absent keys included); then the content and the allocator.
fn exercise_batches(
    t: &dyn DynIndex,
    heap: &Heap,
    state: &State,
    nkeys: usize,
    rng: &mut SmallRng,
) -> Result<(), String> {
    let mut model = state.clone();
    let all = nkeys + 8;
    {
        let mut h = t.handle().map_err(|e| format!("handle: {e}"))?;
        let mut out = Vec::new();
        let mut i = 0u64;
        for _ in 0..4 {
            let len = rng.random_range(1..=24);
            let items: Vec<(usize, Option<u64>)> = (0..len)
                .map(|_| {
                    i += 1;
                    let k = rng.random_range(0..all);
                    (k, (!rng.random_bool(0.3)).then_some(vid(1, 254, i)))
                })
                .collect();
            run_step(&mut *h, &Step::Batch(items.clone()), true, &mut out)
                .map_err(|e| format!("after recovery: {e}"))?;
            for (k, v) in items {
                match v {
                    Some(v) => model.insert(k, v),
                    None => model.remove(&k),
                };
            }
        }
    }
    check_model(
        t,
        heap,
        &model,
        all,
        "after batches on the recovered structure",
    )
}

/// The history and its clock (the simulator's tag follows the clock).
#[derive(Default)]
struct Log {
    clock: u64,
    ops: Vec<OpRec>,
}

struct Run {
    sim: Arc<CrashSim>,
    log: Mutex<Log>,
    checked: AtomicU64,
    stop: AtomicBool,
}

impl Run {
    /// Advances the clock (and the tag) and, under the same lock, runs `f`.
    fn tick<R>(&self, f: impl FnOnce(&mut Log, u64) -> R) -> R {
        let mut g = self.log.lock().unwrap();
        g.clock += 1;
        let c = g.clock;
        self.sim.set_tag(c);
        f(&mut g, c)
    }
}

fn worker(run: &Run, t: &Idx, sync: bool, tid: u64, seed: u64, wl: Workload) -> Result<(), String> {
    let mut h = t.handle().map_err(|e| format!("handle: {e}"))?;
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut out = Vec::new();
    for n in 0..OPS_PER_THREAD {
        while run.sim.captured() > run.checked.load(Ordering::Acquire) + BACKLOG
            && !run.stop.load(Ordering::Acquire)
        {
            std::thread::sleep(Duration::from_micros(200));
        }
        if run.stop.load(Ordering::Acquire) {
            break;
        }
        let step = random_step(&mut rng, wl, tid, n, 0);
        let idx = run.tick(|log, c| {
            let first = log.ops.len();
            log.ops.extend(step_records(&step, tid, n, c));
            first..log.ops.len()
        });
        let r =
            run_step(&mut *h, &step, sync, &mut out).map_err(|e| format!("t{tid} op {n}: {e}"))?;
        run.tick(|log, c| {
            for i in idx {
                log.ops[i].resp = Some(c);
                if let Some((r, got)) = r {
                    log.ops[i].result = Some(r);
                    log.ops[i].got = got;
                }
            }
        });
    }
    Ok(())
}

/// What to do with an image besides the checks.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Extra {
    None,
    /// Random operations on the recovered structure.
    Exercise,
    /// Recover it under a second simulator and crash again (see [`second_crash`]).
    SecondCrash,
}

/// Opens one image and checks it against the history. Returns the number of
/// second-generation images it checked.
fn check_image(
    kind: Kind,
    path: &Path,
    img: &CrashImage,
    ops: &[OpRec],
    rng: &mut SmallRng,
    extra: Extra,
    wl: Workload,
) -> Result<u64, String> {
    pmem::sim::write_image(path, &img.bytes).map_err(|e| format!("write image: {e}"))?;
    let rec = Heap::open(path, &wl.opts()).map_err(|e| format!("open: {e}"))?;
    let (heap, t, _st) = recover(kind, rec).map_err(|e| format!("recover: {e}"))?;
    let state = match check_history_wl(&*t, &heap, &State::new(), ops, img.tag, wl) {
        Ok(s) => s,
        Err(e) => {
            let again = t.verify(true);
            return Err(format!(
                "{e}\n  (verify(true) again on the same heap: {again:?})"
            ));
        }
    };
    match extra {
        Extra::None => Ok(0),
        Extra::Exercise if wl.batches => {
            exercise_batches(&*t, &heap, &state, wl.nkeys, rng)?;
            let state = read_state(&*t, wl.nkeys + 8)?;
            exercise(&*t, &heap, &state, wl.nkeys, 24, 1, rng).map(|_| 0)
        }
        Extra::Exercise => exercise(&*t, &heap, &state, wl.nkeys, 24, 1, rng).map(|_| 0),
        Extra::SecondCrash => {
            drop(t);
            drop(heap);
            second_crash(kind, path, img, &state, rng, wl)
        }
    }
}

/// Crashes during and after recovery: the image (whose recovery gave `s1`) is
/// recovered again under a second simulator that takes images at random fences of
/// the recovery itself (tag 0) and of a short single-threaded workload that follows
/// (each operation synced, tagged like the main workload). Every such image must
/// recover to `s1` (a crash during recovery changes no content) extended by the
/// workload's completed operations and possibly the one in flight.
fn second_crash(
    kind: Kind,
    path: &Path,
    img: &CrashImage,
    s1: &State,
    rng: &mut SmallRng,
    wl: Workload,
) -> Result<u64, String> {
    let p2 = path.with_extension("gen2");
    let p3 = path.with_extension("gen3");
    pmem::sim::write_image(&p2, &img.bytes).map_err(|e| format!("write image: {e}"))?;
    let sim = Arc::new(CrashSim::new(rng.random(), 0));
    let rec = Heap::open_sim(&p2, &wl.opts(), sim.clone()).map_err(|e| format!("open: {e}"))?;
    sim.set_tag(0);
    sim.set_capture_ppm(GEN2_PPM);
    let (heap, t, _) =
        recover(kind, rec).map_err(|e| format!("recover under the simulator: {e}"))?;
    let mut ops = Vec::new();
    {
        let mut h = t.handle().map_err(|e| format!("handle: {e}"))?;
        let mut out = Vec::new();
        let mut clock = 0;
        for n in 0..GEN2_OPS {
            let step = match random_step(rng, wl, 0, n, 2) {
                // Batch value ids apart from the first workload's.
                Step::Batch(items) => Step::Batch(
                    items
                        .into_iter()
                        .map(|(k, v)| (k, v.map(|v| v | GEN2_BATCH_TID << 36)))
                        .collect(),
                ),
                s => s,
            };
            clock += 1;
            sim.set_tag(clock);
            let inv = clock;
            let r = run_step(&mut *h, &step, !kind.durable_on_return(), &mut out)
                .map_err(|e| format!("after recovery, op {n}: {e}"))?;
            clock += 1;
            sim.set_tag(clock);
            for mut o in step_records(&step, 0, n, inv) {
                o.resp = Some(clock);
                if let Some((r, got)) = r {
                    o.result = Some(r);
                    o.got = got;
                }
                ops.push(o);
            }
        }
    }
    sim.set_capture_ppm(0);
    let imgs = sim.take_images();
    drop(t);
    drop(heap);
    let total = imgs.len();
    let mut checked = 0;
    for im in imgs {
        if total > GEN2_CHECK && rng.random_range(0..total) >= GEN2_CHECK {
            continue;
        }
        checked += 1;
        let what = if im.tag == 0 {
            format!("crash during its recovery (fence {})", im.fence)
        } else {
            format!(
                "crash after its recovery (tag {}, fence {})",
                im.tag, im.fence
            )
        };
        pmem::sim::write_image(&p3, &im.bytes).map_err(|e| format!("write image: {e}"))?;
        let rec = Heap::open(&p3, &wl.opts()).map_err(|e| format!("{what}: open: {e}"))?;
        let (heap, t, _) = recover(kind, rec).map_err(|e| format!("{what}: recover: {e}"))?;
        if let Err(e) = check_history_wl(&*t, &heap, s1, &ops, im.tag, wl) {
            if let Some(k) = std::env::var_os("EMBER_CRASH_KEEP") {
                let k = PathBuf::from(k);
                let _ = pmem::sim::write_image(
                    &k.join(format!(
                        "{kind}-gen2-{}-{}-{}.heap",
                        img.tag, im.tag, im.fence
                    )),
                    &im.bytes,
                );
            }
            return Err(format!("{what}: {e}"));
        }
    }
    let _ = std::fs::remove_file(&p2);
    let _ = std::fs::remove_file(&p3);
    Ok(checked)
}

struct Tally {
    images: u64,
    gen2: u64,
    forced: u64,
    bad: u64,
    first: Vec<String>,
}

#[allow(clippy::too_many_arguments)]
fn check_batch(
    kind: Kind,
    run_no: u64,
    seed: u64,
    img_path: &Path,
    imgs: Vec<CrashImage>,
    run: &Run,
    rng: &mut SmallRng,
    tally: &mut Tally,
    keep: Option<&PathBuf>,
    wl: Workload,
) {
    if imgs.is_empty() {
        return;
    }
    let ops = run.log.lock().unwrap().ops.clone();
    for img in imgs {
        tally.images += 1;
        let extra = if tally.images.is_multiple_of(GEN2_EVERY) {
            Extra::SecondCrash
        } else if tally.images.is_multiple_of(2) {
            Extra::Exercise
        } else {
            Extra::None
        };
        match check_image(kind, img_path, &img, &ops, rng, extra, wl) {
            Ok(n) => tally.gen2 += n,
            Err(e) => {
                // Recover the same bytes again: does the failure reproduce?
                let again = check_image(kind, img_path, &img, &ops, rng, Extra::None, wl);
                let e = format!(
                    "{e}\n  (a second recovery of the same image: {})",
                    match again {
                        Ok(_) => "passes".to_string(),
                        Err(e2) if e2 == e => "fails the same way".to_string(),
                        Err(e2) => format!("fails differently: {e2}"),
                    }
                );
                tally.bad += 1;
                if let Some(k) = keep {
                    let _ = pmem::sim::write_image(
                        &k.join(format!("{kind}-{run_no}-{}-{}.heap", img.tag, img.fence)),
                        &img.bytes,
                    );
                }
                if tally.first.len() < 5 {
                    tally.first.push(format!(
                        "{kind} run {run_no} (seed {seed:#x}) image tag {} fence {}: {e}",
                        img.tag, img.fence
                    ));
                }
            }
        }
        run.checked.fetch_add(1, Ordering::AcqRel);
    }
}

fn crash_sim(kind: Kind, wl: Workload) {
    let mut label = kind.to_string();
    if wl.batches {
        label.push_str("+batches");
    }
    if wl.msync {
        label.push_str("+msync");
    }
    let dir = tempfile::tempdir_in(shm_dir()).unwrap();
    let img_path = dir.path().join("image.heap");
    let keep = std::env::var_os("EMBER_CRASH_KEEP").map(PathBuf::from);
    let target = env_u64("EMBER_INDEX_CRASH_IMAGES", 250).max(1);
    let seed0 = env_u64("EMBER_INDEX_CRASH_SEED", 0x1dc5);
    let started = Instant::now();
    let mut tally = Tally {
        images: 0,
        gen2: 0,
        forced: 0,
        bad: 0,
        first: Vec::new(),
    };
    let (mut runs, mut nops) = (0u64, 0u64);
    while tally.images < target {
        runs += 1;
        let seed = mix(seed0
            ^ (kind.id() << 40)
            ^ ((wl.batches as u64) << 48)
            ^ ((wl.msync as u64) << 52)
            ^ runs);
        let mut rng = SmallRng::seed_from_u64(seed);
        let path = dir.path().join(format!("run{runs}.heap"));
        {
            let heap = Heap::create(&path, &wl.opts()).unwrap();
            let t = create(kind, &heap).unwrap();
            t.close().unwrap();
        }
        let sim = Arc::new(CrashSim::new(seed, 0));
        let rec = Heap::open_sim(&path, &wl.opts(), sim.clone()).unwrap();
        let (heap, t, _) = recover(kind, rec).unwrap();
        let run = Run {
            sim: sim.clone(),
            log: Mutex::new(Log::default()),
            checked: AtomicU64::new(0),
            stop: AtomicBool::new(false),
        };
        sim.set_capture_ppm(CAPTURE_PPM);
        let errors: Vec<String> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..THREADS)
                .map(|tid| {
                    let (run, t) = (&run, &t);
                    let ws = mix(seed ^ (tid + 1));
                    s.spawn(move || {
                        let r = worker(run, t, !kind.durable_on_return(), tid, ws, wl);
                        if r.is_err() {
                            run.stop.store(true, Ordering::Release);
                        }
                        r
                    })
                })
                .collect();
            let mut forced_here = 0;
            while !hs.iter().all(|h| h.is_finished()) {
                if forced_here < 20 && rng.random_range(0..4u32) == 0 {
                    let img = sim.capture_now(heap.region());
                    forced_here += 1;
                    tally.forced += 1;
                    check_batch(
                        kind,
                        runs,
                        seed,
                        &img_path,
                        vec![img],
                        &run,
                        &mut rng,
                        &mut tally,
                        keep.as_ref(),
                        wl,
                    );
                }
                let imgs = sim.take_images();
                if imgs.is_empty() {
                    std::thread::sleep(Duration::from_micros(300));
                }
                check_batch(
                    kind,
                    runs,
                    seed,
                    &img_path,
                    imgs,
                    &run,
                    &mut rng,
                    &mut tally,
                    keep.as_ref(),
                    wl,
                );
            }
            hs.into_iter()
                .filter_map(|h| h.join().unwrap().err())
                .collect()
        });
        assert!(
            errors.is_empty(),
            "{label} run {runs} (seed {seed:#x}): a worker failed: {errors:?}"
        );
        sim.set_capture_ppm(0);
        let imgs = sim.take_images();
        check_batch(
            kind,
            runs,
            seed,
            &img_path,
            imgs,
            &run,
            &mut rng,
            &mut tally,
            keep.as_ref(),
            wl,
        );
        // Quiescent: a final image, and the live structure itself, must hold exactly
        // the last completed writes.
        let img = sim.capture_now(heap.region());
        tally.forced += 1;
        check_batch(
            kind,
            runs,
            seed,
            &img_path,
            vec![img],
            &run,
            &mut rng,
            &mut tally,
            keep.as_ref(),
            wl,
        );
        let log = run.log.lock().unwrap();
        nops += log.ops.len() as u64;
        // (A clean close runs the deferred frees: the block counts must then agree.)
        t.close().unwrap();
        let live = check_history_wl(&*t, &heap, &State::new(), &log.ops, log.clock, wl);
        if let Err(e) = live {
            tally.bad += 1;
            tally.first.push(format!(
                "{label} run {runs} (seed {seed:#x}): live structure after the run: {e}"
            ));
        }
        drop(log);
        drop(t);
        drop(heap);
        let _ = std::fs::remove_file(&path);
        if tally.bad > 0 {
            break;
        }
    }
    say(&format!(
        "index crash-sim: {} images, {} inconsistent ({label}: {} forced, {} second crashes, \
         {runs} runs, {nops} ops, {:.1} s)",
        tally.images + tally.gen2,
        tally.bad,
        tally.forced,
        tally.gen2,
        started.elapsed().as_secs_f64()
    ));
    for f in &tally.first {
        say(f);
    }
    assert_eq!(
        tally.bad,
        0,
        "{label}: inconsistent crash images:\n{}",
        tally.first.join("\n")
    );
    assert!(tally.images >= target);
}

#[test]
fn crash_sim_hash() {
    crash_sim(Kind::Hash, SINGLES);
}

#[test]
fn crash_sim_hash_nocache() {
    crash_sim(Kind::HashNoCache, SINGLES);
}

#[test]
fn crash_sim_skip() {
    crash_sim(Kind::Skip, SINGLES);
}

#[test]
fn crash_sim_skip_nocache() {
    crash_sim(Kind::SkipNoCache, SINGLES);
}

#[test]
fn crash_sim_phash() {
    crash_sim(Kind::PHash, SINGLES);
}

/// The log-free hash table's own `apply_batch` (two phases), link cache on.
#[test]
fn crash_sim_hash_batches() {
    crash_sim(Kind::Hash, BATCHES);
}

/// The log-free hash table's own `apply_batch`, link-and-persist only.
#[test]
fn crash_sim_hash_nocache_batches() {
    crash_sim(Kind::HashNoCache, BATCHES);
}

/// The batches on an msync heap, where a batch's allocations are covered ahead
/// (`ThreadHeap::reserve`: entries for words of the current slab and of spare
/// slabs, one fence) before any of its blocks is claimed.
#[test]
fn crash_sim_hash_batches_msync() {
    crash_sim(
        Kind::Hash,
        Workload {
            msync: true,
            ..BATCHES
        },
    );
}

/// A heap with a zeroed 64-byte root block for the plain-transaction tests:
/// (directory, heap path, image path, root offset).
fn tx_heap() -> (
    tempfile::TempDir,
    std::path::PathBuf,
    std::path::PathBuf,
    u64,
) {
    let dir = tempfile::tempdir_in(shm_dir()).unwrap();
    let path = dir.path().join("tx.heap");
    let img_path = dir.path().join("img.heap");
    let heap = Heap::create(&path, &sim_opts()).unwrap();
    let mut th = heap.thread().unwrap();
    let p = th.alloc_zeroed(64).unwrap();
    heap.region().fence();
    heap.set_root(p).unwrap();
    th.end_op();
    (dir, path, img_path, p.offset())
}

/// Whether the raw image holds a redo-log header that says COMMITTED (magic
/// "EMTX", state 1) in any thread slot: torn or not, recovery must never leave it.
fn has_commit_header(bytes: &[u8]) -> bool {
    let geo = sim_opts().geometry;
    (0..geo.nslots as usize).any(|s| {
        let o = geo.log_off(s) as usize;
        bytes.len() >= o + 8
            && bytes[o..o + 4] == 0x5854_4d45u32.to_le_bytes()
            && bytes[o + 4..o + 8] == 1u32.to_le_bytes()
    })
}

/// Regression test of a pmem recovery defect the phash crash images hit: a crash
/// image taken at a transaction's commit fence may hold the new log header
/// (COMMITTED) but not all of the new records. Recovery must not replay it (checksum
/// mismatch) and must clear it: left in place, `check_heap` reports a "committed log
/// awaiting replay" on a freshly recovered heap, and the stale header stays armed
/// until the slot's next commit (see the next test). Plain pmem transactions, no
/// index structure involved.
#[test]
fn pmem_recovery_clears_torn_commit_headers() {
    let (_dir, path, img_path, root) = tx_heap();
    let sim = Arc::new(CrashSim::new(42, 1_000_000)); // an image at every fence
    let rec = Heap::open_sim(&path, &sim_opts(), sim.clone()).unwrap();
    sim.set_capture_ppm(0);
    let _ = sim.take_images();
    let (heap, _) = rec.finish(|b| b.offset() == root).unwrap();
    let mut th = heap.thread().unwrap();
    sim.set_capture_ppm(1_000_000);
    for i in 1..=40u64 {
        sim.set_tag(i);
        let mut tx = th.begin();
        tx.write_u64(root, i * 0x0101_0101).unwrap();
        tx.write_u64(root + 8, !i).unwrap();
        tx.commit().unwrap();
    }
    sim.set_capture_ppm(0);
    let (mut images, mut bad) = (0, Vec::new());
    for img in sim.take_images() {
        images += 1;
        pmem::sim::write_image(&img_path, &img.bytes).unwrap();
        let rec = Heap::open(&img_path, &sim_opts()).unwrap();
        let (h, _) = rec.finish(|b| b.offset() == root).unwrap();
        let rep = pmem::check_heap(&h);
        let (a, b): (u64, u64) = (h.region().read(root), h.region().read(root + 8));
        if !rep.ok() || rep.pending_logs != 0 {
            bad.push(format!(
                "image of tx {} (fence {}): {} pending logs after recovery, root words {a:#x} {b:#x}",
                img.tag, img.fence, rep.pending_logs
            ));
        }
    }
    assert!(
        bad.is_empty(),
        "{} of {images} images recover with a committed-looking log left:\n{}",
        bad.len(),
        bad.join("\n")
    );
}

/// Regression test of the consequence of the defect above (`recover_all` now
/// clears torn headers): after recovering an image with a torn
/// commit header, a later transaction of the same thread slot whose first records
/// repeat the torn transaction's records byte for byte is replayed *in part* if the
/// crash comes after its records but before its own header became durable: the
/// stale header's length and checksum cover only the first records. Here T1 writes
/// (a, b), its commit is torn; T2 writes (a, b, c) with the same values for a and
/// b; a crash image taken at T2's commit fence recovers with a and b from T2 and c
/// from before T2, which breaks T2's atomicity.
#[test]
fn pmem_stale_commit_header_never_replays_part_of_a_transaction() {
    let (dir, path, img_path, root) = tx_heap();
    let words = |h: &Heap| -> [u64; 3] { [0, 8, 16].map(|o| h.region().read::<u64>(root + o)) };
    // Stage 1: images of T1 = (a, b) commits whose header is torn.
    let sim = Arc::new(CrashSim::new(42, 0));
    let (heap, _) = Heap::open_sim(&path, &sim_opts(), sim.clone())
        .unwrap()
        .finish(|b| b.offset() == root)
        .unwrap();
    let mut th = heap.thread().unwrap();
    sim.set_capture_ppm(1_000_000);
    for i in 1..=40u64 {
        sim.set_tag(i);
        let mut tx = th.begin();
        tx.write_u64(root, i * 0x0101_0101).unwrap();
        tx.write_u64(root + 8, !i).unwrap();
        tx.commit().unwrap();
    }
    sim.set_capture_ppm(0);
    drop(th);
    // The images of stage 1 whose bytes hold a commit header (recovery clears a
    // torn one, so they are told apart before opening).
    let torn: Vec<_> = sim
        .take_images()
        .into_iter()
        .filter(|img| has_commit_header(&img.bytes))
        .collect();
    assert!(!torn.is_empty(), "no commit header in any stage-1 image");
    // Stage 2: from each torn image, T2 = (a, b, c) repeating T1's a and b.
    let mut bad = Vec::new();
    let mut images = 0;
    for (k, t1) in torn.iter().enumerate() {
        for seed in 0..16u64 {
            let p2 = dir.path().join(format!("s2-{k}-{seed}.heap"));
            pmem::sim::write_image(&p2, &t1.bytes).unwrap();
            let sim = Arc::new(CrashSim::new(seed, 0));
            let (h, _) = Heap::open_sim(&p2, &sim_opts(), sim.clone())
                .unwrap()
                .finish(|b| b.offset() == root)
                .unwrap();
            let before = words(&h);
            let i = t1.tag;
            let after = [i * 0x0101_0101, !i, 0xc0ffee];
            let mut th = h.thread().unwrap();
            sim.set_capture_ppm(1_000_000);
            let mut tx = th.begin();
            tx.write_u64(root, after[0]).unwrap();
            tx.write_u64(root + 8, after[1]).unwrap();
            tx.write_u64(root + 16, after[2]).unwrap();
            tx.commit().unwrap();
            sim.set_capture_ppm(0);
            drop(th);
            drop(h);
            for img in sim.take_images() {
                images += 1;
                pmem::sim::write_image(&img_path, &img.bytes).unwrap();
                let (h, _) = Heap::open(&img_path, &sim_opts())
                    .unwrap()
                    .finish(|b| b.offset() == root)
                    .unwrap();
                let got = words(&h);
                if got != before && got != after {
                    bad.push(format!(
                        "T1 image of tx {i}, T2 seed {seed}, fence {}: recovered {got:x?}, \
                         T2 changes {before:x?} to {after:x?}",
                        img.fence
                    ));
                }
            }
            let _ = std::fs::remove_file(&p2);
        }
    }
    assert!(
        bad.is_empty(),
        "{} of {images} images recover a transaction in part:\n{}",
        bad.len(),
        bad.join("\n")
    );
}

/// The durable-linearizability checker itself must reject what it should.
#[test]
fn checker_rejects_lost_and_phantom_writes() {
    let op = |tid, n, kind, val, inv, resp: Option<u64>, result: Option<bool>, got| OpRec {
        tid,
        n,
        kind,
        key: 0,
        val,
        inv,
        resp,
        result,
        got,
    };
    let st = |v: Option<u64>| -> State { v.map(|v| State::from([(0, v)])).unwrap_or_default() };
    let base = State::new();
    // A completed put must survive; an in-flight one may or may not.
    let h = [
        op(0, 0, OpKind::Put, 10, 1, Some(2), Some(true), None),
        op(1, 0, OpKind::Put, 11, 3, None, None, None),
    ];
    assert!(check_durable(&base, &h, 9, &st(Some(10)), 1).is_ok());
    assert!(check_durable(&base, &h, 9, &st(Some(11)), 1).is_ok());
    assert!(check_durable(&base, &h, 9, &st(None), 1).is_err());
    // Before the put completed, absence is fine; a write not yet started is not.
    assert!(check_durable(&base, &h, 1, &st(None), 1).is_ok());
    assert!(check_durable(&base, &h, 1, &st(Some(11)), 1).is_err());
    // A completed remove after the put: the put's value is gone.
    let h2 = [
        op(0, 0, OpKind::Put, 10, 1, Some(2), Some(true), None),
        op(0, 1, OpKind::Remove, 0, 3, Some(4), Some(true), None),
    ];
    assert!(check_durable(&base, &h2, 9, &st(None), 1).is_ok());
    assert!(check_durable(&base, &h2, 9, &st(Some(10)), 1).is_err());
    // A completed get saw an in-flight insert: the insert must be durable.
    let h3 = [
        op(0, 0, OpKind::Insert, 10, 1, None, None, None),
        op(1, 0, OpKind::Get, 0, 2, Some(3), Some(true), Some(10)),
    ];
    assert!(check_durable(&base, &h3, 9, &st(Some(10)), 1).is_ok());
    assert!(check_durable(&base, &h3, 9, &st(None), 1).is_err());
    // Results must agree with the state: an insert that failed on an empty key.
    let h4 = [op(0, 0, OpKind::Insert, 10, 1, Some(2), Some(false), None)];
    assert!(check_durable(&base, &h4, 9, &st(None), 1).is_err());
    // Overlapping completed puts: the results fix the order (11 found a value, so
    // 10 came first and 11 is last); without results either could be last.
    let h5 = [
        op(0, 0, OpKind::Put, 10, 1, Some(4), Some(true), None),
        op(1, 0, OpKind::Put, 11, 2, Some(3), Some(false), None),
    ];
    assert!(check_durable(&base, &h5, 9, &st(Some(11)), 1).is_ok());
    assert!(check_durable(&base, &h5, 9, &st(Some(10)), 1).is_err());
    let h6 = [
        op(0, 0, OpKind::Put, 10, 1, Some(4), Some(false), None),
        op(1, 0, OpKind::Put, 11, 2, Some(3), Some(false), None),
    ];
    let b6 = st(Some(7));
    assert!(check_durable(&b6, &h6, 9, &st(Some(10)), 1).is_ok());
    assert!(check_durable(&b6, &h6, 9, &st(Some(11)), 1).is_ok());
    assert!(check_durable(&b6, &h6, 9, &st(Some(7)), 1).is_err());
    // A value nobody wrote, a key outside the key space.
    assert!(check_durable(&base, &h, 9, &st(Some(99)), 1).is_err());
    assert!(check_durable(&base, &[], 9, &State::from([(3, 1)]), 1).is_err());
}

/// The batch-aware checker must reject what it should, and accept what a batch in
/// flight may leave.
#[test]
fn checker_batched_rejects_lost_and_reordered_batch_writes() {
    // A batch of thread 0 at [1, 4]: key 0 put 10, remove, put 11 (a repeated
    // key); key 1 put 20. A single put of thread 1 on key 0 at [5, 6].
    let w = |tid, key, kind, val, inv, resp: Option<u64>| OpRec {
        tid,
        n: 0,
        kind,
        key,
        val,
        inv,
        resp,
        result: None,
        got: None,
    };
    let batch = |resp| {
        vec![
            w(0, 0, OpKind::Put, 10, 1, resp),
            w(0, 0, OpKind::Remove, 0, 1, resp),
            w(0, 0, OpKind::Put, 11, 1, resp),
            w(0, 1, OpKind::Put, 20, 1, resp),
        ]
    };
    let st = |a: Option<u64>, b: Option<u64>| -> State {
        let mut s = State::new();
        if let Some(a) = a {
            s.insert(0, a);
        }
        if let Some(b) = b {
            s.insert(1, b);
        }
        s
    };
    let base = st(Some(7), None);
    // Completed: every write in, in batch order.
    let done = batch(Some(4));
    assert!(check_durable_with(&base, &done, 4, &st(Some(11), Some(20)), 2, true).is_ok());
    assert!(check_durable_with(&base, &done, 4, &st(Some(10), Some(20)), 2, true).is_err());
    assert!(check_durable_with(&base, &done, 4, &st(None, Some(20)), 2, true).is_err());
    assert!(check_durable_with(&base, &done, 4, &st(Some(7), Some(20)), 2, true).is_err());
    assert!(check_durable_with(&base, &done, 4, &st(Some(11), None), 2, true).is_err());
    // In flight at the crash (cut 3): per key any prefix of its writes.
    for a in [Some(7), Some(10), None, Some(11)] {
        for b in [None, Some(20)] {
            assert!(
                check_durable_with(&base, &batch(Some(4)), 3, &st(a, b), 2, true).is_ok(),
                "{a:?} {b:?}"
            );
        }
    }
    assert!(check_durable_with(&base, &batch(None), 9, &st(Some(99), None), 2, true).is_err());
    // Not started at the crash (cut 0): nothing of it.
    assert!(check_durable_with(&base, &batch(Some(4)), 0, &st(Some(10), None), 2, true).is_err());
    // A later single put of another thread after the completed batch: it wins.
    let mut h = batch(Some(4));
    h.push(OpRec {
        result: Some(false),
        ..w(1, 0, OpKind::Put, 30, 5, Some(6))
    });
    assert!(check_durable_with(&base, &h, 6, &st(Some(30), Some(20)), 2, true).is_ok());
    assert!(check_durable_with(&base, &h, 6, &st(Some(11), Some(20)), 2, true).is_err());
    // Two operations in flight on a key that are not one batch are a worker bug.
    let two = [
        w(0, 0, OpKind::Put, 10, 1, None),
        w(0, 0, OpKind::Put, 11, 2, None),
    ];
    assert!(check_durable_with(&base, &two, 9, &st(Some(11), None), 2, true).is_err());
}

/// Debugging aid: recovers a saved image (`EMBER_CRASH_KEEP` output) named by
/// `EMBER_CRASH_REPLAY=path` as `EMBER_CRASH_REPLAY_KIND=kind` and runs the checks
/// that do not need the history. Run with `--ignored --nocapture`.
#[test]
#[ignore = "debugging aid: needs EMBER_CRASH_REPLAY"]
fn replay_kept_image() {
    let Some(src) = std::env::var_os("EMBER_CRASH_REPLAY") else {
        return;
    };
    let kind = std::env::var("EMBER_CRASH_REPLAY_KIND")
        .ok()
        .and_then(|k| Kind::parse(&k))
        .expect("EMBER_CRASH_REPLAY_KIND=hash|hash-nocache|skip|skip-nocache|phash");
    let dir = tempfile::tempdir_in(shm_dir()).unwrap();
    let path = dir.path().join("replay.heap");
    std::fs::copy(&src, &path).unwrap();
    let rec = Heap::open(&path, &sim_opts()).unwrap();
    let (heap, t, st) = recover(kind, rec).unwrap();
    say(&format!("recovered: {st:?}"));
    let v = check_recovered(&*t, &heap);
    say(&format!("check_recovered: {v:?}"));
    let s = read_state(&*t, NKEYS);
    say(&format!("state: {s:?}"));
    assert!(v.is_ok() && s.is_ok());
}

/// Skip list, link cache on: a crash in the middle of a remove must not leave a
/// live node linked at a level above one it is missing from. The remove freezes the
/// node through the link cache (durable only at the bucket's next flush), marks its
/// levels and snips it at every level with `cas_flush`; the first fence comes when
/// `find` reaches level 0. A crash image taken there may hold the level-1 snip but
/// neither the freeze nor the level-2 snip: the node is then live after recovery,
/// on levels 0 and 2 but not 1, and `find` descends through it and follows its own
/// stale `next[1]`, so later removes snip nodes at the wrong predecessor and leave
/// them linked (dangling once freed). Each image of the remove is recovered, and
/// then every key is removed, from the last one down (so that the nodes after the
/// victim go first), with `verify(true)` after each.
#[test]
fn skip_crash_in_a_remove_leaves_no_level_gap() {
    let dir = tempfile::tempdir_in(shm_dir()).unwrap();
    let base = dir.path().join("base.heap");
    let work = dir.path().join("work.heap");
    let img_path = dir.path().join("img.heap");
    let next = |n: u64, l: u64| n + 24 + 8 * l; // node layout (skiplist/mod.rs)
    let line = |a: u64| a / 64;
    // A list of NKEYS keys, closed cleanly; the victim has height >= 3 and its
    // level-1 and level-2 predecessors' links lie in other cache lines than its
    // own header and than each other.
    let victim = {
        let heap = Heap::create(&base, &sim_opts()).unwrap();
        let t = create(Kind::Skip, &heap).unwrap();
        {
            let mut h = t.handle().unwrap();
            for i in 0..NKEYS {
                h.put(&key(i), &value(vid(0, 0, i as u64))).unwrap();
            }
        }
        t.close().unwrap();
        let r = heap.region();
        let head: u64 = r.read(t.root().offset() + 8);
        let level = |l: u64| {
            let mut v = Vec::new();
            let mut p = head;
            loop {
                let c = r.read::<u64>(next(p, l)) & !7;
                if c == 0 {
                    break v;
                }
                v.push((p, c));
                p = c;
            }
        };
        let (l1, l2) = (level(1), level(2));
        let found = l2.iter().find_map(|&(p2, c)| {
            let &(p1, _) = l1.iter().find(|&&(_, c1)| c1 == c)?;
            let lines = [line(c + 16), line(next(p1, 1)), line(next(p2, 2))];
            (lines[0] != lines[1] && lines[0] != lines[2] && lines[1] != lines[2]).then_some(c)
        });
        let c = found.expect("no suitable node (heights are random): run again");
        let klen: u32 = r.read(c + 4);
        let h: u32 = r.read(c + 8);
        let mut k = vec![0u8; klen as usize];
        r.read_bytes(next(c, h as u64), &mut k);
        k
    };
    let (mut images, mut bad) = (0, Vec::new());
    for seed in 0..96u64 {
        std::fs::copy(&base, &work).unwrap();
        let sim = Arc::new(CrashSim::new(seed, 0));
        let rec = Heap::open_sim(&work, &sim_opts(), sim.clone()).unwrap();
        let (heap, t, _) = recover(Kind::Skip, rec).unwrap();
        {
            let mut h = t.handle().unwrap();
            sim.set_capture_ppm(1_000_000);
            assert!(h.remove(&victim).unwrap());
            sim.set_capture_ppm(0);
        }
        drop(t);
        drop(heap);
        for img in sim.take_images() {
            images += 1;
            let check = || -> Result<(), String> {
                pmem::sim::write_image(&img_path, &img.bytes).map_err(|e| e.to_string())?;
                let rec = Heap::open(&img_path, &sim_opts()).map_err(|e| e.to_string())?;
                let (heap, t, _) = recover(Kind::Skip, rec).map_err(|e| e.to_string())?;
                check_recovered(&*t, &heap)?;
                let mut h = t.handle().map_err(|e| e.to_string())?;
                for i in (0..NKEYS).rev() {
                    h.remove(&key(i)).map_err(|e| e.to_string())?;
                    t.verify(true)
                        .map_err(|e| format!("after removing key{i}: {e}"))?;
                }
                Ok(())
            };
            if let Err(e) = check() {
                bad.push(format!("seed {seed}, fence {}: {e}", img.fence));
            }
        }
    }
    assert!(
        bad.is_empty(),
        "{} of {images} images of remove({}) go wrong:\n{}",
        bad.len(),
        String::from_utf8_lossy(&victim),
        bad.join("\n")
    );
}
