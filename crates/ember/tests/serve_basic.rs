//! `ember serve` end to end: redis-cli and the `redis` crate against the real
//! binary, restarts, expiry, every engine, and heaps it must refuse.

mod serve_common;

use redis::Commands;
use serve_common::{info_field, Server};
use std::process::Command;
use std::time::Duration;

fn redis_cli(port: u16, args: &[&str]) -> String {
    let out = Command::new("redis-cli")
        .arg("-p")
        .arg(port.to_string())
        .args(args)
        .output()
        .expect("redis-cli is not installed: run the README's test command (scripts/test.sh), which installs redis-tools");
    assert!(out.status.success(), "redis-cli {args:?}: {out:?}");
    String::from_utf8_lossy(&out.stdout).trim_end().to_string()
}

#[test]
fn redis_cli_works() {
    let dir = tempfile::tempdir().unwrap();
    let srv = Server::start(dir.path(), &[]);
    let p = srv.port;
    assert_eq!(redis_cli(p, &["ping"]), "PONG");
    assert_eq!(redis_cli(p, &["set", "greeting", "hello world"]), "OK");
    assert_eq!(redis_cli(p, &["get", "greeting"]), "hello world");
    assert_eq!(redis_cli(p, &["incrby", "n", "41"]), "41");
    assert_eq!(redis_cli(p, &["incr", "n"]), "42");
    assert_eq!(redis_cli(p, &["exists", "n", "greeting", "nope"]), "2");
    assert_eq!(redis_cli(p, &["type", "n"]), "string");
    let mut keys: Vec<String> = redis_cli(p, &["--scan"])
        .lines()
        .map(String::from)
        .collect();
    keys.sort();
    assert_eq!(keys, ["greeting", "n"]);
    assert_eq!(redis_cli(p, &["dbsize"]), "2");
    assert!(redis_cli(p, &["info", "server"]).contains("redis_version:"));
    // redis-cli speaks RESP3 when asked.
    assert_eq!(redis_cli(p, &["-3", "get", "greeting"]), "hello world");
    assert!(redis_cli(p, &["nosuchcommand"]).contains("unknown command"));
}

#[test]
fn data_and_ttls_survive_restarts_for_every_durable_engine() {
    for engine in [
        "bullet",
        "bullet-st",
        "bullet-opt",
        "direct",
        "direct-phash",
    ] {
        let dir = tempfile::tempdir().unwrap();
        let mut srv = Server::start(dir.path(), &["--engine", engine]);
        {
            let mut con = srv.client();
            for i in 0..500 {
                let _: () = con.set(format!("key:{i}"), format!("value:{i}")).unwrap();
            }
            let _: () = con.set_ex("ttl", "x", 1000).unwrap();
            let _: i64 = con.incr("counter", 7).unwrap();
            let _: () = redis::cmd("SELECT").arg(3).query(&mut con).unwrap();
            let _: () = con.set("in-db-3", "three").unwrap();
            let _: () = redis::cmd("SHUTDOWN").query(&mut con).unwrap_or(());
        }
        assert!(srv.wait_exit(), "{engine}: {}", srv.log());
        assert!(srv.log().contains("shut down"), "{}", srv.log());
        srv.restart();
        assert!(srv.log().contains("clean start"), "{engine}: {}", srv.log());
        let mut con = srv.client();
        for i in 0..500 {
            let v: String = con.get(format!("key:{i}")).unwrap();
            assert_eq!(v, format!("value:{i}"), "{engine}");
        }
        let ttl: i64 = con.ttl("ttl").unwrap();
        // Loose: the runs before this check may take long on a loaded machine;
        // what matters is that the TTL survived.
        assert!((900..=1000).contains(&ttl), "{engine}: ttl {ttl}");
        let n: i64 = con.get("counter").unwrap();
        assert_eq!(n, 7);
        let none: Option<String> = con.get("in-db-3").unwrap();
        assert_eq!(none, None, "{engine}: databases are separate");
        let _: () = redis::cmd("SELECT").arg(3).query(&mut con).unwrap();
        let v: String = con.get("in-db-3").unwrap();
        assert_eq!(v, "three");
        assert_eq!(info_field(&mut con, "ember", "engine_durable"), "yes");
        // Without group commit (pmem durability) records are stored through
        // the mapping, never written through the file.
        assert_eq!(info_field(&mut con, "ember", "writes_through"), "0");
        assert!(srv.terminate());
    }
}

