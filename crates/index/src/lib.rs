//! Ember's durable concurrent index structures on the persistent heap.
//!
//! - [`LfHash`]: the log-free hash table (log-free paper §3–§5): lock-free lists
//!   with link-and-persist, the link cache, NV-epochs, and online growth (the
//!   per-bucket lists are segments of one split-ordered list, so a bucket splits
//!   without moving a node).
//! - [`SkipList`]: the durable lock-free skip list, ordered by key bytes.
//! - [`PHash`]: the lock-based baseline of both papers (Bullet's backend table):
//!   chained buckets under persistent spinlocks, updates in redo-log transactions.
//!
//! Every hash structure can be scanned with a cursor ([`Ops::scan`], Redis's
//! `SCAN` semantics); the cursor is a *split-order position* ([`scan_pos`]), the
//! same at every level, so a store can merge the scans of two tiers.
//!
//! Every structure answers for its own blocks at recovery ([`Recoverable`]): the
//! heap's leak sweep asks, for every block slot in an active page, whether it is
//! reachable, and frees what is not (log-free paper §5.5, first approach: search
//! the structure for the block's key and compare addresses).

// The one exception is `SkipHandle`'s `Send` (crossbeam-epoch's handle).
#![deny(unsafe_code)]

pub mod any;
pub mod blob;
pub mod error;
pub mod hash;
pub mod lcache;
pub mod link;
pub mod phash;
pub mod reclaim;
pub mod recover;
#[allow(unsafe_code)]
pub mod skiplist;

/// Pieces of this crate's unit tests.
#[cfg(test)]
pub(crate) mod test_util {
    use pmem::{CrashSim, Geometry, HeapOptions, Region, Strategy};

    /// A small heap for crash-simulator unit tests.
    pub fn sim_opts() -> HeapOptions {
        HeapOptions {
            size: 2 << 20,
            max_size: 16 << 20,
            reserve: 16 << 20,
            geometry: Geometry::small(),
            strategy: Strategy::FenceOnly,
            ..Default::default()
        }
    }

    /// Of 16 crash images taken now, how many hold at `at` a link to `target`.
    pub fn images_linking(sim: &CrashSim, r: &Region, at: u64, target: u64) -> usize {
        let at = at as usize;
        (0..16)
            .filter(|_| {
                let img = sim.capture_now(r);
                let w = u64::from_le_bytes(img.bytes[at..at + 8].try_into().expect("8 bytes"));
                crate::link::ptr(w) == target
            })
            .count()
    }
}

pub use error::{Error, Result};
pub use hash::{HashOptions, LfHash};
pub use phash::{PHash, PHashOptions};
pub use recover::{recover, RecoverStats, Recoverable};
pub use skiplist::{SkipList, SkipOptions};

/// Largest key the structures accept (bytes).
pub const MAX_KEY: usize = 64 * 1024;
/// Largest value the structures accept (bytes): Redis's `proto-max-bulk-len`
/// (512 MiB) plus 64 bytes, so that a string of exactly 512 MiB fits with
/// the headers the layers above add to it (the server's type tag and
/// expiry, the engine's stamp).
pub const MAX_VALUE: usize = 512 * 1024 * 1024 + 64;

/// What a structure reports about itself (`ember check`, tests).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Verified {
    /// Live key-value pairs.
    pub keys: u64,
    /// Heap blocks the structure owns (nodes, values, arrays, descriptor).
    pub blocks: u64,
    /// Bytes of keys and values.
    pub payload_bytes: u64,
}

/// A durable key-value index. Clone is cheap (a shared handle).
pub trait Index: Recoverable + Clone + Send + Sync + 'static {
    type Handle: Ops;
    /// A per-thread handle (holds a heap thread slot and an epoch participant; it
    /// stays on the thread that made it).
    fn handle(&self) -> Result<Self::Handle>;
    /// The persistent descriptor of the structure (store it to find it again).
    fn root(&self) -> pmem::PPtr<u8>;
    /// Walks the whole structure and checks every invariant: order, placement,
    /// block tags, back-pointers, no logically deleted node left after recovery
    /// when `quiescent`. Returns what it counted, or the first problem found.
    fn verify(&self, quiescent: bool) -> std::result::Result<Verified, String>;
    /// Approximate number of keys (exact after a clean close).
    fn len_estimate(&self) -> u64;
    /// Makes every completed operation of every handle durable and writes the
    /// exact counters (clean shutdown). Call with no operation in flight.
    fn close(&self) -> Result<()>;
}

