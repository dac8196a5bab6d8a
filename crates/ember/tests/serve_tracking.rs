//! Client-side caching (CLIENT TRACKING) against the real `ember serve`
//! with two workers (connections are handed to the workers in turn, so a
//! tracking client and the writer opened after it are served by different
//! workers and every invalidation crosses threads), compared with a real
//! `redis-server` 7.0: the same steps on both, the same replies and the
//! same invalidation messages.
//!
//! - `resp3_default_mode_matches_redis`: pushes for keys read and then
//!   written by another client or by the client itself, once per key,
//!   transactions and scripts, NOLOOP, FLUSHALL/FLUSHDB's null, INFO's
//!   counters, CLIENT TRACKINGINFO/GETREDIR and CLIENT INFO's flags;
//! - `resp2_redirect_matches_redis`: RESP2 tracking redirected to a
//!   subscriber of `__redis__:invalidate`, to a RESP3 client, and a
//!   redirect client that went away (`tracking-redir-broken`, flag `R`);
//! - `bcast_matches_redis`: BCAST with prefixes and NOLOOP, one message per
//!   prefix for a command's keys;
//! - `optin_optout_match_redis`: CLIENT CACHING for the next command or
//!   transaction;
//! - `errors_match_redis`: every error reply of the tracking subcommands;
//! - `table_is_held_to_tracking_table_max_keys`: keys dropped from a full
//!   table are invalidated;
//! - `expired_keys_are_invalidated`: active and lazy expiry;
//! - `evicted_keys_are_invalidated`: cache mode's evictions;
//! - `memcached_writes_are_invalidated`: the memcached port's writes and
//!   `flush_all` reach Redis-side trackers;
//! - `many_trackers_on_both_workers`: each tracker gets each key it read,
//!   once, whichever worker wrote it;
//! - `redis_py_cache_is_invalidated`: redis-py's client-side cache;
//! - `swapdb_invalidates_as_a_flush`: SWAPDB sends one null (Redis sends
//!   nothing).

mod serve_common;

use proto::{encode_request, parse_reply, split_args};
use serve_common::redis_server::RedisServer;
use serve_common::Server;
use std::collections::HashMap;
use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// A raw connection that keeps push messages (RESP3 pushes and Pub/Sub
/// messages) apart from replies.
struct Cx {
    s: TcpStream,
    buf: Vec<u8>,
    pushes: Vec<Vec<u8>>,
}

fn is_push(f: &[u8]) -> bool {
    f.starts_with(b">") || f.starts_with(b"*3\r\n$7\r\nmessage\r\n")
}

impl Cx {
    fn open(port: u16) -> Cx {
        let s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.set_nodelay(true).unwrap();
        Cx {
            s,
            buf: Vec::new(),
            pushes: Vec::new(),
        }
    }

    /// The next frame, waiting at most `wait`.
    fn frame(&mut self, wait: Duration) -> Option<Vec<u8>> {
        let end = Instant::now() + wait;
        let mut chunk = [0u8; 16384];
        loop {
            if let Some((_, n)) = parse_reply(&self.buf).unwrap() {
                return Some(self.buf.drain(..n).collect());
            }
            let left = end.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return None;
            }
            self.s.set_read_timeout(Some(left)).unwrap();
            match self.s.read(&mut chunk) {
                Ok(0) => panic!("the server closed the connection"),
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                    return None
                }
                Err(e) => panic!("read: {e}"),
            }
        }
    }

    fn send(&mut self, args: &[Vec<u8>]) {
        let mut req = Vec::new();
        encode_request(args, &mut req);
        self.s.write_all(&req).unwrap();
    }

    /// A request's reply; pushes before it are kept.
    fn call(&mut self, args: &[Vec<u8>]) -> Vec<u8> {
        self.send(args);
        loop {
            let f = self
                .frame(Duration::from_secs(10))
                .expect("no reply within 10 s");
            if is_push(&f) {
                self.pushes.push(f);
            } else {
                return f;
            }
        }
    }

    /// Every push delivered so far: a PING's reply comes after the pushes
    /// queued before it on Redis, and at the latest in the same write on
    /// Ember; a short wait after it catches those.
    fn settle(&mut self) -> Vec<Vec<u8>> {
        self.call(&[b"PING".to_vec()]);
        while let Some(f) = self.frame(Duration::from_millis(60)) {
            assert!(is_push(&f), "unexpected frame {:?}", lossy(&f));
            self.pushes.push(f);
        }
        std::mem::take(&mut self.pushes)
    }
}

