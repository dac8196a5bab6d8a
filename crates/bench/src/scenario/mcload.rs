//! A memcached load generator (text protocol) for `logfree-fig11`: `set` and
//! `get` (optionally multi-key `get`) over N connections driven by 1-2 client
//! threads, with a pipelining depth per connection, uniform keys over a key
//! range, a warm-up and a measured window; throughput and latency percentiles
//! (hdrhistogram).
//!
//! Every reply is checked, so that a broken server cannot look fast:
//! - a value's bytes encode their key, a version and a fill pattern derived
//!   from both ([`value_for`]); a `VALUE` whose key was not asked for, whose
//!   flags are not the key's ([`flags_of`]), or whose bytes do not decode to
//!   its key with the right length and fill is counted `corrupt`;
//! - a key whose `set` was acknowledged (`STORED`) before the `get` was sent
//!   must be found: a miss of such a key is counted `lost` (the servers run
//!   with memory enough that nothing is evicted);
//! - a reply other than the expected one (`NOT_STORED`, `SERVER_ERROR`, ...)
//!   is counted `unexpected`; bytes that are not a reply at all end the run
//!   with an error (the stream cannot be resynchronised).
//!
//! Each thread drives its connections in rounds: it writes `depth` requests
//! on every connection, then reads every reply; a request's latency runs from
//! its round's send to its reply. Sockets block with a timeout, so a server
//! that stops answering ends the run with an error rather than hanging.

use hdrhistogram::Histogram;
use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};
use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Barrier;
use std::time::{Duration, Instant};

/// Reads and writes that take longer than this end the run with an error.
const IO_TIMEOUT: Duration = Duration::from_secs(30);

/// The key's name on the wire.
pub fn key_name(key: u64) -> String {
    format!("key:{key}")
}

/// The key number of a key name ([`key_name`]), if it is one.
pub fn parse_key(name: &[u8]) -> Option<u64> {
    let digits = name.strip_prefix(b"key:")?;
    if digits.is_empty() || digits.len() > 20 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(digits).ok()?.parse().ok()
}

/// The 32-bit client flags stored with `key` (Knuth's multiplicative hash,
/// so that flags differ between keys and a mix-up shows).
pub fn flags_of(key: u64) -> u32 {
    (key as u32).wrapping_mul(2_654_435_761)
}

/// The fill byte of a value of `key` at `version`: a lower-case letter.
fn fill_of(key: u64, version: u32) -> u8 {
    b'a' + ((key ^ u64::from(version)) % 26) as u8
}

/// The longest header [`value_for`] writes for keys below `key_range`.
pub fn header_len(key_range: u64) -> usize {
    format!("{}:{}:", key_range.saturating_sub(1), u32::MAX).len()
}

/// Writes the value of `key` at `version`, `size` bytes, into `out`
/// (replacing its contents): `KEY:VERSION:` then the fill byte. `size` must
/// be at least the header's length ([`header_len`] checks it up front).
pub fn value_for(key: u64, version: u32, size: usize, out: &mut Vec<u8>) {
    out.clear();
    let _ = write!(out, "{key}:{version}:");
    debug_assert!(out.len() <= size, "value size {size} below the header");
    out.resize(size.max(out.len()), fill_of(key, version));
}

/// Whether `data` is a value [`value_for`] wrote for `key` with `size` bytes
/// (any version).
pub fn check_value(key: u64, size: usize, data: &[u8]) -> bool {
    if data.len() != size {
        return false;
    }
    let mut parts = data.splitn(3, |&b| b == b':');
    let (Some(k), Some(v), Some(fill)) = (parts.next(), parts.next(), parts.next()) else {
        return false;
    };
    let num = |s: &[u8]| -> Option<u64> {
        if s.is_empty() || s.len() > 20 || !s.iter().all(u8::is_ascii_digit) {
            return None;
        }
        std::str::from_utf8(s).ok()?.parse().ok()
    };
    let (Some(k), Some(v)) = (num(k), num(v)) else {
        return false;
    };
    let Ok(v) = u32::try_from(v) else {
        return false;
    };
    let f = fill_of(key, v);
    k == key && fill.iter().all(|&b| b == f)
}

/// Appends `set KEY FLAGS 0 LEN\r\nDATA\r\n`.
pub fn encode_set(buf: &mut Vec<u8>, key: u64, value: &[u8]) {
    let _ = write!(
        buf,
        "set {} {} 0 {}\r\n",
        key_name(key),
        flags_of(key),
        value.len()
    );
    buf.extend_from_slice(value);
    buf.extend_from_slice(b"\r\n");
}

/// Appends `get KEY...\r\n`.
pub fn encode_get(buf: &mut Vec<u8>, keys: &[u64]) {
    buf.extend_from_slice(b"get");
    for &k in keys {
        let _ = write!(buf, " {}", key_name(k));
    }
    buf.extend_from_slice(b"\r\n");
}

