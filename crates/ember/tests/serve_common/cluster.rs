//! Nodes of a replicated cluster for multi-process tests: `ember serve`
//! processes with `--node-id` and `--peers` on loopback, each in its own
//! directory, its stderr in `log-N` for its N-th start.

use super::{free_port, SMALL};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct Node {
    pub id: u64,
    pub port: u16,
    pub dir: PathBuf,
    pub peers: String,
    pub child: Option<Child>,
    pub starts: u32,
    /// More flags (`--raft-port` behind a proxy, `--join`...).
    pub extra: Vec<String>,
}

impl Node {
    /// A node not started yet.
    pub fn new(id: u64, port: u16, dir: PathBuf, peers: &str, extra: &[&str]) -> Node {
        std::fs::create_dir_all(&dir).unwrap();
        Node {
            id,
            port,
            dir,
            peers: peers.to_string(),
            child: None,
            starts: 0,
            extra: extra.iter().map(|s| s.to_string()).collect(),
        }
    }

    /// Starts the process and waits until it takes connections.
    pub fn launch(&mut self) {
        self.starts += 1;
        let log = std::fs::File::create(self.dir.join(format!("log-{}", self.starts))).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_ember"))
            .args(["serve", "--port", &self.port.to_string()])
            .arg("--heap")
            .arg(self.dir.join("ember.heap"))
            .args(SMALL)
            .args(["--node-id", &self.id.to_string(), "--peers", &self.peers])
            .args(&self.extra)
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn ember serve");
        self.child = Some(child);
        let t = Instant::now();
        while self.try_con().is_none() {
            assert!(
                t.elapsed() < Duration::from_secs(60),
                "node {} did not start: {}",
                self.id,
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Its stderr since its last start.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join(format!("log-{}", self.starts))).unwrap_or_default()
    }

    pub fn heap(&self) -> PathBuf {
        self.dir.join("ember.heap")
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// A connection, None while the node does not answer (a node that
    /// installed a snapshot restarts itself on it).
    pub fn try_con(&self) -> Option<redis::Connection> {
        let con = redis::Client::open(self.url())
            .ok()?
            .get_connection_with_timeout(Duration::from_millis(300))
            .ok()?;
        con.set_read_timeout(Some(Duration::from_secs(40))).ok()?;
        Some(con)
    }

    pub fn con(&self) -> redis::Connection {
        let c = redis::Client::open(self.url()).unwrap();
        let con = c
            .get_connection_with_timeout(Duration::from_secs(5))
            .unwrap();
        con.set_read_timeout(Some(Duration::from_secs(40))).unwrap();
        con
    }

    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Sends `sig` (SIGTERM: a clean shutdown) and waits for the exit
    /// (SIGKILL after 60 s).
    pub fn stop(&mut self, sig: libc::c_int) {
        let mut c = self.child.take().expect("running");
        // SAFETY: kill(2) on our own child's pid.
        unsafe {
            libc::kill(c.id() as i32, sig);
        }
        let t = Instant::now();
        while c.try_wait().unwrap().is_none() {
            if t.elapsed() > Duration::from_secs(60) {
                let _ = c.kill();
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// `--peers` for members 1.. with these (raft port, client port) pairs.
pub fn peers_for(ports: &[(u16, u16)]) -> String {
    ports
        .iter()
        .enumerate()
        .map(|(i, (raft, port))| format!("{}=127.0.0.1:{raft}:{port}", i + 1))
        .collect::<Vec<_>>()
        .join(",")
}

/// Three nodes in `dir/n1..n3`, started with `extra` flags.
pub fn cluster_with(dir: &Path, extra: &[&str]) -> Vec<Node> {
    let ports: Vec<(u16, u16)> = (0..3).map(|_| (free_port(), free_port())).collect();
    let peers = peers_for(&ports);
    (0..3)
        .map(|i| {
            let d = dir.join(format!("n{}", i + 1));
            let mut n = Node::new(i as u64 + 1, ports[i].1, d, &peers, extra);
            n.launch();
            n
        })
        .collect()
}
