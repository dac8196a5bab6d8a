//! A deterministic simulation of the replication glue (issue 36): the
//! raft thread's [`Driver`] and its [`HeapStorage`] log, driven without
//! threads, sockets or wall clock.
//!
//! Each node's log and keyspace live in a real heap (a small file in a
//! temporary directory). The simulation calls what the raft thread's loop
//! calls (`handle`, `snapshot_work`, `turn`) with a simulated clock, routes
//! the messages the drivers send through a simulated network, and plays
//! the apply thread itself: a small state machine that applies committed
//! entries in order over a store session (persisting the applied index in
//! each entry's batch, as the server's does), answers the proposers and
//! reports `Applied`. One seeded RNG decides everything else: message
//! loss, delay (and so reordering), duplication, partitions (cut and
//! healed), crashes and restarts of nodes (the leader too), how far the
//! apply thread lags, client proposals and reads, the compaction setting
//! (small: compaction is frequent, and a node that falls behind needs a
//! snapshot), and raft-rs's election timeouts (it draws them from
//! `thread_rng`; the simulation sets them again from its RNG).
//!
//! A crash drops the node's driver, apply queue and messages in flight
//! from and to it, and reopens the heap as it is (a process crash: what
//! was written stays; a power loss is not modelled here). A snapshot's
//! install ends with the node opened again from its heap, as the server's
//! restart does. A snapshot's bytes are dumped to a file by the simulated
//! apply thread, as the server's, and fetched in chunks (a few bytes to a
//! few hundred: many chunks) through the simulated network: a fetch takes
//! a few steps, and fails when either node crashes meanwhile, a link
//! between them is cut, or by chance (a connection lost); now and then a
//! chunk arrives damaged, which the receiver's check must refuse.
//!
//! Checked after every step: at most one leader per term; every node
//! applies entry `i` with the same data and the same state before it (a
//! hash chain over every entry applied, kept in the keyspace, so it
//! travels in snapshots); a node applies index `i` only right after
//! `i - 1` (never twice, across restarts and installs); an acknowledged
//! proposal is the entry at the index it was acknowledged with; a read
//! passes only once its node has applied every write acknowledged before
//! it began; the persisted commit index never goes back (across restarts
//! too); the log never drops an entry its node has not applied. At the
//! end the network heals, every node restarts, and all must converge: the
//! same applied index and keyspace everywhere, every acknowledged write in,
//! and an idle cluster must go quiet.
//!
//! In half the seeds (`EMBER_SIM_MEMBERSHIP=1`: all, `=0`: none) the
//! leader is also asked to add nodes (started to join: a snapshot brings
//! them in) and to remove members (not itself; a removal may still commit
//! under the member removed, if it leads by then).
//!
//! Found so far (fixed): a restarted node answering a new write's waiter
//! with the result of an entry it proposed before the restart; a
//! membership change silently dropped by raft-rs and never answered;
//! compactions feeding themselves on an idle cluster; a leader applying
//! its own removal panicking in raft-rs; a member whose configuration
//! predates the addition of the node that now leads having no address for
//! it, so that it could not answer it and stayed behind for good (it now
//! answers through its peers, which forward).
//!
//! `EMBER_SIM_SEEDS=N` runs N seeds (default 200) from
//! `EMBER_SIM_FIRST_SEED` (default 1), `EMBER_SIM_SEED=S` only seed S,
//! `EMBER_SIM_STEPS=K` K chaotic steps per seed; a failure names its seed
//! and prints the run's last events and each node's state
//! (`EMBER_SIM_KEEP_GOING=1`: every seed runs, and the failures are
//! listed).

use super::*;
use crate::net::Fetch;
use crate::storage::{dump, dump_to, open_offered, write_dump, SnapDesc, SnapSink, APPLIED_KEY};
use engine::direct::DirectStore;
use engine::{Session, Store, WriteBatch};
use pmem::{Geometry, Heap, HeapOptions, Strategy};
use raft::Storage as _;
use rand::rngs::SmallRng;
use rand::seq::SliceRandom;
use rand::{RngExt, SeedableRng};
use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::hash::{Hash, Hasher};
use std::rc::Rc;
use std::sync::mpsc::TryRecvError;

const TICK_MS: u64 = 10;
const ELECTION_TICKS: usize = 10;
const HEARTBEAT_TICKS: usize = 2;
/// The model's hash chain over every entry applied (u64 LE).
const CHAIN_KEY: &[u8] = b"chain";

fn heap_opts() -> HeapOptions {
    HeapOptions {
        size: 4 << 20,
        max_size: 64 << 20,
        reserve: 64 << 20,
        geometry: Geometry {
            nslots: 8,
            ..Geometry::small()
        },
        strategy: Strategy::FenceOnly,
        ..Default::default()
    }
}

fn chain(prev: u64, index: u64, data: &[u8]) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (prev, index, data).hash(&mut h);
    h.finish()
}

/// The simulated apply thread's state machine: each entry's data put under
/// one of a few keys, the hash chain, and the applied index, in one batch.
struct Model {
    sess: Box<dyn Session>,
    /// The applied index persisted.
    applied: u64,
    chain: u64,
}

impl Model {
    fn open(store: &DirectStore) -> Result<Model, String> {
        let mut sess: Box<dyn Session> = Box::new(store.session().map_err(|e| e.to_string())?);
        let applied = read_applied(&mut *sess).map_err(|e| e.to_string())?;
        let mut v = Vec::new();
        let chain = if sess.get(CHAIN_KEY, &mut v).map_err(|e| e.to_string())? {
            u64::from_le_bytes(v.as_slice().try_into().map_err(|_| "chain key")?)
        } else {
            0
        };
        Ok(Model {
            sess,
            applied,
            chain,
        })
    }

    /// Applies entry `index` (`raw`: its whole data; `data`: a proposer's
    /// data, if it has any) and returns the chain after it.
    fn apply(&mut self, index: u64, raw: &[u8], data: Option<&[u8]>) -> Result<u64, String> {
        if index != self.applied + 1 {
            return Err(format!(
                "applies entry {index} with entry {} applied last",
                self.applied
            ));
        }
        let c = chain(self.chain, index, raw);
        let mut b = WriteBatch::new();
        if let Some(d) = data {
            let key = format!("k{}", d.len() % 5 + d.last().map_or(0, |&x| x as usize % 3));
            b.put(key.as_bytes(), d);
        }
        b.put(CHAIN_KEY, &c.to_le_bytes());
        b.put(APPLIED_KEY, &index.to_le_bytes());
        self.sess
            .apply_batch(&b, &mut Vec::new())
            .map_err(|e| e.to_string())?;
        self.applied = index;
        self.chain = c;
        Ok(c)
    }
}

/// A message on its way: (sending node, receiving node, message); the
/// receiving node is not the message's recipient when it relays it.
type Hop = (u64, u64, Message);

