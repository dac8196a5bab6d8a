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

use std::hint;
use std::mem;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::{self, JoinHandle};

use crossbeam_epoch::{self as epoch, Atomic, Guard, Owned, Pointable, Pointer, Shared};
use pmem::prefetch_line;

const MIN_BUCKETS: usize = 16;
/// The table doubles when entries exceed `LOAD_FACTOR * buckets`.
const LOAD_FACTOR: usize = 1;
/// Old buckets the migration thread moves per epoch pin.
const MIGRATE_BATCH: usize = 64;
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
// Spinlock
// ---------------------------------------------------------------------------

struct Backoff(u32);

impl Backoff {
    fn new() -> Self {
        Backoff(0)
    }

    fn snooze(&mut self) {
        if self.0 < SPIN_LIMIT {
            self.0 += 1;
            hint::spin_loop();
        } else {
            thread::yield_now();
        }
    }
}

const WRITER: u32 = 1 << 31;
/// Set by a waiting writer: new readers hold back so writers are not starved.
const WRITER_WAITING: u32 = 1 << 30;
const READERS: u32 = WRITER_WAITING - 1;

/// A reader-writer spinlock in one word: a writer bit, a writer-waiting bit and a
/// reader count.
struct RwSpin(AtomicU32);

impl RwSpin {
    fn new() -> Self {
        RwSpin(AtomicU32::new(0))
    }

    fn lock(&self) {
        let mut backoff = Backoff::new();
        loop {
            let s = self.0.load(Ordering::Relaxed);
            if s & (WRITER | READERS) == 0 {
                // Taking the lock also clears WRITER_WAITING: any other waiting
                // writer sets it again on its next round.
                if self
                    .0
                    .compare_exchange_weak(s, WRITER, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
                {
                    return;
                }
            } else if s & WRITER_WAITING == 0 {
                self.0.fetch_or(WRITER_WAITING, Ordering::Relaxed);
            }
            backoff.snooze();
        }
    }

    fn unlock(&self) {
        self.0.fetch_and(!WRITER, Ordering::Release);
    }

    fn lock_shared(&self) {
        let mut backoff = Backoff::new();
        loop {
            let s = self.0.load(Ordering::Relaxed);
            if s & (WRITER | WRITER_WAITING) == 0
                && self
                    .0
                    .compare_exchange_weak(s, s + 1, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
            {
                return;
            }
            backoff.snooze();
        }
    }

    fn unlock_shared(&self) {
        self.0.fetch_sub(1, Ordering::Release);
    }

    fn write(&self) -> WriteGuard<'_> {
        self.lock();
        WriteGuard(self)
    }

    fn read(&self) -> ReadGuard<'_> {
        self.lock_shared();
        ReadGuard(self)
    }
}

struct WriteGuard<'a>(&'a RwSpin);

impl Drop for WriteGuard<'_> {
    fn drop(&mut self) {
        self.0.unlock();
    }
}

struct ReadGuard<'a>(&'a RwSpin);

impl Drop for ReadGuard<'_> {
    fn drop(&mut self) {
        self.0.unlock_shared();
    }
}

// ---------------------------------------------------------------------------
// Keys and values
// ---------------------------------------------------------------------------

/// Longest key kept inside its node (longer ones get an allocation of their
/// own): a lookup then reads the hash, the chain link and the key from one
/// place instead of following a pointer to the key.
const INLINE_KEY: usize = 30;

/// A node's key: inline up to [`INLINE_KEY`] bytes, else boxed.
#[derive(Clone)]
enum KeyBuf {
    Inline { len: u8, bytes: [u8; INLINE_KEY] },
    Boxed(Box<[u8]>),
}

impl KeyBuf {
    fn new(key: &[u8]) -> KeyBuf {
        if key.len() <= INLINE_KEY {
            let mut bytes = [0u8; INLINE_KEY];
            bytes[..key.len()].copy_from_slice(key);
            KeyBuf::Inline {
                len: key.len() as u8,
                bytes,
            }
        } else {
            KeyBuf::Boxed(key.into())
        }
    }
}

impl std::ops::Deref for KeyBuf {
    type Target = [u8];
    #[inline]
    fn deref(&self) -> &[u8] {
        match self {
            KeyBuf::Inline { len, bytes } => &bytes[..*len as usize],
            KeyBuf::Boxed(b) => b,
        }
    }
}

/// What a table can hold as a value: anything epoch-managed that can be
/// copied into a new allocation when its node migrates to a doubled array.
/// Every `Clone` type qualifies; [`Blob`] is the byte-string value the stores
/// use.
pub trait TableValue: Pointable + Send + Sync + 'static {
    fn clone_owned(&self) -> Owned<Self>;
}

impl<T: Clone + Send + Sync + 'static> TableValue for T {
    fn clone_owned(&self) -> Owned<T> {
        Owned::new(self.clone())
    }
}

/// A byte-string value or a tombstone, in one allocation (its length, then a
/// tag byte, then the bytes): a reader goes from the node to the bytes through
/// one pointer, where a `Box<[u8]>` behind the node's atomic pointer would
/// take two.
#[repr(transparent)]
pub struct Blob([u8]);

const BLOB_VALUE: u8 = 1;
const BLOB_TOMB: u8 = 0;
/// The pointer tag of a tombstone blob (see `Blob::tomb` and `Node::tagged`).
pub const TOMB_TAG: usize = 1;
/// The length word before the tag and bytes.
const BLOB_HDR: usize = mem::size_of::<usize>();

