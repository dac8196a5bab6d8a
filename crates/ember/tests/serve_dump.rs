//! DUMP and RESTORE against a real redis-server: a value of every type and
//! encoding (integer and LZF-compressed strings, listpack and quicklist
//! lists, intset and hashtable sets, listpack and hashtable hashes, listpack
//! and skiplist sorted sets, streams with consumer groups) DUMPed by Redis
//! RESTOREs in Ember with the same contents, and DUMPed by Ember RESTOREs
//! in Redis; RESTORE's options and errors answer as Redis's; DEBUG DIGEST
//! and DEBUG DIGEST-VALUE of the same values give Redis's digits.

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

/// DEBUG DIGEST and DEBUG DIGEST-VALUE give redis-server's digits for the
/// same data (a value of every type and encoding, TTLs, two databases): 40
/// zeros for an empty dataset and a missing key, and after each change
/// (a value, a TTL, a key's database, SWAPDB) both servers' digests still
/// agree and differ from the one before; undoing a change gives the old
/// digest back, and sets built in another order digest the same.
#[test]
fn debug_digest_matches_redis() {
    let redis = RedisServer::start_with(&["--enable-debug-command", "yes"]);
    let dir = tempfile::tempdir().unwrap();
    let ember = Server::start(dir.path(), &["--enable-debug-command", "yes"]);
    let mut conns = [Conn::open(ember.port), Conn::open(redis.port)];
    let zeros = Reply::Simple("0".repeat(40));
    fn both(conns: &mut [Conn; 2], args: &[&str]) -> Reply {
        let [e, r] = conns;
        let (a, b) = (e.call(args), r.call(args));
        assert_eq!(a, b, "{args:?}");
        a
    }
    assert_eq!(both(&mut conns, &["DEBUG", "DIGEST"]), zeros);
    assert_eq!(
        both(&mut conns, &["DEBUG", "DIGEST-VALUE", "nosuch"]),
        Reply::Array(vec![zeros.clone()])
    );
    assert_eq!(
        both(&mut conns, &["DEBUG", "DIGEST-VALUE"]),
        Reply::Array(vec![])
    );
    for c in conns.iter_mut() {
        fill(c);
    }
    for k in KEYS {
        both(&mut conns, &["DEBUG", "DIGEST-VALUE", k]);
    }
    let mut digests = vec![both(&mut conns, &["DEBUG", "DIGEST"])];
    let mut keys = vec!["DEBUG", "DIGEST-VALUE"];
    keys.extend(KEYS);
    keys.push("nosuch");
    let Reply::Array(values) = both(&mut conns, &keys) else {
        panic!("DIGEST-VALUE");
    };
    assert_eq!(values.len(), KEYS.len() + 1);
    assert!(values[..KEYS.len()].iter().all(|v| *v != zeros));
    // Each change: the new digest is Redis's, and new, or the digest that
    // the data had before (given by its index) when the change undid others.
    let changes: &[(&[&str], Option<usize>)] = &[
        (&["SET", "s", "hellp"], None),
        (&["EXPIRE", "s", "1000"], None),
        // Only whether a key has a TTL counts, not its time.
        (&["EXPIRE", "s", "2000"], Some(2)),
        (&["PERSIST", "s"], Some(1)),
        (&["SET", "s", "hello"], Some(0)),
        (&["LSET", "bl", "5", "changed"], None),
        (&["SADD", "si", "999999"], None),
        (&["HSET", "h", "extra", "v"], None),
        (&["ZADD", "z", "0.1", "extra"], None),
        (&["ZINCRBY", "bz", "1e300", "extra"], None),
        (&["XADD", "x", "999-1", "f", "v"], None),
        (&["MOVE", "n", "3"], None),
        (&["SWAPDB", "0", "3"], None),
        (&["SELECT", "3"], Some(usize::MAX)),
        (&["PEXPIRE", "l", "100000"], None),
    ];
    for &(change, was) in changes {
        both(&mut conns, change);
        let d = both(&mut conns, &["DEBUG", "DIGEST"]);
        match was {
            Some(usize::MAX) => continue,
            Some(i) => assert_eq!(d, digests[i], "{change:?}"),
            None => assert!(!digests.contains(&d), "{change:?} gave an old digest"),
        }
        digests.push(d);
        both(&mut conns, &keys);
    }
    // Sets, hashes and sorted sets built in another order digest the same.
    let [e, _] = &mut conns;
    e.call(&["SADD", "o1", "a", "b", "c", "1", "2"]);
    e.call(&["SADD", "o2", "2", "c", "1", "b", "a"]);
    e.call(&["HSET", "p1", "a", "1", "b", "2"]);
    e.call(&["HSET", "p2", "b", "2", "a", "1"]);
    let Reply::Array(d) = e.call(&["DEBUG", "DIGEST-VALUE", "o1", "o2", "p1", "p2"]) else {
        panic!("DIGEST-VALUE");
    };
    assert_eq!((&d[0], &d[2]), (&d[1], &d[3]));
    assert_ne!(d[0], d[2]);
}
