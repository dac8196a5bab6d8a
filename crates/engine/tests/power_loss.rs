//! Power loss under `--durability msync`: Bullet with group commit and staged
//! records (written through the file at the commit, `Pool::stages`) on a heap
//! watched by the power-loss simulator (`CrashSim::power_loss`). A crash image
//! holds every page an msync or fsync made durable, with its content then, and
//! for each page written since (through the mapping or by `pwrite`) its old or
//! new content or a tear of both at 512-byte sectors.
//!
//! Several sessions, each on its own thread, write batches and commit them
//! (in some runs a third through `commit_detached`, completed after the next
//! batch's writes, as the server's pipeline does);
//! every write and commit is stamped with one clock that is also the
//! simulator's tag (`CrashSim::tick`): `start` before `apply`, `end` after it,
//! `ack` after the commit that covers it returned. The simulator takes images
//! at random syncs, and one is taken after the workload. Each image is
//! recovered and, for every key of the key space:
//!
//! - the value read back was written (or is the key's initial absence), by a
//!   write started before the image;
//! - no write acknowledged before the image is lost: the value read back is
//!   not older than any of them (older: its `apply` returned before theirs
//!   started);
//!
//! and every few images the store is drained and checked (frontend against
//! backend) and the heap's allocated blocks are exactly the store's (no leak).
//!
//! Variants of the workload: sessions with keys of their own, or hot keys that
//! two sessions write (a record whose `prev` is in another writer's
//! uncommitted log: `make_durable` on the writer's thread); detached commits
//! (a key rewritten while its last record's commit is detached); small logs (log
//! hand-over, full logs); reads that miss the frontend after a restart (backend
//! reads, which clean links a gleaner left dirty); the ablation variants
//! (`st`, `lfr`: a side-table transaction per put); and double crashes (an
//! image recovered under a second simulator, written to, crashed again).
//!
//! What they guard against: an acknowledged record left unsynced because a
//! fence ran between its append and the commit (hot keys, detached commits,
//! small logs, backend reads, opt, st / lfr: "fence before commit" below); a
//! record from before a crash replayed after the next one
//! (`double_crash_any_image`: "reused positions" below); and a remove that
//! finds a key already removed by another session's uncommitted tombstone,
//! acknowledged with the tombstone unsynced (the hot keys, in some runs; the
//! deterministic case is
//! `a_remove_that_finds_an_uncommitted_tombstone_makes_it_durable`).
//!
//! Each test prints `power-loss-sim: N images, M inconsistent (engine ...)`.
//! `EMBER_POWER_LOSS_SEED` sets the first seed; failures name their seed.

mod common;

use common::*;
use engine::bullet::{BulletOptions, BulletParts, BulletStore, Variant};
use engine::direct::BackendKind;
use engine::{Op, Session, Store};
use index::Index;
use pmem::{CrashImage, CrashSim, Heap, HeapOptions, Strategy};
use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// Every value is this long and every key 4 bytes: all put records have one
/// length, so a record of a later run can end exactly where an older one starts.
const VAL: usize = 92;

fn heap_o() -> HeapOptions {
    heap_opts(4 << 20, 32 << 20, Strategy::Msync)
}

/// Images are recovered without the simulator, under the fence-only strategy
/// (the same format; nothing waits for the file).
fn check_o() -> HeapOptions {
    heap_opts(4 << 20, 32 << 20, Strategy::FenceOnly)
}

