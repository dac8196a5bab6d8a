//! A worker thread: a mio event loop over its own connections with its own
//! store session. `server::run` starts the workers and the acceptor
//! (`accept`), which hands them connections; a worker reads and executes
//! their requests (`cmd::execute` on a [`Client`]), commits each batch (in
//! line or on its syncer thread, `commit`), writes the replies the commit
//! released, and runs periodic work (idle timeouts; active expiry, `expire`).
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

use crate::accept::{is_http_attack, NewConn};
use crate::client::{Client, ClientMeta};
use crate::clock::Stamp;
use crate::cmd::{self, Ctx};
use crate::commit::Committer;
use crate::config::ObufLimit;
use crate::keyspace::Keyspace;
use crate::server::Shared;
use crate::stats::WorkerStats;
use crate::tls::Conn;
use mio::net::TcpStream;
use mio::{Events, Interest, Poll, Token};
use proto::{Codec, Limits, Parsed};
use std::collections::HashMap;
use std::io::{ErrorKind, Read, Write};
use std::sync::atomic::Ordering;
use std::sync::mpsc::Receiver;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub(crate) const WAKER: Token = Token(0);
/// Output buffered for one client before the worker stops executing its
/// pipelined requests until the socket drains.
pub(crate) const OUT_HIGH_WATER: usize = 64 << 20;
/// Bytes read from one socket per batch before moving to the next client.
const READ_BUDGET: usize = 1 << 20;
/// One socket read: into the worker's scratch buffer, then appended to the
/// client's query buffer. An idle client holds no query buffer at all.
pub(crate) const READ_CHUNK: usize = 64 * 1024;
/// Buffers larger than this are freed, not kept, once empty: ten thousand idle
/// clients must not hold what their busiest moment needed.
pub(crate) const KEEP_BUF: usize = 16 * 1024;
/// Redis 7's limits for a client that has not authenticated yet (when a
/// password is required): `*` counts above 10 and `$` lengths above 16384 are
/// refused, so that an anonymous peer cannot make the server buffer much.
const UNAUTH_MAX_MULTIBULK: usize = 10;
const UNAUTH_MAX_BULK: usize = 16384;
/// A batch of fewer requests commits in line rather than on the syncer thread
/// (see `Worker::commit_batch`): handing a commit to another thread costs
/// two thread switches, which only a batch large enough to keep the worker
/// busy during the device write pays back (the measurements are in
/// BENCHMARKS.md's history).
const PIPELINE_MIN_REQUESTS: usize = 64;

/// Bounds on `Worker::serve_arrivals`, so that a steady stream of requests
/// (many clients) still commits, and replies, at least this often. Large
/// enough for one commit to cover every request of a closed-loop load of
/// dozens of pipelining clients (hundreds of requests, served in well under
/// a millisecond).
const ARRIVALS_MAX_REQUESTS: usize = 2048;
const ARRIVALS_MAX_WAIT: Duration = Duration::from_micros(500);

/// Says that a batch's clients are being closed unacknowledged.
fn commit_failed(e: &str) {
    eprintln!("ember: commit failed, closing the batch's clients unacknowledged: {e}");
}

/// A worker's cached copy of the settings it checks per request.
pub(crate) struct Settings {
    epoch: u64,
    limits: Limits,
    /// `limits` tightened for clients that still have to authenticate.
    unauth_limits: Limits,
    timeout: u64,
    pub(crate) hz: u64,
    busy_poll: Duration,
    /// `client-output-buffer-limit normal`, and the pending output from
    /// which a client is checked against it (the smaller limit set; `usize::MAX`
    /// when there is none): one comparison per command when under it.
    obuf: ObufLimit,
    obuf_check: usize,
    /// `client-output-buffer-limit pubsub`, for clients with subscriptions,
    /// and its check threshold.
    obuf_pubsub: ObufLimit,
    obuf_pubsub_check: usize,
}

impl Settings {
    /// The request limits for connection `c` (tighter before it
    /// authenticates).
    pub(crate) fn limits_for(&self, sh: &Shared, c: &Client) -> &Limits {
        if !sh.acl.auth_required(c.authed) {
            &self.limits
        } else {
            &self.unauth_limits
        }
    }

