//! Server administration commands against a real redis-server 7.0: CLIENT
//! KILL (its filters, old and new forms, errors), SLOWLOG (entries,
//! trimming, redaction, LEN, RESET, errors) and WAIT, same requests, same
//! replies where they do not depend on timing; and CLIENT KILL closes
//! connections served by another worker.

mod serve_common;

use proto::Reply;
use serve_common::redis_server::{Conn, RedisServer};
use serve_common::Server;
use std::io::Read;
use std::net::TcpStream;
use std::time::Duration;

/// Requests whose replies do not depend on connection ids or timing.
const CASES: &[&[&str]] = &[
    &["CLIENT", "KILL"],
    &["CLIENT", "KILL", "1.2.3.4:5"],
    &["CLIENT", "KILL", "ID", "0"],
    &["CLIENT", "KILL", "ID", "x"],
    &["CLIENT", "KILL", "ID", "999999"],
    &["CLIENT", "KILL", "TYPE", "nosuch"],
    &["CLIENT", "KILL", "TYPE", "master"],
    &["CLIENT", "KILL", "TYPE", "pubsub"],
    &["CLIENT", "KILL", "USER", "nosuch"],
    &["CLIENT", "KILL", "ADDR", "1.2.3.4:5", "SKIPME", "maybe"],
    &["CLIENT", "KILL", "ADDR", "1.2.3.4:5", "LADDR"],
    &["CLIENT", "KILL", "BOGUS", "1"],
    &["WAIT", "0", "0"],
    &["WAIT", "x", "0"],
    &["WAIT", "0", "-1"],
    &["WAIT", "0", "y"],
    &["SLOWLOG", "GET", "-2"],
    &["SLOWLOG", "GET", "x"],
    &["SLOWLOG", "LEN", "1"],
    &["SLOWLOG", "NOSUCH"],
    &["SLOWLOG", "HELP"],
    &["CONFIG", "SET", "slowlog-log-slower-than", "0"],
    &["SLOWLOG", "RESET"],
    &["SET", "k", "v"],
    &["AUTH", "secret"],
    &["HELLO", "2", "AUTH", "default", "secret", "BADOPT"],
    &["ACL", "SETUSER", "u1", "on", ">pw"],
    &["CONFIG", "SET", "slowlog-max-len", "3"],
    &["LATENCY", "LATEST"],
    &["LATENCY", "HISTORY", "command"],
    &["LATENCY", "HISTORY"],
    &["LATENCY", "RESET"],
    &["LATENCY", "RESET", "command", "x"],
    &["LATENCY", "GRAPH", "command"],
    &["LATENCY", "HELP"],
    &["LATENCY", "NOSUCH"],
    &["CONFIG", "GET", "latency-monitor-threshold"],
];

/// The entries of SLOWLOG GET with what depends on the server's timing
/// (id, time, duration, client address) left out: arguments and name.
fn entries(c: &mut Conn) -> Vec<Reply> {
    let Reply::Array(v) = c.call(&["SLOWLOG", "GET", "-1"]) else {
        panic!("SLOWLOG GET");
    };
    v.into_iter()
        .map(|e| {
            let Reply::Array(f) = e else {
                panic!("entry {e:?}");
            };
            assert_eq!(f.len(), 6);
            Reply::Array(vec![f[3].clone(), f[5].clone()])
        })
        .collect()
}

