//! The durable lock-free skip list of the log-free paper (§3–§5), ordered by key
//! bytes (`memcmp` order, a shorter key before its extensions).
//!
//! The volatile algorithm is the lock-free skip list of Herlihy, Lev, Luchangco and
//! Shavit (Fraser's design): every level is a Harris list, level 0 holds every
//! member and the upper levels are shortcuts. Durability comes from the three
//! techniques of the paper, with the shared machinery of this crate:
//! link-and-persist ([`crate::link`]), the link cache ([`crate::lcache`]) and
//! NV-epochs (the heap's active page tables plus [`crate::reclaim`]).
//!
//! # Layout (little-endian, every block 16-byte aligned)
//!
//! Descriptor (24 bytes, the structure's root):
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 4 | tag `"ESLR"` ([`DESC_TAG`]) |
//! | 4 | 4 | version ([`VERSION`] = 1) |
//! | 8 | 8 | head: offset of the head sentinel |
//! | 16 | 8 | count: number of keys, exact after [`Index::close`], a hint otherwise (rewritten, flushed without a fence, every 64 operations of a handle) |
//!
//! Node (`24 + 8 * height + klen` bytes rounded up to 16):
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 4 | tag `"ESLN"` ([`NODE_TAG`]) |
//! | 4 | 4 | klen: key length (at most [`crate::MAX_KEY`]) |
//! | 8 | 4 | height: number of levels, 1..=[`MAX_LEVEL`] |
//! | 12 | 4 | pad: volatile insert/remove handshake word (see *Removal racing an insertion*); meaningless after a restart |
//! | 16 | 8 | value: link to a [`crate::blob`] value block whose owner is this node; [`DEL`] = the node is logically deleted ("frozen"), [`DIRTY`] = not yet durable |
//! | 24 | 8 × height | next\[l\]: link to the successor at level l; [`DEL`] = the node is being unlinked at level l; [`DIRTY`] (level 0 only) = not yet durable |
//! | 24 + 8 × height | klen | key bytes |
//!
//! Head sentinel: the node format with tag `"ESLH"` ([`HEAD_TAG`]), height 32,
//! klen 0, pad 0 and value 0; it is never deleted.
//!
//! # Protocol
//!
//! 1. **Level 0 defines membership.** A node is logically deleted iff its value link
//!    carries `DEL` (frozen): that CAS is a remove's linearization point. Upper
//!    levels are search shortcuts. (`next[l]` carries `DEL` only after the freeze,
//!    so at run time `DEL` on `next[0]` also means deleted; recovery treats `DEL`
//!    on any link as deleted, see *Recovery*.)
//! 2. **Level-0 links and value links** are written with link-and-persist
//!    ([`link::cas_persist`]) or through the link cache
//!    ([`LinkCache::try_link`], falling back to `cas_persist` on `NoRoom`,
//!    retrying the operation on `CasFailed`). The cache tag is the inserted node for
//!    an insert's level-0 link and the node itself for its value link. A handle
//!    remembers the buckets it used in a `u64` mask. Readers settle a `DIRTY`
//!    level-0 or value link they read ([`link::settle`]: flush, fence, clear).
//! 3. **Dependencies are durable first.** Before an operation modifies a link or
//!    returns a result that depends on links, it calls `cache.scan` for its
//!    level-0 predecessor and for the current node (the node found, or the
//!    successor when the key is absent), after reading the links.
//! 4. **Upper levels and snips** (physical unlinks, every level) use
//!    [`link::cas_flush`]: flushed, not fenced. An operation that issued one fences
//!    before it drops its epoch guard, so with epoch reclamation every unlink is
//!    durable before the unlinked block can be freed.
//! 5. **Insert** (key absent): allocate the node (height random, p = 1/2, at most
//!    32) and its value block (owner = node); write both, flush, one fence. Scan
//!    `pred0` and `succ0`; CAS `pred0.next[0]`: `succ0 → node` (rule 2). On failure:
//!    find again, rewrite the node's `next` words, flush, fence, retry. Once linked
//!    at level 0, and if the node has upper levels, the level-0 link is made durable
//!    now (`cache.scan(node)` flushes its bucket; `cas_persist` already did): no
//!    upper level may point to a node whose membership is not durable. Then levels
//!    1..height are linked bottom-up with `cas_flush`, a fence between levels (a
//!    crash never keeps a live node on a level without the one below), finding
//!    again on failure (the node's
//!    `next[l]` is then rewritten with a CAS, flushed and fenced before the
//!    predecessor may point to it) and stopping when the node is deleted meanwhile.
//!
//!    Persist order: value block and node contents (fence) → level-0 link (fence:
//!    link-and-persist, or the bucket flush) → upper links (flush, fence before
//!    unpinning) → NV-epoch end (`end_op`: after the operation without the cache, at
//!    `sync` with it).
//! 6. **Update** (key present and live, node N): new value block (owner N), flush,
//!    fence. `v = settle(N.value)`; if frozen, the key is absent: find again. Scan
//!    `pred0` and N; take a free ticket for `v` *before* the CAS (it becomes covered by the
//!    active page table, durably); CAS `N.value: v → new` (rule 2). Failure: cancel
//!    the ticket, retry. Success: retire the ticket (freed after the grace period).
//!
//!    Persist order: new value block (fence) → ticket (APT entry, if new) → value
//!    link (link-and-persist or cache) → old block freed after every reader left.
//! 7. **Remove** (node N live): `v = settle(N.value)`; scan `pred0` and N; take
//!    tickets for N and `v` *before* freezing; freeze: CAS `N.value: v → v|DEL`
//!    (rule 2); failure: cancel both tickets, retry. The winner owns retirement: it
//!    marks `N.next[l]` with `DEL` top-down (`cas_flush`), runs `find(key)`, which
//!    snips N at every level, fences, and retires both tickets.
//!
//!    Persist order: tickets (APT entries) → freeze (link-and-persist or cache) →
//!    marks and snips (flush) → fence → blocks freed after the grace period.
//! 8. **find** walks from the head's top level down. At level l, for
//!    `curr = ptr(pred.next[l])`: if `curr.next[l]` carries `DEL`, or curr is
//!    logically deleted (then it first helps mark `curr.next[l]`), it snips curr:
//!    at level 0 it scans curr and settles curr's value first, then
//!    `cas_flush(pred.next[l], curr → succ)`; a failed snip restarts from the head.
//!    The predecessor only ever advances to nodes it saw live.
//! 9. **get** is a read-only traversal (no snipping; it passes through deleted
//!    nodes, whose memory the epoch guard protects, but only descends from nodes it
//!    saw live, which keeps the wait-free search linearizable). When the key is
//!    found: settle the value and `pred0`'s link, scan `pred0` and N; a frozen value
//!    means absent; else the value is copied. A deleted node with the key that the
//!    search passes is scanned too (its freeze is what the "absent" depends on).
//! 10. **scan** ([`Ops::scan`]) is not offered: its cursor is a split-order
//!     (hash) position, which this list, ordered by key bytes, cannot seek to; it
//!     returns [`crate::Error::Unsupported`]. No store uses the list as a backend.
//! 11. Every operation runs pinned. **NV-epochs**: without the link cache, a handle
//!     calls `end_op` after every operation (its new blocks are durably linked by
//!     then). With the cache, a block linked through the cache is durably linked
//!     only once its bucket is flushed, so `end_op` is called only by
//!     [`Ops::sync`] (flush the handle's buckets, clear the mask, `end_op`), which
//!     the handle runs by itself every 64 operations and when it is dropped.
//!
//! ## Removal racing an insertion
//!
//! An inserter may link an upper level of its node after a remover's `find` has
//! already snipped it (the inserter's CAS on the predecessor cannot see the node's
//! marks). If the remover retired the node then, a later reader could reach a freed
//! node through that level. The `pad` word is a handshake (Fraser's "whoever
//! finishes last frees"): the inserter writes a per-process token there before
//! publishing the node and CASes it to 0 when it has stopped linking. A remover
//! that sees the token after marking the node pushes its tickets into a hand-off
//! list and CASes the token to `token|1`: if that succeeds, the inserter's
//! closing CAS fails, so the inserter runs `find(key)` after its last link, fences
//! and retires the tickets; if it fails, the inserter has finished and the
//! remover's own `find`, which runs after the handshake, snips every level. The
//! token is random per attached instance, so a stale `pad` from an earlier process
//! matches it only with probability 2^-30; the cost would be a node and a value
//! block left unfreed until the next recovery (they are unlinked and covered by an
//! active page, so the leak sweep frees them).
//!
//! The hand-off list is a volatile `Vec` under a mutex, held for one push or one
//! removal and taken only on this race, so the common paths stay lock-free. (The
//! tickets must wait somewhere between the remover and the inserter: a ticket is
//! an owned value and cannot be re-created by another thread.)
//!
//! # Recovery ([`Recoverable`])
//!
//! - `repair(slots)`: for every covered slot that parses as a node of this list
//!   (tag, klen and height within the slot, every read bounds-checked) and is
//!   logically deleted and still linked at some level (pointer-equality search for
//!   its key), mark all its levels and run `find(key)` (no link cache), then unlink
//!   it by pointer at any level `find` left it at; one fence at the end. Here
//!   "logically deleted" means `DEL` on the value link *or on any `next` link*:
//!   marks follow a freeze, but the freeze may have sat in the link cache and been
//!   lost while a mark (flushed, not fenced) reached the medium; such a remove was
//!   linearized before the crash and is completed, so that no live node keeps a
//!   marked link (a `find` descending from a live node with a marked link could
//!   not make progress). Every deleted node that can still be linked after a crash
//!   is in a covered slot: its remover took its ticket before the freeze and
//!   redeems it only after all its unlinks are durable.
//! - `reachable(p)` is exact for any slot: true iff `p` is the descriptor, the head,
//!   a node that is found at level 0 by searching its own key (pointer equality)
//!   and is not logically deleted (no mark on any of its links), or a value block
//!   (tag, length within the slot) whose owner is such a node and whose owner's
//!   value link (marks stripped) is `p`.
//!
//! Searches during recovery validate every node they visit and never panic on
//! garbage.

