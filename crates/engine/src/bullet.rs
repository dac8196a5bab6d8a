//! The Bullet store (ATC '18): a DRAM frontend table, a persistent backend index,
//! and cross-referencing logs between them.
//!
//! - **Write** (§2.3, §4.1): reserve room in the session's log (before any lock);
//!   lock the key's frontend bucket; compute the new value; append a record whose
//!   `prev` is the entry's `lentry` (flush, one fence: the tail is not persisted,
//!   recovery finds it by checksums); set the entry's value, version and `lentry`;
//!   unlock. No backend access unless the key is missing from a frontend that is
//!   not complete (then the backend is read, under the lock).
//! - **Get** (§4.2): the frontend alone, lock-free (crossbeam-epoch keeps replaced
//!   values alive); a miss in a frontend that is not complete reads the backend
//!   under the bucket lock and caches the pair.
//! - **Scan** (cursor, [`Session::scan`]): the frontend's buckets covering the
//!   step (under their shared locks), then the backend index's scan from the same
//!   cursor; the step ends at the smaller of the two next cursors; frontend
//!   tombstones hide backend keys. The frontend goes first because a key leaves
//!   it only after the backend holds it. A complete frontend is scanned alone.
//! - **Glean** (§2.3, §4.4): a gleaner holds a log, walks it from its cursor, and
//!   for each unapplied record takes the key's gleaner lock (or skips the record:
//!   whoever holds the key applies it), walks the key's chain from the frontend
//!   `lentry` back through `prev` to the first applied record, and applies the
//!   chain oldest first (the chains of up to 16 records of distinct keys are
//!   walked in step, so that their cache misses overlap). Each backend value carries the version of the newest
//!   record it includes (see [`crate::value`]), which makes re-applying a record
//!   after a crash harmless. With put collapsing (variant `full`), a chain is
//!   folded in DRAM from its newest idempotent record (or from the backend value
//!   when it has none) and written once. At the end of a batch the backend is
//!   synced once, the records' `applied` flags set and fenced, each chain's
//!   `lentry` released with a compare-and-swap, and only then the keys' gleaner
//!   locks given back.
//! - **Epochs** (§2.4): the advancer thread bumps the version tick, moves each
//!   log's head past applied records (read boundary, grace period, persist,
//!   reuse), and once per epoch sets the number of gleaners wanted from the log
//!   occupancy (§4.3.2: above 60% one more, below 30% one fewer; with msync
//!   also one fewer after a few epochs in which nothing was written, so that a
//!   read-only phase has every thread serving; a background role thread no
//!   longer wanted finishes its batch at low priority). Frontend memory is
//!   reclaimed through crossbeam-epoch.
//! - **Recovery** (§5): the heap replays its transactions and sweeps leaks first;
//!   then every log is read from head to tail and the records not yet in the
//!   backend are replayed into the frontend (not the backend). Recovery time grows
//!   with the logs' contents, not with the number of keys.
//!
//! Variants (§7): `st` (static roles: a fixed number of gleaner threads; lock-based
//! gets; a transaction on the put critical path), `lfr` (+ lock-free gets), `opt`
//! (+ no transaction on the put path), `dyn` (+ dynamic roles), `full` (+ put
//! collapsing). The base design's transaction on the put path — locating or
//! allocating the key's persistent pair to persist `lentry` there — is reproduced
//! by a persistent side table (phash) mapping each key to its newest record,
//! updated in a transaction under the bucket lock; it is written, never read.

use crate::crl::{self, Header, Pool, RecPtr, OPC_PAD};
use crate::direct::{backend_kind, create_backend, BackendKind, BackendOptions};
use crate::table::{prefetch_keys, Blob, Table, TOMB_TAG};
use crate::{
    check_op, incr_value, lentry, min_cursor, value, Durability, Error, Op, Outcome, PendingCommit,
    Result, Session, Store, StoreStats, OPC_INCR, OPC_PUT, OPC_REMOVE,
};
use index::any::{attach_any, AnyHandle, AnyIndex};
use index::phash::PHashHandle;
use index::{Index, KeyHasher, Ops, PHash, PHashOptions, RecoverStats, Recoverable};
use pmem::{Heap, PPtr, Recovery};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Bullet's variants, as in the paper's ablation (§7).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Variant {
    St,
    Lfr,
    Opt,
    Dyn,
    Full,
}

impl Variant {
    pub const ALL: [Variant; 5] = [
        Variant::St,
        Variant::Lfr,
        Variant::Opt,
        Variant::Dyn,
        Variant::Full,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Variant::St => "st",
            Variant::Lfr => "lfr",
            Variant::Opt => "opt",
            Variant::Dyn => "dyn",
            Variant::Full => "full",
        }
    }

    pub fn parse(s: &str) -> Result<Variant> {
        let s = s.trim_start_matches('+');
        Variant::ALL
            .into_iter()
            .find(|v| v.name() == s)
            .ok_or_else(|| Error::Config(format!("unknown Bullet variant {s:?}")))
    }

    pub fn lockfree_gets(self) -> bool {
        self != Variant::St
    }
    pub fn tx_on_put_path(self) -> bool {
        matches!(self, Variant::St | Variant::Lfr)
    }
    pub fn dynamic(self) -> bool {
        matches!(self, Variant::Dyn | Variant::Full)
    }
    pub fn collapse(self) -> bool {
        self == Variant::Full
    }
}

/// Configuration of a Bullet store.
#[derive(Clone, Debug)]
pub struct BulletOptions {
    pub variant: Variant,
    /// Logs in the pool (a new store only; an existing one keeps its own).
    pub logs: usize,
    /// Bytes per log (a new store only).
    pub log_size: u64,
    /// The backend of a new store.
    pub backend: BackendOptions,
    /// Initial frontend buckets.
    pub frontend_buckets: usize,
    /// Most frontend entries (0 = unbounded: the frontend is a full copy).
    pub cache_entries: u64,
    /// Epoch length.
    pub epoch: Duration,
    /// Gleaner threads of the static variants (`st`, `lfr`, `opt`).
    pub static_gleaners: usize,
    /// Group commit: [`Session::apply`] returns once the record is written and
    /// flushed, without the fence; [`Session::commit`] makes every update of
    /// the session durable with one fence (with the msync strategy: one msync
    /// per batch instead of one per write). Other sessions may read an update
    /// before it is durable, as Redis clients read writes before the AOF fsync.
    pub group_commit: bool,
    /// Dynamic variants: 0 = sessions take the gleaner roles between their
    /// requests (§4.3: a thread is a writer or a gleaner); N > 0 = N background
    /// threads take them instead and sessions only serve. For gleaning that waits
    /// on I/O (the msync strategy, where a batch's backend writes cost one
    /// `msync` of many scattered pages): a session holding the role would keep its
    /// clients waiting meanwhile.
    pub role_threads: usize,
    /// A new store allocates every log buffer at once and maps it writable
    /// ([`Pool::preallocate`]); otherwise a buffer is allocated when a writer
    /// first takes its log, and its pages are faulted in on the way.
    pub preallocate_logs: bool,
    /// Recovery folds the logs' records on two threads from this many records
    /// on (fewer: on the opening thread alone).
    pub parallel_replay_from: usize,
}

impl Default for BulletOptions {
    fn default() -> Self {
        BulletOptions {
            variant: Variant::Full,
            logs: 32,
            log_size: 64 << 20,
            backend: BackendOptions::default(),
            frontend_buckets: 1 << 16,
            cache_entries: 0,
            epoch: Duration::from_millis(10),
            static_gleaners: 1,
            group_commit: false,
            role_threads: 0,
            preallocate_logs: true,
            parallel_replay_from: 20_000,
        }
    }
}

/// A frontend value: bytes, or a tombstone ([`Blob::tomb`], §2.3).
type FVal = Blob;

/// A frontend entry's log bookkeeping.
pub struct FMeta {
    /// The key's newest log record ([`RecPtr`]; 0: none pending).
    lentry: lentry::AtomicU64,
    /// The version of the key's newest record (or the backend stamp it was loaded
    /// with).
    version: AtomicU64,
}

impl FMeta {
    fn new(lentry: u64, version: u64) -> FMeta {
        FMeta {
            lentry: lentry::AtomicU64::new(lentry),
            version: AtomicU64::new(version),
        }
    }
}

impl Clone for FMeta {
    fn clone(&self) -> FMeta {
        FMeta::new(
            self.lentry.load(Ordering::Acquire),
            self.version.load(Ordering::Acquire),
        )
    }
}

const GLOCKS: usize = 1 << 16;
/// Versions are `max(previous + 1, vtick << VERSION_SHIFT)`: 2^24 writes of one
/// key per tick before its versions spill into the next tick's range (harmless:
/// they still grow), and 2^40 ticks (348 years at 100 ticks a second).
const VERSION_SHIFT: u32 = 24;
const READER_SLOTS: usize = 512;
const IDLE: u64 = u64::MAX;
/// Records a glean batch applies at most.
const BATCH: usize = 256;
/// The same with the msync strategy, where each of a batch's fences is an
/// `msync` of scattered pages (a device flush): larger batches, fewer of them.
/// A batch writes every backend page it touches once, so the larger the batch
/// the fewer page writes per record (sustained `SET -P 16` on 100k keys:
/// 126-130k/s at 2,048 records, 152k at 8,192, 141-159k at 32,768 and more).
/// For background gleaners (role threads, the advancer).
const BATCH_MSYNC: usize = 16384;
/// A worker that must glean between requests (every log full) keeps its
/// batches short: its clients wait for each one.
const BATCH_MSYNC_INLINE: usize = 2048;
const SIDE_ROOT: u64 = 32;
/// How far past each log's tail the advancer maps pages writable every epoch
/// (`Pool::populate_ahead`): several epochs of appends at a million puts a
/// second per writer.
const POPULATE_AHEAD: u64 = 8 << 20;
/// Session counters are folded into the shared ones every this many operations.
const FOLD_EVERY: u64 = 256;

#[repr(align(64))]
struct Padded(AtomicU64);

#[derive(Default)]
struct Counters {
    ops: AtomicU64,
    appended: AtomicU64,
    applied: AtomicU64,
    collapsed: AtomicU64,
    loads: AtomicU64,
    evictions: AtomicU64,
    waits: AtomicU64,
    epochs: AtomicU64,
    lowered: AtomicU64,
}

/// A role thread (`role_gleaner`) as the advancer sees it.
#[derive(Default)]
struct RoleSlot {
    /// The running thread's id (0 between threads). The advancer lowers a
    /// thread's priority holding this lock, which the thread takes to clear
    /// its id before it ends: the id is never that of a finished thread.
    tid: Mutex<i32>,
    /// In a batch with the role: the only time its priority is lowered.
    busy: AtomicBool,
    /// Its priority was lowered: it gives the role back after the batch and
    /// ends; its keeper starts a new thread at normal priority.
    lowered: AtomicBool,
}

/// A head advance waiting for its grace period: the epoch it bumped to, and the
/// new head of each log that moved.
type PendingAdvance = (u64, Vec<(usize, u64)>);

struct Shared {
    heap: Heap,
    pool: Pool,
    backend: AnyIndex,
    side: Option<PHash>,
    table: Table<FVal, FMeta>,
    /// The backend's key hash: the frontend places and orders keys by it too,
    /// so that a SCAN can merge the two tiers by position.
    hasher: KeyHasher,
    opts: BulletOptions,
    /// Reader epoch (bumped by every head advance; reader slots record it).
    epoch: AtomicU64,
    /// Version tick, bumped once per epoch period by the advancer only:
    /// `vtick << VERSION_SHIFT` is the least version a write may take. Kept apart
    /// from the reader epoch, which waiting writers may bump at any rate.
    vtick: AtomicU64,
    readers: Box<[Padded]>,
    reader_used: Box<[AtomicBool]>,
    glocks: Box<[AtomicBool]>,
    sessions: AtomicUsize,
    gleaners: AtomicUsize,
    target: AtomicUsize,
    /// One per role thread (`BulletOptions::role_threads`).
    roles: Box<[RoleSlot]>,
    /// Every key of the store is in the frontend (a miss is a miss).
    complete: AtomicBool,
    stop: AtomicBool,
    /// A head advance waiting for its grace period: the epoch and the new heads.
    advance_lock: Mutex<Option<PendingAdvance>>,
    /// Tombstones whose removal waits for a later epoch.
    deferred: Mutex<Vec<(u64, Vec<u8>)>>,
    /// Keys whose records the backend had no room for (a full heap).
    stuck: Mutex<Stuck>,
    /// `stuck` holds a key: puts are refused with the heap-full error.
    full: AtomicBool,
    c: Counters,
}

/// Keys whose chains a gleaner could not apply because the backend could not
/// allocate (a full heap), and the last such error. Their records stay in the
/// logs, unflagged (acknowledged writes are never dropped), and every batch
/// that meets them tries again; a key leaves the set when a batch applies its
/// chain (space freed by removes, or a remove of the key itself collapsed into
/// it). While the set is not empty, puts and increments are refused at once
/// (Redis's maxmemory `-OOM`): the logs then keep their room for removes, whose
/// application frees backend space.
#[derive(Default)]
struct Stuck {
    keys: std::collections::HashSet<Vec<u8>>,
    /// The last lack-of-room error a backend write met.
    last: Option<pmem::Error>,
}

/// Whether `e` says the heap could not allocate: at its limit, or no room on
/// its file system (`pmem::Error::is_full`; it may have room later).
fn heap_full(e: &Error) -> bool {
    match e {
        Error::Heap(h) | Error::Index(index::Error::Heap(h)) => h.is_full(),
        _ => false,
    }
}

fn clone_full(e: &Error) -> Option<pmem::Error> {
    match e {
        Error::Heap(h) | Error::Index(index::Error::Heap(h)) => h.clone_full(),
        _ => None,
    }
}

/// The share of each log that puts leave free (1/16): removes may use it, so
/// that when the backend is full and puts wait in the logs, removes, whose
/// application frees backend space, still find room.
const REMOVE_RESERVE: u64 = 16;