/// The first line of `buf` without its `\r\n`, and the bytes it takes with
/// it; None until the whole line is there.
fn line(buf: &[u8]) -> Option<(&[u8], usize)> {
    let i = buf.windows(2).position(|w| w == b"\r\n")?;
    Some((&buf[..i], i + 2))
}

/// The lines memcached answers with when a command fails: `ERROR`,
/// `CLIENT_ERROR msg`, `SERVER_ERROR msg`.
fn is_error_line(l: &[u8]) -> bool {
    l == b"ERROR" || l.starts_with(b"CLIENT_ERROR") || l.starts_with(b"SERVER_ERROR")
}

/// The longest line a reply has before its data (a `VALUE` line with a
/// 250-byte key); more bytes without a line end is not memcached speaking.
const MAX_LINE: usize = 1024;

/// The reply to a `set`.
#[derive(Debug, PartialEq, Eq)]
pub enum StoreReply {
    Stored,
    /// Any other reply line (`NOT_STORED`, `SERVER_ERROR out of memory`, ...).
    Other(String),
}

/// Parses the reply to a `set` at the start of `buf`: the reply and the bytes
/// it takes, None while incomplete, an error for a line that no `set`
/// answers with.
pub fn parse_store(buf: &[u8]) -> Result<Option<(StoreReply, usize)>, String> {
    let Some((l, n)) = line(buf) else {
        return if buf.len() > MAX_LINE {
            Err(format!("no line end in {} bytes", buf.len()))
        } else {
            Ok(None)
        };
    };
    let reply = match l {
        b"STORED" => StoreReply::Stored,
        b"NOT_STORED" | b"EXISTS" | b"NOT_FOUND" => {
            StoreReply::Other(String::from_utf8_lossy(l).into())
        }
        l if is_error_line(l) => StoreReply::Other(String::from_utf8_lossy(l).into()),
        l => {
            return Err(format!(
                "not a reply to set: {:?}",
                String::from_utf8_lossy(&l[..l.len().min(80)])
            ))
        }
    };
    Ok(Some((reply, n)))
}

/// One `VALUE` of a `get` reply: where its key and data are in the buffer.
#[derive(Debug, PartialEq, Eq, Clone)]
pub struct Value {
    pub key: std::ops::Range<usize>,
    pub flags: u32,
    pub data: std::ops::Range<usize>,
}

/// The reply to a `get`.
#[derive(Debug, PartialEq, Eq)]
pub enum GetReply {
    /// The values, up to `END`.
    Values(Vec<Value>),
    /// An error line instead (`SERVER_ERROR ...`).
    Error(String),
}

/// Parses the reply to a `get` at the start of `buf`: `VALUE KEY FLAGS
/// BYTES\r\nDATA\r\n`... `END\r\n` (or an error line). Returns the reply and
/// the bytes it takes, None while incomplete, an error for bytes that are
/// not such a reply (a bad `VALUE` line, data not followed by `\r\n`).
pub fn parse_get(buf: &[u8]) -> Result<Option<(GetReply, usize)>, String> {
    let mut at = 0;
    let mut values = Vec::new();
    loop {
        let Some((l, n)) = line(&buf[at..]) else {
            return if buf.len() - at > MAX_LINE {
                Err(format!("no line end in {} bytes", buf.len() - at))
            } else {
                Ok(None)
            };
        };
        if l == b"END" {
            return Ok(Some((GetReply::Values(values), at + n)));
        }
        if values.is_empty() && is_error_line(l) {
            return Ok(Some((
                GetReply::Error(String::from_utf8_lossy(l).into()),
                at + n,
            )));
        }
        let bad = || {
            format!(
                "not a VALUE line: {:?}",
                String::from_utf8_lossy(&l[..l.len().min(80)])
            )
        };
        let mut f = l.split(|&b| b == b' ');
        if f.next() != Some(b"VALUE") {
            return Err(bad());
        }
        let key = f.next().filter(|k| !k.is_empty()).ok_or_else(bad)?;
        let num = |s: Option<&[u8]>| -> Option<u64> {
            let s = s?;
            if s.is_empty() || s.len() > 20 || !s.iter().all(u8::is_ascii_digit) {
                return None;
            }
            std::str::from_utf8(s).ok()?.parse().ok()
        };
        let flags = num(f.next())
            .and_then(|v| u32::try_from(v).ok())
            .ok_or_else(bad)?;
        let len = num(f.next())
            .and_then(|v| usize::try_from(v).ok())
            .ok_or_else(bad)?;
        // `gets` adds a CAS number; `get` must not.
        if f.next().is_some() {
            return Err(bad());
        }
        let key_start = at + 6;
        let key = key_start..key_start + key.len();
        let data_start = at + n;
        let Some(data_end) = data_start.checked_add(len) else {
            return Err(bad());
        };
        if buf.len() < data_end.saturating_add(2) {
            return Ok(None);
        }
        if &buf[data_end..data_end + 2] != b"\r\n" {
            return Err(format!(
                "the {len} bytes of a VALUE are not followed by \\r\\n"
            ));
        }
        values.push(Value {
            key,
            flags,
            data: data_start..data_end,
        });
        at = data_end + 2;
    }
}

