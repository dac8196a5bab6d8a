//! phash: the lock-based baseline hash table.
//!
//! This is the redo-log baseline of the log-free data structures paper, and Bullet's
//! backend table. It has chained buckets, each under a persistent spinlock
//! ([`pmem::lock`]). Every update is one failure-atomic redo-log transaction
//! ([`pmem::Tx`]), run while the bucket's lock is held. The point of it is to be
//! simple and obviously correct, so the log-free structures ([`crate::LfHash`],
//! [`crate::SkipList`]) have something to be measured against. It pays the
//! fences of the redo log: four per insert or update, three per remove (plus one
//! when a page run or huge block is freed). Every operation, reads included, takes
//! its bucket's lock.
//!
//! # Layout
//!
//! All fields are little-endian. Offsets are relative to the start of the block.
//!
//! Descriptor block ([`DESC_SIZE`] = 48 bytes, the table's [`Index::root`]):
//!
//! ```text
//! 0   tag u32        DESC_TAG  0x5248_5045 ("EPHR")
//! 4   version u32    VERSION = 2
//! 8   nbuckets u64   a power of two, 1 ..= 2^32 (fixed for the life of the table)
//! 16  array u64      offset of the bucket array block
//! 24  count u64      number of keys: exact after `close()`, otherwise approximate
//!                    (written now and then without a fence)
//! 32  key 2 x u64    the SipHash-1-3 key every key is hashed with
//!                    ([`crate::KeyHasher`])
//! ```
//!
//! A version-1 descriptor (32 bytes, made by an earlier Ember) has no key: its
//! table hashes with unkeyed xxh3.
//!
//! Bucket array block (`nbuckets` x [`BUCKET_SIZE`] = 16 bytes, zeroed at creation):
//!
//! ```text
//! 16*b + 0   lock u64   persistent spinlock word of bucket b (`pmem::lock`:
//!                       generation << 1 | held). It is never flushed on purpose.
//!                       A lock held when the process died is free after the
//!                       next open, because opening bumps the generation.
//! 16*b + 8   head u64   offset of the first node of bucket b's chain (0 = empty)
//! ```
//!
//! Node block ([`NODE_HDR`] + klen bytes):
//!
//! ```text
//! 0   tag u32        NODE_TAG  0x4e48_5045 ("EPHN")
//! 4   klen u32       key length (<= MAX_KEY)
//! 8   hash u64       the table's hash of the key. The node lives in bucket hash & (nbuckets-1).
//! 16  next u64       next node of the chain (0 = end). Chains are unordered:
//!                    new nodes go at the head.
//! 24  value u64      offset of the node's value block
//! 32  key bytes      klen bytes
//! ```
//!
//! Value block (the format of [`crate::blob`]; [`blob::HDR`] + len bytes):
//!
//! ```text
//! 0   tag u32        blob::VAL_TAG ("EVAL")
//! 4   len u32        value length (<= MAX_VALUE)
//! 8   owner u64      offset of the node whose `value` field publishes this block
//! 16  value bytes
//! ```
//!
//! Node and value blocks are allocated inside the transaction that publishes them
//! ([`pmem::Tx::alloc`]). Writes into those fresh blocks go straight to the block
//! and are flushed at commit. Only the writes to links that already exist go
//! through the redo log. This is why the value block is written here and not with
//! [`blob::alloc_value`], which allocates outside a transaction.
//!
//! # Operations and persist order
//!
//! Every operation takes the bucket's lock first and releases it after
//! `commit` has returned. So a reader never sees a half-applied transaction or a
//! block that a commit has just freed.
//!
//! - **insert** (a new key, by `put` or `insert`): `tx.alloc` the node and the value
//!   block. Write them directly: `node.next` = the current head, `value.owner` =
//!   node. Log `bucket.head := node`. Commit then does this: (1) flush the fresh
//!   blocks and the log record, then **fence**; (2) write the commit record, flush
//!   it, **fence** (the commit point); (3) write `bucket.head` in place, flush,
//!   **fence**; (4) clear the log, **fence**.
//! - **update** (`put` of a present key): `tx.alloc` a new value block and write it
//!   directly (owner = the node). Log `node.value := new`. `tx.free` the old value
//!   block: it becomes covered by the active page table (durable by the commit). Commit runs
//!   the same steps 1–4, then (5) frees the old block.
//! - **remove**: log `prev.next := node.next` (`prev.next` is `bucket.head` when
//!   the node comes first). `tx.free` the node and its value block. Commit runs
//!   steps 1–4 (there is no fresh block, so the first fence is skipped), then (5)
//!   frees both blocks.
//! - **get**: takes the lock, searches, copies the value, releases the lock.
//!   There is no transaction.
//! - **scan** ([`Ops::scan`], cursor = [`crate::scan_pos`] position): bucket `b`
//!   holds exactly the positions whose top `log2(nbuckets)` bits are those of
//!   `reverse_bits(b)`, so a step visits buckets in bit-reversed order from the
//!   one holding the cursor, each under its lock, copies out the keys at or past
//!   the cursor (a bucket whole: chains are unordered), and returns the end of the
//!   last bucket visited as the next cursor. No transaction.
//!
//! A crash before the commit point leaves the table as it was. The blocks the
//! transaction allocated are in active pages and unreachable, so the leak sweep
//! frees them. A crash after the commit point is fixed when the heap is opened:
//! the committed log is replayed. Any block the transaction was to free is then
//! in an active page and unreachable, so the sweep frees it. Each operation is
//! therefore durable when it returns, and [`Ops::sync`] has nothing to do.
//!
//! # Recovery
//!
//! [`Recoverable::repair`] does nothing: transactions already make updates atomic,
//! and `Heap::open` has replayed committed logs. [`Recoverable::reachable`] is
//! exact for any 16-aligned offset, whatever bytes it holds. An offset is
//! reachable if and only if it is one of these:
//!
//! - the descriptor;
//! - the bucket array;
//! - a node found by walking the chain of the bucket named by the hash stored in
//!   the slot (addresses are compared, so a stale or garbage slot never matches);
//! - a value block whose recorded owner is such a reachable node and whose owner's
//!   `value` field points back at it.
//!
//! Every read is checked against the heap bounds first. Chain walks are bounded,
//! so garbage can neither panic nor loop.
//!
//! The volatile key count (an `AtomicI64`) is updated while the bucket lock is
//! held. Each handle writes it to the descriptor every [`COUNT_EVERY`] updates
//! without a fence, and [`Index::close`] persists it exactly. After a crash,
//! [`Index::len_estimate`] is approximate until the next clean close.