/// How long a remove waits for log space while the backend is full and
/// nothing moves before it gets the heap-full error.
const REMOVE_PATIENCE: Duration = Duration::from_millis(500);

/// Owns the background threads; stops and joins them when the last store handle
/// goes.
struct Life {
    sh: Arc<Shared>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl Life {
    fn stop(&self) {
        self.sh.stop.store(true, Ordering::Release);
        let ts = std::mem::take(&mut *self.threads.lock().unwrap_or_else(|e| e.into_inner()));
        for t in ts {
            let _ = t.join();
        }
    }
}

impl Drop for Life {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The Bullet store. Clone is cheap.
#[derive(Clone)]
pub struct BulletStore {
    sh: Arc<Shared>,
    life: Arc<Life>,
}

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
            if !matches!(h.opcode, OPC_PUT | OPC_REMOVE | OPC_INCR) {
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
        let st = Self::assemble(heap.clone(), pool, backend, opts, true, 1)?;
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
        let replay = replay(
            &pool,
            &backend,
            &hasher,
            opts.parallel_replay_from,
            &mut stats,
        )?;
        // After a restart the frontend holds only what the logs replayed: a miss
        // must read the backend (its key count is not exact after a crash, so it
        // cannot tell us the backend is empty).
        // A frontend big enough for the replayed entries from the start: a
        // table doubling under the replay copies every node it holds, again
        // and again (it was a tenth of a large recovery's time).
        let sized = BulletOptions {
            frontend_buckets: opts
                .frontend_buckets
                .max(replay.entries.len().next_power_of_two()),
            ..opts.clone()
        };
        let st = Self::assemble(heap, pool, backend, &sized, false, replay.next_epoch)?;
        for (hash, k, v, lentry, version) in replay.entries {
            let mut l = st.sh.table.lock(hash);
            if l.find(&k).is_none() {
                l.insert(
                    hash,
                    &k,
                    Blob::new_opt(v.as_deref()),
                    FMeta::new(lentry, version),
                );
            }
        }
        stats.replay_micros = t.elapsed().as_micros() as u64;
        Ok((st, stats))
    }

    fn assemble(
        heap: Heap,
        pool: Pool,
        backend: AnyIndex,
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
            table: Table::new(opts.frontend_buckets),
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

    pub fn heap(&self) -> &Heap {
        &self.sh.heap
    }

    pub fn backend(&self) -> &AnyIndex {
        &self.sh.backend
    }

    pub fn variant(&self) -> Variant {
        self.sh.opts.variant
    }

    /// Applies every record in the logs to the backend and reclaims the logs
    /// (tests, benchmarks' prefill). Call with no session writing.
    pub fn drain(&self) -> Result<()> {
        self.drain_for(None).map(|_| ())
    }

    /// Bytes of the logs in use (records not yet reclaimed) and their total.
    pub fn log_occupancy_bytes(&self) -> (u64, u64) {
        self.sh.pool.occupancy()
    }

    /// [`drain`](Self::drain), for at most `budget` (None: no limit): true when
    /// the logs are empty, false when time ran out first. Records left in the
    /// logs are safe there: the next open replays them into the frontend
    /// (§5) and gleaners apply them later. A clean shutdown uses this so that
    /// its time stays bounded whatever the backlog (with the msync strategy a
    /// backend update costs msyncs, and a full pool takes minutes to apply).
    ///
    /// Records the backend has no room for (a full heap) end a drain with a
    /// budget early (false: they stay in the logs); one without a budget
    /// returns the heap-full error.
    pub fn drain_for(&self, budget: Option<Duration>) -> Result<bool> {
        let mut g = Gleaner::new(&self.sh)?;
        let r = self.drain_loop(&mut g, budget.map(|b| std::time::Instant::now() + b));
        g.retire(&self.sh);
        match r {
            Err(e) if budget.is_some() && heap_full(&e) => Ok(false),
            r => r,
        }
    }

    fn drain_loop(&self, g: &mut Gleaner, deadline: Option<std::time::Instant>) -> Result<bool> {
        let late = || deadline.is_some_and(|d| std::time::Instant::now() >= d);
        loop {
            if self.sh.pool.group_commit.load(Ordering::Relaxed) {
                // Gleaners apply only durable records: a drain applies
                // everything published, committed or not.
                self.sh.pool.make_all_durable()?;
            }
            while g.glean_batch(&self.sh)? {
                if late() {
                    break;
                }
            }
            self.sh.advance()?;
            let (used, _) = self.sh.pool.occupancy();
            if used == 0 {
                return Ok(true);
            }
            if late() {
                return Ok(false);
            }
            if !g.glean_batch(&self.sh)? {
                std::thread::sleep(Duration::from_micros(200));
            }
        }
    }

    /// Checks the frontend against the backend (tests): every frontend entry
    /// without pending records equals the backend's value.
    pub fn verify(&self) -> std::result::Result<u64, String> {
        let mut h = self.sh.backend.handle().map_err(|e| e.to_string())?;
        let mut buf = Vec::new();
        let mut n = 0;
        let mut err = None;
        let g = crossbeam_epoch::pin();
        self.sh.table.for_each(|node| {
            if err.is_some() {
                return;
            }
            n += 1;
            if node.meta().lentry.load(Ordering::Acquire) != 0 {
                return;
            }
            let found = match h.get(node.key(), &mut buf) {
                Ok(f) => f,
                Err(e) => {
                    err = Some(e.to_string());
                    return;
                }
            };
            let b = if found {
                value::decode(&buf).map(|(_, v)| v)
            } else {
                None
            };
            if b != node.value(&g).get() {
                err = Some(format!(
                    "key {:?}: frontend {:?}, backend {:?}",
                    String::from_utf8_lossy(node.key()),
                    node.value(&g).get().map(String::from_utf8_lossy),
                    b.map(String::from_utf8_lossy)
                ));
            }
        });
        match err {
            Some(e) => Err(e),
            None => Ok(n),
        }
    }
}

/// A frontend entry rebuilt from the logs: key hash, key, value (None:
/// tombstone), lentry, version.
type ReplayEntry = (u64, Vec<u8>, Option<Box<[u8]>>, u64, u64);

/// The outcome of reading the logs at recovery.
struct Replay {
    entries: Vec<ReplayEntry>,
    next_epoch: u64,
}

/// A record found at recovery.
#[derive(Clone, Copy)]
struct Found {
    p: RecPtr,
    h: Header,
    /// Where its key is in `replay`'s copy of the keys.
    koff: usize,
}

/// Reads every log from head to tail; for each key with records not yet in the
/// backend, computes the frontend value (backend value + those records, in version
/// order). Records found to be in the backend already (their version is at most
/// the backend stamp, or at most a flagged record's) are flagged, so the prefix of
/// each key's chain that is flagged is exactly what the backend holds.
///
/// The records are grouped by key without a map: one array of (key hash,
/// version, index) sorted, then runs of one hash split by key bytes (only a
/// hash collision makes a run hold two keys). No allocation per key or record
/// besides the entries themselves: a map of keys to record lists cost an
/// allocation of each and a tenth of a large recovery's time freeing them.
/// The keys are copied into one buffer as the logs are read, so that going
/// through them in hash order reads that buffer, not the logs at random. That
/// is every record's key (the map held each key once): recovery's memory is
/// the logs' key bytes plus about 90 bytes a record, at most about the logs'
/// size.
fn replay(
    pool: &Pool,
    backend: &AnyIndex,
    hasher: &KeyHasher,
    parallel_from: usize,
    st: &mut BulletRecovery,
) -> Result<Replay> {
    let mut recs: Vec<Found> = Vec::new();
    let mut keys: Vec<u8> = Vec::new();
    let mut order: Vec<(u64, u64, u32)> = Vec::new();
    let mut max_version = 0;
    let mut key = Vec::new();
    for (i, l) in pool.logs.iter().enumerate() {
        if l.base.load(Ordering::Acquire) == 0 {
            continue;
        }
        let head = l.head.load(Ordering::Acquire);
        let tail = l.tail.load(Ordering::Acquire);
        st.log_bytes += tail - head;
        let mut pos = head;
        loop {
            pos = pool.skip_gap(pos);
            if pos >= tail {
                break;
            }
            let p = RecPtr::new(i, pos);
            let h = pool.header(p)?;
            pos += h.len as u64;
            if pos > tail {
                return Err(Error::Corrupt(format!("log {i}: record past the tail")));
            }
            if h.opcode == OPC_PAD {
                continue;
            }
            if !matches!(h.opcode, OPC_PUT | OPC_REMOVE | OPC_INCR) {
                return Err(Error::Corrupt(format!(
                    "log {i} record at {}: opcode {}",
                    p.pos(),
                    h.opcode
                )));
            }
            st.records += 1;
            pool.key(p, &h, &mut key);
            max_version = max_version.max(h.version);
            let n = u32::try_from(recs.len()).map_err(|_| {
                Error::Config("more than 2^32 log records: too many to recover at once".into())
            })?;
            order.push((order_hash(hasher, &key), h.version, n));
            recs.push(Found {
                p,
                h,
                koff: keys.len(),
            });
            keys.extend_from_slice(&key);
        }
    }
    order.sort_unstable();
    // Two halves on two threads (split at a run of one hash) when there is
    // enough to share: each key's fold is independent of the others'.
    let collide = collide_now();
    let mut split = order.len() / 2;
    while split > 0 && split < order.len() && order[split].0 == order[split - 1].0 {
        split += 1;
    }
    let parts: Vec<&[(u64, u64, u32)]> = if order.len() >= parallel_from.max(2) {
        vec![&order[..split], &order[split..]]
    } else {
        vec![&order[..]]
    };
    let run =
        |part: &[(u64, u64, u32)]| replay_part(pool, backend, hasher, &recs, &keys, part, collide);
    let mut done: Vec<Result<PartOut>> = Vec::new();
    std::thread::scope(|sc| {
        let mut handles = Vec::new();
        for part in &parts[1..] {
            match std::thread::Builder::new()
                .name("ember-replay".into())
                .spawn_scoped(sc, move || run(part))
            {
                Ok(h) => handles.push(h),
                // No thread: this one does that part too.
                Err(_) => done.push(run(part)),
            }
        }
        done.push(run(parts[0]));
        for h in handles {
            // A panic there is a panic here, as in the part run here.
            done.push(h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)));
        }
    });
    if parts.len() > 1 && done.iter().any(Result::is_err) {
        // Run in parallel, a part can fail for want of a second heap thread
        // slot (a backend handle takes one): again one after the other, each
        // handle dropped before the next. Parts have no effect until merged.
        done = parts.iter().map(|part| run(part)).collect();
    }
    let mut entries = Vec::new();
    let mut to_flag = Vec::new();
    for r in done {
        let (e, f, replayed) = r?;
        st.replayed += replayed;
        if entries.is_empty() {
            entries = e;
        } else {
            entries.extend(e);
        }
        to_flag.extend(f);
    }
    if !to_flag.is_empty() {
        // All the flags, then all the flushes (see `Pool::mark_applied_all`).
        pool.mark_applied_all(&to_flag);
        pool.fence();
    }
    st.keys = entries.len() as u64;
    Ok(Replay {
        entries,
        next_epoch: (max_version >> VERSION_SHIFT) + 1,
    })
}

/// What `replay_part` found: frontend entries, records to flag, and how many
/// records it replayed.
type PartOut = (Vec<ReplayEntry>, Vec<RecPtr>, u64);

/// `replay`'s work on one part of the records in (hash, version) order (a part
/// begins and ends at hash runs' boundaries).
fn replay_part(
    pool: &Pool,
    backend: &AnyIndex,
    hasher: &KeyHasher,
    recs: &[Found],
    keys: &[u8],
    order: &[(u64, u64, u32)],
    collide: bool,
) -> Result<PartOut> {
    let mut r = Replayer {
        pool,
        bh: backend.handle()?,
        buf: Vec::new(),
        payload: Vec::new(),
        entries: Vec::new(),
        to_flag: Vec::new(),
        replayed: 0,
    };
    let key_of = |f: &Found| &keys[f.koff..f.koff + f.h.klen as usize];
    let mut group: Vec<Found> = Vec::new();
    let mut a = 0;
    while a < order.len() {
        let hash = order[a].0;
        let mut b = a + 1;
        while b < order.len() && order[b].0 == hash {
            b += 1;
        }
        if let Some(o) = order.get(b) {
            pool.prefetch_header(recs[o.2 as usize].p);
        }
        group.clear();
        group.extend(order[a..b].iter().map(|o| recs[o.2 as usize]));
        let key = key_of(&group[0]);
        if b - a > 1 && group.iter().any(|f| key_of(f) != key) {
            // A hash collision: the run's records of other keys go to groups
            // of their own, in order (still by version).
            let mut rest: Vec<Found> = Vec::new();
            group.retain(|f| {
                let mine = key_of(f) == key;
                if !mine {
                    rest.push(*f);
                }
                mine
            });
            while !rest.is_empty() {
                let other = key_of(&rest[0]);
                let (g2, r2): (Vec<Found>, Vec<Found>) =
                    rest.iter().partition(|f| key_of(f) == other);
                r.key(entry_hash(hasher, hash, other, collide), other, &g2)?;
                rest = r2;
            }
        }
        r.key(entry_hash(hasher, hash, key, collide), key, &group)?;
        a = b;
    }
    Ok((r.entries, r.to_flag, r.replayed))
}
#[cfg(test)]
thread_local! {
    /// Tests: `replay` groups records under a hash that collides for every
    /// other key (`order_hash`).
    static COLLIDE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Whether this thread's `replay` forces hash collisions (tests).
fn collide_now() -> bool {
    #[cfg(test)]
    if COLLIDE.with(|c| c.get()) {
        return true;
    }
    false
}

/// The key hash of a Bullet store: its backend's (the frontend must order keys
/// as the backend does). Bullet's backends are hash tables; a root whose backend
/// has no hash (a skip list) is refused.
fn backend_hasher(backend: &AnyIndex) -> Result<KeyHasher> {
    backend.hasher().ok_or_else(|| {
        Error::Corrupt(format!(
            "Bullet backend is a {}, not a hash table",
            backend.name()
        ))
    })
}

/// The hash `replay` groups a key's records under.
fn order_hash(hasher: &KeyHasher, key: &[u8]) -> u64 {
    if collide_now() {
        return key.len() as u64 % 2;
    }
    hasher.hash(key)
}

/// The frontend hash of `key`, grouped under `hash` (`collide`: by
/// `order_hash`'s test stand-in).
fn entry_hash(hasher: &KeyHasher, hash: u64, key: &[u8], collide: bool) -> u64 {
    if collide {
        hasher.hash(key)
    } else {
        hash
    }
}

/// `replay`'s state while it goes through the keys.
struct Replayer<'a> {
    pool: &'a Pool,
    bh: AnyHandle,
    buf: Vec<u8>,
    payload: Vec<u8>,
    entries: Vec<ReplayEntry>,
    to_flag: Vec<RecPtr>,
    /// Records not yet in the backend, replayed.
    replayed: u64,
}

