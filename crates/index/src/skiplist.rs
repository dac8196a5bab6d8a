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

use crate::blob;
use crate::lcache::{Added, LinkCache};
#[cfg(doc)]
use crate::link::DIRTY;
use crate::link::{self, ptr, LinkMem, DEL};
use crate::reclaim::{Domain, Participant};
use crate::{check_kv, Error, Index, Ops, Recoverable, Result, Verified, MAX_KEY};
use crossbeam_epoch::Guard;
use pmem::{FreeTicket, Heap, PPtr, Region, ThreadHeap};
use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};
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

/// Per-operation context: the region, the cache, whether a link was flushed without
/// a fence (rule 4) and the cache buckets used.
struct Cx<'a> {
    r: &'a Region,
    head: u64,
    cache: Option<&'a LinkCache>,
    flushed: bool,
    mask: u64,
}

impl<'a> Cx<'a> {
    fn new(inner: &'a Inner, with_cache: bool) -> Self {
        Cx {
            r: inner.heap.region(),
            head: inner.head,
            cache: if with_cache {
                inner.cache.as_ref()
            } else {
                None
            },
            flushed: false,
            mask: 0,
        }
    }

    #[inline]
    fn scan(&self, n: u64) {
        if n != 0 {
            if let Some(c) = self.cache {
                c.scan(self.r, n);
            }
        }
    }

    #[inline]
    fn load(&self, a: u64) -> u64 {
        link::load(self.r, a)
    }

    /// Loads a link of level `l`, settling it when it is a level-0 link.
    #[inline]
    fn load_at(&self, a: u64, l: usize) -> u64 {
        if l == 0 {
            link::load_settled(self.r, a)
        } else {
            link::load(self.r, a)
        }
    }

    /// Logically deleted: value frozen (or `next[0]` marked, which at run time
    /// implies it; after a crash it may survive alone).
    #[inline]
    fn dead(&self, n: u64) -> bool {
        (self.load(val_at(n)) | self.load(next_at(n, 0))) & DEL != 0
    }

    #[inline]
    fn cas_flush(&mut self, a: u64, old: u64, new: u64) -> bool {
        let ok = link::cas_flush(self.r, a, old, new);
        self.flushed |= ok;
        ok
    }

    /// Writes a level-0 or value link (rule 2); `node` is the cache tag.
    fn link0(&mut self, node: u64, addr: u64, old: u64, new: u64) -> bool {
        if let Some(c) = self.cache {
            let (res, b) = c.try_link(self.r, node, addr, old, new);
            match res {
                Added::Linked => {
                    self.mask |= 1u64 << b;
                    return true;
                }
                Added::CasFailed => return false,
                Added::NoRoom => {}
            }
        }
        link::cas_persist(self.r, addr, old, new)
    }

    fn fence_if_flushed(&mut self) {
        if self.flushed {
            self.r.fence();
            self.flushed = false;
        }
    }