/// Operations of one thread. Every update is durable when it returns, except that
/// with the link cache on, its last link may still sit in the cache: call
/// [`Ops::sync`] before acknowledging (it flushes what this handle cached; any
/// operation that depends on a cached link flushes it first, so the structure is
/// durably linearizable either way).
pub trait Ops {
    /// Copies the value of `key` into `out` (cleared first); false when absent.
    fn get(&mut self, key: &[u8], out: &mut Vec<u8>) -> Result<bool>;
    /// Inserts or replaces; true when the key was new.
    fn put(&mut self, key: &[u8], value: &[u8]) -> Result<bool>;
    /// Inserts only when absent; true when inserted.
    fn insert(&mut self, key: &[u8], value: &[u8]) -> Result<bool>;
    /// Removes; true when the key was present.
    fn remove(&mut self, key: &[u8]) -> Result<bool>;
    /// Makes every operation this handle completed durable.
    fn sync(&mut self) -> Result<()>;
    /// One step of a cursor scan (Redis's `SCAN`): appends to `out` the keys whose
    /// position ([`scan_pos`] of their hash) is at least `cursor`, in position
    /// order as far as the structure keeps one, and returns the next cursor: every
    /// position below it is covered, and 0 means the scan is complete. Start with
    /// cursor 0.
    ///
    /// Guarantees of a full scan (every step until 0 is returned): a key present
    /// for the whole scan is returned at least once; a key may be returned more
    /// than once and may have been removed meanwhile (re-check with `get`).
    /// `count` is a hint: a step returns about that many keys, more to finish a
    /// group of keys at one position or one bucket, fewer (even none) when it has
    /// walked about `10 × count` buckets or list nodes without finding them. A step
    /// costs what it covers, never the whole structure, and always makes progress.
    /// A key is returned only if its insertion is durable (as for `get`).
    ///
    /// The skip list (ordered by key bytes) has no such order: it returns
    /// [`Error::Unsupported`].
    fn scan(&mut self, cursor: u64, count: usize, out: &mut Vec<Vec<u8>>) -> Result<u64>;
    /// Applies a batch of writes (`Some` = put, `None` = remove) as if one after
    /// the other, for a writer that needs them durable only together, at its next
    /// [`Ops::sync`] (Bullet's gleaner). A structure may make the batch cheaper than
    /// the single operations (the log-free hash table fences twice per part of up to
    /// 256 puts, not once per put). Each write is still failure-atomic; after an error, any subset
    /// of the batch's writes may have been applied. Keys should be distinct (a
    /// repeated key is applied in order, only slower).
    fn apply_batch(&mut self, items: &[(&[u8], Option<&[u8]>)]) -> Result<()> {
        for (k, v) in items {
            match v {
                Some(v) => {
                    self.put(k, v)?;
                }
                None => {
                    self.remove(k)?;
                }
            }
        }
        Ok(())
    }
}

pub(crate) fn check_kv(key: &[u8], value: Option<&[u8]>) -> Result<()> {
    if key.len() > MAX_KEY {
        return Err(Error::KeyTooLarge(key.len()));
    }
    if let Some(v) = value {
        if v.len() > MAX_VALUE {
            return Err(Error::ValueTooLarge(v.len()));
        }
    }
    Ok(())
}

