//! The gleaner: applies log records to the backend in batches (§2.3, §4.4).

use super::{fold, heap_full, Shared, GLOCKS};
use crate::crl::{Header, Pool, RecPtr, OPC_PAD};
use crate::{idempotent_opcode, lentry, value, Error, Result};
use index::any::AnyHandle;
use index::{Index, Ops};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Records a glean batch applies at most.
const BATCH: usize = 256;
/// The same with the msync strategy, where each of a batch's fences is an
/// `msync` of scattered pages (a device flush): larger batches, fewer of them.
/// A batch writes every backend page it touches once, so the larger the batch
/// the fewer page writes per record.
/// For background gleaners (role threads, the advancer).
const BATCH_MSYNC: usize = 16384;
/// A worker that must glean between requests (every log full) keeps its
/// batches short: its clients wait for each one.
const BATCH_MSYNC_INLINE: usize = 2048;

/// The backend-side worker: applies log records (one per session, per static
/// gleaner thread, and one in the advancer).
pub(super) struct Gleaner {
    pub(super) h: AnyHandle,
    pub(super) slot: usize,
    log: Option<usize>,
    bval: Vec<u8>,
    chain: Vec<(RecPtr, Header)>,
    walks: Vec<Walk>,
    cpay: Vec<u8>,
    from: usize,
    /// Records applied in this batch whose flags wait for the batch's backend sync.
    pending: Vec<RecPtr>,
    /// The same records, looked up for every record a walk or the scan meets:
    /// with a fast hasher (foldhash, seeded per process), as the lookup is on
    /// the drain's hot path.
    pending_set: foldhash::HashSet<u64>,
    /// Gleaner locks held until the batch ends (and which, as a bitmap).
    held: Vec<usize>,
    held_bits: Vec<u64>,
    /// Chains applied in this batch. Their `lentry` is released at the end of
    /// the batch.
    releases: Vec<Release>,
    /// The batch's backend writes found no room for some keys (a full heap)
    /// and it applied no other chain: `glean_batch` returns this error.
    full: Option<Error>,
    /// The batch's backend writes (key → stamp and value, `None` = remove), applied
    /// together at the end of the batch ([`index::Ops::apply_batch`]: two fences
    /// for the batch instead of one or more per write) and read back by the
    /// batch's later chains of the same key.
    writes: std::collections::HashMap<Vec<u8>, (u64, Option<Vec<u8>>)>,
    /// Gleans between other work (a session, `drain`, the advancer's idle
    /// gleaning): gives its log back after every batch, and with msync takes
    /// the smaller batches.
    pub(super) inline: bool,
    /// When a batch ends before its size: see [`Cut`].
    pub(super) cut: Cut,
}

/// A chain applied in a batch: key hash, key, newest record, whether the key
/// is now removed, and where its records are in the batch's `pending`.
struct Release {
    hash: u64,
    key: Vec<u8>,
    newest: u64,
    removed: bool,
    pending: std::ops::Range<usize>,
}

/// When a gleaner's batch ends early (checked before each group of chains; the
/// records gathered so far are applied and synced as a whole batch). With
/// `msync` a background batch is thousands of records and takes a large part
/// of a second; the foreground should not wait for all of it.
#[derive(Clone, Copy)]
pub(super) enum Cut {
    /// Only at the batch's size or the log's durable end.
    Never,
    /// A role thread's batch: once the advancer wants fewer gleaners than
    /// there are (the role is given back after the batch).
    RoleWanted,
    /// The advancer's idle gleaning: once requests were served since (the
    /// operation counter moved from this value).
    Requests(u64),
}

impl Cut {
    fn now(self, sh: &Shared) -> bool {
        match self {
            Cut::Never => false,
            Cut::RoleWanted => {
                sh.gleaners.load(Ordering::Acquire) > sh.target.load(Ordering::Acquire)
            }
            Cut::Requests(ops) => sh.c.ops.load(Ordering::Relaxed) != ops,
        }
    }
}

enum Glean {
    Applied,
    Skipped,
}

/// Chains walked in step by a gleaner (see `glean_inner`).
const WALK_GROUP: usize = 16;