    /// Rule 8: fills `preds`/`succs` at every level, snipping deleted nodes on the
    /// way; returns the live node with `key` if level 0 has one.
    fn find(&mut self, key: &[u8], preds: &mut Levels, succs: &mut Levels) -> Option<u64> {
        'retry: loop {
            let mut pred = self.head;
            for l in (0..MAX_LEVEL).rev() {
                test_hook("find_level", l);
                let mut pa = next_at(pred, l);
                let mut pv = self.load_at(pa, l);
                loop {
                    let curr = ptr(pv);
                    if curr == 0 {
                        break;
                    }
                    let ca = next_at(curr, l);
                    let cn = self.load_at(ca, l);
                    if cn & DEL != 0 || self.dead(curr) {
                        if cn & DEL == 0 {
                            // Help the remover mark this level, then look again.
                            self.cas_flush(ca, cn, cn | DEL);
                            continue;
                        }
                        // The removal's freeze is durable before any level is
                        // snipped: otherwise a crash could keep an upper-level snip
                        // and lose the freeze, leaving a live node with a level gap.
                        self.scan(curr);
                        link::load_settled(self.r, val_at(curr));
                        if pv & DEL != 0 || !self.cas_flush(pa, pv, ptr(cn)) {
                            continue 'retry;
                        }
                        pv = ptr(cn);
                        continue;
                    }
                    if cmp_key(self.r, curr, key) == Cmp::Less {
                        pred = curr;
                        pa = ca;
                        pv = cn;
                    } else {
                        break;
                    }
                }
                preds[l] = pred;
                succs[l] = ptr(pv);
            }
            let c = succs[0];
            return (c != 0 && cmp_key(self.r, c, key) == Cmp::Equal).then_some(c);
        }
    }

    /// Rule 9: read-only search. Returns (pred0, curr, found): `curr` is the live
    /// node with `key` when found, else the first live-looking node after the key's
    /// place (0 at the end). Deleted nodes with the key are scanned on the way.
    fn search(&self, key: &[u8]) -> (u64, u64, bool) {
        let r = self.r;
        let mut pred = self.head;
        for l in (1..MAX_LEVEL).rev() {
            let mut curr = ptr(self.load(next_at(pred, l)));
            while curr != 0 {
                let cn = self.load(next_at(curr, l));
                if cn & DEL != 0 || self.dead(curr) {
                    curr = ptr(cn);
                    continue;
                }
                if cmp_key(r, curr, key) == Cmp::Less {
                    pred = curr;
                    curr = ptr(cn);
                } else {
                    break;
                }
            }
        }
        let mut curr = ptr(self.load_at(next_at(pred, 0), 0));
        while curr != 0 {
            let cn = self.load_at(next_at(curr, 0), 0);
            let dead = (cn | self.load(val_at(curr))) & DEL != 0;
            match cmp_key(r, curr, key) {
                Cmp::Less => {
                    if !dead {
                        pred = curr;
                    }
                }
                Cmp::Equal => {
                    if !dead {
                        return (pred, curr, true);
                    }
                    self.scan(curr);
                    link::load_settled(r, val_at(curr));
                }
                Cmp::Greater => return (pred, curr, false),
            }
            curr = ptr(cn);
        }
        (pred, 0, false)
    }

    /// Marks every level of `n` with `DEL`, top-down (rule 7).
    fn mark_all(&mut self, n: u64) {
        let h = height_of(self.r, n).min(MAX_LEVEL);
        for l in (0..h).rev() {
            let a = next_at(n, l);
            loop {
                let v = self.load_at(a, l);
                if v & DEL != 0 || self.cas_flush(a, v, v | DEL) {
                    break;
                }
            }
        }
    }
}

/// Blocks allocated by an operation and not (yet) published: freed when the
/// operation ends without publishing them.
#[derive(Default)]
struct Spare {
    /// (node, its value block, height)
    node: Option<(u64, u64, usize)>,
    /// (owner, value block) for an update
    val: Option<(u64, u64)>,
}

impl Spare {
    fn release(&mut self, th: &mut ThreadHeap) {
        if let Some((n, v, _)) = self.node.take() {
            let _ = th.free(PPtr::from_raw(v));
            let _ = th.free(PPtr::from_raw(n));
        }
        if let Some((_, v)) = self.val.take() {
            let _ = th.free(PPtr::from_raw(v));
        }
    }
}

fn random_height(rng: &mut SmallRng) -> usize {
    #[cfg(test)]
    {
        let f = FORCE_H.with(|c| c.get());
        if f > 0 {
            return f;
        }
    }
    let bits: u32 = rng.random();
    (bits.trailing_ones() as usize + 1).min(MAX_LEVEL)
}

/// One operation of a handle: the list, the thread's heap and epoch participant,
/// the guard and the per-operation context.
struct Op<'a> {
    inner: &'a Inner,
    cx: Cx<'a>,
    th: &'a mut ThreadHeap,
    part: &'a mut Participant,
    guard: &'a Guard,
    rng: &'a mut SmallRng,
    spare: Spare,
    /// The handle's `replaced`.
    replaced: &'a mut Vec<FreeTicket>,
}

