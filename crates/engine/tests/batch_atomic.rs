//! Batches of several operations (`Session::apply_batch`) are all-or-nothing
//! across a crash, for the Bullet and direct stores.
//!
//! Simulated crashes: one session applies batches, each on one of a few key
//! groups `g`: `a_g := n`, `b_g := tmp` then `b_g := n` (two operations on one
//! key), `c_g += 1` (an increment), `d_g := n` or removed (by the parity of
//! `n`), and `e_g`, a list leaf, merged with the insert of `n` at its front
//! (its group's first batch puts the empty leaf first: a chain that folds
//! from a put), in shuffled order. A crash image is taken at every fence (the
//! cache-line simulator: what fences persisted plus any subset of the lines
//! written since; or the power-loss simulator under msync: pages old, new or
//! torn), and each image is recovered and checked: for every group, the keys
//! hold one batch's values (`a_g = b_g = n`, `c_g` = the number of batches on
//! the group up to `n`, `d_g` by the parity of `n`, `e_g` the group's values
//! up to `n`, newest first: every merge once, in order) or none, and that batch is
//! not older than the last one acknowledged before the image. Every few
//! images the store is drained and the frontend checked against the backend.
//!
//! Also: two sessions whose batches share keys (marks taken in one order, so
//! they never deadlock, and the keys end with one batch's values); a batch
//! with an error (nothing applied); a batch larger than a Bullet log can take
//! (refused before anything is written).

mod common;

use common::*;
use engine::bullet::Variant;
use engine::direct::BackendKind;
use engine::types::edit::Edit;
use engine::types::node::{Entry, Node};
use engine::{Session, WriteBatch};
use pmem::{CrashImage, CrashSim, Heap, HeapOptions, Strategy};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

const LOG: u64 = 16 << 10;
/// A multiple of every `Cfg::threads`: a group is one thread's.
const GROUPS: u64 = 4;

fn key(k: &str, g: u64) -> Vec<u8> {
    format!("{k}{g}").into_bytes()
}

/// The batch numbered `n` (on group `n % GROUPS`), its operations shuffled
/// by `n` (the two on `b` keep their order).
fn batch(n: u64, long: bool) -> WriteBatch {
    let g = n % GROUPS;
    // Long values: a batch spans several 512-byte sectors, which the
    // power-loss simulator tears apart.
    let len = if long { 300 + n % 200 } else { n % 40 };
    let v = format!("{n:08}-{}", "x".repeat(len as usize));
    let mut w = WriteBatch::new();
    let mut parts: Vec<u8> = vec![0, 1, 2, 3, 4];
    let mut x = n.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    for i in (1..parts.len()).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        parts.swap(i, (x % (i as u64 + 1)) as usize);
    }
    for p in parts {
        match p {
            0 => w.put(&key("a", g), v.as_bytes()),
            1 => {
                w.put(&key("b", g), b"tmp");
                w.put(&key("b", g), v.as_bytes());
            }
            2 => w.incr(&key("c", g), 1),
            4 => {
                if n < GROUPS {
                    w.put(&key("e", g), &Node::Leaf(Vec::new()).encode(false));
                }
                let mut edit = Vec::new();
                Edit::LeafInsert {
                    pos: 0,
                    entry: Entry::new(0.0, v.as_bytes().to_vec()),
                }
                .encode(false, &mut edit);
                w.merge(&key("e", g), &edit);
            }
            _ => {
                if n.is_multiple_of(2) {
                    w.put(&key("d", g), v.as_bytes())
                } else {
                    w.remove(&key("d", g))
                }
            }
        }
    }
    w
}

