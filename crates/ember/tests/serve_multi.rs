//! Transactions (MULTI, EXEC, DISCARD, WATCH, UNWATCH) against a real
//! redis-server: random transactions with errors at queueing and at run
//! time, watched keys written by a second connection, in RESP2 and RESP3,
//! give the same replies; scripted WATCH cases (expiry, FLUSHDB, the
//! client's own writes, RESET); client libraries' transactions (the `redis`
//! crate's atomic pipeline, redis-py's default pipeline); isolation of
//! optimistic (WATCH) increments across workers; MGET sees transactions and
//! MSET whole; and after SIGKILL each
//! transaction's writes are all present or none.

mod serve_common;

use proto::Reply;
use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};
use serve_common::redis_server::{reply_int, Conn, RedisServer};
use serve_common::Server;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// A request from words.
fn req(words: &[&str]) -> Vec<Vec<u8>> {
    words.iter().map(|w| w.as_bytes().to_vec()).collect()
}

/// Ember and Redis side by side, two connections to each (`a` runs the
/// transactions, `b` writes meanwhile).
struct Pair {
    a: [Conn; 2],
    b: [Conn; 2],
    mismatches: Vec<String>,
    history: Vec<String>,
}

impl Pair {
    fn new(ember: u16, redis: u16, resp3: bool) -> Pair {
        let mut p = Pair {
            a: [Conn::open(ember), Conn::open(redis)],
            b: [Conn::open(ember), Conn::open(redis)],
            mismatches: Vec::new(),
            history: Vec::new(),
        };
        if resp3 {
            for c in p.a.iter_mut().chain(p.b.iter_mut()) {
                assert!(matches!(c.call(&["HELLO", "3"]), Reply::Map(_)));
            }
        }
        p
    }

    /// Sends `args` on both servers' first (or `second`) connection and
    /// compares the replies; returns Redis's.
    fn send(&mut self, second: bool, args: &[Vec<u8>]) -> Reply {
        let conns = if second { &mut self.b } else { &mut self.a };
        let e = conns[0].call(args);
        let r = conns[1].call(args);
        let line = format!(
            "{}{}",
            if second { "(b) " } else { "" },
            args.iter()
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect::<Vec<_>>()
                .join(" ")
        );
        if e != r {
            self.mismatches.push(format!(
                "{line}\n  ember: {e:?}\n  redis: {r:?}\n  after:\n    {}",
                self.history[self.history.len().saturating_sub(12)..].join("\n    ")
            ));
        }
        self.history.push(line);
        r
    }
}

const KEYS: &[&str] = &["k1", "k2", "k3", "l1", "h1", "z1"];

/// A random command for a transaction: writes and reads of every type with
/// exact replies, run-time errors (WRONGTYPE, not an integer) and, rarely,
/// queueing errors (unknown command, wrong arity) and commands that need
/// every lock or change the database.
fn command(rng: &mut SmallRng) -> Vec<Vec<u8>> {
    let k = KEYS[rng.random_range(0..KEYS.len())];
    let k2 = KEYS[rng.random_range(0..KEYS.len())];
    let n = rng.random_range(0..5).to_string();
    let w: &[&str] = match rng.random_range(0..40) {
        0..=3 => &["SET", k, &n],
        4..=6 => &["INCR", k],
        7..=8 => &["GET", k],
        9 => &["DEL", k],
        10 => &["APPEND", k, "x"],
        11..=13 => &["LPUSH", k, &n],
        14 => &["RPOP", k],
        15 => &["LRANGE", k, "0", "-1"],
        16..=17 => &["HSET", k, "f", &n],
        18 => &["HINCRBY", k, "f", "2"],
        19 => &["HGETALL", k],
        20..=21 => &["ZADD", k, &n, "m"],
        22 => &["ZINCRBY", k, "1.5", "m"],
        23 => &["ZRANGE", k, "0", "-1", "WITHSCORES"],
        24 => &["EXISTS", k, k2],
        25 => &["TYPE", k],
        26 => &["MSET", k, "1", k2, "2"],
        27 => &["RENAME", k, k2],
        28 => &["LMOVE", k, k2, "LEFT", "RIGHT"],
        29 => &["BLPOP", k, "0"],
        30 => &["EXPIRE", k, "100"],
        31 => &["PERSIST", k],
        32 => &["DBSIZE"],
        33 => &["SELECT", if rng.random_bool(0.5) { "1" } else { "0" }],
        34 => &["COPY", k, k2, "REPLACE"],
        35 => &["NOSUCHCOMMAND", k],
        36 => &["GET"],
        37 => &["SET", k],
        38 => &["MOVE", k, "1"],
        _ => &["STRLEN", k],
    };
    req(w)
}

