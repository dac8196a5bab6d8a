//! The memcached port beside Redis's: the mapping between memcached items
//! and Redis strings (both protocols on database 0), its configuration,
//! `stats`, authentication, and a real client library (pymemcache).

mod serve_common;

use serve_common::{free_port, Server};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

fn start(dir: &std::path::Path, extra: &[&str]) -> (Server, u16) {
    let p = free_port();
    let ps = p.to_string();
    let mut args = vec!["--memcached-port", ps.as_str()];
    args.extend_from_slice(extra);
    (Server::start(dir, &args), p)
}

/// A memcached text connection.
struct Mc(TcpStream);

impl Mc {
    fn open(port: u16) -> Mc {
        let s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        Mc(s)
    }

    /// Sends `req` and `mn`; the replies before `MN`.
    fn call(&mut self, req: &str) -> String {
        self.0.write_all(req.as_bytes()).unwrap();
        self.0.write_all(b"mn\r\n").unwrap();
        let mut out = Vec::new();
        let mut buf = [0u8; 4096];
        while !(out.ends_with(b"MN\r\n")
            && (out.len() == 4 || out[..out.len() - 4].ends_with(b"\n")))
        {
            let n = self.0.read(&mut buf).unwrap();
            assert!(n > 0, "closed after {:?}", String::from_utf8_lossy(&out));
            out.extend_from_slice(&buf[..n]);
        }
        out.truncate(out.len() - 4);
        String::from_utf8(out).unwrap()
    }

    /// The CAS of `key` (gets).
    fn cas(&mut self, key: &str) -> u64 {
        let r = self.call(&format!("gets {key}\r\n"));
        r.split("\r\n")
            .next()
            .unwrap()
            .split(' ')
            .nth(4)
            .unwrap()
            .parse()
            .unwrap()
    }
}

fn redis_str(con: &mut redis::Connection, args: &[&str]) -> redis::Value {
    let mut c = redis::cmd(args[0]);
    for a in &args[1..] {
        c.arg(*a);
    }
    c.query(con).unwrap()
}

fn bulk(v: redis::Value) -> Option<String> {
    match v {
        redis::Value::BulkString(b) => Some(String::from_utf8(b).unwrap()),
        redis::Value::Nil => None,
        redis::Value::SimpleString(s) => Some(s),
        redis::Value::Int(i) => Some(i.to_string()),
        v => panic!("unexpected {v:?}"),
    }
}