fn lossy(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Runs `steps` on `port` and returns the transcript. A step is
/// `N command line` (the reply is recorded), `N !command line` (not
/// recorded: HELLO's reply names the server), `settle` (every connection's
/// pushes), `N close`, `sleep MS`, `N info` (INFO's tracking fields) and
/// `N flags` (CLIENT INFO's `flags=` and `redir=`). `{idN}` in a command
/// line is connection N's client id; ids in the transcript are written
/// `idN`.
fn scenario(port: u16, conns: usize, steps: &[&str]) -> Vec<String> {
    let mut cx: Vec<Option<Cx>> = (0..conns).map(|_| Some(Cx::open(port))).collect();
    let mut ids: HashMap<usize, i64> = HashMap::new();
    for (n, c) in cx.iter_mut().enumerate() {
        let r = c
            .as_mut()
            .unwrap()
            .call(&[b"CLIENT".to_vec(), b"ID".to_vec()]);
        ids.insert(n, lossy(&r[1..r.len() - 2]).parse().unwrap());
    }
    let norm = |s: String| {
        let mut s = s;
        for (n, id) in &ids {
            s = s
                .replace(&format!(":{id}\r\n"), &format!(":id{n}\r\n"))
                .replace(&format!("redir={id}"), &format!("redir=id{n}"));
        }
        s
    };
    let mut out = Vec::new();
    for step in steps {
        if *step == "settle" {
            for (n, c) in cx.iter_mut().enumerate() {
                let Some(c) = c else { continue };
                for p in c.settle() {
                    out.push(norm(format!("{n} push {}", lossy(&p))));
                }
            }
            continue;
        }
        if let Some(ms) = step.strip_prefix("sleep ") {
            std::thread::sleep(Duration::from_millis(ms.parse().unwrap()));
            continue;
        }
        let (n, line) = step.split_once(' ').unwrap();
        let n: usize = n.parse().unwrap();
        match line {
            "close" => {
                cx[n] = None;
                continue;
            }
            "info" => {
                let c = cx[n].as_mut().unwrap();
                let r = lossy(&c.call(&[b"INFO".to_vec()]));
                for l in r.lines().filter(|l| l.starts_with("tracking_")) {
                    out.push(format!("{n} {l}"));
                }
                continue;
            }
            "flags" => {
                let c = cx[n].as_mut().unwrap();
                let r = lossy(&c.call(&[b"CLIENT".to_vec(), b"INFO".to_vec()]));
                let f: Vec<&str> = r
                    .split_whitespace()
                    .filter(|w| w.starts_with("flags=") || w.starts_with("redir="))
                    .collect();
                out.push(norm(format!("{n} {}", f.join(" "))));
                continue;
            }
            _ => {}
        }
        let (record, line) = match line.strip_prefix('!') {
            Some(l) => (false, l),
            None => (true, line),
        };
        let mut sent = line.to_string();
        for (m, id) in &ids {
            sent = sent.replace(&format!("{{id{m}}}"), &id.to_string());
        }
        let args = split_args(sent.as_bytes()).unwrap();
        let r = cx[n].as_mut().unwrap().call(&args);
        if record {
            out.push(norm(format!("{n} {line} -> {}", lossy(&r))));
        }
    }
    out
}

/// Runs the steps on redis-server and on Ember and compares.
fn same_as_redis(conns: usize, steps: &[&str]) -> Vec<String> {
    let redis = RedisServer::start();
    let want = scenario(redis.port, conns, steps);
    let dir = tempfile::tempdir().unwrap();
    let ember = Server::start(dir.path(), &[]);
    let got = scenario(ember.port, conns, steps);
    for (i, (w, g)) in want.iter().zip(&got).enumerate() {
        assert_eq!(w, g, "step {i} differs\nredis: {want:#?}\nember: {got:#?}");
    }
    assert_eq!(want.len(), got.len(), "redis: {want:#?}\nember: {got:#?}");
    got
}

#[test]
fn resp3_default_mode_matches_redis() {
    let t = same_as_redis(
        3,
        &[
            "0 !HELLO 3",
            "0 CLIENT TRACKING on",
            "0 GET k",
            "0 MGET a b",
            "1 SET k 1",
            "settle",
            // Sent once, then forgotten.
            "1 SET k 2",
            "settle",
            // Deleting missing keys changes nothing.
            "1 DEL a b c",
            "settle",
            "1 SET a 1",
            "1 MSET b 2 c 3",
            "settle",
            // The client's own write: after its reply.
            "0 GET k",
            "0 SET k 3",
            "settle",
            // Collections, TTLs, renames.
            "0 HGET h f",
            "0 LRANGE l 0 -1",
            "0 SMEMBERS s",
            "0 ZSCORE z m",
            "0 GET e",
            "0 EXISTS r1",
            "1 HSET h f v",
            "1 RPUSH l x",
            "1 SADD s m",
            "1 ZADD z 1 m",
            "1 SET e 1",
            "settle",
            "0 GET e",
            "1 EXPIRE e 100",
            "1 SET r1 x",
            "settle",
            // (Ember invalidates a RENAME's destination first: both tracked,
            // the two messages would come in the other order.)
            "0 GET r1",
            "1 RENAME r1 r2",
            "settle",
            "0 TYPE r2",
            "1 RENAME r2 r3",
            "settle",
            // Expired keys the client reads itself: an invalidation when it
            // had read the key before (after the reply), none for a first
            // read; remembered again either way.
            "1 DEBUG SET-ACTIVE-EXPIRE 0",
            "1 SET fx 1 PX 50",
            "1 SET fy 1 PX 300",
            "0 GET fy",
            "sleep 400",
            "0 GET fx",
            "0 GET fy",
            "settle",
            "1 MSET fx 2 fy 2",
            "settle",
            "1 DEBUG SET-ACTIVE-EXPIRE 1",
            // A transaction's read, then its write: after EXEC's reply.
            "0 MULTI",
            "0 GET m",
            "0 SET m 1",
            "0 EXEC",
            "settle",
            "0 GET m",
            "1 MULTI",
            "1 SET m 2",
            "1 SET m 3",
            "1 EXEC",
            "settle",
            // A script's declared keys, remembered when it reads.
            "0 EVAL \"return redis.call('get', KEYS[1])\" 1 sk",
            "0 EVAL \"return 1\" 1 sk2",
            "1 MSET sk 1 sk2 2",
            "settle",
            "0 info",
            "0 flags",
            "0 CLIENT TRACKINGINFO",
            "0 CLIENT GETREDIR",
            // NOLOOP: no message for its own writes (and the key is
            // forgotten all the same).
            "0 CLIENT TRACKING on NOLOOP",
            "0 CLIENT TRACKINGINFO",
            "0 GET n",
            "0 SET n 1",
            "settle",
            "1 SET n 2",
            "settle",
            "0 GET n",
            "1 SET n 3",
            "settle",
            // A flush: one null for everything, to every tracking client.
            "2 !HELLO 3",
            "2 CLIENT TRACKING on",
            "0 GET z",
            "2 GET z",
            "1 FLUSHALL",
            "settle",
            "1 SET z 1",
            "settle",
            "0 GET z",
            "0 FLUSHDB",
            "settle",
            "0 info",
            "0 CLIENT TRACKING off",
            "0 CLIENT TRACKINGINFO",
            "0 CLIENT GETREDIR",
            "0 flags",
            "0 GET y",
            "1 SET y 1",
            "settle",
        ],
    );
    // The transcript holds invalidations (not only equal silence).
    assert!(t.iter().any(|l| l.contains("invalidate")), "{t:#?}");
}

#[test]
fn resp2_redirect_matches_redis() {
    let t = same_as_redis(
        6,
        &[
            "0 SUBSCRIBE __redis__:invalidate",
            "1 CLIENT TRACKING on REDIRECT {id0}",
            "1 CLIENT GETREDIR",
            "1 flags",
            "1 GET k",
            "1 MGET k j",
            "2 SET k 1",
            "settle",
            "2 SET j 1",
            "settle",
            "1 GET k",
            "2 FLUSHALL",
            "settle",
            // RESP2 without a redirect: keys are remembered, nothing is sent.
            "3 CLIENT TRACKING on",
            "3 GET q",
            "2 SET q 1",
            "settle",
            "3 info",
            // Redirected to a RESP3 client: a push there.
            "4 !HELLO 3",
            "1 CLIENT TRACKING on REDIRECT {id4}",
            "1 GET p",
            "2 SET p 1",
            "settle",
            // The redirect client goes away: flag R, and a RESP3 tracking
            // client is told so when an invalidation is due.
            "1 GET p",
            "4 close",
            "sleep 200",
            "2 SET p 2",
            "settle",
            "1 flags",
            "1 CLIENT TRACKINGINFO",
            "5 !HELLO 3",
            "3 CLIENT TRACKING on REDIRECT {id5}",
            "5 !HELLO 3",
            "3 !HELLO 3",
            "3 GET w",
            "5 close",
            "sleep 200",
            "2 SET w 1",
            "settle",
            "3 flags",
            "3 CLIENT TRACKINGINFO",
            // Turning tracking on again clears the broken flag.
            "3 CLIENT TRACKING on",
            "3 flags",
        ],
    );
    assert!(
        t.iter().any(|l| l.contains("__redis__:invalidate")),
        "{t:#?}"
    );
    assert!(
        t.iter().any(|l| l.contains("tracking-redir-broken")),
        "{t:#?}"
    );
}

#[test]
fn bcast_matches_redis() {
    let t = same_as_redis(
        3,
        &[
            "0 !HELLO 3",
            "1 !HELLO 3",
            "0 CLIENT TRACKING on BCAST PREFIX a PREFIX b",
            "1 CLIENT TRACKING on BCAST NOLOOP",
            "0 info",
            "0 flags",
            "0 CLIENT TRACKINGINFO",
            "1 CLIENT TRACKINGINFO",
            // A command's keys: one message per prefix, sorted.
            "2 MSET b1 1 a2 2 c 3 a1 4",
            "settle",
            "2 MULTI",
            "2 SET a5 1",
            "2 DEL a5",
            "2 SET zz 1",
            "2 EXEC",
            "settle",
            // NOLOOP: the keys a client wrote last are left out of its own.
            "1 SET a9 x",
            "settle",
            "1 MSET x1 1 a3 2",
            "settle",
            // Reads are not remembered in BCAST mode.
            "0 GET c",
            "2 SET c 1",
            "settle",
            // More prefixes for a BCAST client; overlapping ones refused.
            "0 CLIENT TRACKING on BCAST PREFIX ab",
            "0 CLIENT TRACKING on BCAST PREFIX cd",
            "0 CLIENT TRACKINGINFO",
            "0 CLIENT TRACKING on",
            "2 SET cde 1",
            "settle",
            "0 FLUSHALL",
            "settle",
            "0 CLIENT TRACKING off",
            "0 info",
            "2 SET a1 1",
            "settle",
        ],
    );
    assert!(t.iter().any(|l| l.contains("a1")), "{t:#?}");
}

#[test]
fn optin_optout_match_redis() {
    let t = same_as_redis(
        3,
        &[
            "0 !HELLO 3",
            "2 !HELLO 3",
            "0 CLIENT TRACKING on OPTIN",
            "0 GET a",
            "0 CLIENT CACHING yes",
            "0 CLIENT TRACKINGINFO",
            "0 GET b",
            "0 GET c",
            // A refused request takes it as a command does...
            "0 CLIENT CACHING yes",
            "0 NOSUCHCOMMAND",
            "0 GET x1",
            "0 CLIENT CACHING yes",
            "0 GET",
            "0 GET x2",
            // ... except a CLIENT one.
            "0 CLIENT CACHING yes",
            "0 CLIENT CACHING",
            "0 GET x3",
            "1 MSET x1 1 x2 1 x3 1",
            "settle",
            "0 CLIENT CACHING yes",
            // Another CLIENT subcommand keeps it for the next command.
            "0 CLIENT ID",
            "0 GET d",
            "1 MSET a 1 b 1 c 1 d 1",
            "settle",
            // For a whole transaction.
            "0 CLIENT CACHING yes",
            "0 MULTI",
            "0 GET e",
            "0 GET f",
            "0 EXEC",
            "0 GET g",
            "1 MSET e 1 f 1 g 1",
            "settle",
            "2 CLIENT TRACKING on OPTOUT",
            "2 GET g",
            "2 CLIENT CACHING no",
            "2 CLIENT TRACKINGINFO",
            "2 GET h",
            "2 GET i",
            "1 MSET g 2 h 2 i 2",
            "settle",
            "0 CLIENT CACHING no",
            "2 CLIENT CACHING yes",
            "0 CLIENT TRACKING on OPTOUT",
            "2 CLIENT TRACKING on OPTIN",
            "0 CLIENT TRACKING on OPTIN NOLOOP",
            "0 CLIENT TRACKINGINFO",
        ],
    );
    assert!(t.iter().any(|l| l.contains("invalidate")), "{t:#?}");
}

#[test]
fn errors_match_redis() {
    same_as_redis(
        2,
        &[
            "0 CLIENT TRACKING",
            "0 CLIENT TRACKING maybe",
            "0 CLIENT TRACKING on foo",
            "0 CLIENT TRACKING on REDIRECT",
            "0 CLIENT TRACKING on PREFIX",
            "0 CLIENT TRACKING on REDIRECT abc",
            "0 CLIENT TRACKING on REDIRECT 999999",
            "0 CLIENT TRACKING on REDIRECT 0",
            "0 CLIENT TRACKING on REDIRECT -1",
            "0 CLIENT TRACKING on REDIRECT {id1} REDIRECT {id1}",
            "0 CLIENT TRACKING on PREFIX a",
            "0 CLIENT TRACKING on BCAST OPTIN",
            "0 CLIENT TRACKING on BCAST OPTOUT",
            "0 CLIENT TRACKING on OPTIN OPTOUT",
            "0 CLIENT TRACKING on BCAST PREFIX a PREFIX ab",
            "0 CLIENT TRACKING on BCAST PREFIX abc PREFIX ab",
            "0 CLIENT TRACKING off REDIRECT 999999",
            "0 CLIENT TRACKING off BCAST",
            "0 CLIENT CACHING yes",
            "0 CLIENT CACHING no",
            "0 CLIENT CACHING",
            "0 CLIENT CACHING yes no",
            "0 CLIENT GETREDIR x",
            "0 CLIENT TRACKINGINFO x",
            "0 CLIENT GETREDIR",
            "0 CLIENT TRACKINGINFO",
            "0 CLIENT TRACKING on REDIRECT {id0}",
            "0 CLIENT GETREDIR",
            "0 CLIENT CACHING yes",
            "0 CLIENT CACHING maybe",
            "0 CLIENT TRACKING on BCAST",
            "0 CLIENT TRACKING on OPTIN",
            "0 CLIENT CACHING no",
            "0 CLIENT CACHING maybe",
            "0 CLIENT TRACKING on OPTOUT",
            "0 CLIENT TRACKING off",
            "0 CLIENT TRACKING on BCAST PREFIX a",
            "0 CLIENT TRACKING on BCAST PREFIX a",
            "0 CLIENT TRACKING on BCAST PREFIX abc",
            "0 CLIENT TRACKING on BCAST PREFIX b",
            "0 CLIENT TRACKING on",
            "0 CLIENT TRACKINGINFO",
            "0 RESET",
            "0 CLIENT TRACKINGINFO",
            "0 flags",
            "0 CONFIG GET tracking-table-max-keys",
            "0 CONFIG SET tracking-table-max-keys -1",
            "0 CONFIG SET tracking-table-max-keys x",
            "0 CONFIG SET tracking-table-max-keys 0",
            "0 CONFIG GET tracking-table-max-keys",
        ],
    );
}

#[test]
fn table_is_held_to_tracking_table_max_keys() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let ember = Server::start(dir.path(), &[]);
    for port in [redis.port, ember.port] {
        let mut t = Cx::open(port);
        t.call(&a("HELLO 3"));
        t.call(&a("CONFIG SET tracking-table-max-keys 2"));
        t.call(&a("CLIENT TRACKING on"));
        for k in 1..=5 {
            t.call(&a(&format!("GET k{k}")));
        }
        // Redis drops keys before the next command, Ember as it remembers
        // one: three of the five were dropped, each with an invalidation.
        let p = t.settle();
        assert_eq!(p.len(), 3, "{p:?}");
        let info = lossy(&t.call(&a("INFO stats")));
        assert!(info.contains("tracking_total_keys:2\r\n"), "{info}");
    }
}

