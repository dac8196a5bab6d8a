//! How Redis keys and values are laid out in a store, and the keyspace
//! operations every command is built from.
//!
//! # Persistent format (stable: it is what the heap holds)
//! - **store key** = database number (1 byte, at most 254) ‖ the client's key.
//! - **store value** = tag byte ‖ \[expiry\] ‖ payload. The tag's low 7 bits are
//!   the type ([`KIND_STRING`] 1, [`KIND_LIST`] 2, [`KIND_HASH`] 3,
//!   [`KIND_SET`] 4, [`KIND_ZSET`] 5, [`KIND_STREAM`] 6); bit 7 set means an 8-byte
//!   little-endian expiry follows (absolute Unix time in ms). A string's
//!   payload is its bytes; a collection's is its head
//!   ([`engine::types::head`]).
//! - **pieces** of large collections live under internal store keys whose
//!   first byte is [`PIECE_PREFIX`] (0xFF, which no database number is):
//!   they are not keys of any database, and scans, counts and expiry skip
//!   them (docs/design-collections.md).
//!
//! A TTL therefore lives in the same heap value as the data: it is written by
//! the same durable operation and kept across restarts.
//!
//! # Writes are staged, then applied
//! A command that writes does not change the store while it decides: its
//! writes ([`Keyspace::put`], [`Keyspace::delete`], ...) are staged as
//! [`engine::Op`]s in the command's [`engine::WriteBatch`], with every
//! non-deterministic input already resolved (a relative TTL is stored as an
//! absolute time, computed from the command's clock). Reads inside the
//! command see its staged writes ([`Keyspace::lookup_raw`] looks in the batch
//! first). [`Keyspace::apply`] then applies the batch with
//! [`engine::Session::apply_batch`] and adds what it did to the key counts.
//! The batch is the unit a log, a replica or a transaction takes.
//!
//! # Atomicity
//! String gets of one key take no lock (they read again under it when a
//! SWAPDB moved keys meanwhile: [`Stripes::moving`]; MGET of several keys and
//! collection reads take the keys' stripe locks: see [`crate::coll`]). Every command that writes takes the stripe locks of its
//! keys (sorted, so multi-key commands cannot deadlock) around its
//! read-modify-write and applies its batch before it releases them, so
//! commands on one key are linearizable as in Redis. A command's batch is
//! also all-or-nothing across a crash (process kill, or OS crash or power
//! loss in the heap's durability mode) with the `bullet` and `direct`
//! engines ([`engine::Session::apply_batch`]): after a restart MSET, MSETNX,
//! RENAME and every other command that applies one batch left all of its
//! writes or none, and an acknowledged one all; a batch that fails (an
//! increment of a non-integer) applies nothing. FLUSHDB, FLUSHALL and
//! SWAPDB are several batches behind a marker that a restart completes
//! (`cmd::finish_flushes`, `cmd::finish_swap`). The `volatile` engine applies a batch operation
//! by operation.

use crate::counts::{Delta, KeyCounts};
use engine::{Op, Outcome, Session, WriteBatch};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{SystemTime, UNIX_EPOCH};

/// The string type.
pub const KIND_STRING: u8 = 1;
/// The list type.
pub const KIND_LIST: u8 = 2;
/// The hash type.
pub const KIND_HASH: u8 = 3;
/// The set type.
pub const KIND_SET: u8 = 4;
/// The sorted set type.
pub const KIND_ZSET: u8 = 5;
/// The stream type.
pub const KIND_STREAM: u8 = 6;
pub use engine::types::head::PIECE_PREFIX;
const EXPIRY_BIT: u8 = 0x80;
/// Tag bit of a string written through the memcached protocol: a header of
/// [`MC_HEADER`] bytes (client flags, CAS, item bits, last access; see
/// `memcache::item`) follows the expiry, before the payload.
pub const MC_BIT: u8 = 0x40;
/// Bytes of the memcached item header.
pub const MC_HEADER: usize = 17;

/// Bytes a store value adds to the payload at most.
pub const VALUE_OVERHEAD: usize = 9;

/// Now, in Unix milliseconds.
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// A decoded value header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    pub kind: u8,
    /// Absolute expiry (Unix ms).
    pub expire: Option<i64>,
    /// Offset of the payload in the raw value.
    pub off: usize,
}

/// Decodes a raw store value's header; `None` when it is not a value this
/// version wrote (the caller reports corruption, never panics).
pub fn decode(raw: &[u8]) -> Option<Header> {
    let tag = *raw.first()?;
    let kind = tag & !(EXPIRY_BIT | MC_BIT);
    if !(KIND_STRING..=KIND_STREAM).contains(&kind) || (tag & MC_BIT != 0 && kind != KIND_STRING) {
        return None;
    }
    let mc = if tag & MC_BIT != 0 { MC_HEADER } else { 0 };
    if tag & EXPIRY_BIT != 0 {
        let b: [u8; 8] = raw.get(1..9)?.try_into().ok()?;
        if raw.len() < 9 + mc {
            return None;
        }
        Some(Header {
            kind,
            expire: Some(i64::from_le_bytes(b)),
            off: 9 + mc,
        })
    } else {
        if raw.len() < 1 + mc {
            return None;
        }
        Some(Header {
            kind,
            expire: None,
            off: 1 + mc,
        })
    }
}

/// Encodes a value into `out` (cleared first).
pub fn encode(kind: u8, expire: Option<i64>, payload: &[u8], out: &mut Vec<u8>) {
    out.clear();
    out.reserve(payload.len() + VALUE_OVERHEAD);
    encode_into(kind, expire, payload, out);
}

/// Appends a value's encoding to `out`.
fn encode_into(kind: u8, expire: Option<i64>, payload: &[u8], out: &mut Vec<u8>) {
    match expire {
        Some(t) => {
            out.push(kind | EXPIRY_BIT);
            out.extend_from_slice(&t.to_le_bytes());
        }
        None => out.push(kind),
    }
    out.extend_from_slice(payload);
}

/// The Redis type name of a kind.
pub fn type_name(kind: u8) -> &'static str {
    match kind {
        KIND_STRING => "string",
        KIND_LIST => "list",
        KIND_HASH => "hash",
        KIND_SET => "set",
        KIND_ZSET => "zset",
        KIND_STREAM => "stream",
        _ => "unknown",
    }
}