#[derive(Clone, Copy, Debug)]
struct Cfg {
    name: &'static str,
    variant: Variant,
    backend: BackendKind,
    sessions: usize,
    /// Keys of each session's own.
    own_keys: usize,
    /// Keys every session writes (0: none).
    hot_keys: usize,
    /// Per mille of writes to a hot key.
    hot_pm: u32,
    /// Reads between writes, mostly of keys nobody writes (`read_keys`, which
    /// miss the frontend after the restart the run starts with, and read the
    /// backend, where the gleaner is applying the writes).
    reads: bool,
    /// Keys only read (0: none).
    read_keys: usize,
    /// Start from a store holding every key (written, drained, closed).
    prefill: bool,
    /// Read every key before the sessions start: with `prefill` (and no
    /// removes) every write then finds its key in the frontend, and no write
    /// reads the backend.
    warm: bool,
    /// A third of the commits through `commit_detached`, completed after the
    /// next batch's writes (the server's pipeline): a write of a key whose last
    /// record awaits that completion syncs the log itself (`make_durable`).
    detached: bool,
    removes: bool,
    logs: usize,
    log_size: u64,
    batches: usize,
    max_batch: usize,
    capture_ppm: u64,
    /// Every how many images a second crash is tried (0: never).
    double_every: u64,
    /// Whether the first crash of a double crash is taken only with every
    /// session committed and idle (its image then holds every record).
    quiescent_first: bool,
    /// The second run of a double crash: batches and writes per batch.
    second: (usize, usize),
    /// Every page written since its sync comes back torn at sectors (rather
    /// than old, new or torn at random): records lost in front of kept ones.
    torn: bool,
    /// Images to collect (at least).
    images: u64,
    /// `BulletOptions::backlog_limit` (0: none).
    backlog: u64,
}

const BASE: Cfg = Cfg {
    name: "",
    variant: Variant::Full,
    backend: BackendKind::LogFree,
    sessions: 3,
    own_keys: 8,
    hot_keys: 0,
    hot_pm: 0,
    reads: false,
    read_keys: 0,
    prefill: false,
    warm: false,
    detached: false,
    removes: true,
    logs: 4,
    // Larger than what the workload writes: no writer waits for log space.
    log_size: 64 << 10,
    batches: 30,
    max_batch: 6,
    capture_ppm: 150_000,
    double_every: 0,
    quiescent_first: true,
    second: (3, 6),
    torn: false,
    images: 400,
    backlog: 0,
};

fn store_o(c: &Cfg) -> BulletOptions {
    BulletOptions {
        logs: c.logs,
        group_commit: true,
        // As `ember serve --durability msync` runs it.
        role_threads: 1,
        backlog_limit: c.backlog,
        ..bullet_opts(c.variant, c.backend, c.log_size)
    }
}

fn key(k: usize) -> Vec<u8> {
    format!("k{k:03}").into_bytes()
}

fn value(sess: usize, n: u64) -> Vec<u8> {
    let mut v = format!("s{sess}-{n}-").into_bytes();
    v.resize(VAL, b'a' + (n % 26) as u8);
    v
}

/// One write: its value (None: a remove) and its instants on the clock.
#[derive(Clone, Debug)]
struct W {
    val: Option<Vec<u8>>,
    start: u64,
    end: u64,
    ack: u64,
}

/// Per key, every write (the first: the value at the run's start, acknowledged
/// at 0).
type Hist = BTreeMap<Vec<u8>, Vec<W>>;

/// Keys and their values.
type Values = BTreeMap<Vec<u8>, Vec<u8>>;

/// A batch's writes: keys and their indices in the history.
type Batch = Vec<(Vec<u8>, usize)>;

fn nkeys(c: &Cfg) -> usize {
    c.sessions * c.own_keys + c.hot_keys + c.read_keys
}

/// Keys sessions write.
fn written_keys(c: &Cfg) -> usize {
    c.sessions * c.own_keys + c.hot_keys
}

/// Keys `0..own_keys*sessions` are the sessions' own, the rest hot.
fn key_space(c: &Cfg) -> Vec<Vec<u8>> {
    (0..nkeys(c)).map(key).collect()
}

