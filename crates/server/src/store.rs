//! Opening the configured store on the heap file, and one type for all three.

use crate::config::{Config, DurabilityMode, EngineChoice};
use engine::bullet::{is_bullet_root, BulletOptions, BulletStore};
use engine::direct::{backend_kind, BackendOptions, DirectStore};
use engine::volatile::VolatileStore;
use engine::{Session, Store, StoreStats};
use pmem::{Heap, HeapOptions, Strategy};
use std::time::{Duration, Instant};

/// The store a server runs on.
pub enum AnyStore {
    Volatile(VolatileStore),
    Direct(DirectStore),
    Bullet(BulletStore),
}

/// What opening the heap found and did (INFO, logs).
#[derive(Clone, Debug, Default)]
pub struct Startup {
    /// Whether the heap existed (false: created now).
    pub existed: bool,
    /// Whether the previous run shut down cleanly.
    pub was_clean: bool,
    /// Time from opening the file to serving, ms.
    pub open_ms: f64,
    /// Committed heap transactions replayed.
    pub txs_replayed: u64,
    /// Blocks freed by the leak sweep.
    pub leaked_freed: u64,
    /// Bullet: log records found / replayed into the frontend, bytes of log read.
    pub log_records: u64,
    pub log_replayed: u64,
    pub log_bytes: u64,
}

impl AnyStore {
    pub fn session(&self) -> engine::Result<Box<dyn Session>> {
        Ok(match self {
            AnyStore::Volatile(s) => Box::new(s.session()?),
            AnyStore::Direct(s) => Box::new(s.session()?),
            AnyStore::Bullet(s) => Box::new(s.session()?),
        })
    }

    pub fn name(&self) -> String {
        match self {
            AnyStore::Volatile(s) => s.name(),
            AnyStore::Direct(s) => s.name(),
            AnyStore::Bullet(s) => s.name(),
        }
    }

    pub fn stats(&self) -> StoreStats {
        match self {
            AnyStore::Volatile(s) => s.stats(),
            AnyStore::Direct(s) => s.stats(),
            AnyStore::Bullet(s) => s.stats(),
        }
    }

    /// The key hash that orders this store's scan (the key counts' recount).
    pub fn key_hasher(&self) -> index::KeyHasher {
        match self {
            AnyStore::Volatile(s) => s.key_hasher(),
            AnyStore::Direct(s) => s.key_hasher(),
            AnyStore::Bullet(s) => s.key_hasher(),
        }
    }

    pub fn heap(&self) -> Option<&Heap> {
        match self {
            AnyStore::Volatile(_) => None,
            AnyStore::Direct(s) => Some(s.heap()),
            AnyStore::Bullet(s) => Some(s.heap()),
        }
    }

    /// Clean shutdown: Bullet applies every log record to the backend first (so
    /// the next start replays nothing), then background threads stop and the
    /// structures write their exact counters. Sessions must be gone.
    pub fn close(&self) -> engine::Result<()> {
        match self {
            AnyStore::Volatile(s) => s.close(),
            AnyStore::Direct(s) => s.close(),
            AnyStore::Bullet(s) => {
                let t = Instant::now();
                if !s.drain_for(Some(SHUTDOWN_DRAIN))? {
                    let (used, _) = s.log_occupancy_bytes();
                    eprintln!(
                        "ember: stopped applying the logs after {:.1} s with {} bytes of records left: the next start replays them",
                        t.elapsed().as_secs_f64(),
                        used
                    );
                }
                s.close()
            }
        }
    }
}

/// The longest a clean shutdown spends applying Bullet's logs to the backend;
/// what is left stays in the logs (durable) and is replayed at the next start.
pub const SHUTDOWN_DRAIN: Duration = Duration::from_secs(5);

/// Opens (or creates) the heap and the store the configuration names.
pub fn open(cfg: &Config) -> Result<(AnyStore, Startup), String> {
    let t0 = Instant::now();
    let mut st = Startup::default();
    if cfg.engine == EngineChoice::Volatile {
        st.was_clean = true;
        st.open_ms = t0.elapsed().as_secs_f64() * 1e3;
        return Ok((AnyStore::Volatile(VolatileStore::new(1 << 16)), st));
    }
    let hopts = heap_options(cfg);
    st.existed = cfg.heap.exists();
    let rec = Heap::open_or_create(&cfg.heap, &hopts).map_err(|e| e.to_string())?;
    open_recovered(cfg, rec, st, t0)
}

/// The configured heap options (`--heap-size`, `--durability`...).
pub fn heap_options(cfg: &Config) -> HeapOptions {
    let strategy = match cfg.durability {
        DurabilityMode::Pmem => Strategy::detect(),
        DurabilityMode::Msync => Strategy::Msync,
    };
    HeapOptions {
        size: cfg.heap_size,
        max_size: cfg.heap_max_size,
        strategy,
        fence_ns: cfg.fence_ns,
        ..Default::default()
    }
}

