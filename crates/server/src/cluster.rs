//! Replication glue: a node of a Raft cluster (crate `repl`) replicating
//! the keyspace's write batches.
//!
//! # What is replicated
//! A write command runs at the leader as it runs alone: under its stripe
//! locks it reads the applied state and stages its writes, a
//! [`engine::WriteBatch`] whose every non-deterministic choice is already
//! made (a relative TTL is an absolute time, SPOP's member is chosen). Where
//! a lone server would apply the batch ([`Keyspace::apply`]), a node
//! proposes it and waits, **with the stripe locks still held**, until the
//! entry is committed and applied (Blizzard's delayed lock release): no
//! other command reads those keys in between, so the batch is still right
//! when it applies, on every node, in log order. The reply goes out after.
//!
//! # Apply, exactly once
//! Every node's apply thread ([`Applier`]) applies committed entries in log
//! order, each as one crash-atomic batch that also writes the entry's index
//! to [`repl::APPLIED_KEY`]; a restarted node resumes after that index. A
//! batch that fails the same way everywhere (an increment of a
//! non-integer) applies nothing and still advances the index; one that fails
//! here but might not elsewhere (a full heap) stops the node's replication
//! rather than let it diverge.
//!
//! # Followers
//! A follower refuses writes with Redis's replica error
//! (`-READONLY You can't write against a read only replica.`) and serves
//! reads from its applied state (possibly behind the leader). It deletes no
//! expired key on its own (as a Redis replica): the leader's deletions
//! arrive as entries. The lazy free of a deleted collection's pieces is
//! local on every node (`Keyspace::set_local`).

use crate::keyspace::Keyspace;
use crate::server::Shared;
use engine::{Outcome, WriteBatch};
use std::sync::Arc;
use std::time::Duration;

/// What a proposer gets back: the outcomes of its batch's operations.
pub type ApplyOut = engine::Result<Vec<Outcome>>;

/// A running node.
pub struct Cluster {
    pub node: repl::Handle<ApplyOut>,
    /// How long a write waits for its entry before it is answered with an
    /// error (the node steps down well before, when it loses its quorum).
    pub write_timeout: Duration,
}

/// Why a replicated write failed, as the client is told.
pub fn error_text(e: &repl::ReplError) -> String {
    match e {
        repl::ReplError::NotLeader(_) => "READONLY You can't write against a read only replica.".into(),
        repl::ReplError::LeaderChanged => "TRYAGAIN the leader changed before the write was committed; it may or may not have been applied".into(),
        repl::ReplError::Stopped(why) => format!("CLUSTERDOWN replication stopped on this node: {why}"),
    }
}

impl Cluster {
    /// Replicates a command's batch and returns its outcomes once it is
    /// applied here (the apply thread applied it).
    pub fn replicate(&self, batch: &WriteBatch, out: &mut Vec<Outcome>) -> Result<(), ReplFailure> {
        let rx = self.node.propose(batch.as_bytes().to_vec());
        match rx.recv_timeout(self.write_timeout) {
            Ok(Ok(Ok(outs))) => {
                out.extend(outs);
                Ok(())
            }
            Ok(Ok(Err(e))) => Err(ReplFailure::Store(e)),
            Ok(Err(e)) => Err(ReplFailure::Repl(e)),
            Err(_) => Err(ReplFailure::Repl(repl::ReplError::Stopped(
                "no quorum answered in time".into(),
            ))),
        }
    }

    /// The client address (host, port) of member `id` (empty when unknown).
    fn client_addr(&self, id: Option<u64>) -> (String, u16) {
        id.and_then(|id| self.node.peers().iter().find(|p| p.id == id))
            .map(|p| split_addr(&p.client_addr))
            .unwrap_or_default()
    }

    /// Whether this node takes writes now.
    pub fn is_leader(&self) -> bool {
        self.node.is_leader()
    }
}

/// A failed replicated write.
#[derive(Debug)]
pub enum ReplFailure {
    /// The batch applied nowhere, for a reason of the store's (the same on
    /// every node).
    Store(engine::Error),
    Repl(repl::ReplError),
}

