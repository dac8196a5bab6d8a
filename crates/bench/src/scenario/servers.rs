//! Servers of the UDORN scenarios: `ember serve` and a real `redis-server`, each
//! a child process on 127.0.0.1 with a free port and its own data directory;
//! `redis-benchmark` against them.
//!
//! Ready = PING answers +PONG (Redis answers -LOADING while it loads its data,
//! so a connection alone is not readiness). Launch time runs from the spawn to
//! that PONG; shutdown time from sending SHUTDOWN to the process's exit.

use super::child::{run_capture, tail, Guard};
use super::resp::{info_field, Conn, Reply};
use super::BenchResult;
use std::fs::OpenOptions;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// How Redis keeps its data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RedisMode {
    /// No AOF; an RDB snapshot is written at shutdown (SHUTDOWN SAVE) and loaded
    /// at launch.
    Rdb,
    /// AOF, fsync once a second.
    AofEverysec,
    /// AOF, fsync before replies (once per event-loop iteration).
    AofAlways,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `ember serve` with `--durability pmem` (or msync).
    Ember {
        msync: bool,
    },
    Redis(RedisMode),
}

impl Kind {
    /// Series name in charts.
    pub fn label(self) -> &'static str {
        match self {
            Kind::Ember { msync: false } => "ember pmem",
            Kind::Ember { msync: true } => "ember msync",
            Kind::Redis(RedisMode::Rdb) => "redis rdb",
            Kind::Redis(RedisMode::AofEverysec) => "redis aof everysec",
            Kind::Redis(RedisMode::AofAlways) => "redis aof always",
        }
    }

    /// For file names.
    pub fn tag(self) -> &'static str {
        match self {
            Kind::Ember { msync: false } => "ember-pmem",
            Kind::Ember { msync: true } => "ember-msync",
            Kind::Redis(RedisMode::Rdb) => "redis-rdb",
            Kind::Redis(RedisMode::AofEverysec) => "redis-aof-everysec",
            Kind::Redis(RedisMode::AofAlways) => "redis-aof-always",
        }
    }

    /// (durability, strategy) labels of a Redis server's rows.
    pub fn redis_labels(self) -> (&'static str, &'static str) {
        match self {
            Kind::Redis(RedisMode::Rdb) => ("rdb", "snapshot at shutdown"),
            Kind::Redis(RedisMode::AofEverysec) => ("aof", "appendfsync everysec"),
            Kind::Redis(RedisMode::AofAlways) => ("aof", "appendfsync always"),
            Kind::Ember { .. } => ("", ""),
        }
    }
}

/// How to start one server.
pub struct Spec<'a> {
    pub kind: Kind,
    /// Its data directory (heap file, RDB or AOF) and log.
    pub dir: &'a Path,
    /// The `ember` binary (for `ember serve`; see `Ctx::ember`).
    pub ember: &'a Path,
    /// Ember only: emulated fence latency.
    pub fence_ns: u64,
    /// Ember only: size of a new heap, MiB.
    pub heap_mib: u64,
    /// More options: of `ember serve` (e.g. `--logs 8 --log-size 4mb`) or of
    /// `redis-server` (e.g. `--replicaof 127.0.0.1 PORT`).
    pub extra: Vec<String>,
}

/// A running server; dropping it kills it.
pub struct Server {
    guard: Guard,
    pub port: u16,
    log: PathBuf,
    what: String,
    /// When the process was spawned.
    started: Instant,
}

/// Readiness as [`Spec::start`] means it: PING answers +PONG.
fn pong(c: &mut Conn) -> bool {
    matches!(c.call(&[b"PING"]), Ok(Reply::Simple(s)) if s == "PONG")
}

/// A port nothing listens on now (the kernel's choice for port 0).
pub(super) fn free_port() -> BenchResult<u16> {
    let l = TcpListener::bind("127.0.0.1:0").map_err(|e| format!("bind 127.0.0.1:0: {e}"))?;
    l.local_addr()
        .map(|a| a.port())
        .map_err(|e| format!("local_addr: {e}"))
}

fn read_log(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_default()
}

