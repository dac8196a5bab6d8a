//! Per-database key counts, so that DBSIZE and INFO's keyspace section answer
//! from counters instead of a scan of every key (which took 3 s at a million
//! keys and held up every client of the worker meanwhile).
//!
//! A count is of the keys present in the store, keys whose TTL has passed but
//! that no access or expiry cycle has deleted yet included: what Redis's DBSIZE
//! counts (the size of the database's dictionary). `expires` counts those with
//! a TTL, as Redis's INFO keyspace does.
//!
//! # Where the counts come from
//! - **Writes.** Every put and remove a worker applies goes through
//!   [`crate::keyspace::Keyspace`], which adds what it changed to its worker's
//!   shard of the counters (no cache line shared between workers). The store
//!   says whether a put created its key and what the replaced value's first
//!   byte (the type and TTL tag) was ([`engine::Outcome::Put`]); a remove's
//!   caller looked the key up first.
//! - **A clean shutdown** writes the totals into the store under
//!   [`COUNTS_KEY`], the empty key, which no client key can be (a store key
//!   always begins with its database byte), with the heap's open generation.
//!   The next start reads them back when its generation is the next one: no
//!   run wrote to the heap in between. That read is one lookup.
//! - **Otherwise** (after a crash, on a heap written before counts existed, on
//!   the volatile engine) a background thread recounts with a cursor scan while
//!   the server serves. The scan visits keys in order of their split-order
//!   position ([`index::scan_pos`]); a write of a key below the recount's cursor
//!   adds its change, a write of a key at or past it does not (the recount
//!   counts that key's state when it gets there). A write and a recount step
//!   exclude each other through one mutex, taken by writers only while a
//!   recount runs. DBSIZE or INFO keyspace asked before the recount ends
//!   finishes it on the asking worker (once per crash, at the cost of the old
//!   full scan).

use engine::Session;
use index::KeyHasher;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Mutex, MutexGuard};

/// Databases a store key can name (its first byte).
pub const DBS: usize = 256;
/// Two counters a database: keys, then keys with a TTL.
const SLOTS: usize = 2 * DBS;
/// The store key of the counts written at a clean shutdown.
pub const COUNTS_KEY: &[u8] = b"";
/// The snapshot's first bytes (its format, version 1).
const MAGIC: &[u8; 8] = b"EMBCNT01";
/// Keys a recount step asks the scan for.
const STEP_KEYS: usize = 128;

/// What a write did to the counts of its database.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Delta {
    pub keys: i64,
    pub expires: i64,
}

impl Delta {
    /// From the key's state before and after: `None` absent, `Some(ttl)`
    /// present (with a TTL or not).
    pub fn between(before: Option<bool>, after: Option<bool>) -> Delta {
        let n = |s: Option<bool>| i64::from(s.is_some());
        let t = |s: Option<bool>| i64::from(s == Some(true));
        Delta {
            keys: n(after) - n(before),
            expires: t(after) - t(before),
        }
    }
}

/// The recount's progress, under the mutex writers take while it runs.
#[derive(Debug)]
pub struct Recount {
    /// Every key whose position is below this has been counted.
    cursor: u64,
    done: bool,
}

/// Keys and keys with a TTL of every database.
pub struct KeyCounts {
    /// Counted by the recount, or read from the snapshot.
    base: Box<[AtomicI64]>,
    /// One per worker: the changes its writes made (each written by its
    /// worker only).
    shards: Box<[Box<[AtomicI64]>]>,
    /// The counts are exact (the recount ended, or the snapshot was read).
    ready: AtomicBool,
    recount: Mutex<Recount>,
    /// The store's key hash, whose scan positions order the recount.
    hasher: KeyHasher,
    /// Per database, the estimate of the TTL left (ms) that INFO keyspace
    /// reports as `avg_ttl`, from active expiry's samples (see
    /// [`Self::sample_ttls`]); 0 when not known.
    avg_ttl: Box<[AtomicI64]>,
}

fn zeros() -> Box<[AtomicI64]> {
    (0..SLOTS).map(|_| AtomicI64::new(0)).collect()
}