    pub(crate) fn load(sh: &Shared) -> Settings {
        let epoch = sh.cfg_epoch.load(Ordering::Acquire);
        let c = sh.cfg();
        let obuf = c.client_output_buffer_limit[crate::pubsub::OBUF_NORMAL];
        let obuf_check = crate::pubsub::obuf_check(&obuf);
        let obuf_pubsub = c.client_output_buffer_limit[crate::pubsub::OBUF_PUBSUB];
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
            timeout: c.timeout,
            hz: c.hz,
            busy_poll: Duration::from_micros(c.busy_poll_us),
            obuf,
            obuf_check,
            obuf_pubsub,
            obuf_pubsub_check: crate::pubsub::obuf_check(&obuf_pubsub),
        }
    }
}

/// One worker thread's state; [`Worker::run`] is its event loop.
pub(crate) struct Worker {
    pub(crate) id: usize,
    pub(crate) sh: Arc<Shared>,
    pub(crate) poll: Poll,
    pub(crate) rx: Receiver<NewConn>,
    pub(crate) clients: HashMap<Token, Client>,
    pub(crate) next_token: usize,
    pub(crate) ks: Keyspace,
    pub(crate) ws: Arc<WorkerStats>,
    pub(crate) settings: Settings,
    /// Active expiry: the scan cursor of the running pass.
    pub(crate) expire_cursor: u64,
    /// Clients with input left unprocessed (read budget, or output that fell
    /// back below the high water).
    pub(crate) pending: Vec<Token>,
    /// Scratch buffer every socket read goes through.
    pub(crate) rbuf: Vec<u8>,
    /// The arguments of the request being executed (slots reused).
    pub(crate) args: proto::Args,
    /// The store keys of a pipeline being prefetched (see `prefetch_pipeline`).
    pub(crate) pf_keys: Vec<u8>,
    /// Commits in flight on the syncer thread, and the replies they hold.
    pub(crate) committer: Committer,
    /// Requests executed in the current batch.
    pub(crate) batch_requests: usize,
    /// `commit-pipeline`: large batches commit on the syncer thread.
    pub(crate) pipeline: bool,
    /// The ACL epoch this worker last swept its connections at.
    pub(crate) acl_epoch: u64,
    /// Timeouts of this worker's blocked clients: (deadline, client id,
    /// wait number, token), earliest first (see `blocking`).
    pub(crate) block_timers: std::collections::BTreeSet<(Instant, u64, u64, Token)>,
    /// A busy script's pump (`busy`) took the wake-up event.
    pub(crate) pump_woke: bool,
    /// The `Shared::kill_epoch` this worker last swept at.
    pub(crate) kill_epoch: u64,
    /// Connections whose next request waits for CLIENT PAUSE to end.
    pub(crate) paused: Vec<Token>,
    /// Connections waiting for a blocking command's reply from the leader.
    pub(crate) fwd_waiting: Vec<Token>,
}

