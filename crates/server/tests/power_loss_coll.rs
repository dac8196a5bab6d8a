//! Power loss under `--durability msync` for the collection commands, through
//! the server's command layer (as `power_loss.rs` does for strings): the heap
//! runs under the power-loss simulator (every page an msync made durable
//! survives; every page written since is kept old, new or torn at 512-byte
//! sectors), a worker (`server::Embedded`) runs batches of real commands and
//! commits after each batch, and each image taken at a random sync is
//! recovered as the server starts and checked:
//!
//! - LMOVE between two large lists and SMOVE between two large sets lose and
//!   double nothing (a move's two heads and their pieces are one batch);
//! - a large sorted set whose members change score (ZADD) and rank
//!   (ZINCRBY) still holds every member once, and its order (the tree) and
//!   its scores (the table) agree: ZRANGE WITHSCORES, ZSCORE and ZRANK tell
//!   the same story;
//! - `ZINTERSTORE zu 2 zs zs WEIGHTS w 0` rewrites a large sorted set whole:
//!   every score of `zu` is w times `zs`'s for one w;
//! - RPUSH of a sequence keeps a prefix of it in order, and HINCRBY and
//!   ZINCRBY counters hold every acknowledged increment and none that was
//!   never started.
//! - a transaction (`MULTI; INCR t; RPUSH lt x; HINCRBY ht n 1; ZINCRBY zt
//!   1 n; SADD st <i>; EXEC`, the list and the set large, so pieced), or
//!   every other time the same writes as one Lua script (EVAL), is one
//!   unit: the five counts agree, between acknowledged and started.
//! - a stream appended to (XADD with growing IDs) while a consumer group
//!   reads it (XREADGROUP) and acknowledges (XACK) keeps a prefix of the
//!   appends, and its group's pending list, its consumer's count and its
//!   last delivered ID agree with each other and with the entries.
//!
//! `EMBER_POWER_LOSS_SEED` sets the first seed; failures name their seed.

mod common;

use pmem::{CrashImage, CrashSim, Heap};
use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};
use server::config::{Config, DurabilityMode, EngineChoice};
use server::server::{Embedded, Shared};
use server::store::{self, Startup};
use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

const LIST_N: usize = 300;
const SET_N: usize = 400;
const ZSET_N: usize = 300;
const BATCHES: usize = 60;
const MAX_BATCH: usize = 5;
const CAPTURE_PPM: u64 = 200_000;
const IMAGES: u64 = 150;

fn cfg(path: &Path) -> Config {
    Config {
        heap: path.to_path_buf(),
        heap_size: 8 << 20,
        heap_max_size: 32 << 20,
        engine: EngineChoice::Bullet(engine::bullet::Variant::Full),
        durability: DurabilityMode::Msync,
        threads: 1,
        logs: 2,
        log_size: 1 << 20,
        ..Config::default()
    }
}

fn args(a: &[&str]) -> Vec<Vec<u8>> {
    a.iter().map(|s| s.as_bytes().to_vec()).collect()
}

fn run(e: &mut Embedded, a: &[&str]) -> Vec<u8> {
    e.exec(&args(a))
}

/// The elements of a flat array reply of bulk strings.
fn bulks(r: &[u8]) -> Result<Vec<String>, String> {
    let s = String::from_utf8_lossy(r);
    let mut lines = s.split("\r\n");
    let head = lines.next().unwrap_or_default();
    let n: usize = head
        .strip_prefix('*')
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| format!("not an array: {s}"))?;
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let len = lines.next().unwrap_or_default();
        if !len.starts_with('$') {
            return Err(format!("not a bulk string in {s}"));
        }
        out.push(lines.next().unwrap_or_default().to_string());
    }
    Ok(out)
}

fn int(r: &[u8]) -> Result<i64, String> {
    let s = String::from_utf8_lossy(r);
    s.trim_end()
        .strip_prefix(':')
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| format!("not an integer: {s}"))
}

