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
//! A follower forwards each client's writes, scripts, transactions (the
//! queue with its EXEC, WATCH) and reads to the leader over that client's
//! own connection to it ([`Forward`]), and relays the leader's replies as
//! they come; after READONLY, reads are served from the follower's applied
//! state (possibly behind the leader). A blocking pop is forwarded too and
//! waits at the leader on a thread of its own, so the worker serves its
//! other clients meanwhile (`forward_blocking`); CLIENT UNBLOCK of such a
//! client is passed on. A write at a node that is not the leader and cannot
//! be forwarded gets Redis's replica error (`-READONLY You can't write
//! against a read only replica.`). A follower deletes no expired key on its own (as a Redis
//! replica): the leader's deletions arrive as entries. The lazy free of a
//! deleted collection's pieces is local on every node
//! (`Keyspace::set_local`).

use crate::keyspace::Keyspace;
use crate::server::Shared;
use engine::{Outcome, WriteBatch};
use std::sync::Arc;
use std::time::Duration;

/// What a proposer gets back: the entry's index and the outcomes of its
/// batch's operations.
pub type ApplyOut = engine::Result<(u64, Vec<Outcome>)>;

/// A running node.
pub struct Cluster {
    pub node: repl::Handle<ApplyOut>,
    /// How long a write waits for its entry before it is answered with an
    /// error (the node steps down well before, when it loses its quorum).
    pub write_timeout: Duration,
    /// Clients of this node waiting in a blocking command forwarded to the
    /// leader: this node's client id -> (the leader, its connection's
    /// client id there), for CLIENT UNBLOCK.
    pub fwd_blocked: std::sync::Mutex<std::collections::HashMap<u64, (u64, u64)>>,
    /// The store's batch limit (`Session::batch_limit`) less what persisting
    /// or applying an entry adds to its data: a larger entry could be
    /// persisted or applied by no node, and would stop replication.
    pub entry_limit: Option<u64>,
}

/// What an entry's persist (its key, the protobuf around the data, the
/// range and hard state) or apply (the applied-index mark) adds to its data,
/// at most.
const ENTRY_OVERHEAD: u64 = 4096;

/// The refusal of an entry too large for the store's batches: the store's
/// own error (`-ERR write of N bytes does not fit in a persistent log of M
/// bytes (raise --log-size)`).
fn too_large(limit: Option<u64>, ops: usize, bytes: usize) -> Option<engine::Error> {
    let limit = limit?;
    (!engine::batch_fits(ops, bytes, Some(limit)))
        .then(|| engine::Error::RecordTooLarge(bytes as u64 + 64 * ops as u64, limit))
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
    /// Returns the entry's index.
    pub fn replicate(
        &self,
        batch: &WriteBatch,
        out: &mut Vec<Outcome>,
    ) -> Result<u64, ReplFailure> {
        // Refused before it is proposed: once in the log, an entry no node
        // can persist or apply would stop them all.
        if let Some(e) = too_large(self.entry_limit, batch.len(), batch.as_bytes().len()) {
            return Err(ReplFailure::Store(e));
        }
        let rx = self.node.propose(batch.as_bytes().to_vec());
        match rx.recv_timeout(self.write_timeout) {
            Ok(Ok(Ok((index, outs)))) => {
                out.extend(outs);
                Ok(index)
            }
            Ok(Ok(Err(e))) => Err(ReplFailure::Store(e)),
            Ok(Err(e)) => Err(ReplFailure::Repl(e)),
            Err(_) => Err(ReplFailure::Repl(repl::ReplError::Stopped(
                "no quorum answered in time".into(),
            ))),
        }
    }

    /// Publishes a message on every node (PUBLISH, SPUBLISH at the leader):
    /// an event entry that each node's apply thread delivers to its own
    /// subscribers, in log order; returns once it is applied here (the
    /// caller then delivers to this node's subscribers and counts them).
    pub fn publish(&self, shard: bool, channel: &[u8], payload: &[u8]) -> Result<(), String> {
        let mut data = Vec::with_capacity(channel.len() + payload.len() + 5);
        data.push(u8::from(shard));
        data.extend_from_slice(&(channel.len() as u32).to_le_bytes());
        data.extend_from_slice(channel);
        data.extend_from_slice(payload);
        if let Some(e) = too_large(self.entry_limit, 1, data.len()) {
            return Err(crate::cmd::store_text(&e));
        }
        match self
            .node
            .propose_event(&data)
            .recv_timeout(self.write_timeout)
        {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(error_text(&e)),
            Err(_) => Err(error_text(&repl::ReplError::Stopped(
                "no quorum answered in time".into(),
            ))),
        }
    }

    /// The client address (host, port) of member `id` (empty when unknown).
    fn client_addr(&self, id: Option<u64>) -> (String, u16) {
        id.and_then(|id| self.node.peers().into_iter().find(|p| p.id == id))
            .map(|p| split_addr(&p.client_addr))
            .unwrap_or_default()
    }

    /// Whether this node takes writes now.
    pub fn is_leader(&self) -> bool {
        self.node.is_leader()
    }
}

/// The first byte of an event entry's data: a Pub/Sub message (0 and 1:
/// its shard flag, see [`Cluster::publish`]) or keyspace events.
const EVENT_NOTIFY: u8 = 2;

