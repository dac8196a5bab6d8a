//! Cursor scans of every store ([`engine::Session::scan`], Redis's `SCAN`).
//!
//! - Exact key sets at rest, with every count, after draining, after a restart,
//!   and after updates made since the restart (Bullet's merge of frontend and
//!   backend: a reopened Bullet frontend is not complete, so its backend is read).
//! - Bullet's tiers, set up deterministically (1-hour epochs, a dynamic variant
//!   whose sessions never glean, a log that never fills): keys only in the
//!   backend, keys only in the frontend (not yet gleaned), keys removed in the
//!   frontend whose backend copy is still there, keys in both.
//! - Scans while other threads update other keys (the frontend doubles, the
//!   log-free backend grows, tiny logs make writers glean): every key present
//!   throughout is returned, nothing never written is.
//! - Crash images: after recovery, the scan agrees with `get`.
//!
//! Every step is checked: its keys lie in `[cursor, next)` of split-order
//! positions, and the cursor grows until 0.

mod common;

use common::*;
use engine::bullet::{BulletOptions, BulletStore, Variant};
use engine::direct::{BackendKind, DirectStore};
use engine::volatile::VolatileStore;
use engine::{KeyHasher, Op, Session, Store};
use index::{scan_pos, Index, Ops};
use pmem::{CrashSim, Heap, HeapOptions, Strategy};
use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};
use std::collections::{BTreeSet, HashSet};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

const TINY_LOG: u64 = 4096;
const BIG_LOG: u64 = 8 << 20;

/// A store configuration: the kind, Bullet's log size, bounded frontend and epoch.
#[derive(Clone, Copy, Debug)]
struct Cfg {
    kind: Kind,
    log: u64,
    cache: u64,
    epoch: Duration,
}

impl Cfg {
    fn new(kind: Kind) -> Cfg {
        Cfg {
            kind,
            log: BIG_LOG,
            cache: 0,
            epoch: Duration::from_millis(1),
        }
    }

    fn log(self, log: u64) -> Cfg {
        Cfg { log, ..self }
    }

    fn cache(self, cache: u64) -> Cfg {
        Cfg { cache, ..self }
    }

    fn epoch(self, epoch: Duration) -> Cfg {
        Cfg { epoch, ..self }
    }

    fn name(&self) -> String {
        format!(
            "{} log {} cache {} epoch {:?}",
            self.kind.name(),
            self.log,
            self.cache,
            self.epoch
        )
    }

    fn persistent(&self) -> bool {
        self.kind != Kind::Volatile
    }

    fn bullet_opts(&self) -> BulletOptions {
        let Kind::Bullet(v, b) = self.kind else {
            panic!("not Bullet")
        };
        BulletOptions {
            cache_entries: self.cache,
            epoch: self.epoch,
            ..bullet_opts(v, b, self.log)
        }
    }

    fn create(&self, heap: &Heap) -> AnyStore {
        match self.kind {
            Kind::Bullet(..) => {
                AnyStore::Bullet(BulletStore::create(heap, &self.bullet_opts()).unwrap())
            }
            Kind::Volatile => AnyStore::Volatile(VolatileStore::new(16)),
            k => create(k, heap, self.log).unwrap(),
        }
    }

    fn reopen(&self, path: &Path) -> (AnyStore, Heap) {
        let rec = Heap::open(path, &opts()).unwrap();
        match self.kind {
            Kind::Bullet(..) => {
                let (s, _) = BulletStore::open(rec, &self.bullet_opts()).unwrap();
                let h = s.heap().clone();
                (AnyStore::Bullet(s), h)
            }
            Kind::BulletGroup(..) => open(self.kind, rec, self.log).unwrap(),
            Kind::Direct(_) => {
                let (s, _) = DirectStore::open(rec).unwrap();
                let h = s.heap().clone();
                (AnyStore::Direct(s), h)
            }
            Kind::Volatile => panic!("nothing to reopen"),
        }
    }
}