/// A bulk number (a score or a counter), or 0 for a null.
fn num(r: &[u8]) -> Result<f64, String> {
    if r == b"$-1\r\n" {
        return Ok(0.0);
    }
    let v = bulks(&[b"*1\r\n", r].concat())?;
    v[0].parse().map_err(|_| format!("not a number: {v:?}"))
}

fn create(path: &Path) {
    let c = cfg(path);
    let (store, st) = store::open(&c).unwrap();
    let sh = Embedded::start(c, store, st, 1).unwrap();
    let mut e = Embedded::new(sh.clone(), 0).unwrap();
    let mut cmd = vec!["RPUSH".to_string(), "l1".into()];
    cmd.extend((0..LIST_N).map(|i| format!("e{i}")));
    let mut sadd = vec!["SADD".to_string(), "s1".into()];
    sadd.extend((0..SET_N).map(|i| format!("m{i}")));
    let mut za = vec!["ZADD".to_string(), "z".into()];
    let mut zs = vec!["ZADD".to_string(), "zs".into()];
    for i in 0..ZSET_N {
        za.extend([i.to_string(), format!("z{i}")]);
        zs.extend([(i + 1).to_string(), format!("z{i}")]);
    }
    for c in [cmd, sadd, za, zs] {
        let refs: Vec<&str> = c.iter().map(|s| s.as_str()).collect();
        let r = run(&mut e, &refs);
        assert!(!r.starts_with(b"-"), "{}", String::from_utf8_lossy(&r));
    }
    let r = run(
        &mut e,
        &["ZINTERSTORE", "zu", "2", "zs", "zs", "WEIGHTS", "1", "0"],
    );
    assert_eq!(int(&r).unwrap(), ZSET_N as i64);
    // The transaction's list and set start large (pieced).
    let mut lt = vec!["RPUSH".to_string(), "lt".into()];
    lt.extend((0..LIST_N).map(|i| format!("e{i}")));
    let mut st = vec!["SADD".to_string(), "st".into()];
    st.extend((0..SET_N).map(|i| format!("base{i}")));
    for c in [lt, st] {
        let refs: Vec<&str> = c.iter().map(|s| s.as_str()).collect();
        let r = run(&mut e, &refs);
        assert!(!r.starts_with(b"-"), "{}", String::from_utf8_lossy(&r));
    }
    let r = run(&mut e, &["XGROUP", "CREATE", "xs", "g", "0", "MKSTREAM"]);
    assert_eq!(r, b"+OK\r\n");
    e.commit().unwrap();
    drop(e);
    Embedded::shutdown(sh).unwrap();
}

/// Instants (on the simulator's clock) of the counted writes: when each was
/// started and when the commit covering it returned.
#[derive(Default)]
struct Counted {
    /// (start, ack) of each increment of the counters (hash and sorted set
    /// alike) and of each RPUSH of the sequence, in order.
    incr: Vec<(u64, u64)>,
    push: Vec<(u64, u64)>,
    /// Of each transaction.
    tx: Vec<(u64, u64)>,
    /// Of each XADD.
    xadd: Vec<(u64, u64)>,
}

/// A transaction's writes as a script (every other transaction runs so).
const TX_SCRIPT: &str = "redis.call('incr', KEYS[1]) redis.call('rpush', KEYS[2], 'x') \
    redis.call('hincrby', KEYS[3], 'n', 1) redis.call('zincrby', KEYS[4], 1, 'n') \
    return redis.call('sadd', KEYS[5], ARGV[1])";

