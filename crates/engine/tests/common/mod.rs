//! Shared helpers of the engine tests: which store, opened how.
#![allow(dead_code)]

use engine::bullet::{BulletOptions, BulletStore, Variant};
use engine::direct::{BackendKind, BackendOptions, DirectStore};
use engine::volatile::VolatileStore;
use engine::{Session, Store};
use pmem::{CrashSim, Geometry, Heap, HeapOptions, Recovery, Strategy};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

/// The store (and configuration) under test.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Volatile,
    Direct(BackendKind),
    Bullet(Variant, BackendKind),
    /// Bullet with group commit (`apply` defers its fence to `commit`) and a
    /// background thread for the dynamic gleaner roles, as the server's msync mode.
    BulletGroup(Variant, BackendKind),
}

impl Kind {
    pub const PERSISTENT: [Kind; 7] = [
        Kind::Direct(BackendKind::LogFree),
        Kind::Direct(BackendKind::PHash),
        Kind::Bullet(Variant::Full, BackendKind::LogFree),
        Kind::Bullet(Variant::Full, BackendKind::PHash),
        Kind::Bullet(Variant::Dyn, BackendKind::LogFree),
        Kind::Bullet(Variant::St, BackendKind::PHash),
        Kind::Bullet(Variant::Opt, BackendKind::LogFree),
    ];

    pub fn name(self) -> String {
        match self {
            Kind::Volatile => "volatile".into(),
            Kind::Direct(b) => format!("direct-{}", b.name()),
            Kind::Bullet(v, b) => format!("bullet-{}-{}", v.name(), b.name()),
            Kind::BulletGroup(v, b) => format!("bullet-{}-{}-group-commit", v.name(), b.name()),
        }
    }
}

/// Small logs, so that wrap-around, log switching and full logs happen often.
pub fn bullet_opts(v: Variant, b: BackendKind, log_size: u64) -> BulletOptions {
    BulletOptions {
        variant: v,
        logs: 4,
        log_size,
        backend: BackendOptions {
            kind: b,
            buckets: 64,
            link_cache: true,
        },
        frontend_buckets: 16,
        cache_entries: 0,
        epoch: Duration::from_millis(1),
        static_gleaners: 1,
        group_commit: false,
        role_threads: 0,
        preallocate_logs: true,
        // Recovery on two threads whenever there are records to share: every
        // crash and restart test runs that path.
        parallel_replay_from: 2,
        backlog_limit: 0,
    }
}

pub fn heap_opts(size: u64, max_size: u64, strategy: Strategy) -> HeapOptions {
    HeapOptions {
        size,
        max_size,
        reserve: max_size.max(size),
        geometry: Geometry {
            nslots: 16,
            ..Geometry::small()
        },
        strategy,
        ..Default::default()
    }
}

pub fn sim_opts() -> HeapOptions {
    heap_opts(4 << 20, 32 << 20, Strategy::FenceOnly)
}

/// A directory in memory when there is one (images are written often).
pub fn shm_dir() -> std::path::PathBuf {
    let d = Path::new("/dev/shm");
    if d.is_dir() {
        d.to_path_buf()
    } else {
        std::env::temp_dir()
    }
}

/// A store of any kind, type-erased for tests.
pub enum AnyStore {
    Volatile(VolatileStore),
    Direct(DirectStore),
    Bullet(BulletStore),
}

impl AnyStore {
    pub fn session(&self) -> Box<dyn Session> {
        match self {
            AnyStore::Volatile(s) => Box::new(s.session().unwrap()),
            AnyStore::Direct(s) => Box::new(s.session().unwrap()),
            AnyStore::Bullet(s) => Box::new(s.session().unwrap()),
        }
    }

    pub fn close(&self) -> engine::Result<()> {
        match self {
            AnyStore::Volatile(s) => s.close(),
            AnyStore::Direct(s) => s.close(),
            AnyStore::Bullet(s) => s.close(),
        }
    }

