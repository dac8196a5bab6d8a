//! The blocking list commands (BLPOP, BRPOP, BLMOVE, BRPOPLPUSH, BLMPOP)
//! against the real `ember serve` with two workers (connections are handed
//! to the workers in turn, so consecutive connections wait on different
//! workers and their wake-ups cross threads):
//!
//! - `immediate_forms_and_errors_match_redis`: what does not wait (data
//!   present, errors, short timeouts in RESP2 and RESP3, CLIENT UNBLOCK's
//!   errors) compared byte for byte with a real `redis-server`;
//! - FIFO wake-ups across workers, a push of n elements serving n clients,
//!   BLMOVE chains, BLMPOP's count, the first key in argument order;
//! - timeouts, CLIENT UNBLOCK TIMEOUT and ERROR, pipelined requests held
//!   behind a blocked one, disconnects, INFO `blocked_clients` and CLIENT
//!   LIST's `b` flag;
//! - a key that became another type keeps its clients waiting; FLUSHALL
//!   wakes nobody; RENAME of a list onto the key wakes; BLMOVE onto a key
//!   of another type is the woken client's WRONGTYPE;
//! - the pop done for a woken client is durable once its reply arrives
//!   (SIGKILL right after, then restart);
//! - the `redis` crate's BLPOP with a timeout.
//!
//! Nothing here sleeps to let something happen: a test waits (up to a
//! minute) for INFO `blocked_clients` to reach the count it needs before it
//! pushes, and reads replies with long read timeouts.

mod serve_common;

use proto::{encode_request, parse_reply, split_args, Reply};
use serve_common::redis_server::RedisServer;
use serve_common::Server;
use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::time::{Duration, Instant};

/// A raw RESP connection that can send without waiting for the reply.
struct Conn {
    s: TcpStream,
    buf: Vec<u8>,
}

impl Conn {
    fn open(port: u16) -> Conn {
        let s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        s.set_nodelay(true).unwrap();
        Conn { s, buf: Vec::new() }
    }

    fn send(&mut self, line: &str) {
        let mut req = Vec::new();
        encode_request(&split_args(line.as_bytes()).unwrap(), &mut req);
        self.s.write_all(&req).unwrap();
    }

    /// The next reply, parsed and as its raw bytes.
    fn read_raw(&mut self) -> (Reply, Vec<u8>) {
        let mut chunk = [0u8; 16384];
        loop {
            if let Some((r, n)) = parse_reply(&self.buf).unwrap() {
                let raw = self.buf.drain(..n).collect();
                return (r, raw);
            }
            let n = self.s.read(&mut chunk).expect("read a reply");
            assert!(n > 0, "the server closed the connection");
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }

    fn read(&mut self) -> Reply {
        self.read_raw().0
    }

    fn call(&mut self, line: &str) -> Reply {
        self.send(line);
        self.read()
    }

    fn call_raw(&mut self, line: &str) -> Vec<u8> {
        self.send(line);
        self.read_raw().1
    }

    fn int(&mut self, line: &str) -> i64 {
        match self.call(line) {
            Reply::Integer(n) => n,
            r => panic!("{line}: {r:?}"),
        }
    }
}

fn bulk(s: &str) -> Reply {
    Reply::Bulk(s.as_bytes().to_vec())
}

fn arr(items: Vec<Reply>) -> Reply {
    Reply::Array(items)
}

/// BLPOP's reply: the key and the element.
fn kv(k: &str, v: &str) -> Reply {
    arr(vec![bulk(k), bulk(v)])
}

fn blocked_clients(c: &mut Conn) -> usize {
    let Reply::Bulk(info) = c.call("INFO clients") else {
        panic!("INFO clients")
    };
    let info = String::from_utf8(info).unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("blocked_clients:"))
        .expect("blocked_clients")
        .trim()
        .parse()
        .unwrap()
}