/// One chain walk: from the key's `lentry` back through `prev` to the first
/// applied record (Bullet §2.3), for the scanned record `p`.
#[derive(Default)]
struct Walk {
    p: RecPtr,
    hash: u64,
    key: Vec<u8>,
    /// The next record to read; null once the walk is over.
    cur: RecPtr,
    /// Whether the key had a chain to walk (its entry and `lentry` were there).
    started: bool,
    /// The version of the record taken last (a chain's versions decrease).
    last: u64,
    /// The records taken, newest first.
    chain: Vec<(RecPtr, Header)>,
}

/// Reads the walk's next record: takes it into the chain, or ends the walk at an
/// applied record (flagged, or pending in this batch), a reclaimed one, or the
/// chain's end. Under group commit the chain's newest records may not be durable
/// yet; they are passed over and left to a later batch: applied now, their
/// effect would be durable in the backend (and their older records flagged)
/// while a crash could still lose them from the log, and recovery would replay an
/// older value into the frontend than the backend holds. A record is durable only
/// after its `prev`, so the durable records of a chain are its older part.
fn walk_step(pool: &Pool, pending: &foldhash::HashSet<u64>, w: &mut Walk) -> Result<()> {
    let cur = w.cur;
    if cur.log() >= pool.logs.len() {
        return Err(Error::Corrupt(format!("record pointer {:#x}", cur.0)));
    }
    if pool.reclaimed(cur) {
        w.cur = RecPtr(0);
        return Ok(());
    }
    let h = pool.header(cur)?;
    if h.applied || h.opcode == OPC_PAD || pending.contains(&cur.0) {
        w.cur = RecPtr(0);
        return Ok(());
    }
    if h.version >= w.last {
        return Err(Error::Corrupt(format!(
            "log chain out of version order at {:#x}",
            cur.0
        )));
    }
    w.last = h.version;
    if !w.chain.is_empty() || pool.is_durable(cur, h.len as u64) {
        if w.chain.is_empty() {
            // The chain's newest record: its payload is read when the chain
            // is folded (put collapsing reads no older one). Its first lines
            // only: a large value is read in order anyway.
            pool.prefetch(cur, (cur.pos() % 64 + h.len as u64).div_ceil(64).min(8));
        }
        w.chain.push((cur, h));
    }
    w.cur = h.prev;
    pool.prefetch_header(w.cur);
    Ok(())
}

impl Gleaner {
    pub(super) fn new(sh: &Arc<Shared>) -> Result<Gleaner> {
        let slot = sh.claim_slot()?;
        Ok(Gleaner {
            h: sh.backend.handle()?,
            slot,
            log: None,
            bval: Vec::new(),
            chain: Vec::new(),
            walks: Vec::new(),
            cpay: Vec::new(),
            from: slot,
            pending: Vec::new(),
            pending_set: Default::default(),
            held: Vec::new(),
            held_bits: vec![0; GLOCKS / 64],
            releases: Vec::new(),
            full: None,
            writes: Default::default(),
            inline: true,
            cut: Cut::Never,
        })
    }

    pub(super) fn release(&mut self, sh: &Shared) {
        if let Some(i) = self.log.take() {
            sh.pool.logs[i].gleaner.store(false, Ordering::Release);
        }
    }

    /// Applies up to a batch of records from one log. True when it applied any.
    pub(super) fn glean_batch(&mut self, sh: &Shared) -> Result<bool> {
        sh.enter(self.slot);
        let mut r = self.glean_inner(sh);
        // The batch's reads of the logs are over: its values are folded into
        // `writes`, and the records it flags at the end are unflagged until then,
        // so no head passes them. Leaving the epoch here lets `advance` free
        // other space to writers while the backend sync runs (under `msync` a
        // large part of a second, and seconds for a backend's first batches).
        // `end_batch` enters again to set the flags (see there).
        sh.exit(self.slot);
        if let Err(e) = self.end_batch(sh) {
            r = Err(e);
        }
        if let Some(e) = self.full.take() {
            // Nothing but chains the heap has no room for: the caller backs
            // off (a writer waiting for log space gets the error).
            if r.is_ok() {
                r = Err(e);
            }
        }
        if r.is_err() || self.inline {
            // A session gleans between requests; it must not keep a log from the
            // other gleaners (and from `drain`) while it serves or idles.
            self.release(sh);
        }
        r
    }