impl Spec<'_> {
    fn command(&self, port: u16) -> Command {
        let port = port.to_string();
        match self.kind {
            Kind::Ember { msync } => {
                // In its data directory, as an operator would run it: the
                // heap file is ./ember.heap.
                let mut c = Command::new(self.ember);
                c.current_dir(self.dir)
                    .arg("serve")
                    .args(["--port", &port, "--bind", "127.0.0.1"])
                    .args(["--heap", "ember.heap"])
                    .args([
                        "--heap-size",
                        &format!("{}mb", self.heap_mib),
                        "--durability",
                        if msync { "msync" } else { "pmem" },
                        "--fence-ns",
                        &self.fence_ns.to_string(),
                    ])
                    .args(&self.extra);
                c
            }
            Kind::Redis(mode) => {
                let mut c = Command::new("redis-server");
                c.args(["--port", &port, "--bind", "127.0.0.1", "--dir"])
                    .arg(self.dir)
                    .args(["--daemonize", "no", "--save", ""])
                    .args(&self.extra);
                match mode {
                    RedisMode::Rdb => {
                        c.args(["--appendonly", "no"]);
                    }
                    RedisMode::AofEverysec | RedisMode::AofAlways => {
                        // A plain AOF that stays one (no RDB preamble, no
                        // automatic rewrite): launch replays every command.
                        c.args([
                            "--appendonly",
                            "yes",
                            "--appendfsync",
                            if mode == RedisMode::AofAlways {
                                "always"
                            } else {
                                "everysec"
                            },
                            "--aof-use-rdb-preamble",
                            "no",
                            "--auto-aof-rewrite-percentage",
                            "0",
                        ]);
                    }
                }
                c
            }
        }
    }

    /// The server's log file (stdout and stderr of every start, appended).
    pub fn log_path(&self) -> PathBuf {
        self.dir.join(format!("{}.log", self.kind.tag()))
    }

    /// Starts the server and waits until PING answers PONG (at most `timeout`);
    /// returns it and the launch time. A port taken meanwhile is retried.
    pub fn start(&self, timeout: Duration, stop: &AtomicBool) -> BenchResult<(Server, Duration)> {
        let mut last = String::new();
        for _ in 0..3 {
            let port = free_port()?;
            let log_len = std::fs::metadata(self.log_path())
                .map(|m| m.len())
                .unwrap_or(0);
            match self.start_on(port, timeout, stop) {
                Ok(r) => return Ok(r),
                Err(e) => {
                    // Only this start's part of the log.
                    let text = read_log(&self.log_path());
                    let this_start = text.get(log_len as usize..).unwrap_or(&text);
                    if !this_start.contains("Address already in use") {
                        return Err(e);
                    }
                    last = e;
                }
            }
        }
        Err(format!(
            "{} could not get a free port: {last}",
            self.kind.label()
        ))
    }

    /// Starts the server on `port` (e.g. the port of a server that was just
    /// killed, as a restart would) and waits until PING answers PONG (at most
    /// `timeout`); returns it and the time from the spawn to that PONG.
    pub fn start_on(
        &self,
        port: u16,
        timeout: Duration,
        stop: &AtomicBool,
    ) -> BenchResult<(Server, Duration)> {
        self.start_until(port, timeout, stop, &mut pong)
    }

    /// Starts the server on `port` and waits until `ready` returns true for a
    /// fresh connection (tried every 0.5 ms, at most `timeout`), e.g. until a
    /// command on a key of the loaded data answers with that data; returns it
    /// and the time from the spawn to that answer.
    pub fn start_until(
        &self,
        port: u16,
        timeout: Duration,
        stop: &AtomicBool,
        ready: &mut dyn FnMut(&mut Conn) -> bool,
    ) -> BenchResult<(Server, Duration)> {
        let log = self.log_path();
        let f = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .map_err(|e| format!("cannot open {}: {e}", log.display()))?;
        let f2 = f.try_clone().map_err(|e| format!("log: {e}"))?;
        let mut cmd = self.command(port);
        cmd.stdin(Stdio::null())
            .stdout(Stdio::from(f))
            .stderr(Stdio::from(f2));
        let what = format!("{} on port {port}", self.kind.label());
        let t0 = Instant::now();
        let guard = Guard::spawn(cmd, &what)?;
        let mut s = Server {
            guard,
            port,
            log,
            what,
            started: t0,
        };
        s.wait_ready(t0, timeout, stop, ready)?;
        Ok((s, t0.elapsed()))
    }
}

