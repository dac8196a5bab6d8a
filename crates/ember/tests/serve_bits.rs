//! Differential tests of the bitmap, HyperLogLog and LCS commands: the same
//! requests go to `ember serve` and to a real `redis-server` 7.0, and the
//! parsed replies must be equal, error texts included, in RESP2 and RESP3.
//!
//! - `bit_sequences_match_redis`: seeded random sequences of SETBIT, GETBIT,
//!   BITCOUNT, BITPOS, BITOP, BITFIELD, BITFIELD_RO, LCS and the string
//!   writes that share their values (SET, APPEND, SETRANGE), over a few keys
//!   (a list among them, for WRONGTYPE), with bad offsets, types and
//!   options; GET of every key after each step compares the bytes.
//! - `hll_sequences_match_redis`: thousands of PFADDs on a few keys (sparse
//!   ones that turn dense on the way), PFCOUNT of one and several keys,
//!   PFMERGE of sparse and dense HLLs, and GET of the HLLs' bytes.
//! - `lcs_sequences_match_redis`: LCS (plain, LEN, IDX with MINMATCHLEN and
//!   WITHMATCHLEN) of random strings over a three-letter alphabet.
//! - `edge_cases_match_redis`: a curated list (error texts, limits, corrupt
//!   HLLs, LCS's documented examples, TTLs kept or dropped, ACL key access,
//!   `hll-sparse-max-bytes` and `proto-max-bulk-len` changed at run time).
//! - `setrange_of_exactly_512mb`: the largest string Redis accepts is
//!   stored (direct engine) and one byte more is refused; with Bullet's
//!   default logs the write is refused with an error naming `--log-size`.
//!
//! `EMBER_DIFF_SEED` / `EMBER_DIFF_STEPS` replay one seed or run longer;
//! `EMBER_DIFF_VERBOSE=1` prints every request with both replies.

mod serve_common;

use proto::{encode_request, Reply};
use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};
use serve_common::redis_server::{Conn, RedisServer};
use serve_common::Server;
use std::collections::VecDeque;

