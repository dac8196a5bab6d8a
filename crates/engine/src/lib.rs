//! # engine — what a command runs against
//!
//! One [`Store`] trait, three stores:
//! - [`volatile::VolatileStore`]: the DRAM table alone, no durability (the upper
//!   bound of every comparison; never call it durable).
//! - [`direct::DirectStore`]: a single tier on the persistent heap (UDORN's "the
//!   database is the image"), on the log-free hash table or on phash.
//! - [`bullet::BulletStore`]: Bullet (ATC '18): the DRAM table as frontend, the
//!   direct store's index as backend, and between them cross-referencing logs
//!   (per-thread persistent logs whose records link to the key's previous record in
//!   any log), gleaners, epochs, dynamic writer/gleaner roles, put collapsing.
//!
//! Every update is an [`Op`]: an opcode with a payload; a command's updates
//! are a [`WriteBatch`] of them ([`batch`]), applied with
//! [`Session::apply_batch`]. Puts and removes are
//! idempotent (applying one twice is harmless, and only the newest of a chain
//! matters); `Incr` and `Merge` are not, and the stores apply such operations
//! exactly once and in the order they were acknowledged.
//!
//! A [`Session`] is one thread's door into a store: it holds that thread's heap
//! slot, log and epoch participation. An update is durable when
//! [`Session::apply`] returns (in the store's durability mode: see
//! [`Store::durability`]). [`Session::scan`] walks the keys with a cursor
//! (Redis's `SCAN`) that means the same in every store and tier: a split-order
//! position ([`index::scan_pos`]).

// Unsafe code lives in two modules: the DRAM table's lock-free nodes
// (`table`) and the role threads' priority calls (`bullet`).
#![deny(unsafe_code)]

pub mod batch;
#[allow(unsafe_code)]
pub mod bullet;
pub mod crl;
pub mod direct;
pub mod error;
pub mod lentry;
#[allow(unsafe_code)]
pub mod table;
pub mod types;
pub mod value;
pub mod volatile;

pub use batch::WriteBatch;
pub use error::{Error, ErrorKind, Result};
pub use index::KeyHasher;
/// Integers in values are read as Redis reads them (`string2ll`).
pub use proto::int::parse_i64;

/// An update, as an opcode with its payload. The key travels beside it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op<'a> {
    /// Sets the value (idempotent).
    Put(&'a [u8]),
    /// Deletes the key (idempotent).
    Remove,
    /// Adds to the value read as a decimal signed 64-bit integer, Redis's `INCRBY`
    /// (an absent key counts as 0). Not idempotent.
    Incr(i64),
    /// Replaces the value with [`merge_value`] of it and the payload: an
    /// edit of a collection's piece ([`types::edit`]), so that a log record
    /// carries the edit (an element and a few bytes) instead of the piece's
    /// new bytes. The key must hold a value the edit fits. Deterministic, not
    /// idempotent.
    Merge(&'a [u8]),
}

impl Op<'_> {
    /// The opcode as stored in a log record.
    pub fn code(&self) -> u8 {
        match self {
            Op::Put(_) => OPC_PUT,
            Op::Remove => OPC_REMOVE,
            Op::Incr(_) => OPC_INCR,
            Op::Merge(_) => OPC_MERGE,
        }
    }

    /// Whether applying the operation twice equals applying it once, and a newer
    /// idempotent operation makes every older one irrelevant (put collapsing).
    pub fn idempotent(&self) -> bool {
        !matches!(self, Op::Incr(_) | Op::Merge(_))
    }
}

/// Opcodes of log records (stable: they are stored in the heap).
pub const OPC_PUT: u8 = 1;
pub const OPC_REMOVE: u8 = 2;
pub const OPC_INCR: u8 = 3;
pub const OPC_MERGE: u8 = 4;

/// Whether a log record's opcode is an operation's (not a pad record's, nor
/// one this build does not know).
#[inline]
pub fn known_opcode(code: u8) -> bool {
    matches!(code, OPC_PUT | OPC_REMOVE | OPC_INCR | OPC_MERGE)
}

/// Whether an opcode's operation is idempotent ([`Op::idempotent`]).
#[inline]
pub fn idempotent_opcode(code: u8) -> bool {
    matches!(code, OPC_PUT | OPC_REMOVE)
}

