//! Differential tests: the same requests go to `ember serve` and to a real
//! `redis-server`, and the parsed replies must be equal, error texts included.
//!
//! - `random_sequences_match_redis`: seeded random sequences over a small key
//!   space (so operations collide) of every deterministic string and keyspace
//!   command, with valid, invalid and conflicting options, bad numbers, wrong
//!   arities and unknown commands. Set `EMBER_DIFF_SEED` / `EMBER_DIFF_STEPS` to
//!   replay one seed or run longer.
//! - `glob_patterns_match_redis`: random glob patterns and keys over every
//!   special byte, KEYS and SCAN MATCH.
//! - `hash_sequences_match_redis`: random sequences of every hash command
//!   over a few keys (a string among them, for WRONGTYPE), with big HSETs
//!   and long values that pass the listpack limits, so both encodings and the
//!   conversion are compared (HGETALL/HKEYS/HVALS exactly while Redis keeps
//!   the hash as a listpack, as sets after; HSCAN iterated to cursor 0;
//!   HRANDFIELD's errors exactly, its random picks by shape).
//! - `set_sequences_match_redis`: the same for every set command (intsets
//!   growing past 512 members and non-integer members convert to
//!   hashtables); set replies as sets, SPOP/SRANDMEMBER by shape (and a
//!   popped key is deleted on both servers afterwards).
//! - `list_sequences_match_redis`: the same for every non-blocking list
//!   command, with big pushes that make lists of several pieces; every
//!   reply compared exactly (lists are ordered).
//! - `edge_case_errors_match_redis`: a curated list of edge cases (error texts,
//!   limits, rounding, absolute expiry times), every reply compared exactly.
//!
//! What is compared loosely, and why:
//! - KEYS and SCAN: as sets (the order is the store's; SCAN is iterated to
//!   cursor 0 on each server separately).
//! - TTL/PTTL and EXPIRETIME/PEXPIRETIME of relative expiries: within a small
//!   tolerance, as the two servers read the clock at slightly different
//!   moments. Expiry times given as absolute times are compared exactly.
//! - Relative expiry times are either in the past or at least 100 s away, and
//!   are chosen so they never come near an absolute time of the mix: so no key
//!   expires during a run, and GT/LT comparisons cannot depend on the moment.
//!
//! - DBSIZE and SCAN: every key is touched first (`touch_all`), as Redis 7.0
//!   keeps a key whose expiry passed until it is touched.
//!
//! Left out on purpose:
//! - not deterministic or server-specific: RANDOMKEY, INFO, CONFIG, COMMAND,
//!   CLIENT, HELLO, TIME, LASTSAVE, OBJECT IDLETIME/FREQ/HELP;
//! - INCRBYFLOAT whose sum is not exact in binary: Ember computes in `f64`,
//!   Redis in `long double` (see `float_safe`); increments beyond the `f64`
//!   range that a long double still holds (1e309..1e4932) likewise;
//! - OBJECT ENCODING after APPEND/SETRANGE/INCRBYFLOAT (Redis reports its
//!   in-memory object, e.g. "raw" for a short appended string; Ember asks only
//!   the value), so OBJECT comes right after a SET or INCR that wrote;
//! - short positive expiry times (a key expiring mid-run would expire at
//!   different moments on the two servers).
//!
//! On a divergence the test prints the seed, the step, the request, both
//! replies and the requests before it, then starts again from an empty
//! keyspace; it fails at the end listing every divergence. It also prints
//! Redis's replies by command and kind (the coverage the mix reached).
//! `EMBER_DIFF_VERBOSE=1` prints every request with both replies.

mod serve_common;

use proto::{encode_request, split_args, Reply};
use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};
use serve_common::redis_server::{Conn, RedisServer};
use serve_common::Server;
use std::collections::{BTreeMap, BTreeSet, HashSet, VecDeque};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// A request as redis-cli would show it.
fn render(args: &[Vec<u8>]) -> String {
    let mut out = String::new();
    for a in args {
        if !out.is_empty() {
            out.push(' ');
        }
        out.push('"');
        for &b in a {
            match b {
                b'"' => out.push_str("\\\""),
                b'\\' => out.push_str("\\\\"),
                0x20..=0x7e => out.push(b as char),
                _ => out.push_str(&format!("\\x{b:02x}")),
            }
        }
        out.push('"');
    }
    out
}

/// How two replies are compared.
#[derive(Clone, Copy, Debug)]
enum Cmp {
    Exact,
    /// Arrays compared as multisets (KEYS).
    Sorted,
    /// TTL family: non-negative integers may differ by `tol` unless Redis's
    /// reply is one of the absolute times in use (then exactly).
    Ttl {
        tol: i64,
    },
    /// Errors exactly; otherwise both must be arrays (a SCAN from an odd cursor).
    ErrorOrArray,
    /// Flat arrays of pairs (HGETALL of a hashtable) compared as sets of pairs.
    SortedPairs,
    /// Random picks: errors exactly; otherwise the same kind of reply, and
    /// arrays or sets of the same length.
    Shape,
}

fn sorted(r: &Reply) -> Option<Vec<Reply>> {
    match r {
        Reply::Array(v) | Reply::Set(v) => {
            let mut v = v.clone();
            v.sort_by(|a, b| format!("{a:?}").cmp(&format!("{b:?}")));
            Some(v)
        }
        _ => None,
    }
}

fn same(e: &Reply, r: &Reply, cmp: Cmp, exact: &HashSet<i64>) -> bool {
    match cmp {
        Cmp::Exact => e == r,
        Cmp::Sorted => match (sorted(e), sorted(r)) {
            (Some(a), Some(b)) => a == b,
            _ => e == r,
        },
        Cmp::Ttl { tol } => match (e, r) {
            (Reply::Integer(a), Reply::Integer(b)) if *a >= 0 && *b >= 0 && !exact.contains(b) => {
                (a - b).abs() <= tol
            }
            _ => e == r,
        },
        Cmp::ErrorOrArray => match (e, r) {
            (Reply::Array(_), Reply::Array(_)) => true,
            _ => e == r,
        },
        Cmp::Shape => match (e, r) {
            (Reply::Bulk(_), Reply::Bulk(_)) => true,
            (Reply::Array(a), Reply::Array(b)) | (Reply::Set(a), Reply::Set(b)) => {
                a.len() == b.len()
            }
            (Reply::Map(a), Reply::Map(b)) => a.len() == b.len(),
            _ => e == r,
        },
        Cmp::SortedPairs => match (e, r) {
            (Reply::Array(a), Reply::Array(b)) => {
                let pairs = |v: &[Reply]| {
                    let mut p: Vec<String> = v.chunks(2).map(|c| format!("{c:?}")).collect();
                    p.sort();
                    p
                };
                a.len() % 2 == 0 && pairs(a) == pairs(b)
            }
            // RESP3: a map, compared as a set of pairs.
            (Reply::Map(a), Reply::Map(b)) => {
                let pairs = |v: &[(Reply, Reply)]| {
                    let mut p: Vec<String> = v.iter().map(|c| format!("{c:?}")).collect();
                    p.sort();
                    p
                };
                pairs(a) == pairs(b)
            }
            _ => e == r,
        },
    }
}

/// Sends every request to both servers and records each disagreement.
struct Diff {
    ember: Conn,
    ember_log: std::path::PathBuf,
    redis: Conn,
    label: String,
    steps: usize,
    total: usize,
    history: VecDeque<String>,
    failures: Vec<String>,
    /// Absolute expiry times (s and ms) in use: EXPIRETIME/PEXPIRETIME of these
    /// must match exactly.
    exact_times: HashSet<i64>,
    /// Redis's replies by command and kind (the coverage the mix reached).
    kinds: BTreeMap<String, BTreeMap<&'static str, usize>>,
    /// Both connections speak RESP3 (HELLO 3 after every reset).
    resp3: bool,
}

fn kind(r: &Reply) -> &'static str {
    match r {
        Reply::Simple(_) => "ok",
        Reply::Error(e) if e.contains("syntax") => "err-syntax",
        Reply::Error(e) if e.contains("wrong number") => "err-arity",
        Reply::Error(e) if e.contains("unknown") => "err-unknown",
        Reply::Error(_) => "err-other",
        Reply::Integer(0) => "0",
        Reply::Integer(n) if *n < 0 => "neg",
        Reply::Integer(_) => "int",
        Reply::Null | Reply::NullArray => "nil",
        Reply::Bulk(b) if b.is_empty() => "empty",
        Reply::Bulk(_) => "bulk",
        Reply::Array(v) if v.is_empty() => "[]",
        Reply::Array(_) => "array",
        _ => "other",
    }
}

impl Diff {
    fn new(ember: &Server, redis_port: u16) -> Diff {
        Diff {
            ember_log: ember.log_path(),
            ember: Conn::open(ember.port),
            redis: Conn::open(redis_port),
            label: String::new(),
            steps: 0,
            total: 0,
            history: VecDeque::new(),
            failures: Vec::new(),
            exact_times: HashSet::new(),
            kinds: BTreeMap::new(),
            resp3: false,
        }
    }

    /// Empties both servers (not compared) and selects database 0.
    fn reset(&mut self) {
        for c in [&mut self.ember, &mut self.redis] {
            assert_eq!(c.call(&["FLUSHALL"]), Reply::ok());
            assert_eq!(c.call(&["SELECT", "0"]), Reply::ok());
            if self.resp3 {
                // The greeting names each server: not compared.
                assert!(matches!(c.call(&["HELLO", "3"]), Reply::Map(_)));
            }
        }
        self.history.clear();
    }

    /// Sends `args` to both; returns Ember's and Redis's replies.
    fn both(&mut self, args: &[Vec<u8>], cmp: Cmp) -> (Reply, Reply) {
        let mut req = Vec::new();
        encode_request(args, &mut req);
        let e = self.ember.request(&req);
        let r = self.redis.request(&req);
        let (e, r) = match (e, r) {
            (Ok(e), Ok(r)) => (e, r),
            (e, r) => {
                let log = std::fs::read_to_string(&self.ember_log).unwrap_or_default();
                let hist: Vec<String> = self.history.iter().cloned().collect();
                panic!(
                    "{} step {}: {}\n  ember: {e:?}\n  redis: {r:?}\n  preceding commands:\n    {}\n\
                     ember's log:\n{log}",
                    self.label,
                    self.steps + 1,
                    render(args),
                    hist.join("\n    ")
                );
            }
        };
        self.steps += 1;
        self.total += 1;
        let name = String::from_utf8_lossy(&args[0]).to_ascii_uppercase();
        *self
            .kinds
            .entry(name)
            .or_default()
            .entry(kind(&r))
            .or_default() += 1;
        let line = render(args);
        if std::env::var_os("EMBER_DIFF_VERBOSE").is_some() {
            println!("{line}\n  ember: {e:?}\n  redis: {r:?}");
        }
        if !same(&e, &r, cmp, &self.exact_times) {
            let hist: Vec<String> = self.history.iter().cloned().collect();
            self.failures.push(format!(
                "{} step {}: {line}\n  ember: {e:?}\n  redis: {r:?}\n  (compared {cmp:?}; \
                 preceding commands, oldest first:\n    {})",
                self.label,
                self.steps,
                hist.join("\n    ")
            ));
            eprintln!("MISMATCH {}", self.failures.last().unwrap());
            // Start again from an empty keyspace so one divergence is reported once.
            self.reset();
        } else {
            self.remember(line);
        }
        (e, r)
    }