fn render(args: &[Vec<u8>]) -> String {
    args.iter()
        .map(|a| format!("{:?}", String::from_utf8_lossy(a)))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Both servers, the requests so far, and every disagreement.
struct Diff {
    ember: Conn,
    redis: Conn,
    ember_log: std::path::PathBuf,
    label: String,
    history: VecDeque<String>,
    failures: Vec<String>,
    total: usize,
    resp3: bool,
}

impl Diff {
    fn new(ember: &Server, redis: &RedisServer, resp3: bool) -> Diff {
        let mut d = Diff {
            ember: Conn::open(ember.port),
            redis: Conn::open(redis.port),
            ember_log: ember.log_path(),
            label: String::new(),
            history: VecDeque::new(),
            failures: Vec::new(),
            total: 0,
            resp3,
        };
        d.reset();
        d
    }

    fn reset(&mut self) {
        for c in [&mut self.ember, &mut self.redis] {
            assert_eq!(c.call(&["FLUSHALL"]), Reply::ok());
            if self.resp3 {
                assert!(matches!(c.call(&["HELLO", "3"]), Reply::Map(_)));
            }
        }
        self.history.clear();
    }

    /// Sends `args` to both and compares the replies; returns Redis's.
    fn call(&mut self, args: &[Vec<u8>]) -> Reply {
        let mut req = Vec::new();
        encode_request(args, &mut req);
        let line = render(args);
        let (e, r) = match (self.ember.request(&req), self.redis.request(&req)) {
            (Ok(e), Ok(r)) => (e, r),
            (e, r) => {
                let log = std::fs::read_to_string(&self.ember_log).unwrap_or_default();
                panic!(
                    "{}: {line}\n  ember: {e:?}\n  redis: {r:?}\nember's log:\n{log}",
                    self.label
                );
            }
        };
        self.total += 1;
        if std::env::var_os("EMBER_DIFF_VERBOSE").is_some() {
            println!("{line}\n  ember: {e:?}\n  redis: {r:?}");
        }
        if e != r {
            let hist: Vec<String> = self.history.iter().cloned().collect();
            self.failures.push(format!(
                "{} (resp3={}): {line}\n  ember: {e:?}\n  redis: {r:?}\n  preceding:\n    {}",
                self.label,
                self.resp3,
                hist.join("\n    ")
            ));
            eprintln!("MISMATCH {}", self.failures.last().unwrap());
            self.reset();
        } else {
            if self.history.len() == 24 {
                self.history.pop_front();
            }
            self.history.push_back(line);
        }
        r
    }

    fn cmd(&mut self, args: &[&[u8]]) -> Reply {
        let v: Vec<Vec<u8>> = args.iter().map(|a| a.to_vec()).collect();
        self.call(&v)
    }

    fn report(&self) {
        assert!(
            self.failures.is_empty(),
            "{} divergence(s) between Ember and redis-server:\n{}",
            self.failures.len(),
            self.failures
                .iter()
                .take(20)
                .cloned()
                .collect::<Vec<_>>()
                .join("\n\n")
        );
    }
}

fn seeds(default: &[u64]) -> Vec<u64> {
    match std::env::var("EMBER_DIFF_SEED") {
        Ok(s) => vec![s.parse().expect("EMBER_DIFF_SEED: a number")],
        Err(_) => default.to_vec(),
    }
}

fn steps(default: usize) -> usize {
    std::env::var("EMBER_DIFF_STEPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

/// Runs `step` for each seed in RESP2 and RESP3 against fresh servers.
fn run(label: &str, default_seeds: &[u64], default_steps: usize, step: fn(&mut Diff, &mut Gen)) {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let ember = Server::start(dir.path(), &[]);
    for resp3 in [false, true] {
        let mut d = Diff::new(&ember, &redis, resp3);
        for seed in seeds(default_seeds) {
            d.reset();
            d.label = format!("{label} seed {seed}");
            let mut g = Gen {
                rng: SmallRng::seed_from_u64(seed),
            };
            for _ in 0..steps(default_steps) {
                step(&mut d, &mut g);
                if d.failures.len() >= 20 {
                    break;
                }
            }
        }
        println!("serve_bits: {label} resp3={resp3}: {} requests", d.total);
        d.report();
    }
}

struct Gen {
    rng: SmallRng,
}

const BIT_KEYS: &[&str] = &["a", "b", "c", "list"];

impl Gen {
    fn p(&mut self, prob: f64) -> bool {
        self.rng.random_bool(prob)
    }
    fn pick<'a>(&mut self, xs: &[&'a str]) -> &'a str {
        xs[self.rng.random_range(0..xs.len())]
    }
    fn n(&mut self, lo: i64, hi: i64) -> i64 {
        self.rng.random_range(lo..hi)
    }
    fn key(&mut self) -> Vec<u8> {
        self.pick(BIT_KEYS).as_bytes().to_vec()
    }
    /// A bit offset: mostly small, sometimes past the end or invalid.
    fn offset(&mut self) -> Vec<u8> {
        match self.n(0, 20) {
            0 => self
                .pick(&["-1", "x", "", "4294967296", "1.5", "#1", " 1"])
                .into(),
            1 => self.n(0, 5000).to_string().into(),
            _ => self.n(0, 80).to_string().into(),
        }
    }
    /// An index for BITCOUNT/BITPOS ranges.
    fn index(&mut self) -> Vec<u8> {
        match self.n(0, 15) {
            0 => self
                .pick(&["x", "9223372036854775807", "-9223372036854775808", ""])
                .into(),
            _ => self.n(-30, 30).to_string().into(),
        }
    }
    fn bytes(&mut self) -> Vec<u8> {
        let n = self.n(0, 12) as usize;
        (0..n)
            .map(|_| {
                if self.p(0.5) {
                    b"\x00\xff\x0f\xf0\x55\xaa01ab"[self.n(0, 10) as usize]
                } else {
                    self.n(0, 256) as u8
                }
            })
            .collect()
    }
    fn field_type(&mut self) -> Vec<u8> {
        match self.n(0, 12) {
            0 => self
                .pick(&["u64", "i65", "u0", "x8", "I8", "u", "i-1", "U8"])
                .into(),
            1 => format!("i{}", self.n(56, 65)).into(),
            _ => {
                let s = if self.p(0.5) { "i" } else { "u" };
                format!("{s}{}", self.n(1, 17)).into()
            }
        }
    }
    fn field_offset(&mut self) -> Vec<u8> {
        if self.p(0.2) {
            format!("#{}", self.n(0, 10)).into()
        } else {
            self.offset()
        }
    }
    fn field_value(&mut self) -> Vec<u8> {
        match self.n(0, 10) {
            0 => self
                .pick(&[
                    "9223372036854775807",
                    "-9223372036854775808",
                    "x",
                    "18446744073709551615",
                ])
                .into(),
            1 => self.n(-100_000, 100_000).to_string().into(),
            _ => self.n(-300, 300).to_string().into(),
        }
    }
}

