//! Blocking commands (BLPOP, BRPOP, BLMOVE, BRPOPLPUSH, BLMPOP, BZPOPMIN,
//! BZPOPMAX, BZMPOP): a client whose keys have nothing to give
//! waits, without holding its worker, until a write makes data available,
//! its timeout passes, CLIENT UNBLOCK ends the wait or it disconnects.
//!
//! # Pieces
//! - A command's **serve function** ([`Serve`]): its non-blocking form
//!   restricted to one of its keys, run under the stripe locks of all its
//!   keys. It writes its reply and says [`Try::Served`], or says the key
//!   has nothing ([`Try::Empty`]) or holds another type ([`Try::Mismatch`]).
//!   A blocking command's handler parses its arguments and calls [`wait`]
//!   with the serve function, the keys it waits on and its timeout; that is
//!   all a new blocking command needs.
//! - The **registry** ([`Blocking`], in `Shared`): per store key (database
//!   byte ‖ key), the clients waiting on it in arrival order; per waiting
//!   client, its worker, connection token and keys. `any()` (one atomic
//!   load) is all a write pays while nobody waits.
//! - **Ready keys**: `cmd::locked`, after a command's writes are applied
//!   and its stripe locks released, hands the keys it wrote to
//!   [`Blocking::signal`] when someone waits. A signalled key's **turn**
//!   goes to the first client in its queue: a message in its worker's inbox
//!   and a wake of that worker's poll.
//! - The **owning worker** runs the client's serve function on the ready
//!   key (`Worker::serve_blocked`), in its own session: the pop is an
//!   ordinary command write (one batch, durable before the reply, as any
//!   write). Served: the client is unblocked everywhere, its reply goes out
//!   with the worker's batch, the turn passes to the next client in the
//!   key's queue (the key may hold more), and its pipelined requests run.
//!   Empty: the turn ends (unless the key was signalled again meanwhile:
//!   then the head tries again). Mismatch: the turn passes to the first
//!   client waiting for another type (a BZPOPMIN behind BLPOPs on a key that
//!   became a sorted set), or ends.
//!
//! # Fairness
//! One client per key holds the turn at a time, always the earliest one that
//! can use the key, so clients blocked on a key are served in arrival order
//! whichever workers they are on, and one push of n elements serves up to n
//! of them in order. A command arriving while the woken clients are being
//! served (microseconds: one message per served client) may take an
//! element first, as it could in any interleaving of concurrent commands.
//!
//! # Lost wake-ups
//! A blocking command tries, registers, and tries again: a write between
//! the first try and the registration is seen by the second; a write after
//! the registration sees the registration (the writer checks `any()` after
//! releasing stripe locks the second try took after registering). A write
//! while the turn holder is trying marks the key `again`, and the holder's
//! "empty" hands the turn back to the queue's head instead of ending it.
//!
//! # Ending a wait
//! Whoever removes a client's registration owns its unblocking: the owning
//! worker after a serve, a timeout or a disconnect; CLIENT UNBLOCK from any
//! worker (which then sends the owner an `Unblock` message). While the owner
//! runs the serve function the registration is `busy` and CLIENT UNBLOCK
//! waits for it (a serve is short and waits on nobody), so a client is
//! never both served and unblocked.

use crate::cmd::{self, CmdError, Ctx, R};
use crate::keyspace::skey;
use crate::server::Client;
use crate::worker::Worker;
use mio::{Token, Waker};
use proto::Reply;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

/// What a serve function found at the key it was given.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Try {
    /// It popped (or moved) and wrote the reply.
    Served,
    /// The key is absent (Redis keeps no empty collection): keep waiting.
    Empty,
    /// The key holds a type this command does not pop from: WRONGTYPE when
    /// the command is called, keep waiting when the key became so later
    /// (Redis 7.0).
    Mismatch,
}

