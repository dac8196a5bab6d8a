//! Creating and opening a Bullet store: the descriptor and its parts, the
//! logs' check, and the store's assembly (its shared state and threads).

use super::replay::replay;
use super::roles::{advancer, role_keeper, static_gleaner, RoleSlot};
use super::{
    BulletOptions, BulletStore, Counters, FMeta, FVal, Life, Padded, Shared, Stuck, GLOCKS, IDLE,
    READER_SLOTS, SIDE_ROOT,
};
use crate::crl::{self, Pool, RecPtr, OPC_PAD};
use crate::direct::{backend_kind, create_backend, BackendKind};
use crate::table::Table;
use crate::{known_opcode, Error, Result};
use index::any::{attach_any, AnyIndex};
use index::{Index, KeyHasher, PHash, PHashOptions, RecoverStats, Recoverable};
use pmem::{Heap, PPtr, Recovery};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// The pool's own blocks (descriptor and log buffers) and the log size, for the
/// heap's leak sweep.
struct PoolBlocks(Vec<u64>, u64);

impl Recoverable for PoolBlocks {
    fn repair(&self, _slots: &[(PPtr<u8>, u64)]) -> index::Result<u64> {
        Ok(0)
    }
    fn reachable(&self, p: PPtr<u8>) -> bool {
        self.0.contains(&p.offset())
    }
}

/// Whether the heap's root is a Bullet descriptor (by its tag alone).
pub fn is_bullet_root(heap: &Heap, root: PPtr<u8>) -> bool {
    let r = heap.region();
    root.raw() != 0 && r.contains(root.raw(), 4) && r.read::<u32>(root.raw()) == crl::ROOT_TAG
}

/// A Bullet heap's parts, found from its descriptor without opening the store
/// (recovery, `ember check`): the backend index, the side table of the `st` and
/// `lfr` variants, and the pool's own blocks.
pub struct BulletParts {
    pub backend: AnyIndex,
    pub side: Option<PHash>,
    blocks: PoolBlocks,
}

impl BulletParts {
    /// Validates the descriptor at `root` and attaches the backend and side table.
    pub fn attach(heap: &Heap, root: PPtr<u8>) -> Result<BulletParts> {
        let desc = root.raw();
        let (nlogs, size, kind, broot) = Pool::read_desc(heap, desc)?;
        let backend = attach_any(heap, broot)?;
        let want = if kind == crl::BACKEND_HASH {
            BackendKind::LogFree
        } else {
            BackendKind::PHash
        };
        if backend_kind(&backend) != Some(want) {
            return Err(Error::Corrupt(format!(
                "Bullet backend is not the {} its descriptor names",
                want.name()
            )));
        }
        let r = heap.region();
        let mut blocks = vec![desc];
        for i in 0..nlogs {
            let b: u64 = r.read(desc + crl::LOGS_OFF + i as u64 * crl::LOG_DESC);
            if b != 0 {
                blocks.push(b);
            }
        }
        let side_root: u64 = r.read(desc + SIDE_ROOT);
        let side = if side_root != 0 {
            Some(PHash::attach(heap, PPtr::from_raw(side_root))?)
        } else {
            None
        };
        Ok(BulletParts {
            backend,
            side,
            blocks: PoolBlocks(blocks, size),
        })
    }

    /// Heap blocks the pool owns (descriptor and log buffers).
    pub fn pool_blocks(&self) -> u64 {
        self.blocks.0.len() as u64
    }

    /// The parts the heap's leak sweep asks about reachability.
    pub fn recoverables(&self) -> Vec<&dyn Recoverable> {
        let mut v: Vec<&dyn Recoverable> = vec![self.backend.recoverable(), &self.blocks];
        if let Some(s) = &self.side {
            v.push(s);
        }
        v
    }
}

/// What the logs of a Bullet heap hold, as found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LogFacts {
    /// Logs with a buffer.
    pub logs_used: u64,
    /// Records between heads and tails (pads excluded).
    pub records: u64,
    /// Of those, records not flagged as applied.
    pub unapplied: u64,
    /// Bytes between heads and tails.
    pub bytes: u64,
}