fn workload(e: &mut Embedded, sim: &CrashSim, seed: u64) -> Counted {
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut counted = Counted::default();
    let mut next_push = 0usize;
    for _ in 0..BATCHES {
        let mut pending_incr = Vec::new();
        let mut pending_push = Vec::new();
        let mut pending_tx = Vec::new();
        let mut pending_xadd = Vec::new();
        for _ in 0..rng.random_range(1..=MAX_BATCH) {
            let start = sim.tick();
            match rng.random_range(0..10) {
                8 => {
                    let n = counted.xadd.len() + pending_xadd.len() + 1;
                    let id = format!("{n}-1");
                    let r = run(e, &["XADD", "xs", &id, "f", &"x".repeat(60)]);
                    assert_eq!(r, format!("${}\r\n{id}\r\n", id.len()).as_bytes());
                    pending_xadd.push(start);
                }
                9 => {
                    let r = run(
                        e,
                        &[
                            "XREADGROUP",
                            "GROUP",
                            "g",
                            "c",
                            "COUNT",
                            "3",
                            "STREAMS",
                            "xs",
                            ">",
                        ],
                    );
                    assert!(r.starts_with(b"*"), "{}", String::from_utf8_lossy(&r));
                    // Acknowledge the oldest pending entry, if any.
                    let p = run(e, &["XPENDING", "xs", "g", "-", "+", "1"]);
                    let s = String::from_utf8_lossy(&p).into_owned();
                    if let Some(id) = s.split("\r\n").nth(3) {
                        let r = run(e, &["XACK", "xs", "g", id]);
                        assert_eq!(r, b":1\r\n", "{s}");
                    }
                }
                7 => {
                    let i = counted.tx.len() + pending_tx.len();
                    let m = format!("tx{i}");
                    if i % 2 == 0 {
                        assert_eq!(run(e, &["MULTI"]), b"+OK\r\n");
                        for c in [
                            vec!["INCR", "t"],
                            vec!["RPUSH", "lt", "x"],
                            vec!["HINCRBY", "ht", "n", "1"],
                            vec!["ZINCRBY", "zt", "1", "n"],
                        ] {
                            assert_eq!(run(e, &c), b"+QUEUED\r\n");
                        }
                        assert_eq!(run(e, &["SADD", "st", &m]), b"+QUEUED\r\n");
                        let r = run(e, &["EXEC"]);
                        assert!(r.starts_with(b"*5\r\n"), "{}", String::from_utf8_lossy(&r));
                    } else {
                        // The same five writes as one Lua script.
                        let r = run(
                            e,
                            &["EVAL", TX_SCRIPT, "5", "t", "lt", "ht", "zt", "st", &m],
                        );
                        assert_eq!(r, b":1\r\n", "{}", String::from_utf8_lossy(&r));
                    }
                    pending_tx.push(start);
                }
                0 => {
                    let (a, b) = if rng.random_bool(0.5) {
                        ("l1", "l2")
                    } else {
                        ("l2", "l1")
                    };
                    run(e, &["LMOVE", a, b, "LEFT", "RIGHT"]);
                }
                1 => {
                    let (a, b) = if rng.random_bool(0.5) {
                        ("s1", "s2")
                    } else {
                        ("s2", "s1")
                    };
                    let m = format!("m{}", rng.random_range(0..SET_N));
                    run(e, &["SMOVE", a, b, &m]);
                }
                2 => {
                    let m = format!("z{}", rng.random_range(0..ZSET_N));
                    let s = rng.random_range(-1000..1000).to_string();
                    let r = run(e, &["ZADD", "z", "XX", &s, &m]);
                    assert_eq!(r, b":0\r\n");
                }
                3 => {
                    let w = rng.random_range(1..50).to_string();
                    let r = run(
                        e,
                        &["ZINTERSTORE", "zu", "2", "zs", "zs", "WEIGHTS", &w, "0"],
                    );
                    assert_eq!(int(&r).unwrap(), ZSET_N as i64);
                }
                4 => {
                    let r = run(e, &["HINCRBY", "h", "n", "1"]);
                    assert!(r.starts_with(b":"));
                    pending_incr.push(start);
                }
                5 => {
                    let r = run(e, &["ZINCRBY", "zc", "1", "n"]);
                    assert!(r.starts_with(b"$"));
                    pending_incr.push(start);
                }
                _ => {
                    let v = format!("p{next_push}");
                    next_push += 1;
                    run(e, &["RPUSH", "seq", &v]);
                    pending_push.push(start);
                }
            }
        }
        e.commit().unwrap();
        let ack = sim.tick();
        counted
            .incr
            .extend(pending_incr.into_iter().map(|s| (s, ack)));
        counted
            .push
            .extend(pending_push.into_iter().map(|s| (s, ack)));
        counted.tx.extend(pending_tx.into_iter().map(|s| (s, ack)));
        counted
            .xadd
            .extend(pending_xadd.into_iter().map(|s| (s, ack)));
    }
    counted
}