/// Lists, hashes, sets and sorted sets, small (one head value) and large (pieces), come
/// back after a clean restart and after SIGKILL (at rest: no write in
/// flight), on every durable engine. (That no piece outlives its collection
/// is checked in the server crate's `collections.rs`.)
#[test]
fn collections_survive_restarts_for_every_durable_engine() {
    for engine in ["bullet", "direct"] {
        let dir = tempfile::tempdir().unwrap();
        let mut srv = Server::start(dir.path(), &["--engine", engine]);
        let fill = |con: &mut redis::Connection| {
            let big: Vec<String> = (0..3000).map(|i| format!("e{i}")).collect();
            let _: i64 = con.rpush("biglist", &big).unwrap();
            let _: i64 = con.lpush("smalllist", &["a", "b", "c"]).unwrap();
            let pairs: Vec<(String, String)> = (0..2000)
                .map(|i| (format!("f{i}"), format!("v{i}")))
                .collect();
            let _: () = con.hset_multiple("bighash", &pairs).unwrap();
            let _: i64 = con.hset("smallhash", "f", "v").unwrap();
            let members: Vec<String> = (0..1500).map(|i| format!("m{i}")).collect();
            let _: i64 = con.sadd("bigset", &members).unwrap();
            let _: i64 = con.sadd("intset", &[3, 1, 2]).unwrap();
            let scored: Vec<(f64, String)> = (0..2500)
                .map(|i| (i as f64 / 2.0, format!("z{i}")))
                .collect();
            let _: i64 = con.zadd_multiple("bigzset", &scored).unwrap();
            let _: i64 = con
                .zadd_multiple("smallzset", &[(2, "b"), (1, "a")])
                .unwrap();
            // A large collection deleted, one overwritten by a string.
            let _: i64 = con.rpush("gone", &big).unwrap();
            let _: i64 = con.del("gone").unwrap();
            let _: () = con.hset_multiple("replaced", &pairs).unwrap();
            let _: () = con.set("replaced", "now a string").unwrap();
        };
        let check = |con: &mut redis::Connection, what: &str| {
            let n: i64 = con.llen("biglist").unwrap();
            assert_eq!(n, 3000, "{engine} {what}");
            let v: String = con.lindex("biglist", 2999).unwrap();
            assert_eq!(v, "e2999");
            let r: Vec<String> = con.lrange("biglist", 1000, 1002).unwrap();
            assert_eq!(r, ["e1000", "e1001", "e1002"]);
            let r: Vec<String> = con.lrange("smalllist", 0, -1).unwrap();
            assert_eq!(r, ["c", "b", "a"]);
            let n: i64 = con.hlen("bighash").unwrap();
            assert_eq!(n, 2000, "{engine} {what}");
            let v: String = con.hget("bighash", "f1234").unwrap();
            assert_eq!(v, "v1234");
            let v: String = con.hget("smallhash", "f").unwrap();
            assert_eq!(v, "v");
            let n: i64 = con.scard("bigset").unwrap();
            assert_eq!(n, 1500);
            let yes: bool = con.sismember("bigset", "m777").unwrap();
            assert!(yes);
            let r: Vec<i64> = con.smembers("intset").unwrap();
            assert_eq!(r, [1, 2, 3]);
            let n: i64 = con.zcard("bigzset").unwrap();
            assert_eq!(n, 2500, "{engine} {what}");
            let r: Vec<(String, f64)> = con.zrange_withscores("bigzset", 1000, 1001).unwrap();
            assert_eq!(
                r,
                [("z1000".to_string(), 500.0), ("z1001".to_string(), 500.5)]
            );
            let rank: Option<i64> = con.zrank("bigzset", "z2222").unwrap();
            assert_eq!(rank, Some(2222));
            let r: Vec<String> = con.zrangebyscore("bigzset", 1249, "+inf").unwrap();
            assert_eq!(r, ["z2498", "z2499"]);
            let r: Vec<String> = con.zrange("smallzset", 0, -1).unwrap();
            assert_eq!(r, ["a", "b"]);
            let t: String = redis::cmd("TYPE").arg("replaced").query(con).unwrap();
            assert_eq!(t, "string");
            let n: i64 = redis::cmd("DBSIZE").query(con).unwrap();
            assert_eq!(n, 9, "{engine} {what}");
        };
        {
            let mut con = srv.client();
            fill(&mut con);
            check(&mut con, "before restart");
            let _: () = redis::cmd("SHUTDOWN").query(&mut con).unwrap_or(());
        }
        assert!(srv.wait_exit(), "{engine}: {}", srv.log());
        srv.restart();
        check(&mut srv.client(), "after a clean restart");
        srv.kill9();
        srv.restart();
        let mut con = srv.client();
        check(&mut con, "after SIGKILL");
        let _: () = redis::cmd("FLUSHALL").query(&mut con).unwrap();
        let keys: i64 = redis::cmd("DBSIZE").query(&mut con).unwrap();
        assert_eq!(keys, 0);
    }
}