/// What verifying replies found wrong.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Errors {
    /// Misses of keys whose `set` had been acknowledged before the `get`.
    pub lost: u64,
    /// Values with wrong bytes, wrong flags, or a key that was not asked for.
    pub corrupt: u64,
    /// Replies other than the expected one (`NOT_STORED`, `SERVER_ERROR`...).
    pub unexpected: u64,
}

impl Errors {
    pub fn total(&self) -> u64 {
        self.lost + self.corrupt + self.unexpected
    }

    fn add(&mut self, o: &Errors) {
        self.lost += o.lost;
        self.corrupt += o.corrupt;
        self.unexpected += o.unexpected;
    }
}

/// What one `get` reply gave: hits, misses and errors.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GetCheck {
    pub hits: u64,
    pub misses: u64,
    pub errors: Errors,
}

/// Verifies the values of a `get` of `keys` (in `buf`, as [`parse_get`]
/// found them): each must be one of the keys, in the order asked, once, with
/// the key's flags and a value of `size` bytes for it; `known[i]` says that
/// `keys[i]` was acknowledged as stored before the `get` was sent, so its
/// absence is a loss.
pub fn verify_get(
    keys: &[u64],
    known: &[bool],
    buf: &[u8],
    values: &[Value],
    size: usize,
) -> GetCheck {
    let mut c = GetCheck::default();
    let mut found = vec![false; keys.len()];
    let mut next = 0;
    for v in values {
        let key = parse_key(&buf[v.key.clone()]);
        // memcached answers in the order asked, hits only.
        let pos = key.and_then(|k| keys[next..].iter().position(|&x| x == k).map(|p| next + p));
        let Some(i) = pos else {
            c.errors.corrupt += 1;
            continue;
        };
        next = i + 1;
        found[i] = true;
        if v.flags == flags_of(keys[i]) && check_value(keys[i], size, &buf[v.data.clone()]) {
            c.hits += 1;
        } else {
            c.errors.corrupt += 1;
        }
    }
    for (i, f) in found.iter().enumerate() {
        if !f {
            c.misses += 1;
            if known.get(i).copied().unwrap_or(false) {
                c.errors.lost += 1;
            }
        }
    }
    c
}

/// The keys acknowledged as stored (one bit each): set after a `STORED`,
/// read when a `get` is sent.
pub struct Known(Vec<AtomicU64>);

impl Known {
    pub fn new(key_range: u64) -> Known {
        Known(
            (0..key_range.div_ceil(64))
                .map(|_| AtomicU64::new(0))
                .collect(),
        )
    }

    pub fn insert(&self, key: u64) {
        self.0[(key / 64) as usize].fetch_or(1 << (key % 64), Ordering::Relaxed);
    }

    pub fn contains(&self, key: u64) -> bool {
        self.0[(key / 64) as usize].load(Ordering::Relaxed) & (1 << (key % 64)) != 0
    }
}

/// A connection with its read buffer.
struct Conn {
    s: TcpStream,
    buf: Vec<u8>,
    /// Start of the unparsed bytes in `buf`.
    at: usize,
}

impl Conn {
    fn connect(port: u16) -> io::Result<Conn> {
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
        s.set_read_timeout(Some(IO_TIMEOUT))?;
        s.set_write_timeout(Some(IO_TIMEOUT))?;
        s.set_nodelay(true)?;
        Ok(Conn {
            s,
            buf: Vec::with_capacity(64 * 1024),
            at: 0,
        })
    }

    /// Reads more bytes (moving the unparsed ones to the front first).
    fn fill(&mut self) -> Result<(), String> {
        if self.at > 0 {
            self.buf.drain(..self.at);
            self.at = 0;
        }
        let old = self.buf.len();
        self.buf.resize(old + 64 * 1024, 0);
        let r = self.s.read(&mut self.buf[old..]);
        match r {
            Ok(0) => {
                self.buf.truncate(old);
                Err("the server closed the connection".into())
            }
            Ok(n) => {
                self.buf.truncate(old + n);
                Ok(())
            }
            Err(e) => {
                self.buf.truncate(old);
                Err(format!("read: {e}"))
            }
        }
    }

    /// The next reply, parsed by `parse` (reading until it is complete).
    fn next<T>(
        &mut self,
        parse: impl Fn(&[u8]) -> Result<Option<(T, usize)>, String>,
    ) -> Result<(T, std::ops::Range<usize>), String> {
        loop {
            if let Some((r, n)) = parse(&self.buf[self.at..])? {
                let range = self.at..self.at + n;
                self.at += n;
                return Ok((r, range));
            }
            self.fill()?;
        }
    }
}