#[test]
fn items_and_redis_strings_are_one_keyspace() {
    let dir = tempfile::tempdir().unwrap();
    let (srv, port) = start(dir.path(), &[]);
    let mut r = srv.client();
    let mut m = Mc::open(port);

    // A memcached item is a Redis string: its bytes, its TTL.
    assert_eq!(m.call("set item 42 100 5\r\nhello\r\n"), "STORED\r\n");
    assert_eq!(
        bulk(redis_str(&mut r, &["GET", "item"])).as_deref(),
        Some("hello")
    );
    assert_eq!(
        bulk(redis_str(&mut r, &["TYPE", "item"])).as_deref(),
        Some("string")
    );
    assert_eq!(
        bulk(redis_str(&mut r, &["STRLEN", "item"])).as_deref(),
        Some("5")
    );
    let ttl: i64 = bulk(redis_str(&mut r, &["TTL", "item"]))
        .unwrap()
        .parse()
        .unwrap();
    assert!((98..=100).contains(&ttl), "{ttl}");
    // RENAME keeps the item (flags and CAS); the old key is gone.
    let cas = m.cas("item");
    redis_str(&mut r, &["RENAME", "item", "moved"]);
    assert_eq!(
        m.call("gets moved item\r\n"),
        format!("VALUE moved 42 5 {cas}\r\nhello\r\nEND\r\n")
    );
    // A Redis write makes it a plain string again: flags 0, a new CAS.
    redis_str(&mut r, &["APPEND", "moved", "!"]);
    let r2 = m.call("gets moved\r\n");
    assert!(
        r2.starts_with("VALUE moved 0 6 ") && r2.ends_with("\r\nhello!\r\nEND\r\n"),
        "{r2}"
    );
    assert_ne!(m.cas("moved"), cas);

    // A Redis string is an item with flags 0; its CAS changes with its value.
    redis_str(&mut r, &["SET", "rs", "v1"]);
    assert_eq!(m.call("get rs\r\n"), "VALUE rs 0 2\r\nv1\r\nEND\r\n");
    let c1 = m.cas("rs");
    assert_eq!(m.cas("rs"), c1);
    redis_str(&mut r, &["SET", "rs", "v2"]);
    let c2 = m.cas("rs");
    assert_ne!(c1, c2);
    assert_eq!(
        m.call(&format!("cas rs 7 0 2 {c1}\r\nv3\r\n")),
        "EXISTS\r\n"
    );
    assert_eq!(
        m.call(&format!("cas rs 7 0 2 {c2}\r\nv3\r\n")),
        "STORED\r\n"
    );
    assert_eq!(m.call("mg rs v f\r\n"), "VA 2 f7\r\nv3\r\n");

    // Counters both ways.
    redis_str(&mut r, &["SET", "n", "41"]);
    assert_eq!(m.call("incr n 1\r\n"), "42\r\n");
    assert_eq!(
        bulk(redis_str(&mut r, &["INCR", "n"])).as_deref(),
        Some("43")
    );
    assert_eq!(m.call("decr n 50\r\n"), "0\r\n");

    // Expiry set on either side shows on the other.
    redis_str(&mut r, &["EXPIRE", "rs", "500"]);
    let t = m.call("mg rs t\r\n");
    assert!(t == "HD t500\r\n" || t == "HD t499\r\n", "{t}");
    assert_eq!(m.call("touch n 300\r\n"), "TOUCHED\r\n");
    let ttl: i64 = bulk(redis_str(&mut r, &["TTL", "n"]))
        .unwrap()
        .parse()
        .unwrap();
    assert!((298..=300).contains(&ttl), "{ttl}");

    // Collections are not items: reads miss, add refuses the key, set
    // replaces it, delete removes it.
    redis_str(&mut r, &["RPUSH", "list", "a", "b"]);
    redis_str(&mut r, &["HSET", "hash", "f", "v"]);
    assert_eq!(m.call("get list hash\r\n"), "END\r\n");
    assert_eq!(m.call("mg list v\r\n"), "EN\r\n");
    assert_eq!(
        m.call("incr list 1\r\nappend list 0 0 1\r\nx\r\n"),
        "NOT_FOUND\r\nNOT_STORED\r\n"
    );
    assert_eq!(m.call("add list 0 0 1\r\nx\r\n"), "NOT_STORED\r\n");
    assert_eq!(
        bulk(redis_str(&mut r, &["TYPE", "list"])).as_deref(),
        Some("list")
    );
    assert_eq!(m.call("set list 3 0 1\r\nx\r\n"), "STORED\r\n");
    assert_eq!(
        bulk(redis_str(&mut r, &["GET", "list"])).as_deref(),
        Some("x")
    );
    assert_eq!(m.call("delete hash\r\n"), "DELETED\r\n");
    assert_eq!(
        bulk(redis_str(&mut r, &["EXISTS", "hash"])).as_deref(),
        Some("0")
    );

    // memcached sees database 0 only.
    redis_str(&mut r, &["SELECT", "1"]);
    redis_str(&mut r, &["SET", "other", "db1"]);
    assert_eq!(m.call("get other\r\n"), "END\r\n");
    redis_str(&mut r, &["SELECT", "0"]);
    assert_eq!(bulk(redis_str(&mut r, &["DBSIZE"])).as_deref(), Some("4"));
    // flush_all empties database 0, whoever wrote the keys.
    assert_eq!(m.call("flush_all\r\n"), "OK\r\n");
    assert_eq!(bulk(redis_str(&mut r, &["DBSIZE"])).as_deref(), Some("0"));
    redis_str(&mut r, &["SELECT", "1"]);
    assert_eq!(bulk(redis_str(&mut r, &["DBSIZE"])).as_deref(), Some("1"));
}