use crate::blob;
use crate::{check_kv, Error, Index, KeyHasher, Ops, Recoverable, Result, Verified};
use crate::{MAX_KEY, MAX_VALUE};
use pmem::{Heap, PPtr, Region, ThreadHeap, Tx};
use std::fmt;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

/// Descriptor tag, "EPHR" in little-endian bytes.
pub const DESC_TAG: u32 = 0x5248_5045;
/// Node tag, "EPHN" in little-endian bytes.
pub const NODE_TAG: u32 = 0x4e48_5045;
/// Format version written in the descriptor (version 1, without the hash key,
/// is still read).
pub const VERSION: u32 = 2;

/// Descriptor block size.
pub const DESC_SIZE: u64 = 48;
/// Descriptor block size of version 1.
pub const DESC_SIZE_V1: u64 = 32;
/// Descriptor field: tag (u32).
pub const D_TAG: u64 = 0;
/// Descriptor field: version (u32).
pub const D_VERSION: u64 = 4;
/// Descriptor field: number of buckets (u64).
pub const D_NBUCKETS: u64 = 8;
/// Descriptor field: bucket array offset (u64).
pub const D_ARRAY: u64 = 16;
/// Descriptor field: key count (u64).
pub const D_COUNT: u64 = 24;
/// Descriptor field: the SipHash key (2 x u64; version 2).
pub const D_KEY: u64 = 32;

/// Bytes per bucket in the bucket array.
pub const BUCKET_SIZE: u64 = 16;
/// Bucket field: persistent lock word (u64).
pub const B_LOCK: u64 = 0;
/// Bucket field: chain head (u64).
pub const B_HEAD: u64 = 8;

/// Node header size; the key bytes follow it.
pub const NODE_HDR: u64 = 32;
/// Node field: tag (u32).
pub const N_TAG: u64 = 0;
/// Node field: key length (u32).
pub const N_KLEN: u64 = 4;
/// Node field: key hash (u64).
pub const N_HASH: u64 = 8;
/// Node field: next node of the chain (u64).
pub const N_NEXT: u64 = 16;
/// Node field: value block (u64).
pub const N_VALUE: u64 = 24;

/// Largest bucket count.
pub const MAX_BUCKETS: u64 = 1 << 32;
/// Default bucket count.
pub const DEFAULT_BUCKETS: u64 = 1 << 16;
/// Each handle writes the volatile count to the descriptor every this many
/// updates (no fence).
pub const COUNT_EVERY: u64 = 4096;

/// Options of a new table.
#[derive(Clone, Debug)]
pub struct PHashOptions {
    /// Number of buckets. It is rounded up to a power of two in `1 ..= 2^32` and
    /// is fixed for the life of the table (the table never grows).
    pub buckets: u64,
    /// The key hash (`None`: SipHash-1-3 under a random key, the default). Tests
    /// fix it to make layouts repeatable; [`KeyHasher::LEGACY_XXH3`] makes the
    /// version-1 table of an earlier Ember.
    pub hasher: Option<KeyHasher>,
}

