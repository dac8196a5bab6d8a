//! SIGKILL tests of `ember serve`, for each durable engine and both durability
//! modes: clients write while the server is killed with SIGKILL at a random
//! moment; after a restart every acknowledged write is present, counters are
//! exact (the one request in flight per client may or may not have happened),
//! TTLs survive, and nothing else is invented.

mod serve_common;

use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};
use redis::Commands;
use serve_common::Server;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// What one client knows: per key, the acknowledged value and the value of a
/// request that was in flight when the server died (if any).
#[derive(Default, Debug)]
struct Known {
    acked: HashMap<String, Option<String>>,
    inflight: Option<(String, Option<String>)>,
    counter: i64,
    counter_inflight: bool,
    acked_ops: u64,
}

fn client_loop(
    port: u16,
    id: usize,
    seed: u64,
    stop: Arc<AtomicBool>,
    acks: Arc<std::sync::atomic::AtomicU64>,
) -> Known {
    let mut k = Known::default();
    let Ok(c) = redis::Client::open(format!("redis://127.0.0.1:{port}/")) else {
        return k;
    };
    let Ok(mut con) = c.get_connection() else {
        return k;
    };
    let mut rng = SmallRng::seed_from_u64(seed);
    let counter_key = format!("ctr:{id}");
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        n += 1;
        let key = format!("k:{id}:{}", rng.random_range(0..200u32));
        match rng.random_range(0..10u32) {
            0..=4 => {
                let v = format!("v{n}-{}", "x".repeat(rng.random_range(0..300usize)));
                k.inflight = Some((key.clone(), Some(v.clone())));
                let r: redis::RedisResult<()> = con.set(&key, &v);
                if r.is_err() {
                    return k;
                }
                k.acked.insert(key, Some(v));
            }
            5 => {
                k.inflight = Some((key.clone(), None));
                let r: redis::RedisResult<i64> = con.del(&key);
                if r.is_err() {
                    return k;
                }
                k.acked.insert(key, None);
            }
            6 => {
                // A long TTL: must survive the restart.
                let v = format!("t{n}");
                k.inflight = Some((key.clone(), Some(v.clone())));
                let r: redis::RedisResult<()> = con.set_ex(&key, &v, 100_000);
                if r.is_err() {
                    return k;
                }
                k.acked.insert(key, Some(v));
            }
            _ => {
                k.inflight = None;
                k.counter_inflight = true;
                let r: redis::RedisResult<i64> = con.incr(&counter_key, 1);
                match r {
                    Ok(v) => {
                        k.counter += 1;
                        assert_eq!(v, k.counter, "INCR reply");
                        k.counter_inflight = false;
                    }
                    Err(_) => return k,
                }
            }
        }
        k.inflight = None;
        k.acked_ops += 1;
        acks.fetch_add(1, Ordering::Relaxed);
    }
    k.counter_inflight = false;
    k
}

fn check(srv: &Server, id: usize, k: &Known) {
    let mut con = srv.client();
    let ctr: Option<i64> = con.get(format!("ctr:{id}")).unwrap();
    let ctr = ctr.unwrap_or(0);
    assert!(
        ctr == k.counter || (k.counter_inflight && ctr == k.counter + 1),
        "client {id}: counter {ctr}, acknowledged {} (in flight: {})",
        k.counter,
        k.counter_inflight
    );
    for (key, want) in &k.acked {
        let got: Option<String> = con.get(key).unwrap();
        let inflight_ok = matches!(&k.inflight, Some((ik, iv)) if ik == key && *iv == got);
        assert!(
            got == *want || inflight_ok,
            "client {id}: key {key}: got {got:?}, acknowledged {want:?}, in flight {:?}",
            k.inflight
        );
        if let Some(v) = &got {
            if v.starts_with('t') {
                let ttl: i64 = con.ttl(key).unwrap();
                assert!(ttl > 90_000, "{key}: TTL lost ({ttl})");
            }
        }
    }
    // Nothing invented: every key of this client is one it wrote.
    let keys: Vec<String> = con.keys(format!("k:{id}:*")).unwrap();
    for key in keys {
        let inflight = matches!(&k.inflight, Some((ik, _)) if *ik == key);
        assert!(k.acked.contains_key(&key) || inflight, "invented key {key}");
    }
}