impl Replayer<'_> {
    /// One key's records, in version order: its frontend entry, if it needs
    /// one, and the records to flag.
    fn key(&mut self, hash: u64, key: &[u8], recs: &[Found]) -> Result<()> {
        let maxflag = recs
            .iter()
            .filter(|r| r.h.applied)
            .map(|r| r.h.version)
            .max()
            .unwrap_or(0);
        // The backend is read only when the value needs it: when the records
        // not yet flagged applied hold a put or remove, the value is the fold
        // from the newest of them, whatever the backend holds. Records the
        // backend already has (but that were not flagged) are then applied
        // again by the gleaners: idempotent, since the chain has a put or
        // remove after which the value is rewritten whole (§4.4). A restart
        // after a write-heavy crash thus costs no backend lookup per key, on
        // a heap whose pages are all cold.
        let split = recs.partition_point(|r| r.h.version <= maxflag);
        let unflagged = &recs[split..];
        if let Some(k) = unflagged.iter().rposition(|r| r.h.opcode != OPC_INCR) {
            // Older than a record flagged applied: in the backend too (chains
            // are applied in order). Flag them, or no chain walk from the
            // frontend entry (which stops at the flagged record) reaches them
            // and the log's head never passes them.
            self.to_flag
                .extend(recs[..split].iter().filter(|r| !r.h.applied).map(|r| r.p));
            self.replayed += unflagged.len() as u64;
            let val = self.fold(None, &unflagged[k..])?;
            let newest = unflagged.last().expect("non-empty");
            self.entries
                .push((hash, key.to_vec(), val, newest.p.0, newest.h.version));
            return Ok(());
        }
        let found = self.bh.get(key, &mut self.buf)?;
        let stamp = if found {
            value::decode(&self.buf)
                .ok_or_else(|| Error::Corrupt("backend value without a stamp".into()))?
                .0
        } else {
            0
        };
        let done = maxflag.max(stamp);
        self.to_flag.extend(
            recs.iter()
                .filter(|r| r.h.version <= done && !r.h.applied)
                .map(|r| r.p),
        );
        let first = recs.partition_point(|r| r.h.version <= done);
        let pending = &recs[first..];
        if pending.is_empty() {
            return Ok(());
        }
        self.replayed += pending.len() as u64;
        // Increments only (a put or remove would have been folded above, or
        // is in the backend): onto the backend value.
        let base = if found {
            value::decode(&self.buf).map(|(_, v)| v.to_vec())
        } else {
            None
        };
        let val = self.fold(base, pending)?;
        let newest = pending.last().expect("non-empty");
        self.entries
            .push((hash, key.to_vec(), val, newest.p.0, newest.h.version));
        Ok(())
    }

    /// Folds `recs` (in version order) onto `val`.
    fn fold(&mut self, mut val: Option<Vec<u8>>, recs: &[Found]) -> Result<Option<Box<[u8]>>> {
        for r in recs {
            self.pool.payload(r.p, &r.h, &mut self.payload);
            val = fold(val, r.h.opcode, &self.payload)?;
        }
        Ok(val.map(Vec::into_boxed_slice))
    }
}

/// Applies one record's operation to a value.
fn fold(val: Option<Vec<u8>>, opcode: u8, payload: &[u8]) -> Result<Option<Vec<u8>>> {
    Ok(match opcode {
        OPC_PUT => Some(payload.to_vec()),
        OPC_REMOVE => None,
        OPC_INCR => {
            let d = i64::from_le_bytes(
                payload
                    .try_into()
                    .map_err(|_| Error::Corrupt("Incr record without an 8-byte delta".into()))?,
            );
            let n = incr_value(val.as_deref(), d).map_err(|e| {
                Error::Corrupt(format!("Incr record does not apply to its value: {e}"))
            })?;
            Some(n.to_string().into_bytes())
        }
        o => return Err(Error::Corrupt(format!("opcode {o}"))),
    })
}

impl Shared {
    fn epoch_base(&self) -> u64 {
        self.vtick.load(Ordering::Acquire) << VERSION_SHIFT
    }

    fn enter(&self, slot: usize) {
        let e = self.epoch.load(Ordering::SeqCst);
        self.readers[slot].0.store(e, Ordering::SeqCst);
    }

    fn exit(&self, slot: usize) {
        self.readers[slot].0.store(IDLE, Ordering::Release);
    }

    fn claim_slot(&self) -> Result<usize> {
        for (i, u) in self.reader_used.iter().enumerate() {
            if !u.load(Ordering::Relaxed)
                && u.compare_exchange(false, true, Ordering::AcqRel, Ordering::Relaxed)
                    .is_ok()
            {
                return Ok(i);
            }
        }
        Err(Error::Config(format!(
            "more than {READER_SLOTS} sessions and gleaners at once"
        )))
    }

    /// Whether every reader that entered before epoch `e` has left.
    fn readers_past(&self, e: u64) -> bool {
        self.readers.iter().all(|r| {
            let v = r.0.load(Ordering::SeqCst);
            v == IDLE || v >= e
        })
    }

    /// Moves each log's head past its applied records (§2.4), in two phases that
    /// never wait: the first publishes the new heads as read boundaries and bumps
    /// the epoch; a later call, once every reader that entered before that epoch
    /// has left (gleaners leave at the end of each batch), persists the heads and
    /// frees the space to writers. Returns whether it freed space. Only one thread
    /// advances at a time; others return at once.
    fn advance(&self) -> Result<bool> {
        let mut pend = match self.advance_lock.try_lock() {
            Ok(g) => g,
            Err(_) => return Ok(false),
        };
        if let Some((e, _)) = pend.as_ref() {
            if !self.readers_past(*e) {
                return Ok(false);
            }
            let (_, moved) = pend.take().expect("pending");
            self.finish_advance(&moved);
            return Ok(true);
        }
        let mut moved = Vec::new();
        for (i, l) in self.pool.logs.iter().enumerate() {
            if l.base.load(Ordering::Acquire) == 0 {
                continue;
            }
            let head = l.head.load(Ordering::Acquire);
            let tail = l.tail.load(Ordering::Acquire);
            let mut pos = head;
            loop {
                pos = self.pool.skip_gap(pos);
                if pos >= tail {
                    pos = pos.min(tail);
                    break;
                }
                let h = self.pool.header(RecPtr::new(i, pos))?;
                if !(h.applied || h.opcode == OPC_PAD) {
                    break;
                }
                pos += h.len as u64;
            }
            if pos > head {
                // The read boundary first: no reader starts below it from now on.
                l.head.store(pos, Ordering::SeqCst);
                moved.push((i, pos));
            }
        }
        if moved.is_empty() {
            return Ok(false);
        }
        let e = self.epoch.fetch_add(1, Ordering::SeqCst) + 1;
        if self.readers_past(e) {
            self.finish_advance(&moved);
            return Ok(true);
        }
        *pend = Some((e, moved));
        Ok(false)
    }

    fn finish_advance(&self, moved: &[(usize, u64)]) {
        self.pool.persist_heads(moved);
    }

    fn claim_glean_log(&self, from: usize) -> Option<usize> {
        let n = self.pool.logs.len();
        for k in 0..n {
            let i = (from + k) % n;
            let l = &self.pool.logs[i];
            if l.gleaner.load(Ordering::Relaxed) {
                continue;
            }
            let scan = l.scan.load(Ordering::Relaxed);
            if scan >= l.tail.load(Ordering::Acquire) {
                continue;
            }
            if l.gleaner
                .compare_exchange(false, true, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
            {
                return Some(i);
            }
        }
        None
    }

    /// Removes the tombstone of `key` if its remove is in the backend and no newer
    /// record exists; keeps it for later when its version is from this tick (a new
    /// incarnation of the key must get a larger version than every record of the
    /// old one still in the logs). True when the tombstone is settled (removed, or
    /// no longer a tombstone, or a newer record's gleaner will see to it).
    fn reap(&self, hash: u64, key: &[u8]) -> bool {
        let mut l = self.table.lock(hash);
        self.reap_locked(&mut l, key)
    }

    fn reap_locked(&self, l: &mut crate::table::Locked<'_, FVal, FMeta>, key: &[u8]) -> bool {
        let g = l.guard();
        let Some(n) = l.find(key) else {
            return true;
        };
        if n.value(g).get().is_some() {
            return true;
        }
        let le = n.meta().lentry.load(Ordering::Acquire);
        if le != 0 && !self.pool.reclaimed(RecPtr(le)) {
            return true; // a newer remove is pending; its gleaner reaps
        }
        if n.meta().version.load(Ordering::Acquire) >= self.epoch_base() {
            return false;
        }
        l.remove(key);
        true
    }

    /// The heap-full error writes get while the backend has no room for a
    /// chain (`Stuck`); None otherwise.
    fn full_error(&self) -> Option<Error> {
        if !self.full.load(Ordering::Acquire) {
            return None;
        }
        let s = self.stuck.lock().unwrap_or_else(|e| e.into_inner());
        if s.keys.is_empty() {
            return None;
        }
        Some(Error::Heap(
            s.last
                .as_ref()
                .and_then(|e| e.clone_full())
                .unwrap_or(pmem::Error::HeapFull {
                    requested: 0,
                    heap_size: self.heap.region().size(),
                    max_size: self.heap.region().reserved(),
                }),
        ))
    }

    /// Records a batch's outcome for `stuck`: the keys it applied leave the
    /// set, the keys it could not apply for lack of heap join it.
    fn note_applied<'a>(
        &self,
        applied: impl Iterator<Item = &'a [u8]>,
        failed: &[Vec<u8>],
        err: Option<&Error>,
    ) {
        if failed.is_empty() && !self.full.load(Ordering::Acquire) {
            return;
        }
        let mut s = self.stuck.lock().unwrap_or_else(|e| e.into_inner());
        for k in applied {
            s.keys.remove(k);
        }
        for k in failed {
            s.keys.insert(k.clone());
        }
        if let Some(l) = err.and_then(clone_full) {
            s.last = Some(l);
        }
        self.full.store(!s.keys.is_empty(), Ordering::Release);
    }

    /// Raises the version tick above a stamp read from the backend, so that after
    /// a restart with empty logs the tick is not behind the keys' versions (eviction
    /// and tombstone reaping compare versions with the tick).
    fn saw_stamp(&self, stamp: u64) {
        self.vtick
            .fetch_max((stamp >> VERSION_SHIFT) + 1, Ordering::AcqRel);
    }
}

/// The backend-side worker: applies log records (one per session, per static
/// gleaner thread, and one in the advancer).
struct Gleaner {
    h: AnyHandle,
    slot: usize,
    log: Option<usize>,
    bval: Vec<u8>,
    chain: Vec<(RecPtr, Header)>,
    walks: Vec<Walk>,
    cpay: Vec<u8>,
    from: usize,
    /// Records applied in this batch whose flags wait for the batch's backend sync.
    pending: Vec<RecPtr>,
    /// The same records, looked up for every record a walk or the scan meets:
    /// with a fast hasher (foldhash, seeded per process; std's SipHash took
    /// about 4% of a backlog's drain).
    pending_set: foldhash::HashSet<u64>,
    /// Gleaner locks held until the batch ends (and which, as a bitmap).
    held: Vec<usize>,
    held_bits: Vec<u64>,
    /// Chains applied in this batch. Their `lentry` is released at the end of
    /// the batch.
    releases: Vec<Release>,
    /// The batch's backend writes found no room for some keys (a full heap)
    /// and it applied no other chain: `glean_batch` returns this error.
    full: Option<Error>,
    /// The batch's backend writes (key → stamp and value, `None` = remove), applied
    /// together at the end of the batch ([`index::Ops::apply_batch`]: two fences
    /// for the batch instead of one or more per write) and read back by the
    /// batch's later chains of the same key.
    writes: std::collections::HashMap<Vec<u8>, (u64, Option<Vec<u8>>)>,
    /// Gleans between other work (a session, `drain`, the advancer's idle
    /// gleaning): gives its log back after every batch, and with msync takes
    /// the smaller batches.
    inline: bool,
    /// When a batch ends before its size: see [`Cut`].
    cut: Cut,
}

/// A chain applied in a batch: key hash, key, newest record, whether the key
/// is now removed, and where its records are in the batch's `pending`.
struct Release {
    hash: u64,
    key: Vec<u8>,
    newest: u64,
    removed: bool,
    pending: std::ops::Range<usize>,
}

/// When a gleaner's batch ends early (checked before each group of chains; the
/// records gathered so far are applied and synced as a whole batch). With
/// `msync` a background batch is thousands of records and takes a large part
/// of a second; the foreground should not wait for all of it.
#[derive(Clone, Copy)]
enum Cut {
    /// Only at the batch's size or the log's durable end.
    Never,
    /// A role thread's batch: once the advancer wants fewer gleaners than
    /// there are (the role is given back after the batch).
    RoleWanted,
    /// The advancer's idle gleaning: once requests were served since (the
    /// operation counter moved from this value).
    Requests(u64),
}

