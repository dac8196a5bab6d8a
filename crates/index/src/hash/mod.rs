//! The log-free durable hash table (log-free paper §3–§5), resizable.
//!
//! # Structure
//! Every bucket's chain is a Harris lock-free list, and the chains are consecutive
//! segments of **one** list sorted in *split order* (the bit-reversed hash): bucket
//! `b`'s chain starts at a *dummy* node whose split key is `reverse(b)`. Doubling
//! the table then moves no node: bucket `b + 2^k` is born by inserting its dummy
//! into bucket `b`'s chain (lazily, on first use), and the bucket array grows by
//! adding a segment. Readers are never blocked and the list is consistent at every
//! instant, so growth is crash-consistent with nothing to log: a bucket slot that
//! was not yet durable at a crash is simply initialised again and finds its dummy.
//!
//! # Layout (all little-endian, offsets in bytes)
//! - **descriptor** (464 B): `0` tag u32 "EHRT", `4` version u32 (2), `8` log2 of
//!   segment 0's buckets, `16` log2 of the buckets in use (grows; a hint whose loss
//!   only lengthens chains), `24` key count (approximate, exact after a clean
//!   close), `32` the dummy node of bucket 0 (the list head), `64` 48 segment
//!   pointers, `448` the SipHash-1-3 key (two u64, [`crate::KeyHasher`]) that
//!   every key is hashed with. Segment 0 holds buckets `[0, 2^s0)`, segment
//!   `i ≥ 1` holds `[2^(s0+i-1), 2^(s0+i))`. A version-1 descriptor (448 B, made
//!   by an earlier Ember) has no key; its table hashes with unkeyed xxh3.
//! - **segment**: `0` tag u32 "EHSG", `4` index u32, `8` bucket count u64, `16`
//!   bucket slots (u64: 0 = not initialised, else the bucket's dummy node).
//! - **node** (32 B + key, 16-B aligned): `0` tag u32 ("EHND" regular, "EHDM"
//!   dummy), `4` key length u32, `8` split key u64 (`reverse(hash | 2^63)` for a
//!   regular node: odd; `reverse(b)` for a dummy: even), `16` next link, `24` value
//!   link (a [`crate::blob`] value block whose owner is this node; 0 in a dummy),
//!   `32` key bytes. Order: (split key, key bytes).
//!
//! # Links and marks
//! See [`crate::link`]: DIRTY = not yet durable (readers help), DEL on `next` =
//! being unlinked (Harris), DEL on `value` = logically deleted (frozen).
//!
//! # Persist order
//! - **insert**: allocate node and value block (no flush: NV-epochs, their pages are
//!   in the thread's active page table); write both; flush both; **fence**; scan the
//!   link cache for the predecessor; CAS `pred.next` to the node marked DIRTY; then
//!   either hand the link to the link cache (no fence now; the bucket is flushed,
//!   one fence for up to six links, when an operation depends on one of them or the
//!   writer syncs) or flush it and **fence** (link-and-persist); clear DIRTY.
//! - **update**: new value block (owner = node), flush, **fence**; free ticket for
//!   the old block (its page durably active); CAS `node.value` old → new as a link
//!   (cache or persist); retire the old block.
//! - **remove**: tickets for node and value block; CAS `node.value` v → v|DEL as a
//!   link (cache or persist): the linearization point; mark `node.next` DEL; snip
//!   the node from its predecessor (flush, the **fence** comes before the epoch
//!   guard is released); retire both blocks: they are freed once no thread can
//!   hold a reference, after every unlink is durable. With the link cache on, the
//!   unlink waits for the handle's next sync (automatic every 64 operations): the
//!   handle's cached links are written back (one **fence**), every pending node
//!   is unlinked (flushes), one **fence**, then they are retired.
//! - **scan** (cursor, [`Ops::scan`]): the cursor is a split key
//!   ([`crate::scan_pos`] of a hash: a regular node's split key); start at the
//!   dummy of the bucket holding it, walk the list in order and collect the live
//!   regular nodes' keys (settling the links followed, scanning the link cache for
//!   each key returned, as `get` does); the next cursor is the split key of the
//!   first node left (0 at the end of the list). No node moves, so growth cannot
//!   make a scan miss a key.
//! - A dependency is settled first: an operation that relies on a link scans the
//!   link cache for the nodes involved and persists any DIRTY link it reads.
//!
//! # Recovery
//! Nothing to replay. [`Recoverable::repair`] unlinks nodes that were frozen but
//! still linked (their remover's ticket keeps them in an active page), then the
//! leak sweep asks [`Recoverable::reachable`] for every slot of every active page:
//! the slot's split key locates its chain, and the answer is whether the chain
//! holds exactly this address (log-free paper §5.5, first approach).

use crate::blob;
use crate::lcache::{Added, LinkCache};
use crate::link::{self, ptr, DEL, DIRTY};
use crate::reclaim::{Domain, Participant};
use crate::{check_kv, Error, Index, KeyHasher, Ops, Recoverable, Result, Verified};
use crossbeam_epoch::Guard;
use pmem::{FreeTicket, Heap, PPtr, Region, ThreadHeap};
use std::cmp::Ordering as Cmp;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

mod batch;

const ROOT_TAG: u32 = 0x5452_4845; // "EHRT"
const NODE_TAG: u32 = 0x444e_4845; // "EHND"
const DUMMY_TAG: u32 = 0x4d44_4845; // "EHDM"
const SEG_TAG: u32 = 0x4753_4845; // "EHSG"
/// Version 2 keeps the table's SipHash key at [`R_KEY`]; version 1 (no key,
/// unkeyed xxh3) is still read.
const VERSION: u32 = 2;
const MAX_SEGS: u64 = 48;

const R_SEG0: u64 = 8;
const R_SIZE: u64 = 16;
const R_COUNT: u64 = 24;
const R_HEAD: u64 = 32;
const R_DIR: u64 = 64;
const R_KEY: u64 = R_DIR + 8 * MAX_SEGS;
/// The descriptor of version 1 ends where version 2's key begins.
const ROOT_SIZE_V1: u64 = R_KEY;
const ROOT_SIZE: u64 = R_KEY + 16;

const N_SO: u64 = 8;
const N_NEXT: u64 = 16;
const N_VAL: u64 = 24;
const N_KEY: u64 = 32;

const S_HDR: u64 = 16;

/// Operations between automatic syncs when the link cache is on.
const SYNC_EVERY: u32 = 64;

#[derive(Clone, Debug)]
pub struct HashOptions {
    /// Buckets at creation (a power of two; segment 0's size).
    pub initial_buckets: u64,
    /// The table doubles when keys exceed `max_load` × buckets.
    pub max_load: u64,
    /// Use the link cache (log-free paper §4).
    pub link_cache: bool,
    /// Link cache buckets (cache lines; the paper uses 32).
    pub cache_buckets: usize,
    /// The key hash of a table [`LfHash::create`] makes (`None`: SipHash-1-3
    /// under a random key, the default). Tests fix it to make bucket layouts
    /// repeatable; [`KeyHasher::LEGACY_XXH3`] makes the version-1 table of an
    /// earlier Ember. `attach` ignores it: a table's hash is in its descriptor.
    pub hasher: Option<KeyHasher>,
}

