//! Bullet's DRAM frontend hash table (ATC '18, §2.2 and §4.2).
//!
//! Closed addressing with chaining. Every bucket has a small reader-writer
//! spinlock: writers take it exclusively, lock-based readers ([`Table::get_shared`],
//! the paper's `bullet-st`) take it shared, and nonblocking readers ([`Table::get`],
//! the paper's `+lfr`) take no lock at all. Memory reclamation goes through
//! crossbeam-epoch: unlinked nodes, replaced values and retired bucket arrays are
//! freed only after every guard that might still see them is gone.
//!
//! ## Chains
//!
//! New nodes are pushed at the head of their bucket. A node is unlinked by swinging
//! its predecessor's `next` past it; the unlinked node keeps its own `next`, so a
//! reader standing on it still reaches the rest of the chain. Since a `next` pointer
//! only ever points to an older node, chains are acyclic and every traversal ends.
//!
//! ## Doubling
//!
//! When the number of entries exceeds twice the number of buckets, the table spawns
//! a background thread (at most one at a time; it holds only an `Arc` of the shared
//! state, and dropping the table stops and joins it). The thread installs a new
//! array of twice the size whose buckets are all *pending*, linked from the old
//! array's `next`. It then migrates the old buckets one by one: under the old
//! bucket's lock (and the locks of its two target buckets) it copies every node
//! (cloning the value and the meta) into the new array, marks the two targets live
//! and the old bucket *migrated*. When every old bucket is migrated, the new array
//! becomes the base and the old one (with its frozen chains) is retired through
//! the epoch.
//!
//! - Readers start at the base array and follow `next` from migrated buckets. A
//!   bucket reached that way is never pending.
//! - Writers start at the newest array. A writer that locks a migrated bucket
//!   unlocks it and moves on to the next array; one that locks a pending bucket
//!   unlocks it and migrates the source bucket itself (helping), then retries.
//! - Lock order is always older array before newer array, so helping, migration
//!   and [`Table::for_each`] cannot deadlock.
//!
//! ## Scan
//!
//! [`Table::scan`] walks the table in split order (the bit-reversed hash, the
//! cursor of every level's scan, [`index::scan_pos`]): bucket `i` of `2^k` holds
//! one contiguous range of positions, which a doubling splits between buckets `i`
//! and `i + 2^k`, so a cursor keeps its meaning across doublings. Each bucket is
//! read under its shared lock from the base array, following migrated buckets.
//!
//! Never hold two [`Locked`] buckets at once, nor call into the table from the
//! closures of [`Table::get_shared`] and [`Table::for_each`] (they hold bucket locks).
//!
//! Metadata `M` is cloned when a node is migrated: changes made to a node's meta
//! must be made while holding its bucket lock (or be repeated on the node found
//! later), else a concurrent migration may copy the older state.

mod resize;
mod spin;
#[cfg(test)]
mod tests;
mod value;

use std::mem;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;

use crossbeam_epoch::{self as epoch, Atomic, Guard, Owned, Pointable, Pointer, Shared};
use pmem::prefetch_line;

use resize::migrate_bucket;
use spin::RwSpin;
use value::KeyBuf;
pub use value::{Blob, BlobInit, TableValue, TOMB_TAG};

const MIN_BUCKETS: usize = 16;
/// The table doubles when entries exceed `LOAD_FACTOR * buckets`.
const LOAD_FACTOR: usize = 1;
/// Busy spins before a waiting thread starts yielding its core.
const SPIN_LIMIT: u32 = 256;

// Bucket states.
/// A bucket whose chain is authoritative.
const LIVE: u32 = 0;
/// A bucket of a new array whose source bucket has not been migrated yet.
const PENDING: u32 = 1;
/// A bucket whose nodes now live in the next array.
const MIGRATED: u32 = 2;

// ---------------------------------------------------------------------------
// Nodes, buckets, arrays
// ---------------------------------------------------------------------------

/// One entry: key, value and the caller's metadata. The fields a lookup reads
/// (hash, next, key) come first.
#[repr(C)]
pub struct Node<V: ?Sized + Pointable, M> {
    hash: u64,
    next: Atomic<Node<V, M>>,
    key: KeyBuf,
    /// Never null.
    value: Atomic<V>,
    meta: M,
}