    /// The key hash ordering the store's scan.
    #[allow(dead_code)] // not every test file scans
    pub fn hasher(&self) -> engine::KeyHasher {
        match self {
            AnyStore::Volatile(s) => s.key_hasher(),
            AnyStore::Direct(s) => s.key_hasher(),
            AnyStore::Bullet(s) => s.key_hasher(),
        }
    }

    pub fn bullet(&self) -> Option<&BulletStore> {
        match self {
            AnyStore::Bullet(s) => Some(s),
            _ => None,
        }
    }
}

pub fn create(kind: Kind, heap: &Heap, log_size: u64) -> engine::Result<AnyStore> {
    Ok(match kind {
        Kind::Volatile => AnyStore::Volatile(VolatileStore::new(16)),
        Kind::Direct(b) => AnyStore::Direct(DirectStore::create(
            heap,
            &BackendOptions {
                kind: b,
                buckets: 64,
                link_cache: true,
            },
        )?),
        Kind::Bullet(v, b) => {
            AnyStore::Bullet(BulletStore::create(heap, &bullet_opts(v, b, log_size))?)
        }
        Kind::BulletGroup(v, b) => AnyStore::Bullet(BulletStore::create(
            heap,
            &BulletOptions {
                group_commit: true,
                // As `ember serve --durability msync` runs it: a background
                // thread takes the dynamic gleaner roles.
                role_threads: 1,
                ..bullet_opts(v, b, log_size)
            },
        )?),
    })
}

/// Opens the store of a recovering heap; returns it and the heap.
pub fn open(kind: Kind, rec: Recovery, log_size: u64) -> engine::Result<(AnyStore, Heap)> {
    Ok(match kind {
        Kind::Volatile => panic!("a volatile store has nothing to open"),
        Kind::Direct(_) => {
            let (s, _) = DirectStore::open(rec)?;
            let h = s.heap().clone();
            (AnyStore::Direct(s), h)
        }
        Kind::Bullet(v, b) => {
            let (s, _) = BulletStore::open(rec, &bullet_opts(v, b, log_size))?;
            let h = s.heap().clone();
            (AnyStore::Bullet(s), h)
        }
        Kind::BulletGroup(v, b) => {
            let o = BulletOptions {
                group_commit: true,
                // As `ember serve --durability msync` runs it: a background
                // thread takes the dynamic gleaner roles.
                role_threads: 1,
                ..bullet_opts(v, b, log_size)
            };
            let (s, _) = BulletStore::open(rec, &o)?;
            let h = s.heap().clone();
            (AnyStore::Bullet(s), h)
        }
    })
}

pub fn open_sim(
    kind: Kind,
    path: &Path,
    sim: Arc<CrashSim>,
    log_size: u64,
) -> engine::Result<(AnyStore, Heap, bool)> {
    let rec = Heap::open_sim(path, &sim_opts(), sim)?;
    let clean = rec.report().was_clean;
    let (s, h) = open(kind, rec, log_size)?;
    Ok((s, h, clean))
}

/// Drains `st` on another thread; true when the drain succeeded within
/// `secs` seconds (a drain that never ends fails the caller's assertion rather
/// than hanging the test).
pub fn drain_within(st: &BulletStore, secs: u64) -> bool {
    let st2 = st.clone();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(st2.drain().is_ok());
    });
    rx.recv_timeout(Duration::from_secs(secs)) == Ok(true)
}

/// Opens the Bullet store at `path` under a crash simulator seeded `seed`.
pub fn open_bullet_under_sim(
    path: &Path,
    o: &BulletOptions,
    seed: u64,
) -> (BulletStore, Arc<CrashSim>) {
    let sim = Arc::new(CrashSim::new(seed, 0));
    let rec = Heap::open_sim(path, &sim_opts(), sim.clone()).unwrap();
    (BulletStore::open(rec, o).unwrap().0, sim)
}

