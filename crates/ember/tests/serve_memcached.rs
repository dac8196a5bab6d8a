//! The memcached port against a real memcached 1.6 (`/usr/bin/memcached`,
//! installed by scripts/test.sh): the same requests go to both and the
//! replies must be equal byte for byte, after two normalisations:
//!
//! - CAS uniques differ (memcached counts from 1, Ember from its start time),
//!   so each server's CAS values are renamed `#1`, `#2`... in order of first
//!   appearance; the requests that send a CAS back (`cas`, `ms C`, `md C`,
//!   `ma C`) send each server the value it gave for that key (or an older
//!   one, or one it never gave).
//! - TTLs left (`t` flags) may differ by a second: the two servers read the
//!   clock at different moments and memcached's clock ticks once a second.
//!
//! `random_sequences_match_memcached` runs seeded random sequences of the
//! text and meta commands over a few keys, with noreply, quiet mode, CAS
//! conflicts, expiry (absolute times in the past, negative and long TTLs),
//! flush_all, incr/decr edges (wrap, underflow, padding, non-numbers) and
//! malformed lines (unknown commands, wrong token counts, bad numbers, long
//! keys, bad data chunks, too large values). `EMBER_MC_SEED` replays one
//! seed, `EMBER_MC_STEPS` sets the steps per seed. Requests go in batches
//! closed by `mn` (whose `MN` ends the batch's replies).
//!
//! `malformed_input_closes_like_memcached`: a line too long, the binary
//! protocol, and the server still serving others afterwards.

mod serve_common;

use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};
use serve_common::{free_port, Server};
use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A real memcached on a free loopback port.
struct Memcached {
    child: Child,
    port: u16,
}

impl Memcached {
    fn start() -> Option<Memcached> {
        let bin = "/usr/bin/memcached";
        if !std::path::Path::new(bin).exists() {
            eprintln!("memcached is not installed (scripts/test.sh installs it): test skipped");
            return None;
        }
        let port = free_port();
        let mut cmd = Command::new(bin);
        // Without its background LRU threads: they hold items for moments,
        // and memcached then makes incr/decr write a new item instead of
        // changing it in place (a new one loses the padding and the item's
        // bits), at random.
        cmd.args(["-p", &port.to_string(), "-U", "0", "-l", "127.0.0.1"]);
        cmd.args(["-o", "no_lru_crawler,no_lru_maintainer"]);
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } == 0 {
            cmd.args(["-u", "root"]);
        }
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn memcached");
        let t = Instant::now();
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "memcached did not start"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        Some(Memcached { child, port })
    }
}

impl Drop for Memcached {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Ember with a memcached port.
fn ember(dir: &std::path::Path) -> (Server, u16) {
    let p = free_port();
    let s = Server::start(dir, &["--memcached-port", &p.to_string(), "--threads", "1"]);
    (s, p)
}

fn connect(port: u16) -> TcpStream {
    let s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    s.set_nodelay(true).unwrap();
    s
}

/// Sends `req` then `mn`, and reads up to the `MN` line: the replies to
/// `req`.
fn exchange(s: &mut TcpStream, req: &[u8]) -> Vec<u8> {
    s.write_all(req).unwrap();
    s.write_all(b"mn\r\n").unwrap();
    let mut out = Vec::new();
    let mut buf = [0u8; 65536];
    loop {
        if out.ends_with(b"MN\r\n") && (out.len() == 4 || out[..out.len() - 4].ends_with(b"\n")) {
            out.truncate(out.len() - 4);
            return out;
        }
        match s.read(&mut buf) {
            Ok(0) => return out,
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(e) => panic!("read: {e} after {:?}", String::from_utf8_lossy(&out)),
        }
    }
}

/// One server's side of the comparison: its connection, the CAS values it
/// gave per key, and its CAS renaming.
struct Side {
    conn: TcpStream,
    cas_of: HashMap<Vec<u8>, Vec<u64>>,
    names: HashMap<u64, usize>,
}

impl Side {
    fn new(port: u16) -> Side {
        Side {
            conn: connect(port),
            cas_of: HashMap::new(),
            names: HashMap::new(),
        }
    }