/// The simulated network's end in a driver: what it sends goes to the
/// simulation's outbox, as the TCP transport sends it (a recipient with no
/// address here gets it through every peer, which forward it).
struct SimNet {
    me: u64,
    out: Rc<RefCell<Vec<Hop>>>,
    peers: BTreeSet<u64>,
    /// Fetches of snapshots' bytes asked for: (node, fetch).
    fetches: Rc<RefCell<Vec<(u64, Fetch)>>>,
    /// Probes asked for: (node, peer probed).
    probes: Rc<RefCell<Vec<(u64, u64)>>>,
}

/// What the transport tells a node besides messages (see
/// [`Sim::deliver_notices`]).
#[derive(Clone, Debug)]
enum Notice {
    /// A connection from these peers ended.
    Gone(Vec<u64>),
    /// This peer's address refused a connection.
    Down(u64),
}

impl crate::net::Net for SimNet {
    fn send(&mut self, m: Message) {
        if self.peers.contains(&m.to) {
            self.out.borrow_mut().push((self.me, m.to, m));
            return;
        }
        for &p in &self.peers {
            self.out.borrow_mut().push((self.me, p, m.clone()));
        }
    }
    fn forward(&mut self, m: Message) {
        if self.peers.contains(&m.to) {
            self.out.borrow_mut().push((self.me, m.to, m));
        }
    }
    fn add(&mut self, id: u64, _addr: &str) {
        self.peers.insert(id);
    }
    fn remove(&mut self, id: u64) {
        self.peers.remove(&id);
    }
    fn fetch(&mut self, f: Fetch) {
        self.fetches.borrow_mut().push((self.me, f));
    }
    fn probe(&mut self, id: u64) {
        self.probes.borrow_mut().push((self.me, id));
    }
}

/// A snapshot's bytes on their way from node `from` to node `to` (indexes
/// into the nodes, each at the run it had when the fetch began).
struct Transfer {
    to: usize,
    to_run: u64,
    from: usize,
    from_run: u64,
    desc: SnapDesc,
    file: std::fs::File,
    sink: Option<SnapSink>,
    dest: std::path::PathBuf,
}

/// A running node (dropped at a crash: fields drop in order, the driver
/// and the sessions before the store).
struct Live {
    d: Driver<u64>,
    h: Handle<u64>,
    inbox: Receiver<Event>,
    tx: Sender<Event>,
    apply_rx: Receiver<ApplyMsg>,
    /// The apply message being worked through, and its answers.
    pending: VecDeque<Entry>,
    done: Vec<(Waiter<u64>, u64)>,
    last: u64,
    model: Model,
    next_tick: Duration,
    _store: DirectStore,
    /// The heap, when this run created it (an opened one lives in the store).
    _heap: Option<Heap>,
}

struct SimNode {
    id: u64,
    path: std::path::PathBuf,
    snap_file: std::path::PathBuf,
    live: Option<Live>,
    /// The highest persisted commit index seen.
    max_commit: u64,
    /// This node's tick, in simulated microseconds (its clock's drift).
    tick_us: u64,
    /// Started to join a running cluster (its log begins empty).
    join: bool,
    /// Removed from the cluster: it stays down.
    gone: bool,
    /// Counts its opens (a transfer fails when either end restarted).
    run: u64,
}

/// A membership change proposed and not answered yet: (added, id).
struct Change {
    add: bool,
    id: u64,
    rx: Receiver<Result<(), ReplError>>,
}

struct Prop {
    data: Vec<u8>,
    node: usize,
    rx: Receiver<Result<u64, ReplError>>,
}

struct Read {
    node: usize,
    /// The highest index acknowledged to a client before the read began.
    must: u64,
    rx: Receiver<Result<(), ReplError>>,
}

struct Sim {
    seed: u64,
    rng: SmallRng,
    now: Duration,
    base: Instant,
    clock: Rc<Cell<Instant>>,
    _dir: tempfile::TempDir,
    nodes: Vec<SimNode>,
    peers: Vec<Peer>,
    out: Rc<RefCell<Vec<Hop>>>,
    fetches: Rc<RefCell<Vec<(u64, Fetch)>>>,
    probes: Rc<RefCell<Vec<(u64, u64)>>>,
    /// Notices on their way: (arrival, sequence) → (node id, its run, notice).
    notices: BTreeMap<(Duration, u64), (u64, u64, Notice)>,
    transfers: Vec<Transfer>,
    /// The chunk size of snapshots' transfers.
    chunk: usize,
    /// Messages in flight: (arrival, sequence) → hop.
    wire: BTreeMap<(Duration, u64), Hop>,
    next_msg: u64,
    /// Directed links cut (from, to).
    cut: BTreeSet<(u64, u64)>,
    p_drop: f64,
    p_dup: f64,
    max_delay_ms: u64,
    compact_after: u64,
    chaos: bool,
    clients: bool,
    /// Membership changes: in half the seeds (`EMBER_SIM_MEMBERSHIP=1` in
    /// all, `=0` in none).
    membership: bool,
    /// The leader of each term seen.
    leaders: BTreeMap<u64, u64>,
    /// What was applied at each index: (entry data, chain after it).
    applied_at: BTreeMap<u64, (Vec<u8>, u64)>,
    props: Vec<Prop>,
    reads: Vec<Read>,
    /// Acknowledged proposals: (data, index).
    acked: Vec<(Vec<u8>, u64)>,
    max_acked: u64,
    change: Option<Change>,
    next_data: u64,
    step: u64,
    trace: VecDeque<String>,
    stats: Stats,
}

#[derive(Default, Debug, Clone, Copy)]
struct Stats {
    acked: u64,
    reads: u64,
    crashes: u64,
    installs: u64,
    /// Transfers of snapshots' bytes completed and failed.
    fetched: u64,
    fetch_failed: u64,
    compactions: u64,
    elections: u64,
    added: u64,
    removed: u64,
    /// Peers found down by a probe, and the campaigns that followed.
    downs: u64,
    takeovers: u64,
}