/// The batch number the keys of group `g` hold (None: no batch yet), or
/// what is wrong with them.
fn read_group(s: &mut dyn Session, g: u64) -> Result<Option<u64>, String> {
    let mut get = |k: &str| {
        let mut out = Vec::new();
        s.get(&key(k, g), &mut out)
            .map_err(|e| format!("get {k}{g}: {e}"))
            .map(|f| f.then(|| String::from_utf8_lossy(&out).into_owned()))
    };
    let (a, b, c, d) = (get("a")?, get("b")?, get("c")?, get("d")?);
    let mut e = Vec::new();
    let has_e = s
        .get(&key("e", g), &mut e)
        .map_err(|x| format!("get e{g}: {x}"))?;
    let Some(a) = a else {
        if b.is_some() || c.is_some() || d.is_some() || has_e {
            return Err(format!(
                "group {g}: a absent, b {b:?} c {c:?} d {d:?} e {has_e}"
            ));
        }
        return Ok(None);
    };
    let n: u64 = a[..8]
        .parse()
        .map_err(|_| format!("group {g}: a = {a:?}"))?;
    let count = (n - g) / GROUPS + 1;
    let want_d = n.is_multiple_of(2).then(|| a.clone());
    if b.as_ref() != Some(&a) || c != Some(count.to_string()) || d != want_d {
        return Err(format!(
            "group {g}: a {a:?} b {b:?} c {c:?} (want {count}) d {d:?}: parts of different batches"
        ));
    }
    // The leaf: the group's batches up to n, newest first.
    let leaf = match has_e.then(|| Node::decode(&e, false)) {
        Some(Ok(Node::Leaf(v))) => v,
        x => return Err(format!("group {g}: e is not a leaf: {x:?}")),
    };
    let got: Vec<&[u8]> = leaf.iter().map(|x| &x.bytes[..8]).collect();
    let want: Vec<String> = (0..count)
        .rev()
        .map(|i| format!("{:08}", g + i * GROUPS))
        .collect();
    if !got
        .iter()
        .map(|x| x.to_vec())
        .eq(want.iter().map(|x| x.as_bytes().to_vec()))
    {
        return Err(format!(
            "group {g} at batch {n}: e holds {:?}, want {want:?}",
            got.iter()
                .map(|x| String::from_utf8_lossy(x))
                .collect::<Vec<_>>()
        ));
    }
    Ok(Some(n))
}

#[derive(Clone, Copy)]
struct Cfg {
    kind: Kind,
    /// The power-loss simulator under msync (else the cache-line one).
    power: bool,
    batches: u64,
    /// Writer threads (each on groups of its own: thread `t` writes the
    /// batches `n` with `n % threads == t`), plus, with more than one, a
    /// thread reading every key (under group commit its gets make other
    /// sessions' batches durable: `settle_read`).
    threads: u64,
    /// Per million fences, an image.
    ppm: u64,
}

/// Per group, the batches started: (n, clock at its start, clock at its
/// acknowledgement once acknowledged). The clock is the simulator's tag.
type Hist = Vec<Vec<(u64, u64, Option<u64>)>>;

fn heap_o(c: &Cfg) -> HeapOptions {
    heap_opts(
        4 << 20,
        32 << 20,
        if c.power {
            Strategy::Msync
        } else {
            Strategy::FenceOnly
        },
    )
}

/// Recovers image `img` (written to `path`) and checks each group against
/// the history: it holds a batch started before the image was complete, not
/// older than any acknowledged before the image began.
fn check_image(c: &Cfg, path: &Path, img: &CrashImage, hist: &Hist, i: u64) -> Result<(), String> {
    // A new file, not the previous image's truncated: the previous store's
    // index may still have block frees deferred to the epoch (they hold its
    // heap and run on whichever thread collects next), and a store into a
    // truncated mapping is a SIGBUS.
    let _ = std::fs::remove_file(path);
    pmem::sim::write_image(path, &img.bytes).unwrap();
    let rec = Heap::open(path, &heap_opts(4 << 20, 32 << 20, Strategy::FenceOnly))
        .map_err(|e| format!("open: {e}"))?;
    let (store, _heap) = open(c.kind, rec, LOG).map_err(|e| format!("recover: {e}"))?;
    let r = check_store(&store, img, hist, i);
    // Closed whatever the outcome: its threads must not outlive the image's
    // file, which the next image overwrites.
    let closed = store.close();
    r?;
    closed.map_err(|e| format!("close: {e}"))
}

fn check_store(store: &AnyStore, img: &CrashImage, hist: &Hist, i: u64) -> Result<(), String> {
    let mut s = store.session();
    for g in 0..GROUPS {
        let got = read_group(&mut *s, g)?;
        let h = &hist[g as usize];
        let want = h
            .iter()
            .filter(|(_, _, a)| a.is_some_and(|a| a < img.tag_before))
            .map(|(n, _, _)| *n)
            .max();
        if got < want {
            return Err(format!(
                "group {g}: batch {got:?} after recovery, {want:?} was acknowledged"
            ));
        }
        if let Some(n) = got {
            if !h.iter().any(|(m, start, _)| *m == n && *start < img.tag) {
                return Err(format!("group {g}: batch {n} from after the image"));
            }
        }
    }
    drop(s);
    if i.is_multiple_of(8) {
        if let Some(b) = store.bullet() {
            if !drain_within(b, 60) {
                return Err("drain failed".into());
            }
            b.verify().map_err(|e| format!("verify: {e}"))?;
        }
    }
    Ok(())
}