/// Every store the scan must work on.
fn configs() -> Vec<Cfg> {
    vec![
        Cfg::new(Kind::Volatile),
        Cfg::new(Kind::Direct(BackendKind::LogFree)),
        Cfg::new(Kind::Direct(BackendKind::PHash)),
        Cfg::new(Kind::Bullet(Variant::Full, BackendKind::LogFree)),
        Cfg::new(Kind::Bullet(Variant::Full, BackendKind::PHash)),
        // Tiny logs: writers glean when their log is full.
        Cfg::new(Kind::Bullet(Variant::Full, BackendKind::LogFree)).log(TINY_LOG),
        Cfg::new(Kind::Bullet(Variant::St, BackendKind::PHash)).log(TINY_LOG),
        // A bounded frontend: evictions, so the backend is scanned too.
        Cfg::new(Kind::Bullet(Variant::Full, BackendKind::LogFree))
            .log(TINY_LOG)
            .cache(64),
        Cfg::new(Kind::Bullet(Variant::Opt, BackendKind::PHash))
            .log(TINY_LOG)
            .cache(64),
    ]
}

fn opts() -> HeapOptions {
    heap_opts(32 << 20, 1 << 30, Strategy::FenceOnly)
}

fn key(i: u64) -> Vec<u8> {
    format!("key:{i}").into_bytes()
}

fn key_id(k: &[u8]) -> u64 {
    std::str::from_utf8(&k[4..]).unwrap().parse().unwrap()
}

fn pos(h: KeyHasher, k: &[u8]) -> u64 {
    scan_pos(h.hash(k))
}

/// A full scan from cursor 0 with `count`, each step checked (keys within
/// `[cursor, next)`, progress). Returns every key returned, repetitions included.
fn full_scan(s: &mut dyn Session, h: KeyHasher, count: usize) -> Vec<Vec<u8>> {
    let mut all = Vec::new();
    let mut cursor = 0u64;
    let mut steps = 0u64;
    loop {
        let mut out = Vec::new();
        let next = s.scan(cursor, count, &mut out).unwrap();
        for k in &out {
            let p = pos(h, k);
            assert!(
                p >= cursor && (next == 0 || p < next),
                "key {:?} at {p:#x} outside the step [{cursor:#x}, {next:#x})",
                String::from_utf8_lossy(k)
            );
        }
        all.extend(out);
        if next == 0 {
            return all;
        }
        assert!(next > cursor, "no progress: {cursor:#x} -> {next:#x}");
        cursor = next;
        steps += 1;
        assert!(steps < 10_000_000, "the scan does not end");
    }
}

/// At rest: every count gives exactly the model's keys, each once.
fn check_exact(s: &mut dyn Session, h: KeyHasher, model: &BTreeSet<u64>, what: &str) {
    for count in [1usize, 7, 100, 1 << 20] {
        let keys = full_scan(s, h, count);
        let got: BTreeSet<u64> = keys.iter().map(|k| key_id(k)).collect();
        if got != *model {
            let missing: Vec<_> = model.difference(&got).take(10).collect();
            let extra: Vec<_> = got.difference(model).take(10).collect();
            panic!(
                "{what} count {count}: {} keys, model {}; missing {missing:?}, extra {extra:?}",
                got.len(),
                model.len()
            );
        }
        assert_eq!(keys.len(), model.len(), "{what} count {count}: duplicates");
    }
}

/// Random puts, removes and increments on `space` keys.
fn churn(
    s: &mut dyn Session,
    rng: &mut SmallRng,
    model: &mut BTreeSet<u64>,
    space: std::ops::Range<u64>,
    n: usize,
) {
    for _ in 0..n {
        let _ = s.maintain().unwrap();
        let i = rng.random_range(space.clone());
        match rng.random_range(0..20u32) {
            0..=11 => {
                let v = rng.random_range(0..1000u32).to_string();
                s.apply(&key(i), Op::Put(v.as_bytes())).unwrap();
                model.insert(i);
            }
            12..=16 => {
                s.apply(&key(i), Op::Remove).unwrap();
                model.remove(&i);
            }
            _ => {
                s.apply(&key(i), Op::Incr(3)).unwrap();
                model.insert(i);
            }
        }
    }
}