impl Sim {
    fn new(seed: u64) -> Sim {
        let mut rng = SmallRng::seed_from_u64(seed);
        let n = if rng.random_bool(0.25) { 5 } else { 3 };
        let peers: Vec<Peer> = (1..=n)
            .map(|id| Peer {
                id,
                raft_addr: format!("127.0.0.1:{}", 7000 + id),
                client_addr: format!("127.0.0.1:{}", 6000 + id),
            })
            .collect();
        // In memory where the machine has it: the runs sync their heaps and
        // snapshot files often, and a crash here is a process's (the page
        // cache survives it).
        let shm = std::path::Path::new("/dev/shm");
        let dir = if shm.is_dir() {
            tempfile::tempdir_in(shm)
        } else {
            tempfile::tempdir()
        }
        .expect("a temporary directory");
        let nodes = (1..=n)
            .map(|id| SimNode {
                id,
                path: dir.path().join(format!("n{id}.heap")),
                snap_file: dir.path().join(format!("n{id}.raft-snapshot")),
                live: None,
                max_commit: 0,
                tick_us: TICK_MS * 1000 * rng.random_range(90..=110) / 100,
                join: false,
                gone: false,
                run: 0,
            })
            .collect();
        let base = Instant::now();
        let mut sim = Sim {
            seed,
            p_drop: if rng.random_bool(0.3) {
                0.0
            } else {
                rng.random_range(0.0..0.2)
            },
            p_dup: rng.random_range(0.0..0.05),
            max_delay_ms: rng.random_range(1..=40),
            compact_after: rng.random_range(1..=12),
            // Drawn either way, so that a seed is the same run with or
            // without the variable.
            membership: {
                let m = rng.random_bool(0.5);
                env_u64("EMBER_SIM_MEMBERSHIP").map_or(m, |v| v > 0)
            },
            rng,
            now: Duration::ZERO,
            base,
            clock: Rc::new(Cell::new(base)),
            _dir: dir,
            nodes,
            peers,
            out: Rc::new(RefCell::new(Vec::new())),
            fetches: Rc::new(RefCell::new(Vec::new())),
            probes: Rc::new(RefCell::new(Vec::new())),
            notices: BTreeMap::new(),
            transfers: Vec::new(),
            chunk: 0,
            wire: BTreeMap::new(),
            next_msg: 0,
            cut: BTreeSet::new(),
            chaos: true,
            clients: true,
            leaders: BTreeMap::new(),
            applied_at: BTreeMap::new(),
            props: Vec::new(),
            reads: Vec::new(),
            acked: Vec::new(),
            max_acked: 0,
            change: None,
            next_data: 0,
            step: 0,
            trace: VecDeque::new(),
            stats: Stats::default(),
        };
        // Chunks of a few bytes to a few hundred: the model's snapshots
        // are small, and go in many chunks.
        sim.chunk = sim.rng.random_range(1..=256);
        sim
    }

    fn note(&mut self, s: String) {
        if self.trace.len() >= 80 {
            self.trace.pop_front();
        }
        self.trace
            .push_back(format!("step {} t={:?}: {s}", self.step, self.now));
    }

    /// Opens node `i` from its heap (creating it the first time).
    fn open(&mut self, i: usize) -> Result<(), String> {
        let n = &self.nodes[i];
        let (store, heap) = if n.path.exists() {
            let rec = Heap::open(&n.path, &heap_opts()).map_err(|e| e.to_string())?;
            let (st, _) = DirectStore::open(rec).map_err(|e| e.to_string())?;
            (st, None)
        } else {
            let heap = Heap::create(&n.path, &heap_opts()).map_err(|e| e.to_string())?;
            let st = DirectStore::create(&heap, &Default::default()).map_err(|e| e.to_string())?;
            (st, Some(heap))
        };
        let cfg = NodeConfig {
            id: n.id,
            peers: self.peers.clone(),
            listen: String::new(),
            tick: Duration::from_micros(n.tick_us),
            election_ticks: ELECTION_TICKS,
            heartbeat_ticks: HEARTBEAT_TICKS,
            compact_after: self.compact_after,
            join: n.join,
            snapshot_file: Some(n.snap_file.clone()),
            snapshot_chunk: self.chunk,
            // The harness applies in log order, as one lane does.
            apply_lanes: 1,
        };
        let sh = Shared::for_test(n.id);
        sh.status.lock().unwrap().id = n.id;
        *sh.peers.lock().unwrap() = self.peers.clone();
        let (tx, inbox) = std::sync::mpsc::channel();
        let (apply_tx, apply_rx) = std::sync::mpsc::channel();
        let st2 = store.clone();
        let out = self.out.clone();
        let fetches = self.fetches.clone();
        let probes = self.probes.clone();
        let mut d = Driver::open_with(
            cfg,
            Box::new(move || Ok(Box::new(st2.session()?) as Box<dyn Session>)),
            sh.clone(),
            apply_tx,
            |others| {
                Box::new(SimNet {
                    me: n.id,
                    out,
                    peers: others.iter().map(|(id, _)| *id).collect(),
                    fetches,
                    probes,
                })
            },
        )?;
        let clock = self.clock.clone();
        d.clock = Box::new(move || clock.get());
        d.restart_process = false;
        let model = Model::open(&store)?;
        // The state persisted is the state some node had at that index.
        if model.applied > 0 {
            match self.applied_at.get(&model.applied) {
                Some((_, c)) if *c == model.chain => {}
                other => {
                    return Err(format!(
                        "node {} opens at applied {} with chain {:x}; recorded: {other:?}",
                        n.id, model.applied, model.chain
                    ))
                }
            }
        }
        let commit = d.node.store().initial_state().map_err(|e| e.to_string())?;
        let commit = commit.hard_state.commit;
        if commit < n.max_commit {
            return Err(format!(
                "node {} opens with commit {commit}, below the {} it had persisted",
                n.id, n.max_commit
            ));
        }
        let next_tick = self.now + Duration::from_micros(n.tick_us);
        let live = Live {
            h: Handle {
                sh,
                inbox: Mutex::new(tx.clone()),
            },
            d,
            inbox,
            tx,
            apply_rx,
            pending: VecDeque::new(),
            done: Vec::new(),
            last: 0,
            model,
            next_tick,
            _store: store,
            _heap: heap,
        };
        let id = n.id;
        self.nodes[i].live = Some(live);
        self.nodes[i].run += 1;
        self.set_timeout(i);
        self.note(format!("node {id} opens (applied {})", {
            self.nodes[i].live.as_ref().map_or(0, |l| l.model.applied)
        }));
        Ok(())
    }

    /// raft-rs draws election timeouts from `thread_rng` whenever it resets
    /// its election clock: the simulation draws them again from its own.
    fn set_timeout(&mut self, i: usize) {
        if let Some(l) = self.nodes[i].live.as_mut() {
            Self::draw_timeout(&mut self.rng, l);
        }
    }

    fn draw_timeout(rng: &mut SmallRng, l: &mut Live) {
        if l.d.node.raft.election_elapsed == 0 {
            let t = rng.random_range(ELECTION_TICKS..2 * ELECTION_TICKS);
            l.d.node.raft.set_randomized_election_timeout(t);
        }
    }

    /// Node `i` crashes: its driver, apply queue and messages in flight go.
    fn crash(&mut self, i: usize, why: &str) {
        let id = self.nodes[i].id;
        if self.nodes[i].live.take().is_none() {
            return;
        }
        self.wire.retain(|_, h| h.0 != id && h.1 != id);
        self.out.borrow_mut().retain(|h| h.0 != id);
        self.stats.crashes += 1;
        self.note(format!("node {id} {why}"));
        // Its connections end: the nodes it had one to (most) hear of it.
        for j in self.live_ids() {
            let to = self.nodes[j].id;
            if !self.cut.contains(&(id, to)) && self.rng.random_bool(0.8) {
                self.notify(j, Notice::Gone(vec![id]));
            }
        }
    }

