//! Networking: one acceptor thread, N worker threads each running a mio event
//! loop over its own connections with its own store session, and shutdown.
//!
//! # A batch
//! A worker wakes with a set of ready connections. For each it reads what the
//! socket has, parses every complete request and executes it; replies go to the
//! connection's output buffer. Then the batch commits: in `pmem` mode every
//! write was durable when its command returned (the store's apply persists
//! it); in `msync` mode the batch's writes become durable with one `msync`,
//! on the worker's thread or, with `commit-pipeline yes`, on its syncer thread
//! (see `commit`) while the worker serves the next batches and the batch's
//! replies wait. Output is written only up to what is durable. Then it runs
//! the session's maintenance (Bullet's gleaning role) and periodic tasks
//! (active expiry on worker 0, idle timeouts).

use crate::clock::Stamp;
use crate::cmd::{self, Ctx};
use crate::commit::Committer;
use crate::config::Config;
use crate::counts::KeyCounts;
use crate::keyspace::{Keyspace, Stripes};
use crate::stats::{Stats, WorkerStats};
use crate::store::{AnyStore, Startup};
use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Token, Waker};
use proto::{Limits, Parsed, Reply, Version};
use std::collections::{BTreeMap, HashMap};
use std::io::{ErrorKind, Read, Write};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

const WAKER: Token = Token(0);
/// The acceptor's waker (its listeners are tokens 0..n).
const ACCEPT_WAKER: Token = Token(usize::MAX);
/// An accepted connection on its way from the acceptor to a worker.
type NewConn = (std::net::TcpStream, SocketAddr);
/// Output buffered for one client before the worker stops executing its
/// pipelined requests until the socket drains.
const OUT_HIGH_WATER: usize = 64 << 20;
/// Bytes read from one socket per batch before moving to the next client.
const READ_BUDGET: usize = 1 << 20;
/// One socket read: into the worker's scratch buffer, then appended to the
/// client's query buffer. An idle client holds no query buffer at all.
const READ_CHUNK: usize = 64 * 1024;
/// Buffers larger than this are freed, not kept, once empty: ten thousand idle
/// clients must not hold what their busiest moment needed.
const KEEP_BUF: usize = 16 * 1024;
/// File descriptors kept beyond maxclients (listeners, heap, logs, metrics).
const RESERVED_FDS: u64 = 64;
/// Redis 7's limits for a client that has not authenticated yet (when a
/// password is required): `*` counts above 10 and `$` lengths above 16384 are
/// refused, so that an anonymous peer cannot make the server buffer much.
const UNAUTH_MAX_MULTIBULK: usize = 10;
const UNAUTH_MAX_BULK: usize = 16384;
/// A batch of fewer requests commits in line rather than on the syncer thread
/// (see `Worker::commit_batch`). Measured with 50 clients: without pipelining
/// (at most 50 requests a batch) handing every commit over cost 7-29% of
/// `msync` SET throughput; with `-P 16` (hundreds a batch) it gained 8-15%,
/// and up to 2x when the disk was slow (BENCHMARKS.md).
const PIPELINE_MIN_REQUESTS: usize = 64;

/// Bounds on `Worker::serve_arrivals`, so that a steady stream of requests
/// (many clients) still commits, and replies, at least this often. Measured
/// with 50 clients and `-P 16` (800 requests in flight): the batches before
/// a commit grew from about 460 requests to all 800, served in 0.3-0.5 ms,
/// and `msync` SET and INCR gained about 15% (BENCHMARKS.md).
const ARRIVALS_MAX_REQUESTS: usize = 2048;
const ARRIVALS_MAX_WAIT: Duration = Duration::from_micros(500);

/// Says that a batch's clients are being closed unacknowledged.
fn commit_failed(e: &str) {
    eprintln!("ember: commit failed, closing the batch's clients unacknowledged: {e}");
}

/// What every thread shares.
pub struct Shared {
    pub cfg: RwLock<Config>,
    /// Bumped by CONFIG SET so workers reload their cached settings.
    pub cfg_epoch: AtomicU64,
    pub store: AnyStore,
    pub startup: Startup,
    /// Keys per database (DBSIZE, INFO keyspace), kept by every write.
    pub counts: Arc<KeyCounts>,
    pub stripes: Stripes,
    /// Set by [`Shared::begin_shutdown`] (SHUTDOWN, SIGTERM, SIGINT, a fatal
    /// error); every loop checks it.
    pub shutdown: AtomicBool,
    /// The wakers of every poll loop (workers and acceptor): shutdown wakes
    /// them instead of waiting for their poll timeouts.
    pub wakers: Mutex<Vec<Arc<Waker>>>,
    pub clients: Mutex<BTreeMap<u64, Arc<ClientMeta>>>,
    pub next_client_id: AtomicU64,
    pub connected: AtomicU64,
    pub stats: Stats,
    pub started: Instant,
    pub run_id: String,
    pub tcp_port: u16,
}

impl Shared {
    pub fn cfg(&self) -> std::sync::RwLockReadGuard<'_, Config> {
        self.cfg.read().unwrap_or_else(|p| p.into_inner())
    }

    /// Starts a clean shutdown: every loop stops at its next check, and the
    /// poll loops are woken now.
    pub fn begin_shutdown(&self) {
        self.shutdown.store(true, Ordering::Release);
        for w in self.wakers.lock().unwrap_or_else(|p| p.into_inner()).iter() {
            let _ = w.wake();
        }
    }
}

/// A client as other threads see it (CLIENT LIST, INFO clients).
pub struct ClientMeta {
    pub id: u64,
    pub addr: String,
    pub laddr: String,
    pub fd: i32,
    pub created: Stamp,
    pub name: Mutex<String>,
    pub lib_name: Mutex<String>,
    pub lib_ver: Mutex<String>,
    pub db: AtomicU8,
    pub resp: AtomicU8,
    /// Milliseconds since `created` of the last command.
    pub last_ms: AtomicU64,
    /// Index of the last command in the command table (+1; 0 = none).
    pub last_cmd: AtomicU64,
}

impl ClientMeta {
    /// A new connection's metadata, stamped now.
    fn new(id: u64, addr: String, laddr: String, fd: i32) -> ClientMeta {
        ClientMeta {
            id,
            addr,
            laddr,
            fd,
            created: Stamp::now(),
            name: Mutex::new(String::new()),
            lib_name: Mutex::new(String::new()),
            lib_ver: Mutex::new(String::new()),
            db: AtomicU8::new(0),
            resp: AtomicU8::new(2),
            last_ms: AtomicU64::new(0),
            last_cmd: AtomicU64::new(0),
        }
    }
}

impl ClientMeta {
    /// The client connected from a loopback address (Redis's `connIsLocal`).
    pub fn is_local(&self) -> bool {
        self.addr
            .parse::<SocketAddr>()
            .is_ok_and(|a| is_loopback(a.ip()))
    }

    /// One line of CLIENT LIST / CLIENT INFO (Redis's field order).
    pub fn line(&self) -> String {
        let age_ms = Stamp::now().millis_since(self.created);
        let idle = age_ms.saturating_sub(self.last_ms.load(Ordering::Relaxed)) / 1000;
        let cmd = match self.last_cmd.load(Ordering::Relaxed) {
            0 => "NULL".to_string(),
            i => cmd::TABLE
                .get(i as usize - 1)
                .map(|c| c.name.to_string())
                .unwrap_or_default(),
        };
        format!(
            "id={} addr={} laddr={} fd={} name={} age={} idle={} flags=N db={} sub=0 psub=0 ssub=0 multi=-1 qbuf=0 qbuf-free=0 argv-mem=0 multi-mem=0 rbs=0 rbp=0 obl=0 oll=0 omem=0 tot-mem=0 events=r cmd={} user=default redir=-1 resp={} lib-name={} lib-ver={}",
            self.id,
            self.addr,
            self.laddr,
            self.fd,
            self.name.lock().unwrap_or_else(|p| p.into_inner()),
            age_ms / 1000,
            idle,
            self.db.load(Ordering::Relaxed),
            cmd,
            self.resp.load(Ordering::Relaxed),
            self.lib_name.lock().unwrap_or_else(|p| p.into_inner()),
            self.lib_ver.lock().unwrap_or_else(|p| p.into_inner()),
        )
    }
}