    /// Ends a batch, in this order: the backend updates are made durable (one sync
    /// for the batch); the records are flagged and the flags fenced; each applied
    /// chain's `lentry` is released (so `lentry` = 0 always means every record of
    /// the key is durably flagged, and a record appended later never gets a `prev`
    /// of 0 while an older one still lacks its flag); tombstones whose remove is in
    /// the backend are reaped; and only then are the keys' gleaner locks given
    /// back, so that no other gleaner re-applies a chain whose flags are not set.
    fn end_batch(&mut self, sh: &Shared) -> Result<()> {
        let mut r = Ok(());
        if !self.pending.is_empty() {
            let flushed = self
                .flush_writes()
                .and_then(|f| self.h.sync().map(|()| f).map_err(Error::from));
            match flushed {
                Ok((failed, err)) => {
                    if !failed.is_empty() {
                        self.drop_failed(sh, &failed);
                    }
                    sh.note_applied(
                        self.releases.iter().map(|r| r.key.as_slice()),
                        &failed,
                        err.as_ref(),
                    );
                    if !failed.is_empty() && self.releases.is_empty() {
                        self.full = err;
                    }
                    // The flags are set and fenced inside the epoch. A head
                    // advance that sees some of them set moves past those
                    // records, but frees their space, and makes the new head
                    // durable, only once this batch has left: after its fence.
                    // Otherwise a crash could find a head durably past one
                    // record of a chain while an older record of that chain,
                    // in another log, has no durable flag. Recovery would then
                    // find that record unflagged, with the backend already past
                    // it and no chain that reaches it: never applied, never
                    // flagged, it would hold its log's head for good.
                    if !self.pending.is_empty() {
                        sh.c.applied
                            .fetch_add(self.pending.len() as u64, Ordering::Relaxed);
                        sh.enter(self.slot);
                        sh.pool.mark_applied_all(&self.pending);
                        self.pending.clear();
                        sh.pool.fence();
                        sh.exit(self.slot);
                    }
                    for Release {
                        hash,
                        key,
                        newest,
                        removed,
                        ..
                    } in self.releases.drain(..)
                    {
                        // Under the bucket lock: the node found is the current one
                        // even while the table doubles (a swap on a copy the
                        // doubling left behind would be lost).
                        let mut l = sh.table.lock(hash);
                        let Some(n) = l.find(&key) else {
                            continue;
                        };
                        if lentry::release(&n.meta().lentry, newest)
                            && removed
                            && !sh.reap_locked(&mut l, &key)
                        {
                            drop(l);
                            sh.deferred
                                .lock()
                                .unwrap_or_else(|e| e.into_inner())
                                .push((hash, key));
                        }
                    }
                }
                Err(e) => r = Err(e),
            }
        }
        // Nothing is flagged on an error: the records are applied again later (the
        // stamps make that harmless).
        self.writes.clear();
        self.pending.clear();
        self.pending_set.clear();
        self.releases.clear();
        for i in self.held.drain(..) {
            sh.glocks[i].store(false, Ordering::Release);
            self.held_bits[i / 64] &= !(1 << (i % 64));
        }
        r
    }