impl Blob {
    /// A value.
    pub fn new(bytes: &[u8]) -> Owned<Blob> {
        Owned::init(BlobInit {
            tag: BLOB_VALUE,
            bytes,
        })
    }

    /// A tombstone (a removed key whose removal is not yet in the backend).
    pub fn tomb() -> Owned<Blob> {
        // Tagged too, so that a writer learns whether a key is live from the
        // pointer alone (`Node::tagged`), without reading the value's line.
        Owned::<Blob>::init(BlobInit {
            tag: BLOB_TOMB,
            bytes: &[],
        })
        .with_tag(TOMB_TAG)
    }

    /// `Some` of the bytes, or `None` for a tombstone.
    pub fn new_opt(v: Option<&[u8]>) -> Owned<Blob> {
        match v {
            Some(b) => Blob::new(b),
            None => Blob::tomb(),
        }
    }

    /// The bytes, or `None` for a tombstone.
    #[inline]
    pub fn get(&self) -> Option<&[u8]> {
        match self.0.split_first() {
            Some((&BLOB_VALUE, rest)) => Some(rest),
            _ => None,
        }
    }

    fn layout(len: usize) -> std::alloc::Layout {
        std::alloc::Layout::from_size_align(BLOB_HDR + len, mem::align_of::<usize>())
            .expect("blob layout")
    }
}

/// What [`Blob`]'s `Pointable::init` copies: a tag and the bytes. Only
/// [`Blob::new`], [`Blob::tomb`] and `clone_owned` make one (the fields are
/// private), from a
/// borrowed slice, and hand it to `Owned::init` in the same expression, so the
/// bytes outlive the `init` that copies them. (A lifetime cannot be spelled in
/// `Pointable::Init`, hence the raw pointer, and hence no other constructor:
/// safe code elsewhere could otherwise give `init` a dangling one.)
pub struct BlobInit {
    tag: u8,
    bytes: *const [u8],
}

// The allocation is a `usize` length `n` followed by `n` bytes (the
// tag and the value); `deref` builds a slice of exactly those `n` bytes from
// the allocation's pointer, `drop` frees it with the layout it was made with.
// The `unsafe fn`s' contracts are crossbeam-epoch's (`Pointable`): `deref`,
// `deref_mut` and `drop` take a pointer `init` returned and not yet dropped,
// `deref_mut` and `drop` with no other access to it meanwhile.
impl Pointable for Blob {
    const ALIGN: usize = mem::align_of::<usize>();
    type Init = BlobInit;

    unsafe fn init(BlobInit { tag, bytes }: Self::Init) -> usize {
        // SAFETY: a `BlobInit` is made only in this module, from a slice borrowed for the whole `Owned::init` call that runs this (see
        // `BlobInit`), so `bytes` points to a live, initialised slice.
        let bytes = unsafe { &*bytes };
        let n = 1 + bytes.len();
        let layout = Blob::layout(n);
        // SAFETY: the layout has a non-zero size (the length word).
        let p = unsafe { std::alloc::alloc(layout) };
        if p.is_null() {
            std::alloc::handle_alloc_error(layout);
        }
        // SAFETY: `p` is a fresh allocation of `BLOB_HDR + n` bytes, aligned
        // for `usize`.
        unsafe {
            (p as *mut usize).write(n);
            p.add(BLOB_HDR).write(tag);
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), p.add(BLOB_HDR + 1), bytes.len());
        }
        p as usize
    }

    unsafe fn deref<'a>(ptr: usize) -> &'a Blob {
        // SAFETY: by `Pointable::deref`'s contract `ptr` came from `init` and is
        // not freed for 'a: it starts with the length word `n`, followed by `n`
        // initialised bytes, and nobody mutates them (`deref_mut` needs sole
        // access). `Blob` is `repr(transparent)` over `[u8]`, so the slice
        // pointer casts to a `Blob` pointer with the same length.
        unsafe {
            let n = *(ptr as *const usize);
            let s = std::ptr::slice_from_raw_parts((ptr as *const u8).add(BLOB_HDR), n);
            &*(s as *const Blob)
        }
    }

    unsafe fn deref_mut<'a>(ptr: usize) -> &'a mut Blob {
        // SAFETY: as in `deref`; and by the contract nobody else accesses the
        // allocation for 'a, so the `&mut` is unique.
        unsafe {
            let n = *(ptr as *const usize);
            let s = std::ptr::slice_from_raw_parts_mut((ptr as *mut u8).add(BLOB_HDR), n);
            &mut *(s as *mut Blob)
        }
    }

    unsafe fn drop(ptr: usize) {
        // SAFETY: by the contract `ptr` came from `init`, is dropped once, and
        // nobody else accesses it: its length word is readable, and the layout
        // rebuilt from it is the one `init` allocated with.
        unsafe {
            let n = *(ptr as *const usize);
            std::alloc::dealloc(ptr as *mut u8, Blob::layout(n));
        }
    }
}

impl TableValue for Blob {
    fn clone_owned(&self) -> Owned<Blob> {
        Owned::init(BlobInit {
            tag: self.0[0],
            bytes: &self.0[1..],
        })
    }
}

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

