//! Malformed input and limits of `ember serve`: protocol garbage, truncated
//! and split frames, oversized requests, many idle connections, maxclients,
//! pipelining and output buffering, AUTH, SHUTDOWN/SIGTERM, the server
//! commands tools rely on, `--config`, and the metrics endpoint. After every
//! abuse the server must still be running and serving other clients.

mod serve_common;

use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};
use redis::Commands;
use serve_common::Server;
use std::io::{BufRead, BufReader, ErrorKind, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn tmp() -> tempfile::TempDir {
    tempfile::tempdir().unwrap()
}

/// The server is running and serves a SET/GET on a fresh connection.
fn assert_healthy(srv: &mut Server) {
    assert!(srv.running(), "server died:\n{}", srv.log());
    let mut con = srv.client();
    let k = format!("health:{}", rand::rng().random::<u64>());
    let _: () = con.set(&k, "ok").unwrap();
    let v: String = con.get(&k).unwrap();
    assert_eq!(v, "ok");
    let _: () = con.del(&k).unwrap();
}

/// Reads until the peer closes (EOF or reset) or `timeout` passes; returns
/// the bytes and whether the connection was closed.
fn read_to_close(s: &mut TcpStream, timeout: Duration) -> (Vec<u8>, bool) {
    let deadline = Instant::now() + timeout;
    let mut out = Vec::new();
    let mut buf = [0u8; 16384];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return (out, false);
        }
        s.set_read_timeout(Some(left.min(Duration::from_millis(500))))
            .unwrap();
        match s.read(&mut buf) {
            Ok(0) => return (out, true),
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(_) => return (out, true),
        }
    }
}

/// Reads exactly `n` bytes (with a deadline).
fn read_exact_timeout(s: &mut TcpStream, n: usize, timeout: Duration) -> Vec<u8> {
    let deadline = Instant::now() + timeout;
    let mut out = vec![0u8; n];
    let mut got = 0;
    while got < n {
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(!left.is_zero(), "timed out after {got} of {n} bytes");
        s.set_read_timeout(Some(left)).unwrap();
        match s.read(&mut out[got..]) {
            Ok(0) => panic!("connection closed after {got} of {n} bytes"),
            Ok(k) => got += k,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => panic!("read failed after {got} of {n} bytes: {e}"),
        }
    }
    out
}