/// Why a keyspace operation failed: each maps to one reply.
#[derive(Debug)]
pub enum KsError {
    /// A value in the heap that this version cannot read.
    Corrupt,
    /// A command inside a unit (`cmd::unit`) touched a key whose lock the
    /// unit does not hold: the unit runs again with every lock.
    Undeclared,
    Store(engine::Error),
    /// A replicated write that did not apply (see [`crate::cluster`]).
    Repl(repl::ReplError),
}

impl From<engine::Error> for KsError {
    fn from(e: engine::Error) -> Self {
        KsError::Store(e)
    }
}

/// Writes refused for lack of room (a full heap or a full file system), and
/// the last refusal's reason (INFO's `heap_oom_errors`, `heap_full_reason`);
/// counted when the refusal is replied ([`crate::cmd::CmdError::text`]).
pub static OOM_ERRORS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
pub static OOM_REASON: Mutex<String> = Mutex::new(String::new());

pub type KsResult<T> = Result<T, KsError>;

/// Stripe locks serialising writers of the same key.
pub struct Stripes {
    locks: Vec<Mutex<()>>,
    /// Seeded per process (the stripes are not persistent). Keys that share a
    /// stripe only take turns at its lock: there is no chain to walk.
    hasher: foldhash::fast::RandomState,
    /// A sequence lock for the readers that take no lock: odd while a
    /// SWAPDB (holding every stripe) moves keys between databases, bumped
    /// again when it is done. A reader that saw it odd or changed reads
    /// again under its key's stripe lock ([`Keyspace::get`]).
    moving: std::sync::atomic::AtomicU64,
}

impl Stripes {
    pub fn new(n: usize) -> Stripes {
        Stripes {
            locks: (0..n.next_power_of_two()).map(|_| Mutex::new(())).collect(),
            hasher: foldhash::fast::RandomState::default(),
            moving: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// Marks the start (then the end) of keys moving between databases
    /// while every stripe is held (SWAPDB): lock-free readers meanwhile
    /// read again under their stripe lock.
    pub fn moving(&self) {
        self.moving
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }

    fn index(&self, skey: &[u8]) -> usize {
        (std::hash::BuildHasher::hash_one(&self.hasher, skey) as usize) & (self.locks.len() - 1)
    }

    /// Locks the stripes of every key (deduplicated, in index order).
    pub fn lock_many<'a>(&'a self, skeys: &[&[u8]]) -> Vec<MutexGuard<'a, ()>> {
        let mut ix: Vec<usize> = skeys.iter().map(|k| self.index(k)).collect();
        ix.sort_unstable();
        ix.dedup();
        ix.into_iter()
            .map(|i| self.locks[i].lock().unwrap_or_else(|p| p.into_inner()))
            .collect()
    }

    /// Locks every stripe, in index order (a transaction or script that
    /// touches keys it cannot name in advance).
    pub fn lock_all(&self) -> StripeGuard<'_> {
        StripeGuard::Many(
            self.locks
                .iter()
                .map(|l| l.lock().unwrap_or_else(|p| p.into_inner()))
                .collect(),
        )
    }

    /// Locks the stripes of `skeys`: [`Self::lock`] for one key (no
    /// allocation), [`Self::lock_many`] for more.
    pub fn lock_set<'a>(&'a self, skeys: &[&[u8]]) -> StripeGuard<'a> {
        match skeys {
            [one] => StripeGuard::One(self.lock(one)),
            many => StripeGuard::Many(self.lock_many(many)),
        }
    }

    pub fn lock(&self, skey: &[u8]) -> MutexGuard<'_, ()> {
        self.locks[self.index(skey)]
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }
}

/// The stripe locks a command holds (released on drop).
pub enum StripeGuard<'a> {
    One(MutexGuard<'a, ()>),
    Many(Vec<MutexGuard<'a, ()>>),
}

/// The store key of `key` in database `db`.
pub fn skey(db: u8, key: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(key.len() + 1);
    k.push(db);
    k.extend_from_slice(key);
    k
}

/// The value of a plain free-list entry that `op` on `skey` puts (not a
/// COPY's in-progress one).
fn lazy_entry<'a>(skey: &[u8], op: &Op<'a>) -> Option<&'a [u8]> {
    match op {
        Op::Put(v)
            if crate::housekeep::parse_gc_key(skey).is_some()
                && v.first()
                    .is_some_and(|b| b & crate::housekeep::IN_PROGRESS == 0) =>
        {
            Some(v)
        }
        _ => None,
    }
}

/// What the running command wrote to one piece. Its reads see the piece's
/// newest bytes either way; the batch carries what the variant says.
enum PieceWrite {
    /// Written whole (a put of these bytes, or a remove: None).
    Whole(Option<Vec<u8>>),
    /// Changed by edits only: the batch carries one `Merge` per edit, in
    /// order (each an encoded [`engine::types::edit::Edit`]); `bytes` is
    /// the piece after them, `logged` the log bytes of their records.
    Edits {
        bytes: Vec<u8>,
        edits: Vec<Vec<u8>>,
        logged: u64,
    },
}