impl Default for HashOptions {
    fn default() -> Self {
        HashOptions {
            initial_buckets: 1024,
            max_load: 2,
            link_cache: true,
            cache_buckets: 32,
            hasher: None,
        }
    }
}

#[inline]
fn so_regular(h: u64) -> u64 {
    (h | 1 << 63).reverse_bits()
}
#[inline]
fn so_dummy(b: u64) -> u64 {
    b.reverse_bits()
}
#[inline]
fn parent(b: u64) -> u64 {
    b & !(1u64 << (63 - b.leading_zeros()))
}

/// Writes a regular node (tag, key, split key, value link `vb`, next link `next`)
/// and flushes it; the caller fences before linking it.
fn write_node(r: &Region, node: u64, key: &[u8], so: u64, vb: u64, next: u64) {
    write_node_unflushed(r, node, key, so, vb, next);
    r.flush(node, N_KEY as usize + key.len());
}

/// [`write_node`] without the flush (the caller flushes `N_KEY + key.len()`
/// bytes at `node` before the fence that precedes the node's link).
fn write_node_unflushed(r: &Region, node: u64, key: &[u8], so: u64, vb: u64, next: u64) {
    r.write::<u32>(node, &NODE_TAG);
    r.write::<u32>(node + 4, &(key.len() as u32));
    r.write::<u64>(node + N_SO, &so);
    r.write::<u64>(node + N_VAL, &vb);
    r.write_bytes(node + N_KEY, key);
    r.write::<u64>(node + N_NEXT, &next);
}

struct Inner {
    heap: Heap,
    root: u64,
    seg0: u32,
    head: u64,
    lc: Option<LinkCache>,
    domain: Domain,
    count: AtomicI64,
    opts: HashOptions,
    hasher: KeyHasher,
}

/// The log-free hash table. Clone is cheap.
#[derive(Clone)]
pub struct LfHash {
    inner: Arc<Inner>,
}

/// Per-operation state: whether a fence is owed before unpinning, the link-cache
/// buckets holding this handle's links.
#[derive(Default)]
struct OpState {
    fence_owed: bool,
    mask: u64,
}

enum Swap {
    Done,
    Deleted,
}

impl Inner {
    #[inline]
    fn r(&self) -> &Region {
        self.heap.region()
    }

    #[inline]
    fn size_log2(&self) -> u32 {
        self.r()
            .atomic_u64(self.root + R_SIZE)
            .load(Ordering::Acquire) as u32
    }

    fn seg_of(&self, b: u64) -> (u64, u64) {
        let s0 = self.seg0;
        if b < (1 << s0) {
            (0, b)
        } else {
            let hb = 63 - b.leading_zeros();
            ((hb - s0 + 1) as u64, b - (1 << hb))
        }
    }

    fn seg_buckets(&self, i: u64) -> u64 {
        if i == 0 {
            1 << self.seg0
        } else {
            1 << (self.seg0 as u64 + i - 1)
        }
    }

    /// The slot of bucket `b`, if its segment exists.
    fn slot_addr(&self, b: u64) -> Option<u64> {
        let (i, j) = self.seg_of(b);
        if i >= MAX_SEGS {
            return None;
        }
        let s = self
            .r()
            .atomic_u64(self.root + R_DIR + 8 * i)
            .load(Ordering::Acquire);
        (s != 0).then(|| s + S_HDR + 8 * j)
    }

    fn slot(&self, b: u64) -> u64 {
        if b == 0 {
            return self.head;
        }
        self.slot_addr(b)
            .map(|a| ptr(self.r().atomic_u64(a).load(Ordering::Acquire)))
            .unwrap_or(0)
    }

    /// A hint for a batch walking to the keys of `hashes` in order, at its
    /// `i`th: starts fetching the bucket slot of the key `3 * PF_STEP` ahead,
    /// the dummy of the one `2 * PF_STEP` ahead (its slot fetched two stages
    /// ago) and the first node of the one `PF_STEP` ahead. Reads only links
    /// (plain loads: a stale one costs a useless fetch) and changes nothing.
    fn prefetch_walk(&self, hashes: &[u64], i: usize) {
        let r = self.r();
        if let Some(a) = hashes
            .get(i + 3 * PF_STEP)
            .and_then(|&h| self.slot_addr(self.bucket_of(h)))
        {
            r.prefetch(a);
        }
        if let Some(&h) = hashes.get(i + 2 * PF_STEP) {
            let d = self.slot(self.bucket_of(h));
            if d != 0 {
                r.prefetch(d);
            }
        }
        if let Some(&h) = hashes.get(i + PF_STEP) {
            let d = self.slot(self.bucket_of(h));
            if d != 0 {
                let n = ptr(link::load(r, d + N_NEXT));
                if n != 0 {
                    r.prefetch(n);
                }
            }
        }
    }

    /// The dummy of the nearest initialised bucket among `b` and its ancestors.
    fn start_ro(&self, mut b: u64) -> u64 {
        loop {
            let d = self.slot(b);
            if d != 0 {
                return d;
            }
            b = parent(b);
        }
    }

    #[inline]
    fn scan(&self, n: u64) {
        if let Some(lc) = &self.lc {
            lc.scan(self.r(), n);
        }
    }

    /// Installs `new` over `old` in the link at `addr` concerning node `n`: through
    /// the link cache when it has room, else link-and-persist.
    fn link(&self, st: &mut OpState, n: u64, addr: u64, old: u64, new: u64) -> bool {
        let r = self.r();
        if let Some(lc) = &self.lc {
            match lc.try_link(r, n, addr, old, new) {
                (Added::Linked, b) => {
                    st.mask |= 1 << b;
                    return true;
                }
                (Added::CasFailed, _) => return false,
                (Added::NoRoom, _) => {}
            }
        }
        link::cas_persist(r, addr, old, new)
    }

    #[inline]
    fn cmp_node(&self, n: u64, so: u64, key: &[u8]) -> Cmp {
        let r = self.r();
        r.emulate_read();
        let nso: u64 = r.read(n + N_SO);
        match nso.cmp(&so) {
            Cmp::Equal => {
                let klen: u32 = r.read(n + 4);
                r.cmp_bytes(n + N_KEY, klen as usize, key)
            }
            o => o,
        }
    }