/// What an update did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// A put: whether the key was new, and the first byte of the value it
    /// replaced (`None` when the key was new or that value was empty), so that
    /// a caller whose values begin with a tag (the server's type and TTL byte)
    /// learns what it overwrote without reading the value first.
    Put {
        created: bool,
        old_first: Option<u8>,
    },
    /// A remove: whether the key was present.
    Removed(bool),
    /// An increment: the new value.
    Int(i64),
    /// A merge: the length of the new value.
    Merged(usize),
}

/// The durability an acknowledged update has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Durability {
    /// None: the store is DRAM only.
    Volatile,
    /// In the heap's persistence domain (flush + fence, or msync, per the heap's
    /// strategy: on an ordinary file without msync that survives SIGKILL, not an
    /// OS crash).
    Heap,
}

/// Whether `batch` (`ops` operations, `bytes` of `WriteBatch` encoding) is
/// sure to fit a store's [`Session::batch_limit`] `limit`: each operation's
/// record costs at most 64 bytes more than its encoding (a 40-byte header
/// and padding to 8).
pub fn batch_fits(ops: usize, bytes: usize, limit: Option<u64>) -> bool {
    limit.is_none_or(|l| (bytes as u64).saturating_add(64 * ops as u64) <= l)
}

/// Counters a store reports (INFO, benchmarks).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StoreStats {
    /// Keys in the store (approximate while operations run).
    pub keys: u64,
    /// Entries in the DRAM table (frontend), if any.
    pub frontend_entries: u64,
    /// Log occupancy, 0.0..=1.0 (Bullet only).
    pub log_occupancy: f64,
    /// Threads gleaning now (Bullet only).
    pub gleaners: u64,
    /// Log records appended / applied to the backend / skipped by put collapsing.
    pub records_appended: u64,
    pub records_applied: u64,
    pub records_collapsed: u64,
    /// Bytes appended to the logs (record headers, keys, payloads and pad
    /// records) over the store's life: the sum of the logs' tail positions
    /// (Bullet only).
    pub log_bytes_appended: u64,
    /// Bytes of log buffer behind the heads given back to the kernel
    /// (`Pool::release_behind`: out of the resident set until the next lap)
    /// over this process's life (Bullet only).
    pub log_bytes_released: u64,
    /// Frontend misses served from the backend.
    pub backend_loads: u64,
    /// Frontend entries evicted (bounded cache).
    pub evictions: u64,
    /// Times a writer waited for log space.
    pub log_full_waits: u64,
    /// Epochs completed by the epoch advancer.
    pub epochs: u64,
    /// Background gleaners whose priority was lowered mid-batch because the
    /// role was no longer wanted (Bullet with role threads only).
    pub gleaner_roles_lowered: u64,
    /// Keys whose logged writes the backend has no room for (Bullet: a full
    /// heap); while there are any, puts are refused with the heap-full error.
    pub heap_full_keys: u64,
}

/// A store: shared by every thread (`Clone` is a cheap handle).
pub trait Store: Send + Sync + 'static {
    type Session: Session;
    /// A session for the calling thread (it stays on that thread).
    fn session(&self) -> Result<Self::Session>;
    /// `"volatile"`, `"direct"`, `"bullet"` (with the variant, e.g. `"bullet-st"`).
    fn name(&self) -> String;
    fn durability(&self) -> Durability;
    /// The key hash whose [`index::scan_pos`] orders this store's scan (its
    /// backend's, kept in the heap; a random one for the volatile store).
    fn key_hasher(&self) -> KeyHasher;
    fn stats(&self) -> StoreStats;
    /// Stops background threads and makes everything durable (clean shutdown).
    /// Sessions must be dropped first.
    fn close(&self) -> Result<()>;
}