impl<V: ?Sized + Pointable, M> Node<V, M> {
    fn new(hash: u64, key: KeyBuf, value: Owned<V>, meta: M) -> Self {
        Node {
            hash,
            next: Atomic::null(),
            key,
            value: Atomic::from(value),
            meta,
        }
    }

    #[inline]
    fn matches(&self, hash: u64, key: &[u8]) -> bool {
        self.hash == hash && *self.key == *key
    }

    pub fn key(&self) -> &[u8] {
        &self.key
    }

    pub fn hash(&self) -> u64 {
        self.hash
    }

    pub fn meta(&self) -> &M {
        &self.meta
    }

    /// The tag of the current value's pointer (`TOMB_TAG` for a tombstone
    /// blob): no read of the value itself.
    #[inline]
    pub fn tagged(&self, g: &Guard) -> usize {
        self.value.load(Ordering::Acquire, g).tag()
    }

    /// The current value (always present: a node is created with one).
    #[inline]
    pub fn value<'g>(&'g self, g: &'g Guard) -> &'g V {
        let v = self.value.load(Ordering::Acquire, g);
        // SAFETY: a node's value pointer is never null. A value replaced by
        // `set_value` is retired through the epoch, so one loaded under `g` stays
        // alive while `g` is pinned; the current value lives as long as the node,
        // which is borrowed for 'g.
        unsafe { v.deref() }
    }
}

impl<V: ?Sized + Pointable, M> Drop for Node<V, M> {
    fn drop(&mut self) {
        // SAFETY: `&mut self` means nobody else can reach this node any more (it is
        // dropped only after its grace period, or by the table's owner).
        let g = unsafe { epoch::unprotected() };
        let v = self.value.load(Ordering::Relaxed, g);
        if !v.is_null() {
            // SAFETY: the node owns its current value (replaced ones were handed to
            // the epoch by `set_value`), so it is freed exactly once, here.
            drop(unsafe { v.into_owned() });
        }
    }
}

#[repr(C)]
struct Bucket<V: ?Sized + Pointable, M> {
    lock: RwSpin,
    status: AtomicU32,
    head: Atomic<Node<V, M>>,
}

impl<V: ?Sized + Pointable, M> Bucket<V, M> {
    /// Searches the chain; safe without the lock (nonblocking readers).
    #[inline]
    fn find<'g>(&self, hash: u64, key: &[u8], g: &'g Guard) -> Option<&'g Node<V, M>> {
        let mut cur = self.head.load(Ordering::Acquire, g);
        // SAFETY: the caller reached this bucket under `g`; every node reachable
        // from it is either linked or was unlinked after `g` was pinned (unlinked
        // nodes keep their `next`), so it is retired no earlier than `g` unpins.
        while let Some(n) = unsafe { cur.as_ref() } {
            if n.matches(hash, key) {
                return Some(n);
            }
            cur = n.next.load(Ordering::Acquire, g);
        }
        None
    }
}

struct Array<V: ?Sized + Pointable, M> {
    mask: usize,
    buckets: Box<[Bucket<V, M>]>,
    /// The array this one is migrating into (null when none).
    next: Atomic<Array<V, M>>,
    /// While this array has pending buckets: the array it is being filled from.
    prev: Atomic<Array<V, M>>,
}

impl<V: ?Sized + Pointable, M> Array<V, M> {
    fn new(n: usize, status: u32) -> Self {
        debug_assert!(n.is_power_of_two());
        let buckets = (0..n)
            .map(|_| Bucket {
                lock: RwSpin::new(),
                status: AtomicU32::new(status),
                head: Atomic::null(),
            })
            .collect();
        Array {
            mask: n - 1,
            buckets,
            next: Atomic::null(),
            prev: Atomic::null(),
        }
    }

    #[inline]
    fn len(&self) -> usize {
        self.buckets.len()
    }

    #[inline]
    fn index(&self, hash: u64) -> usize {
        hash as usize & self.mask
    }

    /// The next array, for a caller that saw a migrated bucket of this one.
    fn next_array<'g>(&self, g: &'g Guard) -> &'g Array<V, M> {
        let next = self.next.load(Ordering::Acquire, g);
        // SAFETY: a bucket is marked migrated only after `next` was installed, and
        // `next` never changes afterwards. The next array is retired only after it
        // has stopped being the base, i.e. after this array (which links to it)
        // was retired, so it outlives every guard that could reach this array.
        unsafe { next.as_ref() }.expect("migrated bucket without a next array")
    }
}