impl Op<'_> {
    /// The new node for `key`, written with `next[l] = succs[l]`, durable (fenced):
    /// allocated on the first call, its links rewritten on later ones.
    fn prepare_node(&mut self, key: &[u8], value: &[u8], succs: &Levels) -> Result<(u64, usize)> {
        let r = self.cx.r;
        if let Some((_, v)) = self.spare.val.take() {
            let _ = self.th.free(PPtr::from_raw(v));
        }
        if let Some((n, _, h)) = self.spare.node {
            for (l, s) in succs.iter().enumerate().take(h) {
                r.atomic_u64(next_at(n, l)).store(*s, Ordering::Relaxed);
            }
            r.flush(next_at(n, 0), 8 * h);
            r.fence();
            return Ok((n, h));
        }
        let h = random_height(self.rng);
        let size = node_size(h, key.len());
        let n = self.th.alloc(size)?.offset();
        let v = match blob::alloc_value(self.th, n, value) {
            Ok(v) => v.offset(),
            Err(e) => {
                let _ = self.th.free(PPtr::from_raw(n));
                return Err(e);
            }
        };
        self.spare.node = Some((n, v, h));
        r.write::<u32>(n, &NODE_TAG);
        r.write::<u32>(n + OFF_KLEN, &(key.len() as u32));
        r.write::<u32>(n + 8, &(h as u32));
        r.write::<u32>(n + OFF_PAD, &self.inner.token);
        r.write::<u64>(val_at(n), &v);
        for (l, s) in succs.iter().enumerate().take(h) {
            r.write::<u64>(next_at(n, l), s);
        }
        r.write_bytes(next_at(n, h), key);
        r.flush(n, (NODE_HDR + 8 * h as u64) as usize + key.len());
        r.fence();
        Ok((n, h))
    }

    /// A durable value block owned by `owner` (reused across retries on one owner).
    fn prepare_value(&mut self, owner: u64, value: &[u8]) -> Result<u64> {
        if let Some((o, v)) = self.spare.val {
            if o == owner {
                return Ok(v);
            }
        }
        self.spare.release(self.th);
        let v = blob::alloc_value(self.th, owner, value)?.offset();
        self.spare.val = Some((owner, v));
        self.cx.r.fence();
        Ok(v)
    }

    /// Insert (`replace` false) or put (`replace` true); true when the key was new.
    fn put(&mut self, key: &[u8], value: &[u8], replace: bool) -> Result<bool> {
        let mut preds = [0u64; MAX_LEVEL];
        let mut succs = [0u64; MAX_LEVEL];
        loop {
            if let Some(n) = self.cx.find(key, &mut preds, &mut succs) {
                if !replace {
                    let v = link::load_settled(self.cx.r, val_at(n));
                    if v & DEL != 0 {
                        continue;
                    }
                    self.cx.scan(preds[0]);
                    self.cx.scan(n);
                    return Ok(false);
                }
                let nv = self.prepare_value(n, value)?;
                if self.update(n, preds[0], nv)? {
                    self.spare.val = None;
                    return Ok(false);
                }
                continue;
            }
            let (node, h) = self.prepare_node(key, value, &succs)?;
            self.cx.scan(preds[0]);
            self.cx.scan(succs[0]);
            if !self.cx.link0(node, next_at(preds[0], 0), succs[0], node) {
                continue;
            }
            self.spare.node = None;
            self.inner.count.fetch_add(1, Ordering::Relaxed);
            self.link_upper(key, node, h, &mut preds, &mut succs);
            return Ok(true);
        }
    }

    /// Rule 6: swaps the value of live node `n`; false when `n` got deleted.
    fn update(&mut self, n: u64, pred0: u64, nv: u64) -> Result<bool> {
        let r = self.cx.r;
        loop {
            let v = link::load_settled(r, val_at(n));
            if v & DEL != 0 {
                return Ok(false);
            }
            self.cx.scan(pred0);
            self.cx.scan(n);
            let t = self.th.prepare_free(PPtr::from_raw(ptr(v)))?;
            if self.cx.link0(n, val_at(n), v, nv) {
                if self.inner.cache.is_some() {
                    // The new link may be in the link cache, not yet durable:
                    // the old block stays until the handle's cached links are
                    // flushed (retired now, it could be freed, even reused,
                    // while the durable value link still points at it).
                    self.replaced.push(t);
                } else {
                    self.part.retire(self.guard, [t]);
                }
                return Ok(true);
            }
            self.th.heap().cancel_ticket(t);
        }
    }

    /// Rule 5, after the level-0 link: durability of that link, upper levels, and
    /// the handshake with a remover.
    fn link_upper(
        &mut self,
        key: &[u8],
        node: u64,
        h: usize,
        preds: &mut Levels,
        succs: &mut Levels,
    ) {
        let r = self.cx.r;
        if h > 1 {
            self.cx.scan(node);
        }
        'levels: for l in 1..h {
            loop {
                if self.cx.dead(node) {
                    break 'levels;
                }
                let na = next_at(node, l);
                let cur = self.cx.load(na);
                if cur & DEL != 0 {
                    break 'levels;
                }
                let succ = succs[l];
                if succ != 0 && cmp_key(r, succ, key) == Cmp::Equal {
                    // An older node with our key: deleted (ours is the key's live node
                    // at level 0). Linked in front of it, we would hide it from its
                    // remover's find(key), which stops at the first live node with the
                    // key; it would stay linked here after being retired and freed.
                    // Find again: that snips it at this level.
                    if self.cx.find(key, preds, succs) != Some(node) {
                        break 'levels;
                    }
                    continue;
                }
                if cur != succ {
                    if !r.cas(na, cur, succ) {
                        continue;
                    }
                    r.flush(na, 8);
                    r.fence();
                }
                if self.cx.cas_flush(next_at(preds[l], l), succ, node) {
                    // Level l must be durable before level l+1 can link the node: a
                    // crash must never keep a live node on a level without the one
                    // below (find descends through it and would follow its stale
                    // lower links).
                    if l + 1 < h {
                        r.fence();
                    }
                    break;
                }
                if self.cx.find(key, preds, succs) != Some(node) {
                    break 'levels;
                }
            }
        }
        let token = self.inner.token;
        let pad = r.atomic_u32(node + OFF_PAD);
        match pad.compare_exchange(token, 0, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => r.flush(node + OFF_PAD, 4),
            Err(x) if x == token | HANDOFF => {
                // A remover handed retirement to us: unlink every level we linked.
                self.cx.find(key, preds, succs);
                self.cx.fence_if_flushed();
                if let Some(ts) = self.inner.take_handoff(node) {
                    self.part.retire(self.guard, ts);
                }
            }
            Err(_) => {}
        }
    }

    /// Rule 7.
    fn remove(&mut self, key: &[u8]) -> Result<bool> {
        let r = self.cx.r;
        let mut preds = [0u64; MAX_LEVEL];
        let mut succs = [0u64; MAX_LEVEL];
        loop {
            let Some(n) = self.cx.find(key, &mut preds, &mut succs) else {
                self.cx.scan(preds[0]);
                self.cx.scan(succs[0]);
                return Ok(false);
            };
            let v = link::load_settled(r, val_at(n));
            if v & DEL != 0 {
                continue;
            }
            self.cx.scan(preds[0]);
            self.cx.scan(n);
            let tn = self.th.prepare_free(PPtr::from_raw(n))?;
            let tv = match self.th.prepare_free(PPtr::from_raw(ptr(v))) {
                Ok(t) => t,
                Err(e) => {
                    self.th.heap().cancel_ticket(tn);
                    return Err(e.into());
                }
            };
            if !self.cx.link0(n, val_at(n), v, v | DEL) {
                self.th.heap().cancel_ticket(tn);
                self.th.heap().cancel_ticket(tv);
                continue;
            }
            self.inner.count.fetch_sub(1, Ordering::Relaxed);
            self.cx.mark_all(n);
            let mut tickets = Some([tn, tv]);
            let token = self.inner.token;
            let pad = r.atomic_u32(n + OFF_PAD);
            if pad.load(Ordering::Acquire) == token {
                if let Some(ts) = tickets.take() {
                    self.inner
                        .handoff
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push((n, ts));
                }
                if pad
                    .compare_exchange(token, token | HANDOFF, Ordering::AcqRel, Ordering::Acquire)
                    .is_err()
                {
                    // The inserter finished first: its links precede our find.
                    tickets = self.inner.take_handoff(n);
                }
            }
            test_hook("remove_before_find", 0);
            self.cx.find(key, &mut preds, &mut succs);
            self.cx.fence_if_flushed();
            if let Some(ts) = tickets {
                self.part.retire(self.guard, ts);
            }
            return Ok(true);
        }
    }

    /// Rule 9.
    fn get(&mut self, key: &[u8], out: &mut Vec<u8>) -> bool {
        let r = self.cx.r;
        out.clear();
        let (pred, curr, found) = self.cx.search(key);
        if !found {
            self.cx.scan(pred);
            self.cx.scan(curr);
            return false;
        }
        let v = link::load_settled(r, val_at(curr));
        self.cx.scan(pred);
        self.cx.scan(curr);
        if v & DEL != 0 {
            return false;
        }
        blob::read_value(r, ptr(v), out);
        true
    }

    fn range(&mut self, start: &[u8], limit: usize, f: &mut dyn FnMut(&[u8], &[u8])) -> usize {
        let r = self.cx.r;
        let (pred, _, _) = self.cx.search(start);
        self.cx.scan(pred);
        let mut curr = ptr(self.cx.load_at(next_at(pred, 0), 0));
        let (mut kbuf, mut vbuf) = (Vec::new(), Vec::new());
        let mut n = 0;
        while curr != 0 && n < limit {
            let cn = self.cx.load_at(next_at(curr, 0), 0);
            if cn & DEL == 0 {
                let v = link::load_settled(r, val_at(curr));
                if v & DEL == 0 && cmp_key(r, curr, start) != Cmp::Less {
                    self.cx.scan(curr);
                    read_key(r, curr, &mut kbuf);
                    blob::read_value(r, ptr(v), &mut vbuf);
                    f(&kbuf, &vbuf);
                    n += 1;
                }
            }
            curr = ptr(cn);
        }
        n
    }
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