    /// Sends `n` to node `j` (as it runs now), arriving in up to 3 ms.
    fn notify(&mut self, j: usize, n: Notice) {
        let at = self.now + Duration::from_micros(self.rng.random_range(0..=3000));
        self.next_msg += 1;
        let (id, run) = (self.nodes[j].id, self.nodes[j].run);
        self.notices.insert((at, self.next_msg), (id, run, n));
    }

    /// Answers the probes asked for: a peer that is down (and reachable:
    /// a cut link is a probe that times out) is reported down; then hands
    /// the notices due to their nodes' inboxes (a node restarted since
    /// loses them, as a new process has no such connection).
    fn deliver_notices(&mut self) {
        let asked = std::mem::take(&mut *self.probes.borrow_mut());
        for (me, peer) in asked {
            let down = self
                .nodes
                .iter()
                .find(|n| n.id == peer)
                .is_none_or(|n| n.live.is_none());
            if down && !self.cut.contains(&(me, peer)) {
                if let Some(j) = self.nodes.iter().position(|n| n.id == me) {
                    self.notify(j, Notice::Down(peer));
                }
            }
        }
        while let Some(e) = self.notices.first_entry() {
            if e.key().0 > self.now {
                break;
            }
            let (id, run, n) = e.remove();
            let Some(node) = self.nodes.iter().find(|x| x.id == id && x.run == run) else {
                continue;
            };
            let Some(l) = node.live.as_ref() else {
                continue;
            };
            let ev = match n {
                Notice::Gone(ids) => Event::PeerGone(ids),
                Notice::Down(p) => {
                    self.stats.downs += 1;
                    Event::PeerDown(p)
                }
            };
            let _ = l.tx.send(ev);
        }
    }

    /// Routes what the drivers sent.
    fn route(&mut self) {
        let out = std::mem::take(&mut *self.out.borrow_mut());
        for h in out {
            if self.cut.contains(&(h.0, h.1)) || self.rng.random_bool(self.p_drop) {
                continue;
            }
            let copies = if self.rng.random_bool(self.p_dup) {
                2
            } else {
                1
            };
            for _ in 0..copies {
                let delay =
                    Duration::from_micros(self.rng.random_range(500..=self.max_delay_ms * 1000));
                self.next_msg += 1;
                self.wire
                    .insert((self.now + delay, self.next_msg), h.clone());
            }
        }
    }

    fn live_ids(&self) -> Vec<usize> {
        (0..self.nodes.len())
            .filter(|&i| self.nodes[i].live.is_some())
            .collect()
    }

    fn leader(&self) -> Option<usize> {
        self.live_ids().into_iter().find(|&i| {
            self.nodes[i]
                .live
                .as_ref()
                .is_some_and(|l| l.d.node.raft.state == StateRole::Leader)
        })
    }

    fn chaos(&mut self) -> Result<(), String> {
        let n = self.nodes.len();
        let ids: Vec<u64> = self.nodes.iter().map(|n| n.id).collect();
        let r: f64 = self.rng.random_range(0.0..1.0);
        if r < 0.004 {
            let a = ids[self.rng.random_range(0..n)];
            for &b in &ids {
                if a != b {
                    self.cut.insert((a, b));
                    self.cut.insert((b, a));
                }
            }
            self.note(format!("node {a} isolated"));
        } else if r < 0.007 {
            let mut s = ids.clone();
            s.shuffle(&mut self.rng);
            let k = self.rng.random_range(1..n);
            for &a in &s[..k] {
                for &b in &s[k..] {
                    self.cut.insert((a, b));
                    self.cut.insert((b, a));
                }
            }
            self.note(format!("partition {:?} | {:?}", &s[..k], &s[k..]));
        } else if r < 0.009 {
            let a = ids[self.rng.random_range(0..n)];
            let b = ids[self.rng.random_range(0..n)];
            if a != b {
                self.cut.insert((a, b));
                self.note(format!("link {a} -> {b} cut"));
            }
        } else if r < 0.02 && !self.cut.is_empty() {
            self.cut.clear();
            self.note("network healed".into());
        } else if r < 0.025 {
            let live = self.live_ids();
            let victim = match self.leader() {
                Some(l) if self.rng.random_bool(0.4) => Some(l),
                _ if !live.is_empty() => Some(live[self.rng.random_range(0..live.len())]),
                _ => None,
            };
            if let Some(v) = victim {
                self.crash(v, "crashes");
            }
        } else if r < 0.045 {
            let down: Vec<usize> = (0..n)
                .filter(|&i| self.nodes[i].live.is_none() && !self.nodes[i].gone)
                .collect();
            if !down.is_empty() {
                let i = down[self.rng.random_range(0..down.len())];
                self.open(i)?;
            }
        } else if r < 0.05 && self.membership {
            self.change_members()?;
        } else if r < 0.053 {
            // A connection between live nodes ends (the probe finds the
            // peer up and nothing follows).
            let live = self.live_ids();
            if live.len() >= 2 {
                let a = live[self.rng.random_range(0..live.len())];
                let b = live[self.rng.random_range(0..live.len())];
                if a != b {
                    let from = self.nodes[a].id;
                    self.notify(b, Notice::Gone(vec![from]));
                }
            }
        } else if r < 0.0535 {
            // A wrong "down" for a live leader (a refused connection for
            // another reason): a needless election, never an unsafe one.
            if let Some(l) = self.leader() {
                let lid = self.nodes[l].id;
                let live = self.live_ids();
                let j = live[self.rng.random_range(0..live.len())];
                if j != l {
                    self.note(format!(
                        "node {} told leader {lid} is down",
                        self.nodes[j].id
                    ));
                    self.notify(j, Notice::Down(lid));
                }
            }
        }
        Ok(())
    }

    /// The leader's configuration: its voters.
    fn members(&self) -> Option<Vec<u64>> {
        let l = self.leader()?;
        let l = self.nodes[l].live.as_ref()?;
        Some(l.d.node.store().conf_state().voters)
    }

