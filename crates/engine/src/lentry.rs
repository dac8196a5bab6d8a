//! The `lentry` protocol between a log writer and a gleaner (Bullet §2.3, §4.1).
//!
//! Every frontend entry keeps `lentry`: a pointer to the newest log record of its
//! key (0: none unapplied). The writer, holding the key's bucket lock, reads it as
//! the new record's `prev` ([`prev_for_append`]), persists the record, then
//! publishes the record ([`publish`]). A gleaner, after applying a chain whose
//! newest record is `newest`, clears `lentry` with a compare-and-swap
//! ([`release`]) without taking the lock: the swap fails when a writer appended
//! since, and then the newer record's `prev` chain still leads to `newest`, whose
//! `applied` flag stops the next gleaner's walk.
//!
//! A session applying a batch of several operations marks each key's
//! `lentry` [`PENDING`] (still holding the older record) before it appends
//! anything, and clears the mark once the whole batch is appended and
//! published: until then no other writer or reader uses the key (they wait,
//! see `BulletSession`), so nothing observes a value that recovery could drop
//! with a batch cut short. The gleaner walks from the pointer without the
//! mark ([`chain_start`]); its release fails while the mark is set.
//!
//! Invariant: every unapplied record of a key is reachable from the key's
//! `lentry` through `prev` links, before any applied record of the chain. The loom
//! model `tests/loom_lentry.rs` checks it, with the real functions below.

#[cfg(loom)]
pub use loom::sync::atomic::AtomicU64;
#[cfg(not(loom))]
pub use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering;

/// The mark of a key in a batch being applied (a position bit no log reaches:
/// positions stay below 2^55).
pub const PENDING: u64 = 1 << 55;

/// Whether `lentry`'s value `v` carries the batch mark.
#[inline]
pub fn is_pending(v: u64) -> bool {
    v & PENDING != 0
}

/// `lentry`'s value `v` without the batch mark: the record pointer.
#[inline]
pub fn record(v: u64) -> u64 {
    v & !PENDING
}

/// Writer, holding the bucket lock: the `prev` of the record it is about to write.
#[inline]
pub fn prev_for_append(lentry: &AtomicU64) -> u64 {
    lentry.load(Ordering::Acquire)
}

/// Writer, holding the bucket lock, after the record is persisted and the log's
/// tail published. A swap rather than a plain store: every write of `lentry` is
/// then a read-modify-write, so the gleaner's compare-and-swap and the writer's
/// publication are totally ordered by construction (and loom 0.7, which can let a
/// compare-and-swap read past a plain store — tokio-rs/loom#282 — models it
/// exactly). On x86 the cost is one locked instruction on a line the writer owns.
#[inline]
pub fn publish(lentry: &AtomicU64, rec: u64) {
    lentry.swap(rec, Ordering::AcqRel);
}

/// Gleaner, after the chain ending at `newest` is applied and flagged: clears
/// `lentry` unless a writer appended since. True when cleared.
#[inline]
pub fn release(lentry: &AtomicU64, newest: u64) -> bool {
    lentry
        .compare_exchange(newest, 0, Ordering::AcqRel, Ordering::Acquire)
        .is_ok()
}

/// Gleaner: where the walk over a key's unapplied records starts.
#[inline]
pub fn chain_start(lentry: &AtomicU64) -> u64 {
    record(lentry.load(Ordering::Acquire))
}