/// A blocking command's non-blocking form at one key: `fn(ctx, client,
/// args, i)` tries to serve the request `args` from the key at argument
/// index `i`, with the stripe locks of every key the command named in
/// [`Wait`] held. It stages its writes and writes its reply only when it
/// returns `Served`; an error (BLMOVE's destination of another type) is the
/// client's reply and ends its wait.
pub type Serve = fn(&mut Ctx, &mut Client, &[Vec<u8>], usize) -> Result<Try, CmdError>;

/// A blocking request: what [`wait`] needs.
pub struct Wait {
    /// Argument indexes of the keys it pops from, in the order it tries them.
    pub keys: Vec<usize>,
    /// Argument indexes of keys it writes without waiting on them (BLMOVE's
    /// destination): locked with `keys` around every try.
    pub also_lock: Vec<usize>,
    /// Milliseconds to wait; 0 waits for ever (see [`timeout_arg`]).
    pub timeout_ms: u64,
    /// The type it pops from (`keyspace::KIND_LIST`, `KIND_ZSET`): a turn
    /// the key's type refused passes to a client waiting for another type.
    pub kind: u8,
    pub serve: Serve,
}

/// A blocked client's request, kept in its `Client` until it is served.
pub(crate) struct Blocked {
    /// Which wait of the client this is (messages about an older one are
    /// stale).
    pub(crate) seq: u64,
    pub(crate) args: Vec<Vec<u8>>,
    pub(crate) keys: Vec<usize>,
    pub(crate) also_lock: Vec<usize>,
    pub(crate) serve: Serve,
    pub(crate) deadline: Option<Instant>,
}

/// A blocking command's timeout argument, in seconds as a float (Redis's
/// `getTimeoutFromObjectOrReply`): milliseconds rounded up, 0 for ever.
/// A value whose milliseconds do not fit in 64 bits (`inf`, `1e16`) is
/// "negative", as Redis's conversion makes it on x86-64.
pub fn timeout_arg(a: &[u8]) -> Result<u64, CmdError> {
    let f = cmd::float_arg(a).ok_or(CmdError::TimeoutNotFloat)?;
    let ms = (f * 1000.0).ceil();
    // i64::MAX as f64 rounds up to 2^63, the first value out of range.
    if !(ms >= -(2f64.powi(63)) && ms < 2f64.powi(63)) || ms < 0.0 {
        return Err(CmdError::TimeoutNegative);
    }
    Ok(ms as u64)
}

/// The reply of a blocking request that may not block (in a transaction or
/// a script) and finds nothing: a null for BLMOVE and BRPOPLPUSH (the
/// commands that also write a destination), a null array for the pops, as
/// Redis replies (a request that waited and timed out gets a null array
/// whichever it is).
fn deny_reply(c: &mut Client, moves: bool) {
    if moves {
        c.null();
    } else {
        c.reply(&Reply::NullArray);
    }
}

/// Runs a blocking request: served at once when one of its keys (in their
/// order) has data, WRONGTYPE when one before it holds another type;
/// otherwise the client waits (see the module's documentation). A client
/// that may not block (the in-process executor) gets the timeout's reply.
pub fn wait(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>], w: Wait) -> R {
    if try_keys(ctx, c, a, &w.keys, &w.also_lock, w.serve)? {
        return Ok(());
    }
    let Some((worker, token)) = c.home.filter(|_| !c.deny_blocking) else {
        deny_reply(c, !w.also_lock.is_empty());
        return Ok(());
    };
    c.block_seq += 1;
    let seq = c.block_seq;
    let mut keys: Vec<Vec<u8>> = Vec::with_capacity(w.keys.len());
    for &i in &w.keys {
        let k = skey(c.db, &a[i]);
        if !keys.contains(&k) {
            keys.push(k);
        }
    }
    let bl = &ctx.sh.blocking;
    // Registered busy: CLIENT UNBLOCK waits for the second try's outcome.
    bl.register(c.id, seq, worker, token, w.kind, keys);
    // A write between the first try and the registration did not see the
    // registration: the second try sees the write.
    match try_keys(ctx, c, a, &w.keys, &w.also_lock, w.serve) {
        Ok(false) => bl.settle(c.id),
        r => {
            bl.remove(c.id, seq);
            return r.map(|_| ());
        }
    }
    let deadline = match w.timeout_ms {
        0 => None,
        ms => Instant::now().checked_add(Duration::from_millis(ms)),
    };
    c.blocked = Some(Box::new(Blocked {
        seq,
        args: a.to_vec(),
        keys: w.keys,
        also_lock: w.also_lock,
        serve: w.serve,
        deadline,
    }));
    c.meta.blocked.store(true, Ordering::Relaxed);
    Ok(())
}