#[test]
fn configuration_stats_and_limits() {
    let dir = tempfile::tempdir().unwrap();
    let (srv, port) = start(dir.path(), &["--memcached-item-size-max", "2kb"]);
    let mut r = srv.client();
    let got: Vec<String> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("memcached-*")
        .query(&mut r)
        .unwrap();
    assert_eq!(
        got,
        [
            "memcached-port".to_string(),
            port.to_string(),
            "memcached-item-size-max".into(),
            "2048".into(),
        ]
    );
    let e = redis::cmd("CONFIG")
        .arg("SET")
        .arg("memcached-port")
        .arg("1")
        .query::<()>(&mut r)
        .unwrap_err();
    assert!(e.to_string().contains("immutable"), "{e}");
    let mut m = Mc::open(port);
    // The item size limit, as memcached sizes items (header, key, value).
    let v = "x".repeat(1900);
    assert_eq!(
        m.call(&format!("set k 0 0 {}\r\n{v}\r\n", v.len())),
        "STORED\r\n"
    );
    let v = "x".repeat(2100);
    assert_eq!(
        m.call(&format!("set k 0 0 {}\r\n{v}\r\nget k\r\n", v.len())),
        "SERVER_ERROR object too large for cache\r\nEND\r\n"
    );
    assert_eq!(
        m.call("set a 0 0 1\r\n1\r\nget a b\r\ndelete b\r\n"),
        "STORED\r\nVALUE a 0 1\r\n1\r\nEND\r\nNOT_FOUND\r\n"
    );
    let s = m.call("stats\r\n");
    for f in [
        "STAT pid ",
        "STAT uptime ",
        "STAT version 1.6.18\r\n",
        "STAT curr_connections ",
        "STAT cmd_get 3\r\n",
        "STAT get_hits 1\r\n",
        "STAT get_misses 2\r\n",
        "STAT delete_misses 1\r\n",
        "STAT store_too_large 1\r\n",
        "STAT curr_items 1\r\n",
        "STAT evictions 0\r\n",
        "STAT limit_maxbytes ",
    ] {
        assert!(s.contains(f), "{f:?} missing from {s}");
    }
    assert!(s.ends_with("END\r\n"));
    assert!(m
        .call("stats settings\r\n")
        .contains("STAT item_size_max 2048\r\n"));
    assert_eq!(m.call("stats nonsense\r\n"), "ERROR\r\n");
    assert_eq!(m.call("version\r\n"), "VERSION 1.6.18\r\n");
    // me: memcached's debug line (class and size are Ember's own).
    // `la` is seconds since the last access: 0 on a quiet machine, a
    // second or two on a loaded one, so it is checked for a small number.
    let cas = m.cas("a");
    let reply = m.call("me a\r\nme nope\r\nme YQ== b\r\n");
    let mut seen = 0;
    let normal: Vec<String> = reply
        .split(' ')
        .map(|w| match w.strip_prefix("la=") {
            Some(n) => {
                let n: u64 = n.parse().expect("la= is a number");
                assert!(n <= 5, "last access {n} s ago in {reply}");
                seen += 1;
                "la=_".to_string()
            }
            None => w.to_string(),
        })
        .collect();
    assert_eq!(seen, 2, "{reply}");
    assert_eq!(
        normal.join(" "),
        format!(
            "ME a exp=-1 la=_ cas={cas} fetch=yes cls=1 size=61\r\nEN\r\nME a exp=-1 la=_ cas={cas} fetch=yes cls=1 size=61\r\n"
        )
    );
}

