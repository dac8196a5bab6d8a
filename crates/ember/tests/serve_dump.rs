//! DUMP and RESTORE against a real redis-server: a value of every type and
//! encoding (integer and LZF-compressed strings, listpack and quicklist
//! lists, intset and hashtable sets, listpack and hashtable hashes, listpack
//! and skiplist sorted sets, streams with consumer groups) DUMPed by Redis
//! RESTOREs in Ember with the same contents, and DUMPed by Ember RESTOREs
//! in Redis; RESTORE's options and errors answer as Redis's.

mod serve_common;

use proto::Reply;
use serve_common::redis_server::{Conn, RedisServer};
use serve_common::values::{contents, fill, KEYS};
use serve_common::Server;

/// DUMPs every key on `from` and RESTOREs it on `to`; the differences.
fn transfer(from: &mut Conn, to: &mut Conn, name: &str) -> Vec<String> {
    let mut bad = Vec::new();
    for k in KEYS {
        let Reply::Bulk(payload) = from.call(&["DUMP", k]) else {
            bad.push(format!("{name}: DUMP {k} gave no payload"));
            continue;
        };
        let dst = format!("{k}:restored");
        let args: Vec<&[u8]> = vec![b"RESTORE", dst.as_bytes(), b"0", &payload];
        let rr = to.call(&args);
        if rr != Reply::ok() {
            bad.push(format!("{name}: RESTORE {k}: {rr:?}"));
            continue;
        }
        let (want, got) = (contents(from, k), contents(to, &dst));
        if want != got {
            bad.push(format!(
                "{name}: {k}\n  source: {want:?}\n  restored: {got:?}"
            ));
        }
    }
    bad
}

#[test]
fn dump_payloads_restore_both_ways() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let ember = Server::start(dir.path(), &[]);
    let mut r = Conn::open(redis.port);
    let mut e = Conn::open(ember.port);
    fill(&mut r);
    fill(&mut e);
    let mut bad = transfer(&mut r, &mut e, "redis -> ember");
    bad.extend(transfer(&mut e, &mut r, "ember -> redis"));
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

#[test]
fn restore_options_and_errors_match_redis() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let ember = Server::start(dir.path(), &[]);
    let mut conns = [Conn::open(ember.port), Conn::open(redis.port)];
    for c in conns.iter_mut() {
        c.call(&["SET", "src", "hello"]);
    }
    let Reply::Bulk(p) = conns[1].call(&["DUMP", "src"]) else {
        panic!("DUMP");
    };
    let mut damaged = p.clone();
    damaged[2] ^= 0x55;
    let cases: Vec<Vec<&[u8]>> = vec![
        vec![b"DUMP", b"nokey"],
        vec![b"RESTORE", b"src", b"0", &p],
        vec![b"RESTORE", b"q", b"-1", &p],
        vec![b"RESTORE", b"q", b"x", &p],
        vec![b"RESTORE", b"q", b"0", b"garbage"],
        vec![b"RESTORE", b"q", b"0", &damaged],
        vec![b"RESTORE", b"q", b"0", &p, b"IDLETIME", b"5", b"FREQ", b"3"],
        vec![b"RESTORE", b"q", b"0", &p, b"FREQ", b"300"],
        vec![b"RESTORE", b"q", b"0", &p, b"IDLETIME", b"-1"],
        vec![b"RESTORE", b"q", b"0", &p, b"BOGUS"],
        vec![b"RESTORE", b"q", b"0", &p, b"IDLETIME", b"100", b"REPLACE"],
        vec![b"GET", b"q"],
        vec![b"RESTORE", b"q", b"100000", &p, b"REPLACE"],
        vec![b"RESTORE", b"q", b"1", &p, b"REPLACE", b"ABSTTL"],
        vec![b"EXISTS", b"q"],
        vec![b"SET", b"big", b"x"],
        vec![b"RESTORE", b"big", b"0", &p, b"REPLACE", b"FREQ", b"10"],
        vec![b"GET", b"big"],
    ];
    for args in cases {
        let e = conns[0].call(&args);
        let r = conns[1].call(&args);
        assert_eq!(e, r, "{:?}", String::from_utf8_lossy(&args.concat()));
    }
}
