//! Background work the workers share: the index of keys with a TTL that
//! active expiry samples (Redis's `expires` dict), and the lazy free of large
//! collections' pieces (Redis's lazy free), both run in bounded steps on
//! worker 0's tick (`expire.rs`).
//!
//! # The TTL index
//! A DRAM set of the store keys written with an expiry (every worker's
//! [`crate::keyspace::Keyspace::apply`] adds them). It may hold keys that
//! lost their TTL or are gone: the expiry cycle drops those when it samples
//! them, under the key's stripe lock (a writer adds under the same lock, so
//! a key re-written with a TTL is never dropped). After a restart it starts
//! empty: a one-time pass over the store ([`start_pass`], in bounded steps)
//! indexes the keys with a TTL that the store held, and finds the pending
//! lazy frees.
//!
//! # Lazy free
//! A collection with many pieces that is deleted, expired or overwritten
//! leaves, in the same batch as its head's removal, a *free-list entry*
//! under the internal key [`gc_key`] (`0xFF 0xFF "gc" ‖ id`, 12 bytes: no
//! piece key (17 bytes) nor the pieced marker (1 byte) has that length), whose
//! value is the collection's kind and head. [`lazy_free_step`] removes the
//! pieces in batches of [`FREE_BATCH`], children before parents (so that a
//! walk of what is left, after a crash, finds exactly the pieces not yet
//! removed), then the entry.

