//! Cache mode: `maxmemory` and `maxmemory-policy`. With a small limit (the
//! used memory at the start plus a few MiB) and 1,000-byte values:
//! noeviction refuses writes with Redis's `-OOM` and serves reads;
//! allkeys-lru keeps a working set that is read while the rest is written;
//! allkeys-lfu keeps the frequently read keys; volatile-* evict only keys with
//! a TTL and refuse writes once none is left; volatile-ttl evicts the nearest
//! TTLs first; allkeys-random evicts; INFO `evicted_keys` counts and
//! `evicted` keyspace events arrive; after SIGKILL and a restart the keyspace
//! is exactly what it was (no evicted key back, no acknowledged key lost);
//! CONFIG SET maxmemory lower evicts on the next write; the parameters'
//! texts and the OOM replies match redis-server's.

mod serve_common;

use serve_common::redis_server::{Conn, RedisServer};
use serve_common::{info_field, Server};
use std::collections::BTreeSet;
use std::time::{Duration, Instant};

const VAL: usize = 1000;

/// Bullet's writes reach the heap (and the used memory) when gleaned: small
/// logs keep what waits in them, and the used memory's lag, small.
fn start(extra: &[&str]) -> (tempfile::TempDir, Server, redis::Connection) {
    let dir = tempfile::tempdir().unwrap();
    let mut args = vec!["--logs", "2", "--log-size", "1mb"];
    args.extend_from_slice(extra);
    let srv = Server::start(dir.path(), &args);
    let con = srv.client();
    (dir, srv, con)
}

fn num(con: &mut redis::Connection, section: &str, field: &str) -> u64 {
    info_field(con, section, field).parse().unwrap()
}

fn config(con: &mut redis::Connection, name: &str, value: &str) {
    let () = redis::cmd("CONFIG")
        .arg("SET")
        .arg(name)
        .arg(value)
        .query(con)
        .unwrap();
}

/// Sets maxmemory to the used memory now plus `room` bytes and `policy`.
fn limit(con: &mut redis::Connection, room: u64, policy: &str) -> u64 {
    // Writes reach the heap when gleaned: let the start settle.
    std::thread::sleep(Duration::from_millis(200));
    let max = num(con, "memory", "used_memory") + room;
    config(con, "maxmemory-policy", policy);
    config(con, "maxmemory", &max.to_string());
    max
}

fn set(con: &mut redis::Connection, k: &str, ttl: Option<u64>) -> redis::RedisResult<()> {
    let mut c = redis::cmd("SET");
    c.arg(k).arg(vec![b'v'; VAL]);
    if let Some(t) = ttl {
        c.arg("EX").arg(t);
    }
    c.query(con)
}

fn exists(con: &mut redis::Connection, k: &str) -> bool {
    redis::cmd("EXISTS").arg(k).query::<i64>(con).unwrap() == 1
}

fn keys(con: &mut redis::Connection) -> BTreeSet<String> {
    redis::cmd("KEYS").arg("*").query(con).unwrap()
}

fn dbsize(con: &mut redis::Connection) -> u64 {
    redis::cmd("DBSIZE").query(con).unwrap()
}

const OOM: &str = "OOM command not allowed when used memory > 'maxmemory'.";

fn is_oom(e: &redis::RedisError) -> bool {
    e.code() == Some("OOM") && e.to_string().contains("used memory > 'maxmemory'")
}

/// The used memory stays near the limit: within what the gleaners may
/// hold back and the page granularity of the count.
fn assert_near_limit(con: &mut redis::Connection, max: u64) {
    let used = num(con, "memory", "used_memory");
    assert!(
        used <= max + (4 << 20),
        "used_memory {used} far above maxmemory {max}"
    );
}