fn bit_step(d: &mut Diff, g: &mut Gen) {
    let k = g.key();
    let mut args: Vec<Vec<u8>> = match g.n(0, 17) {
        0 | 1 => {
            let v = match g.n(0, 12) {
                0 => b"2".to_vec(),
                1 => b"x".to_vec(),
                2 => b"-1".to_vec(),
                _ => if g.p(0.5) { b"1" } else { b"0" }.to_vec(),
            };
            vec![b"SETBIT".to_vec(), k, g.offset(), v]
        }
        2 => vec![b"GETBIT".to_vec(), k, g.offset()],
        3 | 4 => {
            let mut a = vec![b"BITCOUNT".to_vec(), k];
            match g.n(0, 6) {
                0 => {}
                1 => a.push(g.index()),
                _ => {
                    a.push(g.index());
                    a.push(g.index());
                    if g.p(0.6) {
                        a.push(g.pick(&["BIT", "byte", "bits", "BYTE", "bit"]).into());
                    }
                }
            }
            a
        }
        5 | 6 => {
            let bit = g.pick(&["0", "1", "1", "0", "2", "x"]).into();
            let mut a = vec![b"BITPOS".to_vec(), k, bit];
            let extra = g.n(0, 5);
            if extra >= 1 {
                a.push(g.index());
            }
            if extra >= 2 {
                a.push(g.index());
            }
            if extra >= 3 {
                a.push(g.pick(&["BIT", "byte", "bits", "BYTE", "bit"]).into());
            }
            if extra >= 4 && g.p(0.3) {
                a.push(b"x".to_vec());
            }
            a
        }
        7 => {
            let op = g.pick(&["AND", "or", "XOR", "not", "NOT", "nand"]).into();
            let mut a = vec![b"BITOP".to_vec(), op, g.key()];
            for _ in 0..g.n(1, 4) {
                a.push(g.key());
            }
            a
        }
        8..=10 => {
            let name = if g.p(0.8) { "BITFIELD" } else { "BITFIELD_RO" };
            let mut a = vec![name.into(), k];
            for _ in 0..g.n(0, 4) {
                match g.n(0, 10) {
                    0..=2 => {
                        a.push(g.pick(&["GET", "get"]).into());
                        a.push(g.field_type());
                        a.push(g.field_offset());
                    }
                    3..=5 => {
                        a.push(g.pick(&["SET", "set"]).into());
                        a.push(g.field_type());
                        a.push(g.field_offset());
                        a.push(g.field_value());
                    }
                    6..=8 => {
                        a.push(g.pick(&["INCRBY", "incrby"]).into());
                        a.push(g.field_type());
                        a.push(g.field_offset());
                        a.push(g.field_value());
                    }
                    _ => {
                        a.push(b"OVERFLOW".to_vec());
                        a.push(g.pick(&["WRAP", "sat", "FAIL", "fail", "x"]).into());
                    }
                }
            }
            if g.p(0.05) {
                a.push(b"GET".to_vec());
            }
            a
        }
        11 => vec![b"SET".to_vec(), k, g.bytes()],
        12 => vec![b"APPEND".to_vec(), k, g.bytes()],
        13 => vec![
            b"SETRANGE".to_vec(),
            k,
            g.n(0, 20).to_string().into(),
            g.bytes(),
        ],
        14 => {
            let mut a = vec![b"LCS".to_vec(), k, g.key()];
            for _ in 0..g.n(0, 4) {
                match g.n(0, 6) {
                    0 => a.push(b"LEN".to_vec()),
                    1 | 2 => a.push(b"IDX".to_vec()),
                    3 => a.push(b"WITHMATCHLEN".to_vec()),
                    4 => {
                        a.push(b"MINMATCHLEN".to_vec());
                        a.push(g.n(-1, 4).to_string().into());
                    }
                    _ => a.push(b"x".to_vec()),
                }
            }
            a
        }
        15 => vec![b"RPUSH".to_vec(), b"list".to_vec(), b"x".to_vec()],
        _ => vec![b"DEL".to_vec(), k],
    };
    if args[0] == b"SET" && args[1] == b"list" {
        args[1] = b"a".to_vec();
    }
    d.call(&args);
    for k in ["a", "b", "c"] {
        d.cmd(&[b"GET", k.as_bytes()]);
    }
}