#[test]
fn a_password_shuts_the_memcached_port() {
    let dir = tempfile::tempdir().unwrap();
    let (_srv, port) = start(dir.path(), &["--requirepass", "secret"]);
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(b"get a\r\n").unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).unwrap();
    assert_eq!(out, b"CLIENT_ERROR unauthenticated\r\n");
}

/// pymemcache against the memcached port (skipped when python3 or
/// pymemcache is missing; scripts/test.sh installs it).
#[test]
fn pymemcache_client_works() {
    let dir = tempfile::tempdir().unwrap();
    let (_srv, port) = start(dir.path(), &[]);
    let script = format!(
        r#"
from pymemcache.client.base import Client
c = Client(("127.0.0.1", {port}))
assert c.set("a", b"1", expire=100)
assert c.get("a") == b"1"
assert c.add("a", b"2", noreply=False) is False
assert c.replace("a", b"5", noreply=False) is True
assert c.incr("a", 10) == 15
assert c.decr("a", 20) == 0
assert c.append("a", b"x", noreply=False)
assert c.prepend("a", b"y", noreply=False)
# decr wrote "0" over "15" in place, padded with a space, as memcached does
assert c.get("a") == b"y0 x"
v, cas = c.gets("a")
assert v == b"y0 x"
assert c.cas("a", b"new", cas, noreply=False) is True
assert c.cas("a", b"newer", cas, noreply=False) is False
assert c.get_many(["a", "missing"]) == {{"a": b"new"}}
c.set_many({{"k1": b"v1", "k2": b"v2"}})
assert c.get_multi(["k1", "k2"]) == {{"k1": b"v1", "k2": b"v2"}}
assert c.touch("k1", 50, noreply=False)
assert c.delete("k1", noreply=False)
assert c.get("k1") is None
assert c.delete("k1", noreply=False) is False
st = c.stats()
assert st[b"version"] == b"1.6.18" and b"curr_items" in st
assert c.version() == b"1.6.18"
assert c.flush_all(noreply=False)
assert c.get("a") is None
c.quit()
print("pymemcache ok")
"#
    );
    serve_common::run_python(&script, "pymemcache", "pymemcache");
}