/// One worker's door into the keyspace: its store session and scratch buffers.
pub struct Keyspace {
    pub sess: Box<dyn Session>,
    /// The raw value of the last lookup.
    pub raw: Vec<u8>,
    kbuf: Vec<u8>,
    /// The running command's writes, not yet applied.
    staged: WriteBatch,
    /// The running command's piece writes (see [`PieceWrite`]): a command
    /// may change one piece many times (3,000 pushes fill a leaf 128
    /// times), and its batch carries each piece once, whole or as its
    /// edits, whichever logs fewer bytes. Staged by [`Keyspace::apply`].
    pieces: std::collections::HashMap<Vec<u8>, PieceWrite>,
    /// For each staged remove, the key's state its caller found (Some(has a
    /// TTL)); None for puts (a put learns what it replaced from its outcome).
    before: Vec<Option<bool>>,
    outcomes: Vec<Outcome>,
    /// Keys deleted because they had expired (INFO `expired_keys`).
    pub expired: u64,
    /// `notify-keyspace-events` (shared with `Pubsub`): while its `x` or
    /// `n` class is on, the store keys found expired and those a write
    /// created are logged for [`crate::notify`] to publish.
    pub notify: Arc<std::sync::atomic::AtomicU32>,
    pub expired_log: Vec<Vec<u8>>,
    pub created_log: Vec<Vec<u8>>,
    /// The running command reads (Redis's `lookupKeyRead`): a key its
    /// lookups ([`Self::get`], [`Self::lookup_locked`]) do not find is a
    /// `keymiss` event while that class is on. Set by the dispatcher for
    /// read-only commands.
    pub reading: bool,
    /// The store keys a write command only reads (its misses are `keymiss`
    /// events too: `acl::read_keys`); set by the dispatcher while that class
    /// is on.
    pub read_keys: Vec<Vec<u8>>,
    /// Events of the running command, published when it ends (class,
    /// Redis's name, store key).
    pub events: Vec<(u32, &'static str, Vec<u8>)>,
    /// The per-database key counts every write here keeps (DBSIZE).
    counts: Arc<KeyCounts>,
    /// This worker's shard of them.
    shard: usize,
    /// The TTL index and the lazy-free queue, which applied writes feed.
    hk: Arc<crate::housekeep::Housekeeping>,
    /// The unit of several commands running (a transaction's EXEC, a
    /// script): see [`Unit`].
    unit: Option<Unit>,
    /// Watched keys (WATCH), which applied writes touch.
    watches: Arc<crate::watch::Watches>,
    /// Client-side caching: the keys applied writes modified (see
    /// [`crate::tracking`]).
    pub track: crate::tracking::Local,
    /// Set before a script when eviction could not free enough memory: its
    /// `denyoom` commands are refused until it writes (see
    /// [`crate::evict::script_refuses`]).
    pub pre_oom: bool,
    /// This node's replication, when it is one of a cluster: the batches
    /// [`Keyspace::apply`] applies are replicated (see [`crate::cluster`]).
    repl: Option<Arc<crate::cluster::Cluster>>,
    /// Set around node-local work (the lazy free of pieces): applied here
    /// only, not replicated.
    local: bool,
    /// The Raft index of the last batch this keyspace replicated (the
    /// command's client takes it: see `cmd::execute`).
    pub repl_index: u64,
}

/// A unit of several commands in progress (`cmd::unit`): its stripe locks
/// are held by its runner, so the commands inside take none; while `hold`
/// is set, [`Keyspace::apply`] keeps every write staged, so that the unit's
/// writes are applied as one batch when it ends. A command inside that
/// touches a database key outside `keys` (unless `all`) marks the unit
/// `escaped`: its runner drops what it staged and runs it again with every
/// stripe locked.
pub struct Unit {
    pub all: bool,
    pub keys: std::collections::HashSet<Vec<u8>>,
    pub hold: bool,
    pub escaped: bool,
}

/// A live value found by [`Keyspace::get`] or [`Keyspace::lookup_locked`]; the payload is
/// `ks.raw[h.off..]`.
pub type Found = Option<Header>;

impl Keyspace {
    pub fn new(
        sess: Box<dyn Session>,
        counts: Arc<KeyCounts>,
        shard: usize,
        hk: Arc<crate::housekeep::Housekeeping>,
    ) -> Keyspace {
        Keyspace {
            sess,
            raw: Vec::new(),
            kbuf: Vec::new(),
            staged: WriteBatch::new(),
            pieces: std::collections::HashMap::new(),
            before: Vec::new(),
            outcomes: Vec::new(),
            expired: 0,
            notify: Arc::default(),
            expired_log: Vec::new(),
            created_log: Vec::new(),
            reading: false,
            read_keys: Vec::new(),
            events: Vec::new(),
            counts,
            shard,
            hk,
            unit: None,
            watches: Arc::default(),
            track: Default::default(),
            pre_oom: false,
            repl: None,
            local: false,
            repl_index: 0,
        }
    }

    /// Makes this keyspace's writes go through replication.
    pub fn set_repl(&mut self, r: Option<Arc<crate::cluster::Cluster>>) {
        self.repl = r;
    }

    /// Marks the writes that follow as node-local (not replicated) until
    /// cleared: the lazy free's, whose pieces every node frees on its own.
    pub fn set_local(&mut self, local: bool) {
        self.local = local;
    }

    /// True on a node of a cluster that is not its leader now: it takes no
    /// writes and deletes no expired key of its own.
    pub fn follower(&self) -> bool {
        self.repl.as_ref().is_some_and(|r| !r.is_leader())
    }

    /// Makes applied writes touch the server's watched keys (a worker's
    /// keyspace; others have a registry of their own that nobody watches).
    pub fn set_watches(&mut self, w: Arc<crate::watch::Watches>) {
        self.watches = w;
    }

    /// Begins a unit (see [`Unit`]); its runner holds the locks.
    pub fn begin_unit(&mut self, all: bool, keys: std::collections::HashSet<Vec<u8>>) {
        self.unit = Some(Unit {
            all,
            keys,
            hold: true,
            escaped: false,
        });
    }

    /// Ends the unit: its writes are still staged (the runner applies them,
    /// or drops them with [`Self::discard_staged`]).
    pub fn end_unit(&mut self) -> Option<Unit> {
        self.unit.take()
    }

    /// The running unit, if any.
    pub fn unit(&self) -> Option<&Unit> {
        self.unit.as_ref()
    }

    /// Whether a unit runs (its runner holds the locks).
    pub fn in_unit(&self) -> bool {
        self.unit.is_some()
    }

    /// Sets whether the running unit keeps its writes staged (a command that
    /// needs the store's applied view, such as FLUSHDB, runs with it off).
    pub fn set_hold(&mut self, hold: bool) {
        if let Some(u) = &mut self.unit {
            u.hold = hold;
        }
    }

    /// Whether a command may touch store key `skey`: always outside a unit;
    /// inside one, when its runner holds the key's lock (an internal key is
    /// its collection's, whose key was checked). Otherwise the unit is
    /// marked escaped.
    pub fn may_touch(&mut self, skey: &[u8]) -> bool {
        let Some(u) = &mut self.unit else {
            return true;
        };
        if u.all || skey.first() == Some(&PIECE_PREFIX) || u.keys.contains(skey) {
            return true;
        }
        u.escaped = true;
        false
    }