fn random_transactions(seed: u64, steps: usize, resp3: bool) -> Vec<String> {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let ember = Server::start(dir.path(), &["--threads", "2"]);
    let mut p = Pair::new(ember.port, redis.port, resp3);
    let mut rng = SmallRng::seed_from_u64(seed);
    for _ in 0..steps {
        if p.mismatches.len() >= 10 {
            break;
        }
        if rng.random_bool(0.05) {
            p.send(false, &req(&["FLUSHALL"]));
        }
        // WATCH some keys; the other connection may write one of them.
        if rng.random_bool(0.4) {
            let mut w = vec![b"WATCH".to_vec()];
            for _ in 0..rng.random_range(1..3) {
                w.push(KEYS[rng.random_range(0..KEYS.len())].as_bytes().to_vec());
            }
            p.send(false, &w);
            if rng.random_bool(0.5) {
                let c = command(&mut rng);
                // Outside a transaction BLPOP would wait.
                if c[0] != b"BLPOP" {
                    p.send(true, &c);
                }
            }
            if rng.random_bool(0.1) {
                p.send(false, &req(&["UNWATCH"]));
            }
        }
        if rng.random_bool(0.05) {
            // Outside a transaction, or nested.
            let c = match rng.random_range(0..3) {
                0 => req(&["EXEC"]),
                1 => req(&["DISCARD"]),
                _ => req(&["MULTI"]),
            };
            p.send(false, &c);
        }
        p.send(false, &req(&["MULTI"]));
        for _ in 0..rng.random_range(0..6) {
            let c = command(&mut rng);
            p.send(false, &c);
            if rng.random_bool(0.03) {
                p.send(false, &req(&["WATCH", "k1"]));
            }
            if rng.random_bool(0.03) {
                p.send(false, &req(&["MULTI"]));
            }
        }
        let end = if rng.random_bool(0.1) {
            "DISCARD"
        } else {
            "EXEC"
        };
        p.send(false, &req(&[end]));
        p.send(false, &req(&["SELECT", "0"]));
        // The state after it, read outside any transaction.
        for k in KEYS {
            let t = p.send(false, &req(&["TYPE", k]));
            let read: &[&str] = match &t {
                Reply::Simple(s) if s == "string" => &["GET", k],
                Reply::Simple(s) if s == "list" => &["LRANGE", k, "0", "-1"],
                Reply::Simple(s) if s == "hash" => &["HGETALL", k],
                Reply::Simple(s) if s == "zset" => &["ZRANGE", k, "0", "-1", "WITHSCORES"],
                _ => &["EXISTS", k],
            };
            p.send(false, &req(read));
        }
    }
    p.mismatches
}