#[cfg(test)]
mod lc_retire_tests;
mod ops;
#[cfg(test)]
mod race_tests;

use crate::blob;
use crate::lcache::LinkCache;
#[cfg(doc)]
use crate::link::DIRTY;
use crate::link::{self, ptr, DEL};
use crate::reclaim::{Domain, Participant};
use crate::{check_kv, Error, Index, Ops, Recoverable, Result, Verified, MAX_KEY};
use ops::{Cx, Op, Spare};
use pmem::{FreeTicket, Heap, PPtr, Region, ThreadHeap};
use rand::rngs::SmallRng;
use rand::SeedableRng;
use std::cmp::Ordering as Cmp;
use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};

/// Most levels a node may have (and the head's height).
pub const MAX_LEVEL: usize = 32;
/// Descriptor tag, `"ESLR"`.
pub const DESC_TAG: u32 = u32::from_le_bytes(*b"ESLR");
/// Node tag, `"ESLN"`.
pub const NODE_TAG: u32 = u32::from_le_bytes(*b"ESLN");
/// Head sentinel tag, `"ESLH"`.
pub const HEAD_TAG: u32 = u32::from_le_bytes(*b"ESLH");
/// Layout version.
pub const VERSION: u32 = 1;
/// Descriptor size in bytes.
pub const DESC_SIZE: u64 = 24;
/// Bytes of a node before its `next` array.
pub const NODE_HDR: u64 = 24;