/// Copies source bucket `i` of `old` into `new` (buckets `i` and `i + old.len()`)
/// unless that is done already.
fn migrate_bucket<V: TableValue + ?Sized, M: Clone>(
    old: &Array<V, M>,
    i: usize,
    new: &Array<V, M>,
    g: &Guard,
) {
    let ob = &old.buckets[i];
    let _old_lock = ob.lock.write();
    if ob.status.load(Ordering::Acquire) == MIGRATED {
        return;
    }
    debug_assert_eq!(ob.status.load(Ordering::Relaxed), LIVE);
    let lo = &new.buckets[i];
    let hi = &new.buckets[i + old.len()];
    let lo_lock = lo.lock.write();
    let hi_lock = hi.lock.write();
    debug_assert_eq!(lo.status.load(Ordering::Relaxed), PENDING);
    debug_assert_eq!(hi.status.load(Ordering::Relaxed), PENDING);
    // Clone everything first: if a clone panics, the copies are dropped, the locks
    // released and the source is still live (nothing half-migrated remains).
    let mut copies = Vec::new();
    let mut cur = ob.head.load(Ordering::Acquire, g);
    // SAFETY: we hold the bucket's lock, so the chain is stable and its nodes are
    // alive (unlinking needs the lock); `g` is pinned.
    while let Some(n) = unsafe { cur.as_ref() } {
        copies.push(Owned::new(Node::new(
            n.hash,
            n.key.clone(),
            // The pointer's tag (a tombstone's `TOMB_TAG`) goes with the copy.
            n.value(g).clone_owned().with_tag(n.tagged(g)),
            n.meta.clone(),
        )));
        cur = n.next.load(Ordering::Acquire, g);
    }
    // Push in reverse so each target chain keeps the source's relative order.
    for copy in copies.into_iter().rev() {
        let target = if new.index(copy.hash) == i { lo } else { hi };
        copy.next
            .store(target.head.load(Ordering::Relaxed, g), Ordering::Relaxed);
        target.head.store(copy, Ordering::Release);
    }
    lo.status.store(LIVE, Ordering::Release);
    hi.status.store(LIVE, Ordering::Release);
    // Readers that see MIGRATED (Acquire) see the filled targets. It is stored
    // before the targets are unlocked: a writer that changes a target afterwards
    // must not be overtaken by a reader still reading the frozen source.
    ob.status.store(MIGRATED, Ordering::Release);
    drop(hi_lock);
    drop(lo_lock);
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

    fn needs_doubling(&self) -> bool {
        let g = epoch::pin();
        // SeqCst pairs with `insert`'s increment and `resizing`'s accesses: an
        // insert that still saw `resizing` set is seen by the worker's recheck.
        self.len.load(Ordering::SeqCst) > LOAD_FACTOR * self.newest(&g).len()
    }
}

impl<V: TableValue + ?Sized, M: Clone> Inner<V, M> {
    /// One doubling; false when stopped before the end.
    fn double(&self) -> bool {
        let n = {
            let g = epoch::pin();
            let old_ptr = self.array.load(Ordering::Acquire, &g);
            // SAFETY: the base is never null and alive while pinned.
            let old = unsafe { old_ptr.deref() };
            debug_assert!(old.next.load(Ordering::Relaxed, &g).is_null());
            let new = Array::new(old.len() * 2, PENDING);
            new.prev.store(old_ptr, Ordering::Relaxed);
            old.next.store(Owned::new(new), Ordering::Release);
            old.len()
        };
        let mut i = 0;
        while i < n {
            if self.stop.load(Ordering::Relaxed) {
                return false;
            }
            let g = epoch::pin();
            let old = self.base(&g);
            let new = old.next_array(&g);
            for j in i..(i + MIGRATE_BATCH).min(n) {
                migrate_bucket(old, j, new, &g);
            }
            i += MIGRATE_BATCH;
        }
        let g = epoch::pin();
        let old_ptr = self.array.load(Ordering::Acquire, &g);
        // SAFETY: the base is never null and alive while pinned.
        let old = unsafe { old_ptr.deref() };
        let new_ptr = old.next.load(Ordering::Acquire, &g);
        // SAFETY: installed above and retired only by this thread, later.
        unsafe { new_ptr.deref() }
            .prev
            .store(Shared::null(), Ordering::Relaxed);
        self.array.store(new_ptr, Ordering::Release);
        // SAFETY: the old array is no longer the base and every bucket of it is
        // migrated, so no writer touches it and no reader pinned from now on can
        // reach it; readers pinned earlier are covered by the grace period. Its
        // drop frees only its own (frozen) chains.
        unsafe { g.defer_destroy(old_ptr) };
        g.flush();
        true
    }