    /// Harris search from the dummy `start`: the first node ≥ (so, key) and its
    /// predecessor, unlinking logically deleted nodes on the way.
    fn find(&self, st: &mut OpState, start: u64, so: u64, key: &[u8]) -> (u64, u64, bool) {
        let r = self.r();
        'retry: loop {
            let mut prev = start;
            let mut curr = ptr(link::load_settled(r, prev + N_NEXT));
            loop {
                if curr == 0 {
                    return (prev, 0, false);
                }
                let nv = link::load_settled(r, curr + N_NEXT);
                let frozen = link::load(r, curr + N_VAL) & DEL != 0;
                if nv & DEL != 0 || frozen {
                    // The removal is linearized: make it durable before helping.
                    link::load_settled(r, curr + N_VAL);
                    self.scan(curr);
                    if nv & DEL == 0 {
                        let _ = r.atomic_u64(curr + N_NEXT).compare_exchange(
                            nv,
                            nv | DEL,
                            Ordering::AcqRel,
                            Ordering::Acquire,
                        );
                        continue;
                    }
                    self.scan(prev);
                    let succ = ptr(nv);
                    if !link::cas_flush(r, prev + N_NEXT, curr, succ) {
                        continue 'retry;
                    }
                    st.fence_owed = true;
                    curr = succ;
                    continue;
                }
                match self.cmp_node(curr, so, key) {
                    Cmp::Less => {
                        prev = curr;
                        curr = ptr(nv);
                    }
                    Cmp::Equal => return (prev, curr, true),
                    Cmp::Greater => return (prev, curr, false),
                }
            }
        }
    }

    /// The segment `i`, allocated on first use.
    fn segment(&self, th: &mut ThreadHeap, i: u64) -> Result<u64> {
        let r = self.r();
        let a = r.atomic_u64(self.root + R_DIR + 8 * i);
        let s = a.load(Ordering::Acquire);
        if s != 0 {
            return Ok(s);
        }
        let n = self.seg_buckets(i);
        let p = th.alloc_zeroed(S_HDR + 8 * n)?.offset();
        r.write::<u32>(p, &SEG_TAG);
        r.write::<u32>(p + 4, &(i as u32));
        r.write::<u64>(p + 8, &n);
        r.persist(p, S_HDR as usize);
        match a.compare_exchange(0, p, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => {
                r.persist(self.root + R_DIR + 8 * i, 8);
                Ok(p)
            }
            Err(cur) => {
                th.free(PPtr::from_raw(p))?;
                Ok(cur)
            }
        }
    }

    /// The dummy of bucket `b`, inserting it (and its ancestors') on first use.
    fn bucket(&self, st: &mut OpState, th: &mut ThreadHeap, b: u64) -> Result<u64> {
        let d = self.slot(b);
        if d != 0 {
            return Ok(d);
        }
        let p = self.bucket(st, th, parent(b))?;
        let r = self.r();
        let (si, _) = self.seg_of(b);
        if si >= MAX_SEGS {
            return Ok(p);
        }
        self.segment(th, si)?;
        let so = so_dummy(b);
        let mut mine = 0u64;
        let d = loop {
            let (prev, curr, found) = self.find(st, p, so, &[]);
            if found {
                break curr;
            }
            if mine == 0 {
                mine = th.alloc(N_KEY)?.offset();
                r.write::<u32>(mine, &DUMMY_TAG);
                r.write::<u32>(mine + 4, &0);
                r.write::<u64>(mine + N_SO, &so);
                r.write::<u64>(mine + N_VAL, &0);
            }
            r.write::<u64>(mine + N_NEXT, &curr);
            r.persist(mine, N_KEY as usize);
            self.scan(prev);
            if link::cas_persist(r, prev + N_NEXT, curr, mine) {
                let m = mine;
                mine = 0;
                break m;
            }
        };
        if mine != 0 {
            th.free(PPtr::from_raw(mine))?;
        }
        // The dummy's link is durable (link-and-persist above); the slot is a hint.
        self.set_slot(b, d);
        Ok(d)
    }

    /// Initialises the buckets `need` (slots 0) with two fences in all, for a batch
    /// of writes: phase A finds each dummy's place in its parent's chain and writes
    /// and flushes the dummy (its `next` included; dummies that go between the
    /// same two nodes form one run in split order, each linked to the next);
    /// **fence**; phase B CASes each predecessor link to its dummy (a run's
    /// first) marked DIRTY and flushes it; **fence**; the
    /// marks are cleared and the slots set (flushed, not fenced: a slot is a hint,
    /// and a lost one is initialised again and finds its dummy). Uninitialised
    /// ancestors come first, a round per level; a dummy whose place changed between
    /// the phases goes through [`Self::bucket`] alone.
    fn init_buckets(&self, st: &mut OpState, th: &mut ThreadHeap, need: &[u64]) -> Result<()> {
        // The buckets and their uninitialised ancestors, by rounds: a round takes
        // those whose parent is initialised (two fences per round).
        let mut todo: std::collections::BTreeSet<u64> = std::collections::BTreeSet::new();
        for &b in need {
            let mut b = b;
            while b != 0 && self.slot(b) == 0 && todo.insert(b) {
                b = parent(b);
            }
        }
        while !todo.is_empty() {
            let round: Vec<u64> = todo
                .iter()
                .copied()
                .filter(|&b| self.slot(parent(b)) != 0)
                .collect();
            if round.is_empty() {
                // Cannot happen (the smallest bucket's parent is initialised), but a
                // loop must not spin: initialise the rest one by one.
                for b in std::mem::take(&mut todo) {
                    self.bucket(st, th, b)?;
                }
                break;
            }
            for b in &round {
                todo.remove(b);
            }
            self.init_round(st, th, &round)?;
        }
        Ok(())
    }

    /// One round of [`Self::init_buckets`]: buckets whose parents are initialised.
    fn init_round(&self, st: &mut OpState, th: &mut ThreadHeap, need: &[u64]) -> Result<()> {
        let r = self.r();
        let mut alone = Vec::new();
        // (predecessor, successor, split-order key, bucket, dummy) per new dummy.
        let mut prepared: Vec<(u64, u64, u64, u64, u64)> = Vec::new();
        let give_back = |th: &mut ThreadHeap, prepared: &mut Vec<(u64, u64, u64, u64, u64)>| {
            for (_, _, _, _, mine) in prepared.drain(..) {
                let _ = th.free(PPtr::from_raw(mine));
            }
        };
        for &b in need.iter() {
            if self.slot(b) != 0 {
                continue;
            }
            let p = self.slot(parent(b));
            let (si, _) = self.seg_of(b);
            if p == 0 || si >= MAX_SEGS {
                alone.push(b);
                continue;
            }
            let so = so_dummy(b);
            let step = (|| -> Result<()> {
                self.segment(th, si)?;
                let (prev, curr, found) = self.find(st, p, so, &[]);
                if found {
                    self.set_slot(b, curr);
                    return Ok(());
                }
                let mine = th.alloc(N_KEY)?.offset();
                r.write::<u32>(mine, &DUMMY_TAG);
                r.write::<u32>(mine + 4, &0);
                r.write::<u64>(mine + N_SO, &so);
                r.write::<u64>(mine + N_VAL, &0);
                prepared.push((prev, curr, so, b, mine));
                Ok(())
            })();
            if let Err(e) = step {
                give_back(th, &mut prepared);
                return Err(e);
            }
        }
        // Dummies that go between the same two nodes (siblings under one
        // parent, in a sparse list) are one run, in split order: each links to
        // the next, the last to the successor, and one CAS publishes the run.
        // Linked one by one, all but the first would fail their CAS and go
        // through `bucket` alone, at two fences each.
        prepared.sort_unstable_by_key(|&(prev, curr, so, _, _)| (prev, curr, so));
        let runs: Vec<std::ops::Range<usize>> = {
            let mut runs = Vec::new();
            let mut a = 0;
            for k in 1..=prepared.len() {
                if k == prepared.len()
                    || prepared[k].0 != prepared[a].0
                    || prepared[k].1 != prepared[a].1
                {
                    runs.push(a..k);
                    a = k;
                }
            }
            runs
        };
        for run in &runs {
            for k in run.clone() {
                let next = if k + 1 < run.end {
                    prepared[k + 1].4
                } else {
                    prepared[k].1
                };
                let mine = prepared[k].4;
                r.write::<u64>(mine + N_NEXT, &next);
                r.flush(mine, N_KEY as usize);
            }
        }
        if !prepared.is_empty() {
            r.fence();
        }
        let mut linked = Vec::with_capacity(runs.len());
        for run in runs {
            let (prev, curr, _, _, first) = prepared[run.start];
            self.scan(prev);
            if r.atomic_u64(prev + N_NEXT)
                .compare_exchange(curr, first | DIRTY, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                r.flush(prev + N_NEXT, 8);
                linked.push((prev + N_NEXT, first, run));
            } else {
                for k in run {
                    th.free(PPtr::from_raw(prepared[k].4))?;
                    alone.push(prepared[k].3);
                }
            }
        }
        if !linked.is_empty() {
            r.fence();
            for (a, first, run) in linked {
                let _ = r.atomic_u64(a).compare_exchange(
                    first | DIRTY,
                    first,
                    Ordering::AcqRel,
                    Ordering::Acquire,
                );
                for k in run {
                    self.set_slot(prepared[k].3, prepared[k].4);
                }
            }
        }
        for b in alone {
            self.bucket(st, th, b)?;
        }
        Ok(())
    }

    /// Records `d` as bucket `b`'s dummy if its slot is empty (flushed, a hint).
    fn set_slot(&self, b: u64, d: u64) {
        if let Some(a) = self.slot_addr(b) {
            let r = self.r();
            if r.atomic_u64(a)
                .compare_exchange(0, d, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                r.flush(a, 8);
            }
        }
    }

    fn bucket_of(&self, h: u64) -> u64 {
        h & ((1u64 << self.size_log2()) - 1)
    }

    /// A read-only walk to `key`: its node (0 when absent) and the node before
    /// it (or before where it would be).
    fn walk_ro(&self, key: &[u8], h: u64) -> (u64, u64) {
        let r = self.r();
        let so = so_regular(h);
        let mut prev = self.start_ro(self.bucket_of(h));
        let mut curr = ptr(link::load_settled(r, prev + N_NEXT));
        while curr != 0 {
            match self.cmp_node(curr, so, key) {
                Cmp::Less => {
                    prev = curr;
                    curr = ptr(link::load_settled(r, curr + N_NEXT));
                }
                Cmp::Greater => break,
                Cmp::Equal => return (prev, curr),
            }
        }
        (prev, 0)
    }

    fn get(&self, key: &[u8], out: &mut Vec<u8>) -> bool {
        let r = self.r();
        let (prev, curr) = self.walk_ro(key, self.hasher.hash(key));
        if curr == 0 {
            return false;
        }
        let v = link::load_settled(r, curr + N_VAL);
        let nv = link::load(r, curr + N_NEXT);
        self.scan(prev);
        self.scan(curr);
        if v & DEL != 0 || nv & DEL != 0 {
            return false;
        }
        blob::read_value(r, ptr(v), out);
        true
    }

    /// Where a write of `key` lands (a hint): its node, or for an absent key the
    /// node after which it would be linked. A read-only walk, as `get`.
    fn locate(&self, key: &[u8], hash: u64) -> u64 {
        match self.walk_ro(key, hash) {
            (prev, 0) => prev,
            (_, node) => node,
        }
    }

    /// One scan step (see [`Ops::scan`]): the list is in position order, so this
    /// starts at the dummy of the bucket holding `cursor` (or its nearest
    /// initialised ancestor), skips the nodes below `cursor` (part of one chain)
    /// and collects the live regular nodes' keys until it has `count` of them (or
    /// has passed `10 × count` nodes) and reaches a node of a higher position,
    /// whose position is the next cursor. Like `get`, it settles the DIRTY links
    /// it follows and scans the link cache for every key it returns, so a key is
    /// returned only once its insertion is durable. Nodes never move (growth only
    /// inserts dummies), so a concurrent doubling changes nothing here.
    fn scan_keys(&self, cursor: u64, count: usize, out: &mut Vec<Vec<u8>>) -> u64 {
        let r = self.r();
        let count = count.max(1);
        let budget = count.saturating_mul(10);
        let b = crate::pos_bucket(cursor, self.size_log2());
        let mut prev = self.start_ro(b);
        let mut curr = ptr(link::load_settled(r, prev + N_NEXT));
        let (mut got, mut seen) = (0usize, 0usize);
        // Every position below `floor` is covered; a step may end only at a
        // higher one (never inside a group of keys of one position).
        let mut floor = cursor;
        while curr != 0 {
            let so: u64 = r.read(curr + N_SO);
            if so >= cursor {
                if (got >= count || seen >= budget) && so > floor {
                    return so;
                }
                seen += 1;
            }
            let nv = link::load_settled(r, curr + N_NEXT);
            if so >= cursor && so & 1 == 1 {
                let v = link::load_settled(r, curr + N_VAL);
                if v & DEL == 0 && nv & DEL == 0 {
                    self.scan(prev);
                    self.scan(curr);
                    let klen: u32 = r.read(curr + 4);
                    let mut key = vec![0u8; klen as usize];
                    r.read_bytes(curr + N_KEY, &mut key);
                    out.push(key);
                    got += 1;
                    floor = so;
                }
            }
            prev = curr;
            curr = ptr(nv);
        }
        0
    }

    fn swap_value(
        &self,
        h: &mut HandleState,
        g: &Guard,
        n: u64,
        prev: u64,
        val: &[u8],
    ) -> Result<Swap> {
        let r = self.r();
        let nb = blob::alloc_value(&mut h.th, n, val)?.offset();
        r.fence();
        loop {
            let v = link::load_settled(r, n + N_VAL);
            if v & DEL != 0 {
                h.th.free(PPtr::from_raw(nb))?;
                return Ok(Swap::Deleted);
            }
            self.scan(prev);
            self.scan(n);
            let t = h.th.prepare_free(PPtr::from_raw(ptr(v)))?;
            if self.link(&mut h.st, n, n + N_VAL, v, nb) {
                if self.lc.is_some() {
                    // The new link may be in the link cache, not yet durable:
                    // the old block stays until the handle's sync has flushed
                    // it (retired earlier, it could be freed, even reused,
                    // while the durable value link still points at it).
                    h.replaced.push(t);
                } else {
                    h.part.retire(g, [t]);
                }
                return Ok(Swap::Done);
            }
            self.heap.cancel_ticket(t);
        }
    }

    fn upsert(
        &self,
        h: &mut HandleState,
        g: &Guard,
        key: &[u8],
        val: &[u8],
        replace: bool,
    ) -> Result<bool> {
        let r = self.r();
        let hash = self.hasher.hash(key);
        let so = so_regular(hash);
        let start = self.bucket(&mut h.st, &mut h.th, self.bucket_of(hash))?;
        let (mut node, mut vb) = (0u64, 0u64);
        let res = loop {
            let (prev, curr, found) = self.find(&mut h.st, start, so, key);
            if found {
                if !replace {
                    link::load_settled(r, curr + N_VAL);
                    self.scan(prev);
                    self.scan(curr);
                    break false;
                }
                match self.swap_value(h, g, curr, prev, val)? {
                    Swap::Done => break false,
                    Swap::Deleted => continue,
                }
            }
            if node == 0 {
                node = h.th.alloc(N_KEY + key.len() as u64)?.offset();
                vb = blob::alloc_value(&mut h.th, node, val)?.offset();
                write_node(r, node, key, so, vb, curr);
            } else {
                r.write::<u64>(node + N_NEXT, &curr);
                r.flush(node + N_NEXT, 8);
            }
            r.fence();
            self.scan(prev);
            if self.link(&mut h.st, node, prev + N_NEXT, curr, node) {
                node = 0;
                break true;
            }
        };
        if node != 0 {
            // Allocated but never linked: no durable reference, free at once.
            h.th.free(PPtr::from_raw(vb))?;
            h.th.free(PPtr::from_raw(node))?;
        }
        if res {
            h.count += 1;
        }
        Ok(res)
    }

    fn remove(&self, h: &mut HandleState, g: &Guard, key: &[u8]) -> Result<bool> {
        let r = self.r();
        let hash = self.hasher.hash(key);
        let so = so_regular(hash);
        if self.slot(self.bucket_of(hash)) == 0 && self.walk_ro(key, hash).1 == 0 {
            // Absent, and its bucket not made yet: nothing to allocate for
            // (a remove must succeed on a full heap, where making the bucket
            // could not).
            return Ok(false);
        }
        let start = self.bucket(&mut h.st, &mut h.th, self.bucket_of(hash))?;
        loop {
            let (prev, curr, found) = self.find(&mut h.st, start, so, key);
            if !found {
                return Ok(false);
            }
            let v = link::load_settled(r, curr + N_VAL);
            if v & DEL != 0 {
                continue;
            }
            self.scan(prev);
            self.scan(curr);
            let tn = h.th.prepare_free(PPtr::from_raw(curr))?;
            let tv = match h.th.prepare_free(PPtr::from_raw(ptr(v))) {
                Ok(t) => t,
                Err(e) => {
                    self.heap.cancel_ticket(tn);
                    return Err(e.into());
                }
            };
            if !self.link(&mut h.st, curr, curr + N_VAL, v, v | DEL) {
                self.heap.cancel_ticket(tn);
                self.heap.cancel_ticket(tv);
                continue;
            }
            h.count -= 1;
            if self.lc.is_some() {
                // Linearized; its freeze may sit in the link cache. The physical
                // unlink waits for the handle's next sync, which makes the freezes
                // durable with one fence, unlinks, fences once more and retires.
                h.pending.push(Pending {
                    start,
                    so,
                    key: key.to_vec(),
                    tickets: [tn, tv],
                });
                return Ok(true);
            }
            // Linearized and durable. Unlink it physically (find helps marked
            // nodes out); the fence comes before the guard is released.
            self.find(&mut h.st, start, so, key);
            h.part.retire(g, [tn, tv]);
            return Ok(true);
        }
    }

    /// Publishes a handle's count delta and grows the table when loaded.
    fn add_count(&self, d: i64) {
        if d == 0 {
            return;
        }
        let c = self.count.fetch_add(d, Ordering::AcqRel) + d;
        let r = self.r();
        r.write::<u64>(self.root + R_COUNT, &(c.max(0) as u64));
        let size = self.size_log2();
        let max = self.seg0 as u64 + MAX_SEGS - 1;
        if (size as u64) < max.min(62) && c > 0 && (c as u64) > self.opts.max_load << size {
            let a = r.atomic_u64(self.root + R_SIZE);
            if a.compare_exchange(
                size as u64,
                size as u64 + 1,
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .is_ok()
            {
                // A hint: losing it in a crash only lengthens chains.
                r.flush(self.root + R_SIZE, 8);
            }
        } else {
            r.flush(self.root + R_COUNT, 8);
        }
    }

    /// Whether `p` is linked in the list (pointer equality in its chain).
    fn linked(&self, p: u64) -> bool {
        let r = self.r();
        let so: u64 = r.read(p + N_SO);
        let b = so.reverse_bits() & ((1u64 << self.size_log2()) - 1);
        let mut curr = self.start_ro(b);
        while curr != 0 {
            if curr == p {
                return true;
            }
            let cso: u64 = r.read(curr + N_SO);
            if cso > so {
                return false;
            }
            curr = ptr(link::load(r, curr + N_NEXT));
        }
        false
    }

    /// Whether the slot at `p` parses as a node of this table (tag and bounds).
    fn node_slot(&self, p: u64) -> Option<u32> {
        let r = self.r();
        if p == 0 || !p.is_multiple_of(16) || !r.contains(p, N_KEY) {
            return None;
        }
        let tag: u32 = r.read(p);
        if tag != NODE_TAG && tag != DUMMY_TAG {
            return None;
        }
        // Bounds only (memory safety); exactness comes from the pointer-equality
        // walk, so the allocator is not consulted.
        let klen = r.read::<u32>(p + 4) as u64;
        (klen <= crate::MAX_KEY as u64 && r.contains(p, N_KEY + klen)).then_some(tag)
    }
}