/// Whether a store error is the same on every node for the same batch
/// (decided by the batch and the state, which every node shares), as
/// opposed to one of this node's own (its heap is full, its disk failed).
fn deterministic(e: &engine::Error) -> bool {
    matches!(
        e.kind(),
        engine::ErrorKind::NotInteger
            | engine::ErrorKind::Overflow
            | engine::ErrorKind::KeyTooLarge { .. }
            | engine::ErrorKind::ValueTooLarge
    )
}

/// The apply thread's state machine.
struct Applier {
    ks: Keyspace,
    failed: Option<String>,
}

impl Applier {
    fn mark(&mut self, index: u64) {
        let mut b = WriteBatch::new();
        b.put(repl::APPLIED_KEY, &index.to_le_bytes());
        if let Err(e) = self.ks.sess.apply_batch(&b, &mut Vec::new()) {
            self.failed = Some(format!("recording applied index {index}: {e}"));
        }
    }
}

impl repl::StateMachine<ApplyOut> for Applier {
    fn apply(&mut self, index: u64, data: &[u8], own: bool) -> ApplyOut {
        let batch = match WriteBatch::from_bytes(data) {
            Ok(b) => b,
            Err(e) => {
                self.failed = Some(format!("entry {index} is not a write batch: {e}"));
                return Err(e);
            }
        };
        let r = if own {
            // The proposer does the bookkeeping (key counts, TTL index,
            // WATCH) with these outcomes, as after its own apply.
            self.ks.apply_entry_raw(batch, index)
        } else {
            self.ks.apply_entry(batch, index).map(|()| Vec::new())
        };
        if let Err(e) = &r {
            if deterministic(e) {
                self.mark(index);
            } else {
                self.failed = Some(format!("applying entry {index}: {e}"));
            }
        }
        r
    }

    fn skip(&mut self, index: u64) {
        self.mark(index);
    }

    fn sync(&mut self) {
        if let Err(e) = self.ks.sess.commit() {
            self.failed = Some(format!("committing applied entries: {e}"));
        }
    }

    fn failed(&self) -> Option<String> {
        self.failed.clone()
    }
}

/// Starts this node when the configuration names one (`node-id`).
pub fn start(sh: &Arc<Shared>) -> Result<Option<Arc<Cluster>>, String> {
    let c = sh.cfg();
    if c.node_id == 0 {
        if !c.peers.is_empty() || c.raft_port != 0 {
            return Err("--peers and --raft-port need --node-id".into());
        }
        return Ok(None);
    }
    let peers = repl::parse_peers(&c.peers)?;
    let me = peers
        .iter()
        .find(|p| p.id == c.node_id)
        .ok_or_else(|| format!("node id {} is not in --peers", c.node_id))?;
    let listen = if c.raft_port != 0 {
        let host = me
            .raft_addr
            .rsplit_once(':')
            .map(|(h, _)| h)
            .unwrap_or("127.0.0.1");
        format!("{host}:{}", c.raft_port)
    } else {
        me.raft_addr.clone()
    };
    let tick = Duration::from_millis(c.raft_tick_ms);
    let cfg = repl::NodeConfig {
        id: c.node_id,
        peers: peers.clone(),
        listen,
        tick,
        election_ticks: c.raft_election_ticks as usize,
        heartbeat_ticks: 2.min(c.raft_election_ticks as usize - 1).max(1),
    };
    drop(c);
    let (s1, s2) = (sh.clone(), sh.clone());
    let node = repl::Handle::start(
        cfg,
        Box::new(move || s1.store.session()),
        Box::new(move || {
            let sess = s2
                .store
                .session()
                .expect("a store session for the apply thread");
            // The key counts' shard after the workers' is this thread's.
            let shard = s2.cfg().threads;
            let mut ks = Keyspace::new(sess, s2.counts.clone(), shard, s2.hk.clone());
            ks.set_watches(s2.watches.clone());
            Box::new(Applier { ks, failed: None }) as Box<dyn repl::StateMachine<ApplyOut>>
        }),
    )?;
    Ok(Some(Arc::new(Cluster {
        node,
        write_timeout: Duration::from_secs(30),
    })))
}