impl Default for PHashOptions {
    fn default() -> Self {
        PHashOptions {
            buckets: DEFAULT_BUCKETS,
            hasher: None,
        }
    }
}

impl PHashOptions {
    /// The bucket count that will actually be used.
    pub fn effective_buckets(&self) -> u64 {
        self.buckets.clamp(1, MAX_BUCKETS).next_power_of_two()
    }
}

struct Inner {
    heap: Heap,
    /// Descriptor offset.
    root: u64,
    nbuckets: u64,
    mask: u64,
    /// Bucket array offset.
    array: u64,
    /// Live keys (volatile; changed under the bucket lock, so never negative).
    count: AtomicI64,
    hasher: KeyHasher,
}

/// The lock-based durable hash table. See the module documentation.
///
/// Cloning is cheap: all clones share one table.
#[derive(Clone)]
pub struct PHash {
    inner: Arc<Inner>,
}

impl fmt::Debug for PHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PHash")
            .field("root", &format_args!("{:#x}", self.inner.root))
            .field("array", &format_args!("{:#x}", self.inner.array))
            .field("nbuckets", &self.inner.nbuckets)
            .field("count", &self.inner.count.load(Ordering::Relaxed))
            .finish()
    }
}

/// A per-thread handle: the table and one heap thread slot. The slot provides the
/// redo log and the allocation context.
pub struct PHashHandle {
    table: PHash,
    th: ThreadHeap,
    updates: u64,
}

/// The search result for a key in a bucket chain.
struct Found {
    node: u64,
    /// Offset of the word that points at `node`: the bucket head or `prev.next`.
    link: u64,
    value: u64,
    vlen: u64,
}

fn corrupt(msg: String) -> Error {
    Error::Corrupt(msg)
}

/// Whether a node header can be read at `p`: `p` is non-null, 16-aligned, and
/// inside the heap.
#[inline]
fn node_ok(r: &Region, p: u64) -> bool {
    p != 0 && p.is_multiple_of(16) && r.contains(p, NODE_HDR)
}

/// A bound on the length of any well-formed chain. Each node is at least
/// `NODE_HDR` bytes, so a walk longer than this has met a cycle.
#[inline]
fn walk_limit(r: &Region) -> u64 {
    r.size() / NODE_HDR + 1
}

/// Checks a value block with bounds checks, and returns its length.
fn value_len_checked(r: &Region, v: u64) -> Option<u64> {
    if v == 0 || !v.is_multiple_of(16) || !r.contains(v, blob::HDR) {
        return None;
    }
    if r.read::<u32>(v) != blob::VAL_TAG {
        return None;
    }
    let len = r.read::<u32>(v + 4) as u64;
    if len > MAX_VALUE as u64 || !r.contains(v + blob::HDR, len) {
        return None;
    }
    Some(len)
}

/// Compares `key` with the `key.len()` bytes at `at`. The caller has checked that
/// they are inside the heap.
fn key_eq(r: &Region, at: u64, key: &[u8]) -> bool {
    let mut buf = [0u8; 256];
    let mut off = at;
    for chunk in key.chunks(buf.len()) {
        let b = &mut buf[..chunk.len()];
        r.read_bytes(off, b);
        if b != chunk {
            return false;
        }
        off += chunk.len() as u64;
    }
    true
}

/// Allocates a value block in `tx` and writes it directly (it is a fresh block).
fn write_value(tx: &mut Tx<'_>, owner: u64, v: &[u8]) -> Result<u64> {
    let p = tx.alloc(blob::HDR + v.len() as u64)?.offset();
    let mut h = [0u8; blob::HDR as usize];
    h[0..4].copy_from_slice(&blob::VAL_TAG.to_le_bytes());
    h[4..8].copy_from_slice(&(v.len() as u32).to_le_bytes());
    h[8..16].copy_from_slice(&owner.to_le_bytes());
    tx.write(p, &h)?;
    if !v.is_empty() {
        tx.write(p + blob::HDR, v)?;
    }
    Ok(p)
}

impl Inner {
    #[inline]
    fn region(&self) -> &Region {
        self.heap.region()
    }

    /// The bucket of `hash`: the offset of its 16-byte entry in the array.
    #[inline]
    fn bucket(&self, hash: u64) -> u64 {
        self.array + BUCKET_SIZE * (hash & self.mask)
    }