/// At a cluster's leader, as a worker publishes its keyspace events: the
/// same events go to the other nodes' subscribers in an event entry,
/// proposed without waiting (the writes they tell of are already
/// committed). Called by [`crate::notify::flush_pending`].
pub fn replicate_events(sh: &Shared, ks: &Keyspace) {
    if !ks.replicates() {
        return;
    }
    let Some(cl) = sh.cluster.get() else {
        return;
    };
    if !cl.is_leader() {
        return;
    }
    let mut data = vec![EVENT_NOTIFY];
    data.extend_from_slice(&cl.node.id().to_le_bytes());
    if encode_note(ks, &mut data) {
        cl.node.abandon(cl.node.propose_event(&data));
    }
}

/// The keyspace events `ks` holds: per event u8 kind (0 a key found
/// expired, 1 a command's event, 2 a key a write created), u32 class, u8
/// name length, name, u32 store-key length, store key. `keymiss` events
/// stay on the node that served the read (a Redis replica never sees the
/// master's reads). False when there is nothing to send.
fn encode_note(ks: &Keyspace, v: &mut Vec<u8>) -> bool {
    let start = v.len();
    let mut put = |kind: u8, class: u32, name: &str, sk: &[u8]| {
        v.push(kind);
        v.extend_from_slice(&class.to_le_bytes());
        v.push(name.len() as u8);
        v.extend_from_slice(name.as_bytes());
        v.extend_from_slice(&(sk.len() as u32).to_le_bytes());
        v.extend_from_slice(sk);
    };
    for sk in &ks.expired_log {
        put(0, crate::notify::EXPIRED, "expired", sk);
    }
    for (class, name, sk) in &ks.events {
        if *class != crate::notify::KEY_MISS {
            put(1, *class, name, sk);
        }
    }
    for sk in &ks.created_log {
        put(2, crate::notify::NEW, "new", sk);
    }
    v.len() > start
}

/// An entry's note read back into `ks`'s pending events (published by
/// [`crate::notify::flush_pending`]); false when it is malformed.
fn decode_note(ks: &mut Keyspace, mut b: &[u8]) -> bool {
    fn take<'a>(b: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
        let (h, t) = (b.get(..n)?, b.get(n..)?);
        *b = t;
        Some(h)
    }
    while !b.is_empty() {
        let Some(kind) = take(&mut b, 1).map(|k| k[0]) else {
            return false;
        };
        let Some(class) =
            take(&mut b, 4).map(|c| u32::from_le_bytes(c.try_into().unwrap_or_default()))
        else {
            return false;
        };
        let Some(n) = take(&mut b, 1).map(|n| n[0] as usize) else {
            return false;
        };
        let Some(name) = take(&mut b, n).and_then(intern) else {
            return false;
        };
        let Some(n) =
            take(&mut b, 4).map(|n| u32::from_le_bytes(n.try_into().unwrap_or_default()) as usize)
        else {
            return false;
        };
        let Some(sk) = take(&mut b, n) else {
            return false;
        };
        match kind {
            0 => ks.expired_log.push(sk.to_vec()),
            2 => ks.created_log.push(sk.to_vec()),
            _ => ks.events.push((class, name, sk.to_vec())),
        }
    }
    true
}

/// Event names as `&'static str` (the keyspace's event list holds Redis's
/// names as static strings): each distinct name read from an entry is
/// kept once (Redis has about a hundred).
fn intern(name: &[u8]) -> Option<&'static str> {
    static NAMES: std::sync::Mutex<Vec<&'static str>> = std::sync::Mutex::new(Vec::new());
    let name = std::str::from_utf8(name).ok()?;
    let mut names = NAMES.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(n) = names.iter().find(|n| **n == name) {
        return Some(n);
    }
    if names.len() >= 1024 {
        return None;
    }
    let n: &'static str = Box::leak(name.to_string().into_boxed_str());
    names.push(n);
    Some(n)
}

