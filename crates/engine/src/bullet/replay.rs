//! Recovery's replay of the logs into the frontend (§5).

use super::{fold, BulletRecovery, FMeta, FVal, VERSION_SHIFT};
use crate::crl::{Header, Pool, RecPtr, OPC_PAD};
use crate::table::{Blob, Table};
use crate::{idempotent_opcode, known_opcode, value, Error, Result, OPC_PUT};
use index::any::{AnyHandle, AnyIndex};
use index::{Index, KeyHasher, Ops};
use std::sync::atomic::Ordering;

/// The outcome of reading the logs at recovery.
pub(super) struct Replay {
    /// The frontend, holding an entry for each key the logs hold records of
    /// that are not yet in the backend.
    pub(super) table: Table<FVal, FMeta>,
    pub(super) next_epoch: u64,
}

/// A record found at recovery.
#[derive(Clone, Copy)]
struct Found {
    p: RecPtr,
    h: Header,
    /// Where its key is in `replay`'s copy of the keys.
    koff: usize,
}

/// Reads every log from head to tail; for each key with records not yet in the
/// backend, computes the frontend value (backend value + those records, in version
/// order). Records found to be in the backend already (their version is at most
/// the backend stamp, or at most a flagged record's) are flagged, so the prefix of
/// each key's chain that is flagged is exactly what the backend holds.
///
/// The records are grouped by key without a map: one array of (key hash,
/// version, index) sorted, then runs of one hash split by key bytes (only a
/// hash collision makes a run hold two keys). No allocation per key or record
/// besides the entries themselves: a map of keys to record lists would cost
/// an allocation of each, and the time to free them.
/// The keys are copied into one buffer as the logs are read, so that going
/// through them in hash order reads that buffer, not the logs at random. That
/// is every record's key (the map held each key once): recovery's memory is
/// the logs' key bytes plus about 90 bytes a record, at most about the logs'
/// size.
///
/// Each key's fold goes straight into the frontend (a table of at least
/// `frontend_buckets`, sized up front for one entry per key found, so that no
/// doubling runs meanwhile), from both halves' threads under its bucket lock:
/// no list of entries in between, whose keys and values would be allocated,
/// copied again into the table and freed.
pub(super) fn replay(
    pool: &Pool,
    backend: &AnyIndex,
    hasher: &KeyHasher,
    parallel_from: usize,
    frontend_buckets: usize,
    st: &mut BulletRecovery,
) -> Result<Replay> {
    let mut recs: Vec<Found> = Vec::new();
    let mut keys: Vec<u8> = Vec::new();
    let mut order: Vec<(u64, u64, u32)> = Vec::new();
    let mut max_version = 0;
    let mut key = Vec::new();
    for (i, l) in pool.logs.iter().enumerate() {
        if l.base.load(Ordering::Acquire) == 0 {
            continue;
        }
        let head = l.head.load(Ordering::Acquire);
        let tail = l.tail.load(Ordering::Acquire);
        st.log_bytes += tail - head;
        let mut pos = head;
        loop {
            pos = pool.skip_gap(pos);
            if pos >= tail {
                break;
            }
            let p = RecPtr::new(i, pos);
            let h = pool.header(p)?;
            pos += h.len as u64;
            if pos > tail {
                return Err(Error::Corrupt(format!("log {i}: record past the tail")));
            }
            if h.opcode == OPC_PAD {
                continue;
            }
            if !known_opcode(h.opcode) {
                return Err(Error::Corrupt(format!(
                    "log {i} record at {}: opcode {}",
                    p.pos(),
                    h.opcode
                )));
            }
            st.records += 1;
            pool.key(p, &h, &mut key);
            max_version = max_version.max(h.version);
            let n = u32::try_from(recs.len()).map_err(|_| {
                Error::Config("more than 2^32 log records: too many to recover at once".into())
            })?;
            order.push((order_hash(hasher, &key), h.version, n));
            recs.push(Found {
                p,
                h,
                koff: keys.len(),
            });
            keys.extend_from_slice(&key);
        }
    }
    order.sort_unstable();
    // One entry per run of a hash (a collision adds one more, harmless).
    let runs = order.windows(2).filter(|w| w[0].0 != w[1].0).count() + 1;
    let frontend: Table<FVal, FMeta> = Table::new(frontend_buckets.max(runs.next_power_of_two()));
    // Two halves on two threads (split at a run of one hash) when there is
    // enough to share: each key's fold is independent of the others'.
    let collide = collide_now();
    let mut split = order.len() / 2;
    while split > 0 && split < order.len() && order[split].0 == order[split - 1].0 {
        split += 1;
    }
    let parts: Vec<&[(u64, u64, u32)]> = if order.len() >= parallel_from.max(2) {
        vec![&order[..split], &order[split..]]
    } else {
        vec![&order[..]]
    };
    let table = &frontend;
    let run = |part: &[(u64, u64, u32)]| {
        replay_part(pool, backend, hasher, table, &recs, &keys, part, collide)
    };
    let mut done: Vec<Result<PartOut>> = Vec::new();
    std::thread::scope(|sc| {
        let mut handles = Vec::new();
        for part in &parts[1..] {
            match std::thread::Builder::new()
                .name("ember-replay".into())
                .spawn_scoped(sc, move || run(part))
            {
                Ok(h) => handles.push(h),
                // No thread: this one does that part too.
                Err(_) => done.push(run(part)),
            }
        }
        done.push(run(parts[0]));
        for h in handles {
            // A panic there is a panic here, as in the part run here.
            done.push(h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)));
        }
    });
    if parts.len() > 1 && done.iter().any(Result::is_err) {
        // Run in parallel, a part can fail for want of a second heap thread
        // slot (a backend handle takes one; it is taken before anything is
        // inserted): again one after the other, each handle dropped before
        // the next. A part that did run inserted its keys already; run again
        // it finds them there and leaves them (the same fold from the same
        // records).
        done = parts.iter().map(|part| run(part)).collect();
    }
    let mut to_flag = Vec::new();
    for r in done {
        let (n, f, replayed) = r?;
        st.replayed += replayed;
        st.keys += n;
        to_flag.extend(f);
    }
    if !to_flag.is_empty() {
        // All the flags, then all the flushes (see `Pool::mark_applied_all`).
        pool.mark_applied_all(&to_flag);
        pool.fence();
    }
    Ok(Replay {
        table: frontend,
        next_epoch: (max_version >> VERSION_SHIFT) + 1,
    })
}