/// One connection, owned by its worker.
pub struct Client {
    pub id: u64,
    sock: TcpStream,
    inbuf: Vec<u8>,
    inpos: usize,
    pub out: Vec<u8>,
    outpos: usize,
    /// Bytes dropped from the front of `out` so far: `out_base + i` is the
    /// absolute position of `out[i]` (see `commit`).
    out_base: u64,
    /// Output may be written up to this absolute position: replies past it
    /// wait for their batch's commit.
    ready_to: u64,
    pub db: u8,
    pub resp: Version,
    pub authed: bool,
    /// Close once the output is written (QUIT, protocol error).
    pub close_after: bool,
    /// Close now, without writing (query buffer limit).
    kill: bool,
    /// The peer shut down its side: run what is buffered, answer, then close.
    eof: bool,
    /// An event said the peer shut down its side (or the socket failed): read
    /// on to the end of the stream, even after a short read.
    peer_closing: bool,
    /// Stopped at the output high water with input left; resumes (through
    /// `pending`) once a flush brings the output below it.
    stalled: bool,
    /// Progress through a pending multibulk request (see [`Resume`]).
    resume: Resume,
    pub meta: Arc<ClientMeta>,
    last_active: Instant,
    want_write: bool,
}

impl Client {
    /// A new connection: nothing read or queued yet, RESP2, database 0.
    fn new(id: u64, sock: TcpStream, meta: Arc<ClientMeta>, authed: bool) -> Client {
        Client {
            id,
            sock,
            inbuf: Vec::new(),
            inpos: 0,
            out: Vec::new(),
            outpos: 0,
            out_base: 0,
            ready_to: 0,
            db: 0,
            resp: Version::Resp2,
            authed,
            close_after: false,
            kill: false,
            eof: false,
            peer_closing: false,
            stalled: false,
            resume: Resume::default(),
            meta,
            last_active: Instant::now(),
            want_write: false,
        }
    }
}

impl Client {
    pub fn reply(&mut self, r: &Reply) {
        r.encode(self.resp, &mut self.out);
    }
    pub fn ok(&mut self) {
        self.out.extend_from_slice(b"+OK\r\n");
    }
    pub fn simple(&mut self, s: &str) {
        self.reply(&Reply::Simple(s.into()));
    }
    pub fn err(&mut self, s: &str) {
        self.reply(&Reply::Error(s.into()));
    }
    pub fn int(&mut self, n: i64) {
        self.out.push(b':');
        self.out
            .extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
        self.out.extend_from_slice(b"\r\n");
    }
    pub fn bulk(&mut self, b: &[u8]) {
        self.out.push(b'$');
        self.out
            .extend_from_slice(itoa::Buffer::new().format(b.len()).as_bytes());
        self.out.extend_from_slice(b"\r\n");
        self.out.extend_from_slice(b);
        self.out.extend_from_slice(b"\r\n");
    }
    pub fn null(&mut self) {
        self.reply(&Reply::Null);
    }
    pub fn array_header(&mut self, n: usize) {
        self.out.push(b'*');
        self.out
            .extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
        self.out.extend_from_slice(b"\r\n");
    }
}

/// A worker's cached copy of the settings it checks per request.
struct Settings {
    epoch: u64,
    limits: Limits,
    /// `limits` tightened for clients that still have to authenticate.
    unauth_limits: Limits,
    requirepass: Option<String>,
    timeout: u64,
    hz: u64,
    busy_poll: Duration,
}

impl Settings {
    fn load(sh: &Shared) -> Settings {
        let epoch = sh.cfg_epoch.load(Ordering::Acquire);
        let c = sh.cfg();
        let limits = Limits {
            max_bulk_len: c.proto_max_bulk_len as usize,
            max_query_buffer: c.client_query_buffer_limit as usize,
            ..Limits::default()
        };
        Settings {
            epoch,
            limits,
            unauth_limits: Limits {
                max_multibulk_len: UNAUTH_MAX_MULTIBULK,
                max_bulk_len: UNAUTH_MAX_BULK.min(limits.max_bulk_len),
                ..limits
            },
            requirepass: c.requirepass.clone(),
            timeout: c.timeout,
            hz: c.hz,
            busy_poll: Duration::from_micros(c.busy_poll_us),
        }
    }
}

struct Worker {
    id: usize,
    sh: Arc<Shared>,
    poll: Poll,
    rx: Receiver<NewConn>,
    clients: HashMap<Token, Client>,
    next_token: usize,
    ks: Keyspace,
    ws: Arc<WorkerStats>,
    settings: Settings,
    /// Active expiry: the scan cursor of the running pass.
    expire_cursor: u64,
    /// Clients with input left unprocessed (read budget, or output that fell
    /// back below the high water).
    pending: Vec<Token>,
    /// Scratch buffer every socket read goes through.
    rbuf: Vec<u8>,
    /// The arguments of the request being executed (slots reused).
    args: proto::Args,
    /// The store keys of a pipeline being prefetched (see `prefetch_pipeline`).
    pf_keys: Vec<u8>,
    /// Commits in flight on the syncer thread, and the replies they hold.
    committer: Committer,
    /// Requests executed in the current batch.
    batch_requests: usize,
    /// `commit-pipeline`: large batches commit on the syncer thread.
    pipeline: bool,
}

impl Worker {
    fn run(mut self) {
        let mut events = Events::with_capacity(1024);
        let mut last_tick = Instant::now();
        let mut busy_maint = false;
        let mut ready: Vec<Token> = Vec::new();
        // The last batch's clients each sent one or two requests: they wait
        // for each reply, so the next request comes within microseconds.
        let mut unpipelined = false;
        // A wake-up (new connection, commit completed) that `serve_arrivals`
        // took: the next poll must not sleep.
        let mut rewake = false;
        while !self.sh.shutdown.load(Ordering::Acquire) {
            let period = Duration::from_millis(1000 / self.settings.hz.max(1));
            let timeout = if busy_maint || std::mem::take(&mut rewake) || !self.pending.is_empty() {
                Duration::ZERO
            } else {
                period
            };
            let spin = if unpipelined {
                self.settings.busy_poll
            } else {
                Duration::ZERO
            };
            if let Err(e) = self.poll_spinning(&mut events, timeout, spin) {
                if e.kind() != ErrorKind::Interrupted {
                    eprintln!("ember: worker {} poll failed: {e}", self.id);
                    break;
                }
            }
            self.reload_settings();
            self.adopt_new();
            ready.clear();
            ready.append(&mut self.pending);
            self.take_events(&events, &mut ready);
            ready.sort_unstable();
            ready.dedup();
            // Replies whose commits completed while the worker polled.
            self.reap_commits(false);
            let mut requesting = 0;
            for &t in &ready {
                let before = self.batch_requests;
                self.serve(t);
                requesting += usize::from(self.batch_requests > before);
            }
            let group = self.ks.sess.awaits_commit();
            if group {
                rewake = self.serve_arrivals(&mut events, &mut ready, &mut requesting);
            }
            let served = self.batch_requests;
            if group {
                self.ws.group_commit_batches.add(1);
                self.ws.group_commit_requests.add(served as u64);
            }
            unpipelined = served > 0 && served <= 2 * requesting;
            self.commit_batch(&ready);
            for &t in &ready {
                self.flush(t);
            }
            busy_maint = match self.ks.sess.maintain() {
                Ok(b) => b,
                Err(e) => {
                    eprintln!("ember: background store work failed: {e}");
                    false
                }
            };
            if last_tick.elapsed() >= period {
                last_tick = Instant::now();
                crate::clock::recalibrate();
                self.tick();
            }
        }
        // Shutdown: the commits in flight complete and release their
        // replies; then every connection of this worker closes.
        self.reap_commits(true);
        let tokens: Vec<Token> = self.clients.keys().copied().collect();
        for t in tokens {
            self.flush(t);
            self.drop_client(t);
        }
    }

    /// Adds the connections a poll found ready to `ready` (noting those whose
    /// peer is closing); returns whether the waker fired (a new connection or
    /// a completed commit).
    fn take_events(&mut self, events: &Events, ready: &mut Vec<Token>) -> bool {
        let mut woken = false;
        for ev in events.iter() {
            if ev.token() == WAKER {
                woken = true;
                continue;
            }
            if ev.is_read_closed() || ev.is_error() {
                if let Some(c) = self.clients.get_mut(&ev.token()) {
                    c.peer_closing = true;
                }
            }
            ready.push(ev.token());
        }
        woken
    }