    /// Asks the leader to add a new node (started to join) or to remove a
    /// member (not itself), keeping three to five.
    fn change_members(&mut self) -> Result<(), String> {
        let (Some(l), Some(voters), None) = (self.leader(), self.members(), &self.change) else {
            return Ok(());
        };
        let lid = self.nodes[l].id;
        let add = match voters.len() {
            0..=3 => true,
            4 => self.rng.random_bool(0.5),
            _ => false,
        };
        if add {
            let id = self.nodes.len() as u64 + 1;
            let peer = Peer {
                id,
                raft_addr: format!("127.0.0.1:{}", 7000 + id),
                client_addr: format!("127.0.0.1:{}", 6000 + id),
            };
            self.peers.push(peer.clone());
            let tick_us = TICK_MS * 1000 * self.rng.random_range(90..=110) / 100;
            self.nodes.push(SimNode {
                id,
                path: self._dir.path().join(format!("n{id}.heap")),
                snap_file: self._dir.path().join(format!("n{id}.raft-snapshot")),
                live: None,
                max_commit: 0,
                tick_us,
                join: true,
                gone: false,
                run: 0,
            });
            self.open(self.nodes.len() - 1)?;
            let rx = self.nodes[l]
                .live
                .as_ref()
                .expect("live")
                .h
                .change(Some(peer), None);
            self.note(format!("node {lid} adds node {id}"));
            self.change = Some(Change { add, id, rx });
        } else {
            let others: Vec<u64> = voters.into_iter().filter(|&v| v != lid).collect();
            let id = others[self.rng.random_range(0..others.len())];
            let rx = self.nodes[l]
                .live
                .as_ref()
                .expect("live")
                .h
                .change(None, Some(id));
            self.note(format!("node {lid} removes node {id}"));
            self.change = Some(Change { add, id, rx });
        }
        Ok(())
    }

    /// A membership change answered: a node removed goes for good.
    fn change_answered(&mut self) {
        let Some(c) = &self.change else {
            return;
        };
        let r = match c.rx.try_recv() {
            Ok(r) => r,
            Err(TryRecvError::Empty) => return,
            Err(TryRecvError::Disconnected) => Err(ReplError::Stopped("crashed".into())),
        };
        let (add, id) = (c.add, c.id);
        self.change = None;
        let what = if add { "adding" } else { "removing" };
        match r {
            Ok(()) if add => {
                self.stats.added += 1;
                self.note(format!("node {id} added"));
            }
            Ok(()) => {
                self.stats.removed += 1;
                let i = self.nodes.iter().position(|n| n.id == id).expect("a node");
                self.nodes[i].gone = true;
                self.crash(i, "removed: stops for good");
                self.stats.crashes -= 1;
            }
            Err(e) => self.note(format!("{what} node {id} failed: {e}")),
        }
    }

    fn clients(&mut self) {
        let live = self.live_ids();
        if live.is_empty() {
            return;
        }
        if self.props.len() < 24 && self.rng.random_bool(0.35) {
            let i = match self.leader() {
                Some(l) if self.rng.random_bool(0.85) => l,
                _ => live[self.rng.random_range(0..live.len())],
            };
            self.next_data += 1;
            let data = format!("s{}-w{}", self.seed, self.next_data).into_bytes();
            let Some(l) = self.nodes[i].live.as_ref() else {
                return;
            };
            let rx = if self.rng.random_bool(0.05) {
                l.h.propose_event(&data)
            } else {
                l.h.propose(data.clone())
            };
            self.props.push(Prop { data, node: i, rx });
        }
        if self.reads.len() < 8 && self.rng.random_bool(0.1) {
            let i = match self.leader() {
                Some(l) if self.rng.random_bool(0.9) => l,
                _ => live[self.rng.random_range(0..live.len())],
            };
            if let Some(l) = self.nodes[i].live.as_ref() {
                let rx = l.h.read_barrier();
                self.reads.push(Read {
                    node: i,
                    must: self.max_acked,
                    rx,
                });
            }
        }
    }

    /// Collects the answers to proposals and reads, checking them.
    fn answers(&mut self) -> Result<(), String> {
        self.change_answered();
        let mut props = std::mem::take(&mut self.props);
        let mut err = None;
        props.retain(|p| match p.rx.try_recv() {
            Ok(Ok(index)) => {
                let want: Vec<u8> = std::iter::once(TAG_DATA)
                    .chain(p.data.iter().copied())
                    .collect();
                let want_ev: Vec<u8> = std::iter::once(TAG_EVENT)
                    .chain(p.data.iter().copied())
                    .collect();
                match self.applied_at.get(&index) {
                    Some((d, _)) if *d == want || *d == want_ev => {}
                    other => {
                        err = Some(format!(
                            "node {} acknowledged {:?} at index {index}, where {:?} was applied",
                            self.nodes[p.node].id,
                            String::from_utf8_lossy(&p.data),
                            other.map(|(d, _)| String::from_utf8_lossy(d).into_owned())
                        ));
                    }
                }
                self.acked.push((p.data.clone(), index));
                self.max_acked = self.max_acked.max(index);
                self.stats.acked += 1;
                false
            }
            Ok(Err(_)) | Err(TryRecvError::Disconnected) => false,
            Err(TryRecvError::Empty) => true,
        });
        self.props = props;
        if let Some(e) = err {
            return Err(e);
        }
        Ok(())
    }

    /// Checks the reads node `i` answered (right after its turn, while its
    /// applied index is the one it answered them at).
    fn check_reads(&mut self, i: usize) -> Result<(), String> {
        let Some(l) = self.nodes[i].live.as_ref() else {
            return Ok(());
        };
        let applied = l.d.applied;
        let mut err = None;
        let mut passed = 0;
        self.reads.retain(|r| {
            if r.node != i {
                return true;
            }
            match r.rx.try_recv() {
                Ok(Ok(())) => {
                    passed += 1;
                    if applied < r.must {
                        err = Some(format!(
                            "node {} passed a read at applied {applied}, before the write \
                             acknowledged at {} that preceded it",
                            l.d.sh.id, r.must
                        ));
                    }
                    false
                }
                Ok(Err(_)) | Err(TryRecvError::Disconnected) => false,
                Err(TryRecvError::Empty) => true,
            }
        });
        self.stats.reads += passed;
        err.map_or(Ok(()), Err)
    }