impl LfHash {
    /// Creates an empty table (descriptor, segment 0, the head dummy), durable.
    /// The caller stores [`Index::root`] (e.g. as the heap root).
    pub fn create(heap: &Heap, opts: &HashOptions) -> Result<LfHash> {
        let seg0 = opts.initial_buckets.clamp(2, 1 << 30).next_power_of_two();
        let s0 = seg0.trailing_zeros();
        let mut th = heap.thread()?;
        let r = heap.region();
        let root = th.alloc_zeroed(ROOT_SIZE)?.offset();
        let head = th.alloc(N_KEY)?.offset();
        r.write::<u32>(head, &DUMMY_TAG);
        r.write::<u32>(head + 4, &0);
        r.write::<u64>(head + N_SO, &0);
        r.write::<u64>(head + N_NEXT, &0);
        r.write::<u64>(head + N_VAL, &0);
        r.flush(head, N_KEY as usize);
        let seg = th.alloc_zeroed(S_HDR + 8 * seg0)?.offset();
        r.write::<u32>(seg, &SEG_TAG);
        r.write::<u32>(seg + 4, &0);
        r.write::<u64>(seg + 8, &seg0);
        r.write::<u64>(seg + S_HDR, &head);
        r.flush(seg, (S_HDR + 8) as usize);
        r.write::<u32>(root, &ROOT_TAG);
        r.write::<u32>(root + 4, &VERSION);
        r.write::<u64>(root + R_SEG0, &(s0 as u64));
        r.write::<u64>(root + R_SIZE, &(s0 as u64));
        r.write::<u64>(root + R_COUNT, &0);
        r.write::<u64>(root + R_HEAD, &head);
        r.write::<u64>(root + R_DIR, &seg);
        // A legacy hasher writes what an earlier Ember wrote: version 1, no key
        // (compatibility tests).
        match opts.hasher.unwrap_or_else(KeyHasher::random).sip_key() {
            Some((k0, k1)) => {
                r.write::<u64>(root + R_KEY, &k0);
                r.write::<u64>(root + R_KEY + 8, &k1);
            }
            None => r.write::<u32>(root + 4, &1),
        }
        r.flush(root, ROOT_SIZE as usize);
        r.fence();
        th.end_op();
        drop(th);
        Self::attach(heap, PPtr::from_raw(root), opts)
    }

