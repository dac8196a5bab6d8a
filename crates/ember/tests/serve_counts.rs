//! DBSIZE and INFO's keyspace section answer from counts the server keeps
//! (`server::counts`) instead of scanning the keys. A random sequence of
//! writes over four databases runs against a model of which keys exist and
//! which have a TTL, checked after every few commands; the server is restarted
//! cleanly (the counts are read back: no recount) and killed with SIGKILL (the
//! counts are recounted in the background over 20,000 keys while the writes
//! go on; the unit test in `server::counts` is the one that checks writes on
//! both sides of the recount's cursor).

mod serve_common;

use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};
use serve_common::Server;
use std::collections::HashMap;

/// Database -> key -> has a TTL.
type Model = HashMap<u8, HashMap<String, bool>>;

const DBS: u8 = 4;

fn info_keyspace(con: &mut redis::Connection) -> HashMap<u8, (u64, u64)> {
    let info: String = redis::cmd("INFO").arg("keyspace").query(con).unwrap();
    let mut out = HashMap::new();
    for line in info.lines() {
        let Some((db, rest)) = line.strip_prefix("db").and_then(|l| l.split_once(':')) else {
            continue;
        };
        let field = |name: &str| -> u64 {
            rest.split(',')
                .find_map(|f| f.strip_prefix(name))
                .and_then(|v| v.strip_prefix('='))
                .unwrap()
                .parse()
                .unwrap()
        };
        out.insert(db.parse().unwrap(), (field("keys"), field("expires")));
    }
    out
}

fn check(con: &mut redis::Connection, model: &Model, db: u8, what: &str) {
    let n: u64 = redis::cmd("DBSIZE").query(con).unwrap();
    let want = model.get(&db).map_or(0, |m| m.len() as u64);
    assert_eq!(n, want, "DBSIZE of db {db} {what}");
    let got = info_keyspace(con);
    for d in 0..DBS {
        let m = model.get(&d);
        let keys = m.map_or(0, |m| m.len() as u64);
        let ttls = m.map_or(0, |m| m.values().filter(|t| **t).count() as u64);
        let want = (keys > 0).then_some((keys, ttls));
        assert_eq!(got.get(&d).copied(), want, "INFO keyspace of db {d} {what}");
    }
}

fn connect(srv: &Server, db: u8) -> redis::Connection {
    let mut con = srv.client();
    redis::cmd("SELECT").arg(db).exec(&mut con).unwrap();
    con
}

/// One random write on `db`, applied to the model as Redis defines it.
fn step(con: &mut redis::Connection, model: &mut Model, db: u8, rng: &mut SmallRng) {
    let m = model.entry(db).or_default();
    let k = format!("k{}", rng.random_range(0..60));
    let c = format!("c{}", rng.random_range(0..20));
    let q = |args: &[&str]| {
        let mut cmd = redis::cmd(args[0]);
        for a in &args[1..] {
            cmd.arg(*a);
        }
        cmd
    };
    match rng.random_range(0..14) {
        0 | 1 => {
            q(&["SET", &k, "v"]).exec(con).unwrap();
            m.insert(k, false);
        }
        2 => {
            q(&["SET", &k, "v", "EX", "1000"]).exec(con).unwrap();
            m.insert(k, true);
        }
        3 => {
            q(&["SET", &k, "w", "KEEPTTL"]).exec(con).unwrap();
            let t = m.get(&k).copied().unwrap_or(false);
            m.insert(k, t);
        }
        4 => {
            q(&["SETEX", &k, "1000", "v"]).exec(con).unwrap();
            m.insert(k, true);
        }
        5 => {
            let k2 = format!("k{}", rng.random_range(0..60));
            q(&["MSET", &k, "a", &k2, "b"]).exec(con).unwrap();
            m.insert(k, false);
            m.insert(k2, false);
        }
        6 => {
            let key = if rng.random_bool(0.5) { &k } else { &c };
            q(&["DEL", key]).exec(con).unwrap();
            m.remove(key);
        }
        7 => {
            q(&["GETDEL", &k]).exec(con).unwrap();
            m.remove(&k);
        }
        8 => {
            let key = if rng.random_bool(0.5) { k } else { c };
            q(&["EXPIRE", &key, "1000"]).exec(con).unwrap();
            if let Some(t) = m.get_mut(&key) {
                *t = true;
            }
        }
        9 => {
            let key = if rng.random_bool(0.5) { k } else { c };
            q(&["PERSIST", &key]).exec(con).unwrap();
            if let Some(t) = m.get_mut(&key) {
                *t = false;
            }
        }
        10 => {
            let k2 = format!("k{}", rng.random_range(0..60));
            let r: redis::RedisResult<()> = q(&["RENAME", &k, &k2]).exec(con);
            match m.remove(&k) {
                Some(t) => {
                    r.unwrap();
                    m.insert(k2, t);
                }
                None => assert!(r.is_err(), "RENAME of a missing key"),
            }
        }
        11 => {
            q(&["INCR", &c]).exec(con).unwrap();
            let t = m.get(&c).copied().unwrap_or(false);
            m.insert(c, t);
        }
        12 => {
            q(&["APPEND", &k, "x"]).exec(con).unwrap();
            let t = m.get(&k).copied().unwrap_or(false);
            m.insert(k, t);
        }
        _ => {
            // A past expiry deletes the key.
            q(&["EXPIRE", &k, "0"]).exec(con).unwrap();
            m.remove(&k);
        }
    }
}