impl Server {
    fn wait_ready(
        &mut self,
        t0: Instant,
        timeout: Duration,
        stop: &AtomicBool,
        ready: &mut dyn FnMut(&mut Conn) -> bool,
    ) -> BenchResult<()> {
        let deadline = t0 + timeout;
        loop {
            if let Some(st) = self.guard.try_wait()? {
                return Err(format!(
                    "{} exited before it was ready ({st}); its log ends:\n{}",
                    self.what,
                    tail(&read_log(&self.log), 15)
                ));
            }
            if let Ok(mut c) = Conn::connect(self.port, Duration::from_secs(5)) {
                if ready(&mut c) {
                    return Ok(());
                }
            }
            if stop.load(Ordering::Relaxed) {
                return Err("interrupted".into());
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "{} was not ready (PING, or the scenario's probe) within {:.0} s; its log ends:\n{}",
                    self.what,
                    timeout.as_secs_f64(),
                    tail(&read_log(&self.log), 15)
                ));
            }
            std::thread::sleep(Duration::from_micros(500));
        }
    }

    /// SIGKILL (to its process group), and waits for the exit; an error unless
    /// the server died of that SIGKILL (it had exited already).
    pub fn kill(mut self) -> BenchResult<()> {
        use std::os::unix::process::ExitStatusExt;
        let st = self.guard.kill()?;
        if st.signal() != Some(libc::SIGKILL) {
            return Err(format!(
                "{} had exited ({st}) before it was killed; its log ends:\n{}",
                self.what,
                tail(&read_log(&self.log), 15)
            ));
        }
        Ok(())
    }

    /// The server's process id.
    pub fn pid(&self) -> u32 {
        self.guard.id()
    }

    /// When the process was spawned.
    pub fn started(&self) -> Instant {
        self.started
    }

    /// The end of the server's log (every start so far).
    pub fn log_tail(&self, lines: usize) -> String {
        tail(&read_log(&self.log), lines)
    }

    /// A connection whose replies may take up to `io_timeout`.
    pub fn conn(&self, io_timeout: Duration) -> BenchResult<Conn> {
        Conn::connect(self.port, io_timeout).map_err(|e| format!("{}: connect: {e}", self.what))
    }

    /// The persistence strategy Ember reports in INFO (`clwb`, `msync`, ...).
    pub fn ember_strategy(&self) -> BenchResult<String> {
        let info = self
            .conn(Duration::from_secs(30))?
            .info("ember")
            .map_err(|e| format!("{}: INFO: {e}", self.what))?;
        let s = info_field(&info, "persistence_strategy")
            .ok_or_else(|| format!("{}: no persistence_strategy in INFO", self.what))?;
        Ok(s.split(':').next().unwrap_or(s).trim().to_string())
    }

    /// Sends `SHUTDOWN args` and waits for the process to exit (at most
    /// `timeout`); returns the time from the send to the exit.
    pub fn shutdown(
        mut self,
        args: &[&str],
        timeout: Duration,
        stop: &AtomicBool,
    ) -> BenchResult<Duration> {
        let mut c = self.conn(Duration::from_secs(5))?;
        let mut cmd: Vec<&[u8]> = vec![b"SHUTDOWN"];
        cmd.extend(args.iter().map(|a| a.as_bytes()));
        let mut buf = Vec::new();
        super::resp::encode(&mut buf, &cmd);
        let t0 = Instant::now();
        c.write_raw(&buf)
            .map_err(|e| format!("{}: SHUTDOWN: {e}", self.what))?;
        let deadline = t0 + timeout;
        loop {
            if let Some(st) = self.guard.try_wait()? {
                let t = t0.elapsed();
                if !st.success() {
                    return Err(format!(
                        "{} exited with {st} after SHUTDOWN; its log ends:\n{}",
                        self.what,
                        tail(&read_log(&self.log), 15)
                    ));
                }
                return Ok(t);
            }
            if stop.load(Ordering::Relaxed) {
                return Err("interrupted".into());
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "{} still running {:.0} s after SHUTDOWN; killed. Its log ends:\n{}",
                    self.what,
                    timeout.as_secs_f64(),
                    tail(&read_log(&self.log), 15)
                ));
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }
}

/// `redis-server --version`'s version number.
pub fn redis_version(stop: &AtomicBool) -> BenchResult<String> {
    let mut c = Command::new("redis-server");
    c.arg("--version");
    let out = run_capture(c, "redis-server --version", Duration::from_secs(10), stop)?;
    Ok(out
        .split_whitespace()
        .find_map(|w| w.strip_prefix("v="))
        .unwrap_or("unknown")
        .to_string())
}

/// One line of `redis-benchmark --csv`.
#[derive(Clone, Debug, PartialEq)]
pub struct BenchLine {
    pub test: String,
    pub rps: f64,
    /// Columns Redis 7 adds (avg, p50, p99, max in ms); empty with older versions.
    pub avg_ms: String,
    pub p50_ms: String,
    pub p99_ms: String,
    pub max_ms: String,
}