    /// Attaches to an existing table (after `Heap::open`, before or after the
    /// leak sweep). A descriptor that does not validate is an error.
    pub fn attach(heap: &Heap, root: PPtr<u8>, opts: &HashOptions) -> Result<LfHash> {
        let r = heap.region();
        let root = root.offset();
        let bad = |m: &str| Err(Error::Corrupt(format!("hash table at {root:#x}: {m}")));
        if root == 0 || !r.contains(root, ROOT_SIZE_V1) {
            return bad("descriptor outside the heap");
        }
        if r.read::<u32>(root) != ROOT_TAG {
            return bad("not a hash table descriptor");
        }
        let hasher = match r.read::<u32>(root + 4) {
            1 => KeyHasher::LEGACY_XXH3,
            VERSION if r.contains(root, ROOT_SIZE) => {
                KeyHasher::sip13(r.read(root + R_KEY), r.read(root + R_KEY + 8))
            }
            VERSION => return bad("descriptor outside the heap"),
            _ => return bad("unknown version"),
        };
        let s0: u64 = r.read(root + R_SEG0);
        let size: u64 = r.read(root + R_SIZE);
        if !(1..=30).contains(&s0) || size < s0 || size > (s0 + MAX_SEGS - 1).min(62) {
            return bad("bad bucket geometry");
        }
        let head: u64 = r.read(root + R_HEAD);
        if !r.contains(head, N_KEY)
            || r.read::<u32>(head) != DUMMY_TAG
            || r.read::<u64>(head + N_SO) != 0
        {
            return bad("bad head node");
        }
        for i in 0..MAX_SEGS {
            let s: u64 = r.read(root + R_DIR + 8 * i);
            if s == 0 {
                continue;
            }
            let shift = if i == 0 { s0 } else { s0 + i - 1 };
            // A corrupt directory can name a segment too large for its byte
            // length to be a u64 (s0 up to 30, i up to 47): refused, not an
            // overflow.
            let Some(len) = 1u64
                .checked_shl(shift as u32)
                .and_then(|n| n.checked_mul(8))
                .and_then(|b| b.checked_add(S_HDR))
            else {
                return bad(&format!("bad segment {i}"));
            };
            let n = 1u64 << shift;
            if !r.contains(s, len)
                || r.read::<u32>(s) != SEG_TAG
                || r.read::<u32>(s + 4) as u64 != i
                || r.read::<u64>(s + 8) != n
            {
                return bad(&format!("bad segment {i}"));
            }
        }
        if r.read::<u64>(root + R_DIR) == 0 {
            return bad("segment 0 missing");
        }
        let count: u64 = r.read(root + R_COUNT);
        Ok(LfHash {
            inner: Arc::new(Inner {
                heap: heap.clone(),
                root,
                seg0: s0 as u32,
                head,
                lc: opts.link_cache.then(|| LinkCache::new(opts.cache_buckets)),
                domain: Domain::new(heap.clone()),
                count: AtomicI64::new(count.min(i64::MAX as u64) as i64),
                opts: opts.clone(),
                hasher,
            }),
        })
    }