/// What `replay_part` did: keys put into the frontend, records to flag, and
/// how many records it replayed.
type PartOut = (u64, Vec<RecPtr>, u64);

/// `replay`'s work on one part of the records in (hash, version) order (a part
/// begins and ends at hash runs' boundaries).
#[allow(clippy::too_many_arguments)]
fn replay_part(
    pool: &Pool,
    backend: &AnyIndex,
    hasher: &KeyHasher,
    table: &Table<FVal, FMeta>,
    recs: &[Found],
    keys: &[u8],
    order: &[(u64, u64, u32)],
    collide: bool,
) -> Result<PartOut> {
    let mut r = Replayer {
        pool,
        bh: backend.handle()?,
        table,
        buf: Vec::new(),
        payload: Vec::new(),
        keys: 0,
        to_flag: Vec::new(),
        replayed: 0,
    };
    let key_of = |f: &Found| &keys[f.koff..f.koff + f.h.klen as usize];
    let mut group: Vec<Found> = Vec::new();
    let mut a = 0;
    while a < order.len() {
        let hash = order[a].0;
        let mut b = a + 1;
        while b < order.len() && order[b].0 == hash {
            b += 1;
        }
        if let Some(o) = order.get(b) {
            pool.prefetch_header(recs[o.2 as usize].p);
        }
        group.clear();
        group.extend(order[a..b].iter().map(|o| recs[o.2 as usize]));
        let key = key_of(&group[0]);
        if b - a > 1 && group.iter().any(|f| key_of(f) != key) {
            // A hash collision: the run's records of other keys go to groups
            // of their own, in order (still by version).
            let mut rest: Vec<Found> = Vec::new();
            group.retain(|f| {
                let mine = key_of(f) == key;
                if !mine {
                    rest.push(*f);
                }
                mine
            });
            while !rest.is_empty() {
                let other = key_of(&rest[0]);
                let (g2, r2): (Vec<Found>, Vec<Found>) =
                    rest.iter().partition(|f| key_of(f) == other);
                r.key(entry_hash(hasher, hash, other, collide), other, &g2)?;
                rest = r2;
            }
        }
        r.key(entry_hash(hasher, hash, key, collide), key, &group)?;
        a = b;
    }
    Ok((r.keys, r.to_flag, r.replayed))
}
#[cfg(test)]
thread_local! {
    /// Tests: `replay` groups records under a hash that collides for every
    /// other key (`order_hash`).
    static COLLIDE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Whether this thread's `replay` forces hash collisions (tests).
fn collide_now() -> bool {
    #[cfg(test)]
    if COLLIDE.with(|c| c.get()) {
        return true;
    }
    false
}

/// The hash `replay` groups a key's records under.
fn order_hash(hasher: &KeyHasher, key: &[u8]) -> u64 {
    if collide_now() {
        return key.len() as u64 % 2;
    }
    hasher.hash(key)
}

/// The frontend hash of `key`, grouped under `hash` (`collide`: by
/// `order_hash`'s test stand-in).
fn entry_hash(hasher: &KeyHasher, hash: u64, key: &[u8], collide: bool) -> u64 {
    if collide {
        hasher.hash(key)
    } else {
        hash
    }
}

/// `replay`'s state while it goes through the keys.
struct Replayer<'a> {
    pool: &'a Pool,
    bh: AnyHandle,
    table: &'a Table<FVal, FMeta>,
    buf: Vec<u8>,
    payload: Vec<u8>,
    /// Keys given a frontend entry.
    keys: u64,
    to_flag: Vec<RecPtr>,
    /// Records not yet in the backend, replayed.
    replayed: u64,
}