/// Whether `got` may be what key `k` holds after a crash whose image was
/// built between the instants `before` and `tag`: writes acknowledged before
/// `before` must be there, writes started after `tag` cannot.
fn check_key(ws: &[W], got: &Option<Vec<u8>>, before: u64, tag: u64) -> Result<(), String> {
    let show = |v: &Option<Vec<u8>>| {
        v.as_ref()
            .map(|v| String::from_utf8_lossy(&v[..v.len().min(16)]).into_owned())
    };
    let mut cands = ws
        .iter()
        .filter(|w| w.start < tag && &w.val == got)
        .peekable();
    if cands.peek().is_none() {
        return Err(format!("reads {:?}, never written", show(got)));
    }
    let mut lost = None;
    for x in cands {
        match ws.iter().find(|y| y.ack < before && x.end < y.start) {
            None => return Ok(()),
            Some(y) => lost = Some(y),
        }
    }
    let y = lost.expect("a candidate");
    Err(format!(
        "reads {:?}, but {:?} was acknowledged at {} (image from {before} to {tag})",
        show(got),
        show(&y.val),
        y.ack
    ))
}

/// One session's batches of writes (and reads), each committed.
#[allow(clippy::too_many_arguments)]
fn session_work(
    c: &Cfg,
    store: &BulletStore,
    sim: &CrashSim,
    hist: &Mutex<Hist>,
    sid: usize,
    run: usize,
    seed: u64,
    batches: usize,
) {
    let mut s = store.session().unwrap();
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut out = Vec::new();
    let mut n = 0u64;
    // Writes of the detached commit not yet completed.
    let mut pending: Option<(engine::PendingCommit, Batch)> = None;
    for _ in 0..batches {
        let mut batch = Vec::new();
        for _ in 0..rng.random_range(1..=c.max_batch) {
            let k = if c.hot_keys > 0 && rng.random_range(0..1000) < c.hot_pm {
                c.sessions * c.own_keys + rng.random_range(0..c.hot_keys)
            } else {
                sid * c.own_keys + rng.random_range(0..c.own_keys)
            };
            let remove = c.removes && rng.random_range(0..10) == 0;
            n += 1;
            // Values name their run, session and write: never written twice.
            let val = (!remove).then(|| value(sid + 10 * run, n));
            let idx = {
                let mut h = hist.lock().unwrap();
                let ws = h.get_mut(&key(k)).unwrap();
                ws.push(W {
                    val: val.clone(),
                    start: sim.tick(),
                    end: u64::MAX,
                    ack: u64::MAX,
                });
                ws.len() - 1
            };
            match &val {
                Some(v) => s.apply(&key(k), Op::Put(v)).unwrap(),
                None => s.apply(&key(k), Op::Remove).unwrap(),
            };
            hist.lock().unwrap().get_mut(&key(k)).unwrap()[idx].end = sim.tick();
            batch.push((key(k), idx));
            if c.reads {
                for _ in 0..4 {
                    let other = if c.read_keys > 0 && rng.random_bool(0.8) {
                        written_keys(c) + rng.random_range(0..c.read_keys)
                    } else {
                        rng.random_range(0..written_keys(c))
                    };
                    s.get(&key(other), &mut out).unwrap();
                }
            }
        }
        // The previous detached commit completes after this batch's writes.
        if let Some((p, done)) = pending.take() {
            p.complete().unwrap();
            ack(sim, hist, &done);
        }
        if c.detached && rng.random_range(0..3) == 0 {
            if let Some(p) = s.commit_detached().unwrap() {
                pending = Some((p, batch));
                continue;
            }
        } else {
            s.commit().unwrap();
        }
        ack(sim, hist, &batch);
    }
    if let Some((p, done)) = pending.take() {
        p.complete().unwrap();
        ack(sim, hist, &done);
    }
}

fn ack(sim: &CrashSim, hist: &Mutex<Hist>, batch: &[(Vec<u8>, usize)]) {
    let t = sim.tick();
    let mut h = hist.lock().unwrap();
    for (k, i) in batch {
        h.get_mut(k).unwrap()[*i].ack = t;
    }
}

/// A history whose every key starts as `start` says (acknowledged at 0).
fn initial_hist(c: &Cfg, start: &BTreeMap<Vec<u8>, Vec<u8>>) -> Hist {
    key_space(c)
        .into_iter()
        .map(|k| {
            let val = start.get(&k).cloned();
            (
                k,
                vec![W {
                    val,
                    start: 0,
                    end: 0,
                    ack: 0,
                }],
            )
        })
        .collect()
}

