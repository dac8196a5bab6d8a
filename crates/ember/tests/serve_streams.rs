//! Streams against a real redis-server: random sequences of every stream
//! command (entries, trimming, consumer groups, pending entries, claims,
//! XINFO) with explicit IDs give the same replies in RESP2 and RESP3
//! (times since a delivery, which differ by the milliseconds between the
//! two servers, are compared as zero); blocking XREAD and XREADGROUP are
//! woken by a write on another connection; a stream survives SIGKILL with
//! every acknowledged entry and its groups.

mod serve_common;

use proto::Reply;
use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};
use serve_common::redis_server::{Conn, RedisServer};
use serve_common::Server;
use std::time::{Duration, Instant};

fn req(words: &[String]) -> Vec<Vec<u8>> {
    words.iter().map(|w| w.as_bytes().to_vec()).collect()
}

/// Zeroes what depends on the moment: idle and seen times (after their
/// names in XINFO replies; the third element of XPENDING's entries) and
/// XINFO's radix-tree sizes.
fn normalize(r: &mut Reply, pending: bool) {
    const TIMED: &[&[u8]] = &[
        b"idle",
        b"seen-time",
        b"radix-tree-keys",
        b"radix-tree-nodes",
    ];
    match r {
        Reply::Array(v) | Reply::Set(v) | Reply::Push(v) => {
            for i in 0..v.len() {
                if let (Reply::Bulk(k), true) = (&v[i], i + 1 < v.len()) {
                    if TIMED.contains(&k.as_slice()) {
                        v[i + 1] = Reply::Integer(0);
                    }
                }
            }
            if pending && v.len() == 4 && matches!(v[2], Reply::Integer(_)) {
                v[2] = Reply::Integer(0);
            }
            for x in v.iter_mut() {
                normalize(x, pending);
            }
        }
        Reply::Map(m) => {
            for (k, v) in m.iter_mut() {
                if let Reply::Bulk(k) = k {
                    if TIMED.contains(&k.as_slice()) {
                        *v = Reply::Integer(0);
                    }
                }
                normalize(v, pending);
            }
        }
        // A delivery time (Unix ms; XINFO STREAM FULL).
        Reply::Integer(n) if *n > 1_000_000_000_000 => *r = Reply::Integer(0),
        _ => {}
    }
}

struct Gen {
    rng: SmallRng,
    /// The milliseconds of IDs so far: XADD's IDs mostly grow from it, the
    /// other commands' IDs fall around it.
    t: u32,
}