    /// The request with its CAS placeholders filled: `{C}` the last CAS this
    /// server gave for the op's key, `{O}` the one before it.
    fn fill(&self, req: &[u8], key: &[u8]) -> Vec<u8> {
        let seen = self.cas_of.get(key);
        let last = seen.and_then(|v| v.last()).copied().unwrap_or(u64::MAX);
        let older = seen
            .and_then(|v| v.len().checked_sub(2).map(|i| v[i]))
            .unwrap_or(1);
        let s = String::from_utf8_lossy(req)
            .replace("{C}", &last.to_string())
            .replace("{O}", &older.to_string());
        s.into_bytes()
    }

    /// Records the CAS values in `reply` (for `key`) and renames them.
    fn normalise(&mut self, reply: &[u8], key: &[u8]) -> String {
        let text = String::from_utf8_lossy(reply).into_owned();
        let mut out = String::new();
        for line in text.split_inclusive("\r\n") {
            let body = line.trim_end_matches("\r\n");
            let mut words: Vec<String> = body.split(' ').map(|w| w.to_string()).collect();
            let is_value = words.first().is_some_and(|w| w == "VALUE") && words.len() == 5;
            let is_meta = matches!(
                words.first().map(|w| w.as_str()),
                Some("HD" | "VA" | "EX" | "NF" | "NS" | "EN")
            );
            let mut cas_at: Vec<usize> = Vec::new();
            if is_value {
                cas_at.push(4);
            } else if is_meta {
                cas_at.extend((1..words.len()).filter(|&i| {
                    words[i].starts_with('c') && words[i][1..].parse::<u64>().is_ok()
                }));
            }
            for i in cas_at {
                let digits = if is_value {
                    &words[i][..]
                } else {
                    &words[i][1..]
                };
                let v: u64 = digits.parse().unwrap();
                let owner = if is_value {
                    words[1].as_bytes().to_vec()
                } else {
                    key.to_vec()
                };
                if v != 0 {
                    let e = self.cas_of.entry(owner).or_default();
                    if e.last() != Some(&v) {
                        e.push(v);
                    }
                }
                let n = self.names.len() + 1;
                let name = if v == 0 {
                    0
                } else {
                    *self.names.entry(v).or_insert(n)
                };
                words[i] = if is_value {
                    format!("#{name}")
                } else {
                    format!("c#{name}")
                };
            }
            out.push_str(&words.join(" "));
            out.push_str(&line[body.len()..]);
        }
        out
    }
}

/// Whether two normalised replies are equal, TTLs (`t` words of meta
/// replies) within a second.
fn same(a: &str, b: &str) -> bool {
    if a == b {
        return true;
    }
    let (la, lb): (Vec<&str>, Vec<&str>) = (a.split("\r\n").collect(), b.split("\r\n").collect());
    let ttl = |w: &str| w.strip_prefix('t').and_then(|n| n.parse::<i64>().ok());
    la.len() == lb.len()
        && la.iter().zip(&lb).all(|(x, y)| {
            let (wx, wy): (Vec<&str>, Vec<&str>) = (x.split(' ').collect(), y.split(' ').collect());
            x == y
                || (wx.len() == wy.len()
                    && wx.iter().zip(&wy).all(|(p, q)| {
                        p == q
                            || matches!((ttl(p), ttl(q)), (Some(i), Some(j)) if (i - j).abs() <= 1)
                    }))
        })
}

struct Gen {
    rng: SmallRng,
    now_s: i64,
}

const KEYS: &[&str] = &["a", "b", "num", "k:1", "x"];

impl Gen {
    fn pick<'a>(&mut self, xs: &[&'a str]) -> &'a str {
        xs[self.rng.random_range(0..xs.len())]
    }
    fn chance(&mut self, p: f64) -> bool {
        self.rng.random_bool(p)
    }
    fn value(&mut self) -> String {
        match self.rng.random_range(0..12) {
            0 => String::new(),
            1 => "0".into(),
            2 => "18446744073709551615".into(),
            3 => "18446744073709551614".into(),
            4 => self
                .pick(&[
                    "99", "100", "9", "10", " 5", "+7", "-1", "12abc", "007", "1 2",
                ])
                .into(),
            5 => self.rng.random_range(0u64..1000).to_string(),
            _ => {
                let n = self.rng.random_range(1..24);
                (0..n)
                    .map(|_| (b'a' + self.rng.random_range(0..26u8)) as char)
                    .collect()
            }
        }
    }
    /// An exptime: never, long relative, negative, absolute past or future.
    fn exptime(&mut self) -> String {
        match self.rng.random_range(0..10) {
            0..=4 => "0".into(),
            5 => "-1".into(),
            6 => "1000000000".into(),
            7 => (self.now_s + 100_000).to_string(),
            _ => self.rng.random_range(1000..100_000).to_string(),
        }
    }
    fn flags(&mut self) -> String {
        self.pick(&["0", "0", "1", "42", "4294967295", "65536"])
            .into()
    }
    fn nr(&mut self) -> &'static str {
        if self.chance(0.15) {
            " noreply"
        } else {
            ""
        }
    }

    /// One request and the key its CAS placeholders refer to.
    fn op(&mut self) -> (Vec<u8>, Vec<u8>) {
        let key = self.pick(KEYS).to_string();
        let k = key.as_bytes().to_vec();
        let r: String = match self.rng.random_range(0..34) {
            0..=3 => {
                let cmd = self.pick(&["set", "set", "add", "replace", "append", "prepend"]);
                let v = self.value();
                let (f, e, nr) = (self.flags(), self.exptime(), self.nr());
                format!("{cmd} {key} {f} {e} {}{nr}\r\n{v}\r\n", v.len())
            }
            4 => {
                let v = self.value();
                let (f, e, nr) = (self.flags(), self.exptime(), self.nr());
                let c = self.pick(&["{C}", "{C}", "{O}", "0", "18446744073709551615"]);
                format!("cas {key} {f} {e} {} {c}{nr}\r\n{v}\r\n", v.len())
            }
            5..=7 => {
                let cmd = self.pick(&["get", "gets", "get", "gets"]);
                let k2 = self.pick(KEYS);
                format!("{cmd} {key} {k2}\r\n")
            }
            8 => {
                let cmd = self.pick(&["gat", "gats"]);
                let e = self.exptime();
                format!("{cmd} {e} {key}\r\n")
            }
            9..=10 => {
                let cmd = self.pick(&["incr", "decr"]);
                let d = self.pick(&[
                    "1",
                    "0",
                    "5",
                    "100",
                    "18446744073709551615",
                    "-1",
                    "x",
                    "9999999918446744073709551615",
                ]);
                let nr = self.nr();
                format!("{cmd} {key} {d}{nr}\r\n")
            }
            11 => {
                let nr = self.nr();
                let hold = self.pick(&["", "", " 0", " 1"]);
                format!("delete {key}{hold}{nr}\r\n")
            }
            12 => {
                let (e, nr) = (self.exptime(), self.nr());
                format!("touch {key} {e}{nr}\r\n")
            }
            13 => {
                if self.chance(0.2) {
                    let nr = self.nr();
                    let d = self.pick(&["", " 0", " -1", " 100000", " x", " 1000000000"]);
                    format!("flush_all{d}{nr}\r\n")
                } else {
                    "version\r\nverbosity 1\r\nverbosity x noreply\r\n".into()
                }
            }
            14..=17 => {
                let mut fl: Vec<String> = Vec::new();
                for f in [
                    "v", "s", "f", "c", "t", "k", "h", "q", "O123", "T500", "N300", "R30", "u",
                ] {
                    if self.chance(0.25) {
                        fl.push(f.into());
                    }
                }
                if self.chance(0.05) {
                    fl.push(self.pick(&["v", "E5", "Tx", "Z"]).into());
                }
                format!("mg {key} {}\r\n", fl.join(" "))
            }
            18..=21 => {
                let v = self.value();
                let mut fl: Vec<String> = Vec::new();
                for f in ["c", "k", "q", "O9", "I"] {
                    if self.chance(0.2) {
                        fl.push(f.into());
                    }
                }
                if self.chance(0.3) {
                    fl.push(format!("F{}", self.flags()));
                }
                if self.chance(0.3) {
                    fl.push(format!("T{}", self.exptime()));
                }
                if self.chance(0.3) {
                    fl.push(self.pick(&["C{C}", "C{O}", "C18446744073709551615"]).into());
                }
                if self.chance(0.3) {
                    fl.push(
                        self.pick(&["ME", "MA", "MP", "MR", "MS", "Mx", "MEE"])
                            .into(),
                    );
                }
                let len = if self.chance(0.05) {
                    v.len() + 1
                } else {
                    v.len()
                };
                let pad = if len > v.len() { "zz" } else { "" };
                format!("ms {key} {len} {}\r\n{v}{pad}\r\n", fl.join(" "))
            }
            22..=23 => {
                let mut fl: Vec<String> = Vec::new();
                for f in ["q", "k", "O7", "I", "T100"] {
                    if self.chance(0.2) {
                        fl.push(f.into());
                    }
                }
                if self.chance(0.2) {
                    fl.push(self.pick(&["C{C}", "C{O}", "C18446744073709551615"]).into());
                }
                format!("md {key} {}\r\n", fl.join(" "))
            }
            24..=26 => {
                let mut fl: Vec<String> = Vec::new();
                for f in ["q", "k", "O7", "v", "c", "t", "N0", "J13", "T900"] {
                    if self.chance(0.25) {
                        fl.push(f.into());
                    }
                }
                if self.chance(0.4) {
                    fl.push(self.pick(&["MI", "MD", "M+", "M-", "Mx"]).into());
                }
                if self.chance(0.4) {
                    fl.push(
                        self.pick(&["D1", "D0", "D10", "D18446744073709551615", "Dx"])
                            .into(),
                    );
                }
                if self.chance(0.15) {
                    fl.push(self.pick(&["C{C}", "C18446744073709551615"]).into());
                }
                format!("ma {key} {}\r\n", fl.join(" "))
            }
            27 => {
                // Base64 keys.
                let b = self.pick(&["YQ==", "Yg==", "bnVt", "!!", "eA=="]);
                let m = self.pick(&[
                    "mg {b} b v k c",
                    "ms {b} 2 b k\r\nhi",
                    "md {b} b k",
                    "ma {b} b N0 v k",
                ]);
                format!("{}\r\n", m.replace("{b}", b))
            }
            _ => self.malformed(&key),
        };
        (r.into_bytes(), k)
    }

    fn malformed(&mut self, key: &str) -> String {
        let long = "L".repeat(251);
        match self.rng.random_range(0..23) {
            0 => "bogus\r\n".into(),
            22 => "mz a\r\n".into(),
            1 => "\r\n".into(),
            2 => "g\r\n".into(),
            3 => "get\r\n".into(),
            4 => format!("get {long}\r\n"),
            5 => format!("set {long} 0 0 1\r\nx\r\n"),
            6 => format!("set {key} 0 0\r\n"),
            7 => format!("set {key} x 0 1\r\n"),
            8 => format!("set {key} 0 0 -1\r\n"),
            9 => format!("set {key} 0 0 2\r\nabcd\r\n"),
            10 => format!("set {key} 0 0 1 noreply\r\nxyz\r\n"),
            11 => format!("incr {key}\r\n"),
            12 => format!("delete {key} 5 noreply\r\n"),
            13 => format!("touch {key} x\r\n"),
            14 => format!("mg {long} v\r\n"),
            15 => format!("ms {key}\r\n"),
            16 => format!("ms {key} x\r\n"),
            17 => format!("mg {key} O{}\r\n", "o".repeat(40)),
            18 => {
                let t = self.pick(&["", " T800", " v"]);
                format!("ma {key}{t} O{} N0\r\n", "o".repeat(40))
            }
            19 => format!("set  {key}  0  0  1 \r\nq\r\n"),
            20 => format!("set {key} 0 0 2000000\r\n{}\r\n", "v".repeat(2_000_000)),
            21 => format!("gets {key} {long}\r\n"),
            _ => format!("mg {key} T700 O{} v\r\n", "p".repeat(33)),
        }
    }
}