/// Writes crash image `bytes` to `path` and recovers the Bullet store it
/// holds, under a simulator seeded `seed`.
pub fn recover_bullet(
    path: &Path,
    bytes: &[u8],
    o: &BulletOptions,
    seed: u64,
) -> (BulletStore, Arc<CrashSim>) {
    pmem::sim::write_image(path, bytes).unwrap();
    open_bullet_under_sim(path, o, seed)
}

/// Runs this test binary's ignored test `child` as a child process with
/// `envs`, SIGKILLs it after `run_for`, and returns the lines it printed.
pub fn run_and_kill(child: &str, envs: &[(&str, String)], run_for: Duration) -> Vec<String> {
    use std::io::BufRead;
    use std::process::{Command, Stdio};
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([child, "--exact", "--ignored", "--nocapture"])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    for (k, v) in envs {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().unwrap();
    let stdout = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut lines = Vec::new();
        for l in std::io::BufReader::new(stdout).lines() {
            match l {
                Ok(l) => lines.push(l),
                Err(_) => break,
            }
        }
        lines
    });
    std::thread::sleep(run_for);
    let _ = Command::new("kill")
        .args(["-9", &child.id().to_string()])
        .status();
    let _ = child.wait();
    reader.join().unwrap()
}

/// Opens the heap at `path` with `opts` (creating it with the store of
/// `kind` first when there is none) and the store in it, retrying for a
/// moment while a killed child's lock is still held.
pub fn open_or_create_store(
    kind: Kind,
    path: &Path,
    opts: &HeapOptions,
    log_size: u64,
) -> (AnyStore, Heap) {
    let t0 = std::time::Instant::now();
    loop {
        let rec = if path.exists() {
            Heap::open(path, opts)
        } else {
            let heap = Heap::create(path, opts).unwrap();
            create(kind, &heap, log_size).unwrap().close().unwrap();
            drop(heap);
            Heap::open(path, opts)
        };
        match rec {
            Ok(rec) => return open(kind, rec, log_size).unwrap(),
            Err(pmem::Error::InUse { .. }) if t0.elapsed() < Duration::from_secs(5) => {
                std::thread::sleep(Duration::from_millis(20))
            }
            Err(e) => panic!("open: {e}"),
        }
    }
}

/// Rounds of a SIGKILL test: `EMBER_ENGINE_SIGKILL_ROUNDS` (default 4).
pub fn sigkill_rounds() -> u32 {
    std::env::var("EMBER_ENGINE_SIGKILL_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(4)
}

/// The next number of a xorshift generator.
pub fn xorshift(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

/// In a SIGKILL test's child: the heap path and the store kind the parent
/// passed in `env_heap` and `env_kind` (one of `kinds`), or None when the
/// test runs directly rather than as a child.
pub fn child_args(env_heap: &str, env_kind: &str, kinds: &[Kind]) -> Option<(String, Kind)> {
    let path = std::env::var(env_heap).ok()?;
    let name = std::env::var(env_kind).unwrap();
    let kind = *kinds.iter().find(|k| k.name() == name).unwrap();
    Some((path, kind))
}

/// A collection's list leaf of `n` elements (a piece), for merge tests.
pub fn leaf_piece(n: u8, v: u32) -> Vec<u8> {
    use engine::types::node::{Entry, Node};
    Node::Leaf(
        (0..n)
            .map(|i| Entry::new(0.0, format!("e{v:x}.{i}").into_bytes()))
            .collect(),
    )
    .encode(false)
}

/// A merge payload: an edit of a list leaf (`kind` 0 inserts, 1 removes,
/// 2 replaces the element at `pos`); it fails on a leaf too short for `pos`.
pub fn leaf_edit(kind: u8, pos: u32, v: u32) -> Vec<u8> {
    use engine::types::edit::Edit;
    use engine::types::node::Entry;
    let entry = Entry::new(0.0, format!("m{v:x}").into_bytes());
    let e = match kind {
        0 => Edit::LeafInsert { pos, entry },
        1 => Edit::LeafRemove { pos },
        _ => Edit::LeafSet { pos, entry },
    };
    let mut out = Vec::new();
    e.encode(false, &mut out);
    out
}