impl<V: ?Sized + Pointable, M> Drop for Array<V, M> {
    /// Frees the chains (not `next`/`prev`: the owner of the array list does).
    fn drop(&mut self) {
        // SAFETY: `&mut self`: the array is unreachable (retired past its grace
        // period, or the table is being dropped), so no one else reads the chains.
        let g = unsafe { epoch::unprotected() };
        for b in self.buckets.iter() {
            let mut cur = b.head.load(Ordering::Relaxed, g);
            while !cur.is_null() {
                // SAFETY: each linked node belongs to exactly one chain of one
                // array (migration copies nodes) and unlinked ones are no longer
                // in the chain, so this frees each node once.
                let node = unsafe { cur.into_owned() };
                cur = node.next.load(Ordering::Relaxed, g);
                drop(node);
            }
        }
    }
}

/// Calls `f` for every node of bucket `i` of `a` (under its shared lock), or, when
/// it is migrated, of its two target buckets (the source's lock held, so that no
/// node is seen twice; lock order is older before newer).
fn visit<V: ?Sized + Pointable, M, F: FnMut(&Node<V, M>, &Guard)>(
    a: &Array<V, M>,
    i: usize,
    f: &mut F,
    g: &Guard,
) {
    let b = &a.buckets[i];
    let _read = b.lock.read();
    if b.status.load(Ordering::Acquire) == MIGRATED {
        let next = a.next_array(g);
        visit(next, i, f, g);
        visit(next, i + a.len(), f, g);
        return;
    }
    debug_assert_ne!(b.status.load(Ordering::Relaxed), PENDING);
    let mut cur = b.head.load(Ordering::Acquire, g);
    // SAFETY: the shared lock keeps the chain stable and its nodes alive; `g` is
    // pinned.
    while let Some(n) = unsafe { cur.as_ref() } {
        f(n, g);
        cur = n.next.load(Ordering::Acquire, g);
    }
}

// ---------------------------------------------------------------------------
// Shared state
// ---------------------------------------------------------------------------

/// What the table and its migration thread share.
struct Inner<V: ?Sized + Pointable, M> {
    /// The base (oldest live) array; its `next` chain leads to the newest.
    array: Atomic<Array<V, M>>,
    len: AtomicUsize,
    resizing: AtomicBool,
    /// Set when the table is dropped: the migration thread stops early.
    stop: AtomicBool,
}

impl<V: ?Sized + Pointable, M> Inner<V, M> {
    fn base<'g>(&self, g: &'g Guard) -> &'g Array<V, M> {
        let a = self.array.load(Ordering::Acquire, g);
        // SAFETY: the base is never null, and it is retired only after being
        // replaced, so one loaded under `g` lives until `g` unpins.
        unsafe { a.deref() }
    }

    fn newest<'g>(&self, g: &'g Guard) -> &'g Array<V, M> {
        let mut a = self.base(g);
        loop {
            let next = a.next.load(Ordering::Acquire, g);
            // SAFETY: arrays reachable from the base under `g` are alive while it
            // is pinned (an array is retired only once unreachable from the base).
            match unsafe { next.as_ref() } {
                Some(n) => a = n,
                None => return a,
            }
        }
    }
}

impl<V: ?Sized + Pointable, M> Drop for Inner<V, M> {
    fn drop(&mut self) {
        // SAFETY: `&mut self`: the last handle is gone (the migration thread, which
        // held one, has exited), so nobody else can reach the arrays.
        let g = unsafe { epoch::unprotected() };
        let mut cur = self.array.load(Ordering::Relaxed, g);
        while !cur.is_null() {
            // SAFETY: arrays from the base along `next` are owned by the table
            // (retired arrays were unlinked from the base first), each once.
            let array = unsafe { cur.into_owned() };
            cur = array.next.load(Ordering::Relaxed, g);
            drop(array);
        }
    }
}

// ---------------------------------------------------------------------------
// Table
// ---------------------------------------------------------------------------

/// The frontend table. `V`: the value (cloned only during migration). `M`:
/// per-entry metadata the caller keeps in atomics (e.g. a log pointer); cloned
/// during migration.
pub struct Table<V: TableValue + ?Sized, M: Clone + Send + Sync + 'static> {
    inner: Arc<Inner<V, M>>,
    worker: Mutex<Option<JoinHandle<()>>>,
}