    /// Searches bucket `bucket` for `key`. The caller holds the bucket's lock.
    /// Anything malformed on the path gives an error, never a panic.
    fn find(&self, bucket: u64, hash: u64, key: &[u8]) -> Result<Option<Found>> {
        let r = self.region();
        let limit = walk_limit(r);
        let mut link = bucket + B_HEAD;
        let mut cur: u64 = r.read(link);
        let mut steps = 0u64;
        while cur != 0 {
            steps += 1;
            r.emulate_read();
            if !node_ok(r, cur) || steps > limit {
                return Err(corrupt(format!(
                    "phash: bucket {bucket:#x}: bad link {cur:#x} at {link:#x}"
                )));
            }
            if r.read::<u32>(cur + N_TAG) != NODE_TAG {
                return Err(corrupt(format!("phash: node {cur:#x} has a bad tag")));
            }
            if r.read::<u64>(cur + N_HASH) == hash {
                let klen = r.read::<u32>(cur + N_KLEN) as u64;
                if klen == key.len() as u64 {
                    if !r.contains(cur + NODE_HDR, klen) {
                        return Err(corrupt(format!("phash: node {cur:#x} overruns the heap")));
                    }
                    if key_eq(r, cur + NODE_HDR, key) {
                        let value: u64 = r.read(cur + N_VALUE);
                        let Some(vlen) = value_len_checked(r, value) else {
                            return Err(corrupt(format!(
                                "phash: node {cur:#x}: bad value block {value:#x}"
                            )));
                        };
                        return Ok(Some(Found {
                            node: cur,
                            link,
                            value,
                            vlen,
                        }));
                    }
                }
            }
            link = cur + N_NEXT;
            cur = r.read(link);
        }
        Ok(None)
    }

    /// Whether `off` is a node linked in its bucket's chain. This is exact for any
    /// offset and any content (see the module documentation).
    fn node_linked(&self, off: u64) -> bool {
        let r = self.region();
        if !node_ok(r, off) || r.read::<u32>(off + N_TAG) != NODE_TAG {
            return false;
        }
        let hash: u64 = r.read(off + N_HASH);
        let limit = walk_limit(r);
        let mut cur: u64 = r.read(self.bucket(hash) + B_HEAD);
        let mut steps = 0u64;
        while cur != 0 && steps <= limit {
            if cur == off {
                return true;
            }
            if !node_ok(r, cur) {
                return false;
            }
            cur = r.read(cur + N_NEXT);
            steps += 1;
        }
        false
    }

    /// One scan step (see [`Ops::scan`]). Bucket `b` holds exactly the positions
    /// `[bucket_pos(b), bucket_end_pos(b, k))` (`2^k` buckets, bucket = `hash &
    /// mask`), so the step visits buckets in bit-reversed order from the one
    /// holding `cursor`, each under its lock, and returns every key of a bucket
    /// whose position is at least `cursor` (chains are unordered: a bucket is
    /// returned whole, so the next cursor is a bucket's end). It stops after a
    /// bucket once it has `count` keys or has visited `10 × count` buckets. The
    /// table never resizes.
    fn scan_keys(&self, cursor: u64, count: usize, out: &mut Vec<Vec<u8>>) -> Result<u64> {
        let r = self.region();
        let k = self.nbuckets.trailing_zeros();
        let count = count.max(1);
        let budget = count.saturating_mul(10);
        let limit = walk_limit(r);
        let (mut from, mut got, mut visited) = (cursor, 0usize, 0usize);
        loop {
            let b = crate::pos_bucket(from, k);
            let bucket = self.array + BUCKET_SIZE * b;
            {
                let _guard = pmem::lock::lock(r, bucket + B_LOCK);
                let mut link = bucket + B_HEAD;
                let mut cur: u64 = r.read(link);
                let mut steps = 0u64;
                while cur != 0 {
                    steps += 1;
                    if !node_ok(r, cur) || steps > limit {
                        return Err(corrupt(format!(
                            "phash: bucket {bucket:#x}: bad link {cur:#x} at {link:#x}"
                        )));
                    }
                    if r.read::<u32>(cur + N_TAG) != NODE_TAG {
                        return Err(corrupt(format!("phash: node {cur:#x} has a bad tag")));
                    }
                    let hash: u64 = r.read(cur + N_HASH);
                    if hash & self.mask != b {
                        return Err(corrupt(format!(
                            "phash: node {cur:#x} with hash {hash:#x} is in bucket {b}"
                        )));
                    }
                    if crate::scan_pos(hash) >= from {
                        let klen = r.read::<u32>(cur + N_KLEN) as u64;
                        if klen > MAX_KEY as u64 || !r.contains(cur + NODE_HDR, klen) {
                            return Err(corrupt(format!("phash: node {cur:#x} overruns the heap")));
                        }
                        let mut key = vec![0u8; klen as usize];
                        r.read_bytes(cur + NODE_HDR, &mut key);
                        out.push(key);
                        got += 1;
                    }
                    link = cur + N_NEXT;
                    cur = r.read(link);
                }
            }
            visited += 1;
            let end = crate::bucket_end_pos(b, k);
            if end == 0 {
                return Ok(0);
            }
            if got >= count || visited >= budget {
                return Ok(end);
            }
            from = end;
        }
    }

