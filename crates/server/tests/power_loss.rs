//! Power loss under `--durability msync`, through the server's command layer:
//! the heap is opened under the power-loss simulator (`CrashSim::power_loss`;
//! a crash image holds every page an msync or fsync made durable, and for
//! each page written since its old or new content or a tear of both at
//! 512-byte sectors), the store is started on it as `ember serve` starts it
//! (`store::open_recovered`: Bullet with group commit and a role thread), and
//! workers (`server::Embedded`, one thread and store session each) execute
//! random batches of real commands (`cmd::execute`: SET with and without EX,
//! MSET, INCR, APPEND, DEL, EXPIRE, PERSIST, RENAME), committing in line after
//! each batch as a worker does before it writes the batch's replies.
//!
//! Each worker has keys of its own, on which every command runs and whose
//! replies are checked against a model; and all workers write a few hot keys
//! with SET and DEL, so that a batch's record can have its previous version
//! in another worker's uncommitted log, and a DEL can find the key already
//! gone by another worker's uncommitted tombstone: its reply (0) depends on
//! that tombstone, so the store makes a record it answers from durable before
//! the reply (`BulletSession::settle_read`; a power loss before the other
//! worker's commit would otherwise bring the key back,
//! `del_after_another_workers_uncommitted_del`).
//! Every write is stamped on the simulator's clock: `start` before `exec`,
//! `end` after it, `ack` after the commit covering it returned (only then
//! would a worker send the reply).
//!
//! The simulator takes images at random syncs, and one after the workload.
//! Each image is recovered as the server starts (store recovery, then the key
//! counts: the snapshot a clean shutdown saved under the empty key is refused
//! for its heap generation, so the counts are recounted, here by the first
//! DBSIZE) and checked:
//!
//! - every key's state (value, and whether it has a TTL) was written, by a
//!   command started before the image, or is its state at the run's start;
//! - no acknowledged write is lost: the state read back is not older than any
//!   write acknowledged before the image;
//! - DBSIZE equals the number of keys present;
//!
//! and every eighth image is then shut down cleanly (key counts saved) and
//! reopened: the same states, and DBSIZE from the saved counts.
//!
//! MSET and RENAME are not crash-atomic (each key is its own store write; a
//! crash can keep some of their keys' writes and not others until they are
//! acknowledged): for them only the per-key properties above are checked,
//! which hold for each of their keys separately.
//!
//! Prints `power-loss-sim: N images, M inconsistent (server ...)`.
//! `EMBER_POWER_LOSS_SEED` sets the first seed; failures name their seed.

mod common;

use pmem::{CrashImage, CrashSim, Heap};
use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};
use server::config::{Config, DurabilityMode, EngineChoice};
use server::server::{Embedded, Shared};
use server::store::{self, Startup};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Instant;

const WORKERS: usize = 2;
const OWN_KEYS: usize = 6;
const HOT_KEYS: usize = 3;
const BATCHES: usize = 40;
const MAX_BATCH: usize = 6;
/// Whether workers also DEL hot keys (a DEL that finds another worker's
/// uncommitted tombstone replies 0 without writing anything: see
/// `del_after_another_workers_uncommitted_del`).
const HOT_DELS: bool = true;
/// Threads checking images.
const CHECKERS: usize = 2;
const CAPTURE_PPM: u64 = 150_000;
const IMAGES: u64 = 1000;
/// EX / EXPIRE seconds: no key expires during a run.
const TTL_S: &str = "100000";

fn cfg(path: &Path) -> Config {
    Config {
        heap: path.to_path_buf(),
        heap_size: 4 << 20,
        heap_max_size: 32 << 20,
        engine: EngineChoice::Bullet(engine::bullet::Variant::Full),
        durability: DurabilityMode::Msync,
        threads: WORKERS,
        logs: 4,
        log_size: 64 << 10,
        ..Config::default()
    }
}

/// A key's state: its value and whether it has a TTL (None: absent).
type State = Option<(Vec<u8>, bool)>;