    /// Before a group commit: serves the requests that arrived while the batch
    /// was being served, and those that arrived meanwhile, until none is
    /// waiting (or `ARRIVALS_MAX_REQUESTS` / `ARRIVALS_MAX_WAIT`), adding
    /// their clients to `ready`, so that one commit covers them all. A commit
    /// costs a device write whatever it covers; a client whose requests were
    /// served cannot send more until its replies are written, so under a
    /// closed-loop load the loop ends when every client waits for the commit.
    /// Returns true when it took a wake-up event (see `run`).
    fn serve_arrivals(
        &mut self,
        events: &mut Events,
        ready: &mut Vec<Token>,
        requesting: &mut usize,
    ) -> bool {
        let start = Instant::now();
        let mut woken = false;
        while self.batch_requests < ARRIVALS_MAX_REQUESTS && start.elapsed() < ARRIVALS_MAX_WAIT {
            if self.poll.poll(events, Some(Duration::ZERO)).is_err() {
                break;
            }
            let from = ready.len();
            woken |= self.take_events(events, ready);
            if ready.len() == from {
                break;
            }
            for &t in &ready[from..] {
                let before = self.batch_requests;
                self.serve(t);
                *requesting += usize::from(self.batch_requests > before);
            }
        }
        ready.sort_unstable();
        ready.dedup();
        woken
    }

    /// Group commit, after a batch: its log appends become durable before any
    /// of its replies is written. In msync mode the commit is detached and
    /// runs on the syncer thread while this worker serves the next batches,
    /// whose writes accumulate for the commit after it (submitted when it
    /// completes: one device write at a time, each covering everything served
    /// during the previous one). A batch's replies, reads too, are held until
    /// the commit covering it completes (see `commit`). Elsewhere every write
    /// was durable when it returned and the replies are released at once.
    ///
    /// Only with `commit-pipeline yes`; otherwise every batch commits in line.
    /// A batch of fewer than `PIPELINE_MIN_REQUESTS` requests with nothing in
    /// flight commits in line, as it would without the syncer: handing a
    /// commit over and being woken for its end costs two thread switches, and
    /// what a small batch could overlap with the device's write is smaller
    /// still (the requests that arrive meanwhile are few, and the `msync`'s
    /// own CPU work runs on this worker's CPU either way; see `commit`).
    fn commit_batch(&mut self, ready: &[Token]) {
        let small = !self.pipeline || self.batch_requests < PIPELINE_MIN_REQUESTS;
        self.batch_requests = 0;
        let next = self.committer.in_flight();
        if !next {
            let r = if small {
                self.ks.sess.commit()
            } else {
                self.ks.sess.commit_detached().map(|p| {
                    if let Some(p) = p {
                        self.submit(p);
                    }
                })
            };
            if let Err(e) = r {
                commit_failed(&e.to_string());
                let tokens = ready.to_vec();
                self.kill_and_flush(tokens);
            }
            if !self.committer.in_flight() {
                for t in ready {
                    if let Some(c) = self.clients.get_mut(t) {
                        c.ready_to = c.out_base + c.out.len() as u64;
                    }
                }
                return;
            }
        }
        let marks = ready
            .iter()
            .filter_map(|t| {
                let c = self.clients.get(t)?;
                Some((*t, c.out_base + c.out.len() as u64))
            })
            .collect();
        let now = self.committer.hold(marks, next);
        debug_assert!(now.is_empty());
    }

    /// Takes the outcomes of the commits the syncer completed (waits for all
    /// when `wait_all`): writes the replies they held, or closes the clients
    /// of a batch whose commit failed, unacknowledged. With none in flight any
    /// more, what the batches since accumulated is submitted as the next.
    fn reap_commits(&mut self, wait_all: bool) {
        loop {
            if !self.committer.holding() && !self.committer.in_flight() {
                return;
            }
            let r = if wait_all {
                self.committer.finish()
            } else {
                self.committer.reap(false)
            };
            for e in &r.errors {
                commit_failed(e);
            }
            self.kill_and_flush(r.failed);
            self.release(r.release);
            if self.committer.in_flight() || !self.committer.waiting_for_next() {
                return;
            }
            match self.ks.sess.commit_detached() {
                Ok(Some(p)) => self.submit(p),
                Ok(None) => {
                    let r = self.committer.release_next();
                    self.release(r);
                }
                Err(e) => {
                    commit_failed(&e.to_string());
                    let f = self.committer.fail_next();
                    self.kill_and_flush(f);
                }
            }
            if !wait_all {
                return;
            }
        }
    }

    fn submit(&mut self, p: engine::PendingCommit) {
        self.committer.submit(p);
        self.ws.commits_pipelined.add(1);
    }

    /// Output released by completed commits: written now.
    fn release(&mut self, marks: Vec<(Token, u64)>) {
        for (t, pos) in marks {
            if let Some(c) = self.clients.get_mut(&t) {
                c.ready_to = c.ready_to.max(pos);
            }
            self.flush(t);
        }
    }

    fn kill_and_flush(&mut self, tokens: Vec<Token>) {
        for t in tokens {
            if let Some(c) = self.clients.get_mut(&t) {
                c.kill = true;
            }
            self.flush(t);
        }
    }

    /// Picks up CONFIG SET changes. When the password is removed, clients
    /// that had not authenticated no longer need to (Redis: the default user
    /// becomes `nopass`).
    fn reload_settings(&mut self) {
        if self.sh.cfg_epoch.load(Ordering::Acquire) == self.settings.epoch {
            return;
        }
        self.settings = Settings::load(&self.sh);
        if self.settings.requirepass.is_none() {
            for c in self.clients.values_mut() {
                c.authed = true;
            }
        }
    }

    fn adopt_new(&mut self) {
        while let Ok((s, peer)) = self.rx.try_recv() {
            let _ = s.set_nodelay(true);
            let laddr = s.local_addr().map(|a| a.to_string()).unwrap_or_default();
            let fd = {
                use std::os::fd::AsRawFd;
                s.as_raw_fd()
            };
            let mut sock = TcpStream::from_std(s);
            self.next_token += 1;
            let token = Token(self.next_token);
            if self
                .poll
                .registry()
                .register(&mut sock, token, Interest::READABLE)
                .is_err()
            {
                self.sh.connected.fetch_sub(1, Ordering::AcqRel);
                continue;
            }
            let id = self.sh.next_client_id.fetch_add(1, Ordering::Relaxed);
            let meta = Arc::new(ClientMeta::new(id, peer.to_string(), laddr, fd));
            self.sh
                .clients
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(id, meta.clone());
            let authed = self.settings.requirepass.is_none();
            self.clients
                .insert(token, Client::new(id, sock, meta, authed));
            // Data may have arrived before registration: look once.
            self.pending.push(token);
        }
    }

    /// Reads what the socket has and executes every complete request.
    fn serve(&mut self, t: Token) {
        let Some(mut c) = self.clients.remove(&t) else {
            return;
        };
        if !c.close_after && !c.kill {
            self.read_and_run(&mut c, t);
        }
        self.clients.insert(t, c);
    }