    /// Marks the running unit escaped (a command in it needs every lock).
    pub fn escape(&mut self) {
        if let Some(u) = &mut self.unit {
            u.escaped = !u.all;
        }
    }

    /// Drops every staged write (a unit run again after it escaped).
    pub fn discard_staged(&mut self) {
        self.staged.clear();
        self.pieces.clear();
        self.before.clear();
    }

    /// The database keys the staged writes touch (to wake blocked clients
    /// after a unit).
    pub fn staged_keys(&self) -> Vec<Vec<u8>> {
        let mut v: Vec<Vec<u8>> = self
            .staged
            .iter()
            .filter(|(k, _)| k.first() != Some(&PIECE_PREFIX))
            .map(|(k, _)| k.to_vec())
            .collect();
        v.sort_unstable();
        v.dedup();
        v
    }

    /// Every write to the store goes through here: applies the staged batch
    /// and adds what each operation did to the key counts (see
    /// [`crate::counts`]). A write command calls it before it releases its
    /// stripe locks; it does nothing when nothing is staged. On an error the
    /// `bullet` and `direct` stores applied nothing of the batch; the
    /// `volatile` store keeps the operations before the failing one (counted
    /// here from the outcomes it returned), and the rest are dropped.
    pub fn apply(&mut self) -> KsResult<()> {
        if self.unit.as_ref().is_some_and(|u| u.hold) {
            return Ok(());
        }
        for (k, v) in self.pieces.drain() {
            match v {
                PieceWrite::Whole(Some(b)) => {
                    self.staged.put(&k, &b);
                    self.before.push(None);
                }
                PieceWrite::Whole(None) => {
                    self.staged.remove(&k);
                    self.before.push(Some(false));
                }
                PieceWrite::Edits { edits, .. } => {
                    for e in edits {
                        self.staged.merge(&k, &e);
                        self.before.push(None);
                    }
                }
            }
        }
        if self.staged.is_empty() {
            return Ok(());
        }
        let counts = &*self.counts;
        let log_new =
            self.notify.load(std::sync::atomic::Ordering::Relaxed) & crate::notify::NEW != 0;
        let now = now_ms();
        self.outcomes.clear();
        let (r, guard) = match &self.repl {
            // A cluster's write: committed by a quorum and applied by the
            // apply thread before this returns (see `crate::cluster`). The
            // recount's guard is not held across that wait (the apply
            // thread may need it): taken after, for the counts only.
            Some(c) if !self.local => {
                let r = match c.replicate(&self.staged, &mut self.outcomes) {
                    Ok(index) => {
                        self.repl_index = index;
                        Ok(())
                    }
                    Err(crate::cluster::ReplFailure::Store(e)) => Err(KsError::Store(e)),
                    Err(crate::cluster::ReplFailure::Repl(e)) => Err(KsError::Repl(e)),
                };
                (r, counts.write_guard())
            }
            // While a recount runs, the writes and their counts exclude a
            // recount step.
            _ => {
                let guard = counts.write_guard();
                let r = self
                    .sess
                    .apply_batch(&self.staged, &mut self.outcomes)
                    .map_err(KsError::Store);
                (r, guard)
            }
        };
        if matches!(&r, Err(KsError::Store(e)) if matches!(e.kind(), engine::ErrorKind::NoRoom { .. }))
            && self.has_lazy_free()
        {
            // The stores applied nothing of a batch that failed so.
            drop(guard);
            return self.apply_without_lazy_free();
        }
        for (((skey, op), out), before) in self.staged.iter().zip(&self.outcomes).zip(&self.before)
        {
            if skey.first() == Some(&PIECE_PREFIX) {
                // A free-list entry: the lazy free may take it (one that a
                // failed batch did not apply is found missing and skipped).
                // A COPY's in-progress entry is not (its COPY removes it).
                if let (Some(_), Some(id)) =
                    (lazy_entry(skey, &op), crate::housekeep::parse_gc_key(skey))
                {
                    self.hk.enqueue(id);
                }
                continue;
            }
            let after = match op {
                Op::Put(v) => Some(v.first().is_some_and(|t| t & EXPIRY_BIT != 0)),
                _ => None,
            };
            // A write is an access; a deleted key's stamp is forgotten.
            if r.is_ok() {
                match op {
                    Op::Put(_) => self.hk.access.touch(skey, now),
                    Op::Remove => self.hk.access.forget(skey),
                    _ => {}
                }
            }
            if after == Some(true) {
                self.hk.note_ttl(skey);
            }
            if log_new && matches!(out, Outcome::Put { created: true, .. }) && !skey.is_empty() {
                self.created_log.push(skey.to_vec());
            }
            let before = match *out {
                Outcome::Put {
                    created: false,
                    old_first,
                } => Some(old_first.is_some_and(|t| t & EXPIRY_BIT != 0)),
                Outcome::Removed(true) => Some(before.unwrap_or(false)),
                Outcome::Put { created: true, .. }
                | Outcome::Removed(false)
                | Outcome::Int(_)
                | Outcome::Merged(_) => None,
            };
            counts.add(
                self.shard,
                skey,
                Delta::between(before, after),
                guard.as_ref(),
            );
        }
        drop(guard);
        if r.is_ok() && self.watches.active() {
            for (skey, op) in self.staged.iter() {
                if skey.first() != Some(&PIECE_PREFIX) {
                    self.watches.touch(skey, matches!(op, Op::Remove));
                }
            }
        }
        if r.is_ok() {
            // One relaxed load while no client tracks.
            self.track.applied(self.staged.iter().map(|(k, _)| k));
        }
        self.staged.clear();
        self.before.clear();
        r?;
        Ok(())
    }

    /// Whether this keyspace's writes are replicated (a cluster node's
    /// worker; not its apply threads').
    pub fn replicates(&self) -> bool {
        self.repl.is_some()
    }