impl Cut {
    fn now(self, sh: &Shared) -> bool {
        match self {
            Cut::Never => false,
            Cut::RoleWanted => {
                sh.gleaners.load(Ordering::Acquire) > sh.target.load(Ordering::Acquire)
            }
            Cut::Requests(ops) => sh.c.ops.load(Ordering::Relaxed) != ops,
        }
    }
}

enum Glean {
    Applied,
    Skipped,
}

/// Chains walked in step by a gleaner (see `glean_inner`).
const WALK_GROUP: usize = 16;

/// One chain walk: from the key's `lentry` back through `prev` to the first
/// applied record (Bullet §2.3), for the scanned record `p`.
#[derive(Default)]
struct Walk {
    p: RecPtr,
    hash: u64,
    key: Vec<u8>,
    /// The next record to read; null once the walk is over.
    cur: RecPtr,
    /// Whether the key had a chain to walk (its entry and `lentry` were there).
    started: bool,
    /// The version of the record taken last (a chain's versions decrease).
    last: u64,
    /// The records taken, newest first.
    chain: Vec<(RecPtr, Header)>,
}

/// Reads the walk's next record: takes it into the chain, or ends the walk at an
/// applied record (flagged, or pending in this batch), a reclaimed one, or the
/// chain's end. Under group commit the chain's newest records may not be durable
/// yet; they are passed over and left to a later batch: applied now, their
/// effect would be durable in the backend (and their older records flagged)
/// while a crash could still lose them from the log, and recovery would replay an
/// older value into the frontend than the backend holds. A record is durable only
/// after its `prev`, so the durable records of a chain are its older part.
fn walk_step(pool: &Pool, pending: &foldhash::HashSet<u64>, w: &mut Walk) -> Result<()> {
    let cur = w.cur;
    if cur.log() >= pool.logs.len() {
        return Err(Error::Corrupt(format!("record pointer {:#x}", cur.0)));
    }
    if pool.reclaimed(cur) {
        w.cur = RecPtr(0);
        return Ok(());
    }
    let h = pool.header(cur)?;
    if h.applied || h.opcode == OPC_PAD || pending.contains(&cur.0) {
        w.cur = RecPtr(0);
        return Ok(());
    }
    if h.version >= w.last {
        return Err(Error::Corrupt(format!(
            "log chain out of version order at {:#x}",
            cur.0
        )));
    }
    w.last = h.version;
    if !w.chain.is_empty() || pool.is_durable(cur, h.len as u64) {
        if w.chain.is_empty() {
            // The chain's newest record: its payload is read when the chain
            // is folded (put collapsing reads no older one). Its first lines
            // only: a large value is read in order anyway.
            pool.prefetch(cur, (cur.pos() % 64 + h.len as u64).div_ceil(64).min(8));
        }
        w.chain.push((cur, h));
    }
    w.cur = h.prev;
    pool.prefetch_header(w.cur);
    Ok(())
}

impl Gleaner {
    fn new(sh: &Arc<Shared>) -> Result<Gleaner> {
        let slot = sh.claim_slot()?;
        Ok(Gleaner {
            h: sh.backend.handle()?,
            slot,
            log: None,
            bval: Vec::new(),
            chain: Vec::new(),
            walks: Vec::new(),
            cpay: Vec::new(),
            from: slot,
            pending: Vec::new(),
            pending_set: Default::default(),
            held: Vec::new(),
            held_bits: vec![0; GLOCKS / 64],
            releases: Vec::new(),
            full: None,
            writes: Default::default(),
            inline: true,
            cut: Cut::Never,
        })
    }

    fn release(&mut self, sh: &Shared) {
        if let Some(i) = self.log.take() {
            sh.pool.logs[i].gleaner.store(false, Ordering::Release);
        }
    }

    /// Applies up to a batch of records from one log. True when it applied any.
    fn glean_batch(&mut self, sh: &Shared) -> Result<bool> {
        sh.enter(self.slot);
        let mut r = self.glean_inner(sh);
        // The batch's reads of the logs are over: its values are folded into
        // `writes`, and the records it flags at the end are unflagged until then,
        // so no head passes them. Leaving the epoch here lets `advance` free
        // other space to writers while the backend sync runs (under `msync` a
        // large part of a second, and seconds for a backend's first batches).
        // `end_batch` enters again to set the flags (see there).
        sh.exit(self.slot);
        if let Err(e) = self.end_batch(sh) {
            r = Err(e);
        }
        if let Some(e) = self.full.take() {
            // Nothing but chains the heap has no room for: the caller backs
            // off (a writer waiting for log space gets the error).
            if r.is_ok() {
                r = Err(e);
            }
        }
        if r.is_err() || self.inline {
            // A session gleans between requests; it must not keep a log from the
            // other gleaners (and from `drain`) while it serves or idles.
            self.release(sh);
        }
        r
    }

    /// Ends a batch, in this order: the backend updates are made durable (one sync
    /// for the batch); the records are flagged and the flags fenced; each applied
    /// chain's `lentry` is released (so `lentry` = 0 always means every record of
    /// the key is durably flagged, and a record appended later never gets a `prev`
    /// of 0 while an older one still lacks its flag); tombstones whose remove is in
    /// the backend are reaped; and only then are the keys' gleaner locks given
    /// back, so that no other gleaner re-applies a chain whose flags are not set.
    fn end_batch(&mut self, sh: &Shared) -> Result<()> {
        let mut r = Ok(());
        if !self.pending.is_empty() {
            let flushed = self
                .flush_writes()
                .and_then(|f| self.h.sync().map(|()| f).map_err(Error::from));
            match flushed {
                Ok((failed, err)) => {
                    if !failed.is_empty() {
                        self.drop_failed(sh, &failed);
                    }
                    sh.note_applied(
                        self.releases.iter().map(|r| r.key.as_slice()),
                        &failed,
                        err.as_ref(),
                    );
                    if !failed.is_empty() && self.releases.is_empty() {
                        self.full = err;
                    }
                    // The flags are set and fenced inside the epoch. A head
                    // advance that sees some of them set moves past those
                    // records, but frees their space, and makes the new head
                    // durable, only once this batch has left: after its fence.
                    // Otherwise a crash could find a head durably past one
                    // record of a chain while an older record of that chain,
                    // in another log, has no durable flag. Recovery would then
                    // find that record unflagged, with the backend already past
                    // it and no chain that reaches it: never applied, never
                    // flagged, it would hold its log's head for good.
                    if !self.pending.is_empty() {
                        sh.c.applied
                            .fetch_add(self.pending.len() as u64, Ordering::Relaxed);
                        sh.enter(self.slot);
                        sh.pool.mark_applied_all(&self.pending);
                        self.pending.clear();
                        sh.pool.fence();
                        sh.exit(self.slot);
                    }
                    for Release {
                        hash,
                        key,
                        newest,
                        removed,
                        ..
                    } in self.releases.drain(..)
                    {
                        // Under the bucket lock: the node found is the current one
                        // even while the table doubles (a swap on a copy the
                        // doubling left behind would be lost).
                        let mut l = sh.table.lock(hash);
                        let Some(n) = l.find(&key) else {
                            continue;
                        };
                        if lentry::release(&n.meta().lentry, newest)
                            && removed
                            && !sh.reap_locked(&mut l, &key)
                        {
                            drop(l);
                            sh.deferred
                                .lock()
                                .unwrap_or_else(|e| e.into_inner())
                                .push((hash, key));
                        }
                    }
                }
                Err(e) => r = Err(e),
            }
        }
        // Nothing is flagged on an error: the records are applied again later (the
        // stamps make that harmless).
        self.writes.clear();
        self.pending.clear();
        self.pending_set.clear();
        self.releases.clear();
        for i in self.held.drain(..) {
            sh.glocks[i].store(false, Ordering::Release);
            self.held_bits[i / 64] &= !(1 << (i % 64));
        }
        r
    }

    fn glean_inner(&mut self, sh: &Shared) -> Result<bool> {
        let i = match self.log {
            Some(i) => i,
            None => match sh.claim_glean_log(self.from) {
                Some(i) => {
                    self.from = i + 1;
                    self.log = Some(i);
                    i
                }
                None => return Ok(false),
            },
        };
        let l = &sh.pool.logs[i];
        // Only durable records (group commit: `durable` may lag the tail).
        let tail = l
            .tail
            .load(Ordering::Acquire)
            .min(l.durable.load(Ordering::Acquire));
        let mut pos = l
            .scan
            .load(Ordering::Relaxed)
            .max(l.head.load(Ordering::SeqCst));
        let mut skipped: Option<u64> = None;
        let mut did = 0;
        let mut seen = 0;
        let batch = match (sh.pool.heap.region().strategy(), self.inline) {
            (pmem::Strategy::Msync, false) => BATCH_MSYNC,
            (pmem::Strategy::Msync, true) => BATCH_MSYNC_INLINE,
            _ => BATCH,
        };
        // The walks of a group, kept across batches for their buffers.
        let mut walks = std::mem::take(&mut self.walks);
        let r = (|| -> Result<()> {
            loop {
                // 1. Gather the next unapplied records of distinct keys (the log
                //    is read in order: fetch a few records ahead).
                let mut n = 0;
                let mut end = false;
                if self.cut.now(sh) {
                    break;
                }
                while n < WALK_GROUP {
                    pos = sh.pool.skip_gap(pos).min(tail);
                    if pos >= tail || did + n >= batch || seen >= 8 * batch {
                        end = true;
                        break;
                    }
                    let p = RecPtr::new(i, pos);
                    sh.pool.prefetch(RecPtr::new(i, pos + 512), 2);
                    let h = sh.pool.header(p)?;
                    if h.opcode != OPC_PAD && !h.applied && !self.pending_set.contains(&p.0) {
                        if walks.len() == n {
                            walks.push(Walk::default());
                        }
                        let (group, rest) = walks.split_at_mut(n);
                        let w = &mut rest[0];
                        // Only the key: the chain's payloads are read when folded.
                        sh.pool.key(p, &h, &mut w.key);
                        w.hash = sh.hasher.hash(&w.key);
                        if group.iter().any(|o| o.hash == w.hash && o.key == w.key) {
                            // The same key twice: this record waits for the
                            // group's chains to be applied (it is then pending).
                            break;
                        }
                        walks[n].p = p;
                        n += 1;
                    }
                    seen += 1;
                    pos += h.len as u64;
                }
                if n == 0 {
                    break;
                }
                // 2. Each key's gleaner lock and chain start; the frontend
                //    buckets are fetched for the whole group first.
                let g = crossbeam_epoch::pin();
                let mut hashes = [0u64; WALK_GROUP];
                for (h, w) in hashes.iter_mut().zip(&walks[..n]) {
                    *h = w.hash;
                }
                sh.table.prefetch(&hashes[..n], &g);
                for w in &mut walks[..n] {
                    w.chain.clear();
                    w.last = u64::MAX;
                    w.cur = if self.lock_key(sh, w.hash) {
                        // No entry, or `lentry` = 0: the record is applied and its
                        // flag is on the way (another gleaner's batch), or the
                        // entry is a copy a table doubling left behind: the record
                        // is tried again later.
                        sh.table.get(w.hash, &w.key, &g).map_or(RecPtr(0), |node| {
                            RecPtr(lentry::chain_start(&node.meta().lentry))
                        })
                    } else {
                        RecPtr(0)
                    };
                    w.started = !w.cur.is_null();
                    sh.pool.prefetch_header(w.cur);
                }
                drop(g);
                // 3. The chains, walked in step: each step reads one record of
                //    every chain, whose header was fetched the step before, so
                //    the group's cache misses overlap instead of queueing.
                let mut active = n;
                while active > 0 {
                    active = 0;
                    for w in &mut walks[..n] {
                        if !w.cur.is_null() {
                            walk_step(&sh.pool, &self.pending_set, w)?;
                            active += usize::from(!w.cur.is_null());
                        }
                    }
                }
                // 4. Apply the chains in the log's order.
                for w in &mut walks[..n] {
                    let r = if w.started {
                        std::mem::swap(&mut self.chain, &mut w.chain);
                        self.apply_chain(sh, w.p, w.hash, &w.key)?
                    } else {
                        Glean::Skipped
                    };
                    match r {
                        Glean::Applied => did += 1,
                        Glean::Skipped => {
                            let at = w.p.pos();
                            skipped = Some(skipped.map_or(at, |s| s.min(at)));
                        }
                    }
                }
                if end {
                    break;
                }
            }
            Ok(())
        })();
        self.walks = walks;
        r?;
        l.scan.store(skipped.unwrap_or(pos), Ordering::Relaxed);
        if did == 0 && skipped.is_none() && pos >= tail {
            self.release(sh);
        }
        Ok(did > 0)
    }

    /// Takes the gleaner lock of the key with `hash` for the rest of the batch
    /// (held already, or free). False when another gleaner holds it.
    fn lock_key(&mut self, sh: &Shared, hash: u64) -> bool {
        let i = (hash as usize) & (GLOCKS - 1);
        if self.held_bits[i / 64] & (1 << (i % 64)) == 0 {
            if sh.glocks[i]
                .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
                .is_err()
            {
                return false;
            }
            self.held_bits[i / 64] |= 1 << (i % 64);
            self.held.push(i);
        }
        true
    }

    /// Applies the chain a walk found (in `self.chain`, newest first) for the
    /// scanned record `p`: Applied when `p` is now applied or pending.
    fn apply_chain(&mut self, sh: &Shared, p: RecPtr, hash: u64, key: &[u8]) -> Result<Glean> {
        if self.chain.is_empty() {
            return Ok(
                if self.pending_set.contains(&p.0) || sh.pool.header(p)?.applied {
                    Glean::Applied
                } else {
                    Glean::Skipped
                },
            );
        }
        self.chain.reverse();
        let newest = self.chain.last().expect("non-empty").0;
        let mut removed = false;
        if sh.opts.variant.collapse() {
            removed = self.apply_collapsed(sh, key)?;
        } else {
            for k in 0..self.chain.len() {
                removed = self.apply_one(sh, k, key)?;
            }
        }
        let from = self.pending.len();
        for (r, _) in &self.chain {
            self.pending.push(*r);
            self.pending_set.insert(r.0);
        }
        let mut in_chain = self.chain.iter().any(|(r, _)| *r == p);
        self.releases.push(Release {
            hash,
            key: key.to_vec(),
            newest: newest.0,
            removed,
            pending: from..self.pending.len(),
        });
        if !in_chain {
            in_chain = self.pending_set.contains(&p.0) || sh.pool.header(p)?.applied;
        }
        Ok(if in_chain {
            Glean::Applied
        } else {
            Glean::Skipped
        })
    }