fn recover(path: &Path) -> Result<(Arc<Shared>, Embedded), String> {
    common::recover(cfg(path))
}

fn check(e: &mut Embedded, img: &CrashImage, counted: &Counted) -> Result<(), String> {
    // Lists: every element once, in one of the two lists.
    let mut all = bulks(&run(e, &["LRANGE", "l1", "0", "-1"]))?;
    all.extend(bulks(&run(e, &["LRANGE", "l2", "0", "-1"]))?);
    let uniq: BTreeSet<&String> = all.iter().collect();
    if all.len() != LIST_N || uniq.len() != LIST_N {
        return Err(format!(
            "lists hold {} elements, {} distinct",
            all.len(),
            uniq.len()
        ));
    }
    // Sets: disjoint, every member.
    let s1: BTreeSet<String> = bulks(&run(e, &["SMEMBERS", "s1"]))?.into_iter().collect();
    let s2: BTreeSet<String> = bulks(&run(e, &["SMEMBERS", "s2"]))?.into_iter().collect();
    if !s1.is_disjoint(&s2) || s1.len() + s2.len() != SET_N {
        return Err(format!("sets hold {} + {} members", s1.len(), s2.len()));
    }
    // The sorted set: order, scores and ranks agree.
    let flat = bulks(&run(e, &["ZRANGE", "z", "0", "-1", "WITHSCORES"]))?;
    if flat.len() != 2 * ZSET_N {
        return Err(format!("z holds {} members", flat.len() / 2));
    }
    let mut members = BTreeSet::new();
    let mut last = f64::NEG_INFINITY;
    for (rank, p) in flat.chunks(2).enumerate() {
        let s: f64 = p[1].parse().map_err(|_| format!("score {}", p[1]))?;
        if s < last {
            return Err(format!("z out of order at rank {rank}"));
        }
        last = s;
        members.insert(p[0].clone());
        let zs = num(&run(e, &["ZSCORE", "z", &p[0]]))?;
        let zr = int(&run(e, &["ZRANK", "z", &p[0]]))?;
        if zs != s || zr != rank as i64 {
            return Err(format!(
                "z: {} at rank {rank} with {s} in the order, ZSCORE {zs} ZRANK {zr}",
                p[0]
            ));
        }
    }
    if members.len() != ZSET_N {
        return Err("z holds a member twice".into());
    }
    // The rewritten sorted set is one command's result.
    let zu = bulks(&run(e, &["ZRANGE", "zu", "0", "-1", "WITHSCORES"]))?;
    if zu.len() != 2 * ZSET_N {
        return Err(format!("zu holds {} members", zu.len() / 2));
    }
    let w: f64 = zu[1].parse().unwrap_or(f64::NAN);
    for (i, p) in zu.chunks(2).enumerate() {
        let s: f64 = p[1].parse().unwrap_or(f64::NAN);
        if p[0] != format!("z{i}") || s != w * (i + 1) as f64 {
            return Err(format!("zu mixes two results: {} {s} (w {w})", p[0]));
        }
    }
    // Counters and the sequence: acknowledged <= present <= started.
    let bounds = |v: &[(u64, u64)]| {
        let acked = v.iter().filter(|(_, a)| *a < img.tag_before).count();
        let started = v.iter().filter(|(s, _)| *s < img.tag).count();
        (acked, started)
    };
    let n = num(&run(e, &["HGET", "h", "n"]))? + num(&run(e, &["ZSCORE", "zc", "n"]))?;
    let (acked, started) = bounds(&counted.incr);
    if (n as usize) < acked || n as usize > started {
        return Err(format!(
            "counters {n}: acknowledged {acked}, started {started}"
        ));
    }
    let seq = bulks(&run(e, &["LRANGE", "seq", "0", "-1"]))?;
    let (acked, started) = bounds(&counted.push);
    if seq.len() < acked || seq.len() > started {
        return Err(format!(
            "seq of {}: acknowledged {acked}, started {started}",
            seq.len()
        ));
    }
    for (i, v) in seq.iter().enumerate() {
        if v != &format!("p{i}") {
            return Err(format!("seq[{i}] = {v}"));
        }
    }
    // The transactions: all of each or none.
    let t = num(&run(e, &["GET", "t"]))? as i64;
    let lt = int(&run(e, &["LLEN", "lt"]))? - LIST_N as i64;
    let ht = num(&run(e, &["HGET", "ht", "n"]))? as i64;
    let zt = num(&run(e, &["ZSCORE", "zt", "n"]))? as i64;
    let st = int(&run(e, &["SCARD", "st"]))? - SET_N as i64;
    if [lt, ht, zt, st] != [t; 4] {
        return Err(format!(
            "transactions half applied: INCR {t}, RPUSH {lt}, HINCRBY {ht}, ZINCRBY {zt}, SADD {st}"
        ));
    }
    check_stream(e, &bounds(&counted.xadd))?;
    let (acked, started) = bounds(&counted.tx);
    if (t as usize) < acked || t as usize > started {
        return Err(format!(
            "transactions {t}: acknowledged {acked}, started {started}"
        ));
    }
    Ok(())
}