    /// Writes the volatile count to the descriptor and flushes it. With `fence`,
    /// it is also made durable.
    fn store_count(&self, fence: bool) {
        let r = self.region();
        let c = self.count.load(Ordering::Acquire).max(0) as u64;
        let off = self.root + D_COUNT;
        r.atomic_u64(off).store(c, Ordering::Release);
        r.flush(off, 8);
        if fence {
            r.fence();
        }
    }
}

impl PHash {
    /// Creates an empty table. It allocates the descriptor and the zeroed bucket
    /// array with a thread slot of its own, and makes both durable (one fence).
    ///
    /// This does not set the heap root. The caller stores [`Index::root`]
    /// somewhere durable (e.g. `heap.set_root(table.root())`) before it runs
    /// operations. Until then, a crash leaves the two blocks to the next leak sweep.
    pub fn create(heap: &Heap, opts: &PHashOptions) -> Result<PHash> {
        let n = opts.effective_buckets();
        let mut th = heap.thread()?;
        let desc = th.alloc_zeroed(DESC_SIZE)?.offset();
        let array = match th.alloc_zeroed(n * BUCKET_SIZE) {
            Ok(p) => p.offset(),
            Err(e) => {
                let _ = th.free(PPtr::from_raw(desc));
                return Err(e.into());
            }
        };
        let r = heap.region();
        r.write::<u32>(desc + D_TAG, &DESC_TAG);
        r.write::<u32>(desc + D_VERSION, &VERSION);
        r.write::<u64>(desc + D_NBUCKETS, &n);
        r.write::<u64>(desc + D_ARRAY, &array);
        r.write::<u64>(desc + D_COUNT, &0);
        let hasher = opts.hasher.unwrap_or_else(KeyHasher::random);
        match hasher.sip_key() {
            Some((k0, k1)) => {
                r.write::<u64>(desc + D_KEY, &k0);
                r.write::<u64>(desc + D_KEY + 8, &k1);
            }
            // What an earlier Ember wrote (compatibility tests).
            None => r.write::<u32>(desc + D_VERSION, &1),
        }
        r.flush(desc, DESC_SIZE as usize);
        r.fence();
        Ok(PHash::from_parts(heap, desc, n, array, 0, hasher))
    }

    /// Attaches to the table whose descriptor is at `root`. It only reads: it
    /// works on a heap that is still recovering, and on a check-only view.
    ///
    /// Every field of the descriptor is validated: the tag, the version, a
    /// power-of-two bucket count, and the bucket array (aligned, inside the
    /// heap, a block at least as large as the buckets need). Anything wrong gives
    /// [`Error::Corrupt`].
    pub fn attach(heap: &Heap, root: PPtr<u8>) -> Result<PHash> {
        let r = heap.region();
        let d = root.raw();
        if d == 0 {
            return Err(corrupt("phash: null descriptor".into()));
        }
        if !d.is_multiple_of(16) || !r.contains(d, DESC_SIZE_V1) {
            return Err(corrupt(format!(
                "phash: descriptor {d:#x} is misaligned or outside the heap"
            )));
        }
        let tag: u32 = r.read(d + D_TAG);
        if tag != DESC_TAG {
            return Err(corrupt(format!(
                "phash: descriptor {d:#x} has tag {tag:#x}, expected {DESC_TAG:#x}"
            )));
        }
        let version: u32 = r.read(d + D_VERSION);
        let size = match version {
            1 => DESC_SIZE_V1,
            VERSION => DESC_SIZE,
            _ => {
                return Err(corrupt(format!(
                    "phash: descriptor {d:#x} has version {version}, expected 1 or {VERSION}"
                )))
            }
        };
        match heap.usable_size(root) {
            Ok(s) if s >= size => {}
            Ok(s) => {
                return Err(corrupt(format!(
                    "phash: descriptor block {d:#x} is only {s} bytes"
                )))
            }
            Err(e) => {
                return Err(corrupt(format!(
                    "phash: descriptor {d:#x} is not a heap block: {e}"
                )))
            }
        }
        let n: u64 = r.read(d + D_NBUCKETS);
        if n == 0 || n > MAX_BUCKETS || !n.is_power_of_two() {
            return Err(corrupt(format!(
                "phash: descriptor {d:#x}: bucket count {n} is not a power of two in 1..=2^32"
            )));
        }
        let array: u64 = r.read(d + D_ARRAY);
        let bytes = n * BUCKET_SIZE; // n <= 2^32: no overflow
        if array == 0 || array == d || !array.is_multiple_of(16) || !r.contains(array, bytes) {
            return Err(corrupt(format!(
                "phash: bucket array {array:#x} ({bytes} bytes) is misaligned or outside the heap"
            )));
        }
        match heap.usable_size(PPtr::from_raw(array)) {
            Ok(s) if s >= bytes => {}
            Ok(s) => {
                return Err(corrupt(format!(
                    "phash: bucket array block {array:#x} is {s} bytes, {n} buckets need {bytes}"
                )))
            }
            Err(e) => {
                return Err(corrupt(format!(
                    "phash: bucket array {array:#x} is not a heap block: {e}"
                )))
            }
        }
        let count: u64 = r.read(d + D_COUNT);
        let hasher = if version == 1 {
            KeyHasher::LEGACY_XXH3
        } else {
            KeyHasher::sip13(r.read(d + D_KEY), r.read(d + D_KEY + 8))
        };
        Ok(PHash::from_parts(heap, d, n, array, count, hasher))
    }