/// A publish event's parts: (shard channel?, channel, payload).
fn decode_publish(data: &[u8]) -> Option<(bool, &[u8], &[u8])> {
    let shard = *data.first()? == 1;
    let n = u32::from_le_bytes(data.get(1..5)?.try_into().ok()?) as usize;
    let channel = data.get(5..5 + n)?;
    Some((shard, channel, &data[5 + n..]))
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

/// What an entry's batch writes (see `repl::StateMachine::footprint`): the
/// hash of every store key, and the owner: the one client key (database
/// and name) among them. Internal keys (pieces, lazy-free entries, the
/// collections marker) have no owner of their own: a collection's pieces
/// go with its key, and any key two entries of different owners both write
/// sends them to one thread anyway (the hashes of every key are compared).
fn footprint(data: &[u8], keys: &mut Vec<u64>) -> Option<u64> {
    use std::hash::BuildHasher;
    // Fixed seeds: every node and every restart puts an entry in the same
    // lane (its mark depends on it).
    let h = foldhash::fast::FixedState::with_seed(0x656d_6265_725f_6c61);
    let batch = WriteBatch::from_bytes(data).ok()?;
    let mut owner = None;
    for (k, _) in batch.iter() {
        let kh = h.hash_one(k);
        keys.push(kh);
        if k.first() != Some(&crate::keyspace::PIECE_PREFIX) {
            match owner {
                None => owner = Some(kh),
                Some(o) if o == kh => {}
                Some(_) => return None,
            }
        }
    }
    owner
}

/// An apply thread's state machine.
struct Applier {
    ks: Keyspace,
    sh: Arc<Shared>,
    failed: Option<String>,
}

impl Applier {
    fn mark(&mut self, key: &[u8], index: u64) {
        let mut b = WriteBatch::new();
        b.put(key, &index.to_le_bytes());
        if let Err(e) = self.ks.sess.apply_batch(&b, &mut Vec::new()) {
            self.failed = Some(format!("recording applied index {index}: {e}"));
        }
    }
}

impl repl::StateMachine<ApplyOut> for Applier {
    fn apply(&mut self, index: u64, data: &[u8], own: bool, mark: &[u8]) -> ApplyOut {
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
            self.ks
                .apply_entry_raw(batch, index, mark)
                .map(|o| (index, o))
        } else {
            let r = self
                .ks
                .apply_entry(batch, index, mark)
                .map(|()| (index, Vec::new()));
            // Its keyspace events (`new` too) come in the event entry the
            // leader proposes after it.
            self.ks.created_log.clear();
            r
        };
        if let Err(e) = &r {
            if deterministic(e) {
                self.mark(mark, index);
            } else {
                self.failed = Some(format!("applying entry {index}: {e}"));
            }
        }
        r
    }

    fn skip(&mut self, index: u64) {
        self.mark(repl::APPLIED_KEY, index);
    }

    fn footprint(&self, data: &[u8], keys: &mut Vec<u64>) -> Option<u64> {
        footprint(data, keys)
    }

    fn lane_marks(&mut self) -> Result<Vec<u64>, String> {
        repl::storage::read_lane_marks(&mut *self.ks.sess).map_err(|e| e.to_string())
    }

    fn sync(&mut self) {
        if let Err(e) = self.ks.sess.commit() {
            self.failed = Some(format!("committing applied entries: {e}"));
        }
        // Clients of this node that track keys the entries changed (a
        // follower's READONLY readers) are told, as after a local write.
        crate::tracking::flush_turn(&self.sh, &mut self.ks);
    }

    fn failed(&self) -> Option<String> {
        self.failed.clone()
    }

    fn event(&mut self, index: u64, data: &[u8], own: bool) -> ApplyOut {
        // A message published at the leader: delivered to this node's
        // subscribers (the proposer's node delivers it itself, counting
        // its receivers for the reply).
        if data.first() == Some(&EVENT_NOTIFY) {
            // Keyspace events, published here unless this node proposed
            // them (its worker published them first).
            let from = data
                .get(1..9)
                .map(|b| u64::from_le_bytes(b.try_into().unwrap_or_default()));
            if from != Some(self.sh.cluster.get().map_or(0, |c| c.node.id())) {
                if decode_note(&mut self.ks, &data[9..]) {
                    crate::notify::flush_pending(&self.sh, &mut self.ks);
                } else {
                    self.ks.events.clear();
                    self.ks.expired_log.clear();
                    self.ks.created_log.clear();
                }
            }
        } else if !own {
            if let Some((shard, channel, payload)) = decode_publish(data) {
                self.sh.pubsub.publish(shard, channel, payload);
            }
        }
        self.mark(repl::APPLIED_KEY, index);
        Ok((index, Vec::new()))
    }

    fn dump(&mut self, out: &mut dyn std::io::Write) -> Result<(), String> {
        repl::storage::dump_to(&mut *self.ks.sess, out).map_err(|e| e.to_string())
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
        compact_after: c.raft_log_keep,
        apply_lanes: c.raft_apply_lanes,
        join: c.join,
        snapshot_chunk: c.raft_snapshot_chunk,
        snapshot_file: Some({
            let mut p = c.heap.clone().into_os_string();
            p.push(".raft-snapshot");
            p.into()
        }),
    };
    drop(c);
    let (s1, s2) = (sh.clone(), sh.clone());
    let node = repl::Handle::start(
        cfg,
        Box::new(move || s1.store.session()),
        Arc::new(move |lane| {
            let sess = s2
                .store
                .session()
                .expect("a store session for the apply thread");
            // The key counts' shards after the workers' are the apply
            // threads'.
            let shard = s2.cfg().threads + lane;
            let mut ks = Keyspace::new(sess, s2.counts.clone(), shard, s2.hk.clone());
            ks.set_watches(s2.watches.clone());
            ks.track.set_registry(s2.tracking.clone());
            ks.notify = s2.pubsub.notify_flags().clone();
            Box::new(Applier {
                ks,
                sh: s2.clone(),
                failed: None,
            }) as Box<dyn repl::StateMachine<ApplyOut>>
        }),
    )?;
    let entry_limit = sh
        .store
        .session()
        .map_err(|e| e.to_string())?
        .batch_limit()
        .map(|l| l.saturating_sub(ENTRY_OVERHEAD));
    Ok(Some(Arc::new(Cluster {
        node,
        write_timeout: Duration::from_secs(30),
        fwd_blocked: Default::default(),
        entry_limit,
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
        "master_failover_state:no-failover\r\nmaster_replid:{}\r\nmaster_repl_offset:{}\r\nraft_node_id:{}\r\nraft_leader_id:{}\r\nraft_term:{}\r\nraft_commit_index:{}\r\nraft_applied_index:{}\r\nraft_last_index:{}\r\nraft_first_index:{}\r\nraft_failed:{}\r\nraft_apply_lanes:{}\r\nraft_applied_in_parallel:{}\r\n\r\n",
        sh.run_id,
        st.applied,
        st.id,
        st.leader.unwrap_or(0),
        st.term,
        st.commit,
        st.applied,
        st.last_index,
        st.first_index,
        st.failed.as_deref().unwrap_or("no"),
        st.apply_lanes,
        st.applied_in_parallel,
    );
    Some(o)
}

/// The name clients give the cluster in Sentinel's discovery commands.
pub const SENTINEL_NAME: &str = "mymaster";

/// A Sentinel state (a flat list of field, value pairs: a map in RESP3).
fn sentinel_state(fields: &[(&str, String)]) -> proto::Reply {
    proto::Reply::Map(
        fields
            .iter()
            .map(|(k, v)| {
                (
                    proto::Reply::Bulk(k.as_bytes().to_vec()),
                    proto::Reply::Bulk(v.as_bytes().to_vec()),
                )
            })
            .collect(),
    )
}

/// This server's cluster node, for a command (`what`) that needs one.
fn node_for<'a>(
    ctx: &crate::cmd::Ctx<'a>,
    what: &str,
) -> Result<&'a Cluster, crate::cmd::CmdError> {
    ctx.sh
        .cluster
        .get()
        .map(|c| &**c)
        .ok_or_else(|| crate::cmd::CmdError::NotSupported {
            what: what.into(),
            why: " on a server that is not a node of a cluster (start it with --node-id and --peers)",
        })
}

/// SENTINEL's discovery subcommands, answered by every node of a cluster as
/// a Sentinel watching it would, so that Sentinel-aware clients (redis-py's
/// `Sentinel`, Jedis, go-redis failover) find the leader: the cluster is
/// the master named `mymaster`, the leader its address, the followers its
/// replicas, and the other nodes its sentinels. GET-MASTER-ADDR-BY-NAME,
/// MASTERS, MASTER, REPLICAS (SLAVES), SENTINELS, MYID, HELP; the
/// subcommands that configure or fail over a Sentinel are refused (Raft
/// elects the leader).
pub fn sentinel(
    ctx: &mut crate::cmd::Ctx,
    c: &mut crate::server::Client,
    a: &[Vec<u8>],
) -> crate::cmd::R {
    use crate::cmd::{eq, CmdError};
    use proto::Reply;
    let cl = node_for(ctx, "SENTINEL")?;
    let sub = &a[1];
    let named = |i: usize| {
        a.get(i)
            .is_some_and(|n| n.as_slice() == SENTINEL_NAME.as_bytes())
    };
    let st = cl.node.status();
    let leader = st.leader.filter(|_| st.failed.is_none());
    let (lh, lp) = cl.client_addr(leader);
    let others: Vec<repl::Peer> = cl.node.peers();
    let master = || {
        let flags = if leader.is_some() {
            "master"
        } else {
            "master,s_down"
        };
        sentinel_state(&[
            ("name", SENTINEL_NAME.into()),
            ("ip", lh.clone()),
            ("port", lp.to_string()),
            ("runid", String::new()),
            ("flags", flags.into()),
            ("num-slaves", (others.len().saturating_sub(1)).to_string()),
            (
                "num-other-sentinels",
                (others.len().saturating_sub(1)).to_string(),
            ),
            ("quorum", (others.len() / 2 + 1).to_string()),
            ("config-epoch", st.term.to_string()),
        ])
    };
    if eq(sub, "get-master-addr-by-name") && a.len() == 3 {
        if named(2) && leader.is_some() {
            c.reply(&Reply::Array(vec![
                Reply::Bulk(lh.clone().into_bytes()),
                Reply::Bulk(lp.to_string().into_bytes()),
            ]));
        } else {
            c.reply(&Reply::NullArray);
        }
    } else if eq(sub, "masters") && a.len() == 2 {
        c.reply(&Reply::Array(vec![master()]));
    } else if eq(sub, "master") && a.len() == 3 {
        if !named(2) {
            return Err(CmdError::Msg("No such master with that name"));
        }
        c.reply(&master());
    } else if (eq(sub, "replicas") || eq(sub, "slaves")) && a.len() == 3 {
        if !named(2) {
            return Err(CmdError::Msg("No such master with that name"));
        }
        let reps = others
            .iter()
            .filter(|p| Some(p.id) != leader)
            .map(|p| {
                let (h, port) = split_addr(&p.client_addr);
                sentinel_state(&[
                    ("name", format!("{h}:{port}")),
                    ("ip", h),
                    ("port", port.to_string()),
                    ("runid", String::new()),
                    ("flags", "slave".into()),
                    ("master-host", lh.clone()),
                    ("master-port", lp.to_string()),
                    (
                        "master-link-status",
                        if leader.is_some() { "ok" } else { "err" }.into(),
                    ),
                ])
            })
            .collect();
        c.reply(&Reply::Array(reps));
    } else if eq(sub, "sentinels") && a.len() == 3 {
        if !named(2) {
            return Err(CmdError::Msg("No such master with that name"));
        }
        let me = cl.node.id();
        let s = others
            .iter()
            .filter(|p| p.id != me)
            .map(|p| {
                let (h, port) = split_addr(&p.client_addr);
                sentinel_state(&[
                    ("name", format!("node-{}", p.id)),
                    ("ip", h),
                    ("port", port.to_string()),
                    ("runid", String::new()),
                    ("flags", "sentinel".into()),
                ])
            })
            .collect();
        c.reply(&Reply::Array(s));
    } else if eq(sub, "myid") && a.len() == 2 {
        c.bulk(format!("node-{}", cl.node.id()).as_bytes());
    } else if eq(sub, "help") && a.len() == 2 {
        crate::cmd::help(
            c,
            &[
                "SENTINEL <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
                "GET-MASTER-ADDR-BY-NAME <master-name>",
                "    Return the ip and port number of the master with that name.",
                "MASTERS",
                "    Show a list of monitored masters and their state.",
                "MASTER <master-name>",
                "    Show the state and info of the specified master.",
                "REPLICAS <master-name>",
                "    Show a list of replicas for this master and their state.",
                "SENTINELS <master-name>",
                "    Show a list of Sentinel instances for this master and their state.",
                "MYID",
                "    Return the ID of the Sentinel instance.",
                "HELP",
                "    Print this help.",
            ],
        );
    } else {
        return Err(CmdError::NotSupported {
            what: format!("SENTINEL {}", String::from_utf8_lossy(sub)),
            why: ": the cluster's leader is elected by Raft, not configured through Sentinel",
        });
    }
    Ok(())
}

/// A follower's client's connection to the leader: the requests it
/// forwards go through it, in order, so the leader keeps the connection's
/// state for it (its database, WATCH, RESP version).
pub struct Forward {
    leader: u64,
    stream: std::net::TcpStream,
    db: u8,
    buf: Vec<u8>,
    /// The connection's client id at the leader (CLIENT UNBLOCK of a
    /// forwarded blocking command names it there).
    leader_client: u64,
}

/// A blocking command forwarded to the leader (BLPOP, BLMOVE, BZPOPMIN...
/// at a follower): a thread waits for the leader's reply, so that the
/// worker serves its other clients meanwhile; the client's own input waits
/// (as a blocked client's does) until the worker takes the reply
/// ([`FwdWait::take`]).
pub struct FwdWait {
    slot: Arc<std::sync::Mutex<Option<FwdDone>>>,
    /// Shut down when the client goes: the leader then ends the wait, and
    /// takes nothing for it.
    stream: Option<std::net::TcpStream>,
    /// This client's id here, registered in [`Cluster::fwd_blocked`].
    id: u64,
}

/// The leader's reply (or why there is none) and the connection back.
type FwdDone = (Result<Vec<u8>, String>, Option<Box<Forward>>);

impl FwdWait {
    /// The reply once it came: appended to the client's output, its
    /// connection to the leader given back; false while it waits.
    pub(crate) fn take(c: &mut crate::server::Client, cl: &Cluster) -> bool {
        let Some(w) = c.fwd_wait.as_ref() else {
            return true;
        };
        let Some((r, f)) = w.slot.lock().unwrap_or_else(|p| p.into_inner()).take() else {
            return false;
        };
        cl.fwd_blocked
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&w.id);
        c.fwd_wait = None;
        c.meta
            .blocked
            .store(false, std::sync::atomic::Ordering::Relaxed);
        c.fwd = f;
        match r {
            Ok(r) => c.out.extend_from_slice(&r),
            Err(e) => c.err(&format!("TRYAGAIN forwarding to the leader failed: {e}")),
        }
        true
    }

    /// The client goes while it waits.
    pub(crate) fn abandon(c: &mut crate::server::Client, cl: Option<&Cluster>) {
        if let Some(w) = c.fwd_wait.take() {
            c.meta
                .blocked
                .store(false, std::sync::atomic::Ordering::Relaxed);
            if let Some(s) = &w.stream {
                let _ = s.shutdown(std::net::Shutdown::Both);
            }
            if let Some(cl) = cl {
                cl.fwd_blocked
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .remove(&w.id);
            }
        }
    }
}