#[test]
fn volatile_engine_says_it_is_not_durable() {
    let dir = tempfile::tempdir().unwrap();
    let mut srv = Server::start(dir.path(), &["--engine", "volatile"]);
    let mut con = srv.client();
    let _: () = con.set("a", "1").unwrap();
    assert!(info_field(&mut con, "ember", "engine_durable").starts_with("no"));
    assert_eq!(info_field(&mut con, "ember", "durability"), "none");
    assert!(srv.terminate());
    assert!(
        !dir.path().join("ember.heap").exists(),
        "volatile wrote a heap"
    );
}

#[test]
fn expiry_lazy_and_active() {
    let dir = tempfile::tempdir().unwrap();
    let srv = Server::start(dir.path(), &["--hz", "50"]);
    let mut con = srv.client();
    let _: () = redis::cmd("SET")
        .arg("short")
        .arg("v")
        .arg("PX")
        .arg(50)
        .query(&mut con)
        .unwrap();
    for i in 0..200 {
        let _: () = redis::cmd("SET")
            .arg(format!("bulk:{i}"))
            .arg("v")
            .arg("PX")
            .arg(30)
            .query(&mut con)
            .unwrap();
    }
    let _: () = con.set("keep", "v").unwrap();
    std::thread::sleep(Duration::from_millis(120));
    // Lazy: a read of an expired key finds nothing.
    let v: Option<String> = con.get("short").unwrap();
    assert_eq!(v, None);
    let ttl: i64 = con.ttl("short").unwrap();
    assert_eq!(ttl, -2);
    // Active: the keys nobody reads go too.
    let mut expired = 0;
    for _ in 0..200 {
        expired = info_field(&mut con, "stats", "expired_keys")
            .parse::<u64>()
            .unwrap();
        if expired >= 201 {
            break;
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    assert!(expired >= 201, "active expiry deleted only {expired} keys");
    let n: i64 = redis::cmd("DBSIZE").query(&mut con).unwrap();
    assert_eq!(n, 1);
}

/// `avg_ttl` of `db` in INFO keyspace (0 when the database is not listed).
fn avg_ttl(con: &mut redis::Connection, db: u8) -> i64 {
    let info: String = redis::cmd("INFO").arg("keyspace").query(con).unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix(&format!("db{db}:")))
        .and_then(|rest| rest.split(',').find_map(|f| f.strip_prefix("avg_ttl=")))
        .map(|v| v.trim().parse().unwrap())
        .unwrap_or(0)
}

/// Polls until `db`'s `avg_ttl` satisfies `ok` (the active expiry cycle
/// samples it), or fails after about 5 s.
fn wait_avg_ttl(con: &mut redis::Connection, db: u8, ok: impl Fn(i64) -> bool, what: &str) {
    let mut last = 0;
    for _ in 0..200 {
        last = avg_ttl(con, db);
        if ok(last) {
            return;
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    panic!("db{db} avg_ttl is {last}: {what}");
}

#[test]
fn info_keyspace_estimates_the_ttl_left() {
    let dir = tempfile::tempdir().unwrap();
    let srv = Server::start(dir.path(), &["--hz", "50"]);
    let mut con = srv.client();
    let set = |con: &mut redis::Connection, db: u8, n: usize, ex: Option<u64>| {
        let _: () = redis::cmd("SELECT").arg(db).query(con).unwrap();
        for i in 0..n {
            let mut c = redis::cmd("SET");
            c.arg(format!("k{i}")).arg("v");
            if let Some(s) = ex {
                c.arg("EX").arg(s);
            }
            let _: () = c.query(con).unwrap();
        }
    };
    set(&mut con, 0, 100, Some(1000));
    set(&mut con, 0, 50, None);
    set(&mut con, 1, 100, Some(100));
    // Keys without a TTL do not count: only the TTLs left, in milliseconds.
    wait_avg_ttl(
        &mut con,
        0,
        |a| (900_000..=1_000_000).contains(&a),
        "want ~1,000,000",
    );
    wait_avg_ttl(
        &mut con,
        1,
        |a| (90_000..=100_000).contains(&a),
        "want ~100,000",
    );
    // No key with a TTL left: 0, and the next estimate starts over.
    let _: () = redis::cmd("SELECT").arg(1).query(&mut con).unwrap();
    for i in 0..100 {
        let _: () = redis::cmd("PERSIST")
            .arg(format!("k{i}"))
            .query(&mut con)
            .unwrap();
    }
    assert_eq!(avg_ttl(&mut con, 1), 0);
    std::thread::sleep(Duration::from_millis(100));
    set(&mut con, 1, 100, Some(10));
    wait_avg_ttl(
        &mut con,
        1,
        |a| (1..=10_000).contains(&a),
        "want ~10,000 after PERSIST",
    );
    // FLUSHDB forgets the estimate too.
    let _: () = redis::cmd("SELECT").arg(0).query(&mut con).unwrap();
    let _: () = redis::cmd("FLUSHDB").query(&mut con).unwrap();
    set(&mut con, 0, 100, Some(20));
    wait_avg_ttl(
        &mut con,
        0,
        |a| (1..=20_000).contains(&a),
        "want ~20,000 after FLUSHDB",
    );
}

#[test]
fn refuses_foreign_heaps_and_other_engines() {
    let dir = tempfile::tempdir().unwrap();
    let mut srv = Server::start(dir.path(), &["--engine", "bullet"]);
    assert!(srv.terminate());
    let heap = dir.path().join("ember.heap");
    // A port nothing else uses (port 0 would serve no TCP at all).
    let port = serve_common::free_port();
    let run = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_ember"))
            .arg("serve")
            .arg("--port")
            .arg(port.to_string())
            .arg("--heap")
            .arg(&heap)
            .args(args)
            .output()
            .unwrap()
    };
    let out = run(&["--engine", "direct"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("holds a Bullet store"), "{err}");
    // A file that is not a heap.
    std::fs::write(&heap, vec![0x5a; 1 << 20]).unwrap();
    let out = run(&[]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("not an Ember heap"), "{err}");
    // The file is untouched.
    assert_eq!(std::fs::read(&heap).unwrap(), vec![0x5a; 1 << 20]);
}

/// `msync` mode with `commit-pipeline yes` commits a large batch on the
/// worker's syncer thread while the worker serves the next batches, holding
/// each batch's replies until its commit completes (and without it, in line).
/// Pipelining clients at once (writes, reads of their own writes, counters,
/// and pipelines of reads only behind writes in flight): every reply arrives,
/// in order and right; a graceful shutdown and restart keeps it all; the
/// server made fewer msyncs than the requests it served (writes shared
/// commits, as INFO's group commit counters say too), and handed commits to
/// its syncer thread exactly when asked to (pipelines of 96 requests: above
/// the batch size that commits in line).
#[test]
fn msync_pipelined_commits_reply_in_order_and_keep_everything() {
    for pipeline in ["yes", "no"] {
        msync_commits(pipeline);
    }
}

fn msync_commits(pipeline: &str) {
    const CLIENTS: usize = 6;
    const ROUNDS: usize = 60;
    const DEPTH: usize = 32;
    let dir = tempfile::tempdir().unwrap();
    let mut srv = Server::start(
        dir.path(),
        &["--durability", "msync", "--commit-pipeline", pipeline],
    );
    std::thread::scope(|s| {
        for id in 0..CLIENTS {
            let srv = &srv;
            s.spawn(move || {
                let mut con = srv.client();
                let mut ctr = 0i64;
                for round in 0..ROUNDS {
                    let mut p = redis::pipe();
                    for i in 0..DEPTH {
                        let key = format!("c{id}:k{}", (round * DEPTH + i) % 97);
                        let val = format!("v{round}-{i}");
                        p.set(&key, &val).get(&key).incr(format!("c{id}:ctr"), 1);
                    }
                    let out: Vec<redis::Value> = p.query(&mut con).unwrap();
                    assert_eq!(out.len(), DEPTH * 3);
                    for i in 0..DEPTH {
                        ctr += 1;
                        let val = format!("v{round}-{i}");
                        assert_eq!(out[i * 3], redis::Value::Okay);
                        assert_eq!(out[i * 3 + 1], redis::Value::BulkString(val.into_bytes()));
                        assert_eq!(out[i * 3 + 2], redis::Value::Int(ctr));
                    }
                    // Reads only, right behind the writes' commit.
                    let mut p = redis::pipe();
                    for i in 0..DEPTH {
                        p.get(format!("c{id}:k{}", (round * DEPTH + i) % 97));
                    }
                    let got: Vec<String> = p.query(&mut con).unwrap();
                    for (i, g) in got.iter().enumerate() {
                        assert_eq!(*g, format!("v{round}-{i}"));
                    }
                }
            });
        }
    });
    let mut con = srv.client();
    let msyncs: u64 = info_field(&mut con, "ember", "msyncs").parse().unwrap();
    let writes = (CLIENTS * ROUNDS * DEPTH * 2) as u64;
    assert!(
        msyncs < writes,
        "{msyncs} msyncs for {writes} writes: no group commit"
    );
    // Every request of a pipeline with writes was in a batch whose writes
    // awaited a group commit; batches held many requests each.
    let batches: u64 = info_field(&mut con, "ember", "group_commit_batches")
        .parse()
        .unwrap();
    let covered: u64 = info_field(&mut con, "ember", "group_commit_requests")
        .parse()
        .unwrap();
    let in_write_pipelines = (CLIENTS * ROUNDS * DEPTH * 3) as u64;
    assert!(
        batches > 0 && covered >= in_write_pipelines && batches < covered,
        "{batches} group commit batches holding {covered} requests ({in_write_pipelines} in pipelines with writes)"
    );
    // The records went to the file with one write per commit (at most: a
    // commit with nothing new to write writes nothing), not through the
    // mapping.
    let through: u64 = info_field(&mut con, "ember", "writes_through")
        .parse()
        .unwrap();
    assert!(
        through > 0 && through <= batches + msyncs,
        "{through} writes through the file for {batches} batches"
    );
    let pipelined: u64 = info_field(&mut con, "ember", "group_commits_pipelined")
        .parse()
        .unwrap();
    if pipeline == "yes" {
        assert!(pipelined > 0, "no commit went to the syncer thread");
    } else {
        assert_eq!(
            pipelined, 0,
            "commit-pipeline no, yet commits were handed over"
        );
    }
    drop(con);
    assert!(srv.terminate(), "no clean exit:\n{}", srv.log());
    srv.restart();
    let mut con = srv.client();
    for id in 0..CLIENTS {
        let ctr: i64 = con.get(format!("c{id}:ctr")).unwrap();
        assert_eq!(ctr, (ROUNDS * DEPTH) as i64);
        for i in 0..DEPTH {
            let n = (ROUNDS - 1) * DEPTH + i;
            let v: String = con.get(format!("c{id}:k{}", n % 97)).unwrap();
            assert_eq!(v, format!("v{}-{i}", ROUNDS - 1));
        }
    }
}