    fn resize_worker(self: Arc<Self>) {
        /// Clears `resizing` if the worker unwinds, so `wait_resize` cannot hang.
        struct OnPanic<'a>(&'a AtomicBool);
        impl Drop for OnPanic<'_> {
            fn drop(&mut self) {
                if thread::panicking() {
                    self.0.store(false, Ordering::Release);
                }
            }
        }
        let _on_panic = OnPanic(&self.resizing);
        loop {
            while !self.stop.load(Ordering::Acquire) && self.needs_doubling() {
                if !self.double() {
                    break;
                }
            }
            self.resizing.store(false, Ordering::SeqCst);
            // An insert may have crossed the threshold after our last check while
            // it still saw `resizing`: look again before leaving.
            if self.stop.load(Ordering::Acquire)
                || !self.needs_doubling()
                || self.resizing.swap(true, Ordering::SeqCst)
            {
                return;
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

    /// Whether a background doubling is running (tests).
    pub fn resizing(&self) -> bool {
        self.inner.resizing.load(Ordering::Acquire)
    }

    /// Blocks until no doubling is running (tests, benchmarks' prefill).
    pub fn wait_resize(&self) {
        let mut backoff = Backoff::new();
        while self.inner.resizing.load(Ordering::Acquire) {
            if backoff.0 < SPIN_LIMIT {
                backoff.snooze();
            } else {
                thread::sleep(std::time::Duration::from_micros(100));
            }
        }
    }

    /// Starts the migration thread if the table is over its load and none runs.
    fn maybe_resize(&self) {
        let inner = &self.inner;
        if inner.resizing.load(Ordering::SeqCst) || !inner.needs_doubling() {
            return;
        }
        let mut worker = self.worker.lock().unwrap_or_else(PoisonError::into_inner);
        if inner.resizing.swap(true, Ordering::SeqCst) {
            return;
        }
        // A previous worker has cleared `resizing` and lost the race to take it
        // again: it is exiting without taking any lock, so joining is quick.
        if let Some(h) = worker.take() {
            let _ = h.join();
        }
        let shared = Arc::clone(inner);
        match thread::Builder::new()
            .name("table-resize".into())
            .spawn(move || shared.resize_worker())
        {
            Ok(h) => *worker = Some(h),
            Err(_) => inner.resizing.store(false, Ordering::Release),
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

// ---------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use std::sync::atomic::{AtomicIsize, AtomicU64};
    use std::time::{Duration, Instant};

    /// xorshift64*: deterministic, no dependency on rand's API.
    struct Rng(u64);

    impl Rng {
        fn new(seed: u64) -> Self {
            Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
        }

        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
        }

        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
    }

    fn strong_hash(key: &[u8]) -> u64 {
        xxhash_rust::xxh3::xxh3_64(key)
    }

    /// Many full-hash collisions: exercises key comparison and long chains.
    fn weak_hash(key: &[u8]) -> u64 {
        u64::from_le_bytes(key.try_into().unwrap()) % 61
    }

    fn kb(k: u64) -> [u8; 8] {
        k.to_le_bytes()
    }

    /// Blob values (bytes and tombstones, empty and long) with inline and
    /// boxed keys, replaced and carried through several doublings, read back
    /// against a model; and a blob's copy is equal and independent.
    #[test]
    fn blob_values_and_key_sizes_through_doublings() {
        let t: Table<Blob, ()> = Table::new(16);
        let mut model: HashMap<Vec<u8>, Option<Vec<u8>>> = HashMap::new();
        let mut rng = Rng::new(11);
        for i in 0..5_000u64 {
            // Key lengths around the inline limit.
            let klen = [0, 1, INLINE_KEY - 1, INLINE_KEY, INLINE_KEY + 1, 200][(i % 6) as usize];
            let k = rng.below(1_500);
            let mut key = k.to_le_bytes().repeat(klen / 8 + 1);
            key.truncate(klen.max(8));
            key[..8].copy_from_slice(&k.to_le_bytes());
            let v: Option<Vec<u8>> = match rng.below(5) {
                0 => None,
                1 => Some(Vec::new()),
                2 => Some(vec![b'x'; 5_000]),
                _ => Some(format!("v{i}").into_bytes()),
            };
            let h = strong_hash(&key);
            let mut l = t.lock(h);
            match l.find(&key) {
                Some(n) => l.set_value(n, Blob::new_opt(v.as_deref())),
                None => {
                    l.insert(h, &key, Blob::new_opt(v.as_deref()), ());
                }
            }
            drop(l);
            model.insert(key, v);
            if i % 7 == 0 {
                // A hint in the middle of the doublings: changes nothing.
                let ks: Vec<&[u8]> = model.keys().take(40).map(|k| k.as_slice()).collect();
                prefetch_keys(&t, &crate::KeyHasher::random(), &ks);
            }
        }
        t.wait_resize();
        assert!(t.buckets() >= model.len(), "load factor at most 1");
        let g = epoch::pin();
        for (k, v) in &model {
            let n = t.get(strong_hash(k), k, &g).expect("present");
            assert_eq!(n.key(), k.as_slice());
            assert_eq!(n.value(&g).get(), v.as_deref());
            // Tombstones carry their tag through set_value and the doublings.
            assert_eq!(n.tagged(&g) == TOMB_TAG, v.is_none(), "tag of {k:?}");
            let copy = n.value(&g).clone_owned();
            assert_eq!(copy.get(), v.as_deref());
        }
        assert_eq!(t.len(), model.len());
    }

    #[test]
    fn send_sync() {
        fn check<T: Send + Sync>() {}
        check::<Table<Vec<u8>, AtomicU64Meta>>();
        check::<Node<Vec<u8>, AtomicU64Meta>>();
    }

    /// Meta as callers keep it: in an atomic, cloned on migration.
    #[derive(Debug, Default)]
    struct AtomicU64Meta(AtomicU64);

    impl Clone for AtomicU64Meta {
        fn clone(&self) -> Self {
            AtomicU64Meta(AtomicU64::new(self.0.load(Ordering::Relaxed)))
        }
    }

    fn upsert<V: TableValue, M: Clone + Send + Sync + 'static>(
        t: &Table<V, M>,
        hash: u64,
        key: &[u8],
        value: V,
        meta: M,
    ) -> bool {
        let mut l = t.lock(hash);
        if let Some(n) = l.find(key) {
            l.set_value(n, value);
            false
        } else {
            l.insert(hash, key, value, meta);
            true
        }
    }

    fn model_run(hash: fn(&[u8]) -> u64, inserts: u64, ops: usize, seed: u64) {
        let t: Table<u64, u64> = Table::new(1);
        assert_eq!(t.buckets(), 16);
        let mut model: HashMap<u64, u64> = HashMap::new();
        let mut rng = Rng::new(seed);
        let space = inserts + inserts / 5;
        let mut saw_resizing = false;
        let mut next_insert = 0;
        for step in 0..ops {
            saw_resizing |= t.resizing();
            // Phase one interleaves the insertion of keys 0..inserts.
            if next_insert < inserts && step % 2 == 0 {
                let k = next_insert;
                next_insert += 1;
                let v = rng.next();
                let created = upsert(&t, hash(&kb(k)), &kb(k), v, k * 3);
                assert_eq!(created, model.insert(k, v).is_none(), "key {k}");
                continue;
            }
            let k = rng.below(space);
            let h = hash(&kb(k));
            match rng.below(100) {
                0..=29 => {
                    let v = rng.next();
                    let created = upsert(&t, h, &kb(k), v, k * 3);
                    assert_eq!(created, model.insert(k, v).is_none(), "key {k}");
                }
                30..=44 => {
                    let mut l = t.lock(h);
                    assert_eq!(l.remove(&kb(k)), model.remove(&k).is_some(), "key {k}");
                }
                45..=47 => {
                    // The table only grows (a doubling may finish meanwhile).
                    let before = t.buckets();
                    let i = rng.below(before as u64 * 2) as usize;
                    let Some(mut l) = t.lock_index(i) else {
                        assert!(i >= before);
                        continue;
                    };
                    let mut gone = Vec::new();
                    let n = l.retain(|n| {
                        let keep = rng.below(2) == 0;
                        if !keep {
                            gone.push(u64::from_le_bytes(n.key().try_into().unwrap()));
                        }
                        keep
                    });
                    drop(l);
                    assert_eq!(n, gone.len());
                    for k in gone {
                        assert!(model.remove(&k).is_some(), "retain removed absent {k}");
                    }
                }
                48..=54 => {
                    let want = model.get(&k).copied();
                    let got = t.get_shared(h, &kb(k), |n| {
                        n.map(|n| (*n.value(&epoch::pin()), *n.meta()))
                    });
                    assert_eq!(got, want.map(|v| (v, k * 3)), "key {k}");
                }
                _ => {
                    let g = epoch::pin();
                    let got = t.get(h, &kb(k), &g).map(|n| {
                        assert_eq!(n.key(), kb(k));
                        assert_eq!(n.hash(), h);
                        assert_eq!(*n.meta(), k * 3);
                        *n.value(&g)
                    });
                    assert_eq!(got, model.get(&k).copied(), "key {k}");
                }
            }
            assert_eq!(t.len(), model.len());
        }
        assert_eq!(next_insert, inserts, "too few ops to insert every key");
        t.wait_resize();
        assert!(!t.resizing());
        assert!(saw_resizing || t.buckets() > 16);
        assert!(t.buckets() >= 256, "buckets {}", t.buckets());
        assert!(
            t.len() <= 2 * t.buckets(),
            "{} > 2 x {}",
            t.len(),
            t.buckets()
        );
        assert_eq!(t.len(), model.len());
        let mut seen = HashMap::new();
        t.for_each(|n| {
            let k = u64::from_le_bytes(n.key().try_into().unwrap());
            let g = epoch::pin();
            assert!(seen.insert(k, *n.value(&g)).is_none(), "{k} visited twice");
        });
        assert_eq!(seen.len(), t.len());
        assert_eq!(seen, model);
        let g = epoch::pin();
        for k in 0..space {
            let got = t.get(hash(&kb(k)), &kb(k), &g).map(|n| *n.value(&g));
            assert_eq!(got, model.get(&k).copied(), "key {k}");
        }
        // Locked lookups agree too (hash compared before key bytes).
        for k in 0..space {
            let l = t.lock(hash(&kb(k)));
            assert_eq!(l.find(&kb(k)).is_some(), model.contains_key(&k));
        }
    }

    #[test]
    fn model_strong_hash() {
        model_run(strong_hash, 10_000, 50_000, 1);
    }

    #[test]
    fn model_colliding_hash() {
        model_run(weak_hash, 2_500, 12_000, 2);
    }

    #[test]
    fn lock_index_bounds() {
        let t: Table<u64, ()> = Table::new(100);
        assert_eq!(t.buckets(), 128);
        assert!(t.lock_index(127).is_some());
        assert!(t.lock_index(128).is_none());
        assert!(t.is_empty());
    }

    #[test]
    fn concurrent_readers_writers_during_doubling() {
        const WRITERS: u64 = 2;
        const KEYS_PER_WRITER: u64 = 4_000;
        const OPS: usize = 60_000;
        // Stable keys are inserted first and then only updated, never removed: a
        // reader must always find them (a lost chain or a lost migration shows).
        let stable = |k: u64| k.is_multiple_of(5);
        let t: Arc<Table<u64, AtomicU64Meta>> = Arc::new(Table::new(16));
        for k in (0..WRITERS * KEYS_PER_WRITER).filter(|&k| stable(k)) {
            let meta = AtomicU64Meta(AtomicU64::new(k));
            assert!(upsert(&*t, strong_hash(&kb(k)), &kb(k), k << 32, meta));
        }
        let done = Arc::new(AtomicBool::new(false));

        let readers: Vec<_> = (0..2u64)
            .map(|r| {
                let t = Arc::clone(&t);
                let done = Arc::clone(&done);
                thread::spawn(move || {
                    let mut rng = Rng::new(100 + r);
                    // Per key, the newest version this reader saw: reads must
                    // never go back in time.
                    let mut last = vec![0u64; (WRITERS * KEYS_PER_WRITER) as usize];
                    let mut reads = 0u64;
                    let mut hits = 0u64;
                    while !done.load(Ordering::Acquire) || reads < 1000 {
                        let k = rng.below(WRITERS * KEYS_PER_WRITER);
                        let h = strong_hash(&kb(k));
                        let check = |n: &Node<u64, AtomicU64Meta>, v: u64| {
                            assert_eq!(n.key(), kb(k));
                            assert_eq!(v >> 32, k, "value of another key");
                            assert_eq!(n.meta().0.load(Ordering::Relaxed), k);
                            v & 0xFFFF_FFFF
                        };
                        let version = if rng.below(8) == 0 {
                            t.get_shared(h, &kb(k), |n| {
                                n.map(|n| check(n, *n.value(&epoch::pin())))
                            })
                        } else {
                            let g = epoch::pin();
                            if reads.is_multiple_of(4) {
                                // A pipeline's hint before the lookup: it reads
                                // chains while writers and the migration change
                                // them (and takes 32 of these 40 hashes).
                                let hs: Vec<u64> = (0..40)
                                    .map(|i| {
                                        strong_hash(&kb((k + i) % (WRITERS * KEYS_PER_WRITER)))
                                    })
                                    .collect();
                                t.prefetch(&hs, &g);
                            }
                            t.get(h, &kb(k), &g).map(|n| check(n, *n.value(&g)))
                        };
                        match version {
                            Some(v) => {
                                assert!(v >= last[k as usize], "key {k} went back in time");
                                last[k as usize] = v;
                                hits += 1;
                            }
                            None => assert!(!stable(k), "stable key {k} not found"),
                        }
                        reads += 1;
                    }
                    (reads, hits)
                })
            })
            .collect();

        let writers: Vec<_> = (0..WRITERS)
            .map(|w| {
                let t = Arc::clone(&t);
                thread::spawn(move || {
                    let mut rng = Rng::new(200 + w);
                    let mut model: HashMap<u64, u64> = (0..KEYS_PER_WRITER)
                        .map(|i| i * WRITERS + w)
                        .filter(|&k| stable(k))
                        .map(|k| (k, k << 32))
                        .collect();
                    let mut version = 0u64;
                    for i in 0..OPS {
                        // Keys of this writer: k % WRITERS == w.
                        let k = rng.below(KEYS_PER_WRITER) * WRITERS + w;
                        let h = strong_hash(&kb(k));
                        let roll = rng.below(100);
                        if i < OPS / 4 || roll < 60 || stable(k) {
                            version += 1;
                            let v = (k << 32) | version;
                            let mut l = t.lock(h);
                            let found = l.find(&kb(k)).map(|n| *n.value(l.guard()));
                            assert_eq!(found, model.get(&k).copied(), "key {k}");
                            match l.find(&kb(k)) {
                                Some(n) => l.set_value(n, v),
                                None => {
                                    l.insert(h, &kb(k), v, AtomicU64Meta(AtomicU64::new(k)));
                                }
                            }
                            model.insert(k, v);
                        } else if roll < 95 {
                            let mut l = t.lock(h);
                            assert_eq!(l.remove(&kb(k)), model.remove(&k).is_some(), "key {k}");
                        } else {
                            // Evict some of our own keys from a random bucket.
                            let i = rng.below(t.buckets() as u64) as usize;
                            if let Some(mut l) = t.lock_index(i) {
                                let mut gone = Vec::new();
                                l.retain(|n| {
                                    let k = u64::from_le_bytes(n.key().try_into().unwrap());
                                    if k % WRITERS == w && k % 3 == 0 && !stable(k) {
                                        gone.push(k);
                                        false
                                    } else {
                                        true
                                    }
                                });
                                drop(l);
                                for k in gone {
                                    assert!(model.remove(&k).is_some(), "evicted absent {k}");
                                }
                            }
                        }
                        // Read your own write, without a lock, once it is done.
                        let g = epoch::pin();
                        let got = t.get(h, &kb(k), &g).map(|n| *n.value(&g));
                        assert_eq!(got, model.get(&k).copied(), "own write of key {k}");
                    }
                    model
                })
            })
            .collect();

        let models: Vec<HashMap<u64, u64>> =
            writers.into_iter().map(|h| h.join().unwrap()).collect();
        done.store(true, Ordering::Release);
        for r in readers {
            let (reads, hits) = r.join().unwrap();
            assert!(reads >= 1000 && hits > 0, "reads {reads} hits {hits}");
        }
        t.wait_resize();
        assert!(t.buckets() >= 1024, "buckets {}", t.buckets());
        assert!(
            t.len() <= 2 * t.buckets(),
            "{} > 2 x {}",
            t.len(),
            t.buckets()
        );
        let total: usize = models.iter().map(|m| m.len()).sum();
        assert_eq!(t.len(), total);
        let mut count = 0;
        t.for_each(|_| count += 1);
        assert_eq!(count, total);
        let g = epoch::pin();
        for k in 0..WRITERS * KEYS_PER_WRITER {
            let want = models[(k % WRITERS) as usize].get(&k).copied();
            let got = t.get(strong_hash(&kb(k)), &kb(k), &g).map(|n| *n.value(&g));
            assert_eq!(got, want, "key {k}");
        }
    }

    /// Long chains under constant churn: readers standing on unlinked nodes must
    /// still reach the rest of the chain, and values replaced under them must stay
    /// readable.
    #[test]
    fn readers_survive_unlinks_and_replacements() {
        const STABLE: u64 = 64;
        const CHURN: u64 = 200;
        // Two hashes for every key: two long chains, whatever the table's size.
        let h = |k: u64| k % 2;
        let t: Arc<Table<u64, ()>> = Arc::new(Table::new(16));
        // Inserted first, so they sit behind the churning nodes (head insertion).
        for k in 0..STABLE {
            assert!(upsert(&*t, h(k), &kb(k), k << 32, ()));
        }
        let done = Arc::new(AtomicBool::new(false));
        let readers: Vec<_> = (0..2u64)
            .map(|r| {
                let t = Arc::clone(&t);
                let done = Arc::clone(&done);
                thread::spawn(move || {
                    let mut rng = Rng::new(300 + r);
                    let mut reads = 0u64;
                    while !done.load(Ordering::Acquire) || reads < 1000 {
                        let k = rng.below(STABLE);
                        let g = epoch::pin();
                        // Both chains walked by the prefetch hint, through
                        // nodes being unlinked and values being replaced.
                        t.prefetch(&[0, 1, h(k)], &g);
                        let n = t.get(h(k), &kb(k), &g);
                        let n = n.unwrap_or_else(|| panic!("stable key {k} lost"));
                        assert_eq!(*n.value(&g) >> 32, k, "value of another key");
                        reads += 1;
                    }
                })
            })
            .collect();
        let mut rng = Rng::new(400);
        let mut present = vec![false; CHURN as usize];
        for i in 0..40_000u64 {
            let c = rng.below(CHURN);
            let k = STABLE + c;
            let mut l = t.lock(h(k));
            if present[c as usize] {
                assert!(l.remove(&kb(k)));
            } else {
                l.insert(h(k), &kb(k), k << 32, ());
            }
            drop(l);
            present[c as usize] = !present[c as usize];
            let s = rng.below(STABLE);
            let l = t.lock(h(s));
            let n = l.find(&kb(s)).expect("stable key");
            l.set_value(n, (s << 32) | (i & 0xFFFF_FFFF));
        }
        done.store(true, Ordering::Release);
        for r in readers {
            r.join().unwrap();
        }
        t.wait_resize();
        let live = present.iter().filter(|&&p| p).count();
        assert_eq!(t.len(), STABLE as usize + live);
    }

    /// Full scans (every step checked against its cursor range) while another
    /// thread inserts enough to double the table several times: every key present
    /// throughout is visited, and a scan at rest visits each key exactly once.
    #[test]
    fn scan_during_doubling() {
        const STABLE: u64 = 2_000;
        const ALL: u64 = 60_000;
        let t: Arc<Table<u64, ()>> = Arc::new(Table::new(16));
        for k in 0..STABLE {
            assert!(upsert(&*t, strong_hash(&kb(k)), &kb(k), k, ()));
        }
        t.wait_resize();
        let full = |count: usize, keys: &mut Vec<u64>| {
            let mut cursor = 0u64;
            loop {
                let next = t.scan(cursor, count, |n, g| {
                    let p = index::scan_pos(n.hash());
                    assert!(p >= cursor, "{p:#x} below the cursor {cursor:#x}");
                    assert_eq!(*n.value(g), u64::from_le_bytes(n.key().try_into().unwrap()));
                    keys.push(*n.value(g));
                });
                if next == 0 {
                    return;
                }
                assert!(next > cursor);
                cursor = next;
            }
        };
        let done = Arc::new(AtomicBool::new(false));
        // Scans that overlapped a doubling. While there is none yet, the writer
        // waits inside each doubling it sees for a scan to overlap it (or for
        // the doubling to end), so the overlap does not depend on timing.
        let overlapped = Arc::new(AtomicU64::new(0));
        let writer = {
            let t = Arc::clone(&t);
            let done = Arc::clone(&done);
            let overlapped = Arc::clone(&overlapped);
            thread::spawn(move || {
                for k in STABLE..ALL {
                    upsert(&*t, strong_hash(&kb(k)), &kb(k), k, ());
                    if k % 2 == 0 && k > STABLE {
                        t.lock(strong_hash(&kb(k - 1))).remove(&kb(k - 1));
                    }
                    let waited = Instant::now();
                    while overlapped.load(Ordering::Acquire) == 0
                        && t.resizing()
                        && waited.elapsed() < Duration::from_secs(2)
                    {
                        thread::yield_now();
                    }
                }
                done.store(true, Ordering::Release);
            })
        };
        let (mut scans, mut during) = (0, 0);
        while !done.load(Ordering::Acquire) || scans < 3 {
            let resizing = t.resizing();
            let buckets = t.buckets();
            let mut keys = Vec::new();
            full([1, 8, 64][scans % 3], &mut keys);
            // A doubling under way at either end, or one that began within the
            // scan (`buckets` is the newest array's; a small table's doubling
            // can begin and end within one scan).
            if resizing || t.resizing() || t.buckets() != buckets {
                during += 1;
                overlapped.fetch_add(1, Ordering::Release);
            }
            let seen: std::collections::HashSet<u64> = keys.iter().copied().collect();
            assert!(
                (0..STABLE).all(|k| seen.contains(&k)),
                "scan {scans} missed a key"
            );
            assert!(keys.iter().all(|&k| k < ALL));
            scans += 1;
        }
        writer.join().unwrap();
        t.wait_resize();
        assert!(during > 0, "no scan overlapped a doubling ({scans} scans)");
        assert!(t.buckets() >= 16_384, "buckets {}", t.buckets());
        let mut keys = Vec::new();
        full(10, &mut keys);
        assert_eq!(keys.len(), t.len(), "each key once at rest");
        let mut n = 0;
        t.for_each(|_| n += 1);
        assert_eq!(n, t.len());
    }

    static LIVE: AtomicIsize = AtomicIsize::new(0);

    /// Counts live instances; the heap box makes a double free visible to
    /// allocators and valgrind.
    struct Counted(Box<u64>);

    impl Counted {
        fn new(v: u64) -> Self {
            LIVE.fetch_add(1, Ordering::Relaxed);
            Counted(Box::new(v))
        }
    }

    impl Clone for Counted {
        fn clone(&self) -> Self {
            Counted::new(*self.0)
        }
    }

    impl Drop for Counted {
        fn drop(&mut self) {
            let before = LIVE.fetch_sub(1, Ordering::Relaxed);
            assert!(before > 0, "more drops than instances");
        }
    }

    /// Waits (pinning and flushing) until every deferred drop has run.
    fn settle() -> isize {
        let start = Instant::now();
        loop {
            for _ in 0..8 {
                epoch::pin().flush();
            }
            let live = LIVE.load(Ordering::Relaxed);
            if live == 0 || start.elapsed() > Duration::from_secs(3) {
                return live;
            }
            thread::sleep(Duration::from_millis(1));
        }
    }

    #[test]
    fn drops_every_value_once() {
        // 1: a full life: doublings, replacements, removals, evictions.
        {
            let t: Table<Counted, Counted> = Table::new(16);
            let mut rng = Rng::new(7);
            for k in 0..6_000u64 {
                let h = strong_hash(&kb(k));
                upsert(&t, h, &kb(k), Counted::new(k), Counted::new(k));
                if k % 3 == 0 {
                    let j = rng.below(k + 1);
                    let _ = upsert(
                        &t,
                        strong_hash(&kb(j)),
                        &kb(j),
                        Counted::new(j),
                        Counted::new(j),
                    );
                }
                if k % 5 == 0 {
                    let j = rng.below(k + 1);
                    t.lock(strong_hash(&kb(j))).remove(&kb(j));
                }
                if k % 97 == 0 {
                    if let Some(mut l) = t.lock_index(rng.below(t.buckets() as u64) as usize) {
                        l.retain(|n| *n.meta().0 % 2 == 0);
                    }
                }
            }
            t.wait_resize();
            let mut n = 0;
            t.for_each(|_| n += 1);
            assert_eq!(n, t.len());
            assert!(LIVE.load(Ordering::Relaxed) >= 2 * t.len() as isize);
        }
        assert_eq!(settle(), 0, "leaked values after a full life");

        // 2: dropped while a doubling runs (the migration thread is stopped).
        for round in 0..3u64 {
            let t: Table<Counted, Counted> = Table::new(16);
            let mut saw = false;
            for k in 0..(4_000 + round * 1_000) {
                upsert(
                    &t,
                    strong_hash(&kb(k)),
                    &kb(k),
                    Counted::new(k),
                    Counted::new(k),
                );
                saw |= t.resizing();
            }
            assert!(saw, "never saw a doubling");
            drop(t);
        }
        assert_eq!(settle(), 0, "leaked values after drop during doubling");
    }

    #[test]
    fn spinlock_excludes() {
        let lock = Arc::new(RwSpin::new());
        let counter = Arc::new(AtomicU64::new(0));
        let hs: Vec<_> = (0..4)
            .map(|i| {
                let lock = Arc::clone(&lock);
                let counter = Arc::clone(&counter);
                thread::spawn(move || {
                    for _ in 0..20_000 {
                        if i % 2 == 0 {
                            let _w = lock.write();
                            // Non-atomic read-modify-write: lost updates if two
                            // writers overlap.
                            let v = counter.load(Ordering::Relaxed);
                            hint::spin_loop();
                            counter.store(v + 1, Ordering::Relaxed);
                        } else {
                            let _r = lock.read();
                            let v = counter.load(Ordering::Relaxed);
                            hint::spin_loop();
                            assert_eq!(counter.load(Ordering::Relaxed), v, "writer inside read");
                        }
                    }
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
        assert_eq!(counter.load(Ordering::Relaxed), 40_000);
        assert_eq!(lock.0.load(Ordering::Relaxed) & (WRITER | READERS), 0);
    }
}
