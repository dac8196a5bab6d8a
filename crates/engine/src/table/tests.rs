use super::value::INLINE_KEY;
use super::*;
use std::collections::HashMap;
use std::sync::atomic::{AtomicIsize, AtomicU64};
use std::thread;
use std::time::{Duration, Instant};

/// xorshift64*: deterministic, no dependency on rand's API.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn strong_hash(key: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(key)
}

/// Many full-hash collisions: exercises key comparison and long chains.
fn weak_hash(key: &[u8]) -> u64 {
    u64::from_le_bytes(key.try_into().unwrap()) % 61
}

fn kb(k: u64) -> [u8; 8] {
    k.to_le_bytes()
}

/// Blob values (bytes and tombstones, empty and long) with inline and
/// boxed keys, replaced and carried through several doublings, read back
/// against a model; and a blob's copy is equal and independent.
#[test]
fn blob_values_and_key_sizes_through_doublings() {
    let t: Table<Blob, ()> = Table::new(16);
    let mut model: HashMap<Vec<u8>, Option<Vec<u8>>> = HashMap::new();
    let mut rng = Rng::new(11);
    for i in 0..5_000u64 {
        // Key lengths around the inline limit.
        let klen = [0, 1, INLINE_KEY - 1, INLINE_KEY, INLINE_KEY + 1, 200][(i % 6) as usize];
        let k = rng.below(1_500);
        let mut key = k.to_le_bytes().repeat(klen / 8 + 1);
        key.truncate(klen.max(8));
        key[..8].copy_from_slice(&k.to_le_bytes());
        let v: Option<Vec<u8>> = match rng.below(5) {
            0 => None,
            1 => Some(Vec::new()),
            2 => Some(vec![b'x'; 5_000]),
            _ => Some(format!("v{i}").into_bytes()),
        };
        let h = strong_hash(&key);
        let mut l = t.lock(h);
        match l.find(&key) {
            Some(n) => l.set_value(n, Blob::new_opt(v.as_deref())),
            None => {
                l.insert(h, &key, Blob::new_opt(v.as_deref()), ());
            }
        }
        drop(l);
        model.insert(key, v);
        if i % 7 == 0 {
            // A hint in the middle of the doublings: changes nothing.
            let ks: Vec<&[u8]> = model.keys().take(40).map(|k| k.as_slice()).collect();
            prefetch_keys(&t, &crate::KeyHasher::random(), &ks);
        }
    }
    t.wait_resize();
    assert!(t.buckets() >= model.len(), "load factor at most 1");
    let g = epoch::pin();
    for (k, v) in &model {
        let n = t.get(strong_hash(k), k, &g).expect("present");
        assert_eq!(n.key(), k.as_slice());
        assert_eq!(n.value(&g).get(), v.as_deref());
        // Tombstones carry their tag through set_value and the doublings.
        assert_eq!(n.tagged(&g) == TOMB_TAG, v.is_none(), "tag of {k:?}");
        let copy = n.value(&g).clone_owned();
        assert_eq!(copy.get(), v.as_deref());
    }
    assert_eq!(t.len(), model.len());
}

#[test]
fn send_sync() {
    fn check<T: Send + Sync>() {}
    check::<Table<Vec<u8>, AtomicU64Meta>>();
    check::<Node<Vec<u8>, AtomicU64Meta>>();
}

/// Meta as callers keep it: in an atomic, cloned on migration.
#[derive(Debug, Default)]
struct AtomicU64Meta(AtomicU64);

impl Clone for AtomicU64Meta {
    fn clone(&self) -> Self {
        AtomicU64Meta(AtomicU64::new(self.0.load(Ordering::Relaxed)))
    }
}

fn upsert<V: TableValue, M: Clone + Send + Sync + 'static>(
    t: &Table<V, M>,
    hash: u64,
    key: &[u8],
    value: V,
    meta: M,
) -> bool {
    let mut l = t.lock(hash);
    if let Some(n) = l.find(key) {
        l.set_value(n, value);
        false
    } else {
        l.insert(hash, key, value, meta);
        true
    }
}