fn own_key(w: usize, i: usize) -> Vec<u8> {
    format!("w{w}k{i}").into_bytes()
}

fn hot_key(i: usize) -> Vec<u8> {
    format!("hot{i}").into_bytes()
}

fn key_space() -> Vec<Vec<u8>> {
    let mut v: Vec<_> = (0..WORKERS)
        .flat_map(|w| (0..OWN_KEYS).map(move |i| own_key(w, i)))
        .collect();
    v.extend((0..HOT_KEYS).map(hot_key));
    v
}

/// One write of a key: the state it left, and its instants on the clock.
#[derive(Clone, Debug)]
struct W {
    state: State,
    start: u64,
    end: u64,
    ack: u64,
}

/// Per key, every write (the first: the state at the run's start, acknowledged
/// at 0).
type Hist = BTreeMap<Vec<u8>, Vec<W>>;

/// Whether `got` may be what a key holds after a crash whose image was built
/// between the instants `before` and `tag`: writes acknowledged before
/// `before` must be there (or a later one), writes started after `tag` cannot.
fn check_key(ws: &[W], got: &State, before: u64, tag: u64) -> Result<(), String> {
    let mut cands = ws
        .iter()
        .filter(|w| w.start < tag && &w.state == got)
        .peekable();
    if cands.peek().is_none() {
        return Err(format!("reads {}, never written", show(got)));
    }
    let mut lost = None;
    for x in cands {
        match ws.iter().find(|y| y.ack < before && x.end < y.start) {
            None => return Ok(()),
            Some(y) => lost = Some(y),
        }
    }
    let y = lost.expect("a candidate");
    Err(format!(
        "reads {}, but {} was acknowledged at {} (image from {before} to {tag})",
        show(got),
        show(&y.state),
        y.ack
    ))
}

fn show(s: &State) -> String {
    match s {
        None => "(absent)".into(),
        Some((v, t)) => format!(
            "{:?}{}",
            String::from_utf8_lossy(v),
            if *t { " with a TTL" } else { "" }
        ),
    }
}

fn args(a: &[&[u8]]) -> Vec<Vec<u8>> {
    a.iter().map(|x| x.to_vec()).collect()
}

fn int_reply(n: i64) -> Vec<u8> {
    format!(":{n}\r\n").into_bytes()
}

/// A key's state as the server reads it (GET and PTTL).
fn read_state(e: &mut Embedded, k: &[u8]) -> Result<State, String> {
    let get = e.exec(&args(&[b"GET", k]));
    let pttl = e.exec(&args(&[b"PTTL", k]));
    if get == b"$-1\r\n" {
        return if pttl == b":-2\r\n" {
            Ok(None)
        } else {
            Err(format!("GET says absent, PTTL {:?}", show_reply(&pttl)))
        };
    }
    let text = get
        .strip_prefix(b"$")
        .and_then(|r| {
            let nl = r.iter().position(|&b| b == b'\r')?;
            let n: usize = std::str::from_utf8(&r[..nl]).ok()?.parse().ok()?;
            r.get(nl + 2..nl + 2 + n).map(|v| v.to_vec())
        })
        .ok_or_else(|| format!("GET replied {:?}", show_reply(&get)))?;
    let ttl = match &pttl[..] {
        b":-1\r\n" => false,
        p if p.starts_with(b":") && !p.starts_with(b":-") => true,
        p => return Err(format!("PTTL of a present key replied {:?}", show_reply(p))),
    };
    Ok(Some((text, ttl)))
}

fn show_reply(r: &[u8]) -> String {
    String::from_utf8_lossy(r).into_owned()
}

fn dbsize(e: &mut Embedded) -> Result<u64, String> {
    let r = e.exec(&args(&[b"DBSIZE"]));
    std::str::from_utf8(&r)
        .ok()
        .and_then(|s| s.strip_prefix(':')?.trim_end().parse().ok())
        .ok_or_else(|| format!("DBSIZE replied {:?}", show_reply(&r)))
}

/// A command, the reply it should get (empty: not checked), and the states
/// it leaves (key, state) when it succeeds.
type Step = (Vec<Vec<u8>>, Vec<u8>, Vec<(Vec<u8>, State)>);

