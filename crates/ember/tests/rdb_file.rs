//! `ember import` and `ember export` against a real redis-server: Redis
//! SAVEs an RDB file holding every type and encoding (integer and
//! LZF-compressed strings, listpack and quicklist lists, intset, listpack
//! and hashtable sets and hashes, listpack and skiplist sorted sets,
//! streams with consumer groups, TTLs, several databases, a function
//! library); Ember imports it and serves the same keyspace, key by key;
//! Ember exports it again and redis-server, started on that file, serves
//! the same keyspace. Damaged files (truncated, bytes flipped) are refused
//! with an error naming the offset, never a panic, and import nothing.

mod serve_common;

use proto::Reply;
use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};
use serve_common::redis_server::Conn;
use serve_common::values::{contents, fill};
use serve_common::{free_port, Server, SMALL};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// A redis-server whose `dir` holds `dump.rdb` (loaded at start when it
/// exists; written by SAVE), killed on drop.
struct Redis {
    child: Child,
    port: u16,
}

impl Redis {
    fn start(dir: &Path) -> Redis {
        let port = free_port();
        let log = std::fs::File::create(dir.join("redis.log")).unwrap();
        let mut child = Command::new("/usr/bin/redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .args(["--dbfilename", "dump.rdb"])
            .arg("--dir")
            .arg(dir)
            .env("LC_ALL", "C")
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("spawn redis-server (Debian package redis-server)");
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(60) {
            if let Ok(Some(st)) = child.try_wait() {
                let log = std::fs::read_to_string(dir.join("redis.log")).unwrap_or_default();
                panic!("redis-server exited ({st}):\n{log}");
            }
            if let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) {
                let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
                // PONG once the file is loaded (LOADING before).
                let mut b = [0u8; 7];
                if s.write_all(b"PING\r\n").is_ok()
                    && s.read_exact(&mut b).is_ok()
                    && &b == b"+PONG\r\n"
                {
                    return Redis { child, port };
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        let _ = child.wait();
        panic!("redis-server did not start");
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `ember ARGS` with the test heap flags for the heap in `dir`.
fn ember(cmd: &str, dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ember"))
        .arg(cmd)
        .arg("--heap")
        .arg(dir.join("ember.heap"))
        .args(SMALL.iter().take(6))
        .args(args)
        .output()
        .unwrap()
}

fn ok(c: &mut Conn, args: &[&str]) {
    let r = c.call(args);
    assert!(!matches!(r, Reply::Error(_)), "{args:?}: {r:?}");
}

const LIB: &str =
    "#!lua name=mylib\nredis.register_function('echo1', function(keys, args) return args[1] end)";

/// Databases 0, 1, 7 and 15: every type and encoding in 0, a few keys with
/// TTLs elsewhere; a function library.
fn populate(c: &mut Conn) {
    fill(c);
    ok(c, &["SET", "ttl-ms", "v", "PX", "86400000"]);
    ok(c, &["EXPIRE", "bh", "50000"]);
    ok(c, &["SET", "zeros", &"0".repeat(20_000)]);
    ok(c, &["SET", "max", "9223372036854775807"]);
    ok(c, &["SET", "small", "12"]);
    for db in ["1", "7", "15"] {
        ok(c, &["SELECT", db]);
        ok(c, &["SET", "db", db]);
        ok(c, &["RPUSH", "l", db, "x"]);
        ok(c, &["HSET", "h", "f", db]);
        ok(c, &["SET", "t", "v", "EX", "100000"]);
        ok(c, &["ZADD", "z", db, "m"]);
        ok(c, &["SADD", "s", "a", db]);
    }
    ok(c, &["SELECT", "0"]);
    ok(c, &["FUNCTION", "LOAD", LIB]);
}

fn keys(c: &mut Conn) -> Vec<String> {
    let Reply::Array(ks) = c.call(&["KEYS", "*"]) else {
        panic!("KEYS")
    };
    let mut v: Vec<String> = ks
        .into_iter()
        .map(|k| match k {
            Reply::Bulk(b) => String::from_utf8(b).unwrap(),
            r => panic!("{r:?}"),
        })
        .collect();
    v.sort();
    v
}

fn int(r: Reply) -> i64 {
    match r {
        Reply::Integer(n) => n,
        r => panic!("{r:?}"),
    }
}

/// The differences between two servers' keyspaces (all 16 databases: keys,
/// types and contents, TTLs within a minute) and function libraries.
fn diff(a: &mut Conn, b: &mut Conn) -> Vec<String> {
    let mut bad = Vec::new();
    let mut total = 0;
    for db in 0..16 {
        let d = db.to_string();
        ok(a, &["SELECT", &d]);
        ok(b, &["SELECT", &d]);
        let (ka, kb) = (keys(a), keys(b));
        if ka != kb {
            bad.push(format!("db {db}: keys {ka:?} vs {kb:?}"));
            continue;
        }
        total += ka.len();
        for k in &ka {
            let (ca, cb) = (contents(a, k), contents(b, k));
            if ca != cb {
                bad.push(format!("db {db} key {k}: {ca:?} vs {cb:?}"));
            }
            let (ta, tb) = (int(a.call(&["PTTL", k])), int(b.call(&["PTTL", k])));
            if (ta < 0 || tb < 0) && ta != tb || (ta - tb).abs() > 60_000 {
                bad.push(format!("db {db} key {k}: PTTL {ta} vs {tb}"));
            }
        }
    }
    assert!(total > 20, "the keyspaces are nearly empty: {total} keys");
    ok(a, &["SELECT", "0"]);
    ok(b, &["SELECT", "0"]);
    let (fa, fb) = (
        a.call(&["FUNCTION", "LIST", "WITHCODE"]),
        b.call(&["FUNCTION", "LIST", "WITHCODE"]),
    );
    if fa != fb {
        bad.push(format!("FUNCTION LIST: {fa:?} vs {fb:?}"));
    }
    bad
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn redis_to_ember_to_redis() {
    let t = tempfile::tempdir().unwrap();
    let (ra, eb, rc) = (t.path().join("a"), t.path().join("b"), t.path().join("c"));
    for d in [&ra, &eb, &rc] {
        std::fs::create_dir(d).unwrap();
    }
    let redis = Redis::start(&ra);
    let mut a = Conn::open(redis.port);
    populate(&mut a);
    ok(&mut a, &["SAVE"]);
    let rdb = ra.join("dump.rdb");

    let o = ember("import", &eb, &[rdb.to_str().unwrap()]);
    assert!(o.status.success(), "import: {}", stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("1 function libraries"), "{out}");

    // A second import: every key exists (BUSYKEY) and nothing changes;
    // with --replace it goes through.
    let o = ember("import", &eb, &[rdb.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("already exists") && stderr(&o).contains("nothing imported"));
    let o = ember("import", &eb, &["--replace", rdb.to_str().unwrap()]);
    assert!(o.status.success(), "import --replace: {}", stderr(&o));

    let mut server = Server::start(&eb, &[]);
    let mut b = Conn::open(server.port);
    let bad = diff(&mut a, &mut b);
    assert!(bad.is_empty(), "Redis -> Ember:\n{}", bad.join("\n"));
    // The import's key counts are the server's.
    ok(&mut b, &["SELECT", "7"]);
    assert_eq!(int(b.call(&["DBSIZE"])), 6);
    drop(b);

    // Exporting while a server has the heap open is refused.
    let out_rdb = rc.join("dump.rdb");
    let o = ember("export", &eb, &[out_rdb.to_str().unwrap()]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("in use"), "{}", stderr(&o));
    assert!(server.terminate());

    let o = ember("export", &eb, &[out_rdb.to_str().unwrap()]);
    assert!(o.status.success(), "export: {}", stderr(&o));
    let redis_c = Redis::start(&rc);
    let mut c = Conn::open(redis_c.port);
    let bad = diff(&mut a, &mut c);
    assert!(bad.is_empty(), "Ember -> Redis:\n{}", bad.join("\n"));
}

#[test]
fn damaged_files_are_refused_and_import_nothing() {
    let t = tempfile::tempdir().unwrap();
    let redis = Redis::start(t.path());
    let mut a = Conn::open(redis.port);
    populate(&mut a);
    ok(&mut a, &["SAVE"]);
    let good = std::fs::read(t.path().join("dump.rdb")).unwrap();
    let mut rng = SmallRng::seed_from_u64(7);
    let mut cases: Vec<(String, Vec<u8>)> = Vec::new();
    for _ in 0..8 {
        let cut = rng.random_range(0..good.len());
        cases.push((format!("truncated at {cut}"), good[..cut].to_vec()));
    }
    for _ in 0..8 {
        let at = rng.random_range(0..good.len());
        let mut g = good.clone();
        g[at] ^= 1 << rng.random_range(0..8);
        cases.push((format!("bit flipped at {at}"), g));
    }
    let mut g = good.clone();
    g[9] = 0xF7;
    cases.push(("module aux".into(), g));
    let heap_dir = t.path().join("heap");
    std::fs::create_dir(&heap_dir).unwrap();
    let file: PathBuf = t.path().join("bad.rdb");
    for (what, bytes) in &cases {
        std::fs::write(&file, bytes).unwrap();
        let o = ember("import", &heap_dir, &[file.to_str().unwrap()]);
        let e = stderr(&o);
        // 1 is a reported error; a panic would exit with 101.
        assert_eq!(o.status.code(), Some(1), "{what}: {e}");
        assert!(
            e.contains("offset") && e.contains("nothing imported"),
            "{what}: {e}"
        );
    }
    let mut server = Server::start(&heap_dir, &[]);
    let mut b = Conn::open(server.port);
    for db in 0..16 {
        ok(&mut b, &["SELECT", &db.to_string()]);
        assert_eq!(int(b.call(&["DBSIZE"])), 0);
    }
    assert_eq!(b.call(&["FUNCTION", "LIST"]), Reply::Array(vec![]));
    drop(b);
    assert!(server.terminate());
}

#[test]
fn existing_keys_busykey_replace_and_a_running_server() {
    let t = tempfile::tempdir().unwrap();
    let (rd, hd) = (t.path().join("redis"), t.path().join("heap"));
    std::fs::create_dir(&rd).unwrap();
    std::fs::create_dir(&hd).unwrap();
    let redis = Redis::start(&rd);
    let mut a = Conn::open(redis.port);
    ok(&mut a, &["SET", "s", "from-redis"]);
    ok(&mut a, &["RPUSH", "l", "x", "y"]);
    ok(&mut a, &["SET", "gone", "v", "PX", "1"]);
    std::thread::sleep(Duration::from_millis(5));
    ok(&mut a, &["SAVE"]);
    let rdb = rd.join("dump.rdb");
    let rdb = rdb.to_str().unwrap();

    let mut server = Server::start(&hd, &[]);
    let mut b = Conn::open(server.port);
    ok(&mut b, &["SET", "s", "from-ember"]);
    ok(&mut b, &["SET", "other", "kept"]);
    // The heap is in use: refused.
    let o = ember("import", &hd, &[rdb]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("in use"), "{}", stderr(&o));
    drop(b);
    assert!(server.terminate());

    // "s" exists: refused whole, "l" not written either.
    let o = ember("import", &hd, &[rdb]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("'s'"), "{}", stderr(&o));
    server.restart();
    let mut b = Conn::open(server.port);
    assert_eq!(b.call(&["EXISTS", "l"]), Reply::Integer(0));
    assert_eq!(b.call(&["GET", "s"]), Reply::Bulk(b"from-ember".to_vec()));
    drop(b);
    assert!(server.terminate());

    // --replace: "s" replaced, "l" written, "other" kept, "gone" (expired
    // in the file, unless Redis's active expiry removed it first) skipped.
    let o = ember("import", &hd, &["--replace", rdb]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("imported 2 keys"), "{out}");
    server.restart();
    let mut b = Conn::open(server.port);
    assert_eq!(b.call(&["GET", "s"]), Reply::Bulk(b"from-redis".to_vec()));
    assert_eq!(b.call(&["GET", "other"]), Reply::Bulk(b"kept".to_vec()));
    assert_eq!(b.call(&["LLEN", "l"]), Reply::Integer(2));
    assert_eq!(b.call(&["EXISTS", "gone"]), Reply::Integer(0));
    assert_eq!(b.call(&["DBSIZE"]), Reply::Integer(3));
    drop(b);
    assert!(server.terminate());
}