/// The workload.
#[derive(Clone, Debug)]
pub struct Load {
    pub port: u16,
    /// Client threads (1-2 on a 2-core machine shared with the server).
    pub threads: usize,
    /// Connections per thread.
    pub conns: usize,
    /// Requests in flight per connection.
    pub depth: usize,
    /// Keys per `get` (1: single-key gets).
    pub multiget: usize,
    pub key_range: u64,
    pub value_size: usize,
    /// Fraction of requests that are sets (0.2: 1 set to 4 gets).
    pub set_ratio: f64,
    pub warmup: Duration,
    pub measure: Duration,
    pub seed: u64,
}

impl Load {
    pub fn check(&self) -> Result<(), String> {
        if self.threads == 0 || self.conns == 0 || self.depth == 0 || self.multiget == 0 {
            return Err("threads, connections, depth and multiget must be at least 1".into());
        }
        if self.key_range == 0 {
            return Err("the key range must not be empty".into());
        }
        if self.value_size < header_len(self.key_range) {
            return Err(format!(
                "values of {} bytes cannot carry their check header ({} bytes for this key range)",
                self.value_size,
                header_len(self.key_range)
            ));
        }
        if !(0.0..=1.0).contains(&self.set_ratio) {
            return Err(format!("set ratio {} not in 0..=1", self.set_ratio));
        }
        Ok(())
    }
}

/// What a run measured (in the measured window).
#[derive(Clone, Debug, Default)]
pub struct Outcome {
    /// Requests answered (a multi-key get is one).
    pub requests: u64,
    pub sets: u64,
    pub gets: u64,
    /// Keys asked for by the gets, and how many were found.
    pub keys_asked: u64,
    pub hits: u64,
    pub seconds: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub max_us: f64,
    /// Over the whole run, warm-up included.
    pub errors: Errors,
}

impl Outcome {
    pub fn ops_per_sec(&self) -> f64 {
        self.requests as f64 / self.seconds
    }

    pub fn hit_ratio(&self) -> f64 {
        if self.keys_asked == 0 {
            0.0
        } else {
            self.hits as f64 / self.keys_asked as f64
        }
    }
}

/// A request in flight.
enum Pending {
    Set(u64),
    Get { keys: Vec<u64>, known: Vec<bool> },
}

/// One thread's share of a run.
struct Part {
    o: Outcome,
    hist: Histogram<u64>,
}

fn histogram() -> Histogram<u64> {
    Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3).expect("histogram bounds")
}

/// Runs the load: the threads start together, run `warmup` and then
/// `measure`; only replies that arrive in the measured window count
/// (errors count over the whole run). Fails on a connection or protocol
/// error, or when `stop` is set.
pub fn run(load: &Load, known: &Known, stop: &AtomicBool) -> Result<Outcome, String> {
    load.check()?;
    let barrier = Barrier::new(load.threads);
    let parts: Vec<Result<Part, String>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..load.threads)
            .map(|t| {
                let barrier = &barrier;
                s.spawn(move || client(load, t, known, barrier, stop))
            })
            .collect();
        hs.into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err("client thread panicked".into()))
            })
            .collect()
    });
    let mut total = Outcome::default();
    let mut hist = histogram();
    for p in parts {
        let p = p?;
        total.requests += p.o.requests;
        total.sets += p.o.sets;
        total.gets += p.o.gets;
        total.keys_asked += p.o.keys_asked;
        total.hits += p.o.hits;
        total.errors.add(&p.o.errors);
        hist.add(&p.hist).map_err(|e| format!("histogram: {e}"))?;
    }
    total.seconds = load.measure.as_secs_f64();
    total.p50_us = hist.value_at_quantile(0.5) as f64 / 1e3;
    total.p99_us = hist.value_at_quantile(0.99) as f64 / 1e3;
    total.max_us = hist.max() as f64 / 1e3;
    Ok(total)
}