    /// One round of node `i`'s raft thread: the messages arrived, its
    /// inbox, a tick when due, the Ready.
    fn run_node(&mut self, i: usize, msgs: Vec<Message>) -> Result<(), String> {
        let now = self.now;
        let id = self.nodes[i].id;
        let tick_us = self.nodes[i].tick_us;
        let Some(l) = self.nodes[i].live.as_mut() else {
            return Ok(());
        };
        let before = (l.d.node.raft.term, l.d.node.raft.state);
        let mut go = true;
        for m in msgs {
            go &= l.d.handle(Event::Message(Box::new(m)));
        }
        let evs: Vec<Event> = l.inbox.try_iter().collect();
        for ev in evs {
            go &= l.d.handle(ev);
        }
        // A reset of the election clock while handling them is drawn
        // again before the tick below counts on it.
        Self::draw_timeout(&mut self.rng, l);
        let mut ok = go;
        let mut installed = false;
        let mut led = None;
        if go {
            l.d.snapshot_work();
            let tick = now >= l.next_tick;
            if tick {
                l.next_tick = now + Duration::from_micros(tick_us);
            }
            ok = l.d.turn(tick);
            self.stats.takeovers += std::mem::take(&mut l.d.takeovers);
            installed = l.d.installed;
            let r = &l.d.node.raft;
            if !installed && r.state == StateRole::Leader && before != (r.term, r.state) {
                led = Some(r.term);
            }
        }
        if installed {
            let index = self.nodes[i]
                .live
                .as_ref()
                .map_or(0, |l| l.d.node.store().range().0 - 1);
            self.stats.installs += 1;
            self.crash(i, &format!("installed a snapshot at {index}; restarts"));
            self.stats.crashes -= 1;
            return self.open(i);
        }
        if let Some(term) = led {
            self.stats.elections += 1;
            if let Some(&other) = self.leaders.get(&term) {
                if other != id {
                    return Err(format!("two leaders in term {term}: {other} and {id}"));
                }
            }
            self.leaders.insert(term, id);
            self.note(format!("node {id} leads term {term}"));
        }
        let n = &mut self.nodes[i];
        let l = n.live.as_mut().expect("still live");
        if !ok {
            let why = l.d.sh.status.lock().unwrap().failed.clone();
            return Err(format!("node {id} stopped: {why:?}"));
        }
        // The persisted commit index never goes back; the log never drops
        // an entry not applied here.
        let rs =
            l.d.node
                .store()
                .initial_state()
                .map_err(|e| e.to_string())?;
        let commit = rs.hard_state.commit;
        if commit < n.max_commit {
            return Err(format!(
                "node {id}'s persisted commit went back from {} to {commit}",
                n.max_commit
            ));
        }
        n.max_commit = commit;
        let first = l.d.node.store().range().0;
        if first > l.model.applied + 1 || first > l.d.applied + 1 {
            return Err(format!(
                "node {id}'s log starts at {first} with only {} applied ({} reported)",
                l.model.applied, l.d.applied
            ));
        }
        self.set_timeout(i);
        self.check_reads(i)
    }

    /// The apply thread of node `i` works through up to a few entries.
    fn apply_some(&mut self, i: usize) -> Result<(), String> {
        let budget = self.rng.random_range(1..=8);
        let id = self.nodes[i].id;
        let Some(l) = self.nodes[i].live.as_mut() else {
            return Ok(());
        };
        for _ in 0..budget {
            if l.pending.is_empty() {
                match l.apply_rx.try_recv() {
                    Ok(ApplyMsg::Entries(ents)) => l.pending = ents.into(),
                    Ok(ApplyMsg::Dump(path)) => {
                        let index = l.d.sh.applied.load(Ordering::Acquire);
                        let sess = &mut *l.model.sess;
                        let data =
                            write_dump(&path, |out| dump_to(sess, out).map_err(|e| e.to_string()));
                        let _ = l.tx.send(Event::Dumped { index, data });
                        continue;
                    }
                    Err(_) => break,
                }
                if l.pending.is_empty() {
                    continue;
                }
            }
            let e = l.pending.pop_front().expect("an entry");
            let waiter = parse_ctx(&e.context)
                .filter(|&(pid, _)| pid == id)
                .and_then(|(_, seq)| l.d.sh.waiters.lock().unwrap().remove(&seq));
            let normal = e.get_entry_type() == EntryType::EntryNormal;
            let data = (normal && matches!(e.data.first(), Some(&TAG_DATA | &TAG_EVENT)))
                .then(|| &e.data[1..]);
            let c = l
                .model
                .apply(e.index, &e.data, data)
                .map_err(|err| format!("node {id} {err}"))?;
            match self.applied_at.get(&e.index) {
                None => {
                    if normal && e.data.first() == Some(&TAG_COMPACT) {
                        self.stats.compactions += 1;
                    }
                    self.applied_at.insert(e.index, (e.data.to_vec(), c));
                }
                Some((d, c0)) if d[..] == e.data[..] && *c0 == c => {}
                Some((d, c0)) => {
                    return Err(format!(
                        "node {id} applied entry {} = {:?} (chain {c:x}); another node applied \
                         {:?} (chain {c0:x})",
                        e.index,
                        String::from_utf8_lossy(&e.data),
                        String::from_utf8_lossy(d)
                    ))
                }
            }
            if let Some(w) = waiter {
                l.done.push((w, e.index));
            }
            l.last = e.index;
            if l.pending.is_empty() {
                l.model.sess.commit().map_err(|e| e.to_string())?;
                for (w, r) in l.done.drain(..) {
                    let _ = w.send(Ok(r));
                }
                l.d.sh.applied.store(l.last, Ordering::Release);
                let _ = l.tx.send(Event::Applied(l.last));
            }
        }
        Ok(())
    }

    /// Sends `ev` to node `i`'s inbox if it still runs run `run`.
    fn tell(&self, i: usize, run: u64, ev: Event) {
        if self.nodes[i].run == run {
            if let Some(l) = &self.nodes[i].live {
                let _ = l.tx.send(ev);
            }
        }
    }