/// One try at the keys `keys` (argument indexes, in order) under the stripe
/// locks of them and `also_lock`: true when served; WRONGTYPE for a key
/// of another type met before one that served.
fn try_keys(
    ctx: &mut Ctx,
    c: &mut Client,
    a: &[Vec<u8>],
    keys: &[usize],
    also_lock: &[usize],
    serve: Serve,
) -> Result<bool, CmdError> {
    let lock: Vec<Vec<u8>> = keys
        .iter()
        .chain(also_lock)
        .map(|&i| skey(c.db, &a[i]))
        .collect();
    let refs: Vec<&[u8]> = lock.iter().map(|k| k.as_slice()).collect();
    cmd::locked(ctx, &refs, |ctx| {
        for &i in keys {
            match serve(ctx, c, a, i)? {
                Try::Served => return Ok(true),
                Try::Empty => {}
                Try::Mismatch => return Err(CmdError::WrongType),
            }
        }
        Ok(false)
    })
}

/// One try of a blocked client at the ready key `i` (argument index).
fn try_ready(ctx: &mut Ctx, c: &mut Client, b: &Blocked, i: usize) -> Result<Try, CmdError> {
    let lock: Vec<Vec<u8>> = b
        .keys
        .iter()
        .chain(&b.also_lock)
        .map(|&k| skey(c.db, &b.args[k]))
        .collect();
    let refs: Vec<&[u8]> = lock.iter().map(|k| k.as_slice()).collect();
    let serve = b.serve;
    cmd::locked(ctx, &refs, |ctx| serve(ctx, c, &b.args, i))
}

/// A message to a worker about one of its blocked clients.
pub(crate) enum Msg {
    /// The client holds the turn on `key`: try it.
    Try {
        token: Token,
        id: u64,
        seq: u64,
        key: Vec<u8>,
    },
    /// CLIENT UNBLOCK took the client's registration: reply (the timeout's
    /// reply, or the UNBLOCKED error) and unblock it.
    Unblock {
        token: Token,
        id: u64,
        seq: u64,
        error: bool,
    },
}

/// A registered client.
struct Waiter {
    worker: usize,
    token: Token,
    seq: u64,
    kind: u8,
    keys: Vec<Vec<u8>>,
    /// Its worker is running its serve function.
    busy: bool,
}

/// The clients waiting on one key.
#[derive(Default)]
struct Queue {
    /// Client ids, in arrival order.
    ids: VecDeque<u64>,
    /// The client that was told to try the key and has not answered.
    turn: Option<u64>,
    /// The key was signalled while the turn was out.
    again: bool,
}

#[derive(Default)]
struct Registry {
    keys: HashMap<Vec<u8>, Queue>,
    clients: HashMap<u64, Waiter>,
}

/// A worker's messages, and how to wake its poll.
#[derive(Default)]
struct Inbox {
    msgs: Mutex<Vec<Msg>>,
    /// Set when `msgs` is not empty: the worker's loop checks it for free.
    full: AtomicBool,
    waker: OnceLock<Arc<Waker>>,
}

/// The registry of blocked clients (see the module's documentation).
pub struct Blocking {
    /// Registered clients (INFO `blocked_clients`; zero: no write looks
    /// further).
    count: AtomicUsize,
    reg: Mutex<Registry>,
    /// Notified when a registration stops being busy.
    idle: Condvar,
    inboxes: Vec<Inbox>,
}

impl Blocking {
    pub fn new(workers: usize) -> Blocking {
        Blocking {
            count: AtomicUsize::new(0),
            reg: Mutex::new(Registry::default()),
            idle: Condvar::new(),
            inboxes: (0..workers.max(1)).map(|_| Inbox::default()).collect(),
        }
    }