    fn from_parts(
        heap: &Heap,
        root: u64,
        nbuckets: u64,
        array: u64,
        count: u64,
        hasher: KeyHasher,
    ) -> PHash {
        PHash {
            inner: Arc::new(Inner {
                heap: heap.clone(),
                root,
                nbuckets,
                mask: nbuckets - 1,
                array,
                count: AtomicI64::new(count.min(i64::MAX as u64) as i64),
                hasher,
            }),
        }
    }

    /// How this table hashes its keys (from its descriptor).
    pub fn hasher(&self) -> KeyHasher {
        self.inner.hasher
    }

    /// The heap the table lives in.
    pub fn heap(&self) -> &Heap {
        &self.inner.heap
    }

    /// Number of buckets (a power of two).
    pub fn nbuckets(&self) -> u64 {
        self.inner.nbuckets
    }

    /// The bucket array block.
    pub fn array(&self) -> PPtr<u8> {
        PPtr::from_raw(self.inner.array)
    }
}

impl Index for PHash {
    type Handle = PHashHandle;

    fn handle(&self) -> Result<PHashHandle> {
        Ok(PHashHandle {
            table: self.clone(),
            th: self.inner.heap.thread()?,
            updates: 0,
        })
    }

    fn root(&self) -> PPtr<u8> {
        PPtr::from_raw(self.inner.root)
    }

