//! `ember check` on the heaps of a replicated node: a three-node cluster
//! takes writes, then one follower is stopped with SIGTERM and the other
//! with SIGKILL; `ember check` finds each heap's Raft log consistent and
//! reports its entries, commit and applied indexes (at least what the node
//! said it had applied before it stopped) and its three voters. A fourth
//! node that joined through a snapshot (the log compacted) checks clean too.

mod serve_common;

use redis::Commands;
use serde_json::Value;
use serve_common::cluster::{cluster_with, Node};
use serve_common::free_port;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

/// The applied index INFO reports (None while the node does not answer:
/// a node that installed a snapshot restarts itself on it).
fn try_applied(n: &Node) -> Option<u64> {
    let mut c = n.try_con()?;
    // The node may restart itself between the connect and the query.
    let info: String = redis::cmd("INFO").arg("replication").query(&mut c).ok()?;
    info.lines()
        .find_map(|l| l.strip_prefix("raft_applied_index:"))?
        .trim()
        .parse()
        .ok()
}

fn applied(n: &Node) -> u64 {
    wait_for(n, "answer", || try_applied(n))
}

/// Polls `f` until it yields (30 s at most, then fails saying `what`).
fn wait_for<T>(n: &Node, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let t = Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "node {} did not {what}: {}",
            n.id,
            n.log()
        );
        std::thread::sleep(Duration::from_millis(20));
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
/// `applied` (what the node reported before it stopped). Returns the
/// report's `raft_log` section.
fn expect_clean(node: &Node, applied: u64) -> Value {
    let heap = node.heap();
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
    r.clone()
}

/// The cluster's first log: at least one entry per write (the SETs and
/// INCRs; the oldest may be compacted away) and the three voters it started
/// with.
fn expect_first_log(r: &Value) {
    assert!(num(r, "last") >= 50, "{r}");
    assert_eq!(r["voters"], serde_json::json!([1, 2, 3]), "{r}");
}

/// The index of the node whose ROLE says master (waits for one).
fn leader(nodes: &[Node]) -> usize {
    let t = Instant::now();
    loop {
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
            return i;
        }
        assert!(t.elapsed() < Duration::from_secs(30), "no leader elected");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits until `node` has applied `target`.
fn wait_applied(node: &Node, target: u64) {
    wait_for(node, "catch up", || {
        try_applied(node).filter(|&a| a >= target).map(|_| ())
    });
}

#[test]
fn check_verifies_the_raft_log_of_stopped_nodes() {
    let dir = tempfile::tempdir().unwrap();
    let mut nodes = cluster_with(dir.path(), &[]);
    let leader = leader(&nodes);
    let mut lc = nodes[leader].con();
    for i in 0..30 {
        let _: () = lc.set(format!("k{i}"), i).unwrap();
    }
    for _ in 0..20 {
        let _: i64 = lc.incr("counter", 1).unwrap();
    }
    let target = applied(&nodes[leader]);
    // Both followers apply everything the leader applied.
    let followers: Vec<usize> = (0..3).filter(|&i| i != leader).collect();
    for &f in &followers {
        wait_applied(&nodes[f], target);
    }
    drop(lc);
    let (a, b) = (followers[0], followers[1]);
    let applied_a = applied(&nodes[a]);
    nodes[a].stop(libc::SIGTERM);
    expect_first_log(&expect_clean(&nodes[a], applied_a));
    let applied_b = applied(&nodes[b]);
    nodes[b].stop(libc::SIGKILL);
    expect_first_log(&expect_clean(&nodes[b], applied_b));
    // The leader, killed under no load, checks clean too.
    let applied_l = applied(&nodes[leader]);
    nodes[leader].stop(libc::SIGKILL);
    expect_first_log(&expect_clean(&nodes[leader], applied_l));
}

#[test]
fn check_verifies_a_node_that_joined_through_a_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    let keep = ["--raft-log-keep", "20"];
    let nodes = cluster_with(dir.path(), &keep);
    let peers = nodes[0].peers.clone();
    let l = leader(&nodes);
    let mut lc = nodes[l].con();
    for i in 0..100 {
        let _: () = lc.set(format!("k{i}"), i).unwrap();
    }
    let (raft4, port4) = (free_port(), free_port());
    let peers4 = format!("{peers},4=127.0.0.1:{raft4}:{port4}");
    let mut extra = vec!["--join"];
    extra.extend(keep);
    let mut n4 = Node::new(4, port4, dir.path().join("n4"), &peers4, &extra);
    n4.launch();
    let r: String = redis::cmd("RAFT")
        .arg("ADD")
        .arg(4)
        .arg(format!("127.0.0.1:{raft4}:{port4}"))
        .query(&mut lc)
        .unwrap();
    assert_eq!(r, "OK");
    let _: () = lc.set("after-join", "yes").unwrap();
    wait_applied(&n4, applied(&nodes[l]));
    let applied = applied(&n4);
    n4.stop(libc::SIGKILL);
    let r = &expect_clean(&n4, applied);
    // Its log begins after the snapshot it was sent.
    assert!(num(r, "first") > 1, "{r}");
    let mut voters: Vec<u64> = serde_json::from_value(r["voters"].clone()).unwrap();
    voters.sort_unstable();
    assert_eq!(voters, vec![1, 2, 3, 4], "{r}");
    let members = r["members"].as_str().unwrap_or_default();
    assert!(
        members.contains(&format!("4=127.0.0.1:{raft4}:{port4}")),
        "{r}"
    );
}