    fn read_and_run(&mut self, c: &mut Client, t: Token) {
        // Execute what is already buffered first (a client left pending).
        c.stalled = false;
        let mut read_total = 0usize;
        // A read that returned less than it asked for emptied the socket's
        // receive queue: more data will come with an event of its own (edge
        // triggered: data arriving later is a new edge), so there is no need
        // for one more read that would only say "would block" (a third of a
        // pipelining client's system calls). Not when the peer is shutting
        // down: its end of stream may already be queued behind the data, and
        // no event would announce it again.
        let mut drained = false;
        loop {
            if !self.run_requests(c) {
                // Output high water: stop reading and executing until a flush
                // drains the output (the WRITABLE event brings the client
                // back; see `flush`). Nothing spins meanwhile.
                c.stalled = true;
                return;
            }
            if c.close_after || c.kill {
                break;
            }
            if c.eof {
                // Every complete request has run; what is left is a truncated
                // request nobody will finish. Answer, then close.
                c.close_after = true;
                break;
            }
            if c.inbuf.len() - c.inpos > self.settings.limits.max_query_buffer {
                self.query_buffer_limit(c);
                break;
            }
            if drained {
                break;
            }
            if read_total >= READ_BUDGET {
                self.pending.push(t);
                return;
            }
            match c.sock.read(&mut self.rbuf) {
                Ok(0) => c.eof = true,
                Ok(n) => {
                    c.inbuf.extend_from_slice(&self.rbuf[..n]);
                    drained = n < self.rbuf.len() && !c.peer_closing;
                    read_total += n;
                    self.ws.net_in.add(n as u64);
                    c.last_active = Instant::now();
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => {
                    c.kill = true;
                    break;
                }
            }
        }
    }

    /// Redis closes such a client without a reply, and logs it.
    fn query_buffer_limit(&mut self, c: &mut Client) {
        eprintln!(
            "ember: closing client id={} addr={} that reached the query buffer limit ({} bytes pending, client-query-buffer-limit {})",
            c.id,
            c.meta.addr,
            c.inbuf.len() - c.inpos,
            self.settings.limits.max_query_buffer
        );
        c.kill = true;
        c.inbuf = Vec::new();
        c.inpos = 0;
        c.resume = Resume::default();
    }

    /// Runs buffered requests; false when stopped at the output high water.
    fn run_requests(&mut self, c: &mut Client) -> bool {
        // One clock read per command: each command's time runs from the end
        // of the previous one (parsing included), and expiry is judged
        // against the time this run of requests started.
        let now = crate::keyspace::now_ms();
        self.prefetch_pipeline(c);
        // After the prefetch, which is the batch's, not its first command's.
        let mut clock = Stamp::now();
        let mut args = std::mem::take(&mut self.args);
        let r = self.run_requests_with(c, &mut args, &mut clock, now);
        args.trim();
        self.args = args;
        r
    }

    /// A pipeline of requests waits in `c`'s buffer: the store starts fetching
    /// their keys' entries from memory before the first one runs, so that the
    /// cache misses of the batch overlap (a hint; the argument after the
    /// command name is taken as the key, in the client's current database).
    fn prefetch_pipeline(&mut self, c: &Client) {
        const MAX: usize = 32;
        const MAX_KEY: usize = 256;
        let buf = &c.inbuf[c.inpos..];
        if buf.first() != Some(&b'*') {
            return;
        }
        let keys = &mut self.pf_keys;
        keys.clear();
        let mut ends = [0usize; MAX];
        let mut n = 0;
        proto::peek_requests(buf, MAX, |_, key| {
            if let Some(k) = key.filter(|k| k.len() <= MAX_KEY) {
                keys.push(c.db);
                keys.extend_from_slice(k);
                ends[n] = keys.len();
                n += 1;
            }
        });
        if n < 2 {
            return;
        }
        let mut slices: [&[u8]; MAX] = [&[]; MAX];
        let mut start = 0;
        for (s, &e) in slices.iter_mut().zip(&ends[..n]) {
            *s = &keys[start..e];
            start = e;
        }
        self.ks.sess.prefetch(&slices[..n]);
    }

    fn run_requests_with(
        &mut self,
        c: &mut Client,
        args: &mut proto::Args,
        clock: &mut Stamp,
        now: i64,
    ) -> bool {
        loop {
            if c.close_after || c.kill {
                return true;
            }
            if c.out.len() - c.outpos > OUT_HIGH_WATER {
                return false;
            }
            if c.inpos == c.inbuf.len() {
                if c.inbuf.capacity() > KEEP_BUF {
                    c.inbuf = Vec::new();
                } else {
                    c.inbuf.clear();
                }
                c.inpos = 0;
                return true;
            }
            let limits = if c.authed {
                &self.settings.limits
            } else {
                &self.settings.unauth_limits
            };
            if c.resume.active && !c.resume.advance(&c.inbuf[c.inpos..], limits) {
                // Still incomplete: not worth a full parse.
                if c.inpos > 0 {
                    c.inbuf.drain(..c.inpos);
                    c.inpos = 0;
                }
                return true;
            }
            c.resume = Resume::default();
            match proto::parse_request_into(&c.inbuf[c.inpos..], limits, args) {
                Ok(Some(consumed)) => {
                    c.inpos += consumed;
                    let args = args.as_slice();
                    if args.is_empty() {
                        continue;
                    }
                    if is_http_attack(&args[0]) {
                        eprintln!("ember: possible SECURITY ATTACK detected from {}: a POST or Host: command (cross protocol scripting?); connection aborted", c.meta.addr);
                        c.kill = true;
                        return true;
                    }
                    // A CONFIG SET earlier in this batch (requirepass, limits)
                    // applies from the next command on.
                    self.reload_settings();
                    if self.settings.requirepass.is_none() {
                        c.authed = true;
                    }
                    let mut ctx = Ctx {
                        sh: &self.sh,
                        ks: &mut self.ks,
                        ws: &self.ws,
                        now,
                        requirepass: self.settings.requirepass.as_deref(),
                    };
                    cmd::execute(&mut ctx, c, args, clock);
                    self.batch_requests += 1;
                }
                Ok(None) => {
                    if c.inpos > 0 {
                        c.inbuf.drain(..c.inpos);
                        c.inpos = 0;
                    }
                    // Track the request from here on, so that each read
                    // costs what it brought, not a parse of all that came
                    // before it.
                    c.resume = Resume::start(&c.inbuf, limits);
                    return true;
                }
                Err(e) => {
                    if e == proto::ProtoError::QueryBufferLimit {
                        self.query_buffer_limit(c);
                        return true;
                    }
                    let unauth = !c.authed
                        && matches!(
                            e,
                            proto::ProtoError::InvalidMultibulkLength
                                | proto::ProtoError::InvalidBulkLength
                        )
                        && !matches!(
                            proto::parse_request(&c.inbuf[c.inpos..], &self.settings.limits),
                            Parsed::Error(_)
                        );
                    if unauth {
                        let what = if e == proto::ProtoError::InvalidMultibulkLength {
                            "multibulk"
                        } else {
                            "bulk"
                        };
                        c.err(&format!(
                            "ERR Protocol error: unauthenticated {what} length"
                        ));
                    } else {
                        c.reply(&e.to_reply());
                    }
                    c.close_after = true;
                    c.inbuf = Vec::new();
                    c.inpos = 0;
                    return true;
                }
            }
        }
    }

    /// Writes buffered output; closes clients that are done.
    fn flush(&mut self, t: Token) {
        let Some(c) = self.clients.get_mut(&t) else {
            return;
        };
        // What may be written: the replies whose commits are complete.
        let limit = (c.ready_to.saturating_sub(c.out_base) as usize).min(c.out.len());
        if !c.kill {
            while c.outpos < limit {
                match c.sock.write(&c.out[c.outpos..limit]) {
                    Ok(0) => {
                        c.kill = true;
                        break;
                    }
                    Ok(n) => {
                        c.outpos += n;
                        self.ws.net_out.add(n as u64);
                    }
                    Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == ErrorKind::Interrupted => {}
                    Err(_) => {
                        c.kill = true;
                        break;
                    }
                }
            }
        }
        if c.outpos == c.out.len() {
            c.out_base += c.out.len() as u64;
            if c.out.capacity() > KEEP_BUF {
                c.out = Vec::new();
            } else {
                c.out.clear();
            }
            c.outpos = 0;
        } else if c.outpos > 1 << 20 && c.outpos >= c.out.len() / 2 {
            // Drop what was written once it is at least half the buffer, so
            // the copying stays linear in the bytes sent.
            c.out.drain(..c.outpos);
            c.out_base += c.outpos as u64;
            c.outpos = 0;
        }
        let done = c.kill || (c.close_after && c.out.is_empty());
        if done {
            self.drop_client(t);
            return;
        }
        if c.stalled && c.out.len() - c.outpos <= OUT_HIGH_WATER {
            // Back below the high water: execute the rest of its pipeline
            // (and read more) in the next round.
            c.stalled = false;
            self.pending.push(t);
        }
        // Writable events matter only for output that may be written.
        let want = c.out_base + (c.outpos as u64) < c.ready_to.min(c.out_base + c.out.len() as u64);
        if want != c.want_write {
            c.want_write = want;
            let interest = if want {
                Interest::READABLE | Interest::WRITABLE
            } else {
                Interest::READABLE
            };
            let _ = self.poll.registry().reregister(&mut c.sock, t, interest);
        }
    }

    fn drop_client(&mut self, t: Token) {
        if let Some(mut c) = self.clients.remove(&t) {
            let _ = self.poll.registry().deregister(&mut c.sock);
            self.sh
                .clients
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&c.id);
            self.sh.connected.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// Polls for events: without sleeping for up to `spin` (yielding the CPU
    /// to any other runnable thread between polls), then blocking for up to
    /// `timeout`. Under a load of small requests without pipelining, a worker
    /// that served everything otherwise sleeps until the next request, and
    /// the client's send then pays for waking it: 10% of the throughput of
    /// SET and GET -P 1 on two cores. The caller spins only after a batch of
    /// such clients: after pipelined batches, spinning took CPU from the
    /// gleaner and the client (SET -P 16 about 7% slower).
    fn poll_spinning(
        &mut self,
        events: &mut Events,
        timeout: Duration,
        spin: Duration,
    ) -> std::io::Result<()> {
        let spin = spin.min(timeout);
        if !spin.is_zero() {
            let start = Instant::now();
            loop {
                self.poll.poll(events, Some(Duration::ZERO))?;
                if !events.is_empty() || start.elapsed() >= spin {
                    break;
                }
                std::thread::yield_now();
            }
            if !events.is_empty() {
                return Ok(());
            }
        }
        self.poll.poll(events, Some(timeout))
    }

    /// Periodic work: idle timeouts, and (worker 0) one active-expiry step.
    fn tick(&mut self) {
        if self.settings.timeout > 0 {
            let limit = Duration::from_secs(self.settings.timeout);
            let idle: Vec<Token> = self
                .clients
                .iter()
                .filter(|(_, c)| c.last_active.elapsed() > limit && c.out.is_empty())
                .map(|(t, _)| *t)
                .collect();
            for t in idle {
                self.drop_client(t);
            }
        }
        if self.id == 0 {
            self.active_expire();
        }
        self.ws.expired_keys.set_total(self.ks.expired);
    }

    /// Redis's active expiry, adapted: keys with a TTL are not indexed
    /// separately, so each tick walks the next slice of the keyspace (a scan
    /// cursor that wraps around) and deletes what has expired, for at most
    /// ~25% of the tick period; a slice where a quarter or more of the keys had
    /// expired is followed at once by another.
    fn active_expire(&mut self) {
        let budget = Duration::from_millis(250 / self.settings.hz.max(1));
        let t0 = Instant::now();
        // A database left without keys with a TTL starts its `avg_ttl` over,
        // as Redis's does.
        for db in 0..=u8::MAX {
            if let Some((_, 0)) = self.sh.counts.get(db) {
                self.sh.counts.reset_avg_ttl(db);
            }
        }
        let mut keys = Vec::new();
        loop {
            keys.clear();
            let next = match self.ks.sess.scan(self.expire_cursor, 200, &mut keys) {
                Ok(n) => n,
                Err(e) => {
                    eprintln!("ember: active expiry scan failed: {e}");
                    return;
                }
            };
            self.expire_cursor = next;
            let now = crate::keyspace::now_ms();
            let mut expired = 0;
            let seen = keys.len();
            // TTLs left on the live keys seen, per database: (sum, count);
            // i128, as a TTL may lie near the end of time (PXAT).
            let mut ttls: BTreeMap<u8, (i128, i64)> = BTreeMap::new();
            for k in &keys {
                match self.ks.lookup_raw(k, now) {
                    Ok((None, true)) => {
                        let _g = self.sh.stripes.lock(k);
                        if let Ok((None, true)) = self.ks.lookup_raw(k, now) {
                            if self.ks.lookup_expiring(k, now).is_ok() {
                                expired += 1;
                            }
                        }
                    }
                    Ok((Some(h), false)) => {
                        if let (Some(t), Some(&db)) = (h.expire, k.first()) {
                            let e = ttls.entry(db).or_default();
                            e.0 += i128::from(t - now);
                            e.1 += 1;
                        }
                    }
                    _ => {}
                }
            }
            for (db, (sum, n)) in ttls {
                self.sh.counts.sample_ttls(db, sum, n);
            }
            if next == 0 || seen == 0 || expired * 4 < seen || t0.elapsed() >= budget {
                return;
            }
        }
    }
}

/// Where the scan of a pending (incomplete) multibulk request stands.
///
/// The request parser is stateless: given an incomplete request it starts
/// over from its first byte each time. A request of many arguments arriving
/// in many reads would be re-parsed once per read, quadratic in its size (a
/// 4 MB MSET took 0.7 s of a worker). `Resume` walks the frame structure
/// incrementally, as far as the bytes go, and says when the parser might have
/// something other than `Incomplete` to say: the request looks complete, or
/// something in it is not plainly well-formed (the parser then reports the
/// error with its exact text). It only decides when to parse, never what a
/// request means, and it errs towards parsing: whenever it reports "still
/// incomplete", [`proto::parse_request`] would too (a unit test checks this
/// on every prefix of a set of requests).
#[derive(Default, Debug, Clone, Copy, PartialEq, Eq)]
struct Resume {
    active: bool,
    /// Arguments not yet complete.
    args_left: usize,
    /// Offset (from the request's start) of the first incomplete argument.
    pos: usize,
}

impl Resume {
    /// Starts tracking the request at the front of `buf`, which the parser
    /// found incomplete. Inactive unless it is a multibulk request whose
    /// count line is complete and positive.
    fn start(buf: &[u8], limits: &Limits) -> Resume {
        if buf.first() != Some(&b'*') {
            return Resume::default();
        }
        let Some(cr) = buf.iter().position(|&b| b == b'\r') else {
            return Resume::default();
        };
        if cr + 2 > buf.len() {
            return Resume::default();
        }
        let Some(n) = digits(&buf[1..cr]) else {
            return Resume::default();
        };
        if n == 0 || n > limits.max_multibulk_len as u64 {
            return Resume::default();
        }
        let mut r = Resume {
            active: true,
            args_left: n as usize,
            pos: cr + 2,
        };
        if r.advance(buf, limits) {
            // Disagrees with the parser's Incomplete: just parse next time.
            r = Resume::default();
        }
        r
    }

    /// Walks the arguments that arrived; true when the parser must run (the
    /// request may be complete, or may be malformed).
    fn advance(&mut self, buf: &[u8], limits: &Limits) -> bool {
        if buf.len() > limits.max_query_buffer {
            return true;
        }
        while self.args_left > 0 {
            let Some(rest) = buf.get(self.pos..) else {
                return true;
            };
            let Some(cr) = rest.iter().position(|&b| b == b'\r') else {
                return rest.len() > limits.max_inline_len;
            };
            if cr + 2 > rest.len() {
                return false;
            }
            if rest[0] != b'$' {
                return true;
            }
            let Some(len) = digits(&rest[1..cr]) else {
                return true;
            };
            if len > limits.max_bulk_len as u64 {
                return true;
            }
            let need = (cr + 2) as u64 + len + 2;
            if (rest.len() as u64) < need {
                return false;
            }
            self.pos += need as usize;
            self.args_left -= 1;
        }
        true
    }
}

/// A non-negative integer as Redis's `string2ll` accepts it: digits only, no
/// sign, no leading zero, no overflow.
fn digits(s: &[u8]) -> Option<u64> {
    if s.is_empty() || s.len() > 19 || (s[0] == b'0' && s.len() > 1) {
        return None;
    }
    let mut v: u64 = 0;
    for &c in s {
        if !c.is_ascii_digit() {
            return None;
        }
        v = v.checked_mul(10)?.checked_add(u64::from(c - b'0'))?;
    }
    Some(v)
}

/// The acceptor: accepts, enforces maxclients and protected mode, and hands
/// connections to workers round-robin.
fn accept_loop(
    sh: Arc<Shared>,
    mut poll: Poll,
    mut listeners: Vec<TcpListener>,
    workers: Vec<(Sender<NewConn>, Arc<Waker>)>,
) {
    for (i, l) in listeners.iter_mut().enumerate() {
        if let Err(e) = poll.registry().register(l, Token(i), Interest::READABLE) {
            eprintln!("ember: acceptor: {e}");
            sh.begin_shutdown();
            return;
        }
    }
    let mut events = Events::with_capacity(64);
    let mut rr = 0usize;
    // After an accept error (EMFILE, ENFILE, ENOBUFS) the connections left in
    // the backlog raise no new edge: retry every listener shortly.
    let mut retry = false;
    let mut last_error_log: Option<Instant> = None;
    let mut todo: Vec<usize> = Vec::new();
    while !sh.shutdown.load(Ordering::Acquire) {
        let timeout = Duration::from_millis(if retry { 10 } else { 100 });
        if let Err(e) = poll.poll(&mut events, Some(timeout)) {
            if e.kind() != ErrorKind::Interrupted {
                eprintln!("ember: acceptor poll: {e}");
                break;
            }
        }
        todo.clear();
        if retry {
            todo.extend(0..listeners.len());
            retry = false;
        } else {
            todo.extend(
                events
                    .iter()
                    .map(|ev| ev.token().0)
                    .filter(|&i| i < listeners.len()),
            );
        }
        for &i in &todo {
            let l = &listeners[i];
            loop {
                match l.accept() {
                    Ok((s, peer)) => {
                        // mio hands out nonblocking sockets; go back to std to
                        // pass it across threads.
                        let s: std::net::TcpStream = {
                            use std::os::fd::{FromRawFd, IntoRawFd};
                            // SAFETY: the fd was just taken from a live socket
                            // we own; ownership moves to the std type.
                            unsafe { std::net::TcpStream::from_raw_fd(s.into_raw_fd()) }
                        };
                        sh.stats.total_connections.fetch_add(1, Ordering::Relaxed);
                        let refusal = {
                            let c = sh.cfg();
                            admission(
                                sh.connected.load(Ordering::Acquire),
                                c.maxclients,
                                c.protected_mode,
                                c.requirepass.is_some(),
                                peer.ip(),
                            )
                        };
                        if let Some(msg) = refusal {
                            sh.stats.rejected.fetch_add(1, Ordering::Relaxed);
                            refuse(s, msg);
                            continue;
                        }
                        sh.connected.fetch_add(1, Ordering::AcqRel);
                        let (tx, waker) = &workers[rr % workers.len()];
                        rr += 1;
                        if tx.send((s, peer)).is_err() {
                            sh.connected.fetch_sub(1, Ordering::AcqRel);
                            continue;
                        }
                        let _ = waker.wake();
                    }
                    Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == ErrorKind::Interrupted => {}
                    Err(e) => {
                        // EMFILE and friends: log (once a second at most),
                        // keep serving, retry soon.
                        if last_error_log.is_none_or(|t| t.elapsed() >= Duration::from_secs(1)) {
                            eprintln!("ember: accept failed: {e}");
                            last_error_log = Some(Instant::now());
                        }
                        retry = true;
                        break;
                    }
                }
            }
        }
    }
    for l in &mut listeners {
        let _ = poll.registry().deregister(l);
    }
}

/// Whether a new connection is served: `None`, or the error it gets before
/// being closed (maxclients; protected mode: no password and not loopback).
fn is_loopback(peer: std::net::IpAddr) -> bool {
    match peer {
        std::net::IpAddr::V4(a) => a.is_loopback(),
        // An IPv4 client on a dual-stack socket (::ffff:127.0.0.1).
        std::net::IpAddr::V6(a) => {
            a.is_loopback() || a.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback())
        }
    }
}

fn admission(
    connected: u64,
    maxclients: u64,
    protected: bool,
    has_password: bool,
    peer: std::net::IpAddr,
) -> Option<&'static str> {
    if connected >= maxclients {
        return Some("-ERR max number of clients reached\r\n");
    }
    if protected && !has_password && !is_loopback(peer) {
        return Some(PROTECTED_MSG);
    }
    None
}