#[test]
fn noeviction_refuses_writes_and_serves_reads() {
    let (_d, _srv, mut con) = start(&[]);
    let max = limit(&mut con, 2 << 20, "noeviction");
    let mut written = Vec::new();
    let mut refused = None;
    for i in 0..40_000 {
        let k = format!("k{i}");
        match set(&mut con, &k, None) {
            Ok(()) => written.push(k),
            Err(e) => {
                refused = Some(e);
                break;
            }
        }
    }
    let e = refused.expect("no OOM after 40 MB of writes");
    assert!(is_oom(&e), "{e}");
    assert!(written.len() > 500, "only {} writes fit", written.len());
    // Further writes are refused with the same text; reads, DEL and PING work.
    let raw = Conn::open(_srv.port).call(&["SET", "x", "y"]);
    assert_eq!(raw, proto::Reply::Error(OOM.into()));
    let v: Vec<u8> = redis::cmd("GET").arg(&written[0]).query(&mut con).unwrap();
    assert_eq!(v.len(), VAL);
    assert_eq!(dbsize(&mut con), written.len() as u64);
    let () = redis::cmd("PING").query(&mut con).unwrap();
    // MULTI: a queued denyoom command is refused and EXEC aborts.
    let mut c = Conn::open(_srv.port);
    assert_eq!(c.call(&["MULTI"]), proto::Reply::Simple("OK".into()));
    assert_eq!(c.call(&["SET", "x", "y"]), proto::Reply::Error(OOM.into()));
    assert_eq!(
        c.call(&["EXEC"]),
        proto::Reply::Error("EXECABORT Transaction discarded because of previous errors.".into())
    );
    // A script may read and delete, not write.
    assert_eq!(
        c.call(&[
            "EVAL",
            "return redis.call('exists', KEYS[1])",
            "1",
            written[0].as_str()
        ]),
        proto::Reply::Integer(1)
    );
    match c.call(&["EVAL", "return redis.call('set', KEYS[1], 'v')", "1", "x"]) {
        proto::Reply::Error(e) => assert!(e.starts_with(OOM), "{e}"),
        r => panic!("a script's SET under OOM: {r:?}"),
    }
    assert_eq!(num(&mut con, "stats", "evicted_keys"), 0);
    assert_eq!(info_field(&mut con, "memory", "maxmemory"), max.to_string());
    assert_eq!(
        info_field(&mut con, "memory", "maxmemory_policy"),
        "noeviction"
    );
    // DEL is not denyoom; after enough deletes (applied in the background)
    // writes are accepted again.
    for k in &written {
        let _: i64 = redis::cmd("DEL").arg(k).query(&mut con).unwrap();
    }
    let t = Instant::now();
    while set(&mut con, "again", None).is_err() {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "deletes made no room"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Writes `n` keys `prefix{i}` (with `ttl`), calling `between` after each.
fn fill(
    con: &mut redis::Connection,
    prefix: &str,
    n: usize,
    ttl: Option<u64>,
    mut between: impl FnMut(&mut redis::Connection, usize),
) {
    for i in 0..n {
        set(con, &format!("{prefix}{i}"), ttl).unwrap_or_else(|e| panic!("{prefix}{i}: {e}"));
        between(con, i);
    }
}

#[test]
fn allkeys_lru_keeps_the_working_set() {
    for engine in ["bullet", "direct"] {
        let (_d, _srv, mut con) = start(&["--engine", engine]);
        for i in 0..100 {
            set(&mut con, &format!("hot{i}"), None).unwrap();
        }
        let max = limit(&mut con, 3 << 20, "allkeys-lru");
        let mut reads = 0;
        fill(&mut con, "cold", 12_000, None, |con, i| {
            // Every hot key is read every 20 writes.
            for j in 0..5 {
                let k = format!("hot{}", (i * 5 + j) % 100);
                let _: Option<Vec<u8>> = redis::cmd("GET").arg(&k).query(con).unwrap();
                reads += 1;
            }
        });
        let evicted = num(&mut con, "stats", "evicted_keys");
        assert!(evicted > 5000, "{engine}: evicted {evicted}");
        let hot = (0..100)
            .filter(|i| exists(&mut con, &format!("hot{i}")))
            .count();
        assert!(hot >= 90, "{engine}: only {hot} of 100 hot keys kept");
        let n = dbsize(&mut con);
        assert_eq!(n + evicted, 12_100, "{engine}");
        assert_near_limit(&mut con, max);
        // OBJECT IDLETIME: a key just read is not idle; FREQ needs LFU.
        let idle: i64 = redis::cmd("OBJECT")
            .arg("IDLETIME")
            .arg("hot0")
            .query(&mut con)
            .unwrap();
        assert!(idle <= 1, "{idle}");
        let e = redis::cmd("OBJECT")
            .arg("FREQ")
            .arg("hot0")
            .query::<i64>(&mut con)
            .unwrap_err();
        assert!(e
            .to_string()
            .contains("An LFU maxmemory policy is not selected"));
    }
}

#[test]
fn allkeys_lfu_keeps_the_frequently_read_keys() {
    let (_d, _srv, mut con) = start(&[]);
    config(&mut con, "maxmemory-policy", "allkeys-lfu");
    for i in 0..100 {
        set(&mut con, &format!("hot{i}"), None).unwrap();
        for _ in 0..30 {
            let _: Vec<u8> = redis::cmd("GET")
                .arg(format!("hot{i}"))
                .query(&mut con)
                .unwrap();
        }
    }
    let f: i64 = redis::cmd("OBJECT")
        .arg("FREQ")
        .arg("hot0")
        .query(&mut con)
        .unwrap();
    assert!(f > 5, "freq {f}");
    let e = redis::cmd("OBJECT")
        .arg("IDLETIME")
        .arg("hot0")
        .query::<i64>(&mut con)
        .unwrap_err();
    assert!(e
        .to_string()
        .contains("An LFU maxmemory policy is selected"));
    let max = limit(&mut con, 3 << 20, "allkeys-lfu");
    fill(&mut con, "cold", 10_000, None, |con, i| {
        if i % 10 == 0 {
            let _: Option<Vec<u8>> = redis::cmd("GET")
                .arg(format!("hot{}", i / 10 % 100))
                .query(con)
                .unwrap();
        }
    });
    let evicted = num(&mut con, "stats", "evicted_keys");
    assert!(evicted > 4000, "evicted {evicted}");
    let hot = (0..100)
        .filter(|i| exists(&mut con, &format!("hot{i}")))
        .count();
    assert!(hot >= 90, "only {hot} of 100 frequently read keys kept");
    assert_near_limit(&mut con, max);
}

#[test]
fn allkeys_random_evicts() {
    let (_d, _srv, mut con) = start(&[]);
    let max = limit(&mut con, 2 << 20, "allkeys-random");
    fill(&mut con, "k", 8_000, None, |_, _| {});
    let evicted = num(&mut con, "stats", "evicted_keys");
    assert!(evicted > 3000, "evicted {evicted}");
    assert_eq!(dbsize(&mut con) + evicted, 8_000);
    assert_near_limit(&mut con, max);
    // CONFIG RESETSTAT zeroes the count.
    let () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query(&mut con)
        .unwrap();
    assert_eq!(num(&mut con, "stats", "evicted_keys"), 0);
}

/// volatile-lru and volatile-random evict only keys with a TTL; once none
/// is left, writes get -OOM.
#[test]
fn volatile_policies_evict_only_keys_with_a_ttl() {
    for policy in ["volatile-lru", "volatile-random", "volatile-lfu"] {
        let (_d, _srv, mut con) = start(&[]);
        let _max = limit(&mut con, 3 << 20, policy);
        fill(&mut con, "t", 1000, Some(10_000), |_, _| {});
        let mut persistent = 0;
        let e = loop {
            match set(&mut con, &format!("p{persistent}"), None) {
                Ok(()) => persistent += 1,
                Err(e) => break e,
            }
            assert!(persistent < 40_000, "{policy}: never refused");
        };
        assert!(is_oom(&e), "{policy}: {e}");
        for i in 0..persistent {
            assert!(exists(&mut con, &format!("p{i}")), "{policy}: p{i} evicted");
        }
        let evicted = num(&mut con, "stats", "evicted_keys");
        let ttl_left = (0..1000)
            .filter(|i| exists(&mut con, &format!("t{i}")))
            .count() as u64;
        assert_eq!(evicted + ttl_left, 1000, "{policy}");
        assert!(evicted > 900, "{policy}: evicted {evicted}");
    }
}

#[test]
fn volatile_ttl_evicts_the_nearest_ttls_first() {
    let (_d, _srv, mut con) = start(&[]);
    let _max = limit(&mut con, 3 << 20, "volatile-ttl");
    for i in 0..1000 {
        set(&mut con, &format!("near{i}"), Some(1000 + i)).unwrap();
        set(&mut con, &format!("far{i}"), Some(100_000 + i)).unwrap();
    }
    // Persistent writes until 600 keys were evicted.
    let mut i = 0;
    while num(&mut con, "stats", "evicted_keys") < 600 {
        for _ in 0..50 {
            set(&mut con, &format!("p{i}"), None).unwrap();
            i += 1;
        }
        assert!(i < 40_000, "never evicted");
    }
    let far = (0..1000)
        .filter(|i| exists(&mut con, &format!("far{i}")))
        .count();
    let near = (0..1000)
        .filter(|i| exists(&mut con, &format!("near{i}")))
        .count();
    // The near TTLs go first (sampled, so not strictly: at least four near
    // keys evicted for each far one).
    assert!(near < 500, "far {far}, near {near}");
    assert!(1000 - near >= 4 * (1000 - far), "far {far}, near {near}");
}

/// `evicted` events on `__keyevent@0__:evicted` (and the keyspace
/// channel), each naming a key that is gone.
#[test]
fn evictions_are_published() {
    let (_d, srv, mut con) = start(&[]);
    config(&mut con, "notify-keyspace-events", "Ee");
    let mut sub = Conn::open(srv.port);
    sub.call(&["SUBSCRIBE", "__keyevent@0__:evicted"]);
    let _max = limit(&mut con, 2 << 20, "allkeys-random");
    fill(&mut con, "k", 6_000, None, |_, _| {});
    let evicted = num(&mut con, "stats", "evicted_keys");
    assert!(evicted > 1000, "evicted {evicted}");
    let mut seen = BTreeSet::new();
    for _ in 0..evicted {
        match sub.request(&[]).unwrap() {
            proto::Reply::Array(m) | proto::Reply::Push(m) => {
                assert_eq!(m[0], proto::Reply::Bulk(b"message".to_vec()));
                assert_eq!(m[1], proto::Reply::Bulk(b"__keyevent@0__:evicted".to_vec()));
                let proto::Reply::Bulk(k) = &m[2] else {
                    panic!("{m:?}")
                };
                seen.insert(String::from_utf8(k.clone()).unwrap());
            }
            r => panic!("{r:?}"),
        }
    }
    assert_eq!(seen.len() as u64, evicted, "each eviction published once");
    for k in &seen {
        assert!(!exists(&mut con, k), "{k} published as evicted but present");
    }
}

/// After SIGKILL and a restart the keyspace is exactly what it was: no
/// evicted key comes back, no acknowledged key is lost.
#[test]
fn evictions_are_durable_across_sigkill() {
    for durability in ["pmem", "msync"] {
        let (_d, mut srv, mut con) = start(&["--durability", durability]);
        let _max = limit(&mut con, 2 << 20, "allkeys-lru");
        fill(&mut con, "k", 6_000, None, |_, _| {});
        assert!(num(&mut con, "stats", "evicted_keys") > 1000);
        let before = keys(&mut con);
        srv.kill9();
        srv.restart();
        let mut con = srv.client();
        assert_eq!(keys(&mut con), before, "{durability}");
        // Not persisted: the restart starts with the configured (default)
        // parameters; CONFIG SET is not written back.
        assert_eq!(info_field(&mut con, "memory", "maxmemory"), "0");
    }
}

#[test]
fn lowering_maxmemory_evicts_on_the_next_write() {
    let (_d, _srv, mut con) = start(&["--maxmemory-policy", "allkeys-random"]);
    for i in 0..4000 {
        set(&mut con, &format!("k{i}"), None).unwrap();
    }
    std::thread::sleep(Duration::from_millis(300));
    let used = num(&mut con, "memory", "used_memory");
    config(&mut con, "maxmemory-eviction-tenacity", "100");
    config(&mut con, "maxmemory", &(used - (2 << 20)).to_string());
    // Reads do not evict.
    let _: Vec<u8> = redis::cmd("GET").arg("k1").query(&mut con).unwrap();
    assert_eq!(num(&mut con, "stats", "evicted_keys"), 0);
    set(&mut con, "new", None).unwrap();
    let evicted = num(&mut con, "stats", "evicted_keys");
    // 2 MiB of 1,000-byte values (and their overheads) in one round.
    assert!(
        (1500..=2200).contains(&evicted),
        "evicted {evicted} for 2 MiB"
    );
}

/// A cache with no maxmemory evicts when the heap nears its largest size
/// instead of failing writes: 200 MB of 4,000-byte values written into a
/// 128 MiB heap.
#[test]
fn a_full_heap_evicts_instead_of_failing() {
    let (_d, _srv, mut con) = start(&[
        "--heap-size",
        "128mb",
        "--heap-max-size",
        "128mb",
        "--maxmemory-policy",
        "allkeys-lru",
    ]);
    assert_eq!(info_field(&mut con, "memory", "maxmemory"), "0");
    // A write the heap refuses anyway (its free pages too scattered) lowers
    // the limit: a few at most.
    let mut refused = Vec::new();
    for i in 0..50_000 {
        let r: redis::RedisResult<()> = redis::cmd("SET")
            .arg(format!("k{i}"))
            .arg(vec![b'v'; 4000])
            .query(&mut con);
        if let Err(e) = r {
            assert!(e.to_string().contains("heap is full"), "k{i}: {e}");
            refused.push(i);
            assert!(refused.len() <= 3, "refused: {refused:?}");
        }
    }
    assert!(num(&mut con, "stats", "evicted_keys") > 10_000);
}

/// The parameters' texts, the OOM replies and OBJECT FREQ/IDLETIME's
/// errors as redis-server gives them.
#[test]
fn config_texts_and_oom_replies_match_redis() {
    let redis = RedisServer::start();
    let (_d, srv, _con) = start(&[]);
    let mut ours = Conn::open(srv.port);
    let mut theirs = Conn::open(redis.port);
    let script: &[&[&str]] = &[
        &["CONFIG", "SET", "maxmemory", "foo"],
        &["CONFIG", "SET", "maxmemory", "-1"],
        &["CONFIG", "SET", "maxmemory", "1.5mb"],
        &["CONFIG", "SET", "maxmemory", "10mb"],
        &["CONFIG", "GET", "maxmemory"],
        &["CONFIG", "SET", "maxmemory", "1k"],
        &["CONFIG", "GET", "maxmemory"],
        &["CONFIG", "SET", "maxmemory", "5G"],
        &["CONFIG", "GET", "maxmemory"],
        &["CONFIG", "SET", "maxmemory", "0"],
        &["CONFIG", "SET", "maxmemory-policy", "foo"],
        &["CONFIG", "SET", "maxmemory-policy", "ALLKEYS-LRU"],
        &["CONFIG", "GET", "maxmemory-policy"],
        &["CONFIG", "SET", "maxmemory-samples", "0"],
        &["CONFIG", "SET", "maxmemory-samples", "x"],
        &["CONFIG", "SET", "maxmemory-samples", "10"],
        &["CONFIG", "GET", "maxmemory-samples"],
        &["CONFIG", "SET", "maxmemory-eviction-tenacity", "101"],
        &["CONFIG", "SET", "maxmemory-eviction-tenacity", "-1"],
        &["CONFIG", "GET", "maxmemory-eviction-tenacity"],
        &["CONFIG", "SET", "lfu-log-factor", "-1"],
        &["CONFIG", "GET", "lfu-log-factor"],
        &["CONFIG", "SET", "lfu-decay-time", "-1"],
        &["CONFIG", "GET", "lfu-decay-time"],
        &["SET", "a", "b"],
        &["OBJECT", "IDLETIME", "a"],
        &["OBJECT", "FREQ", "a"],
        &["OBJECT", "FREQ", "nokey"],
        &["CONFIG", "SET", "maxmemory-policy", "allkeys-lfu"],
        &["OBJECT", "IDLETIME", "a"],
        &["OBJECT", "IDLETIME", "nokey"],
        &["CONFIG", "SET", "maxmemory-policy", "noeviction"],
        // Every denyoom command refused: 1 byte is always exceeded.
        &["CONFIG", "SET", "maxmemory", "1"],
        &["SET", "a", "c"],
        &["GET", "a"],
        &["INCR", "n"],
        &["RPUSH", "l", "x"],
        &["EXPIRE", "a", "100"],
        &["MULTI"],
        &["SET", "x", "y"],
        &["GET", "a"],
        &["EXEC"],
        &["MULTI"],
        &["GET", "a"],
        &["EXEC"],
        &["EVAL", "return redis.call('get', KEYS[1])", "1", "a"],
        &["DEL", "a"],
        &["CONFIG", "SET", "maxmemory", "0"],
        &["SET", "a", "d"],
    ];
    for req in script {
        let (a, b) = (ours.call(req), theirs.call(req));
        assert_eq!(a, b, "{req:?}");
    }
}