/// Waits until exactly `n` clients are blocked.
fn wait_blocked(c: &mut Conn, n: usize) {
    let t = Instant::now();
    loop {
        let got = blocked_clients(c);
        if got == n {
            return;
        }
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "blocked_clients stayed {got}, waiting for {n}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Sends `line` (a blocking request) on a new connection and waits until
/// the server counts `blocked` blocked clients.
fn block(port: u16, admin: &mut Conn, line: &str, blocked: usize) -> Conn {
    let mut c = Conn::open(port);
    c.send(line);
    wait_blocked(admin, blocked);
    c
}

fn start() -> (tempfile::TempDir, Server) {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), &[]);
    (dir, s)
}

/// Requests whose replies do not depend on timing (timeouts are short and
/// on keys nobody pushes to), run on both servers in order on one
/// connection; `# reset` starts a new connection (RESP2 again).
const IMMEDIATE: &str = r#"
RPUSH l a b c d
BLPOP l 0
BRPOP l 0
BLPOP nokey l 1
BRPOP nokey l nokey2 0
RPUSH l2 x
BLPOP l2 l 0
BLPOP nokey 0.01
BRPOP nokey nokey2 0.01
BLPOP nokey -0.0001x
RPUSH m 1 2 3 4 5
BLMOVE m n LEFT RIGHT 0
BLMOVE m n RIGHT LEFT 0
BLMOVE m n left left 0
BLMOVE m n right right 0
BLMOVE m m LEFT RIGHT 0
LRANGE m 0 -1
LRANGE n 0 -1
BRPOPLPUSH m n 0
BRPOPLPUSH m n 0.01
BRPOPLPUSH nokey n 0.01
BLMOVE nokey n LEFT LEFT 0.01
LRANGE n 0 -1
RPUSH p 1 2 3 4 5
BLMPOP 0 2 nokey p LEFT
BLMPOP 0 2 nokey p RIGHT COUNT 2
BLMPOP 0 1 p LEFT COUNT 10
BLMPOP 0.01 1 p LEFT
BLMPOP 0.01 2 p q RIGHT COUNT 3
SET s str
BLPOP s 0
BLPOP nokey s 0
RPUSH l3 v
BLPOP l3 s 0
BRPOP s l3 0
BLMOVE s n LEFT LEFT 0
RPUSH l4 v
BLMOVE l4 s LEFT LEFT 0
LRANGE l4 0 -1
BRPOPLPUSH l4 s 0
BLMPOP 0 2 nokey s LEFT
BLPOP
BLPOP k
BRPOP k
BLMOVE a b LEFT LEFT
BRPOPLPUSH a b
BLMPOP 0 1 a
BLMPOP 0 1
BLPOP k abc
BLPOP k ""
BLPOP k " 1"
BLPOP k nan
BLPOP k -1
BLPOP k -0.001x
BLPOP k inf
BLPOP k -inf
BLPOP k 1e16
BLPOP s abc
BLMOVE a b UP LEFT abc
BLMOVE a b LEFT DOWN 0
BLMOVE a b LEFT LEFT abc
BLMOVE a b LEFT LEFT -1
BRPOPLPUSH a b abc
BRPOPLPUSH a b -5
BLMPOP abc 0 a LEFT
BLMPOP abc x a LEFT
BLMPOP abc -1 a LEFT
BLMPOP abc 1 a UP
BLMPOP abc 1 a LEFT COUNT 0
BLMPOP abc 1 a LEFT COUNT -1
BLMPOP abc 1 a LEFT COUNT x
BLMPOP abc 1 a LEFT COUNT 1 COUNT 1
BLMPOP abc 1 a LEFT EXTRA
BLMPOP abc 5 a LEFT
BLMPOP -1 1 a LEFT
BLMPOP abc 1 a LEFT COUNT 2
COMMAND GETKEYS BLPOP a b c 0
COMMAND GETKEYS BLMOVE a b LEFT LEFT 0
COMMAND GETKEYS BLMPOP 0 2 a b LEFT COUNT 2
CLIENT UNBLOCK
CLIENT UNBLOCK 1 2 3
CLIENT UNBLOCK x foo
CLIENT UNBLOCK x
CLIENT UNBLOCK 999999
CLIENT UNBLOCK 999999 error
CLIENT UNBLOCK 999999 TIMEOUT
CLIENT UNBLOCK -1
ZADD z 1 a 2 b 3 c 4 d
BZPOPMIN z 0
BZPOPMAX z 0
BZPOPMIN nokey z 0.01
BZPOPMAX nokey nokey2 0.01
BZPOPMIN s 0
BZPOPMIN nokey s 0
RPUSH l5 v
BZPOPMIN l5 0
BZPOPMIN z abc
BZPOPMIN z -1
BZPOPMIN
BZPOPMIN z
ZADD z2 5 x 6 y 7 w
BZMPOP 0 2 nokey z2 MIN
BZMPOP 0 2 nokey z2 MAX COUNT 5
BZMPOP 0.01 1 z2 MIN
BZMPOP 0 1 s MIN
BZMPOP abc 1 z2 MIN
BZMPOP 0 0 z2 MIN
BZMPOP 0 1 z2 MID
BZMPOP 0 1 z2 MIN COUNT 0
BZMPOP 0 1 z2 MIN COUNT 1 COUNT 1
BZMPOP -1 1 z2 MIN
COMMAND GETKEYS BZMPOP 0 2 a b MIN COUNT 2
COMMAND GETKEYS BZPOPMIN a b 0
# reset
HELLO 3
ZADD z3 1.5 a 2.5 b 3 c
BZPOPMIN z3 0
BZMPOP 0 1 z3 MAX COUNT 5
BZPOPMAX nokey 0.01
BZMPOP 0.01 1 nokey MIN
BLPOP nokey 0.01
BLMOVE nokey n LEFT LEFT 0.01
BRPOPLPUSH nokey n 0.01
BLMPOP 0.01 1 nokey LEFT
RPUSH r 1 2 3
BLPOP r 0
BLMPOP 0 1 r RIGHT COUNT 5
"#;