    /// How this table hashes its keys (from its descriptor).
    pub fn hasher(&self) -> KeyHasher {
        self.inner.hasher
    }

    /// Buckets in use.
    pub fn buckets(&self) -> u64 {
        1 << self.inner.size_log2()
    }

    /// The link cache, if on (benchmarks, tests).
    pub fn link_cache(&self) -> Option<&LinkCache> {
        self.inner.lc.as_ref()
    }
}

/// A removal whose physical unlink waits for the next sync (link cache mode).
struct Pending {
    start: u64,
    so: u64,
    key: Vec<u8>,
    tickets: [FreeTicket; 2],
}

struct HandleState {
    th: ThreadHeap,
    part: Participant,
    st: OpState,
    count: i64,
    unsynced: u32,
    pending: Vec<Pending>,
    /// Old value blocks of updates whose new link may be in the link cache:
    /// retired at sync, once the handle's cached links are flushed.
    replaced: Vec<FreeTicket>,
}

/// The distance between the stages of `Inner::prefetch_walk`, in puts.
const PF_STEP: usize = 4;

/// One thread's handle on an [`LfHash`].
pub struct HashHandle {
    t: LfHash,
    h: HandleState,
}

impl HashHandle {
    fn run<R>(
        &mut self,
        f: impl FnOnce(&Inner, &mut HandleState, &Guard) -> Result<R>,
    ) -> Result<R> {
        let inner = &*self.t.inner;
        let g = self.h.part.pin();
        let res = f(inner, &mut self.h, &g);
        if self.h.st.fence_owed {
            inner.r().fence();
            self.h.st.fence_owed = false;
        }
        drop(g);
        if inner.lc.is_none() {
            self.h.th.end_op();
            self.h.unsynced += 1;
            if self.h.unsynced >= SYNC_EVERY {
                self.settle_count();
            }
        } else {
            self.h.unsynced += 1;
            if self.h.unsynced >= SYNC_EVERY {
                self.sync_inner();
            }
        }
        self.h.part.throttle();
        res
    }

    /// Frees the blocks this handle unlinked as soon as the epoch allows
    /// (`Participant::release_now`), after a write found the heap full: the
    /// blocks of values replaced and keys removed would otherwise wait for a
    /// batch of tickets to fill, and a writer retrying on a full heap would
    /// not find the room its own removes made.
    /// False when it had nothing to free (a retry would fail the same way).
    fn reclaim_now(&mut self) -> bool {
        if self.h.pending.is_empty() && self.h.replaced.is_empty() && self.h.part.outstanding() == 0
        {
            return false;
        }
        self.sync_inner();
        self.h.part.release_now();
        true
    }

    fn settle_count(&mut self) {
        self.t.inner.add_count(std::mem::take(&mut self.h.count));
        self.h.unsynced = 0;
    }