impl Worker {
    pub(crate) fn run(mut self) {
        self.ks.notify = self.sh.pubsub.notify_flags().clone();
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
            rewake |= std::mem::take(&mut self.pump_woke);
            // CLIENT PAUSE: held connections run again once it ends; until
            // then the poll sleeps no longer than it lasts.
            let mut pause_wait = None;
            if !self.paused.is_empty() {
                match self.sh.pause.remaining() {
                    None => {
                        let p = std::mem::take(&mut self.paused);
                        self.pending.extend(p);
                    }
                    Some(r) => pause_wait = Some(r + Duration::from_millis(1)),
                }
            }
            let timeout = if busy_maint || std::mem::take(&mut rewake) || !self.pending.is_empty() {
                Duration::ZERO
            } else {
                // A blocked client's timeout, or a pause's end, may come
                // first.
                let t = self.block_wait().map_or(period, |w| w.min(period));
                pause_wait.map_or(t, |p| p.min(t))
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
            self.acl_sweep();
            self.kill_sweep();
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
            // Blocked clients: timeouts, turns on ready keys, CLIENT UNBLOCK.
            let n = ready.len();
            self.serve_blocked(&mut ready);
            if ready.len() > n {
                ready.sort_unstable();
                ready.dedup();
            }
            let group = self.ks.sess.awaits_commit();
            if group {
                rewake = self.serve_arrivals(&mut events, &mut ready, &mut requesting);
            }
            // Invalidations of writes made outside commands, and the BCAST
            // batch; then Pub/Sub messages for this worker's clients,
            // released with the batch's commit.
            crate::tracking::flush_turn(&self.sh, &mut self.ks);
            self.deliver_pubsub(&mut ready);
            self.reap_forwards(&mut ready);
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
                crate::tracking::flush_turn(&self.sh, &mut self.ks);
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

    /// Picks up CONFIG SET changes. (A removed password needs nothing here:
    /// `Acl::auth_required` sees the default user become `nopass`.)
    fn reload_settings(&mut self) {
        if self.sh.cfg_epoch.load(Ordering::Acquire) == self.settings.epoch {
            return;
        }
        self.settings = Settings::load(&self.sh);
    }

    /// Drops the connections CLIENT KILL marked (on any worker).
    fn kill_sweep(&mut self) {
        let epoch = self.sh.kill_epoch.load(Ordering::Acquire);
        if epoch == self.kill_epoch {
            return;
        }
        self.kill_epoch = epoch;
        let gone: Vec<Token> = self
            .clients
            .iter()
            .filter(|(_, c)| c.meta.killed.load(Ordering::Acquire))
            .map(|(t, _)| *t)
            .collect();
        self.kill_and_flush(gone);
    }

    /// After an ACL change: closes the connections whose user was deleted
    /// or replaced (ACL DELUSER, ACL LOAD), as Redis frees them, also those
    /// that send nothing more.
    fn acl_sweep(&mut self) {
        let acl = &self.sh.acl;
        let epoch = acl.epoch();
        if epoch == self.acl_epoch {
            return;
        }
        self.acl_epoch = epoch;
        let gone: Vec<Token> = self
            .clients
            .iter_mut()
            .filter(|(_, c)| c.acl_epoch != epoch && !c.close_after)
            .filter_map(|(t, c)| (!acl.refresh(&mut c.user, &mut c.acl_epoch)).then_some(*t))
            .collect();
        self.kill_and_flush(gone);
    }

    fn adopt_new(&mut self) {
        adopt(
            &self.sh,
            self.id,
            &self.rx,
            &self.poll,
            &mut self.next_token,
            &mut self.clients,
            &mut self.pending,
        );
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
                // request nobody will finish. Answer, then close. A blocked
                // client stops waiting (Redis frees it).
                self.forget_blocked(c, t);
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
                    drained = n < self.rbuf.len() && !c.peer_closing && !c.sock.end_pending();
                    read_total += n;
                    self.ws.net_in.add(n as u64);
                    c.last_active = Instant::now();
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => {
                    if c.sock.is_tls() && e.kind() == ErrorKind::InvalidData {
                        // A failed handshake, or a peer that does not speak
                        // TLS: this connection only is closed.
                        eprintln!(
                            "ember: closing TLS client id={} addr={}: {e}",
                            c.id, c.meta.addr
                        );
                    }
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
        c.codec.reset();
    }

    /// `client-output-buffer-limit normal` (Redis's semantics): whether the
    /// client's pending output is at its hard limit, or has been at its soft
    /// limit for more than the soft seconds; such a client is closed without
    /// the rest of its output being written, and logged. Called when the
    /// pending output is above the smaller limit, and by the periodic tick
    /// for clients that got no new output meanwhile.
    pub(crate) fn output_limit_reached(&mut self, c: &mut Client) -> bool {
        let pending = (c.out.len() - c.outpos) as u64;
        let class = crate::pubsub::obuf_class(c);
        let l = if class == crate::pubsub::OBUF_PUBSUB {
            self.settings.obuf_pubsub
        } else {
            self.settings.obuf
        };
        let hard = l.hard > 0 && pending >= l.hard;
        let mut soft = false;
        if l.soft > 0 && pending >= l.soft {
            let since = *c.obuf_soft_since.get_or_insert_with(Instant::now);
            soft = since.elapsed() > Duration::from_secs(l.soft_seconds);
        } else {
            c.obuf_soft_since = None;
        }
        if !(hard || soft) {
            return false;
        }
        eprintln!(
            "ember: Client {} closed for overcoming of output buffer limits ({pending} bytes pending; client-output-buffer-limit {} {} {} {})",
            c.meta.line(),
            crate::config::OBUF_CLASSES[class],
            l.hard,
            l.soft,
            l.soft_seconds
        );
        self.sh
            .stats
            .obuf_limit_disconnections
            .fetch_add(1, Ordering::Relaxed);
        c.kill = true;
        c.out = Vec::new();
        c.outpos = 0;
        true
    }

    /// The pending output from which `c` is checked against its class's
    /// output buffer limit.
    pub(crate) fn obuf_check_of(&self, c: &Client) -> usize {
        if crate::pubsub::obuf_class(c) == crate::pubsub::OBUF_PUBSUB {
            self.settings.obuf_pubsub_check
        } else {
            self.settings.obuf_check
        }
    }

    /// Runs buffered requests; false when stopped at the output high water.
    fn run_requests(&mut self, c: &mut Client) -> bool {
        if c.mc.is_some() {
            return self.run_memcached(c);
        }
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
    /// command name is taken as the key, in the client's current database;
    /// for a script or function call, the keys it declares).
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
        proto::peek_request_args(buf, MAX, |args| {
            for k in hinted_keys(args) {
                if n == MAX || k.len() > MAX_KEY {
                    continue;
                }
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
            // A blocked client's input waits, unparsed, until it is unblocked.
            if c.close_after || c.kill || c.blocked.is_some() || c.fwd_wait.is_some() {
                return true;
            }
            let pending = c.out.len() - c.outpos;
            if pending >= self.obuf_check_of(c) && self.output_limit_reached(c) {
                return true;
            }
            if pending > OUT_HIGH_WATER {
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
            let limits = self.settings.limits_for(&self.sh, c);
            match c.codec.decode(&c.inbuf[c.inpos..], limits, args) {
                Ok(Some(consumed)) => {
                    // CLIENT PAUSE: the request waits, unconsumed, with
                    // everything after it.
                    if !args.as_slice().is_empty()
                        && self.sh.pause.holds(&self.sh, c, args.as_slice())
                    {
                        if let Some((_, t)) = c.home {
                            self.paused.push(t);
                        }
                        return true;
                    }
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
                    let mut ctx = Ctx {
                        sh: &self.sh,
                        ks: &mut self.ks,
                        ws: &self.ws,
                        now,
                    };
                    // Lent to a script that runs past busy-reply-threshold,
                    // to answer this worker's other connections meanwhile.
                    let mut pump = crate::busy::Pump {
                        sh: &self.sh,
                        ws: &self.ws,
                        worker: self.id,
                        poll: &mut self.poll,
                        rx: &self.rx,
                        next_token: &mut self.next_token,
                        clients: &mut self.clients,
                        pending: &mut self.pending,
                        rbuf: &mut self.rbuf,
                        settings: &self.settings,
                        woke: &mut self.pump_woke,
                    };
                    let mark = c.out.len();
                    crate::busy::with_pump(&mut pump, || cmd::execute(&mut ctx, c, args, clock));
                    c.after_request(mark);
                    self.batch_requests += 1;
                    if let (Some(_), Some((_, token))) = (&c.blocked, c.home) {
                        self.note_blocked(c, token);
                    }
                    if let (Some(_), Some((_, token))) = (&c.fwd_wait, c.home) {
                        self.fwd_waiting.push(token);
                    }
                }
                Ok(None) => {
                    // Incomplete: keep its bytes at the front of the buffer
                    // (the codec remembers how far it walked them).
                    if c.inpos > 0 {
                        c.inbuf.drain(..c.inpos);
                        c.inpos = 0;
                    }
                    return true;
                }
                Err(e) => {
                    if e == proto::ProtoError::QueryBufferLimit {
                        self.query_buffer_limit(c);
                        return true;
                    }
                    let unauth = self.sh.acl.auth_required(c.authed)
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
        if !c.kill && c.sock.push_pending().is_err() {
            c.kill = true;
        }
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
        let soft = if crate::pubsub::obuf_class(c) == crate::pubsub::OBUF_PUBSUB {
            self.settings.obuf_pubsub.soft
        } else {
            self.settings.obuf.soft
        };
        if c.obuf_soft_since.is_some() && ((c.out.len() - c.outpos) as u64) < soft {
            // Below the soft limit again: its clock starts over.
            c.obuf_soft_since = None;
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
        let want = c.out_base + (c.outpos as u64) < c.ready_to.min(c.out_base + c.out.len() as u64)
            || c.sock.wants_write();
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

    /// Clients whose blocking command forwarded to the leader got its
    /// reply (see `cluster::forward_blocking`): the reply goes out with the
    /// batch and their pipelined requests run.
    fn reap_forwards(&mut self, ready: &mut Vec<Token>) {
        if self.fwd_waiting.is_empty() {
            return;
        }
        let Some(cl) = self.sh.cluster.get() else {
            return;
        };
        let mut i = 0;
        while i < self.fwd_waiting.len() {
            let t = self.fwd_waiting[i];
            let Some(c) = self.clients.get_mut(&t) else {
                self.fwd_waiting.swap_remove(i);
                continue;
            };
            if crate::cluster::FwdWait::take(c, cl) {
                self.fwd_waiting.swap_remove(i);
                ready.push(t);
                self.pending.push(t);
            } else {
                i += 1;
            }
        }
    }

    fn drop_client(&mut self, t: Token) {
        if let Some(mut c) = self.clients.remove(&t) {
            crate::cluster::FwdWait::abandon(&mut c, self.sh.cluster.get().map(|c| &**c));
            self.forget_blocked(&mut c, t);
            self.sh.watches.unwatch_all(c.id, &mut c.watching);
            crate::tracking::disable(&self.sh.tracking, &c.meta);
            crate::pubsub::forget(&self.sh, &mut c);
            if !c.kill {
                c.sock.close_notify();
            }
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
    /// the client's send then pays for waking it. The caller spins only after
    /// a batch of such clients: after pipelined batches, spinning would take
    /// CPU from the gleaner and the client.
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
                .filter(|(_, c)| {
                    c.last_active.elapsed() > limit
                        && c.out.is_empty()
                        && c.blocked.is_none()
                        && c.fwd_wait.is_none()
                })
                .map(|(t, _)| *t)
                .collect();
            for t in idle {
                self.drop_client(t);
            }
        }
        // The soft output limit's seconds run out for clients that got no
        // new output meanwhile (stalled, or not reading their last reply).
        let check = self
            .settings
            .obuf_check
            .min(self.settings.obuf_pubsub_check);
        if check != usize::MAX {
            let over: Vec<Token> = self
                .clients
                .iter()
                .filter(|(_, c)| c.out.len() - c.outpos >= self.obuf_check_of(c) && !c.kill)
                .map(|(t, _)| *t)
                .collect();
            for t in over {
                if let Some(mut c) = self.clients.remove(&t) {
                    let closed = self.output_limit_reached(&mut c);
                    self.clients.insert(t, c);
                    if closed {
                        self.flush(t);
                    }
                }
            }
        }
        if self.id == 0 {
            self.active_expire();
            self.memcached_tick();
        }
        self.ws.expired_keys.set_total(self.ks.expired);
    }
}

/// Registers the connections the acceptor handed to worker `id` and adds
/// them to its `clients` (and to `pending`: data may have arrived before
/// registration).
pub(crate) fn adopt(
    sh: &Shared,
    id: usize,
    rx: &Receiver<NewConn>,
    poll: &Poll,
    next_token: &mut usize,
    clients: &mut HashMap<Token, Client>,
    pending: &mut Vec<Token>,
) {
    while let Ok((s, peer, tls, mc)) = rx.try_recv() {
        let _ = s.set_nodelay(true);
        let laddr = s.local_addr().map(|a| a.to_string()).unwrap_or_default();
        let fd = {
            use std::os::fd::AsRawFd;
            s.as_raw_fd()
        };
        let mut sock = match tls {
            None => Conn::Plain(TcpStream::from_std(s)),
            Some(cfg) => match Conn::tls(TcpStream::from_std(s), cfg) {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("ember: TLS connection from {peer} refused: {e}");
                    sh.connected.fetch_sub(1, Ordering::AcqRel);
                    continue;
                }
            },
        };
        *next_token += 1;
        let token = Token(*next_token);
        if poll
            .registry()
            .register(&mut sock, token, Interest::READABLE)
            .is_err()
        {
            sh.connected.fetch_sub(1, Ordering::AcqRel);
            continue;
        }
        let cid = sh.next_client_id.fetch_add(1, Ordering::Relaxed);
        let meta = Arc::new(ClientMeta::new(cid, peer.to_string(), laddr, fd));
        let _ = meta.track.home.set((id, token));
        sh.clients
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(cid, meta.clone());
        let mut c = Client::new(cid, sock, meta, &sh.acl);
        c.home = Some((id, token));
        if mc {
            c.mc = Some(Box::default());
        }
        clients.insert(token, c);
        // Data may have arrived before registration: look once.
        pending.push(token);
    }
}

/// The keys a request's leading arguments name, as the pipeline prefetch
/// guesses them: the declared keys of EVAL, EVALSHA, FCALL and their
/// read-only forms (`name body numkeys key...`, as far as shown), else the
/// argument after the command name.
fn hinted_keys<'s, 'a>(args: &'s [&'a [u8]]) -> &'s [&'a [u8]] {
    const SCRIPT_CALLS: [&[u8]; 6] = [
        b"evalsha",
        b"eval",
        b"fcall",
        b"evalsha_ro",
        b"eval_ro",
        b"fcall_ro",
    ];
    let Some(name) = args.first() else {
        return &[];
    };
    if SCRIPT_CALLS.iter().any(|n| name.eq_ignore_ascii_case(n)) {
        let numkeys = args
            .get(2)
            .and_then(|n| proto::int::parse_i64(n))
            .and_then(|n| usize::try_from(n).ok())
            .unwrap_or(0);
        let end = numkeys.saturating_add(3).min(args.len());
        return args.get(3..end).unwrap_or(&[]);
    }
    args.get(1..2).unwrap_or(&[])
}

#[cfg(test)]
mod tests {
    use super::hinted_keys;

    fn keys<'a>(args: &[&'a str]) -> Vec<&'a str> {
        let args: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
        hinted_keys(&args)
            .iter()
            .map(|k| std::str::from_utf8(k).unwrap())
            .collect()
    }

    #[test]
    fn prefetch_hints_a_script_call_declared_keys() {
        assert_eq!(keys(&["SET", "k", "v"]), ["k"]);
        assert_eq!(keys(&["PING"]), Vec::<&str>::new());
        assert_eq!(
            keys(&["EVALSHA", "abc", "2", "k1", "k2", "a"]),
            ["k1", "k2"]
        );
        assert_eq!(keys(&["fcall_ro", "f", "1", "k1", "a"]), ["k1"]);
        assert_eq!(keys(&["EVAL", "return 1", "0", "a"]), Vec::<&str>::new());
        // More keys than shown, a bad or negative count: what is there.
        assert_eq!(keys(&["EVAL", "s", "9", "k1", "k2"]), ["k1", "k2"]);
        assert_eq!(keys(&["EVAL", "s", "x", "k1"]), Vec::<&str>::new());
        assert_eq!(keys(&["EVAL", "s", "-1", "k1"]), Vec::<&str>::new());
        assert_eq!(keys(&["EVAL", "s"]), Vec::<&str>::new());
    }
}