#[test]
fn admin_commands_match_redis() {
    let dir = tempfile::tempdir().unwrap();
    let ember = Server::start(dir.path(), &[]);
    let redis = RedisServer::start();
    let mut e = Conn::open(ember.port);
    let mut r = Conn::open(redis.port);
    for req in CASES {
        let (a, b) = (e.call(req), r.call(req));
        assert_eq!(a, b, "{req:?}");
    }
    // Trimming: 40 arguments, a 200-byte one.
    let mut long: Vec<String> = vec!["RPUSH".into(), "list".into(), "x".repeat(200)];
    long.extend((0..40).map(|i| i.to_string()));
    assert_eq!(e.call(&long), r.call(&long));
    for c in [&mut e, &mut r] {
        c.call(&["CLIENT", "SETNAME", "me"]);
        c.call(&["GET", "k"]);
    }
    let (a, b) = (entries(&mut e), entries(&mut r));
    assert_eq!(a, b);
    assert_eq!(a.len(), 3);
    assert_eq!(e.call(&["SLOWLOG", "LEN"]), Reply::Integer(3));
    // RESET itself is logged (as in Redis); nothing after logging is off.
    for c in [&mut e, &mut r] {
        assert_eq!(c.call(&["SLOWLOG", "RESET"]), Reply::Simple("OK".into()));
        assert_eq!(
            c.call(&["CONFIG", "SET", "slowlog-log-slower-than", "-1"]),
            Reply::Simple("OK".into())
        );
        c.call(&["GET", "k"]);
        assert_eq!(c.call(&["SLOWLOG", "LEN"]), Reply::Integer(1));
    }
    // A transaction's commands are logged one by one, not EXEC.
    for c in [&mut e, &mut r] {
        c.call(&["CONFIG", "SET", "slowlog-log-slower-than", "0"]);
        c.call(&["CONFIG", "SET", "slowlog-max-len", "128"]);
        c.call(&["SLOWLOG", "RESET"]);
        c.call(&["MULTI"]);
        c.call(&["INCR", "n"]);
        c.call(&["EXEC"]);
    }
    assert_eq!(entries(&mut e), entries(&mut r));
}

/// CLIENT KILL by ID, ADDR (old form), TYPE and USER closes connections on
/// either worker; SKIPME no closes the caller after its reply.
#[test]
fn client_kill_closes_connections() {
    let dir = tempfile::tempdir().unwrap();
    let ember = Server::start(dir.path(), &["--threads", "2"]);
    let mut admin = Conn::open(ember.port);
    let open = || {
        let mut c = Conn::open(ember.port);
        let Reply::Integer(id) = c.call(&["CLIENT", "ID"]) else {
            panic!("CLIENT ID");
        };
        (c, id)
    };
    let closed = |c: Conn| {
        let mut s: TcpStream = c.into_stream();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut b = [0u8; 16];
        assert_eq!(
            s.read(&mut b).unwrap(),
            0,
            "the killed connection is still open"
        );
    };
    let (a, ida) = open();
    let (b, idb) = open();
    let (mut keep, _) = open();
    assert_eq!(
        admin.call(&["CLIENT", "KILL", "ID", &ida.to_string()]),
        Reply::Integer(1)
    );
    closed(a);
    let addr = addr_of(&mut admin, idb);
    assert_eq!(
        admin.call(&["CLIENT", "KILL", &addr]),
        Reply::Simple("OK".into())
    );
    closed(b);
    let (mut sub, _) = open();
    sub.call(&["SUBSCRIBE", "ch"]);
    assert_eq!(
        admin.call(&["CLIENT", "KILL", "TYPE", "pubsub"]),
        Reply::Integer(1)
    );
    closed(sub);
    assert_eq!(keep.call(&["PING"]), Reply::Simple("PONG".into()));
    // USER default, skipping the caller: every other connection.
    assert_eq!(
        admin.call(&["CLIENT", "KILL", "USER", "default"]),
        Reply::Integer(1)
    );
    closed(keep);
    // SKIPME no: the caller too, after its reply.
    assert_eq!(
        admin.call(&["CLIENT", "KILL", "USER", "default", "SKIPME", "no"]),
        Reply::Integer(1)
    );
    closed(admin);
}

/// The `addr=` field of connection `id` in CLIENT LIST.
fn addr_of(admin: &mut Conn, id: i64) -> String {
    let Reply::Bulk(all) = admin.call(&["CLIENT", "LIST"]) else {
        panic!("CLIENT LIST");
    };
    let all = String::from_utf8(all).unwrap();
    let line = all
        .lines()
        .find(|l| l.starts_with(&format!("id={id} ")))
        .expect("the connection is listed");
    line.split(' ')
        .find_map(|f| f.strip_prefix("addr="))
        .expect("addr=")
        .to_string()
}