/// A worker's model of its own keys (exact: only it writes them).
struct Model {
    own: Vec<State>,
}

/// One worker: batches of random commands, each batch committed; every
/// write recorded in `hist`, every reply checked against the model (hot keys:
/// replies of SET only, DEL's count depends on the other workers).
fn worker(
    sh: Arc<Shared>,
    sim: &CrashSim,
    hist: &Mutex<Hist>,
    w: usize,
    seed: u64,
    mut model: Model,
) -> Result<(), String> {
    let mut e = Embedded::new(sh, w)?;
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut n = 0u64;
    for _ in 0..BATCHES {
        let mut batch: Vec<(Vec<u8>, usize)> = Vec::new();
        for _ in 0..rng.random_range(1..=MAX_BATCH) {
            n += 1;
            let i = rng.random_range(0..OWN_KEYS);
            let k = own_key(w, i);
            let val = format!("s{seed}-w{w}-{n}").into_bytes();
            let cur = model.own[i].clone();
            let (cmd, want, writes): Step = match rng.random_range(0..100) {
                0..15 if HOT_KEYS > 0 => {
                    let h = hot_key(rng.random_range(0..HOT_KEYS));
                    if HOT_DELS && rng.random_bool(0.2) {
                        (args(&[b"DEL", &h]), Vec::new(), vec![(h, None)])
                    } else {
                        let ex = rng.random_bool(0.3);
                        let c = if ex {
                            args(&[b"SET", &h, &val, b"EX", TTL_S.as_bytes()])
                        } else {
                            args(&[b"SET", &h, &val])
                        };
                        (c, b"+OK\r\n".to_vec(), vec![(h, Some((val, ex)))])
                    }
                }
                15..35 => {
                    let ex = rng.random_bool(0.3);
                    // Some values are integers, for INCR.
                    let v = if rng.random_bool(0.4) {
                        (seed * 1_000_000 + n * 1000).to_string().into_bytes()
                    } else {
                        val
                    };
                    let c = if ex {
                        args(&[b"SET", &k, &v, b"EX", TTL_S.as_bytes()])
                    } else {
                        args(&[b"SET", &k, &v])
                    };
                    (c, b"+OK\r\n".to_vec(), vec![(k, Some((v, ex)))])
                }
                35..45 => {
                    let j = (i + rng.random_range(1..OWN_KEYS)) % OWN_KEYS;
                    let k2 = own_key(w, j);
                    let v2 = format!("s{seed}-w{w}-{n}m").into_bytes();
                    (
                        args(&[b"MSET", &k, &val, &k2, &v2]),
                        b"+OK\r\n".to_vec(),
                        vec![(k, Some((val, false))), (k2, Some((v2, false)))],
                    )
                }
                45..58 => {
                    let c = args(&[b"INCR", &k]);
                    match &cur {
                        None => (c, int_reply(1), vec![(k, Some((b"1".to_vec(), false)))]),
                        Some((v, t)) => {
                            match std::str::from_utf8(v)
                                .ok()
                                .and_then(|s| s.parse::<i64>().ok())
                            {
                                Some(x) => (
                                    c,
                                    int_reply(x + 1),
                                    vec![(k, Some(((x + 1).to_string().into_bytes(), *t)))],
                                ),
                                None => (
                                    c,
                                    b"-ERR value is not an integer or out of range\r\n".to_vec(),
                                    vec![],
                                ),
                            }
                        }
                    }
                }
                58..68 => {
                    let suffix = format!(".{n}").into_bytes();
                    let (mut v, t) = cur.clone().unwrap_or_default();
                    v.extend_from_slice(&suffix);
                    (
                        args(&[b"APPEND", &k, &suffix]),
                        int_reply(v.len() as i64),
                        vec![(k, Some((v, t)))],
                    )
                }
                68..78 => {
                    let c = args(&[b"DEL", &k]);
                    match cur {
                        None => (c, int_reply(0), vec![]),
                        Some(_) => (c, int_reply(1), vec![(k, None)]),
                    }
                }
                78..86 => {
                    let c = args(&[b"EXPIRE", &k, TTL_S.as_bytes()]);
                    match cur {
                        None => (c, int_reply(0), vec![]),
                        Some((v, _)) => (c, int_reply(1), vec![(k, Some((v, true)))]),
                    }
                }
                86..92 => {
                    let c = args(&[b"PERSIST", &k]);
                    match cur {
                        Some((v, true)) => (c, int_reply(1), vec![(k, Some((v, false)))]),
                        _ => (c, int_reply(0), vec![]),
                    }
                }
                _ => {
                    let j = (i + rng.random_range(1..OWN_KEYS)) % OWN_KEYS;
                    let k2 = own_key(w, j);
                    let c = args(&[b"RENAME", &k, &k2]);
                    match cur {
                        None => (c, b"-ERR no such key\r\n".to_vec(), vec![]),
                        Some(s) => (c, b"+OK\r\n".to_vec(), vec![(k, None), (k2, Some(s))]),
                    }
                }
            };
            let idx: Vec<usize> = {
                let mut h = hist.lock().unwrap();
                writes
                    .iter()
                    .map(|(k, s)| {
                        let ws = h.get_mut(k).unwrap();
                        ws.push(W {
                            state: s.clone(),
                            start: sim.tick(),
                            end: u64::MAX,
                            ack: u64::MAX,
                        });
                        ws.len() - 1
                    })
                    .collect()
            };
            let got = e.exec(&cmd);
            let end = sim.tick();
            {
                let mut h = hist.lock().unwrap();
                for ((k, _), &x) in writes.iter().zip(&idx) {
                    h.get_mut(k).unwrap()[x].end = end;
                }
            }
            if !want.is_empty() && got != want {
                return Err(format!(
                    "worker {w}: {:?} replied {:?}, expected {:?}",
                    cmd.iter()
                        .map(|a| String::from_utf8_lossy(a).into_owned())
                        .collect::<Vec<_>>(),
                    show_reply(&got),
                    show_reply(&want)
                ));
            }
            for ((k, s), x) in writes.into_iter().zip(idx) {
                if let Some(j) = (0..OWN_KEYS).find(|&j| own_key(w, j) == k) {
                    model.own[j] = s;
                }
                batch.push((k, x));
            }
        }
        e.commit().map_err(|err| format!("commit: {err}"))?;
        let t = sim.tick();
        let mut h = hist.lock().unwrap();
        for (k, x) in &batch {
            h.get_mut(k).unwrap()[*x].ack = t;
        }
    }
    Ok(())
}