#[test]
fn random_sequences_match_memcached() {
    let Some(mc) = Memcached::start() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (_ember, eport) = ember(dir.path());
    let seeds: Vec<u64> = match std::env::var("EMBER_MC_SEED") {
        Ok(s) => vec![s.parse().expect("EMBER_MC_SEED: a number")],
        Err(_) => vec![1, 2, 3],
    };
    let steps: usize = std::env::var("EMBER_MC_STEPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1500);
    let verbose = std::env::var("EMBER_MC_VERBOSE").is_ok();
    let now_s = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    let mut failures = Vec::new();
    for &seed in &seeds {
        let mut g = Gen {
            rng: SmallRng::seed_from_u64(seed),
            now_s,
        };
        let mut e = Side::new(eport);
        let mut m = Side::new(mc.port);
        // Both start empty.
        for s in [&mut e, &mut m] {
            assert_eq!(exchange(&mut s.conn, b"flush_all\r\n"), b"OK\r\n");
        }
        let mut history: Vec<String> = Vec::new();
        for step in 0..steps {
            let (req, key) = g.op();
            let (re, rm) = (e.fill(&req, &key), m.fill(&req, &key));
            let (oe, om) = (exchange(&mut e.conn, &re), exchange(&mut m.conn, &rm));
            let (ne, nm) = (e.normalise(&oe, &key), m.normalise(&om, &key));
            let shown = String::from_utf8_lossy(&req[..req.len().min(200)]).into_owned();
            if verbose {
                println!("> {shown:?}\n  ember {ne:?}\n  memcd {nm:?}");
            }
            if !same(&ne, &nm) && memcached_overread(&mut m, &key, &nm) {
                // memcached's answer came from bytes after the value: both
                // forget the key and go on.
                for side in [&mut e, &mut m] {
                    let del = [b"delete ".as_slice(), &key, b"\r\n"].concat();
                    exchange(&mut side.conn, &del);
                }
                history.push(shown);
                continue;
            }
            if !same(&ne, &nm) {
                let msg = format!(
                    "seed {seed} step {step}: {shown:?}\n  ember:     {ne:?}\n  memcached: {nm:?}\n  before: {:?}",
                    &history[history.len().saturating_sub(8)..]
                );
                println!("{msg}");
                let probe = [b"mg ".as_slice(), &key, b" v f t h\r\n"].concat();
                println!(
                    "  now: ember {:?} memcached {:?}",
                    String::from_utf8_lossy(&exchange(&mut e.conn, &probe)),
                    String::from_utf8_lossy(&exchange(&mut m.conn, &probe))
                );
                failures.push(msg);
                break;
            }
            history.push(shown);
        }
    }
    assert!(
        failures.is_empty(),
        "{} divergence(s):\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// memcached's `safe_strtoull` looks for a minus sign in a number of 2^63
/// or more with `strchr` on the item's data, which has no terminating NUL:
/// whether incr/decr of such a value answers "non-numeric" depends on the
/// memory after the item. True when that is what happened.
fn memcached_overread(m: &mut Side, key: &[u8], reply: &str) -> bool {
    if !reply.contains("non-numeric") {
        return false;
    }
    let probe = [b"mg ".as_slice(), key, b" v\r\n"].concat();
    let r = String::from_utf8_lossy(&exchange(&mut m.conn, &probe)).into_owned();
    r.split("\r\n")
        .nth(1)
        .and_then(|v| v.trim_end().parse::<u64>().ok())
        .is_some_and(|n| n >= 1 << 63)
}

/// Reads until the peer closes (or 5 s pass); the bytes it sent.
fn read_to_close(s: &mut TcpStream) -> (Vec<u8>, bool) {
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return (out, true),
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return (out, true),
            Err(_) => return (out, false),
        }
    }
}

#[test]
fn malformed_input_closes_like_memcached() {
    let Some(mc) = Memcached::start() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (_ember, eport) = ember(dir.path());
    // A line of 3000 bytes without a newline: memcached closes silently.
    for port in [eport, mc.port] {
        let mut s = connect(port);
        s.write_all(&[b'x'; 3000]).unwrap();
        assert_eq!(read_to_close(&mut s), (Vec::new(), true), "port {port}");
        // A long multiget line is fine.
        let mut s = connect(port);
        let keys: String = (0..400).map(|i| format!(" key{i}")).collect();
        s.write_all(format!("get{keys}").as_bytes()).unwrap();
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(exchange(&mut s, b"\r\n"), b"END\r\n");
        // Binary junk in a command line: errors, and the connection goes on.
        let mut s = connect(port);
        let r = exchange(
            &mut s,
            b"get a\r\n\x01\x02\xff junk\r\nset a 0 0 1\r\nz\r\n",
        );
        assert_eq!(r, b"END\r\nERROR\r\nSTORED\r\n");
    }
    // The binary protocol: a clear error, then the connection closes; the
    // server serves others.
    let mut s = connect(eport);
    s.write_all(&[0x80, 0x00, 0x00, 0x00]).unwrap();
    let (out, closed) = read_to_close(&mut s);
    assert!(closed && out.starts_with(b"SERVER_ERROR the binary protocol is not supported"));
    let mut s = connect(eport);
    assert_eq!(
        exchange(&mut s, b"get a\r\n"),
        b"VALUE a 0 1\r\nz\r\nEND\r\n"
    );
    // quit closes without a reply.
    s.write_all(b"quit\r\n").unwrap();
    assert_eq!(read_to_close(&mut s), (Vec::new(), true));
}

/// Short TTLs and a delayed flush_all, with real sleeps: the same replies
/// before and after the moments pass.
#[test]
fn expiry_and_delayed_flush_match_memcached() {
    let Some(mc) = Memcached::start() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (_ember, eport) = ember(dir.path());
    let mut conns = [connect(eport), connect(mc.port)];
    let both = |conns: &mut [TcpStream; 2], req: &[u8]| -> Vec<u8> {
        let a = exchange(&mut conns[0], req);
        let b = exchange(&mut conns[1], req);
        assert_eq!(
            String::from_utf8_lossy(&a),
            String::from_utf8_lossy(&b),
            "request {:?}",
            String::from_utf8_lossy(req)
        );
        a
    };
    both(&mut conns, b"flush_all\r\n");
    let r = both(
        &mut conns,
        b"set short 0 1 1\r\na\r\nset long 0 100 1\r\nb\r\nms meta 1 T1\r\nc\r\nset touched 0 100 1\r\nd\r\ntouch touched 1\r\nget short long meta touched\r\n",
    );
    assert!(r.ends_with(b"VALUE touched 0 1\r\nd\r\nEND\r\n"));
    std::thread::sleep(Duration::from_millis(2500));
    let r = both(&mut conns, b"get short long meta touched\r\nmg meta v\r\n");
    assert_eq!(r, b"VALUE long 0 1\r\nb\r\nEND\r\nEN\r\n");
    // flush_all with a delay: items stored before the moment go then.
    both(
        &mut conns,
        b"set f1 0 0 1\r\nx\r\nflush_all 2\r\nget f1\r\n",
    );
    std::thread::sleep(Duration::from_millis(2500));
    let r = both(
        &mut conns,
        b"get f1 long\r\nset f2 0 0 1\r\ny\r\nget f2\r\n",
    );
    assert_eq!(r, b"END\r\nSTORED\r\nVALUE f2 0 1\r\ny\r\nEND\r\n");
}