impl Gen {
    fn pick<'a>(&mut self, xs: &[&'a str]) -> &'a str {
        xs[self.rng.random_range(0..xs.len())]
    }
    fn key(&mut self) -> String {
        self.pick(&["s1", "s1", "s1", "s2", "str"]).to_string()
    }
    fn ms(&mut self) -> u32 {
        self.rng.random_range(0..self.t + 3)
    }
    /// An ID for XADD: mostly after the last one.
    fn new_id(&mut self) -> String {
        if self.rng.random_bool(0.85) {
            self.t += self.rng.random_range(0..2);
            let t = self.t;
            match self.rng.random_range(0..6) {
                0 => format!("{t}"),
                1 => format!("{t}-*"),
                _ => format!("{t}-{}", self.rng.random_range(0..4u32)),
            }
        } else {
            self.id()
        }
    }
    fn id(&mut self) -> String {
        let ms = self.ms();
        match self.rng.random_range(0..10) {
            0 => format!("{ms}"),
            1 => format!("{ms}-*"),
            _ => format!("{ms}-{}", self.rng.random_range(0..3u32)),
        }
    }
    fn bound(&mut self) -> String {
        match self.rng.random_range(0..8) {
            0 => "-".into(),
            1 => "+".into(),
            2 => format!("({}", self.ms()),
            _ => format!("{}", self.ms()),
        }
    }
    fn group(&mut self) -> String {
        self.pick(&["g1", "g1", "g2", "nog"]).to_string()
    }
    fn consumer(&mut self) -> String {
        self.pick(&["c1", "c2", "c3"]).to_string()
    }
    fn ids(&mut self) -> Vec<String> {
        (0..self.rng.random_range(1..4))
            .map(|_| {
                let ms = self.ms();
                format!("{ms}-{}", self.rng.random_range(0..3u32))
            })
            .collect()
    }

    fn command(&mut self) -> Vec<String> {
        let k = self.key();
        let s = |x: &str| x.to_string();
        let mut c: Vec<String> = Vec::new();
        match self.rng.random_range(0..100) {
            0..=24 => {
                c.extend([s("XADD"), k]);
                if self.rng.random_bool(0.05) {
                    c.push(s("NOMKSTREAM"));
                }
                if self.rng.random_bool(0.15) {
                    if self.rng.random_bool(0.5) {
                        c.extend([
                            s("MAXLEN"),
                            s("="),
                            self.rng.random_range(0..6u32).to_string(),
                        ]);
                    } else {
                        c.extend([s("MINID"), self.id()]);
                    }
                }
                let id = self.new_id();
                c.push(id);
                for _ in 0..self.rng.random_range(1..3) {
                    c.extend([
                        self.pick(&["f", "g", "h"]).into(),
                        self.rng.random_range(0..100u32).to_string(),
                    ]);
                }
            }
            25..=31 => {
                let cmd = if self.rng.random_bool(0.5) {
                    "XRANGE"
                } else {
                    "XREVRANGE"
                };
                c.extend([s(cmd), k, self.bound(), self.bound()]);
                if self.rng.random_bool(0.3) {
                    c.extend([s("COUNT"), self.rng.random_range(0..4u32).to_string()]);
                }
            }
            32..=33 => c.extend([s("XLEN"), k]),
            34..=36 => {
                c.extend([s("XDEL"), k]);
                c.extend(self.ids());
            }
            37..=38 => {
                c.extend([s("XTRIM"), k]);
                if self.rng.random_bool(0.5) {
                    c.extend([s("MAXLEN"), self.rng.random_range(0..8u32).to_string()]);
                } else {
                    c.extend([s("MINID"), self.id()]);
                }
            }
            39..=44 => {
                let g = self.group();
                let at = self.pick(&["0", "$", "5-0", "0-0"]).to_string();
                c.extend([s("XGROUP"), s("CREATE"), k, g, at]);
                if self.rng.random_bool(0.3) {
                    c.push(s("MKSTREAM"));
                }
                if self.rng.random_bool(0.1) {
                    c.extend([s("ENTRIESREAD"), self.rng.random_range(0..5u32).to_string()]);
                }
            }
            45..=46 => {
                let g = self.group();
                let at = self.pick(&["0", "$", "3-0"]).to_string();
                c.extend([s("XGROUP"), s("SETID"), k, g, at]);
            }
            47 => {
                let g = self.group();
                c.extend([s("XGROUP"), s("DESTROY"), k, g]);
            }
            48..=49 => {
                let (g, cs) = (self.group(), self.consumer());
                let sub = self.pick(&["CREATECONSUMER", "DELCONSUMER"]).to_string();
                c.extend([s("XGROUP"), sub, k, g, cs]);
            }
            50..=61 => {
                let (g, cs) = (self.group(), self.consumer());
                c.extend([s("XREADGROUP"), s("GROUP"), g, cs]);
                if self.rng.random_bool(0.4) {
                    c.extend([s("COUNT"), self.rng.random_range(0..3u32).to_string()]);
                }
                if self.rng.random_bool(0.1) {
                    c.push(s("NOACK"));
                }
                c.push(s("STREAMS"));
                c.push(k);
                if self.rng.random_bool(0.2) {
                    c.insert(c.len(), s("s2"));
                    c.push(s(">"));
                }
                c.push(if self.rng.random_bool(0.7) {
                    s(">")
                } else {
                    s("0")
                });
            }
            62..=65 => {
                c.extend([s("XREAD")]);
                if self.rng.random_bool(0.4) {
                    c.extend([s("COUNT"), self.rng.random_range(0..3u32).to_string()]);
                }
                c.extend([s("STREAMS"), k, self.bound().replace(['(', '-', '+'], "0")]);
            }
            66..=71 => {
                let g = self.group();
                c.extend([s("XACK"), k, g]);
                c.extend(self.ids());
            }
            72..=75 => {
                let g = self.group();
                c.extend([s("XPENDING"), k, g]);
                if self.rng.random_bool(0.6) {
                    c.extend([
                        self.bound(),
                        self.bound(),
                        self.rng.random_range(0..5u32).to_string(),
                    ]);
                    if self.rng.random_bool(0.4) {
                        c.push(self.consumer());
                    }
                }
            }
            76..=80 => {
                let (g, cs) = (self.group(), self.consumer());
                c.extend([s("XCLAIM"), k, g, cs, s("0")]);
                c.extend(self.ids());
                for (p, opt) in [(0.3, "JUSTID"), (0.2, "FORCE")] {
                    if self.rng.random_bool(p) {
                        c.push(s(opt));
                    }
                }
                if self.rng.random_bool(0.2) {
                    c.extend([s("RETRYCOUNT"), self.rng.random_range(0..5u32).to_string()]);
                }
                if self.rng.random_bool(0.1) {
                    c.extend([s("LASTID"), self.id().replace('*', "0")]);
                }
            }
            81..=84 => {
                let (g, cs) = (self.group(), self.consumer());
                c.extend([
                    s("XAUTOCLAIM"),
                    k,
                    g,
                    cs,
                    s("0"),
                    self.bound().replace(['-', '+'], "0"),
                ]);
                if self.rng.random_bool(0.5) {
                    c.extend([s("COUNT"), self.rng.random_range(1..4u32).to_string()]);
                }
                if self.rng.random_bool(0.3) {
                    c.push(s("JUSTID"));
                }
            }
            85..=87 => c.extend([s("XINFO"), s("GROUPS"), k]),
            88..=89 => {
                let g = self.group();
                c.extend([s("XINFO"), s("CONSUMERS"), k, g]);
            }
            90..=91 => c.extend([s("XINFO"), s("STREAM"), k]),
            92 => c.extend([s("XINFO"), s("STREAM"), k, s("FULL")]),
            93..=94 => {
                let at = self.t + self.rng.random_range(0..3u32);
                c.extend([s("XSETID"), k, format!("{at}-0")]);
                if self.rng.random_bool(0.3) {
                    c.extend([
                        s("ENTRIESADDED"),
                        self.rng.random_range(0..30u32).to_string(),
                    ]);
                }
                if self.rng.random_bool(0.2) {
                    let at = self.ms();
                    c.extend([s("MAXDELETEDID"), format!("{at}-0")]);
                }
            }
            95 => c.extend([s("DEL"), k]),
            96 => c.extend([s("SET"), s("str"), s("x")]),
            97 => c.extend([s("TYPE"), k]),
            _ => c.extend([s("OBJECT"), s("ENCODING"), k]),
        }
        c
    }
}