/// Creates the heap at `path` with the store the configuration names and a
/// few keys, and shuts down cleanly (the key counts saved); returns every
/// key's state.
fn create(path: &Path, seed: u64) -> BTreeMap<Vec<u8>, State> {
    let c = cfg(path);
    let (store, st) = store::open(&c).unwrap();
    let sh = Embedded::start(c, store, st, 1).unwrap();
    let mut e = Embedded::new(sh.clone(), 0).unwrap();
    let mut start = BTreeMap::new();
    for (n, k) in key_space().into_iter().enumerate() {
        let s = match n % 3 {
            0 => None,
            1 => Some((format!("init{seed}-{n}").into_bytes(), false)),
            _ => Some(((n * 10).to_string().into_bytes(), true)),
        };
        match &s {
            None => {}
            Some((v, false)) => assert_eq!(e.exec(&args(&[b"SET", &k, v])), b"+OK\r\n"),
            Some((v, true)) => assert_eq!(
                e.exec(&args(&[b"SET", &k, v, b"EX", TTL_S.as_bytes()])),
                b"+OK\r\n"
            ),
        }
        start.insert(k, s);
    }
    e.commit().unwrap();
    drop(e);
    Embedded::shutdown(sh).unwrap();
    start
}

fn recover(path: &Path) -> Result<(Arc<Shared>, Embedded), String> {
    common::recover(cfg(path))
}