fn split_addr(a: &str) -> (String, u16) {
    match a.rsplit_once(':') {
        Some((h, p)) => (h.to_string(), p.parse().unwrap_or(0)),
        None => (a.to_string(), 0),
    }
}

/// ROLE, as Redis answers it: the leader is a master listing its followers
/// with their replicated offsets (Raft indexes), a follower a replica of the
/// leader; a lone server a master without replicas.
pub fn role(
    ctx: &mut crate::cmd::Ctx,
    c: &mut crate::server::Client,
    _a: &[Vec<u8>],
) -> crate::cmd::R {
    use proto::Reply;
    let b = |s: &str| Reply::Bulk(s.as_bytes().to_vec());
    let Some(cl) = ctx.sh.cluster.get() else {
        c.reply(&Reply::Array(vec![
            b("master"),
            Reply::Integer(0),
            Reply::Array(vec![]),
        ]));
        return Ok(());
    };
    let st = cl.node.status();
    if st.is_leader {
        let reps = st
            .matched
            .iter()
            .filter_map(|&(id, m)| {
                let (h, p) = cl.client_addr(Some(id));
                (p != 0).then(|| Reply::Array(vec![b(&h), b(&p.to_string()), b(&m.to_string())]))
            })
            .collect();
        c.reply(&Reply::Array(vec![
            b("master"),
            Reply::Integer(st.applied as i64),
            Reply::Array(reps),
        ]));
    } else {
        let (h, p) = cl.client_addr(st.leader);
        c.reply(&Reply::Array(vec![
            b("slave"),
            b(&h),
            Reply::Integer(i64::from(p)),
            b(if st.leader.is_some() {
                "connected"
            } else {
                "connect"
            }),
            Reply::Integer(st.applied as i64),
        ]));
    }
    Ok(())
}

/// INFO's Replication section on a cluster node (Redis's fields for a
/// master or a replica, then the node's Raft state); None on a lone server.
pub fn info_section(sh: &Shared) -> Option<String> {
    use std::fmt::Write;
    let cl = sh.cluster.get()?;
    let st = cl.node.status();
    let mut o = String::from("# Replication\r\n");
    if st.is_leader {
        let _ = write!(
            o,
            "role:master\r\nconnected_slaves:{}\r\n",
            st.matched.len()
        );
        for (i, &(id, m)) in st.matched.iter().enumerate() {
            let (h, port) = cl.client_addr(Some(id));
            if port != 0 {
                let _ = write!(
                    o,
                    "slave{i}:ip={h},port={port},state=online,offset={m},lag=0\r\n"
                );
            }
        }
    } else {
        let (h, port) = cl.client_addr(st.leader);
        let _ = write!(
            o,
            "role:slave\r\nmaster_host:{h}\r\nmaster_port:{port}\r\nmaster_link_status:{}\r\nmaster_last_io_seconds_ago:0\r\nmaster_sync_in_progress:0\r\nslave_read_repl_offset:{}\r\nslave_repl_offset:{}\r\nslave_priority:100\r\nslave_read_only:1\r\nreplica_announced:1\r\nconnected_slaves:0\r\n",
            if st.leader.is_some() { "up" } else { "down" },
            st.last_index,
            st.applied
        );
    }
    let _ = write!(
        o,
        "master_failover_state:no-failover\r\nmaster_replid:{}\r\nmaster_repl_offset:{}\r\nraft_node_id:{}\r\nraft_leader_id:{}\r\nraft_term:{}\r\nraft_commit_index:{}\r\nraft_applied_index:{}\r\nraft_last_index:{}\r\nraft_failed:{}\r\n\r\n",
        sh.run_id,
        st.applied,
        st.id,
        st.leader.unwrap_or(0),
        st.term,
        st.commit,
        st.applied,
        st.last_index,
        st.failed.as_deref().unwrap_or("no"),
    );
    Some(o)
}