/// Redis's answer to a cross-protocol attack: an HTTP request sent to the
/// Redis port parses as the commands `POST` or `Host:`.
fn is_http_attack(name: &[u8]) -> bool {
    name.eq_ignore_ascii_case(b"post") || name.eq_ignore_ascii_case(b"host:")
}

/// Raises the soft RLIMIT_NOFILE towards `maxclients` + a reserve (never
/// lowers it, never above the hard limit). Returns how many clients the limit
/// allows. Called at startup and by CONFIG SET maxclients.
pub fn raise_nofile_limit(maxclients: u64) -> u64 {
    let want = maxclients.saturating_add(RESERVED_FDS);
    // SAFETY: getrlimit/setrlimit only read and write the struct we pass.
    let mut r: libc::rlimit = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) } != 0 {
        eprintln!(
            "ember: cannot read the open file limit: {}",
            std::io::Error::last_os_error()
        );
        return maxclients;
    }
    let cur = r.rlim_cur as u64;
    if r.rlim_cur == libc::RLIM_INFINITY || cur >= want {
        return maxclients.max(cur.saturating_sub(RESERVED_FDS));
    }
    let target = if r.rlim_max == libc::RLIM_INFINITY {
        want
    } else {
        want.min(r.rlim_max as u64)
    };
    let mut got = cur;
    if target > cur {
        r.rlim_cur = target as libc::rlim_t;
        // SAFETY: as above.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &r) } == 0 {
            got = target;
        } else {
            eprintln!(
                "ember: cannot raise the open file limit from {cur} to {target}: {}",
                std::io::Error::last_os_error()
            );
        }
    }
    got.saturating_sub(RESERVED_FDS)
}