fn client(
    load: &Load,
    t: usize,
    known: &Known,
    barrier: &Barrier,
    stop: &AtomicBool,
) -> Result<Part, String> {
    let conns: Result<Vec<Conn>, String> = (0..load.conns)
        .map(|_| Conn::connect(load.port).map_err(|e| format!("connect to {}: {e}", load.port)))
        .collect();
    // Every thread reaches the barrier, also one that could not connect.
    barrier.wait();
    let mut conns = conns?;
    let mut rng = SmallRng::seed_from_u64(load.seed.wrapping_add(t as u64 * 7919 + 1));
    let mut part = Part {
        o: Outcome::default(),
        hist: histogram(),
    };
    let t0 = Instant::now();
    let from = t0 + load.warmup;
    let until = from + load.measure;
    let mut pending: Vec<VecDeque<Pending>> = (0..conns.len()).map(|_| VecDeque::new()).collect();
    let mut wbuf = Vec::new();
    let mut value = Vec::new();
    while Instant::now() < until {
        if stop.load(Ordering::Relaxed) {
            return Err("interrupted".into());
        }
        let sent = Instant::now();
        for (c, q) in conns.iter_mut().zip(&mut pending) {
            wbuf.clear();
            for _ in 0..load.depth {
                if rng.random::<f64>() < load.set_ratio {
                    let key = rng.random_range(0..load.key_range);
                    value_for(key, rng.random(), load.value_size, &mut value);
                    encode_set(&mut wbuf, key, &value);
                    q.push_back(Pending::Set(key));
                } else {
                    let keys: Vec<u64> = (0..load.multiget)
                        .map(|_| rng.random_range(0..load.key_range))
                        .collect();
                    let known = keys.iter().map(|&k| known.contains(k)).collect();
                    encode_get(&mut wbuf, &keys);
                    q.push_back(Pending::Get { keys, known });
                }
            }
            c.s.write_all(&wbuf).map_err(|e| format!("write: {e}"))?;
        }
        for (c, q) in conns.iter_mut().zip(&mut pending) {
            while let Some(p) = q.pop_front() {
                match p {
                    Pending::Set(key) => {
                        let (r, _) = c.next(parse_store)?;
                        let now = Instant::now();
                        match r {
                            StoreReply::Stored => known.insert(key),
                            StoreReply::Other(_) => part.o.errors.unexpected += 1,
                        }
                        if now >= from && now < until {
                            part.o.requests += 1;
                            part.o.sets += 1;
                            part.hist.saturating_record((now - sent).as_nanos() as u64);
                        }
                    }
                    Pending::Get { keys, known } => {
                        let (r, range) = c.next(parse_get)?;
                        let now = Instant::now();
                        let check = match r {
                            GetReply::Values(vals) => {
                                // The values' ranges are relative to the reply.
                                let reply = &c.buf[range];
                                verify_get(&keys, &known, reply, &vals, load.value_size)
                            }
                            GetReply::Error(_) => GetCheck {
                                errors: Errors {
                                    unexpected: 1,
                                    ..Errors::default()
                                },
                                ..GetCheck::default()
                            },
                        };
                        part.o.errors.add(&check.errors);
                        if now >= from && now < until {
                            part.o.requests += 1;
                            part.o.gets += 1;
                            part.o.keys_asked += keys.len() as u64;
                            part.o.hits += check.hits;
                            part.hist.saturating_record((now - sent).as_nanos() as u64);
                        }
                    }
                }
            }
        }
    }
    Ok(part)
}

/// Stores every key of `keys` (split between `threads` connections,
/// `batch` pipelined sets at a time, at full speed) and marks each in
/// `known` once acknowledged. Returns the time from the first send to the
/// last acknowledgement and the replies other than `STORED`.
pub fn populate(
    port: u16,
    keys: std::ops::Range<u64>,
    value_size: usize,
    threads: usize,
    batch: usize,
    known: &Known,
    stop: &AtomicBool,
) -> Result<(Duration, Errors), String> {
    if value_size < header_len(keys.end) {
        return Err(format!(
            "values of {value_size} bytes cannot carry their check header"
        ));
    }
    let threads = threads.max(1) as u64;
    let batch = batch.max(1) as u64;
    let n = keys.end.saturating_sub(keys.start);
    let barrier = Barrier::new(threads as usize);
    let t0 = Instant::now();
    let results: Vec<Result<Errors, String>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|t| {
                let lo = keys.start + n * t / threads;
                let hi = keys.start + n * (t + 1) / threads;
                let barrier = &barrier;
                s.spawn(move || -> Result<Errors, String> {
                    let c = Conn::connect(port).map_err(|e| format!("connect to {port}: {e}"));
                    barrier.wait();
                    let mut c = c?;
                    let mut errors = Errors::default();
                    let (mut wbuf, mut value) = (Vec::new(), Vec::new());
                    let mut k = lo;
                    while k < hi {
                        if stop.load(Ordering::Relaxed) {
                            return Err("interrupted".into());
                        }
                        let end = (k + batch).min(hi);
                        wbuf.clear();
                        for key in k..end {
                            value_for(key, 0, value_size, &mut value);
                            encode_set(&mut wbuf, key, &value);
                        }
                        c.s.write_all(&wbuf).map_err(|e| format!("write: {e}"))?;
                        for key in k..end {
                            match c.next(parse_store)?.0 {
                                StoreReply::Stored => known.insert(key),
                                StoreReply::Other(_) => errors.unexpected += 1,
                            }
                        }
                        k = end;
                    }
                    Ok(errors)
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err("populating thread panicked".into()))
            })
            .collect()
    });
    let took = t0.elapsed();
    let mut errors = Errors::default();
    for r in results {
        errors.add(&r?);
    }
    Ok((took, errors))
}