/// Runs the sessions' workload on `store` (under `sim`), then takes a last
/// image; returns the images and the history.
fn workload(
    c: &Cfg,
    store: &BulletStore,
    sim: &Arc<CrashSim>,
    start: &BTreeMap<Vec<u8>, Vec<u8>>,
    run: usize,
    seed: u64,
    batches: usize,
) -> (Vec<CrashImage>, Hist) {
    let hist = Mutex::new(initial_hist(c, start));
    sim.tick();
    sim.set_capture_ppm(c.capture_ppm);
    std::thread::scope(|sc| {
        for sid in 0..c.sessions {
            let hist = &hist;
            sc.spawn(move || {
                session_work(
                    c,
                    store,
                    sim,
                    hist,
                    sid,
                    run,
                    seed * 31 + sid as u64,
                    batches,
                )
            });
        }
    });
    sim.set_capture_ppm(0);
    let mut images = sim.take_images();
    images.push(sim.capture_now(store.heap().region()));
    (images, hist.into_inner().unwrap())
}

/// Every key's value as the store reads it.
fn read_all(c: &Cfg, store: &BulletStore) -> BTreeMap<Vec<u8>, Vec<u8>> {
    let mut s = store.session().unwrap();
    let mut out = Vec::new();
    let mut m = BTreeMap::new();
    for k in key_space(c) {
        if s.get(&k, &mut out).unwrap() {
            m.insert(k, out.clone());
        }
    }
    m
}

/// The heap at `path` (closed cleanly) holds exactly the blocks its store owns.
fn no_leak(path: &Path) -> Result<(), String> {
    let rec = Heap::open(path, &check_o()).map_err(|e| format!("reopen: {e}"))?;
    let parts =
        BulletParts::attach(rec.heap(), rec.heap().root()).map_err(|e| format!("attach: {e}"))?;
    let (heap, _) =
        index::recover(rec, &parts.recoverables()).map_err(|e| format!("recover: {e}"))?;
    let mut owned = parts.pool_blocks();
    owned += parts.backend.verify(true)?.blocks;
    if let Some(side) = &parts.side {
        owned += side.verify(true)?.blocks;
    }
    let rep = pmem::check_heap(&heap);
    if !rep.ok() {
        return Err(format!("check_heap: {}", rep.problems.join("; ")));
    }
    if rep.blocks != owned {
        return Err(format!(
            "{} blocks allocated, the store owns {owned} (leak or lost block)",
            rep.blocks
        ));
    }
    Ok(())
}

struct Tally {
    images: u64,
    bad: u64,
    first: Vec<String>,
}

impl Tally {
    fn fail(&mut self, what: String) {
        self.bad += 1;
        if self.first.len() < 5 {
            eprintln!("{what}");
            self.first.push(what);
        }
    }
}

/// Recovers `img` at `path` and checks it against `hist`; returns the store
/// (open, under a power-loss simulator when `sim` is given) and what it holds.
fn check_image(
    c: &Cfg,
    path: &Path,
    img: &CrashImage,
    hist: &Hist,
    deep: bool,
    sim: Option<Arc<CrashSim>>,
) -> Result<(BulletStore, Values), String> {
    pmem::sim::write_image(path, &img.bytes).map_err(|e| e.to_string())?;
    let rec = match &sim {
        Some(s) => Heap::open_sim(path, &heap_o(), s.clone()),
        None => Heap::open(path, &check_o()),
    }
    .map_err(|e| format!("open: {e}"))?;
    let (store, _) = BulletStore::open(rec, &store_o(c)).map_err(|e| format!("recover: {e}"))?;
    let got = read_all(c, &store);
    for (k, ws) in hist {
        check_key(ws, &got.get(k).cloned(), img.tag_before, img.tag)
            .map_err(|e| format!("key {}: {e}", String::from_utf8_lossy(k)))?;
    }
    if deep {
        if !drain_within(&store, 30) {
            return Err("the drain did not finish".into());
        }
        store.verify().map_err(|e| format!("verify: {e}"))?;
    }
    Ok((store, got))
}