    /// Walks every bucket and checks the following: the descriptor is unchanged;
    /// every node is readable, tagged, in the bucket of its hash, and has the hash
    /// of its key; every value block is valid and names its node as owner; no key
    /// appears twice; no chain has a cycle; every block is allocated.
    ///
    /// When `quiescent` is false, each bucket is locked while it is walked, so
    /// this can run at the same time as operations. When it is true, no lock is
    /// taken. That is also what makes it usable on a check-only view, where a lock
    /// word left held by a crashed process still looks held.
    fn verify(&self, quiescent: bool) -> std::result::Result<Verified, String> {
        let inner = &*self.inner;
        let r = inner.region();
        let heap = &inner.heap;
        let d = inner.root;
        let key = inner.hasher.sip_key();
        let (version, size) = match key {
            Some(_) => (VERSION, DESC_SIZE),
            None => (1, DESC_SIZE_V1),
        };
        if !r.contains(d, size) || !r.contains(inner.array, inner.nbuckets * BUCKET_SIZE) {
            return Err(format!(
                "phash: descriptor {d:#x} or its array left the heap"
            ));
        }
        if r.read::<u32>(d + D_TAG) != DESC_TAG
            || r.read::<u32>(d + D_VERSION) != version
            || r.read::<u64>(d + D_NBUCKETS) != inner.nbuckets
            || r.read::<u64>(d + D_ARRAY) != inner.array
            || key.is_some_and(|k| (r.read(d + D_KEY), r.read(d + D_KEY + 8)) != k)
        {
            return Err(format!("phash: descriptor {d:#x} changed since attach"));
        }
        for (what, p) in [("descriptor", d), ("bucket array", inner.array)] {
            if !heap.is_allocated(PPtr::from_raw(p)) {
                return Err(format!("phash: {what} {p:#x} is not an allocated block"));
            }
        }
        let mut out = Verified {
            keys: 0,
            blocks: 2,
            payload_bytes: 0,
        };
        let limit = walk_limit(r);
        let mut chain: Vec<(u64, u64, u64)> = Vec::new(); // (hash, node, klen)
        let (mut ka, mut kb) = (Vec::new(), Vec::new());
        for b in 0..inner.nbuckets {
            let bucket = inner.array + BUCKET_SIZE * b;
            let _guard = (!quiescent).then(|| pmem::lock::lock(r, bucket + B_LOCK));
            chain.clear();
            let mut link = bucket + B_HEAD;
            let mut cur: u64 = r.read(link);
            while cur != 0 {
                if chain.len() as u64 >= limit {
                    return Err(format!("phash: bucket {b}: the chain has a cycle"));
                }
                if !node_ok(r, cur) {
                    return Err(format!(
                        "phash: bucket {b}: link {cur:#x} at {link:#x} is misaligned or outside the heap"
                    ));
                }
                let tag: u32 = r.read(cur + N_TAG);
                if tag != NODE_TAG {
                    return Err(format!(
                        "phash: bucket {b}: node {cur:#x} has tag {tag:#x}, expected {NODE_TAG:#x}"
                    ));
                }
                if !heap.is_allocated(PPtr::from_raw(cur)) {
                    return Err(format!("phash: bucket {b}: node {cur:#x} is not allocated"));
                }
                let klen = r.read::<u32>(cur + N_KLEN) as u64;
                if klen > MAX_KEY as u64 || !r.contains(cur + NODE_HDR, klen) {
                    return Err(format!(
                        "phash: node {cur:#x}: key length {klen} is too large"
                    ));
                }
                match heap.usable_size(PPtr::from_raw(cur)) {
                    Ok(s) if s >= NODE_HDR + klen => {}
                    other => {
                        return Err(format!(
                        "phash: node {cur:#x}: block size {other:?} cannot hold a {klen}-byte key"
                    ))
                    }
                }
                ka.resize(klen as usize, 0);
                r.read_bytes(cur + NODE_HDR, &mut ka);
                let hash: u64 = r.read(cur + N_HASH);
                if hash != self.inner.hasher.hash(&ka) {
                    return Err(format!(
                        "phash: node {cur:#x}: stored hash {hash:#x} is not the hash of its key"
                    ));
                }
                if hash & inner.mask != b {
                    return Err(format!(
                        "phash: node {cur:#x} with hash {hash:#x} is in bucket {b}, not {}",
                        hash & inner.mask
                    ));
                }
                let v: u64 = r.read(cur + N_VALUE);
                let vlen = blob::verify_value(r, v, cur)?;
                if !v.is_multiple_of(16) || vlen > MAX_VALUE as u64 {
                    return Err(format!("phash: node {cur:#x}: bad value block {v:#x}"));
                }
                if !heap.is_allocated(PPtr::from_raw(v)) {
                    return Err(format!(
                        "phash: node {cur:#x}: value block {v:#x} is not allocated"
                    ));
                }
                match heap.usable_size(PPtr::from_raw(v)) {
                    Ok(s) if s >= blob::HDR + vlen => {}
                    other => {
                        return Err(format!(
                        "phash: value block {v:#x}: block size {other:?} cannot hold {vlen} bytes"
                    ))
                    }
                }
                chain.push((hash, cur, klen));
                out.keys += 1;
                out.blocks += 2;
                out.payload_bytes += klen + vlen;
                link = cur + N_NEXT;
                cur = r.read(link);
            }
            // No key twice in a chain: compare the keys of nodes with equal hashes.
            if chain.len() > 1 {
                chain.sort_unstable();
                for w in chain.windows(2) {
                    let ((h1, n1, l1), (h2, n2, l2)) = (w[0], w[1]);
                    if h1 != h2 || l1 != l2 {
                        continue;
                    }
                    ka.resize(l1 as usize, 0);
                    kb.resize(l2 as usize, 0);
                    r.read_bytes(n1 + NODE_HDR, &mut ka);
                    r.read_bytes(n2 + NODE_HDR, &mut kb);
                    if ka == kb {
                        return Err(format!(
                            "phash: bucket {b}: nodes {n1:#x} and {n2:#x} hold the same key"
                        ));
                    }
                }
            }
        }
        Ok(out)
    }

    fn len_estimate(&self) -> u64 {
        self.inner.count.load(Ordering::Acquire).max(0) as u64
    }

    /// Every operation is already durable, so this only persists the exact count.
    fn close(&self) -> Result<()> {
        self.inner.store_count(true);
        self.inner.region().health()?;
        Ok(())
    }
}

impl Recoverable for PHash {
    /// Nothing to repair: updates are transactions, and `Heap::open` has already
    /// replayed committed logs.
    fn repair(&self, _slots: &[(PPtr<u8>, u64)]) -> Result<u64> {
        Ok(0)
    }