#[test]
fn immediate_forms_and_errors_match_redis() {
    let redis = RedisServer::start();
    let (_dir, ember) = start();
    let (mut r, mut e) = (Conn::open(redis.port), Conn::open(ember.port));
    let mut diffs = Vec::new();
    let mut n = 0;
    for line in IMMEDIATE.lines().map(str::trim).filter(|l| !l.is_empty()) {
        if line == "# reset" {
            r = Conn::open(redis.port);
            e = Conn::open(ember.port);
            continue;
        }
        if line.starts_with("HELLO") {
            // The server's version and client id differ: only the protocol.
            r.call(line);
            e.call(line);
            continue;
        }
        n += 1;
        let (want, got) = (r.call_raw(line), e.call_raw(line));
        if want != got {
            diffs.push(format!(
                "{line}\n  redis: {:?}\n  ember: {:?}",
                String::from_utf8_lossy(&want),
                String::from_utf8_lossy(&got)
            ));
        }
    }
    println!("serve_blocking: {n} requests compared with redis-server");
    assert!(
        diffs.is_empty(),
        "{} of {n} differ:\n{}",
        diffs.len(),
        diffs.join("\n")
    );
}

#[test]
fn clients_are_served_in_arrival_order_across_workers() {
    let (_dir, s) = start();
    let mut admin = Conn::open(s.port);
    let mut waiters: Vec<Conn> = (0..4)
        .map(|i| block(s.port, &mut admin, "BLPOP q 0", i + 1))
        .collect();
    // One push of two elements serves the first two, in order.
    assert_eq!(admin.int("RPUSH q a b"), 2);
    assert_eq!(waiters[0].read(), kv("q", "a"));
    assert_eq!(waiters[1].read(), kv("q", "b"));
    wait_blocked(&mut admin, 2);
    // Three elements for the last two: one is left.
    assert_eq!(admin.int("RPUSH q c d e"), 3);
    assert_eq!(waiters[2].read(), kv("q", "c"));
    assert_eq!(waiters[3].read(), kv("q", "d"));
    wait_blocked(&mut admin, 0);
    assert_eq!(admin.call("LRANGE q 0 -1"), arr(vec![bulk("e")]));
    // The served connections go on as usual.
    for w in &mut waiters {
        assert_eq!(w.call("PING"), Reply::Simple("PONG".into()));
    }
    // BRPOP waits as well, and a waiter on several keys is served from the
    // key that got data.
    let mut w1 = block(s.port, &mut admin, "BRPOP x y 0", 1);
    let mut w2 = block(s.port, &mut admin, "BLPOP y x 0", 2);
    admin.int("RPUSH y 1 2");
    assert_eq!(w1.read(), kv("y", "2"));
    assert_eq!(w2.read(), kv("y", "1"));
    wait_blocked(&mut admin, 0);
}