    /// Applies a committed entry's batch that this node's proposer awaits,
    /// with `index` recorded as applied under `mark` in the same batch
    /// (`repl::APPLIED_KEY` or an apply lane's mark); returns the
    /// outcomes of the batch's own operations (the proposer's
    /// [`Self::apply`] does the bookkeeping with them).
    pub fn apply_entry_raw(
        &mut self,
        mut batch: WriteBatch,
        index: u64,
        mark: &[u8],
    ) -> engine::Result<Vec<Outcome>> {
        let n = batch.len();
        batch.put(mark, &index.to_le_bytes());
        let mut out = Vec::with_capacity(n + 1);
        self.sess.apply_batch(&batch, &mut out)?;
        out.truncate(n);
        Ok(out)
    }

    /// Applies a committed entry's batch proposed elsewhere (a follower's
    /// apply, or a new leader's of its predecessor's entries), `index`
    /// recorded as applied under `mark` in the same batch, with the bookkeeping a local
    /// write does (key counts, TTL index, lazy free, WATCH).
    pub fn apply_entry(
        &mut self,
        batch: WriteBatch,
        index: u64,
        mark: &[u8],
    ) -> engine::Result<()> {
        debug_assert!(!self.has_staged() && self.repl.is_none());
        // What each removal deletes (whether it had a TTL), for the counts.
        let mut before = Vec::with_capacity(batch.len() + 1);
        let mut raw = Vec::new();
        for (k, op) in batch.iter() {
            before.push(match op {
                Op::Remove if k.first() != Some(&PIECE_PREFIX) => Some(
                    self.sess.get(k, &mut raw)? && decode(&raw).is_some_and(|h| h.expire.is_some()),
                ),
                Op::Remove => Some(false),
                _ => None,
            });
        }
        self.staged = batch;
        self.staged.put(mark, &index.to_le_bytes());
        before.push(None);
        self.before = before;
        match self.apply() {
            Ok(()) => Ok(()),
            Err(KsError::Store(e)) => Err(e),
            Err(e) => {
                self.discard_staged();
                Err(engine::Error::Corrupt(format!("{e:?}")))
            }
        }
    }

    /// Whether the staged batch hands a collection to the lazy free (puts a
    /// plain free-list entry).
    fn has_lazy_free(&self) -> bool {
        self.staged
            .iter()
            .any(|(k, op)| lazy_entry(k, &op).is_some())
    }

    /// A full store refuses every put, free-list entries too: so that
    /// deletes still make room, the batch is staged again with the pieces
    /// of the collections it handed to the lazy free removed in it instead,
    /// and applied (one batch: if it is too large for the store, the
    /// command fails and changes nothing).
    fn apply_without_lazy_free(&mut self) -> KsResult<()> {
        let old = std::mem::take(&mut self.staged);
        let before = std::mem::take(&mut self.before);
        let mut lazy = Vec::new();
        for ((k, op), b) in old.iter().zip(before) {
            if let Some(v) = lazy_entry(k, &op) {
                lazy.push((crate::housekeep::parse_gc_key(k), v.to_vec()));
                continue;
            }
            match op {
                Op::Put(v) => self.staged.put(k, v),
                Op::Remove => self.staged.remove(k),
                Op::Incr(n) => self.staged.incr(k, n),
                Op::Merge(m) => self.staged.merge(k, m),
            }
            self.before.push(b);
        }
        let mut pkey = Vec::new();
        for (id, v) in lazy {
            let (Some(id), Some((&kind, head))) = (id, v.split_first()) else {
                continue;
            };
            for p in crate::coll::pieces_left(self, kind, head)? {
                engine::types::head::piece_key(id, p, &mut pkey);
                self.remove_piece(&pkey);
            }
        }
        self.apply()
    }

    /// True when writes are staged and not applied (a command must not
    /// return so).
    pub fn has_staged(&self) -> bool {
        !self.staged.is_empty() || !self.pieces.is_empty()
    }

    fn stage_remove(&mut self, skey: &[u8], before: bool) {
        self.may_touch(skey);
        self.staged.remove(skey);
        self.before.push(Some(before));
    }

    /// Reads a piece (an internal key) as the running command's staged
    /// writes left it.
    pub fn get_piece(&mut self, pkey: &[u8], out: &mut Vec<u8>) -> KsResult<bool> {
        if let Some(v) = self.pieces.get(pkey) {
            out.clear();
            let b = match v {
                PieceWrite::Whole(b) => b.as_deref(),
                PieceWrite::Edits { bytes, .. } => Some(bytes.as_slice()),
            };
            if let Some(b) = b {
                out.extend_from_slice(b);
            }
            return Ok(b.is_some());
        }
        match self.staged.newest(pkey) {
            Some(Op::Put(v)) => {
                out.clear();
                out.extend_from_slice(v);
                Ok(true)
            }
            Some(Op::Remove) => Ok(false),
            // Piece merges are staged by `apply` only, never before a read.
            Some(Op::Incr(_) | Op::Merge(_)) | None => Ok(self.sess.get(pkey, out)?),
        }
    }

    /// Stages a piece's new bytes (the collection's stripe lock held).
    pub fn put_piece(&mut self, pkey: &[u8], bytes: &[u8]) {
        self.pieces
            .insert(pkey.to_vec(), PieceWrite::Whole(Some(bytes.to_vec())));
    }

    /// Stages an edit of a piece (the collection's stripe lock held): `new`
    /// is the piece after it, which the command's later reads see, and
    /// `edit` the encoded [`engine::types::edit::Edit`] that the batch
    /// carries as a `Merge` (the engine computes `new` again from the
    /// store's piece, in order with the piece's other writes). A piece the
    /// command also wrote whole stays one put of its newest bytes; a piece
    /// whose edits would log more than the piece itself (many edits in one
    /// command) becomes one put too: either way the store ends with `new`.
    pub fn edit_piece(&mut self, pkey: &[u8], new: Vec<u8>, edit: &[u8]) {
        let cost = engine::crl::record_len(pkey.len(), edit.len());
        let whole = engine::crl::record_len(pkey.len(), new.len());
        match self.pieces.get_mut(pkey) {
            Some(PieceWrite::Edits {
                bytes,
                edits,
                logged,
            }) if *logged + cost <= whole => {
                *bytes = new;
                edits.push(edit.to_vec());
                *logged += cost;
            }
            // Written whole in this command, or edits outgrowing the piece.
            Some(w) => *w = PieceWrite::Whole(Some(new)),
            None if cost > whole => {
                self.pieces
                    .insert(pkey.to_vec(), PieceWrite::Whole(Some(new)));
            }
            None => {
                self.pieces.insert(
                    pkey.to_vec(),
                    PieceWrite::Edits {
                        bytes: new,
                        edits: vec![edit.to_vec()],
                        logged: cost,
                    },
                );
            }
        }
    }