/// Gets every key of `keys` (multi-key gets of `batch`, on one connection)
/// and checks each value; every key is expected present (a miss is `lost`).
/// Returns the hits and the errors.
pub fn verify_all(
    port: u16,
    keys: std::ops::Range<u64>,
    value_size: usize,
    batch: usize,
    stop: &AtomicBool,
) -> Result<(u64, Errors), String> {
    let mut c = Conn::connect(port).map_err(|e| format!("connect to {port}: {e}"))?;
    let batch = batch.max(1) as u64;
    let mut wbuf = Vec::new();
    let mut hits = 0;
    let mut errors = Errors::default();
    let mut k = keys.start;
    while k < keys.end {
        if stop.load(Ordering::Relaxed) {
            return Err("interrupted".into());
        }
        let end = (k + batch).min(keys.end);
        let ks: Vec<u64> = (k..end).collect();
        wbuf.clear();
        encode_get(&mut wbuf, &ks);
        c.s.write_all(&wbuf).map_err(|e| format!("write: {e}"))?;
        let (r, range) = c.next(parse_get)?;
        match r {
            GetReply::Values(vals) => {
                let check =
                    verify_get(&ks, &vec![true; ks.len()], &c.buf[range], &vals, value_size);
                hits += check.hits;
                errors.add(&check.errors);
            }
            GetReply::Error(_) => errors.unexpected += 1,
        }
        k = end;
    }
    Ok((hits, errors))
}

/// Whether a `get` of `key` on `port` answers with its value (a fresh
/// connection; false on any failure): the readiness probe of a restart.
pub fn get_hits(port: u16, key: u64, value_size: usize) -> bool {
    let Ok(mut c) = Conn::connect(port) else {
        return false;
    };
    let _ = c.s.set_read_timeout(Some(Duration::from_secs(2)));
    let mut wbuf = Vec::new();
    encode_get(&mut wbuf, &[key]);
    if c.s.write_all(&wbuf).is_err() {
        return false;
    }
    match c.next(parse_get) {
        Ok((GetReply::Values(vals), range)) => {
            let check = verify_get(&[key], &[true], &c.buf[range], &vals, value_size);
            check.hits == 1 && check.errors.total() == 0
        }
        _ => false,
    }
}

/// Sends one command line and returns the reply lines up to `END` (for
/// `stats`), or the first line (for `version`).
pub fn command(port: u16, line_: &str, until_end: bool) -> Result<Vec<String>, String> {
    let mut c = Conn::connect(port).map_err(|e| format!("connect to {port}: {e}"))?;
    c.s.write_all(format!("{line_}\r\n").as_bytes())
        .map_err(|e| format!("write: {e}"))?;
    let mut lines = Vec::new();
    loop {
        let (l, _) = c.next(|b| Ok(line(b).map(|(l, n)| (l.to_vec(), n))))?;
        let l = String::from_utf8_lossy(&l).into_owned();
        let end = !until_end || l == "END" || is_error_line(l.as_bytes());
        lines.push(l);
        if end {
            return Ok(lines);
        }
    }
}