/// The split-order position of a key with hash `hash`: `reverse_bits(hash | 2^63)`,
/// always odd (the regular split key of [`LfHash`]). This is the cursor space of
/// [`Ops::scan`] at every level (index structures and the engine's stores):
///
/// - a scan step returns the keys whose position is `>= cursor`; the cursor it
///   returns is the position to resume from (every position below it is covered),
///   0 when the whole position space is covered;
/// - cursor 0 starts a scan; any `u64` is a valid cursor (a client may send
///   anything): it simply skips the positions below it.
///
/// A table whose bucket of a key is `hash & (2^k - 1)` holds in bucket `b`
/// exactly the positions whose top `k` bits are those of `reverse_bits(b)`: the
/// range `[bucket_pos(b), bucket_end_pos(b, k))`, so a cursor range maps to a run
/// of buckets in bit-reversed order, whatever `k` is, and resizing such a table
/// (which splits each bucket's range in two halves) moves no key across a cursor.
#[inline]
pub fn scan_pos(hash: u64) -> u64 {
    (hash | 1 << 63).reverse_bits()
}

/// The bucket of position `pos` in a table of `2^k` buckets (`k < 64`) indexed by
/// `hash & (2^k - 1)`: `reverse_bits(pos) & (2^k - 1)`.
#[inline]
pub fn pos_bucket(pos: u64, k: u32) -> u64 {
    debug_assert!(k < 64);
    pos.reverse_bits() & ((1u64 << k) - 1)
}

/// The first position of bucket `b` (any table size): `reverse_bits(b)`.
#[inline]
pub fn bucket_pos(b: u64) -> u64 {
    b.reverse_bits()
}

/// The end (exclusive) of bucket `b`'s positions in a table of `2^k` buckets
/// (`k < 64`, `b < 2^k`): the first position of the next bucket in position
/// order, or 0 when `b` holds the last positions (the scan is then complete).
#[inline]
pub fn bucket_end_pos(b: u64, k: u32) -> u64 {
    debug_assert!(k < 64 && b >> k == 0);
    if k == 0 {
        return 0;
    }
    b.reverse_bits().wrapping_add(1u64 << (64 - k))
}

/// How a structure hashes its keys. The hash places keys in buckets and orders
/// them (split order, the [`scan_pos`] cursor space), and both are persistent, so a
/// structure's hasher is chosen at creation and kept in its descriptor for life.
///
/// Structures created now use **SipHash-1-3 under a random 128-bit key** (what
/// Rust's `HashMap` uses, and Redis's dict uses SipHash-1-2 for the same reason):
/// a client cannot choose keys that share a bucket without knowing the key, and
/// the hash positions that SCAN cursors reveal do not help it find the key
/// (SipHash is a pseudorandom function). Structures written by an earlier Ember
/// (descriptor version 1) hash with unkeyed xxh3 and keep doing so.
///
/// `Debug` does not print the key.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct KeyHasher {
    k0: u64,
    k1: u64,
    legacy: bool,
}

impl KeyHasher {
    /// The unkeyed xxh3 of version-1 descriptors.
    pub const LEGACY_XXH3: KeyHasher = KeyHasher {
        k0: 0,
        k1: 0,
        legacy: true,
    };

    /// SipHash-1-3 under the key `(k0, k1)`.
    pub const fn sip13(k0: u64, k1: u64) -> KeyHasher {
        KeyHasher {
            k0,
            k1,
            legacy: false,
        }
    }

    /// SipHash-1-3 under a key drawn from `rand`'s thread RNG (a CSPRNG seeded by
    /// the operating system).
    pub fn random() -> KeyHasher {
        Self::sip13(rand::random(), rand::random())
    }

    /// The SipHash key, `None` for the legacy xxh3.
    pub fn sip_key(&self) -> Option<(u64, u64)> {
        (!self.legacy).then_some((self.k0, self.k1))
    }

    /// The 64-bit hash of `key`.
    #[inline]
    pub fn hash(&self, key: &[u8]) -> u64 {
        if self.legacy {
            return xxhash_rust::xxh3::xxh3_64(key);
        }
        let mut h = siphasher::sip::SipHasher13::new_with_keys(self.k0, self.k1);
        std::hash::Hasher::write(&mut h, key);
        std::hash::Hasher::finish(&h)
    }
}

impl std::fmt::Debug for KeyHasher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.legacy {
            "KeyHasher(xxh3, unkeyed)"
        } else {
            "KeyHasher(siphash-1-3, keyed)"
        })
    }
}