/// Reads MONITOR lines from `s` until `n` arrived; each normalised to
/// `[db who] args` with `who` "lua" or "client" (addresses differ).
fn monitor_lines(s: &mut TcpStream, n: usize) -> Vec<String> {
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let text = String::from_utf8_lossy(&buf).to_string();
        let lines: Vec<&str> = text.split_terminator("\r\n").collect();
        if lines.len() >= n && text.ends_with("\r\n") {
            return lines
                .iter()
                .map(|l| {
                    let (_, rest) = l.split_once(" [").expect("a monitor line");
                    let (who, args) = rest.split_once("] ").unwrap();
                    let (db, addr) = who.split_once(' ').unwrap();
                    let addr = if addr == "lua" { "lua" } else { "client" };
                    format!("[{db} {addr}] {args}")
                })
                .collect();
        }
        let k = s.read(&mut chunk).expect("monitor read");
        assert!(k > 0, "monitor closed");
        buf.extend_from_slice(&chunk[..k]);
    }
}

/// MONITOR shows the same lines as Redis's (addresses aside): quoting,
/// the script's commands as `lua`, a transaction's commands, redaction,
/// admin commands and refused requests left out. The monitor and the
/// client are on different workers.
#[test]
fn monitor_matches_redis() {
    let dir = tempfile::tempdir().unwrap();
    let ember = Server::start(dir.path(), &["--threads", "2"]);
    let redis = RedisServer::start();
    let mut got = Vec::new();
    for port in [ember.port, redis.port] {
        let mut m = Conn::open(port);
        assert_eq!(m.call(&["MONITOR"]), Reply::Simple("OK".into()));
        let mut s = m.into_stream();
        let mut c = Conn::open(port);
        c.call(&["SET", "k", "a \"b\"\n\u{1}"]);
        c.call(&["GET", "k"]);
        c.call(&["EVAL", "return redis.call('incr', KEYS[1])", "1", "n"]);
        c.call(&["CONFIG", "GET", "maxclients"]);
        c.call(&["NOSUCH", "x"]);
        c.call(&["GET"]);
        c.call(&["AUTH", "secret"]);
        c.call(&["MULTI"]);
        c.call(&["SELECT", "2"]);
        c.call(&["SET", "k2", "v"]);
        c.call(&["EXEC"]);
        c.call(&["PING"]);
        got.push(monitor_lines(&mut s, 10));
    }
    assert_eq!(got[0], got[1]);
}

/// CLIENT REPLY ON|OFF|SKIP: the same bytes as Redis for a pipeline that
/// skips one reply, turns replies off (errors included) and on again.
#[test]
fn client_reply_matches_redis() {
    let dir = tempfile::tempdir().unwrap();
    let ember = Server::start(dir.path(), &[]);
    let redis = RedisServer::start();
    let reqs: &[&[&str]] = &[
        &["CLIENT", "REPLY", "SKIP"],
        &["SET", "a", "1"],
        &["GET", "a"],
        &["CLIENT", "REPLY", "BOGUS"],
        &["CLIENT", "REPLY", "OFF"],
        &["SET", "b", "2"],
        &["NOSUCH"],
        &["CLIENT", "REPLY", "SKIP"],
        &["GET", "b"],
        &["CLIENT", "REPLY", "ON"],
        &["GET", "b"],
        &["PING"],
    ];
    let mut got = Vec::new();
    for port in [ember.port, redis.port] {
        let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut req = Vec::new();
        for r in reqs {
            proto::encode_request(r, &mut req);
        }
        std::io::Write::write_all(&mut s, &req).unwrap();
        let mut out = Vec::new();
        let mut chunk = [0u8; 1024];
        while !out.ends_with(b"+PONG\r\n") {
            let n = s.read(&mut chunk).unwrap();
            assert!(n > 0);
            out.extend_from_slice(&chunk[..n]);
        }
        got.push(String::from_utf8(out).unwrap());
    }
    assert_eq!(got[0], got[1]);
}