/// mio listens with the standard library's backlog (128): a burst of
/// connects overflows it while the acceptor is descheduled, and each dropped
/// SYN costs that client a one-second retransmit. `listen` again with
/// `tcp-backlog` (Linux takes a new backlog on a listening socket).
fn set_backlog(l: &TcpListener, backlog: u32) {
    use std::os::fd::AsRawFd;
    let n = backlog.min(i32::MAX as u32) as i32;
    // SAFETY: listen(2) on a socket we own; no memory is passed.
    if unsafe { libc::listen(l.as_raw_fd(), n) } != 0 {
        eprintln!(
            "ember: cannot set tcp-backlog {backlog}: {}",
            std::io::Error::last_os_error()
        );
    }
    if let Some(max) = std::fs::read_to_string("/proc/sys/net/core/somaxconn")
        .ok()
        .and_then(|s| s.trim().parse::<u32>().ok())
    {
        if max < backlog {
            eprintln!("ember: tcp-backlog {backlog} cannot be enforced: /proc/sys/net/core/somaxconn is {max}");
        }
    }
}

const PROTECTED_MSG: &str = "-DENIED Ember is running in protected mode because protected mode is enabled and no password is set for the default user. In this mode connections are only accepted from the loopback interface. If you want to connect from external computers to Ember you may adopt one of the following solutions: 1) Disable protected mode with 'CONFIG SET protected-mode no' from the loopback interface. 2) Set a password with --requirepass or 'requirepass' in the configuration file. 3) Bind to the loopback interface only (the default).\r\n";

fn refuse(mut s: std::net::TcpStream, msg: &str) {
    let _ = s.set_nonblocking(true);
    let _ = s.write(msg.as_bytes());
}