/// One thread's operations on a store.
pub trait Session {
    /// Copies the value of `key` into `out` (cleared first); false when absent.
    fn get(&mut self, key: &[u8], out: &mut Vec<u8>) -> Result<bool>;
    /// Applies an update; durable (per [`Store::durability`]) when it returns.
    fn apply(&mut self, key: &[u8], op: Op<'_>) -> Result<Outcome>;
    /// Applies a command's [`WriteBatch`] in order, pushing each operation's
    /// outcome to `out`; durable as [`Session::apply`]'s updates are (under
    /// group commit: at the session's next commit).
    ///
    /// The persistent stores ([`bullet`], [`direct`]) apply a batch
    /// **all-or-nothing across a crash** (a killed process, or an OS crash or
    /// power loss in the heap's durability mode): after recovery either every
    /// operation of the batch is there or none is, and an acknowledged batch
    /// is whole. An error (an `Incr` on a value that is not an integer, a
    /// batch too large for a Bullet log: [`Error::RecordTooLarge`]) fails the
    /// whole batch before anything is written, leaving `out` as it was. A
    /// batch of one operation costs what [`Session::apply`] costs.
    ///
    /// The default, kept by the `volatile` store only, applies the operations
    /// one by one: on an error, `out` holds the outcomes of those applied
    /// before it.
    fn apply_batch(&mut self, batch: &WriteBatch, out: &mut Vec<Outcome>) -> Result<()> {
        apply_each(self, batch, out)
    }
    /// One step of a cursor scan of the store's keys, Redis's `SCAN` (for `KEYS`,
    /// `SCAN`, `DBSIZE`, `FLUSHDB`, `RANDOMKEY`, active expiry): appends keys to
    /// `out` and returns the next cursor; cursor 0 starts a scan and a returned 0
    /// means it is complete.
    ///
    /// The cursor is a split-order position ([`index::scan_pos`] of the key's
    /// hash, the same at every level): a step returns keys whose position is at
    /// least `cursor`, and every position below the cursor it returns is covered.
    /// Any `u64` is accepted. A key present for the whole scan is returned at least
    /// once; a key may be returned more than once and may have been removed
    /// meanwhile (re-check with [`Session::get`]). `count` is a hint (a step may
    /// return more, to finish a bucket or a position, or fewer, even none, after
    /// visiting about `10 × count` empty buckets); a step costs what it covers,
    /// never the whole store, and always makes progress.
    fn scan(&mut self, cursor: u64, count: usize, out: &mut Vec<Vec<u8>>) -> Result<u64>;
    /// Backend work the store wants from this thread between requests (Bullet's
    /// dynamic roles: a worker asked to glean does so here). Returns true when it
    /// did some. Call it between requests; it is cheap when there is nothing to do.
    fn maintain(&mut self) -> Result<bool> {
        Ok(false)
    }
    /// The most bytes of records [`Session::apply_batch`] takes in one batch
    /// (for a batch of `n` operations, a little less than this minus
    /// `n` × 64 of `WriteBatch` bytes: [`batch_fits`]); None when only the
    /// heap bounds it. A caller that must know a batch will be accepted
    /// before it commits to it (a replicated node proposing an entry that
    /// every node must persist and apply) checks it first.
    fn batch_limit(&self) -> Option<u64> {
        None
    }
    /// Makes every update this session applied durable. Needed only by a store
    /// opened with group commit (Bullet's `group_commit`), whose `apply`
    /// returns before the update is durable; elsewhere every `apply` already is,
    /// and this does nothing.
    fn commit(&mut self) -> Result<()> {
        Ok(())
    }
    /// True when this session applied updates that are not durable until its
    /// next [`Session::commit`] (group commit only; elsewhere always false).
    /// A caller batching requests may serve more before committing: the
    /// commit's cost is the same for one update as for many.
    fn awaits_commit(&self) -> bool {
        false
    }
    /// [`Session::commit`] taken apart, for a pipelined group commit: returns
    /// the work that makes every update this session applied so far durable,
    /// to be completed later, on any thread, while this session applies more.
    /// Updates applied after the call are not covered. Complete such work in
    /// the order it was detached: a later one's updates may follow the
    /// earlier one's in the same log. None when nothing awaits durability; the
    /// default commits here and returns None.
    fn commit_detached(&mut self) -> Result<Option<PendingCommit>> {
        self.commit()?;
        Ok(None)
    }
    /// A hint that these keys are about to be read or written (a pipeline of
    /// requests): a store may start fetching their entries from memory, so that
    /// the misses overlap. Changes nothing; the default does nothing.
    fn prefetch(&mut self, keys: &[&[u8]]) {
        let _ = keys;
    }
}

/// Applies `batch`'s operations one by one with [`Session::apply`] (the
/// default [`Session::apply_batch`], and the persistent stores' for a batch
/// of one operation).
#[inline]
pub(crate) fn apply_each<S: Session + ?Sized>(
    s: &mut S,
    batch: &WriteBatch,
    out: &mut Vec<Outcome>,
) -> Result<()> {
    for (key, op) in batch.iter() {
        out.push(s.apply(key, op)?);
    }
    Ok(())
}

/// The durability work of a [`Session::commit_detached`]: once `complete`
/// returns Ok, the updates it covers are durable.
#[must_use = "the updates are durable only once completed"]
pub struct PendingCommit(Box<dyn FnOnce() -> Result<()> + Send>);

impl PendingCommit {
    pub fn new(f: impl FnOnce() -> Result<()> + Send + 'static) -> Self {
        PendingCommit(Box::new(f))
    }
    /// Makes the updates durable (waits for the device); any thread.
    pub fn complete(self) -> Result<()> {
        (self.0)()
    }
}

/// Computes an `Incr` on a stored value: the value must be a decimal signed 64-bit
/// integer, as Redis requires (no spaces, no leading `+`, no leading zeros except
/// `0` itself); the sum must not overflow.
pub fn incr_value(old: Option<&[u8]>, delta: i64) -> Result<i64> {
    let base = match old {
        None => 0,
        Some(v) => parse_i64(v).ok_or(Error::NotInteger)?,
    };
    base.checked_add(delta).ok_or(Error::Overflow)
}

/// Computes a `Merge` on a stored value: the payload is an encoded
/// [`types::edit::Edit`], applied to the value as a piece. An absent value,
/// a payload that is not an edit, or an edit that does not fit the value
/// (a position past a leaf's end...) is an error: the writer checks it before
/// anything is logged, so a record that fails here later is corruption.
pub fn merge_value(old: Option<&[u8]>, payload: &[u8]) -> Result<Vec<u8>> {
    let old = old.ok_or_else(|| Error::Corrupt("a merge on an absent value".into()))?;
    let (edit, ordered) = types::edit::Edit::decode(payload)?;
    let new = edit.apply(ordered, old)?;
    if new.len() > index::MAX_VALUE - value::STAMP_LEN {
        return Err(Error::ValueTooLarge(new.len()));
    }
    Ok(new)
}

/// The smaller of two scan cursors, where 0 (scan complete) counts as the end of
/// the position space: the cursor of the union of two steps taken from one cursor.
#[inline]
pub(crate) fn min_cursor(a: u64, b: u64) -> u64 {
    match (a, b) {
        (0, x) | (x, 0) => x,
        _ => a.min(b),
    }
}

/// Refuses keys and values beyond the index's limits before any work is done.
pub(crate) fn check_op(key: &[u8], op: &Op<'_>) -> Result<()> {
    if key.len() > index::MAX_KEY {
        return Err(Error::KeyTooLarge(key.len()));
    }
    if let Op::Put(v) | Op::Merge(v) = op {
        if v.len() > index::MAX_VALUE - value::STAMP_LEN {
            return Err(Error::ValueTooLarge(v.len()));
        }
    }
    Ok(())
}

/// Unit tests: options of a small heap of `size` bytes (growing to `max`) with
/// the fence-only strategy.
#[cfg(test)]
pub(crate) fn test_heap_opts(size: u64, max: u64) -> pmem::HeapOptions {
    pmem::HeapOptions {
        size,
        max_size: max,
        reserve: max,
        geometry: pmem::Geometry {
            nslots: 16,
            ..pmem::Geometry::small()
        },
        strategy: pmem::Strategy::FenceOnly,
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn incr_follows_redis() {
        assert_eq!(incr_value(None, 5).unwrap(), 5);
        assert!(matches!(
            incr_value(Some(b"9223372036854775807"), 1),
            Err(Error::Overflow)
        ));
        assert!(matches!(incr_value(Some(b"x"), 1), Err(Error::NotInteger)));
    }
}