fn show(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Resident memory of a process, in KiB.
fn rss_kib(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

/// CPU time (user + system) a process used so far, in clock ticks.
fn cpu_ticks(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let after = &s[s.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = after.split_whitespace().collect();
    // Fields 14 and 15 of stat (utime, stime); `after` starts at field 3.
    f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
}

/// One field of INFO.
fn info_field(con: &mut redis::Connection, section: &str, field: &str) -> String {
    let text: String = redis::cmd("INFO").arg(section).query(con).unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .unwrap_or_else(|| panic!("no {field} in INFO {section}:\n{text}"))
        .trim()
        .to_string()
}

fn resp(args: &[&[u8]]) -> Vec<u8> {
    let mut o = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        o.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        o.extend_from_slice(a);
        o.extend_from_slice(b"\r\n");
    }
    o
}

/// A RESP2/RESP3 reply, as far as these tests need to look into one.
#[derive(Debug, Clone, PartialEq)]
enum V {
    Simple(String),
    Err(String),
    Int(i64),
    Bulk(Vec<u8>),
    Null,
    Arr(Vec<V>),
    Map(Vec<(V, V)>),
    Set(Vec<V>),
    Verbatim(String),
    Other(String),
}

fn read_reply(r: &mut BufReader<TcpStream>) -> V {
    let mut line = Vec::new();
    r.read_until(b'\n', &mut line).unwrap();
    assert!(line.ends_with(b"\r\n"), "bad reply line {:?}", show(&line));
    let body = show(&line[1..line.len() - 2]);
    let n = || body.parse::<i64>().unwrap();
    let blob = |r: &mut BufReader<TcpStream>, len: i64| {
        let mut b = vec![0u8; len as usize + 2];
        r.read_exact(&mut b).unwrap();
        b.truncate(len as usize);
        b
    };
    match line[0] {
        b'+' => V::Simple(body),
        b'-' => V::Err(body),
        b':' => V::Int(n()),
        b'_' => V::Null,
        b'$' if n() < 0 => V::Null,
        b'$' => V::Bulk(blob(r, n())),
        b'=' => V::Verbatim(show(&blob(r, n())[4..])),
        b'*' if n() < 0 => V::Null,
        b'*' => V::Arr((0..n()).map(|_| read_reply(r)).collect()),
        b'~' => V::Set((0..n()).map(|_| read_reply(r)).collect()),
        b'%' => V::Map((0..n()).map(|_| (read_reply(r), read_reply(r))).collect()),
        _ => V::Other(show(&line)),
    }
}

/// A raw connection with a reply reader.
struct Raw {
    w: TcpStream,
    r: BufReader<TcpStream>,
}

impl Raw {
    fn new(srv: &Server) -> Raw {
        let w = srv.raw();
        w.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let r = BufReader::new(w.try_clone().unwrap());
        Raw { w, r }
    }
    fn cmd(&mut self, args: &[&str]) -> V {
        let a: Vec<&[u8]> = args.iter().map(|s| s.as_bytes()).collect();
        self.w.write_all(&resp(&a)).unwrap();
        read_reply(&mut self.r)
    }
}

fn bulk_str(v: &V) -> String {
    match v {
        V::Bulk(b) => show(b),
        V::Simple(s) | V::Verbatim(s) => s.clone(),
        other => panic!("not a string: {other:?}"),
    }
}

fn err_text(v: &V) -> &str {
    match v {
        V::Err(e) => e,
        other => panic!("not an error: {other:?}"),
    }
}

// ---------------------------------------------------------------- 1. garbage

#[test]
fn protocol_garbage_gets_redis_errors_and_is_closed() {
    let dir = tmp();
    let mut srv = Server::start(dir.path(), &["--proto-max-bulk-len", "2mb"]);
    // A client connected all along, mid-pipeline, on the same workers.
    let mut bystander = Raw::new(&srv);
    assert_eq!(
        bystander.cmd(&["SET", "by", "stander"]),
        V::Simple("OK".into())
    );
    // (request, exact reply) — each connection is closed after the reply.
    let cases: &[(&[u8], &[u8])] = &[
        (
            b"*abc\r\n",
            b"-ERR Protocol error: invalid multibulk length\r\n",
        ),
        (
            b"*\xff\xfe\x00\r\n",
            b"-ERR Protocol error: invalid multibulk length\r\n",
        ),
        (
            b"*1\r\n$-5\r\n",
            b"-ERR Protocol error: invalid bulk length\r\n",
        ),
        (
            b"*1\r\n$abc\r\n",
            b"-ERR Protocol error: invalid bulk length\r\n",
        ),
        (
            b"*1\r\nxyz\r\n",
            b"-ERR Protocol error: expected '$', got 'x'\r\n",
        ),
        (
            b"SET \"foo bar\r\n",
            b"-ERR Protocol error: unbalanced quotes in request\r\n",
        ),
        (
            b"SET 'a'b c\r\n",
            b"-ERR Protocol error: unbalanced quotes in request\r\n",
        ),
        // One byte over proto-max-bulk-len (2mb here), and far over.
        (
            b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$2097153\r\n",
            b"-ERR Protocol error: invalid bulk length\r\n",
        ),
        (
            b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$536870913\r\n",
            b"-ERR Protocol error: invalid bulk length\r\n",
        ),
        (
            b"*2147483648\r\n",
            b"-ERR Protocol error: invalid multibulk length\r\n",
        ),
        (
            b"*99999999999999999999999\r\n",
            b"-ERR Protocol error: invalid multibulk length\r\n",
        ),
        // Requests before the garbage are answered first.
        (
            b"PING\r\n*1\r\n$4\r\nPING\r\n*x\r\n",
            b"+PONG\r\n+PONG\r\n-ERR Protocol error: invalid multibulk length\r\n",
        ),
    ];
    for (req, want) in cases {
        let mut s = srv.raw();
        s.write_all(req).unwrap();
        let (got, closed) = read_to_close(&mut s, Duration::from_secs(10));
        assert_eq!(show(&got), show(want), "reply to {:?}", show(req));
        assert!(closed, "connection not closed after {:?}", show(req));
    }
    // An HTTP request (cross protocol scripting): closed without a reply, as
    // Redis does for `POST` and `Host:`.
    let mut s = srv.raw();
    s.write_all(b"POST / HTTP/1.1\r\nHost: localhost\r\nContent-Length: 0\r\n\r\n")
        .unwrap();
    let (got, closed) = read_to_close(&mut s, Duration::from_secs(10));
    assert!(got.is_empty() && closed, "{:?}", show(&got));
    assert!(srv.log().contains("SECURITY ATTACK"), "{}", srv.log());
    // Exactly proto-max-bulk-len is fine.
    let mut con = srv.client();
    let max = vec![b'm'; 2 << 20];
    let _: () = con.set("maxbulk", &max[..]).unwrap();
    let n: usize = con.strlen("maxbulk").unwrap();
    assert_eq!(n, 2 << 20);
    // *-N and *0 are empty requests: no reply, the connection goes on.
    let mut s = srv.raw();
    s.write_all(b"*-10\r\n*0\r\n*-1\r\nPING\r\n").unwrap();
    assert_eq!(
        read_exact_timeout(&mut s, 7, Duration::from_secs(10)),
        b"+PONG\r\n"
    );
    // Binary junk on a line is an unknown command, sanitised (no CR/LF inside
    // the error), and the connection stays open; so is a `$` outside a
    // multibulk request (an inline command named "$-5", as in Redis).
    let mut s = srv.raw();
    s.write_all(b"\x01\x02\xfe\x7f junk\r\n$-5\r\nPING\r\n")
        .unwrap();
    let mut r = BufReader::new(s.try_clone().unwrap());
    let e = read_reply(&mut r);
    assert!(err_text(&e).starts_with("ERR unknown command"), "{e:?}");
    assert_eq!(
        read_reply(&mut r),
        V::Err("ERR unknown command '$-5', with args beginning with: ".into())
    );
    assert_eq!(read_reply(&mut r), V::Simple("PONG".into()));
    // An argument with CR LF inside, echoed in an error, stays one line.
    let mut req = resp(&[b"no\r\nsuch", b"a\r\nb"]);
    req.extend_from_slice(b"PING\r\n");
    s.write_all(&req).unwrap();
    let e = read_reply(&mut r);
    assert!(
        err_text(&e).starts_with("ERR unknown command 'no  such'"),
        "{e:?}"
    );
    assert_eq!(read_reply(&mut r), V::Simple("PONG".into()));
    assert_healthy(&mut srv);
    // Random bytes from many clients (seeded), some closing mid-stream: the
    // server answers or closes them, and keeps serving.
    let mut rng = SmallRng::seed_from_u64(0xe3be7);
    let mut socks = Vec::new();
    for i in 0..32 {
        let mut s = srv.raw();
        let n = rng.random_range(1..20_000);
        let mut junk: Vec<u8> = (0..n).map(|_| rng.random::<u8>()).collect();
        if i % 4 == 0 {
            junk[0] = b'*';
        }
        if i % 4 == 1 {
            junk.splice(0..0, b"*3\r\n$3\r\nSET\r\n".iter().copied());
        }
        let _ = s.write_all(&junk);
        if i % 2 == 0 {
            drop(s);
        } else {
            socks.push(s);
        }
    }
    assert_healthy(&mut srv);
    drop(socks);
    assert_healthy(&mut srv);
    assert_eq!(bystander.cmd(&["GET", "by"]), V::Bulk(b"stander".to_vec()));
}

// ---------------------------------------------------------------- 2. truncated

#[test]
fn truncated_and_split_frames() {
    let dir = tmp();
    let mut srv = Server::start(dir.path(), &[]);
    let pid = srv.pid();
    // Cut in the middle of a bulk, then gone: nothing is executed.
    for cut in [1, 5, 12, 20, 27] {
        let req = resp(&[b"SET", b"cut", b"value"]);
        let mut s = srv.raw();
        s.write_all(&req[..cut]).unwrap();
        drop(s);
    }
    // Cut, then the peer shuts down its side: still nothing executed, closed.
    let mut s = srv.raw();
    s.write_all(b"*3\r\n$3\r\nSET\r\n$3\r\ncut\r\n$5\r\nval")
        .unwrap();
    s.shutdown(Shutdown::Write).unwrap();
    let (got, closed) = read_to_close(&mut s, Duration::from_secs(10));
    assert!(got.is_empty() && closed, "{:?}", show(&got));
    let mut con = srv.client();
    let v: Option<String> = con.get("cut").unwrap();
    assert_eq!(v, None);
    // Complete requests followed by a half-close are answered before the
    // close (`printf 'PING\r\n' | nc` style clients).
    let mut s = srv.raw();
    s.write_all(b"SET half closed\r\nGET half\r\n").unwrap();
    s.shutdown(Shutdown::Write).unwrap();
    let (got, closed) = read_to_close(&mut s, Duration::from_secs(10));
    assert_eq!(show(&got), "+OK\r\n$6\r\nclosed\r\n");
    assert!(closed);
    // One byte per write, with pauses: the same replies.
    let mut s = srv.raw();
    s.set_nodelay(true).unwrap();
    let mut req = resp(&[b"SET", b"split", b"by bytes"]);
    req.extend_from_slice(b"GET split\r\n");
    req.extend_from_slice(&resp(&[b"GET", b"split"]));
    for b in &req {
        s.write_all(std::slice::from_ref(b)).unwrap();
        std::thread::sleep(Duration::from_micros(300));
    }
    let want = b"+OK\r\n$8\r\nby bytes\r\n$8\r\nby bytes\r\n";
    assert_eq!(
        show(&read_exact_timeout(
            &mut s,
            want.len(),
            Duration::from_secs(10)
        )),
        show(want)
    );
    // Huge announced lengths and counts followed by little or nothing cost
    // nothing: the server allocates for what arrived, not for what was
    // announced.
    let before = rss_kib(pid);
    let mut held = Vec::new();
    for i in 0..40 {
        let mut s = srv.raw();
        let mut req = b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$536870912\r\n".to_vec();
        if i % 2 == 0 {
            req.extend_from_slice(&[b'x'; 32 * 1024]);
        }
        s.write_all(&req).unwrap();
        held.push(s);
        let mut s = srv.raw();
        s.write_all(b"*2000000000\r\n$3\r\nSET\r\n").unwrap();
        held.push(s);
    }
    // Let the server read all of it.
    let mut con = srv.client();
    let _: String = redis::cmd("PING").query(&mut con).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    let during = rss_kib(pid);
    drop(held);
    assert_healthy(&mut srv);
    let after = rss_kib(pid);
    eprintln!("huge announcements: VmRSS {before} KiB before, {during} KiB with 80 pending, {after} KiB after");
    assert!(
        during < before + 32 * 1024,
        "VmRSS grew from {before} KiB to {during} KiB"
    );
    let v: Option<String> = con.get("k").unwrap();
    assert_eq!(v, None);
    assert_healthy(&mut srv);
}

// ---------------------------------------------------------------- 3. limits

#[test]
fn inline_and_query_buffer_limits() {
    let dir = tmp();
    let mut srv = Server::start(dir.path(), &["--client-query-buffer-limit", "1mb"]);
    // 64 KiB + 1 without a newline: too big inline request. (Exactly that many
    // bytes, so that nothing unread is left when the server closes.)
    let mut s = srv.raw();
    s.write_all(&vec![b'a'; 64 * 1024 + 1]).unwrap();
    let (got, closed) = read_to_close(&mut s, Duration::from_secs(10));
    assert_eq!(
        show(&got),
        "-ERR Protocol error: too big inline request\r\n"
    );
    assert!(closed);
    // A `*` count line or `$` length line without its CR.
    let mut s = srv.raw();
    let mut req = b"*1".to_vec();
    req.extend_from_slice(&vec![b'1'; 64 * 1024]);
    s.write_all(&req).unwrap();
    let (got, closed) = read_to_close(&mut s, Duration::from_secs(10));
    assert_eq!(
        show(&got),
        "-ERR Protocol error: too big mbulk count string\r\n"
    );
    assert!(closed);
    assert_healthy(&mut srv);
    // A 2 MB bulk, announced and half sent, with a 1mb query buffer limit: the
    // client is closed without a reply; other clients are served meanwhile.
    let mut other = srv.client();
    let mut s = srv.raw();
    let mut req = b"*3\r\n$3\r\nSET\r\n$3\r\nbig\r\n$2000000\r\n".to_vec();
    req.extend_from_slice(&vec![b'v'; 1_500_000]);
    let _ = s.write_all(&req); // may fail with a reset once the server closes
    let (got, closed) = read_to_close(&mut s, Duration::from_secs(10));
    assert!(got.is_empty(), "{:?}", show(&got));
    assert!(closed, "client over the query buffer limit not closed");
    let _: () = other.set("qb", "fine").unwrap();
    let v: Option<String> = other.get("big").unwrap();
    assert_eq!(v, None);
    assert!(srv.log().contains("query buffer"), "{}", srv.log());
    // A value under the limit is fine (as in Redis, the limit covers the
    // whole pending request, so a value above it cannot be sent at all).
    let big = vec![b'z'; 900_000];
    let _: () = other.set("big", &big[..]).unwrap();
    let got: Vec<u8> = other.get("big").unwrap();
    assert_eq!(got.len(), big.len());
    assert_healthy(&mut srv);
}

// ---------------------------------------------------------------- 4. many idle

fn set_nofile_soft(n: u64) -> (u64, u64) {
    // SAFETY: getrlimit/setrlimit read and write only the struct passed.
    unsafe {
        let mut r: libc::rlimit = std::mem::zeroed();
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut r), 0);
        let old = (r.rlim_cur, r.rlim_max);
        r.rlim_cur = n.min(r.rlim_max);
        assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &r), 0);
        old
    }
}

fn nofile_soft_of(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let l = s.lines().find(|l| l.starts_with("Max open files")).unwrap();
    l.split_whitespace().nth(3).unwrap().parse().unwrap()
}