    fn sync_inner(&mut self) {
        let inner = &*self.t.inner;
        let r = inner.r();
        if let Some(lc) = &inner.lc {
            if self.h.st.mask != 0 {
                lc.flush_buckets(r, std::mem::take(&mut self.h.st.mask));
            }
        }
        if !self.h.replaced.is_empty() {
            // The values that replaced them are durably linked (flushed above,
            // or by whoever flushed their bucket first).
            let g = self.h.part.pin();
            let ts = std::mem::take(&mut self.h.replaced);
            self.h.part.retire(&g, ts);
        }
        if !self.h.pending.is_empty() {
            // The freezes are durable (flushed above, or by whoever flushed their
            // bucket first): unlink the nodes, one fence, then retire them.
            let g = self.h.part.pin();
            let pending = std::mem::take(&mut self.h.pending);
            for p in &pending {
                inner.find(&mut self.h.st, p.start, p.so, &p.key);
            }
            r.fence();
            self.h.st.fence_owed = false;
            self.h
                .part
                .retire(&g, pending.into_iter().flat_map(|p| p.tickets));
        }
        // Every block allocated so far is now durably linked (or freed).
        self.h.th.end_op();
        self.settle_count();
    }
}

impl Drop for HashHandle {
    fn drop(&mut self) {
        self.sync_inner();
    }
}

impl Ops for HashHandle {
    fn get(&mut self, key: &[u8], out: &mut Vec<u8>) -> Result<bool> {
        check_kv(key, None)?;
        let inner = &*self.t.inner;
        let _g = self.h.part.pin();
        Ok(inner.get(key, out))
    }

    fn put(&mut self, key: &[u8], value: &[u8]) -> Result<bool> {
        check_kv(key, Some(value))?;
        let r = self.run(|i, h, g| i.upsert(h, g, key, value, true));
        if !heap_full(&r) || !self.reclaim_now() {
            return r;
        }
        // Once more after freeing what this handle unlinked (a put is
        // failure-atomic: the failed one changed nothing).
        self.run(|i, h, g| i.upsert(h, g, key, value, true))
    }

    fn insert(&mut self, key: &[u8], value: &[u8]) -> Result<bool> {
        check_kv(key, Some(value))?;
        let r = self.run(|i, h, g| i.upsert(h, g, key, value, false));
        if !heap_full(&r) || !self.reclaim_now() {
            return r;
        }
        self.run(|i, h, g| i.upsert(h, g, key, value, false))
    }

    fn remove(&mut self, key: &[u8]) -> Result<bool> {
        check_kv(key, None)?;
        self.run(|i, h, g| i.remove(h, g, key))
    }

    fn sync(&mut self) -> Result<()> {
        self.sync_inner();
        Ok(())
    }

    fn apply_batch(&mut self, items: &[(&[u8], Option<&[u8]>)]) -> Result<()> {
        let r = self.apply_batch_once(items);
        if !heap_full(&r) || !self.reclaim_now() {
            return r;
        }
        // Once more after freeing what this handle unlinked: each write is
        // failure-atomic, and writing one again is the same write.
        self.apply_batch_once(items)
    }

    fn scan(&mut self, cursor: u64, count: usize, out: &mut Vec<Vec<u8>>) -> Result<u64> {
        let inner = &*self.t.inner;
        let _g = self.h.part.pin();
        Ok(inner.scan_keys(cursor, count, out))
    }
}

/// Whether `r` failed for lack of room in the heap.
fn heap_full<T>(r: &Result<T>) -> bool {
    matches!(r, Err(Error::Heap(e)) if e.is_full())
}

impl Index for LfHash {
    type Handle = HashHandle;

    fn handle(&self) -> Result<HashHandle> {
        let inner = &*self.inner;
        Ok(HashHandle {
            t: self.clone(),
            h: HandleState {
                th: inner.heap.thread()?,
                part: inner.domain.participant(),
                st: OpState::default(),
                count: 0,
                unsynced: 0,
                pending: Vec::new(),
                replaced: Vec::new(),
            },
        })
    }

    fn root(&self) -> PPtr<u8> {
        PPtr::from_raw(self.inner.root)
    }

    fn len_estimate(&self) -> u64 {
        self.inner.count.load(Ordering::Acquire).max(0) as u64
    }

    fn close(&self) -> Result<()> {
        let inner = &*self.inner;
        let r = inner.r();
        if let Some(lc) = &inner.lc {
            lc.flush_all(r);
        }
        inner.domain.collect();
        let c = inner.count.load(Ordering::Acquire).max(0) as u64;
        r.write::<u64>(inner.root + R_COUNT, &c);
        r.persist(inner.root, 32);
        Ok(())
    }

    fn verify(&self, quiescent: bool) -> std::result::Result<Verified, String> {
        let inner = &*self.inner;
        let r = inner.r();
        let mut v = Verified {
            blocks: 1,
            ..Default::default()
        };
        // Segments and their slots.
        let mut dummies = std::collections::HashMap::new();
        for i in 0..MAX_SEGS {
            let s: u64 = r.read(inner.root + R_DIR + 8 * i);
            if s == 0 {
                continue;
            }
            v.blocks += 1;
            for j in 0..inner.seg_buckets(i) {
                let d = ptr(r.read::<u64>(s + S_HDR + 8 * j));
                if d != 0 {
                    let b = if i == 0 {
                        j
                    } else {
                        (1 << (inner.seg0 as u64 + i - 1)) + j
                    };
                    dummies.insert(d, b);
                }
            }
        }
        let mut prev: Option<(u64, Vec<u8>)> = None;
        let mut curr = inner.head;
        let mut seen = 0u64;
        let limit = inner.heap.region().size() / 32;
        let mut key = Vec::new();
        while curr != 0 {
            seen += 1;
            if seen > limit {
                return Err("the list has a cycle".into());
            }
            if !curr.is_multiple_of(16) || !r.contains(curr, N_KEY) {
                return Err(format!("link to {curr:#x}: outside the heap"));
            }
            let tag: u32 = r.read(curr);
            let klen: u32 = r.read(curr + 4);
            let so: u64 = r.read(curr + N_SO);
            if !r.contains(curr + N_KEY, klen as u64) {
                return Err(format!("node {curr:#x}: key overruns the heap"));
            }
            key.resize(klen as usize, 0);
            r.read_bytes(curr + N_KEY, &mut key);
            let nv = link::load(r, curr + N_NEXT);
            let val = link::load(r, curr + N_VAL);
            if quiescent && (nv & DEL != 0 || val & DEL != 0) {
                return Err(format!(
                    "node {curr:#x}: logically deleted but still linked"
                ));
            }
            match tag {
                DUMMY_TAG => {
                    if so & 1 != 0 || klen != 0 {
                        return Err(format!("dummy {curr:#x}: bad split key or key"));
                    }
                    if let Some(&b) = dummies.get(&curr) {
                        if so_dummy(b) != so {
                            return Err(format!(
                                "bucket {b} points at the dummy of another bucket"
                            ));
                        }
                    }
                    dummies.remove(&curr);
                }
                NODE_TAG => {
                    if so != so_regular(inner.hasher.hash(&key)) {
                        return Err(format!(
                            "node {curr:#x}: split key does not match its key's hash"
                        ));
                    }
                    if nv & DEL == 0 && val & DEL == 0 {
                        v.keys += 1;
                        v.payload_bytes += klen as u64;
                    }
                    v.payload_bytes += blob::verify_value(r, ptr(val), curr)?
                        * (nv & DEL == 0 && val & DEL == 0) as u64;
                    v.blocks += 1;
                }
                _ => return Err(format!("node {curr:#x}: bad tag {tag:#x}")),
            }
            v.blocks += 1;
            if let Some((pso, pkey)) = &prev {
                let ord = (*pso, pkey.as_slice()).cmp(&(so, key.as_slice()));
                if ord != Cmp::Less {
                    return Err(format!("node {curr:#x}: out of split order"));
                }
            }
            prev = Some((so, key.clone()));
            curr = ptr(nv);
        }
        if let Some((d, b)) = dummies.into_iter().next() {
            return Err(format!(
                "bucket {b} points at {d:#x}, which is not in the list"
            ));
        }
        Ok(v)
    }
}