    /// Worker `id`'s poll waker (set once when the worker starts).
    pub(crate) fn set_waker(&self, id: usize, w: Arc<Waker>) {
        if let Some(i) = self.inboxes.get(id) {
            let _ = i.waker.set(w);
        }
    }

    /// Whether any client is blocked: the only cost of this module for a
    /// write while none is.
    pub fn any(&self) -> bool {
        self.count.load(Ordering::Acquire) > 0
    }

    /// Clients blocked (INFO `blocked_clients`).
    pub fn blocked_clients(&self) -> usize {
        self.count.load(Ordering::Relaxed)
    }

    fn lock(&self) -> MutexGuard<'_, Registry> {
        self.reg.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn send(&self, worker: usize, m: Msg) {
        let Some(inbox) = self.inboxes.get(worker) else {
            return;
        };
        inbox.msgs.lock().unwrap_or_else(|p| p.into_inner()).push(m);
        inbox.full.store(true, Ordering::Release);
        if let Some(w) = inbox.waker.get() {
            let _ = w.wake();
        }
    }

    /// The messages for worker `id`, oldest first.
    pub(crate) fn take_msgs(&self, id: usize) -> Vec<Msg> {
        let Some(inbox) = self.inboxes.get(id) else {
            return Vec::new();
        };
        if !inbox.full.load(Ordering::Acquire) {
            return Vec::new();
        }
        let mut m = inbox.msgs.lock().unwrap_or_else(|p| p.into_inner());
        inbox.full.store(false, Ordering::Relaxed);
        std::mem::take(&mut *m)
    }

    /// Registers client `id`'s wait number `seq` on `keys` (store keys, no
    /// repeats), at the end of each key's queue, busy until
    /// [`Blocking::settle`].
    fn register(
        &self,
        id: u64,
        seq: u64,
        worker: usize,
        token: Token,
        kind: u8,
        keys: Vec<Vec<u8>>,
    ) {
        let mut r = self.lock();
        for k in &keys {
            r.keys.entry(k.clone()).or_default().ids.push_back(id);
        }
        let old = r.clients.insert(
            id,
            Waiter {
                worker,
                token,
                seq,
                kind,
                keys,
                busy: true,
            },
        );
        debug_assert!(old.is_none(), "client {id} registered twice");
        self.count.store(r.clients.len(), Ordering::Release);
    }

    /// A registration made by `register` is no longer busy.
    fn settle(&self, id: u64) {
        if let Some(w) = self.lock().clients.get_mut(&id) {
            w.busy = false;
        }
        self.idle.notify_all();
    }

    /// Keys a command wrote (store keys): each that has clients waiting
    /// gets a turn, or is marked to be tried again when one is out.
    pub fn signal(&self, keys: &[&[u8]]) {
        let mut r = self.lock();
        for k in keys {
            let Some(q) = r.keys.get_mut(*k) else {
                continue;
            };
            if q.turn.is_some() {
                q.again = true;
            } else {
                self.give_turn(&mut r, k, None);
            }
        }
    }

    /// Gives `key`'s turn to the first client in its queue (the first whose
    /// kind is not `skip_kind`, when given), or to none; drops an empty
    /// queue.
    fn give_turn(&self, r: &mut Registry, key: &[u8], skip_kind: Option<u8>) {
        let Registry { keys, clients } = r;
        let Some(q) = keys.get_mut(key) else {
            return;
        };
        q.again = false;
        q.turn = None;
        if q.ids.is_empty() {
            keys.remove(key);
            return;
        }
        let next = q.ids.iter().copied().find_map(|id| {
            let w = clients.get(&id)?;
            (Some(w.kind) != skip_kind).then_some((id, w))
        });
        if let Some((id, w)) = next {
            q.turn = Some(id);
            self.send(
                w.worker,
                Msg::Try {
                    token: w.token,
                    id,
                    seq: w.seq,
                    key: key.to_vec(),
                },
            );
        }
    }