/// A field of `stats` output (`STAT name value` lines).
pub fn stat(lines: &[String], name: &str) -> Option<u64> {
    lines.iter().find_map(|l| {
        let mut f = l.split(' ');
        (f.next() == Some("STAT") && f.next() == Some(name))
            .then(|| f.next()?.parse().ok())
            .flatten()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_encode_their_key() {
        let mut v = Vec::new();
        value_for(42, 7, 32, &mut v);
        assert_eq!(v.len(), 32);
        assert!(v.starts_with(b"42:7:"));
        assert!(check_value(42, 32, &v));
        assert!(!check_value(43, 32, &v), "another key's value");
        assert!(!check_value(42, 32, &v[..31]), "truncated");
        let longer = [&v[..], &v[31..]].concat();
        assert!(check_value(42, 33, &longer), "the same pattern, 33 bytes");
        assert!(!check_value(42, 32, &longer), "too long");
        let mut bad = v.clone();
        bad[20] ^= 1;
        assert!(!check_value(42, 32, &bad), "a flipped bit in the fill");
        assert!(!check_value(42, 32, &[b'x'; 32]), "no header");
        assert!(!check_value(42, 32, b"42:99999999999:aaaaaaaaaaaaaaaaa"));
        assert_eq!(header_len(10_000_000), "9999999:4294967295:".len());
    }

    #[test]
    fn keys_round_trip() {
        assert_eq!(parse_key(key_name(123).as_bytes()), Some(123));
        assert_eq!(parse_key(b"key:"), None);
        assert_eq!(parse_key(b"key:1x"), None);
        assert_eq!(parse_key(b"other:1"), None);
        assert_ne!(flags_of(1), flags_of(2));
    }

    #[test]
    fn requests_are_encoded() {
        let mut b = Vec::new();
        encode_set(&mut b, 5, b"abc");
        encode_get(&mut b, &[1, 2]);
        let f = flags_of(5);
        assert_eq!(
            String::from_utf8(b).unwrap(),
            format!("set key:5 {f} 0 3\r\nabc\r\nget key:1 key:2\r\n")
        );
    }

    #[test]
    fn store_replies_parse() {
        assert_eq!(parse_store(b"STO").unwrap(), None);
        assert_eq!(parse_store(b"STORED\r").unwrap(), None);
        assert_eq!(
            parse_store(b"STORED\r\nEND").unwrap(),
            Some((StoreReply::Stored, 8))
        );
        assert_eq!(
            parse_store(b"SERVER_ERROR out of memory storing object\r\n").unwrap(),
            Some((
                StoreReply::Other("SERVER_ERROR out of memory storing object".into()),
                43
            ))
        );
        assert!(parse_store(b"VALUE x 0 1\r\n").is_err());
        assert!(parse_store(&[b'x'; 2000]).is_err(), "no line end");
    }

    #[test]
    fn get_replies_parse() {
        let r = b"VALUE key:1 5 3\r\nabc\r\nVALUE key:22 0 0\r\n\r\nEND\r\nnext";
        let (g, n) = parse_get(r).unwrap().unwrap();
        assert_eq!(n, r.len() - 4);
        let GetReply::Values(v) = g else {
            panic!("{g:?}")
        };
        assert_eq!(v.len(), 2);
        assert_eq!(&r[v[0].key.clone()], b"key:1");
        assert_eq!(v[0].flags, 5);
        assert_eq!(&r[v[0].data.clone()], b"abc");
        assert_eq!(&r[v[1].key.clone()], b"key:22");
        assert!(v[1].data.is_empty());
        // Incomplete at every cut.
        for cut in 0..n {
            assert_eq!(parse_get(&r[..cut]).unwrap(), None, "cut {cut}");
        }
        assert_eq!(
            parse_get(b"END\r\n").unwrap(),
            Some((GetReply::Values(vec![]), 5))
        );
        assert_eq!(
            parse_get(b"SERVER_ERROR busy\r\n").unwrap(),
            Some((GetReply::Error("SERVER_ERROR busy".into()), 19))
        );
        // Data not followed by \r\n, a CAS number, bad numbers, junk.
        assert!(parse_get(b"VALUE k 0 3\r\nabcd\r\nEND\r\n").is_err());
        assert!(parse_get(b"VALUE k 0 3 99\r\nabc\r\nEND\r\n").is_err());
        assert!(parse_get(b"VALUE k 0 -1\r\n").is_err());
        assert!(parse_get(b"VALUE k 4294967296 1\r\n").is_err());
        assert!(parse_get(b"VALUE k 0 99999999999999999999999\r\n").is_err());
        assert!(parse_get(b"STORED\r\n").is_err());
        assert!(parse_get(b"VALUE  0 1\r\n").is_err());
    }

    /// A `get` reply of `items` (key, flags, data) as the buffer and values
    /// [`parse_get`] gives.
    fn reply(items: &[(String, u32, Vec<u8>)]) -> (Vec<u8>, Vec<Value>) {
        let mut b = Vec::new();
        for (k, f, d) in items {
            b.extend_from_slice(format!("VALUE {k} {f} {}\r\n", d.len()).as_bytes());
            b.extend_from_slice(d);
            b.extend_from_slice(b"\r\n");
        }
        b.extend_from_slice(b"END\r\n");
        let (GetReply::Values(v), _) = parse_get(&b).unwrap().unwrap() else {
            panic!("not values")
        };
        (b, v)
    }

    fn item(key: u64, size: usize) -> (String, u32, Vec<u8>) {
        let mut v = Vec::new();
        value_for(key, 3, size, &mut v);
        (key_name(key), flags_of(key), v)
    }

    #[test]
    fn gets_are_verified() {
        let keys = [1, 2, 3];
        // Hits of 1 and 3; 2 missing but not known: a plain miss.
        let (b, v) = reply(&[item(1, 32), item(3, 32)]);
        let c = verify_get(&keys, &[true, false, true], &b, &v, 32);
        assert_eq!((c.hits, c.misses, c.errors), (2, 1, Errors::default()));
        // 2 was known stored: its miss is a loss.
        let c = verify_get(&keys, &[true, true, true], &b, &v, 32);
        assert_eq!(c.errors.lost, 1);
        // Another key's value under key 1, wrong flags, wrong size.
        let mut wrong = item(1, 32);
        wrong.2 = item(2, 32).2;
        let mut flags = item(3, 32);
        flags.1 ^= 1;
        let (b, v) = reply(&[wrong, item(2, 31), flags]);
        let c = verify_get(&keys, &[false; 3], &b, &v, 32);
        assert_eq!((c.hits, c.errors.corrupt), (0, 3));
        // A key not asked for, a key twice, keys out of order.
        let (b, v) = reply(&[item(9, 32)]);
        assert_eq!(verify_get(&keys, &[false; 3], &b, &v, 32).errors.corrupt, 1);
        let (b, v) = reply(&[item(1, 32), item(1, 32)]);
        assert_eq!(verify_get(&keys, &[false; 3], &b, &v, 32).errors.corrupt, 1);
        let (b, v) = reply(&[item(3, 32), item(1, 32)]);
        let c = verify_get(&keys, &[false; 3], &b, &v, 32);
        assert_eq!((c.hits, c.errors.corrupt), (1, 1));
    }

    #[test]
    fn known_keys() {
        let k = Known::new(130);
        assert!(!k.contains(129));
        k.insert(129);
        k.insert(0);
        assert!(k.contains(129) && k.contains(0) && !k.contains(64));
    }

    #[test]
    fn stats_fields() {
        let lines: Vec<String> = ["STAT pid 12", "STAT bytes 4096", "END"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        assert_eq!(stat(&lines, "bytes"), Some(4096));
        assert_eq!(stat(&lines, "curr_items"), None);
    }

    /// A server that answers every `set` with STORED and every `get` with
    /// END (it keeps nothing), or, with `corrupt`, every `get` with one value
    /// of the wrong length: the load must count the losses or the corrupt
    /// values rather than report a clean run.
    fn forgetful_server(corrupt: bool) -> u16 {
        use std::io::{BufRead, BufReader};
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        std::thread::spawn(move || {
            for s in l.incoming() {
                let Ok(s) = s else { return };
                std::thread::spawn(move || {
                    let mut w = s.try_clone().unwrap();
                    let mut r = BufReader::new(s);
                    let mut line = String::new();
                    while r.read_line(&mut line).is_ok_and(|n| n > 0) {
                        let f: Vec<&str> = line.split_whitespace().collect();
                        let reply = match f.first() {
                            Some(&"set") => {
                                let n: usize = f[4].parse().unwrap();
                                let mut data = vec![0; n + 2];
                                r.read_exact(&mut data).unwrap();
                                "STORED\r\n".to_string()
                            }
                            Some(&"get") if corrupt => {
                                format!(
                                    "VALUE {} {} 1\r\nx\r\nEND\r\n",
                                    f[1],
                                    flags_of(parse_key(f[1].as_bytes()).unwrap())
                                )
                            }
                            Some(&"get") => "END\r\n".to_string(),
                            _ => "ERROR\r\n".to_string(),
                        };
                        if w.write_all(reply.as_bytes()).is_err() {
                            return;
                        }
                        line.clear();
                    }
                });
            }
        });
        port
    }

    #[test]
    fn a_server_that_forgets_is_caught() {
        let stop = AtomicBool::new(false);
        for corrupt in [false, true] {
            let port = forgetful_server(corrupt);
            let known = Known::new(100);
            let (_, e) = populate(port, 0..50, 32, 2, 10, &known, &stop).unwrap();
            assert_eq!(e, Errors::default());
            assert!((0..50).all(|k| known.contains(k)) && !known.contains(50));
            let load = Load {
                port,
                threads: 1,
                conns: 2,
                depth: 4,
                multiget: 2,
                key_range: 100,
                value_size: 32,
                set_ratio: 0.2,
                warmup: Duration::ZERO,
                measure: Duration::from_millis(200),
                seed: 7,
            };
            let o = run(&load, &known, &stop).unwrap();
            assert!(o.requests > 0 && o.gets > 0 && o.sets > 0, "{o:?}");
            if corrupt {
                assert!(o.errors.corrupt > 0 && o.hits == 0, "{o:?}");
            } else {
                assert!(o.errors.lost > 0 && o.hits == 0, "{o:?}");
            }
            let (hits, e) = verify_all(port, 0..50, 32, 7, &stop).unwrap();
            assert_eq!(hits, 0);
            if corrupt {
                // One wrong value per get of 7 keys, the other keys missing.
                assert_eq!((e.corrupt, e.lost), (8, 42));
            } else {
                assert_eq!(e.lost, 50);
            }
            assert!(!get_hits(port, 3, 32));
        }
    }

    #[test]
    fn loads_are_checked() {
        let ok = Load {
            port: 1,
            threads: 1,
            conns: 1,
            depth: 1,
            multiget: 1,
            key_range: 1000,
            value_size: 32,
            set_ratio: 0.2,
            warmup: Duration::ZERO,
            measure: Duration::from_millis(1),
            seed: 1,
        };
        assert!(ok.check().is_ok());
        assert!(Load {
            value_size: 8,
            ..ok.clone()
        }
        .check()
        .is_err());
        assert!(Load {
            depth: 0,
            ..ok.clone()
        }
        .check()
        .is_err());
        assert!(Load {
            set_ratio: 1.5,
            ..ok
        }
        .check()
        .is_err());
    }
}
