//! SIGKILL tests of collection commands: while clients move elements between
//! two large lists (LMOVE) and two large sets (SMOVE), count in a hash
//! (HINCRBY) and a sorted set (ZINCRBY), and rewrite a large sorted set from
//! two others (ZINTERSTORE with new weights), the server is killed at a
//! random moment; after a restart no element is lost or doubled (each
//! command's writes, its heads and their pieces, are one crash-atomic
//! batch), the rewritten sorted set is wholly one command's result, and the
//! counters hold every acknowledged increment (plus at most the one in
//! flight).

mod serve_common;

use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};
use redis::Commands;
use serve_common::Server;
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

const LIST_N: usize = 1500;
const SET_N: usize = 1200;
const ZSET_N: usize = 1000;

fn fill(con: &mut redis::Connection) {
    let elems: Vec<String> = (0..LIST_N).map(|i| format!("e{i}")).collect();
    let _: i64 = con.rpush("src", &elems).unwrap();
    let members: Vec<String> = (0..SET_N).map(|i| format!("m{i}")).collect();
    let _: i64 = con.sadd("s1", &members).unwrap();
    let za: Vec<(usize, String)> = (0..ZSET_N).map(|i| (i + 1, format!("z{i}"))).collect();
    let zb: Vec<(usize, String)> = (0..ZSET_N).map(|i| (0, format!("z{i}"))).collect();
    let _: i64 = con.zadd_multiple("za", &za).unwrap();
    let _: i64 = con.zadd_multiple("zb", &zb).unwrap();
    let _: i64 = redis::cmd("ZINTERSTORE")
        .arg(&["zu", "2", "za", "zb", "WEIGHTS", "1", "0"])
        .query(con)
        .unwrap();
}

/// Moves elements back and forth until stopped; returns the acknowledged
/// increments of the counter and whether one was in flight.
/// `acks` counts every acknowledged command (the kill waits for some).
fn client(port: u16, seed: u64, stop: Arc<AtomicBool>, acks: Arc<AtomicU64>) -> (i64, bool) {
    let Ok(c) = redis::Client::open(format!("redis://127.0.0.1:{port}/")) else {
        return (0, false);
    };
    let Ok(mut con) = c.get_connection() else {
        return (0, false);
    };
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut acked = 0;
    while !stop.load(Ordering::Relaxed) {
        let r: redis::RedisResult<()> = match rng.random_range(0..5) {
            0 => {
                let (from, to) = if rng.random_bool(0.5) {
                    ("src", "dst")
                } else {
                    ("dst", "src")
                };
                con.lmove::<_, _, Option<String>>(
                    from,
                    to,
                    redis::Direction::Right,
                    redis::Direction::Left,
                )
                .map(|_| ())
            }
            1 => {
                let m = format!("m{}", rng.random_range(0..SET_N));
                let (from, to) = if rng.random_bool(0.5) {
                    ("s1", "s2")
                } else {
                    ("s2", "s1")
                };
                con.smove::<_, _, _, i64>(from, to, m).map(|_| ())
            }
            2 => {
                let w = rng.random_range(1..100).to_string();
                redis::cmd("ZINTERSTORE")
                    .arg(&["zu", "2", "za", "zb", "WEIGHTS", &w, "0"])
                    .query::<i64>(&mut con)
                    .map(|_| ())
            }
            3 => match con.zincr::<_, _, _, f64>(format!("zc{}", seed % 2), "n", 1) {
                Ok(_) => {
                    acked += 1;
                    Ok(())
                }
                Err(e) => return (acked, e.is_io_error() || e.is_connection_dropped()),
            },
            _ => match con.hincr::<_, _, _, i64>(format!("h{}", seed % 2), "n", 1) {
                Ok(_) => {
                    acked += 1;
                    Ok(())
                }
                Err(e) => return (acked, e.is_io_error() || e.is_connection_dropped()),
            },
        };
        if r.is_err() {
            return (acked, false);
        }
        acks.fetch_add(1, Ordering::Relaxed);
    }
    (acked, false)
}