    /// Stages a piece's removal (the collection's stripe lock held).
    pub fn remove_piece(&mut self, pkey: &[u8]) {
        self.pieces.insert(pkey.to_vec(), PieceWrite::Whole(None));
    }

    /// Stages a raw store value (RENAME's move; stripe lock held).
    pub fn put_raw(&mut self, skey: &[u8], raw: &[u8]) {
        self.may_touch(skey);
        self.staged.put(skey, raw);
        self.before.push(None);
    }

    /// Stages the removal of a key whose state the caller has just read under
    /// its stripe lock (`ttl`: it has one).
    pub fn remove_known(&mut self, skey: &[u8], ttl: bool) {
        self.stage_remove(skey, ttl);
    }

    fn set_key(&mut self, db: u8, key: &[u8]) {
        self.kbuf.clear();
        self.kbuf.push(db);
        self.kbuf.extend_from_slice(key);
    }

    /// Reads `key` into `self.raw`, as the running command's staged writes
    /// left it; an expired key is absent, and `.1` says it was found expired
    /// (the caller deletes it).
    pub fn lookup_raw(&mut self, skey: &[u8], now: i64) -> KsResult<(Found, bool)> {
        if self.unit.is_some() && !self.may_touch(skey) {
            return Err(KsError::Undeclared);
        }
        match self.staged.newest(skey) {
            Some(Op::Put(v)) => {
                self.raw.clear();
                self.raw.extend_from_slice(v);
            }
            Some(Op::Remove) => return Ok((None, false)),
            // The keyspace stages no `Incr`: its values begin with a tag that
            // the engine's integer operation does not read; `Merge`s are
            // pieces' only.
            Some(Op::Incr(_) | Op::Merge(_)) | None => {
                if !self.sess.get(skey, &mut self.raw)? {
                    return Ok((None, false));
                }
            }
        }
        let h = decode(&self.raw).ok_or(KsError::Corrupt)?;
        if let Some(t) = h.expire {
            if t <= now {
                return Ok((None, true));
            }
        }
        Ok((Some(h), false))
    }

    /// Looks `key` up for a reader (no lock held). An expired key found here is
    /// deleted under its stripe lock, after checking again. A key found
    /// counts as accessed (its access stamp, see [`crate::evict`]).
    pub fn get(&mut self, stripes: &Stripes, db: u8, key: &[u8], now: i64) -> KsResult<Found> {
        let r = self.get_untouched(stripes, db, key, now);
        match r {
            Ok(Some(_)) => self.hk.access.touch(&self.kbuf, now),
            Ok(None) => {
                let sk = std::mem::take(&mut self.kbuf);
                self.note_miss(&sk);
                self.kbuf = sk;
            }
            Err(_) => {}
        }
        r
    }

    /// Logs a `keymiss` event for a read command's lookup that did not
    /// find `skey` (Redis's `lookupKey` without `LOOKUP_NONOTIFY`), while
    /// that class is on.
    fn note_miss(&mut self, skey: &[u8]) {
        if (self.reading || self.read_keys.iter().any(|k| k == skey))
            && self.notify.load(std::sync::atomic::Ordering::Relaxed) & crate::notify::KEY_MISS != 0
            && skey.first() != Some(&PIECE_PREFIX)
        {
            self.events
                .push((crate::notify::KEY_MISS, "keymiss", skey.to_vec()));
        }
    }

    /// [`Self::get`] without counting an access (OBJECT, as Redis's
    /// `LOOKUP_NOTOUCH`).
    pub fn get_untouched(
        &mut self,
        stripes: &Stripes,
        db: u8,
        key: &[u8],
        now: i64,
    ) -> KsResult<Found> {
        self.set_key(db, key);
        let sk = std::mem::take(&mut self.kbuf);
        let r = self.get_sk(stripes, &sk, now);
        self.kbuf = sk;
        r
    }

    fn get_sk(&mut self, stripes: &Stripes, sk: &[u8], now: i64) -> KsResult<Found> {
        use std::sync::atomic::{fence, Ordering};
        if self.in_unit() {
            let (f, expired) = self.lookup_raw(sk, now)?;
            if expired {
                // The unit's runner holds the key's lock.
                return self.lookup_locked_quiet(sk, now);
            }
            return Ok(f);
        }
        let seq = stripes.moving.load(Ordering::Acquire);
        if seq & 1 == 0 {
            let (f, expired) = self.lookup_raw(sk, now)?;
            fence(Ordering::Acquire);
            if stripes.moving.load(Ordering::Relaxed) == seq {
                if expired {
                    let _g = stripes.lock(sk);
                    return self.lookup_expiring(sk, now);
                }
                return Ok(f);
            }
        }
        // A SWAPDB moved keys during the read (one key may have been
        // between its databases): read again under the key's stripe lock,
        // which the SWAPDB holds until every key is in place.
        let _g = stripes.lock(sk);
        self.lookup_expiring(sk, now)
    }

    /// Looks up with the stripe lock held: the removal of an expired key is
    /// staged (the caller applies it).
    pub fn lookup_locked(&mut self, skey: &[u8], now: i64) -> KsResult<Found> {
        let f = self.lookup_locked_quiet(skey, now)?;
        if f.is_none() {
            self.note_miss(skey);
        }
        Ok(f)
    }

    /// [`Self::lookup_locked`] without its `keymiss` event (the lookups
    /// inside [`Self::get`], which notes its own).
    fn lookup_locked_quiet(&mut self, skey: &[u8], now: i64) -> KsResult<Found> {
        let (f, expired) = self.lookup_raw(skey, now)?;
        if f.is_some() {
            self.hk.access.touch(skey, now);
        }
        // A follower leaves the key for the leader's deletion, which
        // arrives as an entry (as a Redis replica does); during a CLIENT
        // PAUSE it stays until the pause ends (as in Redis 7.0).
        if expired && !self.follower() && !self.hk.paused() {
            self.free_pieces_of_raw()?;
            self.stage_remove(skey, true);
            self.note_expired(skey);
        }
        Ok(f)
    }