fn model_run(hash: fn(&[u8]) -> u64, inserts: u64, ops: usize, seed: u64) {
    let t: Table<u64, u64> = Table::new(1);
    assert_eq!(t.buckets(), 16);
    let mut model: HashMap<u64, u64> = HashMap::new();
    let mut rng = Rng::new(seed);
    let space = inserts + inserts / 5;
    let mut saw_resizing = false;
    let mut next_insert = 0;
    for step in 0..ops {
        saw_resizing |= t.resizing();
        // Phase one interleaves the insertion of keys 0..inserts.
        if next_insert < inserts && step % 2 == 0 {
            let k = next_insert;
            next_insert += 1;
            let v = rng.next();
            let created = upsert(&t, hash(&kb(k)), &kb(k), v, k * 3);
            assert_eq!(created, model.insert(k, v).is_none(), "key {k}");
            continue;
        }
        let k = rng.below(space);
        let h = hash(&kb(k));
        match rng.below(100) {
            0..=29 => {
                let v = rng.next();
                let created = upsert(&t, h, &kb(k), v, k * 3);
                assert_eq!(created, model.insert(k, v).is_none(), "key {k}");
            }
            30..=44 => {
                let mut l = t.lock(h);
                assert_eq!(l.remove(&kb(k)), model.remove(&k).is_some(), "key {k}");
            }
            45..=47 => {
                // The table only grows (a doubling may finish meanwhile).
                let before = t.buckets();
                let i = rng.below(before as u64 * 2) as usize;
                let Some(mut l) = t.lock_index(i) else {
                    assert!(i >= before);
                    continue;
                };
                let mut gone = Vec::new();
                let n = l.retain(|n| {
                    let keep = rng.below(2) == 0;
                    if !keep {
                        gone.push(u64::from_le_bytes(n.key().try_into().unwrap()));
                    }
                    keep
                });
                drop(l);
                assert_eq!(n, gone.len());
                for k in gone {
                    assert!(model.remove(&k).is_some(), "retain removed absent {k}");
                }
            }
            48..=54 => {
                let want = model.get(&k).copied();
                let got = t.get_shared(h, &kb(k), |n| {
                    n.map(|n| (*n.value(&epoch::pin()), *n.meta()))
                });
                assert_eq!(got, want.map(|v| (v, k * 3)), "key {k}");
            }
            _ => {
                let g = epoch::pin();
                let got = t.get(h, &kb(k), &g).map(|n| {
                    assert_eq!(n.key(), kb(k));
                    assert_eq!(n.hash(), h);
                    assert_eq!(*n.meta(), k * 3);
                    *n.value(&g)
                });
                assert_eq!(got, model.get(&k).copied(), "key {k}");
            }
        }
        assert_eq!(t.len(), model.len());
    }
    assert_eq!(next_insert, inserts, "too few ops to insert every key");
    t.wait_resize();
    assert!(!t.resizing());
    assert!(saw_resizing || t.buckets() > 16);
    assert!(t.buckets() >= 256, "buckets {}", t.buckets());
    assert!(
        t.len() <= 2 * t.buckets(),
        "{} > 2 x {}",
        t.len(),
        t.buckets()
    );
    assert_eq!(t.len(), model.len());
    let mut seen = HashMap::new();
    t.for_each(|n| {
        let k = u64::from_le_bytes(n.key().try_into().unwrap());
        let g = epoch::pin();
        assert!(seen.insert(k, *n.value(&g)).is_none(), "{k} visited twice");
    });
    assert_eq!(seen.len(), t.len());
    assert_eq!(seen, model);
    let g = epoch::pin();
    for k in 0..space {
        let got = t.get(hash(&kb(k)), &kb(k), &g).map(|n| *n.value(&g));
        assert_eq!(got, model.get(&k).copied(), "key {k}");
    }
    // Locked lookups agree too (hash compared before key bytes).
    for k in 0..space {
        let l = t.lock(hash(&kb(k)));
        assert_eq!(l.find(&kb(k)).is_some(), model.contains_key(&k));
    }
}