#[test]
fn transactions_match_redis() {
    let seeds: Vec<u64> = match std::env::var("EMBER_DIFF_SEED") {
        Ok(s) => vec![s.parse().unwrap()],
        Err(_) => vec![1, 2],
    };
    let steps = std::env::var("EMBER_DIFF_STEPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(300);
    let mut bad = Vec::new();
    for seed in seeds {
        bad.extend(random_transactions(seed, steps, false));
        bad.extend(random_transactions(seed + 100, steps / 2, true));
    }
    assert!(
        bad.is_empty(),
        "{} mismatches:\n{}",
        bad.len(),
        bad.join("\n")
    );
}

/// Scripted WATCH cases with timing (expiry), FLUSHDB, the client's own
/// writes and RESET, compared with Redis.
#[test]
fn watch_cases_match_redis() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let ember = Server::start(dir.path(), &[]);
    let mut p = Pair::new(ember.port, redis.port, false);
    let script: &[(bool, &[&str])] = &[
        // The client's own write after WATCH fails its EXEC.
        (false, &["SET", "a", "1"]),
        (false, &["WATCH", "a"]),
        (false, &["INCR", "a"]),
        (false, &["MULTI"]),
        (false, &["INCR", "a"]),
        (false, &["EXEC"]),
        // Another client's write of the same value fails it too.
        (false, &["WATCH", "a"]),
        (true, &["SET", "a", "2"]),
        (false, &["MULTI"]),
        (false, &["GET", "a"]),
        (false, &["EXEC"]),
        // A write to another key does not; UNWATCH forgets.
        (false, &["WATCH", "a", "b"]),
        (true, &["SET", "c", "1"]),
        (false, &["MULTI"]),
        (false, &["GET", "a"]),
        (false, &["EXEC"]),
        (false, &["WATCH", "a"]),
        (true, &["DEL", "a"]),
        (false, &["UNWATCH"]),
        (false, &["MULTI"]),
        (false, &["SET", "a", "3"]),
        (false, &["EXEC"]),
        // FLUSHDB touches watched keys that exist, not missing ones.
        (false, &["WATCH", "a"]),
        (true, &["FLUSHDB"]),
        (false, &["MULTI"]),
        (false, &["PING"]),
        (false, &["EXEC"]),
        (false, &["WATCH", "missing"]),
        (true, &["FLUSHDB"]),
        (false, &["MULTI"]),
        (false, &["PING"]),
        (false, &["EXEC"]),
        // DISCARD and RESET unwatch.
        (false, &["SET", "a", "1"]),
        (false, &["WATCH", "a"]),
        (false, &["MULTI"]),
        (false, &["DISCARD"]),
        (true, &["SET", "a", "5"]),
        (false, &["MULTI"]),
        (false, &["GET", "a"]),
        (false, &["EXEC"]),
        (false, &["WATCH", "a"]),
        (false, &["MULTI"]),
        (false, &["RESET"]),
        (true, &["SET", "a", "6"]),
        (false, &["MULTI"]),
        (false, &["GET", "a"]),
        (false, &["EXEC"]),
        // A watched key in another database is another key.
        (false, &["SELECT", "1"]),
        (false, &["WATCH", "a"]),
        (true, &["SET", "a", "7"]),
        (false, &["MULTI"]),
        (false, &["GET", "a"]),
        (false, &["EXEC"]),
        (false, &["SELECT", "0"]),
        // A watched key that expires before EXEC fails it.
        (false, &["SET", "e", "1", "PX", "100"]),
        (false, &["WATCH", "e"]),
    ];
    for (second, w) in script {
        p.send(*second, &req(w));
    }
    std::thread::sleep(Duration::from_millis(250));
    for w in [&["MULTI"][..], &["PING"], &["EXEC"]] {
        p.send(false, &req(w));
    }
    // A key watched after it expired, then deleted by a read: no change.
    let after: &[(bool, &[&str])] = &[
        (false, &["SET", "f", "1", "PX", "50"]),
        (false, &["DEBUG", "SLEEP", "0"]),
    ];
    for (second, w) in after {
        p.send(*second, &req(w));
    }
    std::thread::sleep(Duration::from_millis(150));
    for w in [
        &["WATCH", "f"][..],
        &["GET", "f"],
        &["MULTI"],
        &["PING"],
        &["EXEC"],
    ] {
        p.send(false, &req(w));
    }
    // CLIENT LIST shows the transaction: flag x and the queued count.
    let mut e = Conn::open(ember.port);
    e.call(&["MULTI"]);
    e.call(&["SET", "q", "1"]);
    e.call(&["GET", "q"]);
    let Reply::Bulk(list) = Conn::open(ember.port).call(&["CLIENT", "LIST"]) else {
        panic!("CLIENT LIST");
    };
    let list = String::from_utf8_lossy(&list).into_owned();
    assert!(
        list.lines()
            .any(|l| l.contains("flags=x") && l.contains("multi=2")),
        "{list}"
    );
    assert!(p.mismatches.is_empty(), "{}", p.mismatches.join("\n"));
}