#[cfg(test)]
mod race_tests {
    //! A remover and an inserter of the same key, driven through one
    //! interleaving with hooks: the inserter's `find` sees the old node live at
    //! level 1 and pauses before level 0; the remover freezes and marks the old
    //! node and pauses before its last `find`; the inserter goes on (snips the
    //! old node at level 0, links its new node there and at level 1); the
    //! remover's `find` then ends. The old node must not stay linked at level 1
    //! behind the new one: its remover retires it, and once its block was
    //! reused a level could form a cycle (every `find` for a larger key looped
    //! forever).
    use super::*;
    use pmem::HeapOptions;
    use std::sync::mpsc::channel;
    use std::time::Duration;

    fn k(x: u64) -> [u8; 8] {
        x.to_be_bytes()
    }

    /// Level `l` from the head, at most `max` nodes.
    fn walk(list: &SkipList, l: usize, max: usize) -> Vec<u64> {
        let r = list.inner.heap.region();
        let mut out = Vec::new();
        let mut c = ptr(link::load(r, next_at(list.inner.head, l)));
        while c != 0 && out.len() < max {
            out.push(c);
            c = ptr(link::load(r, next_at(c, l)));
        }
        out
    }

    fn run(cache: bool) {
        let dir = tempfile::tempdir().unwrap();
        let heap = Heap::create(
            &dir.path().join("h"),
            &HeapOptions {
                size: 64 << 20,
                ..Default::default()
            },
        )
        .unwrap();
        let list = SkipList::create(
            &heap,
            &SkipOptions {
                link_cache: cache,
                ..Default::default()
            },
        )
        .unwrap();
        const K: u64 = 1000;
        FORCE_H.with(|c| c.set(2));
        let mut hb = list.handle().unwrap();
        assert!(hb.insert(&k(K), b"old").unwrap());
        let old = hb.locate(&k(K)).unwrap().0.raw();
        assert_eq!(walk(&list, 1, 10), vec![old]);

        let (paused_tx, paused_rx) = channel::<()>();
        let (resume_tx, resume_rx) = channel::<()>();
        let (done_tx, done_rx) = channel::<()>();
        let l2 = list.clone();
        let a = std::thread::spawn(move || {
            FORCE_H.with(|c| c.set(2));
            let mut ha = l2.handle().unwrap();
            let mut armed = true;
            HOOK.with(|h| {
                *h.borrow_mut() = Some(Box::new(move |at, l| {
                    if armed && at == "find_level" && l == 0 {
                        armed = false;
                        paused_tx.send(()).unwrap();
                        resume_rx.recv().unwrap();
                    }
                }))
            });
            let new = ha.insert(&k(K), b"new").unwrap();
            HOOK.with(|h| *h.borrow_mut() = None);
            done_tx.send(()).unwrap();
            new
        });
        paused_rx.recv().unwrap();
        let mut once = Some((resume_tx, done_rx));
        HOOK.with(|h| {
            *h.borrow_mut() = Some(Box::new(move |at, _| {
                if at == "remove_before_find" {
                    if let Some((rt, dr)) = once.take() {
                        rt.send(()).unwrap();
                        dr.recv().unwrap();
                    }
                }
            }))
        });
        assert!(hb.remove(&k(K)).unwrap());
        HOOK.with(|h| *h.borrow_mut() = None);
        assert!(a.join().unwrap(), "the insert found no live key");
        let new = hb.locate(&k(K)).unwrap().0.raw();
        assert_ne!(new, old);
        assert_eq!(
            walk(&list, 1, 10),
            vec![new],
            "the removed node is still linked"
        );
        assert_eq!(list.verify(true).unwrap().keys, 1);

        // The old node's block goes back to the allocator; new nodes below K
        // (height 2) may reuse it. A find for a key above K still ends.
        drop(hb);
        list.inner.domain.collect();
        let mut hc = list.handle().unwrap();
        for x in 0..200 {
            hc.insert(&k(x), b"x").unwrap();
        }
        drop(hc);
        let l3 = list.clone();
        let (tx, rx) = channel::<()>();
        std::thread::spawn(move || {
            let mut hd = l3.handle().unwrap();
            hd.insert(&k(2000), b"z").unwrap();
            tx.send(()).unwrap();
        });
        rx.recv_timeout(Duration::from_secs(20))
            .expect("an insert above K did not end");
        assert_eq!(list.verify(true).unwrap().keys, 202);
    }

