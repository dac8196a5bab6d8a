//! Serving a worker's other connections while a script on it runs past
//! `busy-reply-threshold` (Redis's `processEventsWhileBlocked`).
//!
//! A script runs on the worker thread of the connection that sent it; the
//! worker's other connections wait for it. Redis, single-threaded, answers
//! them from the script's hook once the script is "busy": `-BUSY` for most
//! commands, and runs the few flagged `allow_busy` (SCRIPT KILL, FUNCTION
//! KILL, SHUTDOWN NOSAVE...), so that a runaway script can be killed from
//! another connection. Ember does the same on the script's worker: the
//! worker lends the script's thread a [`Pump`] (its poll, its other
//! connections, its scratch buffers) for the duration of each command
//! ([`with_pump`]); the Lua hook calls [`serve_while_busy`], which polls
//! without sleeping and serves what arrived.
//!
//! What the pump runs: every request passes `cmd::precheck` (unknown
//! command, arity, authentication, ACL, then `-BUSY` for commands without
//! `allow_busy`: refused requests are answered there and then). Of the
//! allowed commands it runs those that need no keyspace: SCRIPT KILL,
//! FUNCTION KILL, FUNCTION STATS, SHUTDOWN, AUTH, HELLO, QUIT, MULTI,
//! DISCARD, UNWATCH. The keyspace belongs to the running script (its unit
//! holds its keys' locks and its staged writes), so WATCH, RESET and a
//! request queued in MULTI wait, with everything the connection sent after
//! them, until the script ends; their replies then come in order. Replies
//! are written at once unless earlier output of the connection is still
//! held for a commit (group commit), in which case they follow it.
//!
//! Connections on other workers need none of this: their workers run, and
//! `cmd::precheck` answers them `-BUSY` from the shared busy flag.

use crate::accept::NewConn;
use crate::clock::Stamp;
use crate::cmd::{self, CmdError, TABLE};
use crate::server::{Client, Shared};
use crate::stats::WorkerStats;
use crate::worker::Settings;
use mio::{Events, Poll, Token};
use proto::Codec;
use std::cell::Cell;
use std::collections::HashMap;
use std::io::{ErrorKind, Read, Write};
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

/// How often a busy script's hook serves the other connections at most.
const EVERY: Duration = Duration::from_millis(5);

/// Bytes read from one connection per round (the rest waits for the next).
const READ_BUDGET: usize = 64 * 1024;

/// What a worker lends the script's thread while one command runs.
pub(crate) struct Pump<'a> {
    pub(crate) sh: &'a Shared,
    pub(crate) ws: &'a WorkerStats,
    /// The worker's id, its poll, and the channel new connections come on
    /// (a connection opened to send SCRIPT KILL must be served too).
    pub(crate) worker: usize,
    pub(crate) poll: &'a mut Poll,
    pub(crate) rx: &'a Receiver<NewConn>,
    pub(crate) next_token: &'a mut usize,
    pub(crate) clients: &'a mut HashMap<Token, Client>,
    /// Connections the pump touched: the worker serves them next (their
    /// edge-triggered events may have been taken here, and requests that
    /// waited for the script's end are in their buffers).
    pub(crate) pending: &'a mut Vec<Token>,
    pub(crate) rbuf: &'a mut Vec<u8>,
    pub(crate) settings: &'a Settings,
    /// Set when a poll here took the worker's wake-up event: its next poll
    /// must not sleep.
    pub(crate) woke: &'a mut bool,
}

thread_local! {
    /// The pump of the command running on this thread (null outside one,
    /// and while the pump itself runs).
    static PUMP: Cell<*mut Pump<'static>> = const { Cell::new(std::ptr::null_mut()) };
    static LAST: Cell<Option<Instant>> = const { Cell::new(None) };
}

/// Puts the previous pointer back, also on unwinding.
struct Restore(*mut Pump<'static>);

impl Drop for Restore {
    fn drop(&mut self) {
        PUMP.with(|p| p.set(self.0));
    }
}

/// Runs `f` (one command) with `pump` lent to the thread.
pub(crate) fn with_pump<T>(pump: &mut Pump<'_>, f: impl FnOnce() -> T) -> T {
    let ptr: *mut Pump<'_> = pump;
    let prev = PUMP.with(|p| p.replace(ptr.cast()));
    let _restore = Restore(prev);
    f()
}

/// Called by a busy script's hook: serves the worker's other connections
/// (at most every [`EVERY`]).
pub(crate) fn serve_while_busy() {
    let now = Instant::now();
    if LAST.with(|l| l.get().is_some_and(|t| now.duration_since(t) < EVERY)) {
        return;
    }
    LAST.with(|l| l.set(Some(now)));
    // Taken for the round: a command the pump runs cannot reach it again.
    let ptr = PUMP.with(|p| p.replace(std::ptr::null_mut()));
    if ptr.is_null() {
        return;
    }
    let _restore = Restore(ptr);
    // SAFETY: `ptr` was set by `with_pump` from a `&mut Pump` that lives
    // for the whole command now running on this thread (the script's), and
    // nothing else uses the pump's borrows meanwhile: the worker is inside
    // that command, which touches neither its poll, nor its other
    // connections, nor its buffers. It is taken out of the thread-local for
    // this round, so no second reference to it exists.
    let pump = unsafe { &mut *ptr };
    crate::lua::outside_script(|| pump.round());
}

impl Pump<'_> {
    fn round(&mut self) {
        let mut events = Events::with_capacity(256);
        if self.poll.poll(&mut events, Some(Duration::ZERO)).is_err() {
            return;
        }
        let mut ready: Vec<Token> = Vec::new();
        for ev in events.iter() {
            if ev.token() == crate::worker::WAKER {
                *self.woke = true;
                continue;
            }
            ready.push(ev.token());
        }
        crate::worker::adopt(
            self.sh,
            self.worker,
            self.rx,
            self.poll,
            self.next_token,
            self.clients,
            self.pending,
        );
        // Connections left with input by an earlier round (a request that
        // arrived whole meanwhile would bring no new event).
        ready.extend(self.pending.iter().copied());
        ready.sort_unstable();
        ready.dedup();
        let mut args = proto::Args::default();
        for t in ready {
            let Some(c) = self.clients.get_mut(&t) else {
                continue;
            };
            if !self.pending.contains(&t) {
                self.pending.push(t);
            }
            // memcached connections wait for the script (no BUSY there).
            if c.blocked.is_some() || c.close_after || c.kill || c.stalled || c.mc.is_some() {
                continue;
            }
            // The worker's limits: no more input past the query buffer
            // limit (the worker closes such a connection), no more
            // requests past the output high water.
            if c.inbuf.len() - c.inpos <= self.settings.limits_for(self.sh, c).max_query_buffer {
                read(c, self.rbuf, self.ws);
            }
            let start = c.out.len();
            // Earlier output held for a commit keeps the new replies behind it.
            let released = c.ready_to >= c.out_base + start as u64;
            serve_requests(self.sh, self.ws, self.settings, c, &mut args);
            if released && c.out.len() > start {
                c.ready_to = c.out_base + c.out.len() as u64;
                write(c, self.ws);
            }
        }
    }
}