/// The `redis` crate's atomic pipeline and redis-py's default pipeline
/// (MULTI/EXEC) work unchanged.
#[test]
fn client_library_transactions() {
    let dir = tempfile::tempdir().unwrap();
    let ember = Server::start(dir.path(), &[]);
    let mut con = ember.client();
    let (a, b, l): (i64, String, Vec<String>) = redis::pipe()
        .atomic()
        .cmd("INCR")
        .arg("n")
        .cmd("SET")
        .arg("s")
        .arg("v")
        .ignore()
        .cmd("GET")
        .arg("s")
        .cmd("RPUSH")
        .arg("l")
        .arg("x")
        .ignore()
        .cmd("LRANGE")
        .arg("l")
        .arg(0)
        .arg(-1)
        .query(&mut con)
        .unwrap();
    assert_eq!((a, b.as_str(), l), (1, "v", vec!["x".to_string()]));
    // redis-py, if the test machine has it (scripts/test.sh installs it).
    let script = format!(
        r#"
import redis
r = redis.Redis(port={port})
assert r.pipeline().set("x", 1).get("x").incr("x").execute() == [True, b"1", 2]
with r.pipeline() as p:
    while True:
        try:
            p.watch("x")
            v = int(p.get("x"))
            p.multi()
            p.set("x", v + 10)
            p.execute()
            break
        except redis.WatchError:
            continue
assert r.get("x") == b"12"
print("redis-py ok")
"#,
        port = ember.port
    );
    serve_common::run_redis_py(&script);
}

/// Optimistic increments (WATCH, GET, MULTI, SET, EXEC, retried on a null
/// EXEC) from four clients on two workers lose none: the counter ends at
/// the number of EXECs that succeeded.
#[test]
fn watch_increments_are_isolated_across_workers() {
    let dir = tempfile::tempdir().unwrap();
    let ember = Server::start(dir.path(), &["--threads", "2"]);
    let port = ember.port;
    let handles: Vec<_> = (0..4)
        .map(|_| {
            std::thread::spawn(move || {
                let mut c = Conn::open(port);
                let (mut done, mut retries) = (0, 0);
                while done < 200 {
                    c.call(&["WATCH", "ctr"]);
                    let v = match c.call(&["GET", "ctr"]) {
                        Reply::Bulk(b) => String::from_utf8_lossy(&b).parse::<i64>().unwrap(),
                        _ => 0,
                    };
                    c.call(&["MULTI"]);
                    c.call(&["SET", "ctr", &(v + 1).to_string()]);
                    c.call(&["INCR", "execs"]);
                    match c.call(&["EXEC"]) {
                        Reply::Array(_) => done += 1,
                        Reply::NullArray | Reply::Null => retries += 1,
                        r => panic!("EXEC: {r:?}"),
                    }
                }
                retries
            })
        })
        .collect();
    let retries: i32 = handles.into_iter().map(|h| h.join().unwrap()).sum();
    let mut c = Conn::open(port);
    assert_eq!(c.call(&["GET", "ctr"]), Reply::Bulk(b"800".to_vec()));
    assert_eq!(c.call(&["GET", "execs"]), Reply::Bulk(b"800".to_vec()));
    eprintln!("optimistic increments: 800 committed, {retries} retried");
}