fn counts_follow_a_model(extra: &[&str], seed: u64) {
    let dir = tempfile::tempdir().unwrap();
    let mut srv = Server::start(dir.path(), extra);
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut model = Model::new();
    // A large database, so that a recount takes many steps.
    {
        let mut con = connect(&srv, DBS - 1);
        let big = model.entry(DBS - 1).or_default();
        for chunk in 0..40 {
            let mut cmd = redis::cmd("MSET");
            for i in 0..500 {
                let k = format!("big{}", chunk * 500 + i);
                cmd.arg(&k).arg("x");
                big.insert(k, false);
            }
            cmd.exec(&mut con).unwrap();
        }
        check(&mut con, &model, DBS - 1, "after the preload");
    }
    for round in 0..6 {
        let mut db = rng.random_range(0..DBS);
        let mut con = connect(&srv, db);
        for i in 0..240 {
            if rng.random_range(0..40) == 0 {
                db = rng.random_range(0..DBS);
                redis::cmd("SELECT").arg(db).exec(&mut con).unwrap();
            }
            step(&mut con, &mut model, db, &mut rng);
            if i % 30 == 29 {
                check(&mut con, &model, db, &format!("in round {round}, step {i}"));
            }
        }
        check(
            &mut con,
            &model,
            db,
            &format!("at the end of round {round}"),
        );
        drop(con);
        if round % 2 == 0 {
            srv.kill9();
            srv.restart();
            // Writes go on while the recount runs; the checks come after.
            let mut con = connect(&srv, 0);
            for _ in 0..60 {
                step(&mut con, &mut model, 0, &mut rng);
            }
            check(&mut con, &model, 0, &format!("after SIGKILL {round}"));
            // The recount thread logs its end (the check may have finished it).
            let t = std::time::Instant::now();
            while !srv.log().contains("key counts recounted") && t.elapsed().as_secs() < 20 {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            assert!(
                srv.log().contains("key counts recounted"),
                "a start after SIGKILL recounts:\n{}",
                srv.log()
            );
        } else {
            assert!(srv.terminate(), "clean shutdown");
            srv.restart();
            let mut con = connect(&srv, 0);
            check(
                &mut con,
                &model,
                0,
                &format!("after a clean restart {round}"),
            );
            assert!(
                !srv.log().contains("recounted"),
                "a start after a clean shutdown reads the counts back:\n{}",
                srv.log()
            );
        }
    }
    // FLUSHALL empties every count.
    let mut con = connect(&srv, 0);
    redis::cmd("FLUSHALL").exec(&mut con).unwrap();
    model.clear();
    check(&mut con, &model, 0, "after FLUSHALL");
}

#[test]
fn counts_follow_a_model_bullet() {
    counts_follow_a_model(&[], 1);
}

#[test]
fn counts_follow_a_model_bullet_msync() {
    counts_follow_a_model(&["--durability", "msync", "--threads", "1"], 2);
}

#[test]
fn counts_follow_a_model_direct() {
    counts_follow_a_model(&["--engine", "direct"], 3);
}

/// The volatile engine keeps nothing across a restart, counts included.
#[test]
fn counts_on_the_volatile_engine() {
    let dir = tempfile::tempdir().unwrap();
    let mut srv = Server::start(dir.path(), &["--engine", "volatile"]);
    let mut con = connect(&srv, 0);
    redis::cmd("MSET")
        .arg("a")
        .arg(1)
        .arg("b")
        .arg(2)
        .exec(&mut con)
        .unwrap();
    let n: u64 = redis::cmd("DBSIZE").query(&mut con).unwrap();
    assert_eq!(n, 2);
    drop(con);
    assert!(srv.terminate());
    srv.restart();
    let mut con = connect(&srv, 0);
    let n: u64 = redis::cmd("DBSIZE").query(&mut con).unwrap();
    assert_eq!(n, 0);
}