    fn glean_inner(&mut self, sh: &Shared) -> Result<bool> {
        let i = match self.log {
            Some(i) => i,
            None => match sh.claim_glean_log(self.from) {
                Some(i) => {
                    self.from = i + 1;
                    self.log = Some(i);
                    i
                }
                None => return Ok(false),
            },
        };
        let l = &sh.pool.logs[i];
        // Only durable records (group commit: `durable` may lag the tail).
        let tail = l
            .tail
            .load(Ordering::Acquire)
            .min(l.durable.load(Ordering::Acquire));
        let mut pos = l
            .scan
            .load(Ordering::Relaxed)
            .max(l.head.load(Ordering::SeqCst));
        let mut skipped: Option<u64> = None;
        let mut did = 0;
        let mut seen = 0;
        let batch = match (sh.pool.heap.region().strategy(), self.inline) {
            (pmem::Strategy::Msync, false) => BATCH_MSYNC,
            (pmem::Strategy::Msync, true) => BATCH_MSYNC_INLINE,
            _ => BATCH,
        };
        // The walks of a group, kept across batches for their buffers.
        let mut walks = std::mem::take(&mut self.walks);
        let r = (|| -> Result<()> {
            loop {
                // 1. Gather the next unapplied records of distinct keys (the log
                //    is read in order: fetch a few records ahead).
                let mut n = 0;
                let mut end = false;
                if self.cut.now(sh) {
                    break;
                }
                while n < WALK_GROUP {
                    pos = sh.pool.skip_gap(pos).min(tail);
                    if pos >= tail || did + n >= batch || seen >= 8 * batch {
                        end = true;
                        break;
                    }
                    let p = RecPtr::new(i, pos);
                    sh.pool.prefetch(RecPtr::new(i, pos + 512), 2);
                    let h = sh.pool.header(p)?;
                    if h.opcode != OPC_PAD && !h.applied && !self.pending_set.contains(&p.0) {
                        if walks.len() == n {
                            walks.push(Walk::default());
                        }
                        let (group, rest) = walks.split_at_mut(n);
                        let w = &mut rest[0];
                        // Only the key: the chain's payloads are read when folded.
                        sh.pool.key(p, &h, &mut w.key);
                        w.hash = sh.hasher.hash(&w.key);
                        if group.iter().any(|o| o.hash == w.hash && o.key == w.key) {
                            // The same key twice: this record waits for the
                            // group's chains to be applied (it is then pending).
                            break;
                        }
                        walks[n].p = p;
                        n += 1;
                    }
                    seen += 1;
                    pos += h.len as u64;
                }
                if n == 0 {
                    break;
                }
                // 2. Each key's gleaner lock and chain start; the frontend
                //    buckets are fetched for the whole group first.
                let g = crossbeam_epoch::pin();
                let mut hashes = [0u64; WALK_GROUP];
                for (h, w) in hashes.iter_mut().zip(&walks[..n]) {
                    *h = w.hash;
                }
                sh.table.prefetch(&hashes[..n], &g);
                for w in &mut walks[..n] {
                    w.chain.clear();
                    w.last = u64::MAX;
                    w.cur = if self.lock_key(sh, w.hash) {
                        // No entry, or `lentry` = 0: the record is applied and its
                        // flag is on the way (another gleaner's batch), or the
                        // entry is a copy a table doubling left behind: the record
                        // is tried again later.
                        sh.table.get(w.hash, &w.key, &g).map_or(RecPtr(0), |node| {
                            RecPtr(lentry::chain_start(&node.meta().lentry))
                        })
                    } else {
                        RecPtr(0)
                    };
                    w.started = !w.cur.is_null();
                    sh.pool.prefetch_header(w.cur);
                }
                drop(g);
                // 3. The chains, walked in step: each step reads one record of
                //    every chain, whose header was fetched the step before, so
                //    the group's cache misses overlap instead of queueing.
                let mut active = n;
                while active > 0 {
                    active = 0;
                    for w in &mut walks[..n] {
                        if !w.cur.is_null() {
                            walk_step(&sh.pool, &self.pending_set, w)?;
                            active += usize::from(!w.cur.is_null());
                        }
                    }
                }
                // 4. Apply the chains in the log's order.
                for w in &mut walks[..n] {
                    let r = if w.started {
                        std::mem::swap(&mut self.chain, &mut w.chain);
                        self.apply_chain(sh, w.p, w.hash, &w.key)?
                    } else {
                        Glean::Skipped
                    };
                    match r {
                        Glean::Applied => did += 1,
                        Glean::Skipped => {
                            let at = w.p.pos();
                            skipped = Some(skipped.map_or(at, |s| s.min(at)));
                        }
                    }
                }
                if end {
                    break;
                }
            }
            Ok(())
        })();
        self.walks = walks;
        r?;
        l.scan.store(skipped.unwrap_or(pos), Ordering::Relaxed);
        if did == 0 && skipped.is_none() && pos >= tail {
            self.release(sh);
        }
        Ok(did > 0)
    }