#[test]
fn model_strong_hash() {
    model_run(strong_hash, 10_000, 50_000, 1);
}

#[test]
fn model_colliding_hash() {
    model_run(weak_hash, 2_500, 12_000, 2);
}

#[test]
fn lock_index_bounds() {
    let t: Table<u64, ()> = Table::new(100);
    assert_eq!(t.buckets(), 128);
    assert!(t.lock_index(127).is_some());
    assert!(t.lock_index(128).is_none());
    assert!(t.is_empty());
}

#[test]
fn concurrent_readers_writers_during_doubling() {
    const WRITERS: u64 = 2;
    const KEYS_PER_WRITER: u64 = 4_000;
    const OPS: usize = 60_000;
    // Stable keys are inserted first and then only updated, never removed: a
    // reader must always find them (a lost chain or a lost migration shows).
    let stable = |k: u64| k.is_multiple_of(5);
    let t: Arc<Table<u64, AtomicU64Meta>> = Arc::new(Table::new(16));
    for k in (0..WRITERS * KEYS_PER_WRITER).filter(|&k| stable(k)) {
        let meta = AtomicU64Meta(AtomicU64::new(k));
        assert!(upsert(&*t, strong_hash(&kb(k)), &kb(k), k << 32, meta));
    }
    let done = Arc::new(AtomicBool::new(false));

    let readers: Vec<_> = (0..2u64)
        .map(|r| {
            let t = Arc::clone(&t);
            let done = Arc::clone(&done);
            thread::spawn(move || {
                let mut rng = Rng::new(100 + r);
                // Per key, the newest version this reader saw: reads must
                // never go back in time.
                let mut last = vec![0u64; (WRITERS * KEYS_PER_WRITER) as usize];
                let mut reads = 0u64;
                let mut hits = 0u64;
                while !done.load(Ordering::Acquire) || reads < 1000 {
                    let k = rng.below(WRITERS * KEYS_PER_WRITER);
                    let h = strong_hash(&kb(k));
                    let check = |n: &Node<u64, AtomicU64Meta>, v: u64| {
                        assert_eq!(n.key(), kb(k));
                        assert_eq!(v >> 32, k, "value of another key");
                        assert_eq!(n.meta().0.load(Ordering::Relaxed), k);
                        v & 0xFFFF_FFFF
                    };
                    let version = if rng.below(8) == 0 {
                        t.get_shared(h, &kb(k), |n| n.map(|n| check(n, *n.value(&epoch::pin()))))
                    } else {
                        let g = epoch::pin();
                        if reads.is_multiple_of(4) {
                            // A pipeline's hint before the lookup: it reads
                            // chains while writers and the migration change
                            // them (and takes 32 of these 40 hashes).
                            let hs: Vec<u64> = (0..40)
                                .map(|i| strong_hash(&kb((k + i) % (WRITERS * KEYS_PER_WRITER))))
                                .collect();
                            t.prefetch(&hs, &g);
                        }
                        t.get(h, &kb(k), &g).map(|n| check(n, *n.value(&g)))
                    };
                    match version {
                        Some(v) => {
                            assert!(v >= last[k as usize], "key {k} went back in time");
                            last[k as usize] = v;
                            hits += 1;
                        }
                        None => assert!(!stable(k), "stable key {k} not found"),
                    }
                    reads += 1;
                }
                (reads, hits)
            })
        })
        .collect();

    let writers: Vec<_> = (0..WRITERS)
        .map(|w| {
            let t = Arc::clone(&t);
            thread::spawn(move || {
                let mut rng = Rng::new(200 + w);
                let mut model: HashMap<u64, u64> = (0..KEYS_PER_WRITER)
                    .map(|i| i * WRITERS + w)
                    .filter(|&k| stable(k))
                    .map(|k| (k, k << 32))
                    .collect();
                let mut version = 0u64;
                for i in 0..OPS {
                    // Keys of this writer: k % WRITERS == w.
                    let k = rng.below(KEYS_PER_WRITER) * WRITERS + w;
                    let h = strong_hash(&kb(k));
                    let roll = rng.below(100);
                    if i < OPS / 4 || roll < 60 || stable(k) {
                        version += 1;
                        let v = (k << 32) | version;
                        let mut l = t.lock(h);
                        let found = l.find(&kb(k)).map(|n| *n.value(l.guard()));
                        assert_eq!(found, model.get(&k).copied(), "key {k}");
                        match l.find(&kb(k)) {
                            Some(n) => l.set_value(n, v),
                            None => {
                                l.insert(h, &kb(k), v, AtomicU64Meta(AtomicU64::new(k)));
                            }
                        }
                        model.insert(k, v);
                    } else if roll < 95 {
                        let mut l = t.lock(h);
                        assert_eq!(l.remove(&kb(k)), model.remove(&k).is_some(), "key {k}");
                    } else {
                        // Evict some of our own keys from a random bucket.
                        let i = rng.below(t.buckets() as u64) as usize;
                        if let Some(mut l) = t.lock_index(i) {
                            let mut gone = Vec::new();
                            l.retain(|n| {
                                let k = u64::from_le_bytes(n.key().try_into().unwrap());
                                if k % WRITERS == w && k % 3 == 0 && !stable(k) {
                                    gone.push(k);
                                    false
                                } else {
                                    true
                                }
                            });
                            drop(l);
                            for k in gone {
                                assert!(model.remove(&k).is_some(), "evicted absent {k}");
                            }
                        }
                    }
                    // Read your own write, without a lock, once it is done.
                    let g = epoch::pin();
                    let got = t.get(h, &kb(k), &g).map(|n| *n.value(&g));
                    assert_eq!(got, model.get(&k).copied(), "own write of key {k}");
                }
                model
            })
        })
        .collect();

    let models: Vec<HashMap<u64, u64>> = writers.into_iter().map(|h| h.join().unwrap()).collect();
    done.store(true, Ordering::Release);
    for r in readers {
        let (reads, hits) = r.join().unwrap();
        assert!(reads >= 1000 && hits > 0, "reads {reads} hits {hits}");
    }
    t.wait_resize();
    assert!(t.buckets() >= 1024, "buckets {}", t.buckets());
    assert!(
        t.len() <= 2 * t.buckets(),
        "{} > 2 x {}",
        t.len(),
        t.buckets()
    );
    let total: usize = models.iter().map(|m| m.len()).sum();
    assert_eq!(t.len(), total);
    let mut count = 0;
    t.for_each(|_| count += 1);
    assert_eq!(count, total);
    let g = epoch::pin();
    for k in 0..WRITERS * KEYS_PER_WRITER {
        let want = models[(k % WRITERS) as usize].get(&k).copied();
        let got = t.get(strong_hash(&kb(k)), &kb(k), &g).map(|n| *n.value(&g));
        assert_eq!(got, want, "key {k}");
    }
}