/// Runs the server until SHUTDOWN, SIGTERM or SIGINT; returns after a clean
/// shutdown (the store closed, the heap marked clean). When a thread does not
/// stop within `shutdown-worker-timeout`, the process exits with status 1
/// instead (see `force_exit`).
pub fn run(cfg: Config) -> Result<(), String> {
    for (k, v) in &cfg.no_effect {
        eprintln!("ember: config '{k} {v}' accepted; it has no effect in Ember (the heap is always the image)");
    }
    let room = raise_nofile_limit(cfg.maxclients);
    if room < cfg.maxclients {
        eprintln!(
            "ember: the open file limit allows about {room} clients, fewer than maxclients {}; raise it (ulimit -n) to serve that many",
            cfg.maxclients
        );
    }
    let mut listeners = Vec::new();
    for b in &cfg.bind {
        let ip: std::net::IpAddr = b
            .parse()
            .map_err(|_| format!("bind: '{b}' is not an IP address"))?;
        let addr = SocketAddr::new(ip, cfg.port);
        let l = TcpListener::bind(addr).map_err(|e| format!("cannot listen on {addr}: {e}"))?;
        set_backlog(&l, cfg.tcp_backlog);
        listeners.push(l);
    }
    let tcp_port = listeners
        .first()
        .and_then(|l| l.local_addr().ok())
        .map(|a| a.port())
        .unwrap_or(cfg.port);
    let (store, startup) = crate::store::open(&cfg)?;
    let threads = cfg.threads;
    let counts = crate::counts::load(&store, threads)
        .map_err(|e| format!("cannot read the key counts: {e}"))?;
    let metrics_port = cfg.metrics_port;
    let sh = Arc::new(Shared {
        cfg: RwLock::new(cfg),
        cfg_epoch: AtomicU64::new(0),
        store,
        startup,
        counts: Arc::new(counts),
        stripes: Stripes::new(4096),
        shutdown: AtomicBool::new(false),
        wakers: Mutex::new(Vec::new()),
        clients: Mutex::new(BTreeMap::new()),
        next_client_id: AtomicU64::new(1),
        connected: AtomicU64::new(0),
        stats: Stats::new(threads),
        started: Instant::now(),
        run_id: run_id(),
        tcp_port,
    });
    let mut aux = Vec::new();
    {
        let term = Arc::new(AtomicBool::new(false));
        for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
            signal_hook::flag::register(sig, term.clone()).map_err(|e| e.to_string())?;
        }
        let sh2 = sh.clone();
        aux.push(
            std::thread::Builder::new()
                .name("ember-signal".into())
                .spawn(move || {
                    while !term.load(Ordering::Acquire) && !sh2.shutdown.load(Ordering::Acquire) {
                        std::thread::sleep(Duration::from_millis(5));
                    }
                    if term.load(Ordering::Acquire) {
                        eprintln!("ember: received SIGTERM/SIGINT: shutting down");
                    }
                    sh2.begin_shutdown();
                })
                .map_err(|e| e.to_string())?,
        );
    }
    if let Some(p) = metrics_port {
        aux.push(crate::metrics::spawn(sh.clone(), p)?);
    }
    if !sh.counts.ready() {
        let sh2 = sh.clone();
        aux.push(
            std::thread::Builder::new()
                .name("ember-keycount".into())
                .spawn(move || crate::counts::recount_thread(sh2))
                .map_err(|e| e.to_string())?,
        );
    }
    let mut handles = Vec::new();
    let mut doors = Vec::new();
    for id in 0..threads {
        let poll = Poll::new().map_err(|e| e.to_string())?;
        let waker = Arc::new(Waker::new(poll.registry(), WAKER).map_err(|e| e.to_string())?);
        sh.wakers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(waker.clone());
        let (tx, rx) = channel();
        doors.push((tx, waker.clone()));
        let sh2 = sh.clone();
        let ws = sh.stats.workers[id].clone();
        let h = std::thread::Builder::new()
            .name(format!("ember-worker-{id}"))
            .spawn(move || {
                // A session stays on the thread that made it.
                let sess = match sh2.store.session() {
                    Ok(s) => s,
                    Err(e) => {
                        eprintln!("ember: worker {id}: cannot open a store session: {e}");
                        sh2.begin_shutdown();
                        return;
                    }
                };
                let settings = Settings::load(&sh2);
                let pipeline_commits = sh2.cfg().commit_pipeline;
                let counts = sh2.counts.clone();
                Worker {
                    id,
                    sh: sh2,
                    poll,
                    rx,
                    clients: HashMap::new(),
                    next_token: 0,
                    ks: Keyspace::new(sess, counts, id),
                    ws,
                    settings,
                    expire_cursor: 0,
                    pending: Vec::new(),
                    rbuf: vec![0; READ_CHUNK],
                    args: proto::Args::default(),
                    pf_keys: Vec::new(),
                    committer: Committer::new(format!("ember-sync-{id}"), waker),
                    batch_requests: 0,
                    pipeline: pipeline_commits,
                }
                .run()
            })
            .map_err(|e| e.to_string())?;
        handles.push(h);
    }
    {
        let c = sh.cfg();
        let st = &sh.startup;
        eprintln!(
            "ember: serving {} on {} port {} ({} workers): engine {}, durability {} ({}), heap {}; {} in {:.1} ms{}",
            if st.existed { "existing heap" } else { "new heap" },
            c.bind.join(" "),
            tcp_port,
            threads,
            sh.store.name(),
            c.durability.name(),
            crate::info::strategy_note(&sh),
            c.heap.display(),
            if st.was_clean { "clean start" } else { "recovered after a crash" },
            st.open_ms,
            if st.log_records > 0 {
                format!(
                    ", {} log records read ({} bytes), {} replayed",
                    st.log_records, st.log_bytes, st.log_replayed
                )
            } else {
                String::new()
            }
        );
    }
    let accept_poll = Poll::new().map_err(|e| format!("acceptor: {e}"))?;
    sh.wakers
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .push(Arc::new(
            Waker::new(accept_poll.registry(), ACCEPT_WAKER)
                .map_err(|e| format!("acceptor: {e}"))?,
        ));
    let sh2 = sh.clone();
    let acceptor = std::thread::Builder::new()
        .name("ember-accept".into())
        .spawn(move || accept_loop(sh2, accept_poll, listeners, doors))
        .map_err(|e| e.to_string())?;
    let _ = acceptor.join();
    let threads: Vec<_> = handles.into_iter().chain(aux).collect();
    let wait = Duration::from_secs(sh.cfg().shutdown_worker_timeout);
    if !finish_within(&threads, wait) {
        force_exit(&threads, wait);
    }
    for h in threads {
        let _ = h.join();
    }
    let t = Instant::now();
    if let Err(e) = crate::counts::save(&sh.store, &sh.counts) {
        eprintln!("ember: could not save the key counts ({e}): the next start recounts them");
    }
    let r = sh.store.close().map_err(|e| e.to_string());
    eprintln!(
        "ember: shut down in {:.1} ms{}",
        t.elapsed().as_secs_f64() * 1e3,
        match &r {
            Ok(()) => String::new(),
            Err(e) => format!(" with an error: {e}"),
        }
    );
    // Every thread is joined: this is the last reference to the store, and
    // dropping the heap with it marks the heap clean.
    match Arc::try_unwrap(sh) {
        Ok(sh) => drop(sh),
        Err(_) => eprintln!("ember: the store is still referenced at exit; the next start recovers as after a crash"),
    }
    r
}