#[test]
fn bit_sequences_match_redis() {
    run("bits", &[1, 2, 3], 800, bit_step);
}

/// LCS over short strings of a small alphabet (many ties, many ranges).
fn lcs_step(d: &mut Diff, g: &mut Gen) {
    for k in ["x", "y"] {
        if g.p(0.5) {
            let n = g.n(0, 24) as usize;
            let v: Vec<u8> = (0..n).map(|_| b"abc"[g.n(0, 3) as usize]).collect();
            d.cmd(&[b"SET", k.as_bytes(), &v]);
        }
    }
    let mut a: Vec<Vec<u8>> = vec![b"LCS".to_vec(), b"x".to_vec(), b"y".to_vec()];
    match g.n(0, 4) {
        0 => {}
        1 => a.push(b"LEN".to_vec()),
        _ => {
            a.push(b"IDX".to_vec());
            if g.p(0.5) {
                a.push(b"MINMATCHLEN".to_vec());
                a.push(g.n(0, 4).to_string().into());
            }
            if g.p(0.5) {
                a.push(b"WITHMATCHLEN".to_vec());
            }
        }
    }
    d.call(&a);
}

#[test]
fn lcs_sequences_match_redis() {
    run("lcs", &[31, 32], 600, lcs_step);
}

/// HLL keys: the first two collect many elements (they turn dense), the
/// others few.
const HLL_KEYS: &[&str] = &["h1", "h2", "s1", "s2", "m"];

fn hll_step(d: &mut Diff, g: &mut Gen) {
    let k = g.pick(HLL_KEYS);
    match g.n(0, 20) {
        0..=13 => {
            let big = k.starts_with('h');
            let n = if big { g.n(1, 40) } else { g.n(0, 4) };
            let range = if big { 200_000 } else { 300 };
            let mut a: Vec<Vec<u8>> = vec![b"PFADD".to_vec(), k.into()];
            for _ in 0..n {
                a.push(format!("el{}", g.n(0, range)).into());
            }
            d.call(&a);
        }
        14 | 15 => {
            d.cmd(&[b"PFCOUNT", k.as_bytes()]);
            d.cmd(&[b"GET", k.as_bytes()]);
        }
        16 => {
            let mut a: Vec<Vec<u8>> = vec![b"PFCOUNT".to_vec()];
            for _ in 0..g.n(2, 4) {
                a.push(g.pick(HLL_KEYS).into());
            }
            d.call(&a);
        }
        17 | 18 => {
            let mut a: Vec<Vec<u8>> = vec![b"PFMERGE".to_vec(), g.pick(&["m", "s2", "dst"]).into()];
            for _ in 0..g.n(0, 3) {
                a.push(g.pick(HLL_KEYS).into());
            }
            d.call(&a);
            d.cmd(&[b"GET", a[1].as_slice()]);
        }
        _ => {
            d.cmd(&[b"GET", k.as_bytes()]);
        }
    }
}

#[test]
fn hll_sequences_match_redis() {
    run("hll", &[11, 12], 2500, hll_step);
}