/// CLIENT PAUSE: WRITE holds writes (and scripts that may write) but not
/// reads or `no-writes` scripts; CLIENT UNPAUSE releases the held request
/// at once; ALL holds every command until the pause ends. The paused
/// clients are on both workers.
#[test]
fn client_pause_holds_writes_or_everything() {
    use std::time::Instant;
    let dir = tempfile::tempdir().unwrap();
    let ember = Server::start(dir.path(), &["--threads", "2"]);
    let mut a = Conn::open(ember.port);
    let mut b = Conn::open(ember.port);
    let mut c2 = Conn::open(ember.port);
    assert_eq!(
        a.call(&["CLIENT", "PAUSE", "x"]),
        Reply::Error("ERR timeout is not an integer or out of range".into())
    );
    assert_eq!(
        a.call(&["CLIENT", "PAUSE", "10", "SOME"]),
        Reply::Error("ERR CLIENT PAUSE mode must be WRITE or ALL".into())
    );
    assert_eq!(
        a.call(&["CLIENT", "PAUSE", "-1"]),
        Reply::Error("ERR timeout is negative".into())
    );
    // WRITE for 10 s, lifted by UNPAUSE.
    assert_eq!(
        a.call(&["CLIENT", "PAUSE", "10000", "WRITE"]),
        Reply::Simple("OK".into())
    );
    let t = Instant::now();
    assert_eq!(b.call(&["GET", "x"]), Reply::Null);
    assert_eq!(
        b.call(&["EVAL", "#!lua flags=no-writes\nreturn 7", "0"]),
        Reply::Integer(7)
    );
    assert!(t.elapsed() < Duration::from_secs(3), "reads were held");
    let port = ember.port;
    let writer = std::thread::spawn(move || {
        let mut w = Conn::open(port);
        let r = w.call(&["SET", "x", "1"]);
        (r, Instant::now())
    });
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        c2.call(&["GET", "x"]),
        Reply::Null,
        "the write ran during the pause"
    );
    // The write's reply comes after UNPAUSE was sent (timed from there, not
    // from the writer's start, which a loaded machine may delay).
    let unpaused = Instant::now();
    assert_eq!(a.call(&["CLIENT", "UNPAUSE"]), Reply::Simple("OK".into()));
    let (r, done) = writer.join().unwrap();
    assert_eq!(r, Reply::Simple("OK".into()));
    assert!(
        done >= unpaused && done - unpaused < Duration::from_secs(5),
        "the write was answered {:?} before the unpause",
        unpaused.saturating_duration_since(done)
    );
    // ALL for 400 ms: even PING waits.
    assert_eq!(
        a.call(&["CLIENT", "PAUSE", "400", "ALL"]),
        Reply::Simple("OK".into())
    );
    let t = Instant::now();
    assert_eq!(b.call(&["PING"]), Reply::Simple("PONG".into()));
    assert!(
        t.elapsed() >= Duration::from_millis(300),
        "PING ran during ALL"
    );
    assert_eq!(c2.call(&["GET", "x"]), Reply::Bulk(b"1".to_vec()));
}

/// The latency monitor samples slow commands as `command` (a script that
/// spins 30 ms), on Ember as on Redis: LATEST names the event with a
/// latency of at least the threshold, HISTORY holds the sample, RESET
/// clears it.
#[test]
fn latency_monitor_samples_slow_commands() {
    let dir = tempfile::tempdir().unwrap();
    let ember = Server::start(dir.path(), &[]);
    let redis = RedisServer::start();
    for port in [ember.port, redis.port] {
        let mut c = Conn::open(port);
        assert_eq!(
            c.call(&["CONFIG", "SET", "latency-monitor-threshold", "5"]),
            Reply::Simple("OK".into())
        );
        let spin = "local t = redis.call('time') local s = t[1] * 1000000 + t[2] \
                    while true do local n = redis.call('time') \
                    if n[1] * 1000000 + n[2] - s > 30000 then break end end return 1";
        assert_eq!(c.call(&["EVAL", spin, "0"]), Reply::Integer(1));
        let Reply::Array(latest) = c.call(&["LATENCY", "LATEST"]) else {
            panic!("LATENCY LATEST");
        };
        // On a loaded machine a fast command (CONFIG SET) may also take
        // 5 ms and be sampled as `fast-command`: only that may come with it.
        let named = |r: &Reply| match r {
            Reply::Array(e) => e.first().cloned(),
            _ => None,
        };
        assert!(
            latest.iter().all(|r| matches!(named(r), Some(Reply::Bulk(n)) if n == b"command" || n == b"fast-command")),
            "{latest:?}"
        );
        let Some(Reply::Array(e)) = latest
            .iter()
            .find(|r| named(r) == Some(Reply::Bulk(b"command".to_vec())))
        else {
            panic!("no `command` event: {latest:?}");
        };
        assert!(matches!(e[2], Reply::Integer(ms) if ms >= 5), "{e:?}");
        let Reply::Array(h) = c.call(&["LATENCY", "HISTORY", "command"]) else {
            panic!("HISTORY");
        };
        assert_eq!(h.len(), 1);
        assert_eq!(
            c.call(&["LATENCY", "RESET"]),
            Reply::Integer(latest.len() as i64)
        );
        assert_eq!(c.call(&["LATENCY", "LATEST"]), Reply::Array(vec![]));
    }
}