    /// Starts the fetches asked for and moves the transfers on: a few
    /// chunks each, or a failure (see the module docs).
    fn transfer_some(&mut self) -> Result<(), String> {
        let asked = std::mem::take(&mut *self.fetches.borrow_mut());
        for (me, f) in asked {
            let Some(to) = self.nodes.iter().position(|n| n.id == me) else {
                continue;
            };
            let to_run = self.nodes[to].run;
            let from = self
                .peers
                .iter()
                .find(|p| p.raft_addr == f.desc.source)
                .and_then(|p| self.nodes.iter().position(|n| n.id == p.id));
            let src = from.and_then(|j| {
                let l = self.nodes[j].live.as_ref()?;
                let shelf = l.d.node.store().shelf();
                open_offered(&shelf, f.desc.index, f.desc.len, f.desc.crc)
            });
            let (Some(from), Some(file)) = (from, src) else {
                self.tell(
                    to,
                    to_run,
                    Event::Fetched {
                        desc: f.desc,
                        ok: Err("not on offer".into()),
                    },
                );
                continue;
            };
            let sink = SnapSink::create(&f.part, &f.desc).map_err(|e| e.to_string())?;
            let from_run = self.nodes[from].run;
            self.tell(from, from_run, Event::Transfer { to: me, done: None });
            self.note(format!(
                "node {me} fetches snapshot {} ({} bytes) from node {}",
                f.desc.index, f.desc.len, self.nodes[from].id
            ));
            self.transfers.push(Transfer {
                to,
                to_run,
                from,
                from_run,
                desc: f.desc,
                file,
                sink: Some(sink),
                dest: f.dest,
            });
        }
        let mut transfers = std::mem::take(&mut self.transfers);
        let mut err = None;
        transfers.retain_mut(|t| {
            let (to_id, from_id) = (self.nodes[t.to].id, self.nodes[t.from].id);
            let up = |n: &SimNode, run| n.run == run && n.live.is_some();
            let to_up = up(&self.nodes[t.to], t.to_run);
            let from_up = up(&self.nodes[t.from], t.from_run);
            let cut = self.cut.contains(&(from_id, to_id)) || self.cut.contains(&(to_id, from_id));
            let lost = self.rng.random_bool(0.02);
            let done: Option<Result<(), String>> = if !to_up || !from_up || cut || lost {
                Some(Err("transfer cut".into()))
            } else {
                let mut r = None;
                for _ in 0..self.rng.random_range(1..=4) {
                    let Some(sink) = t.sink.as_mut() else {
                        break;
                    };
                    let left = t.desc.len - sink.received();
                    let n = (self.chunk as u64).min(left) as usize;
                    let mut buf = vec![0u8; n];
                    if let Err(e) = std::io::Read::read_exact(&mut t.file, &mut buf) {
                        err = Some(format!("reading a snapshot's file: {e}"));
                        return false;
                    }
                    if n > 0 && self.rng.random_bool(0.005) {
                        buf[n / 2] ^= 0x20;
                    }
                    if let Err(e) = sink.write(&buf) {
                        r = Some(Err(e));
                        break;
                    }
                    if sink.received() == t.desc.len {
                        r = t.sink.take().map(|s| s.finish(&t.dest));
                        break;
                    }
                }
                r
            };
            let Some(r) = done else {
                return true;
            };
            if r.is_ok() {
                self.stats.fetched += 1;
            } else {
                self.stats.fetch_failed += 1;
            }
            self.note(format!(
                "node {to_id}'s fetch of snapshot {} from node {from_id}: {r:?}",
                t.desc.index
            ));
            let ok = r.is_ok();
            if to_up {
                self.tell(
                    t.to,
                    t.to_run,
                    Event::Fetched {
                        desc: t.desc.clone(),
                        ok: r,
                    },
                );
            }
            if from_up {
                self.tell(
                    t.from,
                    t.from_run,
                    Event::Transfer {
                        to: to_id,
                        done: Some(ok),
                    },
                );
            }
            false
        });
        self.transfers = transfers;
        err.map_or(Ok(()), Err)
    }

    fn step(&mut self) -> Result<(), String> {
        self.step += 1;
        self.now += Duration::from_micros(self.rng.random_range(500..=4000));
        self.clock.set(self.base + self.now);
        if self.chaos {
            self.chaos()?;
        }
        if self.clients {
            self.clients();
        }
        // The messages due, by recipient (a cut link loses those on it).
        let mut due: Vec<Vec<Message>> = vec![Vec::new(); self.nodes.len()];
        while let Some(e) = self.wire.first_entry() {
            if e.key().0 > self.now {
                break;
            }
            let (from, to, m) = e.remove();
            if !self.cut.contains(&(from, to)) {
                if let Some(i) = self.nodes.iter().position(|n| n.id == to) {
                    due[i].push(m);
                }
            }
        }
        self.transfer_some()?;
        self.deliver_notices();
        let mut order: Vec<usize> = (0..self.nodes.len()).collect();
        order.shuffle(&mut self.rng);
        for i in order {
            let msgs = std::mem::take(&mut due[i]);
            self.run_node(i, msgs)?;
            self.route();
        }
        for i in 0..self.nodes.len() {
            if self.rng.random_bool(0.7) {
                self.apply_some(i)?;
            }
        }
        self.answers()
    }

    /// Whether every node is up and has applied everything committed, the
    /// same everywhere, with no proposal waiting.
    fn converged(&self) -> bool {
        let Some(l) = self.leader() else {
            return false;
        };
        let ld = &self.nodes[l].live.as_ref().expect("live").d;
        let commit = ld.node.raft.raft_log.committed;
        let voters = ld.node.store().conf_state().voters;
        self.props.is_empty()
            && self.change.is_none()
            && self
                .nodes
                .iter()
                .filter(|n| voters.contains(&n.id))
                .all(|n| {
                    n.live.as_ref().is_some_and(|x| {
                        x.model.applied == commit
                            && x.d.node.raft.raft_log.committed == commit
                            && x.pending.is_empty()
                    })
                })
    }

    /// Each node's state, for a failure's report.
    fn describe(&self) -> String {
        let mut out = Vec::new();
        for n in &self.nodes {
            let Some(l) = n.live.as_ref() else {
                out.push(format!(
                    "node {}: down{}",
                    n.id,
                    if n.gone { " (removed)" } else { "" }
                ));
                continue;
            };
            let r = &l.d.node.raft;
            let prs: Vec<String> = if r.state == StateRole::Leader {
                r.prs()
                    .iter()
                    .map(|(id, p)| format!("{id}:{}/{}/{:?}", p.matched, p.next_idx, p.state))
                    .collect()
            } else {
                Vec::new()
            };
            out.push(format!(
                "node {}: {:?} term {} leader {} commit {} applied {}/{} log {:?} voters {:?} \
                 pending apply {} snapshots sent {:?} dumping {} progress {prs:?}",
                n.id,
                r.state,
                r.term,
                r.leader_id,
                r.raft_log.committed,
                l.d.applied,
                l.model.applied,
                l.d.node.store().range(),
                l.d.node.store().conf_state().voters,
                l.pending.len(),
                l.d.snaps_sent.len(),
                l.d.dumping,
            ));
        }
        out.join("\n")
    }

    /// Steps until the nodes converge (`calm` counts the steps taken).
    fn settle(&mut self, calm: &mut u64, when: &str) -> Result<(), String> {
        while !self.converged() {
            *calm += 1;
            if *calm > 20_000 {
                return Err(format!(
                    "the nodes did not converge {when}:\n{}",
                    self.describe()
                ));
            }
            self.step()?;
        }
        Ok(())
    }