/// [`open`] from a heap already opened (its recovery not yet finished): makes
/// or recovers the configured store on it. `st.existed` says whether the heap
/// existed before; `t0` is when opening began. Public for tests that open the
/// heap under a crash simulator (`Heap::open_sim`) and then start the store
/// exactly as the server does.
#[doc(hidden)]
pub fn open_recovered(
    cfg: &Config,
    rec: pmem::Recovery,
    mut st: Startup,
    t0: Instant,
) -> Result<(AnyStore, Startup), String> {
    st.was_clean = rec.report().was_clean;
    st.txs_replayed = rec.report().txs_replayed;
    let root = rec.heap().root();
    let backend = |kind| BackendOptions {
        kind,
        buckets: 1 << 16,
        link_cache: true,
    };
    let store = if root.is_null() {
        // A new heap (or one created but never given a store): make the store.
        let (heap, _) = rec.finish(|_| false).map_err(|e| e.to_string())?;
        let made = match &cfg.engine {
            EngineChoice::Direct(k) => {
                DirectStore::create(&heap, &backend(*k)).map(AnyStore::Direct)
            }
            EngineChoice::Bullet(v) => {
                BulletStore::create(&heap, &bullet_options(cfg, *v)).map(AnyStore::Bullet)
            }
            EngineChoice::Volatile => unreachable!("handled above"),
        };
        match made {
            Ok(s) => s,
            Err(e) => {
                // A heap file this start created and could not make a store in
                // (e.g. too small for Bullet's logs) goes, so that a start with
                // a larger --heap-size begins afresh.
                drop(heap);
                if !st.existed {
                    let _ = std::fs::remove_file(&cfg.heap);
                }
                return Err(e.to_string());
            }
        }
    } else if is_bullet_root(rec.heap(), root) {
        let EngineChoice::Bullet(v) = cfg.engine else {
            return Err(format!(
                "{} holds a Bullet store; start with --engine bullet (or a bullet-* variant)",
                cfg.heap.display()
            ));
        };
        let (s, r) = BulletStore::open(rec, &bullet_options(cfg, v)).map_err(|e| e.to_string())?;
        st.leaked_freed = r.index.heap.leaked_freed;
        st.log_records = r.records;
        st.log_replayed = r.replayed;
        st.log_bytes = r.log_bytes;
        AnyStore::Bullet(s)
    } else {
        let index = index::any::attach_any(rec.heap(), root).map_err(|e| {
            format!(
                "{}: the heap's root is not an Ember store: {e}",
                cfg.heap.display()
            )
        })?;
        let kind = backend_kind(&index).ok_or_else(|| {
            format!(
                "{}: the heap's root is a skip list, not a key-value store",
                cfg.heap.display()
            )
        })?;
        match cfg.engine {
            EngineChoice::Direct(k) if k == kind => {}
            _ => {
                return Err(format!(
                    "{} holds a direct store on {}; start with --engine {}",
                    cfg.heap.display(),
                    kind.name(),
                    if kind == engine::direct::BackendKind::PHash {
                        "direct-phash"
                    } else {
                        "direct"
                    }
                ))
            }
        }
        drop(index);
        let (s, r) = DirectStore::open(rec).map_err(|e| e.to_string())?;
        st.leaked_freed = r.heap.leaked_freed;
        AnyStore::Direct(s)
    };
    st.open_ms = t0.elapsed().as_secs_f64() * 1e3;
    Ok((store, st))
}

fn bullet_options(cfg: &Config, variant: engine::bullet::Variant) -> BulletOptions {
    BulletOptions {
        variant,
        logs: cfg.logs,
        log_size: cfg.log_size,
        backend: BackendOptions::default(),
        // msync mode: one msync per batch of requests (the worker commits
        // before it writes the batch's replies) instead of one per write.
        group_commit: cfg.durability == DurabilityMode::Msync,
        // msync mode: gleaning waits on the disk (a batch's backend writes are
        // one msync of scattered pages); a background thread takes the gleaner
        // role so that no worker keeps its clients waiting meanwhile. So too
        // with a single worker, which could never take the role (one session
        // always serves).
        role_threads: usize::from(cfg.durability == DurabilityMode::Msync || cfg.threads == 1),
        // A restart after a crash replays at most this much log.
        backlog_limit: cfg.log_backlog,
        // Bullet's bounded frontend: at most this many keys in DRAM.
        cache_entries: cfg.frontend_max_keys,
        ..Default::default()
    }
}