fn run(c: Cfg) {
    let dir = tempfile::tempdir_in(shm_dir()).unwrap();
    let path = dir.path().join("b.heap");
    let check = dir.path().join("img.heap");
    {
        let heap = Heap::create(&path, &heap_o(&c)).unwrap();
        create(c.kind, &heap, LOG).unwrap().close().unwrap();
    }
    let sim = Arc::new(if c.power {
        let s = CrashSim::power_loss(7, 0);
        // Most pages written since their sync come back torn.
        s.set_tear(0.5, 0.8);
        s
    } else {
        CrashSim::new(7, 0)
    });
    let rec = Heap::open_sim(&path, &heap_o(&c), sim.clone()).unwrap();
    let (store, heap) = open(c.kind, rec, LOG).unwrap();
    let hist: Mutex<Hist> = Mutex::new(vec![Vec::new(); GROUPS as usize]);
    let done = AtomicU64::new(0);
    let mut images = 0u64;
    let mut bad = Vec::new();
    sim.set_capture_ppm(c.ppm);
    std::thread::scope(|sc| {
        for t in 0..c.threads {
            let (store, sim, hist, done) = (&store, &sim, &hist, &done);
            sc.spawn(move || {
                let mut s = store.session();
                let mut out = Vec::new();
                for n in (t..c.batches).step_by(c.threads as usize) {
                    let g = (n % GROUPS) as usize;
                    {
                        // The tick and its record together: a checker that
                        // holds the lock sees every tick before it.
                        let mut h = hist.lock().unwrap();
                        let start = sim.tick();
                        h[g].push((n, start, None));
                    }
                    out.clear();
                    s.apply_batch(&batch(n, c.power), &mut out).unwrap();
                    s.commit().unwrap();
                    assert_eq!(out.len(), batch(n, c.power).len());
                    let mut h = hist.lock().unwrap();
                    let ack = sim.tick();
                    h[g].last_mut().unwrap().2 = Some(ack);
                }
                done.fetch_add(1, Ordering::AcqRel);
            });
        }
        if c.threads > 1 {
            let (store, done) = (&store, &done);
            sc.spawn(move || {
                let mut s = store.session();
                let mut out = Vec::new();
                // Gets one by one see batches land between them: only the
                // images are checked.
                while done.load(Ordering::Acquire) < c.threads {
                    for g in 0..GROUPS {
                        for k in ["a", "b", "c", "d"] {
                            s.get(&key(k, g), &mut out).unwrap();
                        }
                    }
                }
            });
        }
        loop {
            let finished = done.load(Ordering::Acquire) == c.threads;
            for img in sim.take_images() {
                images += 1;
                let h = hist.lock().unwrap().clone();
                if let Err(e) = check_image(&c, &check, &img, &h, images) {
                    bad.push(format!("image at fence {}: {e}", img.fence));
                }
            }
            if finished {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
    });
    sim.set_capture_ppm(0);
    let last = sim.capture_now(heap.region());
    let h = hist.lock().unwrap().clone();
    if let Err(e) = check_image(&c, &check, &last, &h, 0) {
        bad.push(format!("final image: {e}"));
    }
    store.close().unwrap();
    eprintln!(
        "batch-crash-sim {}{}, {} writers: {images} images, {} inconsistent",
        c.kind.name(),
        if c.power { " (power loss, msync)" } else { "" },
        c.threads,
        bad.len()
    );
    assert!(images > c.batches / 4, "too few images: {images}");
    assert!(bad.is_empty(), "{}", bad[..bad.len().min(5)].join("\n"));
}

/// One writer, an image at every fence.
fn every_fence(kind: Kind, power: bool, batches: u64) {
    run(Cfg {
        kind,
        power,
        batches,
        threads: 1,
        ppm: 1_000_000,
    });
}

/// Two writers and a reader; an image at every fence (Bullet), or at a
/// quarter of them (direct, whose batches take several fences each).
fn concurrent(kind: Kind, power: bool) {
    let direct = matches!(kind, Kind::Direct(_));
    run(Cfg {
        kind,
        power,
        batches: if direct { 120 } else { 240 },
        threads: 2,
        ppm: if direct { 250_000 } else { 1_000_000 },
    });
}

#[test]
fn bullet_batches_at_every_fence() {
    for b in [BackendKind::LogFree, BackendKind::PHash] {
        every_fence(Kind::Bullet(Variant::Full, b), false, 60);
    }
}

#[test]
fn bullet_group_commit_batches_at_every_fence() {
    every_fence(
        Kind::BulletGroup(Variant::Full, BackendKind::LogFree),
        false,
        60,
    );
}

#[test]
fn bullet_group_commit_batches_power_loss() {
    every_fence(
        Kind::BulletGroup(Variant::Full, BackendKind::LogFree),
        true,
        60,
    );
}

#[test]
fn direct_batches_at_every_fence() {
    for b in [BackendKind::LogFree, BackendKind::PHash] {
        every_fence(Kind::Direct(b), false, 40);
    }
}

#[test]
fn direct_batches_power_loss() {
    every_fence(Kind::Direct(BackendKind::LogFree), true, 40);
}

/// Two writers in their own logs and a reader: under group commit the
/// reader's gets make the other sessions' batches durable (`settle_read`,
/// `Pool::make_durable` to the batch's end) while they run.
#[test]
fn concurrent_batches_under_crashes() {
    concurrent(Kind::Bullet(Variant::Full, BackendKind::LogFree), false);
    concurrent(
        Kind::BulletGroup(Variant::Full, BackendKind::LogFree),
        false,
    );
    concurrent(Kind::BulletGroup(Variant::Full, BackendKind::LogFree), true);
    concurrent(Kind::Direct(BackendKind::LogFree), false);
}

/// A store of `kind` in a fresh heap (not under a simulator).
fn fresh(kind: Kind, dir: &Path) -> (AnyStore, Heap) {
    let heap = Heap::create(&dir.join("f.heap"), &sim_opts()).unwrap();
    let st = create(kind, &heap, LOG).unwrap();
    (st, heap)
}

/// Drains a Bullet store and checks its frontend against its backend; closes.
fn drain_verify_close(store: &AnyStore) {
    if let Some(b) = store.bullet() {
        b.drain().unwrap();
        b.verify().unwrap();
    }
    store.close().unwrap();
}

const KINDS: [Kind; 4] = [
    Kind::Bullet(Variant::Full, BackendKind::LogFree),
    Kind::BulletGroup(Variant::Full, BackendKind::LogFree),
    Kind::Direct(BackendKind::LogFree),
    Kind::Direct(BackendKind::PHash),
];

/// Three sessions write batches over the same four keys, each batch in its
/// own operation order, while a fourth reads them and increments a key of
/// its own: no deadlock (batches mark their keys in one order), and at
/// the end the four keys hold one batch's value.
#[test]
fn batches_sharing_keys_neither_deadlock_nor_mix() {
    for kind in KINDS {
        let dir = tempfile::tempdir_in(shm_dir()).unwrap();
        let (store, _heap) = fresh(kind, dir.path());
        let keys: Vec<Vec<u8>> = (0..4).map(|i| format!("k{i}").into_bytes()).collect();
        let stop = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|s| {
            let mut writers = Vec::new();
            for t in 0..3u64 {
                let (store, keys) = (&store, &keys);
                writers.push(s.spawn(move || {
                    let mut sess = store.session();
                    let mut out = Vec::new();
                    for n in 0..300u64 {
                        let v = format!("t{t}-{n}");
                        let mut w = WriteBatch::new();
                        for i in 0..4 {
                            // A different order per batch.
                            let k = &keys[((i + n + t) % 4) as usize];
                            w.put(k, v.as_bytes());
                        }
                        w.incr(b"count", 1);
                        out.clear();
                        sess.apply_batch(&w, &mut out).unwrap();
                        sess.commit().unwrap();
                        let _ = sess.maintain();
                    }
                }));
            }
            let (store, keys, stop) = (&store, &keys, &stop);
            s.spawn(move || {
                let mut sess = store.session();
                let mut out = Vec::new();
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    for k in keys {
                        sess.get(k, &mut out).unwrap();
                    }
                    sess.apply(b"solo", engine::Op::Incr(1)).unwrap();
                    sess.commit().unwrap();
                }
            });
            for w in writers {
                w.join().unwrap();
            }
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
        });
        let mut sess = store.session();
        let mut out = Vec::new();
        let vals: Vec<Vec<u8>> = keys
            .iter()
            .map(|k| {
                assert!(sess.get(k, &mut out).unwrap());
                out.clone()
            })
            .collect();
        assert!(
            vals.iter().all(|v| *v == vals[0]),
            "{}: {vals:?}",
            kind.name()
        );
        assert!(sess.get(b"count", &mut out).unwrap());
        assert_eq!(out, b"900", "{}", kind.name());
        drop(sess);
        drain_verify_close(&store);
    }
}

