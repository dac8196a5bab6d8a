//! Starting the real `ember serve` binary for integration tests.
#![allow(dead_code)]

pub mod cluster;
pub mod redis_server;
pub mod values;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running `ember serve` on a free loopback port, its heap in `dir`.
pub struct Server {
    child: Option<Child>,
    pub port: u16,
    pub dir: PathBuf,
    args: Vec<String>,
    starts: u32,
}

/// Small stores for tests: a 256 MiB heap, 4 logs of 4 MiB.
/// Two workers, as on a machine with three or more cores (the default is one
/// per core but one, so 1 on the 2-core CI machine): the paths between workers
/// (a chain's older record in another worker's log, gleaner roles taken by
/// workers) stay tested. Tests of one worker say `--threads 1`.
pub const SMALL: &[&str] = &[
    "--heap-size",
    "256mb",
    "--logs",
    "4",
    "--log-size",
    "4mb",
    "--threads",
    "2",
];

/// A loopback port free at the time of the call, below Linux's ephemeral
/// range (32768–60999): a port the kernel hands out to an outgoing
/// connection meanwhile cannot take it before the server binds it (a test
/// whose nodes know each other's ports cannot pick another one then).
/// Ports are drawn from a per-process sequence at a random start, so that
/// tests running at once rarely try the same ones.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let _ = NEXT.compare_exchange(
        0,
        20_000 + (std::process::id() * 7919) % 12_000,
        Ordering::Relaxed,
        Ordering::Relaxed,
    );
    for _ in 0..12_000 {
        let p = 20_000 + (NEXT.fetch_add(1, Ordering::Relaxed) - 20_000) % 12_000;
        if TcpListener::bind(("127.0.0.1", p as u16)).is_ok() {
            return p as u16;
        }
    }
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl Server {
    /// Starts a server whose heap is `dir/ember.heap`, with `SMALL` and `extra`.
    pub fn start(dir: &Path, extra: &[&str]) -> Server {
        // `extra` overrides the flags of SMALL it repeats.
        let mut args: Vec<String> = Vec::new();
        for pair in SMALL.chunks(2) {
            if !extra.contains(&pair[0]) {
                args.extend(pair.iter().map(|s| s.to_string()));
            }
        }
        args.extend(extra.iter().map(|s| s.to_string()));
        let mut s = Server {
            child: None,
            port: 0,
            dir: dir.to_path_buf(),
            args,
            starts: 0,
        };
        s.launch();
        s
    }

    pub fn log_path(&self) -> PathBuf {
        self.dir.join(format!("server-{}.log", self.starts))
    }

    /// The server's stderr so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    fn launch(&mut self) {
        for _attempt in 0..5 {
            self.starts += 1;
            self.port = free_port();
            let log = std::fs::File::create(self.log_path()).unwrap();
            let child = Command::new(env!("CARGO_BIN_EXE_ember"))
                .arg("serve")
                .arg("--port")
                .arg(self.port.to_string())
                .arg("--heap")
                .arg(self.dir.join("ember.heap"))
                .args(&self.args)
                .current_dir(&self.dir)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .expect("spawn ember serve");
            self.child = Some(child);
            if self.wait_ready() {
                return;
            }
            let log = self.log();
            self.kill9();
            if !log.contains("cannot listen") {
                panic!("ember serve did not start:\n{log}");
            }
        }
        panic!("ember serve could not find a free port");
    }

    fn wait_ready(&mut self) -> bool {
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(60) {
            if let Some(c) = self.child.as_mut() {
                if let Ok(Some(_)) = c.try_wait() {
                    return false;
                }
            }
            if let Ok(mut s) = TcpStream::connect(("127.0.0.1", self.port)) {
                let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
                if s.write_all(b"PING\r\n").is_ok() {
                    // +PONG, or NOAUTH from a server started with requirepass.
                    let mut b = [0u8; 7];
                    if s.read_exact(&mut b).is_ok() && (&b == b"+PONG\r\n" || &b == b"-NOAUTH") {
                        return true;
                    }
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }

    /// A `redis` crate connection.
    pub fn client(&self) -> redis::Connection {
        let c = redis::Client::open(format!("redis://127.0.0.1:{}/", self.port)).unwrap();
        let con = c.get_connection().unwrap();
        con.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        con
    }

    /// A raw TCP connection.
    pub fn raw(&self) -> TcpStream {
        let s = TcpStream::connect(("127.0.0.1", self.port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        s
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(|c| c.id()).unwrap_or(0)
    }

    /// SIGKILL, then wait for the process.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM; waits for a clean exit and returns the exit status success.
    pub fn terminate(&mut self) -> bool {
        if let Some(c) = self.child.as_ref() {
            // SAFETY: plain kill(2) on our own child's pid.
            unsafe {
                libc::kill(c.id() as i32, libc::SIGTERM);
            }
        }
        self.wait_exit()
    }

    /// Waits (at most 60 s, then SIGKILL) for the process to exit by itself
    /// (after SHUTDOWN or SIGTERM); true when it exited with success.
    pub fn wait_exit(&mut self) -> bool {
        let Some(mut c) = self.child.take() else {
            return false;
        };
        let t = Instant::now();
        loop {
            if let Ok(Some(st)) = c.try_wait() {
                return st.success();
            }
            if t.elapsed() > Duration::from_secs(60) {
                let _ = c.kill();
                let _ = c.wait();
                return false;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Waits at most `limit` for the process to exit by itself; its exit
    /// status, or None (then it is SIGKILLed) when it is still running.
    pub fn wait_exit_within(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        let mut c = self.child.take()?;
        let t = Instant::now();
        loop {
            if let Ok(Some(st)) = c.try_wait() {
                return Some(st);
            }
            if t.elapsed() > limit {
                let _ = c.kill();
                let _ = c.wait();
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Starts the server again on the same heap (after kill9/terminate).
    pub fn restart(&mut self) {
        assert!(self.child.is_none(), "restart while running");
        self.launch();
    }

    pub fn running(&mut self) -> bool {
        match self.child.as_mut() {
            Some(c) => matches!(c.try_wait(), Ok(None)),
            None => false,
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// Sends raw bytes and reads until `want` bytes arrived or the peer closed.
pub fn roundtrip(s: &mut TcpStream, send: &[u8], want: usize) -> Vec<u8> {
    s.write_all(send).unwrap();
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    while out.len() < want {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(_) => break,
        }
    }
    out
}

/// A field of an INFO section.
pub fn info_field(con: &mut redis::Connection, section: &str, field: &str) -> String {
    let info: String = redis::cmd("INFO").arg(section).query(con).unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .unwrap_or_else(|| panic!("INFO {section} has no {field}:\n{info}"))
        .trim()
        .to_string()
}

/// Runs a Python script that uses redis-py; it must print `redis-py ok`.
/// Skipped (with a note) when python3 or redis-py is not installed
/// (scripts/test.sh installs them).
pub fn run_redis_py(script: &str) {
    run_python(script, "redis", "redis-py");
}

/// Runs a Python script that uses the client library `module` (named `lib`
/// in messages); it must print `<lib> ok`. Skipped (with a note) when
/// python3 or the module is not installed (scripts/test.sh installs them).
/// A script that hangs (a client library waiting for a reply that never
/// comes) is stopped after two minutes with every thread's stack printed.
pub fn run_python(script: &str, module: &str, lib: &str) {
    let script =
        format!("import faulthandler; faulthandler.dump_traceback_later(120, exit=True)\n{script}");
    match Command::new("python3").args(["-c", &script]).output() {
        Ok(out) if out.status.success() => {
            assert!(String::from_utf8_lossy(&out.stdout).contains(&format!("{lib} ok")));
        }
        Ok(out) => {
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(
                err.contains(&format!("No module named '{module}'")),
                "{lib} failed: {err}"
            );
            eprintln!("{lib} is not installed: its part of the test was skipped");
        }
        Err(e) => eprintln!("python3 not found ({e}): the {lib} part was skipped"),
    }
}