/// MGET sees a transaction's writes, and MSET's, whole or not at all:
/// clients on both workers read pairs of keys that a writer on one of them
/// always sets together.
#[test]
fn mget_sees_batches_whole() {
    let dir = tempfile::tempdir().unwrap();
    let ember = Server::start(dir.path(), &["--threads", "2"]);
    let port = ember.port;
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut c = Conn::open(port);
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                i += 1;
                let v = i.to_string();
                c.call(&["MULTI"]);
                c.call(&["SET", "a", &v]);
                c.call(&["SET", "b", &v]);
                assert!(matches!(c.call(&["EXEC"]), Reply::Array(_)));
                assert_eq!(
                    c.call(&["MSET", "c", &v, "d", &v]),
                    Reply::Simple("OK".into())
                );
            }
            i
        })
    };
    let readers: Vec<_> = (0..2)
        .map(|_| {
            std::thread::spawn(move || {
                let mut c = Conn::open(port);
                for n in 0..10000 {
                    for keys in [["a", "b"], ["c", "d"]] {
                        let r = c.call(&["MGET", keys[0], keys[1]]);
                        let Reply::Array(v) = &r else {
                            panic!("MGET: {r:?}");
                        };
                        assert_eq!(v[0], v[1], "MGET {keys:?} saw half a batch (read {n})");
                    }
                }
            })
        })
        .collect();
    for r in readers {
        r.join().unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    let batches = writer.join().unwrap();
    eprintln!("MGET: 40000 reads against {batches} transactions and MSETs");
}

/// Transactions under SIGKILL: each client runs `MULTI; INCR a:<id>; RPUSH
/// l:<id> x; HINCRBY h:<id> n 1; SET last:<id> <n>; EXEC`; after a restart
/// the four agree (all of a transaction or none), and hold at least every
/// acknowledged transaction and at most one more.
#[test]
fn sigkill_keeps_transactions_whole() {
    let dir = tempfile::tempdir().unwrap();
    let mut srv = Server::start(dir.path(), &["--threads", "2"]);
    let mut rng = SmallRng::seed_from_u64(7);
    for cycle in 0..3 {
        let stop = Arc::new(AtomicBool::new(false));
        let port = srv.port;
        let handles: Vec<_> = (0..3)
            .map(|id| {
                let stop = stop.clone();
                let id = cycle * 3 + id;
                std::thread::spawn(move || {
                    let mut c = Conn::open(port);
                    let mut acked = 0i64;
                    while !stop.load(Ordering::Relaxed) {
                        let n = (acked + 1).to_string();
                        let reqs: [&[&str]; 6] = [
                            &["MULTI"],
                            &["INCR", &format!("a:{id}")],
                            &["RPUSH", &format!("l:{id}"), "x"],
                            &["HINCRBY", &format!("h:{id}"), "n", "1"],
                            &["SET", &format!("last:{id}"), &n],
                            &["EXEC"],
                        ];
                        let mut req_bytes = Vec::new();
                        for r in reqs {
                            proto::encode_request(r, &mut req_bytes);
                        }
                        // One write for the whole transaction; the replies
                        // are read one by one (a dead server ends the loop).
                        let mut ok = true;
                        let mut last = Reply::Null;
                        for (i, _) in reqs.iter().enumerate() {
                            let r = if i == 0 {
                                c.request(&req_bytes)
                            } else {
                                c.request(&[])
                            };
                            match r {
                                Ok(r) => last = r,
                                Err(_) => {
                                    ok = false;
                                    break;
                                }
                            }
                        }
                        if !ok {
                            break;
                        }
                        assert!(
                            matches!(last, Reply::Array(ref v) if v.len() == 4),
                            "{last:?}"
                        );
                        acked += 1;
                    }
                    (id, acked)
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(rng.random_range(300..900u64)));
        srv.kill9();
        stop.store(true, Ordering::Relaxed);
        let results: Vec<(usize, i64)> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        srv.restart();
        let mut c = Conn::open(srv.port);
        for (id, acked) in results {
            let int = reply_int;
            let a = int(c.call(&["GET", &format!("a:{id}")]));
            let l = int(c.call(&["LLEN", &format!("l:{id}")]));
            let h = int(c.call(&["HGET", &format!("h:{id}"), "n"]));
            let last = int(c.call(&["GET", &format!("last:{id}")]));
            assert!(
                a == l && l == h && h == last,
                "client {id}: a {a}, list {l}, hash {h}, last {last}: a transaction was cut"
            );
            assert!(
                a == acked || a == acked + 1,
                "client {id}: {a} transactions present, {acked} acknowledged"
            );
            assert!(
                acked > 10,
                "client {id}: only {acked} transactions acknowledged"
            );
        }
    }
}
