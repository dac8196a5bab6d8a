//! A real `redis-server` for differential tests, and a raw RESP connection
//! that reads one reply per request.

use proto::{encode_request, parse_reply, Reply};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const REDIS_SERVER: &str = "/usr/bin/redis-server";

/// A `redis-server` on a free loopback port, with no persistence, killed on drop.
pub struct RedisServer {
    child: Child,
    pub port: u16,
    _dir: tempfile::TempDir,
}

impl RedisServer {
    pub fn start() -> RedisServer {
        RedisServer::start_with(&[])
    }

    /// Starts one with `extra` arguments (`--requirepass x`...).
    pub fn start_with(extra: &[&str]) -> RedisServer {
        assert!(
            Path::new(REDIS_SERVER).exists(),
            "{REDIS_SERVER} is missing: the differential tests compare Ember with a real \
             Redis. Run the README's test command (`bash scripts/test.sh`), which installs \
             redis-server (Debian package `redis-server`), or install it yourself."
        );
        for _attempt in 0..5 {
            let port = super::free_port();
            let dir = tempfile::tempdir().unwrap();
            let log = std::fs::File::create(dir.path().join("redis.log")).unwrap();
            let mut child = Command::new(REDIS_SERVER)
                .args(["--port", &port.to_string()])
                .args(["--save", ""])
                .args(["--appendonly", "no"])
                .args(["--bind", "127.0.0.1"])
                .args(extra)
                // SORT ALPHA compares with strcoll: the C locale makes that
                // byte order, as Ember compares.
                .env("LC_ALL", "C")
                .arg("--dir")
                .arg(dir.path())
                .current_dir(dir.path())
                .stdin(Stdio::null())
                .stdout(log.try_clone().unwrap())
                .stderr(log)
                .spawn()
                .expect("spawn redis-server");
            let t = Instant::now();
            while t.elapsed() < Duration::from_secs(20) {
                if let Ok(Some(_)) = child.try_wait() {
                    break;
                }
                if let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) {
                    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
                    // PONG, or NOAUTH when started with a password.
                    let mut b = [0u8; 7];
                    if s.write_all(b"PING\r\n").is_ok()
                        && s.read_exact(&mut b).is_ok()
                        && (&b == b"+PONG\r\n" || &b == b"-NOAUTH")
                    {
                        return RedisServer {
                            child,
                            port,
                            _dir: dir,
                        };
                    }
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            let _ = child.wait();
            let log = std::fs::read_to_string(dir.path().join("redis.log")).unwrap_or_default();
            eprintln!("redis-server on port {port} did not start:\n{log}");
        }
        panic!("redis-server did not start (its logs are above)");
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A raw RESP connection.
pub struct Conn {
    s: TcpStream,
    buf: Vec<u8>,
}

impl Conn {
    /// The connection's socket (to see it closed).
    pub fn into_stream(self) -> TcpStream {
        self.s
    }

    pub fn open(port: u16) -> Conn {
        let s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        s.set_nodelay(true).unwrap();
        Conn { s, buf: Vec::new() }
    }

    /// Sends an encoded request without reading its reply.
    pub fn send(&mut self, req: &[u8]) {
        self.s.write_all(req).unwrap();
    }

    /// Sends an encoded request and reads exactly one reply.
    pub fn request(&mut self, req: &[u8]) -> Result<Reply, String> {
        self.s.write_all(req).map_err(|e| format!("write: {e}"))?;
        let mut chunk = [0u8; 16384];
        loop {
            match parse_reply(&self.buf) {
                Ok(Some((r, n))) => {
                    self.buf.drain(..n);
                    return Ok(r);
                }
                Ok(None) => {}
                Err(e) => return Err(format!("malformed reply: {e}")),
            }
            match self.s.read(&mut chunk) {
                Ok(0) => return Err("the server closed the connection".into()),
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e) => return Err(format!("read: {e}")),
            }
        }
    }

    /// Sends a request and returns its reply's bytes exactly as sent (to
    /// compare formatting that parsing would hide, such as a RESP3
    /// double's digits).
    pub fn call_raw<A: AsRef<[u8]>>(&mut self, args: &[A]) -> Vec<u8> {
        let mut req = Vec::new();
        encode_request(args, &mut req);
        self.s.write_all(&req).unwrap();
        let mut chunk = [0u8; 16384];
        loop {
            if let Some((_, n)) = parse_reply(&self.buf).unwrap() {
                return self.buf.drain(..n).collect();
            }
            let n = self.s.read(&mut chunk).unwrap();
            assert!(n > 0, "the server closed the connection");
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }

    pub fn call<A: AsRef<[u8]>>(&mut self, args: &[A]) -> Reply {
        let mut req = Vec::new();
        encode_request(args, &mut req);
        self.request(&req).unwrap()
    }
}

/// An integer reply, or a bulk string holding one (GET of a counter); 0 for
/// anything else (a missing key).
pub fn reply_int(r: Reply) -> i64 {
    match r {
        Reply::Bulk(b) => String::from_utf8_lossy(&b).parse::<i64>().unwrap(),
        Reply::Integer(n) => n,
        _ => 0,
    }
}