    /// Reads record `k` of the chain's payload into `self.cpay`.
    fn load_payload(&mut self, sh: &Shared, k: usize) {
        let (r, h) = self.chain[k];
        sh.pool.payload(r, &h, &mut self.cpay);
    }

    /// Applies the batch's backend writes (see `writes`). A full heap does not
    /// fail the batch: its writes are then applied one at a time, removes
    /// first (they free space), and the keys whose write found no room are
    /// returned with the error (after the first put without room, the rest
    /// are not tried). Each write is failure-atomic and writing one
    /// again is harmless (the same stamp and value), so after the batch's
    /// failure, which may have applied any subset, each is simply written.
    fn flush_writes(&mut self) -> Result<(Vec<Vec<u8>>, Option<Error>)> {
        if self.writes.is_empty() {
            return Ok((Vec::new(), None));
        }
        let mut enc: Vec<(Vec<u8>, Option<Vec<u8>>)> = Vec::with_capacity(self.writes.len());
        for (k, (stamp, v)) in self.writes.drain() {
            let v = v.map(|v| {
                let mut e = Vec::with_capacity(v.len() + 16);
                value::encode(stamp, &v, &mut e);
                e
            });
            enc.push((k, v));
        }
        let items: Vec<(&[u8], Option<&[u8]>)> = enc
            .iter()
            .map(|(k, v)| (k.as_slice(), v.as_deref()))
            .collect();
        match self.h.apply_batch(&items) {
            Ok(()) => return Ok((Vec::new(), None)),
            Err(e) => {
                let e = Error::from(e);
                if !heap_full(&e) {
                    return Err(e);
                }
            }
        }
        let mut failed = Vec::new();
        let mut err: Option<Error> = None;
        let removes = items.iter().filter(|(_, v)| v.is_none());
        for &(k, v) in removes.chain(items.iter().filter(|(_, v)| v.is_some())) {
            if err.is_some() && v.is_some() {
                // One put found no room: the batch's other puts wait for the
                // next batch rather than each paying for a failed growth.
                failed.push(k.to_vec());
                continue;
            }
            if let Err(e) = self.h.apply_batch(&[(k, v)]) {
                let e = Error::from(e);
                if !heap_full(&e) {
                    return Err(e);
                }
                failed.push(k.to_vec());
                err.get_or_insert(e);
            }
        }
        Ok((failed, err))
    }

    /// Takes the chains of `failed` keys (their backend write found no room)
    /// out of the batch: their records stay unflagged and their `lentry`
    /// unreleased, so the chains are applied by a later batch; each log's
    /// scan cursor goes back to the earliest such record (the cursor had
    /// passed them as applied).
    fn drop_failed(&mut self, sh: &Shared, failed: &[Vec<u8>]) {
        let failed: std::collections::HashSet<&[u8]> =
            failed.iter().map(|k| k.as_slice()).collect();
        let mut keep = vec![true; self.pending.len()];
        self.releases.retain(|r| {
            if failed.contains(r.key.as_slice()) {
                keep[r.pending.clone()].fill(false);
                false
            } else {
                true
            }
        });
        let mut i = 0;
        self.pending.retain(|p| {
            let k = keep[i];
            i += 1;
            if !k {
                sh.pool.logs[p.log()]
                    .scan
                    .fetch_min(p.pos(), Ordering::AcqRel);
            }
            k
        });
    }

    /// The backend's value of `key` and its stamp, as this batch left it.
    fn backend_value(&mut self, key: &[u8]) -> Result<(u64, Option<Vec<u8>>)> {
        if let Some((s, v)) = self.writes.get(key) {
            return Ok((*s, v.clone()));
        }
        if self.h.get(key, &mut self.bval)? {
            let (s, v) = value::decode(&self.bval)
                .ok_or_else(|| Error::Corrupt("backend value without a stamp".into()))?;
            Ok((s, Some(v.to_vec())))
        } else {
            Ok((0, None))
        }
    }

    /// Records a backend write; it is applied with the batch's others at the end
    /// of the batch (`flush_writes`), before any of the batch's records is flagged.
    fn write_backend(&mut self, key: &[u8], stamp: u64, val: Option<&[u8]>) -> Result<()> {
        self.writes
            .insert(key.to_vec(), (stamp, val.map(|v| v.to_vec())));
        Ok(())
    }

    /// Applies chain record `k` alone (chain order; exactly once by the stamp).
    /// Returns whether the key is now absent.
    fn apply_one(&mut self, sh: &Shared, k: usize, key: &[u8]) -> Result<bool> {
        let h = self.chain[k].1;
        let (stamp, cur) = self.backend_value(key)?;
        if h.version <= stamp {
            return Ok(cur.is_none());
        }
        self.load_payload(sh, k);
        let new = fold(cur, h.opcode, &self.cpay)?;
        self.write_backend(key, h.version, new.as_deref())?;
        Ok(new.is_none())
    }

    /// Put collapsing (§4.4), generalised to chains with non-idempotent records:
    /// the value after the chain is computed in DRAM from the newest idempotent
    /// record (or the backend value, skipping records already in it) and the
    /// records after it, in chain order, and written once.
    fn apply_collapsed(&mut self, sh: &Shared, key: &[u8]) -> Result<bool> {
        let n = self.chain.len();
        let last_idem = self
            .chain
            .iter()
            .rposition(|(_, h)| h.opcode == OPC_PUT || h.opcode == OPC_REMOVE);
        let (mut val, from) = match last_idem {
            Some(k) => {
                self.load_payload(sh, k);
                (fold(None, self.chain[k].1.opcode, &self.cpay)?, k + 1)
            }
            None => {
                let (stamp, cur) = self.backend_value(key)?;
                let from = self
                    .chain
                    .iter()
                    .position(|(_, h)| h.version > stamp)
                    .unwrap_or(n);
                if from == n {
                    return Ok(cur.is_none()); // all in the backend already
                }
                (cur, from)
            }
        };
        for k in from..n {
            self.load_payload(sh, k);
            val = fold(val, self.chain[k].1.opcode, &self.cpay)?;
        }
        let newest = self.chain[n - 1].1.version;
        self.write_backend(key, newest, val.as_deref())?;
        sh.c.collapsed.fetch_add(n as u64 - 1, Ordering::Relaxed);
        Ok(val.is_none())
    }
}

impl Gleaner {
    /// Gives back the gleaner's log and reader slot (the gleaner holds no
    /// reference to its store, so its owner calls this).
    fn retire(&mut self, sh: &Shared) {
        self.release(sh);
        sh.exit(self.slot);
        sh.reader_used[self.slot].store(false, Ordering::Release);
    }
}

/// A gleaner for a background thread (made on that thread: index handles stay on
/// the thread that made them).
fn thread_gleaner(sh: &Arc<Shared>, what: &str) -> Option<Gleaner> {
    match Gleaner::new(sh) {
        Ok(mut g) => {
            g.inline = false;
            Some(g)
        }
        Err(e) => {
            eprintln!("ember: {what} cannot start: {e}");
            None
        }
    }
}

/// Reports a background error once per kind of message, then backs off: a full
/// heap can empty again, so the thread keeps trying.
fn backoff(what: &str, e: &Error, last: &mut String) {
    let m = e.to_string();
    if *last != m {
        eprintln!("ember: {what}: {m} (retrying)");
        *last = m;
    }
    std::thread::sleep(Duration::from_millis(10));
}

/// Runs role thread `n` (`role_gleaner`), and a new one each time a thread
/// ends because its priority was lowered (a thread cannot raise its own
/// priority again without privileges; a new thread starts at this one's).
fn role_keeper(sh: Arc<Shared>, n: usize) {
    let mut last = String::new();
    while !sh.stop.load(Ordering::Acquire) {
        let s = sh.clone();
        let t = std::thread::Builder::new()
            .name(format!("ember-gleaner-{n}"))
            .spawn(move || role_gleaner(s, n));
        match t {
            // Lowered: a new thread. Otherwise the store is closing, or the
            // thread could not start (its message is printed) or panicked: a
            // new one would fail the same way.
            Ok(t) => {
                if !matches!(t.join(), Ok(true)) {
                    return;
                }
            }
            Err(e) => backoff(
                "gleaner",
                &Error::Config(format!("cannot start a gleaner: {e}")),
                &mut last,
            ),
        }
    }
}

/// A background thread that takes a dynamic gleaner role when the advancer wants
/// one more gleaner and gives it back when it wants one fewer
/// (`BulletOptions::role_threads`). When the advancer wants one fewer while
/// the thread is in a batch, it lowers the thread's priority (`lower_roles`):
/// the batch ends (its backend writes must be made durable before its records
/// are flagged, with msync much of a second) at the priority of a background
/// task, out of the way of the requests, and the thread then ends. True when
/// it ended for that reason.
fn role_gleaner(sh: Arc<Shared>, n: usize) -> bool {
    let slot = &sh.roles[n];
    let Some(mut g) = thread_gleaner(&sh, "gleaner") else {
        return false;
    };
    g.cut = Cut::RoleWanted;
    *slot.tid.lock().unwrap_or_else(|e| e.into_inner()) = current_tid();
    let mut active = false;
    let mut last = String::new();
    while !sh.stop.load(Ordering::Acquire) && !slot.lowered.load(Ordering::Acquire) {
        let have = sh.gleaners.load(Ordering::Acquire);
        let target = sh.target.load(Ordering::Acquire);
        if !active {
            if have < target
                && sh
                    .gleaners
                    .compare_exchange(have, have + 1, Ordering::AcqRel, Ordering::Relaxed)
                    .is_ok()
            {
                active = true;
            } else {
                std::thread::sleep(Duration::from_millis(1));
            }
            continue;
        }
        if have > target
            && sh
                .gleaners
                .compare_exchange(have, have - 1, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
        {
            active = false;
            g.release(&sh);
            continue;
        }
        slot.busy.store(true, Ordering::Release);
        let r = g.glean_batch(&sh);
        slot.busy.store(false, Ordering::Release);
        match r {
            Ok(true) => {}
            Ok(false) => std::thread::sleep(Duration::from_micros(100)),
            Err(e) => backoff("gleaner", &e, &mut last),
        }
    }
    *slot.tid.lock().unwrap_or_else(|e| e.into_inner()) = 0;
    let lowered = slot.lowered.swap(false, Ordering::AcqRel);
    if active {
        sh.gleaners.fetch_sub(1, Ordering::AcqRel);
    }
    g.retire(&sh);
    lowered
}

/// The calling thread's kernel id.
fn current_tid() -> i32 {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::gettid() }
}

/// Lowers the priority of busy role threads, `excess` of them at most (the
/// advancer wants that many gleaners fewer than there are): each gives its
/// role back after its batch and ends (`role_gleaner`).
fn lower_roles(sh: &Shared, excess: usize) {
    // Lowered threads still in their batch count towards the excess.
    let lowered = sh
        .roles
        .iter()
        .filter(|s| s.lowered.load(Ordering::Acquire))
        .count();
    let mut excess = excess.saturating_sub(lowered);
    for slot in sh.roles.iter() {
        if excess == 0 {
            break;
        }
        let tid = slot.tid.lock().unwrap_or_else(|e| e.into_inner());
        if *tid == 0 || !slot.busy.load(Ordering::Acquire) || slot.lowered.load(Ordering::Acquire) {
            continue;
        }
        // Nice 19: CPU only when the serving threads leave some. Raising a
        // nice value needs no privilege; lowering it again would (hence a new
        // thread). A failure leaves the thread as it was.
        // SAFETY: setpriority has no memory preconditions; the id is a live
        // thread of this process (see `RoleSlot::tid`).
        if unsafe { libc::setpriority(libc::PRIO_PROCESS, *tid as libc::id_t, 19) } == 0 {
            slot.lowered.store(true, Ordering::Release);
            sh.c.lowered.fetch_add(1, Ordering::Relaxed);
            excess -= 1;
        }
    }
}

fn static_gleaner(sh: Arc<Shared>) {
    let Some(mut g) = thread_gleaner(&sh, "gleaner") else {
        return;
    };
    sh.gleaners.fetch_add(1, Ordering::AcqRel);
    let mut last = String::new();
    while !sh.stop.load(Ordering::Acquire) {
        match g.glean_batch(&sh) {
            Ok(true) => {}
            Ok(false) => std::thread::sleep(Duration::from_micros(100)),
            Err(e) => backoff("gleaner", &e, &mut last),
        }
    }
    sh.gleaners.fetch_sub(1, Ordering::AcqRel);
    g.retire(&sh);
}

/// Epochs in a row without a write after which a gleaner goes back to serving
/// (see `gleaners_wanted`).
const QUIET_EPOCHS: u32 = 3;

/// The number of gleaners the advancer wants after an epoch, from `t` (the
/// number it wanted before), `max` (threads that may glean), the log
/// occupancy now and one epoch ago, and `quiet` (epochs in a row in which
/// nothing was written; 0 = written this epoch).
///
/// §4.3.2: above 60% occupancy one more gleaner (while the occupancy still
/// grows), below 30% one fewer. And one refinement (the advancer applies it
/// with msync only; elsewhere `quiet` is always 0): `QUIET_EPOCHS` epochs in
/// a row in which nothing was written give a gleaner back, whatever the
/// occupancy. Logs that nobody writes cannot fill, and a read-only phase
/// should have every thread serving. The backlog waits for the next writes
/// (above 60%, a gleaner again at the first epoch with an append) or for an
/// idle spell (drained then). More than one epoch, so that a pause in the
/// writes (a slow `msync`) does not bounce the role.
fn gleaners_wanted(t: usize, max: usize, occ: f64, last_occ: f64, quiet: u32) -> usize {
    if occ > 0.6 && quiet == 0 && (t == 0 || occ > last_occ) {
        (t + 1).min(max)
    } else if (occ < 0.3 || quiet >= QUIET_EPOCHS) && t > 0 {
        t - 1
    } else {
        t.min(max)
    }
}