/// The stream and its group agree (see the module's text); `appends`: the
/// XADDs acknowledged and started.
fn check_stream(e: &mut Embedded, appends: &(usize, usize)) -> Result<(), String> {
    let len = int(&run(e, &["XLEN", "xs"]))? as usize;
    if len < appends.0 || len > appends.1 {
        return Err(format!(
            "stream of {len}: acknowledged {}, started {}",
            appends.0, appends.1
        ));
    }
    // The entries are 1-1 .. len-1, in order.
    for (i, id) in entry_ids(&run(e, &["XRANGE", "xs", "-", "+"]))?
        .iter()
        .enumerate()
    {
        if *id != format!("{}-1", i + 1) {
            return Err(format!("stream entry {i} is {id}"));
        }
    }
    // The group: pending entries are delivered entries still in the stream,
    // counted the same by the summary, the consumer and the list.
    let info = String::from_utf8_lossy(&run(e, &["XINFO", "GROUPS", "xs"])).into_owned();
    let field = |name: &str| -> Option<String> {
        let parts: Vec<&str> = info.split("\r\n").collect();
        let i = parts.iter().position(|p| *p == name)?;
        // The value: the next line that is not a bulk string's length.
        let v = parts[i + 1..].iter().find(|p| !p.starts_with('$'))?;
        Some(v.trim_start_matches(':').to_string())
    };
    let last = field("last-delivered-id").ok_or(format!("no group: {info}"))?;
    let pending: usize = field("pending")
        .and_then(|p| p.parse().ok())
        .ok_or(format!("group pending: {info}"))?;
    let list = entry_ids(&run(e, &["XPENDING", "xs", "g", "-", "+", "1000000"]))?;
    if list.len() != pending {
        return Err(format!(
            "XINFO says {pending} pending, XPENDING lists {}",
            list.len()
        ));
    }
    let last_n: usize = last.trim_end_matches("-1").parse().unwrap_or(0);
    if last_n > len {
        return Err(format!("delivered up to {last}, stream of {len}"));
    }
    for id in &list {
        let n: usize = id.trim_end_matches("-1").parse().unwrap_or(usize::MAX);
        if n > last_n {
            return Err(format!("{id} pending, delivered only up to {last}"));
        }
    }
    let consumers =
        String::from_utf8_lossy(&run(e, &["XINFO", "CONSUMERS", "xs", "g"])).into_owned();
    if pending > 0 && !consumers.contains(&format!("pending\r\n:{pending}\r\n")) {
        return Err(format!(
            "the consumer's count differs from {pending}: {consumers}"
        ));
    }
    Ok(())
}