#[test]
fn exact_key_sets() {
    for cfg in configs() {
        let what = cfg.name();
        let dir = tempfile::tempdir_in(shm_dir()).unwrap();
        let path = dir.path().join("s.heap");
        let heap = Heap::create(&path, &opts()).unwrap();
        let store = cfg.create(&heap);
        let mut s = store.session();
        let mut model = BTreeSet::new();
        check_exact(&mut *s, store.hasher(), &model, &format!("{what}: empty"));
        let mut rng = SmallRng::seed_from_u64(5);
        churn(&mut *s, &mut rng, &mut model, 0..3000, 4000);
        check_exact(
            &mut *s,
            store.hasher(),
            &model,
            &format!("{what}: after 4000 ops"),
        );
        churn(&mut *s, &mut rng, &mut model, 0..3000, 4000);
        check_exact(
            &mut *s,
            store.hasher(),
            &model,
            &format!("{what}: after 8000 ops"),
        );
        if let Some(b) = store.bullet() {
            let st = b.stats();
            if cfg.log == TINY_LOG {
                assert!(st.records_applied > 0, "{what}: nothing gleaned: {st:?}");
            }
            if cfg.cache > 0 {
                assert!(st.evictions > 0, "{what}: nothing evicted: {st:?}");
            }
            b.drain().unwrap();
            check_exact(&mut *s, store.hasher(), &model, &format!("{what}: drained"));
        }
        if !cfg.persistent() {
            continue;
        }
        drop(s);
        store.close().unwrap();
        drop(store);
        drop(heap);
        let (store, heap) = cfg.reopen(&path);
        let mut s = store.session();
        check_exact(
            &mut *s,
            store.hasher(),
            &model,
            &format!("{what}: reopened"),
        );
        churn(&mut *s, &mut rng, &mut model, 0..4000, 3000);
        check_exact(
            &mut *s,
            store.hasher(),
            &model,
            &format!("{what}: reopened, updated"),
        );
        drop(s);
        store.close().unwrap();
        drop(store);
        drop(heap);
    }
}