fn advancer(sh: Arc<Shared>) {
    let Some(mut g) = thread_gleaner(&sh, "epoch advancer") else {
        return;
    };
    let g = &mut g;
    let mut last = String::new();
    let mut last_occ = 0.0;
    let mut last_ops = u64::MAX;
    let mut last_tails = sh.pool.appended_bytes();
    let mut last_waits = sh.c.waits.load(Ordering::Relaxed);
    let mut quiet = 0u32;
    // The §4.3.2 rule's number of gleaners (`target` may add an idle drain).
    let mut base = 0usize;
    while !sh.stop.load(Ordering::Acquire) {
        // Sleep out the epoch in short naps, so that closing the store does not
        // wait for a long epoch to end.
        let start = Instant::now();
        while !sh.stop.load(Ordering::Acquire) {
            let left = sh.opts.epoch.saturating_sub(start.elapsed());
            if left.is_zero() {
                break;
            }
            std::thread::sleep(left.min(Duration::from_millis(5)));
        }
        if sh.stop.load(Ordering::Acquire) {
            break;
        }
        sh.vtick.fetch_add(1, Ordering::AcqRel);
        sh.c.epochs.fetch_add(1, Ordering::Relaxed);
        if let Err(e) = sh.advance() {
            backoff("epoch advancer", &e, &mut last);
            continue;
        }
        sh.pool.populate_ahead(POPULATE_AHEAD);
        let (used, cap) = sh.pool.occupancy();
        let occ = used as f64 / cap as f64;
        // Written this epoch: a record appended, or a writer found its log
        // full (and so appended nothing).
        let tails = sh.pool.appended_bytes();
        let waits = sh.c.waits.load(Ordering::Relaxed);
        if tails != last_tails || waits != last_waits {
            quiet = 0;
        } else {
            quiet = quiet.saturating_add(1);
        }
        last_tails = tails;
        last_waits = waits;
        // Idle: nobody served a request this epoch, so nobody is short of CPU.
        let ops = sh.c.ops.load(Ordering::Relaxed);
        let idle = ops == last_ops;
        if sh.opts.variant.dynamic() {
            let max = if sh.opts.role_threads > 0 {
                sh.opts.role_threads
            } else {
                sh.sessions.load(Ordering::Acquire).saturating_sub(1)
            };
            // The quiet rule only with msync, where gleaning during reads cost
            // the readers more than its own CPU: each page a batch writes out
            // is write-protected, a TLB shootdown (an IPI, a VM exit here) on
            // the serving cores. With the flush strategies a backlog applied
            // later costs as much as now, and the next writes would pay it
            // (`GET -P 16` then `INCR -P 16`: 5% more time in all, measured).
            let msync = matches!(sh.pool.heap.region().strategy(), pmem::Strategy::Msync);
            let quiet = if msync { quiet } else { 0 };
            base = gleaners_wanted(base, max, occ, last_occ, quiet);
            // Idle with role threads: one of them drains the logs, with the
            // large batches of a background gleaner (restarts after an idle
            // period replay nothing); its priority is lowered as soon as
            // requests come in again.
            let nt = if idle && used > 0 && !sh.roles.is_empty() {
                base.max(1)
            } else {
                base
            };
            sh.target.store(nt, Ordering::Release);
            let have = sh.gleaners.load(Ordering::Acquire);
            if nt < have {
                lower_roles(&sh, have - nt);
            }
        }
        last_occ = occ;
        // Tombstones of an earlier epoch can go now.
        let pending = std::mem::take(&mut *sh.deferred.lock().unwrap_or_else(|e| e.into_inner()));
        let mut keep = Vec::new();
        for (h, k) in pending {
            if !sh.reap(h, &k) {
                keep.push((h, k));
            }
        }
        sh.deferred
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend(keep);
        // Idle without role threads: the advancer drains the logs itself.
        // It keeps gleaning, advancing heads once per epoch, until the logs are
        // empty or requests come in again.
        // Requests that come in wait for at most part of the batch under way:
        // the batches are a session's (with msync 2,048 records, not 16,384,
        // whose writeback took long enough to slow the start of the next
        // load), and the counter is checked before each group (`Cut`).
        if idle && used > 0 && sh.roles.is_empty() {
            let mut until = Instant::now() + sh.opts.epoch;
            g.inline = true;
            g.cut = Cut::Requests(ops);
            while !sh.stop.load(Ordering::Acquire) {
                match g.glean_batch(&sh) {
                    Ok(true) => {}
                    Ok(false) => break,
                    Err(e) => {
                        backoff("idle gleaning", &e, &mut last);
                        break;
                    }
                }
                if sh.c.ops.load(Ordering::Relaxed) != ops {
                    break;
                }
                if Instant::now() >= until {
                    let _ = sh.advance();
                    until = Instant::now() + sh.opts.epoch;
                }
            }
            g.inline = false;
            g.cut = Cut::Never;
        }
        last_ops = sh.c.ops.load(Ordering::Relaxed);
    }
    g.retire(&sh);
}

/// The backend's value of `key` (stamp, value), for a frontend miss (None when the
/// frontend is complete or the backend lacks the key). A free function so that a
/// session can call it while it borrows its store (no reference-count traffic on
/// the hot path).
fn load_backend(sh: &Shared, g: &mut Gleaner, key: &[u8]) -> Result<Option<(u64, Box<[u8]>)>> {
    if sh.complete.load(Ordering::Acquire) {
        return Ok(None);
    }
    let (s, v) = g.backend_value(key)?;
    sh.saw_stamp(s);
    Ok(v.map(|v| {
        sh.c.loads.fetch_add(1, Ordering::Relaxed);
        (s, v.into_boxed_slice())
    }))
}

/// One thread's session on a Bullet store.
pub struct BulletSession {
    sh: Arc<Shared>,
    _life: Arc<Life>,
    g: Gleaner,
    side: Option<PHashHandle>,
    wlog: Option<usize>,
    gleaning: bool,
    ops: u64,
    appended: u64,
    payload: Vec<u8>,
    rng: u64,
    /// Group commit: logs appended to since the last commit, each with the
    /// span `[start, end)` of positions this session appended to it (the
    /// commit flushes that span after writing it through the file).
    uncommitted: Vec<(usize, u64, u64)>,
    /// Detached commits (`commit_detached`) not completed yet.
    detached: Arc<AtomicU64>,
}

impl Store for BulletStore {
    type Session = BulletSession;

    fn session(&self) -> Result<BulletSession> {
        if self.sh.stop.load(Ordering::Acquire) {
            return Err(Error::Closed);
        }
        let g = Gleaner::new(&self.sh)?;
        let side = match &self.sh.side {
            Some(s) => Some(s.handle()?),
            None => None,
        };
        self.sh.sessions.fetch_add(1, Ordering::AcqRel);
        Ok(BulletSession {
            rng: 0x9e37_79b9_7f4a_7c15 ^ (g.slot as u64 + 1),
            uncommitted: Vec::new(),
            detached: Arc::new(AtomicU64::new(0)),
            sh: self.sh.clone(),
            _life: self.life.clone(),
            g,
            side,
            wlog: None,
            gleaning: false,
            ops: 0,
            appended: 0,
            payload: Vec::new(),
        })
    }

    fn name(&self) -> String {
        format!("bullet-{}", self.sh.opts.variant.name())
    }

    fn durability(&self) -> Durability {
        Durability::Heap
    }

    fn key_hasher(&self) -> KeyHasher {
        self.sh.hasher
    }

    fn stats(&self) -> StoreStats {
        let (used, cap) = self.sh.pool.occupancy();
        let c = &self.sh.c;
        StoreStats {
            keys: self.sh.backend.len_estimate(),
            frontend_entries: self.sh.table.len() as u64,
            log_occupancy: used as f64 / cap as f64,
            gleaners: self.sh.gleaners.load(Ordering::Acquire) as u64,
            records_appended: c.appended.load(Ordering::Relaxed),
            records_applied: c.applied.load(Ordering::Relaxed),
            records_collapsed: c.collapsed.load(Ordering::Relaxed),
            backend_loads: c.loads.load(Ordering::Relaxed),
            evictions: c.evictions.load(Ordering::Relaxed),
            log_full_waits: c.waits.load(Ordering::Relaxed),
            epochs: c.epochs.load(Ordering::Relaxed),
            gleaner_roles_lowered: c.lowered.load(Ordering::Relaxed),
            heap_full_keys: self
                .sh
                .stuck
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .keys
                .len() as u64,
        }
    }

    fn close(&self) -> Result<()> {
        self.life.stop();
        self.sh.backend.close()?;
        if let Some(s) = &self.sh.side {
            s.close()?;
        }
        Ok(())
    }
}

impl BulletSession {
    /// A log with room for `len` bytes, held by this session (§4.3.1: a writer
    /// keeps its log until it fills, then takes the next free one). When every log
    /// is full, the writer gleans itself and advances the heads until one has room.
    /// A record other than a remove leaves `REMOVE_RESERVE` of the log free.
    /// When the backend has no room for records already in the logs (a full
    /// heap) and nothing moves, the writer gets the heap-full error instead of
    /// waiting for space that only removes can free: a put at once, a remove
    /// after `REMOVE_PATIENCE`.
    fn ensure_space(&mut self, len: u64, remove: bool) -> Result<usize> {
        let pool = &self.sh.pool;
        let keep = if remove {
            0
        } else {
            pool.size / REMOVE_RESERVE
        };
        if len + keep > pool.size {
            return Err(Error::RecordTooLarge(len, pool.size - keep));
        }
        let mut waited = false;
        let mut stalled: Option<Instant> = None;
        loop {
            if let Some(i) = self.wlog {
                if pool.fits_keeping(i, len, keep) {
                    return Ok(i);
                }
                pool.logs[i].writer.store(false, Ordering::Release);
                self.wlog = None;
            }
            let n = pool.logs.len();
            for k in 0..n {
                let j = (self.g.slot + k) % n;
                let l = &pool.logs[j];
                if l.writer.load(Ordering::Relaxed) || !pool.fits_keeping(j, len, keep) {
                    continue;
                }
                if l.writer
                    .compare_exchange(false, true, Ordering::AcqRel, Ordering::Relaxed)
                    .is_ok()
                {
                    if pool.fits_keeping(j, len, keep) {
                        if pool.group_commit.load(Ordering::Relaxed) {
                            // The log's earlier records (a previous writer's batch
                            // may not have committed yet) are durable before this
                            // session appends after them: recovery reads a log in
                            // order, so an acknowledged record must not sit behind
                            // a lost one. From here on, every record of the log
                            // past this point is this session's, made durable by
                            // its own commits.
                            let tail = l.tail.load(Ordering::Acquire);
                            if let Err(e) = pool.make_durable_to(j, tail) {
                                l.writer.store(false, Ordering::Release);
                                return Err(e);
                            }
                        }
                        self.wlog = Some(j);
                        return Ok(j);
                    }
                    l.writer.store(false, Ordering::Release);
                }
            }
            if !waited {
                waited = true;
                self.sh.c.waits.fetch_add(1, Ordering::Relaxed);
            }
            if self.sh.stop.load(Ordering::Acquire) {
                return Err(Error::Closed);
            }
            if pool.group_commit.load(Ordering::Relaxed) {
                // Gleaners apply only durable records, and the records filling
                // the logs may be uncommitted (this session's among them).
                pool.make_all_durable()?;
            }
            let did = match self.g.glean_batch(&self.sh) {
                Ok(did) => did,
                Err(e) if heap_full(&e) => false,
                Err(e) => return Err(e),
            };
            let moved = self.sh.advance()?;
            if did || moved {
                stalled = None;
            } else {
                if let Some(e) = self.sh.full_error() {
                    let since = *stalled.get_or_insert_with(Instant::now);
                    if !remove || since.elapsed() >= REMOVE_PATIENCE {
                        return Err(e);
                    }
                }
                std::thread::sleep(Duration::from_micros(50));
            }
        }
    }

    /// Group commit: a read answered from the record `seen` (a frontend
    /// entry's `lentry`; 0 for none) makes it durable first when it is in
    /// another writer's log and not yet committed. The answer may be the
    /// only acknowledgement a client gets of that state (a DEL that finds the
    /// key gone replies 0 and writes nothing), so it must not be undone by a
    /// crash before that writer commits. A record in this session's own log
    /// is its own, committed with this batch (whose replies wait for the
    /// commit), or was made durable when it took the log; a record already
    /// below its log's watermark costs one load.
    fn settle_read(&self, seen: u64) -> Result<()> {
        if seen == 0 || !self.sh.pool.group_commit.load(Ordering::Relaxed) {
            return Ok(());
        }
        let p = RecPtr(seen);
        if self.wlog == Some(p.log()) {
            return Ok(());
        }
        self.sh.pool.make_durable(p)
    }

    fn fold_counters(&mut self) {
        self.sh.c.ops.fetch_add(self.ops, Ordering::Relaxed);
        self.sh
            .c
            .appended
            .fetch_add(self.appended, Ordering::Relaxed);
        self.ops = 0;
        self.appended = 0;
    }

    fn tick(&mut self) {
        self.ops += 1;
        if self.ops >= FOLD_EVERY {
            self.fold_counters();
        }
    }

    fn next_rand(&mut self) -> u64 {
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        self.rng
    }