    /// Removes client `id`'s registration, passing on the turns it held.
    fn remove_locked(&self, r: &mut Registry, id: u64) -> Option<Waiter> {
        let w = r.clients.remove(&id)?;
        for k in &w.keys {
            let Some(q) = r.keys.get_mut(k) else {
                continue;
            };
            q.ids.retain(|&x| x != id);
            if q.turn == Some(id) || q.ids.is_empty() {
                self.give_turn(r, k, None);
            }
        }
        self.count.store(r.clients.len(), Ordering::Release);
        Some(w)
    }

    /// Ends client `id`'s wait number `seq` (served at once, timed out,
    /// disconnected): true when it was still registered, false when CLIENT
    /// UNBLOCK took it first (its message is on the way).
    pub(crate) fn remove(&self, id: u64, seq: u64) -> bool {
        let mut r = self.lock();
        if r.clients.get(&id).is_none_or(|w| w.seq != seq) {
            return false;
        }
        let removed = self.remove_locked(&mut r, id).is_some();
        drop(r);
        // A CLIENT UNBLOCK may wait for it to stop being busy.
        self.idle.notify_all();
        removed
    }

    /// Whether client `id` (wait `seq`) holds `key`'s turn; if so it is
    /// marked busy until [`Blocking::finish`].
    fn begin(&self, id: u64, seq: u64, key: &[u8]) -> bool {
        let mut r = self.lock();
        let holds = r.keys.get(key).is_some_and(|q| q.turn == Some(id));
        match r.clients.get_mut(&id) {
            Some(w) if w.seq == seq && holds => {
                w.busy = true;
                true
            }
            _ => false,
        }
    }

    /// The outcome of client `id`'s try at `key` (after [`Blocking::begin`]):
    /// served (or failed: the error was its reply) ends its wait and passes
    /// the turn on; otherwise the turn ends or passes as the module's
    /// documentation says.
    fn finish(&self, id: u64, key: &[u8], outcome: Option<Try>) {
        let mut r = self.lock();
        let kind = match r.clients.get_mut(&id) {
            Some(w) => {
                w.busy = false;
                w.kind
            }
            None => return,
        };
        match outcome {
            Some(Try::Served) | None => {
                self.remove_locked(&mut r, id);
            }
            Some(t) => {
                if let Some(q) = r.keys.get_mut(key) {
                    if q.turn == Some(id) {
                        if q.again {
                            self.give_turn(&mut r, key, None);
                        } else if t == Try::Mismatch {
                            self.give_turn(&mut r, key, Some(kind));
                        } else {
                            q.turn = None;
                        }
                    }
                }
            }
        }
        drop(r);
        self.idle.notify_all();
    }

    /// CLIENT UNBLOCK `id`: true when the client was blocked; its worker
    /// then replies (the timeout's reply, or the UNBLOCKED error when
    /// `error`) and unblocks it.
    pub fn unblock(&self, id: u64, error: bool) -> bool {
        let mut r = self.lock();
        while r.clients.get(&id).is_some_and(|w| w.busy) {
            r = self.idle.wait(r).unwrap_or_else(|p| p.into_inner());
        }
        let Some(w) = self.remove_locked(&mut r, id) else {
            return false;
        };
        self.send(
            w.worker,
            Msg::Unblock {
                token: w.token,
                id,
                seq: w.seq,
                error,
            },
        );
        true
    }
}

/// The worker's side: timeouts, messages, disconnects.
impl Worker {
    /// After a command: a client that blocked gets its timeout armed.
    pub(crate) fn note_blocked(&mut self, c: &Client, token: Token) {
        if let Some(b) = &c.blocked {
            if let Some(d) = b.deadline {
                self.block_timers.insert((d, c.id, b.seq, token));
            }
        }
    }

    /// How long the poll may sleep before the next blocked client's timeout.
    pub(crate) fn block_wait(&self) -> Option<Duration> {
        let &(d, ..) = self.block_timers.first()?;
        Some(d.saturating_duration_since(Instant::now()))
    }