/// Long chains under constant churn: readers standing on unlinked nodes must
/// still reach the rest of the chain, and values replaced under them must stay
/// readable.
#[test]
fn readers_survive_unlinks_and_replacements() {
    const STABLE: u64 = 64;
    const CHURN: u64 = 200;
    // Two hashes for every key: two long chains, whatever the table's size.
    let h = |k: u64| k % 2;
    let t: Arc<Table<u64, ()>> = Arc::new(Table::new(16));
    // Inserted first, so they sit behind the churning nodes (head insertion).
    for k in 0..STABLE {
        assert!(upsert(&*t, h(k), &kb(k), k << 32, ()));
    }
    let done = Arc::new(AtomicBool::new(false));
    let readers: Vec<_> = (0..2u64)
        .map(|r| {
            let t = Arc::clone(&t);
            let done = Arc::clone(&done);
            thread::spawn(move || {
                let mut rng = Rng::new(300 + r);
                let mut reads = 0u64;
                while !done.load(Ordering::Acquire) || reads < 1000 {
                    let k = rng.below(STABLE);
                    let g = epoch::pin();
                    // Both chains walked by the prefetch hint, through
                    // nodes being unlinked and values being replaced.
                    t.prefetch(&[0, 1, h(k)], &g);
                    let n = t.get(h(k), &kb(k), &g);
                    let n = n.unwrap_or_else(|| panic!("stable key {k} lost"));
                    assert_eq!(*n.value(&g) >> 32, k, "value of another key");
                    reads += 1;
                }
            })
        })
        .collect();
    let mut rng = Rng::new(400);
    let mut present = vec![false; CHURN as usize];
    for i in 0..40_000u64 {
        let c = rng.below(CHURN);
        let k = STABLE + c;
        let mut l = t.lock(h(k));
        if present[c as usize] {
            assert!(l.remove(&kb(k)));
        } else {
            l.insert(h(k), &kb(k), k << 32, ());
        }
        drop(l);
        present[c as usize] = !present[c as usize];
        let s = rng.below(STABLE);
        let l = t.lock(h(s));
        let n = l.find(&kb(s)).expect("stable key");
        l.set_value(n, (s << 32) | (i & 0xFFFF_FFFF));
    }
    done.store(true, Ordering::Release);
    for r in readers {
        r.join().unwrap();
    }
    t.wait_resize();
    let live = present.iter().filter(|&&p| p).count();
    assert_eq!(t.len(), STABLE as usize + live);
}