#[test]
fn sorted_set_pops_wait_for_members() {
    let (_dir, s) = start();
    let mut admin = Conn::open(s.port);
    let mut c1 = block(s.port, &mut admin, "BZPOPMIN z 0", 1);
    let mut c2 = block(s.port, &mut admin, "BZPOPMAX nokey z 0", 2);
    let mut c3 = block(s.port, &mut admin, "BZMPOP 0 1 z MIN COUNT 2", 3);
    // A list push to the key wakes nobody (another type for these waiters).
    let mut l = block(s.port, &mut admin, "BLPOP z 0", 4);
    assert_eq!(admin.int("ZADD z 1 a 2 b 3 c 4 d 5 e"), 5);
    assert_eq!(c1.read(), arr(vec![bulk("z"), bulk("a"), bulk("1")]));
    assert_eq!(c2.read(), arr(vec![bulk("z"), bulk("e"), bulk("5")]));
    assert_eq!(
        c3.read(),
        arr(vec![
            bulk("z"),
            arr(vec![
                arr(vec![bulk("b"), bulk("2")]),
                arr(vec![bulk("c"), bulk("3")])
            ])
        ])
    );
    wait_blocked(&mut admin, 1);
    assert_eq!(admin.call("ZRANGE z 0 -1"), arr(vec![bulk("d")]));
    // The list waiter is served once the key is a list.
    admin.int("DEL z");
    admin.int("RPUSH z v");
    assert_eq!(l.read(), kv("z", "v"));
    wait_blocked(&mut admin, 0);
}

#[test]
fn blmove_chains_and_blmpop_counts() {
    let (_dir, s) = start();
    let mut admin = Conn::open(s.port);
    let mut c1 = block(s.port, &mut admin, "BLMOVE a b LEFT RIGHT 0", 1);
    let mut c2 = block(s.port, &mut admin, "BRPOPLPUSH b c 0", 2);
    let mut c3 = block(s.port, &mut admin, "BLMPOP 0 2 nokey c RIGHT COUNT 5", 3);
    admin.int("LPUSH a x");
    assert_eq!(c1.read(), bulk("x"));
    assert_eq!(c2.read(), bulk("x"));
    assert_eq!(c3.read(), arr(vec![bulk("c"), arr(vec![bulk("x")])]));
    wait_blocked(&mut admin, 0);
    assert_eq!(admin.int("EXISTS a b c"), 0);
    // A push of three to a BLMPOP COUNT 2 client: two, from the right.
    let mut c4 = block(s.port, &mut admin, "BLMPOP 0 1 d RIGHT COUNT 2", 1);
    admin.int("RPUSH d 1 2 3");
    assert_eq!(
        c4.read(),
        arr(vec![bulk("d"), arr(vec![bulk("3"), bulk("2")])])
    );
    assert_eq!(admin.call("LRANGE d 0 -1"), arr(vec![bulk("1")]));
    // BLMOVE whose destination became another type: the woken client's
    // reply is WRONGTYPE and the source keeps its element, as in Redis.
    let mut c5 = block(s.port, &mut admin, "BLMOVE src dst LEFT LEFT 0", 1);
    admin.call("SET dst str");
    admin.int("RPUSH src v");
    match c5.read() {
        Reply::Error(e) => assert!(e.starts_with("WRONGTYPE"), "{e}"),
        r => panic!("{r:?}"),
    }
    assert_eq!(admin.call("LRANGE src 0 -1"), arr(vec![bulk("v")]));
    wait_blocked(&mut admin, 0);
}