/// The node when request `spec` from `c` is the leader's business: this
/// node is a follower, and the command writes or may (a script, a
/// transaction's EXEC, WATCH), or reads keys and the client did not ask
/// for local reads with READONLY. [`forward`] sends it there. Pub/Sub,
/// XREAD BLOCK and the connection's own commands stay here.
pub fn forwarded<'a>(
    sh: &'a Shared,
    c: &crate::server::Client,
    spec: &crate::cmd::Spec,
) -> Option<&'a Cluster> {
    use crate::cmd::Flags;
    let cl = sh.cluster.get()?;
    if cl.is_leader() || c.mc.is_some() {
        return None;
    }
    let f = spec.flags;
    if f.contains(Flags::PUBSUB) {
        // Messages go through the leader's log to every node; the
        // subscriptions stay here.
        return matches!(spec.name, "publish" | "spublish").then_some(cl);
    }
    let write = f.contains(Flags::WRITE) || f.contains(Flags::MAY_REPLICATE);
    if f.contains(Flags::BLOCKING) {
        // A blocking pop (or XREADGROUP) waits at the leader, on a thread
        // of its own (`forward_blocking`); XREAD BLOCK (a read) waits here.
        return write.then_some(cl);
    }
    let read = f.contains(Flags::READONLY) && !c.readonly;
    // Scripts may write (their _RO forms are READONLY).
    // RAFT: membership changes are the leader's to propose.
    let conn = matches!(
        spec.name,
        "watch" | "unwatch" | "eval" | "evalsha" | "fcall" | "raft"
    ) || (spec.name == "exec" && c.multi.as_ref().is_some_and(|m| !m.dirty))
        // The client's writes went through the leader: it counts for them.
        || (spec.name == "wait" && c.fwd.is_some());
    (write || read || conn).then_some(cl)
}