fn random_streams(seed: u64, steps: usize, resp3: bool) -> Vec<String> {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let ember = Server::start(dir.path(), &[]);
    let mut conns = [Conn::open(ember.port), Conn::open(redis.port)];
    if resp3 {
        for c in conns.iter_mut() {
            assert!(matches!(c.call(&["HELLO", "3"]), Reply::Map(_)));
        }
    }
    let mut g = Gen {
        rng: SmallRng::seed_from_u64(seed),
        t: 1,
    };
    let mut bad = Vec::new();
    let mut history: Vec<String> = Vec::new();
    // Per command: replies that were not errors, and all.
    let mut seen: std::collections::BTreeMap<String, (u32, u32)> = Default::default();
    for _ in 0..steps {
        let words = g.command();
        let args = req(&words);
        let pending = words[0] == "XPENDING" && words.len() >= 6;
        let mut e = conns[0].call(&args);
        let mut r = conns[1].call(&args);
        normalize(&mut e, pending);
        normalize(&mut r, pending);
        let line = words.join(" ");
        let tally = seen.entry(words[0].clone()).or_default();
        tally.1 += 1;
        if !matches!(r, Reply::Error(_)) {
            tally.0 += 1;
        }
        if e != r {
            bad.push(format!(
                "seed {seed}{}: {line}\n  ember: {e:?}\n  redis: {r:?}\n  after:\n    {}",
                if resp3 { " resp3" } else { "" },
                history[history.len().saturating_sub(15)..].join("\n    ")
            ));
            if bad.len() >= 5 {
                break;
            }
            // Start again from nothing, so one divergence is reported once.
            for c in conns.iter_mut() {
                c.call(&["FLUSHALL"]);
            }
            history.clear();
            continue;
        }
        history.push(line);
    }
    eprintln!("seed {seed}: replies that were not errors, of all: {seen:?}");
    // The mix must exercise the commands, not only their errors.
    for (cmd, (ok, _)) in &seen {
        assert!(*ok > 0 || steps < 500, "{cmd} never succeeded");
    }
    bad
}