fn check(con: &mut redis::Connection, counts: &[(i64, bool)], what: &str) {
    let mut all: Vec<String> = con.lrange("src", 0, -1).unwrap();
    let dst: Vec<String> = con.lrange("dst", 0, -1).unwrap();
    all.extend(dst);
    assert_eq!(all.len(), LIST_N, "{what}: elements lost or doubled");
    let uniq: BTreeSet<&String> = all.iter().collect();
    assert_eq!(uniq.len(), LIST_N, "{what}: an element doubled");
    let s1: BTreeSet<String> = con.smembers("s1").unwrap();
    let s2: BTreeSet<String> = con.smembers("s2").unwrap();
    assert!(s1.is_disjoint(&s2), "{what}: a member in both sets");
    assert_eq!(s1.len() + s2.len(), SET_N, "{what}: members lost");
    // ZINTERSTORE zu 2 za zb WEIGHTS w 0: every score of zu is w times za's,
    // for one w: a half-applied store would mix two.
    let zu: Vec<(String, f64)> = con.zrange_withscores("zu", 0, -1).unwrap();
    assert_eq!(
        zu.len(),
        ZSET_N,
        "{what}: ZINTERSTORE's result lost members"
    );
    let w = zu[0].1;
    for (i, (m, s)) in zu.iter().enumerate() {
        assert_eq!(m, &format!("z{i}"), "{what}: zu out of order");
        assert_eq!(*s, w * (i + 1) as f64, "{what}: zu mixes two results");
    }
    for (i, (acked, inflight)) in counts.iter().enumerate() {
        let h: Option<i64> = con.hget(format!("h{i}"), "n").unwrap();
        let z: Option<f64> = con.zscore(format!("zc{i}"), "n").unwrap();
        // One client counts in both its hash and its sorted set.
        let n = h.unwrap_or(0) + z.unwrap_or(0.0) as i64;
        assert!(
            n >= *acked && n <= acked + i64::from(*inflight),
            "{what}: counter h{i} = {n}, acknowledged {acked} (in flight: {inflight})"
        );
    }
}

fn kill_cycles(extra: &[&str], cycles: usize, seed: u64) {
    let dir = tempfile::tempdir().unwrap();
    let mut srv = Server::start(dir.path(), extra);
    fill(&mut srv.client());
    let mut rng = SmallRng::seed_from_u64(seed);
    // Acknowledged increments per counter, over all cycles.
    let mut counts = vec![(0i64, false); 2];
    for cycle in 0..cycles {
        let stop = Arc::new(AtomicBool::new(false));
        let acks = Arc::new(AtomicU64::new(0));
        let port = srv.port;
        let handles: Vec<_> = (0..2u64)
            .map(|id| {
                let (stop, acks) = (stop.clone(), acks.clone());
                // Client `id` counts in h{id}: seed % 2 == id.
                let s = 2 * (seed * 100 + cycle as u64 * 10) + id;
                std::thread::spawn(move || client(port, s, stop, acks))
            })
            .collect();
        std::thread::sleep(Duration::from_millis(rng.random_range(200..800u64)));
        // A loaded machine may have acknowledged little by then: the kill
        // waits for some commands (at most 20 s).
        let t = std::time::Instant::now();
        while acks.load(Ordering::Relaxed) < 60 && t.elapsed() < Duration::from_secs(20) {
            std::thread::sleep(Duration::from_millis(10));
        }
        srv.kill9();
        stop.store(true, Ordering::Relaxed);
        let mut progress = 0;
        for (id, h) in handles.into_iter().enumerate() {
            let (acked, inflight) = h.join().unwrap();
            progress += acked;
            // A request in flight at an earlier kill either happened or
            // not; the counter's bound widens by one for each.
            counts[id].0 += acked;
            counts[id].1 |= inflight;
        }
        assert!(progress > 10, "too few commands acknowledged ({progress})");
        srv.restart();
        let mut con = srv.client();
        // Re-anchor the counters on what survived: the next cycle's bounds
        // start from the recovered values.
        check(&mut con, &counts, &format!("{extra:?} cycle {cycle}"));
        for (i, c) in counts.iter_mut().enumerate() {
            let h: Option<i64> = con.hget(format!("h{i}"), "n").unwrap();
            let z: Option<f64> = con.zscore(format!("zc{i}"), "n").unwrap();
            *c = (h.unwrap_or(0) + z.unwrap_or(0.0) as i64, false);
        }
    }
}

#[test]
fn sigkill_collections_bullet_pmem() {
    kill_cycles(&[], 3, 1);
}

#[test]
fn sigkill_collections_bullet_msync() {
    kill_cycles(&["--durability", "msync"], 3, 2);
}

#[test]
fn sigkill_collections_direct() {
    kill_cycles(&["--engine", "direct"], 3, 3);
}