    /// Takes the gleaner lock of the key with `hash` for the rest of the batch
    /// (held already, or free). False when another gleaner holds it.
    fn lock_key(&mut self, sh: &Shared, hash: u64) -> bool {
        let i = (hash as usize) & (GLOCKS - 1);
        if self.held_bits[i / 64] & (1 << (i % 64)) == 0 {
            if sh.glocks[i]
                .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
                .is_err()
            {
                return false;
            }
            self.held_bits[i / 64] |= 1 << (i % 64);
            self.held.push(i);
        }
        true
    }

    /// Applies the chain a walk found (in `self.chain`, newest first) for the
    /// scanned record `p`: Applied when `p` is now applied or pending.
    fn apply_chain(&mut self, sh: &Shared, p: RecPtr, hash: u64, key: &[u8]) -> Result<Glean> {
        if self.chain.is_empty() {
            return Ok(
                if self.pending_set.contains(&p.0) || sh.pool.header(p)?.applied {
                    Glean::Applied
                } else {
                    Glean::Skipped
                },
            );
        }
        self.chain.reverse();
        let newest = self.chain.last().expect("non-empty").0;
        let mut removed = false;
        if sh.opts.variant.collapse() {
            removed = self.apply_collapsed(sh, key)?;
        } else {
            for k in 0..self.chain.len() {
                removed = self.apply_one(sh, k, key)?;
            }
        }
        let from = self.pending.len();
        for (r, _) in &self.chain {
            self.pending.push(*r);
            self.pending_set.insert(r.0);
        }
        let mut in_chain = self.chain.iter().any(|(r, _)| *r == p);
        self.releases.push(Release {
            hash,
            key: key.to_vec(),
            newest: newest.0,
            removed,
            pending: from..self.pending.len(),
        });
        if !in_chain {
            in_chain = self.pending_set.contains(&p.0) || sh.pool.header(p)?.applied;
        }
        Ok(if in_chain {
            Glean::Applied
        } else {
            Glean::Skipped
        })
    }

    /// Reads record `k` of the chain's payload into `self.cpay`.
    fn load_payload(&mut self, sh: &Shared, k: usize) {
        let (r, h) = self.chain[k];
        sh.pool.payload(r, &h, &mut self.cpay);
    }

    /// Applies the batch's backend writes (see `writes`). A full heap does not
    /// fail the batch: its writes are then applied one at a time, removes
    /// first (they free space), and the keys whose write found no room are
    /// returned with the error (after the first put without room, the rest
    /// are not tried). Each write is failure-atomic and writing one
    /// again is harmless (the same stamp and value), so after the batch's
    /// failure, which may have applied any subset, each is simply written.
    fn flush_writes(&mut self) -> Result<(Vec<Vec<u8>>, Option<Error>)> {
        if self.writes.is_empty() {
            return Ok((Vec::new(), None));
        }
        let mut enc: Vec<(Vec<u8>, Option<Vec<u8>>)> = Vec::with_capacity(self.writes.len());
        for (k, (stamp, v)) in self.writes.drain() {
            let v = v.map(|v| {
                let mut e = Vec::with_capacity(v.len() + 16);
                value::encode(stamp, &v, &mut e);
                e
            });
            enc.push((k, v));
        }
        let items: Vec<(&[u8], Option<&[u8]>)> = enc
            .iter()
            .map(|(k, v)| (k.as_slice(), v.as_deref()))
            .collect();
        match self.h.apply_batch(&items) {
            Ok(()) => return Ok((Vec::new(), None)),
            Err(e) => {
                let e = Error::from(e);
                if !heap_full(&e) {
                    return Err(e);
                }
            }
        }
        let mut failed = Vec::new();
        let mut err: Option<Error> = None;
        let removes = items.iter().filter(|(_, v)| v.is_none());
        for &(k, v) in removes.chain(items.iter().filter(|(_, v)| v.is_some())) {
            if err.is_some() && v.is_some() {
                // One put found no room: the batch's other puts wait for the
                // next batch rather than each paying for a failed growth.
                failed.push(k.to_vec());
                continue;
            }
            if let Err(e) = self.h.apply_batch(&[(k, v)]) {
                let e = Error::from(e);
                if !heap_full(&e) {
                    return Err(e);
                }
                failed.push(k.to_vec());
                err.get_or_insert(e);
            }
        }
        Ok((failed, err))
    }