const OFF_KLEN: u64 = 4;
const OFF_PAD: u64 = 12;
const OFF_VALUE: u64 = 16;
const OFF_NEXT: u64 = 24;
const D_HEAD: u64 = 8;
const D_COUNT: u64 = 16;
/// Operations between automatic syncs (link cache) and count hints.
const SYNC_EVERY: u32 = 64;
/// Added to the insert token by a remover that hands retirement off.
const HANDOFF: u32 = 1;

type Levels = [u64; MAX_LEVEL];

// Test hooks (`race_tests`): a callback at named points of `find` (each level)
// and `remove` (before its unlinking `find`), to drive one interleaving of two
// threads; and a forced height for the nodes a thread creates. Nothing outside
// this crate's unit tests.
#[cfg(test)]
type Hook = Box<dyn FnMut(&'static str, usize)>;
#[cfg(test)]
thread_local! {
    static HOOK: std::cell::RefCell<Option<Hook>> = const { std::cell::RefCell::new(None) };
    static FORCE_H: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}
#[cfg(test)]
fn test_hook(at: &'static str, l: usize) {
    HOOK.with(|h| {
        if let Some(f) = h.borrow_mut().as_mut() {
            f(at, l)
        }
    })
}
#[cfg(not(test))]
#[inline(always)]
fn test_hook(_: &'static str, _: usize) {}

/// Bytes of a node of `height` levels and a `klen`-byte key.
pub fn node_size(height: usize, klen: usize) -> u64 {
    (NODE_HDR + 8 * height as u64 + klen as u64 + 15) & !15
}

#[inline]
fn next_at(n: u64, l: usize) -> u64 {
    n + OFF_NEXT + 8 * l as u64
}
#[inline]
fn val_at(n: u64) -> u64 {
    n + OFF_VALUE
}
#[inline]
fn height_of(r: &Region, n: u64) -> usize {
    r.read::<u32>(n + 8) as usize
}

/// Compares the key of node `n` with `key` (memcmp order), reading it in chunks.
fn cmp_key(r: &Region, n: u64, key: &[u8]) -> Cmp {
    r.emulate_read();
    let [klen, h] = r.read::<[u32; 2]>(n + OFF_KLEN);
    let base = n + OFF_NEXT + 8 * h as u64;
    let klen = klen as usize;
    let m = klen.min(key.len());
    let mut buf = [0u8; 64];
    let mut i = 0;
    while i < m {
        let c = (m - i).min(buf.len());
        r.read_bytes(base + i as u64, &mut buf[..c]);
        match buf[..c].cmp(&key[i..i + c]) {
            Cmp::Equal => i += c,
            o => return o,
        }
    }
    klen.cmp(&key.len())
}

/// Copies the key of node `n` into `out`.
fn read_key(r: &Region, n: u64, out: &mut Vec<u8>) {
    let [klen, h] = r.read::<[u32; 2]>(n + OFF_KLEN);
    out.clear();
    out.resize(klen as usize, 0);
    r.read_bytes(n + OFF_NEXT + 8 * h as u64, out);
}

/// What a validated node header says.
#[derive(Clone, Copy)]
struct NodeInfo {
    height: usize,
}

/// Parses the block at `n` (a slot of `slot` bytes) as a node of a skip list, with
/// every read bounds-checked: None for anything else.
fn parse_node(r: &Region, n: u64, slot: u64) -> Option<NodeInfo> {
    if n == 0 || !n.is_multiple_of(16) || !r.contains(n, NODE_HDR) {
        return None;
    }
    if r.read::<u32>(n) != NODE_TAG {
        return None;
    }
    let [klen, h] = r.read::<[u32; 2]>(n + OFF_KLEN);
    let (klen, h) = (klen as u64, h as u64);
    if h == 0 || h > MAX_LEVEL as u64 || klen > MAX_KEY as u64 {
        return None;
    }
    let need = NODE_HDR + 8 * h + klen;
    if need > slot || !r.contains(n, need) {
        return None;
    }
    Some(NodeInfo { height: h as usize })
}

/// Whether any link of node `n` (`height` levels, validated) carries `DEL`: the
/// recovery notion of "logically deleted". At run time a mark on any `next` word
/// follows a freeze; after a crash the marks may be durable while the freeze (in
/// the link cache) was lost, and the interrupted remove is then completed.
fn any_mark(r: &Region, n: u64, height: usize) -> bool {
    let v = link::load(r, val_at(n));
    (0..height).fold(v, |a, l| a | link::load(r, next_at(n, l))) & DEL != 0
}

/// Options of a skip list (volatile: they may differ between runs).
#[derive(Clone, Debug)]
pub struct SkipOptions {
    /// Use the link cache (§4) for level-0 and value links.
    pub link_cache: bool,
    /// Buckets of the link cache (power of two, 1..=64).
    pub cache_buckets: usize,
}

impl Default for SkipOptions {
    fn default() -> Self {
        SkipOptions {
            link_cache: true,
            cache_buckets: 32,
        }
    }
}

struct Inner {
    heap: Heap,
    root: u64,
    head: u64,
    cache: Option<LinkCache>,
    domain: Domain,
    count: AtomicI64,
    /// Written into `pad` by inserters of this instance (bit 0 clear, bit 1 set).
    token: u32,
    /// Tickets of nodes whose retirement a remover handed to their inserter.
    handoff: Mutex<Vec<(u64, [FreeTicket; 2])>>,
}

impl Inner {
    fn take_handoff(&self, n: u64) -> Option<[FreeTicket; 2]> {
        let mut h = self.handoff.lock().unwrap_or_else(|e| e.into_inner());
        let i = h.iter().position(|(m, _)| *m == n)?;
        Some(h.swap_remove(i).1)
    }
}

/// The durable lock-free skip list. Cheap to clone (a shared handle).
#[derive(Clone)]
pub struct SkipList {
    inner: Arc<Inner>,
}

/// A thread's handle on a [`SkipList`]: a heap thread slot, an epoch participant,
/// the link-cache buckets it has entries in, and the generator of node heights.
pub struct SkipHandle {
    list: SkipList,
    th: ThreadHeap,
    part: Participant,
    mask: u64,
    rng: SmallRng,
    ops: u32,
    /// Old value blocks of updates whose new link may be in the link cache:
    /// retired by `flush_mine`, once the cached links are flushed.
    replaced: Vec<FreeTicket>,
}

// SAFETY: the only non-`Send` part is the crossbeam-epoch `LocalHandle` inside the
// `Participant`. It is `!Send` because a `Guard` points to it; every guard of a
// handle is created and dropped inside one `&mut self` method, so none exists when
// the handle moves, and the handle (hence its `LocalHandle`) is used by one thread
// at a time. crossbeam's `Local` state is only touched through that handle and its
// guards.
unsafe impl Send for SkipHandle {}

impl SkipHandle {
    fn run<T>(&mut self, f: impl FnOnce(&mut Op<'_>) -> T) -> T {
        let guard = self.part.pin();
        let inner = &*self.list.inner;
        let (res, mask) = {
            let mut op = Op {
                inner,
                cx: Cx::new(inner, true),
                th: &mut self.th,
                part: &mut self.part,
                guard: &guard,
                rng: &mut self.rng,
                spare: Spare::default(),
                replaced: &mut self.replaced,
            };
            let res = f(&mut op);
            op.spare.release(op.th);
            // Rule 4: every cas_flush of this operation is durable before unpinning.
            op.cx.fence_if_flushed();
            (res, op.cx.mask)
        };
        drop(guard);
        self.mask |= mask;
        self.after_op();
        self.part.throttle();
        res
    }

    fn after_op(&mut self) {
        let inner = &*self.list.inner;
        if inner.cache.is_none() {
            self.th.end_op();
        }
        self.ops += 1;
        if self.ops >= SYNC_EVERY {
            self.ops = 0;
            let r = inner.heap.region();
            let a = inner.root + D_COUNT;
            let c = inner.count.load(Ordering::Relaxed).max(0) as u64;
            r.atomic_u64(a).store(c, Ordering::Relaxed);
            r.flush(a, 8);
            if inner.cache.is_some() {
                self.flush_mine();
            }
        }
    }

    fn flush_mine(&mut self) {
        let inner = &*self.list.inner;
        if let Some(c) = &inner.cache {
            if self.mask != 0 {
                c.flush_buckets(inner.heap.region(), self.mask);
                self.mask = 0;
            }
        }
        if !self.replaced.is_empty() {
            // The values that replaced them are durably linked (flushed above,
            // or by whoever flushed their bucket first).
            let g = self.part.pin();
            let ts = std::mem::take(&mut self.replaced);
            self.part.retire(&g, ts);
        }
        self.th.end_op();
    }

    /// Calls `f` on the live pairs with key >= `start`, in key order, at most
    /// `limit` of them; returns how many. Each pair was present at some point during
    /// the call (the scan is not an atomic snapshot); the links each result depends
    /// on are durable before `f` sees it.
    pub fn range(
        &mut self,
        start: &[u8],
        limit: usize,
        mut f: impl FnMut(&[u8], &[u8]),
    ) -> Result<usize> {
        check_kv(start, None)?;
        if limit == 0 {
            return Ok(0);
        }
        Ok(self.run(|op| op.range(start, limit, &mut f)))
    }

    /// The node holding `key` and its value block, if the key is present (tests,
    /// tools).
    pub fn locate(&mut self, key: &[u8]) -> Option<(PPtr<u8>, PPtr<u8>)> {
        self.run(|op| {
            let (_, n, found) = op.cx.search(key);
            if !found {
                return None;
            }
            let v = link::load_settled(op.cx.r, val_at(n));
            (v & DEL == 0).then(|| (PPtr::from_raw(n), PPtr::from_raw(ptr(v))))
        })
    }

    /// The list this handle works on.
    pub fn list(&self) -> &SkipList {
        &self.list
    }
}

impl Drop for SkipHandle {
    fn drop(&mut self) {
        self.flush_mine();
    }
}

impl Ops for SkipHandle {
    fn get(&mut self, key: &[u8], out: &mut Vec<u8>) -> Result<bool> {
        check_kv(key, None)?;
        Ok(self.run(|op| op.get(key, out)))
    }

    fn put(&mut self, key: &[u8], value: &[u8]) -> Result<bool> {
        check_kv(key, Some(value))?;
        self.run(|op| op.put(key, value, true))
    }

    fn insert(&mut self, key: &[u8], value: &[u8]) -> Result<bool> {
        check_kv(key, Some(value))?;
        self.run(|op| op.put(key, value, false))
    }

    fn remove(&mut self, key: &[u8]) -> Result<bool> {
        check_kv(key, None)?;
        self.run(|op| op.remove(key))
    }

    fn sync(&mut self) -> Result<()> {
        self.flush_mine();
        Ok(())
    }

    /// Not offered: the list is ordered by key bytes, and a step in split-order
    /// positions (the cursor every level shares) would have to walk the whole list.
    fn scan(&mut self, _cursor: u64, _count: usize, _out: &mut Vec<Vec<u8>>) -> Result<u64> {
        Err(crate::Error::Unsupported(
            "scan not supported on the skip list (ordered by key bytes, not by hash)",
        ))
    }
}

impl SkipList {
    /// Creates an empty list: allocates the descriptor and the head sentinel,
    /// writes them and makes them durable (flush, fence). The heap root is not set:
    /// store [`Index::root`] where it can be found again (e.g. `heap.set_root`).
    pub fn create(heap: &Heap, opts: &SkipOptions) -> Result<SkipList> {
        let mut th = heap.thread()?;
        let hsize = node_size(MAX_LEVEL, 0);
        let head = th.alloc(hsize)?.offset();
        let d = match th.alloc(DESC_SIZE) {
            Ok(d) => d.offset(),
            Err(e) => {
                let _ = th.free(PPtr::from_raw(head));
                return Err(e.into());
            }
        };
        let r = heap.region();
        r.fill(head, hsize as usize, 0);
        r.write::<u32>(head, &HEAD_TAG);
        r.write::<u32>(head + 8, &(MAX_LEVEL as u32));
        r.write::<u32>(d, &DESC_TAG);
        r.write::<u32>(d + 4, &VERSION);
        r.write::<u64>(d + D_HEAD, &head);
        r.write::<u64>(d + D_COUNT, &0);
        r.flush(head, hsize as usize);
        r.flush(d, DESC_SIZE as usize);
        r.fence();
        drop(th);
        Ok(Self::build(heap, d, head, 0, opts))
    }

    /// Attaches to the list whose descriptor is at `root`, after validating the
    /// descriptor and the head sentinel ([`Error::Corrupt`] otherwise). Allocates
    /// nothing: works on a heap that is still recovering.
    pub fn attach(heap: &Heap, root: PPtr<u8>, opts: &SkipOptions) -> Result<SkipList> {
        let r = heap.region();
        let d = root.offset();
        let bad =
            |m: &str| Error::Corrupt(format!("skip list descriptor at {:#x}: {m}", root.raw()));
        if root.marks() != 0 || d == 0 || !d.is_multiple_of(16) || !r.contains(d, DESC_SIZE) {
            return Err(bad("not a block address inside the heap"));
        }
        if !matches!(heap.usable_size(root), Ok(s) if s >= DESC_SIZE) {
            return Err(bad("not a heap block of descriptor size"));
        }
        if r.read::<u32>(d) != DESC_TAG {
            return Err(bad("bad tag"));
        }
        let v = r.read::<u32>(d + 4);
        if v != VERSION {
            return Err(bad(&format!("unsupported version {v}")));
        }
        let head = r.read::<u64>(d + D_HEAD);
        let hsize = node_size(MAX_LEVEL, 0);
        if head == 0
            || !head.is_multiple_of(16)
            || !r.contains(head, hsize)
            || !matches!(heap.usable_size(PPtr::from_raw(head)), Ok(s) if s >= hsize)
        {
            return Err(bad(&format!(
                "head {head:#x} is not a heap block of head size"
            )));
        }
        if r.read::<u32>(head) != HEAD_TAG
            || r.read::<[u32; 2]>(head + OFF_KLEN) != [0, MAX_LEVEL as u32]
        {
            return Err(bad(&format!("head {head:#x} is not a skip-list head")));
        }
        let count = r.read::<u64>(d + D_COUNT).min(i64::MAX as u64) as i64;
        Ok(Self::build(heap, d, head, count, opts))
    }

    fn build(heap: &Heap, root: u64, head: u64, count: i64, opts: &SkipOptions) -> SkipList {
        let token = (rand::random::<u32>() & !HANDOFF) | 2;
        SkipList {
            inner: Arc::new(Inner {
                heap: heap.clone(),
                root,
                head,
                cache: opts.link_cache.then(|| LinkCache::new(opts.cache_buckets)),
                domain: Domain::new(heap.clone()),
                count: AtomicI64::new(count),
                token,
                handoff: Mutex::new(Vec::new()),
            }),
        }
    }

    /// The link cache, if enabled (tests, benchmarks).
    pub fn link_cache(&self) -> Option<&LinkCache> {
        self.inner.cache.as_ref()
    }

    /// Validates node `c` met at level `l` while walking the list (recovery).
    fn check_linked(&self, c: u64, l: usize) -> std::result::Result<(), String> {
        match parse_node(self.inner.heap.region(), c, u64::MAX) {
            Some(i) if i.height > l => Ok(()),
            _ => Err(format!(
                "level {l} links {c:#x}, which is not a node of that height"
            )),
        }
    }

    /// For each level l < `levels`: the predecessor of node `n` at level l if `n`
    /// is linked there (0 otherwise), found by searching for `key`. Validates every
    /// node it visits (recovery: never panics on a corrupt list).
    fn locate_by_ptr(
        &self,
        key: &[u8],
        n: u64,
        levels: usize,
    ) -> std::result::Result<Levels, String> {
        let r = self.inner.heap.region();
        let limit = r.size() / 16;
        let mut steps = 0u64;
        let mut step = || {
            steps += 1;
            if steps > limit {
                Err("a level of the list has a cycle".to_string())
            } else {
                Ok(())
            }
        };
        let mut out = [0u64; MAX_LEVEL];
        let mut pred = self.inner.head;
        for l in (0..MAX_LEVEL).rev() {
            loop {
                let c = ptr(link::load(r, next_at(pred, l)));
                if c == 0 {
                    break;
                }
                step()?;
                self.check_linked(c, l)?;
                if cmp_key(r, c, key) == Cmp::Less {
                    pred = c;
                } else {
                    break;
                }
            }
            if l < levels {
                let mut p = pred;
                loop {
                    let c = ptr(link::load(r, next_at(p, l)));
                    if c == 0 {
                        break;
                    }
                    step()?;
                    self.check_linked(c, l)?;
                    if c == n {
                        out[l] = p;
                        break;
                    }
                    if cmp_key(r, c, key) != Cmp::Equal {
                        break;
                    }
                    p = c;
                }
            }
        }
        Ok(out)
    }

    /// Whether `n` (a node of `height` levels, validated) is linked at level 0 and
    /// not logically deleted.
    fn node_reachable(&self, n: u64, height: usize) -> bool {
        let r = self.inner.heap.region();
        if any_mark(r, n, height) {
            return false;
        }
        let mut key = Vec::new();
        read_key(r, n, &mut key);
        matches!(self.locate_by_ptr(&key, n, 1), Ok(p) if p[0] != 0)
    }
}

impl Index for SkipList {
    type Handle = SkipHandle;

    fn handle(&self) -> Result<SkipHandle> {
        let th = self.inner.heap.thread()?;
        Ok(SkipHandle {
            list: self.clone(),
            th,
            part: self.inner.domain.participant(),
            mask: 0,
            rng: SmallRng::seed_from_u64(rand::random()),
            ops: 0,
            replaced: Vec::new(),
        })
    }

    fn root(&self) -> PPtr<u8> {
        PPtr::from_raw(self.inner.root)
    }

    fn verify(&self, quiescent: bool) -> std::result::Result<Verified, String> {
        let inner = &*self.inner;
        let heap = &inner.heap;
        let r = heap.region();
        let (d, head) = (inner.root, inner.head);
        if !r.contains(d, DESC_SIZE) || r.read::<u32>(d) != DESC_TAG {
            return Err(format!("descriptor {d:#x}: bad tag"));
        }
        if r.read::<u32>(d + 4) != VERSION || r.read::<u64>(d + D_HEAD) != head {
            return Err(format!("descriptor {d:#x}: bad version or head"));
        }
        let hsize = node_size(MAX_LEVEL, 0);
        if !r.contains(head, hsize)
            || r.read::<u32>(head) != HEAD_TAG
            || r.read::<[u32; 2]>(head + OFF_KLEN) != [0, MAX_LEVEL as u32]
            || r.read::<u64>(val_at(head)) != 0
        {
            return Err(format!("head {head:#x}: bad header"));
        }
        for b in [d, head] {
            if !heap.is_allocated(PPtr::from_raw(b)) {
                return Err(format!(
                    "block {b:#x} (descriptor or head) is not allocated"
                ));
            }
        }
        let mut v = Verified {
            keys: 0,
            blocks: 2,
            payload_bytes: 0,
        };
        let mut index: HashMap<u64, usize> = HashMap::new();
        let mut prev: Option<Vec<u8>> = None;
        let mut prev_live: Option<Vec<u8>> = None;
        let mut key = Vec::new();
        let mut c = ptr(link::load(r, next_at(head, 0)));
        while c != 0 {
            if parse_node(r, c, u64::MAX).is_none() {
                return Err(format!("level 0 links {c:#x}, which is not a node"));
            }
            if !heap.is_allocated(PPtr::from_raw(c)) {
                return Err(format!("node {c:#x} is linked but not allocated"));
            }
            if index.insert(c, index.len()).is_some() {
                return Err(format!("level 0 has a cycle through {c:#x}"));
            }
            read_key(r, c, &mut key);
            let vraw = link::load(r, val_at(c));
            let n0 = link::load(r, next_at(c, 0));
            let dead = (vraw | n0) & DEL != 0;
            if let Some(p) = &prev {
                let ok = if quiescent { *p < key } else { *p <= key };
                if !ok {
                    return Err(format!("level 0: key of node {c:#x} is out of order"));
                }
            }
            if !dead {
                if prev_live.as_ref().is_some_and(|p| *p >= key) {
                    return Err(format!(
                        "level 0: live node {c:#x} duplicates or precedes a live key"
                    ));
                }
                prev_live = Some(key.clone());
            } else if quiescent {
                return Err(format!(
                    "node {c:#x} is logically deleted but linked at level 0"
                ));
            }
            let vp = ptr(vraw);
            let vlen = blob::verify_value(r, vp, c)?;
            if !heap.is_allocated(PPtr::from_raw(vp)) {
                return Err(format!(
                    "value block {vp:#x} of node {c:#x} is not allocated"
                ));
            }
            v.blocks += 2;
            if !dead {
                v.keys += 1;
                v.payload_bytes += key.len() as u64 + vlen;
            }
            prev = Some(std::mem::take(&mut key));
            c = ptr(n0);
        }
        for l in 1..MAX_LEVEL {
            let mut last: Option<usize> = None;
            let mut c = ptr(link::load(r, next_at(head, l)));
            while c != 0 {
                let Some(&i) = index.get(&c) else {
                    return Err(format!("level {l} links {c:#x}, which is not in level 0"));
                };
                if last.is_some_and(|x| i <= x) {
                    return Err(format!("level {l}: node {c:#x} is out of level-0 order"));
                }
                if height_of(r, c) <= l {
                    return Err(format!(
                        "level {l} links node {c:#x} of height {}",
                        height_of(r, c)
                    ));
                }
                if quiescent && (link::load(r, val_at(c)) | link::load(r, next_at(c, 0))) & DEL != 0
                {
                    return Err(format!(
                        "node {c:#x} is logically deleted but linked at level {l}"
                    ));
                }
                last = Some(i);
                c = ptr(link::load(r, next_at(c, l)));
            }
        }
        Ok(v)
    }

    fn len_estimate(&self) -> u64 {
        self.inner.count.load(Ordering::Relaxed).max(0) as u64
    }

    fn close(&self) -> Result<()> {
        let inner = &*self.inner;
        let r = inner.heap.region();
        if let Some(c) = &inner.cache {
            c.flush_all(r);
        }
        inner.domain.collect();
        let a = inner.root + D_COUNT;
        let c = inner.count.load(Ordering::Relaxed).max(0) as u64;
        r.atomic_u64(a).store(c, Ordering::Relaxed);
        r.persist(a, 8);
        Ok(())
    }
}

impl Recoverable for SkipList {
    fn repair(&self, slots: &[(PPtr<u8>, u64)]) -> Result<u64> {
        let inner = &*self.inner;
        let r = inner.heap.region();
        let mut cx = Cx::new(inner, false);
        let mut preds = [0u64; MAX_LEVEL];
        let mut succs = [0u64; MAX_LEVEL];
        let mut key = Vec::new();
        let mut repaired = 0;
        for &(p, size) in slots {
            let n = p.offset();
            let Some(info) = parse_node(r, n, size) else {
                continue;
            };
            if !any_mark(r, n, info.height) {
                continue;
            }
            read_key(r, n, &mut key);
            let at = self
                .locate_by_ptr(&key, n, info.height)
                .map_err(Error::Corrupt)?;
            if at.iter().all(|&p| p == 0) {
                continue;
            }
            cx.mark_all(n);
            cx.find(&key, &mut preds, &mut succs);
            // Whatever find left (it cannot leave the node linked in a list that
            // obeys the invariants): unlink by pointer.
            let at = self
                .locate_by_ptr(&key, n, info.height)
                .map_err(Error::Corrupt)?;
            for (l, &p) in at.iter().enumerate() {
                if p != 0 {
                    let a = next_at(p, l);
                    let old = link::load(r, a);
                    if ptr(old) == n {
                        let succ = ptr(link::load(r, next_at(n, l)));
                        cx.cas_flush(a, old, succ | (old & DEL));
                    }
                }
            }
            repaired += 1;
        }
        r.fence();
        Ok(repaired)
    }

    fn reachable(&self, p: PPtr<u8>) -> bool {
        let inner = &*self.inner;
        let n = p.raw();
        if n == inner.root || n == inner.head {
            return true;
        }
        let heap = &inner.heap;
        let r = heap.region();
        let Ok(slot) = heap.usable_size(p) else {
            return false;
        };
        if let Some(info) = parse_node(r, n, slot) {
            return self.node_reachable(n, info.height);
        }
        if let Some(owner) = blob::value_owner(r, n, slot) {
            return parse_node(r, owner, u64::MAX).is_some_and(|info| {
                ptr(link::load(r, val_at(owner))) == n && self.node_reachable(owner, info.height)
            });
        }
        false
    }
}
