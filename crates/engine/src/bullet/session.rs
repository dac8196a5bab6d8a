//! A session's read and write path: log space, gets, scans, writes, commits
//! and dynamic roles between requests (§4.1, §4.2, §4.3).

use super::glean::Gleaner;
use super::{heap_full, BulletStore, FMeta, Life, Shared};
use crate::crl::{self, RecPtr};
use crate::table::{prefetch_keys, Blob, TOMB_TAG};
use crate::{
    check_op, incr_value, lentry, merge_value, min_cursor, Error, Op, Outcome, PendingCommit,
    Result, Session, WriteBatch,
};
use index::phash::PHashHandle;
use index::{Index, Ops};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Session counters are folded into the shared ones every this many operations.
const FOLD_EVERY: u64 = 256;

/// The share of each log that puts leave free (1/16): removes may use it, so
/// that when the backend is full and puts wait in the logs, removes, whose
/// application frees backend space, still find room.
const REMOVE_RESERVE: u64 = 16;

/// How long a remove waits for log space while the backend is full and
/// nothing moves before it gets the heap-full error.
const REMOVE_PATIENCE: Duration = Duration::from_millis(500);

/// The backend's value of `key` (stamp, value), for a frontend miss (None when the
/// frontend is complete or the backend lacks the key). A free function so that a
/// session can call it while it borrows its store (no reference-count traffic on
/// the hot path).
fn load_backend(sh: &Shared, g: &mut Gleaner, key: &[u8]) -> Result<Option<(u64, Box<[u8]>)>> {
    if sh.complete.load(Ordering::Acquire) {
        return Ok(None);
    }
    let (s, v) = g.backend_value(key)?;
    sh.saw_stamp(s);
    Ok(v.map(|v| {
        sh.c.loads.fetch_add(1, Ordering::Relaxed);
        (s, v.into_boxed_slice())
    }))
}

/// A key's place in a batch being applied (`apply_many`).
struct Planned<'b> {
    hash: u64,
    key: &'b [u8],
    /// The entry's `lentry` before the batch marked it.
    old: u64,
    /// Whether the batch inserted the entry (the key was absent) for its mark.
    inserted: bool,
    /// The entry's version when marked; after the append, the newest record's.
    version: u64,
    /// The operations that write records, in batch order.
    recs: Vec<Op<'b>>,
    /// The value to publish.
    fin: Fin<'b>,
    /// The key's newest record once appended (0: none written).
    rec: u64,
}