/// Before a read at a cluster's leader (a command that reads keys, or a
/// script or transaction, which may): waits until the leader has confirmed
/// with a quorum that it still leads and has applied what was committed
/// when the read arrived (Raft's ReadIndex, batched: see
/// [`repl::Handle::read_barrier`]). A leader cut off from its majority then
/// answers no stale read: the read fails when it steps down. Nothing to do
/// on a lone server, on a follower (its reads were forwarded), for a
/// client that asked for local reads with READONLY, or for a pure write (its entry
/// commits through the same quorum).
pub fn read_barrier(
    sh: &Shared,
    c: &crate::server::Client,
    spec: &crate::cmd::Spec,
) -> Result<(), String> {
    let Some(cl) = sh.cluster.get() else {
        return Ok(());
    };
    let reads = spec.flags.contains(crate::cmd::Flags::READONLY)
        || matches!(spec.name, "exec" | "eval" | "evalsha" | "fcall");
    // READONLY asked for this node's own state, wherever it stands.
    if !reads || c.mc.is_some() || c.readonly || !cl.is_leader() {
        return Ok(());
    }
    match cl.node.read_barrier().recv_timeout(cl.write_timeout) {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(error_text(&e)),
        Err(_) => Err(error_text(&repl::ReplError::Stopped(
            "no quorum confirmed the leader in time".into(),
        ))),
    }
}

