//! A three-node cluster of `ember serve` processes on loopback (Raft
//! replication, crate `repl`): writes at the leader reach every node,
//! followers refuse writes with Redis's replica error, ROLE and INFO
//! replication name the leader, and SIGKILL of the leader under load loses
//! no acknowledged write: a new leader takes over, counters stay exact (up
//! to the requests in flight when it died), and the killed node catches up
//! after a restart.

mod serve_common;

use redis::Commands;
use serve_common::cluster::{cluster_with, peers_for, Node};
use serve_common::free_port;
use std::collections::HashMap;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn cluster(dir: &Path) -> Vec<Node> {
    cluster_with(dir, &[])
}

/// A one-way link between two nodes' Raft transports: a TCP proxy that
/// can be cut (its connections closed, new ones refused) and healed.
struct Link {
    port: u16,
    cut: Arc<AtomicBool>,
}

impl Link {
    fn start(upstream: u16) -> Link {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let cut = Arc::new(AtomicBool::new(false));
        let cut2 = cut.clone();
        std::thread::spawn(move || {
            for s in l.incoming() {
                let Ok(s) = s else { continue };
                if cut2.load(Ordering::Relaxed) {
                    continue;
                }
                let Ok(up) = std::net::TcpStream::connect(("127.0.0.1", upstream)) else {
                    continue;
                };
                for (mut from, mut to) in
                    [(s.try_clone().unwrap(), up.try_clone().unwrap()), (up, s)]
                {
                    let cut = cut2.clone();
                    std::thread::spawn(move || {
                        let _ = from.set_read_timeout(Some(Duration::from_millis(20)));
                        let mut buf = [0u8; 64 << 10];
                        loop {
                            if cut.load(Ordering::Relaxed) {
                                break;
                            }
                            match std::io::Read::read(&mut from, &mut buf) {
                                Ok(0) => break,
                                Ok(n) => {
                                    if std::io::Write::write_all(&mut to, &buf[..n]).is_err() {
                                        break;
                                    }
                                }
                                Err(e)
                                    if matches!(
                                        e.kind(),
                                        std::io::ErrorKind::WouldBlock
                                            | std::io::ErrorKind::TimedOut
                                    ) => {}
                                Err(_) => break,
                            }
                        }
                        let _ = from.shutdown(std::net::Shutdown::Both);
                        let _ = to.shutdown(std::net::Shutdown::Both);
                    });
                }
            }
        });
        Link { port, cut }
    }
}

/// Cuts every link to and from node `i`.
fn isolate(links: &[Vec<Option<Link>>], i: usize) {
    for (j, row) in links.iter().enumerate() {
        for l in [&links[i][j], &row[i]].into_iter().flatten() {
            l.cut.store(true, Ordering::Relaxed);
        }
    }
}

/// Restores every link.
fn heal(links: &[Vec<Option<Link>>]) {
    for l in links.iter().flatten().flatten() {
        l.cut.store(false, Ordering::Relaxed);
    }
}

/// Three nodes whose Raft traffic from node i to node j goes through
/// `links[i][j]`, so that the test can partition them.
fn proxied_cluster(dir: &Path, extra: &[&str]) -> (Vec<Node>, Vec<Vec<Option<Link>>>) {
    let raft: Vec<u16> = (0..3).map(|_| free_port()).collect();
    let client: Vec<u16> = (0..3).map(|_| free_port()).collect();
    let links: Vec<Vec<Option<Link>>> = (0..3)
        .map(|i| {
            (0..3)
                .map(|j| (i != j).then(|| Link::start(raft[j])))
                .collect()
        })
        .collect();
    let nodes = (0..3)
        .map(|i| {
            // Node i reaches node j at its link's port; its own entry
            // names its real Raft port.
            let via: Vec<(u16, u16)> = (0..3)
                .map(|j| (links[i][j].as_ref().map_or(raft[j], |l| l.port), client[j]))
                .collect();
            let d = dir.join(format!("n{}", i + 1));
            let own = raft[i].to_string();
            let mut args = vec!["--raft-port", &own];
            args.extend_from_slice(extra);
            let mut n = Node::new(i as u64 + 1, client[i], d, &peers_for(&via), &args);
            n.launch();
            n
        })
        .collect();
    (nodes, links)
}

/// ROLE's first element on node `n` (None when it does not answer).
fn role(port: u16) -> Option<String> {
    let c = redis::Client::open(format!("redis://127.0.0.1:{port}/")).ok()?;
    let mut con = c
        .get_connection_with_timeout(Duration::from_millis(300))
        .ok()?;
    con.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    let v: redis::Value = redis::cmd("ROLE").query(&mut con).ok()?;
    match v {
        redis::Value::Array(items) => match items.first() {
            Some(redis::Value::BulkString(b)) => Some(String::from_utf8_lossy(b).into_owned()),
            _ => None,
        },
        _ => None,
    }
}

/// The port of the node that says it is master (waits for one).
/// The nodes' client ports.
fn ports(nodes: &[Node]) -> Vec<u16> {
    nodes.iter().map(|n| n.port).collect()
}