    #[test]
    fn removed_node_not_hidden_behind_its_successor() {
        run(false);
    }

    #[test]
    fn removed_node_not_hidden_behind_its_successor_link_cache() {
        run(true);
    }
}

#[cfg(test)]
mod lc_retire_tests {
    //! Link cache on: an update CASes the value link through the cache (not yet
    //! durable). Its old value block must not be freed before that link is
    //! durable (it was retired at once: once the handle's tickets went to the
    //! epoch and a grace period passed, the block was free while the persisted
    //! image of the node's value link still pointed at it).
    use super::*;
    use crate::test_util::{images_linking, sim_opts as opts};
    use pmem::CrashSim;

    fn k(i: u32) -> Vec<u8> {
        format!("key{i:04}").into_bytes()
    }

    #[test]
    fn old_value_not_freed_before_new_value_link_is_durable() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("h");
        let sopts = SkipOptions::default();
        assert!(sopts.link_cache);
        {
            let heap = Heap::create(&path, &opts()).unwrap();
            let t = SkipList::create(&heap, &sopts).unwrap();
            heap.set_root(t.root()).unwrap();
            t.close().unwrap();
        }
        let sim = Arc::new(CrashSim::new(7, 0));
        let rec = Heap::open_sim(&path, &opts(), sim.clone()).unwrap();
        let root = rec.heap().root();
        let t = SkipList::attach(rec.heap(), root, &sopts).unwrap();
        let (heap, _) = crate::recover(rec, &[&t]).unwrap();
        let r = heap.region();
        let mut a = t.handle().unwrap();
        for i in 0..8 {
            assert!(a.insert(&k(i), &[1u8; 100]).unwrap());
        }
        a.sync().unwrap();
        let (n0, old) = a.locate(&k(0)).unwrap();
        let (n0, old) = (n0.raw(), old.raw());
        // The update of k0: its value link goes through the cache.
        a.put(&k(0), &[2u8; 100]).unwrap();
        assert_ne!(ptr(link::load(r, val_at(n0))), old);
        assert!(t.link_cache().unwrap().busy() > 0);
        let stale = || images_linking(&sim, r, val_at(n0), old);
        assert!(stale() > 0, "the new value link is durable already");
        // Whatever the handle retired goes to the epoch, and the grace period
        // passes (the handle is unpinned between operations).
        a.part.hand_over();
        for _ in 0..4 {
            t.inner.domain.collect();
        }
        assert!(stale() > 0, "the new value link became durable");
        assert!(
            heap.is_allocated(PPtr::from_raw(old)),
            "the old value block was freed while the persisted value link still linked it"
        );
        std::mem::forget(a);
    }
}
