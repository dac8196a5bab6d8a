//! Batches of writes ([`crate::Ops::apply_batch`]): a part's puts with two
//! fences for all of them, a large batch in parts (ordered by place under
//! `msync`).

use super::{
    so_regular, write_node_unflushed, HandleState, HashHandle, Inner, N_KEY, N_NEXT, N_VAL,
};
use crate::blob;
use crate::link::{self, ptr, DEL, DIRTY};
use crate::{check_kv, Error, Result};
use crossbeam_epoch::Guard;
use pmem::{FreeTicket, PPtr, Region};
use std::sync::atomic::Ordering;

impl HashHandle {
    pub(super) fn apply_batch_once(&mut self, items: &[(&[u8], Option<&[u8]>)]) -> Result<()> {
        for (k, v) in items {
            check_kv(k, *v)?;
        }
        let part = part_len(&self.t.inner.r().geometry());
        let t = self.t.clone();
        let inner = &*t.inner;
        let hashes: Vec<u64> = items.iter().map(|(k, _)| inner.hasher.hash(k)).collect();
        let sorted;
        let (items, hashes) = if items.len() > part && inner.r().strategy() == pmem::Strategy::Msync
        {
            sorted = self.by_place(items, &hashes);
            (&sorted.0[..], &sorted.1[..])
        } else {
            (items, &hashes[..])
        };
        if items.len() > part {
            // The missing buckets of the whole batch first: their rounds (two
            // fences each, one per level of uninitialised ancestors) are paid
            // once, not by every part (a batch of new keys into a sparse table
            // would make the same rounds in every part). A part finds its
            // buckets initialised, unless the table doubled since.
            let mut need: Vec<u64> = items
                .iter()
                .zip(hashes)
                .filter(|((_, v), _)| v.is_some())
                .map(|(_, &h)| inner.bucket_of(h))
                .filter(|&b| inner.slot(b) == 0)
                .collect();
            if !need.is_empty() {
                need.sort_unstable();
                need.dedup();
                self.run(|i, h, _| i.init_buckets(&mut h.st, &mut h.th, &need))?;
            }
        }
        for (items, hashes) in items.chunks(part).zip(hashes.chunks(part)) {
            self.run(|i, h, g| i.apply_batch(h, g, items, hashes))?;
            // Publish the key count after each part, so that the table grows
            // with a large batch (the automatic sync counts a part as one op).
            let d = std::mem::take(&mut self.h.count);
            self.t.inner.add_count(d);
        }
        Ok(())
    }
}

/// The writes of a batch's part (`HashHandle::apply_batch`). A part's free
/// tickets are all held until its second fence: parts stay well inside the
/// thread's active page table (an eighth of it). Under `msync` each part costs
/// its fences, so the larger the better: 1,024 with the default table.
fn part_len(geo: &pmem::Geometry) -> usize {
    (geo.apt_entries as usize / 8).clamp(4, 1024)
}

/// One write of a batch: key, and value (`None`: remove).
type Write<'a> = (&'a [u8], Option<&'a [u8]>);

/// A key with its hash under the table's [`KeyHasher`], as a map key: hashed
/// by that hash alone (no second pass over the key bytes; a keyed table's
/// hash cannot be steered by a client, so neither can this map), compared by
/// key.
#[derive(Clone, Copy)]
struct Hashed<'a> {
    h: u64,
    k: &'a [u8],
}

impl std::hash::Hash for Hashed<'_> {
    fn hash<H: std::hash::Hasher>(&self, s: &mut H) {
        s.write_u64(self.h);
    }
}

impl PartialEq for Hashed<'_> {
    fn eq(&self, o: &Self) -> bool {
        self.h == o.h && self.k == o.k
    }
}

impl Eq for Hashed<'_> {}

/// A map keyed by [`Hashed`] keys, mixing their hash with `foldhash`.
type HashedMap<'a, V> = std::collections::HashMap<Hashed<'a>, V, foldhash::fast::FixedState>;