/// Waits up to `wait` for every thread to finish; true when they all did.
fn finish_within(threads: &[std::thread::JoinHandle<()>], wait: Duration) -> bool {
    let deadline = Instant::now() + wait;
    loop {
        if threads.iter().all(|h| h.is_finished()) {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Ends the process when a thread (a worker in a long command such as DEBUG
/// SLEEP, or waiting for the store) did not stop within
/// `shutdown-worker-timeout` of the shutdown. Nothing is closed: the store
/// stays as a crash would leave it, which recovery expects, and no step that
/// needs the stuck thread's session or locks is attempted. Every write
/// whose reply was sent is durable already (a reply leaves only after its
/// writes are, in either durability mode); the key counts are not saved, so
/// the next start recounts them, and it replays Bullet's logs as after a
/// crash.
fn force_exit(threads: &[std::thread::JoinHandle<()>], wait: Duration) -> ! {
    let stuck: Vec<&str> = threads
        .iter()
        .filter(|h| !h.is_finished())
        .map(|h| h.thread().name().unwrap_or("a thread"))
        .collect();
    eprintln!(
        "ember: {} still busy {} s after the shutdown began; exiting without a clean shutdown \
         (acknowledged writes are durable; the next start recovers the heap as after a crash)",
        stuck.join(", "),
        wait.as_secs()
    );
    std::process::exit(1)
}

/// The server's command layer in-process, without a network: one worker's
/// keyspace (its own store session and shard of the key counts) and one
/// client, over a store the caller opened. [`Embedded::exec`] runs a request
/// through [`cmd::execute`] as a worker's batch does, and [`Embedded::commit`]
/// commits as a worker does after a batch (in line, before any reply would be
/// written). For tests that run the server's write paths under a crash
/// simulator (a real process can only be killed, not watched); not used by
/// `ember serve`.
#[doc(hidden)]
pub struct Embedded {
    // Declared first: the session is dropped before the store it belongs to.
    ks: Keyspace,
    client: Client,
    ws: Arc<WorkerStats>,
    sh: Arc<Shared>,
    clock: Stamp,
    /// The other end of the client's socket (nothing is ever sent on it).
    _peer: std::net::TcpStream,
}

impl Embedded {
    /// Starts on `store` as [`run`] does, for `workers` workers: loads the key
    /// counts (those saved at the last clean shutdown, or a recount to be
    /// finished, here by the first DBSIZE). Each worker is then made with
    /// [`Embedded::new`] on its own thread (a session stays on the thread that
    /// made it), and [`Embedded::shutdown`] ends the run once they are gone.
    pub fn start(
        cfg: Config,
        store: AnyStore,
        startup: Startup,
        workers: usize,
    ) -> Result<Arc<Shared>, String> {
        let counts = crate::counts::load(&store, workers)
            .map_err(|e| format!("cannot read the key counts: {e}"))?;
        Ok(Arc::new(Shared {
            cfg: RwLock::new(cfg),
            cfg_epoch: AtomicU64::new(0),
            store,
            startup,
            counts: Arc::new(counts),
            stripes: Stripes::new(4096),
            shutdown: AtomicBool::new(false),
            wakers: Mutex::new(Vec::new()),
            clients: Mutex::new(BTreeMap::new()),
            next_client_id: AtomicU64::new(1),
            connected: AtomicU64::new(0),
            stats: Stats::new(workers),
            started: Instant::now(),
            run_id: run_id(),
            tcp_port: 0,
        }))
    }

    /// Worker `id` (below the `workers` given to [`Embedded::start`]) with one
    /// client, whose socket is a loopback connection that carries nothing (a
    /// [`Client`] owns one).
    pub fn new(sh: Arc<Shared>, id: usize) -> Result<Embedded, String> {
        let authed = sh.cfg().requirepass.is_none();
        let sess = sh.store.session().map_err(|e| e.to_string())?;
        let ks = Keyspace::new(sess, sh.counts.clone(), id);
        let ws = sh.stats.workers[id].clone();
        let l = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
        let addr = l.local_addr().map_err(|e| e.to_string())?;
        let sock = std::net::TcpStream::connect(addr).map_err(|e| e.to_string())?;
        let (peer, _) = l.accept().map_err(|e| e.to_string())?;
        sock.set_nonblocking(true).map_err(|e| e.to_string())?;
        let cid = sh.next_client_id.fetch_add(1, Ordering::Relaxed);
        let meta = Arc::new(ClientMeta::new(cid, addr.to_string(), addr.to_string(), -1));
        let client = Client::new(cid, TcpStream::from_std(sock), meta, authed);
        Ok(Embedded {
            ks,
            client,
            ws,
            sh,
            clock: Stamp::now(),
            _peer: peer,
        })
    }

    /// Runs one request (`args[0]` the command name) and returns its reply
    /// (RESP2), as a worker executes it within a batch: nothing is durable
    /// until [`Embedded::commit`].
    pub fn exec(&mut self, args: &[Vec<u8>]) -> Vec<u8> {
        let requirepass = self.sh.cfg().requirepass.clone();
        let mut ctx = Ctx {
            sh: &self.sh,
            ks: &mut self.ks,
            ws: &self.ws,
            now: crate::keyspace::now_ms(),
            requirepass: requirepass.as_deref(),
        };
        cmd::execute(&mut ctx, &mut self.client, args, &mut self.clock);
        std::mem::take(&mut self.client.out)
    }

    /// The worker's in-line commit after a batch: once it returns, the
    /// batch's replies may be sent.
    pub fn commit(&mut self) -> engine::Result<()> {
        self.ks.sess.commit()
    }

    pub fn shared(&self) -> &Shared {
        &self.sh
    }

    /// Clean shutdown as [`run`] ends it, once every worker is dropped: saves
    /// the key counts, closes the store; dropping the heap then marks it clean.
    pub fn shutdown(sh: Arc<Shared>) -> Result<(), String> {
        crate::counts::save(&sh.store, &sh.counts).map_err(|e| e.to_string())?;
        sh.store.close().map_err(|e| e.to_string())?;
        match Arc::try_unwrap(sh) {
            Ok(sh) => drop(sh),
            Err(_) => return Err("the store is still referenced".into()),
        }
        Ok(())
    }
}

fn run_id() -> String {
    use rand::RngExt;
    let mut rng = rand::rng();
    (0..40)
        .map(|_| char::from_digit(rng.random_range(0..16), 16).unwrap_or('0'))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::IpAddr;

    #[test]
    fn admission_maxclients_and_protected_mode() {
        let lo: IpAddr = "127.0.0.1".parse().unwrap();
        let lo6: IpAddr = "::1".parse().unwrap();
        let mapped: IpAddr = "::ffff:127.0.0.1".parse().unwrap();
        let far: IpAddr = "10.1.2.3".parse().unwrap();
        let far6: IpAddr = "2001:db8::1".parse().unwrap();
        assert_eq!(admission(0, 10, true, false, lo), None);
        assert_eq!(admission(9, 10, true, false, lo6), None);
        assert_eq!(admission(9, 10, true, false, mapped), None);
        assert_eq!(
            admission(10, 10, true, false, lo),
            Some("-ERR max number of clients reached\r\n")
        );
        // Protected mode: remote peers only with a password or mode off.
        assert_eq!(admission(0, 10, true, false, far), Some(PROTECTED_MSG));
        assert_eq!(admission(0, 10, true, false, far6), Some(PROTECTED_MSG));
        assert_eq!(admission(0, 10, true, true, far), None);
        assert_eq!(admission(0, 10, false, false, far), None);
        // maxclients first, as Redis checks it first.
        assert_eq!(
            admission(10, 10, true, false, far),
            Some("-ERR max number of clients reached\r\n")
        );
        assert!(PROTECTED_MSG.starts_with("-DENIED ") && PROTECTED_MSG.ends_with("\r\n"));
        assert!(!PROTECTED_MSG[..PROTECTED_MSG.len() - 2].contains(['\r', '\n']));
    }

    fn enc(args: &[&[u8]]) -> Vec<u8> {
        let mut o = Vec::new();
        proto::encode_request(args, &mut o);
        o
    }

    /// Whenever `Resume` says "still incomplete", the parser says so too;
    /// and fed a request piece by piece it finds the end.
    #[test]
    fn resume_never_hides_a_parse_result() {
        let limits = Limits {
            max_bulk_len: 1 << 20,
            max_query_buffer: 1 << 22,
            ..Limits::default()
        };
        let unauth = Limits {
            max_multibulk_len: 10,
            max_bulk_len: 16384,
            ..limits
        };
        let big = vec![b'v'; 70_000];
        let mut reqs: Vec<Vec<u8>> = vec![
            enc(&[b"SET".as_slice(), b"k", b"value"]),
            enc(&[b"SET".as_slice(), b"k", &big]),
            enc(&[b"MSET".as_slice(), b"a", b"1", b"b", b"\r\n\r\n", b"", b"x"]),
            b"*2\r\n$3\r\nGET\r\n$-1\r\n".to_vec(),
            b"*2\r\n$3\r\nGET\r\n$+1\r\nk\r\n".to_vec(),
            b"*2\r\n$3\r\nGET\r\n$01\r\nk\r\n".to_vec(),
            b"*2\r\n$3\r\nGET\r\nx1\r\nk\r\n".to_vec(),
            b"*2\r\n$3\r\nGET\r\n$2000000\r\nk\r\n".to_vec(),
            b"*2\r\n$3\r\nGET\r\n$20000\r\nk\r\n".to_vec(),
            b"*12\r\n$3\r\nGET\r\n".to_vec(),
            b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\nvXY*1\r\n$4\r\nPING\r\n".to_vec(),
            b"*1\r$4\r\nPING\r\n".to_vec(),
        ];
        let mut header_run = b"*2\r\n$3\r\nGET\r\n$".to_vec();
        header_run.extend_from_slice(&[b'1'; 70_000]);
        reqs.push(header_run);
        let mut skipped = 0;
        for lim in [&limits, &unauth] {
            for req in &reqs {
                let mut r = Resume::default();
                let step = if req.len() > 1000 { 997 } else { 1 };
                let mut n = 1;
                while n <= req.len() {
                    let buf = &req[..n];
                    if r.active {
                        if !r.advance(buf, lim) {
                            assert_eq!(
                                proto::parse_request(buf, lim),
                                Parsed::Incomplete,
                                "Resume hid a result at {n} of {:?}",
                                String::from_utf8_lossy(&req[..req.len().min(80)])
                            );
                            skipped += 1;
                            n += step;
                            continue;
                        }
                        r = Resume::default();
                    }
                    if proto::parse_request(buf, lim) == Parsed::Incomplete {
                        r = Resume::start(buf, lim);
                    }
                    n += step;
                }
                // The whole request: whatever the parser says, Resume lets it.
                let whole = proto::parse_request(req, lim);
                if whole != Parsed::Incomplete {
                    let mut r = Resume::start(&req[..req.len() - 1], lim);
                    if r.active {
                        assert!(r.advance(req, lim));
                    }
                }
            }
        }
        assert!(skipped > 100, "Resume never engaged ({skipped})");
        // A pipeline: the first request's end is found incrementally.
        let mut p = enc(&[b"SET".as_slice(), b"k", &big]);
        let one = p.len();
        p.extend_from_slice(&enc(&[b"GET".as_slice(), b"k"]));
        let mut r = Resume::start(&p[..100], &limits);
        assert!(r.active);
        assert!(!r.advance(&p[..one - 1], &limits));
        assert!(r.advance(&p[..one], &limits));
        assert!(
            matches!(proto::parse_request(&p, &limits), Parsed::Complete { consumed, .. } if consumed == one)
        );
    }

    #[test]
    fn digits_like_string2ll() {
        assert_eq!(digits(b"0"), Some(0));
        assert_eq!(digits(b"123"), Some(123));
        for bad in [
            &b""[..],
            b"01",
            b"+1",
            b"-1",
            b" 1",
            b"1 ",
            b"99999999999999999999",
            b"1a",
        ] {
            assert_eq!(digits(bad), None, "{:?}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn http_requests_are_attacks() {
        assert!(is_http_attack(b"POST"));
        assert!(is_http_attack(b"Host:"));
        assert!(!is_http_attack(b"GET"));
        assert!(!is_http_attack(b"host"));
    }

    #[test]
    fn nofile_limit_is_raised_not_lowered() {
        let get = || {
            // SAFETY: getrlimit writes only the struct passed.
            let mut r: libc::rlimit = unsafe { std::mem::zeroed() };
            assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) }, 0);
            r
        };
        let before = get();
        assert!(raise_nofile_limit(16) >= 16);
        assert_eq!(get().rlim_cur, before.rlim_cur, "lowered");
        raise_nofile_limit(u64::MAX);
        let after = get();
        assert!(after.rlim_cur >= before.rlim_cur);
        assert_eq!(after.rlim_max, before.rlim_max);
    }
}