/// Returns the server (running, after a clean restart) and its directory.
fn kill_cycles(extra: &[&str], cycles: usize, seed: u64) -> (Server, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let mut srv = Server::start(dir.path(), extra);
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut knowns: Vec<Known> = Vec::new();
    for cycle in 0..cycles {
        let stop = Arc::new(AtomicBool::new(false));
        let acks = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let port = srv.port;
        let handles: Vec<_> = (0..2)
            .map(|id| {
                let (stop, acks) = (stop.clone(), acks.clone());
                let s = seed * 100 + cycle as u64 * 10 + id as u64;
                std::thread::spawn(move || client_loop(port, id + 2 * cycle, s, stop, acks))
            })
            .collect();
        std::thread::sleep(Duration::from_millis(rng.random_range(200..800u64)));
        // A loaded machine (msync is a device flush per batch) may have
        // acknowledged little by then: the kill waits for some writes.
        let t = std::time::Instant::now();
        while acks.load(Ordering::Relaxed) < 60 && t.elapsed() < Duration::from_secs(20) {
            std::thread::sleep(Duration::from_millis(10));
        }
        srv.kill9();
        stop.store(true, Ordering::Relaxed);
        for h in handles {
            knowns.push(h.join().unwrap());
        }
        srv.restart();
        let log = srv.log();
        assert!(log.contains("recovered after a crash"), "{log}");
        for (id, k) in knowns.iter().enumerate() {
            check(&srv, id, k);
        }
        let ops: u64 = knowns.iter().map(|k| k.acked_ops).sum();
        assert!(ops > 50, "too few operations acknowledged ({ops})");
    }
    // A clean shutdown after all that, and a clean start.
    assert!(srv.terminate(), "{}", srv.log());
    srv.restart();
    assert!(srv.log().contains("clean start"), "{}", srv.log());
    for (id, k) in knowns.iter().enumerate() {
        check(&srv, id, k);
    }
    (srv, dir)
}

#[test]
fn sigkill_bullet_pmem() {
    kill_cycles(&["--engine", "bullet"], 3, 1);
}

#[test]
fn sigkill_bullet_small_logs_gleaning() {
    // Logs of 1 MiB fill quickly: gleaning, head advances and log reuse all
    // happen before the kill.
    kill_cycles(
        &["--engine", "bullet", "--logs", "2", "--log-size", "1mb"],
        2,
        2,
    );
}

/// Bullet's bounded frontend (`--frontend-max-keys`): the DRAM table holds at
/// most 50 of the clients' 400 keys, the rest are read from the heap, and
/// every acknowledged write survives SIGKILL all the same. INFO shows the
/// bound, the evictions and the resident set's parts.
#[test]
fn sigkill_bullet_bounded_frontend() {
    let (srv, _dir) = kill_cycles(
        &[
            "--engine",
            "bullet",
            "--frontend-max-keys",
            "50",
            "--log-size",
            "2mb",
        ],
        2,
        7,
    );
    let mut con = srv.client();
    let field = |con: &mut redis::Connection, s: &str, f: &str| -> u64 {
        serve_common::info_field(con, s, f).parse().unwrap()
    };
    // Reads of every key (misses load them from the heap); then, once the
    // epoch of those loads is over (entries used in the current epoch stay),
    // misses of absent keys (each evicts from a few buckets) bring the
    // frontend back within its bound.
    let t = std::time::Instant::now();
    let mut entries = u64::MAX;
    while t.elapsed() < Duration::from_secs(20) {
        for id in 0..4 {
            for i in 0..200 {
                let _: Option<String> = con.get(format!("k:{id}:{i}")).unwrap();
            }
        }
        std::thread::sleep(Duration::from_millis(100));
        for i in 0..300 {
            let _: Option<String> = con.get(format!("absent:{i}")).unwrap();
        }
        entries = field(&mut con, "ember", "frontend_entries");
        if entries <= 50 {
            break;
        }
    }
    assert!(
        entries <= 50,
        "{entries} frontend entries over a bound of 50"
    );
    assert_eq!(field(&mut con, "ember", "frontend_max_keys"), 50);
    assert!(field(&mut con, "ember", "frontend_evictions") > 0);
    assert!(field(&mut con, "ember", "backend_loads") > 0);
    let rss = field(&mut con, "memory", "used_memory_rss");
    let heap = field(&mut con, "memory", "used_memory_rss_heap");
    let dram = field(&mut con, "memory", "used_memory_rss_dram");
    assert!(
        heap > 0 && dram > 0 && heap + dram <= rss,
        "{heap} + {dram} > {rss}"
    );
    let v: Vec<String> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("frontend-max-keys")
        .query(&mut con)
        .unwrap();
    assert_eq!(v, ["frontend-max-keys", "50"]);
}

#[test]
fn sigkill_bullet_one_worker_gleaner_thread() {
    // One worker (the default on two cores) never takes a gleaner role: a
    // background thread gleans the small logs.
    kill_cycles(
        &[
            "--engine",
            "bullet",
            "--threads",
            "1",
            "--logs",
            "2",
            "--log-size",
            "1mb",
        ],
        2,
        6,
    );
}

#[test]
fn sigkill_direct_logfree() {
    kill_cycles(&["--engine", "direct"], 2, 3);
}

#[test]
fn sigkill_direct_phash() {
    kill_cycles(&["--engine", "direct-phash"], 2, 4);
}

#[test]
fn sigkill_bullet_msync() {
    kill_cycles(&["--engine", "bullet", "--durability", "msync"], 2, 5);
}

#[test]
fn sigkill_bullet_msync_two_workers_small_logs() {
    // Group commit writes records through the file at each commit: with two
    // workers and logs of 1 MiB, writers move between logs, leave staged
    // records behind and take logs whose staged records another wrote; the
    // gleaner thread wraps the logs meanwhile.
    kill_cycles(
        &[
            "--engine",
            "bullet",
            "--durability",
            "msync",
            "--threads",
            "2",
            "--logs",
            "3",
            "--log-size",
            "1mb",
        ],
        2,
        7,
    );
}