use crate::keyspace::{Keyspace, KsError, PIECE_PREFIX};
use crate::server::Shared;
use indexmap::IndexSet;
use std::collections::{BTreeMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Shards of the TTL index (writers on different shards do not contend).
const SHARDS: usize = 16;
/// Keys the expiry cycle samples per round (Redis's
/// `ACTIVE_EXPIRE_CYCLE_KEYS_PER_LOOP`).
pub const SAMPLE: usize = 20;
/// Another round of expiry follows while more than this percentage of a
/// round was reclaimed (Redis 7's `ACTIVE_EXPIRE_CYCLE_ACCEPTABLE_STALE`).
pub const ACCEPTABLE_STALE: usize = 10;
/// Pieces removed per lazy-free batch.
pub const FREE_BATCH: usize = 256;
/// A collection with fewer pieces is freed in its command's batch.
pub const LAZY_MIN_PIECES: u64 = 64;

/// The prefix of free-list entries' keys.
pub const GC_PREFIX: &[u8] = &[PIECE_PREFIX, PIECE_PREFIX, b'g', b'c'];
/// The prefix of the flush markers' keys (`0xFF 0xFF "flush" ‖ db`, 8 bytes).
pub const FLUSH_PREFIX: &[u8] = &[PIECE_PREFIX, PIECE_PREFIX, b'f', b'l', b'u', b's', b'h'];

/// The SWAPDB marker's key (`0xFF 0xFF "swapdb"`, 0xFF being
/// [`PIECE_PREFIX`]); its value is the two databases and the phase reached
/// (see `cmd::keys::swap_dbs`).
pub const SWAP_MARKER: &[u8] = b"\xff\xffswapdb";
/// The prefix under which a SWAPDB parks the first database's keys
/// (`0xFF 0xFF "swaptmp" ‖ key`, the value unchanged).
pub const SWAP_TMP: &[u8] = b"\xff\xffswaptmp";

/// Set in a free-list entry's first byte (with the kind) while a COPY is
/// still writing the collection: the entry is then followed by the
/// writing run's [`Housekeeping::run`] (u64 LE) and the head so far. The
/// lazy free leaves such an entry alone while its run is this one (the
/// COPY ends by removing it, or by turning it into a plain entry when it
/// fails); one from an earlier run is a copy a crash cut short, freed as any.
pub const IN_PROGRESS: u8 = 0x80;

/// The free-list entry of collection `id`.
pub fn gc_key(id: u64) -> Vec<u8> {
    let mut k = GC_PREFIX.to_vec();
    k.extend_from_slice(&id.to_be_bytes());
    k
}

/// The collection id of a free-list entry's key.
pub fn parse_gc_key(k: &[u8]) -> Option<u64> {
    let rest = k.strip_prefix(GC_PREFIX)?;
    Some(u64::from_be_bytes(rest.try_into().ok()?))
}

/// The flush marker of database `db`.
pub fn flush_key(db: u8) -> Vec<u8> {
    let mut k = FLUSH_PREFIX.to_vec();
    k.push(db);
    k
}

type KeySet = IndexSet<Box<[u8]>, foldhash::fast::RandomState>;

/// A lazy free in progress: the pieces left, children first.
struct Job {
    id: u64,
    pieces: Vec<u64>,
    at: usize,
}

#[derive(Default)]
struct Queue {
    /// Entries to free, with when they were seen applied.
    order: VecDeque<(u64, Instant)>,
    /// Every id queued or being freed (no entry is queued twice).
    known: HashSet<u64>,
}

/// The shared state of the background work.
pub struct Housekeeping {
    ttl: Vec<Mutex<KeySet>>,
    hasher: foldhash::fast::RandomState,
    /// The expiry cycle's sampling position: (shard, index).
    at: Mutex<(usize, usize)>,
    /// Whether the start pass is done (every key with a TTL is indexed and
    /// every free-list entry queued).
    indexed: AtomicBool,
    queue: Mutex<Queue>,
    job: Mutex<Option<Job>>,
    /// Collections freed by the lazy free (INFO `lazyfreed_objects`).
    pub freed: AtomicU64,
    /// Whether the active expiry cycle runs (`DEBUG SET-ACTIVE-EXPIRE`).
    pub active_expire: AtomicBool,
    /// The end of a CLIENT PAUSE (Unix ms; 0: none): see [`Self::paused`].
    paused_until: AtomicI64,
    /// This run's random number (see [`IN_PROGRESS`]).
    pub run: u64,
    /// The keys' access stamps, which reads and writes update (see
    /// [`crate::evict`]).
    pub access: crate::evict::Access,
}

impl Housekeeping {
    /// CLIENT PAUSE (WRITE or ALL) for `ms` from now: a later pause keeps
    /// the later end. `None`: CLIENT UNPAUSE.
    pub fn pause(&self, ms: Option<u64>) {
        match ms {
            Some(ms) => {
                let end = crate::keyspace::now_ms().saturating_add(ms.min(i64::MAX as u64) as i64);
                self.paused_until.fetch_max(end, Ordering::Relaxed);
            }
            None => self.paused_until.store(0, Ordering::Relaxed),
        }
    }

    /// Whether clients are paused: as in Redis 7.0, the dataset then stays
    /// as it is, so active expiry and eviction delete nothing, and a key
    /// found expired is reported missing but left in place (DBSIZE still
    /// counts it) until the pause ends.
    pub fn paused(&self) -> bool {
        let until = self.paused_until.load(Ordering::Relaxed);
        until != 0 && crate::keyspace::now_ms() < until
    }

    /// `pass`: whether the store may hold keys with a TTL or free-list
    /// entries that a start pass must find.
    pub fn new(pass: bool) -> Housekeeping {
        Housekeeping {
            ttl: (0..SHARDS).map(|_| Mutex::new(KeySet::default())).collect(),
            hasher: foldhash::fast::RandomState::default(),
            at: Mutex::new((0, 0)),
            indexed: AtomicBool::new(!pass),
            queue: Mutex::new(Queue::default()),
            job: Mutex::new(None),
            freed: AtomicU64::new(0),
            active_expire: AtomicBool::new(true),
            paused_until: AtomicI64::new(0),
            run: crate::coll::new_id(),
            access: crate::evict::Access::new(),
        }
    }

    fn shard(&self, skey: &[u8]) -> &Mutex<KeySet> {
        let h = std::hash::BuildHasher::hash_one(&self.hasher, skey) as usize;
        &self.ttl[h % SHARDS]
    }

    /// Notes that `skey` was written with an expiry (its stripe lock held).
    pub fn note_ttl(&self, skey: &[u8]) {
        let mut s = lock(self.shard(skey));
        if !s.contains(skey) {
            s.insert(skey.into());
        }
    }

    /// Drops `skey` from the TTL index (its stripe lock held, the key found
    /// gone or without a TTL).
    pub(crate) fn forget(&self, skey: &[u8]) {
        lock(self.shard(skey)).swap_remove(skey);
    }

    /// Keys in the TTL index (some may be stale).
    pub fn ttl_len(&self) -> usize {
        self.ttl.iter().map(|s| lock(s).len()).sum()
    }

    /// Up to `n` keys of the index, from where the last call stopped.
    fn sample(&self, n: usize, out: &mut Vec<Vec<u8>>) {
        let mut at = lock(&self.at);
        for _ in 0..=SHARDS {
            let s = lock(&self.ttl[at.0]);
            if at.1 < s.len() {
                let end = (at.1 + n).min(s.len());
                out.extend(
                    (at.1..end)
                        .filter_map(|i| s.get_index(i))
                        .map(|k| k.to_vec()),
                );
                at.1 = end;
                return;
            }
            drop(s);
            *at = ((at.0 + 1) % SHARDS, 0);
        }
    }

    /// Up to `n` keys of the index from a random position (eviction's
    /// volatile-* sampling; some may be stale).
    pub fn random_ttl_keys(&self, n: usize, out: &mut Vec<Vec<u8>>) {
        let first = rand::random::<u64>() as usize;
        for i in 0..SHARDS {
            let s = lock(&self.ttl[(first + i) % SHARDS]);
            if s.is_empty() {
                continue;
            }
            let at = rand::random::<u64>() as usize % s.len();
            out.extend(
                (0..n.min(s.len()))
                    .filter_map(|j| s.get_index((at + j) % s.len()))
                    .map(|k| k.to_vec()),
            );
            return;
        }
    }

    /// Whether the start pass is done.
    pub fn indexed(&self) -> bool {
        self.indexed.load(Ordering::Acquire)
    }

    /// Queues the free-list entry of collection `id` (applied to the store).
    pub fn enqueue(&self, id: u64) {
        let mut q = lock(&self.queue);
        if q.known.insert(id) {
            q.order.push_back((id, Instant::now()));
        }
    }

    /// Collections whose pieces are waiting to be freed (INFO
    /// `lazyfree_pending_objects`; after a restart, those the start pass
    /// has found so far).
    pub fn pending(&self) -> usize {
        lock(&self.queue).known.len()
    }

    fn done(&self, id: u64) {
        lock(&self.queue).known.remove(&id);
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// One active-expiry cycle (Redis's `activeExpireCycle`, slow kind): rounds
/// of [`SAMPLE`] keys from the TTL index; expired keys are deleted, keys no
/// longer holding a TTL are dropped from the index; another round follows
/// while more than [`ACCEPTABLE_STALE`]% of a round was reclaimed, until
/// `deadline`.
/// Returns the keys it deleted.
pub fn expire_cycle(sh: &Shared, ks: &mut Keyspace, deadline: Instant) -> u64 {
    let hk = &sh.hk;
    let mut keys = Vec::with_capacity(SAMPLE);
    let mut deleted = 0;
    // TTLs left on the live keys seen, per database: (sum, count); i128, as
    // a TTL may lie near the end of time (PXAT).
    let mut ttls: BTreeMap<u8, (i128, i64)> = BTreeMap::new();
    loop {
        keys.clear();
        hk.sample(SAMPLE, &mut keys);
        if keys.is_empty() {
            break;
        }
        let now = crate::keyspace::now_ms();
        let mut reclaimed = 0;
        for k in &keys {
            match ks.lookup_raw(k, now) {
                Ok((Some(h), false)) if h.expire.is_some() => {
                    if let (Some(t), Some(&db)) = (h.expire, k.first()) {
                        let e = ttls.entry(db).or_default();
                        e.0 += i128::from(t - now);
                        e.1 += 1;
                    }
                    continue;
                }
                Ok(_) => {}
                Err(_) => continue,
            }
            // Expired, gone, or without a TTL: decided under the lock.
            let _g = sh.stripes.lock(k);
            match ks.lookup_raw(k, now) {
                Ok((None, true)) => {
                    if ks.lookup_expiring(k, now).is_ok() {
                        hk.forget(k);
                        deleted += 1;
                        reclaimed += 1;
                    }
                }
                Ok((Some(h), false)) if h.expire.is_some() => {}
                Ok(_) => {
                    hk.forget(k);
                    reclaimed += 1;
                }
                Err(_) => {}
            }
        }
        if reclaimed * 100 <= keys.len() * ACCEPTABLE_STALE || Instant::now() >= deadline {
            break;
        }
    }
    for (db, (sum, n)) in ttls {
        sh.counts.sample_ttls(db, sum, n);
    }
    deleted
}

/// Steps of the start pass until `deadline` or its end (`cursor`: where the
/// store scan is): indexes the keys with a TTL, deletes the expired ones,
/// and queues the free-list entries.
pub fn start_pass(
    sh: &Shared,
    ks: &mut Keyspace,
    cursor: &mut u64,
    deadline: Option<Instant>,
) -> Result<(), KsError> {
    let hk = &sh.hk;
    let mut page = Vec::new();
    while !hk.indexed() {
        page.clear();
        let next = ks.sess.scan(*cursor, 200, &mut page)?;
        let now = crate::keyspace::now_ms();
        for k in &page {
            if k.first() == Some(&PIECE_PREFIX) {
                if let Some(id) = parse_gc_key(k) {
                    hk.enqueue(id);
                }
                continue;
            }
            // A value this version cannot read is left to the commands
            // that meet it (they report it); the pass goes on.
            match ks.lookup_raw(k, now) {
                Ok((Some(h), false)) if h.expire.is_some() => hk.note_ttl(k),
                // Deleted here as the expiry cycle would; left indexed for
                // it while background expiry is off (DEBUG SET-ACTIVE-EXPIRE).
                Ok((None, true)) if !hk.active_expire.load(Ordering::Relaxed) || hk.paused() => {
                    hk.note_ttl(k)
                }
                Ok((None, true)) => {
                    let _g = sh.stripes.lock(k);
                    ks.lookup_expiring(k, now)?;
                }
                _ => {}
            }
        }
        *cursor = next;
        if next == 0 {
            hk.indexed.store(true, Ordering::Release);
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            break;
        }
    }
    Ok(())
}

/// Lazy-free batches until `deadline` or nothing is left to free (entries
/// queued less than `min_age` ago wait: see ARCHITECTURE.md, "Lazy free").
pub fn lazy_free_step(
    sh: &Shared,
    ks: &mut Keyspace,
    deadline: Option<Instant>,
    min_age: Duration,
) -> Result<(), KsError> {
    // Every node of a cluster frees the pieces of the collections its
    // applied writes handed to the lazy free: these writes are its own.
    ks.set_local(true);
    let r = lazy_free_run(sh, ks, deadline, min_age);
    ks.set_local(false);
    r
}

fn lazy_free_run(
    sh: &Shared,
    ks: &mut Keyspace,
    deadline: Option<Instant>,
    min_age: Duration,
) -> Result<(), KsError> {
    let hk = &sh.hk;
    let mut job = lock(&hk.job);
    let mut kbuf = Vec::new();
    loop {
        if job.is_none() {
            let id = {
                let mut q = lock(&hk.queue);
                match q.order.front() {
                    Some(&(id, t)) if t.elapsed() >= min_age => {
                        q.order.pop_front();
                        id
                    }
                    _ => return Ok(()),
                }
            };
            let mut v = Vec::new();
            let found = ks.get_piece(&gc_key(id), &mut v);
            let pieces = match (found, entry(&v)) {
                (Ok(false), _) => {
                    hk.done(id);
                    continue;
                }
                // A COPY of this run is still writing it.
                (Ok(true), Some((_, _, Some(run)))) if run == hk.run => {
                    hk.done(id);
                    continue;
                }
                (Ok(true), Some((kind, head, _))) => crate::coll::pieces_left(ks, kind, head),
                (Ok(true), None) => Err(KsError::Corrupt),
                (Err(e), _) => Err(e),
            };
            // An entry that cannot be read or walked stays in the store (a
            // later start tries again) and leaves the queue.
            let pieces = pieces.inspect_err(|_| hk.done(id))?;
            *job = Some(Job { id, pieces, at: 0 });
        }
        let Some(j) = job.as_mut() else {
            continue;
        };
        let end = (j.at + FREE_BATCH).min(j.pieces.len());
        for &p in &j.pieces[j.at..end] {
            engine::types::head::piece_key(j.id, p, &mut kbuf);
            ks.remove_piece(&kbuf);
        }
        let finished = end == j.pieces.len();
        if finished {
            ks.remove_piece(&gc_key(j.id));
        }
        ks.apply()?;
        j.at = end;
        if finished {
            hk.done(j.id);
            hk.freed.fetch_add(1, Ordering::Relaxed);
            *job = None;
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return Ok(());
        }
    }
}

/// A free-list entry's kind, head, and the run of the COPY still writing
/// it (see [`IN_PROGRESS`]).
fn entry(v: &[u8]) -> Option<(u8, &[u8], Option<u64>)> {
    let (&first, rest) = v.split_first()?;
    if first & IN_PROGRESS == 0 {
        return Some((first, rest, None));
    }
    let run = u64::from_le_bytes(rest.get(..8)?.try_into().ok()?);
    Some((first & !IN_PROGRESS, &rest[8..], Some(run)))
}

/// Runs the start pass to its end, one expiry cycle, and frees every
/// queued collection now (tests and the fuzz harness, which have no worker
/// tick).
pub fn run_all(sh: &Shared, ks: &mut Keyspace) -> Result<(), KsError> {
    let mut cursor = 0;
    start_pass(sh, ks, &mut cursor, None)?;
    expire_cycle(sh, ks, Instant::now() + Duration::from_millis(100));
    lazy_free_step(sh, ks, None, Duration::ZERO)
}