impl HashHandle {
    /// `items` ordered by where each write lands (its node, or an absent key's
    /// predecessor), for a batch applied in parts under `msync`: each part's
    /// fences `msync` the pages it wrote, and in arrival order every part of
    /// a large batch touches nodes all over the table, so each node page is
    /// written out again by nearly every part. In node order a part's nodes
    /// share pages, and each part writes out fewer of them. Every occurrence
    /// of a key gets the place found for its first (the sort is stable), so
    /// writes of one key keep their order.
    /// `hashes` are the keys' hashes, and are returned in the new order.
    fn by_place<'a>(&mut self, items: &[Write<'a>], hashes: &[u64]) -> (Vec<Write<'a>>, Vec<u64>) {
        let inner = &*self.t.inner;
        let _g = self.h.part.pin();
        let mut place: HashedMap<u64> =
            HashedMap::with_capacity_and_hasher(items.len(), Default::default());
        let mut keyed: Vec<(u64, Write<'a>, u64)> = items
            .iter()
            .zip(hashes)
            .map(|(&(k, v), &h)| {
                let p = *place
                    .entry(Hashed { h, k })
                    .or_insert_with(|| inner.locate(k, h));
                (p, (k, v), h)
            })
            .collect();
        keyed.sort_by_key(|&(p, _, _)| p);
        keyed.into_iter().map(|(_, kv, h)| (kv, h)).unzip()
    }
}

/// A put of a batch's part, prepared in phase 1 of [`Inner::apply_batch`]:
/// its new blocks written (not yet flushed) and its link not yet made.
enum Prep {
    Swap {
        n: u64,
        prev: u64,
        old: u64,
        nb: u64,
        t: Option<FreeTicket>,
    },
    /// New nodes that go between the same two nodes, in list order
    /// (item, node, value block): each links to the next, the last to
    /// `curr`, and one CAS of `prev` links them all.
    Insert {
        run: Vec<(usize, u64, u64)>,
        prev: u64,
        curr: u64,
    },
}

/// Where a put of a batch's part goes, found before any block is allocated.
struct Place<'v> {
    i: usize,
    val: &'v [u8],
    prev: u64,
    curr: u64,
    /// The node's value link when the key is present.
    old: Option<u64>,
}