/// Every key's state, and DBSIZE against the keys present.
fn read_all(e: &mut Embedded) -> Result<BTreeMap<Vec<u8>, State>, String> {
    let mut m = BTreeMap::new();
    for k in key_space() {
        let s = read_state(e, &k).map_err(|err| format!("key {}: {err}", show_reply(&k)))?;
        m.insert(k, s);
    }
    let present = m.values().filter(|s| s.is_some()).count() as u64;
    let n = dbsize(e)?;
    if n != present {
        return Err(format!("DBSIZE {n}, but {present} keys are present"));
    }
    Ok(m)
}

fn check_image(path: &Path, img: &CrashImage, hist: &Hist, deep: bool) -> Result<(), String> {
    pmem::sim::write_image(path, &img.bytes).map_err(|e| e.to_string())?;
    let (sh, mut e) = recover(path)?;
    let got = read_all(&mut e)?;
    for (k, ws) in hist {
        check_key(ws, &got[k], img.tag_before, img.tag)
            .map_err(|err| format!("key {}: {err}", show_reply(k)))?;
    }
    drop(e);
    if deep {
        Embedded::shutdown(sh).map_err(|e| format!("shutdown: {e}"))?;
        let (sh, mut e) = recover(path)?;
        if !sh.counts.ready() {
            return Err("after a clean shutdown the key counts were not read back".into());
        }
        let again = read_all(&mut e).map_err(|err| format!("after a clean restart: {err}"))?;
        if again != got {
            return Err("a clean restart changed the keys".into());
        }
    }
    Ok(())
}