impl<V: TableValue + ?Sized, M: Clone + Send + Sync + 'static> Table<V, M> {
    /// `initial_buckets` rounded up to a power of two (at least 16).
    pub fn new(initial_buckets: usize) -> Self {
        let n = initial_buckets.max(MIN_BUCKETS).next_power_of_two();
        Table {
            inner: Arc::new(Inner {
                array: Atomic::new(Array::new(n, LIVE)),
                len: AtomicUsize::new(0),
                resizing: AtomicBool::new(false),
                stop: AtomicBool::new(false),
            }),
            worker: Mutex::new(None),
        }
    }

    /// Nonblocking lookup by precomputed hash (the table uses its low bits for the
    /// bucket index) and key bytes.
    #[inline]
    pub fn get<'g>(&'g self, hash: u64, key: &[u8], g: &'g Guard) -> Option<&'g Node<V, M>> {
        let mut a = self.inner.base(g);
        loop {
            let b = &a.buckets[a.index(hash)];
            if b.status.load(Ordering::Acquire) == MIGRATED {
                a = a.next_array(g);
                continue;
            }
            debug_assert_ne!(b.status.load(Ordering::Relaxed), PENDING);
            return b.find(hash, key, g);
        }
    }

    /// Starts fetching from memory what lookups of these hashes will read: the
    /// buckets, then the chains' nodes (two lines each) one link per round,
    /// then the value of the node whose hash matches (its first 128 bytes).
    /// Each round issues all its prefetches before the next reads what it
    /// fetched, so the cache misses of a batch of lookups overlap instead of
    /// following each other (a server does this for a pipeline before executing
    /// it); a round costs one memory latency, not one per key. Chains are
    /// followed for `MAX_HOPS` links. Only a hint: it changes nothing, and a
    /// bucket in migration is left alone. At most 32 hashes are looked at.
    pub fn prefetch(&self, hashes: &[u64], g: &Guard) {
        const MAX_HOPS: usize = 3;
        let hashes = &hashes[..hashes.len().min(32)];
        let a = self.inner.base(g);
        for &h in hashes {
            prefetch_line(&a.buckets[a.index(h)] as *const Bucket<V, M> as *const u8);
        }
        // The keys still walking their chain: the hash and the node to look at
        // next (already being fetched).
        let mut walk = [(0u64, Shared::<Node<V, M>>::null()); 32];
        let mut n = 0;
        for &h in hashes {
            let b = &a.buckets[a.index(h)];
            if b.status.load(Ordering::Relaxed) == MIGRATED {
                continue;
            }
            let head = b.head.load(Ordering::Acquire, g);
            if !head.is_null() {
                prefetch_node(head.as_raw());
                walk[n] = (h, head);
                n += 1;
            }
        }
        for _ in 0..MAX_HOPS {
            let mut left = 0;
            for i in 0..n {
                let (h, cur) = walk[i];
                // SAFETY: as in `Bucket::find`: reached under `g`, a node is
                // linked or was unlinked after `g` was pinned, so it is alive.
                let Some(node) = (unsafe { cur.as_ref() }) else {
                    continue;
                };
                if node.hash == h {
                    let v = (node.value.load(Ordering::Acquire, g).into_usize() & !7) as *const u8;
                    prefetch_line(v);
                    prefetch_line(v.wrapping_add(64));
                    if !(v as usize).is_multiple_of(64) {
                        // The first 128 bytes reach a third line unless the
                        // blob starts a line (a 100-byte value's 109-byte blob
                        // does from 20 bytes into one).
                        prefetch_line(v.wrapping_add(127));
                    }
                    continue;
                }
                let next = node.next.load(Ordering::Acquire, g);
                if !next.is_null() {
                    prefetch_node(next.as_raw());
                    walk[left] = (h, next);
                    left += 1;
                }
            }
            n = left;
            if n == 0 {
                break;
            }
        }
    }

    /// Lookup that holds the bucket's lock in shared (reader) mode while `f` runs:
    /// the paper's lock-based gets (variant bullet-st).
    pub fn get_shared<R>(
        &self,
        hash: u64,
        key: &[u8],
        f: impl FnOnce(Option<&Node<V, M>>) -> R,
    ) -> R {
        let g = epoch::pin();
        let mut a = self.inner.base(&g);
        loop {
            let b = &a.buckets[a.index(hash)];
            let read = b.lock.read();
            if b.status.load(Ordering::Acquire) == MIGRATED {
                drop(read);
                a = a.next_array(&g);
                continue;
            }
            debug_assert_ne!(b.status.load(Ordering::Relaxed), PENDING);
            let r = f(b.find(hash, key, &g));
            drop(read);
            return r;
        }
    }

    /// Locks the bucket of `hash` exclusively (resolving any migration in progress).
    pub fn lock(&self, hash: u64) -> Locked<'_, V, M> {
        let guard = epoch::pin();
        let (array, index) = self.lock_bucket(&guard, |a| a.index(hash));
        Locked {
            table: self,
            array,
            index,
            hash: Some(hash),
            want_resize: false,
            guard,
        }
    }

    /// Locks bucket `i` of the current array (eviction sampling); None when
    /// `i >= buckets()`.
    pub fn lock_index(&self, i: usize) -> Option<Locked<'_, V, M>> {
        let guard = epoch::pin();
        if i >= self.inner.newest(&guard).len() {
            return None;
        }
        // Arrays only grow, so `i` stays in range of every newer array.
        let (array, index) = self.lock_bucket(&guard, |_| i);
        Some(Locked {
            table: self,
            array,
            index,
            hash: None,
            want_resize: false,
            guard,
        })
    }

    /// Locks a live bucket of the newest array (index chosen by `pick`), helping
    /// the migration of its source if needed. Returns the array and index; the
    /// array stays valid while `g` is pinned.
    fn lock_bucket(
        &self,
        g: &Guard,
        pick: impl Fn(&Array<V, M>) -> usize,
    ) -> (*const Array<V, M>, usize) {
        let mut a = self.inner.newest(g);
        loop {
            let i = pick(a);
            let b = &a.buckets[i];
            b.lock.lock();
            match b.status.load(Ordering::Acquire) {
                LIVE => return (a as *const Array<V, M>, i),
                MIGRATED => {
                    b.lock.unlock();
                    a = a.next_array(g);
                }
                _ => {
                    // Pending: migrate the source bucket ourselves (unlocked first:
                    // locks go older array before newer).
                    b.lock.unlock();
                    let prev = a.prev.load(Ordering::Acquire, g);
                    // SAFETY: we saw this bucket pending while pinned, so the
                    // migration filling `a` had not finished then; the source array
                    // is retired only after it finishes, hence after `g` was pinned.
                    // Null means the migration finished meanwhile: just retry.
                    if let Some(old) = unsafe { prev.as_ref() } {
                        migrate_bucket(old, i & old.mask, a, g);
                    }
                }
            }
        }
    }

    /// Buckets of the current (newest) array.
    pub fn buckets(&self) -> usize {
        let g = epoch::pin();
        self.inner.newest(&g).len()
    }

    /// Number of entries (exact when no operation is running).
    pub fn len(&self) -> usize {
        self.inner.len.load(Ordering::Relaxed)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Visits every node (for recovery checks and tests); not linearizable with
    /// concurrent writers; each node exactly once if no writer runs (a background
    /// migration may run: buckets are visited under their shared locks).
    pub fn for_each(&self, mut f: impl FnMut(&Node<V, M>)) {
        let g = epoch::pin();
        let base = self.inner.base(&g);
        for i in 0..base.len() {
            visit(base, i, &mut |n, _| f(n), &g);
        }
    }

    /// One step of a cursor scan in split order (Redis's `SCAN`; the cursor is an
    /// [`index::scan_pos`] position of the node's hash, as at every level): calls
    /// `f` for every node whose position is at least `cursor`, bucket by bucket in
    /// position order, each bucket under its shared lock (do not call into the
    /// table from `f`), and returns the next cursor (every position below it is
    /// covered; 0: the scan is complete).
    ///
    /// Bucket `i` of an array of `2^k` holds the positions `[bucket_pos(i),
    /// bucket_end_pos(i, k))` and a doubling splits that range into buckets `i`
    /// and `i + 2^k` of the new array, so a position range means the same buckets
    /// whatever the size: each bucket is visited from the base array, following
    /// migrated buckets to their targets as [`Table::for_each`] does, and the
    /// array is looked up again for every bucket (the table may double between
    /// them). The step stops after a bucket once `f` has seen `count` nodes or
    /// `10 × count` buckets were visited. A node present for a whole scan is
    /// visited at least once; a node may be visited twice (a doubling's copy is a
    /// new node, but positions never move, so only the steps' ranges matter).
    pub fn scan(&self, cursor: u64, count: usize, mut f: impl FnMut(&Node<V, M>, &Guard)) -> u64 {
        let count = count.max(1);
        let budget = count.saturating_mul(10);
        let (mut from, mut seen, mut visited) = (cursor, 0usize, 0usize);
        loop {
            let g = epoch::pin();
            let base = self.inner.base(&g);
            let k = base.len().trailing_zeros();
            let i = index::pos_bucket(from, k) as usize;
            let lo = from;
            visit(
                base,
                i,
                &mut |n, g| {
                    if index::scan_pos(n.hash) >= lo {
                        seen += 1;
                        f(n, g);
                    }
                },
                &g,
            );
            drop(g);
            visited += 1;
            let end = index::bucket_end_pos(i as u64, k);
            if end == 0 {
                return 0;
            }
            if seen >= count || visited >= budget {
                return end;
            }
            from = end;
        }
    }
}