    /// Takes the chains of `failed` keys (their backend write found no room)
    /// out of the batch: their records stay unflagged and their `lentry`
    /// unreleased, so the chains are applied by a later batch; each log's
    /// scan cursor goes back to the earliest such record (the cursor had
    /// passed them as applied).
    fn drop_failed(&mut self, sh: &Shared, failed: &[Vec<u8>]) {
        let failed: std::collections::HashSet<&[u8]> =
            failed.iter().map(|k| k.as_slice()).collect();
        let mut keep = vec![true; self.pending.len()];
        self.releases.retain(|r| {
            if failed.contains(r.key.as_slice()) {
                keep[r.pending.clone()].fill(false);
                false
            } else {
                true
            }
        });
        let mut i = 0;
        self.pending.retain(|p| {
            let k = keep[i];
            i += 1;
            if !k {
                sh.pool.logs[p.log()]
                    .scan
                    .fetch_min(p.pos(), Ordering::AcqRel);
            }
            k
        });
    }

    /// The backend's value of `key` and its stamp, as this batch left it.
    pub(super) fn backend_value(&mut self, key: &[u8]) -> Result<(u64, Option<Vec<u8>>)> {
        if let Some((s, v)) = self.writes.get(key) {
            return Ok((*s, v.clone()));
        }
        if self.h.get(key, &mut self.bval)? {
            let (s, v) = value::decode(&self.bval)
                .ok_or_else(|| Error::Corrupt("backend value without a stamp".into()))?;
            Ok((s, Some(v.to_vec())))
        } else {
            Ok((0, None))
        }
    }

    /// Records a backend write; it is applied with the batch's others at the end
    /// of the batch (`flush_writes`), before any of the batch's records is flagged.
    fn write_backend(&mut self, key: &[u8], stamp: u64, val: Option<&[u8]>) -> Result<()> {
        self.writes
            .insert(key.to_vec(), (stamp, val.map(|v| v.to_vec())));
        Ok(())
    }

    /// Applies chain record `k` alone (chain order; exactly once by the stamp).
    /// Returns whether the key is now absent.
    fn apply_one(&mut self, sh: &Shared, k: usize, key: &[u8]) -> Result<bool> {
        let h = self.chain[k].1;
        let (stamp, cur) = self.backend_value(key)?;
        if h.version <= stamp {
            return Ok(cur.is_none());
        }
        self.load_payload(sh, k);
        let new = fold(cur, h.opcode, &self.cpay)?;
        self.write_backend(key, h.version, new.as_deref())?;
        Ok(new.is_none())
    }

    /// Put collapsing (§4.4), generalised to chains with non-idempotent records:
    /// the value after the chain is computed in DRAM from the newest idempotent
    /// record (or the backend value, skipping records already in it) and the
    /// records after it, in chain order, and written once.
    fn apply_collapsed(&mut self, sh: &Shared, key: &[u8]) -> Result<bool> {
        let n = self.chain.len();
        let last_idem = self
            .chain
            .iter()
            .rposition(|(_, h)| idempotent_opcode(h.opcode));
        let (mut val, from) = match last_idem {
            Some(k) => {
                self.load_payload(sh, k);
                (fold(None, self.chain[k].1.opcode, &self.cpay)?, k + 1)
            }
            None => {
                let (stamp, cur) = self.backend_value(key)?;
                let from = self
                    .chain
                    .iter()
                    .position(|(_, h)| h.version > stamp)
                    .unwrap_or(n);
                if from == n {
                    return Ok(cur.is_none()); // all in the backend already
                }
                (cur, from)
            }
        };
        for k in from..n {
            self.load_payload(sh, k);
            val = fold(val, self.chain[k].1.opcode, &self.cpay)?;
        }
        let newest = self.chain[n - 1].1.version;
        self.write_backend(key, newest, val.as_deref())?;
        sh.c.collapsed.fetch_add(n as u64 - 1, Ordering::Relaxed);
        Ok(val.is_none())
    }
}

impl Gleaner {
    /// Gives back the gleaner's log and reader slot (the gleaner holds no
    /// reference to its store, so its owner calls this).
    pub(super) fn retire(&mut self, sh: &Shared) {
        self.release(sh);
        sh.exit(self.slot);
        sh.reader_used[self.slot].store(false, Ordering::Release);
    }
}