/// Full scans (every step checked against its cursor range) while another
/// thread inserts enough to double the table several times: every key present
/// throughout is visited, and a scan at rest visits each key exactly once.
#[test]
fn scan_during_doubling() {
    const STABLE: u64 = 2_000;
    const ALL: u64 = 60_000;
    let t: Arc<Table<u64, ()>> = Arc::new(Table::new(16));
    for k in 0..STABLE {
        assert!(upsert(&*t, strong_hash(&kb(k)), &kb(k), k, ()));
    }
    t.wait_resize();
    let full = |count: usize, keys: &mut Vec<u64>| {
        let mut cursor = 0u64;
        loop {
            let next = t.scan(cursor, count, |n, g| {
                let p = index::scan_pos(n.hash());
                assert!(p >= cursor, "{p:#x} below the cursor {cursor:#x}");
                assert_eq!(*n.value(g), u64::from_le_bytes(n.key().try_into().unwrap()));
                keys.push(*n.value(g));
            });
            if next == 0 {
                return;
            }
            assert!(next > cursor);
            cursor = next;
        }
    };
    let done = Arc::new(AtomicBool::new(false));
    // Scans that overlapped a doubling. While there is none yet, the writer
    // waits inside each doubling it sees for a scan to overlap it (or for
    // the doubling to end), so the overlap does not depend on timing.
    let overlapped = Arc::new(AtomicU64::new(0));
    let writer = {
        let t = Arc::clone(&t);
        let done = Arc::clone(&done);
        let overlapped = Arc::clone(&overlapped);
        thread::spawn(move || {
            for k in STABLE..ALL {
                upsert(&*t, strong_hash(&kb(k)), &kb(k), k, ());
                if k % 2 == 0 && k > STABLE {
                    t.lock(strong_hash(&kb(k - 1))).remove(&kb(k - 1));
                }
                let waited = Instant::now();
                while overlapped.load(Ordering::Acquire) == 0
                    && t.resizing()
                    && waited.elapsed() < Duration::from_secs(2)
                {
                    thread::yield_now();
                }
            }
            done.store(true, Ordering::Release);
        })
    };
    let (mut scans, mut during) = (0, 0);
    while !done.load(Ordering::Acquire) || scans < 3 {
        let resizing = t.resizing();
        let buckets = t.buckets();
        let mut keys = Vec::new();
        full([1, 8, 64][scans % 3], &mut keys);
        // A doubling under way at either end, or one that began within the
        // scan (`buckets` is the newest array's; a small table's doubling
        // can begin and end within one scan).
        if resizing || t.resizing() || t.buckets() != buckets {
            during += 1;
            overlapped.fetch_add(1, Ordering::Release);
        }
        let seen: std::collections::HashSet<u64> = keys.iter().copied().collect();
        assert!(
            (0..STABLE).all(|k| seen.contains(&k)),
            "scan {scans} missed a key"
        );
        assert!(keys.iter().all(|&k| k < ALL));
        scans += 1;
    }
    writer.join().unwrap();
    t.wait_resize();
    assert!(during > 0, "no scan overlapped a doubling ({scans} scans)");
    assert!(t.buckets() >= 16_384, "buckets {}", t.buckets());
    let mut keys = Vec::new();
    full(10, &mut keys);
    assert_eq!(keys.len(), t.len(), "each key once at rest");
    let mut n = 0;
    t.for_each(|_| n += 1);
    assert_eq!(n, t.len());
}