/// Creates the store at `path` (prefilled if the configuration says so).
fn create(c: &Cfg, path: &Path) -> BTreeMap<Vec<u8>, Vec<u8>> {
    let heap = Heap::create(path, &heap_o()).unwrap();
    let st = BulletStore::create(&heap, &store_o(c)).unwrap();
    let mut start = BTreeMap::new();
    if c.prefill {
        let mut s = st.session().unwrap();
        for k in key_space(c) {
            let v = value(99, k.len() as u64 + start.len() as u64);
            s.apply(&k, Op::Put(&v)).unwrap();
            start.insert(k, v);
        }
        s.commit().unwrap();
        drop(s);
        assert!(drain_within(&st, 30));
    }
    st.close().unwrap();
    start
}

fn run_cfg(c: &Cfg) -> Tally {
    let dir = tempfile::tempdir_in(shm_dir()).unwrap();
    let img_path = dir.path().join("image");
    let img2_path = dir.path().join("image2");
    let mut t = Tally {
        images: 0,
        bad: 0,
        first: Vec::new(),
    };
    let started = Instant::now();
    let first_seed: u64 = std::env::var("EMBER_POWER_LOSS_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    let mut seed = first_seed;
    while t.images < c.images {
        let path = dir.path().join(format!("run{seed}"));
        let start = create(c, &path);
        let sim = Arc::new(CrashSim::power_loss(seed, 0));
        if c.torn {
            sim.set_tear(1.0, 1.0);
        }
        let rec = Heap::open_sim(&path, &heap_o(), sim.clone()).unwrap();
        let (store, _) = BulletStore::open(rec, &store_o(c)).unwrap();
        if c.warm {
            read_all(c, &store);
        }
        let (images, hist) = workload(c, &store, &sim, &start, 1, seed, c.batches);
        // The last image is the quiescent one (every session committed).
        let last = images.len() - 1;
        store.close().unwrap();
        drop(store);
        let _ = std::fs::remove_file(&path);
        for (n, img) in images.iter().enumerate() {
            t.images += 1;
            let deep = t.images.is_multiple_of(4);
            let double = c.double_every > 0
                && t.images.is_multiple_of(c.double_every)
                && (!c.quiescent_first || n == last);
            let sim2 = double.then(|| Arc::new(CrashSim::power_loss(seed * 1000 + n as u64, 0)));
            let what = format!(
                "{} seed {seed} image {n} (tag {}, fence {})",
                c.name, img.tag, img.fence
            );
            match check_image(c, &img_path, img, &hist, deep && !double, sim2.clone()) {
                Err(e) => t.fail(format!("{what}: {e}")),
                Ok((store, got)) => {
                    if let Some(sim2) = sim2 {
                        let r = second_crash(c, &store, &sim2, &got, seed + n as u64, &img2_path);
                        drop(store);
                        match r {
                            Ok(k) => t.images += k,
                            Err(e) => t.fail(format!("{what}, second crash {e}")),
                        }
                    } else {
                        let closed = store.close().map_err(|e| format!("close: {e}"));
                        drop(store);
                        if deep {
                            if let Err(e) = closed.and_then(|()| no_leak(&img_path)) {
                                t.fail(format!("{what}: {e}"));
                            }
                        }
                    }
                }
            }
        }
        seed += 1;
    }
    use std::io::Write;
    let _ = writeln!(
        std::io::stderr(),
        "power-loss-sim: {} images, {} inconsistent (engine {}: seeds {first_seed}..{seed}, {:.1} s)",
        t.images,
        t.bad,
        c.name,
        started.elapsed().as_secs_f64()
    );
    t
}

/// Recovered `store` (under `sim`, holding `got`): a short workload, then its
/// images recovered and checked. Returns the images checked.
fn second_crash(
    c: &Cfg,
    store: &BulletStore,
    sim: &Arc<CrashSim>,
    got: &BTreeMap<Vec<u8>, Vec<u8>>,
    seed: u64,
    path: &Path,
) -> Result<u64, String> {
    // One session writing session 0's keys (and the hot ones): a few records
    // at the recovered tails.
    let c2 = Cfg {
        sessions: 1,
        removes: false,
        max_batch: c.second.1,
        ..*c
    };
    let batches = 1 + (seed as usize % c.second.0);
    let mut start = got.clone();
    let (images, mut hist) = workload(&c2, store, sim, &start, 2, seed, batches);
    // Keys the second run does not write keep their recovered values.
    for k in key_space(c) {
        hist.entry(k.clone()).or_insert_with(|| {
            vec![W {
                val: start.remove(&k),
                start: 0,
                end: 0,
                ack: 0,
            }]
        });
    }
    let mut n = 0;
    for img in &images {
        n += 1;
        let (st, _) = check_image(c, path, img, &hist, false, None)
            .map_err(|e| format!("(tag {}): {e}", img.tag))?;
        let _ = st.close();
    }
    Ok(n)
}

fn run(c: Cfg) {
    let t = run_cfg(&c);
    assert_eq!(t.bad, 0, "{}: {:?}", c.name, t.first);
}

/// Runs in which nothing fences on a writer's thread between its appends and
/// its commit (the fence hazard below cannot arise). Each session writes keys of its own,
/// all present and in the frontend before the sessions start (a write that
/// misses the frontend reads the backend, where it may persist a link the
/// gleaner left dirty: a fence), into logs larger than the run writes (no
/// waits for space, no hand-over), and commits on its own thread.
const CLEAN: Cfg = Cfg {
    prefill: true,
    warm: true,
    removes: false,
    ..BASE
};

#[test]
fn group_commit_own_keys() {
    run(Cfg {
        name: "full-logfree own keys",
        images: 2_000,
        ..CLEAN
    });
}

#[test]
fn group_commit_phash_dyn() {
    run(Cfg {
        name: "dyn-phash own keys",
        variant: Variant::Dyn,
        backend: BackendKind::PHash,
        images: 1_000,
        ..CLEAN
    });
}

#[test]
fn double_crash_after_a_commit() {
    run(Cfg {
        name: "full-logfree double crash",
        double_every: 1,
        quiescent_first: true,
        images: 1_000,
        ..CLEAN
    });
}

// Fence before commit: a fence between a record's append and its commit (on
// the writer's thread) must not sync its pages before the commit writes them.

#[test]
fn cross_log_hot_keys() {
    run(Cfg {
        name: "full-logfree hot keys",
        detached: true,
        hot_keys: 3,
        hot_pm: 300,
        images: 500,
        ..BASE
    });
}

#[test]
fn opt_own_keys() {
    // Keys of their own: the fence hazard can lose an acknowledged record here
    // too, in some runs.
    run(Cfg {
        name: "opt-logfree own keys",
        variant: Variant::Opt,
        detached: true,
        images: 700,
        ..BASE
    });
}

#[test]
fn pipelined_detached_commits() {
    run(Cfg {
        name: "full-logfree detached commits",
        detached: true,
        images: 500,
        ..BASE
    });
}

#[test]
fn log_handover_small_logs() {
    // 8 KiB logs: writers fill them, wait for space (syncing every log, their
    // own uncommitted records included) and move to other writers' logs.
    run(Cfg {
        name: "full-logfree small logs",
        detached: true,
        log_size: 8 << 10,
        images: 500,
        ..BASE
    });
    run(Cfg {
        name: "opt-logfree small logs",
        detached: true,
        variant: Variant::Opt,
        log_size: 8 << 10,
        images: 300,
        ..BASE
    });
}

#[test]
fn writers_wait_at_a_backlog_bound() {
    // A 16 KiB backlog bound over 4 logs of 64 KiB (4 KiB each): writers
    // keep finding their log at its share, hop to others, and wait for the
    // gleaner role or glean themselves (syncing every log first, their own
    // uncommitted records included); power fails anywhere in that.
    run(Cfg {
        name: "full-logfree backlog bound",
        detached: true,
        backlog: 16 << 10,
        images: 500,
        ..BASE
    });
}

#[test]
fn backend_reads_after_a_restart() {
    run(Cfg {
        name: "full-logfree backend reads",
        reads: true,
        read_keys: 600,
        prefill: true,
        images: 500,
        ..BASE
    });
}

#[test]
fn ablation_variants() {
    for (name, variant) in [("st", Variant::St), ("lfr", Variant::Lfr)] {
        let backend = if variant == Variant::St {
            BackendKind::PHash
        } else {
            BackendKind::LogFree
        };
        run(Cfg {
            name,
            variant,
            backend,
            hot_keys: 2,
            hot_pm: 200,
            detached: true,
            images: 300,
            ..BASE
        });
    }
}

// Reused positions: positions are reused after a crash; a record kept behind a lost one is
// replayed after the next crash when a new record ends where it starts.

#[test]
fn double_crash_any_image() {
    run(Cfg {
        name: "full-logfree double crash (any first image)",
        detached: true,
        double_every: 1,
        quiescent_first: false,
        removes: false,
        sessions: 1,
        logs: 1,
        // The second run writes one record: at the first lost one's place,
        // ending where the next, kept, one starts.
        second: (1, 1),
        torn: true,
        images: 600,
        ..BASE
    });
}

/// A remove of a key whose frontend entry is a tombstone written by another
/// session and not yet committed writes no record (`Outcome::Removed(false)`),
/// yet its acknowledgement says the key is gone: the tombstone it read must be
/// durable when the remover's commit returns, as an older record in another
/// writer's log is before a put's record (`make_durable`). The image holds
/// only what was synced (every page written since its sync is old).
#[test]
fn a_remove_that_finds_an_uncommitted_tombstone_makes_it_durable() {
    let c = Cfg {
        name: "remove of an uncommitted tombstone",
        ..BASE
    };
    let dir = tempfile::tempdir_in(shm_dir()).unwrap();
    let path = dir.path().join("heap");
    let img_path = dir.path().join("image");
    create(&c, &path);
    let sim = Arc::new(CrashSim::power_loss(1, 0));
    sim.set_tear(0.0, 0.0);
    let rec = Heap::open_sim(&path, &heap_o(), sim.clone()).unwrap();
    let (store, _) = BulletStore::open(rec, &store_o(&c)).unwrap();
    let (mut a, mut b) = (store.session().unwrap(), store.session().unwrap());
    let v = value(0, 1);
    a.apply(b"hot", Op::Put(&v)).unwrap();
    a.commit().unwrap();
    // b writes a key of its own first: it holds a log other than a's.
    b.apply(b"own", Op::Put(&value(1, 1))).unwrap();
    b.commit().unwrap();
    // a's tombstone stays uncommitted; b's remove finds the key gone.
    a.apply(b"hot", Op::Remove).unwrap();
    b.apply(b"hot", Op::Remove).unwrap();
    b.commit().unwrap();
    // Power lost now: b's remove was acknowledged, a's commit never ran.
    let img = sim.capture_now(store.heap().region());
    drop((a, b));
    store.close().unwrap();
    drop(store);
    pmem::sim::write_image(&img_path, &img.bytes).unwrap();
    let rec = Heap::open(&img_path, &check_o()).unwrap();
    let (store, _) = BulletStore::open(rec, &store_o(&c)).unwrap();
    let mut s = store.session().unwrap();
    let mut out = Vec::new();
    assert!(s.get(b"own", &mut out).unwrap(), "b's committed put lost");
    assert!(
        !s.get(b"hot", &mut out).unwrap(),
        "an acknowledged remove lost: reads {:?}",
        String::from_utf8_lossy(&out[..16])
    );
    drop(s);
    store.close().unwrap();
}
