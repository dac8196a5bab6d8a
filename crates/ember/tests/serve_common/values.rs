//! A value of every type and encoding, written through commands, and the
//! contents of a key as comparable replies: for the tests that move values
//! between Ember and redis-server (DUMP/RESTORE, RDB files).

use super::redis_server::Conn;
use proto::Reply;

/// Writes a value of every type and encoding (see the keys of [`KEYS`]).
pub fn fill(c: &mut Conn) {
    let mut run = |a: Vec<String>| {
        let r = c.call(&a);
        assert!(!matches!(r, Reply::Error(_)), "{a:?}: {r:?}");
    };
    let s = |x: &str| x.to_string();
    run(vec![s("SET"), s("s"), s("hello")]);
    run(vec![s("SET"), s("n"), s("12345")]);
    run(vec![s("SET"), s("neg"), s("-7")]);
    run(vec![s("SET"), s("big"), "ab".repeat(5000)]);
    run(vec![
        s("RPUSH"),
        s("l"),
        s("a"),
        s("1"),
        s("-300"),
        s("70000"),
        "x".repeat(100),
    ]);
    let mut bl = vec![s("RPUSH"), s("bl")];
    bl.extend((0..3000).map(|i| i.to_string().repeat(i % 7 + 1)));
    run(bl);
    run(vec![
        s("SADD"),
        s("si"),
        s("1"),
        s("2"),
        s("-5"),
        s("100000"),
    ]);
    run(vec![s("SADD"), s("ss"), s("a"), s("b")]);
    let mut bs = vec![s("SADD"), s("bs")];
    bs.extend((0..600).map(|i| format!("m{i}")));
    run(bs);
    run(vec![s("HSET"), s("h"), s("f"), s("v"), s("n"), s("1")]);
    let mut bh = vec![s("HSET"), s("bh")];
    for i in 0..300 {
        bh.extend([format!("f{i}"), "v".repeat(i % 50)]);
    }
    run(bh);
    run(vec![
        s("ZADD"),
        s("z"),
        s("1.5"),
        s("a"),
        s("-2"),
        s("b"),
        s("inf"),
        s("c"),
    ]);
    let mut bz = vec![s("ZADD"), s("bz")];
    for i in 0..400 {
        bz.extend([format!("{}", i as f64 / 3.0), format!("m{i}")]);
    }
    run(bz);
    // A stream with deleted entries, two groups, pending entries (one for
    // an entry deleted since) and consumers.
    for i in 1..=250 {
        let fields = if i % 3 == 0 { "other" } else { "f" };
        run(vec![
            s("XADD"),
            s("x"),
            format!("{i}-1"),
            s(fields),
            i.to_string(),
            s("g"),
            s("v"),
        ]);
    }
    run(vec![s("XDEL"), s("x"), s("5-1"), s("120-1")]);
    run(vec![s("XGROUP"), s("CREATE"), s("x"), s("g1"), s("0")]);
    run(vec![
        s("XGROUP"),
        s("CREATE"),
        s("x"),
        s("g2"),
        s("$"),
        s("ENTRIESREAD"),
        s("3"),
    ]);
    run(vec![
        s("XREADGROUP"),
        s("GROUP"),
        s("g1"),
        s("alice"),
        s("COUNT"),
        s("7"),
        s("STREAMS"),
        s("x"),
        s(">"),
    ]);
    run(vec![
        s("XREADGROUP"),
        s("GROUP"),
        s("g1"),
        s("bob"),
        s("COUNT"),
        s("3"),
        s("STREAMS"),
        s("x"),
        s(">"),
    ]);
    run(vec![
        s("XGROUP"),
        s("CREATECONSUMER"),
        s("x"),
        s("g2"),
        s("carol"),
    ]);
    run(vec![s("XDEL"), s("x"), s("2-1")]);
    run(vec![s("XADD"), s("empty"), s("1-1"), s("a"), s("b")]);
    run(vec![s("XDEL"), s("empty"), s("1-1")]);
}

pub const KEYS: &[&str] = &[
    "s", "n", "neg", "big", "l", "bl", "si", "ss", "bs", "h", "bh", "z", "bz", "x", "empty",
];

/// The contents of `key` as comparable replies (sets and hashes sorted;
/// times since a delivery left out).
pub fn contents(c: &mut Conn, key: &str) -> Vec<Reply> {
    let t = match c.call(&["TYPE", key]) {
        Reply::Simple(t) => t,
        r => panic!("TYPE {key}: {r:?}"),
    };
    let sorted = |r: Reply| match r {
        Reply::Array(mut v) => {
            v.sort_by_key(|x| format!("{x:?}"));
            Reply::Array(v)
        }
        r => r,
    };
    match t.as_str() {
        "string" => vec![c.call(&["GET", key])],
        "list" => vec![c.call(&["LRANGE", key, "0", "-1"])],
        "set" => vec![sorted(c.call(&["SMEMBERS", key]))],
        "hash" => vec![sorted(c.call(&["HGETALL", key]))],
        "zset" => vec![c.call(&["ZRANGE", key, "0", "-1", "WITHSCORES"])],
        "stream" => {
            let mut v = vec![
                c.call(&["XRANGE", key, "-", "+"]),
                c.call(&["XLEN", key]),
                c.call(&["XINFO", "GROUPS", key]),
            ];
            if let Reply::Array(groups) = c.call(&["XINFO", "GROUPS", key]) {
                for g in groups {
                    let Reply::Array(f) = g else { continue };
                    let Reply::Bulk(name) = &f[1] else { continue };
                    let name = String::from_utf8_lossy(name).into_owned();
                    let mut p = c.call(&["XPENDING", key, &name, "-", "+", "100"]);
                    if let Reply::Array(items) = &mut p {
                        for it in items {
                            if let Reply::Array(e) = it {
                                e[2] = Reply::Integer(0);
                            }
                        }
                    }
                    v.push(p);
                    let mut cs = c.call(&["XINFO", "CONSUMERS", key, &name]);
                    if let Reply::Array(items) = &mut cs {
                        for it in items {
                            if let Reply::Array(e) = it {
                                e[5] = Reply::Integer(0);
                            }
                        }
                    }
                    v.push(cs);
                }
            }
            let Reply::Array(mut info) = c.call(&["XINFO", "STREAM", key]) else {
                panic!("XINFO STREAM");
            };
            // The radix tree's shape is Redis's own.
            info[3] = Reply::Integer(0);
            info[5] = Reply::Integer(0);
            v.push(Reply::Array(info));
            v
        }
        other => panic!("type {other}"),
    }
}