/// Reads what the socket has, up to [`READ_BUDGET`].
fn read(c: &mut Client, rbuf: &mut [u8], ws: &WorkerStats) {
    let mut total = 0;
    while total < READ_BUDGET && !c.eof {
        match c.sock.read(rbuf) {
            Ok(0) => c.eof = true,
            Ok(n) => {
                c.inbuf.extend_from_slice(&rbuf[..n]);
                total += n;
                ws.net_in.add(n as u64);
                c.last_active = Instant::now();
                if n < rbuf.len() {
                    break;
                }
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) if e.kind() == ErrorKind::WouldBlock => break,
            // The worker closes it after the script (its read fails again).
            Err(_) => break,
        }
    }
}

/// Writes the connection's released output, as far as the socket takes it
/// (the worker's flush writes the rest).
fn write(c: &mut Client, ws: &WorkerStats) {
    let limit = (c.ready_to.saturating_sub(c.out_base) as usize).min(c.out.len());
    if c.sock.push_pending().is_err() {
        return;
    }
    while c.outpos < limit {
        match c.sock.write(&c.out[c.outpos..limit]) {
            Ok(0) => break,
            Ok(n) => {
                c.outpos += n;
                ws.net_out.add(n as u64);
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
}

/// Serves the connection's complete requests in order, until one that
/// must wait for the script's end.
fn serve_requests(
    sh: &Shared,
    ws: &WorkerStats,
    settings: &Settings,
    c: &mut Client,
    args: &mut proto::Args,
) {
    while c.inpos < c.inbuf.len()
        && !c.close_after
        && !c.kill
        && c.out.len() - c.outpos <= crate::worker::OUT_HIGH_WATER
    {
        let limits = settings.limits_for(sh, c);
        // An incomplete request or a protocol error waits for the worker,
        // which handles both.
        let Ok(Some(consumed)) = c.codec.decode(&c.inbuf[c.inpos..], limits, args) else {
            return;
        };
        let a = args.as_slice();
        if a.is_empty() {
            c.inpos += consumed;
            continue;
        }
        let t0 = Stamp::now();
        let mark = c.out.len();
        let Some((i, queue)) = cmd::precheck(sh, ws, c, a, t0) else {
            // Refused (BUSY, NOAUTH, ...): answered.
            c.inpos += consumed;
            c.after_request(mark);
            continue;
        };
        if queue {
            return;
        }
        let Some(r) = run_allowed(sh, c, TABLE[i].name, a) else {
            return;
        };
        c.inpos += consumed;
        let failed = r.is_err();
        if let Err(e) = r {
            c.err(&e.text());
        }
        ws.record(i, Stamp::now().micros_since(t0), failed);
        c.after_request(mark);
    }
}

/// Runs an `allow_busy` command that needs no keyspace; None for one that
/// must wait for the script's end.
fn run_allowed(
    sh: &Shared,
    c: &mut Client,
    name: &str,
    a: &[Vec<u8>],
) -> Option<Result<(), CmdError>> {
    let sub = |s: &str| a.len() == 2 && a[1].eq_ignore_ascii_case(s.as_bytes());
    Some(match name {
        "script" if sub("kill") => cmd::scripting::script_kill(sh, c),
        "function" if sub("kill") => cmd::scripting::function_kill(sh, c),
        "function" if sub("stats") => cmd::scripting::function_stats(sh, c),
        "shutdown" => cmd::admin::shutdown_with(sh, c, a),
        "auth" => cmd::conn::auth_with(sh, c, a),
        "hello" => cmd::conn::hello_with(sh, c, a),
        "quit" => cmd::conn::quit_with(c),
        "multi" => cmd::multi::begin(c),
        "discard" => cmd::multi::discard_with(sh, c),
        "unwatch" => cmd::multi::unwatch_with(sh, c),
        _ => return None,
    })
}