/// DEBUG OBJECT: Redis's fields, the same encodings as Redis, the same
/// serialized length for a plain string, the same error for a missing key;
/// DEBUG RELOAD is accepted.
#[test]
fn debug_object_matches_redis() {
    let dir = tempfile::tempdir().unwrap();
    let ember = Server::start(dir.path(), &["--enable-debug-command", "yes"]);
    let redis = RedisServer::start_with(&["--enable-debug-command", "yes"]);
    let field = |line: &str, name: &str| -> String {
        line.split(' ')
            .find_map(|f| f.strip_prefix(&format!("{name}:")))
            .unwrap_or_else(|| panic!("no {name} in {line}"))
            .to_string()
    };
    let mut lines = Vec::new();
    for port in [ember.port, redis.port] {
        let mut c = Conn::open(port);
        c.call(&["SET", "s", "hello"]);
        c.call(&["SET", "n", "12345"]);
        c.call(&["RPUSH", "l", "a", "b"]);
        c.call(&["HSET", "h", "f", "v"]);
        c.call(&["SADD", "i", "1", "2"]);
        c.call(&["ZADD", "z", "1", "m"]);
        assert_eq!(
            c.call(&["DEBUG", "OBJECT", "nosuch"]),
            Reply::Error("ERR no such key".into())
        );
        assert_eq!(c.call(&["DEBUG", "RELOAD"]), Reply::Simple("OK".into()));
        let mut got = Vec::new();
        for k in ["s", "n", "l", "h", "i", "z"] {
            let Reply::Simple(l) = c.call(&["DEBUG", "OBJECT", k]) else {
                panic!("DEBUG OBJECT {k}");
            };
            assert!(l.starts_with("Value at:"), "{l}");
            for f in ["refcount", "serializedlength", "lru", "lru_seconds_idle"] {
                field(&l, f);
            }
            got.push(l);
        }
        lines.push(got);
    }
    for (e, r) in lines[0].iter().zip(&lines[1]) {
        assert_eq!(field(e, "encoding"), field(r, "encoding"), "{e} / {r}");
        assert_eq!(field(e, "refcount"), field(r, "refcount"), "{e} / {r}");
    }
    assert_eq!(
        field(&lines[0][0], "serializedlength"),
        field(&lines[1][0], "serializedlength")
    );
}

/// A monitor that stops reading is closed at the pubsub output limit
/// instead of buffering every command.
#[test]
fn a_monitor_that_does_not_read_is_closed() {
    let dir = tempfile::tempdir().unwrap();
    let ember = Server::start(dir.path(), &["--threads", "2"]);
    let mut c = Conn::open(ember.port);
    assert_eq!(
        c.call(&[
            "CONFIG",
            "SET",
            "client-output-buffer-limit",
            "pubsub 1mb 0 0"
        ]),
        Reply::Simple("OK".into())
    );
    let mut m = Conn::open(ember.port);
    assert_eq!(m.call(&["MONITOR"]), Reply::Simple("OK".into()));
    let s = m.into_stream();
    // The monitor's socket buffers fill first; then its output grows.
    let big = "x".repeat(16 * 1024);
    for i in 0..2000 {
        c.call(&["SET", &format!("k{i}"), &big]);
    }
    let mut con = ember.client();
    let closed: u64 = serve_common::info_field(
        &mut con,
        "stats",
        "client_output_buffer_limit_disconnections",
    )
    .parse()
    .unwrap();
    assert!(closed >= 1, "the monitor was not closed");
    drop(s);
}