impl KeyCounts {
    /// Counts not yet known (a recount from the start is due), for `workers`
    /// writers.
    pub fn new(workers: usize, hasher: KeyHasher) -> KeyCounts {
        KeyCounts {
            base: zeros(),
            shards: (0..workers.max(1)).map(|_| zeros()).collect(),
            ready: AtomicBool::new(false),
            recount: Mutex::new(Recount {
                cursor: 0,
                done: false,
            }),
            hasher,
            avg_ttl: (0..DBS).map(|_| AtomicI64::new(0)).collect(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Recount> {
        self.recount.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }

    /// What a writer holds around its store write while a recount runs (None
    /// once the counts are exact).
    pub fn write_guard(&self) -> Option<MutexGuard<'_, Recount>> {
        if self.ready() {
            None
        } else {
            Some(self.lock())
        }
    }

    /// Adds a write's change to `shard`; `guard` is what [`Self::write_guard`]
    /// returned before the write.
    pub fn add(
        &self,
        shard: usize,
        skey: &[u8],
        d: Delta,
        guard: Option<&MutexGuard<'_, Recount>>,
    ) {
        let Some(&db) = skey.first() else { return };
        if d == Delta::default() {
            return;
        }
        if let Some(g) = guard {
            if !g.done && index::scan_pos(self.hasher.hash(skey)) >= g.cursor {
                // The recount has not reached this key: it will count what
                // the write left.
                return;
            }
        }
        // A shard has one writer (its worker): a load and a store, not a
        // locked add.
        let s = &self.shards[shard % self.shards.len()];
        let i = 2 * db as usize;
        for (slot, v) in [(i, d.keys), (i + 1, d.expires)] {
            s[slot].store(s[slot].load(Ordering::Relaxed) + v, Ordering::Relaxed);
        }
    }

    /// Keys and keys with a TTL of `db`; None until the counts are exact.
    pub fn get(&self, db: u8) -> Option<(u64, u64)> {
        if !self.ready() {
            return None;
        }
        let i = 2 * db as usize;
        let sum = |j: usize| {
            let s: i64 = self.base[j].load(Ordering::Relaxed)
                + self
                    .shards
                    .iter()
                    .map(|s| s[j].load(Ordering::Relaxed))
                    .sum::<i64>();
            s.max(0) as u64
        };
        Some((sum(i), sum(i + 1)))
    }

    /// Folds the TTLs left (ms) that one active-expiry slice found on `n`
    /// live keys of `db`, summing to `sum`, into the database's `avg_ttl`, as
    /// Redis does: the slice's mean weighs 1/50 against the estimate so far,
    /// which starts at the first slice's mean.
    pub fn sample_ttls(&self, db: u8, sum: i128, n: i64) {
        if n <= 0 {
            return;
        }
        let mean = (sum / i128::from(n)).clamp(0, i128::from(i64::MAX)) as i64;
        let a = &self.avg_ttl[db as usize];
        let mut cur = a.load(Ordering::Relaxed);
        if cur == 0 {
            cur = mean;
        }
        a.store((cur / 50) * 49 + mean / 50, Ordering::Relaxed);
    }

    /// `db`'s `avg_ttl` estimate (0: none yet). INFO reports 0 for a database
    /// without keys with a TTL whatever this says, as the estimate is reset
    /// only at the next expiry tick.
    pub fn avg_ttl(&self, db: u8) -> i64 {
        self.avg_ttl[db as usize].load(Ordering::Relaxed)
    }

    /// SWAPDB: the databases' `avg_ttl` estimates go with their keys.
    pub fn swap_avg_ttl(&self, x: u8, y: u8) {
        let (a, b) = (&self.avg_ttl[x as usize], &self.avg_ttl[y as usize]);
        let t = a.swap(b.load(Ordering::Relaxed), Ordering::Relaxed);
        b.store(t, Ordering::Relaxed);
    }

    /// Forgets `db`'s estimate (FLUSHDB, or no key with a TTL left there).
    pub fn reset_avg_ttl(&self, db: u8) {
        self.avg_ttl[db as usize].store(0, Ordering::Relaxed);
    }

    /// One recount step with `sess`: counts the keys of the next scan page.
    /// Returns true once the counts are exact.
    pub fn step(&self, sess: &mut dyn Session) -> engine::Result<bool> {
        let mut g = self.lock();
        if g.done {
            return Ok(true);
        }
        let mut page = Vec::new();
        let from = g.cursor;
        let next = sess.scan(from, STEP_KEYS, &mut page)?;
        page.sort_unstable();
        page.dedup();
        let mut raw = Vec::new();
        for k in &page {
            let Some(&db) = k.first() else { continue };
            if db == crate::keyspace::PIECE_PREFIX {
                continue;
            }
            let pos = index::scan_pos(self.hasher.hash(k));
            // Keys past the step's end are counted by a later step.
            if pos < from || (next != 0 && pos >= next) {
                continue;
            }
            if !sess.get(k, &mut raw)? {
                continue;
            }
            let ttl = crate::keyspace::decode(&raw).is_some_and(|h| h.expire.is_some());
            let i = 2 * db as usize;
            self.base[i].fetch_add(1, Ordering::Relaxed);
            self.base[i + 1].fetch_add(i64::from(ttl), Ordering::Relaxed);
        }
        g.cursor = next;
        if next == 0 {
            g.done = true;
            self.ready.store(true, Ordering::Release);
        }
        Ok(g.done)
    }

    /// Runs the recount to its end on this thread (DBSIZE, INFO keyspace).
    pub fn finish(&self, sess: &mut dyn Session) -> engine::Result<()> {
        while !self.step(sess)? {}
        Ok(())
    }

    /// The snapshot of exact counts written at a clean shutdown: the magic, the
    /// heap's open generation, then (database byte, keys, expires) for each
    /// database with keys, little-endian. None while a recount runs.
    pub fn snapshot(&self, generation: u64) -> Option<Vec<u8>> {
        if !self.ready() {
            return None;
        }
        let mut out = MAGIC.to_vec();
        out.extend_from_slice(&generation.to_le_bytes());
        for db in 0..DBS {
            let (k, e) = self.get(db as u8)?;
            if k > 0 || e > 0 {
                out.push(db as u8);
                out.extend_from_slice(&k.to_le_bytes());
                out.extend_from_slice(&e.to_le_bytes());
            }
        }
        Some(out)
    }

    /// Takes the counts from a snapshot written by the run whose open
    /// generation was `generation`; false (and nothing changed) when it is
    /// malformed or from another generation.
    pub fn restore(&self, snap: &[u8], generation: u64) -> bool {
        let Some(rest) = snap.strip_prefix(MAGIC) else {
            return false;
        };
        if rest.len() < 8 || (rest.len() - 8) % 17 != 0 {
            return false;
        }
        let (gen, entries) = rest.split_at(8);
        if u64::from_le_bytes(gen.try_into().unwrap_or_default()) != generation {
            return false;
        }
        let mut counts = vec![0i64; SLOTS];
        for e in entries.chunks_exact(17) {
            let db = e[0] as usize;
            let k = u64::from_le_bytes(e[1..9].try_into().unwrap_or_default());
            let x = u64::from_le_bytes(e[9..17].try_into().unwrap_or_default());
            if k > i64::MAX as u64 || x > k {
                return false;
            }
            counts[2 * db] = k as i64;
            counts[2 * db + 1] = x as i64;
        }
        let mut g = self.lock();
        for (b, c) in self.base.iter().zip(counts) {
            b.store(c, Ordering::Relaxed);
        }
        g.done = true;
        self.ready.store(true, Ordering::Release);
        true
    }
}

/// At startup: the counts the last clean shutdown wrote, when the run before
/// this one wrote them (heap generation one less than this open's); otherwise
/// counts to be recounted (see [`recount_thread`]).
pub fn load(store: &crate::store::AnyStore, workers: usize) -> engine::Result<KeyCounts> {
    let counts = KeyCounts::new(workers, store.key_hasher());
    if let Some(gen) = store.heap().map(|h| h.region().generation()) {
        let mut sess = store.session()?;
        let mut raw = Vec::new();
        if sess.get(COUNTS_KEY, &mut raw)? && gen > 1 {
            counts.restore(&raw, gen - 1);
        }
    }
    Ok(counts)
}

/// At a clean shutdown (workers stopped): writes the exact counts into the
/// store, durably; nothing when a recount had not ended.
pub fn save(store: &crate::store::AnyStore, counts: &KeyCounts) -> engine::Result<()> {
    let Some(gen) = store.heap().map(|h| h.region().generation()) else {
        return Ok(());
    };
    let Some(snap) = counts.snapshot(gen) else {
        return Ok(());
    };
    let mut sess = store.session()?;
    sess.apply(COUNTS_KEY, engine::Op::Put(&snap))?;
    sess.commit()
}

/// The background recount: steps until the counts are exact or the server
/// shuts down, yielding the mutex between steps so writers keep going.
pub fn recount_thread(sh: std::sync::Arc<crate::server::Shared>) {
    let mut sess = match sh.store.session() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("ember: key count: cannot open a store session: {e}");
            return;
        }
    };
    let t = std::time::Instant::now();
    while !sh.shutdown.load(Ordering::Acquire) {
        match sh.counts.step(&mut *sess) {
            Ok(true) => {
                eprintln!(
                    "ember: key counts recounted in {:.1} ms",
                    t.elapsed().as_secs_f64() * 1e3
                );
                return;
            }
            Ok(false) => std::thread::yield_now(),
            Err(e) => {
                eprintln!("ember: key count: the recount failed ({e}); DBSIZE will retry it");
                return;
            }
        }
    }
}