/// Reads every log from its head to its tail (records that check), validating
/// each record's header and opcode (read-only).
pub fn check_logs(heap: &Heap, root: PPtr<u8>) -> Result<LogFacts> {
    let pool = Pool::attach(heap, root.raw())?;
    let mut f = LogFacts::default();
    for (i, l) in pool.logs.iter().enumerate() {
        if l.base.load(Ordering::Acquire) == 0 {
            continue;
        }
        f.logs_used += 1;
        let head = l.head.load(Ordering::Acquire);
        let tail = l.tail.load(Ordering::Acquire);
        f.bytes += tail - head;
        let mut pos = head;
        loop {
            pos = pool.skip_gap(pos);
            if pos >= tail {
                break;
            }
            let h = pool.header(RecPtr::new(i, pos))?;
            pos += h.len as u64;
            if h.opcode == OPC_PAD {
                continue;
            }
            if !known_opcode(h.opcode) {
                return Err(Error::Corrupt(format!("log {i}: opcode {}", h.opcode)));
            }
            f.records += 1;
            if !h.applied {
                f.unapplied += 1;
            }
        }
    }
    Ok(f)
}

/// What recovery found and did.
#[derive(Clone, Debug, Default)]
pub struct BulletRecovery {
    pub index: RecoverStats,
    /// Log records between heads and tails.
    pub records: u64,
    /// Bytes of log read.
    pub log_bytes: u64,
    /// Records not yet in the backend, replayed into the frontend.
    pub replayed: u64,
    /// Keys put into the frontend.
    pub keys: u64,
    /// Replay time (after the index's recovery), microseconds.
    pub replay_micros: u64,
}

impl BulletStore {
    /// Creates a Bullet store in `heap` and makes it the heap's root.
    pub fn create(heap: &Heap, opts: &BulletOptions) -> Result<BulletStore> {
        let backend = create_backend(heap, &opts.backend)?;
        let kind = match opts.backend.kind {
            BackendKind::LogFree => crl::BACKEND_HASH,
            BackendKind::PHash => crl::BACKEND_PHASH,
        };
        let desc = Pool::create_desc(heap, opts.logs, opts.log_size, kind, backend.root())?;
        let pool = Pool::attach(heap, desc)?;
        if opts.preallocate_logs {
            // Before the root: a heap too small for its logs is left without a
            // store (what was allocated is unreachable, and the next open's leak
            // sweep frees it), so the next start fails the same clear way.
            pool.preallocate()?;
        }
        heap.set_root(PPtr::from_raw(desc))?;
        let table = Table::new(opts.frontend_buckets);
        let st = Self::assemble(heap.clone(), pool, backend, table, opts, true, 1)?;
        Ok(st)
    }

    /// Opens the Bullet store of a heap being recovered (§5).
    pub fn open(rec: Recovery, opts: &BulletOptions) -> Result<(BulletStore, BulletRecovery)> {
        let desc = rec.heap().root().raw();
        let BulletParts {
            backend,
            side,
            blocks,
        } = BulletParts::attach(rec.heap(), rec.heap().root())?;
        let size = blocks.1;
        let mut parts: Vec<&dyn Recoverable> = vec![backend.recoverable(), &blocks];
        if let Some(s) = &side {
            parts.push(s);
        }
        let (heap, istats) = index::recover(rec, &parts)?;
        let t = Instant::now();
        let pool = Pool::attach(&heap, desc)?;
        debug_assert_eq!(pool.size, size);
        pool.clear_stale_flags();
        // Before any append: a stale record at a drained head must not check
        // as live after the next crash (`Pool::persist_floors`).
        pool.persist_floors();
        let mut stats = BulletRecovery {
            index: istats,
            ..Default::default()
        };
        let hasher = backend_hasher(&backend)?;
        // The logs are replayed into the frontend, sized for the keys found
        // (a table doubling under the replay would copy every node it holds,
        // again and again).
        let replay = replay(
            &pool,
            &backend,
            &hasher,
            opts.parallel_replay_from,
            opts.frontend_buckets,
            &mut stats,
        )?;
        // After a restart the frontend holds only what the logs replayed: a miss
        // must read the backend (its key count is not exact after a crash, so it
        // cannot tell us the backend is empty).
        let st = Self::assemble(
            heap,
            pool,
            backend,
            replay.table,
            opts,
            false,
            replay.next_epoch,
        )?;
        stats.replay_micros = t.elapsed().as_micros() as u64;
        Ok((st, stats))
    }

