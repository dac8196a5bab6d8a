//! Replication: a 3-node Ember cluster (Raft) against Redis with two replicas
//! (and, where the `etcd` binary is installed, a 3-member etcd), all on
//! loopback.
//!
//! Replicated writes: SET, INCR and LPUSH from [`CLIENTS`] connections at
//! pipeline 1 ([`respload::writes`]) against the Ember leader, and against
//! the Redis master with `WAIT 2 0` after each write (pipelined with it; the
//! write counts once WAIT answers 2: the closest Redis gets to "on every
//! node"). Ember runs in `--durability pmem` (msync with `--strategy msync`)
//! with `--threads` 1 and `--max-threads` on every node: a worker waits for
//! its write's commit while it holds the write's stripe locks, so the
//! workers bound the writes in flight. With `--strategy msync` and `etcd`
//! installed, a put load against etcd (HTTP/JSON gateway, 50 blocking
//! clients) joins. Servers alternate each round (A B C A B C); rows per
//! round, then medians and Ember/Redis (median of the per-round ratios).
//!
//! Failover: a client writes (SET) continuously to the leader; the leader is
//! SIGKILLed; the time from the kill to the first write acknowledged by
//! another node is the failover time. The client finds the leader as a
//! client library would: Ember with ROLE on every node, Redis by asking its
//! three Sentinels (`down-after-milliseconds` [`SENTINEL_DOWN_MS`])
//! `SENTINEL get-master-addr-by-name`. The killed node is restarted (Redis:
//! as a replica of the new master) and caught up before the next kill.

use super::chart::{Bars, Chart, Panel};
use super::child::{run_capture, Guard, TempDir};
use super::resp::{info_field, Conn, Reply};
use super::respload::{self, WriteCmd, WriteLoad};
use super::servers::{free_port, Kind, RedisMode, Server, Spec};
use super::table::{Labels, Table};
use super::udorn::{labels_of, load_preamble, VALUE_SIZE};
use super::{median, BenchResult, Ctx, Report};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Mutex};
use std::time::{Duration, Instant};

/// Connections of the write workloads.
pub const CLIENTS: usize = 50;
const KEYSPACE: u64 = 100_000;
const WRITES: [WriteCmd; 3] = [WriteCmd::Set, WriteCmd::Incr, WriteCmd::Lpush];
/// Sentinel's `down-after-milliseconds`.
pub const SENTINEL_DOWN_MS: u64 = 1000;
/// Sentinel's `failover-timeout`.
const SENTINEL_FAILOVER_TIMEOUT_MS: u64 = 2000;
/// The master name the Sentinels monitor (Ember answers for it too).
const MASTER: &str = "mymaster";
const STARTUP: Duration = Duration::from_secs(60);
/// Goals: Ember pmem / Redis+WAIT, Ember msync / etcd, failover p50 and max.
const GOAL_REDIS: f64 = 2.0;
const GOAL_ETCD: f64 = 5.0;
const GOAL_P50_MS: f64 = 50.0;
const GOAL_MAX_MS: f64 = 150.0;

const COLUMNS: [&str; 14] = [
    "test",
    "clients",
    "requests",
    "value_size",
    "round",
    "rps",
    "avg_ms",
    "p50_ms",
    "p99_ms",
    "max_ms",
    "retried",
    "failover_ms",
    "ratio",
    "server_version",
];

/// ROLE's first element (`master`, `slave`) on `port`, if it answers.
fn role(port: u16) -> Option<String> {
    let mut c = Conn::connect(port, Duration::from_millis(300)).ok()?;
    match c.call(&[b"ROLE"]).ok()? {
        Reply::Array(Some(v)) => match v.first() {
            Some(Reply::Bulk(Some(b))) => Some(String::from_utf8_lossy(b).into_owned()),
            _ => None,
        },
        _ => None,
    }
}

/// The port of the node whose ROLE says master.
fn ember_leader(ports: &[u16]) -> Option<u16> {
    ports
        .iter()
        .copied()
        .find(|&p| role(p).as_deref() == Some("master"))
}