impl Replayer<'_> {
    /// One key's records, in version order: its frontend entry, if it needs
    /// one, and the records to flag.
    fn key(&mut self, hash: u64, key: &[u8], recs: &[Found]) -> Result<()> {
        let maxflag = recs
            .iter()
            .filter(|r| r.h.applied)
            .map(|r| r.h.version)
            .max()
            .unwrap_or(0);
        // The backend is read only when the value needs it: when the records
        // not yet flagged applied hold a put or remove, the value is the fold
        // from the newest of them, whatever the backend holds. Records the
        // backend already has (but that were not flagged) are then applied
        // again by the gleaners: idempotent, since the chain has a put or
        // remove after which the value is rewritten whole (§4.4). A restart
        // after a write-heavy crash thus costs no backend lookup per key, on
        // a heap whose pages are all cold.
        let split = recs.partition_point(|r| r.h.version <= maxflag);
        let unflagged = &recs[split..];
        if let Some(k) = unflagged
            .iter()
            .rposition(|r| idempotent_opcode(r.h.opcode))
        {
            // Older than a record flagged applied: in the backend too (chains
            // are applied in order). Flag them, or no chain walk from the
            // frontend entry (which stops at the flagged record) reaches them
            // and the log's head never passes them.
            self.to_flag
                .extend(recs[..split].iter().filter(|r| !r.h.applied).map(|r| r.p));
            self.replayed += unflagged.len() as u64;
            let newest = unflagged.last().expect("non-empty");
            let blob = if k + 1 == unflagged.len() && newest.h.opcode == OPC_PUT {
                // The newest record is a put (the common case): its payload is
                // the value, copied once, into the frontend's blob.
                self.pool.payload(newest.p, &newest.h, &mut self.payload);
                Blob::new(&self.payload)
            } else {
                Blob::new_opt(self.fold(None, &unflagged[k..])?.as_deref())
            };
            self.insert(hash, key, blob, newest);
            return Ok(());
        }
        let found = self.bh.get(key, &mut self.buf)?;
        let stamp = if found {
            value::decode(&self.buf)
                .ok_or_else(|| Error::Corrupt("backend value without a stamp".into()))?
                .0
        } else {
            0
        };
        let done = maxflag.max(stamp);
        self.to_flag.extend(
            recs.iter()
                .filter(|r| r.h.version <= done && !r.h.applied)
                .map(|r| r.p),
        );
        let first = recs.partition_point(|r| r.h.version <= done);
        let pending = &recs[first..];
        if pending.is_empty() {
            return Ok(());
        }
        self.replayed += pending.len() as u64;
        // Increments and merges only (a put or remove would have been folded
        // above, or is in the backend): onto the backend value, each record
        // above its stamp exactly once.
        let base = if found {
            value::decode(&self.buf).map(|(_, v)| v.to_vec())
        } else {
            None
        };
        let val = self.fold(base, pending)?;
        let newest = pending.last().expect("non-empty");
        self.insert(hash, key, Blob::new_opt(val.as_deref()), newest);
        Ok(())
    }

    /// Puts `key`'s entry into the frontend, with `lentry` = its newest record
    /// `newest`. A key already there (a part run again, see `replay`) is left
    /// as it is (and counted: the count is of keys with an entry).
    fn insert(
        &mut self,
        hash: u64,
        key: &[u8],
        blob: crossbeam_epoch::Owned<FVal>,
        newest: &Found,
    ) {
        let mut l = self.table.lock(hash);
        if l.find(key).is_none() {
            l.insert(hash, key, blob, FMeta::new(newest.p.0, newest.h.version));
        }
        self.keys += 1;
    }

    /// Folds `recs` (in version order) onto `val`.
    fn fold(&mut self, mut val: Option<Vec<u8>>, recs: &[Found]) -> Result<Option<Vec<u8>>> {
        for r in recs {
            self.pool.payload(r.p, &r.h, &mut self.payload);
            val = fold(val, r.h.opcode, &self.payload)?;
        }
        Ok(val)
    }
}