/// Bullet's tiers, deterministically: after a drain and a restart the backend
/// holds every key and the frontend none; with no gleaning from then on, removes
/// leave frontend tombstones over backend keys, new keys live only in the
/// frontend, updated keys are in both.
#[test]
fn bullet_tiers() {
    for b in [BackendKind::LogFree, BackendKind::PHash] {
        // Full is dynamic: no gleaner thread, and sessions glean only in
        // `maintain` (never called here) or when their log is full (never: 8 MiB).
        // The advancer sleeps through its one-hour epoch.
        let cfg = Cfg::new(Kind::Bullet(Variant::Full, b)).epoch(Duration::from_secs(3600));
        let what = cfg.name();
        let dir = tempfile::tempdir_in(shm_dir()).unwrap();
        let path = dir.path().join("t.heap");
        {
            let heap = Heap::create(&path, &opts()).unwrap();
            let store = cfg.create(&heap);
            let mut s = store.session();
            for i in 0..1000 {
                s.apply(&key(i), Op::Put(b"old")).unwrap();
            }
            drop(s);
            store.bullet().unwrap().drain().unwrap();
            store.close().unwrap();
        }
        let (store, heap) = cfg.reopen(&path);
        let bs = store.bullet().unwrap();
        assert_eq!(bs.stats().frontend_entries, 0, "{what}");
        let mut s = store.session();
        let mut model: BTreeSet<u64> = (0..1000).collect();
        check_exact(
            &mut *s,
            store.hasher(),
            &model,
            &format!("{what}: backend only"),
        );
        for i in 0..200 {
            s.apply(&key(i), Op::Remove).unwrap();
            model.remove(&i);
        }
        for i in 1000..1300 {
            s.apply(&key(i), Op::Put(b"new")).unwrap();
            model.insert(i);
        }
        for i in 500..600 {
            s.apply(&key(i), Op::Put(b"newer")).unwrap();
        }
        // The tiers are as intended: nothing was gleaned.
        {
            let mut bh = bs.backend().handle().unwrap();
            let mut out = Vec::new();
            assert!(bh.get(&key(0), &mut out).unwrap(), "{what}: key 0 gleaned");
            assert!(
                bh.get(&key(199), &mut out).unwrap(),
                "{what}: key 199 gleaned"
            );
            assert!(
                !bh.get(&key(1000), &mut out).unwrap(),
                "{what}: key 1000 gleaned"
            );
            let mut back = Vec::new();
            let mut c = 0;
            loop {
                c = bh.scan(c, 1000, &mut back).unwrap();
                if c == 0 {
                    break;
                }
            }
            assert_eq!(back.len(), 1000, "{what}: backend keys");
            let mut g = Vec::new();
            assert!(!s.get(&key(0), &mut g).unwrap());
            assert!(s.get(&key(1000), &mut g).unwrap());
        }
        assert_eq!(bs.stats().frontend_entries, 200 + 300 + 100, "{what}");
        check_exact(
            &mut *s,
            store.hasher(),
            &model,
            &format!("{what}: three tiers"),
        );
        // Steps from arbitrary cursors cover exactly the keys at or past them.
        let mut rng = SmallRng::seed_from_u64(9);
        for _ in 0..20 {
            let start: u64 = rng.random();
            let mut got = BTreeSet::new();
            let mut c = start;
            loop {
                let mut out = Vec::new();
                c = s.scan(c, 5, &mut out).unwrap();
                got.extend(out.iter().map(|k| key_id(k)));
                if c == 0 {
                    break;
                }
            }
            let want: BTreeSet<u64> = model
                .iter()
                .copied()
                .filter(|&i| pos(store.hasher(), &key(i)) >= start)
                .collect();
            assert_eq!(got, want, "{what}: from {start:#x}");
        }
        bs.drain().unwrap();
        check_exact(&mut *s, store.hasher(), &model, &format!("{what}: drained"));
        drop(s);
        store.close().unwrap();
        drop(store);
        drop(heap);
    }
}

/// One thread scans while two others update other keys: every full scan returns
/// every stable key, and only keys that were written.
#[test]
fn scan_during_updates() {
    const STABLE: u64 = 1000;
    const SPACE: u64 = 5000;
    const OPS: usize = 20_000;
    for cfg in configs() {
        let what = cfg.name();
        let dir = tempfile::tempdir_in(shm_dir()).unwrap();
        let path = dir.path().join("c.heap");
        let heap = Heap::create(&path, &opts()).unwrap();
        let store = cfg.create(&heap);
        {
            let mut s = store.session();
            for i in 0..STABLE {
                s.apply(&key(i), Op::Put(b"stable")).unwrap();
            }
        }
        let done = AtomicBool::new(false);
        let mut rounds = 0;
        std::thread::scope(|sc| {
            let writers: Vec<_> = (0..2u64)
                .map(|w| {
                    let store = &store;
                    sc.spawn(move || {
                        let mut s = store.session();
                        let mut rng = SmallRng::seed_from_u64(100 + w);
                        let mut model = BTreeSet::new();
                        // Writer w's keys: STABLE + 2j + w.
                        for _ in 0..OPS {
                            let j = rng.random_range(0..(SPACE - STABLE) / 2);
                            let i = STABLE + 2 * j + w;
                            let _ = s.maintain().unwrap();
                            if rng.random_range(0..3u32) == 0 {
                                s.apply(&key(i), Op::Remove).unwrap();
                                model.remove(&i);
                            } else {
                                s.apply(&key(i), Op::Put(b"churn")).unwrap();
                                model.insert(i);
                            }
                        }
                        model
                    })
                })
                .collect();
            let mut s = store.session();
            while !writers.iter().all(|w| w.is_finished()) || rounds < 3 {
                let count = [1usize, 4, 16, 64][rounds % 4];
                let keys = full_scan(&mut *s, store.hasher(), count);
                let got: HashSet<u64> = keys.iter().map(|k| key_id(k)).collect();
                let missing: Vec<_> = (0..STABLE).filter(|i| !got.contains(i)).collect();
                assert!(
                    missing.is_empty(),
                    "{what}: round {rounds} (count {count}) missed stable keys {:?}",
                    &missing[..missing.len().min(10)]
                );
                assert!(got.iter().all(|&i| i < SPACE), "{what}: invented keys");
                rounds += 1;
            }
            done.store(true, Ordering::Release);
            let mut model: BTreeSet<u64> = (0..STABLE).collect();
            for w in writers {
                model.extend(w.join().unwrap());
            }
            check_exact(&mut *s, store.hasher(), &model, &format!("{what}: at rest"));
        });
        assert!(done.load(Ordering::Acquire));
        assert!(rounds >= 3, "{what}: {rounds} rounds");
        eprintln!("{what}: {rounds} full scans during the updates");
        store.close().unwrap();
        drop(store);
        drop(heap);
    }
}