/// The IDs at the front of each element of an array of arrays (XRANGE's
/// entries, XPENDING's pending entries).
fn entry_ids(r: &[u8]) -> Result<Vec<String>, String> {
    let s = String::from_utf8_lossy(r);
    let lines: Vec<&str> = s.split("\r\n").collect();
    let mut out = Vec::new();
    for (i, l) in lines.iter().enumerate() {
        // Each element opens with `*2` or `*4` and then its ID.
        if (*l == "*2" || *l == "*4") && i > 0 {
            if let Some(id) = lines.get(i + 2) {
                if lines[i + 1].starts_with('$') && id.contains('-') {
                    out.push(id.to_string());
                }
            }
        }
    }
    Ok(out)
}

#[test]
fn collection_commands_survive_power_loss() {
    let dir = tempfile::tempdir_in(common::shm_dir()).unwrap();
    let first_seed: u64 = std::env::var("EMBER_POWER_LOSS_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    let started = Instant::now();
    let (mut images, mut bad) = (0u64, 0u64);
    let mut seed = first_seed;
    while images < IMAGES {
        let path = dir.path().join(format!("run{seed}"));
        create(&path);
        let c = cfg(&path);
        let sim = Arc::new(CrashSim::power_loss(seed, 0));
        let rec = Heap::open_sim(&path, &store::heap_options(&c), sim.clone()).unwrap();
        let st = Startup {
            existed: true,
            ..Startup::default()
        };
        let (store, st) = store::open_recovered(&c, rec, st, Instant::now()).unwrap();
        let sh = Embedded::start(c, store, st, 1).unwrap();
        let mut e = Embedded::new(sh.clone(), 0).unwrap();
        sim.tick();
        sim.set_capture_ppm(CAPTURE_PPM);
        let counted = workload(&mut e, &sim, seed);
        sim.set_capture_ppm(0);
        let mut imgs = sim.take_images();
        imgs.push(sim.capture_now(sh.store.heap().unwrap().region()));
        drop(e);
        Embedded::shutdown(sh).unwrap();
        let _ = std::fs::remove_file(&path);
        let img_path = dir.path().join("image");
        for (n, img) in imgs.iter().enumerate() {
            // A new file each time: the previous store's deferred block
            // frees (held by the epoch) may still store into its mapping,
            // which a truncated file would answer with a SIGBUS.
            let _ = std::fs::remove_file(&img_path);
            pmem::sim::write_image(&img_path, &img.bytes).unwrap();
            let r = recover(&img_path).and_then(|(sh, mut e)| {
                let r = check(&mut e, img, &counted);
                drop(e);
                Embedded::shutdown(sh).map_err(|e| format!("shutdown: {e}"))?;
                r
            });
            if let Err(err) = r {
                bad += 1;
                if bad <= 5 {
                    eprintln!("seed {seed} image {n} (tag {}): {err}", img.tag);
                }
            }
        }
        images += imgs.len() as u64;
        seed += 1;
    }
    use std::io::Write;
    let _ = writeln!(
        std::io::stderr(),
        "power-loss-sim collections: {images} images, {bad} inconsistent (seeds {first_seed}..{seed}, {:.1} s)",
        started.elapsed().as_secs_f64()
    );
    assert_eq!(bad, 0, "inconsistent images (see above)");
}