#[cfg(test)]
mod tests {
    use super::super::glean::Gleaner;
    use super::super::{BulletOptions, BulletSession, BulletStore};
    use super::*;
    use crate::direct::BackendOptions;
    use crate::{Op, Session, Store};
    use pmem::Heap;
    use std::collections::HashMap;
    use std::time::Duration;

    fn heap_opts() -> pmem::HeapOptions {
        crate::test_heap_opts(64 << 20, 64 << 20)
    }

    fn opts() -> BulletOptions {
        BulletOptions {
            logs: 4,
            log_size: 1 << 20,
            backend: BackendOptions {
                buckets: 1024,
                ..Default::default()
            },
            frontend_buckets: 1024,
            // Nothing gleans but the test: records stay in the logs.
            epoch: Duration::from_secs(600),
            static_gleaners: 0,
            role_threads: 0,
            // Both halves of the fold on two threads.
            parallel_replay_from: 2,
            ..Default::default()
        }
    }

    /// Runs `round` for each of `drained` (then drains the store: their
    /// records are in the backend), `glean` (then one glean batch of one
    /// log applies and flags some of them, which stay in the log: no head
    /// advance) and `after`, with session `s` and then new ones; returns the
    /// last.
    fn rounds_in_tiers(
        st: &BulletStore,
        mut s: BulletSession,
        round: &mut dyn FnMut(&mut BulletSession, usize),
        drained: &[usize],
        glean: &[usize],
        after: &[usize],
    ) -> BulletSession {
        for &r in drained {
            round(&mut s, r);
        }
        drop(s);
        st.drain().unwrap();
        let mut s = st.session().unwrap();
        for &r in glean {
            round(&mut s, r);
        }
        drop(s);
        let mut g = Gleaner::new(&st.sh).unwrap();
        assert!(g.glean_batch(&st.sh).unwrap());
        g.retire(&st.sh);
        let mut s = st.session().unwrap();
        for &r in after {
            round(&mut s, r);
        }
        s
    }