/// A batch whose `Incr` finds a value that is not an integer, or whose
/// `Merge` does not fit its value, fails whole: none of its operations is
/// applied, and its keys stay usable.
#[test]
fn a_failing_batch_applies_nothing() {
    for kind in KINDS {
        let dir = tempfile::tempdir_in(shm_dir()).unwrap();
        let (store, _heap) = fresh(kind, dir.path());
        let mut sess = store.session();
        let mut out = Vec::new();
        sess.apply(b"text", engine::Op::Put(b"abc")).unwrap();
        sess.apply(b"gone", engine::Op::Put(b"g")).unwrap();
        let mut w = WriteBatch::new();
        w.put(b"x", b"1");
        w.remove(b"gone");
        w.put(b"new", b"2");
        w.incr(b"text", 1);
        let r = sess.apply_batch(&w, &mut out);
        assert!(
            matches!(r, Err(engine::Error::NotInteger)),
            "{}: {r:?}",
            kind.name()
        );
        assert!(out.is_empty(), "{}: {out:?}", kind.name());
        let mut v = Vec::new();
        assert!(!sess.get(b"x", &mut v).unwrap(), "{}", kind.name());
        assert!(!sess.get(b"new", &mut v).unwrap(), "{}", kind.name());
        assert!(sess.get(b"text", &mut v).unwrap() && v == b"abc");
        assert!(sess.get(b"gone", &mut v).unwrap() && v == b"g");
        // A merge whose edit does not fit its value (no piece) fails the
        // batch as well, with a put before it in batch order.
        let mut edit = Vec::new();
        Edit::LeafRemove { pos: 0 }.encode(false, &mut edit);
        let mut w = WriteBatch::new();
        w.put(b"x", b"1");
        w.merge(b"text", &edit);
        w.merge(b"absent", &edit);
        assert!(sess.apply_batch(&w, &mut out).is_err(), "{}", kind.name());
        assert!(out.is_empty(), "{}: {out:?}", kind.name());
        assert!(!sess.get(b"x", &mut v).unwrap(), "{}", kind.name());
        assert!(sess.get(b"text", &mut v).unwrap() && v == b"abc");
        // The keys stay usable (no batch mark left behind).
        sess.apply(b"x", engine::Op::Put(b"ok")).unwrap();
        assert!(sess.get(b"x", &mut v).unwrap() && v == b"ok");
        let mut w = WriteBatch::new();
        w.put(b"new", b"3");
        w.incr(b"n", 5);
        sess.apply_batch(&w, &mut out).unwrap();
        assert_eq!(
            out,
            [
                engine::Outcome::Put {
                    created: true,
                    old_first: None
                },
                engine::Outcome::Int(5)
            ]
        );
        sess.commit().unwrap();
        drop(sess);
        drain_verify_close(&store);
    }
}

/// A Bullet batch larger than half a log (what one log can always take,
/// contiguous) is refused before anything is written.
#[test]
fn a_batch_too_large_for_a_log_is_refused() {
    let dir = tempfile::tempdir_in(shm_dir()).unwrap();
    let (store, _heap) = fresh(
        Kind::Bullet(Variant::Full, BackendKind::LogFree),
        dir.path(),
    );
    let mut sess = store.session();
    let big = vec![b'v'; 3000];
    let mut w = WriteBatch::new();
    for i in 0..4 {
        w.put(format!("big{i}").as_bytes(), &big);
    }
    let mut out = Vec::new();
    let r = sess.apply_batch(&w, &mut out);
    assert!(matches!(r, Err(engine::Error::RecordTooLarge(..))), "{r:?}");
    assert!(out.is_empty());
    let mut v = Vec::new();
    assert!(!sess.get(b"big0", &mut v).unwrap());
    // Half of it fits.
    let mut w = WriteBatch::new();
    for i in 0..2 {
        w.put(format!("big{i}").as_bytes(), &big);
    }
    sess.apply_batch(&w, &mut out).unwrap();
    assert!(sess.get(b"big1", &mut v).unwrap() && v == big);
    drop(sess);
    store.close().unwrap();
}