    /// Exact reachability of the block at `p` (see the module documentation). It
    /// never panics, whatever the slot holds.
    fn reachable(&self, p: PPtr<u8>) -> bool {
        let inner = &*self.inner;
        let off = p.raw();
        if off == 0 || !off.is_multiple_of(16) {
            return false;
        }
        if off == inner.root || off == inner.array {
            return true;
        }
        if inner.node_linked(off) {
            return true;
        }
        // A value block: its recorded owner must be linked and point back at it.
        let r = inner.region();
        if !r.contains(off, blob::HDR) || r.read::<u32>(off) != blob::VAL_TAG {
            return false;
        }
        let owner: u64 = r.read(off + 8);
        inner.node_linked(owner) && r.read::<u64>(owner + N_VALUE) == off
    }
}

impl PHashHandle {
    /// The table this handle operates on.
    pub fn table(&self) -> &PHash {
        &self.table
    }

    /// Shared path of `put` (`replace`) and `insert` (`!replace`).
    fn upsert(&mut self, key: &[u8], value: &[u8], replace: bool) -> Result<bool> {
        check_kv(key, Some(value))?;
        let inner = &*self.table.inner;
        let r = inner.region();
        let hash = inner.hasher.hash(key);
        let bucket = inner.bucket(hash);
        let guard = pmem::lock::lock(r, bucket + B_LOCK);
        let new = match inner.find(bucket, hash, key)? {
            Some(f) => {
                if !replace {
                    return Ok(false);
                }
                let mut tx = self.th.begin();
                let v = write_value(&mut tx, f.node, value)?;
                tx.write_u64(f.node + N_VALUE, v)?;
                tx.free(PPtr::from_raw(f.value))?;
                tx.commit()?;
                false
            }
            None => {
                let mut tx = self.th.begin();
                let node = tx.alloc(NODE_HDR + key.len() as u64)?.offset();
                let v = write_value(&mut tx, node, value)?;
                let head: u64 = r.read(bucket + B_HEAD);
                let mut h = [0u8; NODE_HDR as usize];
                h[0..4].copy_from_slice(&NODE_TAG.to_le_bytes());
                h[4..8].copy_from_slice(&(key.len() as u32).to_le_bytes());
                h[8..16].copy_from_slice(&hash.to_le_bytes());
                h[16..24].copy_from_slice(&head.to_le_bytes());
                h[24..32].copy_from_slice(&v.to_le_bytes());
                tx.write(node, &h)?;
                if !key.is_empty() {
                    tx.write(node + NODE_HDR, key)?;
                }
                tx.write_u64(bucket + B_HEAD, node)?;
                tx.commit()?;
                inner.count.fetch_add(1, Ordering::AcqRel);
                true
            }
        };
        drop(guard);
        self.note_update();
        Ok(new)
    }

    fn note_update(&mut self) {
        self.updates += 1;
        if self.updates.is_multiple_of(COUNT_EVERY) {
            self.table.inner.store_count(false);
        }
    }
}

impl Ops for PHashHandle {
    fn get(&mut self, key: &[u8], out: &mut Vec<u8>) -> Result<bool> {
        check_kv(key, None)?;
        out.clear();
        let inner = &*self.table.inner;
        let r = inner.region();
        let hash = inner.hasher.hash(key);
        let bucket = inner.bucket(hash);
        let _guard = pmem::lock::lock(r, bucket + B_LOCK);
        match inner.find(bucket, hash, key)? {
            Some(f) => {
                // `find` checked the value block's bounds.
                out.resize(f.vlen as usize, 0);
                r.read_bytes(f.value + blob::HDR, out);
                Ok(true)
            }
            None => Ok(false),
        }
    }

    fn put(&mut self, key: &[u8], value: &[u8]) -> Result<bool> {
        self.upsert(key, value, true)
    }

    fn insert(&mut self, key: &[u8], value: &[u8]) -> Result<bool> {
        self.upsert(key, value, false)
    }

    fn remove(&mut self, key: &[u8]) -> Result<bool> {
        check_kv(key, None)?;
        let inner = &*self.table.inner;
        let r = inner.region();
        let hash = inner.hasher.hash(key);
        let bucket = inner.bucket(hash);
        let guard = pmem::lock::lock(r, bucket + B_LOCK);
        let Some(f) = inner.find(bucket, hash, key)? else {
            return Ok(false);
        };
        let next: u64 = r.read(f.node + N_NEXT);
        let mut tx = self.th.begin();
        tx.write_u64(f.link, next)?;
        tx.free(PPtr::from_raw(f.node))?;
        tx.free(PPtr::from_raw(f.value))?;
        tx.commit()?;
        inner.count.fetch_sub(1, Ordering::AcqRel);
        drop(guard);
        self.note_update();
        Ok(true)
    }

    /// Nothing to do: every operation is durable when its commit returns.
    fn sync(&mut self) -> Result<()> {
        Ok(())
    }

    fn scan(&mut self, cursor: u64, count: usize, out: &mut Vec<Vec<u8>>) -> Result<u64> {
        self.table.inner.scan_keys(cursor, count, out)
    }
}