#[test]
fn stream_sequences_match_redis() {
    let seeds: Vec<u64> = match std::env::var("EMBER_DIFF_SEED") {
        Ok(s) => vec![s.parse().unwrap()],
        Err(_) => vec![1, 2, 3],
    };
    let steps = std::env::var("EMBER_DIFF_STEPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1500);
    let mut bad = Vec::new();
    for seed in seeds {
        bad.extend(random_streams(seed, steps, false));
        bad.extend(random_streams(seed + 1000, steps / 3, true));
    }
    assert!(
        bad.is_empty(),
        "{} mismatches:\n{}",
        bad.len(),
        bad.join("\n")
    );
}

/// XREAD BLOCK and XREADGROUP BLOCK wake on an XADD from another
/// connection (on another worker), time out with a null, and answer at once
/// inside MULTI.
#[test]
fn blocking_reads_wake_and_time_out() {
    let dir = tempfile::tempdir().unwrap();
    let srv = Server::start(dir.path(), &["--threads", "2"]);
    let port = srv.port;
    let mut admin = Conn::open(port);
    admin.call(&["XADD", "s", "1-0", "a", "1"]);
    admin.call(&["XGROUP", "CREATE", "s", "g", "$"]);
    let reader = std::thread::spawn(move || {
        let mut c = Conn::open(port);
        let t = Instant::now();
        let r = c.call(&["XREAD", "BLOCK", "5000", "STREAMS", "s", "$"]);
        (r, t.elapsed())
    });
    let group_reader = std::thread::spawn(move || {
        let mut c = Conn::open(port);
        c.call(&[
            "XREADGROUP",
            "GROUP",
            "g",
            "c1",
            "BLOCK",
            "5000",
            "STREAMS",
            "s",
            ">",
        ])
    });
    std::thread::sleep(Duration::from_millis(300));
    admin.call(&["XADD", "s", "2-0", "b", "2"]);
    let (r, took) = reader.join().unwrap();
    let entry = Reply::Array(vec![
        Reply::Bulk(b"2-0".to_vec()),
        Reply::Array(vec![Reply::Bulk(b"b".to_vec()), Reply::Bulk(b"2".to_vec())]),
    ]);
    let want = Reply::Array(vec![Reply::Array(vec![
        Reply::Bulk(b"s".to_vec()),
        Reply::Array(vec![entry.clone()]),
    ])]);
    assert_eq!(r, want);
    assert!(took < Duration::from_secs(4), "XREAD woke after {took:?}");
    assert_eq!(group_reader.join().unwrap(), want);
    // The group read made the entry pending for c1.
    let Reply::Array(p) = admin.call(&["XPENDING", "s", "g"]) else {
        panic!("XPENDING");
    };
    assert_eq!(p[0], Reply::Integer(1));
    // A timeout, then MULTI.
    let t = Instant::now();
    assert_eq!(
        admin.call(&["XREAD", "BLOCK", "200", "STREAMS", "s", "$"]),
        Reply::NullArray
    );
    assert!(t.elapsed() >= Duration::from_millis(200));
    admin.call(&["MULTI"]);
    admin.call(&["XREAD", "BLOCK", "0", "STREAMS", "s", "$"]);
    assert_eq!(admin.call(&["EXEC"]), Reply::Array(vec![Reply::NullArray]));
}

/// Entries, groups and pending entries survive SIGKILL: every acknowledged
/// XADD is there, and the group's pending count matches its entries.
#[test]
fn streams_survive_sigkill() {
    let dir = tempfile::tempdir().unwrap();
    let mut srv = Server::start(dir.path(), &[]);
    let mut c = Conn::open(srv.port);
    c.call(&["XGROUP", "CREATE", "s", "g", "0", "MKSTREAM"]);
    let mut acked = 0u64;
    for i in 1..=2000u64 {
        let r = c.call(&["XADD", "s", &format!("{i}-0"), "f", &"v".repeat(50)]);
        assert_eq!(r, Reply::Bulk(format!("{i}-0").into_bytes()));
        acked = i;
        if i % 10 == 0 {
            c.call(&[
                "XREADGROUP",
                "GROUP",
                "g",
                "c",
                "COUNT",
                "10",
                "STREAMS",
                "s",
                ">",
            ]);
            c.call(&["XACK", "s", "g", &format!("{}-0", i - 9)]);
        }
    }
    srv.kill9();
    srv.restart();
    let mut c = Conn::open(srv.port);
    assert_eq!(c.call(&["XLEN", "s"]), Reply::Integer(acked as i64));
    let Reply::Array(last) = c.call(&["XREVRANGE", "s", "+", "-", "COUNT", "1"]) else {
        panic!("XREVRANGE");
    };
    assert_eq!(
        last[0],
        Reply::Array(vec![
            Reply::Bulk(format!("{acked}-0").into_bytes()),
            Reply::Array(vec![
                Reply::Bulk(b"f".to_vec()),
                Reply::Bulk("v".repeat(50).into_bytes())
            ])
        ])
    );
    let Reply::Array(p) = c.call(&["XPENDING", "s", "g"]) else {
        panic!("XPENDING");
    };
    assert_eq!(p[0], Reply::Integer(200 * 9));
    let Reply::Array(all) = c.call(&["XPENDING", "s", "g", "-", "+", "100000"]) else {
        panic!("XPENDING range");
    };
    assert_eq!(all.len(), 200 * 9);
    // A large stream restarts without reading its entries: a range at the
    // end answers at once.
    assert_eq!(c.call(&["TYPE", "s"]), Reply::Simple("stream".into()));
}