static LIVE: AtomicIsize = AtomicIsize::new(0);

/// Counts live instances; the heap box makes a double free visible to
/// allocators and valgrind.
struct Counted(Box<u64>);

impl Counted {
    fn new(v: u64) -> Self {
        LIVE.fetch_add(1, Ordering::Relaxed);
        Counted(Box::new(v))
    }
}

impl Clone for Counted {
    fn clone(&self) -> Self {
        Counted::new(*self.0)
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        let before = LIVE.fetch_sub(1, Ordering::Relaxed);
        assert!(before > 0, "more drops than instances");
    }
}

/// Waits (pinning and flushing) until every deferred drop has run.
fn settle() -> isize {
    let start = Instant::now();
    loop {
        for _ in 0..8 {
            epoch::pin().flush();
        }
        let live = LIVE.load(Ordering::Relaxed);
        if live == 0 || start.elapsed() > Duration::from_secs(3) {
            return live;
        }
        thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn drops_every_value_once() {
    // 1: a full life: doublings, replacements, removals, evictions.
    {
        let t: Table<Counted, Counted> = Table::new(16);
        let mut rng = Rng::new(7);
        for k in 0..6_000u64 {
            let h = strong_hash(&kb(k));
            upsert(&t, h, &kb(k), Counted::new(k), Counted::new(k));
            if k % 3 == 0 {
                let j = rng.below(k + 1);
                let _ = upsert(
                    &t,
                    strong_hash(&kb(j)),
                    &kb(j),
                    Counted::new(j),
                    Counted::new(j),
                );
            }
            if k % 5 == 0 {
                let j = rng.below(k + 1);
                t.lock(strong_hash(&kb(j))).remove(&kb(j));
            }
            if k % 97 == 0 {
                if let Some(mut l) = t.lock_index(rng.below(t.buckets() as u64) as usize) {
                    l.retain(|n| *n.meta().0 % 2 == 0);
                }
            }
        }
        t.wait_resize();
        let mut n = 0;
        t.for_each(|_| n += 1);
        assert_eq!(n, t.len());
        assert!(LIVE.load(Ordering::Relaxed) >= 2 * t.len() as isize);
    }
    assert_eq!(settle(), 0, "leaked values after a full life");

    // 2: dropped while a doubling runs (the migration thread is stopped).
    for round in 0..3u64 {
        let t: Table<Counted, Counted> = Table::new(16);
        let mut saw = false;
        for k in 0..(4_000 + round * 1_000) {
            upsert(
                &t,
                strong_hash(&kb(k)),
                &kb(k),
                Counted::new(k),
                Counted::new(k),
            );
            saw |= t.resizing();
        }
        assert!(saw, "never saw a doubling");
        drop(t);
    }
    assert_eq!(settle(), 0, "leaked values after drop during doubling");
}