/// Waits (at most [`STARTUP`]) for `f` to give a value.
fn wait_for<T>(what: &str, stop: &AtomicBool, mut f: impl FnMut() -> Option<T>) -> BenchResult<T> {
    let t = Instant::now();
    loop {
        if let Some(v) = f() {
            return Ok(v);
        }
        if stop.load(Ordering::Relaxed) {
            return Err("interrupted".into());
        }
        if t.elapsed() > STARTUP {
            return Err(format!("{what}: not within {} s", STARTUP.as_secs()));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A field of INFO `section` on `port`.
fn info_of(port: u16, section: &str, field: &str) -> Option<String> {
    let info = Conn::connect(port, Duration::from_secs(2))
        .ok()?
        .info(section)
        .ok()?;
    info_field(&info, field).map(str::to_string)
}

/// Three `ember serve` nodes of one cluster, each in its own directory.
struct EmberCluster {
    msync: bool,
    threads: usize,
    ports: Vec<u16>,
    peers: String,
    ember: PathBuf,
    fence_ns: u64,
    nodes: Vec<Option<Server>>,
    dirs: Vec<TempDir>,
    /// More arguments for every node.
    extra: Vec<String>,
}

impl EmberCluster {
    fn start(ctx: &Ctx, msync: bool, threads: usize, tag: &str) -> BenchResult<EmberCluster> {
        Self::start_with(ctx, msync, threads, tag, &[])
    }

    fn start_with(
        ctx: &Ctx,
        msync: bool,
        threads: usize,
        tag: &str,
        extra: &[String],
    ) -> BenchResult<EmberCluster> {
        let ember = ctx.ember()?;
        let ports: Vec<(u16, u16)> = (0..3)
            .map(|_| Ok((free_port()?, free_port()?)))
            .collect::<BenchResult<_>>()?;
        let peers = ports
            .iter()
            .enumerate()
            .map(|(i, (raft, port))| format!("{}=127.0.0.1:{raft}:{port}", i + 1))
            .collect::<Vec<_>>()
            .join(",");
        let dirs = (1..=3)
            .map(|i| TempDir::new_in(ctx.work_dir(), &format!("{tag}-n{i}")))
            .collect::<BenchResult<Vec<_>>>()?;
        let mut c = EmberCluster {
            msync,
            threads,
            ports: ports.iter().map(|p| p.1).collect(),
            peers,
            ember,
            fence_ns: ctx.fence_ns,
            nodes: (0..3).map(|_| None).collect(),
            dirs,
            extra: extra.to_vec(),
        };
        for i in 0..3 {
            c.launch(i, ctx.stop_flag())?;
        }
        c.leader(ctx.stop_flag())?;
        Ok(c)
    }

    fn spec(&self, i: usize) -> Spec<'_> {
        Spec {
            kind: Kind::Ember { msync: self.msync },
            dir: self.dirs[i].path(),
            ember: &self.ember,
            fence_ns: self.fence_ns,
            heap_mib: 1024,
            extra: [
                "--node-id".into(),
                (i + 1).to_string(),
                "--peers".into(),
                self.peers.clone(),
                "--threads".into(),
                self.threads.to_string(),
            ]
            .into_iter()
            .chain(self.extra.iter().cloned())
            .collect(),
        }
    }

    /// Starts node `i` (again) on its port, on its heap.
    fn launch(&mut self, i: usize, stop: &AtomicBool) -> BenchResult<()> {
        let (s, _) = self.spec(i).start_on(self.ports[i], STARTUP, stop)?;
        self.nodes[i] = Some(s);
        Ok(())
    }

    /// The index of the leader (waits for one).
    fn leader(&self, stop: &AtomicBool) -> BenchResult<usize> {
        let p = wait_for("an Ember leader", stop, || ember_leader(&self.ports))?;
        Ok(self
            .ports
            .iter()
            .position(|&q| q == p)
            .expect("a node's port"))
    }

    fn server(&self, i: usize) -> BenchResult<&Server> {
        self.nodes[i]
            .as_ref()
            .ok_or_else(|| format!("ember node {} is not running", i + 1))
    }

    /// Restarts node `i` after its kill and waits until it follows a leader
    /// and has applied everything committed when it came back.
    fn restore(&mut self, i: usize, stop: &AtomicBool) -> BenchResult<()> {
        self.launch(i, stop)?;
        let leader = self.leader(stop)?;
        let commit: u64 = wait_for("the leader's commit index", stop, || {
            info_of(self.ports[leader], "replication", "raft_commit_index")?
                .parse()
                .ok()
        })?;
        let port = self.ports[i];
        wait_for("the restarted node to catch up", stop, || {
            let applied: u64 = info_of(port, "replication", "raft_applied_index")?
                .parse()
                .ok()?;
            let led = info_of(port, "replication", "raft_leader_id")? != "0";
            (led && applied >= commit).then_some(())
        })
    }
}

/// Redis with two replicas (no persistence on any), and optionally three
/// Sentinels watching it.
struct RedisGroup {
    ports: Vec<u16>,
    nodes: Vec<Option<Server>>,
    dirs: Vec<TempDir>,
    sentinels: Vec<(Guard, u16)>,
}

const REDIS: Kind = Kind::Redis(RedisMode::Rdb);

fn redis_spec<'a>(dir: &'a Path, ember: &'a Path, master: Option<u16>) -> Spec<'a> {
    Spec {
        kind: REDIS,
        dir,
        ember,
        fence_ns: 0,
        heap_mib: 0,
        extra: match master {
            Some(p) => vec!["--replicaof".into(), "127.0.0.1".into(), p.to_string()],
            None => Vec::new(),
        },
    }
}

/// Whether the master on `port` has `n` replicas online.
fn replicas_online(port: u16, n: usize) -> bool {
    let Ok(mut c) = Conn::connect(port, Duration::from_secs(2)) else {
        return false;
    };
    let Ok(info) = c.info("replication") else {
        return false;
    };
    info_field(&info, "role") == Some("master")
        && (0..n).all(|i| {
            info_field(&info, &format!("slave{i}")).is_some_and(|v| v.contains("state=online"))
        })
}

impl RedisGroup {
    fn start(ctx: &Ctx, tag: &str, sentinels: bool) -> BenchResult<RedisGroup> {
        let stop = ctx.stop_flag();
        let dirs = (1..=3)
            .map(|i| TempDir::new_in(ctx.work_dir(), &format!("{tag}-r{i}")))
            .collect::<BenchResult<Vec<_>>>()?;
        let none = PathBuf::new();
        let (m, _) = redis_spec(dirs[0].path(), &none, None).start(STARTUP, stop)?;
        let mut nodes = vec![Some(m)];
        let mut ports = vec![nodes[0].as_ref().expect("master").port];
        for d in &dirs[1..] {
            let (r, _) = redis_spec(d.path(), &none, Some(ports[0])).start(STARTUP, stop)?;
            ports.push(r.port);
            nodes.push(Some(r));
        }
        wait_for("two Redis replicas online", stop, || {
            replicas_online(ports[0], 2).then_some(())
        })?;
        let mut g = RedisGroup {
            ports,
            nodes,
            dirs,
            sentinels: Vec::new(),
        };
        if sentinels {
            for i in 0..3 {
                let port = free_port()?;
                let conf = g.dirs[i].path().join("sentinel.conf");
                std::fs::write(
                    &conf,
                    format!(
                        "port {port}\nbind 127.0.0.1\ndaemonize no\n\
                         sentinel monitor {MASTER} 127.0.0.1 {} 2\n\
                         sentinel down-after-milliseconds {MASTER} {SENTINEL_DOWN_MS}\n\
                         sentinel failover-timeout {MASTER} {SENTINEL_FAILOVER_TIMEOUT_MS}\n\
                         sentinel parallel-syncs {MASTER} 2\n",
                        g.ports[0]
                    ),
                )
                .map_err(|e| format!("cannot write {}: {e}", conf.display()))?;
                let log = std::fs::File::create(g.dirs[i].path().join("sentinel.log"))
                    .map_err(|e| format!("sentinel log: {e}"))?;
                let log2 = log.try_clone().map_err(|e| format!("sentinel log: {e}"))?;
                let mut cmd = Command::new("redis-server");
                cmd.arg(&conf)
                    .arg("--sentinel")
                    .stdin(Stdio::null())
                    .stdout(Stdio::from(log))
                    .stderr(Stdio::from(log2));
                let guard = Guard::spawn(cmd, &format!("redis sentinel on port {port}"))?;
                g.sentinels.push((guard, port));
            }
            // Every Sentinel knows the master, both replicas and the others.
            let sp: Vec<u16> = g.sentinels.iter().map(|s| s.1).collect();
            wait_for("three Sentinels that know each other", stop, || {
                sp.iter()
                    .all(|&p| {
                        sentinel_field(p, "num-slaves").as_deref() == Some("2")
                            && sentinel_field(p, "num-other-sentinels").as_deref() == Some("2")
                    })
                    .then_some(())
            })?;
        }
        Ok(g)
    }

    fn sentinel_ports(&self) -> Vec<u16> {
        self.sentinels.iter().map(|s| s.1).collect()
    }

    /// Restarts node `i` as a replica of the master the Sentinels name and
    /// waits until that master has both replicas online.
    fn restore(&mut self, i: usize, stop: &AtomicBool) -> BenchResult<()> {
        let sp = self.sentinel_ports();
        let master = wait_for("the Sentinels' master", stop, || {
            sentinel_master(&sp).filter(|&p| p != self.ports[i])
        })?;
        let none = PathBuf::new();
        let (s, _) = redis_spec(self.dirs[i].path(), &none, Some(master)).start_on(
            self.ports[i],
            STARTUP,
            stop,
        )?;
        self.nodes[i] = Some(s);
        wait_for("two Redis replicas online after the restart", stop, || {
            replicas_online(master, 2).then_some(())
        })
    }
}

/// A field of `SENTINEL master mymaster` on the Sentinel at `port`.
fn sentinel_field(port: u16, field: &str) -> Option<String> {
    let mut c = Conn::connect(port, Duration::from_millis(500)).ok()?;
    let Reply::Array(Some(v)) = c.call(&[b"SENTINEL", b"master", MASTER.as_bytes()]).ok()? else {
        return None;
    };
    v.chunks(2).find_map(|kv| match kv {
        [Reply::Bulk(Some(k)), Reply::Bulk(Some(val))] if k == field.as_bytes() => {
            Some(String::from_utf8_lossy(val).into_owned())
        }
        _ => None,
    })
}

/// The master's port as the first Sentinel that answers names it.
fn sentinel_master(sentinels: &[u16]) -> Option<u16> {
    sentinels.iter().find_map(|&p| {
        let mut c = Conn::connect(p, Duration::from_millis(300)).ok()?;
        match c
            .call(&[b"SENTINEL", b"get-master-addr-by-name", MASTER.as_bytes()])
            .ok()?
        {
            Reply::Array(Some(v)) => match v.as_slice() {
                [_, Reply::Bulk(Some(port))] => String::from_utf8_lossy(port).parse().ok(),
                _ => None,
            },
            _ => None,
        }
    })
}

/// The failover client: SET continuously to the node `discover` names;
/// after a failed write (connection lost, error reply) it asks `discover`
/// again. Once `killed` holds (port, time), the first write acknowledged by
/// another port after that time sends the elapsed time on `tx`.
fn failover_writer(
    discover: &(dyn Fn() -> Option<u16> + Sync),
    killed: &Mutex<Option<(u16, Instant)>>,
    tx: mpsc::Sender<Duration>,
    done: &AtomicBool,
) {
    let mut cur: Option<(Conn, u16)> = None;
    let mut n = 0u64;
    while !done.load(Ordering::Relaxed) {
        let Some((c, port)) = cur.as_mut() else {
            cur = discover().and_then(|p| {
                Conn::connect(p, Duration::from_millis(500))
                    .ok()
                    .map(|c| (c, p))
            });
            if cur.is_none() {
                std::thread::sleep(Duration::from_millis(1));
            }
            continue;
        };
        n += 1;
        let key = format!("failover:{}", n % 1000);
        match c.call(&[b"SET", key.as_bytes(), b"v"]) {
            Ok(Reply::Simple(s)) if s == "OK" => {
                let now = Instant::now();
                let mut k = killed.lock().unwrap_or_else(|e| e.into_inner());
                if let Some((kp, t)) = *k {
                    if *port != kp && now > t {
                        let _ = tx.send(now - t);
                        *k = None;
                    }
                }
            }
            _ => {
                cur = None;
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }
}

/// Three nodes whose leader [`failovers`] kills and restores.
trait Group {
    fn nodes(&mut self) -> &mut [Option<Server>];
    /// Restarts node `i` and waits until the group is whole again.
    fn restore(&mut self, i: usize, stop: &AtomicBool) -> BenchResult<()>;
}

impl Group for EmberCluster {
    fn nodes(&mut self) -> &mut [Option<Server>] {
        &mut self.nodes
    }
    fn restore(&mut self, i: usize, stop: &AtomicBool) -> BenchResult<()> {
        EmberCluster::restore(self, i, stop)
    }
}

impl Group for RedisGroup {
    fn nodes(&mut self) -> &mut [Option<Server>] {
        &mut self.nodes
    }
    fn restore(&mut self, i: usize, stop: &AtomicBool) -> BenchResult<()> {
        RedisGroup::restore(self, i, stop)
    }
}

/// `rounds` kills of the leader under the failover client; the failover
/// times in ms. `discover` names the leader's port (one of `ports`).
fn failovers(
    ctx: &mut Ctx,
    what: &str,
    rounds: usize,
    discover: &(dyn Fn() -> Option<u16> + Sync),
    ports: &[u16],
    group: &mut dyn Group,
) -> BenchResult<Vec<f64>> {
    let killed = Mutex::new(None);
    let done = AtomicBool::new(false);
    let (tx, rx) = mpsc::channel();
    let stop_arc = ctx.stop.clone();
    let stop: &AtomicBool = &stop_arc;
    let mut out = Vec::new();
    std::thread::scope(|s| {
        let w = s.spawn(|| failover_writer(discover, &killed, tx, &done));
        let r = (|| -> BenchResult<()> {
            for round in 1..=rounds {
                ctx.check_stop()?;
                // Writes flow for a moment before each kill.
                std::thread::sleep(Duration::from_millis(300 + 37 * (round as u64 % 7)));
                let lp = wait_for("the leader", stop, discover)?;
                let i = ports
                    .iter()
                    .position(|&p| p == lp)
                    .ok_or_else(|| format!("{what}: leader port {lp} is not a node's"))?;
                *killed.lock().unwrap_or_else(|e| e.into_inner()) = Some((lp, Instant::now()));
                group.nodes()[i]
                    .take()
                    .ok_or_else(|| format!("{what}: the leader is not running"))?
                    .kill()?;
                let d = rx.recv_timeout(Duration::from_secs(30)).map_err(|_| {
                    format!("{what}: no write acknowledged within 30 s of the kill")
                })?;
                out.push(d.as_secs_f64() * 1e3);
                ctx.progress.done(&format!(
                    "{what} kill {round}: {:.1} ms",
                    d.as_secs_f64() * 1e3
                ));
                // Restored for the next kill (after the last one there is
                // none: a Redis replica that takes long to come back, as on
                // a loaded machine, fails no run).
                if round < rounds {
                    group.restore(i, stop)?;
                }
            }
            Ok(())
        })();
        done.store(true, Ordering::Relaxed);
        let _ = w.join();
        r
    })?;
    Ok(out)
}

/// etcd members on loopback: (guard, client port).
struct Etcd {
    members: Vec<(Guard, u16)>,
    _dirs: Vec<TempDir>,
}

/// `etcd --version`'s version, or None when etcd is not installed.
fn etcd_version(stop: &AtomicBool) -> Option<String> {
    let mut c = Command::new("etcd");
    c.arg("--version");
    let out = run_capture(c, "etcd --version", Duration::from_secs(10), stop).ok()?;
    out.lines()
        .find_map(|l| l.strip_prefix("etcd Version: "))
        .map(|v| v.trim().to_string())
}

/// One HTTP/1.1 request on a kept-alive connection; the response's status
/// and body.
fn http(
    s: &mut std::net::TcpStream,
    buf: &mut Vec<u8>,
    method: &str,
    path: &str,
    body: &str,
) -> Result<(u16, String), String> {
    use std::io::{Read, Write as _};
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes())
        .map_err(|e| format!("write: {e}"))?;
    buf.clear();
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(h) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..h]).to_string();
            let status = head
                .split_whitespace()
                .nth(1)
                .and_then(|s| s.parse().ok())
                .ok_or_else(|| format!("bad HTTP response {head:?}"))?;
            let len: usize = head
                .lines()
                .find_map(|l| {
                    let (k, v) = l.split_once(':')?;
                    k.eq_ignore_ascii_case("content-length")
                        .then(|| v.trim().parse().ok())?
                })
                .ok_or_else(|| format!("no Content-Length in {head:?}"))?;
            while buf.len() < h + 4 + len {
                let n = s.read(&mut chunk).map_err(|e| format!("read: {e}"))?;
                if n == 0 {
                    return Err("etcd closed the connection".into());
                }
                buf.extend_from_slice(&chunk[..n]);
            }
            let body = String::from_utf8_lossy(&buf[h + 4..h + 4 + len]).to_string();
            return Ok((status, body));
        }
        let n = s.read(&mut chunk).map_err(|e| format!("read: {e}"))?;
        if n == 0 {
            return Err("etcd closed the connection".into());
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

fn etcd_conn(port: u16) -> Result<std::net::TcpStream, String> {
    let s =
        std::net::TcpStream::connect(("127.0.0.1", port)).map_err(|e| format!("connect: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(30)))
        .and_then(|_| s.set_nodelay(true))
        .map_err(|e| format!("socket: {e}"))?;
    Ok(s)
}

impl Etcd {
    fn start(ctx: &Ctx, tag: &str) -> BenchResult<Etcd> {
        let ports: Vec<(u16, u16)> = (0..3)
            .map(|_| Ok((free_port()?, free_port()?)))
            .collect::<BenchResult<_>>()?;
        let cluster = ports
            .iter()
            .enumerate()
            .map(|(i, (_, peer))| format!("e{}=http://127.0.0.1:{peer}", i + 1))
            .collect::<Vec<_>>()
            .join(",");
        let mut members = Vec::new();
        let mut dirs = Vec::new();
        for (i, &(client, peer)) in ports.iter().enumerate() {
            let d = TempDir::new_in(ctx.work_dir(), &format!("{tag}-e{}", i + 1))?;
            let log = std::fs::File::create(d.path().join("etcd.log"))
                .map_err(|e| format!("etcd log: {e}"))?;
            let log2 = log.try_clone().map_err(|e| format!("etcd log: {e}"))?;
            let c = format!("http://127.0.0.1:{client}");
            let p = format!("http://127.0.0.1:{peer}");
            let mut cmd = Command::new("etcd");
            cmd.args(["--name", &format!("e{}", i + 1)])
                .arg("--data-dir")
                .arg(d.path().join("data"))
                .args(["--listen-client-urls", &c, "--advertise-client-urls", &c])
                .args([
                    "--listen-peer-urls",
                    &p,
                    "--initial-advertise-peer-urls",
                    &p,
                ])
                .args(["--initial-cluster", &cluster])
                .args(["--initial-cluster-state", "new"])
                .args(["--initial-cluster-token", tag])
                .stdin(Stdio::null())
                .stdout(Stdio::from(log))
                .stderr(Stdio::from(log2));
            members.push((
                Guard::spawn(cmd, &format!("etcd member {}", i + 1))?,
                client,
            ));
            dirs.push(d);
        }
        let e = Etcd {
            members,
            _dirs: dirs,
        };
        // Ready: a put through the first member commits.
        let port = e.members[0].1;
        wait_for(
            "an etcd cluster that commits a put",
            ctx.stop_flag(),
            || {
                let mut s = etcd_conn(port).ok()?;
                let (st, _) = http(
                    &mut s,
                    &mut Vec::new(),
                    "POST",
                    "/v3/kv/put",
                    r#"{"key":"cmVhZHk=","value":"MQ=="}"#,
                )
                .ok()?;
                (st == 200).then_some(())
            },
        )?;
        Ok(e)
    }

    /// `clients` blocking connections put `requests` 100-byte values to
    /// random keys between them (through the first member, which forwards
    /// to the leader); throughput and latency.
    fn puts(
        &self,
        clients: usize,
        requests: u64,
        stop: &AtomicBool,
    ) -> BenchResult<respload::Outcome> {
        let port = self.members[0].1;
        let value = base64(&[b'x'; VALUE_SIZE]);
        let t0 = Instant::now();
        let results: Vec<Result<Vec<u64>, String>> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..clients)
                .map(|i| {
                    let value = &value;
                    s.spawn(move || -> Result<Vec<u64>, String> {
                        let n = requests / clients as u64
                            + u64::from((i as u64) < requests % clients as u64);
                        let mut c = etcd_conn(port)?;
                        let mut buf = Vec::new();
                        let mut lat = Vec::with_capacity(n as usize);
                        for k in 0..n {
                            if stop.load(Ordering::Relaxed) {
                                return Err("interrupted".into());
                            }
                            let r = (k * 7919 + i as u64 * 104_729) % KEYSPACE;
                            let key = base64(format!("key:{r:012}").as_bytes());
                            let body = format!(r#"{{"key":"{key}","value":"{value}"}}"#);
                            let t = Instant::now();
                            let (st, resp) = http(&mut c, &mut buf, "POST", "/v3/kv/put", &body)?;
                            if st != 200 || !resp.contains("revision") {
                                return Err(format!("etcd put answered {st} {resp}"));
                            }
                            lat.push(t.elapsed().as_nanos() as u64);
                        }
                        Ok(lat)
                    })
                })
                .collect();
            hs.into_iter()
                .map(|h| h.join().unwrap_or_else(|_| Err("a client panicked".into())))
                .collect()
        });
        let secs = t0.elapsed().as_secs_f64();
        let mut lat = Vec::new();
        for r in results {
            lat.extend(r?);
        }
        lat.sort_unstable();
        let q = |f: f64| lat[((lat.len() - 1) as f64 * f) as usize] as f64 / 1e6;
        Ok(respload::Outcome {
            units: lat.len() as u64,
            commands: lat.len() as u64,
            deliveries: 0,
            retried: 0,
            seconds: secs,
            avg_ms: lat.iter().sum::<u64>() as f64 / lat.len().max(1) as f64 / 1e6,
            p50_ms: q(0.5),
            p99_ms: q(0.99),
            max_ms: q(1.0),
        })
    }
}

/// Standard base64 (etcd's JSON gateway carries keys and values so).
fn base64(b: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(b)
}

/// One system under the write load.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum System {
    Ember { threads: usize },
    Redis,
    Etcd,
}

fn ms(v: f64) -> String {
    format!("{v:.3}")
}

pub fn run(ctx: &mut Ctx) -> BenchResult<Report> {
    let msync = ctx.strategy == "msync";
    let durability = if msync { "msync" } else { "pmem" };
    let redis_version = load_preamble(ctx)?;
    let etcd = if msync {
        etcd_version(ctx.stop_flag())
    } else {
        None
    };
    let rounds = ctx.rounds(3);
    let kills = if ctx.quick { 1 } else { 20 };
    let requests: u64 = if ctx.quick { 500 } else { 30_000 };
    let mut systems: Vec<System> = ctx
        .thread_ends()
        .into_iter()
        .rev()
        .map(|threads| System::Ember { threads })
        .collect();
    systems.push(System::Redis);
    if etcd.is_some() {
        systems.push(System::Etcd);
    }
    ctx.progress
        .plan((rounds * systems.len() + 2 * kills) as u64);
    let mut table = Table::new(ctx, &COLUMNS);
    let redis_labels = Labels {
        engine: "redis".into(),
        variant: "master + 2 replicas, WAIT 2 0".into(),
        durability: "none".into(),
        strategy: "replication (no fsync)".into(),
        fence_ns: 0,
        read_ns: 0,
        threads: 1,
    };
    let etcd_labels = Labels {
        engine: "etcd".into(),
        variant: "3 members, HTTP/JSON gateway".into(),
        durability: "fsync".into(),
        strategy: "WAL fdatasync".into(),
        fence_ns: 0,
        read_ns: 0,
        threads: ctx.machine.cores,
    };
    let version = |s: System| match s {
        System::Ember { .. } => format!("ember {}", env!("CARGO_PKG_VERSION")),
        System::Redis => format!("redis {redis_version}"),
        System::Etcd => format!("etcd {}", etcd.clone().unwrap_or_default()),
    };
    // [system][write] -> throughput of every round.
    let mut rps = vec![vec![Vec::<f64>::new(); WRITES.len()]; systems.len()];
    let mut labels: Vec<Option<Labels>> = vec![None; systems.len()];
    let mut strategy_note = String::new();
    for round in 1..=rounds {
        for (si, &sys) in systems.iter().enumerate() {
            ctx.check_stop()?;
            let tag = match sys {
                System::Ember { threads } => format!("ember-{durability}-t{threads}"),
                System::Redis => "redis-wait".into(),
                System::Etcd => "etcd".into(),
            };
            ctx.progress.start(format!("{tag}, round {round}"));
            let mut summary = Vec::new();
            let mut measure =
                |ctx: &Ctx, port: u16, wait: Option<u32>, lab: &Labels| -> BenchResult<()> {
                    for (wi, &w) in WRITES.iter().enumerate() {
                        let o = respload::writes(
                            &WriteLoad {
                                port,
                                clients: CLIENTS,
                                requests,
                                write: w,
                                wait,
                                keyspace: KEYSPACE,
                                value_size: VALUE_SIZE,
                                seed: round as u64 * 10 + wi as u64,
                            },
                            ctx.stop_flag(),
                        )
                        .map_err(|e| format!("{tag} {}: {e}", w.name()))?;
                        rps[si][wi].push(o.per_sec());
                        summary.push(format!("{} {:.1}k/s", w.name(), o.per_sec() / 1e3));
                        table.push(lab, measured_row(w.name(), round, &o, version(sys)));
                    }
                    Ok(())
                };
            match sys {
                System::Ember { threads } => {
                    let c = EmberCluster::start(ctx, msync, threads, &format!("{tag}-{round}"))?;
                    let leader = c.server(c.leader(ctx.stop_flag())?)?;
                    let mut lab = labels_of(ctx, Kind::Ember { msync }, leader)?;
                    lab.variant = format!("{}, 3-node Raft", lab.variant);
                    strategy_note = lab.strategy.clone();
                    measure(ctx, leader.port, None, &lab)?;
                    labels[si] = Some(lab);
                }
                System::Redis => {
                    let g = RedisGroup::start(ctx, &format!("{tag}-{round}"), false)?;
                    measure(ctx, g.ports[0], Some(2), &redis_labels)?;
                    labels[si] = Some(redis_labels.clone());
                }
                System::Etcd => {
                    let e = Etcd::start(ctx, &format!("{tag}-{round}"))?;
                    for (wi, w) in WRITES.iter().enumerate() {
                        // etcd has one write, put: it stands for each.
                        let o = e.puts(CLIENTS, requests, ctx.stop_flag())?;
                        rps[si][wi].push(o.per_sec());
                        summary.push(format!("put {:.1}k/s", o.per_sec() / 1e3));
                        table.push(
                            &etcd_labels,
                            measured_row(w.name(), round, &o, version(sys)),
                        );
                    }
                    drop(e.members);
                    labels[si] = Some(etcd_labels.clone());
                }
            }
            ctx.progress.done(&summary.join(", "));
        }
    }

    // Failover: Ember (most threads) and Redis Sentinel.
    let ember_threads = ctx.max_threads;
    ctx.progress
        .start(format!("ember failover, {kills} kill(s)"));
    let mut ember = EmberCluster::start(
        ctx,
        msync,
        ember_threads,
        &format!("ember-{durability}-failover"),
    )?;
    let eports = ember.ports.clone();
    let ember_lab = {
        let l = ember.server(ember.leader(ctx.stop_flag())?)?;
        let mut lab = labels_of(ctx, Kind::Ember { msync }, l)?;
        lab.variant = format!("{}, 3-node Raft", lab.variant);
        lab
    };
    let ember_ms = failovers(
        ctx,
        "ember",
        kills,
        &|| ember_leader(&eports),
        &eports,
        &mut ember,
    )?;
    drop(ember);
    ctx.progress
        .start(format!("redis sentinel failover, {kills} kill(s)"));
    let mut redis = RedisGroup::start(ctx, "redis-sentinel", true)?;
    let rports = redis.ports.clone();
    let sports = redis.sentinel_ports();
    let redis_ms = failovers(
        ctx,
        "redis sentinel",
        kills,
        &|| sentinel_master(&sports),
        &rports,
        &mut redis,
    )?;
    drop(redis);
    let sentinel_labels = Labels {
        variant: format!("master + 2 replicas, 3 Sentinels, down-after {SENTINEL_DOWN_MS} ms"),
        ..redis_labels.clone()
    };
    let fo_stats = |v: &[f64]| {
        let mut s = v.to_vec();
        s.sort_by(f64::total_cmp);
        (median(&s), s.last().copied().unwrap_or(f64::NAN))
    };
    for (lab, v, sys) in [
        (
            &ember_lab,
            &ember_ms,
            System::Ember {
                threads: ember_threads,
            },
        ),
        (&sentinel_labels, &redis_ms, System::Redis),
    ] {
        let (p50, max) = fo_stats(v);
        for (k, &d) in v.iter().enumerate() {
            table.push(
                lab,
                failover_row((k + 1).to_string(), &format!("{d:.3}"), version(sys)),
            );
        }
        table.push(
            lab,
            failover_row("p50".into(), &format!("{p50:.3}"), version(sys)),
        );
        table.push(
            lab,
            failover_row("max".into(), &format!("{max:.3}"), version(sys)),
        );
    }

    // Medians, ratios against Redis (and etcd), the summary.
    let ratio = |a: usize, b: usize, wi: usize| {
        let r: Vec<f64> = rps[a][wi]
            .iter()
            .zip(&rps[b][wi])
            .map(|(x, y)| x / y)
            .collect();
        median(&r)
    };
    let redis_i = systems
        .iter()
        .position(|&s| s == System::Redis)
        .expect("redis");
    let etcd_i = systems.iter().position(|&s| s == System::Etcd);
    let mut lines = Vec::new();
    for (wi, w) in WRITES.iter().enumerate() {
        for (si, &sys) in systems.iter().enumerate() {
            let Some(lab) = &labels[si] else { continue };
            let (r, goal) = match (sys, etcd_i) {
                (System::Ember { .. }, Some(e)) => (Some(ratio(si, e, wi)), GOAL_ETCD),
                (System::Ember { .. }, None) => (Some(ratio(si, redis_i, wi)), GOAL_REDIS),
                _ => (None, 0.0),
            };
            let m = median(&rps[si][wi]);
            table.push(
                lab,
                vec![
                    w.name().into(),
                    CLIENTS.to_string(),
                    String::new(),
                    VALUE_SIZE.to_string(),
                    "median".into(),
                    format!("{m:.0}"),
                    String::new(),
                    String::new(),
                    String::new(),
                    String::new(),
                    String::new(),
                    String::new(),
                    r.map(|r| format!("{r:.3}")).unwrap_or_default(),
                    version(sys),
                ],
            );
            let name = match sys {
                System::Ember { threads } => format!("ember {durability} --threads {threads}"),
                System::Redis => "redis + WAIT 2 0".into(),
                System::Etcd => "etcd put".into(),
            };
            lines.push(format!(
                "| {:<6} | {name:<24} | {m:>9.0} | {} |",
                w.name(),
                match r {
                    Some(r) => format!(
                        "{r:.2}x vs {} (goal {goal:.0}x: {})",
                        if etcd_i.is_some() { "etcd" } else { "redis" },
                        if r >= goal { "met" } else { "NOT met" }
                    ),
                    None => String::new(),
                }
            ));
        }
    }
    let (ep50, emax) = fo_stats(&ember_ms);
    let (rp50, rmax) = fo_stats(&redis_ms);
    println!(
        "\ncluster: 3-node Ember ({durability}, {strategy_note}) against Redis {redis_version} + 2 replicas with WAIT 2 0{}; {CLIENTS} clients, pipeline 1; medians of {rounds} round(s)\n\
         machine: {}\nmode: {} run, commit {}\n\
         | write  | system                   | writes/s  | ratio |\n|--------|--------------------------|-----------|-------|\n{}\n\n\
         failover over {kills} kill(s): ember p50 {ep50:.1} ms, max {emax:.1} ms (goals {GOAL_P50_MS} / {GOAL_MAX_MS} ms: {}); redis sentinel p50 {rp50:.1} ms, max {rmax:.1} ms",
        match &etcd {
            Some(v) => format!(" and etcd {v}"),
            None if msync => " (etcd not installed)".into(),
            None => String::new(),
        },
        ctx.machine.line(),
        ctx.mode(),
        super::COMMIT,
        lines.join("\n"),
        if ep50 <= GOAL_P50_MS && emax <= GOAL_MAX_MS {
            "met"
        } else {
            "NOT met"
        },
    );

    let name_of = |s: System| match s {
        System::Ember { threads } => format!("ember {durability} t{threads}"),
        System::Redis => "redis + WAIT 2 0".into(),
        System::Etcd => "etcd put".into(),
    };
    let panels = vec![
        Panel::Bars(Bars {
            title: format!("replicated writes per second, {CLIENTS} clients, pipeline 1"),
            y_label: "writes/s".into(),
            groups: WRITES.iter().map(|w| w.name().to_string()).collect(),
            series: systems
                .iter()
                .enumerate()
                .map(|(si, &s)| {
                    (
                        name_of(s),
                        rps[si]
                            .iter()
                            .map(|v| (!v.is_empty()).then(|| median(v)))
                            .collect(),
                    )
                })
                .collect(),
        }),
        Panel::Bars(Bars {
            title: format!(
                "failover: SIGKILL of the leader to the first acknowledged write ({kills} kills)"
            ),
            y_label: "ms".into(),
            groups: vec!["p50".into(), "max".into()],
            series: vec![
                ("ember".into(), vec![Some(ep50), Some(emax)]),
                ("redis sentinel".into(), vec![Some(rp50), Some(rmax)]),
            ],
        }),
    ];
    Ok(Report {
        table,
        chart: Chart {
            title: format!("cluster: 3-node Ember (Raft) against Redis {redis_version} + 2 replicas (WAIT 2 0, Sentinel)"),
            subtitle: ctx.subtitle(&format!("Ember durability {durability} ({strategy_note}); Redis without persistence")),
            panels,
        },
    })
}

/// A row of one measured write load (etcd: puts standing for each write).
fn measured_row(test: &str, round: usize, o: &respload::Outcome, version: String) -> Vec<String> {
    vec![
        test.into(),
        CLIENTS.to_string(),
        o.units.to_string(),
        VALUE_SIZE.to_string(),
        round.to_string(),
        format!("{:.0}", o.per_sec()),
        ms(o.avg_ms),
        ms(o.p50_ms),
        ms(o.p99_ms),
        ms(o.max_ms),
        o.retried.to_string(),
        String::new(),
        String::new(),
        version,
    ]
}

fn failover_row(round: String, ms: &str, version: String) -> Vec<String> {
    vec![
        "failover".into(),
        "1".into(),
        String::new(),
        String::new(),
        round,
        String::new(),
        String::new(),
        String::new(),
        String::new(),
        String::new(),
        String::new(),
        ms.into(),
        String::new(),
        version,
    ]
}

/// Apply threads compared by `cluster-apply`.
const APPLY_LANES: [usize; 2] = [1, 2];
/// Writes a follower misses and then catches up with.
const CATCH_UP_WRITES: u64 = 60_000;

/// Serial against parallel apply (`--raft-apply-lanes` 1 and 2, alternating
/// each round): SET from 50 clients on a 3-node cluster with one follower
/// down (the leader and the other follower apply as they go: the live
/// throughput), then the follower restarts and catches up with those
/// entries (the log keeps them all: no snapshot); its catch-up time, from
/// its launch to its applied index reaching the leader's commit index, and
/// the entries applied per second.
pub fn run_apply(ctx: &mut Ctx) -> BenchResult<Report> {
    let msync = ctx.strategy == "msync";
    let durability = if msync { "msync" } else { "pmem" };
    load_preamble(ctx)?;
    let rounds = ctx.rounds(3);
    let writes: u64 = if ctx.quick { 2_000 } else { CATCH_UP_WRITES };
    ctx.progress.plan((rounds * APPLY_LANES.len()) as u64);
    let columns = [
        "test",
        "apply_lanes",
        "clients",
        "requests",
        "round",
        "rps",
        "p50_ms",
        "p99_ms",
        "catch_up_entries",
        "catch_up_ms",
        "applied_per_sec",
        "applied_in_parallel",
    ];
    let mut table = Table::new(ctx, &columns);
    // [lanes] -> (live rps, catch-up entries/s) per round.
    let mut live = vec![Vec::new(); APPLY_LANES.len()];
    let mut catch = vec![Vec::new(); APPLY_LANES.len()];
    let mut note = String::new();
    for round in 1..=rounds {
        for (li, &lanes) in APPLY_LANES.iter().enumerate() {
            ctx.check_stop()?;
            let tag = format!("apply-{durability}-l{lanes}-{round}");
            ctx.progress
                .start(format!("{lanes} apply lane(s), round {round}"));
            let extra = [
                "--raft-apply-lanes".to_string(),
                lanes.to_string(),
                "--raft-log-keep".into(),
                "100000000".into(),
            ];
            let mut c = EmberCluster::start_with(ctx, msync, ctx.max_threads, &tag, &extra)?;
            let leader = c.leader(ctx.stop_flag())?;
            let mut lab = labels_of(ctx, Kind::Ember { msync }, c.server(leader)?)?;
            lab.variant = format!("{}, 3-node Raft, {lanes} apply lane(s)", lab.variant);
            note = lab.strategy.clone();
            let down = (leader + 1) % 3;
            let port = c.ports[down];
            let from: u64 = info_of(port, "replication", "raft_applied_index")
                .and_then(|v| v.parse().ok())
                .ok_or("the follower's applied index")?;
            c.nodes[down]
                .take()
                .ok_or("the follower is not running")?
                .kill()?;
            let o = respload::writes(
                &WriteLoad {
                    port: c.ports[leader],
                    clients: CLIENTS,
                    requests: writes,
                    write: WriteCmd::Set,
                    wait: None,
                    keyspace: KEYSPACE,
                    value_size: VALUE_SIZE,
                    seed: round as u64,
                },
                ctx.stop_flag(),
            )
            .map_err(|e| format!("{tag}: {e}"))?;
            let commit: u64 = info_of(c.ports[leader], "replication", "raft_commit_index")
                .and_then(|v| v.parse().ok())
                .ok_or("the leader's commit index")?;
            let t0 = Instant::now();
            c.launch(down, ctx.stop_flag())?;
            wait_for("the follower to catch up", ctx.stop_flag(), || {
                let a: u64 = info_of(port, "replication", "raft_applied_index")?
                    .parse()
                    .ok()?;
                (a >= commit).then_some(())
            })?;
            let secs = t0.elapsed().as_secs_f64();
            let entries = commit.saturating_sub(from);
            let par = info_of(port, "replication", "raft_applied_in_parallel").unwrap_or_default();
            live[li].push(o.per_sec());
            catch[li].push(entries as f64 / secs);
            table.push(
                &lab,
                vec![
                    "set+catch-up".into(),
                    lanes.to_string(),
                    CLIENTS.to_string(),
                    o.units.to_string(),
                    round.to_string(),
                    format!("{:.0}", o.per_sec()),
                    ms(o.p50_ms),
                    ms(o.p99_ms),
                    entries.to_string(),
                    format!("{:.0}", secs * 1e3),
                    format!("{:.0}", entries as f64 / secs),
                    par,
                ],
            );
            ctx.progress.done(&format!(
                "SET {:.1}k/s; catch-up of {entries} entries in {:.0} ms ({:.1}k/s)",
                o.per_sec() / 1e3,
                secs * 1e3,
                entries as f64 / secs / 1e3
            ));
        }
    }
    let med = |v: &[f64]| median(v);
    let ratio = |v: &[Vec<f64>]| med(&v[1]) / med(&v[0]).max(1e-9);
    eprintln!(
        "cluster-apply ({durability}): live SET {:.0} / {:.0} per s ({:.2}x), catch-up {:.0} / {:.0} entries per s ({:.2}x), lanes {:?}",
        med(&live[0]),
        med(&live[1]),
        ratio(&live),
        med(&catch[0]),
        med(&catch[1]),
        ratio(&catch),
        APPLY_LANES
    );
    let series = |v: &[Vec<f64>]| -> Vec<(String, Vec<Option<f64>>)> {
        APPLY_LANES
            .iter()
            .zip(v)
            .map(|(l, r)| (format!("{l} lane(s)"), vec![Some(med(r))]))
            .collect()
    };
    Ok(Report {
        table,
        chart: Chart {
            title: "cluster-apply: serial against parallel apply of committed entries".into(),
            subtitle: ctx.subtitle(&format!("Ember durability {durability} ({note})")),
            panels: vec![
                Panel::Bars(Bars {
                    title: "SET from 50 clients, one follower down".into(),
                    y_label: "writes/s".into(),
                    groups: vec!["median".into()],
                    series: series(&live),
                }),
                Panel::Bars(Bars {
                    title: format!("a follower catching up with {writes} entries"),
                    y_label: "entries applied/s".into(),
                    groups: vec!["median".into()],
                    series: series(&catch),
                }),
            ],
        },
    })
}