    fn assemble(
        heap: Heap,
        pool: Pool,
        backend: AnyIndex,
        table: Table<FVal, FMeta>,
        opts: &BulletOptions,
        complete: bool,
        epoch: u64,
    ) -> Result<BulletStore> {
        if opts.epoch.is_zero() {
            return Err(Error::Config("epoch must be longer than 0".into()));
        }
        let r = heap.region();
        let side = if opts.variant.tx_on_put_path() {
            let root: u64 = r.read(pool.desc + SIDE_ROOT);
            if root != 0 {
                Some(PHash::attach(&heap, PPtr::from_raw(root))?)
            } else {
                let s = PHash::create(
                    &heap,
                    &PHashOptions {
                        buckets: opts.frontend_buckets as u64,
                        ..Default::default()
                    },
                )?;
                r.write(pool.desc + SIDE_ROOT, &s.root().raw());
                r.persist(pool.desc + SIDE_ROOT, 8);
                Some(s)
            }
        } else {
            None
        };
        pool.group_commit
            .store(opts.group_commit, Ordering::Relaxed);
        let hasher = backend_hasher(&backend)?;
        let sh = Arc::new(Shared {
            heap,
            pool,
            backend,
            side,
            table,
            hasher,
            opts: opts.clone(),
            epoch: AtomicU64::new(1),
            vtick: AtomicU64::new(epoch.max(1)),
            readers: (0..READER_SLOTS)
                .map(|_| Padded(AtomicU64::new(IDLE)))
                .collect(),
            reader_used: (0..READER_SLOTS).map(|_| AtomicBool::new(false)).collect(),
            glocks: (0..GLOCKS).map(|_| AtomicBool::new(false)).collect(),
            sessions: AtomicUsize::new(0),
            gleaners: AtomicUsize::new(0),
            target: AtomicUsize::new(0),
            roles: (0..if opts.variant.dynamic() {
                opts.role_threads
            } else {
                0
            })
                .map(|_| RoleSlot::default())
                .collect(),
            complete: AtomicBool::new(complete),
            stop: AtomicBool::new(false),
            advance_lock: Mutex::new(None),
            deferred: Mutex::new(Vec::new()),
            stuck: Mutex::new(Stuck::default()),
            full: AtomicBool::new(false),
            c: Counters::default(),
        });
        let life = Arc::new(Life {
            sh: sh.clone(),
            threads: Mutex::new(Vec::new()),
        });
        let mut threads = Vec::new();
        {
            let s = sh.clone();
            threads.push(
                std::thread::Builder::new()
                    .name("ember-advancer".into())
                    .spawn(move || advancer(s))
                    .map_err(|e| Error::Config(format!("cannot start the advancer: {e}")))?,
            );
        }
        if opts.variant.dynamic() {
            for n in 0..opts.role_threads {
                let s = sh.clone();
                threads.push(
                    std::thread::Builder::new()
                        .name(format!("ember-keeper-{n}"))
                        .spawn(move || role_keeper(s, n))
                        .map_err(|e| Error::Config(format!("cannot start a gleaner: {e}")))?,
                );
            }
        } else {
            for n in 0..opts.static_gleaners {
                let s = sh.clone();
                threads.push(
                    std::thread::Builder::new()
                        .name(format!("ember-gleaner-{n}"))
                        .spawn(move || static_gleaner(s))
                        .map_err(|e| Error::Config(format!("cannot start a gleaner: {e}")))?,
                );
            }
        }
        *life.threads.lock().unwrap_or_else(|e| e.into_inner()) = threads;
        Ok(BulletStore { sh, life })
    }
}

/// The key hash of a Bullet store: its backend's (the frontend must order keys
/// as the backend does). Bullet's backends are hash tables; a root whose backend
/// has no hash (a skip list) is refused.
pub(super) fn backend_hasher(backend: &AnyIndex) -> Result<KeyHasher> {
    backend.hasher().ok_or_else(|| {
        Error::Corrupt(format!(
            "Bullet backend is a {}, not a hash table",
            backend.name()
        ))
    })
}