    /// Keeps a bounded frontend within its size: evicts entries with nothing
    /// pending from a few random buckets (§2.1: only entries whose records are all
    /// applied may go).
    fn evict(&mut self) {
        let cap = self.sh.opts.cache_entries;
        if cap == 0 || (self.sh.table.len() as u64) <= cap {
            return;
        }
        self.sh.complete.store(false, Ordering::Release);
        let base = self.sh.epoch_base();
        // About as many entries examined as the table holds per 8 buckets
        // (its load factor is at most 1).
        for _ in 0..8 {
            let b = self.sh.table.buckets();
            let i = (self.next_rand() as usize) % b.max(1);
            let Some(mut l) = self.sh.table.lock_index(i) else {
                continue;
            };
            let pool = &self.sh.pool;
            let n = l.retain(|node| {
                let le = node.meta().lentry.load(Ordering::Acquire);
                let settled = le == 0 || pool.reclaimed(RecPtr(le));
                let recent = node.meta().version.load(Ordering::Acquire) >= base;
                !settled || recent
            });
            self.sh.c.evictions.fetch_add(n as u64, Ordering::Relaxed);
            if (self.sh.table.len() as u64) <= cap {
                break;
            }
        }
    }
}

impl Drop for BulletSession {
    fn drop(&mut self) {
        let _ = Session::commit(self);
        self.fold_counters();
        if let Some(i) = self.wlog.take() {
            self.sh.pool.logs[i].writer.store(false, Ordering::Release);
        }
        if self.gleaning {
            self.sh.gleaners.fetch_sub(1, Ordering::AcqRel);
        }
        self.g.retire(&self.sh);
        self.sh.sessions.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Session for BulletSession {
    fn prefetch(&mut self, keys: &[&[u8]]) {
        prefetch_keys(&self.sh.table, &self.sh.hasher, keys);
    }

    fn get(&mut self, key: &[u8], out: &mut Vec<u8>) -> Result<bool> {
        out.clear();
        self.tick();
        let hash = self.sh.hasher.hash(key);
        // The entry's newest record, which the answer reflects (0: none).
        let mut seen = 0u64;
        let found = if self.sh.opts.variant.lockfree_gets() {
            let g = crossbeam_epoch::pin();
            self.sh.table.get(hash, key, &g).map(|n| {
                seen = n.meta().lentry.load(Ordering::Acquire);
                match n.value(&g).get() {
                    Some(v) => {
                        out.extend_from_slice(v);
                        true
                    }
                    None => false,
                }
            })
        } else {
            self.sh.table.get_shared(hash, key, |n| {
                n.map(|n| {
                    seen = n.meta().lentry.load(Ordering::Acquire);
                    let g = crossbeam_epoch::pin();
                    match n.value(&g).get() {
                        Some(v) => {
                            out.extend_from_slice(v);
                            true
                        }
                        None => false,
                    }
                })
            })
        };
        if let Some(f) = found {
            self.settle_read(seen)?;
            return Ok(f);
        }
        if self.sh.complete.load(Ordering::Acquire) {
            return Ok(false);
        }
        // The miss is served under the bucket lock, as a write's is: between an
        // unlocked backend read and the insert, another thread could create,
        // apply and evict the key, and a stale value would be cached.
        let sh = &*self.sh;
        let mut l = sh.table.lock(hash);
        let found = match l.find(key) {
            Some(n) => {
                seen = n.meta().lentry.load(Ordering::Acquire);
                match n.value(l.guard()).get() {
                    Some(v) => {
                        out.extend_from_slice(v);
                        true
                    }
                    None => false,
                }
            }
            None => match load_backend(sh, &mut self.g, key)? {
                Some((stamp, v)) => {
                    out.extend_from_slice(&v);
                    l.insert(hash, key, Blob::new(&v), FMeta::new(0, stamp));
                    true
                }
                None => false,
            },
        };
        drop(l);
        self.settle_read(seen)?;
        self.evict();
        Ok(found)
    }

    /// The keys are the frontend's live entries and the backend's keys that the
    /// frontend does not shadow (a tombstone is a removed key). One step scans the
    /// frontend from `cursor` (about `count` entries, tombstones included), then
    /// the backend from `cursor`; the next cursor is the smaller of the two (each
    /// side covers everything below its own), and what either returned past it is
    /// left for the next step.
    ///
    /// The frontend goes first: a key leaves the frontend only once the backend
    /// holds its value (eviction takes settled entries; a tombstone is reaped after
    /// the backend remove), so a key present throughout that the frontend step
    /// missed is in the backend when the backend step runs. When the frontend is
    /// complete (a full copy: nothing was ever evicted, checked after the frontend
    /// step) the backend is not read at all.
    fn scan(&mut self, cursor: u64, count: usize, out: &mut Vec<Vec<u8>>) -> Result<u64> {
        self.tick();
        let sh = &*self.sh;
        let mut front: Vec<(Vec<u8>, bool)> = Vec::new();
        let fnext = sh.table.scan(cursor, count, |n, g| {
            front.push((n.key().to_vec(), n.value(g).get().is_some()))
        });
        if sh.complete.load(Ordering::Acquire) {
            out.extend(front.into_iter().filter(|(_, live)| *live).map(|(k, _)| k));
            return Ok(fnext);
        }
        let mut back = Vec::new();
        let bnext = self.g.h.scan(cursor, count, &mut back)?;
        let next = min_cursor(fnext, bnext);
        let below = |k: &[u8]| next == 0 || index::scan_pos(sh.hasher.hash(k)) < next;
        let mut shadowed = std::collections::HashSet::new();
        for (k, live) in front {
            if below(&k) {
                if live {
                    out.push(k.clone());
                }
                shadowed.insert(k);
            }
        }
        out.extend(
            back.into_iter()
                .filter(|k| below(k) && !shadowed.contains(k)),
        );
        Ok(next)
    }

    fn apply(&mut self, key: &[u8], op: Op<'_>) -> Result<Outcome> {
        check_op(key, &op)?;
        self.tick();
        let plen = match op {
            Op::Put(v) => v.len(),
            Op::Incr(_) => 8,
            Op::Remove => 0,
        };
        let remove = matches!(op, Op::Remove);
        if !remove {
            // The backend has no room for records already logged: a put or
            // an increment would only fill the logs that removes need.
            if let Some(e) = self.sh.full_error() {
                return Err(e);
            }
        }
        let log = self.ensure_space(crl::record_len(key.len(), plen), remove)?;
        let hash = self.sh.hasher.hash(key);
        let sh = &*self.sh;
        let mut l = sh.table.lock(hash);
        if l.find(key).is_none() {
            if let Some((stamp, v)) = load_backend(sh, &mut self.g, key)? {
                l.insert(hash, key, Blob::new(&v), FMeta::new(0, stamp));
            }
        }
        let node = l.find(key);
        let g = l.guard();
        // Whether the key is live, from the value pointer's tag.
        let live = node.is_some_and(|n| n.tagged(g) != TOMB_TAG);
        let (outcome, new): (Outcome, crossbeam_epoch::Owned<Blob>) = match op {
            Op::Put(v) => {
                // A put reads only the old value's first byte (its blob's first
                // line, which a pipeline's prefetch has fetched already).
                let old_first = node
                    .filter(|_| live)
                    .and_then(|n| n.value(g).get())
                    .and_then(|b| b.first().copied());
                (
                    Outcome::Put {
                        created: !live,
                        old_first,
                    },
                    Blob::new(v),
                )
            }
            Op::Remove => {
                if !live {
                    // Nothing to write, but the acknowledgement says the key
                    // is gone: under group commit the tombstone read here may
                    // be another writer's record not committed yet, lost on a
                    // crash with the older value back. Made durable as a
                    // put's `prev` is below (the same rule: a record in this
                    // session's own log is its own, committed with this batch,
                    // or was made durable when it took the log).
                    let prev = node
                        .map(|n| lentry::prev_for_append(&n.meta().lentry))
                        .unwrap_or(0);
                    if sh.pool.group_commit.load(Ordering::Relaxed)
                        && prev != 0
                        && RecPtr(prev).log() != log
                    {
                        sh.pool.make_durable(RecPtr(prev))?;
                    }
                    return Ok(Outcome::Removed(false));
                }
                (Outcome::Removed(true), Blob::tomb())
            }
            Op::Incr(d) => {
                let cur: Option<&[u8]> = node.and_then(|n| n.value(g).get());
                let n = incr_value(cur, d)?;
                (Outcome::Int(n), Blob::new(n.to_string().as_bytes()))
            }
        };
        let base = sh.epoch_base();
        let version = node
            .map(|n| n.meta().version.load(Ordering::Acquire) + 1)
            .unwrap_or(0)
            .max(base);
        let prev = node
            .map(|n| lentry::prev_for_append(&n.meta().lentry))
            .unwrap_or(0);
        self.payload.clear();
        match op {
            Op::Put(v) => self.payload.extend_from_slice(v),
            Op::Incr(d) => self.payload.extend_from_slice(&d.to_le_bytes()),
            Op::Remove => {}
        }
        let group = sh.pool.group_commit.load(Ordering::Relaxed);
        if group && prev != 0 && RecPtr(prev).log() != log {
            // The chain's older record (maybe another writer's, not yet
            // committed) must be durable before this one can be. Not when it is
            // in this session's own log: everything before this session's
            // first record there was made durable when it took the log
            // (`ensure_space`), everything after is its own and commits with
            // this record, and recovery reads a log in order, so it finds the
            // older record whenever it finds this one.
            sh.pool.make_durable(RecPtr(prev))?;
        }
        // Where this append starts (a pad record before the record included):
        // this session holds the log, so its tail moves only here.
        let start = sh.pool.logs[log].tail.load(Ordering::Acquire);
        let rec = sh
            .pool
            .append(log, op.code(), key, &self.payload, RecPtr(prev), version)?
            .ok_or_else(|| Error::Corrupt("log space reserved for a record vanished".into()))?;
        self.appended += 1;
        if group {
            let end = rec.pos() + crl::record_len(key.len(), self.payload.len());
            match self.uncommitted.iter_mut().find(|(i, _, _)| *i == log) {
                Some(e) => {
                    e.1 = e.1.min(start);
                    e.2 = e.2.max(end);
                }
                None => self.uncommitted.push((log, start, end)),
            }
        }
        match node {
            Some(n) => {
                l.set_value(n, new);
                n.meta().version.store(version, Ordering::Release);
                lentry::publish(&n.meta().lentry, rec.0);
            }
            None => {
                l.insert(hash, key, new, FMeta::new(rec.0, version));
            }
        }
        if let Some(side) = &mut self.side {
            // The base design's transaction on the put path (§4.1, variants st and
            // lfr): the key's persistent pair records its newest log record. After
            // the frontend is updated: the record is durable, so the write has
            // happened even if this fails (the error then says so).
            side.put(key, &rec.0.to_le_bytes())?;
        }
        drop(l);
        self.evict();
        Ok(outcome)
    }

    fn awaits_commit(&self) -> bool {
        !self.uncommitted.is_empty()
    }

    fn commit(&mut self) -> Result<()> {
        if self.uncommitted.is_empty() {
            return Ok(());
        }
        if self.detached.load(Ordering::Acquire) > 0 {
            // A detached commit's records, before these in the same logs, may
            // not be durable yet, so this thread's fence would not make the
            // logs durable up to these ends: sync each from its watermark.
            for (i, _, end) in self.uncommitted.drain(..) {
                self.sh.pool.make_durable_to(i, end)?;
            }
            return Ok(());
        }
        for &(i, start, end) in &self.uncommitted {
            self.sh.pool.committing(i, start, end)?;
        }
        // One fence for the batch: it syncs what `committing` wrote and
        // flushed (and every other flush of this thread since its last fence).
        self.sh.pool.fence();
        self.sh.pool.heap.region().health()?;
        for (i, _, end) in self.uncommitted.drain(..) {
            self.sh.pool.mark_durable(i, end);
        }
        Ok(())
    }

    /// The batch's fence detached from this thread (`Region::detach_fence`):
    /// with msync, the device write runs wherever the work is completed while
    /// this session goes on. Writers that need these records durable wait for
    /// it (`committing`) as for a commit on this thread.
    fn commit_detached(&mut self) -> Result<Option<PendingCommit>> {
        if self.uncommitted.is_empty() {
            return Ok(None);
        }
        for &(i, start, end) in &self.uncommitted {
            self.sh.pool.committing(i, start, end)?;
        }
        // Detached after `committing` wrote and flushed the batch's records.
        let fence = self.sh.pool.heap.region().detach_fence();
        let marks = std::mem::take(&mut self.uncommitted);
        let sh = self.sh.clone();
        let detached = self.detached.clone();
        detached.fetch_add(1, Ordering::AcqRel);
        Ok(Some(PendingCommit::new(move || {
            let r = sh.pool.heap.region();
            r.complete_fence(fence);
            let ok = r.health();
            if ok.is_ok() {
                for (i, _, end) in marks {
                    sh.pool.mark_durable(i, end);
                }
            }
            detached.fetch_sub(1, Ordering::AcqRel);
            Ok(ok?)
        })))
    }

    /// Dynamic roles (§4.3.2): when the advancer wants more gleaners than there
    /// are, this session becomes one (at least one session always serves) and
    /// gleans a batch per call until the advancer wants fewer.
    fn maintain(&mut self) -> Result<bool> {
        let sh = &self.sh;
        if !sh.opts.variant.dynamic() || sh.opts.role_threads > 0 {
            return Ok(false);
        }
        if self.gleaning {
            let have = sh.gleaners.load(Ordering::Acquire);
            if have > sh.target.load(Ordering::Acquire)
                && sh
                    .gleaners
                    .compare_exchange(have, have - 1, Ordering::AcqRel, Ordering::Relaxed)
                    .is_ok()
            {
                self.gleaning = false;
                self.g.release(sh);
                return Ok(false);
            }
        } else {
            let have = sh.gleaners.load(Ordering::Acquire);
            let max = sh.sessions.load(Ordering::Acquire).saturating_sub(1);
            if have >= sh.target.load(Ordering::Acquire)
                || have >= max
                || sh
                    .gleaners
                    .compare_exchange(have, have + 1, Ordering::AcqRel, Ordering::Relaxed)
                    .is_err()
            {
                return Ok(false);
            }
            self.gleaning = true;
        }
        let sh = self.sh.clone();
        match self.g.glean_batch(&sh) {
            Ok(true) => {}
            Ok(false) => std::thread::sleep(Duration::from_micros(50)),
            Err(e) if heap_full(&e) => {
                // Only chains the heap has no room for: the role goes back
                // (the advancer asks again next epoch) rather than this
                // worker retrying them between its requests.
                self.gleaning = false;
                sh.gleaners.fetch_sub(1, Ordering::AcqRel);
                self.g.release(&sh);
                return Ok(false);
            }
            Err(e) => return Err(e),
        }
        Ok(true)
    }
}

#[cfg(test)]
mod role_tests {
    use super::*;

    #[test]
    fn gleaners_wanted_follows_occupancy_and_writes() {
        // §4.3.2: above 60% and growing, one more (up to `max`).
        assert_eq!(gleaners_wanted(0, 2, 0.65, 0.0, 0), 1);
        assert_eq!(gleaners_wanted(1, 2, 0.70, 0.65, 0), 2);
        assert_eq!(gleaners_wanted(2, 2, 0.80, 0.70, 0), 2);
        // Above 60% but shrinking: as many as before.
        assert_eq!(gleaners_wanted(1, 2, 0.62, 0.65, 0), 1);
        // Between 30% and 60% with writes: as many as before.
        assert_eq!(gleaners_wanted(1, 2, 0.45, 0.50, 0), 1);
        // Below 30%: one fewer.
        assert_eq!(gleaners_wanted(2, 2, 0.20, 0.25, 0), 1);
        assert_eq!(gleaners_wanted(0, 2, 0.20, 0.25, 0), 0);
        // Fewer threads than gleaners wanted: capped.
        assert_eq!(gleaners_wanted(3, 1, 0.45, 0.50, 0), 1);
        // No writes for a few epochs: one fewer, whatever the occupancy, and
        // none added while nothing is written.
        for q in 1..QUIET_EPOCHS {
            assert_eq!(gleaners_wanted(1, 2, 0.90, 0.80, q), 1, "quiet {q}");
        }
        assert_eq!(gleaners_wanted(1, 2, 0.90, 0.90, QUIET_EPOCHS), 0);
        assert_eq!(gleaners_wanted(2, 2, 0.90, 0.90, QUIET_EPOCHS + 5), 1);
        assert_eq!(gleaners_wanted(0, 2, 0.95, 0.90, QUIET_EPOCHS), 0);
        assert_eq!(gleaners_wanted(0, 2, 0.95, 0.90, 1), 0);
    }

    fn heap(dir: &std::path::Path) -> Heap {
        Heap::create(&dir.join("h"), &crate::test_heap_opts(96 << 20, 256 << 20)).unwrap()
    }

    fn opts(epoch: Duration) -> BulletOptions {
        BulletOptions {
            logs: 4,
            log_size: 8 << 20,
            backend: BackendOptions {
                buckets: 1024,
                ..Default::default()
            },
            frontend_buckets: 1024,
            epoch,
            role_threads: 1,
            ..Default::default()
        }
    }

    fn until(secs: u64, mut f: impl FnMut() -> bool) -> bool {
        let end = Instant::now() + Duration::from_secs(secs);
        while Instant::now() < end {
            if f() {
                return true;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        false
    }

    fn tid(sh: &Shared) -> i32 {
        *sh.roles[0].tid.lock().unwrap()
    }

    /// A role thread whose priority is lowered in a batch gives its role back
    /// after the batch and ends; its keeper starts another at normal priority,
    /// which takes the role again while it is wanted. Nothing is lost.
    #[test]
    fn a_lowered_role_thread_is_replaced_at_normal_priority() {
        let dir = tempfile::tempdir().unwrap();
        let heap = heap(dir.path());
        // No epoch ends during the test: `target` is the test's alone.
        let st = BulletStore::create(&heap, &opts(Duration::from_secs(3600))).unwrap();
        let sh = st.sh.clone();
        let stop = Arc::new(AtomicBool::new(false));
        const KEYS: u64 = 4000;
        let writer = {
            let st = st.clone();
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut s = st.session().unwrap();
                let mut i = 0u64;
                // Well within the logs (heads do not move without epochs).
                while i < 150_000 && !stop.load(Ordering::Acquire) {
                    let v = format!("value-{i:012}");
                    s.apply(format!("k{}", i % KEYS).as_bytes(), Op::Put(v.as_bytes()))
                        .unwrap();
                    i += 1;
                }
                i
            })
        };
        assert!(until(20, || tid(&sh) != 0), "no role thread");
        let first = tid(&sh);
        // SAFETY: getpriority has no memory preconditions.
        let nice = |t: i32| unsafe { libc::getpriority(libc::PRIO_PROCESS, t as libc::id_t) };
        assert_eq!(nice(first), 0);
        sh.target.store(1, Ordering::Release);
        assert!(
            until(20, || {
                if sh.roles[0].busy.load(Ordering::Acquire) {
                    lower_roles(&sh, 1);
                }
                sh.c.lowered.load(Ordering::Relaxed) == 1
            }),
            "the role thread was never caught in a batch"
        );
        // One lowered thread is enough for an excess of one.
        lower_roles(&sh, 1);
        assert_eq!(sh.c.lowered.load(Ordering::Relaxed), 1);
        assert!(
            until(20, || {
                let t = tid(&sh);
                t != 0 && t != first && sh.gleaners.load(Ordering::Acquire) == 1
            }),
            "no new role thread took the role"
        );
        let second = tid(&sh);
        assert_eq!(nice(second), 0, "the new thread runs at normal priority");
        assert!(!sh.roles[0].lowered.load(Ordering::Acquire));
        stop.store(true, Ordering::Release);
        let n = writer.join().unwrap();
        assert!(n > 0);
        sh.target.store(0, Ordering::Release);
        assert!(until(20, || sh.gleaners.load(Ordering::Acquire) == 0));
        st.drain().unwrap();
        assert_eq!(st.log_occupancy_bytes().0, 0);
        // Every key holds its last value (the backend alone, logs empty).
        let mut s = st.session().unwrap();
        let mut out = Vec::new();
        for k in 0..KEYS.min(n) {
            let last = k + KEYS * ((n - 1 - k) / KEYS);
            assert!(s.get(format!("k{k}").as_bytes(), &mut out).unwrap());
            assert_eq!(out, format!("value-{last:012}").as_bytes(), "key {k}");
        }
        drop(s);
        st.verify().unwrap();
        st.close().unwrap();
    }

    /// With role threads, logs left with records when requests stop are
    /// drained in the background: a role thread takes the role for it and
    /// gives it back once the logs are empty.
    #[test]
    fn idle_logs_drain_on_a_role_thread() {
        let dir = tempfile::tempdir().unwrap();
        let heap = heap(dir.path());
        let st = BulletStore::create(&heap, &opts(Duration::from_millis(5))).unwrap();
        let sh = st.sh.clone();
        {
            let mut s = st.session().unwrap();
            for i in 0..30_000u64 {
                s.apply(format!("k{}", i % 3000).as_bytes(), Op::Incr(1))
                    .unwrap();
            }
        }
        assert!(
            until(30, || st.log_occupancy_bytes().0 == 0
                && sh.gleaners.load(Ordering::Acquire) == 0
                && sh.target.load(Ordering::Acquire) == 0),
            "idle logs were not drained: {:?}",
            st.stats()
        );
        assert_eq!(st.stats().records_applied, 30_000);
        let mut s = st.session().unwrap();
        let mut out = Vec::new();
        for k in 0..3000 {
            assert!(s.get(format!("k{k}").as_bytes(), &mut out).unwrap());
            assert_eq!(out, b"10");
        }
        drop(s);
        st.close().unwrap();
    }
}

#[cfg(test)]
mod replay_tests {
    use super::*;
    use std::collections::HashMap;

    fn heap_opts() -> pmem::HeapOptions {
        crate::test_heap_opts(64 << 20, 64 << 20)
    }

    fn opts() -> BulletOptions {
        BulletOptions {
            logs: 4,
            log_size: 1 << 20,
            backend: BackendOptions {
                buckets: 1024,
                ..Default::default()
            },
            frontend_buckets: 1024,
            // Nothing gleans but the test: records stay in the logs.
            epoch: Duration::from_secs(600),
            static_gleaners: 0,
            role_threads: 0,
            // Both halves of the fold on two threads.
            parallel_replay_from: 2,
            ..Default::default()
        }
    }

    /// The two halves of a recovery's fold each take a heap thread slot (a
    /// backend handle); with one slot the second half cannot get one, and the
    /// halves run one after the other instead.
    #[test]
    fn replay_with_one_thread_slot_runs_the_halves_in_turn() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("h");
        let mut ho = heap_opts();
        ho.geometry.nslots = 1;
        // The store's epoch advancer takes a slot for its gleaner when it
        // starts: with one slot, it and this session race for it. Until the
        // session wins, a new heap.
        for attempt in 0.. {
            let _ = std::fs::remove_file(&path);
            let heap = Heap::create(&path, &ho).unwrap();
            let st = BulletStore::create(&heap, &opts()).unwrap();
            let mut s = match st.session() {
                Ok(s) => s,
                Err(Error::Index(index::Error::Heap(pmem::Error::NoThreadSlot(_))))
                    if attempt < 50 =>
                {
                    continue
                }
                Err(e) => panic!("{e}"),
            };
            for k in 0..300u64 {
                s.apply(format!("k{k}").as_bytes(), Op::Incr(k as i64))
                    .unwrap();
            }
            break;
        }
        let rec = Heap::open(&path, &ho).unwrap();
        // (The store then has no slot for a session: only the replay is
        // checked, by its counts.)
        let (_st, stats) = BulletStore::open(rec, &opts()).unwrap();
        assert_eq!((stats.keys, stats.replayed), (300, 300), "{stats:?}");
    }

    /// Recovery groups the logs' records by key hash; keys whose hashes
    /// collide (here: forced, every other key under one hash) still get their
    /// own values, including keys whose records are partly in the backend.
    #[test]
    fn replay_separates_keys_whose_hashes_collide() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("h");
        let mut model: HashMap<String, Option<Vec<u8>>> = HashMap::new();
        {
            let heap = Heap::create(&path, &heap_opts()).unwrap();
            let st = BulletStore::create(&heap, &opts()).unwrap();
            let mut s = st.session().unwrap();
            let mut round = |s: &mut BulletSession, r: usize| {
                for k in 0..200usize {
                    let key = format!("key-{k}{}", "x".repeat(k % 3));
                    match (k + r) % 4 {
                        0 | 1 => {
                            let v = format!("v{r}-{k}").into_bytes();
                            s.apply(key.as_bytes(), Op::Put(&v)).unwrap();
                            model.insert(key, Some(v));
                        }
                        2 => {
                            let n = match model.get(&key) {
                                Some(Some(v)) => match std::str::from_utf8(v)
                                    .ok()
                                    .and_then(|t| t.parse::<i64>().ok())
                                {
                                    Some(n) => n,
                                    None => continue,
                                },
                                _ => 0,
                            };
                            s.apply(key.as_bytes(), Op::Incr(k as i64)).unwrap();
                            model.insert(key, Some((n + k as i64).to_string().into_bytes()));
                        }
                        _ => {
                            s.apply(key.as_bytes(), Op::Remove).unwrap();
                            model.insert(key, None);
                        }
                    }
                }
                // Counters: after the partial glean below, their unflagged
                // records are all increments, folded onto the backend value.
                for c in 0..50usize {
                    let key = format!("cnt-{c}{}", "y".repeat(c % 2));
                    s.apply(key.as_bytes(), Op::Incr(c as i64 + 1)).unwrap();
                    let n = match model.get(&key) {
                        Some(Some(v)) => std::str::from_utf8(v).unwrap().parse::<i64>().unwrap(),
                        _ => 0,
                    };
                    model.insert(key, Some((n + c as i64 + 1).to_string().into_bytes()));
                }
            };
            round(&mut s, 0);
            round(&mut s, 1);
            // Part of the records in the backend and flagged, the rest not.
            drop(s);
            st.drain().unwrap();
            let mut s = st.session().unwrap();
            round(&mut s, 2);
            round(&mut s, 3);
            drop(s);
            // One batch of one log: its records are applied and flagged but
            // stay in the log (no head advance), so recovery finds flagged
            // records, and increments after them (folded onto the backend).
            let mut g = Gleaner::new(&st.sh).unwrap();
            assert!(g.glean_batch(&st.sh).unwrap());
            g.retire(&st.sh);
            let mut s = st.session().unwrap();
            round(&mut s, 6);
            // Increments only since the batch, for the keys holding numbers:
            // recovery folds them onto the backend's value.
            for (k, v) in model.iter_mut() {
                let n = match v {
                    Some(b) => match std::str::from_utf8(b)
                        .ok()
                        .and_then(|t| t.parse::<i64>().ok())
                    {
                        Some(n) => n,
                        None => continue,
                    },
                    None => 0,
                };
                s.apply(k.as_bytes(), Op::Incr(5)).unwrap();
                *v = Some((n + 5).to_string().into_bytes());
            }
            drop(s);
            assert!(st.log_occupancy_bytes().0 > 0);
            // Dropped without `close`: the next open replays the logs.
        }
        COLLIDE.with(|c| c.set(true));
        let rec = Heap::open(&path, &heap_opts()).unwrap();
        let (st, stats) = BulletStore::open(rec, &opts()).unwrap();
        COLLIDE.with(|c| c.set(false));
        assert!(stats.replayed > 0 && stats.keys > 100, "{stats:?}");
        // Some records were flagged, so not all were replayed.
        assert!(stats.replayed < stats.records, "{stats:?}");
        let mut s = st.session().unwrap();
        let mut out = Vec::new();
        for (k, v) in &model {
            let found = s.get(k.as_bytes(), &mut out).unwrap();
            assert_eq!(found.then_some(out.clone()), *v, "key {k}");
        }
        drop(s);
        st.drain().unwrap();
        st.verify().unwrap();
    }
}
