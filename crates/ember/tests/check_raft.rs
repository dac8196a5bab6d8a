//! `ember check` on the heaps of a replicated node: a three-node cluster
//! takes writes, then one follower is stopped with SIGTERM and the other
//! with SIGKILL; `ember check` finds each heap's Raft log consistent and
//! reports its entries, commit and applied indexes (at least what the node
//! said it had applied before it stopped) and its three voters.

mod serve_common;

use redis::Commands;
use serde_json::Value;
use serve_common::{free_port, info_field, SMALL};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

struct Node {
    port: u16,
    dir: PathBuf,
    child: Option<Child>,
}

impl Node {
    fn launch(id: u64, port: u16, peers: &str, dir: PathBuf) -> Node {
        std::fs::create_dir_all(&dir).unwrap();
        let log = std::fs::File::create(dir.join("log")).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_ember"))
            .args(["serve", "--port", &port.to_string()])
            .arg("--heap")
            .arg(dir.join("ember.heap"))
            .args(SMALL)
            .args(["--node-id", &id.to_string(), "--peers", peers])
            .current_dir(&dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn ember serve");
        let n = Node {
            port,
            dir,
            child: Some(child),
        };
        let t = Instant::now();
        while n.try_con().is_none() {
            assert!(
                t.elapsed() < Duration::from_secs(60),
                "node {id} did not start: {}",
                n.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        n
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("log")).unwrap_or_default()
    }

    fn try_con(&self) -> Option<redis::Connection> {
        let c = redis::Client::open(format!("redis://127.0.0.1:{}/", self.port)).ok()?;
        let con = c
            .get_connection_with_timeout(Duration::from_millis(300))
            .ok()?;
        con.set_read_timeout(Some(Duration::from_secs(20))).ok()?;
        Some(con)
    }

    fn con(&self) -> redis::Connection {
        self.try_con().expect("connect")
    }

    fn replication(&self, field: &str) -> String {
        info_field(&mut self.con(), "replication", field)
    }

    fn applied(&self) -> u64 {
        self.replication("raft_applied_index").parse().unwrap()
    }

    /// SIGTERM (a clean shutdown) or SIGKILL; waits for the exit.
    fn stop(&mut self, sig: libc::c_int) {
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
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// `ember check --json PATH`: its exit success and its report.
fn check(heap: &Path) -> (bool, Value) {
    let out = Command::new(env!("CARGO_BIN_EXE_ember"))
        .args(["check", "--json"])
        .arg(heap)
        .output()
        .unwrap();
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}): {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out.status.success(), v)
}

fn num(v: &Value, field: &str) -> u64 {
    v[field]
        .as_u64()
        .unwrap_or_else(|| panic!("no {field} in {v}"))
}

/// Checks one stopped node's heap: consistent, and its log holds at least
/// `applied` (what the node reported before it stopped).
fn expect_clean(node: &Node, applied: u64) {
    let heap = node.dir.join("ember.heap");
    let (ok, v) = check(&heap);
    assert!(ok, "ember check failed: {v}");
    assert_eq!(v["problems"], serde_json::json!([]), "{v}");
    let r = &v["raft_log"];
    assert!(r.is_object(), "no raft_log section: {v}");
    assert_eq!(r["problems"], serde_json::json!([]), "{r}");
    let (first, last) = (num(r, "first"), num(r, "last"));
    assert_eq!(num(r, "entries"), last + 1 - first, "{r}");
    let (commit, got) = (num(r, "commit"), num(r, "applied"));
    assert!(got >= applied, "applied {got} below {applied}: {r}");
    assert!(got <= commit && commit <= last, "{r}");
    // One entry per write at least (the SETs and INCRs below).
    assert!(num(r, "write_batches") >= 40, "{r}");
    assert_eq!(r["voters"], serde_json::json!([1, 2, 3]), "{r}");
    assert!(num(r, "term") >= 1, "{r}");
    // The text report has the section too.
    let out = Command::new(env!("CARGO_BIN_EXE_ember"))
        .arg("check")
        .arg(&heap)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("raft state:       term ") && text.contains(&format!("applied {got}")),
        "{text}"
    );
    assert!(text.contains("result:           consistent"), "{text}");
}

#[test]
fn check_verifies_the_raft_log_of_stopped_nodes() {
    let dir = tempfile::tempdir().unwrap();
    let ports: Vec<(u16, u16)> = (0..3).map(|_| (free_port(), free_port())).collect();
    let peers = ports
        .iter()
        .enumerate()
        .map(|(i, (raft, port))| format!("{}=127.0.0.1:{raft}:{port}", i + 1))
        .collect::<Vec<_>>()
        .join(",");
    let mut nodes: Vec<Node> = (0..3)
        .map(|i| {
            Node::launch(
                i as u64 + 1,
                ports[i].1,
                &peers,
                dir.path().join(format!("n{}", i + 1)),
            )
        })
        .collect();
    // The leader: the node whose ROLE says master.
    let t = Instant::now();
    let leader = loop {
        let found = nodes.iter().position(|n| {
            n.try_con()
                .and_then(|mut c| redis::cmd("ROLE").query::<Vec<redis::Value>>(&mut c).ok())
                .and_then(|v| match v.first() {
                    Some(redis::Value::BulkString(b)) => Some(b == b"master"),
                    _ => None,
                })
                .unwrap_or(false)
        });
        if let Some(i) = found {
            break i;
        }
        assert!(t.elapsed() < Duration::from_secs(30), "no leader elected");
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut lc = nodes[leader].con();
    for i in 0..30 {
        let _: () = lc.set(format!("k{i}"), i).unwrap();
    }
    for _ in 0..20 {
        let _: i64 = lc.incr("counter", 1).unwrap();
    }
    let target = nodes[leader].applied();
    // Both followers apply everything the leader applied.
    let followers: Vec<usize> = (0..3).filter(|&i| i != leader).collect();
    let t = Instant::now();
    for &f in &followers {
        while nodes[f].applied() < target {
            assert!(
                t.elapsed() < Duration::from_secs(30),
                "node {f} did not catch up: {}",
                nodes[f].log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    drop(lc);
    let (a, b) = (followers[0], followers[1]);
    let applied_a = nodes[a].applied();
    nodes[a].stop(libc::SIGTERM);
    expect_clean(&nodes[a], applied_a);
    let applied_b = nodes[b].applied();
    nodes[b].stop(libc::SIGKILL);
    expect_clean(&nodes[b], applied_b);
    // The leader, killed under no load, checks clean too.
    let applied_l = nodes[leader].applied();
    nodes[leader].stop(libc::SIGKILL);
    expect_clean(&nodes[leader], applied_l);
}