/// Which writes of `items` are of a key that occurs more than once.
fn repeated_keys(items: &[Write<'_>], hashes: &[u64]) -> Vec<bool> {
    let mut seen: HashedMap<u32> =
        HashedMap::with_capacity_and_hasher(items.len(), Default::default());
    for ((k, _), &h) in items.iter().zip(hashes) {
        *seen.entry(Hashed { h, k }).or_insert(0) += 1;
    }
    items
        .iter()
        .zip(hashes)
        .map(|((k, _), &h)| seen[&Hashed { h, k }] > 1)
        .collect()
}

/// New keys with the same place (two in one bucket of a sparse table, as
/// when a table fills) are one run each: linked one by one, all but the
/// first would fail their CAS and go alone, at two fences each.
fn merge_runs(r: &Region, preps: &mut [(usize, Prep)], items: &[Write<'_>], hashes: &[u64]) {
    let mut ins: Vec<(u64, u64, u64, &[u8], usize)> = Vec::new();
    for (k, (i, p)) in preps.iter().enumerate() {
        if let Prep::Insert { prev, curr, .. } = p {
            ins.push((*prev, *curr, so_regular(hashes[*i]), items[*i].0, k));
        }
    }
    ins.sort_unstable();
    let mut a = 0;
    while a < ins.len() {
        let mut b = a + 1;
        while b < ins.len() && (ins[b].0, ins[b].1) == (ins[a].0, ins[a].1) {
            b += 1;
        }
        if b - a > 1 {
            // In list order (split-order key, then key: as `cmp_node`); the
            // first's entry takes the run, the others' become empty. The
            // last node's `next` is the place's successor already.
            let mut run = Vec::with_capacity(b - a);
            for &(.., k) in &ins[a..b] {
                if let Prep::Insert { run: one, .. } = &mut preps[k].1 {
                    run.append(one);
                }
            }
            for w in run.windows(2) {
                r.write::<u64>(w[0].1 + N_NEXT, &w[1].1);
            }
            if let Prep::Insert { run: first, .. } = &mut preps[ins[a].4].1 {
                *first = run;
            }
        }
        a = b;
    }
}

impl Inner {
    /// A batch of writes with two fences for all its puts (see
    /// [`crate::Ops::apply_batch`] and the module note's persist order): phase
    /// 1 finds each put's place, reserves the blocks the places call for (under
    /// `msync` one fence covers all their words, `ThreadHeap::reserve`), and
    /// writes and flushes its new
    /// blocks (a value block for a key present, node and value block for a new
    /// key; new keys with the same place form one run in list order, each node
    /// linked to the next) and the free tickets of the values replaced;
    /// **fence**; phase 2 CASes each link to its new value (or run) marked DIRTY
    /// and flushes it; **fence**; the marks are cleared and the old values
    /// retired. A put whose link changed between the phases (another writer)
    /// gives its blocks back and is applied alone, as are removes and keys that
    /// occur more than once, after the rest and in batch order.
    pub(super) fn apply_batch(
        &self,
        h: &mut HandleState,
        g: &Guard,
        items: &[(&[u8], Option<&[u8]>)],
        hashes: &[u64],
    ) -> Result<()> {
        debug_assert_eq!(items.len(), hashes.len());
        let r = self.r();
        let repeated = repeated_keys(items, hashes);
        self.init_put_buckets(h, items, hashes, &repeated)?;
        let mut alone: Vec<usize> = Vec::new();
        // Phase 1.
        let places = self.find_places(h, items, hashes, &repeated, &mut alone)?;
        self.reserve_blocks(h, items, &places)?;
        let mut to_flush: Vec<(u64, usize)> = Vec::with_capacity(2 * items.len());
        let mut preps = self.prepare_blocks(h, items, hashes, places, &mut to_flush)?;
        merge_runs(r, &mut preps, items, hashes);
        // The blocks are flushed after all the batch's allocations (whose locked
        // instructions would each wait for the flushes issued before them).
        for (a, len) in to_flush.drain(..) {
            r.flush(a, len);
        }
        if !preps.is_empty() {
            // The new blocks and the tickets are durable before any link to them.
            r.fence();
        }
        // Phase 2. An error does not stop it: the links made are fenced and their
        // old values retired before the error is returned.
        let mut first_err: Option<Error> = None;
        let (linked, retire) = self.link_prepared(h, preps, &mut alone, &mut first_err);
        self.persist_links(h, g, linked, retire);
        if let Some(e) = first_err {
            return Err(e);
        }
        self.apply_alone(h, g, items, alone)
    }

    /// Initialises the missing buckets of the batch's puts that are applied
    /// with the rest (not alone).
    fn init_put_buckets(
        &self,
        h: &mut HandleState,
        items: &[Write<'_>],
        hashes: &[u64],
        repeated: &[bool],
    ) -> Result<()> {
        let mut need: Vec<u64> = items
            .iter()
            .zip(hashes)
            .zip(repeated)
            .filter(|(((_, v), _), &rep)| v.is_some() && !rep)
            .map(|((_, &h), _)| self.bucket_of(h))
            .filter(|&b| self.slot(b) == 0)
            .collect();
        if !need.is_empty() {
            need.sort_unstable();
            need.dedup();
            self.init_buckets(&mut h.st, &mut h.th, &need)?;
        }
        Ok(())
    }

    /// Phase 1's walks: the place of each put applied with the rest; the
    /// others (removes, repeated keys, keys being removed) go to `alone`.
    ///
    /// Each put's walk from its bucket is a chain of dependent cache
    /// misses (slot, dummy, first node): fetched ahead, one stage per
    /// distance, so that the misses of several puts overlap. The places are
    /// found first, so that the blocks to allocate are known (`reserve`).
    fn find_places<'v>(
        &self,
        h: &mut HandleState,
        items: &[Write<'v>],
        hashes: &[u64],
        repeated: &[bool],
        alone: &mut Vec<usize>,
    ) -> Result<Vec<Place<'v>>> {
        let r = self.r();
        let mut places: Vec<Place> = Vec::with_capacity(items.len());
        for (i, (key, val)) in items.iter().enumerate() {
            self.prefetch_walk(hashes, i);
            let Some(val) = val.filter(|_| !repeated[i]) else {
                alone.push(i);
                continue;
            };
            let hash = hashes[i];
            let start = self.bucket(&mut h.st, &mut h.th, self.bucket_of(hash))?;
            let (prev, curr, found) = self.find(&mut h.st, start, so_regular(hash), key);
            let old = if found {
                let v = link::load_settled(r, curr + N_VAL);
                if v & DEL != 0 {
                    alone.push(i);
                    continue;
                }
                Some(v)
            } else {
                None
            };
            places.push(Place {
                i,
                val,
                prev,
                curr,
                old,
            });
        }
        Ok(places)
    }

    /// Reserves the blocks the places call for (`ThreadHeap::reserve`): a
    /// value block each, and a node for each absent key.
    fn reserve_blocks(
        &self,
        h: &mut HandleState,
        items: &[Write<'_>],
        places: &[Place<'_>],
    ) -> Result<()> {
        // Lazily: read only under msync (`reserve` does nothing under the
        // others).
        let sizes = places.iter().flat_map(|p| {
            let key = items[p.i].0;
            let vsize = blob::HDR + p.val.len() as u64;
            let node = p.old.is_none().then_some((N_KEY + key.len() as u64, 1));
            std::iter::once((vsize, 1)).chain(node)
        });
        h.th.reserve(sizes)?;
        Ok(())
    }

    /// Phase 1's blocks: for each place, allocates and writes (unflushed) a
    /// new value block and the old value's free ticket (a key present), or a
    /// node and its value block (a new key); what to flush goes to
    /// `to_flush`. On an error, what was prepared is given back.
    fn prepare_blocks(
        &self,
        h: &mut HandleState,
        items: &[Write<'_>],
        hashes: &[u64],
        places: Vec<Place<'_>>,
        to_flush: &mut Vec<(u64, usize)>,
    ) -> Result<Vec<(usize, Prep)>> {
        let r = self.r();
        let mut preps: Vec<(usize, Prep)> = Vec::with_capacity(items.len());
        for Place {
            i,
            val,
            prev,
            curr,
            old,
        } in places
        {
            let key = items[i].0;
            let so = so_regular(hashes[i]);
            let prepared = (|| -> Result<Prep> {
                if let Some(v) = old {
                    let nb = blob::alloc_value_unflushed(&mut h.th, curr, val)?.offset();
                    to_flush.push((nb, blob::HDR as usize + val.len()));
                    let t = match h.th.prepare_free_unfenced(PPtr::from_raw(ptr(v))) {
                        Ok(t) => t,
                        Err(e) => {
                            let _ = h.th.free(PPtr::from_raw(nb));
                            return Err(e.into());
                        }
                    };
                    return Ok(Prep::Swap {
                        n: curr,
                        prev,
                        old: v,
                        nb,
                        t: Some(t),
                    });
                }
                let node = h.th.alloc(N_KEY + key.len() as u64)?.offset();
                let vb = match blob::alloc_value_unflushed(&mut h.th, node, val) {
                    Ok(b) => b.offset(),
                    Err(e) => {
                        let _ = h.th.free(PPtr::from_raw(node));
                        return Err(e);
                    }
                };
                write_node_unflushed(r, node, key, so, vb, curr);
                to_flush.push((vb, blob::HDR as usize + val.len()));
                to_flush.push((node, N_KEY as usize + key.len()));
                Ok(Prep::Insert {
                    run: vec![(i, node, vb)],
                    prev,
                    curr,
                })
            })();
            match prepared {
                Ok(p) => preps.push((i, p)),
                Err(e) => {
                    self.give_back(h, &mut preps);
                    return Err(e);
                }
            }
        }
        Ok(preps)
    }

    /// Frees the blocks of `preps` and cancels their tickets (phase 1 failed).
    fn give_back(&self, h: &mut HandleState, preps: &mut Vec<(usize, Prep)>) {
        for (_, p) in preps.drain(..) {
            match p {
                Prep::Swap { nb, t, .. } => {
                    if let Some(t) = t {
                        self.heap.cancel_ticket(t);
                    }
                    let _ = h.th.free(PPtr::from_raw(nb));
                }
                Prep::Insert { run, .. } => {
                    for (_, node, vb) in run {
                        let _ = h.th.free(PPtr::from_raw(vb));
                        let _ = h.th.free(PPtr::from_raw(node));
                    }
                }
            }
        }
    }

    /// Phase 2's CASes: each prepared link to its new value (or run) marked
    /// DIRTY. Returns the links made (address, new target) and the tickets of
    /// the values they replaced; a put whose link changed since phase 1 gives
    /// its blocks back and goes to `alone`. An error is kept in `first_err`
    /// and does not stop the rest.
    fn link_prepared(
        &self,
        h: &mut HandleState,
        preps: Vec<(usize, Prep)>,
        alone: &mut Vec<usize>,
        first_err: &mut Option<Error>,
    ) -> (Vec<(u64, u64)>, Vec<FreeTicket>) {
        let r = self.r();
        let mut linked: Vec<(u64, u64)> = Vec::with_capacity(preps.len());
        let mut retire: Vec<FreeTicket> = Vec::with_capacity(preps.len());
        for (i, p) in preps {
            match p {
                Prep::Swap {
                    n,
                    prev,
                    old,
                    nb,
                    t,
                } => {
                    self.scan(prev);
                    self.scan(n);
                    if r.atomic_u64(n + N_VAL)
                        .compare_exchange(old, nb | DIRTY, Ordering::AcqRel, Ordering::Acquire)
                        .is_ok()
                    {
                        linked.push((n + N_VAL, nb));
                        retire.extend(t);
                    } else {
                        if let Some(t) = t {
                            self.heap.cancel_ticket(t);
                        }
                        if let Err(e) = h.th.free(PPtr::from_raw(nb)) {
                            first_err.get_or_insert(e.into());
                        }
                        alone.push(i);
                    }
                }
                Prep::Insert { run, prev, curr } => {
                    if run.is_empty() {
                        continue; // merged into another run
                    }
                    let node = run[0].1;
                    self.scan(prev);
                    if r.atomic_u64(prev + N_NEXT)
                        .compare_exchange(curr, node | DIRTY, Ordering::AcqRel, Ordering::Acquire)
                        .is_ok()
                    {
                        linked.push((prev + N_NEXT, node));
                        h.count += run.len() as i64;
                    } else {
                        for (i, node, vb) in run {
                            for b in [vb, node] {
                                if let Err(e) = h.th.free(PPtr::from_raw(b)) {
                                    first_err.get_or_insert(e.into());
                                }
                            }
                            alone.push(i);
                        }
                    }
                }
            }
        }
        (linked, retire)
    }

    /// Phase 2's end: flushes the links made, **fence**, clears their DIRTY
    /// marks and retires the values they replaced.
    fn persist_links(
        &self,
        h: &mut HandleState,
        g: &Guard,
        linked: Vec<(u64, u64)>,
        retire: Vec<FreeTicket>,
    ) {
        let r = self.r();
        if !linked.is_empty() {
            // Flushed after all the CASes, for the reason of phase 1's flushes.
            for &(a, _) in &linked {
                r.flush(a, 8);
            }
            r.fence();
            for (a, v) in linked {
                // A failure: a reader settled it first, or it changed since.
                let _ = r.atomic_u64(a).compare_exchange(
                    v | DIRTY,
                    v,
                    Ordering::AcqRel,
                    Ordering::Acquire,
                );
            }
            h.part.retire(g, retire);
        }
    }

    /// The writes not applied with the rest, one at a time, in batch order.
    fn apply_alone(
        &self,
        h: &mut HandleState,
        g: &Guard,
        items: &[Write<'_>],
        mut alone: Vec<usize>,
    ) -> Result<()> {
        alone.sort_unstable();
        for i in alone {
            let (key, val) = items[i];
            match val {
                Some(v) => {
                    self.upsert(h, g, key, v, true)?;
                }
                None => {
                    self.remove(h, g, key)?;
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    //! Under `msync` a large batch is applied in node order (`by_place`), not
    //! in arrival order; writes of one key keep their order.
    use super::super::{HashOptions, LfHash};
    use super::*;
    use crate::{Index, Ops};
    use pmem::{Geometry, Heap, HeapOptions, Strategy};

    #[test]
    fn a_batch_in_node_order_keeps_each_keys_last_write() {
        let dir = tempfile::tempdir().unwrap();
        let opts = HeapOptions {
            size: 16 << 20,
            max_size: 16 << 20,
            reserve: 16 << 20,
            geometry: Geometry::small(),
            strategy: Strategy::Msync,
            ..Default::default()
        };
        let heap = Heap::create(&dir.path().join("h"), &opts).unwrap();
        let t = LfHash::create(&heap, &HashOptions::default()).unwrap();
        let mut h = t.handle().unwrap();
        let key = |i: usize| format!("key-{i:05}").into_bytes();
        let n = 600;
        for i in (0..n).step_by(2) {
            h.put(&key(i), b"old").unwrap();
        }
        // Each key written three times in one batch, interleaved with the
        // others' writes: put, remove, put (even keys present before, odd
        // keys absent); every third key ends removed.
        let vals: Vec<Vec<u8>> = (0..n).map(|i| format!("v{i}").into_bytes()).collect();
        let mut items: Vec<(&[u8], Option<&[u8]>)> = Vec::new();
        let keys: Vec<Vec<u8>> = (0..n).map(key).collect();
        for round in 0..3 {
            for i in (0..n).rev() {
                let v: Option<&[u8]> = match (round, i % 3) {
                    (1, _) => None,
                    (2, 0) => None,
                    _ => Some(&vals[i]),
                };
                items.push((&keys[i], v));
            }
        }
        let part = part_len(&heap.region().geometry());
        assert!(items.len() > part, "the batch is applied in parts");
        h.apply_batch(&items).unwrap();
        let mut out = Vec::new();
        for i in 0..n {
            let found = h.get(&keys[i], &mut out).unwrap();
            if i % 3 == 0 {
                assert!(!found, "key {i} ends removed");
            } else {
                assert!(found, "key {i}");
                assert_eq!(out, vals[i], "key {i}");
            }
        }
    }
}