#[test]
fn timeouts_reply_null_in_resp2_and_resp3() {
    let (_dir, s) = start();
    for (hello, want) in [(None, &b"*-1\r\n"[..]), (Some("HELLO 3"), &b"_\r\n"[..])] {
        for line in [
            "BLPOP t1 t2 0.2",
            "BRPOP t1 0.2",
            "BLMOVE t1 t2 LEFT LEFT 0.2",
            "BRPOPLPUSH t1 t2 0.2",
            "BLMPOP 0.2 1 t1 LEFT",
        ] {
            let mut c = Conn::open(s.port);
            if let Some(h) = hello {
                c.call(h);
            }
            let t = Instant::now();
            assert_eq!(c.call_raw(line), want, "{line} ({hello:?})");
            assert!(t.elapsed() >= Duration::from_millis(200), "{line}");
        }
    }
    let mut admin = Conn::open(s.port);
    wait_blocked(&mut admin, 0);
}

#[test]
fn client_unblock_and_pipelined_requests() {
    let (_dir, s) = start();
    let mut admin = Conn::open(s.port);
    // TIMEOUT (the default): the timeout's reply; then the requests that
    // were pipelined behind the blocked one run.
    let mut c = Conn::open(s.port);
    let id = c.int("CLIENT ID");
    let mut req = Vec::new();
    for line in ["BLPOP z 0", "RPUSH after 1", "PING"] {
        encode_request(&split_args(line.as_bytes()).unwrap(), &mut req);
    }
    c.s.write_all(&req).unwrap();
    wait_blocked(&mut admin, 1);
    // Held behind BLPOP: not run yet.
    assert_eq!(admin.int("EXISTS after"), 0);
    let list = match admin.call("CLIENT LIST") {
        Reply::Bulk(b) | Reply::Verbatim { text: b, .. } => String::from_utf8(b).unwrap(),
        r => panic!("{r:?}"),
    };
    let line = list
        .lines()
        .find(|l| l.starts_with(&format!("id={id} ")))
        .unwrap();
    assert!(
        line.contains(" flags=b ") && line.contains(" cmd=blpop "),
        "{line}"
    );
    assert_eq!(admin.int(&format!("CLIENT UNBLOCK {id}")), 1);
    assert_eq!(c.read(), Reply::NullArray);
    assert_eq!(c.read(), Reply::Integer(1));
    assert_eq!(c.read(), Reply::Simple("PONG".into()));
    assert_eq!(admin.int(&format!("CLIENT UNBLOCK {id}")), 0);
    wait_blocked(&mut admin, 0);
    // ERROR: the UNBLOCKED error.
    let mut c2 = Conn::open(s.port);
    let id2 = c2.int("CLIENT ID");
    c2.send("BLMOVE z y LEFT LEFT 100");
    wait_blocked(&mut admin, 1);
    assert_eq!(admin.int(&format!("CLIENT UNBLOCK {id2} ERROR")), 1);
    assert_eq!(
        c2.read_raw().1,
        b"-UNBLOCKED client unblocked via CLIENT UNBLOCK\r\n"
    );
    // Not blocked any more: nothing to unblock, and no wake-up takes an
    // element for it.
    wait_blocked(&mut admin, 0);
    admin.int("RPUSH z 1");
    assert_eq!(admin.int("LLEN z"), 1);
    assert_eq!(c2.call("PING"), Reply::Simple("PONG".into()));
}