#[test]
fn server_commands_survive_power_loss() {
    let dir = tempfile::tempdir_in(common::shm_dir()).unwrap();
    let img_path = dir.path().join("image");
    let first_seed: u64 = std::env::var("EMBER_POWER_LOSS_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    let started = Instant::now();
    let (mut images, mut bad) = (0u64, 0u64);
    let mut seed = first_seed;
    let want_images: u64 = std::env::var("EMBER_POWER_LOSS_IMAGES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(IMAGES);
    while images < want_images {
        let path = dir.path().join(format!("run{seed}"));
        let start = create(&path, seed);
        let c = cfg(&path);
        let sim = Arc::new(CrashSim::power_loss(seed, 0));
        let rec = Heap::open_sim(&path, &store::heap_options(&c), sim.clone()).unwrap();
        let st = Startup {
            existed: true,
            ..Startup::default()
        };
        let (store, st) = store::open_recovered(&c, rec, st, Instant::now()).unwrap();
        let sh = Embedded::start(c, store, st, WORKERS).unwrap();
        let hist: Mutex<Hist> = Mutex::new(
            start
                .iter()
                .map(|(k, s)| {
                    let w = W {
                        state: s.clone(),
                        start: 0,
                        end: 0,
                        ack: 0,
                    };
                    (k.clone(), vec![w])
                })
                .collect(),
        );
        sim.tick();
        sim.set_capture_ppm(CAPTURE_PPM);
        std::thread::scope(|sc| {
            let hs: Vec<_> = (0..WORKERS)
                .map(|w| {
                    let model = Model {
                        own: (0..OWN_KEYS)
                            .map(|i| start[&own_key(w, i)].clone())
                            .collect(),
                    };
                    let (sh, sim, hist) = (sh.clone(), &sim, &hist);
                    sc.spawn(move || worker(sh, sim, hist, w, seed * 31 + w as u64, model))
                })
                .collect();
            for h in hs {
                if let Err(e) = h.join().unwrap() {
                    panic!("seed {seed}: {e}");
                }
            }
        });
        sim.set_capture_ppm(0);
        let mut imgs = sim.take_images();
        imgs.push(sim.capture_now(sh.store.heap().unwrap().region()));
        Embedded::shutdown(sh).unwrap();
        let _ = std::fs::remove_file(&path);
        let hist = hist.into_inner().unwrap();
        // Images are checked on CHECKERS threads, each with a file of its own.
        let errs = Mutex::new(Vec::new());
        std::thread::scope(|sc| {
            for t in 0..CHECKERS {
                let (imgs, hist, errs) = (&imgs, &hist, &errs);
                let p = img_path.with_extension(t.to_string());
                sc.spawn(move || {
                    for (n, img) in imgs.iter().enumerate().skip(t).step_by(CHECKERS) {
                        let deep = (images + n as u64 + 1).is_multiple_of(8);
                        if let Err(e) = check_image(&p, img, hist, deep) {
                            errs.lock().unwrap().push(format!(
                                "seed {seed} image {n} (tag {}, fence {}): {e}",
                                img.tag, img.fence
                            ));
                        }
                    }
                });
            }
        });
        images += imgs.len() as u64;
        for e in errs.into_inner().unwrap() {
            bad += 1;
            if bad <= 5 {
                eprintln!("{e}");
            }
        }
        seed += 1;
    }
    // Straight to the process's stderr (the test harness captures
    // `eprintln!`): the suite's summary greps these lines.
    use std::io::Write;
    let _ = writeln!(
        std::io::stderr(),
        "power-loss-sim: {images} images, {bad} inconsistent (server: {WORKERS} workers, seeds {first_seed}..{seed}, {:.1} s)",
        started.elapsed().as_secs_f64()
    );
    assert_eq!(bad, 0, "inconsistent images (see above)");
}

/// Two workers, one key: worker 1 deletes it and has not committed; worker 0's
/// DEL then finds it absent (the uncommitted tombstone), replies 0 without
/// writing, and commits: a worker would now send that reply. A power loss
/// before worker 1's commit loses the tombstone, and the key is back with the
/// value worker 0's client was told is gone. Reads make the record they
/// answer from durable (`BulletSession::settle_read`), so this cannot happen.
#[test]
fn del_after_another_workers_uncommitted_del() {
    use std::sync::mpsc::channel;
    let dir = tempfile::tempdir_in(common::shm_dir()).unwrap();
    let path = dir.path().join("heap");
    create(&path, 0);
    let c = cfg(&path);
    let sim = Arc::new(CrashSim::power_loss(7, 0));
    let rec = Heap::open_sim(&path, &store::heap_options(&c), sim.clone()).unwrap();
    let st = Startup {
        existed: true,
        ..Startup::default()
    };
    let (store, st) = store::open_recovered(&c, rec, st, Instant::now()).unwrap();
    let sh = Embedded::start(c, store, st, 2).unwrap();
    let k = hot_key(0);
    let (to1, from0) = channel::<()>();
    let (to0, from1) = channel::<()>();
    let img = std::thread::scope(|sc| {
        let (sh1, k1) = (sh.clone(), k.clone());
        let w1 = sc.spawn(move || {
            let mut e = Embedded::new(sh1, 1).unwrap();
            from0.recv().unwrap();
            assert_eq!(e.exec(&args(&[b"DEL", &k1])), int_reply(1));
            to0.send(()).unwrap();
            // Waits (uncommitted) until the image is taken.
            from0.recv().unwrap();
            e.commit().unwrap();
        });
        let mut e = Embedded::new(sh.clone(), 0).unwrap();
        assert_eq!(e.exec(&args(&[b"SET", &k, b"old"])), b"+OK\r\n");
        e.commit().unwrap();
        to1.send(()).unwrap();
        from1.recv().unwrap();
        let r = e.exec(&args(&[b"DEL", &k]));
        e.commit().unwrap();
        // Acknowledged: the key is gone.
        assert_eq!(r, int_reply(0));
        let img = sim.capture_now(sh.store.heap().unwrap().region());
        to1.send(()).unwrap();
        w1.join().unwrap();
        img
    });
    Embedded::shutdown(sh).unwrap();
    let img_path = dir.path().join("image");
    pmem::sim::write_image(&img_path, &img.bytes).unwrap();
    let (_sh, mut e) = recover(&img_path).unwrap();
    assert_eq!(
        read_state(&mut e, &k).unwrap(),
        None,
        "a DEL acknowledged as done is undone by a power loss"
    );
}
