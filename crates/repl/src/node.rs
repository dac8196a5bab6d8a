//! A Raft node: the raft-rs state machine driven by one thread, and the
//! apply thread that hands committed entries to the server's state machine.
//!
//! # Threads
//! - **raft** (`raft-N`): owns the `RawNode` and the log ([`HeapStorage`]).
//!   It waits on its inbox (peer messages, proposals, apply progress) for
//!   at most one tick, ticks, and handles a Ready: sends the messages that
//!   need nothing persisted, persists the new entries and hard state as one
//!   batch, then sends the rest, and passes committed entries on.
//! - **apply** (`raft-apply`, and `raft-apply-N` with several lanes):
//!   applies committed entries through the server's [`StateMachine`] (in
//!   log order, or in parallel where they commute: [`crate::apply`]), which
//!   persists each entry's index with its effects (exactly once across
//!   restarts), then completes the proposer's waiter and reports the
//!   applied index back.
//!
//! # Proposals
//! A writer (a server worker) proposes bytes with [`Handle::propose`] and
//! waits on the receiver it gets for what the state machine returned when
//! it applied them. A new leader holds proposals back until it has applied
//! every entry up to the first of its term: a proposer's effects were
//! computed against the applied state, which must then include every
//! committed write. A proposal fails at once when this node is not the
//! leader, and its waiter fails when the node stops being leader before it
//! applied (the entry may still commit: the outcome is then unknown to the
//! client, as after a timeout).

use crate::storage::{read_applied, DumpFile, HeapStorage, SnapDesc};
use protobuf::Message as _;
use raft::eraftpb::{ConfChange, ConfChangeType, Entry, EntryType, Message, MessageType, Snapshot};
use raft::{Config, ProgressState, RawNode, SnapshotStatus, StateRole};
use std::collections::HashMap;
use std::net::TcpListener;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, SyncSender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// One member of the cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Peer {
    pub id: u64,
    /// host:port of its Raft transport.
    pub raft_addr: String,
    /// host:port where it serves clients (ROLE, INFO, Sentinel answers).
    pub client_addr: String,
}

impl Peer {
    /// `ID=HOST:RAFTPORT:PORT`, as `--peers` spells a member.
    pub fn spec(&self) -> String {
        let port = self.client_addr.rsplit_once(':').map_or("", |(_, p)| p);
        format!("{}={}:{port}", self.id, self.raft_addr)
    }
}

/// `--peers`' text for `peers`.
pub fn peers_spec(peers: &[Peer]) -> String {
    peers.iter().map(Peer::spec).collect::<Vec<_>>().join(",")
}

/// Parses `--peers`: `ID=HOST:RAFTPORT:PORT` separated by commas.
pub fn parse_peers(s: &str) -> Result<Vec<Peer>, String> {
    let mut out: Vec<Peer> = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (id, rest) = part
            .split_once('=')
            .ok_or_else(|| format!("peer '{part}' is not ID=HOST:RAFTPORT:PORT"))?;
        let id: u64 = id
            .parse()
            .ok()
            .filter(|&i| i > 0)
            .ok_or_else(|| format!("peer id '{id}' is not a positive integer"))?;
        let mut it = rest.rsplitn(3, ':');
        let (Some(port), Some(raft), Some(host)) = (it.next(), it.next(), it.next()) else {
            return Err(format!("peer '{part}' is not ID=HOST:RAFTPORT:PORT"));
        };
        for p in [port, raft] {
            p.parse::<u16>()
                .map_err(|_| format!("port '{p}' of peer {id} is not a port number"))?;
        }
        if out.iter().any(|p| p.id == id) {
            return Err(format!("peer id {id} appears twice"));
        }
        out.push(Peer {
            id,
            raft_addr: format!("{host}:{raft}"),
            client_addr: format!("{host}:{port}"),
        });
    }
    if out.is_empty() {
        return Err("no peers".into());
    }
    Ok(out)
}

/// How a node runs.
#[derive(Clone, Debug)]
pub struct NodeConfig {
    pub id: u64,
    /// Every member, this node included.
    pub peers: Vec<Peer>,
    /// Where the transport listens (this node's raft address by default).
    pub listen: String,
    pub tick: Duration,
    /// Election timeout, in ticks (randomised by raft-rs in [n, 2n)).
    pub election_ticks: usize,
    pub heartbeat_ticks: usize,
    /// The leader proposes a compaction once this many applied entries
    /// can go (kept for members up to this far behind; a member further
    /// behind is sent a snapshot).
    pub compact_after: u64,
    /// A node joining a running cluster: a new log starts with no
    /// configuration (the leader's snapshot brings it) instead of every
    /// member in `peers` as voters.
    pub join: bool,
    /// Where a snapshot received is kept while it is installed (beside the
    /// heap); the files of snapshots being received or offered are named
    /// after it (see [`crate::storage::part_path`] and its neighbours).
    /// None: this node can neither install nor offer one.
    pub snapshot_file: Option<std::path::PathBuf>,
    /// The size of the chunks a snapshot's bytes are served in (0: 4 MiB,
    /// [`crate::net::DEFAULT_SNAPSHOT_CHUNK`]).
    pub snapshot_chunk: usize,
    /// Threads applying committed entries (see [`crate::apply`]): 1 applies
    /// every entry in log order on one thread.
    pub apply_lanes: usize,
}

/// Why a proposal did not apply.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ReplError {
    /// This node is not the leader (the leader's id, when known).
    #[error("not the leader")]
    NotLeader(Option<u64>),
    /// The node lost leadership before the proposal applied; it may still
    /// commit under the new leader.
    #[error("leadership changed before the write applied")]
    LeaderChanged,
    /// The node is stopping or its log failed.
    #[error("replication stopped: {0}")]
    Stopped(String),
}

/// What the server applies committed entries with (it lives on the apply
/// thread; it is made there, as store sessions stay on their thread).
pub trait StateMachine<T> {
    /// Applies entry `index`'s data and persists `index` as applied in the
    /// same crash-atomic batch as the effects. Called once per committed
    /// entry, in log order, for entries after the applied index found at
    /// start. `own` is true when this node proposed it in this run.
    /// The index is recorded under `mark` ([`crate::APPLIED_KEY`], or a
    /// lane's mark when entries are applied in parallel: see
    /// [`crate::apply`]).
    fn apply(&mut self, index: u64, data: &[u8], own: bool, mark: &[u8]) -> T;
    /// What a data entry writes, for parallel apply: the hash of every
    /// store key it writes into `keys`, and the hash of the one owner of
    /// those keys (entries of different owners are applied in parallel),
    /// or None when it has several or none (it is then applied alone, in
    /// log order). Called on any apply thread's state machine.
    fn footprint(&self, _data: &[u8], _keys: &mut Vec<u64>) -> Option<u64> {
        None
    }
    /// The lane marks in the store ([`crate::storage::read_lane_marks`]),
    /// read once at start.
    fn lane_marks(&mut self) -> Result<Vec<u64>, String> {
        Ok(vec![0; crate::storage::VLANES as usize])
    }
    /// Persists `index` as applied for an entry without data (a new term's
    /// empty entry, a configuration change).
    fn skip(&mut self, index: u64);
    /// Handles an event entry (see [`Handle::propose_event`]) and persists
    /// `index` as applied. `own` as for [`Self::apply`].
    fn event(&mut self, index: u64, data: &[u8], own: bool) -> T;
    /// Writes the keyspace to `out` as a snapshot's data
    /// ([`crate::storage::dump_to`]), at the last applied index (called
    /// between entries; `out` is a buffered file).
    fn dump(&mut self, out: &mut dyn std::io::Write) -> Result<(), String>;
    /// Makes what was applied durable (a store with group commit); called
    /// after each run of entries, before their proposers are answered.
    fn sync(&mut self) {}
    /// Set when an entry could not be applied here although it may have
    /// applied elsewhere (a full heap): the node stops rather than diverge.
    fn failed(&self) -> Option<String> {
        None
    }
}