    /// Ends `c`'s wait on this worker's side (it was served or answered, or
    /// is closing): its timeout is disarmed and, with `resume`, its
    /// pipelined requests run next round.
    fn unblock_local(&mut self, c: &mut Client, token: Token, resume: bool) {
        if let Some(b) = c.blocked.take() {
            if let Some(d) = b.deadline {
                self.block_timers.remove(&(d, c.id, b.seq, token));
            }
        }
        c.meta.blocked.store(false, Ordering::Relaxed);
        if resume {
            self.pending.push(token);
        }
    }

    /// A closing connection's wait ends without a reply.
    pub(crate) fn forget_blocked(&mut self, c: &mut Client, token: Token) {
        if let Some(b) = &c.blocked {
            self.sh.blocking.remove(c.id, b.seq);
            self.unblock_local(c, token, false);
        }
    }

    /// Serves what concerns this worker's blocked clients: timeouts that
    /// passed, and the messages other workers (or this one) sent: turns to
    /// try, CLIENT UNBLOCKs. Clients that got a reply are added to `ready`
    /// (their replies go out with the batch's commit).
    pub(crate) fn serve_blocked(&mut self, ready: &mut Vec<Token>) {
        let mut now = None;
        while let Some(&(d, id, seq, token)) = self.block_timers.first() {
            if d > *now.get_or_insert_with(Instant::now) {
                break;
            }
            self.block_timers.pop_first();
            let Some(mut c) = self.clients.remove(&token) else {
                continue;
            };
            if c.id == id
                && c.blocked.as_ref().is_some_and(|b| b.seq == seq)
                && self.sh.blocking.remove(id, seq)
            {
                c.reply(&Reply::NullArray);
                self.unblock_local(&mut c, token, true);
                ready.push(token);
            }
            self.clients.insert(token, c);
        }
        for m in self.sh.blocking.take_msgs(self.id) {
            match m {
                Msg::Try {
                    token,
                    id,
                    seq,
                    key,
                } => self.try_blocked(token, id, seq, &key, ready),
                Msg::Unblock {
                    token,
                    id,
                    seq,
                    error,
                } => {
                    let Some(mut c) = self.clients.remove(&token) else {
                        continue;
                    };
                    if c.id == id && c.blocked.as_ref().is_some_and(|b| b.seq == seq) {
                        if error {
                            c.err(&CmdError::UnblockedByClient.text());
                        } else {
                            c.reply(&Reply::NullArray);
                        }
                        self.unblock_local(&mut c, token, true);
                        ready.push(token);
                    }
                    self.clients.insert(token, c);
                }
            }
        }
    }