    /// The two halves of a recovery's fold each take a heap thread slot (a
    /// backend handle); with one slot the second half cannot get one, and the
    /// halves run one after the other instead.
    #[test]
    fn replay_with_one_thread_slot_runs_the_halves_in_turn() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("h");
        let mut ho = heap_opts();
        ho.geometry.nslots = 1;
        // The store's epoch advancer takes a slot for its gleaner when it
        // starts: with one slot, it and this session race for it. Until the
        // session wins, a new heap.
        for attempt in 0.. {
            let _ = std::fs::remove_file(&path);
            let heap = Heap::create(&path, &ho).unwrap();
            let st = BulletStore::create(&heap, &opts()).unwrap();
            let mut s = match st.session() {
                Ok(s) => s,
                Err(Error::Index(index::Error::Heap(pmem::Error::NoThreadSlot(_))))
                    if attempt < 50 =>
                {
                    continue
                }
                Err(e) => panic!("{e}"),
            };
            for k in 0..300u64 {
                s.apply(format!("k{k}").as_bytes(), Op::Incr(k as i64))
                    .unwrap();
            }
            break;
        }
        let rec = Heap::open(&path, &ho).unwrap();
        // (The store then has no slot for a session: only the replay is
        // checked, by its counts.)
        let (_st, stats) = BulletStore::open(rec, &opts()).unwrap();
        assert_eq!((stats.keys, stats.replayed), (300, 300), "{stats:?}");
    }

    /// Recovery groups the logs' records by key hash; keys whose hashes
    /// collide (here: forced, every other key under one hash) still get their
    /// own values, including keys whose records are partly in the backend.
    #[test]
    fn replay_separates_keys_whose_hashes_collide() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("h");
        let mut model: HashMap<String, Option<Vec<u8>>> = HashMap::new();
        {
            let heap = Heap::create(&path, &heap_opts()).unwrap();
            let st = BulletStore::create(&heap, &opts()).unwrap();
            let s = st.session().unwrap();
            let mut round = |s: &mut BulletSession, r: usize| {
                for k in 0..200usize {
                    let key = format!("key-{k}{}", "x".repeat(k % 3));
                    match (k + r) % 4 {
                        0 | 1 => {
                            let v = format!("v{r}-{k}").into_bytes();
                            s.apply(key.as_bytes(), Op::Put(&v)).unwrap();
                            model.insert(key, Some(v));
                        }
                        2 => {
                            let n = match model.get(&key) {
                                Some(Some(v)) => match std::str::from_utf8(v)
                                    .ok()
                                    .and_then(|t| t.parse::<i64>().ok())
                                {
                                    Some(n) => n,
                                    None => continue,
                                },
                                _ => 0,
                            };
                            s.apply(key.as_bytes(), Op::Incr(k as i64)).unwrap();
                            model.insert(key, Some((n + k as i64).to_string().into_bytes()));
                        }
                        _ => {
                            s.apply(key.as_bytes(), Op::Remove).unwrap();
                            model.insert(key, None);
                        }
                    }
                }
                // Counters: after the partial glean below, their unflagged
                // records are all increments, folded onto the backend value.
                for c in 0..50usize {
                    let key = format!("cnt-{c}{}", "y".repeat(c % 2));
                    s.apply(key.as_bytes(), Op::Incr(c as i64 + 1)).unwrap();
                    let n = match model.get(&key) {
                        Some(Some(v)) => std::str::from_utf8(v).unwrap().parse::<i64>().unwrap(),
                        _ => 0,
                    };
                    model.insert(key, Some((n + c as i64 + 1).to_string().into_bytes()));
                }
            };
            // Part of the records in the backend and flagged, the rest not;
            // recovery finds flagged records, and increments after them
            // (folded onto the backend).
            let mut s = rounds_in_tiers(&st, s, &mut round, &[0, 1], &[2, 3], &[6]);
            // Increments only since the batch, for the keys holding numbers:
            // recovery folds them onto the backend's value.
            for (k, v) in model.iter_mut() {
                let n = match v {
                    Some(b) => match std::str::from_utf8(b)
                        .ok()
                        .and_then(|t| t.parse::<i64>().ok())
                    {
                        Some(n) => n,
                        None => continue,
                    },
                    None => 0,
                };
                s.apply(k.as_bytes(), Op::Incr(5)).unwrap();
                *v = Some((n + 5).to_string().into_bytes());
            }
            drop(s);
            assert!(st.log_occupancy_bytes().0 > 0);
            // Dropped without `close`: the next open replays the logs.
        }
        COLLIDE.with(|c| c.set(true));
        let rec = Heap::open(&path, &heap_opts()).unwrap();
        let (st, stats) = BulletStore::open(rec, &opts()).unwrap();
        COLLIDE.with(|c| c.set(false));
        assert!(stats.replayed > 0 && stats.keys > 100, "{stats:?}");
        // Some records were flagged, so not all were replayed.
        assert!(stats.replayed < stats.records, "{stats:?}");
        let mut s = st.session().unwrap();
        let mut out = Vec::new();
        for (k, v) in &model {
            let found = s.get(k.as_bytes(), &mut out).unwrap();
            assert_eq!(found.then_some(out.clone()), *v, "key {k}");
        }
        drop(s);
        st.drain().unwrap();
        st.verify().unwrap();
    }

    /// Recovery folds merges (edits of a list leaf, not idempotent) exactly
    /// once: keys whose unflagged records are all merges get them folded
    /// onto the backend value (part of their chain applied by a drain and by
    /// one glean batch whose flags stay in the log), keys whose unflagged
    /// records hold a put fold from it without a backend read; after the
    /// replay, a drain and a second restart, every leaf is the model's.
    #[test]
    fn replay_folds_merges_exactly_once() {
        use crate::types::edit::Edit;
        use crate::types::node::{Entry, Node};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("h");
        let mut model: HashMap<String, Vec<u8>> = HashMap::new();
        let mut edit = Vec::new();
        {
            let heap = Heap::create(&path, &heap_opts()).unwrap();
            let st = BulletStore::create(&heap, &opts()).unwrap();
            let s = st.session().unwrap();
            let empty = Node::Leaf(Vec::new()).encode(false);
            let mut round = |s: &mut BulletSession, r: usize| {
                for k in 0..120usize {
                    let key = format!("leaf-{k}");
                    if r == 0 || (k + r).is_multiple_of(17) {
                        // A put: the chain folds from it.
                        s.apply(key.as_bytes(), Op::Put(&empty)).unwrap();
                        model.insert(key.clone(), empty.clone());
                    }
                    for j in 0..1 + (k % 3) {
                        edit.clear();
                        let e = if j == 2 {
                            Edit::LeafRemove { pos: 0 }
                        } else {
                            Edit::LeafInsert {
                                pos: (k % 2) as u32 & j as u32,
                                entry: Entry::new(0.0, format!("{r}.{k}.{j}").into_bytes()),
                            }
                        };
                        e.encode(false, &mut edit);
                        let new = crate::merge_value(model.get(&key).map(|v| v.as_slice()), &edit)
                            .unwrap();
                        match s.apply(key.as_bytes(), Op::Merge(&edit)).unwrap() {
                            crate::Outcome::Merged(n) => assert_eq!(n, new.len()),
                            o => panic!("{o:?}"),
                        }
                        model.insert(key.clone(), new);
                    }
                }
            };
            drop(rounds_in_tiers(&st, s, &mut round, &[0, 1], &[2], &[3, 4]));
            // Dropped without `close`: the next open replays the logs.
        }
        for pass in 0..2 {
            let rec = Heap::open(&path, &heap_opts()).unwrap();
            let (st, stats) = BulletStore::open(rec, &opts()).unwrap();
            if pass == 0 {
                assert!(
                    stats.replayed > 0 && stats.replayed < stats.records,
                    "{stats:?}"
                );
            }
            let mut s = st.session().unwrap();
            let mut out = Vec::new();
            for (k, v) in &model {
                assert!(
                    s.get(k.as_bytes(), &mut out).unwrap(),
                    "pass {pass}: {k} lost"
                );
                assert_eq!(&out, v, "pass {pass}: key {k}");
            }
            drop(s);
            st.drain().unwrap();
            st.verify().unwrap();
            st.close().unwrap();
        }
    }
}