    /// Counts a key deleted because it expired, and logs it for its
    /// `expired` notification when that class is on.
    fn note_expired(&mut self, skey: &[u8]) {
        self.expired += 1;
        let f = self.notify.load(std::sync::atomic::Ordering::Relaxed);
        if f & crate::notify::EXPIRED != 0 {
            self.expired_log.push(skey.to_vec());
        }
    }

    /// Stages the removal of the pieces of the value in `self.raw` (just
    /// read), when it is a collection that has some: its head is being
    /// deleted or overwritten. A string costs one byte's test.
    fn free_pieces_of_raw(&mut self) -> KsResult<()> {
        let kind = self.raw.first().map(|t| t & !(EXPIRY_BIT | MC_BIT));
        if kind.is_some_and(|k| k != KIND_STRING) {
            let raw = std::mem::take(&mut self.raw);
            let r = crate::coll::free_value(self, &raw);
            self.raw = raw;
            r?;
        }
        Ok(())
    }

    /// Stages the removal of the pieces of the collection at `skey`, if it
    /// holds one (stripe lock held): for a command about to overwrite the
    /// key blindly (SET, RENAME's destination). Reads the key's value.
    pub fn free_pieces(&mut self, skey: &[u8], now: i64) -> KsResult<()> {
        let (f, expired) = self.lookup_raw(skey, now)?;
        if f.is_some() || expired {
            self.free_pieces_of_raw()?;
        }
        Ok(())
    }

    /// [`Self::lookup_locked`] for a reader, outside any command's batch:
    /// the removal of an expired key is applied at once (stripe lock held by
    /// the caller).
    pub fn lookup_expiring(&mut self, skey: &[u8], now: i64) -> KsResult<Found> {
        let f = self.lookup_locked_quiet(skey, now)?;
        self.apply()?;
        Ok(f)
    }

    /// Stages a value (stripe lock held by the caller).
    pub fn put(&mut self, skey: &[u8], kind: u8, expire: Option<i64>, payload: &[u8]) {
        if self.unit.is_some() {
            self.may_touch(skey);
        }
        self.staged
            .put_with(skey, payload.len() + VALUE_OVERHEAD, |out| {
                encode_into(kind, expire, payload, out)
            });
        self.before.push(None);
    }

    /// Stages a deletion (stripe lock held by the caller); true when the key
    /// was live.
    pub fn delete(&mut self, skey: &[u8], now: i64) -> KsResult<bool> {
        let (f, expired) = self.lookup_raw(skey, now)?;
        if f.is_none() && !expired {
            return Ok(false);
        }
        let ttl = expired || f.is_some_and(|h| h.expire.is_some());
        self.free_pieces_of_raw()?;
        self.stage_remove(skey, ttl);
        if expired {
            self.note_expired(skey);
        }
        Ok(f.is_some())
    }

    /// Visits every live key of database `db` once, with its header: a full
    /// scan (the store's scan may return a key twice, so keys are deduplicated
    /// here; expired keys met on the way are deleted, as a read would). Keys of
    /// other databases, and the store's own entries (such as the key counts,
    /// under a key without a database byte), are skipped unread.
    pub fn for_each_live(
        &mut self,
        stripes: &Stripes,
        db: u8,
        now: i64,
        mut f: impl FnMut(&[u8], Header),
    ) -> KsResult<()> {
        let mut seen = std::collections::HashSet::new();
        let mut cursor = 0;
        let mut page = Vec::new();
        loop {
            page.clear();
            cursor = self.sess.scan(cursor, 1024, &mut page)?;
            for sk in page.drain(..) {
                if sk.first() != Some(&db) || seen.contains(&sk) {
                    continue;
                }
                if let Some(h) = self.get_sk(stripes, &sk, now)? {
                    f(&sk, h);
                    seen.insert(sk);
                }
            }
            if cursor == 0 {
                return Ok(());
            }
        }
    }