/// What a status reader sees (ROLE, INFO replication).
#[derive(Clone, Debug, Default)]
pub struct Status {
    pub id: u64,
    pub leader: Option<u64>,
    pub is_leader: bool,
    pub term: u64,
    pub commit: u64,
    pub applied: u64,
    pub last_index: u64,
    /// The first entry the log still holds (compaction drops those before).
    pub first_index: u64,
    /// At the leader: each follower's matched index.
    pub matched: Vec<(u64, u64)>,
    /// Set when the log or the state machine failed: the node stopped.
    pub failed: Option<String>,
    /// Apply threads, and the entries applied while another thread applied
    /// others (see [`crate::apply`]).
    pub apply_lanes: usize,
    pub applied_in_parallel: u64,
}

/// Messages to the raft thread.
pub enum Event {
    Message(Box<Message>),
    Propose {
        seq: u64,
        data: Vec<u8>,
    },
    Applied(u64),
    /// A linearizable read's barrier (see [`Handle::read_barrier`]).
    Read(u64),
    /// A membership change to propose (see [`Handle::change`]).
    Change {
        seq: u64,
        cc: ConfChange,
    },
    /// The apply thread's dump of the keyspace at applied index `index`,
    /// in a file.
    Dumped {
        index: u64,
        data: Result<DumpFile, String>,
    },
    /// A fetch of a snapshot's bytes ended (see [`crate::net::Net::fetch`]):
    /// on success they are in the received file, checked.
    Fetched {
        desc: SnapDesc,
        ok: Result<(), String>,
    },
    /// At the node offering a snapshot: member `to` started fetching its
    /// bytes (`done` None), or the transfer ended (whether the member has
    /// them all, checked).
    Transfer {
        to: u64,
        done: Option<bool>,
    },
    Campaign,
    /// A connection from a peer ended (the transport's reader saw its end
    /// or an error): the ids of the nodes whose messages came over it.
    PeerGone(Vec<u64>),
    /// Peer `id`'s Raft address refuses connections: its process is gone
    /// (see [`crate::net::Net::probe`]).
    PeerDown(u64),
    Stop,
}

pub(crate) type Waiter<T> = SyncSender<Result<T, ReplError>>;

/// An entry's first byte: a proposer's data follows.
pub(crate) const TAG_DATA: u8 = 0;
/// An entry's first byte: a compaction point follows (u64 little-endian):
/// every node drops its log's entries below it once it has applied it.
pub(crate) const TAG_COMPACT: u8 = 1;
/// An entry's first byte: an event follows, which every node handles and
/// that changes no state (the server's Pub/Sub messages).
pub(crate) const TAG_EVENT: u8 = 2;
type ReadWaiter = SyncSender<Result<(), ReplError>>;

/// What the apply thread is handed.
pub(crate) enum ApplyMsg {
    Entries(Vec<Entry>),
    /// Dump the keyspace for a snapshot into a new file at this path
    /// (answered with `Event::Dumped`).
    Dump(std::path::PathBuf),
}

pub(crate) struct Shared<T> {
    pub(crate) id: u64,
    pub(crate) status: Mutex<Status>,
    pub(crate) waiters: Mutex<HashMap<u64, Waiter<T>>>,
    reads: Mutex<HashMap<u64, ReadWaiter>>,
    changes: Mutex<HashMap<u64, ReadWaiter>>,
    /// Every member, this node included (changes with the configuration).
    peers: Mutex<Vec<Peer>>,
    /// Held by the apply thread while it applies a run of entries: a
    /// snapshot's install takes it to keep the apply thread out.
    pub(crate) apply_lock: Mutex<()>,
    next_seq: AtomicU64,
    stop: Arc<AtomicBool>,
    pub(crate) applied: AtomicU64,
    /// Whether this node leads and takes proposals (one load for callers
    /// on every write).
    pub(crate) leader: AtomicBool,
    pub(crate) apply_lanes: usize,
    pub(crate) applied_in_parallel: AtomicU64,
}

#[cfg(test)]
impl<T> Shared<T> {
    /// A node's shared state for tests of the apply threads alone.
    pub(crate) fn for_test(id: u64) -> Arc<Shared<T>> {
        Arc::new(Shared {
            id,
            status: Mutex::new(Status::default()),
            waiters: Mutex::new(HashMap::new()),
            reads: Mutex::new(HashMap::new()),
            changes: Mutex::new(HashMap::new()),
            peers: Mutex::new(Vec::new()),
            apply_lock: Mutex::new(()),
            next_seq: AtomicU64::new(1),
            stop: Arc::new(AtomicBool::new(false)),
            applied: AtomicU64::new(0),
            leader: AtomicBool::new(false),
            apply_lanes: 1,
            applied_in_parallel: AtomicU64::new(0),
        })
    }
}

/// A running node: cheap to clone, shared by the server's threads.
pub struct Handle<T> {
    sh: Arc<Shared<T>>,
    inbox: Mutex<Sender<Event>>,
}

impl<T> Clone for Handle<T> {
    fn clone(&self) -> Self {
        Handle {
            sh: self.sh.clone(),
            inbox: Mutex::new(self.inbox.lock().unwrap_or_else(|p| p.into_inner()).clone()),
        }
    }
}

/// The context stored with an entry: proposer id and its sequence number.
fn ctx_bytes(id: u64, seq: u64) -> Vec<u8> {
    let mut v = Vec::with_capacity(16);
    v.extend_from_slice(&id.to_le_bytes());
    v.extend_from_slice(&seq.to_le_bytes());
    v
}

pub(crate) fn parse_ctx(c: &[u8]) -> Option<(u64, u64)> {
    let id = u64::from_le_bytes(c.get(0..8)?.try_into().ok()?);
    let seq = u64::from_le_bytes(c.get(8..16)?.try_into().ok()?);
    Some((id, seq))
}