#[test]
fn edge_cases_match_redis() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let ember = Server::start(dir.path(), &[]);
    for resp3 in [false, true] {
        let mut d = Diff::new(&ember, &redis, resp3);
        d.label = "edge".into();
        let cases: &[&[&str]] = &[
            &["SETBIT", "k", "4294967296", "1"],
            &["SETBIT", "k", "-1", "1"],
            &["SETBIT", "k", "7", "2"],
            &["SETBIT", "k", "7", "x"],
            &["SETBIT", "k", "7", "1"],
            &["GETBIT", "k", "7"],
            &["GETBIT", "k", "4294967296"],
            &["GETBIT", "missing", "100"],
            &["BITCOUNT", "k", "0"],
            &["BITCOUNT", "missing", "0"],
            &["BITCOUNT", "k", "-1", "-2", "x"],
            &["BITCOUNT", "k", "0", "-1", "x"],
            &["BITPOS", "k", "2"],
            &["BITPOS", "missing", "0", "x"],
            &["BITPOS", "k", "1", "0", "-1", "BIT", "x"],
            &["SET", "s", "foobar"],
            &["BITCOUNT", "s", "1", "1"],
            &["BITCOUNT", "s", "5", "30", "BIT"],
            &["BITPOS", "s", "0", "2", "-1", "BIT"],
            &["BITPOS", "s", "1", "7", "15", "BIT"],
            &["BITOP", "NOT", "d", "s", "k"],
            &["BITOP", "nand", "d", "s"],
            &["BITOP", "AND", "d", "missing", "missing2"],
            &["BITOP", "OR", "d", "s", "k"],
            &["GET", "d"],
            &["BITFIELD", "k", "GET", "u64", "0"],
            &["BITFIELD", "k", "GET", "i8", "4294967290"],
            &["BITFIELD", "k", "SET", "i8", "#536870912", "1"],
            &["BITFIELD", "k", "OVERFLOW", "x", "GET", "u8", "0"],
            &[
                "BITFIELD", "k", "INCRBY", "u2", "100", "1", "GET", "u4", "0",
            ],
            &["BITFIELD_RO", "k", "INCRBY", "u2", "100", "1"],
            &["BITFIELD_RO", "k", "GET", "u2", "100"],
            &[
                "BITFIELD", "n", "OVERFLOW", "FAIL", "INCRBY", "u2", "0", "10",
            ],
            &["GET", "n"],
            &["BITFIELD", "k", "GET"],
            &["BITFIELD", "k"],
            &["RPUSH", "l", "x"],
            &["SETBIT", "l", "1", "1"],
            &["GETBIT", "l", "1"],
            &["BITFIELD_RO", "l", "GET", "u2", "0"],
            &["BITOP", "AND", "d", "s", "l"],
            &["PFADD", "s", "a"],
            &["PFADD", "l", "a"],
            &["PFCOUNT", "s"],
            &["PFCOUNT", "s", "l"],
            &["PFMERGE", "s"],
            &["PFMERGE", "x", "l"],
            &["PFADD", "h"],
            &["GET", "h"],
            &["PFADD", "h", "a", "b", "c"],
            &["PFCOUNT", "h", "missing"],
            &["PFMERGE", "new"],
            &["GET", "new"],
            &[
                "SET",
                "bad",
                "HYLL\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00",
            ],
            &["PFADD", "bad", "x"],
            &["PFCOUNT", "bad"],
            &["PFCOUNT", "bad", "h"],
            &["PFMERGE", "h", "bad"],
            &[
                "SET",
                "bad2",
                "HYLL\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00",
            ],
            &["PFADD", "bad2", "x"],
            &["PFDEBUG", "ENCODING", "h"],
            &["PFDEBUG", "DECODE", "h"],
            &["PFDEBUG", "GETREG", "h"],
            &["PFDEBUG", "ENCODING", "h"],
            &["PFDEBUG", "DECODE", "h"],
            &["PFDEBUG", "TODENSE", "h"],
            &["PFDEBUG", "TODENSE", "new"],
            &["GET", "new"],
            &["PFDEBUG", "nosuch", "h"],
            &["PFDEBUG", "ENCODING", "missing"],
            &["PFDEBUG", "ENCODING", "l"],
            &["PFDEBUG", "ENCODING", "s"],
            &["PFDEBUG", "DECODE", "bad"],
            &["PFDEBUG", "TODENSE", "bad"],
            &["MULTI"],
            &["SETBIT", "tx", "3", "1"],
            &["PFADD", "txh", "a", "b"],
            &["PFCOUNT", "txh"],
            &["PFMERGE", "txm", "txh", "h"],
            &["BITOP", "OR", "txd", "tx", "s"],
            &["BITFIELD", "tx", "INCRBY", "u8", "0", "5", "GET", "i4", "0"],
            &["SETBIT", "tx", "x", "1"],
            &["LCS", "tx", "s", "IDX"],
            &["PFDEBUG", "ENCODING", "txm"],
            &["GET", "txh"],
            &["EXEC"],
            &["SET", "s1", "ohmytext"],
            &["SET", "s2", "mynewtext"],
            &["LCS", "s1", "s2"],
            &["LCS", "s1", "s2", "LEN"],
            &["LCS", "s1", "s2", "IDX"],
            &["LCS", "s1", "s2", "IDX", "MINMATCHLEN", "4", "WITHMATCHLEN"],
            &["LCS", "s1", "s2", "IDX", "LEN"],
            &["LCS", "s1", "s2", "MINMATCHLEN"],
            &["LCS", "s1", "s2", "MINMATCHLEN", "x"],
            &["LCS", "s1", "l"],
            &["LCS", "missing", "s2", "IDX"],
            &["SETRANGE", "r", "536870912", "x"],
            &["SETRANGE", "r", "-1", "x"],
            &["SETRANGE", "r", "536870912", ""],
            &["SETBIT", "r", "4294967296", "0"],
            &["SETRANGE", "l", "536870912", "x"],
            &["APPEND", "l", "x"],
            &["CONFIG", "SET", "proto-max-bulk-len", "1048576"],
            &["SETRANGE", "p", "1048576", "x"],
            &["SETRANGE", "p", "1048575", "x"],
            &["APPEND", "p", "y"],
            &["SETBIT", "p", "8388608", "1"],
            &["SETBIT", "p", "8388607", "1"],
            &["BITFIELD", "p", "SET", "u8", "8388607", "1"],
            &["BITFIELD", "p", "GET", "u8", "8388608"],
            &["STRLEN", "p"],
            &["CONFIG", "SET", "proto-max-bulk-len", "536870912"],
            &["APPEND", "p", "y"],
        ];
        for c in cases {
            let args: Vec<&[u8]> = c.iter().map(|s| s.as_bytes()).collect();
            d.cmd(&args);
        }
        // ACL key checks follow Redis's key specs (BITFIELD's depend on its
        // subcommands, PFCOUNT only reads).
        for c in [&mut d.ember, &mut d.redis] {
            for (u, p) in [("r", "%R~*"), ("w", "%W~*")] {
                assert_eq!(
                    c.call(&["ACL", "SETUSER", u, "on", "nopass", p, "+@all"]),
                    Reply::ok()
                );
            }
        }
        for u in ["r", "w"] {
            for req in [
                "SETBIT k 1 1",
                "GETBIT k 1",
                "BITOP AND d a b",
                "BITFIELD k GET u8 0 OVERFLOW SAT",
                "BITFIELD k GET u8 0 SET u8 0 1",
                "BITFIELD k FOO",
                "BITFIELD_RO k GET u8 0",
                "PFADD k a",
                "PFCOUNT k j",
                "PFMERGE d a",
                "LCS a b",
            ] {
                let mut a: Vec<&[u8]> = vec![b"ACL", b"DRYRUN", u.as_bytes()];
                a.extend(req.split(' ').map(|w| w.as_bytes()));
                d.cmd(&a);
            }
        }
        // A sparse HLL covering twice the registers.
        let mut bad3 = b"HYLL\x01".to_vec();
        bad3.extend_from_slice(&[0; 11]);
        bad3.extend_from_slice(b"\x7f\xff\x7f\xff");
        d.cmd(&[b"SET", b"bad3", &bad3]);
        d.cmd(&[b"PFCOUNT", b"bad3"]);
        d.cmd(&[b"PFADD", b"bad3", b"x"]);
        d.cmd(&[b"GET", b"bad3"]);
        // Large enough LCS tables are refused with Redis's text.
        let big = "x".repeat(12_000);
        d.cmd(&[b"SET", b"big1", big.as_bytes()]);
        d.cmd(&[b"SET", b"big2", big.as_bytes()]);
        d.cmd(&[b"LCS", b"big1", b"big2", b"LEN"]);
        // A smaller hll-sparse-max-bytes promotes earlier, on both.
        for c in [&mut d.ember, &mut d.redis] {
            assert_eq!(
                c.call(&["CONFIG", "SET", "hll-sparse-max-bytes", "200"]),
                Reply::ok()
            );
        }
        // PFADD, PFMERGE and PFCOUNT keep the TTL; BITOP's destination
        // loses it.
        for req in [
            "SET t1 abc",
            "EXPIRE t1 1000",
            "SETBIT t1 100 1",
            "BITFIELD t1 INCRBY u8 0 1",
            "TTL t1",
            "BITOP NOT t1 t1",
            "TTL t1",
            "PFADD t2 a",
            "EXPIRE t2 1000",
            "PFADD t2 b c",
            "PFCOUNT t2",
            "PFMERGE t2 h",
            "TTL t2",
        ] {
            let a: Vec<&[u8]> = req.split(' ').map(|w| w.as_bytes()).collect();
            d.cmd(&a);
        }
        let mut a: Vec<Vec<u8>> = vec![b"PFADD".to_vec(), b"p".to_vec()];
        a.extend((0..120).map(|i| format!("e{i}").into_bytes()));
        d.call(&a);
        d.cmd(&[b"GET", b"p"]);
        d.cmd(&[b"CONFIG", b"GET", b"hll-sparse-max-bytes"]);
        for c in [&mut d.ember, &mut d.redis] {
            assert_eq!(
                c.call(&["CONFIG", "SET", "hll-sparse-max-bytes", "3000"]),
                Reply::ok()
            );
        }
        d.report();
    }
}