/// Crash images taken while a session updates: after recovery, a scan returns
/// exactly the keys `get` finds (Bullet: the replayed frontend merged with the
/// backend).
#[test]
fn scan_after_crash_recovery() {
    const SPACE: u64 = 600;
    for kind in [
        Kind::Direct(BackendKind::LogFree),
        Kind::Direct(BackendKind::PHash),
        Kind::Bullet(Variant::Full, BackendKind::LogFree),
        Kind::Bullet(Variant::Full, BackendKind::PHash),
        Kind::Bullet(Variant::St, BackendKind::PHash),
    ] {
        let dir = tempfile::tempdir_in(shm_dir()).unwrap();
        let path = dir.path().join("c.heap");
        {
            let heap = Heap::create(&path, &sim_opts()).unwrap();
            create(kind, &heap, TINY_LOG).unwrap().close().unwrap();
        }
        let sim = Arc::new(CrashSim::new(kind.name().len() as u64, 0));
        let (store, heap, _) = open_sim(kind, &path, sim.clone(), TINY_LOG).unwrap();
        let mut images = Vec::new();
        {
            let mut s = store.session();
            let mut rng = SmallRng::seed_from_u64(1);
            let mut model = BTreeSet::new();
            for round in 0..4 {
                churn(&mut *s, &mut rng, &mut model, 0..SPACE, 1500);
                images.push(sim.capture_now(heap.region()));
                if round == 1 {
                    check_exact(&mut *s, store.hasher(), &model, &kind.name());
                }
            }
        }
        store.close().unwrap();
        drop(store);
        drop(heap);
        for (n, img) in images.iter().enumerate() {
            let what = format!("{}: image {n}", kind.name());
            let p = dir.path().join(format!("img{n}.heap"));
            pmem::sim::write_image(&p, &img.bytes).unwrap();
            let (store, heap, clean) =
                open_sim(kind, &p, Arc::new(CrashSim::new(3, 0)), TINY_LOG).unwrap();
            assert!(!clean, "{what}");
            let mut s = store.session();
            let mut out = Vec::new();
            let present: BTreeSet<u64> = (0..SPACE)
                .filter(|&i| s.get(&key(i), &mut out).unwrap())
                .collect();
            assert!(!present.is_empty(), "{what}");
            check_exact(&mut *s, store.hasher(), &present, &what);
            if let Some(b) = store.bullet() {
                b.drain().unwrap();
                check_exact(
                    &mut *s,
                    store.hasher(),
                    &present,
                    &format!("{what}: drained"),
                );
            }
            drop(s);
            store.close().unwrap();
            drop(store);
            drop(heap);
            let _ = std::fs::remove_file(&p);
        }
    }
}
