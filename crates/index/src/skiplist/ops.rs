//! The algorithm: the per-operation context [`Cx`] (loads through the link cache,
//! link-and-persist CASes, `find` and the read-only `search`) and one update or
//! read of a handle, [`Op`] (insert, update, remove with its hand-off, get, range).

#[cfg(test)]
use super::FORCE_H;
use super::{cmp_key, height_of, next_at, node_size, read_key, test_hook, val_at, Inner, Levels};
use super::{HANDOFF, MAX_LEVEL, NODE_HDR, NODE_TAG, OFF_KLEN, OFF_PAD};
use crate::blob;
use crate::lcache::{Added, LinkCache};
use crate::link::{self, ptr, LinkMem, DEL};
use crate::reclaim::Participant;
use crate::Result;
use crossbeam_epoch::Guard;
use pmem::{FreeTicket, PPtr, Region, ThreadHeap};
use rand::rngs::SmallRng;
use rand::RngExt;
use std::cmp::Ordering as Cmp;
use std::sync::atomic::Ordering;

/// Per-operation context: the region, the cache, whether a link was flushed without
/// a fence (rule 4) and the cache buckets used.
pub(super) struct Cx<'a> {
    pub(super) r: &'a Region,
    head: u64,
    cache: Option<&'a LinkCache>,
    flushed: bool,
    pub(super) mask: u64,
}

impl<'a> Cx<'a> {
    pub(super) fn new(inner: &'a Inner, with_cache: bool) -> Self {
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
    pub(super) fn cas_flush(&mut self, a: u64, old: u64, new: u64) -> bool {
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

    pub(super) fn fence_if_flushed(&mut self) {
        if self.flushed {
            self.r.fence();
            self.flushed = false;
        }
    }

    /// Rule 8: fills `preds`/`succs` at every level, snipping deleted nodes on the
    /// way; returns the live node with `key` if level 0 has one.
    pub(super) fn find(
        &mut self,
        key: &[u8],
        preds: &mut Levels,
        succs: &mut Levels,
    ) -> Option<u64> {
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
    pub(super) fn search(&self, key: &[u8]) -> (u64, u64, bool) {
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
    pub(super) fn mark_all(&mut self, n: u64) {
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
pub(super) struct Spare {
    /// (node, its value block, height)
    node: Option<(u64, u64, usize)>,
    /// (owner, value block) for an update
    val: Option<(u64, u64)>,
}

impl Spare {
    pub(super) fn release(&mut self, th: &mut ThreadHeap) {
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
pub(super) struct Op<'a> {
    pub(super) inner: &'a Inner,
    pub(super) cx: Cx<'a>,
    pub(super) th: &'a mut ThreadHeap,
    pub(super) part: &'a mut Participant,
    pub(super) guard: &'a Guard,
    pub(super) rng: &'a mut SmallRng,
    pub(super) spare: Spare,
    /// The handle's `replaced`.
    pub(super) replaced: &'a mut Vec<FreeTicket>,
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
    pub(super) fn put(&mut self, key: &[u8], value: &[u8], replace: bool) -> Result<bool> {
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
    pub(super) fn remove(&mut self, key: &[u8]) -> Result<bool> {
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
    pub(super) fn get(&mut self, key: &[u8], out: &mut Vec<u8>) -> bool {
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

    pub(super) fn range(
        &mut self,
        start: &[u8],
        limit: usize,
        f: &mut dyn FnMut(&[u8], &[u8]),
    ) -> usize {
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