    /// Sends `args` to both; returns Redis's reply (Ember's agreed, or the
    /// divergence was recorded).
    fn call(&mut self, args: &[Vec<u8>], cmp: Cmp) -> Reply {
        self.both(args, cmp).1
    }

    fn exact(&mut self, args: &[Vec<u8>]) -> Reply {
        self.call(args, Cmp::Exact)
    }

    /// Iterates SCAN to cursor 0 on each server; compares the key sets.
    fn scan_all(&mut self, opts: &[Vec<u8>]) {
        self.scan_all_of(&[b"SCAN".to_vec()], opts, false)
    }

    /// Iterates a scan (`cmd`: `SCAN`, or `HSCAN key`...) to cursor 0 on each
    /// server and compares what they returned as sets (of pairs when
    /// `pairs`). An error reply is compared exactly.
    fn scan_all_of(&mut self, cmd: &[Vec<u8>], opts: &[Vec<u8>], pairs: bool) {
        let mut sets = Vec::new();
        for c in [&mut self.ember, &mut self.redis] {
            let mut keys = BTreeSet::new();
            let mut cursor = b"0".to_vec();
            let mut rounds = 0;
            let err = loop {
                let mut args = cmd.to_vec();
                args.push(cursor.clone());
                args.extend(opts.iter().cloned());
                match c.call(&args) {
                    Reply::Array(v) if v.len() == 2 => {
                        let (Reply::Bulk(next), Reply::Array(page)) = (&v[0], &v[1]) else {
                            break Some(format!("bad SCAN reply {v:?}"));
                        };
                        if let Some(bad) = page.iter().find(|k| !matches!(k, Reply::Bulk(_))) {
                            break Some(format!("bad SCAN element {bad:?}"));
                        }
                        let items: Vec<Vec<u8>> = page
                            .iter()
                            .filter_map(|k| match k {
                                Reply::Bulk(k) => Some(k.clone()),
                                _ => None,
                            })
                            .collect();
                        if pairs {
                            keys.extend(items.chunks(2).map(|p| p.concat()));
                        } else {
                            keys.extend(items);
                        }
                        cursor = next.clone();
                    }
                    other => break Some(format!("{other:?}")),
                }
                rounds += 1;
                if cursor == b"0" {
                    break None;
                }
                if rounds > 10_000 {
                    break Some("SCAN did not finish".into());
                }
            };
            sets.push((keys, err));
        }
        self.steps += 1;
        self.total += 1;
        let mut line = cmd.to_vec();
        line.push(b"<iterated>".to_vec());
        line.extend(opts.iter().cloned());
        let line = render(&line);
        if sets[0] != sets[1] {
            let show = |s: &(BTreeSet<Vec<u8>>, Option<String>)| {
                let ks: Vec<String> =
                    s.0.iter()
                        .map(|k| render(std::slice::from_ref(k)))
                        .collect();
                format!("{} err={:?}", ks.join(" "), s.1)
            };
            self.failures.push(format!(
                "{} step {}: {line}\n  ember: {}\n  redis: {}",
                self.label,
                self.steps,
                show(&sets[0]),
                show(&sets[1])
            ));
            eprintln!("MISMATCH {}", self.failures.last().unwrap());
            self.reset();
        } else {
            self.remember(line);
        }
    }