impl<T: Send + 'static> Handle<T> {
    /// Starts a node: opens its log through `log_session`'s store, binds its
    /// transport, and starts the raft and apply threads. `make_sm` runs on
    /// the apply thread.
    pub fn start(
        cfg: NodeConfig,
        log_session: Box<dyn FnOnce() -> engine::Result<Box<dyn engine::Session>> + Send>,
        make_sm: crate::apply::MakeStateMachine<T>,
    ) -> Result<Handle<T>, String> {
        if !cfg.peers.iter().any(|p| p.id == cfg.id) {
            return Err(format!("node id {} is not in --peers", cfg.id));
        }
        let listener =
            TcpListener::bind(&cfg.listen).map_err(|e| format!("raft port {}: {e}", cfg.listen))?;
        let stop = Arc::new(AtomicBool::new(false));
        let sh = Arc::new(Shared {
            id: cfg.id,
            status: Mutex::new(Status {
                id: cfg.id,
                ..Status::default()
            }),
            waiters: Mutex::new(HashMap::new()),
            reads: Mutex::new(HashMap::new()),
            changes: Mutex::new(HashMap::new()),
            peers: Mutex::new(cfg.peers.clone()),
            apply_lock: Mutex::new(()),
            // An earlier run's entries may carry the same numbers: the
            // driver clears their context (`started_term`).
            next_seq: AtomicU64::new(1),
            stop: stop.clone(),
            applied: AtomicU64::new(0),
            leader: AtomicBool::new(false),
            apply_lanes: cfg.apply_lanes.clamp(1, crate::apply::MAX_LANES),
            applied_in_parallel: AtomicU64::new(0),
        });
        let (tx, rx) = std::sync::mpsc::channel();
        let (ready_tx, ready_rx) =
            std::sync::mpsc::sync_channel::<Result<crate::storage::Shelf, String>>(1);
        let chunk = match cfg.snapshot_chunk {
            0 => crate::net::DEFAULT_SNAPSHOT_CHUNK,
            n => n,
        };
        let (apply_tx, apply_rx) = std::sync::mpsc::channel::<ApplyMsg>();
        let lanes = cfg.apply_lanes;
        {
            let sh = sh.clone();
            let cfg = cfg.clone();
            let inbox = tx.clone();
            std::thread::Builder::new()
                .name(format!("raft-{}", cfg.id))
                .spawn(move || {
                    let mut d =
                        match Driver::open(cfg, log_session, sh.clone(), apply_tx, inbox.clone()) {
                            Ok(d) => {
                                let _ = ready_tx.send(Ok(d.node.store().shelf()));
                                d
                            }
                            Err(e) => {
                                let _ = ready_tx.send(Err(e));
                                return;
                            }
                        };
                    d.run(&rx);
                    drop(inbox);
                })
                .map_err(|e| e.to_string())?;
        }
        let shelf = ready_rx
            .recv()
            .map_err(|_| "the raft thread ended".to_string())??;
        crate::net::serve(listener, tx.clone(), stop.clone(), shelf, chunk);
        {
            let sh = sh.clone();
            let inbox = tx.clone();
            std::thread::Builder::new()
                .name("raft-apply".into())
                .spawn(
                    move || match crate::apply::Applier::start(sh.clone(), make_sm, lanes) {
                        Ok(a) => a.run(&apply_rx, &inbox),
                        Err(why) => crate::apply::stop(&sh, why, &inbox),
                    },
                )
                .map_err(|e| e.to_string())?;
        }
        Ok(Handle {
            sh,
            inbox: Mutex::new(tx),
        })
    }

    fn send(&self, e: Event) -> bool {
        self.inbox
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .send(e)
            .is_ok()
    }

    /// Proposes `data`; the receiver yields what the state machine returned
    /// when it applied the entry, or why it did not.
    pub fn propose(&self, data: Vec<u8>) -> Receiver<Result<T, ReplError>> {
        self.propose_tagged(TAG_DATA, &data)
    }

    /// Proposes an event: every node's state machine handles it in log
    /// order ([`StateMachine::event`]); the receiver as for [`Self::propose`].
    pub fn propose_event(&self, data: &[u8]) -> Receiver<Result<T, ReplError>> {
        self.propose_tagged(TAG_EVENT, data)
    }

    fn propose_tagged(&self, tag: u8, data: &[u8]) -> Receiver<Result<T, ReplError>> {
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        if !self.is_leader() {
            let st = self.status();
            let e = match st.failed {
                Some(f) => ReplError::Stopped(f),
                None => ReplError::NotLeader(st.leader),
            };
            let _ = tx.send(Err(e));
            return rx;
        }
        let seq = self.sh.next_seq.fetch_add(1, Ordering::Relaxed);
        self.sh
            .waiters
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(seq, tx);
        let mut entry = Vec::with_capacity(data.len() + 1);
        entry.push(tag);
        entry.extend_from_slice(data);
        if !self.send(Event::Propose { seq, data: entry }) {
            fail(&self.sh, seq, ReplError::Stopped("node stopped".into()));
        }
        rx
    }

    /// A linearizable read's barrier (Raft's ReadIndex): the receiver
    /// yields once this node has confirmed with a quorum that it is still
    /// the leader and has applied everything committed when the read
    /// arrived; a read served after that sees every write acknowledged
    /// before it began. Reads arriving together share one confirmation.
    pub fn read_barrier(&self) -> Receiver<Result<(), ReplError>> {
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        if !self.is_leader() {
            let _ = tx.send(Err(ReplError::NotLeader(self.status().leader)));
            return rx;
        }
        let seq = self.sh.next_seq.fetch_add(1, Ordering::Relaxed);
        self.sh
            .reads
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(seq, tx);
        if !self.send(Event::Read(seq)) {
            fail_read(&self.sh, seq, ReplError::Stopped("node stopped".into()));
        }
        rx
    }

    /// Forgets a proposal whose proposer stopped waiting.
    pub fn abandon(&self, rx: Receiver<Result<T, ReplError>>) {
        drop(rx);
    }

    /// The node's state now.
    pub fn status(&self) -> Status {
        let mut st = self
            .sh
            .status
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        st.apply_lanes = self.sh.apply_lanes;
        st.applied_in_parallel = self.sh.applied_in_parallel.load(Ordering::Relaxed);
        st
    }

    /// Whether this node is the leader now (a relaxed load).
    pub fn is_leader(&self) -> bool {
        self.sh.leader.load(Ordering::Relaxed)
    }

    /// This node's id.
    pub fn id(&self) -> u64 {
        self.sh.id
    }

    /// Every member, this node included.
    pub fn peers(&self) -> Vec<Peer> {
        self.sh
            .peers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Proposes a membership change: `add` a member (a node started with
    /// `join`, which the leader then sends a snapshot), or remove member
    /// `remove`. The receiver yields once the change is committed and in
    /// force here. One change at a time (raft-rs refuses a second while
    /// one is pending).
    pub fn change(
        &self,
        add: Option<Peer>,
        remove: Option<u64>,
    ) -> Receiver<Result<(), ReplError>> {
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        if !self.is_leader() {
            let _ = tx.send(Err(ReplError::NotLeader(self.status().leader)));
            return rx;
        }
        let mut cc = ConfChange::default();
        match (add, remove) {
            (Some(p), _) => {
                cc.set_change_type(ConfChangeType::AddNode);
                cc.node_id = p.id;
                cc.context = p.spec().into_bytes().into();
            }
            (None, Some(id)) => {
                cc.set_change_type(ConfChangeType::RemoveNode);
                cc.node_id = id;
            }
            (None, None) => {
                let _ = tx.send(Ok(()));
                return rx;
            }
        }
        let seq = self.sh.next_seq.fetch_add(1, Ordering::Relaxed);
        self.sh
            .changes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(seq, tx);
        if !self.send(Event::Change { seq, cc }) {
            fail_change(&self.sh, seq, ReplError::Stopped("node stopped".into()));
        }
        rx
    }

    /// Asks this node to start an election now (tests, leader transfer).
    pub fn campaign(&self) {
        self.send(Event::Campaign);
    }

    /// Stops the node's threads (the process ends soon after).
    pub fn stop(&self) {
        self.sh.stop.store(true, Ordering::Relaxed);
        self.send(Event::Stop);
    }
}

/// Answers waiter `seq` of `map` with `r`, if it still waits.
fn answer<R>(
    map: &Mutex<HashMap<u64, SyncSender<Result<R, ReplError>>>>,
    seq: u64,
    r: Result<R, ReplError>,
) {
    if let Some(w) = map.lock().unwrap_or_else(|p| p.into_inner()).remove(&seq) {
        let _ = w.send(r);
    }
}

fn fail<T>(sh: &Shared<T>, seq: u64, e: ReplError) {
    answer(&sh.waiters, seq, Err(e));
}

fn fail_change<T>(sh: &Shared<T>, seq: u64, e: ReplError) {
    answer(&sh.changes, seq, Err(e));
}

fn fail_read<T>(sh: &Shared<T>, seq: u64, e: ReplError) {
    answer(&sh.reads, seq, Err(e));
}

/// Fails every proposal and read still waiting.
pub(crate) fn fail_all<T>(sh: &Shared<T>, e: &ReplError) {
    let reads: Vec<ReadWaiter> = sh
        .reads
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .drain()
        .map(|(_, w)| w)
        .collect();
    // A read did nothing: for it a lost leadership is "not the leader".
    let re = match e {
        ReplError::LeaderChanged => ReplError::NotLeader(None),
        e => e.clone(),
    };
    let changes: Vec<ReadWaiter> = sh
        .changes
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .drain()
        .map(|(_, w)| w)
        .collect();
    for w in reads.into_iter().chain(changes) {
        let _ = w.send(Err(re.clone()));
    }
    let all: Vec<Waiter<T>> = sh
        .waiters
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .drain()
        .map(|(_, w)| w)
        .collect();
    for w in all {
        let _ = w.send(Err(e.clone()));
    }
}

/// A snapshot sent to member `to`: raft-rs is told it was delivered at
/// `due` unless a transfer of its bytes is `running` then; one that fails
/// is reported at once.
struct SnapSent {
    to: u64,
    due: Instant,
    running: u32,
}

/// The snapshot a node receives (see [`Driver::snapshot_arrived`]).
enum Incoming {
    None,
    /// Its bytes are being fetched; its message is stepped once they are in.
    Fetching(SnapDesc, Box<Message>),
    /// Its bytes are in the received file, whole and checked.
    Received(SnapDesc),
}

/// How long after a `MsgSnapshot` is sent, or after its bytes were all
/// received, raft-rs is told it was delivered (unless a transfer runs).
const SNAPSHOT_REPORT: Duration = Duration::from_secs(1);

/// A follower's campaign after its leader's process was seen gone: at
/// `at`, unless a leader other than `dead` is known by then.
#[derive(Clone, Copy, Debug)]
struct Takeover {
    at: Instant,
    dead: u64,
    /// The term `at` was set in: another node's election since then moves
    /// `at` to half an election timeout after it.
    term: u64,
}

struct Driver<T> {
    node: RawNode<HeapStorage>,
    sh: Arc<Shared<T>>,
    net: Box<dyn crate::net::Net>,
    /// The time now (the wall clock; the simulated one in the simulation).
    clock: Box<dyn Fn() -> Instant>,
    /// Whether a snapshot's install ends with this process starting again
    /// on its heap (a server). When false (the simulation), the install
    /// sets `installed` instead, and the caller drops this driver and
    /// opens the node again.
    restart_process: bool,
    installed: bool,
    apply: Sender<ApplyMsg>,
    /// The install file (`NodeConfig::snapshot_file`), after which the
    /// other snapshot files are named.
    snap_file: Option<std::path::PathBuf>,
    /// A dump asked of the apply thread and not answered yet.
    dumping: bool,
    /// Dumps asked for (their files are numbered).
    dumps: u64,
    /// No dump asked before then (the last one failed).
    dump_after: Option<Instant>,
    /// Snapshots sent, until raft-rs is told how they went (it then probes
    /// the member again: entries if it installed it, another snapshot if
    /// not).
    snaps_sent: Vec<SnapSent>,
    /// The snapshot this node is receiving or has received.
    incoming: Incoming,
    tick: Duration,
    /// The index of this leader's first entry of its term: proposals wait
    /// until it is applied.
    term_start: Option<u64>,
    held: Vec<(u64, Vec<u8>)>,
    applied: u64,
    was_leader: bool,
    term: u64,
    /// Reads waiting for the next ReadIndex round.
    reads_new: Vec<u64>,
    /// Reads in a ReadIndex round, by the round's id.
    reads_sent: HashMap<u64, Vec<u64>>,
    /// Reads confirmed at a commit index, waiting for it to be applied.
    reads_ready: Vec<(u64, Vec<u64>)>,
    next_round: u64,
    /// At least 2: a compaction is an entry itself, and with 1 it would
    /// make the next one due, and so on: an idle cluster would append
    /// compactions forever, and a member restarting would be cut off
    /// again by the time it has installed its snapshot.
    compact_after: u64,
    /// Committed compaction entries not yet applied: (index, point).
    compactions: Vec<(u64, u64)>,
    /// The point of the compaction this leader proposed last.
    compaction_proposed: u64,
    /// A campaign due because the leader's process is gone (see
    /// [`Driver::leader_down`]).
    takeover: Option<Takeover>,
    /// Campaigns started by a takeover (the simulation counts them).
    takeovers: u64,
    /// The term when this driver opened the log.
    started_term: u64,
}

impl<T: Send + 'static> Driver<T> {
    fn open(
        cfg: NodeConfig,
        log_session: Box<dyn FnOnce() -> engine::Result<Box<dyn engine::Session>> + Send>,
        sh: Arc<Shared<T>>,
        apply: Sender<ApplyMsg>,
        inbox: Sender<Event>,
    ) -> Result<Driver<T>, String> {
        let stop = sh.stop.clone();
        Self::open_with(cfg, log_session, sh, apply, |others| {
            Box::new(crate::net::Transport::start(others, stop, inbox))
        })
    }

    /// [`Self::open`] with the transport `net` makes for the other members
    /// (id, raft address).
    fn open_with(
        cfg: NodeConfig,
        log_session: Box<dyn FnOnce() -> engine::Result<Box<dyn engine::Session>> + Send>,
        sh: Arc<Shared<T>>,
        apply: Sender<ApplyMsg>,
        net: impl FnOnce(&[(u64, String)]) -> Box<dyn crate::net::Net>,
    ) -> Result<Driver<T>, String> {
        let sess = log_session().map_err(|e| e.to_string())?;
        let voters: Vec<u64> = if cfg.join {
            Vec::new()
        } else {
            cfg.peers.iter().map(|p| p.id).collect()
        };
        let mut store = HeapStorage::open_with(sess, &voters, cfg.snapshot_file.clone())
            .map_err(|e| e.to_string())?;
        // Members added or removed online are known from the log's own
        // record; `--peers` names this node's address and the first ones.
        let mut peers = cfg.peers.clone();
        if let Some(saved) = store.peers().map_err(|e| e.to_string())? {
            let saved = parse_peers(&saved)?;
            for p in &mut peers {
                if let Some(s) = saved.iter().find(|s| s.id == p.id) {
                    *p = s.clone();
                }
            }
            for s in saved {
                if !peers.iter().any(|p| p.id == s.id) {
                    peers.push(s);
                }
            }
        }
        let cs = store.conf_state();
        if !cs.voters.is_empty() || !cs.learners.is_empty() {
            peers.retain(|p| {
                p.id == cfg.id || cs.voters.contains(&p.id) || cs.learners.contains(&p.id)
            });
        }
        *sh.peers.lock().unwrap_or_else(|p| p.into_inner()) = peers.clone();
        let applied = read_applied(store.session()).map_err(|e| e.to_string())?;
        // Entries are applied only once committed, so a commit index
        // persisted behind the applied one (a heap written before the hard
        // state was persisted first) is raised to it.
        store.raise_commit(applied).map_err(|e| e.to_string())?;
        let rc = Config {
            id: cfg.id,
            election_tick: cfg.election_ticks,
            heartbeat_tick: cfg.heartbeat_ticks,
            applied,
            max_size_per_msg: 1 << 20,
            max_inflight_msgs: 256,
            check_quorum: true,
            pre_vote: true,
            ..Config::default()
        };
        rc.validate().map_err(|e| e.to_string())?;
        let logger = slog::Logger::root(slog::Discard, slog::o!());
        let node = RawNode::new(&rc, store, &logger).map_err(|e| e.to_string())?;
        let others: Vec<(u64, String)> = peers
            .iter()
            .filter(|p| p.id != cfg.id)
            .map(|p| (p.id, p.raft_addr.clone()))
            .collect();
        let net = net(&others);
        sh.applied.store(applied, Ordering::Release);
        let started_term = node.raft.term;
        Ok(Driver {
            node,
            sh,
            net,
            clock: Box::new(Instant::now),
            restart_process: true,
            installed: false,
            apply,
            snap_file: cfg.snapshot_file.clone(),
            dumping: false,
            dumps: 0,
            dump_after: None,
            snaps_sent: Vec::new(),
            incoming: Incoming::None,
            tick: cfg.tick,
            term_start: None,
            held: Vec::new(),
            applied,
            was_leader: false,
            term: 0,
            reads_new: Vec::new(),
            reads_sent: HashMap::new(),
            reads_ready: Vec::new(),
            next_round: 1,
            compact_after: cfg.compact_after.max(2),
            compactions: Vec::new(),
            compaction_proposed: 0,
            started_term,
            takeover: None,
            takeovers: 0,
        })
    }

    fn run(&mut self, rx: &Receiver<Event>) {
        let mut next_tick = Instant::now() + self.tick;
        loop {
            let now = Instant::now();
            let wait = next_tick.saturating_duration_since(now);
            match rx.recv_timeout(wait) {
                Ok(ev) => {
                    if !self.handle(ev) {
                        return;
                    }
                    // Take what else arrived before handling the Ready, so
                    // one persist covers many proposals.
                    for ev in rx.try_iter().take(4096) {
                        if !self.handle(ev) {
                            return;
                        }
                    }
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => return,
            }
            self.snapshot_work();
            let tick = Instant::now() >= next_tick;
            if tick {
                next_tick += self.tick;
                if next_tick < Instant::now() {
                    next_tick = Instant::now() + self.tick;
                }
            }
            if !self.turn(tick) {
                return;
            }
        }
    }

    /// What follows the events handled: a tick if `tick` (and a compaction
    /// proposed when due), a ReadIndex round for the reads waiting, the
    /// Ready, and the bookkeeping of the role. False when the node is to
    /// stop (or, in the simulation, to be opened again after a snapshot's
    /// install). The caller does the snapshot chores first.
    fn turn(&mut self, tick: bool) -> bool {
        self.maybe_take_over();
        if tick {
            self.maybe_propose_compaction();
            self.node.tick();
        }
        // raft-rs drops a ReadIndex (silently) at a leader that has not
        // committed an entry of its term yet: reads wait for that.
        if !self.reads_new.is_empty()
            && self.node.raft.state == StateRole::Leader
            && self.node.raft.commit_to_current_term()
        {
            let id = self.next_round;
            self.next_round += 1;
            self.reads_sent
                .insert(id, std::mem::take(&mut self.reads_new));
            self.node.read_index(id.to_le_bytes().to_vec());
        }
        if let Err(e) = self.on_ready() {
            self.halt(e);
            return false;
        }
        if self.installed {
            return false;
        }
        self.after_role();
        self.release_reads();
        true
    }

    /// False when the node is to stop.
    fn handle(&mut self, ev: Event) -> bool {
        match ev {
            // A message for another node, relayed through this one by a
            // member that has no address for it (see `Transport::send`).
            Event::Message(m) if m.to != self.sh.id => self.net.forward(*m),
            Event::Message(m) if m.get_msg_type() == MessageType::MsgSnapshot => {
                self.snapshot_arrived(m);
            }
            Event::Fetched { desc, ok } => self.fetched(&desc, ok),
            Event::Transfer { to, done } => self.transfer(to, done),
            Event::Message(m) => {
                let _ = self.node.step(*m);
            }
            Event::Propose { seq, data } => {
                self.note_term();
                if self.node.raft.state != StateRole::Leader {
                    fail(&self.sh, seq, ReplError::NotLeader(self.leader()));
                } else if self.term_start.is_some_and(|s| self.applied < s) {
                    self.held.push((seq, data));
                } else {
                    self.propose(seq, data);
                }
            }
            Event::Applied(i) => {
                if i > self.applied {
                    self.applied = i;
                    self.node.advance_apply_to(i);
                }
                if let Err(e) = self.compact_applied() {
                    self.halt(e);
                    return false;
                }
                if self.term_start.is_some_and(|s| self.applied >= s) && !self.held.is_empty() {
                    for (seq, data) in std::mem::take(&mut self.held) {
                        self.propose(seq, data);
                    }
                }
            }
            Event::Read(seq) => {
                if self.node.raft.state == StateRole::Leader {
                    self.reads_new.push(seq);
                } else {
                    fail_read(&self.sh, seq, ReplError::NotLeader(self.leader()));
                }
            }
            Event::Campaign => {
                let _ = self.node.campaign();
            }
            Event::PeerGone(ids) => {
                let l = self.node.raft.leader_id;
                if self.node.raft.state == StateRole::Follower && ids.contains(&l) {
                    self.net.probe(l);
                }
            }
            Event::PeerDown(id) => self.leader_down(id),
            Event::Change { seq, cc } => {
                let first = self.node.store().range().0;
                if self.node.raft.state != StateRole::Leader {
                    fail_change(&self.sh, seq, ReplError::NotLeader(self.leader()));
                } else if cc.get_change_type() == ConfChangeType::AddNode && first <= 1 {
                    // A new member must start from a snapshot (the log's
                    // start holds no record of the first configuration).
                    fail_change(
                        &self.sh,
                        seq,
                        ReplError::Stopped(
                            "the log is not compacted yet; try again shortly".into(),
                        ),
                    );
                } else if self.node.raft.has_pending_conf() {
                    // raft-rs would take the proposal and append an empty
                    // entry in its place (a change not yet applied, or a
                    // new leader that has not applied its log yet): the
                    // waiter would never be answered.
                    fail_change(
                        &self.sh,
                        seq,
                        ReplError::Stopped(
                            "a membership change is pending; try again shortly".into(),
                        ),
                    );
                } else if let Err(e) = self
                    .node
                    .propose_conf_change(ctx_bytes(self.sh.id, seq), cc)
                {
                    fail_change(
                        &self.sh,
                        seq,
                        ReplError::Stopped(format!("membership change refused: {e}")),
                    );
                }
            }
            Event::Dumped { index, data } => {
                self.dumping = false;
                match data {
                    Ok(file) => self.offer_snapshot(index, file),
                    Err(e) => {
                        // A full disk, say: the leader goes on without.
                        eprintln!("ember: making a snapshot: {e}; trying again in 10 s");
                        self.dump_after = Some((self.clock)() + Duration::from_secs(10));
                    }
                }
            }
            Event::Stop => return false,
        }
        true
    }

    fn propose(&mut self, seq: u64, data: Vec<u8>) {
        if self.node.propose(ctx_bytes(self.sh.id, seq), data).is_err() {
            fail(&self.sh, seq, ReplError::NotLeader(self.leader()));
        }
    }

    fn leader(&self) -> Option<u64> {
        let l = self.node.raft.leader_id;
        (l != raft::INVALID_ID).then_some(l)
    }

    fn on_ready(&mut self) -> Result<(), String> {
        if !self.node.has_ready() {
            return Ok(());
        }
        let mut rd = self.node.ready();
        if !rd.snapshot().is_empty() {
            // The leader's snapshot: this node's keyspace and log are
            // replaced, then the process starts again on them (its DRAM
            // state, key counts and TTL index, is rebuilt by the restart).
            let _hold = self.sh.apply_lock.lock().unwrap_or_else(|p| p.into_inner());
            let snap = rd.snapshot().clone();
            self.node
                .mut_store()
                .install(&snap, rd.hs())
                .map_err(|e| format!("installing a snapshot: {e}"))?;
            // Still holding the apply thread: entries queued for it are
            // covered by the snapshot and must not be applied on top.
            if !self.restart_process {
                self.installed = true;
                return Ok(());
            }
            let why = restart_process();
            eprintln!("ember: {why}; exiting (the next start resumes from the heap)");
            std::process::exit(1);
        }
        for m in rd.take_messages() {
            self.note_sent(&m);
            self.net.send(m);
        }
        for rs in rd.take_read_states() {
            let id = rs
                .request_ctx
                .as_slice()
                .try_into()
                .map(u64::from_le_bytes)
                .unwrap_or(0);
            if let Some(seqs) = self.reads_sent.remove(&id) {
                self.reads_ready.push((rs.index, seqs));
            }
        }
        // New entries (with the hard state) are persisted before anything
        // is applied or acknowledged. A Ready that only moves the hard state
        // (a new commit index, the usual second Ready of a write at the
        // leader) hands its committed entries to the apply thread first and
        // persists the commit index while they apply: one device flush
        // fewer on a write's path under msync. An applied index durable
        // ahead of the persisted commit index (which raft-rs refuses at
        // start) is raised at the next start (`Node::start`:
        // `raise_commit`): an applied entry was committed, and it is in the
        // log.
        let entries_first = !rd.entries().is_empty();
        if entries_first {
            self.node
                .mut_store()
                .persist(rd.entries(), rd.hs())
                .map_err(|e| e.to_string())?;
        }
        let mut committed = rd.take_committed_entries();
        self.forget_old_proposals(&mut committed);
        self.on_committed(&committed)?;
        if !committed.is_empty() {
            self.apply
                .send(ApplyMsg::Entries(committed))
                .map_err(|_| "apply thread ended")?;
        }
        if !entries_first {
            self.node
                .mut_store()
                .persist(&[], rd.hs())
                .map_err(|e| e.to_string())?;
        }
        for m in rd.take_persisted_messages() {
            self.note_sent(&m);
            self.net.send(m);
        }
        // The apply thread reports what it applied (Event::Applied):
        // raft-rs is told then, not here.
        let mut light = self.node.advance_append(rd);
        for m in light.take_messages() {
            self.note_sent(&m);
            self.net.send(m);
        }
        let mut committed = light.take_committed_entries();
        self.forget_old_proposals(&mut committed);
        self.on_committed(&committed)?;
        if !committed.is_empty() {
            self.apply
                .send(ApplyMsg::Entries(committed))
                .map_err(|_| "apply thread ended")?;
        }
        // As above: the commit index is persisted while its entries apply.
        if let Some(c) = light.commit_index() {
            self.node
                .mut_store()
                .commit_to(c)
                .map_err(|e| e.to_string())?;
        }
        Ok(())
    }

    /// Clears the proposer's context of the committed entries that this
    /// node proposed before it last started. Their proposers are gone, and
    /// the sequence numbers start again at 1 at each start: a waiter of
    /// this run with the same number would be answered with the result of
    /// that other write (and its proposer would do the bookkeeping of it).
    /// This run proposes only as the leader of terms after the one it
    /// started in (a term a node led is persisted before it could lead).
    fn forget_old_proposals(&self, ents: &mut [Entry]) {
        for e in ents {
            if e.term <= self.started_term
                && parse_ctx(&e.context).is_some_and(|(id, _)| id == self.sh.id)
            {
                e.context = Default::default();
            }
        }
    }

    /// Notes a snapshot sent: raft-rs waits for its delivery report.
    fn note_sent(&mut self, m: &Message) {
        if m.get_msg_type() == MessageType::MsgSnapshot {
            self.snaps_sent.retain(|s| s.to != m.to);
            self.snaps_sent.push(SnapSent {
                to: m.to,
                due: (self.clock)() + SNAPSHOT_REPORT,
                running: 0,
            });
        }
    }

    /// A transfer of the offered snapshot's bytes to member `to` started
    /// (`done` None) or ended: raft-rs is told at once of a failure (it
    /// probes the member again, which is then sent a snapshot again), and
    /// of a success a moment later (time for the member to install it).
    fn transfer(&mut self, to: u64, done: Option<bool>) {
        let now = (self.clock)();
        let Some(at) = self.snaps_sent.iter().position(|s| s.to == to) else {
            return;
        };
        let s = &mut self.snaps_sent[at];
        match done {
            None => s.running += 1,
            Some(ok) => {
                s.running = s.running.saturating_sub(1);
                if ok {
                    s.due = now + SNAPSHOT_REPORT;
                } else if s.running == 0 {
                    self.snaps_sent.remove(at);
                    self.node.report_snapshot(to, SnapshotStatus::Failure);
                }
            }
        }
    }

    /// A `MsgSnapshot` for this node. raft-rs gets it only once its bytes
    /// are here, whole and checked (in the received file), unless raft-rs
    /// would not restore it anyway (an older term, an index below the
    /// commit index or one the log already has): the first time, the
    /// bytes are fetched from the node the descriptor names ([`Net::fetch`],
    /// one snapshot at a time) and the message is stepped when they are
    /// in; a copy arriving meanwhile replaces the one held; others are
    /// dropped (the leader sends again).
    fn snapshot_arrived(&mut self, m: Box<Message>) {
        let meta = m.get_snapshot().get_metadata();
        let r = &self.node.raft;
        if m.term < r.term
            || meta.index < r.raft_log.committed
            || r.raft_log.match_term(meta.index, meta.term)
        {
            let _ = self.node.step(*m);
            return;
        }
        let (Some(file), Some(desc)) = (
            self.snap_file.as_ref(),
            SnapDesc::decode(&m.get_snapshot().data),
        ) else {
            return;
        };
        match &mut self.incoming {
            Incoming::Received(d) if d.same_bytes(&desc) => {
                let _ = self.node.step(*m);
            }
            Incoming::Fetching(d, held) if d.same_bytes(&desc) => *held = m,
            Incoming::Fetching(..) => {}
            // raft-rs holds a snapshot restored from the received file,
            // which its install reads next: a fetch must not replace it.
            _ if self.node.raft.raft_log.unstable.snapshot.is_some() => {}
            _ => {
                let f = crate::net::Fetch {
                    me: self.sh.id,
                    desc: desc.clone(),
                    part: crate::storage::part_path(file),
                    dest: crate::storage::recv_path(file),
                };
                self.incoming = Incoming::Fetching(desc, m);
                self.net.fetch(f);
            }
        }
    }

    /// A fetch ended: its snapshot's message is stepped if its bytes are
    /// in (raft-rs installs it in the next Ready).
    fn fetched(&mut self, desc: &SnapDesc, ok: Result<(), String>) {
        match std::mem::replace(&mut self.incoming, Incoming::None) {
            Incoming::Fetching(d, m) if d.same_bytes(desc) => {
                if ok.is_ok() {
                    self.incoming = Incoming::Received(d);
                    let _ = self.node.step(*m);
                }
            }
            other => self.incoming = other,
        }
    }

    /// Snapshot chores: asks the apply thread for a dump when a member
    /// needs a snapshot, withdraws an offer no longer of use (this node
    /// no longer leads, or its log moved past it), and reports sent
    /// snapshots as delivered once their time is up.
    fn snapshot_work(&mut self) {
        let now = (self.clock)();
        let leader = self.node.raft.state == StateRole::Leader;
        if let Some((i, _)) = self.node.store().offered() {
            if !leader || i + 1 < self.node.store().range().0 {
                self.node.mut_store().drop_offer();
            }
        }
        if let Some(file) = &self.snap_file {
            if !self.dumping
                && leader
                && self.node.store().snapshot_wanted() > 0
                && self.dump_after.is_none_or(|t| t <= now)
            {
                self.dumps += 1;
                let path = crate::storage::dump_path(file, self.dumps);
                if self.apply.send(ApplyMsg::Dump(path)).is_ok() {
                    self.dumping = true;
                }
            }
        }
        if self.snaps_sent.is_empty() {
            return;
        }
        let mut due = Vec::new();
        self.snaps_sent.retain(|s| {
            if s.running == 0 && s.due <= now {
                due.push(s.to);
                false
            } else {
                true
            }
        });
        for to in due {
            self.node.report_snapshot(to, SnapshotStatus::Finish);
        }
    }

    /// Offers a snapshot of the dump made at applied index `index` (its
    /// bytes in `file`), with its term and the configuration (when the log
    /// still knows the term; otherwise the next request makes another).
    fn offer_snapshot(&mut self, index: u64, file: DumpFile) {
        let Some(term) = self.node.store().term_of(index).filter(|_| index > 0) else {
            let _ = std::fs::remove_file(&file.path);
            return;
        };
        // The members' addresses travel with the keyspace; the members
        // fetch its bytes from this node's Raft address.
        let (peers, source) = {
            let p = self.sh.peers.lock().unwrap_or_else(|p| p.into_inner());
            let source = p
                .iter()
                .find(|p| p.id == self.sh.id)
                .map(|p| p.raft_addr.clone())
                .unwrap_or_default();
            (peers_spec(&p), source)
        };
        let desc = SnapDesc {
            index,
            len: file.len,
            crc: file.crc,
            source,
            peers,
        };
        let mut snap = Snapshot {
            data: desc.encode().into(),
            ..Default::default()
        };
        let meta = snap.mut_metadata();
        meta.index = index;
        meta.term = term;
        meta.set_conf_state(self.node.store().conf_state());
        self.node.mut_store().offer_snapshot(snap, file);
    }

    /// Committed entries' effects on the node itself: compaction points,
    /// and membership changes, put in force here (the configuration and
    /// the members' addresses persisted, the transport told).
    fn on_committed(&mut self, ents: &[Entry]) -> Result<(), String> {
        self.note_compactions(ents);
        for e in ents {
            if e.get_entry_type() != EntryType::EntryConfChange {
                continue;
            }
            let Ok(cc) = ConfChange::parse_from_bytes(&e.data) else {
                return Err(format!("entry {} is not a configuration change", e.index));
            };
            let cs = self
                .node
                .apply_conf_change(&cc)
                .map_err(|err| format!("configuration change {}: {err}", e.index))?;
            let mut peers = self
                .sh
                .peers
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone();
            match cc.get_change_type() {
                ConfChangeType::AddNode | ConfChangeType::AddLearnerNode => {
                    let spec = String::from_utf8_lossy(&cc.context).into_owned();
                    if let Ok(p) = parse_peers(&spec) {
                        for p in p {
                            peers.retain(|o| o.id != p.id);
                            if p.id != self.sh.id {
                                self.net.add(p.id, &p.raft_addr);
                            }
                            peers.push(p);
                        }
                    }
                }
                ConfChangeType::RemoveNode => {
                    if cc.node_id != self.sh.id {
                        peers.retain(|o| o.id != cc.node_id);
                        self.net.remove(cc.node_id);
                    } else if self.node.raft.state == StateRole::Leader {
                        // This leader removed itself (the change was
                        // proposed by an earlier leader). raft-rs leaves it
                        // leading without its own progress, and its next
                        // commit check panics: it steps down (the others
                        // elect a leader; it cannot campaign any more).
                        let term = self.node.raft.term;
                        self.node.raft.become_follower(term, raft::INVALID_ID);
                    }
                }
            }
            peers.sort_by_key(|p| p.id);
            self.node
                .mut_store()
                .set_conf(&cs, &peers_spec(&peers))
                .map_err(|err| err.to_string())?;
            *self.sh.peers.lock().unwrap_or_else(|p| p.into_inner()) = peers;
            if let Some((id, seq)) = parse_ctx(&e.context) {
                if id == self.sh.id {
                    answer(&self.sh.changes, seq, Ok(()));
                }
            }
        }
        Ok(())
    }

    /// The process of `dead`, this follower's leader, is gone (its Raft
    /// port refuses connections after its connection here ended): instead
    /// of waiting out the election timeout (50-100 ms by default), the
    /// followers campaign at once, one after the other in the order of
    /// their ids (rank `r` waits `r` half election timeouts, so that two
    /// do not split the vote), each only while no other leader is known.
    ///
    /// The campaign is a leader transfer's (`MsgTimeoutNow`, as if `dead`
    /// had handed over): no pre-vote, and voters grant it although they
    /// heard from `dead` within the election timeout (raft-rs ignores
    /// ordinary vote requests then, check-quorum's lease). Safety does not
    /// rest on the probe: a vote is still granted once per term and only
    /// to a log as up to date as the voter's, so a wrong "gone" (a leader
    /// that is alive) costs at most a needless election.
    fn leader_down(&mut self, dead: u64) {
        let r = &self.node.raft;
        if r.state != StateRole::Follower || r.leader_id != dead {
            return;
        }
        let mut others: Vec<u64> = r
            .prs()
            .conf()
            .voters()
            .ids()
            .iter()
            .filter(|&v| v != dead)
            .collect();
        others.sort_unstable();
        let Some(rank) = others.iter().position(|&v| v == self.sh.id) else {
            return; // a learner, or not a member
        };
        let at = (self.clock)() + self.half_election() * rank as u32;
        self.takeover = Some(Takeover {
            at,
            dead,
            term: r.term,
        });
        self.maybe_take_over();
    }

    /// Half the election timeout.
    fn half_election(&self) -> Duration {
        self.tick * (self.node.raft.election_timeout() as u32) / 2
    }

    /// Starts the campaign of a takeover that is due (see
    /// [`Driver::leader_down`]).
    fn maybe_take_over(&mut self) {
        let Some(mut t) = self.takeover else {
            return;
        };
        let r = &self.node.raft;
        let known = r.leader_id != raft::INVALID_ID && r.leader_id != t.dead;
        if r.state != StateRole::Follower || known {
            self.takeover = None;
            return;
        }
        let now = (self.clock)();
        if r.term != t.term {
            // Another node campaigns (this one may have voted for it): it
            // gets half an election timeout to win and be heard from.
            t.term = r.term;
            t.at = t.at.max(now + self.half_election());
            self.takeover = Some(t);
            return;
        }
        if now < t.at {
            return;
        }
        self.takeover = None;
        self.takeovers += 1;
        let mut m = Message::default();
        m.set_msg_type(MessageType::MsgTimeoutNow);
        m.from = t.dead;
        m.to = self.sh.id;
        m.term = r.term;
        let _ = self.node.step(m);
    }

    /// Notes a change of role or term: a new leader's first entry of its
    /// term (proposals wait for it to apply); a lost leadership fails the
    /// proposals still waiting.
    fn after_role(&mut self) {
        self.note_term();
        let r = &self.node.raft;
        let leader = r.state == StateRole::Leader;
        if !leader {
            self.term_start = None;
            for (seq, _) in std::mem::take(&mut self.held) {
                fail(&self.sh, seq, ReplError::NotLeader(self.leader()));
            }
            if self.was_leader {
                fail_all(&self.sh, &ReplError::LeaderChanged);
            }
            let leader = self.leader();
            for s in std::mem::take(&mut self.reads_new)
                .into_iter()
                .chain(self.reads_sent.drain().flat_map(|(_, v)| v))
                .chain(self.reads_ready.drain(..).flat_map(|(_, v)| v))
            {
                fail_read(&self.sh, s, ReplError::NotLeader(leader));
            }
        }
        self.was_leader = leader;
        self.term = r.term;
        let matched = if leader {
            r.prs()
                .iter()
                .filter(|(id, _)| **id != self.sh.id)
                .map(|(id, p)| (*id, p.matched))
                .collect()
        } else {
            Vec::new()
        };
        self.sh.leader.store(leader, Ordering::Relaxed);
        let mut st = self.sh.status.lock().unwrap_or_else(|p| p.into_inner());
        st.leader = self.leader();
        // Writes are taken only once the term's first entry is applied.
        st.is_leader = leader;
        st.term = r.term;
        st.commit = r.raft_log.committed;
        st.applied = self.sh.applied.load(Ordering::Acquire);
        st.last_index = r.raft_log.last_index();
        st.first_index = self.node.store().range().0;
        st.matched = matched;
    }

    /// Remembers the committed compaction entries in `ents`.
    fn note_compactions(&mut self, ents: &[Entry]) {
        for e in ents {
            if e.get_entry_type() == EntryType::EntryNormal && e.data.first() == Some(&TAG_COMPACT)
            {
                if let Ok(b) = <[u8; 8]>::try_from(&e.data[1..]) {
                    self.compactions.push((e.index, u64::from_le_bytes(b)));
                }
            }
        }
    }

    /// Drops the log's entries below the points of the compaction entries
    /// applied so far (never past the applied index).
    fn compact_applied(&mut self) -> Result<(), String> {
        let applied = self.applied;
        let mut to = 0;
        self.compactions.retain(|&(index, point)| {
            if index <= applied {
                to = to.max(point.min(applied));
                false
            } else {
                true
            }
        });
        if to > 0 {
            self.node
                .mut_store()
                .compact(to)
                .map_err(|e| e.to_string())?;
        }
        Ok(())
    }

    /// At the leader: proposes a compaction when `compact_after` applied
    /// entries lie below every member's matched index, or below this
    /// node's applied index less `compact_after` (a member further behind
    /// is sent a snapshot). The log's first entries go as soon as they are
    /// applied: a member joining later must start from a snapshot, which
    /// carries the configuration (the log does not record the first one).
    fn maybe_propose_compaction(&mut self) {
        let r = &self.node.raft;
        if r.state != StateRole::Leader || self.term_start.is_some_and(|s| self.applied < s) {
            return;
        }
        let matched = r.prs().iter().map(|(_, p)| p.matched).min().unwrap_or(0);
        // A member being sent a snapshot needs the entries after it once
        // installed: the log keeps them while the transfer lasts.
        let hold = r
            .prs()
            .iter()
            .filter(|(_, p)| p.state == ProgressState::Snapshot)
            .map(|(_, p)| p.pending_snapshot + 1)
            .min()
            .unwrap_or(u64::MAX);
        let keep = self.applied.saturating_sub(self.compact_after);
        let first = self.node.store().range().0;
        let (point, due) = if first <= 1 {
            // Once the members have entry 2 (or one is far behind): a
            // member that has not got entry 1 yet would need a snapshot.
            let p = matched.max(keep).min(self.applied).min(2);
            (p, p >= 2)
        } else {
            // Counted from the point proposed last, which the log's start
            // reaches only once that entry is applied: from the start, a
            // compaction's own entry (applied) would make the next due
            // before the first is applied, and so on, on an idle cluster.
            let p = matched.max(keep).min(self.applied).min(hold);
            (
                p,
                p >= first.max(self.compaction_proposed) + self.compact_after,
            )
        };
        if !due || point <= self.compaction_proposed {
            return;
        }
        let mut data = vec![TAG_COMPACT];
        data.extend_from_slice(&point.to_le_bytes());
        if self.node.propose(Vec::new(), data).is_ok() {
            self.compaction_proposed = point;
        }
    }

    /// Answers the reads whose ReadIndex is applied now.
    fn release_reads(&mut self) {
        if self.reads_ready.is_empty() {
            return;
        }
        let applied = self.applied;
        let mut reads = self.sh.reads.lock().unwrap_or_else(|p| p.into_inner());
        self.reads_ready.retain(|(index, seqs)| {
            if *index > applied {
                return true;
            }
            for s in seqs {
                if let Some(w) = reads.remove(s) {
                    let _ = w.send(Ok(()));
                }
            }
            false
        });
    }

    /// On becoming leader (or a new term as leader): the term's first
    /// entry, which proposals wait to see applied.
    fn note_term(&mut self) {
        let r = &self.node.raft;
        if r.state == StateRole::Leader && (!self.was_leader || r.term != self.term) {
            self.term_start = Some(r.raft_log.last_index());
            self.was_leader = true;
            self.term = r.term;
        }
    }

    fn halt(&mut self, why: String) {
        self.sh.leader.store(false, Ordering::Relaxed);
        self.sh
            .status
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .failed = Some(why.clone());
        fail_all(&self.sh, &ReplError::Stopped(why));
    }
}

/// Starts this process again with the same arguments (after a snapshot's
/// install: the server's DRAM state is rebuilt from the heap, as after any
/// restart). Returns only on failure, with why.
fn restart_process() -> String {
    use std::os::unix::process::CommandExt;
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => return format!("restarting after a snapshot: {e}"),
    };
    let err = std::process::Command::new(exe)
        .args(std::env::args_os().skip(1))
        .exec();
    format!("restarting after a snapshot: {err}")
}

#[cfg(test)]
mod sim;