    fn run(&mut self, steps: u64) -> Result<(), String> {
        for i in 0..self.nodes.len() {
            self.open(i)?;
        }
        for _ in 0..steps {
            self.step()?;
        }
        // Calm: the network heals, every node comes back, and all converge.
        self.chaos = false;
        self.clients = false;
        self.p_drop = 0.0;
        self.cut.clear();
        self.note("calm: healed, every node restarts".into());
        for i in 0..self.nodes.len() {
            if self.nodes[i].live.is_none() && !self.nodes[i].gone {
                self.open(i)?;
            }
        }
        let mut calm = 0;
        self.settle(&mut calm, "after the network healed")?;
        // An idle cluster goes quiet: at most one new entry in one of three
        // windows of 600 steps (a removal still pending, a new leader
        // whose view of its followers settles, may bring a few; one
        // compaction appended after each, as with a setting of 1 before it
        // was raised to 2, made some 30 in each).
        let last = |sim: &Sim| {
            sim.nodes
                .iter()
                .filter_map(|n| n.live.as_ref())
                .map(|l| l.d.node.raft.raft_log.last_index())
                .max()
                .unwrap_or(0)
        };
        for _ in 0..600 {
            self.step()?;
        }
        let mut window = 0;
        loop {
            let before = last(self);
            for _ in 0..600 {
                self.step()?;
            }
            let after = last(self);
            if after <= before + 1 {
                break;
            }
            window += 1;
            if window == 3 {
                return Err(format!(
                    "an idle cluster's log went from {before} to {after} ({:?}):\n{}",
                    (before + 1..=after)
                        .map(|i| self.applied_at.get(&i).map(|(d, _)| d.clone()))
                        .collect::<Vec<_>>(),
                    self.describe()
                ));
            }
        }
        // (A member may be waiting for a snapshot's report.)
        self.settle(&mut calm, "again")?;
        // One keyspace everywhere, every acknowledged write in it.
        let voters = self.members().unwrap_or_default();
        let mut dumps = Vec::new();
        for n in &mut self.nodes {
            if !voters.contains(&n.id) {
                continue;
            }
            let l = n.live.as_mut().expect("live");
            let mut d = dump(&mut *l.model.sess).map_err(|e| e.to_string())?;
            // Pairs in key order (a scan's order is the table's).
            let mut recs = Vec::new();
            let mut rest = d.as_slice();
            while !rest.is_empty() {
                let kl = u32::from_le_bytes(rest[..4].try_into().unwrap()) as usize;
                let k = rest[4..4 + kl].to_vec();
                rest = &rest[4 + kl..];
                let vl = u32::from_le_bytes(rest[..4].try_into().unwrap()) as usize;
                let v = rest[4..4 + vl].to_vec();
                rest = &rest[4 + vl..];
                recs.push((k, v));
            }
            recs.sort();
            recs.dedup();
            d.clear();
            dumps.push((n.id, l.model.applied, recs));
        }
        for w in dumps.windows(2) {
            if w[0].1 != w[1].1 || w[0].2 != w[1].2 {
                return Err(format!(
                    "nodes {} and {} end with different states (applied {} and {})",
                    w[0].0, w[1].0, w[0].1, w[1].1
                ));
            }
        }
        let applied = dumps[0].1;
        for (d, index) in &self.acked {
            if *index > applied {
                return Err(format!(
                    "{:?}, acknowledged at {index}, is not applied (applied {applied})",
                    String::from_utf8_lossy(d)
                ));
            }
        }
        // No snapshot file outlives its use: a node's dumps are the one it
        // offers, if any; bytes received and not installed, one file.
        for n in &self.nodes {
            let Some(l) = n.live.as_ref() else {
                continue;
            };
            let name = n
                .snap_file
                .file_name()
                .unwrap()
                .to_string_lossy()
                .into_owned();
            let offered = l.d.node.store().offered().map(|(_, p)| p);
            let mut files = Vec::new();
            for e in std::fs::read_dir(self._dir.path()).map_err(|e| e.to_string())? {
                let p = e.map_err(|e| e.to_string())?.path();
                let f = p.file_name().unwrap().to_string_lossy().into_owned();
                if f.starts_with(&name) && f != name {
                    files.push(p);
                }
            }
            let stray: Vec<_> = files
                .iter()
                .filter(|p| {
                    Some(*p) != offered.as_ref() && **p != crate::storage::recv_path(&n.snap_file)
                })
                .collect();
            if !stray.is_empty() {
                return Err(format!("node {}'s stray snapshot files: {stray:?}", n.id));
            }
        }
        self.note(format!("converged at {applied} after {calm} calm steps"));
        Ok(())
    }
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

/// Runs seed `seed`: its statistics, or its failure's report.
fn run_seed(seed: u64, steps: u64) -> Result<Stats, String> {
    let mut sim = Sim::new(seed);
    // A panic (raft-rs asserts) is a failure of this seed too, with its
    // trace.
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| sim.run(steps)))
        .unwrap_or_else(|p| {
            let why = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            Err(format!("panicked: {why}"))
        });
    if let Err(e) = r {
        let trace: Vec<String> = sim.trace.iter().cloned().collect();
        return Err(format!(
            "simulation seed {seed} failed at step {} (EMBER_SIM_SEED={seed} \
             EMBER_SIM_STEPS={steps} reproduces it): {e}\n(compact_after {}, drop {:.3}, \
             duplicate {:.3}, delay up to {} ms, membership changes {})\nlast events:\n{}",
            sim.step,
            sim.compact_after,
            sim.p_drop,
            sim.p_dup,
            sim.max_delay_ms,
            sim.membership,
            trace.join("\n")
        ));
    }
    Ok(sim.stats)
}

#[test]
fn replication_glue_survives_loss_partitions_crashes_and_snapshots() {
    let steps = env_u64("EMBER_SIM_STEPS").unwrap_or(4000);
    let first = env_u64("EMBER_SIM_FIRST_SEED").unwrap_or(1);
    let seeds: Vec<u64> = match env_u64("EMBER_SIM_SEED") {
        Some(s) => vec![s],
        None => (first..first + env_u64("EMBER_SIM_SEEDS").unwrap_or(200)).collect(),
    };
    // EMBER_SIM_KEEP_GOING=1: every seed runs; the failures are listed.
    let keep_going = env_u64("EMBER_SIM_KEEP_GOING").is_some_and(|v| v > 0);
    let mut total = Stats::default();
    let mut failed = Vec::new();
    for &seed in &seeds {
        let s = match run_seed(seed, steps) {
            Ok(s) => s,
            Err(e) if keep_going => {
                eprintln!("{}", e.lines().next().unwrap_or_default());
                failed.push(seed);
                continue;
            }
            Err(e) => panic!("{e}"),
        };
        total.acked += s.acked;
        total.reads += s.reads;
        total.crashes += s.crashes;
        total.installs += s.installs;
        total.fetched += s.fetched;
        total.fetch_failed += s.fetch_failed;
        total.compactions += s.compactions;
        total.elections += s.elections;
        total.added += s.added;
        total.removed += s.removed;
        total.downs += s.downs;
        total.takeovers += s.takeovers;
    }
    assert!(failed.is_empty(), "seeds failed: {failed:?}");
    eprintln!("{} seeds x {steps} steps: {total:?}", seeds.len());
    // The runs exercise what they are for.
    assert!(total.acked > 0 && total.elections > 0);
    if seeds.len() >= 20 {
        assert!(total.installs > 0 && total.crashes > 0 && total.compactions > 0);
        assert!(total.fetched >= total.installs && total.fetch_failed > 0);
        assert!(total.downs > 0 && total.takeovers > 0);
    }
}
