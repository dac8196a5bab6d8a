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
//! - **Scan** (cursor, [`Session::scan`](crate::Session::scan)): the
//!   frontend's buckets covering the step (under their shared locks), then the
//!   backend index's scan from the same cursor; the step ends at the smaller
//!   of the two next cursors; frontend tombstones hide backend keys. The
//!   frontend goes first because a key leaves it only after the backend holds
//!   it. A complete frontend is scanned alone.
//! - **Glean** (§2.3, §4.4): a gleaner holds a log, walks it from its cursor, and
//!   for each unapplied record takes the key's gleaner lock (or skips the record:
//!   whoever holds the key applies it), walks the key's chain from the frontend
//!   `lentry` back through `prev` to the first applied record, and applies the
//!   chain oldest first (the chains of up to 16 records of distinct keys are
//!   walked in step, so that their cache misses overlap). Each backend value
//!   carries the version of the newest record it includes (see
//!   [`crate::value`]), which makes re-applying a record after a crash
//!   harmless. With put collapsing (variant `full`), a chain is
//!   folded in DRAM from its newest idempotent record (or from the backend value
//!   when it has none) and written once. Increments and merges (a
//!   collection piece's edit: the writer computes the new piece in the
//!   frontend, the record carries the edit) are folded in chain order, each
//!   exactly once. At the end of a batch the backend is
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
//!
//! The code: `options.rs` (variants and options), `open.rs` (creating and
//! opening a store: the descriptor's parts, the store's shared state and
//! threads), `replay.rs` (recovery's replay of the logs), `session.rs` (a
//! session's read and write path), `glean.rs` (the gleaner), `roles.rs`
//! (gleaner threads and roles, their priorities, the epoch advancer). This
//! file holds the shared state, the store's own API, and the reader epochs
//! and head advance.

mod glean;
mod open;
mod options;
mod replay;
mod roles;
mod session;

pub use open::{check_logs, is_bullet_root, BulletParts, BulletRecovery, LogFacts};
pub use options::{BulletOptions, Variant};
pub use session::BulletSession;

use crate::crl::{Pool, RecPtr, OPC_PAD};
use crate::table::{Blob, Table};
use crate::{
    incr_value, lentry, merge_value, value, Durability, Error, Result, Store, StoreStats, OPC_INCR,
    OPC_MERGE, OPC_PUT, OPC_REMOVE,
};
use glean::Gleaner;
use index::any::AnyIndex;
use index::{Index, KeyHasher, Ops, PHash};
use pmem::Heap;
use roles::RoleSlot;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

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
const SIDE_ROOT: u64 = 32;
/// The least share of `BulletOptions::backlog_limit` a log gets.
const MIN_BACKLOG_SHARE: u64 = 4 << 10;

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
    released: AtomicU64,
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

impl BulletStore {
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
        OPC_MERGE => Some(merge_value(val.as_deref(), payload).map_err(|e| {
            Error::Corrupt(format!("Merge record does not apply to its value: {e}"))
        })?),
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
        if le != 0 && (lentry::is_pending(le) || !self.pool.reclaimed(RecPtr(le))) {
            return true; // a newer remove is pending (or a batch); its gleaner reaps
        }
        if n.meta().version.load(Ordering::Acquire) >= self.epoch_base() {
            return false;
        }
        l.remove(key);
        true
    }

    /// Each log's share of `BulletOptions::backlog_limit` (`u64::MAX`: no
    /// bound). At least a few records' worth, so that a small bound over
    /// many logs still lets writers append.
    fn backlog_share(&self) -> u64 {
        match self.opts.backlog_limit {
            0 => u64::MAX,
            b => (b / self.pool.logs.len() as u64).max(MIN_BACKLOG_SHARE),
        }
    }

    /// The bytes the gleaner roles measure the logs' occupancy against: the
    /// logs' capacity, or the backlog bound when it is smaller.
    fn backlog_capacity(&self, cap: u64) -> u64 {
        match self.opts.backlog_limit {
            0 => cap,
            b => cap.min(b).max(1),
        }
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

impl Store for BulletStore {
    type Session = BulletSession;

    fn session(&self) -> Result<BulletSession> {
        BulletSession::new(self)
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
            log_bytes_appended: self.sh.pool.appended_bytes(),
            log_bytes_released: c.released.load(Ordering::Relaxed),
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