#[test]
fn disconnected_clients_stop_waiting() {
    let (_dir, s) = start();
    let mut admin = Conn::open(s.port);
    let c1 = block(s.port, &mut admin, "BLPOP d 0", 1);
    let c2 = block(s.port, &mut admin, "BRPOP d 0", 2);
    let mut c3 = block(s.port, &mut admin, "BLPOP d 0", 3);
    drop(c1);
    // Half-closed: the peer will send nothing more.
    c2.s.shutdown(Shutdown::Write).unwrap();
    wait_blocked(&mut admin, 1);
    // The one left is served; the closed ones took nothing.
    admin.int("RPUSH d x y");
    assert_eq!(c3.read(), kv("d", "x"));
    assert_eq!(admin.call("LRANGE d 0 -1"), arr(vec![bulk("y")]));
    wait_blocked(&mut admin, 0);
    // Many clients that come and go leave nothing behind.
    for _ in 0..20 {
        let c = block(s.port, &mut admin, "BLPOP e f g 0", 1);
        drop(c);
        wait_blocked(&mut admin, 0);
    }
    admin.int("RPUSH e 1");
    assert_eq!(admin.int("LLEN e"), 1);
}

#[test]
fn other_types_and_flushes_wake_nobody() {
    let (_dir, s) = start();
    let mut admin = Conn::open(s.port);
    let mut c = block(s.port, &mut admin, "BLPOP k 0", 1);
    let mut z = block(s.port, &mut admin, "BLPOP other 0", 2);
    // The key becomes a string, a hash, is deleted, flushed: still waiting
    // (Redis 7.0).
    admin.call("SET k str");
    admin.call("DEL k");
    admin.call("HSET k f v");
    admin.call("FLUSHALL");
    admin.call("FLUSHDB");
    // Time for the wake-up attempts those writes caused: still waiting.
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(blocked_clients(&mut admin), 2);
    // Another database's key of the same name wakes nobody.
    admin.call("SELECT 1");
    admin.int("RPUSH k elsewhere");
    admin.call("SELECT 0");
    admin.int("RPUSH other o");
    assert_eq!(z.read(), kv("other", "o"));
    assert_eq!(blocked_clients(&mut admin), 1);
    admin.int("RPUSH k v");
    assert_eq!(c.read(), kv("k", "v"));
    wait_blocked(&mut admin, 0);
    // A list that arrives by RENAME wakes its waiters as a push does.
    let mut r = block(s.port, &mut admin, "BRPOP dest 0", 1);
    admin.int("RPUSH tmp 1 2");
    admin.call("RENAME tmp dest");
    assert_eq!(r.read(), kv("dest", "2"));
    wait_blocked(&mut admin, 0);
}

#[test]
fn a_woken_pop_is_durable_when_its_reply_arrives() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = Server::start(dir.path(), &[]);
    let mut admin = Conn::open(s.port);
    let mut c = block(s.port, &mut admin, "BLMOVE src dst RIGHT LEFT 0", 1);
    admin.int("RPUSH src a b");
    assert_eq!(c.read(), bulk("b"));
    s.kill9();
    s.restart();
    let mut admin = Conn::open(s.port);
    assert_eq!(admin.call("LRANGE src 0 -1"), arr(vec![bulk("a")]));
    assert_eq!(admin.call("LRANGE dst 0 -1"), arr(vec![bulk("b")]));
}

#[test]
fn redis_crate_blpop_with_a_timeout() {
    let (_dir, s) = start();
    let mut con = s.client();
    let t = Instant::now();
    let none: Option<(String, String)> = redis::cmd("BLPOP")
        .arg("rk")
        .arg(0.25)
        .query(&mut con)
        .unwrap();
    assert_eq!(none, None);
    assert!(t.elapsed() >= Duration::from_millis(250));
    let port = s.port;
    let h = std::thread::spawn(move || {
        let c = redis::Client::open(format!("redis://127.0.0.1:{port}/")).unwrap();
        let mut con = c.get_connection().unwrap();
        let got: Option<(String, String)> = redis::cmd("BLPOP")
            .arg("rk")
            .arg(60)
            .query(&mut con)
            .unwrap();
        got
    });
    let mut admin = Conn::open(s.port);
    wait_blocked(&mut admin, 1);
    let _: i64 = redis::cmd("RPUSH")
        .arg("rk")
        .arg("hello")
        .query(&mut con)
        .unwrap();
    assert_eq!(h.join().unwrap(), Some(("rk".into(), "hello".into())));
}