    /// A turn on `key` for the blocked client at `token`: runs its serve
    /// function on that key.
    fn try_blocked(&mut self, token: Token, id: u64, seq: u64, key: &[u8], ready: &mut Vec<Token>) {
        let Some(mut c) = self.clients.remove(&token) else {
            return;
        };
        let mine = c.id == id && c.blocked.as_ref().is_some_and(|b| b.seq == seq);
        if mine && (c.kill || c.close_after) {
            // Closing: its turn goes to the next client, nothing is popped
            // for a reply that would not be sent.
            self.forget_blocked(&mut c, token);
        } else if mine && self.sh.blocking.begin(id, seq, key) {
            let b = c.blocked.take();
            let outcome = match b.as_deref() {
                // The first of its keys (in argument order) that is the
                // ready one.
                Some(b) => match b
                    .keys
                    .iter()
                    .copied()
                    .find(|&i| skey(c.db, &b.args[i]) == key)
                {
                    Some(i) => {
                        let mark = c.out.len();
                        let mut ctx = Ctx {
                            sh: &self.sh,
                            ks: &mut self.ks,
                            ws: &self.ws,
                            now: crate::keyspace::now_ms(),
                        };
                        match try_ready(&mut ctx, &mut c, b, i) {
                            Ok(Try::Served) => Some(Try::Served),
                            Ok(t) => {
                                c.out.truncate(mark);
                                Some(t)
                            }
                            Err(e) => {
                                // The error is its reply (BLMOVE to a key of
                                // another type), as Redis serves it.
                                c.out.truncate(mark);
                                c.err(&e.text());
                                None
                            }
                        }
                    }
                    None => Some(Try::Empty),
                },
                None => Some(Try::Empty),
            };
            c.blocked = b;
            self.sh.blocking.finish(id, key, outcome);
            if matches!(outcome, Some(Try::Served) | None) {
                self.unblock_local(&mut c, token, true);
                ready.push(token);
            }
        }
        self.clients.insert(token, c);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keyspace::{KIND_LIST, KIND_ZSET};

    /// (worker, kind of message, client id) of every message sent, worker 0 first.
    fn msgs(b: &Blocking) -> Vec<(usize, &'static str, u64)> {
        let mut out = Vec::new();
        for w in 0..b.inboxes.len() {
            for m in b.take_msgs(w) {
                out.push(match m {
                    Msg::Try { id, .. } => (w, "try", id),
                    Msg::Unblock { id, .. } => (w, "unblock", id),
                });
            }
        }
        out
    }

    fn reg(b: &Blocking, id: u64, worker: usize, kind: u8, keys: &[&[u8]]) {
        let keys = keys.iter().map(|k| k.to_vec()).collect();
        b.register(id, 1, worker, Token(id as usize), kind, keys);
        b.settle(id);
    }

    #[test]
    fn turns_go_in_arrival_order_across_workers() {
        let b = Blocking::new(2);
        assert!(!b.any());
        reg(&b, 1, 0, KIND_LIST, &[b"k"]);
        reg(&b, 2, 1, KIND_LIST, &[b"k"]);
        reg(&b, 3, 0, KIND_LIST, &[b"k", b"j"]);
        assert_eq!(b.blocked_clients(), 3);
        b.signal(&[b"k"]);
        // One turn at a time: signalling again while it is out sends nothing.
        b.signal(&[b"k"]);
        assert_eq!(msgs(&b), [(0, "try", 1)]);
        // Only the turn holder may try.
        assert!(!b.begin(2, 1, b"k"));
        assert!(b.begin(1, 1, b"k"));
        b.finish(1, b"k", Some(Try::Served));
        assert_eq!(msgs(&b), [(1, "try", 2)]);
        assert!(b.begin(2, 1, b"k"));
        // Signalled while client 2 tried: "empty" hands the turn back.
        b.signal(&[b"k"]);
        b.finish(2, b"k", Some(Try::Empty));
        assert_eq!(msgs(&b), [(1, "try", 2)]);
        assert!(b.begin(2, 1, b"k"));
        b.finish(2, b"k", Some(Try::Empty));
        assert_eq!(msgs(&b), []);
        // A failed serve (its error was the reply) ends the wait too.
        b.signal(&[b"k"]);
        assert_eq!(msgs(&b), [(1, "try", 2)]);
        assert!(b.begin(2, 1, b"k"));
        b.finish(2, b"k", None);
        assert_eq!(msgs(&b), [(0, "try", 3)]);
        assert_eq!(b.blocked_clients(), 1);
        // Served on another key: the turn on `k` has nobody to go to.
        b.signal(&[b"j"]);
        assert_eq!(msgs(&b), [(0, "try", 3)]);
        assert!(b.begin(3, 1, b"j"));
        b.finish(3, b"j", Some(Try::Served));
        assert_eq!(msgs(&b), []);
        assert!(!b.any());
        assert!(b.lock().keys.is_empty());
    }

    #[test]
    fn a_type_that_does_not_fit_passes_the_turn_to_another_kind() {
        let b = Blocking::new(1);
        reg(&b, 1, 0, KIND_LIST, &[b"k"]);
        reg(&b, 2, 0, KIND_LIST, &[b"k"]);
        reg(&b, 3, 0, KIND_ZSET, &[b"k"]);
        b.signal(&[b"k"]);
        assert_eq!(msgs(&b), [(0, "try", 1)]);
        assert!(b.begin(1, 1, b"k"));
        b.finish(1, b"k", Some(Try::Mismatch));
        assert_eq!(msgs(&b), [(0, "try", 3)]);
        assert!(b.begin(3, 1, b"k"));
        b.finish(3, b"k", Some(Try::Mismatch));
        assert_eq!(msgs(&b), [(0, "try", 1)]);
        assert!(b.begin(1, 1, b"k"));
        b.finish(1, b"k", Some(Try::Mismatch));
        // Back to the zset waiter, which finds nothing it can use either.
        assert_eq!(msgs(&b), [(0, "try", 3)]);
        assert!(b.begin(3, 1, b"k"));
        b.finish(3, b"k", Some(Try::Empty));
        assert_eq!(msgs(&b), []);
        assert_eq!(b.blocked_clients(), 3);
    }

    #[test]
    fn leaving_passes_the_turn_and_unblock_claims_once() {
        let b = Blocking::new(2);
        reg(&b, 1, 0, KIND_LIST, &[b"k"]);
        reg(&b, 2, 1, KIND_LIST, &[b"k"]);
        b.signal(&[b"k"]);
        assert_eq!(msgs(&b), [(0, "try", 1)]);
        // Client 1 times out (or disconnects) before it tries.
        assert!(b.remove(1, 1));
        assert!(!b.remove(1, 1));
        assert_eq!(msgs(&b), [(1, "try", 2)]);
        assert!(!b.begin(1, 1, b"k"));
        // CLIENT UNBLOCK takes client 2: its worker is told; a second one
        // finds nothing, and neither does the worker's own timeout.
        assert!(b.unblock(2, true));
        assert!(!b.unblock(2, false));
        assert!(!b.remove(2, 1));
        assert_eq!(msgs(&b), [(1, "unblock", 2)]);
        assert!(!b.any());
        assert!(b.lock().keys.is_empty());
    }

    #[test]
    fn unblock_waits_for_a_try_in_progress() {
        let b = Arc::new(Blocking::new(1));
        // Registered busy, as `wait` does before its second try.
        b.register(7, 1, 0, Token(7), KIND_LIST, vec![b"k".to_vec()]);
        let b2 = b.clone();
        let h = std::thread::spawn(move || b2.unblock(7, false));
        std::thread::sleep(Duration::from_millis(50));
        assert!(!h.is_finished());
        // The try served: the unblock finds nothing to unblock.
        assert!(b.remove(7, 1));
        assert!(!h.join().unwrap());
        // Another wait whose try found nothing: the unblock takes it.
        b.register(7, 2, 0, Token(7), KIND_LIST, vec![b"k".to_vec()]);
        let b2 = b.clone();
        let h = std::thread::spawn(move || b2.unblock(7, true));
        std::thread::sleep(Duration::from_millis(50));
        assert!(!h.is_finished());
        b.settle(7);
        assert!(h.join().unwrap());
        assert_eq!(msgs(&b), [(0, "unblock", 7)]);
    }

    #[test]
    fn timeouts_parse_as_redis_does() {
        assert_eq!(timeout_arg(b"0").unwrap(), 0);
        assert_eq!(timeout_arg(b"1.5").unwrap(), 1500);
        assert_eq!(timeout_arg(b"0.0001").unwrap(), 1);
        assert_eq!(timeout_arg(b"-0.0001").unwrap(), 0);
        assert_eq!(timeout_arg(b"-0").unwrap(), 0);
        assert_eq!(timeout_arg(b"0x10").unwrap(), 16_000);
        assert_eq!(timeout_arg(b"9.2e15").unwrap(), 9_200_000_000_000_000_000);
        for neg in ["-1", "-0.5", "inf", "-inf", "1e16", "1e300"] {
            assert!(
                matches!(timeout_arg(neg.as_bytes()), Err(CmdError::TimeoutNegative)),
                "{neg}"
            );
        }
        for bad in ["", "abc", " 1", "1 ", "nan", "1e5000"] {
            assert!(
                matches!(timeout_arg(bad.as_bytes()), Err(CmdError::TimeoutNotFloat)),
                "{bad}"
            );
        }
    }
}
