//! Pub/Sub and keyspace notifications against the real `ember serve` with
//! two workers (connections are handed to the workers in turn, so a
//! subscriber and the publisher opened after it are served by different
//! workers and every message crosses threads):
//!
//! - `messages_cross_workers_in_order`: several publishers pipelining to
//!   subscribers on both workers; every message arrives, in each
//!   publisher's order, and PUBLISH counts the receivers;
//! - `subscriptions_and_their_confirmations`: SUBSCRIBE, PSUBSCRIBE,
//!   SSUBSCRIBE and the unsubscribes with their counts, mass unsubscribes
//!   in subscription order, the null confirmation, pattern messages;
//! - `resp3_pushes_and_subscriber_mode`: RESP3 push messages while other
//!   commands run (a client's own message before its PUBLISH reply), RESP2
//!   subscriber mode's errors and PING, RESET leaving every subscription;
//! - `introspection`: PUBSUB CHANNELS/NUMSUB/NUMPAT/SHARDCHANNELS/
//!   SHARDNUMSUB, CLIENT LIST `sub`/`psub`/`ssub` and flag `P`, CLIENT LIST
//!   TYPE PUBSUB, INFO stats;
//! - `slow_subscriber_is_disconnected`: a subscriber that does not read is
//!   closed by `client-output-buffer-limit pubsub`, counted in INFO;
//! - `keyspace_notifications`: the events of a representative set of
//!   commands, `expired` from lazy and active expiry, `new`, and CONFIG
//!   SET/GET of `notify-keyspace-events`;
//! - `message_sequences_match_redis`: the messages a subscriber receives
//!   for the same commands (keyspace notifications of strings, keys,
//!   lists, hashes, sets and sorted sets included) compared exactly with a
//!   real `redis-server`, in RESP2 and RESP3, with `KEA`, `KEAn`, `KEAm`
//!   and `Em` (`keymiss` of read commands and of write commands' sources);
//! - `redis_crate_pubsub` and `redis_py_pubsub`: the client libraries'
//!   Pub/Sub objects (the `redis` crate's `as_pubsub`, redis-py's
//!   `pubsub()` with `get_message`, `listen` and `run_in_thread`), RESP2 and
//!   RESP3, on Ember and on redis-server alike.

mod serve_common;

use proto::{encode_request, split_args, Reply};
use serve_common::redis_server::{Conn, RedisServer};
use serve_common::Server;
use std::io::{Read, Write};
use std::time::{Duration, Instant};

fn start() -> (tempfile::TempDir, Server) {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), &[]);
    (dir, s)
}

fn args(line: &str) -> Vec<Vec<u8>> {
    split_args(line.as_bytes()).unwrap()
}

/// One request (a command line, Redis's quoting) and its reply.
fn call(c: &mut Conn, line: &str) -> Reply {
    c.call(&args(line))
}

/// Sends a request without reading its reply.
fn send(c: &mut Conn, line: &str) {
    let mut req = Vec::new();
    encode_request(&args(line), &mut req);
    c.send(&req);
}

/// The next reply or message.
fn next(c: &mut Conn) -> Reply {
    c.request(b"").unwrap()
}

fn bulk(s: &str) -> Reply {
    Reply::Bulk(s.as_bytes().to_vec())
}

fn int(n: i64) -> Reply {
    Reply::Integer(n)
}

/// A Pub/Sub message or confirmation as RESP2 (an array) shows it.
fn msg(items: &[&str]) -> Reply {
    Reply::Array(items.iter().map(|s| bulk(s)).collect())
}

/// A confirmation: kind, name (None: null), count.
fn conf(kind: &str, name: Option<&str>, n: i64) -> Reply {
    Reply::Array(vec![bulk(kind), name.map_or(Reply::Null, bulk), int(n)])
}

fn push(items: Vec<Reply>) -> Reply {
    Reply::Push(items)
}

fn info_field(c: &mut Conn, section: &str, field: &str) -> String {
    let Reply::Bulk(info) = call(c, &format!("INFO {section}")) else {
        panic!("INFO {section}")
    };
    let info = String::from_utf8(info).unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .unwrap_or_else(|| panic!("no {field} in INFO {section}"))
        .trim()
        .to_string()
}