    /// One page of a keyspace scan over every database: keys of `db` (prefix
    /// stripped), deduplicated within the page, not checked for liveness.
    pub fn scan_page(
        &mut self,
        db: u8,
        cursor: u64,
        count: usize,
        out: &mut Vec<Vec<u8>>,
    ) -> KsResult<u64> {
        let mut raw = Vec::new();
        let next = self.sess.scan(cursor, count, &mut raw)?;
        raw.sort_unstable();
        raw.dedup();
        out.extend(
            raw.into_iter()
                .filter(|k| k.first() == Some(&db))
                .map(|mut k| {
                    k.remove(0);
                    k
                }),
        );
        Ok(next)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_round_trip() {
        let mut out = Vec::new();
        encode(KIND_STRING, None, b"abc", &mut out);
        let h = decode(&out).unwrap();
        assert_eq!((h.kind, h.expire, &out[h.off..]), (1, None, &b"abc"[..]));
        encode(KIND_STRING, Some(-5), b"", &mut out);
        let h = decode(&out).unwrap();
        assert_eq!((h.expire, out.len()), (Some(-5), 9));
        assert!(decode(b"").is_none());
        assert!(decode(&[0x81, 1, 2]).is_none());
        assert!(decode(&[7, 1]).is_none());
    }

    /// A command's reads see its staged writes; nothing reaches the store
    /// until `apply`, which applies the batch in order and counts each
    /// operation once (a put then a delete of one key in one batch leave it
    /// absent and uncounted; `DEL k k` deletes once).
    #[test]
    fn staged_writes_are_seen_then_applied_in_order() {
        use engine::volatile::VolatileStore;
        use engine::Store as _;
        let store = Arc::new(VolatileStore::new(64));
        let counts = Arc::new(KeyCounts::new(1, store.key_hasher()));
        let mut ks = Keyspace::new(
            Box::new(store.session().unwrap()),
            counts.clone(),
            0,
            Arc::new(crate::housekeep::Housekeeping::new(false)),
        );
        let mut probe = store.session().unwrap();
        counts.finish(&mut probe).unwrap();
        let (a, b) = (skey(0, b"a"), skey(0, b"b"));
        ks.put(&a, KIND_STRING, None, b"1");
        ks.put(&b, KIND_STRING, Some(i64::MAX), b"2");
        assert!(ks.has_staged());
        let h = ks.lookup_locked(&a, 0).unwrap().unwrap();
        assert_eq!(&ks.raw[h.off..], b"1");
        let mut out = Vec::new();
        assert!(!probe.get(&a, &mut out).unwrap(), "applied before apply()");
        assert!(ks.delete(&a, 0).unwrap());
        assert!(!ks.delete(&a, 0).unwrap(), "a staged delete is seen");
        assert!(ks.lookup_locked(&a, 0).unwrap().is_none());
        ks.apply().unwrap();
        assert!(!ks.has_staged());
        assert!(!probe.get(&a, &mut out).unwrap());
        assert!(probe.get(&b, &mut out).unwrap());
        assert_eq!(counts.get(0), Some((1, 1)));
        // Expired keys read inside a command are removed by its batch.
        ks.put(&a, KIND_STRING, Some(5), b"x");
        ks.apply().unwrap();
        assert!(ks.lookup_locked(&a, 10).unwrap().is_none());
        assert!(ks.has_staged());
        ks.apply().unwrap();
        assert!(!probe.get(&a, &mut out).unwrap());
        assert_eq!(counts.get(0), Some((1, 1)));
    }

    /// Keys and opcodes, in the order applied.
    type Applied = Arc<Mutex<Vec<(Vec<u8>, u8)>>>;

    /// A session that records the operations it applies.
    struct Recorder {
        inner: Box<dyn Session>,
        ops: Applied,
    }

    impl Session for Recorder {
        fn get(&mut self, key: &[u8], out: &mut Vec<u8>) -> engine::Result<bool> {
            self.inner.get(key, out)
        }
        fn apply(&mut self, key: &[u8], op: Op<'_>) -> engine::Result<Outcome> {
            self.ops.lock().unwrap().push((key.to_vec(), op.code()));
            self.inner.apply(key, op)
        }
        fn scan(
            &mut self,
            cursor: u64,
            count: usize,
            out: &mut Vec<Vec<u8>>,
        ) -> engine::Result<u64> {
            self.inner.scan(cursor, count, out)
        }
    }

    /// A piece's edits reach the store as merge operations, in order, and
    /// the command's reads see the edited piece before then; a piece also
    /// written whole in the command, or whose edits outgrow it, is one put.
    #[test]
    fn piece_edits_are_staged_as_merges() {
        use engine::types::edit::Edit;
        use engine::types::node::{Entry, Node};
        use engine::volatile::VolatileStore;
        use engine::Store as _;
        let store = Arc::new(VolatileStore::new(64));
        let counts = Arc::new(KeyCounts::new(1, store.key_hasher()));
        let ops = Arc::new(Mutex::new(Vec::new()));
        let rec = Recorder {
            inner: Box::new(store.session().unwrap()),
            ops: ops.clone(),
        };
        let mut ks = Keyspace::new(
            Box::new(rec),
            counts.clone(),
            0,
            std::sync::Arc::new(crate::housekeep::Housekeeping::new(false)),
        );
        counts.finish(&mut store.session().unwrap()).unwrap();
        let p = [PIECE_PREFIX, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 2];
        // About 2 KiB: a few edits log less than the piece.
        let filler = |n: usize| (0..n).map(|_| Entry::new(0.0, vec![b'x'; 50]));
        let mut piece = Node::Leaf(filler(40).collect()).encode(false);
        let edit = |ks: &mut Keyspace, piece: &mut Vec<u8>, e: Edit| {
            let mut enc = Vec::new();
            e.encode(false, &mut enc);
            *piece = e.apply(false, piece).unwrap();
            ks.edit_piece(&p, piece.clone(), &enc);
        };
        let ins = |x: &[u8]| Edit::LeafInsert {
            pos: 0,
            entry: Entry::new(0.0, x.to_vec()),
        };
        let got = |ks: &mut Keyspace| {
            let mut out = Vec::new();
            assert!(ks.get_piece(&p, &mut out).unwrap());
            out
        };
        ks.put_piece(&p, &piece);
        ks.apply().unwrap();
        ops.lock().unwrap().clear();
        // Two edits: two merges, in order; reads see both before the apply.
        edit(&mut ks, &mut piece, ins(b"b"));
        edit(&mut ks, &mut piece, Edit::LeafRemove { pos: 1 });
        assert_eq!(got(&mut ks), piece);
        ks.apply().unwrap();
        assert_eq!(
            std::mem::take(&mut *ops.lock().unwrap()),
            [
                (p.to_vec(), engine::OPC_MERGE),
                (p.to_vec(), engine::OPC_MERGE)
            ]
        );
        assert_eq!(got(&mut ks), piece);
        assert_eq!(
            Node::decode(&piece, false).unwrap(),
            Node::Leaf(
                std::iter::once(Entry::new(0.0, b"b".to_vec()))
                    .chain(filler(39))
                    .collect()
            )
        );
        // Written whole, then edited: one put of the newest bytes.
        piece = Node::Leaf(filler(40).collect()).encode(false);
        ks.put_piece(&p, &piece);
        edit(&mut ks, &mut piece, ins(b"c"));
        ks.apply().unwrap();
        assert_eq!(
            std::mem::take(&mut *ops.lock().unwrap()),
            [(p.to_vec(), engine::OPC_PUT)]
        );
        assert_eq!(got(&mut ks), piece);
        // Edits that would log more than the piece: one put.
        for i in 0..40 {
            edit(&mut ks, &mut piece, ins(format!("{i}").as_bytes()));
            edit(&mut ks, &mut piece, Edit::LeafRemove { pos: 0 });
        }
        ks.apply().unwrap();
        assert_eq!(
            std::mem::take(&mut *ops.lock().unwrap()),
            [(p.to_vec(), engine::OPC_PUT)]
        );
        assert_eq!(got(&mut ks), piece);
    }
}