    fn remember(&mut self, line: String) {
        if self.history.len() == 16 {
            self.history.pop_front();
        }
        self.history.push_back(line);
    }
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

fn b(s: &str) -> Vec<u8> {
    s.as_bytes().to_vec()
}

/// The key space: small so operations collide; empty, binary, numeric-looking
/// and glob-special names.
const KEYS: &[&[u8]] = &[
    b"a",
    b"b",
    b"c",
    b"k1",
    b"k2",
    b"key:1",
    b"key:2",
    b"key:10",
    b"",
    b"007",
    b"-0",
    b" 1",
    b"9223372036854775807",
    b"\x00\xff\x01",
    b"caf\xc3\xa9",
    b"h*llo",
    b"h?llo",
    b"[x]",
    b"a b",
    b"x\r\ny",
];

const VALUES: &[&[u8]] = &[
    b"",
    b"0",
    b"1",
    b"-1",
    b"007",
    b"-0",
    b" 1",
    b"1 ",
    b"+1",
    b"10",
    b"9999",
    b"10000",
    b"123456789",
    b"9223372036854775807",
    b"-9223372036854775808",
    b"9223372036854775808",
    b"1.5",
    b"-2.25",
    b"1e3",
    b"3.0",
    b"0x10",
    b"inf",
    b"nan",
    b"abc",
    b"hello world",
    b"\x00\x01\xff",
    b"\xe2\x82\xac1",
    b"12345678901234567890",
    b"123456789012345678901",
    b"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx",
    b"yyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyy",
];

const INTS: &[&str] = &[
    "0",
    "1",
    "-1",
    "5",
    "-100",
    "1000",
    "9223372036854775807",
    "-9223372036854775808",
    "4611686018427387904",
    "9223372036854775808",
    "abc",
    "",
    " 1",
    "1 ",
    "1.5",
    "007",
    "-0",
    "+1",
];

const PATTERNS: &[&[u8]] = &[
    b"*",
    b"**",
    b"k*",
    b"key:?",
    b"key:[12]*",
    b"key:[^1]*",
    b"key:[1-2]",
    b"*1*",
    b"h\\*llo",
    b"h?llo",
    b"[^k]*",
    b"",
    b"a",
    b"*:*",
    b"\x00*",
    b"[",
    b"[a",
    b"\\",
    b"*\\",
    b"?",
    b"??",
    b"*[x]*",
    b"\\[x\\]",
    b"[\\]]",
    b"caf?",
    b"a?b",
    b"*b",
];

struct Gen {
    rng: SmallRng,
    /// Unix seconds and milliseconds when the run started.
    t0_s: i64,
    t0_ms: i64,
}

impl Gen {
    fn pick<'a, T: ?Sized>(&mut self, xs: &'a [&'a T]) -> &'a T {
        xs[self.rng.random_range(0..xs.len())]
    }

    fn p(&mut self, prob: f64) -> bool {
        self.rng.random_bool(prob)
    }

    fn key(&mut self) -> Vec<u8> {
        self.pick(KEYS).to_vec()
    }

    fn val(&mut self) -> Vec<u8> {
        match self.rng.random_range(0..10) {
            0..=5 => self.pick(VALUES).to_vec(),
            6 => self.rng.random_range(-50i64..50).to_string().into_bytes(),
            7 => (self.rng.random_range(-40i64..40) as f64 / 4.0)
                .to_string()
                .into_bytes(),
            _ => {
                let n = self.rng.random_range(0..8);
                (0..n)
                    .map(|_| b"abcxyz01"[self.rng.random_range(0..8)])
                    .collect()
            }
        }
    }

    fn int(&mut self) -> Vec<u8> {
        if self.p(0.5) {
            self.rng.random_range(-20i64..20).to_string().into_bytes()
        } else {
            b(self.pick(INTS))
        }
    }

    fn pick_name(&mut self, xs: &[&str]) -> Vec<u8> {
        let n = self.pick(xs);
        self.name(n)
    }

    /// A command name in a random case.
    fn name(&mut self, n: &str) -> Vec<u8> {
        match self.rng.random_range(0..4) {
            0 => n.to_ascii_lowercase().into_bytes(),
            1 => n
                .bytes()
                .enumerate()
                .map(|(i, c)| {
                    if i % 2 == 0 {
                        c.to_ascii_lowercase()
                    } else {
                        c
                    }
                })
                .collect(),
            _ => b(n),
        }
    }

    /// A relative time in seconds: in the past, or 100 s .. 1 day away, or invalid.
    fn rel_s(&mut self) -> Vec<u8> {
        if self.p(0.6) {
            return b(self.pick(&["100", "1000", "86400"]));
        }
        b(self.pick(&[
            "100",
            "1000",
            "86400",
            "0",
            "-1",
            "-100",
            "abc",
            "",
            "1.5",
            "9223372036854775807",
            "9223372036854775",
            "9223372036854776",
            "-9223372036854775808",
        ]))
    }

    /// A relative time in milliseconds (150 s and 2000 s, past, invalid).
    fn rel_ms(&mut self) -> Vec<u8> {
        if self.p(0.6) {
            return b(self.pick(&["150000", "2000000"]));
        }
        b(self.pick(&[
            "150000",
            "2000000",
            "0",
            "-1",
            "-5000",
            "x",
            "9223372036854775807",
            "9223372036854775000",
            "9223370000000000000",
            "-9223372036854775808",
        ]))
    }

    /// An absolute time in seconds. Future ones are never within a minute of
    /// `t0 + rel_s()` or `t0 + rel_ms()/1000`.
    fn abs_s(&mut self) -> Vec<u8> {
        let t = match self.rng.random_range(0..13) {
            0 | 9 => self.t0_s + 50,
            1 | 10 => self.t0_s + 500,
            2 | 11 => self.t0_s + 5000,
            3 | 12 => self.t0_s + 200_000,
            4 => self.t0_s - 100,
            5 => 1,
            6 => 0,
            7 => -1,
            _ => return b(self.pick(&["abc", "9223372036854775807", "9223372036854775"])),
        };
        t.to_string().into_bytes()
    }

    fn abs_ms(&mut self) -> Vec<u8> {
        let t = match self.rng.random_range(0..11) {
            0 | 8 => self.t0_ms + 70_007,
            1 | 9 => self.t0_ms + 700_007,
            2 | 10 => self.t0_ms + 7_000_007,
            3 => self.t0_ms - 100_000,
            4 => 1,
            5 => 0,
            6 => -1,
            _ => return b(self.pick(&["1e3", "9223372036854775807"])),
        };
        t.to_string().into_bytes()
    }

    fn exact_times(&self) -> HashSet<i64> {
        let mut s = HashSet::new();
        for d in [50, 500, 5000, 200_000] {
            s.insert(self.t0_s + d);
            s.insert((self.t0_s + d) * 1000);
        }
        for d in [70_007, 700_007, 7_000_007] {
            s.insert(self.t0_ms + d);
            s.insert((self.t0_ms + d + 500) / 1000);
        }
        s
    }

    /// An expiry option with its value, for SET and GETEX.
    fn expiry_opt(&mut self) -> Vec<Vec<u8>> {
        match self.rng.random_range(0..4) {
            0 => vec![self.name("EX"), self.rel_s()],
            1 => vec![self.name("PX"), self.rel_ms()],
            2 => vec![self.name("EXAT"), self.abs_s()],
            _ => vec![self.name("PXAT"), self.abs_ms()],
        }
    }

    /// SET's options: usually none or one, sometimes conflicting or bogus.
    fn set_opts(&mut self) -> Vec<Vec<u8>> {
        let n = match self.rng.random_range(0..20) {
            0..=7 => 0,
            8..=15 => 1,
            16..=18 => 2,
            _ => 3,
        };
        let mut out = Vec::new();
        for _ in 0..n {
            match self.rng.random_range(0..12) {
                0 => out.push(self.name("NX")),
                1 => out.push(self.name("XX")),
                2 | 3 => out.push(self.name("GET")),
                4 => out.push(self.name("KEEPTTL")),
                5 => out.push(self.pick_name(&["FOO", "PERSIST", "EXX", "N"])),
                // An expiry keyword with its value missing.
                6 => out.push(self.pick_name(&["EX", "PX", "EXAT", "PXAT"])),
                _ => out.extend(self.expiry_opt()),
            }
        }
        out
    }

    fn getex_opts(&mut self) -> Vec<Vec<u8>> {
        let n = match self.rng.random_range(0..10) {
            0..=2 => 0,
            3..=7 => 1,
            _ => 2,
        };
        let mut out = Vec::new();
        for _ in 0..n {
            match self.rng.random_range(0..8) {
                0 | 1 => out.push(self.name("PERSIST")),
                2 => out.push(self.pick_name(&["NX", "KEEPTTL", "GET", "FOO"])),
                3 => out.push(self.pick_name(&["EX", "PXAT"])),
                _ => out.extend(self.expiry_opt()),
            }
        }
        out
    }

    /// A float increment whose sums stay exact in binary (see the INCRBYFLOAT
    /// step), or an invalid one.
    fn float_incr(&mut self) -> Vec<u8> {
        if self.p(0.7) {
            let q = self.rng.random_range(-400i64..400) as f64 / 4.0;
            return q.to_string().into_bytes();
        }
        b(self.pick(&[
            "1e3",
            "-1.5e2",
            "0x10",
            "0x1p-2",
            "-0x.8",
            "abc",
            "",
            " 1",
            "1 ",
            "nan",
            "inf",
            "-inf",
            "3.0",
            "+2.5",
            ".5",
            "5.",
            "1e",
            "0x",
            "1e5000",
            "-1e5000",
            "1e-5000",
            "\u{20ac}1",
            "-\u{e9}",
        ]))
    }
}

/// Whether INCRBYFLOAT on `cur` gives the same result in f64 (Ember) and in
/// long double (Redis): a missing key, a value that is no float at all, or a
/// small multiple of 1/4 (every sum of such values is exact in both).
fn float_safe(cur: &Reply) -> bool {
    let v = match cur {
        Reply::Null => return true,
        Reply::Bulk(v) => v,
        _ => return false,
    };
    let Ok(s) = std::str::from_utf8(v) else {
        return true;
    };
    let lower = s.to_ascii_lowercase();
    if lower.contains("0x") {
        // Hex floats: exact when short.
        return s.len() <= 8;
    }
    match s.parse::<f64>() {
        Ok(f) if f.is_finite() => f.abs() < (1u64 << 40) as f64 && (f * 4.0).fract() == 0.0,
        Ok(_) => true,
        Err(_) => true,
    }
}

/// Redis's arities for the commands of the mix (wrong-arity requests).
const ARITIES: &[(&str, i32)] = &[
    ("GET", 2),
    ("SET", -3),
    ("SETNX", 3),
    ("SETEX", 4),
    ("PSETEX", 4),
    ("GETSET", 3),
    ("GETDEL", 2),
    ("GETEX", -2),
    ("MGET", -2),
    ("MSET", -3),
    ("MSETNX", -3),
    ("APPEND", 3),
    ("STRLEN", 2),
    ("GETRANGE", 4),
    ("SUBSTR", 4),
    ("SETRANGE", 4),
    ("INCR", 2),
    ("DECR", 2),
    ("INCRBY", 3),
    ("DECRBY", 3),
    ("INCRBYFLOAT", 3),
    ("DEL", -2),
    ("UNLINK", -2),
    ("EXISTS", -2),
    ("TYPE", 2),
    ("RENAME", 3),
    ("RENAMENX", 3),
    ("DBSIZE", 1),
    ("SELECT", 2),
    ("EXPIRE", -3),
    ("PEXPIRE", -3),
    ("EXPIREAT", -3),
    ("PEXPIREAT", -3),
    ("TTL", 2),
    ("PTTL", 2),
    ("PERSIST", 2),
    ("EXPIRETIME", 2),
    ("PEXPIRETIME", 2),
    ("TOUCH", -2),
    ("OBJECT", -2),
    ("ECHO", 2),
    ("KEYS", 2),
    ("SCAN", -2),
];

/// Touches every key of the current database (EXISTS, compared).
///
/// Redis 7.0 keeps a key whose expiry has passed (SET ... EXAT <past> leaves
/// one) in its table until something touches it or its expiry cycle samples
/// it. Until then DBSIZE counts it, and SCAN ... TYPE none even returns it
/// (the type check's lookup deletes the key, then the expiry filter no longer
/// sees it). Ember deletes such keys at once; both are consistent once every
/// key was touched, which is what this does before DBSIZE and SCAN.
fn touch_all(d: &mut Diff) {
    let mut ex = vec![b("EXISTS")];
    ex.extend(KEYS.iter().map(|k| k.to_vec()));
    d.exact(&ex);
}

/// One random step: one command, or a few related ones.
fn step(d: &mut Diff, g: &mut Gen) {
    let k = g.key();
    let roll = g.rng.random_range(0..1000);
    match roll {
        0..=89 => {
            let args = vec![g.name("GET"), k];
            d.exact(&args);
        }
        90..=199 => {
            let mut args = vec![g.name("SET"), k.clone(), g.val()];
            let opts = g.set_opts();
            let with_get = opts.iter().any(|o| o.eq_ignore_ascii_case(b"get"));
            args.extend(opts);
            let r = d.exact(&args);
            // OBJECT ENCODING/REFCOUNT only right after a SET that wrote: after
            // APPEND/SETRANGE Redis reports "raw" for short strings, which
            // Ember (no in-memory object) does not model.
            if r == Reply::ok() && !with_get && g.p(0.4) {
                let sub = g.pick(&["ENCODING", "REFCOUNT"]);
                d.exact(&[g.name("OBJECT"), g.name(sub), k]);
            }
        }
        200..=219 => {
            d.exact(&[g.name("SETNX"), k, g.val()]);
        }
        220..=239 => {
            let (cmd, t) = if g.p(0.5) {
                ("SETEX", g.rel_s())
            } else {
                ("PSETEX", g.rel_ms())
            };
            d.exact(&[g.name(cmd), k, t, g.val()]);
        }
        240..=259 => {
            d.exact(&[g.name("GETSET"), k, g.val()]);
        }
        260..=279 => {
            d.exact(&[g.name("GETDEL"), k]);
        }
        280..=309 => {
            let mut args = vec![g.name("GETEX"), k];
            args.extend(g.getex_opts());
            d.exact(&args);
        }
        310..=339 => {
            let mut args = vec![g.name("MGET")];
            for _ in 0..g.rng.random_range(1..5) {
                args.push(g.key());
            }
            d.exact(&args);
        }
        340..=369 => {
            let cmd = if g.p(0.6) { "MSET" } else { "MSETNX" };
            let mut args = vec![g.name(cmd)];
            for _ in 0..g.rng.random_range(1..4) {
                args.push(g.key());
                args.push(g.val());
            }
            if g.p(0.05) {
                args.pop(); // odd number of arguments
            }
            d.exact(&args);
        }
        370..=399 => {
            d.exact(&[g.name("APPEND"), k, g.val()]);
        }
        400..=414 => {
            d.exact(&[g.name("STRLEN"), k]);
        }
        415..=444 => {
            let cmd = if g.p(0.9) { "GETRANGE" } else { "SUBSTR" };
            let r = |g: &mut Gen| {
                b(g.pick(&[
                    "0",
                    "1",
                    "2",
                    "5",
                    "-1",
                    "-2",
                    "-5",
                    "-100",
                    "100",
                    "9223372036854775807",
                    "-9223372036854775808",
                    "abc",
                    "1.5",
                    "",
                ]))
            };
            d.exact(&[g.name(cmd), k, r(g), r(g)]);
        }
        445..=469 => {
            let off = b(g.pick(&[
                "0",
                "1",
                "3",
                "10",
                "50",
                "100",
                "-1",
                "abc",
                "536870912",
                "9223372036854775807",
            ]));
            let v = if g.p(0.15) { Vec::new() } else { g.val() };
            d.exact(&[g.name("SETRANGE"), k, off, v]);
        }
        470..=569 => {
            let (cmd, arg) = match g.rng.random_range(0..4) {
                0 => ("INCR", None),
                1 => ("DECR", None),
                2 => ("INCRBY", Some(g.int())),
                _ => ("DECRBY", Some(g.int())),
            };
            let mut args = vec![g.name(cmd), k.clone()];
            args.extend(arg);
            let r = d.exact(&args);
            if matches!(r, Reply::Integer(_)) && g.p(0.3) {
                let sub = g.pick(&["ENCODING", "REFCOUNT"]);
                d.exact(&[g.name("OBJECT"), g.name(sub), k]);
            }
        }
        570..=604 => {
            // Ember computes in f64 where Redis uses long double: only sums that
            // are exact in both are compared (see float_safe).
            let cur = d.exact(&[b("GET"), k.clone()]);
            if float_safe(&cur) {
                d.exact(&[g.name("INCRBYFLOAT"), k, g.float_incr()]);
            }
        }
        605..=634 => {
            let cmd = if g.p(0.5) { "DEL" } else { "UNLINK" };
            let mut args = vec![g.name(cmd)];
            for _ in 0..g.rng.random_range(1..4) {
                args.push(g.key());
            }
            d.exact(&args);
        }
        635..=659 => {
            let cmd = if g.p(0.6) { "EXISTS" } else { "TOUCH" };
            let mut args = vec![g.name(cmd)];
            for _ in 0..g.rng.random_range(1..5) {
                args.push(g.key());
            }
            d.exact(&args);
        }
        660..=669 => {
            d.exact(&[g.name("TYPE"), k]);
        }
        670..=689 => {
            let cmd = if g.p(0.5) { "RENAME" } else { "RENAMENX" };
            let dst = if g.p(0.1) { k.clone() } else { g.key() };
            d.exact(&[g.name(cmd), k, dst]);
        }
        690..=699 => {
            touch_all(d);
            d.exact(&[g.name("DBSIZE")]);
        }
        700..=703 => {
            let mut args = vec![g.pick_name(&["FLUSHDB", "FLUSHDB", "FLUSHALL"])];
            if g.p(0.3) {
                args.push(b(g.pick(&["ASYNC", "sync", "now"])));
            }
            d.exact(&args);
        }
        704..=723 => {
            let target = match g.rng.random_range(0..10) {
                0..=7 => g.rng.random_range(0..4).to_string(),
                _ => g
                    .pick(&[
                        "16",
                        "-1",
                        "abc",
                        "",
                        "2147483647",
                        "2147483648",
                        "-2147483649",
                        "99999999999",
                        "1.0",
                        "01",
                    ])
                    .to_string(),
            };
            d.exact(&[g.name("SELECT"), b(&target)]);
        }
        724..=773 => {
            // Relative times with GT/LT are racy (two keys expiring "in 100 s"
            // set a few ms apart compare either way): GT/LT go with past times
            // only, and with EXPIREAT/PEXPIREAT.
            let (cmd, mut t, relative) = match g.rng.random_range(0..4) {
                0 => ("EXPIRE", g.rel_s(), true),
                1 => ("PEXPIRE", g.rel_ms(), true),
                2 => ("EXPIREAT", g.abs_s(), false),
                _ => ("PEXPIREAT", g.abs_ms(), false),
            };
            let mut opts = Vec::new();
            let n = match g.rng.random_range(0..10) {
                0..=4 => 0,
                5..=8 => 1,
                _ => 2,
            };
            for _ in 0..n {
                opts.push(g.pick_name(&["NX", "XX", "GT", "LT", "NX", "XX", "GT", "LT", "FOO"]));
            }
            let cmp_opt = opts
                .iter()
                .any(|o| o.eq_ignore_ascii_case(b"gt") || o.eq_ignore_ascii_case(b"lt"));
            if relative && cmp_opt {
                let positive = std::str::from_utf8(&t)
                    .ok()
                    .and_then(|s| s.parse::<i64>().ok())
                    .is_some_and(|n| n > 0);
                if positive {
                    t = b("-1");
                }
            }
            let mut args = vec![g.name(cmd), k, t];
            args.extend(opts);
            d.exact(&args);
        }
        774..=813 => {
            let (cmd, tol) = match g.rng.random_range(0..4) {
                0 => ("TTL", 2),
                1 => ("PTTL", 2000),
                2 => ("EXPIRETIME", 2),
                _ => ("PEXPIRETIME", 2000),
            };
            d.call(&[g.name(cmd), k], Cmp::Ttl { tol });
        }
        814..=828 => {
            d.exact(&[g.name("PERSIST"), k]);
        }
        829..=843 => {
            let pat = g.pick(PATTERNS).to_vec();
            d.call(&[g.name("KEYS"), pat], Cmp::Sorted);
        }
        844..=858 => {
            let mut opts = Vec::new();
            if g.p(0.5) {
                opts.push(g.name("MATCH"));
                opts.push(g.pick(PATTERNS).to_vec());
            }
            if g.p(0.5) {
                opts.push(g.name("COUNT"));
                opts.push(g.rng.random_range(1..20).to_string().into_bytes());
            }
            touch_all(d);
            if g.p(0.2) {
                opts.push(g.name("TYPE"));
                opts.push(b(g.pick(&["string", "STRING", "list", "none"])));
            }
            d.scan_all(&opts);
        }
        859..=866 => {
            // SCAN with odd arguments: errors exactly, pages by shape only.
            let cursor = b(g.pick(&[
                "0",
                "abc",
                "",
                "-1",
                "+0",
                " 0",
                "0 ",
                "18446744073709551616",
                "1.5",
            ]));
            let mut args = vec![g.name("SCAN"), cursor];
            match g.rng.random_range(0..6) {
                0 => args.extend([b("COUNT"), b(g.pick(&["0", "-1", "abc", ""]))]),
                1 => args.push(b("COUNT")),
                2 => args.push(b("MATCH")),
                3 => args.extend([b("FOO"), b("1")]),
                4 => args.extend([b("TYPE"), b("string"), b("COUNT")]),
                _ => {}
            }
            d.call(&args, Cmp::ErrorOrArray);
        }
        867..=881 => {
            let v = g.val();
            match g.rng.random_range(0..4) {
                0 => d.exact(&[g.name("PING")]),
                1 => d.exact(&[g.name("PING"), v]),
                2 => d.exact(&[g.name("PING"), v.clone(), v]),
                _ => d.exact(&[g.name("ECHO"), v]),
            };
        }
        882..=921 => {
            // A wrong number of arguments.
            let (name, arity) = ARITIES[g.rng.random_range(0..ARITIES.len())];
            let n = if arity > 0 {
                if g.p(0.5) && arity > 1 {
                    arity - 1
                } else {
                    arity + 1
                }
            } else if -arity > 1 {
                g.rng.random_range(1..-arity)
            } else {
                return;
            };
            let mut args = vec![g.name(name)];
            for _ in 1..n {
                args.push(g.key());
            }
            d.exact(&args);
        }
        922..=941 => {
            // Unknown commands (names neither server has), args echoed back.
            let name = b(g.pick(&["FOO", "GETT", "setx", "", "get\x00", "KEYSPACE", "x y"]));
            let mut args = vec![name];
            for _ in 0..g.rng.random_range(0..4) {
                let a = match g.rng.random_range(0..4) {
                    0 => "a".repeat(g.rng.random_range(50..200)).into_bytes(),
                    1 => b"ab\x00cd".to_vec(),
                    2 => b"new\r\nline".to_vec(),
                    _ => g.key(),
                };
                args.push(a);
            }
            d.exact(&args);
        }
        942..=956 => {
            // OBJECT on a missing key, with unknown subcommands, wrong arity.
            let args = match g.rng.random_range(0..4) {
                0 => vec![g.name("OBJECT"), b("ENCODING"), b("no-such-key")],
                1 => vec![g.name("OBJECT"), b(g.pick(&["FOO", "encodingx", ""])), k],
                2 => vec![g.name("OBJECT"), b("ENCODING")],
                _ => vec![g.name("OBJECT"), b("REFCOUNT"), k.clone(), k],
            };
            d.exact(&args);
        }
        _ => {
            // An expiry set, then read back on the same key (random keys
            // rarely carry one, as SET and friends clear it).
            let set = match g.rng.random_range(0..6) {
                0 => vec![g.name("SETEX"), k.clone(), g.rel_s(), g.val()],
                1 => {
                    let mut a = vec![g.name("SET"), k.clone(), g.val()];
                    a.extend(g.expiry_opt());
                    a
                }
                2 => vec![g.name("EXPIREAT"), k.clone(), g.abs_s()],
                3 => vec![g.name("PEXPIREAT"), k.clone(), g.abs_ms()],
                4 => vec![g.name("EXPIRE"), k.clone(), g.rel_s()],
                _ => {
                    let mut a = vec![g.name("GETEX"), k.clone()];
                    a.extend(g.expiry_opt());
                    a
                }
            };
            d.exact(&set);
            for _ in 0..g.rng.random_range(1..3) {
                let (cmd, tol) = match g.rng.random_range(0..5) {
                    0 => ("TTL", 2),
                    1 => ("PTTL", 2000),
                    2 => ("EXPIRETIME", 2),
                    3 => ("PEXPIRETIME", 2000),
                    _ => ("PERSIST", 0),
                };
                d.call(&[g.name(cmd), k.clone()], Cmp::Ttl { tol });
            }
        }
    }
}

fn steps_per_seed() -> usize {
    std::env::var("EMBER_DIFF_STEPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1500)
}

fn report(d: &Diff) {
    if d.failures.is_empty() {
        return;
    }
    let shown: Vec<&String> = d.failures.iter().take(30).collect();
    panic!(
        "{} divergence(s) between Ember and redis-server:\n{}",
        d.failures.len(),
        shown
            .iter()
            .map(|s| s.as_str())
            .collect::<Vec<_>>()
            .join("\n\n")
    );
}

#[test]
fn random_sequences_match_redis() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let ember = Server::start(dir.path(), &[]);
    let mut d = Diff::new(&ember, redis.port);
    let seeds: Vec<u64> = match std::env::var("EMBER_DIFF_SEED") {
        Ok(s) => vec![s.parse().expect("EMBER_DIFF_SEED: a number")],
        Err(_) => vec![1, 2, 3, 4, 0x5eed_e3be],
    };
    let t = Instant::now();
    for &seed in &seeds {
        println!("serve_diff: seed {seed}");
        d.reset();
        d.label = format!("seed {seed}");
        d.steps = 0;
        let t0_ms = now_ms();
        let mut g = Gen {
            rng: SmallRng::seed_from_u64(seed),
            t0_s: t0_ms / 1000,
            t0_ms,
        };
        d.exact_times = g.exact_times();
        for _ in 0..steps_per_seed() {
            step(&mut d, &mut g);
            if d.failures.len() >= 100 {
                break;
            }
        }
    }
    println!(
        "serve_diff: {} requests over {} seeds in {:?}, {} divergences",
        d.total,
        seeds.len(),
        t.elapsed(),
        d.failures.len()
    );
    for (cmd, ks) in &d.kinds {
        let ks: Vec<String> = ks.iter().map(|(k, n)| format!("{k} {n}")).collect();
        println!("  {cmd:<12} {}", ks.join(", "));
    }
    report(&d);
}

/// Curated edge cases, one request per line in redis-cli quoting. `~` first:
/// compared as sets (KEYS); `?` first: errors exactly, arrays by shape (SCAN
/// from an odd cursor). `{FAR}`-style placeholders are absolute times.
const EDGE_CASES: &str = r#"
# Arity, unknown commands.
GET
GET a b
SET k
SETEX k 10
PSETEX k 10
MSET a
MSET a 1 b
MSETNX a 1 b
GETEX
GETRANGE k 0
SETRANGE k 0
EXPIRE k
EXPIREAT k
PEXPIRE k
TTL
TTL a b
OBJECT
OBJECT ENCODING
OBJECT ENCODING a b
OBJECT REFCOUNT
PING a b
ECHO
ECHO a b
SELECT
DBSIZE x
KEYS
KEYS a b
SCAN
RENAME a
DEL
EXISTS
TOUCH
FLUSHDB ASYNC x
FLUSHDB x
FLUSHALL now
FOO
FOO bar "b a z"
""
"get\x00"
"object|encoding" k
"\xff\xfe" "caf\xc3" "\xc3\xa9t\xe9"
aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa x
OBJECT FOO k
object encodingx k
OBJECT "enc\x00oding" k
OBJECT "\xffx" k
OBJECT aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa k

# SET: option combinations, bad numbers, expiry overflow.
SET k v NX XX
SET k v XX NX
SET k v EX 10 PX 100
SET k v PX 100 EXAT 10
SET k v KEEPTTL EX 10
SET k v EX 10 KEEPTTL
SET k v KEEPTTL KEEPTTL
SET k v NX NX
SET k v GET GET
SET k v EX
SET k v EX 10 EX
SET k v FOO
SET k v PERSIST
SET k v EX 0
SET k v EX -1
SET k v PX 0
SET k v EXAT 0
SET k v PXAT -1
SET k v EX abc
SET k v EX ""
SET k v EX 1.5
SET k v EX " 10"
SET k v EX 9223372036854775807
SET k v EX 9223372036854775
SET k v EX 9223372036854775808
SET k v PX 9223372036854775807
SET k v EXAT 9223372036854775807
SET k v EX 100 EX 0
SET k v EX abc EX 100
GET k
SET k v2 NX GET
SET k v3 NX
GET k
SET k v4 XX GET
SET missing v XX GET
SET missing v XX
EXISTS missing
SET missing2 v NX GET
GET missing2
SET k v GET EX 0
SET k v GET EX abc
SET k v PXAT 1 GET
EXISTS k
SET k v EXAT {PAST}
GET k

# SETNX, SETEX, PSETEX, GETSET, GETDEL.
SETNX n1 a
SETNX n1 b
GET n1
SETEX n1 0 v
SETEX n1 -5 v
SETEX n1 abc v
SETEX n1 9223372036854775807 v
PSETEX n1 0 v
PSETEX n1 9223372036854775807 v
GETSET n1 c
GETSET nope c
GETDEL nope
GETDEL n1
GETDEL n1
GETDEL nope

# GETEX: syntax first, then the key, then the time.
SET g v EXAT {FAR}
GETEX nope EX abc
GETEX nope EX 0
GETEX nope PX -1
GETEX nope FOO
GETEX nope EX
GETEX g EX abc
GETEX g EX 0
GETEX g EX -1
GETEX g EXAT 0
GETEX g EX 9223372036854775807
GETEX g PERSIST EX 10
GETEX g EX 10 PERSIST
GETEX g EX 10 PX 10
GETEX g KEEPTTL
GETEX g NX
GETEX g GET
EXPIRETIME g
GETEX g
EXPIRETIME g
GETEX g PERSIST PERSIST
EXPIRETIME g
GETEX g EXAT {FAR2} EXAT {FAR}
EXPIRETIME g
GETEX g PXAT {FAR_MS}
PEXPIRETIME g
GETEX g PXAT {PAST_MS}
EXISTS g

# INCR family: overflow, non-integers.
SET n 9223372036854775807
INCR n
INCRBY n 1
DECRBY n -1
DECRBY n -9223372036854775808
DECRBY n 9223372036854775807
GET n
SET n -9223372036854775808
DECR n
INCRBY n -1
INCRBY n 9223372036854775807
INCRBY n abc
INCRBY n ""
INCRBY n 9223372036854775808
INCRBY n 1.5
INCRBY n " 1"
INCRBY n 007
DECRBY n +1
SET s abc
INCR s
SET s " 1"
INCR s
SET s "1 "
INCR s
SET s 007
INCR s
SET s -0
INCR s
SET s +1
DECR s
SET s 12345678901234567890
INCR s
SET s ""
INCR s
SET s 1.0
INCR s
INCR fresh
DECR fresh2
INCRBY fresh3 -5
TTL fresh3

# INCRBYFLOAT: exact sums only (f64 vs long double, see float_safe).
INCRBYFLOAT s 1
SET f 10.5
INCRBYFLOAT f 0.25
INCRBYFLOAT f -10.75
INCRBYFLOAT f 1e3
INCRBYFLOAT f 0x10
INCRBYFLOAT f 0x1p-2
INCRBYFLOAT f -0x.8
INCRBYFLOAT f 1.5E1
INCRBYFLOAT f +2.5
INCRBYFLOAT f .5
INCRBYFLOAT f 5.
INCRBYFLOAT f inf
INCRBYFLOAT f -inf
INCRBYFLOAT f Infinity
INCRBYFLOAT f nan
INCRBYFLOAT f 1e5000
INCRBYFLOAT f -1e5000
INCRBYFLOAT f 1e-5000
INCRBYFLOAT f 0e-5000
INCRBYFLOAT f ""
INCRBYFLOAT f " 1"
INCRBYFLOAT f "1 "
INCRBYFLOAT f 1e
INCRBYFLOAT f 0x
INCRBYFLOAT f abc
GET f
SET f 5e-20
INCRBYFLOAT f 0
SET f 1180591620717411303424
INCRBYFLOAT f 0
INCRBYFLOAT f -2361183241434822606848
SET f -0.5
INCRBYFLOAT f 0.5
SET f inf
INCRBYFLOAT f 1
SET f nan
INCRBYFLOAT f 1
SET f 3.0
INCRBYFLOAT f 0
SET f EXAT {FAR}
SET f 1.5 KEEPTTL
INCRBYFLOAT f 1
EXPIRETIME f
INCRBYFLOAT newf 2.5e0
# The command reference's example (not exact in binary, but the digits agree).
SET mykey 10.50
INCRBYFLOAT mykey 0.1
INCRBYFLOAT mykey -5
SET mykey 5.0e3
INCRBYFLOAT mykey 2.0e2

# GETRANGE / SUBSTR.
SET r "Hello World"
GETRANGE r 0 4
GETRANGE r -5 -1
GETRANGE r -1 -5
GETRANGE r 5 1
GETRANGE r -100 100
GETRANGE r 100 200
GETRANGE r 0 -100
GETRANGE r -100 -99
GETRANGE r -100 -100
GETRANGE r 10 10
GETRANGE r 11 11
GETRANGE r -9223372036854775808 9223372036854775807
GETRANGE r 9223372036854775807 -9223372036854775808
GETRANGE r abc 1
GETRANGE r 1 abc
GETRANGE r 1.5 2
GETRANGE nope 0 -1
GETRANGE nope abc 1
SUBSTR r 0 2
SET e ""
GETRANGE e 0 -1
GETRANGE e 0 0
GETRANGE e -1 0
SET i 12345
GETRANGE i 1 -2

# SETRANGE and APPEND.
SETRANGE r -1 x
SETRANGE r abc x
SETRANGE r 536870912 x
SETRANGE r 536870912 ""
SETRANGE r 9223372036854775807 x
SETRANGE r 9223372036854775807 ""
SETRANGE nope 5 ""
EXISTS nope
SETRANGE nope -1 ""
SETRANGE new 3 ab
GET new
SETRANGE new 0 ""
SETRANGE new 1 XYZW
GET new
SET tr v EXAT {FAR}
SETRANGE tr 0 w
APPEND tr x
EXPIRETIME tr
APPEND ap ""
EXISTS ap
STRLEN ap
APPEND ap abc
APPEND ap "\x00\xff"
GET ap
STRLEN ap
STRLEN nope

# Keys: RENAME, DEL, EXISTS, TYPE, TOUCH.
RENAME nope x
RENAMENX nope x
RENAME nope nope
RENAME r r
RENAMENX r r
SET t v EXAT {FAR}
RENAME t t2
EXPIRETIME t2
EXISTS t
SET t3 w
RENAMENX t2 t3
RENAME t2 t3
GET t3
EXPIRETIME t3
SET t4 plain
RENAME t4 t3
EXPIRETIME t3
DEL t3 t3 nope
EXISTS t3 t3 nope
UNLINK r new
TOUCH ap ap nope
TYPE ap
TYPE nope

# MSET / MSETNX / MGET.
MSETNX m1 1 m2 2
MSETNX m1 1 m3 3
EXISTS m3
MSETNX mx 1 mx 2
GET mx
MSET m1 a m1 b
MGET m1 m2 nope m1
SET m1 v EXAT {FAR}
MSET m1 c
EXPIRETIME m1

# SELECT.
SELECT 16
SELECT -1
SELECT abc
SELECT ""
SELECT 1.0
SELECT 01
SELECT 2147483647
SELECT 2147483648
SELECT -2147483648
SELECT -2147483649
SELECT 99999999999999999999
SELECT 1
GET ap
SET only1 x
DBSIZE
SELECT 0
EXISTS only1
SELECT 15
SELECT 0

# Expiry commands: options, overflow, absolute times, rounding.
SET e1 v
EXPIRE e1 100 NX XX
EXPIRE e1 100 NX GT
EXPIRE e1 100 NX LT
EXPIRE e1 100 GT LT
EXPIRE e1 100 FOO
EXPIRE e1 100 nx FOO
EXPIRE e1 abc FOO
EXPIRE e1 abc
EXPIRE e1 ""
EXPIRE e1 1.5
EXPIRE e1 9223372036854775807
EXPIRE e1 9223372036854775
EXPIRE e1 -9223372036854775808
PEXPIRE e1 9223372036854775807
EXPIREAT e1 9223372036854775807
EXPIREAT e1 -9223372036854775808
PEXPIRETIME e1
EXPIREAT e1 {FAR} GT
EXPIREAT e1 {FAR} XX
EXPIREAT e1 {FAR} LT
EXPIRETIME e1
PEXPIRETIME e1
EXPIREAT e1 {FAR2} LT
EXPIREAT e1 {FAR} GT
EXPIREAT e1 {FAR2} GT
EXPIREAT e1 {FAR2} GT
EXPIREAT e1 {FAR} XX LT
EXPIREAT e1 {FAR} NX
EXPIRETIME e1
PEXPIREAT e1 {FAR_MS_499}
EXPIRETIME e1
PEXPIREAT e1 {FAR_MS_500}
EXPIRETIME e1
PEXPIREAT e1 9223372036854775807
PEXPIRETIME e1
EXPIRETIME e1
PERSIST e1
PERSIST e1
EXPIRETIME e1
PEXPIRETIME e1
TTL e1
PTTL e1
EXPIRETIME nope
PEXPIRETIME nope
TTL nope
PTTL nope
PERSIST nope
EXPIRE nope 100
EXPIREAT nope {FAR}
EXPIRE e1 -1 LT
EXISTS e1
SET e1 v
EXPIRE e1 0 GT
EXPIRE e1 0
EXISTS e1
SET e1 v
PEXPIREAT e1 {PAST_MS}
EXISTS e1
SET e1 v
EXPIREAT e1 1
EXISTS e1
SET e1 v
EXPIREAT e1 0 NX
EXISTS e1
SET kt v EXAT {FAR}
SET kt v2 KEEPTTL
EXPIRETIME kt
GETSET kt v3
EXPIRETIME kt
SET kt v EXAT {FAR}
INCR kt
SET kt 5 KEEPTTL
INCR kt
EXPIRETIME kt
SET kt v4
EXPIRETIME kt

# OBJECT right after SET / INCR.
SET o 123
OBJECT ENCODING o
OBJECT REFCOUNT o
SET o 12345
OBJECT ENCODING o
OBJECT REFCOUNT o
SET o abc
OBJECT ENCODING o
OBJECT REFCOUNT o
SET o aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa
OBJECT ENCODING o
SET o aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa
OBJECT ENCODING o
SET o -0
OBJECT ENCODING o
SET o 007
OBJECT ENCODING o
SET o 9223372036854775807
OBJECT ENCODING o
SET o 9223372036854775808
OBJECT ENCODING o
SET o -9223372036854775808
OBJECT ENCODING o
SET o ""
OBJECT ENCODING o
SET o 0
OBJECT REFCOUNT o
SET o 9999
OBJECT REFCOUNT o
SET o 10000
OBJECT REFCOUNT o
SET o -1
OBJECT REFCOUNT o
INCR o
OBJECT ENCODING o
OBJECT REFCOUNT o
INCRBY o 20000
OBJECT REFCOUNT o
OBJECT ENCODING nope
OBJECT REFCOUNT nope

# KEYS and SCAN.
FLUSHDB
MSET "" 1 a 2 ab 3 "h*llo" 4 "h?llo" 5 "[x]" 6 "\x00\xff" 7 "a\\b" 8 key:1 9 key:2 10
~KEYS *
~KEYS **
~KEYS ""
~KEYS ?
~KEYS ?*
~KEYS a*
~KEYS *b
~KEYS h\*llo
~KEYS h?llo
~KEYS [
~KEYS [a
~KEYS [^a]*
~KEYS [\]]
~KEYS \[x\]
~KEYS *\\*
~KEYS \
~KEYS key:[1-2]
~KEYS key:[2-1]
~KEYS "\x00*"
~KEYS "[\x01-\xfe]*"
~KEYS "*[x]*"
# Glob corner cases (Redis's stringmatchlen): empty and unterminated
# classes, ranges ending in ] or \, escapes in classes, signed high bytes,
# and a pattern an exponential matcher never finishes on.
MSET "]" 1 "-" 2 "^" 3 "\\" 4 "A" 5 "_" 6 "\xe1" 7 "\xff" 8 "a-" 9 "[" 10 "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa" 11
~KEYS []
~KEYS []]
~KEYS [^]
~KEYS []a]
~KEYS [a-]
~KEYS [a-
~KEYS [^
~KEYS [\\
~KEYS "[a-]x]"
~KEYS "[Z-\\]"
~KEYS "[\\-]"
~KEYS "[\\^a]"
~KEYS "[\x80-a]"
~KEYS "[a-\xff]"
~KEYS "[\xff-\x80]"
~KEYS "*[\xe1]"
~KEYS [A-a]
~KEYS [a-A]
~KEYS [^-a]*
~KEYS a[-]
~KEYS \\
~KEYS \\\\
~KEYS *\\
~KEYS [*]
~KEYS ?[?]*
~KEYS "a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*b"
~KEYS "a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a"
~KEYS "*a*a*a*a*a*a*a*a*a*a*?*a*a*a*a*a*a*a*a*a*a*"
SCAN abc
SCAN " 0"
SCAN "0 "
SCAN 1.5
SCAN 0x10
SCAN 18446744073709551616
SCAN -18446744073709551616
SCAN 0 COUNT 0
SCAN 0 COUNT -1
SCAN 0 COUNT abc
SCAN 0 COUNT
SCAN 0 MATCH
SCAN 0 FOO bar
SCAN 0 TYPE
SCAN abc COUNT 0
?SCAN ""
?SCAN +0
?SCAN -1
?SCAN 18446744073709551615
?SCAN 0 COUNT 1 MATCH * TYPE string
?SCAN "0\x00junk"
TYPE a
TYPE nope
DBSIZE
FLUSHDB SYNC
DBSIZE
FLUSHALL ASYNC
DBSIZE

# DEBUG is refused unless enable-debug-command allows it (default no).
DEBUG
DEBUG SLEEP 0
DEBUG HELP

# PING, ECHO.
PING
PING hello
PING ""
ECHO ""
ECHO "a\r\nb"
"#;

/// Random glob patterns over an alphabet of every special byte, against
/// keys over the same alphabet: KEYS and SCAN MATCH give the same sets.
/// `EMBER_DIFF_SEED` replays one seed.
#[test]
fn glob_patterns_match_redis() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let ember = Server::start(dir.path(), &[]);
    let mut d = Diff::new(&ember, redis.port);
    d.reset();
    d.label = "glob patterns".into();
    let seed = std::env::var("EMBER_DIFF_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(31);
    let mut rng = SmallRng::seed_from_u64(seed);
    const ALPHABET: &[u8] = b"abA-*?[]^\\\xe1";
    let word = |rng: &mut SmallRng, max: usize| -> Vec<u8> {
        let n = rng.random_range(0..=max);
        (0..n)
            .map(|_| ALPHABET[rng.random_range(0..ALPHABET.len())])
            .collect()
    };
    let mut mset = vec![b("MSET")];
    for _ in 0..60 {
        mset.push(word(&mut rng, 5));
        mset.push(b("1"));
    }
    d.exact(&mset);
    for i in 0..400 {
        let pat = word(&mut rng, 8);
        d.call(&[b("KEYS"), pat.clone()], Cmp::Sorted);
        if i % 4 == 0 {
            d.scan_all(&[b("MATCH"), pat, b("COUNT"), b("7")]);
        }
    }
    println!("serve_diff: {} glob requests compared", d.total);
    report(&d);
}

#[test]
fn edge_case_errors_match_redis() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let ember = Server::start(dir.path(), &[]);
    let mut d = Diff::new(&ember, redis.port);
    d.reset();
    d.label = "edge cases".into();
    let now = now_ms() / 1000;
    let subst = [
        ("{FAR}", now + 100_000),
        ("{FAR2}", now + 200_000),
        ("{PAST}", now - 100),
        ("{FAR_MS}", (now + 100_000) * 1000 + 123),
        ("{FAR_MS_499}", (now + 100_000) * 1000 + 499),
        ("{FAR_MS_500}", (now + 100_000) * 1000 + 500),
        ("{PAST_MS}", (now - 100) * 1000),
    ];
    for line in EDGE_CASES.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (cmp, line) = match line.as_bytes()[0] {
            b'~' => (Cmp::Sorted, &line[1..]),
            b'?' => (Cmp::ErrorOrArray, &line[1..]),
            _ => (Cmp::Exact, line),
        };
        let mut line = line.to_string();
        for (k, v) in subst {
            line = line.replace(k, &v.to_string());
        }
        let args = split_args(line.as_bytes()).expect("edge case quoting");
        // TTL and PTTL of keys with an expiry depend on the moment.
        let cmp = if matches!(&args[0][..], b"TTL" | b"PTTL") {
            Cmp::Ttl { tol: 2000 }
        } else {
            cmp
        };
        d.call(&args, cmp);
    }
    println!("serve_diff: {} edge cases compared", d.total);
    report(&d);
}

/// Runs a mix of random steps against both servers for each seed
/// (`EMBER_DIFF_SEED` replays one) and fails listing the divergences.
fn run_mix(label: &str, default_seeds: &[u64], step: fn(&mut Diff, &mut Gen)) {
    run_mix_in(label, default_seeds, step, false)
}

/// [`run_mix`] with both connections in RESP3 (`resp3`) or RESP2.
fn run_mix_in(label: &str, default_seeds: &[u64], step: fn(&mut Diff, &mut Gen), resp3: bool) {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let ember = Server::start(dir.path(), &[]);
    let mut d = Diff::new(&ember, redis.port);
    d.resp3 = resp3;
    let seeds: Vec<u64> = match std::env::var("EMBER_DIFF_SEED") {
        Ok(s) => vec![s.parse().expect("EMBER_DIFF_SEED: a number")],
        Err(_) => default_seeds.to_vec(),
    };
    for &seed in &seeds {
        d.reset();
        d.label = format!("{label} seed {seed}");
        d.steps = 0;
        let t0_ms = now_ms();
        let mut g = Gen {
            rng: SmallRng::seed_from_u64(seed),
            t0_s: t0_ms / 1000,
            t0_ms,
        };
        for _ in 0..steps_per_seed() {
            step(&mut d, &mut g);
            if d.failures.len() >= 30 {
                break;
            }
        }
    }
    println!("serve_diff: {} {label} requests compared", d.total);
    report(&d);
}

/// Hash fields: short ones that collide, empty and numeric-looking ones.
const FIELDS: &[&[u8]] = &[
    b"f1",
    b"f2",
    b"f3",
    b"f4",
    b"f5",
    b"",
    b"007",
    b"-0",
    b"x y",
    b"\x00\xff",
];

/// Floats whose sums are exact in binary (see `float_safe`).
const SAFE_FLOATS: &[&str] = &["1.5", "-2.25", "10", "0.5", "-0", "3e2", "abc", "inf", ""];

impl Gen {
    fn field(&mut self) -> Vec<u8> {
        if self.p(0.8) {
            self.pick(FIELDS).to_vec()
        } else {
            format!("g{}", self.rng.random_range(0..600)).into_bytes()
        }
    }

    /// A hash value: mostly short, sometimes past the listpack's 64 bytes.
    fn hval(&mut self) -> Vec<u8> {
        if self.p(0.03) {
            vec![b'v'; self.rng.random_range(60..70)]
        } else {
            self.val()
        }
    }
}

/// Compares an order-dependent reply of a hash: exactly while Redis keeps it
/// as a listpack (insertion order, as Ember's inline hashes), else as a set
/// (of pairs when `pairs`).
fn hash_order_cmp(d: &mut Diff, key: &[u8], pairs: bool) -> Cmp {
    let enc = d.redis.call(&[b("OBJECT"), b("ENCODING"), key.to_vec()]);
    match enc {
        Reply::Bulk(e) if e == b"hashtable" => {
            if pairs {
                Cmp::SortedPairs
            } else {
                Cmp::Sorted
            }
        }
        _ => Cmp::Exact,
    }
}

/// One random step of the hash mix.
fn hash_step(d: &mut Diff, g: &mut Gen) {
    let k = b(g.pick(&["h1", "h2", "h3", "s1"]));
    match g.rng.random_range(0..100) {
        0..=24 => {
            let cmd = if g.p(0.85) { "HSET" } else { "HMSET" };
            let mut args = vec![g.name(cmd), k];
            for _ in 0..g.rng.random_range(1..4) {
                args.push(g.field());
                args.push(g.hval());
            }
            if g.p(0.04) {
                args.pop();
            }
            d.exact(&args);
        }
        25..=29 => {
            d.exact(&[g.name("HSETNX"), k, g.field(), g.hval()]);
        }
        30..=39 => {
            d.exact(&[g.name("HGET"), k, g.field()]);
        }
        40..=43 => {
            let mut args = vec![g.name("HMGET"), k];
            for _ in 0..g.rng.random_range(0..4) {
                args.push(g.field());
            }
            d.exact(&args);
        }
        44..=51 => {
            let mut args = vec![g.name("HDEL"), k];
            for _ in 0..g.rng.random_range(0..4) {
                args.push(g.field());
            }
            d.exact(&args);
        }
        52..=55 => {
            let cmd = g.pick_name(&["HLEN", "TYPE", "EXISTS"]);
            d.exact(&[cmd, k]);
        }
        56..=59 => {
            let cmd = g.pick_name(&["HEXISTS", "HSTRLEN"]);
            d.exact(&[cmd, k, g.field()]);
        }
        60..=64 => {
            let by = g.int();
            d.exact(&[g.name("HINCRBY"), k, g.field(), by]);
        }
        65..=67 => {
            // Only on fields whose value is absent or a short exact float.
            let f = g.field();
            let cur = d.redis.call(&[b("HGET"), k.clone(), f.clone()]);
            if float_safe(&cur) {
                let by = b(g.pick(SAFE_FLOATS));
                d.exact(&[g.name("HINCRBYFLOAT"), k, f, by]);
            }
        }
        68..=73 => {
            let cmd = g.pick(&["HGETALL", "HKEYS", "HVALS"]);
            let cmp = hash_order_cmp(d, &k, cmd == "HGETALL");
            d.call(&[g.name(cmd), k], cmp);
        }
        74..=77 => {
            let mut opts = Vec::new();
            if g.p(0.4) {
                opts.extend([b("MATCH"), b(g.pick(&["f*", "*", "g1?", "[fg]2*"]))]);
            }
            if g.p(0.4) {
                opts.extend([b("COUNT"), b(g.pick(&["1", "5", "100", "0", "x"]))]);
            }
            d.scan_all_of(&[b("HSCAN"), k], &opts, true);
        }
        78..=80 => {
            d.exact(&[g.name("OBJECT"), b("ENCODING"), k]);
        }
        81..=82 => {
            // A big HSET: past the listpack's 512 entries.
            let mut args = vec![g.name("HSET"), k];
            for i in 0..g.rng.random_range(480..530) {
                args.push(format!("g{i}").into_bytes());
                args.push(g.val());
            }
            d.exact(&args);
        }
        83..=85 => {
            d.exact(&[g.name("SET"), k, g.val()]);
        }
        86..=87 => {
            d.exact(&[g.name("GET"), k]);
        }
        88..=89 => {
            d.exact(&[g.name("DEL"), k]);
        }
        90..=91 => {
            let dst = b(g.pick(&["h1", "h2", "h3", "s1"]));
            let cmd = g.pick_name(&["RENAME", "RENAMENX"]);
            d.exact(&[cmd, k, dst]);
        }
        92..=93 => {
            let ttl = b(g.pick(&["1000", "-1", "0"]));
            d.exact(&[g.name("EXPIRE"), k.clone(), ttl]);
            d.call(&[b("TTL"), k], Cmp::Ttl { tol: 2 });
        }
        94 => {
            d.exact(&[g.name("PERSIST"), k]);
        }
        95..=97 => {
            // The error paths of HRANDFIELD; its picks are random, compared
            // by shape only.
            let count = b(g.pick(&[
                "1",
                "-3",
                "0",
                "5",
                "x",
                "-9223372036854775808",
                "9223372036854775807",
            ]));
            let mut args = vec![g.name("HRANDFIELD"), k, count];
            if g.p(0.5) {
                args.push(b(g.pick(&["WITHVALUES", "withvalues", "bad"])));
            }
            d.call(&args, Cmp::ErrorOrArray);
        }
        _ => {
            let args = [g.name("HGETALL"), b("nosuchkey")];
            d.exact(&args);
        }
    }
}

#[test]
fn hash_sequences_match_redis() {
    run_mix("hash", &[11, 12, 13], hash_step);
}

/// Set members: integers (canonical or not: "007" and "-0" are not), words.
const MEMBERS: &[&str] = &[
    "1", "2", "-5", "10", "007", "-0", "1000", "a", "b", "", "x y",
];

impl Gen {
    fn member(&mut self) -> Vec<u8> {
        match self.rng.random_range(0..10) {
            0..=6 => b(self.pick(MEMBERS)),
            7..=8 => self.rng.random_range(-50i64..600).to_string().into_bytes(),
            _ => format!("m{}", self.rng.random_range(0..600)).into_bytes(),
        }
    }

    fn set_key(&mut self) -> Vec<u8> {
        b(self.pick(&["s1", "s2", "s3", "x1"]))
    }
}

/// One random step of the set mix. Replies that are sets are compared as
/// sets; random picks by shape (and a SPOP's key is then deleted on both, so
/// the two keyspaces stay the same).
fn set_step(d: &mut Diff, g: &mut Gen) {
    let k = g.set_key();
    match g.rng.random_range(0..100) {
        0..=24 => {
            let mut args = vec![g.name("SADD"), k];
            for _ in 0..g.rng.random_range(1..5) {
                args.push(g.member());
            }
            d.exact(&args);
        }
        25..=26 => {
            // Past the intset's 512 entries.
            let mut args = vec![g.name("SADD"), k];
            for i in 0..g.rng.random_range(400..530) {
                args.push(i.to_string().into_bytes());
            }
            d.exact(&args);
        }
        27..=36 => {
            let mut args = vec![g.name("SREM"), k];
            for _ in 0..g.rng.random_range(1..4) {
                args.push(g.member());
            }
            d.exact(&args);
        }
        37..=42 => {
            let cmd = g.pick_name(&["SISMEMBER", "SMISMEMBER"]);
            let mut args = vec![cmd, k, g.member()];
            if args[0].eq_ignore_ascii_case(b"smismember") && g.p(0.5) {
                args.push(g.member());
            }
            d.exact(&args);
        }
        43..=46 => {
            let cmd = g.pick_name(&["SCARD", "TYPE", "EXISTS"]);
            d.exact(&[cmd, k]);
        }
        47..=51 => {
            d.call(&[g.name("SMEMBERS"), k], Cmp::Sorted);
        }
        52..=53 => {
            d.exact(&[g.name("OBJECT"), b("ENCODING"), k]);
        }
        54..=61 => {
            let cmd = g.pick(&["SINTER", "SUNION", "SDIFF"]);
            let mut args = vec![g.name(cmd)];
            for _ in 0..g.rng.random_range(1..4) {
                args.push(g.set_key());
            }
            d.call(&args, Cmp::Sorted);
        }
        62..=67 => {
            let cmd = g.pick(&["SINTERSTORE", "SUNIONSTORE", "SDIFFSTORE"]);
            let dst = g.set_key();
            let mut args = vec![g.name(cmd), dst.clone()];
            for _ in 0..g.rng.random_range(1..4) {
                args.push(g.set_key());
            }
            d.exact(&args);
            d.call(&[b("SMEMBERS"), dst.clone()], Cmp::Sorted);
            d.exact(&[b("OBJECT"), b("ENCODING"), dst]);
        }
        68..=70 => {
            let n = b(g.pick(&["1", "2", "3", "0", "-1", "x", "5"]));
            let mut args = vec![g.name("SINTERCARD"), n];
            for _ in 0..g.rng.random_range(1..4) {
                args.push(g.set_key());
            }
            if g.p(0.4) {
                args.push(b("LIMIT"));
                args.push(b(g.pick(&["0", "1", "2", "-1", "x"])));
            }
            d.exact(&args);
        }
        71..=75 => {
            d.exact(&[g.name("SMOVE"), k, g.set_key(), g.member()]);
        }
        76..=79 => {
            let mut args = vec![g.name("SPOP"), k.clone()];
            if g.p(0.6) {
                args.push(b(g.pick(&["0", "1", "3", "1000", "-1", "x"])));
            }
            if g.p(0.05) {
                args.push(b("1"));
            }
            d.call(&args, Cmp::Shape);
            d.exact(&[b("SCARD"), k.clone()]);
            d.exact(&[b("DEL"), k]);
        }
        80..=83 => {
            let mut args = vec![g.name("SRANDMEMBER"), k];
            if g.p(0.7) {
                args.push(b(g.pick(&[
                    "0",
                    "1",
                    "3",
                    "-3",
                    "1000",
                    "-1",
                    "x",
                    "-9223372036854775808",
                ])));
            }
            d.call(&args, Cmp::Shape);
        }
        84..=86 => {
            let mut opts = Vec::new();
            if g.p(0.4) {
                opts.extend([b("MATCH"), b(g.pick(&["1*", "*", "m?", "[ab]*"]))]);
            }
            if g.p(0.4) {
                opts.extend([b("COUNT"), b(g.pick(&["1", "5", "100", "0"]))]);
            }
            d.scan_all_of(&[b("SSCAN"), k], &opts, false);
        }
        87..=89 => {
            d.exact(&[g.name("SET"), b("x1"), g.val()]);
        }
        90..=91 => {
            d.exact(&[g.name("DEL"), k]);
        }
        92..=94 => {
            let dst = g.set_key();
            d.exact(&[g.name("RENAME"), k, dst]);
        }
        _ => {
            d.exact(&[g.name("EXPIRE"), k.clone(), b("1000")]);
            d.call(&[b("TTL"), k], Cmp::Ttl { tol: 2 });
        }
    }
}

#[test]
fn set_sequences_match_redis() {
    run_mix("set", &[21, 22, 23], set_step);
}

impl Gen {
    fn list_key(&mut self) -> Vec<u8> {
        b(self.pick(&["l1", "l2", "l3", "x1"]))
    }

    /// A list element: short words that repeat (LREM, LPOS, LINSERT find
    /// them), sometimes long ones (past a leaf's 8 KiB quickly).
    fn elem(&mut self) -> Vec<u8> {
        match self.rng.random_range(0..20) {
            0 => vec![b'e'; self.rng.random_range(100..300)],
            1..=12 => b(self.pick(&["a", "b", "c", "", "1", "x y"])),
            _ => format!("e{}", self.rng.random_range(0..300)).into_bytes(),
        }
    }

    fn index(&mut self) -> Vec<u8> {
        b(self.pick(&[
            "0",
            "1",
            "-1",
            "2",
            "-2",
            "5",
            "-100",
            "100",
            "x",
            "9223372036854775807",
            "-9223372036854775808",
        ]))
    }
}

/// One random step of the list mix.
fn list_step(d: &mut Diff, g: &mut Gen) {
    let k = g.list_key();
    match g.rng.random_range(0..100) {
        0..=19 => {
            let cmd = g.pick(&["LPUSH", "RPUSH", "LPUSH", "RPUSH", "LPUSHX", "RPUSHX"]);
            let mut args = vec![g.name(cmd), k];
            for _ in 0..g.rng.random_range(1..5) {
                args.push(g.elem());
            }
            d.exact(&args);
        }
        20..=21 => {
            // Past a leaf: a tree of several pieces.
            let mut args = vec![g.name("RPUSH"), k];
            for i in 0..g.rng.random_range(150..400) {
                args.push(format!("n{i}").into_bytes());
            }
            d.exact(&args);
        }
        22..=31 => {
            let cmd = g.pick(&["LPOP", "RPOP"]);
            let mut args = vec![g.name(cmd), k];
            if g.p(0.4) {
                args.push(b(g.pick(&["0", "1", "3", "500", "-1", "x"])));
            }
            d.exact(&args);
        }
        32..=35 => {
            let cmd = g.pick_name(&["LLEN", "TYPE", "EXISTS"]);
            d.exact(&[cmd, k]);
        }
        36..=43 => {
            let i = g.index();
            d.exact(&[g.name("LINDEX"), k, i]);
        }
        44..=47 => {
            let i = g.index();
            d.exact(&[g.name("LSET"), k, i, g.elem()]);
        }
        48..=57 => {
            let (s, e) = (g.index(), g.index());
            d.exact(&[g.name("LRANGE"), k.clone(), s, e]);
            if g.p(0.3) {
                d.exact(&[b("LRANGE"), k, b("0"), b("-1")]);
            }
        }
        58..=60 => {
            let (s, e) = (g.index(), g.index());
            d.exact(&[g.name("LTRIM"), k, s, e]);
        }
        61..=65 => {
            let n = b(g.pick(&["0", "1", "-1", "2", "-2", "x"]));
            d.exact(&[g.name("LREM"), k, n, g.elem()]);
        }
        66..=69 => {
            let w = b(g.pick(&["BEFORE", "after", "middle"]));
            d.exact(&[g.name("LINSERT"), k, w, g.elem(), g.elem()]);
        }
        70..=74 => {
            let mut args = vec![g.name("LPOS"), k, g.elem()];
            for _ in 0..g.rng.random_range(0..3) {
                let opt = g.pick(&["RANK", "COUNT", "MAXLEN", "bad"]);
                args.push(b(opt));
                args.push(b(g.pick(&["1", "-1", "2", "0", "-2", "x", "10"])));
            }
            d.exact(&args);
        }
        75..=80 => {
            let dst = g.list_key();
            if g.p(0.3) {
                d.exact(&[g.name("RPOPLPUSH"), k, dst]);
            } else {
                let from = b(g.pick(&["LEFT", "right", "up"]));
                let to = b(g.pick(&["left", "RIGHT"]));
                d.exact(&[g.name("LMOVE"), k, dst, from, to]);
            }
        }
        81..=84 => {
            let n = b(g.pick(&["1", "2", "3", "0", "x"]));
            let mut args = vec![g.name("LMPOP"), n];
            for _ in 0..g.rng.random_range(1..4) {
                args.push(g.list_key());
            }
            args.push(b(g.pick(&["LEFT", "RIGHT", "middle"])));
            if g.p(0.4) {
                args.push(b("COUNT"));
                args.push(b(g.pick(&["1", "3", "0", "-1", "x"])));
            }
            d.exact(&args);
        }
        85..=87 => {
            d.exact(&[g.name("OBJECT"), b("ENCODING"), k]);
        }
        88..=90 => {
            d.exact(&[g.name("SET"), b("x1"), g.val()]);
        }
        91..=92 => {
            d.exact(&[g.name("DEL"), k]);
        }
        93..=95 => {
            let dst = g.list_key();
            d.exact(&[g.name("RENAME"), k, dst]);
        }
        _ => {
            d.exact(&[g.name("EXPIRE"), k.clone(), b("1000")]);
            d.call(&[b("TTL"), k], Cmp::Ttl { tol: 2 });
        }
    }
}

#[test]
fn list_sequences_match_redis() {
    run_mix("list", &[31, 32, 33], list_step);
}

/// The collection mixes again with both connections in RESP3 (maps, sets,
/// doubles and nulls in their RESP3 forms), one seed each.
#[test]
fn collection_sequences_match_redis_in_resp3() {
    run_mix_in("hash resp3", &[14], hash_step, true);
    run_mix_in("set resp3", &[24], set_step, true);
    run_mix_in("list resp3", &[34], list_step, true);
    run_mix_in("zset resp3", &[44], zset_step, true);
}

impl Gen {
    fn zset_key(&mut self) -> Vec<u8> {
        b(self.pick(&["z1", "z2", "z3", "s1", "x1"]))
    }

    /// A sorted-set member: a few hundred names (past the listpack's 128
    /// entries), sometimes one past its 64 bytes.
    fn zmember(&mut self) -> Vec<u8> {
        match self.rng.random_range(0..40) {
            0 => vec![b'm'; self.rng.random_range(60..70)],
            1..=10 => b(self.pick(&["a", "b", "c", "", "1", "x y"])),
            _ => format!("m{}", self.rng.random_range(0..300)).into_bytes(),
        }
    }

    /// A score: integers, decimals, the infinities and bad ones.
    fn score(&mut self) -> Vec<u8> {
        match self.rng.random_range(0..20) {
            0 => b(self.pick(&[
                "inf", "-inf", "+inf", "-0", "0.1", "1e17", "(1", "abc", "", "nan",
            ])),
            1..=10 => self.rng.random_range(-50i64..50).to_string().into_bytes(),
            _ => (self.rng.random_range(-4000i64..4000) as f64 / 40.0)
                .to_string()
                .into_bytes(),
        }
    }

    /// A score range bound.
    fn zbound(&mut self) -> Vec<u8> {
        match self.rng.random_range(0..10) {
            0 => b(self.pick(&["-inf", "+inf", "(0", "x", "(inf", "", "(-inf"])),
            1..=3 => format!("({}", self.rng.random_range(-60..60)).into_bytes(),
            _ => self.rng.random_range(-60i64..60).to_string().into_bytes(),
        }
    }

    /// A lexicographic range bound.
    fn zlex(&mut self) -> Vec<u8> {
        match self.rng.random_range(0..10) {
            0..=1 => b(self.pick(&["-", "+", "x", "[", "("])),
            2..=5 => format!("[m{}", self.rng.random_range(0..300)).into_bytes(),
            _ => format!("(m{}", self.rng.random_range(0..300)).into_bytes(),
        }
    }

    fn zrank(&mut self) -> Vec<u8> {
        match self.rng.random_range(0..10) {
            0 => b(self.pick(&["x", "-9223372036854775808", "9223372036854775807"])),
            1..=3 => self.rng.random_range(-40i64..0).to_string().into_bytes(),
            _ => self.rng.random_range(0i64..300).to_string().into_bytes(),
        }
    }
}

/// One random step of the sorted-set mix. Lexicographic ranges run on a key
/// whose members all score 0 (Redis leaves them undefined otherwise).
fn zset_step(d: &mut Diff, g: &mut Gen) {
    let k = g.zset_key();
    match g.rng.random_range(0..100) {
        0..=19 => {
            let mut args = vec![g.name("ZADD"), k];
            let opts = ["NX", "XX", "GT", "LT", "CH", "INCR"];
            for _ in 0..g.rng.random_range(0..3usize).saturating_sub(1) {
                args.push(g.pick_name(&opts));
            }
            let n = if g.p(0.05) {
                60
            } else {
                g.rng.random_range(1..4)
            };
            for _ in 0..n {
                args.push(g.score());
                args.push(g.zmember());
            }
            d.exact(&args);
        }
        20..=23 => {
            d.exact(&[g.name("ZINCRBY"), k, g.score(), g.zmember()]);
        }
        24..=28 => {
            let mut args = vec![g.name("ZREM"), k];
            for _ in 0..g.rng.random_range(1..5) {
                args.push(g.zmember());
            }
            d.exact(&args);
        }
        29..=34 => {
            let cmd = g.pick_name(&["ZSCORE", "ZRANK", "ZREVRANK"]);
            d.exact(&[cmd, k, g.zmember()]);
        }
        35..=36 => {
            d.exact(&[g.name("ZMSCORE"), k, g.zmember(), g.zmember()]);
        }
        37..=39 => {
            let cmd = g.pick_name(&["ZCARD", "TYPE", "EXISTS"]);
            d.exact(&[cmd, k]);
        }
        40..=45 => {
            let mut args = vec![g.name("ZRANGE"), k, g.zrank(), g.zrank()];
            if g.p(0.3) {
                args.push(b("REV"));
            }
            if g.p(0.5) {
                args.push(b("WITHSCORES"));
            }
            if g.p(0.05) {
                args.extend([b("LIMIT"), b("0"), b("1")]);
            }
            d.exact(&args);
        }
        46..=52 => {
            let mut args = vec![g.name("ZRANGE"), k, g.zbound(), g.zbound(), b("BYSCORE")];
            if g.p(0.4) {
                args.push(b("REV"));
            }
            if g.p(0.5) {
                args.push(b("WITHSCORES"));
            }
            if g.p(0.5) {
                args.push(b("LIMIT"));
                args.push(g.rng.random_range(-1i64..6).to_string().into_bytes());
                args.push(g.rng.random_range(-1i64..12).to_string().into_bytes());
            }
            d.exact(&args);
        }
        53..=56 => {
            let cmd = g.pick_name(&["ZRANGEBYSCORE", "ZREVRANGEBYSCORE", "ZREVRANGE", "ZCOUNT"]);
            let rank = cmd.eq_ignore_ascii_case(b"zrevrange");
            let (lo, hi) = if rank {
                (g.zrank(), g.zrank())
            } else {
                (g.zbound(), g.zbound())
            };
            let mut args = vec![cmd.clone(), k, lo, hi];
            if !cmd.eq_ignore_ascii_case(b"zcount") && g.p(0.5) {
                args.push(b("WITHSCORES"));
            }
            d.exact(&args);
        }
        57..=60 => {
            let cmd = g.pick_name(&["ZREMRANGEBYRANK", "ZREMRANGEBYSCORE"]);
            let (lo, hi) = if cmd.eq_ignore_ascii_case(b"zremrangebyrank") {
                (g.zrank(), g.zrank())
            } else {
                (g.zbound(), g.zbound())
            };
            d.exact(&[cmd, k, lo, hi]);
        }
        61..=66 => {
            // Lexicographic commands on the all-zero key.
            let lk = b("lex");
            let cmd = g.pick(&[
                "ZADD",
                "ZADD",
                "ZRANGEBYLEX",
                "ZREVRANGEBYLEX",
                "ZLEXCOUNT",
                "ZREMRANGEBYLEX",
                "ZRANGE",
            ]);
            let mut args = vec![g.name(cmd), lk];
            match cmd {
                "ZADD" => {
                    for _ in 0..g.rng.random_range(1..20) {
                        args.push(b("0"));
                        args.push(g.zmember());
                    }
                }
                "ZRANGE" => {
                    args.extend([g.zlex(), g.zlex(), b("BYLEX")]);
                    if g.p(0.5) {
                        args.push(b("REV"));
                    }
                    if g.p(0.05) {
                        args.push(b("WITHSCORES"));
                    }
                }
                _ => {
                    args.extend([g.zlex(), g.zlex()]);
                    if cmd.ends_with("LEX") && !cmd.starts_with("ZREM") && g.p(0.4) {
                        args.push(b("LIMIT"));
                        args.push(g.rng.random_range(-1i64..4).to_string().into_bytes());
                        args.push(g.rng.random_range(-1i64..8).to_string().into_bytes());
                    }
                }
            }
            d.exact(&args);
        }
        67..=71 => {
            let cmd = g.pick_name(&["ZPOPMIN", "ZPOPMAX"]);
            let mut args = vec![cmd, k];
            if g.p(0.6) {
                args.push(b(g.pick(&["0", "1", "3", "1000", "-1", "x"])));
            }
            d.exact(&args);
        }
        72..=73 => {
            let n = b(g.pick(&["1", "2", "0", "x", "3"]));
            let mut args = vec![g.name("ZMPOP"), n, k, g.zset_key()];
            args.push(b(g.pick(&["MIN", "MAX", "mid"])));
            if g.p(0.5) {
                args.extend([b("COUNT"), b(g.pick(&["1", "4", "0", "1000"]))]);
            }
            d.exact(&args);
        }
        74..=80 => {
            let cmd = g.pick(&["ZUNION", "ZINTER", "ZDIFF"]);
            let n = g.rng.random_range(1..4usize);
            let mut args = vec![g.name(cmd), n.to_string().into_bytes()];
            for _ in 0..n {
                args.push(g.zset_key());
            }
            if cmd != "ZDIFF" && g.p(0.4) {
                args.push(b("WEIGHTS"));
                for _ in 0..n {
                    args.push(b(g.pick(&["1", "2", "-1", "0", "0.5", "x"])));
                }
            }
            if cmd != "ZDIFF" && g.p(0.4) {
                args.extend([b("AGGREGATE"), b(g.pick(&["SUM", "MIN", "MAX", "avg"]))]);
            }
            if g.p(0.6) {
                args.push(b("WITHSCORES"));
            }
            d.exact(&args);
        }
        81..=85 => {
            let cmd = g.pick(&["ZUNIONSTORE", "ZINTERSTORE", "ZDIFFSTORE"]);
            let dst = g.zset_key();
            let n = g.rng.random_range(1..4usize);
            let mut args = vec![g.name(cmd), dst.clone(), n.to_string().into_bytes()];
            for _ in 0..n {
                args.push(g.zset_key());
            }
            d.exact(&args);
            d.exact(&[b("ZRANGE"), dst.clone(), b("0"), b("-1"), b("WITHSCORES")]);
            d.exact(&[b("OBJECT"), b("ENCODING"), dst]);
        }
        86..=87 => {
            let n = b(g.pick(&["1", "2", "0", "x"]));
            let mut args = vec![g.name("ZINTERCARD"), n, k, g.zset_key()];
            if g.p(0.4) {
                args.extend([b("LIMIT"), b(g.pick(&["0", "1", "2", "-1"]))]);
            }
            d.exact(&args);
        }
        88..=89 => {
            let dst = g.zset_key();
            let mut args = vec![g.name("ZRANGESTORE"), dst.clone(), k];
            if g.p(0.5) {
                args.extend([g.zbound(), g.zbound(), b("BYSCORE")]);
            } else {
                args.extend([g.zrank(), g.zrank()]);
            }
            if g.p(0.3) {
                args.push(b("REV"));
            }
            d.exact(&args);
            d.exact(&[b("ZRANGE"), dst, b("0"), b("-1"), b("WITHSCORES")]);
        }
        90..=91 => {
            let mut args = vec![g.name("ZRANDMEMBER"), k];
            if g.p(0.8) {
                args.push(b(g.pick(&["0", "1", "3", "-3", "1000", "-1", "x"])));
                if g.p(0.5) {
                    args.push(b("WITHSCORES"));
                }
            }
            d.call(&args, Cmp::Shape);
        }
        92..=93 => {
            let mut opts = Vec::new();
            if g.p(0.4) {
                opts.extend([b("MATCH"), b(g.pick(&["m1*", "*", "m?", "[ab]*"]))]);
            }
            d.scan_all_of(&[b("ZSCAN"), k], &opts, true);
            d.exact(&[b("OBJECT"), b("ENCODING"), g.zset_key()]);
        }
        94 => {
            d.exact(&[g.name("SADD"), b("s1"), g.zmember()]);
        }
        95 => {
            d.exact(&[g.name("SET"), b("x1"), g.val()]);
        }
        96 => {
            d.exact(&[g.name("DEL"), k]);
        }
        97..=98 => {
            let dst = g.zset_key();
            d.exact(&[g.name("RENAME"), k, dst]);
        }
        _ => {
            d.exact(&[g.name("EXPIRE"), k.clone(), b("1000")]);
            d.call(&[b("TTL"), k], Cmp::Ttl { tol: 2 });
        }
    }
}

#[test]
fn zset_sequences_match_redis() {
    run_mix("zset", &[41, 42, 43], zset_step);
}