/// Waits until `f` holds (a minute at most).
fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(t.elapsed() < Duration::from_secs(60), "waited for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn messages_cross_workers_in_order() {
    let (_d, s) = start();
    // Consecutive connections go to the two workers in turn.
    let mut subs: Vec<Conn> = (0..4).map(|_| Conn::open(s.port)).collect();
    for (i, c) in subs.iter_mut().enumerate() {
        assert_eq!(
            call(c, "SUBSCRIBE news"),
            conf("subscribe", Some("news"), 1)
        );
        if i % 2 == 0 {
            assert_eq!(call(c, "PSUBSCRIBE n*"), conf("psubscribe", Some("n*"), 2));
        }
    }
    let mut pubs: Vec<Conn> = (0..2).map(|_| Conn::open(s.port)).collect();
    // The first message arrives promptly, on both workers.
    let t = Instant::now();
    assert_eq!(call(&mut pubs[0], "PUBLISH news first"), int(6));
    for (i, c) in subs.iter_mut().enumerate() {
        assert_eq!(next(c), msg(&["message", "news", "first"]));
        if i % 2 == 0 {
            assert_eq!(next(c), msg(&["pmessage", "n*", "news", "first"]));
        }
    }
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    // Two publishers pipeline 500 messages each, concurrently.
    const N: usize = 500;
    let handles: Vec<_> = pubs
        .into_iter()
        .enumerate()
        .map(|(p, mut c)| {
            std::thread::spawn(move || {
                for i in 0..N {
                    send(&mut c, &format!("PUBLISH news p{p}-{i}"));
                }
                for _ in 0..N {
                    assert_eq!(next(&mut c), int(6));
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    for (i, c) in subs.iter_mut().enumerate() {
        let per_msg = if i % 2 == 0 { 2 } else { 1 };
        let mut seen = [0usize; 2];
        for _ in 0..2 * N * per_msg {
            let Reply::Array(m) = next(c) else {
                panic!("not a message")
            };
            let Reply::Bulk(payload) = m.last().unwrap().clone() else {
                panic!("no payload")
            };
            let payload = String::from_utf8(payload).unwrap();
            let (p, n) = payload[1..].split_once('-').unwrap();
            let (p, n): (usize, usize) = (p.parse().unwrap(), n.parse().unwrap());
            if m.len() == 3 {
                // Each publisher's messages in the order it sent them.
                assert_eq!(n, seen[p], "subscriber {i}: {payload}");
                seen[p] += 1;
            }
        }
        assert_eq!(seen, [N, N]);
    }
}

#[test]
fn subscriptions_and_their_confirmations() {
    let (_d, s) = start();
    let mut c = Conn::open(s.port);
    let mut p = Conn::open(s.port);
    send(&mut c, "SUBSCRIBE a b a");
    assert_eq!(next(&mut c), conf("subscribe", Some("a"), 1));
    assert_eq!(next(&mut c), conf("subscribe", Some("b"), 2));
    assert_eq!(next(&mut c), conf("subscribe", Some("a"), 2));
    send(&mut c, "PSUBSCRIBE n* n?ws");
    assert_eq!(next(&mut c), conf("psubscribe", Some("n*"), 3));
    assert_eq!(next(&mut c), conf("psubscribe", Some("n?ws"), 4));
    // Shard channels have their own count.
    assert_eq!(
        call(&mut c, "SSUBSCRIBE s1"),
        conf("ssubscribe", Some("s1"), 1)
    );
    assert_eq!(call(&mut p, "PUBLISH news x"), int(2));
    assert_eq!(next(&mut c), msg(&["pmessage", "n*", "news", "x"]));
    assert_eq!(next(&mut c), msg(&["pmessage", "n?ws", "news", "x"]));
    assert_eq!(call(&mut p, "PUBLISH a y"), int(1));
    assert_eq!(next(&mut c), msg(&["message", "a", "y"]));
    // SPUBLISH reaches shard subscribers only, patterns not.
    assert_eq!(call(&mut p, "SPUBLISH s1 z"), int(1));
    assert_eq!(call(&mut p, "SPUBLISH news z"), int(0));
    assert_eq!(next(&mut c), msg(&["smessage", "s1", "z"]));
    assert_eq!(call(&mut p, "PUBLISH s1 z"), int(0));
    // Unsubscribing from what it is not subscribed to still confirms.
    assert_eq!(
        call(&mut c, "UNSUBSCRIBE zz"),
        conf("unsubscribe", Some("zz"), 4)
    );
    assert_eq!(
        call(&mut c, "UNSUBSCRIBE a"),
        conf("unsubscribe", Some("a"), 3)
    );
    assert_eq!(
        call(&mut c, "UNSUBSCRIBE"),
        conf("unsubscribe", Some("b"), 2)
    );
    assert_eq!(call(&mut c, "UNSUBSCRIBE"), conf("unsubscribe", None, 2));
    send(&mut c, "PUNSUBSCRIBE");
    assert_eq!(next(&mut c), conf("punsubscribe", Some("n*"), 1));
    assert_eq!(next(&mut c), conf("punsubscribe", Some("n?ws"), 0));
    assert_eq!(call(&mut c, "PUNSUBSCRIBE"), conf("punsubscribe", None, 0));
    // Still a subscriber through its shard channel: RESP2 subscriber mode.
    assert!(matches!(call(&mut c, "GET k"), Reply::Error(_)));
    assert_eq!(
        call(&mut c, "SUNSUBSCRIBE"),
        conf("sunsubscribe", Some("s1"), 0)
    );
    assert_eq!(call(&mut c, "SUNSUBSCRIBE"), conf("sunsubscribe", None, 0));
    assert_eq!(call(&mut c, "GET k"), Reply::Null);
    assert_eq!(call(&mut p, "PUBLISH a y"), int(0));
    // A message published before an UNSUBSCRIBE took effect arrives before
    // its confirmation.
    assert_eq!(call(&mut c, "SUBSCRIBE q"), conf("subscribe", Some("q"), 1));
    for i in 0..200 {
        send(&mut p, &format!("PUBLISH q {i}"));
    }
    send(&mut c, "UNSUBSCRIBE q");
    let mut got = 0;
    loop {
        match next(&mut c) {
            Reply::Array(m) if m[0] == bulk("message") => {
                assert_eq!(m[2], bulk(&got.to_string()));
                got += 1;
            }
            r => {
                assert_eq!(r, conf("unsubscribe", Some("q"), 0));
                break;
            }
        }
    }
    let mut counted = 0;
    for _ in 0..200 {
        let Reply::Integer(n) = next(&mut p) else {
            panic!()
        };
        counted += n;
    }
    assert_eq!(got, counted, "every message counted was delivered");
}

#[test]
fn resp3_pushes_and_subscriber_mode() {
    let (_d, s) = start();
    let mut c = Conn::open(s.port);
    let mut p = Conn::open(s.port);
    assert!(matches!(call(&mut c, "HELLO 3"), Reply::Map(_)));
    assert_eq!(
        call(&mut c, "SUBSCRIBE ch"),
        push(vec![bulk("subscribe"), bulk("ch"), int(1)])
    );
    // RESP3: any command runs while subscribed.
    assert_eq!(call(&mut c, "SET k v"), Reply::Simple("OK".into()));
    assert_eq!(call(&mut c, "GET k"), bulk("v"));
    assert_eq!(call(&mut p, "PUBLISH ch hi"), int(1));
    assert_eq!(
        next(&mut c),
        push(vec![bulk("message"), bulk("ch"), bulk("hi")])
    );
    // Its own message comes before its PUBLISH reply, as Redis 7.0 sends it.
    send(&mut c, "PUBLISH ch me");
    assert_eq!(
        next(&mut c),
        push(vec![bulk("message"), bulk("ch"), bulk("me")])
    );
    assert_eq!(next(&mut c), int(1));
    assert_eq!(call(&mut c, "PING"), Reply::Simple("PONG".into()));
    assert_eq!(
        call(&mut c, "UNSUBSCRIBE"),
        push(vec![bulk("unsubscribe"), bulk("ch"), int(0)])
    );
    // RESP2 subscriber mode.
    let mut r = Conn::open(s.port);
    assert_eq!(
        call(&mut r, "PSUBSCRIBE x*"),
        conf("psubscribe", Some("x*"), 1)
    );
    let refused = |cmd: &str| {
        Reply::Error(format!(
            "ERR Can't execute '{cmd}': only (P|S)SUBSCRIBE / (P|S)UNSUBSCRIBE / PING / QUIT / RESET are allowed in this context"
        ))
    };
    assert_eq!(call(&mut r, "GET k"), refused("get"));
    assert_eq!(call(&mut r, "CONFIG GET port"), refused("config|get"));
    assert_eq!(call(&mut r, "PUBLISH x y"), refused("publish"));
    assert_eq!(call(&mut r, "PING"), msg(&["pong", ""]));
    assert_eq!(call(&mut r, "PING hi"), msg(&["pong", "hi"]));
    // Arity and unknown commands are checked first, as Redis does.
    assert_eq!(
        call(&mut r, "GET"),
        Reply::Error("ERR wrong number of arguments for 'get' command".into())
    );
    assert!(
        matches!(call(&mut r, "NOSUCH"), Reply::Error(e) if e.starts_with("ERR unknown command"))
    );
    // RESET leaves every subscription.
    assert_eq!(call(&mut r, "RESET"), Reply::Simple("RESET".into()));
    assert_eq!(call(&mut r, "GET k"), bulk("v"));
    assert_eq!(call(&mut p, "PUBLISH xa y"), int(0));
    assert_eq!(call(&mut p, "PUBSUB NUMPAT"), int(0));
    // QUIT is allowed too.
    assert_eq!(call(&mut r, "SUBSCRIBE a"), conf("subscribe", Some("a"), 1));
    assert_eq!(call(&mut r, "QUIT"), Reply::Simple("OK".into()));
    wait_for("the closed subscriber to be gone", || {
        call(&mut p, "PUBSUB NUMSUB a") == Reply::Array(vec![bulk("a"), int(0)])
    });
}

#[test]
fn introspection() {
    let (_d, s) = start();
    let mut a = Conn::open(s.port);
    let mut b = Conn::open(s.port);
    let mut q = Conn::open(s.port);
    send(&mut a, "SUBSCRIBE c1 c2");
    next(&mut a);
    next(&mut a);
    assert_eq!(
        call(&mut a, "PSUBSCRIBE p*"),
        conf("psubscribe", Some("p*"), 3)
    );
    assert_eq!(
        call(&mut b, "SUBSCRIBE c1"),
        conf("subscribe", Some("c1"), 1)
    );
    assert_eq!(
        call(&mut b, "PSUBSCRIBE p*"),
        conf("psubscribe", Some("p*"), 2)
    );
    assert_eq!(
        call(&mut b, "SSUBSCRIBE s1"),
        conf("ssubscribe", Some("s1"), 1)
    );
    let chans = |c: &mut Conn, line: &str| -> Vec<Reply> {
        let Reply::Array(mut v) = call(c, line) else {
            panic!("{line}")
        };
        v.sort_by_key(|r| format!("{r:?}"));
        v
    };
    assert_eq!(chans(&mut q, "PUBSUB CHANNELS"), [bulk("c1"), bulk("c2")]);
    assert_eq!(chans(&mut q, "PUBSUB CHANNELS *2"), [bulk("c2")]);
    assert_eq!(chans(&mut q, "PUBSUB SHARDCHANNELS"), [bulk("s1")]);
    assert_eq!(chans(&mut q, "PUBSUB SHARDCHANNELS x*"), []);
    assert_eq!(
        call(&mut q, "PUBSUB NUMSUB c1 c2 p* nosuch"),
        Reply::Array(vec![
            bulk("c1"),
            int(2),
            bulk("c2"),
            int(1),
            bulk("p*"),
            int(0),
            bulk("nosuch"),
            int(0)
        ])
    );
    assert_eq!(call(&mut q, "PUBSUB NUMSUB"), Reply::Array(vec![]));
    assert_eq!(
        call(&mut q, "PUBSUB SHARDNUMSUB s1 c1"),
        Reply::Array(vec![bulk("s1"), int(1), bulk("c1"), int(0)])
    );
    assert_eq!(call(&mut q, "PUBSUB NUMPAT"), int(1));
    assert_eq!(
        call(&mut q, "PUBSUB NUMPAT x"),
        Reply::Error("ERR wrong number of arguments for 'pubsub|numpat' command".into())
    );
    assert_eq!(
        call(&mut q, "PUBSUB CHANNELS a b"),
        Reply::Error(
            "ERR unknown subcommand or wrong number of arguments for 'CHANNELS'. Try PUBSUB HELP."
                .into()
        )
    );
    assert_eq!(
        call(&mut q, "PUBSUB nosuch"),
        Reply::Error("ERR unknown subcommand 'nosuch'. Try PUBSUB HELP.".into())
    );
    assert_eq!(info_field(&mut q, "stats", "pubsub_channels"), "2");
    assert_eq!(info_field(&mut q, "stats", "pubsub_patterns"), "1");
    assert_eq!(info_field(&mut q, "stats", "pubsubshard_channels"), "1");
    let Reply::Bulk(list) = call(&mut q, "CLIENT LIST") else {
        panic!()
    };
    let list = String::from_utf8(list).unwrap();
    let fields = |l: &str| -> Vec<String> {
        ["flags", "sub", "psub", "ssub"]
            .iter()
            .map(|f| {
                l.split(' ')
                    .find_map(|kv| kv.strip_prefix(&format!("{f}=")))
                    .unwrap()
                    .to_string()
            })
            .collect()
    };
    let lines: Vec<Vec<String>> = list.lines().map(fields).collect();
    assert!(lines.contains(&vec!["P".into(), "2".into(), "1".into(), "0".into()]));
    assert!(lines.contains(&vec!["P".into(), "1".into(), "1".into(), "1".into()]));
    assert!(lines.contains(&vec!["N".into(), "0".into(), "0".into(), "0".into()]));
    let Reply::Bulk(ps) = call(&mut q, "CLIENT LIST TYPE pubsub") else {
        panic!()
    };
    assert_eq!(String::from_utf8(ps).unwrap().lines().count(), 2);
    let Reply::Bulk(normal) = call(&mut q, "CLIENT LIST TYPE normal") else {
        panic!()
    };
    assert!(String::from_utf8(normal)
        .unwrap()
        .contains("cmd=client|list"));
    // A closed subscriber's subscriptions go with it.
    drop(a);
    drop(b);
    wait_for("the subscriptions of closed clients to go", || {
        call(&mut q, "PUBSUB NUMPAT") == int(0)
            && call(&mut q, "PUBSUB CHANNELS") == Reply::Array(vec![])
            && call(&mut q, "PUBSUB SHARDCHANNELS") == Reply::Array(vec![])
    });
}

#[test]
fn slow_subscriber_is_disconnected() {
    let (_d, s) = start();
    let mut admin = Conn::open(s.port);
    assert_eq!(
        call(
            &mut admin,
            "CONFIG SET client-output-buffer-limit \"pubsub 1mb 256kb 60\""
        ),
        Reply::Simple("OK".into())
    );
    // A subscriber that never reads, and a small receive buffer.
    let mut slow = std::net::TcpStream::connect(("127.0.0.1", s.port)).unwrap();
    slow.write_all(b"SUBSCRIBE feed\r\n").unwrap();
    let mut buf = [0u8; 64];
    let n = slow.read(&mut buf).unwrap();
    assert!(buf[..n].starts_with(b"*3\r\n"));
    let mut fast = Conn::open(s.port);
    assert_eq!(
        call(&mut fast, "SUBSCRIBE feed"),
        conf("subscribe", Some("feed"), 1)
    );
    let mut p = Conn::open(s.port);
    let payload = "x".repeat(64 * 1024);
    let mut receivers = Vec::new();
    // Up to 64 MiB published; the slow subscriber must be gone well before.
    for i in 0..1024 {
        receivers.push(match call(&mut p, &format!("PUBLISH feed {payload}")) {
            Reply::Integer(n) => n,
            r => panic!("{r:?}"),
        });
        // The fast one reads everything.
        assert_eq!(next(&mut fast), msg(&["message", "feed", &payload]), "{i}");
        if receivers.last() == Some(&1) {
            break;
        }
    }
    assert_eq!(
        receivers.last(),
        Some(&1),
        "the slow subscriber was never closed"
    );
    assert!(receivers.len() > 4, "closed too early: {receivers:?}");
    assert_eq!(
        info_field(
            &mut admin,
            "stats",
            "client_output_buffer_limit_disconnections"
        ),
        "1"
    );
    assert!(s
        .log()
        .contains("closed for overcoming of output buffer limits"));
    assert!(s.log().contains("client-output-buffer-limit pubsub"));
    // Its socket ends after what the kernel had taken.
    slow.set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut rest = Vec::new();
    let _ = slow.read_to_end(&mut rest);
    assert!(rest.len() < 64 << 20);
}

/// Every message `c` receives until the message `stop` on channel `done`.
fn collect_until_done(c: &mut Conn) -> Vec<Reply> {
    let mut out = Vec::new();
    loop {
        let r = next(c);
        let items = match &r {
            Reply::Array(v) | Reply::Push(v) => v.clone(),
            _ => panic!("not a message: {r:?}"),
        };
        if items.len() == 3 && items[1] == bulk("done") {
            return out;
        }
        out.push(r);
    }
}

/// `(channel, payload)` of keyspace messages received through `psubscribe
/// __key*`, as strings.
fn events(msgs: &[Reply]) -> Vec<(String, String)> {
    msgs.iter()
        .map(|m| {
            let (Reply::Array(v) | Reply::Push(v)) = m else {
                panic!("{m:?}")
            };
            let s = |r: &Reply| match r {
                Reply::Bulk(b) => String::from_utf8_lossy(b).into_owned(),
                r => panic!("{r:?}"),
            };
            (s(&v[2]), s(&v[3]))
        })
        .collect()
}

fn ks(key: &str, ev: &str) -> [(String, String); 2] {
    [
        (format!("__keyspace@0__:{key}"), ev.to_string()),
        (format!("__keyevent@0__:{ev}"), key.to_string()),
    ]
}

#[test]
fn keyspace_notifications() {
    let (_d, s) = start();
    let mut admin = Conn::open(s.port);
    assert_eq!(
        call(&mut admin, "CONFIG GET notify-keyspace-events"),
        Reply::Array(vec![bulk("notify-keyspace-events"), bulk("")])
    );
    assert_eq!(
        call(&mut admin, "CONFIG SET notify-keyspace-events KEA!"),
        Reply::Error("ERR CONFIG SET failed (possibly related to argument 'notify-keyspace-events') - Invalid event class character. Use 'Ag$lshzxeKEtmdn'.".into())
    );
    for (set, shown) in [("AnKE", "AKE"), ("Kgl", "glK"), ("KEA", "AKE")] {
        call(
            &mut admin,
            &format!("CONFIG SET notify-keyspace-events {set}"),
        );
        assert_eq!(
            call(&mut admin, "CONFIG GET notify-keyspace-events"),
            Reply::Array(vec![bulk("notify-keyspace-events"), bulk(shown)])
        );
    }
    let mut sub = Conn::open(s.port);
    assert_eq!(
        call(&mut sub, "PSUBSCRIBE __key*"),
        conf("psubscribe", Some("__key*"), 1)
    );
    assert_eq!(
        call(&mut sub, "SUBSCRIBE done"),
        conf("subscribe", Some("done"), 2)
    );
    let mut w = Conn::open(s.port);
    for line in [
        "SET a 1",
        "INCRBY a 2",
        "EXPIRE a 100",
        "PERSIST a",
        "RENAME a b",
        "DEL b nosuch",
        "RPUSH l x y",
        "LPOP l 2",
        "HSET h f v",
        "HDEL h f",
        "SADD s m",
        "ZADD z 1 m",
        "ZINCRBY z 1 m",
        "SET gone v PX 1",
    ] {
        call(&mut w, line);
    }
    std::thread::sleep(Duration::from_millis(20));
    // Lazy expiry: a read finds the key expired.
    assert_eq!(call(&mut w, "GET gone"), Reply::Null);
    call(&mut w, "PUBLISH done x");
    let got = events(&collect_until_done(&mut sub));
    let mut want = Vec::new();
    for (k, e) in [
        ("a", "set"),
        ("a", "incrby"),
        ("a", "expire"),
        ("a", "persist"),
        ("a", "rename_from"),
        ("b", "rename_to"),
        ("b", "del"),
        ("l", "rpush"),
        ("l", "lpop"),
        ("l", "del"),
        ("h", "hset"),
        ("h", "hdel"),
        ("h", "del"),
        ("s", "sadd"),
        ("z", "zadd"),
        ("z", "zincr"),
        ("gone", "set"),
        ("gone", "expire"),
        ("gone", "expired"),
    ] {
        want.extend(ks(k, e));
    }
    assert_eq!(got, want);
    // Active expiry, and `new` (class n, not in A).
    call(&mut admin, "CONFIG SET notify-keyspace-events Exn");
    call(&mut w, "PSETEX t 50 v");
    let t = Instant::now();
    let r = next(&mut sub);
    assert_eq!(events(&[r]), [("__keyevent@0__:new".into(), "t".into())]);
    let r = next(&mut sub);
    assert_eq!(
        events(&[r]),
        [("__keyevent@0__:expired".into(), "t".into())]
    );
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    // Off: nothing is published.
    call(&mut admin, "CONFIG SET notify-keyspace-events \"\"");
    call(&mut w, "SET quiet 1");
    call(&mut w, "PUBLISH done x");
    assert!(collect_until_done(&mut sub).is_empty());
}

/// The command sequence of the differential test: every command family's
/// events, in database 0 and 1.
const SEQUENCE: &[&str] = &[
    "SET s1 v",
    "SET s1 w KEEPTTL",
    "SET s2 v EX 100",
    "SET s3 v NX",
    "SET s3 v2 XX GET",
    "SETNX s4 v",
    "SETNX s4 v",
    "SETEX s5 100 v",
    "PSETEX s6 100000 v",
    "GETSET s1 x",
    "MSET m1 a m2 b",
    "MSETNX m3 a m1 c",
    "MSETNX m4 a m5 b",
    "APPEND s1 yz",
    "SETRANGE s1 1 QQ",
    "SETRANGE s1 0 \"\"",
    "INCR n",
    "DECR n",
    "INCRBY n 5",
    "DECRBY n 2",
    "INCRBYFLOAT f 1.5",
    "GETDEL m2",
    "GETEX s1 EX 100",
    "GETEX s1 PERSIST",
    "GETEX s1 PXAT 1",
    "EXPIRE s2 200",
    "EXPIRE s2 100 GT",
    "PEXPIRE s3 100000",
    "EXPIREAT s4 1",
    "PERSIST s3",
    "PERSIST s3",
    "DEL m1 m3 nosuch",
    "UNLINK m4",
    "RENAME m5 r1",
    "RENAMENX r1 s5",
    "RENAMENX r1 r2",
    "COPY r2 c1",
    "COPY r2 c1",
    "COPY r2 c1 REPLACE",
    "MOVE c1 1",
    "RPUSH l a b c d e",
    "LPUSH l z",
    "LPUSHX l y",
    "RPUSHX nolist y",
    "LPOP l",
    "RPOP l 2",
    "LSET l 0 Q",
    "LINSERT l BEFORE Q P",
    "LINSERT l BEFORE nosuch P",
    "LREM l 1 P",
    "LTRIM l 0 1",
    "LMOVE l l2 LEFT RIGHT",
    "RPOPLPUSH l2 l",
    "LMPOP 2 nolist l RIGHT COUNT 5",
    "RPUSH bl a",
    "BLPOP nolist bl 1",
    "RPUSH bm a b c",
    "BRPOP bm 1",
    "BLMOVE bm bm2 LEFT RIGHT 1",
    "BRPOPLPUSH bm bm2 1",
    "BLMPOP 1 2 nolist bm2 LEFT COUNT 5",
    "RPUSH l3 a",
    "LTRIM l3 1 0",
    "HSET h a 1 b 2",
    "HMSET h c 3",
    "HSETNX h a 9",
    "HSETNX h d 4",
    "HINCRBY h a 5",
    "HINCRBYFLOAT h b 0.5",
    "HDEL h a nosuch",
    "HDEL h b c d",
    "SADD st 1 2 3",
    "SADD st 1",
    "SREM st 1 9",
    "SMOVE st st2 2",
    "SMOVE st st2 9",
    "SADD st3 a b",
    "SINTERSTORE dst st2 st3",
    "SUNIONSTORE dst st2 st3",
    "SDIFFSTORE dst st3 st3",
    "SPOP st3 5",
    "SPOP st 1",
    "ZADD z 1 a 2 b 3 c 4 d 5 e",
    "ZADD z NX 1 a",
    "ZADD z XX CH 9 a",
    "ZINCRBY z 1 b",
    "ZREM z nosuch",
    "ZREM z c",
    "ZREMRANGEBYRANK z 0 0",
    "ZREMRANGEBYSCORE z 100 200",
    "ZREMRANGEBYSCORE z 4 4",
    "ZREMRANGEBYLEX z - +",
    "ZADD z2 1 a 2 b 3 c",
    "ZPOPMIN z2",
    "ZPOPMAX z2 5",
    "ZADD z3 1 a 2 b",
    "ZRANGESTORE zd z3 0 -1",
    "ZRANGESTORE zd z3 5 6",
    "ZUNIONSTORE zu 2 z3 nosuch",
    "ZINTERSTORE zu 2 z3 nosuch",
    "ZDIFFSTORE zd2 1 z3",
    "ZMPOP 1 z3 MIN COUNT 10",
    "ZADD bz 1 a 2 b 3 c",
    "BZPOPMIN bz 1",
    "BZPOPMAX bz 1",
    "BZMPOP 1 1 bz MIN COUNT 5",
    "XADD e:xs 1-1 f v",
    "XADD e:xs MAXLEN 1 2-1 f v",
    "XTRIM e:xs MAXLEN 0",
    "XDEL e:xs 9-9",
    "XADD e:xs 3-1 f v",
    "XDEL e:xs 3-1",
    "XGROUP CREATE e:xs g 0",
    "XGROUP CREATE e:xs2 g $ MKSTREAM",
    "XADD e:xs 4-1 a b",
    "XREADGROUP GROUP g c1 STREAMS e:xs >",
    "XGROUP CREATECONSUMER e:xs g c2",
    "XGROUP DELCONSUMER e:xs g c2",
    "XCLAIM e:xs g c3 0 4-1",
    "XAUTOCLAIM e:xs g c4 0 0",
    "XGROUP SETID e:xs g 0",
    "XSETID e:xs 10-0",
    "XGROUP DESTROY e:xs g",
    "SETBIT e:b 7 1",
    "SETBIT e:b 7 1",
    "BITFIELD e:b SET u8 0 255",
    "BITFIELD e:b GET u8 0",
    "BITOP NOT e:bn e:b",
    "BITOP AND e:bn nosuch",
    "PFADD e:h1 a b",
    "PFADD e:h1 a",
    "PFMERGE e:h2 e:h1",
    "RPUSH e:sl 3 1 2",
    "SORT e:sl STORE e:so",
    "SORT nosuch STORE e:so",
    "GEOADD e:g 13.36 38.11 p",
    "GEOSEARCHSTORE e:gd e:g FROMLONLAT 13 38 BYRADIUS 500 km",
    "GEOSEARCHSTORE e:gd e:g FROMLONLAT 0 0 BYRADIUS 1 km",
    "MULTI",
    "INCR e:mi",
    "LPUSH e:ml x",
    "EXEC",
    "FLUSHDB",
    "SELECT 1",
    "SET other v",
    "DEL other c1",
];

/// Commands that look up keys that do not exist: read commands, and write
/// commands' source keys, are `keymiss` events (not OBJECT's lookups, nor
/// a write command's own key).
const MISSES: &[&str] = &[
    "GET m:1",
    "SET m:x 1",
    "MGET m:x m:2 m:3",
    "EXISTS m:4 m:x",
    "TYPE m:5",
    "TTL m:6",
    "STRLEN m:7",
    "GETRANGE m:8 0 1",
    "OBJECT ENCODING m:9",
    "LRANGE m:10 0 -1",
    "LLEN m:11",
    "HGET m:12 f",
    "HGETALL m:13",
    "SMEMBERS m:14",
    "SINTER m:15 m:x",
    "SCARD m:16",
    "ZRANGE m:17 0 -1",
    "ZSCORE m:18 a",
    "XRANGE m:19 - +",
    "BITCOUNT m:20",
    "PFCOUNT m:21",
    "GEOPOS m:22 a",
    "SORT_RO m:23",
    "INCR m:24",
    "LPUSH m:25 a",
    "RPOPLPUSH m:26 m:27",
    "SUNIONSTORE m:28 m:29 m:30",
    "COPY m:31 m:32",
    "PFMERGE m:33 m:34",
    "BITOP OR m:35 m:36",
    "DEL m:37",
    "DUMP m:38",
];

/// Runs `SEQUENCE` against the server at `port` with a subscriber to every
/// keyspace channel (and to `done`, which ends the run) in protocol
/// `resp3`, and returns the messages it received, in order.
fn message_sequence(port: u16, resp3: bool, flags: &str) -> Vec<Reply> {
    let mut admin = Conn::open(port);
    call(&mut admin, "FLUSHALL");
    call(
        &mut admin,
        &format!("CONFIG SET notify-keyspace-events {flags}"),
    );
    let mut sub = Conn::open(port);
    if resp3 {
        assert!(matches!(call(&mut sub, "HELLO 3"), Reply::Map(_)));
    }
    call(&mut sub, "PSUBSCRIBE __key*__:*");
    call(&mut sub, "SUBSCRIBE done");
    let mut w = Conn::open(port);
    for line in SEQUENCE {
        call(&mut w, line);
    }
    // A key found expired by a read.
    call(&mut w, "SELECT 0");
    call(&mut w, "SET lazy v PX 1");
    std::thread::sleep(Duration::from_millis(20));
    call(&mut w, "GET lazy");
    // Reads of missing keys (`keymiss` with `m`), OBJECT's excepted.
    for line in MISSES {
        call(&mut w, line);
    }
    call(&mut w, "PUBLISH done x");
    let out = collect_until_done(&mut sub);
    call(&mut admin, "CONFIG SET notify-keyspace-events \"\"");
    out
}

#[test]
fn message_sequences_match_redis() {
    let (_d, s) = start();
    let redis = RedisServer::start();
    for resp3 in [false, true] {
        for flags in ["KEA", "KEAn", "KEAm", "Em"] {
            let want = message_sequence(redis.port, resp3, flags);
            let got = message_sequence(s.port, resp3, flags);
            assert!(want.len() > 20, "{}", want.len());
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert_eq!(
                    g,
                    w,
                    "message {i} (RESP{}, {flags})",
                    if resp3 { 3 } else { 2 }
                );
            }
            assert_eq!(
                got.len(),
                want.len(),
                "RESP{}, {flags}",
                if resp3 { 3 } else { 2 }
            );
        }
    }
}

/// ACL channel rules (`&pattern`, `allchannels`, Redis 7.0's
/// `resetchannels` default for new users) on Pub/Sub commands: the same
/// replies as redis-server, error texts and ACL DRYRUN's included.
#[test]
fn acl_channel_rules_match_redis() {
    let (_d, s) = start();
    let redis = RedisServer::start();
    let run = |port: u16| -> Vec<Reply> {
        let mut admin = Conn::open(port);
        call(&mut admin, "ACL SETUSER alice on >p ~* +@all &news* &chat");
        call(&mut admin, "ACL SETUSER bob on >p ~* +@all");
        let mut out = Vec::new();
        let mut a = Conn::open(port);
        out.push(call(&mut a, "HELLO 3 AUTH alice p"));
        if let Some(Reply::Map(m)) = out.last_mut() {
            // The server's version and the connection id differ.
            m.retain(|(k, _)| *k != bulk("version") && *k != bulk("id"));
        }
        for line in [
            "PUBLISH news1 m",
            "PUBLISH other m",
            "SUBSCRIBE chat news2",
            "SUBSCRIBE chat other",
            "PSUBSCRIBE news*",
            "PSUBSCRIBE n*",
            "SSUBSCRIBE other",
            "SPUBLISH news3 m",
            "UNSUBSCRIBE other",
            "ACL DRYRUN alice publish other m",
            "ACL DRYRUN alice psubscribe news1",
            "ACL DRYRUN bob subscribe x",
            "ACL DRYRUN alice publish news9 m",
        ] {
            out.push(call(&mut a, line));
        }
        let mut b = Conn::open(port);
        call(&mut b, "AUTH bob p");
        out.push(call(&mut b, "PUBLISH any m"));
        out.push(call(&mut b, "PSUBSCRIBE *"));
        let Reply::Array(log) = call(&mut admin, "ACL LOG 1") else {
            panic!("ACL LOG")
        };
        let Reply::Array(entry) = &log[0] else {
            panic!("ACL LOG entry")
        };
        // reason, context, object, username (not the times or client info).
        out.extend(entry[2..10].iter().cloned());
        out
    };
    let want = run(redis.port);
    let got = run(s.port);
    assert_eq!(got, want);
    // Redis 7.2's INFO field (7.0 has none).
    let mut admin = Conn::open(s.port);
    assert_eq!(
        info_field(&mut admin, "stats", "acl_access_denied_channel"),
        "6"
    );
}

/// With one worker (the default on two cores) every message goes through
/// the worker's own inbox: published by its clients' commands, by active
/// expiry on its tick, and delivered in the same loop.
#[test]
fn one_worker_delivers_its_own_messages() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), &["--threads", "1"]);
    let mut sub = Conn::open(s.port);
    let mut p = Conn::open(s.port);
    call(&mut p, "CONFIG SET notify-keyspace-events Ex");
    assert_eq!(
        call(&mut sub, "SUBSCRIBE c"),
        conf("subscribe", Some("c"), 1)
    );
    assert_eq!(
        call(&mut sub, "SUBSCRIBE __keyevent@0__:expired"),
        conf("subscribe", Some("__keyevent@0__:expired"), 2)
    );
    for i in 0..100 {
        send(&mut p, &format!("PUBLISH c {i}"));
    }
    for i in 0..100 {
        assert_eq!(next(&mut p), int(1));
        assert_eq!(next(&mut sub), msg(&["message", "c", &i.to_string()]));
    }
    // Active expiry on the worker's own tick.
    call(&mut p, "PSETEX t 20 v");
    let t = Instant::now();
    assert_eq!(
        next(&mut sub),
        msg(&["message", "__keyevent@0__:expired", "t"])
    );
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
}

/// PUBSUB NUMSUB rc1 rc2 and PUBSUB NUMPAT.
fn numsub(con: &mut redis::Connection) -> ([(String, i64); 2], i64) {
    let subs: Vec<(String, i64)> = redis::cmd("PUBSUB")
        .arg("NUMSUB")
        .arg("rc1")
        .arg("rc2")
        .query(con)
        .unwrap();
    let pats: i64 = redis::cmd("PUBSUB").arg("NUMPAT").query(con).unwrap();
    (subs.try_into().unwrap(), pats)
}

/// The `redis` crate's PubSub API, RESP2 and RESP3, on Ember and on
/// redis-server alike: SUBSCRIBE and PSUBSCRIBE through `as_pubsub`,
/// messages published from another connection (on the other worker) read
/// with `get_message`, binary payloads, PUBLISH's receiver counts, and
/// UNSUBSCRIBE/PUNSUBSCRIBE ending delivery.
#[test]
fn redis_crate_pubsub() {
    let redis = RedisServer::start();
    let (_d, s) = start();
    for port in [s.port, redis.port] {
        for proto in ["", "?protocol=resp3"] {
            let at = format!("{} {proto}", if port == s.port { "ember" } else { "redis" });
            let client = redis::Client::open(format!("redis://127.0.0.1:{port}/{proto}")).unwrap();
            let mut con = client.get_connection().unwrap();
            let mut publisher = client.get_connection().unwrap();
            let mut publish = |ch: &str, payload: &[u8]| -> i64 {
                redis::cmd("PUBLISH")
                    .arg(ch)
                    .arg(payload)
                    .query(&mut publisher)
                    .unwrap()
            };
            let mut ps = con.as_pubsub();
            ps.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            ps.subscribe(&["rc1", "rc2"]).unwrap();
            ps.psubscribe("rp.*").unwrap();
            // With RESP3 the crate sends SUBSCRIBE without awaiting its
            // confirmation (a push): the subscriptions are waited for here.
            let mut watcher = client.get_connection().unwrap();
            wait_for("the subscriptions", || {
                numsub(&mut watcher) == ([("rc1".into(), 1), ("rc2".into(), 1)], 1)
            });
            assert_eq!(publish("rc1", b"one"), 1, "{at}");
            assert_eq!(publish("rp.x", b"\x00bin\xff"), 1, "{at}");
            assert_eq!(publish("nobody", b"x"), 0, "{at}");
            let m = ps.get_message().unwrap();
            assert_eq!(m.get_channel_name(), "rc1", "{at}");
            assert_eq!(m.get_payload::<String>().unwrap(), "one", "{at}");
            assert_eq!(m.get_pattern::<Option<String>>().unwrap(), None, "{at}");
            let m = ps.get_message().unwrap();
            assert_eq!(m.get_channel_name(), "rp.x", "{at}");
            assert_eq!(m.get_payload_bytes(), b"\x00bin\xff", "{at}");
            assert_eq!(
                m.get_pattern::<Option<String>>().unwrap().as_deref(),
                Some("rp.*"),
                "{at}"
            );
            ps.unsubscribe("rc1").unwrap();
            ps.punsubscribe("rp.*").unwrap();
            let mut publisher = client.get_connection().unwrap();
            wait_for("the unsubscribes", || {
                numsub(&mut publisher) == ([("rc1".into(), 0), ("rc2".into(), 1)], 0)
            });
            for (ch, want) in [("rc1", 0), ("rp.y", 0), ("rc2", 1)] {
                let n: i64 = redis::cmd("PUBLISH")
                    .arg(ch)
                    .arg("two")
                    .query(&mut publisher)
                    .unwrap();
                assert_eq!(n, want, "{at} {ch}");
            }
            // Only rc2's message arrives.
            let m = ps.get_message().unwrap();
            assert_eq!(
                (m.get_channel_name(), m.get_payload::<String>().unwrap()),
                ("rc2", "two".to_string()),
                "{at}"
            );
            ps.unsubscribe(&[] as &[&str]).unwrap();
            drop(ps);
            // Out of subscriber mode, the connection takes commands again.
            let pong: String = redis::cmd("PING").query(&mut con).unwrap();
            assert_eq!(pong, "PONG", "{at}");
        }
    }
}

/// redis-py's PubSub object, RESP2 and RESP3, on Ember and on
/// redis-server alike (the script's expectations are checked against
/// both): subscribe/psubscribe confirmations and messages from
/// `get_message`, `listen()` with messages published from another thread
/// and connection, handlers with `run_in_thread`, `ignore_subscribe_messages`,
/// PUBSUB NUMSUB/NUMPAT, unsubscribes with their counts.
#[test]
fn redis_py_pubsub() {
    let redis = RedisServer::start();
    let (_d, s) = start();
    for port in [s.port, redis.port] {
        for protocol in [2, 3] {
            let script = format!(
                r#"
import redis, threading, time
r = redis.Redis(port={port}, protocol={protocol})
pub = redis.Redis(port={port}, protocol={protocol})
p = r.pubsub()
p.subscribe("ch1", "ch2")
got = [p.get_message(timeout=5) for _ in range(2)]
assert [(m["type"], m["channel"], m["data"]) for m in got] == [
    ("subscribe", b"ch1", 1), ("subscribe", b"ch2", 2)], got
p.psubscribe("news.*")
m = p.get_message(timeout=5)
assert (m["type"], m["channel"], m["data"]) == ("psubscribe", b"news.*", 3), m
assert pub.publish("ch1", "hello") == 1
assert pub.publish("news.tech", b"\x00\xff") == 1
assert pub.publish("nobody", "x") == 0
m = p.get_message(timeout=5)
assert m == {{"type": "message", "pattern": None, "channel": b"ch1", "data": b"hello"}}, m
m = p.get_message(timeout=5)
assert m == {{"type": "pmessage", "pattern": b"news.*", "channel": b"news.tech",
              "data": b"\x00\xff"}}, m
assert p.get_message(timeout=0.2) is None
assert pub.pubsub_numsub("ch1", "ch2", "nobody") == [(b"ch1", 1), (b"ch2", 1), (b"nobody", 0)]
assert pub.pubsub_numpat() == 1
assert sorted(pub.pubsub_channels()) == [b"ch1", b"ch2"]

# listen(), fed from another thread's connection.
def later():
    time.sleep(0.1)
    for i in range(5):
        pub.publish("ch2", str(i))
threading.Thread(target=later).start()
seen = []
for m in p.listen():
    assert m["type"] == "message" and m["channel"] == b"ch2", m
    seen.append(m["data"])
    if len(seen) == 5:
        break
assert seen == [b"0", b"1", b"2", b"3", b"4"], seen

# Unsubscribes and their counts.
p.unsubscribe("ch1")
m = p.get_message(timeout=5)
assert (m["type"], m["channel"], m["data"]) == ("unsubscribe", b"ch1", 2), m
p.punsubscribe()
m = p.get_message(timeout=5)
assert (m["type"], m["channel"], m["data"]) == ("punsubscribe", b"news.*", 1), m
assert pub.publish("ch1", "x") == 0 and pub.publish("news.x", "x") == 0
p.unsubscribe()
m = p.get_message(timeout=5)
assert (m["type"], m["channel"], m["data"]) == ("unsubscribe", b"ch2", 0), m
assert pub.publish("ch2", "x") == 0
assert p.get_message(timeout=0.2) is None
p.close()

# Handlers in a background thread, confirmations ignored.
q = r.pubsub(ignore_subscribe_messages=True)
events = []
q.subscribe(**{{"ev": lambda m: events.append(m["data"])}})
q.psubscribe(**{{"ev.*": lambda m: events.append((m["pattern"], m["channel"], m["data"]))}})
# The confirmations are ignored, so wait until the server has registered
# both subscriptions before publishing (another connection, which another
# worker thread may serve before this one's commands are read).
deadline = time.time() + 5
while (pub.pubsub_numsub("ev") != [(b"ev", 1)] or pub.pubsub_numpat() != 1) \
        and time.time() < deadline:
    time.sleep(0.01)
t = q.run_in_thread(sleep_time=0.01, daemon=True)
assert pub.publish("ev", "a") == 1
assert pub.publish("ev.b", "b") == 1
deadline = time.time() + 5
while len(events) < 2 and time.time() < deadline:
    time.sleep(0.01)
t.stop()
t.join(5)
q.close()
assert events == [b"a", (b"ev.*", b"ev.b", b"b")], events
assert pub.pubsub_numsub("ev") == [(b"ev", 0)]
print("redis-py ok")
"#
            );
            serve_common::run_redis_py(&script);
        }
    }
}