/// A full heap: stores answer memcached's out-of-memory error, reads go on,
/// and deletes make room again.
#[test]
fn a_full_heap_answers_out_of_memory() {
    let dir = tempfile::tempdir().unwrap();
    let (_srv, port) = start(
        dir.path(),
        &[
            "--engine",
            "direct",
            "--heap-size",
            "32mb",
            "--heap-max-size",
            "64mb",
            "--threads",
            "1",
            "--memcached-item-size-max",
            "2m",
        ],
    );
    let mut m = Mc::open(port);
    let val = "v".repeat(1 << 20);
    let mut stored = 0;
    let oom = loop {
        assert!(
            stored < 200,
            "200 items of 1 MiB never filled a 64 MiB heap"
        );
        let r = m.call(&format!("set k{stored} 7 0 {}\r\n{val}\r\n", val.len()));
        if r != "STORED\r\n" {
            break r;
        }
        stored += 1;
    };
    assert_eq!(oom, "SERVER_ERROR out of memory storing object\r\n");
    assert!(stored >= 5, "only {stored} items fit");
    assert!(m.call("mg k0 s f\r\n").starts_with("HD s1048576 f7"));
    let r = m.call(&format!("ms more {} T0\r\n{val}\r\n", val.len()));
    assert_eq!(r, "SERVER_ERROR out of memory storing object\r\n");
    for i in 0..stored / 2 {
        assert_eq!(m.call(&format!("delete k{i}\r\n")), "DELETED\r\n");
    }
    let t = std::time::Instant::now();
    loop {
        let r = m.call(&format!("set again 0 0 {}\r\n{val}\r\n", val.len()));
        if r == "STORED\r\n" {
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(10), "{r}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A connection the server admitted (it answers `version`), or None.
fn admitted(port: u16) -> Option<Mc> {
    let mut c = Mc::open(port);
    c.0.write_all(b"version\r\n").ok()?;
    let mut buf = [0u8; 64];
    let n = c.0.read(&mut buf).unwrap_or(0);
    (&buf[..n] == b"VERSION 1.6.18\r\n").then_some(c)
}

/// Waits (up to 10 s) for a connection the server admits: a closed
/// connection's place is free once its worker saw it go.
fn admitted_soon(port: u16) -> Mc {
    let t = std::time::Instant::now();
    loop {
        if let Some(c) = admitted(port) {
            return c;
        }
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "no connection admitted"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// maxclients counts memcached connections too, and refuses one in
/// memcached's words.
#[test]
fn maxclients_refuses_in_memcached_words() {
    let dir = tempfile::tempdir().unwrap();
    let (_srv, port) = start(dir.path(), &["--maxclients", "2"]);
    let a = admitted_soon(port);
    let _b = admitted_soon(port);
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    assert_eq!(out, b"ERROR Too many open connections\r\n");
    drop(a);
    admitted_soon(port);
}

/// The keys of `0..n` that `get` finds (multi-gets of 100).
fn present(m: &mut Mc, n: usize) -> Vec<usize> {
    let mut out = Vec::new();
    for start in (0..n).step_by(100) {
        let keys: Vec<String> = (start..(start + 100).min(n))
            .map(|i| format!("c{i}"))
            .collect();
        let r = m.call(&format!("get {}\r\n", keys.join(" ")));
        for l in r.split("\r\n").filter(|l| l.starts_with("VALUE ")) {
            out.push(l.split(' ').nth(1).unwrap()[1..].parse().unwrap());
        }
    }
    out.sort_unstable();
    out
}

/// Cache mode: with maxmemory and allkeys-lru, memcached sets past the
/// limit are all STORED (the oldest items go), `stats evictions` counts
/// them as INFO's `evicted_keys` does, the newest items are there, and
/// after SIGKILL exactly the same items are present: no evicted item
/// comes back.
#[test]
fn a_cache_evicts_instead_of_failing() {
    let dir = tempfile::tempdir().unwrap();
    let (mut srv, port) = start(
        dir.path(),
        &[
            "--logs",
            "2",
            "--log-size",
            "1mb",
            "--maxmemory-policy",
            "allkeys-lru",
        ],
    );
    let mut con = srv.client();
    std::thread::sleep(Duration::from_millis(200));
    let used: u64 = serve_common::info_field(&mut con, "memory", "used_memory")
        .parse()
        .unwrap();
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory")
        .arg((used + (4 << 20)).to_string())
        .query(&mut con)
        .unwrap();
    let mut m = Mc::open(port);
    let val = "v".repeat(1000);
    let n = 20_000;
    for i in 0..n {
        let r = m.call(&format!("set c{i} 3 0 {}\r\n{val}\r\n", val.len()));
        assert_eq!(r, "STORED\r\n", "item {i}");
    }
    let stats = m.call("stats\r\n");
    let evictions: u64 = stats
        .lines()
        .find_map(|l| l.strip_prefix("STAT evictions "))
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        evictions > 1000,
        "only {evictions} evictions for 20 MB into 4 MB"
    );
    let info: u64 = serve_common::info_field(&mut con, "stats", "evicted_keys")
        .parse()
        .unwrap();
    assert_eq!(info, evictions);
    let before = present(&mut m, n);
    assert!(before.len() < n - 1000, "{} items kept", before.len());
    assert!(before.contains(&(n - 1)), "the newest item was evicted");
    drop(m);
    drop(con);
    srv.kill9();
    srv.restart();
    // The restart may take other ports: the memcached one is in the args.
    let mut m = Mc::open(port);
    assert_eq!(present(&mut m, n), before);
}