fn leader_port(ports: &[u16]) -> u16 {
    let t = Instant::now();
    loop {
        for &p in ports {
            if role(p).as_deref() == Some("master") {
                return p;
            }
        }
        if t.elapsed() > Duration::from_secs(3) && t.elapsed() < Duration::from_millis(3100) {
            for &p in ports {
                let t1 = Instant::now();
                let r = role(p);
                eprintln!("slow election: port {p} says {r:?} in {:?}", t1.elapsed());
            }
        }
        assert!(t.elapsed() < Duration::from_secs(30), "no leader elected");
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn info(con: &mut redis::Connection, field: &str) -> String {
    serve_common::info_field(con, "replication", field)
}

#[test]
fn role_and_info_name_the_leader_and_followers_apply_its_writes() {
    let dir = tempfile::tempdir().unwrap();
    let nodes = cluster(dir.path());
    let ports = ports(&nodes);
    let lp = leader_port(&ports);
    let leader = nodes.iter().find(|n| n.port == lp).unwrap();
    let mut lc = leader.con();
    let _: () = lc.set("k", "v").unwrap();
    // WAIT: both followers get the write (at least one already has it).
    let n: i64 = redis::cmd("WAIT").arg(2).arg(5000).query(&mut lc).unwrap();
    assert_eq!(n, 2);
    let n: i64 = lc.rpush("list", &["a", "b", "c"]).unwrap();
    assert_eq!(n, 3);
    let _: () = lc.hset("h", "f", "1").unwrap();
    assert_eq!(info(&mut lc, "role"), "master");
    assert_eq!(info(&mut lc, "connected_slaves"), "2");
    for f in nodes.iter().filter(|n| n.port != lp) {
        let mut fc = f.con();
        // Reads from this node's own applied state.
        let _: () = redis::cmd("READONLY").query(&mut fc).unwrap();
        // ROLE names the leader's client port (once the follower heard
        // from it: the leader's writes need only one follower); INFO
        // replication too.
        let t = Instant::now();
        loop {
            let v: redis::Value = redis::cmd("ROLE").query(&mut fc).unwrap();
            let redis::Value::Array(items) = v else {
                panic!("{v:?}")
            };
            assert_eq!(items[0], redis::Value::BulkString(b"slave".to_vec()));
            if items[2] == redis::Value::Int(i64::from(lp)) {
                assert_eq!(items[3], redis::Value::BulkString(b"connected".to_vec()));
                break;
            }
            assert!(t.elapsed() < Duration::from_secs(10), "{items:?}");
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(info(&mut fc, "role"), "slave");
        assert_eq!(info(&mut fc, "master_port"), lp.to_string());
        assert_eq!(info(&mut fc, "master_link_status"), "up");
        // The follower applies what the leader committed.
        let t = Instant::now();
        loop {
            let got: (Option<String>, Vec<String>, Option<String>) = redis::pipe()
                .get("k")
                .lrange("list", 0, -1)
                .hget("h", "f")
                .query(&mut fc)
                .unwrap();
            if got
                == (
                    Some("v".into()),
                    vec!["a".into(), "b".into(), "c".into()],
                    Some("1".into()),
                )
            {
                break;
            }
            assert!(t.elapsed() < Duration::from_secs(10), "{got:?}");
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// A write or a PUBLISH larger than a replicated entry can be (the store's
/// batch limit: the tests' Bullet logs of 4 MiB take batches of about 1.9
/// MB) is refused before it is proposed, with the store's error, and the
/// cluster goes on serving. Before, the entry went into the log, the leader could
/// not persist it, its replication stopped (`raft_failed`) and the cluster
/// was left without a leader that could write.
#[test]
fn a_write_too_large_for_an_entry_is_refused_and_the_cluster_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let nodes = cluster(dir.path());
    let ports = ports(&nodes);
    let lp = leader_port(&ports);
    let leader = nodes.iter().find(|n| n.port == lp).unwrap();
    let mut lc = leader.con();
    let big = vec![b'x'; 2_500_000];
    let e = lc.set::<_, _, ()>("big", &big).unwrap_err();
    assert!(
        e.to_string().contains("does not fit in a persistent log"),
        "{e}"
    );
    let e = redis::cmd("PUBLISH")
        .arg("ch")
        .arg(&big)
        .query::<i64>(&mut lc)
        .unwrap_err();
    assert!(
        e.to_string().contains("does not fit in a persistent log"),
        "{e}"
    );
    // A value that fits goes to every node.
    let _: () = lc.set("ok", vec![b'y'; 1_000_000]).unwrap();
    let n: i64 = redis::cmd("WAIT")
        .arg(2)
        .arg(10_000)
        .query(&mut lc)
        .unwrap();
    assert_eq!(n, 2);
    let got: Option<Vec<u8>> = lc.get("big").unwrap();
    assert_eq!(got, None);
    for n in &nodes {
        assert_eq!(
            info(&mut n.con(), "raft_failed"),
            "no",
            "node on port {}",
            n.port
        );
    }
}

/// What one writer knows: acknowledged values per key, its counter's
/// acknowledged increments and those whose outcome it could not learn.
#[derive(Default)]
struct Known {
    acked: HashMap<String, String>,
    unknown: HashMap<String, Vec<String>>,
    incr_acked: i64,
    incr_unknown: i64,
}

fn writer(id: usize, ports: Vec<u16>, stop: Arc<AtomicBool>) -> Known {
    let mut k = Known::default();
    let mut con: Option<redis::Connection> = None;
    let mut i = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let c = match con.as_mut() {
            Some(c) => c,
            None => {
                let p = leader_port(&ports);
                match redis::Client::open(format!("redis://127.0.0.1:{p}/"))
                    .and_then(|c| c.get_connection_with_timeout(Duration::from_millis(500)))
                {
                    Ok(c) => {
                        let _ = c.set_read_timeout(Some(Duration::from_secs(40)));
                        con.insert(c)
                    }
                    Err(_) => continue,
                }
            }
        };
        i += 1;
        let key = format!("w{id}:{}", i % 50);
        let val = format!("{i}");
        if i.is_multiple_of(2) {
            match c.set::<_, _, ()>(&key, &val) {
                Ok(()) => {
                    k.acked.insert(key.clone(), val);
                    k.unknown.remove(&key);
                }
                Err(e) => {
                    // A follower's refusal applied nothing; anything else
                    // (a dead connection, a changed leader) may have.
                    if e.code() != Some("READONLY") {
                        k.unknown.entry(key).or_default().push(val);
                    }
                    con = None;
                }
            }
        } else {
            match c.incr::<_, _, i64>(format!("count{id}"), 1) {
                Ok(_) => k.incr_acked += 1,
                Err(e) => {
                    if e.code() != Some("READONLY") {
                        k.incr_unknown += 1;
                    }
                    con = None;
                }
            }
        }
    }
    k
}

#[test]
fn sigkill_of_the_leader_under_load_loses_no_acknowledged_write() {
    kill_under_load(true, &[]);
}

/// The same with a follower killed: the leader keeps its quorum with the
/// other follower, and the killed one catches up after its restart. Its
/// entries are applied by three threads in parallel (each writer's keys
/// are its own): the kill lands in the middle of parallel runs, and the
/// restart must apply what the lanes had not, once.
#[test]
fn sigkill_of_a_follower_under_load_loses_no_acknowledged_write() {
    kill_under_load(false, &["--raft-apply-lanes", "3"]);
}

fn kill_under_load(kill_leader: bool, extra: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    let mut nodes = cluster_with(dir.path(), extra);
    let ports = ports(&nodes);
    let lp = leader_port(&ports);
    // The node killed: the leader, or a follower.
    let victim = if kill_leader {
        lp
    } else {
        *ports.iter().find(|&&p| p != lp).unwrap()
    };
    let stop = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = (0..3)
        .map(|id| {
            let (p, s) = (ports.clone(), stop.clone());
            std::thread::spawn(move || writer(id, p, s))
        })
        .collect();
    std::thread::sleep(Duration::from_millis(1500));
    let li = nodes.iter().position(|n| n.port == victim).unwrap();
    nodes[li].kill9();
    let t_kill = Instant::now();
    let others: Vec<u16> = ports.iter().copied().filter(|&p| p != victim).collect();
    leader_port(&others);
    eprintln!("leader after {:?}", t_kill.elapsed());
    std::thread::sleep(Duration::from_millis(1500));
    stop.store(true, Ordering::Relaxed);
    let known: Vec<Known> = writers.into_iter().map(|w| w.join().unwrap()).collect();
    let total: i64 = known.iter().map(|k| k.incr_acked).sum();
    assert!(total > 20, "too few writes acknowledged: {total}");
    let check = |con: &mut redis::Connection, who: &str| {
        for (id, k) in known.iter().enumerate() {
            let n: i64 = con
                .get::<_, Option<i64>>(format!("count{id}"))
                .unwrap()
                .unwrap_or(0);
            assert!(
                n >= k.incr_acked && n <= k.incr_acked + k.incr_unknown,
                "{who}: counter {id} is {n}, acknowledged {} (+{} unknown)",
                k.incr_acked,
                k.incr_unknown
            );
            for (key, v) in &k.acked {
                let got: Option<String> = con.get(key).unwrap();
                let ok = got.as_ref() == Some(v)
                    || got
                        .as_ref()
                        .is_some_and(|g| k.unknown.get(key).is_some_and(|u| u.contains(g)));
                assert!(ok, "{who}: {key} is {got:?}, acknowledged {v}");
            }
        }
    };
    // The killed node restarts, catches up, and agrees. Every node is
    // checked once it has applied what any node knows committed (on a
    // loaded machine the leader may change meanwhile).
    nodes[li].launch();
    // (The restarted node may restart itself again to install a snapshot:
    // a failed query is tried again.)
    let commit = |n: &Node| -> Option<u64> {
        let info: String = redis::cmd("INFO")
            .arg("replication")
            .query(&mut n.try_con()?)
            .ok()?;
        info.lines()
            .find_map(|l| l.strip_prefix("raft_commit_index:"))?
            .trim()
            .parse()
            .ok()
    };
    let want: u64 = nodes
        .iter()
        .map(|n| {
            let t = Instant::now();
            loop {
                if let Some(c) = commit(n) {
                    break c;
                }
                assert!(t.elapsed() < Duration::from_secs(30), "node {}", n.id);
                std::thread::sleep(Duration::from_millis(20));
            }
        })
        .max()
        .unwrap();
    let t = Instant::now();
    for n in &nodes {
        // Each node's own state: reads served locally. A node sent a
        // snapshot (it fell further behind than the log keeps) restarts
        // itself once it installed it: connect again.
        let local = || -> redis::RedisResult<redis::Connection> {
            let mut c = redis::Client::open(n.url())?
                .get_connection_with_timeout(Duration::from_secs(2))?;
            let () = redis::cmd("READONLY").query(&mut c)?;
            Ok(c)
        };
        let mut c = loop {
            match local() {
                Ok(c) => break c,
                Err(e) => assert!(t.elapsed() < Duration::from_secs(30), "node {}: {e}", n.id),
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        loop {
            let applied: u64 = match redis::cmd("INFO")
                .arg("replication")
                .query::<String>(&mut c)
            {
                Ok(_) => info(&mut c, "raft_applied_index").parse().unwrap(),
                Err(e) if e.is_io_error() || e.is_connection_dropped() => {
                    std::thread::sleep(Duration::from_millis(20));
                    if let Ok(c2) = local() {
                        c = c2;
                    }
                    0
                }
                Err(e) => panic!("node {}: {e}", n.id),
            };
            if applied >= want {
                break;
            }
            assert!(
                t.elapsed() < Duration::from_secs(30),
                "node {} applied {applied} of {want}",
                n.id
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        check(&mut c, &format!("node {}", n.id));
    }
    // Each node's own key count (READONLY: served locally).
    let sizes: Vec<i64> = nodes
        .iter()
        .map(|n| {
            let mut c = n.con();
            let _: () = redis::cmd("READONLY").query(&mut c).unwrap();
            redis::cmd("DBSIZE").query(&mut c).unwrap()
        })
        .collect();
    assert!(sizes.windows(2).all(|w| w[0] == w[1]), "{sizes:?}");
    if !extra.is_empty() {
        // The lanes did apply entries at once somewhere.
        let par: Vec<u64> = nodes
            .iter()
            .map(|n| {
                info(&mut n.con(), "raft_applied_in_parallel")
                    .parse()
                    .unwrap()
            })
            .collect();
        assert!(par.iter().any(|&p| p > 0), "{par:?}");
    }
}

/// A follower serves every client as the leader would: writes, reads,
/// transactions (with WATCH) and scripts are forwarded to the leader;
/// READONLY makes reads local.
#[test]
fn a_follower_forwards_to_the_leader_and_readonly_reads_locally() {
    let dir = tempfile::tempdir().unwrap();
    let nodes = cluster(dir.path());
    let ports = ports(&nodes);
    let lp = leader_port(&ports);
    let f = nodes.iter().find(|n| n.port != lp).unwrap();
    let mut fc = f.con();
    // Writes and reads, in another database too.
    let _: () = fc.set("a", "1").unwrap();
    assert_eq!(fc.get::<_, String>("a").unwrap(), "1");
    let n: i64 = redis::cmd("WAIT").arg(2).arg(5000).query(&mut fc).unwrap();
    assert_eq!(
        n, 2,
        "WAIT through a follower counts the leader's followers"
    );
    assert_eq!(fc.incr::<_, _, i64>("n", 5).unwrap(), 5);
    let _: () = redis::cmd("SELECT").arg(3).query(&mut fc).unwrap();
    let _: () = fc.set("a", "db3").unwrap();
    assert_eq!(fc.get::<_, String>("a").unwrap(), "db3");
    let _: () = redis::cmd("SELECT").arg(0).query(&mut fc).unwrap();
    assert_eq!(fc.get::<_, String>("a").unwrap(), "1");
    // A transaction through the follower, and WATCH aborting one.
    let (x, y): (i64, i64) = redis::pipe()
        .atomic()
        .incr("n", 1)
        .incr("n", 1)
        .query(&mut fc)
        .unwrap();
    assert_eq!((x, y), (6, 7));
    let _: () = redis::cmd("WATCH").arg("n").query(&mut fc).unwrap();
    let mut lc = nodes.iter().find(|n| n.port == lp).unwrap().con();
    let _: () = lc.set("n", "100").unwrap();
    let r: Option<(i64,)> = redis::pipe().atomic().incr("n", 1).query(&mut fc).unwrap();
    assert_eq!(r, None, "EXEC after a watched key changed must abort");
    // A script that writes.
    let v: i64 = redis::Script::new("return redis.call('incrby', KEYS[1], ARGV[1])")
        .key("n")
        .arg(10)
        .invoke(&mut fc)
        .unwrap();
    assert_eq!(v, 110);
    // READONLY: reads from this node's applied state, which catches up.
    let _: () = redis::cmd("READONLY").query(&mut fc).unwrap();
    let t = Instant::now();
    while fc.get::<_, Option<i64>>("n").unwrap() != Some(110) {
        assert!(t.elapsed() < Duration::from_secs(10));
        std::thread::sleep(Duration::from_millis(10));
    }
    let _: () = redis::cmd("READWRITE").query(&mut fc).unwrap();
}

/// Blocking commands at a follower wait at the leader without holding the
/// follower's worker: a push wakes them, their pipelined requests follow
/// their reply, timeouts and CLIENT UNBLOCK (TIMEOUT and ERROR) work, and a
/// client that goes while it waits takes nothing.
#[test]
fn blocking_commands_at_a_follower_wait_at_the_leader() {
    let dir = tempfile::tempdir().unwrap();
    let nodes = cluster(dir.path());
    let ports = ports(&nodes);
    let lp = leader_port(&ports);
    let f = nodes.iter().find(|n| n.port != lp).unwrap();
    let leader = nodes.iter().find(|n| n.port == lp).unwrap();
    let blocked_at_leader = || -> i64 {
        serve_common::info_field(&mut leader.con(), "clients", "blocked_clients")
            .parse()
            .unwrap()
    };
    let wait_blocked = |n: i64| {
        let t = Instant::now();
        while blocked_at_leader() != n {
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "blocked clients never {n}"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    };
    let mut other = f.con();
    // Connections go to the node's two workers in turn: the next one after
    // this is served by `other`'s worker.
    let _pad = f.con();
    // BLPOP woken by a push through the same follower; meanwhile the
    // follower's worker serves the other client.
    let url = f.url();
    let a = std::thread::spawn(move || {
        let mut c = redis::Client::open(url).unwrap().get_connection().unwrap();
        let mut p = redis::pipe();
        p.cmd("BLPOP").arg("q").arg(0).cmd("PING");
        p.query::<(Option<(String, String)>, String)>(&mut c)
            .unwrap()
    });
    wait_blocked(1);
    // The follower counts it blocked too (INFO, CLIENT LIST flag b).
    assert_eq!(
        serve_common::info_field(&mut other, "clients", "blocked_clients"),
        "1"
    );
    let list: String = redis::cmd("CLIENT").arg("LIST").query(&mut other).unwrap();
    assert!(list.lines().any(|l| l.contains("flags=b")), "{list}");
    let _: () = other.set("k", "v").unwrap();
    assert_eq!(other.get::<_, String>("k").unwrap(), "v");
    let _: i64 = other.rpush("q", "x").unwrap();
    let (got, pong) = a.join().unwrap();
    assert_eq!(got, Some(("q".into(), "x".into())));
    assert_eq!(pong, "PONG", "the pipelined request after the blocking one");
    // BLMOVE, then a timeout.
    let url = f.url();
    let b = std::thread::spawn(move || {
        let mut c = redis::Client::open(url).unwrap().get_connection().unwrap();
        redis::cmd("BLMOVE")
            .arg(&["src", "dst", "LEFT", "RIGHT", "0"])
            .query::<Option<String>>(&mut c)
            .unwrap()
    });
    wait_blocked(1);
    let _: i64 = other.rpush("src", "m").unwrap();
    assert_eq!(b.join().unwrap(), Some("m".into()));
    assert_eq!(other.lrange::<_, Vec<String>>("dst", 0, -1).unwrap(), ["m"]);
    let mut c = f.con();
    let t = Instant::now();
    let r: Option<(String, String)> = redis::cmd("BRPOP")
        .arg("none")
        .arg(0.2)
        .query(&mut c)
        .unwrap();
    assert_eq!(r, None);
    assert!(t.elapsed() >= Duration::from_millis(200));
    // CLIENT UNBLOCK at the follower, with TIMEOUT and with ERROR.
    for error in [false, true] {
        let url = f.url();
        let (tx, rx) = std::sync::mpsc::channel();
        let h = std::thread::spawn(move || {
            let mut c = redis::Client::open(url).unwrap().get_connection().unwrap();
            let id: i64 = redis::cmd("CLIENT").arg("ID").query(&mut c).unwrap();
            tx.send(id).unwrap();
            redis::cmd("BZPOPMIN")
                .arg("z")
                .arg(0)
                .query::<Option<(String, String, f64)>>(&mut c)
        });
        let id = rx.recv().unwrap();
        wait_blocked(1);
        let mut u = redis::cmd("CLIENT");
        u.arg("UNBLOCK").arg(id);
        if error {
            u.arg("ERROR");
        }
        assert_eq!(u.query::<i64>(&mut other).unwrap(), 1);
        match h.join().unwrap() {
            Ok(r) => {
                assert!(!error, "UNBLOCK ERROR gave {r:?}");
                assert_eq!(r, None);
            }
            Err(e) => {
                assert!(error, "{e}");
                assert_eq!(e.code(), Some("UNBLOCKED"), "{e}");
            }
        }
        wait_blocked(0);
    }
    // A client that goes while it waits: the leader's wait ends, and a
    // later push stays in the list.
    {
        use std::io::Write;
        let mut s = std::net::TcpStream::connect(("127.0.0.1", f.port)).unwrap();
        s.write_all(b"*3\r\n$5\r\nBLPOP\r\n$4\r\ngone\r\n$1\r\n0\r\n")
            .unwrap();
        wait_blocked(1);
    }
    wait_blocked(0);
    let _: i64 = other.rpush("gone", "kept").unwrap();
    assert_eq!(other.llen::<_, i64>("gone").unwrap(), 1);
}

/// A follower's client that reads locally (READONLY) with CLIENT TRACKING
/// on is told when a replicated write changes a key it read, as after a
/// local write (RESP3 push): a key it found missing, then the replicated
/// value it read.
///
/// Post-mortem (an intermittent failure, 1-2 runs in 10): this test wrote
/// `SET tk 1` before the client turned tracking on and polled GET until
/// its reply began with `1`, dropping the rest of that read. When the
/// follower applied the SET after CLIENT TRACKING ON, a GET could read the
/// new value between the apply and the apply thread's invalidation flush
/// (`sync`, after the commit); the flush then sent that SET's invalidation
/// behind the reply and forgot the key for the client, as it should (the
/// client drops the value it just cached). The poll discarded the push with
/// the reply, so `SET tk 2` rightly invalidated nothing and the wait for it
/// saw nothing. Here every step waits for the exact reply or push it
/// expects and keeps what follows it.
#[test]
fn tracking_clients_of_a_follower_are_invalidated_by_replicated_writes() {
    use std::io::{Read, Write};
    let dir = tempfile::tempdir().unwrap();
    let nodes = cluster(dir.path());
    let ports = ports(&nodes);
    let lp = leader_port(&ports);
    let f = nodes.iter().find(|n| n.port != lp).unwrap();
    let mut lc = nodes.iter().find(|n| n.port == lp).unwrap().con();
    let mut s = std::net::TcpStream::connect(("127.0.0.1", f.port)).unwrap();
    s.set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    let mut seen = Vec::new();
    // Reads until `what` arrived and consumes the stream through it; what
    // came after it stays for the next wait.
    let mut until = |s: &mut std::net::TcpStream, what: &[u8]| {
        let t = Instant::now();
        let mut buf = [0u8; 4096];
        loop {
            if let Some(i) = seen.windows(what.len()).position(|w| w == what) {
                seen.drain(..i + what.len());
                return;
            }
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "no {:?} in {:?}",
                String::from_utf8_lossy(what),
                String::from_utf8_lossy(&seen)
            );
            if let Ok(n) = s.read(&mut buf) {
                seen.extend_from_slice(&buf[..n]);
            }
        }
    };
    let invalidate = b">2\r\n$10\r\ninvalidate\r\n*1\r\n$2\r\ntk\r\n";
    // The key does not exist yet anywhere: the client reads (and tracks)
    // it before the write is proposed.
    s.write_all(b"HELLO 3\r\nREADONLY\r\nCLIENT TRACKING on\r\nGET tk\r\n")
        .unwrap();
    until(&mut s, b"+OK\r\n+OK\r\n_\r\n");
    let _: () = lc.set("tk", "1").unwrap();
    until(&mut s, invalidate);
    // The invalidation follows the apply: the follower's read finds the
    // value, and tracks it again.
    s.write_all(b"GET tk\r\n").unwrap();
    until(&mut s, b"$1\r\n1\r\n");
    let _: () = lc.set("tk", "2").unwrap();
    until(&mut s, invalidate);
}

/// Keyspace notifications of replicated writes reach a follower's
/// subscribers, as a Redis replica fires them: a command's events (a
/// transaction's too), in order, and a key the leader found expired.
#[test]
fn keyspace_notifications_reach_a_followers_subscribers() {
    use std::io::{Read, Write};
    let dir = tempfile::tempdir().unwrap();
    let nodes = cluster(dir.path());
    let ports = ports(&nodes);
    let lp = leader_port(&ports);
    for n in &nodes {
        let _: () = redis::cmd("CONFIG")
            .arg(&["SET", "notify-keyspace-events", "KEA"])
            .query(&mut n.con())
            .unwrap();
    }
    let f = nodes.iter().find(|n| n.port != lp).unwrap();
    let mut lc = nodes.iter().find(|n| n.port == lp).unwrap().con();
    let mut s = std::net::TcpStream::connect(("127.0.0.1", f.port)).unwrap();
    s.set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    s.write_all(b"PSUBSCRIBE __keyevent@0__:*\r\n").unwrap();
    let mut seen = Vec::new();
    let mut until = |s: &mut std::net::TcpStream, what: &[&str]| {
        let t = Instant::now();
        let mut buf = [0u8; 4096];
        loop {
            let text = String::from_utf8_lossy(&seen).into_owned();
            // Each wanted piece, in order.
            let mut at = 0;
            let all = what.iter().all(|w| match text[at..].find(w) {
                Some(i) => {
                    at += i + w.len();
                    true
                }
                None => false,
            });
            if all {
                break;
            }
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "no {what:?} in {text:?}"
            );
            if let Ok(n) = s.read(&mut buf) {
                seen.extend_from_slice(&buf[..n]);
            }
        }
        seen.clear();
    };
    until(&mut s, &["psubscribe"]);
    // The leader's own subscribers get each event once.
    let mut ls = std::net::TcpStream::connect(("127.0.0.1", lp)).unwrap();
    ls.set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    ls.write_all(b"SUBSCRIBE __keyevent@0__:set\r\n").unwrap();
    until(&mut ls, &["subscribe"]);
    let _: () = lc.set("ev1", "x").unwrap();
    until(&mut s, &["__keyevent@0__:set", "ev1"]);
    std::thread::sleep(Duration::from_millis(200));
    let mut at_leader = Vec::new();
    let mut buf = [0u8; 4096];
    while let Ok(n) = ls.read(&mut buf) {
        if n == 0 {
            break;
        }
        at_leader.extend_from_slice(&buf[..n]);
    }
    let text = String::from_utf8_lossy(&at_leader);
    assert_eq!(text.matches("ev1").count(), 1, "{text:?}");
    let _: () = redis::pipe()
        .atomic()
        .incr("ev2", 1)
        .lpush("ev3", "a")
        .del("ev1")
        .query(&mut lc)
        .unwrap();
    until(
        &mut s,
        &[
            "__keyevent@0__:incrby",
            "ev2",
            "__keyevent@0__:lpush",
            "ev3",
            "__keyevent@0__:del",
            "ev1",
        ],
    );
    let _: () = redis::cmd("SET")
        .arg(&["ev4", "y", "PX", "50"])
        .query(&mut lc)
        .unwrap();
    std::thread::sleep(Duration::from_millis(100));
    // Found expired by a read at the leader, or by its active expiry.
    let _: Option<String> = lc.get("ev4").unwrap();
    until(&mut s, &["__keyevent@0__:expired", "ev4"]);
}

/// Every node answers Sentinel's discovery commands with the leader as
/// master `mymaster`; redis-py's Sentinel client finds the leader through
/// any node, writes, and follows a failover.
#[test]
fn sentinel_clients_find_the_leader_and_follow_a_failover() {
    let dir = tempfile::tempdir().unwrap();
    let mut nodes = cluster(dir.path());
    let ports = ports(&nodes);
    let lp = leader_port(&ports);
    for n in &nodes {
        let mut c = n.con();
        let t = Instant::now();
        loop {
            let a: Option<(String, u16)> = redis::cmd("SENTINEL")
                .arg("get-master-addr-by-name")
                .arg("mymaster")
                .query(&mut c)
                .unwrap();
            if a == Some(("127.0.0.1".into(), lp)) {
                break;
            }
            assert!(t.elapsed() < Duration::from_secs(10), "{a:?}");
            std::thread::sleep(Duration::from_millis(10));
        }
        let none: Option<(String, u16)> = redis::cmd("SENTINEL")
            .arg("get-master-addr-by-name")
            .arg("other")
            .query(&mut c)
            .unwrap();
        assert_eq!(none, None);
        let reps: Vec<HashMap<String, String>> = redis::cmd("SENTINEL")
            .arg("replicas")
            .arg("mymaster")
            .query(&mut c)
            .unwrap();
        assert_eq!(reps.len(), 2);
        assert!(reps
            .iter()
            .all(|r| r["flags"] == "slave" && r["port"] != lp.to_string()));
    }
    let script = format!(
        r#"
import redis, time
from redis.sentinel import Sentinel
s = Sentinel([{addrs}], socket_timeout=2)
assert s.discover_master("mymaster") == ("127.0.0.1", {lp}), s.discover_master("mymaster")
m = s.master_for("mymaster", socket_timeout=5)
m.set("sk", "v1")
assert m.get("sk") == b"v1"
print("ready", flush=True)
# The test kills the leader once it reads "ready", then says so.
import sys
sys.stdin.readline()
t0 = time.time()
while True:
    try:
        m.set("sk", "v2")
        break
    except (redis.ConnectionError, redis.TimeoutError, redis.ReadOnlyError, redis.ResponseError):
        assert time.time() - t0 < 20, "no new leader found"
        time.sleep(0.05)
new = s.discover_master("mymaster")
assert new[1] != {lp}, new
got = m.get("sk")
assert got == b"v2", (got, new, [redis.Redis(port=p).execute_command("ROLE") for p in [{others}]])
print("redis-py ok")
"#,
        others = ports
            .iter()
            .filter(|&&p| p != lp)
            .map(|p| p.to_string())
            .collect::<Vec<_>>()
            .join(", "),
        addrs = ports
            .iter()
            .map(|p| format!("('127.0.0.1', {p})"))
            .collect::<Vec<_>>()
            .join(", "),
    );
    let mut child = match std::process::Command::new("python3")
        .args(["-c", &script])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
    {
        Ok(c) => c,
        Err(_) => {
            eprintln!("python3 is not installed: redis-py's part was skipped");
            return;
        }
    };
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    std::io::BufRead::read_line(&mut out, &mut line).unwrap();
    if line.trim() == "ready" {
        let li = nodes.iter().position(|n| n.port == lp).unwrap();
        nodes[li].kill9();
    }
    let mut stdin = child.stdin.take().unwrap();
    let _ = std::io::Write::write_all(&mut stdin, b"killed\n");
    drop(stdin);
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut out, &mut rest).unwrap();
    let res = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&res.stderr);
    if err.contains("No module named 'redis'") {
        eprintln!("redis-py is not installed: its part was skipped");
        return;
    }
    assert!(rest.contains("redis-py ok"), "{line}{rest}\n{err}");
}

/// A leader cut off from the others answers no read and acknowledges no
/// write (a stale read would break linearizability); the majority elects a
/// leader and takes writes; once healed, every node agrees and the cut-off
/// leader's refused write is nowhere.
#[test]
fn a_partitioned_leader_serves_no_stale_read_and_the_majority_moves_on() {
    let dir = tempfile::tempdir().unwrap();
    let (nodes, links) = proxied_cluster(dir.path(), &[]);
    let ports = ports(&nodes);
    // On a loaded machine the first leader may lose its term at once: the
    // write is tried again at whoever leads.
    let t = Instant::now();
    let (lp, mut old) = loop {
        let lp = leader_port(&ports);
        let mut c = nodes.iter().find(|n| n.port == lp).unwrap().con();
        match c.set::<_, _, ()>("k", "1") {
            Ok(()) => break (lp, c),
            Err(e) => assert!(t.elapsed() < Duration::from_secs(30), "{e}"),
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let li = ports.iter().position(|&p| p == lp).unwrap();
    // Cut the leader off, both ways.
    isolate(&links, li);
    let others: Vec<u16> = ports.iter().copied().filter(|&p| p != lp).collect();
    let np = leader_port(&others);
    let mut new = nodes.iter().find(|n| n.port == np).unwrap().con();
    let _: () = new.set("k", "2").unwrap();
    // The old leader, alone: no read of the old value, no write.
    match old.get::<_, Option<String>>("k") {
        Ok(v) => panic!("a cut-off leader answered a read: {v:?}"),
        Err(e) => eprintln!("cut-off read: {e}"),
    }
    assert!(
        old.set::<_, _, ()>("lost", "x").is_err(),
        "a cut-off leader acknowledged a write"
    );
    // Heal: everyone agrees on the majority's history.
    heal(&links);
    let t = Instant::now();
    for n in &nodes {
        let mut c = n.con();
        let _: () = redis::cmd("READONLY").query(&mut c).unwrap();
        loop {
            let got: (Option<String>, Option<String>) = redis::pipe()
                .get("k")
                .get("lost")
                .query(&mut c)
                .unwrap_or((None, None));
            if got.0.as_deref() == Some("2") {
                assert_eq!(got.1, None, "node {}: the refused write applied", n.id);
                break;
            }
            assert!(
                t.elapsed() < Duration::from_secs(20),
                "node {} has {got:?}",
                n.id
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// One operation of a register history (see tools/lincheck).
struct HOp {
    client: usize,
    set: bool,
    key: String,
    value: String,
    call: u128,
    ret: u128,
    unknown: bool,
}

fn history_client(id: usize, ports: Vec<u16>, t0: Instant, stop: Arc<AtomicBool>) -> Vec<HOp> {
    use rand::{RngExt, SeedableRng};
    let mut rng = rand::rngs::SmallRng::seed_from_u64(id as u64 * 7919 + 1);
    let mut out = Vec::new();
    let mut con: Option<redis::Connection> = None;
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let c = match con.as_mut() {
            Some(c) => c,
            None => {
                let p = ports[rng.random_range(0..ports.len())];
                match redis::Client::open(format!("redis://127.0.0.1:{p}/"))
                    .and_then(|c| c.get_connection_with_timeout(Duration::from_millis(300)))
                {
                    Ok(c) => {
                        let _ = c.set_read_timeout(Some(Duration::from_secs(40)));
                        con.insert(c)
                    }
                    Err(_) => {
                        std::thread::sleep(Duration::from_millis(10));
                        continue;
                    }
                }
            }
        };
        let key = format!("k{}", rng.random_range(0..16));
        let set = rng.random_bool(0.5);
        n += 1;
        let value = format!("c{id}-{n}");
        let call = t0.elapsed().as_nanos();
        if set {
            let r = c.set::<_, _, ()>(&key, &value);
            let ret = t0.elapsed().as_nanos();
            match r {
                Ok(()) => out.push(HOp {
                    client: id,
                    set,
                    key,
                    value,
                    call,
                    ret,
                    unknown: false,
                }),
                // Refused before it was proposed: it never happened.
                Err(e)
                    if e.code() == Some("READONLY")
                        || e.detail().is_some_and(|d| d.contains("was not sent")) =>
                {
                    con = None
                }
                Err(_) => {
                    out.push(HOp {
                        client: id,
                        set,
                        key,
                        value,
                        call,
                        ret,
                        unknown: true,
                    });
                    con = None;
                }
            }
        } else {
            let r = c.get::<_, Option<String>>(&key);
            let ret = t0.elapsed().as_nanos();
            match r {
                Ok(v) => out.push(HOp {
                    client: id,
                    set,
                    key,
                    value: v.unwrap_or_default(),
                    call,
                    ret,
                    unknown: false,
                }),
                // A failed read changed nothing: left out.
                Err(_) => con = None,
            }
        }
    }
    out
}

/// Clients read and write registers through every node while the leader
/// is partitioned away and healed, then SIGKILLed and restarted; the
/// recorded history is checked for linearizability by porcupine
/// (tools/lincheck, Go). Skipped when Go is not installed.
#[test]
fn histories_under_partitions_and_kills_are_linearizable() {
    let checker = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tools/lincheck");
    if Command::new("go").arg("version").output().is_err() {
        eprintln!("go is not installed: the linearizability check was skipped");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // The checker catches a stale read (a control: it can fail).
    let bad = dir.path().join("bad.json");
    std::fs::write(
        &bad,
        r#"[{"client":0,"op":"set","key":"a","value":"1","call":1,"return":2,"unknown":false},
            {"client":1,"op":"get","key":"a","value":"","call":3,"return":4,"unknown":false}]"#,
    )
    .unwrap();
    let out = Command::new("go")
        .args(["run", "."])
        .arg(&bad)
        .current_dir(&checker)
        .output()
        .expect("run the checker");
    let (o, e) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    if !o.contains("NOT linearizable") && e.contains("porcupine") {
        // The module could not be fetched (no access to the Go proxy).
        eprintln!("the checker did not build ({e}): the linearizability check was skipped");
        return;
    }
    assert!(
        !out.status.success() && o.contains("NOT linearizable"),
        "the checker passed a stale read: {o}{e}"
    );
    // Two apply threads: the registers' entries apply in parallel.
    let (mut nodes, links) = proxied_cluster(dir.path(), &["--raft-apply-lanes", "2"]);
    let ports = ports(&nodes);
    leader_port(&ports);
    let t0 = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    let clients: Vec<_> = (0..4)
        .map(|id| {
            let (p, s) = (ports.clone(), stop.clone());
            std::thread::spawn(move || history_client(id, p, t0, s))
        })
        .collect();
    std::thread::sleep(Duration::from_millis(600));
    // Rounds of faults: one in the suite; a soak sets EMBER_LIN_ROUNDS.
    let rounds: usize = std::env::var("EMBER_LIN_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    for round in 0..rounds {
        // A partition of the leader, then healed.
        let lp = leader_port(&ports);
        let li = ports.iter().position(|&p| p == lp).unwrap();
        isolate(&links, li);
        std::thread::sleep(Duration::from_millis(1000));
        heal(&links);
        std::thread::sleep(Duration::from_millis(600));
        // SIGKILL of the leader, restarted after a while.
        eprintln!("round {round}: healed at {:?}", t0.elapsed());
        let lp = leader_port(&ports);
        eprintln!("leader found at {:?}", t0.elapsed());
        let li = ports.iter().position(|&p| p == lp).unwrap();
        nodes[li].kill9();
        std::thread::sleep(Duration::from_millis(600));
        eprintln!("killed; restarting at {:?}", t0.elapsed());
        nodes[li].launch();
        eprintln!("restarted at {:?}", t0.elapsed());
        std::thread::sleep(Duration::from_millis(600));
    }
    stop.store(true, Ordering::Relaxed);
    let ops: Vec<HOp> = clients
        .into_iter()
        .flat_map(|c| c.join().unwrap())
        .collect();
    let sets = ops.iter().filter(|o| o.set && !o.unknown).count();
    let gets = ops.iter().filter(|o| !o.set).count();
    assert!(
        sets > 50 && gets > 50,
        "too few operations: {sets} sets, {gets} gets"
    );
    let json = ops
        .iter()
        .map(|o| {
            format!(
                r#"{{"client":{},"op":"{}","key":"{}","value":"{}","call":{},"return":{},"unknown":{}}}"#,
                o.client,
                if o.set { "set" } else { "get" },
                o.key,
                o.value,
                o.call,
                o.ret,
                o.unknown
            )
        })
        .collect::<Vec<_>>()
        .join(",\n");
    let path = dir.path().join("history.json");
    std::fs::write(&path, format!("[{json}]")).unwrap();
    let out = Command::new("go")
        .args(["run", "."])
        .arg(&path)
        .current_dir(&checker)
        .output()
        .expect("run the checker");
    let text = String::from_utf8_lossy(&out.stdout);
    eprintln!(
        "{} operations ({sets} sets, {gets} gets), {rounds} partitions and {rounds} leader kills: {text}{}",
        ops.len(),
        String::from_utf8_lossy(&out.stderr)
    );
    if !out.status.success() {
        let keep = std::env::temp_dir().join(format!("ember-history-{}.json", std::process::id()));
        let _ = std::fs::copy(&path, &keep);
        eprintln!("history kept at {}", keep.display());
    }
    assert!(
        out.status.success() && text.contains("linearizable:"),
        "the history of {} operations is not linearizable ({sets} sets, {gets} gets)",
        ops.len()
    );
}

/// Runs `cmd` at the leader among `ports`, again at the new leader when
/// the leadership changes meanwhile (a loaded machine may see elections).
fn at_leader<T: redis::FromRedisValue>(ports: &[u16], cmd: &redis::Cmd) -> T {
    let t = Instant::now();
    loop {
        let p = leader_port(ports);
        let r = redis::Client::open(format!("redis://127.0.0.1:{p}/"))
            .and_then(|c| c.get_connection_with_timeout(Duration::from_secs(2)))
            .and_then(|mut c| cmd.query(&mut c));
        match r {
            Ok(v) => return v,
            Err(e)
                if e.is_io_error()
                    || matches!(e.code(), Some("TRYAGAIN" | "READONLY" | "CLUSTERDOWN")) =>
            {
                assert!(t.elapsed() < Duration::from_secs(60), "{e}");
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => panic!("{e}"),
        }
    }
}

/// Waits until node `n` (read with READONLY: its own state) has the
/// leader's keyspace: the same DBSIZE and the same values of `keys`.
fn caught_up(n: &Node, ports: &[u16], keys: &[String]) {
    let t = Instant::now();
    loop {
        let want: i64 = at_leader(ports, &redis::cmd("DBSIZE"));
        let vals: Vec<Option<String>> = at_leader(ports, redis::cmd("MGET").arg(keys));
        let got = redis::Client::open(n.url())
            .and_then(|c| c.get_connection_with_timeout(Duration::from_millis(500)))
            .and_then(|mut c| {
                let () = redis::cmd("READONLY").query(&mut c)?;
                let size: i64 = redis::cmd("DBSIZE").query(&mut c)?;
                let v: Vec<Option<String>> = redis::cmd("MGET").arg(keys).query(&mut c)?;
                Ok((size, v))
            });
        if let Ok((size, v)) = &got {
            if *size == want && *v == vals {
                return;
            }
        }
        // (Sizes and how many values differ: the values may be large.)
        let brief = got.as_ref().map(|(size, v)| {
            let differ = v.iter().zip(&vals).filter(|(a, b)| a != b).count();
            (*size, differ)
        });
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "node {} did not catch up: (dbsize, values differing) {brief:?} vs dbsize \
             {want}\n{}",
            n.id,
            n.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn set_cmd(k: &str, v: impl redis::ToRedisArgs) -> redis::Cmd {
    let mut c = redis::cmd("SET");
    c.arg(k).arg(v);
    c
}

/// A follower that was down while the log was compacted past it is sent a
/// snapshot (the leader's keyspace) and then entries; a node started with
/// --join is added with RAFT ADD (sent from a follower: forwarded) and
/// catches up the same way; RAFT REMOVE takes a member out, and the
/// cluster goes on with the new majority.
#[test]
fn snapshots_and_membership_changes_bring_nodes_up_to_date() {
    let dir = tempfile::tempdir().unwrap();
    let mut nodes = cluster_with(dir.path(), &["--raft-log-keep", "20"]);
    let ports = ports(&nodes);
    let mut keys = Vec::new();
    for i in 0..100 {
        let k = format!("s{i}");
        let () = at_leader(&ports, &set_cmd(&k, i));
        keys.push(k);
    }
    // A follower goes down; the log moves on and is compacted past it
    // (non-idempotent writes among them: a snapshot must not replay them).
    let lp = leader_port(&ports);
    let fi = nodes.iter().position(|n| n.port != lp).unwrap();
    nodes[fi].kill9();
    for i in 0..200 {
        let _: i64 = at_leader(&ports, redis::cmd("INCR").arg("counter"));
        let _: i64 = at_leader(&ports, redis::cmd("RPUSH").arg("list").arg(i));
        let k = format!("t{i}");
        let () = at_leader(&ports, &set_cmd(&k, i));
        keys.push(k);
    }
    keys.push("counter".into());
    let info_all: String = at_leader(&ports, redis::cmd("INFO").arg("replication"));
    let first: u64 = info_all
        .lines()
        .find_map(|l| l.strip_prefix("raft_first_index:"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(first > 100, "log not compacted: first index {first}");
    // SIGKILL while it may be installing the snapshot (the kill lands
    // anywhere from before the transfer to after the restart): whatever
    // was torn is wiped at the next start and the snapshot sent again.
    for pause in [30, 120, 250] {
        nodes[fi].launch();
        std::thread::sleep(Duration::from_millis(pause));
        nodes[fi].kill9();
    }
    nodes[fi].launch();
    caught_up(&nodes[fi], &ports, &keys);
    let len: i64 = at_leader(&ports, redis::cmd("LLEN").arg("list"));
    assert!(len >= 200, "{len}");
    // A fourth node joins.
    let (raft4, port4) = (free_port(), free_port());
    let peers4 = format!("{},4=127.0.0.1:{raft4}:{port4}", nodes[0].peers);
    let d4 = dir.path().join("n4");
    let mut n4 = Node::new(4, port4, d4, &peers4, &["--join", "--raft-log-keep", "20"]);
    n4.launch();
    // Sent to a follower: forwarded to the leader.
    let lp = leader_port(&ports);
    let other = nodes.iter().position(|n| n.port != lp).unwrap();
    let mut oc = nodes[other].con();
    let add = || {
        let mut c = redis::cmd("RAFT");
        c.arg("ADD")
            .arg(4)
            .arg(format!("127.0.0.1:{raft4}:{port4}"));
        c
    };
    let r: String = add().query(&mut oc).unwrap();
    assert_eq!(r, "OK");
    let e = add().query::<String>(&mut oc).unwrap_err();
    assert!(e.to_string().contains("already a member"), "{e}");
    let () = at_leader(&ports, &set_cmd("after-join", "yes"));
    keys.push("after-join".into());
    caught_up(&n4, &ports, &keys);
    let members: Vec<(String, String)> = at_leader(&ports, redis::cmd("RAFT").arg("MEMBERS"));
    assert_eq!(members.len(), 4, "{members:?}");
    assert!(members
        .iter()
        .any(|(m, _)| m == &format!("4=127.0.0.1:{raft4}:{port4}")));
    assert_eq!(members.iter().filter(|(_, r)| r == "leader").count(), 1);
    // A follower among the first three leaves; the other three go on.
    let lp = leader_port(&ports);
    let gone = nodes.iter().position(|n| n.port != lp).unwrap();
    let r: String = at_leader(&ports, redis::cmd("RAFT").arg("REMOVE").arg(nodes[gone].id));
    assert_eq!(r, "OK");
    nodes[gone].kill9();
    let members: Vec<(String, String)> = at_leader(&ports, redis::cmd("RAFT").arg("MEMBERS"));
    assert_eq!(members.len(), 3, "{members:?}");
    let mut live: Vec<u16> = ports
        .iter()
        .copied()
        .filter(|&p| p != nodes[gone].port)
        .collect();
    live.push(port4);
    let () = at_leader(&live, &set_cmd("after-remove", "yes"));
    keys.push("after-remove".into());
    caught_up(&n4, &live, &keys);
    // Node 4 restarts on its own heap as a member (no snapshot needed).
    n4.kill9();
    n4.launch();
    let () = at_leader(&live, &set_cmd("after-restart", "yes"));
    keys.push("after-restart".into());
    caught_up(&n4, &live, &keys);
}

/// The first four bytes of a snapshot fetch on a Raft port (`repl::net::
/// FETCH`), in place of a frame's length.
const FETCH: [u8; 4] = 0xFFFF_FF01u32.to_le_bytes();

/// A connection to a loopback port whose receive buffer is small (32 KiB,
/// set before it connects): a sender it reads slowly from cannot have
/// more than its own send buffer (4 MiB at most) and this in flight.
fn connect_small_rcvbuf(port: u16) -> std::io::Result<std::net::TcpStream> {
    use std::os::fd::FromRawFd;
    let size: libc::c_int = 32 << 10;
    let addr = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: port.to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from_ne_bytes([127, 0, 0, 1]),
        },
        sin_zero: [0; 8],
    };
    // SAFETY: a new socket of ours, configured through pointers to locals
    // that outlive the calls, and owned by the TcpStream once connected
    // (closed here otherwise).
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0);
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_RCVBUF,
            (&size as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        );
        if libc::connect(
            fd,
            (&addr as *const libc::sockaddr_in).cast(),
            std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
        ) != 0
        {
            let e = std::io::Error::last_os_error();
            libc::close(fd);
            return Err(e);
        }
        Ok(std::net::TcpStream::from_raw_fd(fd))
    }
}

/// A proxy in front of a node's Raft port that watches the snapshot
/// fetches through it: it can cut them (after 64 KiB of the answer) or
/// slow them down (bytes per second), and counts them and their bytes.
struct FetchProxy {
    port: u16,
    cut: Arc<AtomicBool>,
    rate: Arc<std::sync::atomic::AtomicU64>,
    fetches: Arc<std::sync::atomic::AtomicUsize>,
    cuts: Arc<std::sync::atomic::AtomicUsize>,
    bytes: Arc<std::sync::atomic::AtomicU64>,
    /// Chunks seen in the answers to fetches, and the largest.
    chunks: Arc<std::sync::atomic::AtomicUsize>,
    max_chunk: Arc<std::sync::atomic::AtomicUsize>,
}

/// Follows an answer to a fetch through the proxy: a `u32` status, then
/// chunks, each a `u32` length and its bytes.
#[derive(Default)]
struct ChunkReader {
    status_seen: usize,
    hdr: [u8; 4],
    hdr_at: usize,
    in_chunk: usize,
}

impl ChunkReader {
    /// Takes the next bytes of the answer; calls `chunk` with each chunk's
    /// length as its header is read.
    fn feed(&mut self, mut b: &[u8], mut chunk: impl FnMut(usize)) {
        while !b.is_empty() {
            if self.status_seen < 4 {
                let n = (4 - self.status_seen).min(b.len());
                self.status_seen += n;
                b = &b[n..];
            } else if self.in_chunk > 0 {
                let n = self.in_chunk.min(b.len());
                self.in_chunk -= n;
                b = &b[n..];
            } else {
                self.hdr[self.hdr_at] = b[0];
                self.hdr_at += 1;
                b = &b[1..];
                if self.hdr_at == 4 {
                    self.hdr_at = 0;
                    self.in_chunk = u32::from_le_bytes(self.hdr) as usize;
                    chunk(self.in_chunk);
                }
            }
        }
    }
}

impl FetchProxy {
    fn start(upstream: u16) -> FetchProxy {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let p = FetchProxy {
            port: l.local_addr().unwrap().port(),
            cut: Arc::default(),
            rate: Arc::default(),
            fetches: Arc::default(),
            cuts: Arc::default(),
            bytes: Arc::default(),
            chunks: Arc::default(),
            max_chunk: Arc::default(),
        };
        let (cut, rate, fetches, cuts, bytes) = (
            p.cut.clone(),
            p.rate.clone(),
            p.fetches.clone(),
            p.cuts.clone(),
            p.bytes.clone(),
        );
        let (chunks, max_chunk) = (p.chunks.clone(), p.max_chunk.clone());
        std::thread::spawn(move || {
            use std::io::{Read, Write};
            for c in l.incoming() {
                let Ok(mut c) = c else { continue };
                let Ok(mut up) = connect_small_rcvbuf(upstream) else {
                    continue;
                };
                let fetch = Arc::new(AtomicBool::new(false));
                let (mut c2, mut up2) = (c.try_clone().unwrap(), up.try_clone().unwrap());
                let (f2, fetches) = (fetch.clone(), fetches.clone());
                std::thread::spawn(move || {
                    let mut first = [0u8; 4];
                    if c2.read_exact(&mut first).is_ok() {
                        if first == FETCH {
                            f2.store(true, Ordering::Relaxed);
                            fetches.fetch_add(1, Ordering::Relaxed);
                        }
                        if up2.write_all(&first).is_ok() {
                            let _ = std::io::copy(&mut c2, &mut up2);
                        }
                    }
                    let _ = c2.shutdown(std::net::Shutdown::Both);
                    let _ = up2.shutdown(std::net::Shutdown::Both);
                });
                let (cut, rate, cuts, bytes) =
                    (cut.clone(), rate.clone(), cuts.clone(), bytes.clone());
                let (chunks, max_chunk) = (chunks.clone(), max_chunk.clone());
                std::thread::spawn(move || {
                    let mut buf = vec![0u8; 16 << 10];
                    let mut passed = 0;
                    let mut answer = ChunkReader::default();
                    loop {
                        let n = match up.read(&mut buf) {
                            Ok(0) | Err(_) => break,
                            Ok(n) => n,
                        };
                        if fetch.load(Ordering::Relaxed) {
                            if cut.load(Ordering::Relaxed) && passed >= 64 << 10 {
                                cuts.fetch_add(1, Ordering::Relaxed);
                                break;
                            }
                            let r = rate.load(Ordering::Relaxed);
                            if let Some(us) = (n as u64 * 1_000_000).checked_div(r) {
                                std::thread::sleep(Duration::from_micros(us));
                            }
                            bytes.fetch_add(n as u64, Ordering::Relaxed);
                            answer.feed(&buf[..n], |len| {
                                chunks.fetch_add(1, Ordering::Relaxed);
                                max_chunk.fetch_max(len, Ordering::Relaxed);
                            });
                        }
                        passed += n;
                        if c.write_all(&buf[..n]).is_err() {
                            break;
                        }
                    }
                    let _ = c.shutdown(std::net::Shutdown::Both);
                    let _ = up.shutdown(std::net::Shutdown::Both);
                });
            }
        });
        p
    }
}

/// Every 40th of `keys` and the last few (DBSIZE covers the others: the
/// values are 10 KB each, and `caught_up` polls).
fn sample(keys: &[String]) -> Vec<String> {
    let tail = keys.len().saturating_sub(3);
    keys.iter()
        .enumerate()
        .filter(|(i, _)| i % 40 == 0 || *i >= tail)
        .map(|(_, k)| k.clone())
        .collect()
}

/// What each node says of its Raft state, and what each proxy saw (for a
/// failure's message).
fn fetch_report(nodes: &[Node], proxies: &[FetchProxy]) -> String {
    let mut out = String::new();
    for (n, p) in nodes.iter().zip(proxies) {
        let raft: String = n
            .try_con()
            .and_then(|mut c| {
                redis::cmd("INFO")
                    .arg("replication")
                    .query::<String>(&mut c)
                    .ok()
            })
            .map(|i| {
                i.lines()
                    .filter(|l| l.starts_with("raft_"))
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .unwrap_or_else(|| "down".into());
        out += &format!(
            "node {}: {raft}; its proxy: {} fetches, {} cut, {} bytes\n",
            n.id,
            p.fetches.load(Ordering::Relaxed),
            p.cuts.load(Ordering::Relaxed),
            p.bytes.load(Ordering::Relaxed)
        );
    }
    out
}

/// A snapshot of a few MB goes in 1 KiB chunks (thousands of them) and
/// installs the leader's exact keyspace; transfers cut midway (the
/// connection dropped, again and again; then the sender SIGKILLed in the
/// middle of a slowed transfer) leave the receiver as it was, serving its
/// own keyspace with no snapshot file installed, and a later transfer
/// (from the new leader) succeeds.
#[test]
fn snapshots_go_in_chunks_and_survive_cut_transfers_and_a_killed_sender() {
    let dir = tempfile::tempdir().unwrap();
    let raft: Vec<u16> = (0..3).map(|_| free_port()).collect();
    let client: Vec<u16> = (0..3).map(|_| free_port()).collect();
    // Every node is known at its proxy's port (the leader names that
    // address in its snapshots' descriptors: receivers fetch through it).
    let proxies: Vec<FetchProxy> = raft.iter().map(|&r| FetchProxy::start(r)).collect();
    let via: Vec<(u16, u16)> = (0..3).map(|i| (proxies[i].port, client[i])).collect();
    let peers = peers_for(&via);
    let mut nodes: Vec<Node> = (0..3)
        .map(|i| {
            let own = raft[i].to_string();
            let args = [
                "--raft-port",
                &own,
                "--raft-log-keep",
                "20",
                "--raft-snapshot-chunk",
                "1024",
            ];
            let d = dir.path().join(format!("n{}", i + 1));
            let mut n = Node::new(i as u64 + 1, client[i], d, &peers, &args);
            n.launch();
            n
        })
        .collect();
    let ports = ports(&nodes);
    // 8 MB of values: more than a killed sender's socket buffers hold (in
    // entries of 100 KB: a follower persists a Ready's entries as one
    // batch, which must fit in one of the store's logs, 4 MB here).
    let mut keys = Vec::new();
    for batch in 0..80 {
        let mut c = redis::cmd("MSET");
        for i in 0..10 {
            let k = format!("big{batch}-{i}");
            c.arg(&k).arg(format!("{k}:{}", "v".repeat(10_000)));
            keys.push(k);
        }
        let () = at_leader(&ports, &c);
    }
    // A follower (once it has them all) goes down; the log is compacted
    // past it.
    let lp = leader_port(&ports);
    let fi = nodes.iter().position(|n| n.port != lp).unwrap();
    caught_up(&nodes[fi], &ports, &sample(&keys));
    nodes[fi].kill9();
    let t = Instant::now();
    let mut done = 0;
    while done < 60 {
        let r = ports.iter().find_map(|&p| {
            let mut c = redis::Client::open(format!("redis://127.0.0.1:{p}/"))
                .ok()?
                .get_connection_with_timeout(Duration::from_millis(500))
                .ok()?;
            c.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
            redis::cmd("INCR").arg("counter").query::<i64>(&mut c).ok()
        });
        match r {
            Some(_) => done += 1,
            None => {
                assert!(
                    t.elapsed() < Duration::from_secs(60),
                    "no INCR taken:\n{}",
                    fetch_report(&nodes, &proxies)
                );
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
    keys.push("counter".into());
    // Every fetch is cut: the follower stays as it was.
    for p in &proxies {
        p.cut.store(true, Ordering::Relaxed);
    }
    nodes[fi].launch();
    let t = Instant::now();
    while proxies
        .iter()
        .map(|p| p.cuts.load(Ordering::Relaxed))
        .sum::<usize>()
        < 3
    {
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "no fetch cut: {}\n{}",
            nodes[fi].log(),
            fetch_report(&nodes, &proxies)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut fc = nodes[fi].con();
    let () = redis::cmd("READONLY").query(&mut fc).unwrap();
    let size: i64 = redis::cmd("DBSIZE").query(&mut fc).unwrap();
    assert_eq!(size, 800, "the follower's own keyspace, untouched");
    let counter: Option<i64> = fc.get("counter").unwrap();
    assert_eq!(counter, None);
    let heap = nodes[fi].heap().into_os_string().into_string().unwrap();
    for suffix in [".raft-snapshot", ".raft-snapshot.recv"] {
        assert!(
            !Path::new(&format!("{heap}{suffix}")).exists(),
            "{suffix} after cut transfers"
        );
    }
    // Slowed down, then its sender killed midway.
    for p in &proxies {
        p.bytes.store(0, Ordering::Relaxed);
        p.rate.store(300 << 10, Ordering::Relaxed);
        p.cut.store(false, Ordering::Relaxed);
    }
    let t = Instant::now();
    let sender = loop {
        if let Some(j) = proxies
            .iter()
            .position(|p| p.bytes.load(Ordering::Relaxed) >= 400 << 10)
        {
            break j;
        }
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "no transfer under way:\n{}",
            fetch_report(&nodes, &proxies)
        );
        std::thread::sleep(Duration::from_millis(10));
    };
    assert_ne!(sender, fi);
    nodes[sender].kill9();
    for p in &proxies {
        p.rate.store(0, Ordering::Relaxed);
    }
    drop(fc);
    // What its socket buffers held went through; not the whole snapshot.
    std::thread::sleep(Duration::from_millis(500));
    let passed = proxies[sender].bytes.load(Ordering::Relaxed);
    assert!(
        passed < 7 << 20,
        "{passed} bytes of a transfer whose sender died"
    );
    // The new leader's snapshot brings it up to date.
    let live: Vec<u16> = (0..3).filter(|&j| j != sender).map(|j| ports[j]).collect();
    let () = at_leader(&live, &set_cmd("after-kill", "yes"));
    keys.push("after-kill".into());
    caught_up(&nodes[fi], &live, &sample(&keys));
    // The cut ones, the one its sender died in, the new leader's.
    let fetched: usize = proxies
        .iter()
        .map(|p| p.fetches.load(Ordering::Relaxed))
        .sum();
    let stats: Vec<_> = proxies
        .iter()
        .map(|p| {
            (
                p.fetches.load(Ordering::Relaxed),
                p.cuts.load(Ordering::Relaxed),
                p.bytes.load(Ordering::Relaxed),
            )
        })
        .collect();
    assert!(
        fetched >= 5,
        "{fetched} fetches: {stats:?}, sender {sender}, follower {fi}\n{}",
        nodes[fi].log()
    );
    // In 1 KiB chunks: thousands of them for one whole transfer.
    let chunks: usize = proxies
        .iter()
        .map(|p| p.chunks.load(Ordering::Relaxed))
        .sum();
    let max = proxies
        .iter()
        .map(|p| p.max_chunk.load(Ordering::Relaxed))
        .max();
    assert_eq!(max, Some(1024));
    assert!(chunks >= 7_000, "{chunks} chunks");
    // The killed leader comes back and catches up too.
    nodes[sender].launch();
    caught_up(&nodes[sender], &ports, &sample(&keys));
}

/// PUBLISH (and SPUBLISH) at any node reaches the subscribers of every
/// node, in the order published; the reply counts the receivers on the
/// node that took the command (the leader, for one sent to a follower),
/// as Redis Cluster counts them.
#[test]
fn messages_published_at_any_node_reach_every_nodes_subscribers() {
    let dir = tempfile::tempdir().unwrap();
    let nodes = cluster(dir.path());
    let ports = ports(&nodes);
    let lp = leader_port(&ports);
    let mut subs: Vec<redis::Connection> = nodes
        .iter()
        .map(|n| {
            let mut c = n.con();
            let () = redis::cmd("SUBSCRIBE")
                .arg("news")
                .query(&mut c)
                .unwrap_or(());
            let () = redis::cmd("SSUBSCRIBE")
                .arg("shard")
                .query(&mut c)
                .unwrap_or(());
            c
        })
        .collect();
    // The subscribe confirmations were read as the commands' replies
    // (redis-rs reads one reply per command); give the two a moment.
    std::thread::sleep(Duration::from_millis(100));
    let follower = nodes.iter().find(|n| n.port != lp).unwrap();
    let leader = nodes.iter().find(|n| n.port == lp).unwrap();
    let sent = [
        (follower, "PUBLISH", "news", "from-follower"),
        (leader, "PUBLISH", "news", "from-leader"),
        (follower, "SPUBLISH", "shard", "sharded"),
    ];
    for (n, cmd, ch, msg) in sent {
        let got: i64 = at_leader_or(n, redis::cmd(cmd).arg(ch).arg(msg));
        assert_eq!(got, 1, "{cmd} {msg} at node {}", n.id);
    }
    for (i, s) in subs.iter_mut().enumerate() {
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut got = Vec::new();
        while got.len() < 3 {
            let v: redis::Value = s.recv_response().unwrap();
            let redis::Value::Array(parts) = v else {
                panic!("{v:?}")
            };
            let text: Vec<String> = parts
                .iter()
                .map(|p| match p {
                    redis::Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
                    other => format!("{other:?}"),
                })
                .collect();
            if text[0] == "message" || text[0] == "smessage" {
                got.push(text[2].clone());
            }
        }
        assert_eq!(
            got,
            ["from-follower", "from-leader", "sharded"],
            "node {}",
            i + 1
        );
    }
}

/// Runs `cmd` at node `n`, again after a moment when an election is under
/// way (a write then gets READONLY or TRYAGAIN).
fn at_leader_or<T: redis::FromRedisValue>(n: &Node, cmd: &redis::Cmd) -> T {
    let t = Instant::now();
    loop {
        match cmd.query(&mut n.con()) {
            Ok(v) => return v,
            Err(e) if matches!(e.code(), Some("TRYAGAIN" | "READONLY")) => {
                assert!(t.elapsed() < Duration::from_secs(30), "{e}");
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => panic!("{e}"),
        }
    }
}
