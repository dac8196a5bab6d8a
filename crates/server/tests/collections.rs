//! Collections leave no piece behind: random list, hash and set commands
//! (large collections made of pieces, deleted, overwritten, renamed onto,
//! expired, popped empty, stored over) on the in-process command layer,
//! then FLUSHALL; the store must then hold no piece (no key with the piece
//! prefix) on the volatile and on the direct engine.

use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};
use server::config::{Config, EngineChoice};
use server::keyspace::PIECE_PREFIX;
use server::server::Embedded;
use server::store;

fn args(a: &[&str]) -> Vec<Vec<u8>> {
    a.iter().map(|x| x.as_bytes().to_vec()).collect()
}

/// Store keys with the piece prefix (the marker that pieces were ever made
/// aside).
fn pieces_left(sh: &server::server::Shared) -> usize {
    let mut sess = sh.store.session().unwrap();
    let (mut cursor, mut n) = (0, 0);
    let mut page = Vec::new();
    loop {
        page.clear();
        cursor = sess.scan(cursor, 1024, &mut page).unwrap();
        let mut live = Vec::new();
        for k in page.drain(..) {
            let piece =
                k.first() == Some(&PIECE_PREFIX) && k.as_slice() != server::coll::PIECED_KEY;
            if piece && sess.get(&k, &mut live).unwrap() {
                n += 1;
            }
        }
        if cursor == 0 {
            return n;
        }
    }
}

fn big(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}{i}")).collect()
}

fn run(cfg: Config, seed: u64) {
    let (st, startup) = store::open(&cfg).unwrap();
    let sh = Embedded::start(cfg, st, startup, 1).unwrap();
    let mut e = Embedded::new(sh.clone(), 0).unwrap();
    let mut rng = SmallRng::seed_from_u64(seed);
    let keys = ["k1", "k2", "k3", "k4"];
    for step in 0..400 {
        let k = keys[rng.random_range(0..keys.len())];
        let k2 = keys[rng.random_range(0..keys.len())];
        let mut cmd: Vec<String> = match rng.random_range(0..20) {
            0 => vec!["RPUSH".into(), k.into()],
            1 => vec!["HSET".into(), k.into()],
            2 => vec!["SADD".into(), k.into()],
            3 => vec!["DEL".into(), k.into()],
            4 => vec!["SET".into(), k.into(), "s".into()],
            5 => vec!["RENAME".into(), k.into(), k2.into()],
            6 => vec!["EXPIRE".into(), k.into(), "-1".into()],
            7 => vec![
                "LPOP".into(),
                k.into(),
                rng.random_range(1..500).to_string(),
            ],
            8 => vec!["LTRIM".into(), k.into(), "100".into(), "-100".into()],
            9 => vec![
                "SPOP".into(),
                k.into(),
                rng.random_range(1..500).to_string(),
            ],
            10 => vec!["SINTERSTORE".into(), k.into(), k2.into(), k2.into()],
            11 => vec!["SUNIONSTORE".into(), k.into(), k2.into()],
            12 => vec![
                "LMOVE".into(),
                k.into(),
                k2.into(),
                "LEFT".into(),
                "RIGHT".into(),
            ],
            13 => vec!["SMOVE".into(), k.into(), k2.into(), "m7".into()],
            14 => vec!["HDEL".into(), k.into(), "f1".into(), "f2".into()],
            15 => vec!["ZADD".into(), k.into()],
            16 => vec![
                "ZREMRANGEBYRANK".into(),
                k.into(),
                "10".into(),
                rng.random_range(10..600).to_string(),
            ],
            17 => vec![
                "ZUNIONSTORE".into(),
                k.into(),
                "2".into(),
                k.into(),
                k2.into(),
            ],
            18 => vec![
                "ZPOPMIN".into(),
                k.into(),
                rng.random_range(1..500).to_string(),
            ],
            _ => vec!["UNLINK".into(), k.into(), k2.into()],
        };
        match cmd[0].as_str() {
            "RPUSH" => cmd.extend(big("e", rng.random_range(1..600))),
            "SADD" => cmd.extend(big("m", rng.random_range(1..900))),
            "ZADD" => {
                for (i, m) in big("z", rng.random_range(1..800)).into_iter().enumerate() {
                    cmd.push((i % 97).to_string());
                    cmd.push(m);
                }
            }
            "HSET" => {
                for f in big("f", rng.random_range(1..700)) {
                    cmd.push(f);
                    cmd.push("v".into());
                }
            }
            _ => {}
        }
        let refs: Vec<&str> = cmd.iter().map(|s| s.as_str()).collect();
        let reply = e.exec(&args(&refs));
        // Errors a random mix makes (no such key, wrong type) are fine; a
        // store error is not.
        let fine = reply.starts_with(b"-ERR no such key") || reply.starts_with(b"-WRONGTYPE");
        assert!(
            fine || !reply.starts_with(b"-"),
            "step {step}: {cmd:?} -> {}",
            String::from_utf8_lossy(&reply)
        );
        e.commit().unwrap();
    }
    assert_eq!(e.exec(&args(&["FLUSHALL"])), b"+OK\r\n");
    e.commit().unwrap();
    assert_eq!(
        pieces_left(e.shared()),
        0,
        "pieces left after FLUSHALL (seed {seed})"
    );
    drop(e);
    Embedded::shutdown(sh).unwrap();
}

#[test]
fn no_piece_outlives_its_collection_volatile() {
    for seed in 0..3 {
        run(
            Config {
                engine: EngineChoice::Volatile,
                threads: 1,
                ..Config::default()
            },
            seed,
        );
    }
}

#[test]
fn no_piece_outlives_its_collection_direct() {
    let dir = tempfile::tempdir().unwrap();
    run(
        Config {
            heap: dir.path().join("heap"),
            heap_size: 64 << 20,
            heap_max_size: 256 << 20,
            engine: EngineChoice::Direct(engine::direct::BackendKind::LogFree),
            threads: 1,
            ..Config::default()
        },
        7,
    );
}