/// WAIT on a cluster's leader: the followers whose logs hold entry `index`
/// (the client's last write), waiting until `want` of them do or `timeout_ms`
/// passes (0: no limit, as in Redis, though at most the write timeout, so
/// that a worker is not held without end by members that are down).
pub fn wait(cl: &Cluster, index: u64, want: i64, timeout_ms: i64) -> i64 {
    let limit = if timeout_ms == 0 {
        cl.write_timeout
    } else {
        Duration::from_millis(timeout_ms as u64).min(cl.write_timeout)
    };
    let t0 = std::time::Instant::now();
    loop {
        let st = cl.node.status();
        let have = st.matched.iter().filter(|(_, m)| *m >= index).count() as i64;
        if have >= want || t0.elapsed() >= limit || !st.is_leader {
            return have;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn encode_request(out: &mut Vec<u8>, args: &[Vec<u8>]) {
    out.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
    for a in args {
        out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
}

impl Forward {
    fn open(cl: &Cluster, sh: &Shared, c: &crate::server::Client) -> Result<Forward, String> {
        use std::io::Write;
        let st = cl.node.status();
        let leader = st.leader.ok_or("no leader is elected now")?;
        let (h, p) = cl.client_addr(Some(leader));
        let addr = std::net::ToSocketAddrs::to_socket_addrs(&(h.as_str(), p))
            .ok()
            .and_then(|mut a| a.next())
            .ok_or_else(|| format!("the leader's address {h}:{p} does not resolve"))?;
        let stream = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(1))
            .map_err(|e| format!("cannot reach the leader at {addr}: {e}"))?;
        let _ = stream.set_nodelay(true);
        let _ = stream.set_read_timeout(Some(cl.write_timeout));
        let _ = stream.set_write_timeout(Some(cl.write_timeout));
        let mut f = Forward {
            leader,
            stream,
            db: 0,
            buf: Vec::new(),
            leader_client: 0,
        };
        // The same password and protocol as the client's; then the
        // connection's id there.
        let mut setup: Vec<Vec<Vec<u8>>> = Vec::new();
        if let Some(pw) = sh.cfg().requirepass.clone() {
            setup.push(vec![b"AUTH".to_vec(), pw.into_bytes()]);
        }
        if c.resp == proto::Version::Resp3 {
            setup.push(vec![b"HELLO".to_vec(), b"3".to_vec()]);
        }
        setup.push(vec![b"CLIENT".to_vec(), b"ID".to_vec()]);
        let mut out = Vec::new();
        for r in &setup {
            encode_request(&mut out, r);
        }
        f.stream.write_all(&out).map_err(|e| e.to_string())?;
        for i in 0..setup.len() {
            let n = f.read_reply()?;
            if i + 1 == setup.len() {
                // `:<id>\r\n`
                f.leader_client = std::str::from_utf8(&f.buf[..n])
                    .ok()
                    .and_then(|r| r.strip_prefix(':'))
                    .and_then(|r| r.trim_end().parse().ok())
                    .unwrap_or(0);
            }
            f.buf.drain(..n);
        }
        Ok(f)
    }

    /// Reads one reply; returns its bytes' length at the front of `buf`.
    fn read_reply(&mut self) -> Result<usize, String> {
        use std::io::Read;
        loop {
            match proto::parse_reply(&self.buf) {
                Ok(Some((_, n))) => return Ok(n),
                Ok(None) => {}
                Err(e) => return Err(format!("the leader's reply: {e:?}")),
            }
            let mut chunk = [0u8; 16 << 10];
            let n = self
                .stream
                .read(&mut chunk)
                .map_err(|e| format!("the leader did not answer: {e}"))?;
            if n == 0 {
                return Err("the leader closed the connection".into());
            }
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }

    /// Sends `reqs` in one write and returns the last reply's bytes.
    fn call(&mut self, db: u8, reqs: &[&[Vec<u8>]]) -> Result<Vec<u8>, String> {
        use std::io::Write;
        let mut out = Vec::new();
        let select = db != self.db;
        if select {
            encode_request(&mut out, &[b"SELECT".to_vec(), db.to_string().into_bytes()]);
        }
        for r in reqs {
            encode_request(&mut out, r);
        }
        self.stream
            .write_all(&out)
            .map_err(|e| format!("cannot send to the leader: {e}"))?;
        let n = reqs.len() + usize::from(select);
        let mut last = Vec::new();
        for i in 0..n {
            let len = self.read_reply()?;
            if i + 1 == n {
                last = self.buf[..len].to_vec();
            }
            self.buf.drain(..len);
        }
        if select {
            self.db = db;
        }
        Ok(last)
    }
}

/// Forwards request `args` (a transaction's queue with its EXEC) over the
/// client's connection to the leader and appends the leader's reply to the
/// client's output as it came; true when the command failed. A leader that
/// changed since the connection was opened is found again when nothing was
/// sent (or it answered that it is no longer the leader).
pub fn forward(
    cl: &Cluster,
    sh: &Shared,
    c: &mut crate::server::Client,
    spec: &crate::cmd::Spec,
    args: &[Vec<u8>],
) -> bool {
    // A script this node knows may be unknown to the leader (script
    // caches are per node): EVALSHA goes as EVAL of its body.
    let as_eval;
    let args = match (spec.name, args.get(1)) {
        ("evalsha", Some(sha)) => {
            match sh
                .scripting
                .script(&String::from_utf8_lossy(sha).to_ascii_lowercase())
            {
                Some(s) => {
                    let mut a = args.to_vec();
                    a[0] = b"EVAL".to_vec();
                    a[1] = s.body.clone();
                    as_eval = a;
                    &as_eval[..]
                }
                None => args,
            }
        }
        _ => args,
    };
    if spec.flags.contains(crate::cmd::Flags::BLOCKING) {
        return forward_blocking(cl, sh, c, args);
    }
    let multi = if spec.name == "exec" {
        c.multi.take()
    } else {
        None
    };
    let multi_cmd = vec![b"MULTI".to_vec()];
    let mut reqs: Vec<&[Vec<u8>]> = Vec::new();
    if let Some(m) = &multi {
        reqs.push(&multi_cmd);
        reqs.extend(m.cmds.iter().map(|r| r.as_slice()));
    }
    reqs.push(args);
    let mut result = Err(String::new());
    for _attempt in 0..2 {
        if let Err(e) = connect_leader(cl, sh, c) {
            result = Err(e);
            break;
        }
        let Some(f) = c.fwd.as_mut() else { break };
        result = f.call(c.db, &reqs);
        match &result {
            Ok(r) if r.starts_with(b"-READONLY") => {
                // It stopped leading before it took the request: nothing
                // applied; ask again once the new leader is known.
                c.fwd = None;
                std::thread::sleep(Duration::from_millis(50));
            }
            Ok(_) => break,
            Err(_) => {
                // Sent or not, the outcome is unknown: not sent again.
                c.fwd = None;
                break;
            }
        }
    }
    match result {
        Ok(r) => {
            let failed = r.first() == Some(&b'-');
            c.out.extend_from_slice(&r);
            failed
        }
        Err(e) => {
            c.err(&format!("TRYAGAIN forwarding to the leader failed: {e}"));
            true
        }
    }
}

/// Opens the client's connection to the leader unless it has one to the
/// current leader. Err: nothing was sent, the command did not run.
fn connect_leader(cl: &Cluster, sh: &Shared, c: &mut crate::server::Client) -> Result<(), String> {
    let leader = cl.node.status().leader;
    if c.fwd.as_ref().is_none_or(|f| Some(f.leader) != leader) {
        c.fwd = None;
        let f = Forward::open(cl, sh, c).map_err(|e| format!("{e} (the command was not sent)"))?;
        c.fwd = Some(Box::new(f));
    }
    Ok(())
}

/// A blocking command at a follower: sent to the leader over the client's
/// connection there, on a thread that waits for the reply (the leader
/// applies its timeout; CLIENT UNBLOCK here is passed on); the worker takes
/// the reply on its loop (`Worker::reap_forwards`). True when it failed at
/// once (answered).
fn forward_blocking(
    cl: &Cluster,
    sh: &Shared,
    c: &mut crate::server::Client,
    args: &[Vec<u8>],
) -> bool {
    let Some((worker, _)) = c.home else {
        // The in-process executor (a script, a transaction) never forwards.
        c.err(&error_text(&repl::ReplError::NotLeader(None)));
        return true;
    };
    if let Err(e) = connect_leader(cl, sh, c) {
        c.err(&format!("TRYAGAIN forwarding to the leader failed: {e}"));
        return true;
    }
    let Some(mut f) = c.fwd.take() else {
        return true;
    };
    let slot = Arc::new(std::sync::Mutex::new(None));
    let stream = f.stream.try_clone().ok();
    cl.fwd_blocked
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(c.id, (f.leader, f.leader_client));
    c.meta
        .blocked
        .store(true, std::sync::atomic::Ordering::Relaxed);
    c.fwd_wait = Some(Box::new(FwdWait {
        slot: slot.clone(),
        stream,
        id: c.id,
    }));
    let (db, args) = (c.db, args.to_vec());
    let waker = sh.pubsub.waker(worker);
    let write_timeout = cl.write_timeout;
    let spawned = std::thread::Builder::new()
        .name("fwd-block".into())
        .spawn(move || {
            // The wait is the command's: no read timeout of ours.
            let _ = f.stream.set_read_timeout(None);
            let r = f.call(db, &[&args]);
            let _ = f.stream.set_read_timeout(Some(write_timeout));
            let back = r.is_ok().then_some(f);
            *slot.lock().unwrap_or_else(|p| p.into_inner()) = Some((r, back));
            // The worker takes it on its next loop turn.
            if let Some(w) = waker {
                let _ = w.wake();
            }
        });
    if let Err(e) = spawned {
        FwdWait::abandon(c, Some(cl));
        c.err(&format!("TRYAGAIN forwarding to the leader failed: {e}"));
        return true;
    }
    false
}

/// CLIENT UNBLOCK at a follower of a client waiting in a forwarded blocking
/// command: passed on to the leader for that client's connection there.
/// None when `id` is not such a client.
pub fn unblock_forwarded(
    cl: &Cluster,
    sh: &Shared,
    c: &crate::server::Client,
    id: u64,
    error: bool,
) -> Option<bool> {
    let (leader, there) = *cl
        .fwd_blocked
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(&id)?;
    let mut f = Forward::open(cl, sh, c).ok()?;
    if f.leader != leader {
        return Some(false);
    }
    let mut req = vec![
        b"CLIENT".to_vec(),
        b"UNBLOCK".to_vec(),
        there.to_string().into_bytes(),
    ];
    if error {
        req.push(b"ERROR".to_vec());
    }
    let r = f.call(0, &[&req]).ok()?;
    Some(r.starts_with(b":1"))
}

/// READONLY: a follower's reads of this connection are served from its own
/// applied state (possibly behind the leader) instead of the leader's.
pub fn readonly(
    ctx: &mut crate::cmd::Ctx,
    c: &mut crate::server::Client,
    _a: &[Vec<u8>],
) -> crate::cmd::R {
    set_readonly(ctx, c, true)
}

/// READWRITE: reads go to the leader again (the default).
pub fn readwrite(
    ctx: &mut crate::cmd::Ctx,
    c: &mut crate::server::Client,
    _a: &[Vec<u8>],
) -> crate::cmd::R {
    set_readonly(ctx, c, false)
}

fn set_readonly(ctx: &crate::cmd::Ctx, c: &mut crate::server::Client, on: bool) -> crate::cmd::R {
    if ctx.sh.cluster.get().is_none() {
        // Redis's answer outside cluster mode.
        return Err(crate::cmd::CmdError::Msg(
            "This instance has cluster support disabled",
        ));
    }
    c.readonly = on;
    c.ok();
    Ok(())
}

/// RAFT: membership of the cluster, online.
/// - `RAFT MEMBERS`: each member as `ID=HOST:RAFTPORT:PORT` and its role
///   (leader, voter) as this node knows them.
/// - `RAFT ADD ID HOST:RAFTPORT:PORT`: adds a member (a node started with
///   `--join` and that id; the leader sends it a snapshot, then entries).
/// - `RAFT REMOVE ID`: removes a member (stop its process afterwards).
///
/// ADD and REMOVE are forwarded to the leader from a follower and answer
/// once the change is committed and in force.
pub fn raft(
    ctx: &mut crate::cmd::Ctx,
    c: &mut crate::server::Client,
    a: &[Vec<u8>],
) -> crate::cmd::R {
    use crate::cmd::{eq, CmdError};
    use proto::Reply;
    let cl = node_for(ctx, "RAFT")?;
    let sub = &a[1];
    let id_arg = |i: usize| -> Result<u64, CmdError> {
        std::str::from_utf8(&a[i])
            .ok()
            .and_then(|s| s.parse::<u64>().ok())
            .filter(|&n| n > 0)
            .ok_or(CmdError::Msg("member id must be a positive integer"))
    };
    let wait = |rx: std::sync::mpsc::Receiver<Result<(), repl::ReplError>>| match rx
        .recv_timeout(cl.write_timeout)
    {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(CmdError::Text(error_text(&e))),
        Err(_) => Err(CmdError::Text(error_text(&repl::ReplError::Stopped(
            "no quorum answered in time".into(),
        )))),
    };
    if eq(sub, "members") && a.len() == 2 {
        let st = cl.node.status();
        let rows = cl
            .node
            .peers()
            .iter()
            .map(|p| {
                let role = if Some(p.id) == st.leader {
                    "leader"
                } else {
                    "voter"
                };
                Reply::Array(vec![
                    Reply::Bulk(p.spec().into_bytes()),
                    Reply::Bulk(role.as_bytes().to_vec()),
                ])
            })
            .collect();
        c.reply(&Reply::Array(rows));
    } else if eq(sub, "add") && a.len() == 4 {
        let id = id_arg(2)?;
        let spec = format!("{id}={}", String::from_utf8_lossy(&a[3]));
        let peer = repl::parse_peers(&spec)
            .map_err(|e| CmdError::Text(format!("ERR {e}")))?
            .remove(0);
        if cl.node.peers().iter().any(|p| p.id == id) {
            return Err(CmdError::Text(format!("ERR node {id} is already a member")));
        }
        wait(cl.node.change(Some(peer), None))?;
        c.ok();
    } else if eq(sub, "remove") && a.len() == 3 {
        let id = id_arg(2)?;
        if !cl.node.peers().iter().any(|p| p.id == id) {
            return Err(CmdError::Text(format!("ERR node {id} is not a member")));
        }
        wait(cl.node.change(None, Some(id)))?;
        c.ok();
    } else if eq(sub, "help") && a.len() == 2 {
        crate::cmd::help(
            c,
            &[
                "RAFT <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
                "MEMBERS",
                "    Return each member as ID=HOST:RAFTPORT:PORT and its role.",
                "ADD <id> <host:raftport:port>",
                "    Add a member (a node started with --join and that --node-id).",
                "REMOVE <id>",
                "    Remove a member.",
                "HELP",
                "    Print this help.",
            ],
        );
    } else {
        return Err(CmdError::Text(format!(
            "ERR unknown subcommand or wrong number of arguments for '{}'. Try RAFT HELP.",
            String::from_utf8_lossy(sub)
        )));
    }
    Ok(())
}