#[test]
fn setrange_of_exactly_512mb() {
    const MAX: usize = 512 * 1024 * 1024;
    // The direct engine writes the value into the heap without a log.
    let dir = tempfile::tempdir().unwrap();
    let ember = Server::start(dir.path(), &["--engine", "direct", "--heap-size", "64mb"]);
    let mut c = Conn::open(ember.port);
    assert_eq!(
        c.call(&["SETRANGE", "k", "536870911", "x"]),
        Reply::Integer(MAX as i64)
    );
    assert_eq!(c.call(&["STRLEN", "k"]), Reply::Integer(MAX as i64));
    assert_eq!(
        c.call(&["GETRANGE", "k", "-2", "-1"]),
        Reply::Bulk(b"\0x".to_vec())
    );
    let too_long =
        Reply::Error("ERR string exceeds maximum allowed size (proto-max-bulk-len)".into());
    assert_eq!(c.call(&["APPEND", "k", "y"]), too_long);
    assert_eq!(c.call(&["SETRANGE", "k", "536870912", "x"]), too_long);
    assert_eq!(
        c.call(&["SETBIT", "k", "4294967295", "1"]),
        Reply::Integer(0)
    );
    assert_eq!(c.call(&["BITCOUNT", "k"]), Reply::Integer(5));
    assert_eq!(c.call(&["DEL", "k"]), Reply::Integer(1));
    drop(ember);
    // Bullet logs every write: a value larger than a log is refused, with
    // the flag to raise.
    let dir = tempfile::tempdir().unwrap();
    let ember = Server::start(dir.path(), &[]);
    let mut c = Conn::open(ember.port);
    match c.call(&["SETRANGE", "k", "536870911", "x"]) {
        Reply::Error(e) => assert!(e.contains("raise --log-size"), "{e}"),
        r => panic!("{r:?}"),
    }
    assert_eq!(c.call(&["EXISTS", "k"]), Reply::Integer(0));
    assert_eq!(c.call(&["PING"]), Reply::Simple("PONG".into()));
}