/// Keys and keys with a TTL of `db` (DBSIZE, INFO keyspace): from the counts,
/// after finishing a recount in progress on this worker.
pub fn db_counts(
    ctx: &mut crate::cmd::Ctx,
    db: u8,
) -> Result<(u64, u64), crate::keyspace::KsError> {
    let counts = &ctx.sh.counts;
    if !counts.ready() {
        counts.finish(&mut *ctx.ks.sess)?;
    }
    Ok(counts.get(db).unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn avg_ttl_is_redis_running_estimate() {
        let c = KeyCounts::new(1, KeyHasher::sip13(1, 2));
        assert_eq!(c.avg_ttl[3].load(Ordering::Relaxed), 0);
        // The first slice's mean, then 49/50 of the estimate plus 1/50 of
        // each later slice's mean.
        c.sample_ttls(3, 3 * 100_000, 3);
        assert_eq!(c.avg_ttl[3].load(Ordering::Relaxed), 100_000);
        c.sample_ttls(3, 50_000, 1);
        assert_eq!(c.avg_ttl[3].load(Ordering::Relaxed), 99_000);
        c.sample_ttls(3, 0, 0);
        assert_eq!(c.avg_ttl[3].load(Ordering::Relaxed), 99_000);
        // TTLs near the end of time neither overflow nor go negative.
        c.sample_ttls(5, 200 * i128::from(i64::MAX - 1), 200);
        assert!(c.avg_ttl[5].load(Ordering::Relaxed) > i64::MAX / 2);
        c.sample_ttls(5, 200 * i128::from(i64::MAX - 1), 200);
        assert!(c.avg_ttl[5].load(Ordering::Relaxed) > 0);
        assert_eq!(c.avg_ttl[4].load(Ordering::Relaxed), 0);
        c.reset_avg_ttl(3);
        assert_eq!(c.avg_ttl[3].load(Ordering::Relaxed), 0);
    }

    #[test]
    fn deltas() {
        let d = |k, e| Delta {
            keys: k,
            expires: e,
        };
        assert_eq!(Delta::between(None, Some(false)), d(1, 0));
        assert_eq!(Delta::between(None, Some(true)), d(1, 1));
        assert_eq!(Delta::between(Some(true), Some(false)), d(0, -1));
        assert_eq!(Delta::between(Some(false), Some(true)), d(0, 1));
        assert_eq!(Delta::between(Some(true), None), d(-1, -1));
        assert_eq!(Delta::between(Some(false), None), d(-1, 0));
        assert_eq!(Delta::between(None, None), d(0, 0));
    }

    #[test]
    fn snapshot_round_trip_and_refusals() {
        let h = KeyHasher::sip13(1, 2);
        let c = KeyCounts::new(2, h);
        assert_eq!(c.get(0), None);
        assert_eq!(c.snapshot(7), None);
        c.restore(&[], 0);
        assert!(!c.ready());
        // Exact from here on: what writes add is summed over the shards.
        let mut v = MAGIC.to_vec();
        v.extend_from_slice(&7u64.to_le_bytes());
        assert!(c.restore(&v, 7));
        c.add(
            0,
            b"\x03a",
            Delta {
                keys: 1,
                expires: 1,
            },
            None,
        );
        c.add(
            1,
            b"\x03b",
            Delta {
                keys: 1,
                expires: 0,
            },
            None,
        );
        c.add(
            1,
            b"\xffz",
            Delta {
                keys: 1,
                expires: 0,
            },
            None,
        );
        c.add(
            0,
            b"",
            Delta {
                keys: 1,
                expires: 0,
            },
            None,
        );
        assert_eq!(c.get(3), Some((2, 1)));
        assert_eq!(c.get(255), Some((1, 0)));
        assert_eq!(c.get(0), Some((0, 0)));
        let s = c.snapshot(9).unwrap();
        let d = KeyCounts::new(1, h);
        assert!(
            !d.restore(&s, 8),
            "another generation's snapshot is refused"
        );
        assert!(!d.restore(&s[..s.len() - 1], 9), "a truncated one too");
        let mut bad = s.clone();
        bad[..8].copy_from_slice(b"EMBCNT02");
        assert!(!d.restore(&bad, 9), "and a foreign one");
        assert!(!d.ready());
        assert!(d.restore(&s, 9));
        assert_eq!(
            (d.get(3), d.get(255), d.get(4)),
            (Some((2, 1)), Some((1, 0)), Some((0, 0)))
        );
    }

    /// The recount protocol under a concurrent writer: one thread recounts
    /// (128 keys a step) while another puts and removes random keys, with and
    /// without TTLs, through a `Keyspace`; once both are done the counts equal
    /// the writer's model. A write ahead of the cursor counted twice, or one
    /// behind it missed, makes the totals drift.
    #[test]
    fn recount_under_concurrent_writes_is_exact() {
        use crate::keyspace::{Keyspace, KIND_STRING};
        use engine::volatile::VolatileStore;
        use engine::Store as _;
        use rand::{RngExt, SeedableRng};
        use std::collections::HashMap;
        use std::sync::Arc;
        for seed in 0..6u64 {
            let store = Arc::new(VolatileStore::new(1024));
            let counts = Arc::new(KeyCounts::new(1, store.key_hasher()));
            let mut ks = Keyspace::new(
                Box::new(store.session().unwrap()),
                counts.clone(),
                0,
                Arc::new(crate::housekeep::Housekeeping::new(false)),
            );
            let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
            // Model: store key -> has a TTL.
            let mut model: HashMap<Vec<u8>, bool> = HashMap::new();
            let mut op = |ks: &mut Keyspace, rng: &mut rand::rngs::SmallRng| {
                let db = rng.random_range(0..3u8);
                let k =
                    crate::keyspace::skey(db, format!("k{}", rng.random_range(0..4000)).as_bytes());
                if rng.random_range(0..3) == 0 {
                    let live = ks.delete(&k, 0).unwrap();
                    ks.apply().unwrap();
                    assert_eq!(live, model.remove(&k).is_some());
                } else {
                    let ttl = rng.random_bool(0.3).then_some(i64::MAX);
                    ks.put(&k, KIND_STRING, ttl, b"v");
                    ks.apply().unwrap();
                    model.insert(k, ttl.is_some());
                }
            };
            for _ in 0..3000 {
                op(&mut ks, &mut rng);
            }
            let rc = {
                let (store, counts) = (store.clone(), counts.clone());
                std::thread::spawn(move || {
                    let mut s = store.session().unwrap();
                    let mut steps = 0;
                    while !counts.step(&mut s).unwrap() {
                        steps += 1;
                        std::thread::yield_now();
                    }
                    steps
                })
            };
            while !counts.ready() {
                op(&mut ks, &mut rng);
            }
            assert!(
                rc.join().unwrap() > 4,
                "seed {seed}: the recount took several steps"
            );
            for _ in 0..500 {
                op(&mut ks, &mut rng);
            }
            for db in 0..4u8 {
                let keys = model.keys().filter(|k| k[0] == db).count() as u64;
                let ttls = model.iter().filter(|(k, t)| k[0] == db && **t).count() as u64;
                assert_eq!(counts.get(db), Some((keys, ttls)), "seed {seed}, db {db}");
            }
        }
    }

    #[test]
    fn writes_ahead_of_the_recount_are_left_to_it() {
        let h = KeyHasher::sip13(5, 6);
        let c = KeyCounts::new(1, h);
        let pos = |k: &[u8]| index::scan_pos(h.hash(k));
        // Pick a key below and one above a cursor between them.
        let keys: Vec<Vec<u8>> = (0..64u8).map(|i| vec![0, i]).collect();
        let mut by_pos: Vec<&Vec<u8>> = keys.iter().collect();
        by_pos.sort_by_key(|k| pos(k));
        let (low, high) = (by_pos[10], by_pos[50]);
        c.lock().cursor = pos(by_pos[30]);
        let one = Delta {
            keys: 1,
            expires: 0,
        };
        for k in [low, high] {
            let g = c.write_guard();
            c.add(0, k, one, g.as_ref());
        }
        // Only the key the recount has passed was added.
        assert_eq!(c.shards[0][0].load(Ordering::Relaxed), 1);
    }
}