/// A key's value while a batch's operations on it are planned.
enum Cur<'n, 'b> {
    Old(Option<&'n [u8]>),
    Batch(&'b [u8]),
    Int(i64),
    /// A merge's result.
    Owned(Vec<u8>),
    None,
}

impl Cur<'_, '_> {
    fn with<R>(&self, f: impl FnOnce(Option<&[u8]>) -> R) -> R {
        match self {
            Cur::Old(v) => f(*v),
            Cur::Batch(v) => f(Some(v)),
            Cur::Int(i) => f(Some(i.to_string().as_bytes())),
            Cur::Owned(v) => f(Some(v)),
            Cur::None => f(None),
        }
    }
}

/// The value a batch leaves a key with.
enum Fin<'b> {
    Unchanged,
    Bytes(&'b [u8]),
    Int(i64),
    /// A merge's result.
    Owned(Vec<u8>),
    Tomb,
}

/// The payload length of `op`'s log record.
#[inline]
fn plen(op: &Op<'_>) -> usize {
    match op {
        Op::Put(v) | Op::Merge(v) => v.len(),
        Op::Incr(_) => 8,
        Op::Remove => 0,
    }
}

/// One thread's session on a Bullet store.
pub struct BulletSession {
    sh: Arc<Shared>,
    _life: Arc<Life>,
    g: Gleaner,
    side: Option<PHashHandle>,
    wlog: Option<usize>,
    gleaning: bool,
    ops: u64,
    appended: u64,
    payload: Vec<u8>,
    rng: u64,
    /// Group commit: logs appended to since the last commit, each with the
    /// span `[start, end)` of positions this session appended to it (the
    /// commit flushes that span after writing it through the file).
    uncommitted: Vec<(usize, u64, u64)>,
    /// Detached commits (`commit_detached`) not completed yet.
    detached: Arc<AtomicU64>,
}

impl BulletSession {
    /// A new session on `st` (`Store::session`).
    pub(super) fn new(st: &BulletStore) -> Result<BulletSession> {
        if st.sh.stop.load(Ordering::Acquire) {
            return Err(Error::Closed);
        }
        let g = Gleaner::new(&st.sh)?;
        let side = match &st.sh.side {
            Some(s) => Some(s.handle()?),
            None => None,
        };
        st.sh.sessions.fetch_add(1, Ordering::AcqRel);
        Ok(BulletSession {
            rng: 0x9e37_79b9_7f4a_7c15 ^ (g.slot as u64 + 1),
            uncommitted: Vec::new(),
            detached: Arc::new(AtomicU64::new(0)),
            sh: st.sh.clone(),
            _life: st.life.clone(),
            g,
            side,
            wlog: None,
            gleaning: false,
            ops: 0,
            appended: 0,
            payload: Vec::new(),
        })
    }

    /// A log with room for `len` bytes, held by this session (§4.3.1: a writer
    /// keeps its log until it fills, then takes the next free one). When every log
    /// is full, the writer gleans itself and advances the heads until one has room.
    /// A record other than a remove leaves `REMOVE_RESERVE` of the log free.
    /// When the backend has no room for records already in the logs (a full
    /// heap) and nothing moves, the writer gets the heap-full error instead of
    /// waiting for space that only removes can free: a put at once, a remove
    /// after `REMOVE_PATIENCE`.
    fn ensure_space(&mut self, len: u64, remove: bool) -> Result<usize> {
        let pool = &self.sh.pool;
        let keep = if remove {
            0
        } else {
            pool.size / REMOVE_RESERVE
        };
        if len + keep > pool.size {
            return Err(Error::RecordTooLarge(len, pool.size - keep));
        }
        let mut waited = false;
        let mut stalled: Option<Instant> = None;
        loop {
            // Read each round: the backend may fill (or empty) while we wait.
            let share = if remove && self.sh.full.load(Ordering::Acquire) {
                u64::MAX
            } else {
                self.sh.backlog_share()
            };
            if let Some(i) = self.wlog {
                if pool.fits_within(i, len, keep, share) {
                    return Ok(i);
                }
                pool.logs[i].writer.store(false, Ordering::Release);
                self.wlog = None;
            }
            let n = pool.logs.len();
            for k in 0..n {
                let j = (self.g.slot + k) % n;
                let l = &pool.logs[j];
                if l.writer.load(Ordering::Relaxed) || !pool.fits_within(j, len, keep, share) {
                    continue;
                }
                if l.writer
                    .compare_exchange(false, true, Ordering::AcqRel, Ordering::Relaxed)
                    .is_ok()
                {
                    if pool.fits_within(j, len, keep, share) {
                        if pool.group_commit.load(Ordering::Relaxed) {
                            // The log's earlier records (a previous writer's batch
                            // may not have committed yet) are durable before this
                            // session appends after them: recovery reads a log in
                            // order, so an acknowledged record must not sit behind
                            // a lost one. From here on, every record of the log
                            // past this point is this session's, made durable by
                            // its own commits.
                            let tail = l.tail.load(Ordering::Acquire);
                            if let Err(e) = pool.make_durable_to(j, tail) {
                                l.writer.store(false, Ordering::Release);
                                return Err(e);
                            }
                        }
                        self.wlog = Some(j);
                        return Ok(j);
                    }
                    l.writer.store(false, Ordering::Release);
                }
            }
            if !waited {
                waited = true;
                self.sh.c.waits.fetch_add(1, Ordering::Relaxed);
            }
            if self.sh.stop.load(Ordering::Acquire) {
                return Err(Error::Closed);
            }
            if pool.group_commit.load(Ordering::Relaxed) {
                // Gleaners apply only durable records, and the records filling
                // the logs may be uncommitted (this session's among them).
                pool.make_all_durable()?;
            }
            let did = match self.g.glean_batch(&self.sh) {
                Ok(did) => did,
                Err(e) if heap_full(&e) => false,
                Err(e) => return Err(e),
            };
            let moved = self.sh.advance()?;
            if did || moved {
                stalled = None;
            } else {
                if let Some(e) = self.sh.full_error() {
                    let since = *stalled.get_or_insert_with(Instant::now);
                    if !remove || since.elapsed() >= REMOVE_PATIENCE {
                        return Err(e);
                    }
                }
                std::thread::sleep(Duration::from_micros(50));
            }
        }
    }

    /// Group commit: a read answered from the record `seen` (a frontend
    /// entry's `lentry`; 0 for none) makes it durable first when it is in
    /// another writer's log and not yet committed. The answer may be the
    /// only acknowledgement a client gets of that state (a DEL that finds the
    /// key gone replies 0 and writes nothing), so it must not be undone by a
    /// crash before that writer commits. A record in this session's own log
    /// is its own, committed with this batch (whose replies wait for the
    /// commit), or was made durable when it took the log; a record already
    /// below its log's watermark costs one load.
    fn settle_read(&self, seen: u64) -> Result<()> {
        if seen == 0 || !self.sh.pool.group_commit.load(Ordering::Relaxed) {
            return Ok(());
        }
        let p = RecPtr(seen);
        if self.wlog == Some(p.log()) {
            return Ok(());
        }
        self.sh.pool.make_durable(p)
    }

    fn fold_counters(&mut self) {
        self.sh.c.ops.fetch_add(self.ops, Ordering::Relaxed);
        self.sh
            .c
            .appended
            .fetch_add(self.appended, Ordering::Relaxed);
        self.ops = 0;
        self.appended = 0;
    }

    fn tick(&mut self) {
        self.ops += 1;
        if self.ops >= FOLD_EVERY {
            self.fold_counters();
        }
    }

    fn next_rand(&mut self) -> u64 {
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        self.rng
    }

    /// Waits until no batch marks `key`: another session is applying a batch
    /// that writes it, and clears the mark once the whole batch is appended
    /// and published (see `apply_many`). Holds no lock meanwhile.
    #[cold]
    #[inline(never)]
    fn wait_batch(&self, hash: u64, key: &[u8]) {
        let mut spins = 0u32;
        loop {
            let marked = {
                let g = crossbeam_epoch::pin();
                self.sh
                    .table
                    .get(hash, key, &g)
                    .is_some_and(|n| lentry::is_pending(n.meta().lentry.load(Ordering::Acquire)))
            };
            if !marked {
                return;
            }
            spins += 1;
            if spins < 100 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
    }

    /// Takes this batch's marks off `plan`'s keys, leaving their entries as
    /// they were (an entry inserted only to hold the mark is removed): the
    /// batch failed before it published anything.
    fn unmark(&self, plan: &[Planned<'_>]) {
        for k in plan {
            let mut l = self.sh.table.lock(k.hash);
            let Some(n) = l.find(k.key) else {
                continue;
            };
            if k.inserted {
                l.remove(k.key);
            } else {
                lentry::publish(&n.meta().lentry, k.old);
            }
        }
    }

    /// Marks `key` for this batch (waiting while another batch marks it) and
    /// plans its operations `ops` (batch index, operation; in batch order) on
    /// the entry's value: their outcomes go to `outcomes` by batch index; the
    /// plan holds the records to append and the value to publish. An `Incr`
    /// on a value that is not an integer (or that overflows), or a `Merge`
    /// that does not fit the value, fails here, and the key is left unmarked.
    fn plan_key<'b>(
        &mut self,
        hash: u64,
        key: &'b [u8],
        ops: &[(usize, Op<'b>)],
        outcomes: &mut [Option<Outcome>],
    ) -> Result<Planned<'b>> {
        loop {
            let sh = &*self.sh;
            let mut l = sh.table.lock(hash);
            let mut inserted = false;
            if l.find(key).is_none() {
                match load_backend(sh, &mut self.g, key)? {
                    Some((stamp, v)) => {
                        l.insert(hash, key, Blob::new(&v), FMeta::new(0, stamp));
                    }
                    None => {
                        // An absent key gets an entry (a tombstone) to hold the
                        // mark, inserted marked.
                        l.insert(hash, key, Blob::tomb(), FMeta::new(lentry::PENDING, 0));
                        inserted = true;
                    }
                }
            }
            let n = l.find(key).expect("the entry was just found or inserted");
            let mut old = 0;
            if !inserted {
                let m = &n.meta().lentry;
                let le = m.load(Ordering::Acquire);
                // A compare-and-swap: a gleaner may release `lentry` meanwhile.
                if lentry::is_pending(le)
                    || m.compare_exchange(
                        le,
                        le | lentry::PENDING,
                        Ordering::AcqRel,
                        Ordering::Acquire,
                    )
                    .is_err()
                {
                    drop(l);
                    self.wait_batch(hash, key);
                    continue;
                }
                old = le;
            }
            let g = l.guard();
            let mut live = n.tagged(g) != TOMB_TAG;
            let mut cur = if live {
                Cur::Old(n.value(g).get())
            } else {
                Cur::None
            };
            let mut recs = Vec::with_capacity(ops.len());
            let mut failed = None;
            for &(idx, op) in ops {
                let outcome = match op {
                    Op::Put(v) => {
                        let old_first = cur.with(|b| b.and_then(|b| b.first().copied()));
                        let created = !live;
                        cur = Cur::Batch(v);
                        live = true;
                        recs.push(op);
                        Outcome::Put { created, old_first }
                    }
                    Op::Remove => {
                        let found = live;
                        if live {
                            live = false;
                            cur = Cur::None;
                            recs.push(op);
                        }
                        Outcome::Removed(found)
                    }
                    Op::Incr(d) => match cur.with(|b| incr_value(b, d)) {
                        Ok(v) => {
                            cur = Cur::Int(v);
                            live = true;
                            recs.push(op);
                            Outcome::Int(v)
                        }
                        Err(e) => {
                            failed = Some(e);
                            break;
                        }
                    },
                    // The new piece is computed here, in DRAM; the record
                    // carries only the edit.
                    Op::Merge(p) => match cur.with(|b| merge_value(b, p)) {
                        Ok(v) => {
                            let len = v.len();
                            cur = Cur::Owned(v);
                            live = true;
                            recs.push(op);
                            Outcome::Merged(len)
                        }
                        Err(e) => {
                            failed = Some(e);
                            break;
                        }
                    },
                };
                outcomes[idx] = Some(outcome);
            }
            let fin = match cur {
                Cur::Old(_) => Fin::Unchanged,
                Cur::Batch(v) => Fin::Bytes(v),
                Cur::Int(v) => Fin::Int(v),
                Cur::Owned(v) => Fin::Owned(v),
                Cur::None => Fin::Tomb,
            };
            let plan = Planned {
                hash,
                key,
                old,
                inserted,
                version: n.meta().version.load(Ordering::Acquire),
                recs,
                fin,
                rec: 0,
            };
            drop(l);
            if let Some(e) = failed {
                self.unmark(std::slice::from_ref(&plan));
                return Err(e);
            }
            return Ok(plan);
        }
    }

    /// `apply_batch` for a batch of several operations, all-or-nothing
    /// across a crash (see "Batches" in the module note of `crl`):
    /// 1. space for every record in one log (`ensure_space`), before any mark;
    /// 2. each key, in the order of (hash, key), marked and planned
    ///    (`plan_key`); a key marked by another batch is waited for, and as
    ///    every batch marks in that order no two wait for each other;
    /// 3. the records appended contiguously to the one log, every one but
    ///    the last with the `more` bit, each key's chain through its records
    ///    in batch order; then published at once (`Pool::publish`: one fence
    ///    without group commit; under group commit the session's commit);
    /// 4. each key's value, version and `lentry` set and its mark cleared.
    ///
    /// An error before step 4 (a planning error, a failed append) takes the
    /// marks off and changes nothing: no record was published, and the bytes
    /// written past the tail are overwritten by the next append (or, left
    /// behind by a crash, belong to a batch without its last record).
    fn apply_many(&mut self, batch: &WriteBatch, out: &mut Vec<Outcome>) -> Result<()> {
        // Pinned once for the whole batch: every key is locked twice below
        // (plan, then publish), and a pin inside a pin is a counter
        // increment, where an outermost pin costs a full fence.
        let _pinned = crossbeam_epoch::pin();
        let ops: Vec<(&[u8], Op<'_>)> = batch.iter().collect();
        let mut total = 0u64;
        let mut remove_only = true;
        for (key, op) in &ops {
            check_op(key, op)?;
            total += crl::record_len(key.len(), plen(op));
            remove_only &= matches!(op, Op::Remove);
        }
        self.ops += ops.len() as u64 - 1;
        self.tick();
        if !remove_only {
            if let Some(e) = self.sh.full_error() {
                return Err(e);
            }
        }
        let keep = if remove_only {
            0
        } else {
            self.sh.pool.size / REMOVE_RESERVE
        };
        let limit = self.sh.pool.batch_limit(keep);
        if total > limit {
            return Err(Error::RecordTooLarge(total, limit));
        }
        // 1.
        let log = self.ensure_space(total, remove_only)?;
        // 2. Keys in (hash, key) order; a key's operations stay in batch order.
        let hashes: Vec<u64> = ops.iter().map(|(k, _)| self.sh.hasher.hash(k)).collect();
        let mut order: Vec<usize> = (0..ops.len()).collect();
        order.sort_by(|&a, &b| (hashes[a], ops[a].0, a).cmp(&(hashes[b], ops[b].0, b)));
        let mut outcomes: Vec<Option<Outcome>> = vec![None; ops.len()];
        let mut plan: Vec<Planned<'_>> = Vec::new();
        let mut group: Vec<(usize, Op<'_>)> = Vec::new();
        let mut at = 0;
        while at < order.len() {
            let first = order[at];
            group.clear();
            while at < order.len() && ops[order[at]].0 == ops[first].0 {
                group.push((order[at], ops[order[at]].1));
                at += 1;
            }
            match self.plan_key(hashes[first], ops[first].0, &group, &mut outcomes) {
                Ok(p) => plan.push(p),
                Err(e) => {
                    self.unmark(&plan);
                    return Err(e);
                }
            }
        }
        // 3.
        let start = self.sh.pool.logs[log].tail.load(Ordering::Acquire);
        let end = match self.append_planned(log, &mut plan) {
            Ok(end) => end,
            Err(e) => {
                self.unmark(&plan);
                return Err(e);
            }
        };
        if let Some(end) = end {
            self.sh.pool.publish(log, end);
            if self.sh.pool.group_commit.load(Ordering::Relaxed) {
                match self.uncommitted.iter_mut().find(|(i, _, _)| *i == log) {
                    Some(e) => {
                        e.1 = e.1.min(start);
                        e.2 = e.2.max(end);
                    }
                    None => self.uncommitted.push((log, start, end)),
                }
            }
        }
        // 4.
        let sh = &*self.sh;
        for k in &plan {
            let mut l = sh.table.lock(k.hash);
            let n = l
                .find(k.key)
                .ok_or_else(|| Error::Corrupt("a marked frontend entry vanished".into()))?;
            if k.rec == 0 {
                // Nothing written (removes of an absent key): as it was.
                if k.inserted {
                    l.remove(k.key);
                } else {
                    lentry::publish(&n.meta().lentry, k.old);
                }
                continue;
            }
            let new = match &k.fin {
                Fin::Bytes(v) => Blob::new(v),
                Fin::Int(v) => Blob::new(v.to_string().as_bytes()),
                Fin::Owned(v) => Blob::new(v),
                Fin::Tomb => Blob::tomb(),
                Fin::Unchanged => unreachable!("a key with records has a new value"),
            };
            l.set_value(n, new);
            n.meta().version.store(k.version, Ordering::Release);
            lentry::publish(&n.meta().lentry, k.rec);
        }
        if let Some(side) = &mut self.side {
            // As `apply`: after the records are durable and published.
            for k in plan.iter().filter(|k| k.rec != 0) {
                side.put(k.key, &k.rec.to_le_bytes())?;
            }
        }
        out.extend(
            outcomes
                .into_iter()
                .map(|o| o.expect("every operation planned")),
        );
        self.evict();
        Ok(())
    }

    /// Step 3 of `apply_many`: appends the planned records to log `log`
    /// (held, with room for them) without publishing them; sets each key's
    /// newest record and version in its plan. Returns the position after the
    /// last record (None when there is none to write).
    fn append_planned(&mut self, log: usize, plan: &mut [Planned<'_>]) -> Result<Option<u64>> {
        let sh = &*self.sh;
        let pool = &sh.pool;
        let group = pool.group_commit.load(Ordering::Relaxed);
        let mut total = 0;
        let mut nrecs = 0;
        for k in plan.iter() {
            for op in &k.recs {
                total += crl::record_len(k.key.len(), plen(op));
                nrecs += 1;
            }
            // As in `apply`: the chain's older record (or, for a remove that
            // found the key gone, the tombstone read) durable first when it is
            // in another writer's log.
            let old = RecPtr(k.old);
            if group && k.old != 0 && old.log() != log {
                pool.make_durable(old)?;
            }
        }
        if nrecs == 0 {
            return Ok(None);
        }
        let mut pos = pool
            .reserve(log, total)?
            .ok_or_else(|| Error::Corrupt("log space reserved for a batch vanished".into()))?;
        let base = sh.epoch_base();
        let mut left = nrecs;
        for k in plan.iter_mut() {
            let mut prev = k.old;
            let mut version = k.version;
            for op in &k.recs {
                version = (version + 1).max(base);
                self.payload.clear();
                match op {
                    Op::Put(v) => self.payload.extend_from_slice(v),
                    Op::Incr(d) => self.payload.extend_from_slice(&d.to_le_bytes()),
                    Op::Merge(p) => self.payload.extend_from_slice(p),
                    Op::Remove => {}
                }
                left -= 1;
                let rec = pool.put_record(
                    log,
                    &mut pos,
                    op.code(),
                    left > 0,
                    k.key,
                    &self.payload,
                    RecPtr(prev),
                    version,
                )?;
                prev = rec.0;
                self.appended += 1;
            }
            if !k.recs.is_empty() {
                k.rec = prev;
                k.version = version;
            }
        }
        Ok(Some(pos))
    }

    /// Keeps a bounded frontend within its size: evicts entries with nothing
    /// pending from consecutive buckets after a random one (§2.1: only entries
    /// whose records are all applied may go), until about `EVICT_EXAMINE`
    /// entries were looked at or `EVICT_BUCKETS` buckets. Consecutive, not
    /// random buckets: a table much emptier than its bucket array (a small
    /// bound, 65,536 buckets to begin with) would otherwise find almost no
    /// entry per call and stay over its bound.
    fn evict(&mut self) {
        const EVICT_EXAMINE: usize = 8;
        const EVICT_BUCKETS: usize = 256;
        let cap = self.sh.opts.cache_entries;
        if cap == 0 || (self.sh.table.len() as u64) <= cap {
            return;
        }
        self.sh.complete.store(false, Ordering::Release);
        let base = self.sh.epoch_base();
        let b = self.sh.table.buckets().max(1);
        let mut i = (self.next_rand() as usize) % b;
        let mut examined = 0;
        for _ in 0..EVICT_BUCKETS.min(b) {
            if let Some(mut l) = self.sh.table.lock_index(i) {
                let pool = &self.sh.pool;
                let n = l.retain(|node| {
                    examined += 1;
                    let le = node.meta().lentry.load(Ordering::Acquire);
                    // A key marked by a batch in progress is not settled.
                    let settled =
                        le == 0 || (!lentry::is_pending(le) && pool.reclaimed(RecPtr(le)));
                    let recent = node.meta().version.load(Ordering::Acquire) >= base;
                    !settled || recent
                });
                self.sh.c.evictions.fetch_add(n as u64, Ordering::Relaxed);
                if (self.sh.table.len() as u64) <= cap || examined >= EVICT_EXAMINE {
                    break;
                }
            }
            i = (i + 1) % b;
        }
    }
}

impl Drop for BulletSession {
    fn drop(&mut self) {
        let _ = Session::commit(self);
        self.fold_counters();
        if let Some(i) = self.wlog.take() {
            self.sh.pool.logs[i].writer.store(false, Ordering::Release);
        }
        if self.gleaning {
            self.sh.gleaners.fetch_sub(1, Ordering::AcqRel);
        }
        self.g.retire(&self.sh);
        self.sh.sessions.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Session for BulletSession {
    fn batch_limit(&self) -> Option<u64> {
        let pool = &self.sh.pool;
        Some(pool.batch_limit(pool.size / REMOVE_RESERVE))
    }

    fn prefetch(&mut self, keys: &[&[u8]]) {
        prefetch_keys(&self.sh.table, &self.sh.hasher, keys);
    }

    fn get(&mut self, key: &[u8], out: &mut Vec<u8>) -> Result<bool> {
        out.clear();
        self.tick();
        let hash = self.sh.hasher.hash(key);
        // The entry's newest record, which the answer reflects (0: none).
        let mut seen = 0u64;
        let found = if self.sh.opts.variant.lockfree_gets() {
            let g = crossbeam_epoch::pin();
            self.sh.table.get(hash, key, &g).map(|n| {
                let found = match n.value(&g).get() {
                    Some(v) => {
                        out.extend_from_slice(v);
                        true
                    }
                    None => false,
                };
                // After the value: a batch marks the key before it changes
                // the value, so a value from a batch in progress comes with
                // its mark here.
                seen = n.meta().lentry.load(Ordering::Acquire);
                found
            })
        } else {
            self.sh.table.get_shared(hash, key, |n| {
                n.map(|n| {
                    seen = n.meta().lentry.load(Ordering::Acquire);
                    let g = crossbeam_epoch::pin();
                    match n.value(&g).get() {
                        Some(v) => {
                            out.extend_from_slice(v);
                            true
                        }
                        None => false,
                    }
                })
            })
        };
        if lentry::is_pending(seen) {
            out.clear();
            self.wait_batch(hash, key);
            return self.get(key, out);
        }
        if let Some(f) = found {
            self.settle_read(seen)?;
            return Ok(f);
        }
        if self.sh.complete.load(Ordering::Acquire) {
            return Ok(false);
        }
        // The miss is served under the bucket lock, as a write's is: between an
        // unlocked backend read and the insert, another thread could create,
        // apply and evict the key, and a stale value would be cached.
        let sh = &*self.sh;
        let mut l = sh.table.lock(hash);
        let found = match l.find(key) {
            Some(n) => {
                seen = n.meta().lentry.load(Ordering::Acquire);
                match n.value(l.guard()).get() {
                    Some(v) => {
                        out.extend_from_slice(v);
                        true
                    }
                    None => false,
                }
            }
            None => match load_backend(sh, &mut self.g, key)? {
                Some((stamp, v)) => {
                    out.extend_from_slice(&v);
                    l.insert(hash, key, Blob::new(&v), FMeta::new(0, stamp));
                    true
                }
                None => false,
            },
        };
        drop(l);
        if lentry::is_pending(seen) {
            out.clear();
            self.wait_batch(hash, key);
            return self.get(key, out);
        }
        self.settle_read(seen)?;
        self.evict();
        Ok(found)
    }

    /// The keys are the frontend's live entries and the backend's keys that the
    /// frontend does not shadow (a tombstone is a removed key). One step scans the
    /// frontend from `cursor` (about `count` entries, tombstones included), then
    /// the backend from `cursor`; the next cursor is the smaller of the two (each
    /// side covers everything below its own), and what either returned past it is
    /// left for the next step.
    ///
    /// The frontend goes first: a key leaves the frontend only once the backend
    /// holds its value (eviction takes settled entries; a tombstone is reaped after
    /// the backend remove), so a key present throughout that the frontend step
    /// missed is in the backend when the backend step runs. When the frontend is
    /// complete (a full copy: nothing was ever evicted, checked after the frontend
    /// step) the backend is not read at all.
    fn scan(&mut self, cursor: u64, count: usize, out: &mut Vec<Vec<u8>>) -> Result<u64> {
        self.tick();
        let sh = &*self.sh;
        let mut front: Vec<(Vec<u8>, bool)> = Vec::new();
        let fnext = sh.table.scan(cursor, count, |n, g| {
            front.push((n.key().to_vec(), n.value(g).get().is_some()))
        });
        if sh.complete.load(Ordering::Acquire) {
            out.extend(front.into_iter().filter(|(_, live)| *live).map(|(k, _)| k));
            return Ok(fnext);
        }
        let mut back = Vec::new();
        let bnext = self.g.h.scan(cursor, count, &mut back)?;
        let next = min_cursor(fnext, bnext);
        let below = |k: &[u8]| next == 0 || index::scan_pos(sh.hasher.hash(k)) < next;
        let mut shadowed = std::collections::HashSet::new();
        for (k, live) in front {
            if below(&k) {
                if live {
                    out.push(k.clone());
                }
                shadowed.insert(k);
            }
        }
        out.extend(
            back.into_iter()
                .filter(|k| below(k) && !shadowed.contains(k)),
        );
        Ok(next)
    }

    fn apply(&mut self, key: &[u8], op: Op<'_>) -> Result<Outcome> {
        check_op(key, &op)?;
        self.tick();
        let plen = plen(&op);
        let remove = matches!(op, Op::Remove);
        if !remove {
            // The backend has no room for records already logged: a put or
            // an increment would only fill the logs that removes need.
            if let Some(e) = self.sh.full_error() {
                return Err(e);
            }
        }
        let log = self.ensure_space(crl::record_len(key.len(), plen), remove)?;
        let hash = self.sh.hasher.hash(key);
        let sh = &*self.sh;
        let mut l = sh.table.lock(hash);
        if l.find(key).is_none() {
            if let Some((stamp, v)) = load_backend(sh, &mut self.g, key)? {
                l.insert(hash, key, Blob::new(&v), FMeta::new(0, stamp));
            }
        }
        let node = l.find(key);
        if node.is_some_and(|n| lentry::is_pending(n.meta().lentry.load(Ordering::Relaxed))) {
            // Another session's batch holds the key: its writes come first.
            drop(l);
            self.wait_batch(hash, key);
            return self.apply(key, op);
        }
        let g = l.guard();
        // Whether the key is live, from the value pointer's tag.
        let live = node.is_some_and(|n| n.tagged(g) != TOMB_TAG);
        let (outcome, new): (Outcome, crossbeam_epoch::Owned<Blob>) = match op {
            Op::Put(v) => {
                // A put reads only the old value's first byte (its blob's first
                // line, which a pipeline's prefetch has fetched already).
                let old_first = node
                    .filter(|_| live)
                    .and_then(|n| n.value(g).get())
                    .and_then(|b| b.first().copied());
                (
                    Outcome::Put {
                        created: !live,
                        old_first,
                    },
                    Blob::new(v),
                )
            }
            Op::Remove => {
                if !live {
                    // Nothing to write, but the acknowledgement says the key
                    // is gone: under group commit the tombstone read here may
                    // be another writer's record not committed yet, lost on a
                    // crash with the older value back. Made durable as a
                    // put's `prev` is below (the same rule: a record in this
                    // session's own log is its own, committed with this batch,
                    // or was made durable when it took the log).
                    let prev = node
                        .map(|n| lentry::prev_for_append(&n.meta().lentry))
                        .unwrap_or(0);
                    if sh.pool.group_commit.load(Ordering::Relaxed)
                        && prev != 0
                        && RecPtr(prev).log() != log
                    {
                        sh.pool.make_durable(RecPtr(prev))?;
                    }
                    return Ok(Outcome::Removed(false));
                }
                (Outcome::Removed(true), Blob::tomb())
            }
            Op::Incr(d) => {
                let cur: Option<&[u8]> = node.and_then(|n| n.value(g).get());
                let n = incr_value(cur, d)?;
                (Outcome::Int(n), Blob::new(n.to_string().as_bytes()))
            }
            Op::Merge(p) => {
                // The writer computes the new piece in DRAM (the frontend
                // replaces a value whole); the record carries the edit only,
                // which the gleaner or recovery folds onto the backend value.
                let cur: Option<&[u8]> = node.and_then(|n| n.value(g).get());
                let new = merge_value(cur, p)?;
                (Outcome::Merged(new.len()), Blob::new(&new))
            }
        };
        let base = sh.epoch_base();
        let version = node
            .map(|n| n.meta().version.load(Ordering::Acquire) + 1)
            .unwrap_or(0)
            .max(base);
        let prev = node
            .map(|n| lentry::prev_for_append(&n.meta().lentry))
            .unwrap_or(0);
        self.payload.clear();
        match op {
            Op::Put(v) => self.payload.extend_from_slice(v),
            Op::Incr(d) => self.payload.extend_from_slice(&d.to_le_bytes()),
            Op::Merge(p) => self.payload.extend_from_slice(p),
            Op::Remove => {}
        }
        let group = sh.pool.group_commit.load(Ordering::Relaxed);
        if group && prev != 0 && RecPtr(prev).log() != log {
            // The chain's older record (maybe another writer's, not yet
            // committed) must be durable before this one can be. Not when it is
            // in this session's own log: everything before this session's
            // first record there was made durable when it took the log
            // (`ensure_space`), everything after is its own and commits with
            // this record, and recovery reads a log in order, so it finds the
            // older record whenever it finds this one.
            sh.pool.make_durable(RecPtr(prev))?;
        }
        // Where this append starts (a pad record before the record included):
        // this session holds the log, so its tail moves only here.
        let start = sh.pool.logs[log].tail.load(Ordering::Acquire);
        let rec = sh
            .pool
            .append(log, op.code(), key, &self.payload, RecPtr(prev), version)?
            .ok_or_else(|| Error::Corrupt("log space reserved for a record vanished".into()))?;
        self.appended += 1;
        if group {
            let end = rec.pos() + crl::record_len(key.len(), self.payload.len());
            match self.uncommitted.iter_mut().find(|(i, _, _)| *i == log) {
                Some(e) => {
                    e.1 = e.1.min(start);
                    e.2 = e.2.max(end);
                }
                None => self.uncommitted.push((log, start, end)),
            }
        }
        match node {
            Some(n) => {
                l.set_value(n, new);
                n.meta().version.store(version, Ordering::Release);
                lentry::publish(&n.meta().lentry, rec.0);
            }
            None => {
                l.insert(hash, key, new, FMeta::new(rec.0, version));
            }
        }
        if let Some(side) = &mut self.side {
            // The base design's transaction on the put path (§4.1, variants st and
            // lfr): the key's persistent pair records its newest log record. After
            // the frontend is updated: the record is durable, so the write has
            // happened even if this fails (the error then says so).
            side.put(key, &rec.0.to_le_bytes())?;
        }
        drop(l);
        self.evict();
        Ok(outcome)
    }

    /// All-or-nothing across a crash (`apply_many`); a batch of one
    /// operation is `apply`.
    fn apply_batch(&mut self, batch: &WriteBatch, out: &mut Vec<Outcome>) -> Result<()> {
        if batch.len() <= 1 {
            return crate::apply_each(self, batch, out);
        }
        self.apply_many(batch, out)
    }

    fn awaits_commit(&self) -> bool {
        !self.uncommitted.is_empty()
    }

    fn commit(&mut self) -> Result<()> {
        if self.uncommitted.is_empty() {
            return Ok(());
        }
        if self.detached.load(Ordering::Acquire) > 0 {
            // A detached commit's records, before these in the same logs, may
            // not be durable yet, so this thread's fence would not make the
            // logs durable up to these ends: sync each from its watermark.
            for (i, _, end) in self.uncommitted.drain(..) {
                self.sh.pool.make_durable_to(i, end)?;
            }
            return Ok(());
        }
        for &(i, start, end) in &self.uncommitted {
            self.sh.pool.committing(i, start, end)?;
        }
        // One fence for the batch: it syncs what `committing` wrote and
        // flushed (and every other flush of this thread since its last fence).
        self.sh.pool.fence();
        self.sh.pool.heap.region().health()?;
        for (i, _, end) in self.uncommitted.drain(..) {
            self.sh.pool.mark_durable(i, end);
        }
        Ok(())
    }

    /// The batch's fence detached from this thread (`Region::detach_fence`):
    /// with msync, the device write runs wherever the work is completed while
    /// this session goes on. Writers that need these records durable wait for
    /// it (`committing`) as for a commit on this thread.
    fn commit_detached(&mut self) -> Result<Option<PendingCommit>> {
        if self.uncommitted.is_empty() {
            return Ok(None);
        }
        for &(i, start, end) in &self.uncommitted {
            self.sh.pool.committing(i, start, end)?;
        }
        // Detached after `committing` wrote and flushed the batch's records.
        let fence = self.sh.pool.heap.region().detach_fence();
        let marks = std::mem::take(&mut self.uncommitted);
        let sh = self.sh.clone();
        let detached = self.detached.clone();
        detached.fetch_add(1, Ordering::AcqRel);
        Ok(Some(PendingCommit::new(move || {
            let r = sh.pool.heap.region();
            r.complete_fence(fence);
            let ok = r.health();
            if ok.is_ok() {
                for (i, _, end) in marks {
                    sh.pool.mark_durable(i, end);
                }
            }
            detached.fetch_sub(1, Ordering::AcqRel);
            Ok(ok?)
        })))
    }

    /// Dynamic roles (§4.3.2): when the advancer wants more gleaners than there
    /// are, this session becomes one (at least one session always serves) and
    /// gleans a batch per call until the advancer wants fewer.
    fn maintain(&mut self) -> Result<bool> {
        let sh = &self.sh;
        if !sh.opts.variant.dynamic() || sh.opts.role_threads > 0 {
            return Ok(false);
        }
        if self.gleaning {
            let have = sh.gleaners.load(Ordering::Acquire);
            if have > sh.target.load(Ordering::Acquire)
                && sh
                    .gleaners
                    .compare_exchange(have, have - 1, Ordering::AcqRel, Ordering::Relaxed)
                    .is_ok()
            {
                self.gleaning = false;
                self.g.release(sh);
                return Ok(false);
            }
        } else {
            let have = sh.gleaners.load(Ordering::Acquire);
            let max = sh.sessions.load(Ordering::Acquire).saturating_sub(1);
            if have >= sh.target.load(Ordering::Acquire)
                || have >= max
                || sh
                    .gleaners
                    .compare_exchange(have, have + 1, Ordering::AcqRel, Ordering::Relaxed)
                    .is_err()
            {
                return Ok(false);
            }
            self.gleaning = true;
        }
        let sh = self.sh.clone();
        match self.g.glean_batch(&sh) {
            Ok(true) => {}
            Ok(false) => std::thread::sleep(Duration::from_micros(50)),
            Err(e) if heap_full(&e) => {
                // Only chains the heap has no room for: the role goes back
                // (the advancer asks again next epoch) rather than this
                // worker retrying them between its requests.
                self.gleaning = false;
                sh.gleaners.fetch_sub(1, Ordering::AcqRel);
                self.g.release(&sh);
                return Ok(false);
            }
            Err(e) => return Err(e),
        }
        Ok(true)
    }
}