/// Parses `redis-benchmark --csv` output (a quoted header, then one line per test).
pub fn parse_benchmark_csv(text: &str) -> BenchResult<Vec<BenchLine>> {
    // Fields are quoted; a custom command's test name may hold commas, and
    // a quote inside is doubled.
    let split = |l: &str| -> Vec<String> {
        let mut fields = Vec::new();
        let mut cur = String::new();
        let mut quoted = false;
        let mut chars = l.trim().chars().peekable();
        while let Some(c) = chars.next() {
            match c {
                '"' if quoted && chars.peek() == Some(&'"') => {
                    cur.push('"');
                    chars.next();
                }
                '"' => quoted = !quoted,
                ',' if !quoted => fields.push(std::mem::take(&mut cur).trim().to_string()),
                c => cur.push(c),
            }
        }
        fields.push(cur.trim().to_string());
        fields
    };
    let mut lines = text.lines().filter(|l| l.trim_start().starts_with('"'));
    let header = split(
        lines
            .next()
            .ok_or_else(|| format!("redis-benchmark printed no CSV: {text:?}"))?,
    );
    let col = |name: &str| header.iter().position(|h| h == name);
    let (Some(test), Some(rps)) = (col("test"), col("rps")) else {
        return Err(format!("unexpected redis-benchmark CSV header {header:?}"));
    };
    let get =
        |f: &[String], c: Option<usize>| c.and_then(|c| f.get(c)).cloned().unwrap_or_default();
    lines
        .map(|l| {
            let f = split(l);
            Ok(BenchLine {
                test: get(&f, Some(test)),
                rps: get(&f, Some(rps))
                    .parse()
                    .map_err(|_| format!("bad rps in redis-benchmark line {l:?}"))?,
                avg_ms: get(&f, col("avg_latency_ms")),
                p50_ms: get(&f, col("p50_latency_ms")),
                p99_ms: get(&f, col("p99_latency_ms")),
                max_ms: get(&f, col("max_latency_ms")),
            })
        })
        .collect()
}

/// What `redis-benchmark` runs.
pub struct BenchLoad<'a> {
    pub tests: &'a str,
    pub requests: u64,
    pub clients: u32,
    pub pipeline: u32,
    pub data_size: usize,
    pub keyspace: u64,
    /// A command line to run instead of `tests` (`__rand_int__` in it is
    /// replaced by a random number below `keyspace`); the data size does not
    /// apply to it.
    pub command: &'a [&'a str],
}

/// Runs `redis-benchmark --csv` against `port`.
pub fn redis_benchmark(
    port: u16,
    load: &BenchLoad<'_>,
    timeout: Duration,
    stop: &AtomicBool,
) -> BenchResult<Vec<BenchLine>> {
    let mut c = Command::new("redis-benchmark");
    c.args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(["-n", &load.requests.to_string()])
        .args(["-c", &load.clients.to_string()])
        .args(["-P", &load.pipeline.to_string()])
        .args(["-r", &load.keyspace.to_string()])
        .arg("--csv");
    if load.command.is_empty() {
        c.args(["-t", load.tests])
            .args(["-d", &load.data_size.to_string()]);
    } else {
        c.args(load.command);
    }
    let out = run_capture(c, "redis-benchmark", timeout, stop)?;
    let lines = parse_benchmark_csv(&out)?;
    if lines.is_empty() {
        return Err(format!("redis-benchmark reported no test: {out:?}"));
    }
    Ok(lines)
}

/// Bytes the files under `dir` occupy on disk (allocated blocks, so a sparse
/// heap counts what it uses), log files excluded.
pub fn data_bytes(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let Ok(rd) = std::fs::read_dir(dir) else {
        return 0;
    };
    rd.flatten()
        .map(|e| {
            let p = e.path();
            match e.metadata() {
                Ok(m) if m.is_dir() => data_bytes(&p),
                Ok(_) if p.extension().is_some_and(|x| x == "log") => 0,
                Ok(m) => m.blocks() * 512,
                Err(_) => 0,
            }
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_benchmark_csv() {
        let text = "\"test\",\"rps\",\"avg_latency_ms\",\"min_latency_ms\",\"p50_latency_ms\",\"p95_latency_ms\",\"p99_latency_ms\",\"max_latency_ms\"\n\
                    \"SET\",\"86956.52\",\"0.333\",\"0.072\",\"0.247\",\"0.823\",\"1.991\",\"2.279\"\n\
                    \"GET\",\"100000.00\",\"0.271\",\"0.088\",\"0.255\",\"0.391\",\"0.495\",\"0.639\"\n";
        let v = parse_benchmark_csv(text).unwrap();
        assert_eq!(v.len(), 2);
        assert_eq!(v[0].test, "SET");
        assert_eq!(v[0].rps, 86956.52);
        assert_eq!(v[0].p99_ms, "1.991");
        assert_eq!(v[0].max_ms, "2.279");
        assert_eq!(v[1].p50_ms, "0.255");
        let custom = "\"test\",\"rps\"\n\"EVAL return redis.call('SET', KEYS[1], \"\"x\"\") 1 k\",\"12.5\"\n";
        let v = parse_benchmark_csv(custom).unwrap();
        assert_eq!(
            v[0].test,
            "EVAL return redis.call('SET', KEYS[1], \"x\") 1 k"
        );
        assert_eq!(v[0].rps, 12.5);
        let old = "\"test\",\"rps\"\n\"SET\",\"1000.00\"\n";
        let v = parse_benchmark_csv(old).unwrap();
        assert_eq!(v[0].avg_ms, "");
        assert!(parse_benchmark_csv("nothing").is_err());
    }
}