/// Waits up to `limit` for pushes on `c`.
fn pushes_within(c: &mut Cx, limit: Duration) -> Vec<String> {
    let t = Instant::now();
    loop {
        let p = c.settle();
        if !p.is_empty() || t.elapsed() > limit {
            return p.iter().map(|f| lossy(f)).collect();
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn a(line: &str) -> Vec<Vec<u8>> {
    split_args(line.as_bytes()).unwrap()
}

#[test]
fn expired_keys_are_invalidated() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let ember = Server::start(dir.path(), &[]);
    let inv = |k: &str| format!(">2\r\n$10\r\ninvalidate\r\n*1\r\n${}\r\n{k}\r\n", k.len());
    for port in [redis.port, ember.port] {
        let mut t = Cx::open(port);
        let mut w = Cx::open(port);
        t.call(&a("HELLO 3"));
        t.call(&a("CLIENT TRACKING on"));
        // Active expiry.
        w.call(&a("SET ax 1 PX 200"));
        t.call(&a("GET ax"));
        assert_eq!(pushes_within(&mut t, Duration::from_secs(5)), [inv("ax")]);
        // Lazy expiry, by another client's read.
        w.call(&a("DEBUG SET-ACTIVE-EXPIRE 0"));
        w.call(&a("SET lx 1 PX 100"));
        t.call(&a("GET lx"));
        std::thread::sleep(Duration::from_millis(300));
        assert_eq!(lossy(&w.call(&a("GET lx"))), "$-1\r\n");
        assert_eq!(pushes_within(&mut t, Duration::from_secs(2)), [inv("lx")]);
        w.call(&a("DEBUG SET-ACTIVE-EXPIRE 1"));
    }
}

/// Requests sent at once, then their replies read.
fn pipeline(c: &mut Cx, reqs: &[Vec<Vec<u8>>]) -> Vec<Vec<u8>> {
    let mut buf = Vec::new();
    for r in reqs {
        encode_request(r, &mut buf);
    }
    c.s.write_all(&buf).unwrap();
    let mut out = Vec::new();
    while out.len() < reqs.len() {
        let f = c.frame(Duration::from_secs(30)).expect("reply");
        if is_push(&f) {
            c.pushes.push(f);
        } else {
            out.push(f);
        }
    }
    out
}

#[test]
fn evicted_keys_are_invalidated() {
    let dir = tempfile::tempdir().unwrap();
    let ember = Server::start(dir.path(), &["--maxmemory-policy", "allkeys-random"]);
    let mut t = Cx::open(ember.port);
    let mut w = Cx::open(ember.port);
    let n = 4000;
    let val = "v".repeat(1000);
    let sets: Vec<Vec<Vec<u8>>> = (0..n).map(|i| a(&format!("SET k{i} {val}"))).collect();
    pipeline(&mut w, &sets);
    t.call(&a("HELLO 3"));
    t.call(&a("CLIENT TRACKING on"));
    let gets: Vec<Vec<Vec<u8>>> = (0..n).map(|i| a(&format!("GET k{i}"))).collect();
    pipeline(&mut t, &gets);
    std::thread::sleep(Duration::from_millis(300));
    let info = lossy(&w.call(&a("INFO memory")));
    let used: u64 = info
        .lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    w.call(&a("CONFIG SET maxmemory-eviction-tenacity 100"));
    w.call(&a(&format!("CONFIG SET maxmemory {}", used - (2 << 20))));
    assert_eq!(lossy(&w.call(&a("SET new 1"))), "+OK\r\n");
    let mut invalidated: Vec<String> = pushes_within(&mut t, Duration::from_secs(5))
        .iter()
        .map(|p| p.rsplit("\r\n").nth(1).unwrap().to_string())
        .collect();
    invalidated.sort();
    let exists: Vec<Vec<Vec<u8>>> = (0..n).map(|i| a(&format!("EXISTS k{i}"))).collect();
    let mut gone: Vec<String> = pipeline(&mut w, &exists)
        .iter()
        .enumerate()
        .filter(|(_, r)| r.as_slice() == b":0\r\n")
        .map(|(i, _)| format!("k{i}"))
        .collect();
    gone.sort();
    assert!(gone.len() > 100, "only {} keys evicted", gone.len());
    assert_eq!(invalidated, gone);
}

#[test]
fn memcached_writes_are_invalidated() {
    let dir = tempfile::tempdir().unwrap();
    let mport = serve_common::free_port();
    let ember = Server::start(dir.path(), &["--memcached-port", &mport.to_string()]);
    let mut t = Cx::open(ember.port);
    t.call(&a("HELLO 3"));
    t.call(&a("CLIENT TRACKING on"));
    t.call(&a("MGET mk other"));
    let mut mc = TcpStream::connect(("127.0.0.1", mport)).unwrap();
    mc.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut said = |req: &str, want: &str| {
        mc.write_all(req.as_bytes()).unwrap();
        let mut got = vec![0u8; want.len()];
        mc.read_exact(&mut got).unwrap();
        assert_eq!(lossy(&got), want);
    };
    said("set mk 0 0 1\r\nx\r\n", "STORED\r\n");
    assert_eq!(
        pushes_within(&mut t, Duration::from_secs(3)),
        [">2\r\n$10\r\ninvalidate\r\n*1\r\n$2\r\nmk\r\n"]
    );
    said("flush_all\r\n", "OK\r\n");
    assert_eq!(
        pushes_within(&mut t, Duration::from_secs(3)),
        [">2\r\n$10\r\ninvalidate\r\n_\r\n"]
    );
}

#[test]
fn many_trackers_on_both_workers() {
    let dir = tempfile::tempdir().unwrap();
    let ember = Server::start(dir.path(), &[]);
    let mut trackers: Vec<Cx> = (0..6).map(|_| Cx::open(ember.port)).collect();
    let mut writers: Vec<Cx> = (0..2).map(|_| Cx::open(ember.port)).collect();
    for (i, t) in trackers.iter_mut().enumerate() {
        t.call(&a("HELLO 3"));
        t.call(&a("CLIENT TRACKING on"));
        // Tracker i reads keys k0..k(i+3).
        for k in 0..i + 4 {
            t.call(&a(&format!("GET k{k}")));
        }
    }
    // Each key written three times, by writers on both workers.
    for round in 0..3 {
        for k in 0..10 {
            writers[(k + round) % 2].call(&a(&format!("SET k{k} {round}")));
        }
    }
    for (i, t) in trackers.iter_mut().enumerate() {
        let mut got: Vec<String> = pushes_within(t, Duration::from_secs(5));
        got.sort();
        let mut want: Vec<String> = (0..i + 4)
            .map(|k| {
                let k = format!("k{k}");
                format!(">2\r\n$10\r\ninvalidate\r\n*1\r\n${}\r\n{k}\r\n", k.len())
            })
            .collect();
        want.sort();
        assert_eq!(got, want, "tracker {i}");
    }
}

#[test]
fn redis_py_cache_is_invalidated() {
    let dir = tempfile::tempdir().unwrap();
    let ember = Server::start(dir.path(), &[]);
    // redis-py's cache refuses servers that report a version below 7.4
    // in HELLO (Ember reports the 7.2 command set it follows; Redis 7.0
    // has the same tracking protocol): the test lowers that floor.
    let script = format!(
        r#"
import sys, time, redis
import redis.connection as rc
try:
    from redis.cache import CacheConfig
except ImportError:
    print("redis-py " + redis.__version__ + " has no client-side cache (5.1 and later have): skipped", file=sys.stderr)
    print("redis-py ok")
    sys.exit(0)
if hasattr(rc, "CacheProxyConnection"):
    rc.CacheProxyConnection.MIN_ALLOWED_VERSION = "7.0.0"
r = redis.Redis(port={port}, protocol=3, cache_config=CacheConfig())
w = redis.Redis(port={port})
def gets():
    return w.info("commandstats").get("cmdstat_get", {{}}).get("calls", 0)
r.set("pk", "1")
assert r.get("pk") == b"1"
assert r.get("pk") == b"1"
assert gets() == 1, gets()
w.set("pk", "2")
time.sleep(0.3)
assert r.get("pk") == b"2"
assert gets() == 2, gets()
assert r.get("pk") == b"2"
assert gets() == 2, gets()
w.flushall()
time.sleep(0.3)
assert r.get("pk") is None
print("redis-py ok")
"#,
        port = ember.port
    );
    serve_common::run_redis_py(&script);
}

/// SWAPDB sends every tracking client one null, as a flush does (beyond
/// Redis 7.0, which invalidates nothing there and leaves caches of either
/// database stale), and no invalidation per moved key.
#[test]
fn swapdb_invalidates_as_a_flush() {
    let dir = tempfile::tempdir().unwrap();
    let ember = Server::start(dir.path(), &[]);
    let mut t = Cx::open(ember.port);
    let mut w = Cx::open(ember.port);
    t.call(&a("HELLO 3"));
    t.call(&a("CLIENT TRACKING on"));
    for i in 0..100 {
        w.call(&a(&format!("SET k{i} v")));
    }
    t.call(&a("GET k1"));
    w.call(&a("SWAPDB 0 1"));
    assert_eq!(
        pushes_within(&mut t, Duration::from_secs(5)),
        [">2\r\n$10\r\ninvalidate\r\n_\r\n"]
    );
    // The key is tracked again after the null: a write to it invalidates it.
    w.call(&a("SELECT 1"));
    t.call(&a("SELECT 1"));
    t.call(&a("GET k1"));
    w.call(&a("SET k1 w"));
    assert_eq!(
        pushes_within(&mut t, Duration::from_secs(5)),
        [">2\r\n$10\r\ninvalidate\r\n*1\r\n$2\r\nk1\r\n"]
    );
}