/// DEBUG PROTOCOL: every type's test value byte for byte as redis-server
/// sends it, in RESP2 and RESP3 (an attribute before its reply, a push
/// before its reply, RESP2's refusal of a push, the error for a bad name).
#[test]
fn debug_protocol_matches_redis_byte_for_byte() {
    use std::io::{Read, Write};
    let dir = tempfile::tempdir().unwrap();
    let ember = Server::start(dir.path(), &["--enable-debug-command", "yes"]);
    let redis = RedisServer::start_with(&["--enable-debug-command", "yes"]);
    let types = [
        "string", "integer", "double", "bignum", "null", "array", "set", "map", "attrib", "push",
        "verbatim", "true", "false", "bogus",
    ];
    // What a request's replies are, read until a PING sent after it
    // answers (so a reply of two frames is read whole).
    let replies = |port: u16, resp3: bool| -> Vec<Vec<u8>> {
        let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.set_read_timeout(Some(std::time::Duration::from_secs(10)))
            .unwrap();
        let read_until_pong = |s: &mut std::net::TcpStream| {
            let mut got = Vec::new();
            let mut chunk = [0u8; 4096];
            while !got.ends_with(b"+PONG\r\n") {
                let n = s.read(&mut chunk).unwrap();
                assert!(n > 0, "closed");
                got.extend_from_slice(&chunk[..n]);
            }
            got.truncate(got.len() - b"+PONG\r\n".len());
            got
        };
        if resp3 {
            s.write_all(b"HELLO 3\r\nPING\r\n").unwrap();
            read_until_pong(&mut s);
        }
        types
            .iter()
            .map(|t| {
                s.write_all(format!("DEBUG PROTOCOL {t}\r\nPING\r\n").as_bytes())
                    .unwrap();
                read_until_pong(&mut s)
            })
            .collect()
    };
    for resp3 in [false, true] {
        let (e, r) = (replies(ember.port, resp3), replies(redis.port, resp3));
        for ((t, e), r) in types.iter().zip(e).zip(r) {
            assert_eq!(
                String::from_utf8_lossy(&e),
                String::from_utf8_lossy(&r),
                "DEBUG PROTOCOL {t} (RESP3: {resp3})"
            );
        }
    }
}

/// DEBUG SET-ACTIVE-EXPIRE 0 stops the background expiry (a key past its
/// time nobody reads is still counted), 1 starts it again, as in Redis.
#[test]
fn debug_set_active_expire_stops_and_restarts_background_expiry() {
    let dir = tempfile::tempdir().unwrap();
    let ember = Server::start(dir.path(), &["--enable-debug-command", "yes"]);
    let redis = RedisServer::start_with(&["--enable-debug-command", "yes"]);
    // Ember recounts its keys after a start (counting no expired key):
    // the test's key is set once that is done.
    let t = std::time::Instant::now();
    while !ember.log().contains("key counts recounted") {
        assert!(t.elapsed() < Duration::from_secs(10), "{}", ember.log());
        std::thread::sleep(Duration::from_millis(10));
    }
    for (port, who) in [(ember.port, "ember"), (redis.port, "redis")] {
        let mut c = Conn::open(port);
        let ok = Reply::Simple("OK".into());
        assert_eq!(c.call(&["DEBUG", "SET-ACTIVE-EXPIRE", "0"]), ok);
        assert_eq!(c.call(&["SET", "k", "v", "PX", "30"]), ok);
        std::thread::sleep(Duration::from_millis(400));
        assert_eq!(c.call(&["DBSIZE"]), Reply::Integer(1), "{who}");
        assert_eq!(c.call(&["DEBUG", "SET-ACTIVE-EXPIRE", "1"]), ok);
        let t = std::time::Instant::now();
        while c.call(&["DBSIZE"]) != Reply::Integer(0) {
            assert!(t.elapsed() < Duration::from_secs(10), "{who}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}