impl Recoverable for LfHash {
    fn repair(&self, slots: &[(PPtr<u8>, u64)]) -> Result<u64> {
        let inner = &*self.inner;
        let r = inner.r();
        let mut st = OpState::default();
        let mut n = 0;
        let mut key = Vec::new();
        for &(p, _) in slots {
            let p = p.offset();
            if inner.node_slot(p) != Some(NODE_TAG) {
                continue;
            }
            let nv = link::load(r, p + N_NEXT);
            let val = link::load(r, p + N_VAL);
            if (nv & DEL == 0 && val & DEL == 0) || !inner.linked(p) {
                continue;
            }
            let klen: u32 = r.read(p + 4);
            key.resize(klen as usize, 0);
            r.read_bytes(p + N_KEY, &mut key);
            let so: u64 = r.read(p + N_SO);
            let start = inner.start_ro(so.reverse_bits() & ((1u64 << inner.size_log2()) - 1));
            inner.find(&mut st, start, so, &key);
            n += 1;
        }
        r.fence();
        Ok(n)
    }

    fn reachable(&self, p: PPtr<u8>) -> bool {
        let inner = &*self.inner;
        let r = inner.r();
        let p = p.offset();
        if p == inner.root {
            return true;
        }
        if p == 0 || !p.is_multiple_of(16) || !r.contains(p, 16) {
            return false;
        }
        match r.read::<u32>(p) {
            NODE_TAG | DUMMY_TAG => {
                if inner.node_slot(p).is_none() || !inner.linked(p) {
                    return false;
                }
                link::load(r, p + N_NEXT) & DEL == 0 && link::load(r, p + N_VAL) & DEL == 0
            }
            SEG_TAG => {
                let i = r.read::<u32>(p + 4) as u64;
                i < MAX_SEGS && r.read::<u64>(inner.root + R_DIR + 8 * i) == p
            }
            blob::VAL_TAG => {
                let Ok(cap) = inner.heap.usable_size(PPtr::from_raw(p)) else {
                    return false;
                };
                let Some(owner) = blob::value_owner(r, p, cap) else {
                    return false;
                };
                inner.node_slot(owner) == Some(NODE_TAG)
                    && ptr(link::load(r, owner + N_VAL)) == p
                    && self.reachable(PPtr::from_raw(owner))
            }
            _ => false,
        }
    }
}

#[cfg(test)]
mod lc_retire_tests {
    //! Link cache on: an update CASes the value link through the cache (not yet
    //! durable). Its old value block must not be freed before that link is
    //! durable (retired at once, it would be freed once the handle's tickets
    //! went to the epoch and a grace period passed, while the persisted image
    //! of the node's value link still pointed at it).
    use super::*;
    use crate::test_util::{images_linking, sim_opts as opts};
    use pmem::CrashSim;

    fn node_of(t: &LfHash, key: &[u8]) -> u64 {
        let inner = &*t.inner;
        let r = inner.r();
        let so = so_regular(inner.hasher.hash(key));
        let mut c = inner.start_ro(inner.bucket_of(inner.hasher.hash(key)));
        while c != 0 {
            if inner.cmp_node(c, so, key) == Cmp::Equal {
                return c;
            }
            c = ptr(link::load(r, c + N_NEXT));
        }
        panic!("key not found")
    }

    fn k(i: u32) -> Vec<u8> {
        format!("key{i:04}").into_bytes()
    }

    /// A directory naming a segment whose size overflows (a large first
    /// segment and a late directory slot) is corrupt, not a panic (`ember
    /// check` panicked on such a heap; found by the heap fuzz target).
    #[test]
    fn oversized_segment_is_corrupt() {
        let dir = tempfile::tempdir().unwrap();
        let heap = Heap::create(&dir.path().join("h"), &opts()).unwrap();
        let t = LfHash::create(&heap, &HashOptions::default()).unwrap();
        let root = t.inner.root;
        drop(t);
        let r = heap.region();
        for (s0, i) in [(30, MAX_SEGS - 1), (20, MAX_SEGS - 6)] {
            r.write(root + R_SEG0, &s0);
            r.write(root + R_SIZE, &s0);
            r.write(root + R_DIR + 8 * i, &root);
            match LfHash::attach(&heap, PPtr::from_raw(root), &HashOptions::default()) {
                Err(Error::Corrupt(m)) => assert!(m.contains("bad segment"), "{m}"),
                Err(e) => panic!("{e}"),
                Ok(_) => panic!("attached with segment {i} at s0 {s0}"),
            }
            r.write(root + R_DIR + 8 * i, &0u64);
        }
    }

    #[test]
    fn old_value_not_freed_before_new_value_link_is_durable() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("h");
        let hopts = HashOptions {
            link_cache: true,
            initial_buckets: 64,
            ..Default::default()
        };
        {
            let heap = Heap::create(&path, &opts()).unwrap();
            let t = LfHash::create(&heap, &hopts).unwrap();
            heap.set_root(t.root()).unwrap();
            t.close().unwrap();
        }
        let sim = Arc::new(CrashSim::new(7, 0));
        let rec = Heap::open_sim(&path, &opts(), sim.clone()).unwrap();
        let root = rec.heap().root();
        let t = LfHash::attach(rec.heap(), root, &hopts).unwrap();
        let (heap, _) = crate::recover(rec, &[&t]).unwrap();
        let r = heap.region();
        let v1 = vec![1u8; 100];
        let mut a = t.handle().unwrap();
        for i in 0..64 {
            assert!(a.insert(&k(i), &v1).unwrap());
        }
        a.sync().unwrap();
        let n0 = node_of(&t, &k(0));
        let b = ptr(link::load(r, n0 + N_VAL));
        // The update of k0: its value link goes through the cache.
        a.put(&k(0), &[2u8; 100]).unwrap();
        assert_ne!(ptr(link::load(r, n0 + N_VAL)), b);
        assert!(t.link_cache().unwrap().busy() > 0);
        // Whatever the handle retired goes to the epoch, and the grace period
        // passes (the handle is unpinned between operations).
        a.h.part.hand_over();
        for _ in 0..4 {
            t.inner.domain.collect();
        }
        let freed = !heap.is_allocated(PPtr::from_raw(b));
        let stale = images_linking(&sim, r, n0 + N_VAL, b);
        std::mem::forget(a);
        assert!(stale > 0, "no crash image links the old block");
        assert!(
            !freed,
            "the old value block was freed while the persisted k0.value still linked it"
        );
    }
}