impl<V: TableValue + ?Sized, M: Clone + Send + Sync + 'static> Drop for Table<V, M> {
    fn drop(&mut self) {
        self.inner.stop.store(true, Ordering::Release);
        let worker = self
            .worker
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(h) = worker {
            let _ = h.join();
        }
        // `inner` (now the last Arc) frees every array, node and value.
    }
}

// ---------------------------------------------------------------------------
// Locked bucket
// ---------------------------------------------------------------------------

/// An exclusively locked bucket. Holds an epoch guard internally so node
/// references it hands out stay valid for its lifetime. Unlocks on drop.
pub struct Locked<'t, V: TableValue + ?Sized, M: Clone + Send + Sync + 'static> {
    table: &'t Table<V, M>,
    /// Valid while `guard` is pinned (and the bucket, locked, is not migrated).
    array: *const Array<V, M>,
    index: usize,
    /// The hash the bucket was locked for: compared before key bytes in `find`.
    hash: Option<u64>,
    want_resize: bool,
    guard: Guard,
}

impl<'t, V: TableValue + ?Sized, M: Clone + Send + Sync + 'static> Locked<'t, V, M> {
    fn array(&self) -> &Array<V, M> {
        // SAFETY: the array was reachable when loaded under `self.guard`, which is
        // pinned for our whole life, and it cannot be retired before our (live,
        // locked) bucket is migrated, which needs the lock we hold.
        unsafe { &*self.array }
    }

    fn bucket(&self) -> &Bucket<V, M> {
        &self.array().buckets[self.index]
    }

    /// Finds the node of `key` (compared with the locked hash first when the
    /// bucket was locked by hash).
    pub fn find(&self, key: &[u8]) -> Option<&Node<V, M>> {
        let g = &self.guard;
        let mut cur = self.bucket().head.load(Ordering::Acquire, g);
        // SAFETY: we hold the bucket lock (the chain is stable, nodes are alive)
        // and `g` is pinned for our lifetime.
        while let Some(n) = unsafe { cur.as_ref() } {
            if self.hash.is_none_or(|h| h == n.hash) && *n.key == *key {
                return Some(n);
            }
            cur = n.next.load(Ordering::Acquire, g);
        }
        None
    }

    fn holds(&self, node: &Node<V, M>) -> bool {
        let g = &self.guard;
        let mut cur = self.bucket().head.load(Ordering::Acquire, g);
        // SAFETY: as in `find`.
        while let Some(n) = unsafe { cur.as_ref() } {
            if std::ptr::eq(n, node) {
                return true;
            }
            cur = n.next.load(Ordering::Acquire, g);
        }
        false
    }

    /// Inserts a new node (the caller found the key absent under this lock);
    /// returns it. Counts toward len() and may trigger a background doubling
    /// (started when the lock is released).
    ///
    /// Panics if `hash` does not belong to this bucket.
    pub fn insert(
        &mut self,
        hash: u64,
        key: &[u8],
        value: impl Into<Owned<V>>,
        meta: M,
    ) -> &Node<V, M> {
        let array = self.array();
        assert_eq!(
            array.index(hash),
            self.index,
            "hash does not belong to the locked bucket"
        );
        debug_assert!(
            self.bucket().find(hash, key, &self.guard).is_none(),
            "key already present"
        );
        let n = self.table.inner.len.fetch_add(1, Ordering::SeqCst) + 1;
        if n > LOAD_FACTOR * array.len() {
            self.want_resize = true;
        }
        let g = &self.guard;
        let b = self.bucket();
        let node = Owned::new(Node::new(hash, KeyBuf::new(key), value.into(), meta));
        node.next
            .store(b.head.load(Ordering::Relaxed, g), Ordering::Relaxed);
        let node = node.into_shared(g);
        b.head.store(node, Ordering::Release);
        // SAFETY: just linked under our lock; it can be unlinked (and retired) only
        // under this lock, i.e. not while the returned borrow of `self` lives.
        unsafe { node.deref() }
    }

    /// Replaces the value of `node` (a node of this bucket); the old value is
    /// dropped after the epoch grace period.
    pub fn set_value(&self, node: &Node<V, M>, value: impl Into<Owned<V>>) {
        debug_assert!(self.holds(node), "node is not in the locked bucket");
        let old = node.value.swap(value.into(), Ordering::AcqRel, &self.guard);
        // SAFETY: the swap made the old value unreachable (exactly once, being
        // atomic); readers that loaded it are pinned, and the epoch frees it only
        // after they unpin. It is never null.
        unsafe { self.guard.defer_destroy(old) };
    }

    /// Unlinks the node with `key`; true when it was there. Reclaimed after grace.
    pub fn remove(&mut self, key: &[u8]) -> bool {
        let hash = self.hash;
        self.unlink(|n| hash.is_none_or(|h| h == n.hash) && *n.key == *key, true) == 1
    }

    /// Unlinks every node for which `keep` returns false (eviction); returns how
    /// many.
    pub fn retain(&mut self, mut keep: impl FnMut(&Node<V, M>) -> bool) -> usize {
        self.unlink(|n| !keep(n), false)
    }

    /// Unlinks the nodes `doomed` selects (stopping after the first when `once`).
    fn unlink(&mut self, mut doomed: impl FnMut(&Node<V, M>) -> bool, once: bool) -> usize {
        let g = &self.guard;
        let b = self.bucket();
        let mut pred = &b.head;
        let mut cur = pred.load(Ordering::Acquire, g);
        let mut removed = 0;
        // SAFETY: we hold the bucket lock (the chain is stable, nodes are alive)
        // and `g` is pinned.
        while let Some(n) = unsafe { cur.as_ref() } {
            let next = n.next.load(Ordering::Acquire, g);
            if doomed(n) {
                // Swing the predecessor past `n`; `n` keeps its own `next` so a
                // reader standing on it still reaches the rest of the chain.
                pred.store(next, Ordering::Release);
                // SAFETY: `n` is now unreachable for readers pinned from now on;
                // those pinned earlier are covered by the grace period. Unlinked
                // once, under the lock.
                unsafe { g.defer_destroy(cur) };
                removed += 1;
                if once {
                    break;
                }
            } else {
                pred = &n.next;
            }
            cur = next;
        }
        if removed > 0 {
            self.table.inner.len.fetch_sub(removed, Ordering::Relaxed);
        }
        removed
    }

    /// The epoch guard this lock holds.
    pub fn guard(&self) -> &Guard {
        &self.guard
    }
}

impl<V: TableValue + ?Sized, M: Clone + Send + Sync + 'static> Drop for Locked<'_, V, M> {
    fn drop(&mut self) {
        self.bucket().lock.unlock();
        if mem::take(&mut self.want_resize) {
            self.table.maybe_resize();
        }
    }
}

/// A node's two lines (the fields a lookup reads, then the value pointer).
#[inline]
fn prefetch_node<T>(p: *const T) {
    let p = p as *const u8;
    prefetch_line(p);
    prefetch_line(p.wrapping_add(64));
}

/// `Session::prefetch` of the stores whose entries live in a `Table`: at most 32
/// keys at a time, hashed on the stack.
pub fn prefetch_keys<V: TableValue + ?Sized, M: Clone + Send + Sync + 'static>(
    t: &Table<V, M>,
    hasher: &crate::KeyHasher,
    keys: &[&[u8]],
) {
    let g = epoch::pin();
    for chunk in keys.chunks(32) {
        let mut hashes = [0u64; 32];
        for (h, k) in hashes.iter_mut().zip(chunk) {
            *h = hasher.hash(k);
        }
        t.prefetch(&hashes[..chunk.len()], &g);
    }
}