#[test]
fn ten_thousand_idle_connections() {
    const IDLE: usize = 10_000;
    let dir = tmp();
    // Start the server with a low soft limit: it must raise its own.
    let (_, hard) = set_nofile_soft(1024);
    let mut srv = Server::start(dir.path(), &["--maxclients", "10100"]);
    set_nofile_soft(hard);
    let pid = srv.pid();
    let soft = nofile_soft_of(pid);
    assert!(
        soft >= hard.min(10_100 + 64),
        "server's RLIMIT_NOFILE soft limit is {soft}"
    );
    if hard < IDLE as u64 + 200 {
        eprintln!("RLIMIT_NOFILE hard limit {hard} is too low for {IDLE} connections; skipped");
        return;
    }
    let rss0 = rss_kib(pid);
    // A client doing SET/GET all along, timing each pair.
    let stop = Arc::new(AtomicBool::new(false));
    let port = srv.port;
    let busy = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let c = redis::Client::open(format!("redis://127.0.0.1:{port}/")).unwrap();
            let mut con = c.get_connection().unwrap();
            con.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            let mut lat = Vec::new();
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let t = Instant::now();
                let _: () = con.set(format!("busy:{}", i % 100), i).unwrap();
                let v: u64 = con.get(format!("busy:{}", i % 100)).unwrap();
                assert_eq!(v, i);
                lat.push(t.elapsed());
                i += 1;
                std::thread::sleep(Duration::from_millis(1));
            }
            lat
        })
    };
    let t = Instant::now();
    let mut idle = Vec::with_capacity(IDLE);
    for i in 0..IDLE {
        match TcpStream::connect(("127.0.0.1", port)) {
            Ok(s) => idle.push(s),
            Err(e) => panic!("connection {i}: {e}"),
        }
    }
    let opened = t.elapsed();
    // Every one of them is served (a PING on a sample answers).
    for s in idle.iter_mut().step_by(500) {
        s.write_all(b"PING\r\n").unwrap();
        assert_eq!(
            read_exact_timeout(s, 7, Duration::from_secs(10)),
            b"+PONG\r\n"
        );
    }
    let mut con = srv.client();
    let t0 = Instant::now();
    loop {
        let n: u64 = info_field(&mut con, "clients", "connected_clients")
            .parse()
            .unwrap();
        if n >= IDLE as u64 + 2 {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(20), "only {n} connected");
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(300));
    let rss1 = rss_kib(pid);
    stop.store(true, Ordering::Relaxed);
    let mut lat = busy.join().unwrap();
    lat.sort();
    let p50 = lat[lat.len() / 2];
    let p99 = lat[lat.len() * 99 / 100];
    let max = *lat.last().unwrap();
    eprintln!(
        "{IDLE} idle connections opened in {opened:?}; busy client: {} SET+GET pairs, p50 {p50:?}, p99 {p99:?}, max {max:?}; server VmRSS {rss0} -> {rss1} KiB",
        lat.len()
    );
    assert!(lat.len() > 20);
    assert!(p50 < Duration::from_millis(20), "p50 {p50:?}");
    assert!(p99 < Duration::from_millis(200), "p99 {p99:?}");
    // Idle connections are cheap: well under 4 KiB each.
    assert!(
        rss1 < rss0 + (IDLE as u64 * 4),
        "VmRSS {rss0} -> {rss1} KiB for {IDLE} idle connections"
    );
    drop(idle);
    let t0 = Instant::now();
    loop {
        let n: u64 = info_field(&mut con, "clients", "connected_clients")
            .parse()
            .unwrap();
        if n <= 2 {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "still {n} connected"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_healthy(&mut srv);
}

// ---------------------------------------------------------------- 5. maxclients

#[test]
fn maxclients_refuses_then_admits() {
    let dir = tmp();
    let mut srv = Server::start(dir.path(), &["--maxclients", "5"]);
    // Take all 5 slots (the harness's readiness probe may still hold one for
    // a moment: retry refused ones).
    let mut held: Vec<TcpStream> = Vec::new();
    let t0 = Instant::now();
    while held.len() < 5 {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "cannot get 5 clients"
        );
        let mut s = srv.raw();
        s.write_all(b"PING\r\n").unwrap();
        let (got, _) = {
            let mut b = [0u8; 7];
            match s.read_exact(&mut b) {
                Ok(()) => (b.to_vec(), false),
                Err(_) => (Vec::new(), true),
            }
        };
        if got == b"+PONG\r\n" {
            held.push(s);
        } else {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    // The 6th: Redis's error, then closed.
    for _ in 0..3 {
        let mut s = srv.raw();
        let (got, closed) = read_to_close(&mut s, Duration::from_secs(10));
        assert_eq!(show(&got), "-ERR max number of clients reached\r\n");
        assert!(closed);
    }
    // The held ones still work.
    for s in &mut held {
        s.write_all(b"PING\r\n").unwrap();
        assert_eq!(
            read_exact_timeout(s, 7, Duration::from_secs(10)),
            b"+PONG\r\n"
        );
    }
    // One leaves: a new one is admitted (once the server has seen the close).
    let q = held.pop().unwrap();
    drop(q);
    let t0 = Instant::now();
    let mut newcomer = loop {
        let mut s = srv.raw();
        s.write_all(b"PING\r\n").unwrap();
        let mut b = [0u8; 7];
        if s.read_exact(&mut b).is_ok() && &b == b"+PONG\r\n" {
            break s;
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "no slot freed");
        std::thread::sleep(Duration::from_millis(20));
    };
    newcomer.write_all(b"SET mc 1\r\nGET mc\r\n").unwrap();
    assert_eq!(
        read_exact_timeout(&mut newcomer, 12, Duration::from_secs(10)),
        b"+OK\r\n$1\r\n1\r\n"
    );
    drop(newcomer);
    drop(held);
    let t0 = Instant::now();
    loop {
        let mut s = srv.raw();
        s.write_all(b"INFO stats\r\n").unwrap();
        let mut r = BufReader::new(s);
        if let V::Bulk(b) = read_reply(&mut r) {
            let text = show(&b);
            assert!(text.contains("rejected_connections:"), "{text}");
            let n: u64 = text
                .lines()
                .find_map(|l| l.strip_prefix("rejected_connections:"))
                .unwrap()
                .trim()
                .parse()
                .unwrap();
            assert!(n >= 3, "{text}");
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(10));
        std::thread::sleep(Duration::from_millis(20));
    }
    // CONFIG SET maxclients raises the limit at runtime.
    let mut con = srv.client();
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxclients")
        .arg("50")
        .query(&mut con)
        .unwrap();
    let many: Vec<redis::Connection> = (0..20).map(|_| srv.client()).collect();
    assert_eq!(many.len(), 20);
    drop(many);
    // More clients than the open file limit allows: refused, as Redis does.
    // SAFETY: getrlimit writes only the struct passed.
    let hard = unsafe {
        let mut r: libc::rlimit = std::mem::zeroed();
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut r);
        r.rlim_max
    };
    if hard != libc::RLIM_INFINITY && hard < 1_000_000 {
        let r: redis::RedisResult<()> = redis::cmd("CONFIG")
            .arg("SET")
            .arg("maxclients")
            .arg("1000000")
            .query(&mut con);
        let e = r.unwrap_err().to_string();
        assert!(
            e.contains("not able to handle the specified number of clients"),
            "{e}"
        );
        let n: Vec<String> = redis::cmd("CONFIG")
            .arg("GET")
            .arg("maxclients")
            .query(&mut con)
            .unwrap();
        assert_eq!(n[1], "50");
    }
    assert_healthy(&mut srv);
}

// ---------------------------------------------------------------- 6. pipelining

#[test]
fn pipelining_and_output_buffering() {
    let dir = tmp();
    // Logs of 16 MiB: the MSET of 50,000 pairs below is one crash-atomic
    // batch of about 3 MB, and a batch must fit in half of a log's room.
    let mut srv = Server::start(dir.path(), &["--log-size", "16mb"]);
    let pid = srv.pid();
    // 10,000 SETs in one write, then 10,000 GETs: every reply, in order.
    const N: usize = 10_000;
    let mut req = Vec::new();
    for i in 0..N {
        req.extend_from_slice(&resp(&[
            b"SET",
            format!("p:{i}").as_bytes(),
            format!("v{i}").as_bytes(),
        ]));
    }
    let mut want = b"+OK\r\n".repeat(N);
    let mut gets = Vec::new();
    for i in 0..N {
        gets.extend_from_slice(&resp(&[b"GET", format!("p:{i}").as_bytes()]));
        let v = format!("v{i}");
        want.extend_from_slice(format!("${}\r\n{v}\r\n", v.len()).as_bytes());
    }
    let mut s = srv.raw();
    let mut w = s.try_clone().unwrap();
    let writer = std::thread::spawn(move || {
        w.write_all(&req).unwrap();
        w.write_all(&gets).unwrap();
    });
    let got = read_exact_timeout(&mut s, want.len(), Duration::from_secs(30));
    writer.join().unwrap();
    assert!(got == want, "pipelined replies differ");
    drop(s);

    // One MSET of 50,000 pairs arriving in 1,000-byte pieces (the server
    // tracks a pending request instead of re-parsing it per read).
    let mut args: Vec<Vec<u8>> = vec![b"MSET".to_vec()];
    for i in 0..50_000 {
        args.push(format!("ms:{i}").into_bytes());
        args.push(format!("{i}").into_bytes());
    }
    let refs: Vec<&[u8]> = args.iter().map(|a| a.as_slice()).collect();
    let req = resp(&refs);
    let mut s = srv.raw();
    s.set_nodelay(true).unwrap();
    let t = Instant::now();
    for piece in req.chunks(1000) {
        s.write_all(piece).unwrap();
    }
    assert_eq!(
        read_exact_timeout(&mut s, 5, Duration::from_secs(30)),
        b"+OK\r\n"
    );
    eprintln!(
        "MSET of 50,000 pairs in 1,000-byte writes: {:?}",
        t.elapsed()
    );
    let mut con = srv.client();
    let v: Vec<i64> = con.mget(&["ms:0", "ms:25000", "ms:49999"]).unwrap();
    assert_eq!(v, [0, 25000, 49999]);
    drop(s);

    // Output buffering: a client pipelines GETs of a 1 MiB value and reads
    // nothing; others are served normally, the server neither spins nor
    // buffers without bound, and the replies all arrive once it reads.
    let val: Vec<u8> = (0..1 << 20).map(|i| b'a' + (i % 26) as u8).collect();
    let _: () = con.set("bigval", &val[..]).unwrap();
    // Let background store work from the writes above finish first, so that
    // the CPU measured below is the stalled client's alone.
    let t0 = Instant::now();
    loop {
        let a = cpu_ticks(pid);
        std::thread::sleep(Duration::from_millis(100));
        if cpu_ticks(pid) - a <= 1 || t0.elapsed() > Duration::from_secs(10) {
            break;
        }
    }
    const GETS: usize = 160;
    let mut greedy = srv.raw();
    let req = resp(&[b"GET", b"bigval"]).repeat(GETS);
    greedy.write_all(&req).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let rss_stalled = rss_kib(pid);
    let ticks0 = cpu_ticks(pid);
    let t = Instant::now();
    let mut worst = Duration::ZERO;
    for i in 0..100 {
        let t1 = Instant::now();
        let _: () = con.set(format!("other:{i}"), i).unwrap();
        let v: i64 = con.get(format!("other:{i}")).unwrap();
        assert_eq!(v, i);
        worst = worst.max(t1.elapsed());
        std::thread::sleep(Duration::from_millis(3));
    }
    let wall = t.elapsed();
    let ticks = cpu_ticks(pid) - ticks0;
    // SAFETY: sysconf has no memory effects.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    let cpu = ticks as f64 / hz;
    eprintln!(
        "stalled reader: others' worst SET+GET {worst:?}; server CPU {cpu:.2}s over {wall:?}; VmRSS {rss_stalled} KiB"
    );
    assert!(worst < Duration::from_millis(500), "worst {worst:?}");
    assert!(
        cpu < wall.as_secs_f64() * 0.5,
        "server used {cpu:.2}s CPU in {wall:?} with one stalled client: spinning?"
    );
    assert!(
        rss_stalled < 512 * 1024,
        "VmRSS {rss_stalled} KiB with one stalled reader"
    );
    // Now read everything: GETS replies, in order, intact.
    let head = format!("${}\r\n", val.len());
    let one = head.len() + val.len() + 2;
    let got = read_exact_timeout(&mut greedy, one * GETS, Duration::from_secs(30));
    for i in 0..GETS {
        let r = &got[i * one..(i + 1) * one];
        assert!(
            r.starts_with(head.as_bytes()) && r[head.len()..one - 2] == val[..],
            "reply {i} differs"
        );
    }
    greedy.write_all(b"PING\r\n").unwrap();
    assert_eq!(
        read_exact_timeout(&mut greedy, 7, Duration::from_secs(10)),
        b"+PONG\r\n"
    );
    // A client that pipelines and disconnects without reading costs nothing.
    let mut gone = srv.raw();
    gone.write_all(&resp(&[b"GET", b"bigval"]).repeat(64))
        .unwrap();
    drop(gone);
    assert_healthy(&mut srv);
}

// ---------------------------------------------------------------- 7. AUTH

#[test]
fn requirepass_auth_and_hello() {
    let dir = tmp();
    let mut srv = Server::start(dir.path(), &["--requirepass", "secret"]);
    let mut c = Raw::new(&srv);
    assert_eq!(
        c.cmd(&["GET", "x"]),
        V::Err("NOAUTH Authentication required.".into())
    );
    assert_eq!(
        c.cmd(&["SET", "x", "1"]),
        V::Err("NOAUTH Authentication required.".into())
    );
    assert_eq!(
        c.cmd(&["AUTH", "wrong"]),
        V::Err("WRONGPASS invalid username-password pair or user is disabled.".into())
    );
    assert_eq!(
        c.cmd(&["AUTH", "nosuchuser", "secret"]),
        V::Err("WRONGPASS invalid username-password pair or user is disabled.".into())
    );
    assert_eq!(
        c.cmd(&["GET", "x"]),
        V::Err("NOAUTH Authentication required.".into())
    );
    assert!(err_text(&c.cmd(&["HELLO", "3"])).starts_with("NOAUTH HELLO must be called"));
    assert_eq!(c.cmd(&["AUTH", "secret"]), V::Simple("OK".into()));
    assert_eq!(c.cmd(&["SET", "x", "1"]), V::Simple("OK".into()));
    // RESET drops the authentication.
    assert_eq!(c.cmd(&["RESET"]), V::Simple("RESET".into()));
    assert_eq!(
        c.cmd(&["GET", "x"]),
        V::Err("NOAUTH Authentication required.".into())
    );
    // HELLO 3 AUTH default secret: authenticated and RESP3 (a map reply).
    let mut h = Raw::new(&srv);
    h.w.write_all(&resp(&[b"HELLO", b"3", b"AUTH", b"default", b"secret"]))
        .unwrap();
    let mut first = [0u8; 1];
    h.r.read_exact(&mut first).unwrap();
    assert_eq!(first[0], b'%', "HELLO 3 reply is not a map");
    // Read the rest of the map.
    let mut rest = Vec::new();
    h.r.read_until(b'\n', &mut rest).unwrap();
    let n: usize = show(&rest).trim().parse().unwrap();
    let mut fields = Vec::new();
    for _ in 0..n {
        fields.push((read_reply(&mut h.r), read_reply(&mut h.r)));
    }
    assert!(
        fields.contains(&(V::Bulk(b"proto".to_vec()), V::Int(3))),
        "{fields:?}"
    );
    assert_eq!(h.cmd(&["GET", "nosuch"]), V::Null);
    h.w.write_all(&resp(&[b"GET", b"nosuch"])).unwrap();
    let mut b = [0u8; 3];
    h.r.read_exact(&mut b).unwrap();
    assert_eq!(&b, b"_\r\n", "RESP3 null");
    assert_eq!(h.cmd(&["GET", "x"]), V::Bulk(b"1".to_vec()));
    // HELLO with a wrong password.
    let mut w = Raw::new(&srv);
    assert!(err_text(&w.cmd(&["HELLO", "3", "AUTH", "default", "nope"])).starts_with("WRONGPASS"));
    assert_eq!(
        w.cmd(&["GET", "x"]),
        V::Err("NOAUTH Authentication required.".into())
    );
    // Before AUTH, Redis's tighter limits: at most 10 arguments and 16 KiB
    // per argument (so an anonymous peer cannot make the server buffer much).
    for (req, want) in [
        (
            b"*11\r\n".to_vec(),
            "-ERR Protocol error: unauthenticated multibulk length\r\n",
        ),
        (
            b"*2\r\n$3\r\nGET\r\n$16385\r\n".to_vec(),
            "-ERR Protocol error: unauthenticated bulk length\r\n",
        ),
        (
            b"*2\r\n$3\r\nGET\r\n$536870913\r\n".to_vec(),
            "-ERR Protocol error: invalid bulk length\r\n",
        ),
    ] {
        let mut s = srv.raw();
        s.write_all(&req).unwrap();
        let (got, closed) = read_to_close(&mut s, Duration::from_secs(10));
        assert_eq!(show(&got), want);
        assert!(closed);
    }
    // After AUTH they do not apply.
    let mut a = Raw::new(&srv);
    assert_eq!(a.cmd(&["AUTH", "secret"]), V::Simple("OK".into()));
    let big = "b".repeat(20_000);
    assert_eq!(
        a.cmd(&["MSET", "m1", "1", "m2", "2", "m3", "3", "m4", "4", "big", &big]),
        V::Simple("OK".into())
    );
    assert_eq!(a.cmd(&["STRLEN", "big"]), V::Int(20_000));
    // The redis crate with a password in the URL works.
    let cl = redis::Client::open(format!("redis://:secret@127.0.0.1:{}/", srv.port)).unwrap();
    let mut con = cl.get_connection().unwrap();
    let v: String = con.get("x").unwrap();
    assert_eq!(v, "1");
    // CONFIG SET requirepass "" lets the clients that never authenticated
    // in; setting it again requires it from new clients.
    let mut anon = Raw::new(&srv);
    assert_eq!(
        anon.cmd(&["GET", "x"]),
        V::Err("NOAUTH Authentication required.".into())
    );
    assert_eq!(
        a.cmd(&["CONFIG", "SET", "requirepass", ""]),
        V::Simple("OK".into())
    );
    assert_eq!(anon.cmd(&["GET", "x"]), V::Bulk(b"1".to_vec()));
    assert_eq!(
        a.cmd(&["CONFIG", "SET", "requirepass", "again"]),
        V::Simple("OK".into())
    );
    let mut fresh = Raw::new(&srv);
    assert_eq!(
        fresh.cmd(&["GET", "x"]),
        V::Err("NOAUTH Authentication required.".into())
    );
    assert_eq!(fresh.cmd(&["AUTH", "again"]), V::Simple("OK".into()));
    assert_eq!(fresh.cmd(&["GET", "x"]), V::Bulk(b"1".to_vec()));
    // In one pipeline: the new password applies from the next command on.
    a.w.write_all(b"CONFIG SET requirepass third\r\nAUTH third\r\n")
        .unwrap();
    assert_eq!(read_reply(&mut a.r), V::Simple("OK".into()));
    assert_eq!(read_reply(&mut a.r), V::Simple("OK".into()));
    assert!(srv.running());
}

// ---------------------------------------------------------------- 8. shutdown

#[test]
fn shutdown_and_sigterm_are_clean() {
    let dir = tmp();
    let mut srv = Server::start(dir.path(), &[]);
    let mut con = srv.client();
    for i in 0..100 {
        let _: () = con.set(format!("sd:{i}"), i).unwrap();
    }
    drop(con);
    // SHUTDOWN: no reply, the connection closes, exit status 0.
    let mut s = srv.raw();
    s.write_all(b"SHUTDOWN\r\n").unwrap();
    let (got, closed) = read_to_close(&mut s, Duration::from_secs(30));
    assert!(closed && got.is_empty(), "{:?}", show(&got));
    assert!(srv.wait_exit(), "SHUTDOWN: non-zero exit\n{}", srv.log());
    assert!(srv.log().contains("shut down"), "{}", srv.log());
    srv.restart();
    assert!(srv.log().contains("clean start"), "{}", srv.log());
    let mut con = srv.client();
    for i in 0..100 {
        let v: i64 = con.get(format!("sd:{i}")).unwrap();
        assert_eq!(v, i);
    }
    let _: () = con.set("after", "sigterm").unwrap();
    // SIGTERM while clients are connected (one of them idle mid-request).
    let mut idle = srv.raw();
    idle.write_all(b"*2\r\n$3\r\nGET").unwrap();
    assert!(srv.terminate(), "SIGTERM: non-zero exit\n{}", srv.log());
    assert!(srv.log().contains("shut down"), "{}", srv.log());
    let (_, closed) = read_to_close(&mut idle, Duration::from_secs(10));
    assert!(closed);
    srv.restart();
    assert!(srv.log().contains("clean start"), "{}", srv.log());
    let mut con = srv.client();
    let v: String = con.get("after").unwrap();
    assert_eq!(v, "sigterm");
    let v: i64 = con.get("sd:99").unwrap();
    assert_eq!(v, 99);
    // SHUTDOWN ABORT with nothing in progress is an error, and the server
    // goes on.
    let r: redis::RedisResult<()> = redis::cmd("SHUTDOWN").arg("ABORT").query(&mut con);
    assert!(r
        .unwrap_err()
        .to_string()
        .contains("No shutdown in progress"));
    assert_healthy(&mut srv);
}

/// A worker busy in a long command (DEBUG SLEEP blocks its worker, as it
/// blocks Redis) cannot keep the process alive: SIGTERM, or SHUTDOWN served
/// by another worker, ends it `shutdown-worker-timeout` (here 2 s) later
/// with status 1, and the next start recovers every acknowledged write.
#[test]
fn shutdown_ends_a_server_whose_worker_is_stuck() {
    for (how, extra) in [
        ("SIGTERM", &["--threads", "1"][..]),
        (
            "SIGTERM",
            &[
                "--threads",
                "2",
                "--durability",
                "msync",
                "--commit-pipeline",
                "yes",
            ][..],
        ),
        ("SHUTDOWN", &["--threads", "2"][..]),
    ] {
        let dir = tmp();
        let mut args = vec![
            "--enable-debug-command",
            "yes",
            "--shutdown-worker-timeout",
            "2",
        ];
        args.extend_from_slice(extra);
        let mut srv = Server::start(dir.path(), &args);
        let mut con = srv.client();
        for i in 0..200 {
            let _: () = con.set(format!("stuck:{i}"), i).unwrap();
        }
        drop(con);
        // Connections go to the workers in turn: with two workers, `other`
        // is served by the worker that does not sleep.
        let mut sleeper = srv.raw();
        let mut other = Raw::new(&srv);
        sleeper.write_all(b"DEBUG SLEEP 600\r\n").unwrap();
        // The sleep has begun once a request behind it on the same
        // connection gets no answer.
        std::thread::sleep(Duration::from_millis(300));
        let t = Instant::now();
        if how == "SIGTERM" {
            // SAFETY: plain kill(2) on our own child's pid.
            unsafe {
                libc::kill(srv.pid() as i32, libc::SIGTERM);
            }
        } else {
            other.w.write_all(b"SHUTDOWN\r\n").unwrap();
        }
        let st = srv.wait_exit_within(Duration::from_secs(30));
        let took = t.elapsed();
        let log = srv.log();
        let st = st.unwrap_or_else(|| panic!("{how} {extra:?}: still running after 30 s\n{log}"));
        assert_eq!(st.code(), Some(1), "{how} {extra:?}: {st:?}\n{log}");
        assert!(
            took >= Duration::from_secs(2) && took < Duration::from_secs(10),
            "{how} {extra:?}: exited after {took:?}\n{log}"
        );
        assert!(
            log.contains("ember-worker-") && log.contains("exiting without a clean shutdown"),
            "{log}"
        );
        let (_, closed) = read_to_close(&mut sleeper, Duration::from_secs(10));
        assert!(
            closed,
            "the sleeping client's connection closed with the process"
        );
        srv.restart();
        assert!(
            srv.log().contains("recovered after a crash"),
            "{}",
            srv.log()
        );
        let mut con = srv.client();
        for i in 0..200 {
            let v: i64 = con.get(format!("stuck:{i}")).unwrap();
            assert_eq!(v, i, "{how} {extra:?}");
        }
        let n: i64 = redis::cmd("DBSIZE").query(&mut con).unwrap();
        assert_eq!(n, 200, "{how} {extra:?}: the key counts are recounted");
        // A clean shutdown with an idle worker still exits 0.
        drop(con);
        assert!(srv.terminate(), "{}", srv.log());
    }
}

/// DEBUG as Redis 7 has it: refused unless `enable-debug-command` allows it
/// (`local`: loopback clients), SLEEP with decimals, HELP.
#[test]
fn debug_command_is_protected_and_sleeps() {
    let dir = tmp();
    let srv = Server::start(dir.path(), &[]);
    let mut r = Raw::new(&srv);
    let e = err_text(&r.cmd(&["DEBUG", "SLEEP", "0"])).to_string();
    assert!(
        e.starts_with(
            "ERR DEBUG command not allowed. If the enable-debug-command option is set to \"local\""
        ),
        "{e}"
    );
    assert_eq!(
        r.cmd(&["CONFIG", "GET", "enable-debug-command"]),
        V::Arr(vec![
            V::Bulk(b"enable-debug-command".to_vec()),
            V::Bulk(b"no".to_vec())
        ])
    );
    let e = err_text(&r.cmd(&["CONFIG", "SET", "enable-debug-command", "yes"])).to_string();
    assert!(e.contains("can't set immutable config"), "{e}");
    drop(r);
    drop(srv);
    let srv = Server::start(dir.path(), &["--enable-debug-command", "local"]);
    let mut r = Raw::new(&srv);
    let t = Instant::now();
    assert_eq!(r.cmd(&["DEBUG", "SLEEP", "0.3"]), V::Simple("OK".into()));
    assert!(t.elapsed() >= Duration::from_millis(300));
    assert_eq!(r.cmd(&["debug", "sleep", "abc"]), V::Simple("OK".into()));
    assert_eq!(r.cmd(&["DEBUG", "SLEEP", "-1"]), V::Simple("OK".into()));
    match r.cmd(&["DEBUG", "HELP"]) {
        V::Arr(lines) => assert!(lines.contains(&V::Simple("SLEEP <seconds>".into()))),
        v => panic!("{v:?}"),
    }
    assert_eq!(
        err_text(&r.cmd(&["DEBUG", "NOPE"])),
        "ERR unknown subcommand or wrong number of arguments for 'NOPE'. Try DEBUG HELP."
    );
    assert_eq!(
        err_text(&r.cmd(&["DEBUG", "SLEEP"])),
        "ERR unknown subcommand or wrong number of arguments for 'SLEEP'. Try DEBUG HELP."
    );
    assert_eq!(
        r.cmd(&["CONFIG", "GET", "shutdown-worker-timeout"]),
        V::Arr(vec![
            V::Bulk(b"shutdown-worker-timeout".to_vec()),
            V::Bulk(b"5".to_vec())
        ])
    );
    assert_eq!(
        r.cmd(&["CONFIG", "SET", "shutdown-worker-timeout", "3"]),
        V::Simple("OK".into())
    );
}

/// A pattern an exponential matcher never finishes on. KEYS and
/// SCAN MATCH answer at once and the server goes on serving.
#[test]
fn keys_with_an_adversarial_pattern_answers_at_once() {
    let dir = tmp();
    let mut srv = Server::start(dir.path(), &["--threads", "1"]);
    let mut s = srv.raw();
    let key = "a".repeat(40);
    let pat = format!("{}b", "a*".repeat(20));
    assert_eq!(pat, "a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*b");
    s.write_all(format!("SET {key} 1\r\n").as_bytes()).unwrap();
    assert_eq!(
        read_exact_timeout(&mut s, 5, Duration::from_secs(10)),
        b"+OK\r\n"
    );
    let t = Instant::now();
    s.write_all(format!("KEYS \"{pat}\"\r\n").as_bytes())
        .unwrap();
    let got = read_exact_timeout(&mut s, 4, Duration::from_secs(2));
    assert_eq!(show(&got), "*0\r\n");
    let mut r = Raw::new(&srv);
    let mut cursor = "0".to_string();
    loop {
        match r.cmd(&["SCAN", &cursor, "MATCH", &pat, "COUNT", "1000"]) {
            V::Arr(v) => {
                assert_eq!(v[1], V::Arr(vec![]));
                cursor = bulk_str(&v[0]);
            }
            v => panic!("{v:?}"),
        }
        if cursor == "0" {
            break;
        }
    }
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    // The same pattern ending in a matches the key.
    let pat_a = format!("{}a", "a*".repeat(20));
    s.write_all(format!("KEYS \"{pat_a}\"\r\n").as_bytes())
        .unwrap();
    let want = format!("*1\r\n$40\r\n{key}\r\n");
    let got = read_exact_timeout(&mut s, want.len(), Duration::from_secs(2));
    assert_eq!(show(&got), want);
    assert_healthy(&mut srv);
}

/// COMMAND LIST FILTERBY as Redis 7 parses it: PATTERN (a nocase glob),
/// ACLCAT, MODULE (Ember has none); FILTERBY is the only option.
#[test]
fn command_list_filterby() {
    let dir = tmp();
    let srv = Server::start(dir.path(), &[]);
    let mut r = Raw::new(&srv);
    let names = |v: V| -> Vec<String> {
        let V::Arr(v) = v else { panic!("{v:?}") };
        let mut n: Vec<String> = v.iter().map(bulk_str).collect();
        n.sort();
        n
    };
    assert_eq!(
        names(r.cmd(&["COMMAND", "LIST", "FILTERBY", "PATTERN", "*EXPIRE*"])),
        [
            "expire",
            "expireat",
            "expiretime",
            "pexpire",
            "pexpireat",
            "pexpiretime"
        ]
    );
    assert_eq!(
        names(r.cmd(&["command", "list", "filterby", "pattern", "[gm]et"])),
        ["get"]
    );
    let strings = names(r.cmd(&["COMMAND", "LIST", "FILTERBY", "ACLCAT", "String"]));
    assert!(strings.contains(&"incrbyfloat".to_string()) && !strings.contains(&"del".to_string()));
    assert_eq!(
        names(r.cmd(&["COMMAND", "LIST", "FILTERBY", "ACLCAT", "nosuch"])),
        Vec::<String>::new()
    );
    assert_eq!(
        names(r.cmd(&["COMMAND", "LIST", "FILTERBY", "MODULE", "x"])),
        Vec::<String>::new()
    );
    let all = names(r.cmd(&["COMMAND", "LIST"]));
    assert!(all.len() > 50 && all.contains(&"keys".to_string()));
    for bad in [
        &["COMMAND", "LIST", "FILTERBY"][..],
        &["COMMAND", "LIST", "FILTERBY", "PATTERN"],
        &["COMMAND", "LIST", "FILTERBY", "NAME", "x"],
        &["COMMAND", "LIST", "FILTERBY", "PATTERN", "x", "y"],
        &["COMMAND", "LIST", "x"],
    ] {
        assert_eq!(err_text(&r.cmd(bad)), "ERR syntax error", "{bad:?}");
    }
    // CONFIG GET: nocase globs, several patterns.
    match r.cmd(&["CONFIG", "GET", "MAXCLIENT?", "[h]z"]) {
        V::Arr(v) => assert_eq!(v.len(), 4, "{v:?}"),
        v => panic!("{v:?}"),
    }
}

// ---------------------------------------------------------------- 9. commands

#[test]
fn connection_and_server_commands() {
    let dir = tmp();
    let mut srv = Server::start(dir.path(), &[]);
    // QUIT: +OK, then closed.
    let mut s = srv.raw();
    s.write_all(b"QUIT\r\nPING\r\n").unwrap();
    let (got, closed) = read_to_close(&mut s, Duration::from_secs(10));
    assert_eq!(show(&got), "+OK\r\n");
    assert!(closed);

    let mut c = Raw::new(&srv);
    assert_eq!(c.cmd(&["SELECT", "15"]), V::Simple("OK".into()));
    assert_eq!(
        c.cmd(&["SELECT", "16"]),
        V::Err("ERR DB index is out of range".into())
    );
    assert_eq!(
        c.cmd(&["SELECT", "-1"]),
        V::Err("ERR DB index is out of range".into())
    );
    assert_eq!(
        c.cmd(&["SELECT", "x"]),
        V::Err("ERR value is not an integer or out of range".into())
    );
    assert_eq!(c.cmd(&["SET", "in15", "yes"]), V::Simple("OK".into()));
    // CLIENT.
    assert_eq!(c.cmd(&["CLIENT", "GETNAME"]), V::Null);
    assert_eq!(
        c.cmd(&["CLIENT", "SETNAME", "robust"]),
        V::Simple("OK".into())
    );
    assert_eq!(c.cmd(&["CLIENT", "GETNAME"]), V::Bulk(b"robust".to_vec()));
    assert!(err_text(&c.cmd(&["CLIENT", "SETNAME", "has space"]))
        .starts_with("ERR Client names cannot contain spaces"));
    let V::Int(id) = c.cmd(&["CLIENT", "ID"]) else {
        panic!()
    };
    assert!(id > 0);
    let list = bulk_str(&c.cmd(&["CLIENT", "LIST"]));
    assert!(
        list.lines().any(|l| l.starts_with(&format!("id={id} "))
            && l.contains(" name=robust ")
            && l.contains(" db=15 ")),
        "{list}"
    );
    let info = bulk_str(&c.cmd(&["CLIENT", "INFO"]));
    assert!(
        info.starts_with(&format!("id={id} ")) && info.contains("name=robust"),
        "{info}"
    );
    let V::Arr(_) = c.cmd(&["CLIENT", "HELP"]) else {
        panic!()
    };
    // RESET: back to db 0, no name, RESP2.
    assert!(matches!(c.cmd(&["HELLO", "3"]), V::Map(_)));
    assert_eq!(c.cmd(&["RESET"]), V::Simple("RESET".into()));
    assert_eq!(c.cmd(&["CLIENT", "GETNAME"]), V::Null);
    assert_eq!(c.cmd(&["GET", "in15"]), V::Null);
    assert_eq!(c.cmd(&["SELECT", "15"]), V::Simple("OK".into()));
    assert_eq!(c.cmd(&["GET", "in15"]), V::Bulk(b"yes".to_vec()));
    // CONFIG.
    assert_eq!(
        c.cmd(&["CONFIG", "SET", "maxclients", "1234"]),
        V::Simple("OK".into())
    );
    assert_eq!(
        c.cmd(&["CONFIG", "GET", "maxclients"]),
        V::Arr(vec![
            V::Bulk(b"maxclients".to_vec()),
            V::Bulk(b"1234".to_vec())
        ])
    );
    assert_eq!(
        c.cmd(&["CONFIG", "SET", "save", ""]),
        V::Simple("OK".into())
    );
    assert_eq!(
        c.cmd(&["CONFIG", "GET", "save"]),
        V::Arr(vec![V::Bulk(b"save".to_vec()), V::Bulk(b"".to_vec())])
    );
    assert_eq!(
        c.cmd(&["CONFIG", "SET", "appendonly", "no"]),
        V::Simple("OK".into())
    );
    assert_eq!(
        c.cmd(&["CONFIG", "SET", "port", "1"]),
        V::Err("ERR CONFIG SET failed (possibly related to argument 'port') - can't set immutable config".into())
    );
    assert_eq!(
        c.cmd(&["CONFIG", "SET", "nosuch", "1"]),
        V::Err("ERR Unknown option or number of arguments for CONFIG SET - 'nosuch'".into())
    );
    assert!(err_text(&c.cmd(&["CONFIG", "SET", "maxclients", "lots"]))
        .starts_with("ERR CONFIG SET failed (possibly related to argument 'maxclients')"));
    // A failed multi-parameter CONFIG SET changes nothing.
    assert!(matches!(
        c.cmd(&["CONFIG", "SET", "maxclients", "77", "port", "1"]),
        V::Err(_)
    ));
    assert_eq!(
        c.cmd(&["CONFIG", "GET", "maxclients"]),
        V::Arr(vec![
            V::Bulk(b"maxclients".to_vec()),
            V::Bulk(b"1234".to_vec())
        ])
    );
    assert_eq!(
        c.cmd(&["CONFIG", "SET", "maxclients"]),
        V::Err("ERR wrong number of arguments for 'config|set' command".into())
    );
    let V::Arr(all) = c.cmd(&["CONFIG", "GET", "*"]) else {
        panic!()
    };
    assert!(all.len() > 40 && all.len() % 2 == 0);
    // COMMAND.
    let V::Int(n) = c.cmd(&["COMMAND", "COUNT"]) else {
        panic!()
    };
    assert!(n > 50, "COMMAND COUNT {n}");
    let V::Arr(cmds) = c.cmd(&["COMMAND"]) else {
        panic!()
    };
    assert_eq!(cmds.len() as i64, n);
    // COMMAND DOCS get: a map (RESP2: flat array name, docs; RESP3: `%`).
    match c.cmd(&["COMMAND", "DOCS", "get"]) {
        V::Arr(a) => {
            assert_eq!(a.len(), 2);
            assert_eq!(a[0], V::Bulk(b"get".to_vec()));
            let V::Arr(d) = &a[1] else { panic!("{a:?}") };
            assert!(d.contains(&V::Bulk(b"summary".to_vec())), "{d:?}");
        }
        other => panic!("{other:?}"),
    }
    let mut c3 = Raw::new(&srv);
    let _ = c3.cmd(&["HELLO", "3"]);
    match c3.cmd(&["COMMAND", "DOCS", "get"]) {
        V::Map(m) => {
            assert_eq!(m.len(), 1);
            assert_eq!(m[0].0, V::Bulk(b"get".to_vec()));
            let V::Map(d) = &m[0].1 else { panic!("{m:?}") };
            assert!(
                d.iter().any(|(k, _)| k == &V::Bulk(b"summary".to_vec())),
                "{d:?}"
            );
        }
        other => panic!("COMMAND DOCS under RESP3 is not a map: {other:?}"),
    }
    // INFO: every default section, and Ember's fields.
    let info = bulk_str(&c.cmd(&["INFO"]));
    for sec in [
        "Server",
        "Clients",
        "Memory",
        "Persistence",
        "Stats",
        "Replication",
        "CPU",
        "Keyspace",
        "Ember",
    ] {
        assert!(
            info.contains(&format!("# {sec}\r\n")),
            "no {sec} section:\n{info}"
        );
    }
    assert!(info.contains("\r\nengine:bullet"), "{info}");
    assert!(info.contains("\r\ndurability:pmem"), "{info}");
    assert!(info.contains("\r\ndb15:keys=1,"), "{info}");
    assert!(
        info.contains(&format!("\r\ntcp_port:{}\r\n", srv.port)),
        "{info}"
    );
    let only = bulk_str(&c.cmd(&["INFO", "clients"]));
    assert!(
        only.starts_with("# Clients\r\n") && !only.contains("# Server"),
        "{only}"
    );
    let many = bulk_str(&c.cmd(&["INFO", "server", "ember"]));
    assert!(many.contains("# Server") && many.contains("# Ember") && !many.contains("# Clients"));
    assert_healthy(&mut srv);
}

// ---------------------------------------------------------------- 10. --config

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn wait_port(port: u16, child: &mut std::process::Child) -> bool {
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(30) {
        if let Ok(Some(_)) = child.try_wait() {
            return false;
        }
        if TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

fn wait_child(
    child: &mut std::process::Child,
    limit: Duration,
) -> Option<std::process::ExitStatus> {
    let t = Instant::now();
    while t.elapsed() < limit {
        if let Ok(Some(st)) = child.try_wait() {
            return Some(st);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let _ = child.kill();
    let _ = child.wait();
    None
}

fn ember_serve(dir: &Path, args: &[&str]) -> std::process::Child {
    Command::new(env!("CARGO_BIN_EXE_ember"))
        .arg("serve")
        .args(serve_common::SMALL)
        .arg("--heap")
        .arg(dir.join("ember.heap"))
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join("cfg.log")).unwrap())
        .spawn()
        .unwrap()
}

#[test]
fn config_file() {
    let dir = tmp();
    let port = free_port();
    let conf = dir.path().join("ember.conf");
    std::fs::write(
        &conf,
        format!(
            "# Ember, redis.conf syntax\nport {port}\nrequirepass \"from file\"\nmaxclients 77\n\nsave 900 1\nsave 300 10\nappendonly yes\nappendfsync everysec\ntcp-keepalive 300\n"
        ),
    )
    .unwrap();
    let c = conf.to_str().unwrap();
    // The file alone: its port, password and maxclients.
    let mut child = ember_serve(dir.path(), &["--config", c]);
    assert!(
        wait_port(port, &mut child),
        "did not start: {}",
        std::fs::read_to_string(dir.path().join("cfg.log")).unwrap_or_default()
    );
    let mut r = Raw {
        w: TcpStream::connect(("127.0.0.1", port)).unwrap(),
        r: BufReader::new(TcpStream::connect(("127.0.0.1", port)).unwrap()),
    };
    // (One connection: reader and writer share it.)
    r.r = BufReader::new(r.w.try_clone().unwrap());
    r.w.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    assert_eq!(
        r.cmd(&["PING"]),
        V::Err("NOAUTH Authentication required.".into())
    );
    assert_eq!(r.cmd(&["AUTH", "from file"]), V::Simple("OK".into()));
    assert_eq!(
        r.cmd(&["CONFIG", "GET", "maxclients"]),
        V::Arr(vec![
            V::Bulk(b"maxclients".to_vec()),
            V::Bulk(b"77".to_vec())
        ])
    );
    assert_eq!(
        r.cmd(&["CONFIG", "GET", "appendonly"]),
        V::Arr(vec![
            V::Bulk(b"appendonly".to_vec()),
            V::Bulk(b"yes".to_vec())
        ])
    );
    // An Ember parameter CONFIG SET changes at runtime, within its range.
    assert_eq!(
        r.cmd(&["CONFIG", "SET", "busy-poll-us", "0"]),
        V::Simple("OK".into())
    );
    assert_eq!(
        r.cmd(&["CONFIG", "GET", "busy-poll-us"]),
        V::Arr(vec![
            V::Bulk(b"busy-poll-us".to_vec()),
            V::Bulk(b"0".to_vec())
        ])
    );
    match r.cmd(&["CONFIG", "SET", "busy-poll-us", "20000"]) {
        V::Err(e) => assert!(e.contains("between 0 and 10000"), "{e}"),
        v => panic!("{v:?}"),
    }
    assert_eq!(r.cmd(&["PING"]), V::Simple("PONG".into()));
    let info = bulk_str(&r.cmd(&["INFO", "server"]));
    assert!(info.contains(&format!("config_file:{c}\r\n")), "{info}");
    drop(r);
    // SAFETY: kill(2) on our own child.
    unsafe {
        libc::kill(child.id() as i32, libc::SIGTERM);
    }
    let st = wait_child(&mut child, Duration::from_secs(30)).expect("no exit after SIGTERM");
    assert!(st.success());
    let log = std::fs::read_to_string(dir.path().join("cfg.log")).unwrap();
    assert!(
        log.contains("'appendonly yes' accepted; it has no effect"),
        "{log}"
    );

    // Flags override the file (the harness passes --port; --maxclients here).
    let mut srv = Server::start(
        dir.path(),
        &["--config", c, "--maxclients", "9", "--requirepass", "flag"],
    );
    let mut r = Raw::new(&srv);
    assert_eq!(
        r.cmd(&["AUTH", "from file"]),
        V::Err("WRONGPASS invalid username-password pair or user is disabled.".into())
    );
    assert_eq!(r.cmd(&["AUTH", "flag"]), V::Simple("OK".into()));
    assert_eq!(
        r.cmd(&["CONFIG", "GET", "maxclients"]),
        V::Arr(vec![
            V::Bulk(b"maxclients".to_vec()),
            V::Bulk(b"9".to_vec())
        ])
    );
    assert_eq!(
        r.cmd(&["CONFIG", "GET", "port"]),
        V::Arr(vec![
            V::Bulk(b"port".to_vec()),
            V::Bulk(srv.port.to_string().into_bytes())
        ])
    );
    assert!(srv.terminate());

    // An unknown directive: exit non-zero, naming the file and the line.
    std::fs::write(&conf, "port 7000\n# fine\nno-such-directive 1\n").unwrap();
    let mut child = ember_serve(dir.path(), &["--config", c]);
    let st = wait_child(&mut child, Duration::from_secs(30)).expect("ember serve did not exit");
    assert!(!st.success());
    let log = std::fs::read_to_string(dir.path().join("cfg.log")).unwrap();
    assert!(
        log.contains(&format!("{c}:3")) && log.contains("no-such-directive"),
        "{log}"
    );
    // A bad value and unbalanced quotes too.
    for (text, line) in [
        ("maxclients lots\n", 1),
        ("port 7000\nrequirepass \"open\n", 2),
    ] {
        std::fs::write(&conf, text).unwrap();
        let mut child = ember_serve(dir.path(), &["--config", c]);
        let st = wait_child(&mut child, Duration::from_secs(30)).expect("ember serve did not exit");
        assert!(!st.success());
        let log = std::fs::read_to_string(dir.path().join("cfg.log")).unwrap();
        assert!(log.contains(&format!("{c}:{line}")), "{log}");
    }
    // A missing file.
    let mut child = ember_serve(dir.path(), &["--config", "/nonexistent/ember.conf"]);
    let st = wait_child(&mut child, Duration::from_secs(30)).expect("ember serve did not exit");
    assert!(!st.success());
}

// ---------------------------------------------------------------- 11. metrics

#[test]
fn metrics_endpoint() {
    let dir = tmp();
    let mport = free_port();
    let mut srv = Server::start(dir.path(), &["--metrics-port", &mport.to_string()]);
    let mut con = srv.client();
    for i in 0..10 {
        let _: () = con.set(format!("m:{i}"), i).unwrap();
        let _: i64 = con.get(format!("m:{i}")).unwrap();
    }
    let get = |path: &str| -> String {
        let mut s = TcpStream::connect(("127.0.0.1", mport)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(format!("GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n").as_bytes())
            .unwrap();
        let (b, closed) = read_to_close(&mut s, Duration::from_secs(10));
        assert!(closed);
        show(&b)
    };
    let m = get("/metrics");
    assert!(
        m.starts_with("HTTP/1.0 200 OK\r\n") || m.starts_with("HTTP/1.1 200 OK\r\n"),
        "{m}"
    );
    assert!(
        m.contains("\nember_commands_total{cmd=\"set\"} 10\n"),
        "{m}"
    );
    assert!(
        m.contains("\nember_commands_total{cmd=\"get\"} 10\n"),
        "{m}"
    );
    assert!(
        m.contains("\nember_command_duration_seconds_bucket{le=\"+Inf\"}"),
        "{m}"
    );
    assert!(m.contains("\nember_connected_clients "), "{m}");
    let body_at = m.find("\r\n\r\n").unwrap() + 4;
    let len: usize = m
        .lines()
        .find_map(|l| l.strip_prefix("Content-Length: "))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert_eq!(m.len() - body_at, len);
    assert!(get("/nope").contains(" 404 "));
    // CONFIG RESETSTAT zeroes INFO's counts, not the Prometheus counters
    // (which only grow).
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query(&mut con)
        .unwrap();
    let info: String = redis::cmd("INFO").arg("stats").query(&mut con).unwrap();
    assert!(info.contains("keyspace_hits:0\r\n"), "{info}");
    let m = get("/metrics");
    assert!(
        m.contains("\nember_commands_total{cmd=\"set\"} 10\n"),
        "{m}"
    );
    assert!(m.contains("\nember_keyspace_hits_total 10\n"), "{m}");
    // A metrics client that connects and says nothing delays no one; a
    // request in pieces is read whole.
    let silent = TcpStream::connect(("127.0.0.1", mport)).unwrap();
    std::thread::sleep(Duration::from_millis(50));
    let t = Instant::now();
    let m = get("/metrics");
    assert!(m.contains(" 200 OK"), "{m}");
    assert!(
        t.elapsed() < Duration::from_secs(1),
        "scrape waited {:?}",
        t.elapsed()
    );
    let mut s = TcpStream::connect(("127.0.0.1", mport)).unwrap();
    s.set_nodelay(true).unwrap();
    for piece in ["GET /met", "rics HTTP/1.1\r\n", "Host: x\r\n", "\r\n"] {
        s.write_all(piece.as_bytes()).unwrap();
        std::thread::sleep(Duration::from_millis(20));
    }
    let (b, _) = read_to_close(&mut s, Duration::from_secs(10));
    assert!(show(&b).starts_with("HTTP/1.0 200 OK\r\n"), "{}", show(&b));
    assert_healthy(&mut srv);
    drop(silent);
    assert_healthy(&mut srv);
}

// ---------------------------------------------------------------- timeouts

#[test]
fn idle_timeout_closes_idle_clients_only() {
    let dir = tmp();
    let mut srv = Server::start(dir.path(), &["--timeout", "1", "--hz", "50"]);
    let mut idle = srv.raw();
    let mut half = srv.raw();
    half.write_all(b"*2\r\n$3\r\nGET").unwrap();
    let mut busy = srv.raw();
    let t = Instant::now();
    while t.elapsed() < Duration::from_millis(2500) {
        busy.write_all(b"PING\r\n").unwrap();
        assert_eq!(
            read_exact_timeout(&mut busy, 7, Duration::from_secs(5)),
            b"+PONG\r\n"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    for s in [&mut idle, &mut half] {
        let (got, closed) = read_to_close(s, Duration::from_secs(5));
        assert!(
            got.is_empty() && closed,
            "idle client not closed: {:?}",
            show(&got)
        );
    }
    assert_healthy(&mut srv);
}

// ---------------------------------------------------------------- protected mode

/// A local IPv4 address that is not loopback (a connection to it from this
/// host has a non-loopback peer address), from the kernel's routing table.
fn non_loopback_ipv4() -> Option<String> {
    let t = std::fs::read_to_string("/proc/net/fib_trie").ok()?;
    let lines: Vec<&str> = t.lines().collect();
    lines.windows(2).find_map(|w| {
        if !w[1].contains("/32 host LOCAL") {
            return None;
        }
        let ip = w[0].trim().trim_start_matches("|--").trim();
        let a: std::net::Ipv4Addr = ip.parse().ok()?;
        (!a.is_loopback() && !a.is_unspecified()).then(|| ip.to_string())
    })
}

#[test]
fn protected_mode_refuses_remote_peers_without_password() {
    let Some(ip) = non_loopback_ipv4() else {
        eprintln!("no non-loopback IPv4 address: protected mode test skipped");
        return;
    };
    let dir = tmp();
    let bind = format!("127.0.0.1 {ip}");
    let mut srv = Server::start(dir.path(), &["--bind", &bind]);
    let remote = || {
        let s = TcpStream::connect((ip.as_str(), srv.port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s
    };
    let mut s = remote();
    let (got, closed) = read_to_close(&mut s, Duration::from_secs(10));
    let got = show(&got);
    assert!(
        got.starts_with("-DENIED ") && got.ends_with("\r\n") && closed,
        "{got}"
    );
    assert_eq!(got.matches("\r\n").count(), 1);
    // Loopback clients are served meanwhile.
    let mut c = Raw::new(&srv);
    assert_eq!(c.cmd(&["PING"]), V::Simple("PONG".into()));
    // protected-mode no: remote peers are served.
    assert_eq!(
        c.cmd(&["CONFIG", "SET", "protected-mode", "no"]),
        V::Simple("OK".into())
    );
    let mut s = remote();
    s.write_all(b"PING\r\n").unwrap();
    assert_eq!(
        read_exact_timeout(&mut s, 7, Duration::from_secs(10)),
        b"+PONG\r\n"
    );
    // protected-mode yes with a password: served, but must authenticate.
    assert_eq!(
        c.cmd(&["CONFIG", "SET", "protected-mode", "yes"]),
        V::Simple("OK".into())
    );
    assert_eq!(
        c.cmd(&["CONFIG", "SET", "requirepass", "pw"]),
        V::Simple("OK".into())
    );
    let mut s = remote();
    s.write_all(b"PING\r\nAUTH pw\r\nPING\r\n").unwrap();
    let want = b"-NOAUTH Authentication required.\r\n+OK\r\n+PONG\r\n";
    assert_eq!(
        show(&read_exact_timeout(
            &mut s,
            want.len(),
            Duration::from_secs(10)
        )),
        show(want)
    );
    let mut con = redis::Client::open(format!("redis://:pw@127.0.0.1:{}/", srv.port))
        .unwrap()
        .get_connection()
        .unwrap();
    let n: u64 = info_field(&mut con, "stats", "rejected_connections")
        .parse()
        .unwrap();
    assert!(n >= 1);
    assert!(srv.running());
}

/// A new heap too small for Bullet's logs: the start fails with a clear error,
/// exits non-zero, and leaves no heap file, so a start with a larger heap
/// begins afresh.
#[test]
fn heap_too_small_for_the_logs() {
    let dir = tmp();
    let port = free_port().to_string();
    let mut child = Command::new(env!("CARGO_BIN_EXE_ember"))
        .arg("serve")
        .arg("--heap")
        .arg(dir.path().join("ember.heap"))
        .args(["--port", &port, "--logs", "8", "--log-size", "16mb"])
        .args(["--heap-size", "64mb", "--heap-max-size", "64mb"])
        .current_dir(dir.path())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.path().join("cfg.log")).unwrap())
        .spawn()
        .unwrap();
    let st = wait_child(&mut child, Duration::from_secs(20)).expect("the start fails");
    assert!(!st.success());
    let log = std::fs::read_to_string(dir.path().join("cfg.log")).unwrap();
    assert!(
        log.contains("no room for 8 logs of 16777216 bytes"),
        "{log}"
    );
    assert!(!dir.path().join("ember.heap").exists());
    let mut srv = Server::start(dir.path(), &[]);
    assert_healthy(&mut srv);
}
