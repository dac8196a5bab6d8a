//! Pub/Sub: channel, pattern and shard-channel subscriptions, and the
//! delivery of published messages to subscribers on any worker.
//!
//! # Pieces
//! - The **registry** ([`Pubsub`], in `Shared`): per channel (and per shard
//!   channel) its subscribers in subscription order, per pattern its
//!   compiled glob and subscribers. A subscriber is a client id, its worker
//!   and its poll token. Changed under the write lock by (P|S)SUBSCRIBE,
//!   (P|S)UNSUBSCRIBE, RESET and disconnects; read by PUBLISH and keyspace
//!   notifications. Each client also keeps its own subscriptions
//!   ([`Subs`], in `Client`): the reply counts and CLIENT LIST read them.
//! - **Delivery**: a publish counts the receivers as Redis does (channel
//!   subscribers, plus one per matching pattern subscription) and, still
//!   under the read lock, appends one message per receiver to the inbox of
//!   the receiver's worker, waking that worker's poll when the inbox was
//!   empty (the waker the blocking registry and the syncer use). The worker
//!   takes its inbox once per loop turn (`Worker::deliver_pubsub`, before
//!   the batch's commit), encodes each message in its client's protocol
//!   (RESP2 array, RESP3 push) into the client's output and checks the
//!   `pubsub` output buffer limit. One inbox per worker, filled in publish
//!   order under a lock: the messages of one publisher reach every
//!   subscriber in the order published.
//! - **Own messages first**: after each command of a subscribed client,
//!   `cmd::execute` moves the messages waiting in the inbox for that client
//!   in front of the command's reply ([`after_command`]): a RESP3 client
//!   that publishes to itself, or writes a key it watches through keyspace
//!   notifications, gets the message before the reply, as Redis 7.0 sends
//!   it. An unsubscribe does the same before each confirmation, so a
//!   message published before it took effect arrives first: removing a
//!   subscription takes the write lock, which waits for publishers holding
//!   the read lock, so every message counted for the client is in the inbox
//!   by then.
//!
//! # Subscriber mode
//! A RESP2 client with at least one subscription may run only (P|S)SUBSCRIBE,
//! (P|S)UNSUBSCRIBE, PING (which answers `["pong", arg]`), QUIT and RESET;
//! a RESP3 client runs anything and receives messages as push replies.

use crate::config::ObufLimit;
use crate::glob::Glob;
use crate::server::{Client, Shared};
use crate::worker::Worker;
use indexmap::{IndexMap, IndexSet};
use mio::{Token, Waker};
use proto::reply::put;
use proto::Version;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};

/// Which family of subscriptions: channels and patterns share a count
/// (Redis's `clientSubscriptionsCount`), shard channels have their own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Channel,
    Pattern,
    Shard,
}

impl Kind {
    fn subscribe_word(self) -> &'static [u8] {
        match self {
            Kind::Channel => b"subscribe",
            Kind::Pattern => b"psubscribe",
            Kind::Shard => b"ssubscribe",
        }
    }
    fn unsubscribe_word(self) -> &'static [u8] {
        match self {
            Kind::Channel => b"unsubscribe",
            Kind::Pattern => b"punsubscribe",
            Kind::Shard => b"sunsubscribe",
        }
    }
}

/// A client's subscriptions, in the order made (a mass unsubscribe
/// confirms them in that order).
#[derive(Default, Debug)]
pub struct Subs {
    channels: IndexSet<Vec<u8>>,
    patterns: IndexSet<Vec<u8>>,
    shard: IndexSet<Vec<u8>>,
}

impl Subs {
    fn set(&mut self, k: Kind) -> &mut IndexSet<Vec<u8>> {
        match k {
            Kind::Channel => &mut self.channels,
            Kind::Pattern => &mut self.patterns,
            Kind::Shard => &mut self.shard,
        }
    }
    /// The count a (un)subscribe confirmation of `k` reports.
    fn count(&self, k: Kind) -> usize {
        match k {
            Kind::Channel | Kind::Pattern => self.channels.len() + self.patterns.len(),
            Kind::Shard => self.shard.len(),
        }
    }
    fn is_empty(&self) -> bool {
        self.channels.is_empty() && self.patterns.is_empty() && self.shard.is_empty()
    }
}

/// A subscriber as the registry knows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Target {
    id: u64,
    worker: usize,
    token: Token,
}

#[derive(Default)]
struct Registry {
    channels: HashMap<Vec<u8>, Vec<Target>>,
    shard: HashMap<Vec<u8>, Vec<Target>>,
    /// Pattern → its glob and subscribers; kept in first-subscription
    /// order, so a message matching several patterns is delivered in a
    /// stable order.
    patterns: IndexMap<Vec<u8>, (Glob, Vec<Target>)>,
}

impl Registry {
    fn map(&mut self, k: Kind) -> &mut HashMap<Vec<u8>, Vec<Target>> {
        match k {
            Kind::Shard => &mut self.shard,
            _ => &mut self.channels,
        }
    }

    fn add(&mut self, k: Kind, name: &[u8], t: Target) {
        match k {
            Kind::Pattern => self
                .patterns
                .entry(name.to_vec())
                .or_insert_with(|| (Glob::new(name, false), Vec::new()))
                .1
                .push(t),
            _ => self.map(k).entry(name.to_vec()).or_default().push(t),
        }
    }

    fn remove(&mut self, k: Kind, name: &[u8], id: u64) {
        match k {
            Kind::Pattern => {
                if let Some((_, v)) = self.patterns.get_mut(name) {
                    v.retain(|t| t.id != id);
                    if v.is_empty() {
                        self.patterns.shift_remove(name);
                    }
                }
            }
            _ => {
                let m = self.map(k);
                if let Some(v) = m.get_mut(name) {
                    v.retain(|t| t.id != id);
                    if v.is_empty() {
                        m.remove(name);
                    }
                }
            }
        }
    }
}

/// One published message, shared by its receivers.
pub(crate) struct Published {
    /// A MONITOR line or an invalidation: `payload` is the whole frame.
    monitor: bool,
    shard: bool,
    channel: Vec<u8>,
    payload: Vec<u8>,
    /// The `message`/`smessage` frame in RESP2 and in RESP3, encoded once
    /// by the first receiver's worker that needs it, then copied to every
    /// other receiver (encoding it per subscriber was a fifth of a fan-out's
    /// delivery time).
    frames: [OnceLock<Vec<u8>>; 2],
}

/// A message on its way to one receiver.
pub(crate) struct Msg {
    token: Token,
    id: u64,
    /// The pattern that matched (a `pmessage`), or None (`message`,
    /// `smessage`).
    pattern: Option<Arc<[u8]>>,
    m: Arc<Published>,
}

impl Msg {
    /// Appends the message to `out` in protocol `v`.
    fn encode(&self, v: Version, out: &mut Vec<u8>) {
        if self.m.monitor {
            out.extend_from_slice(&self.m.payload);
            return;
        }
        match &self.pattern {
            Some(p) => {
                push_header(v, out, 4);
                put::bulk(out, b"pmessage");
                put::bulk(out, p);
                put::bulk(out, &self.m.channel);
                put::bulk(out, &self.m.payload);
            }
            None => {
                let frame = self.m.frames[usize::from(v == Version::Resp3)].get_or_init(|| {
                    let mut f =
                        Vec::with_capacity(self.m.channel.len() + self.m.payload.len() + 48);
                    push_header(v, &mut f, 3);
                    put::bulk(
                        &mut f,
                        if self.m.shard {
                            b"smessage"
                        } else {
                            b"message"
                        },
                    );
                    put::bulk(&mut f, &self.m.channel);
                    put::bulk(&mut f, &self.m.payload);
                    f
                });
                out.extend_from_slice(frame);
            }
        }
    }
}

/// The header of a Pub/Sub message or confirmation: a RESP2 array, a RESP3
/// push.
fn push_header(v: Version, out: &mut Vec<u8>, n: usize) {
    if v == Version::Resp3 {
        use std::io::Write;
        let _ = write!(out, ">{n}\r\n");
    } else {
        put::array_header(out, n);
    }
}

/// A worker's messages, and how to wake its poll.
#[derive(Default)]
struct Inbox {
    msgs: Mutex<Vec<Msg>>,
    /// Set while `msgs` is not empty: the worker's loop checks it for free,
    /// and a publisher wakes the worker only when it was clear.
    full: AtomicBool,
    waker: OnceLock<Arc<Waker>>,
}

/// The Pub/Sub registry and the workers' inboxes (see the module's
/// documentation).
pub struct Pubsub {
    reg: RwLock<Registry>,
    /// Subscriptions of every kind, over every client: zero means a publish
    /// has nobody to count (one load).
    subscriptions: AtomicUsize,
    inboxes: Vec<Inbox>,
    /// `notify-keyspace-events` as flags (see [`crate::notify`]); shared
    /// with every worker's keyspace, which logs expired and created keys
    /// only while the matching class is on.
    notify: Arc<AtomicU32>,
    /// MONITOR clients, and their number (one load per command when zero).
    monitors: std::sync::Mutex<Vec<Target>>,
    monitor_count: AtomicUsize,
}

impl Pubsub {
    pub fn new(workers: usize, notify_flags: u32) -> Pubsub {
        Pubsub {
            reg: RwLock::new(Registry::default()),
            subscriptions: AtomicUsize::new(0),
            inboxes: (0..workers.max(1)).map(|_| Inbox::default()).collect(),
            notify: Arc::new(AtomicU32::new(notify_flags)),
            monitors: std::sync::Mutex::new(Vec::new()),
            monitor_count: AtomicUsize::new(0),
        }
    }

    /// Some client is in MONITOR mode.
    #[inline]
    pub fn monitoring(&self) -> bool {
        self.monitor_count.load(Ordering::Relaxed) > 0
    }

    fn monitors(&self) -> std::sync::MutexGuard<'_, Vec<Target>> {
        self.monitors.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// MONITOR: client `id` (token `token` of worker `worker`) receives
    /// every command from now on.
    pub(crate) fn add_monitor(&self, id: u64, worker: usize, token: Token) {
        let mut m = self.monitors();
        if !m.iter().any(|t| t.id == id) {
            m.push(Target { id, worker, token });
            self.monitor_count.store(m.len(), Ordering::Release);
        }
    }

    fn remove_monitor(&self, id: u64) {
        let mut m = self.monitors();
        m.retain(|t| t.id != id);
        self.monitor_count.store(m.len(), Ordering::Release);
    }

    /// Sends a MONITOR line (a whole frame) to every monitor.
    pub(crate) fn feed_monitors(&self, line: Vec<u8>) {
        let m = Arc::new(Published {
            monitor: true,
            shard: false,
            channel: Vec::new(),
            payload: line,
            frames: Default::default(),
        });
        let out = self
            .monitors()
            .iter()
            .map(|t| {
                (
                    t.worker,
                    Msg {
                        token: t.token,
                        id: t.id,
                        pattern: None,
                        m: m.clone(),
                    },
                )
            })
            .collect();
        self.send(out);
    }

    /// Sends whole frames, each encoded for its receiver (client-side
    /// caching's invalidations: see [`crate::tracking`]), as (worker,
    /// token, client id, frame).
    pub(crate) fn send_frames(&self, frames: Vec<(usize, Token, u64, Vec<u8>)>) {
        let out = frames
            .into_iter()
            .map(|(worker, token, id, payload)| {
                let m = Arc::new(Published {
                    monitor: true,
                    shard: false,
                    channel: Vec::new(),
                    payload,
                    frames: Default::default(),
                });
                (
                    worker,
                    Msg {
                        token,
                        id,
                        pattern: None,
                        m,
                    },
                )
            })
            .collect();
        self.send(out);
    }

    /// Worker `id`'s poll waker (set once when the worker starts).
    pub(crate) fn set_waker(&self, id: usize, w: Arc<Waker>) {
        if let Some(i) = self.inboxes.get(id) {
            let _ = i.waker.set(w);
        }
    }

    /// Worker `id`'s poll waker, once it started.
    pub(crate) fn waker(&self, id: usize) -> Option<Arc<Waker>> {
        self.inboxes.get(id)?.waker.get().cloned()
    }

    /// The `notify-keyspace-events` flags, shared (see [`crate::notify`]).
    pub fn notify_flags(&self) -> &Arc<AtomicU32> {
        &self.notify
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Registry> {
        self.reg.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Registry> {
        self.reg.write().unwrap_or_else(|p| p.into_inner())
    }

    /// Publishes `payload` on `channel` (a shard channel when `shard`):
    /// returns the number of receivers as Redis counts them (each channel
    /// subscriber, and each client once per pattern of its that matches).
    pub fn publish(&self, shard: bool, channel: &[u8], payload: &[u8]) -> usize {
        if self.subscriptions.load(Ordering::Acquire) == 0 {
            return 0;
        }
        let reg = self.read();
        let direct = if shard { &reg.shard } else { &reg.channels };
        let subs = direct.get(channel);
        let mut out: Vec<(usize, Msg)> = Vec::new();
        let mut m: Option<Arc<Published>> = None;
        let mut published = || {
            m.get_or_insert_with(|| {
                Arc::new(Published {
                    monitor: false,
                    shard,
                    channel: channel.to_vec(),
                    payload: payload.to_vec(),
                    frames: Default::default(),
                })
            })
            .clone()
        };
        for t in subs.into_iter().flatten() {
            out.push((
                t.worker,
                Msg {
                    token: t.token,
                    id: t.id,
                    pattern: None,
                    m: published(),
                },
            ));
        }
        if !shard {
            for (p, (g, ts)) in &reg.patterns {
                if !g.matches(channel) {
                    continue;
                }
                let p: Arc<[u8]> = Arc::from(p.as_slice());
                for t in ts {
                    out.push((
                        t.worker,
                        Msg {
                            token: t.token,
                            id: t.id,
                            pattern: Some(p.clone()),
                            m: published(),
                        },
                    ));
                }
            }
        }
        let n = out.len();
        if n > 0 {
            self.send(out);
        }
        drop(reg);
        n
    }

    /// Hands messages to their workers' inboxes (registry read lock held:
    /// a subscription is not removed while messages counted for it are on
    /// their way), each inbox locked once, waking the workers whose inbox
    /// was empty.
    fn send(&self, mut out: Vec<(usize, Msg)>) {
        // Grouped by worker, keeping each worker's messages in order.
        out.sort_by_key(|(w, _)| *w);
        let mut it = out.into_iter().peekable();
        while let Some((w, first)) = it.next() {
            let Some(inbox) = self.inboxes.get(w) else {
                continue;
            };
            let mut q = inbox.msgs.lock().unwrap_or_else(|p| p.into_inner());
            q.push(first);
            while let Some((_, m)) = it.next_if(|(x, _)| *x == w) {
                q.push(m);
            }
            let was_full = inbox.full.swap(true, Ordering::AcqRel);
            drop(q);
            if !was_full {
                if let Some(wk) = inbox.waker.get() {
                    let _ = wk.wake();
                }
            }
        }
    }

    /// The messages waiting for worker `id`, oldest first.
    fn take(&self, id: usize) -> Vec<Msg> {
        let Some(inbox) = self.inboxes.get(id) else {
            return Vec::new();
        };
        if !inbox.full.load(Ordering::Acquire) {
            return Vec::new();
        }
        let mut q = inbox.msgs.lock().unwrap_or_else(|p| p.into_inner());
        inbox.full.store(false, Ordering::Release);
        std::mem::take(&mut *q)
    }

    /// The messages waiting in worker `id`'s inbox for client `cid`, taken
    /// out in order (the others stay).
    fn take_for(&self, id: usize, cid: u64) -> Vec<Msg> {
        let Some(inbox) = self.inboxes.get(id) else {
            return Vec::new();
        };
        if !inbox.full.load(Ordering::Acquire) {
            return Vec::new();
        }
        let mut q = inbox.msgs.lock().unwrap_or_else(|p| p.into_inner());
        if !q.iter().any(|m| m.id == cid) {
            return Vec::new();
        }
        let (mine, rest): (Vec<Msg>, Vec<Msg>) = std::mem::take(&mut *q)
            .into_iter()
            .partition(|m| m.id == cid);
        *q = rest;
        if q.is_empty() {
            inbox.full.store(false, Ordering::Release);
        }
        mine
    }

    /// PUBSUB CHANNELS / SHARDCHANNELS: the active channels matching
    /// `pattern` (all without one).
    pub fn channels(&self, shard: bool, pattern: Option<&[u8]>) -> Vec<Vec<u8>> {
        let g = pattern.map(|p| Glob::new(p, false));
        let reg = self.read();
        let m = if shard { &reg.shard } else { &reg.channels };
        let mut v: Vec<Vec<u8>> = m
            .keys()
            .filter(|c| g.as_ref().is_none_or(|g| g.matches(c)))
            .cloned()
            .collect();
        v.sort_unstable();
        v
    }

    /// PUBSUB NUMSUB / SHARDNUMSUB: a channel's subscribers (patterns not
    /// counted).
    pub fn numsub(&self, shard: bool, channel: &[u8]) -> usize {
        let reg = self.read();
        let m = if shard { &reg.shard } else { &reg.channels };
        m.get(channel).map_or(0, |v| v.len())
    }

    /// Active channels, patterns and shard channels (PUBSUB NUMPAT, INFO
    /// stats `pubsub_channels`, `pubsub_patterns`, `pubsubshard_channels`).
    pub fn counts(&self) -> (usize, usize, usize) {
        let reg = self.read();
        (reg.channels.len(), reg.patterns.len(), reg.shard.len())
    }
}

/// The client's registration handle: its worker and token (None for the
/// in-process executor, which has no poll loop to deliver to).
fn target(c: &Client) -> Option<Target> {
    c.home.map(|(worker, token)| Target {
        id: c.id,
        worker,
        token,
    })
}

/// Publishes CLIENT LIST's `sub`/`psub`/`ssub` and the `pubsub` class.
fn note_counts(c: &Client) {
    let s = c.subs.as_deref();
    let n = |k: Kind| {
        s.map_or(0, |s| match k {
            Kind::Channel => s.channels.len(),
            Kind::Pattern => s.patterns.len(),
            Kind::Shard => s.shard.len(),
        })
    };
    c.meta.sub.store(n(Kind::Channel) as u32, Ordering::Relaxed);
    c.meta
        .psub
        .store(n(Kind::Pattern) as u32, Ordering::Relaxed);
    c.meta.ssub.store(n(Kind::Shard) as u32, Ordering::Relaxed);
}

/// (P|S)SUBSCRIBE of `names`: each confirmed with the client's count after
/// it. False when the client cannot receive messages (in-process executor).
pub fn subscribe(sh: &Shared, c: &mut Client, k: Kind, names: &[Vec<u8>]) -> bool {
    let Some(t) = target(c) else {
        return false;
    };
    let ps = &sh.pubsub;
    for name in names {
        let subs = c.subs.get_or_insert_with(Box::default);
        if subs.set(k).insert(name.clone()) {
            let mut reg = ps.write();
            reg.add(k, name, t);
            ps.subscriptions.fetch_add(1, Ordering::AcqRel);
        }
        let n = subs.count(k);
        push_header(c.resp, &mut c.out, 3);
        put::bulk(&mut c.out, k.subscribe_word());
        put::bulk(&mut c.out, name);
        put::int(&mut c.out, n as i64);
    }
    note_counts(c);
    true
}

/// (P|S)UNSUBSCRIBE of `names`, or of every subscription of kind `k` when
/// empty: each confirmed with the count after it; with none to remove, one
/// confirmation with a null name.
pub fn unsubscribe(sh: &Shared, c: &mut Client, k: Kind, names: &[Vec<u8>]) {
    let all: Vec<Vec<u8>>;
    let names = if names.is_empty() {
        all = c
            .subs
            .as_mut()
            .map(|s| s.set(k).iter().cloned().collect())
            .unwrap_or_default();
        if all.is_empty() {
            let n = c.subs.as_ref().map_or(0, |s| s.count(k));
            push_header(c.resp, &mut c.out, 3);
            put::bulk(&mut c.out, k.unsubscribe_word());
            put::null(&mut c.out, c.resp);
            put::int(&mut c.out, n as i64);
            return;
        }
        &all[..]
    } else {
        names
    };
    for name in names {
        let removed = c.subs.as_mut().is_some_and(|s| s.set(k).shift_remove(name));
        if removed {
            sh.pubsub.write().remove(k, name, c.id);
            sh.pubsub.subscriptions.fetch_sub(1, Ordering::AcqRel);
            // What was published before the removal took effect comes
            // before its confirmation (the write lock waited for the
            // publishers that counted this client).
            if let Some((w, _)) = c.home {
                for m in sh.pubsub.take_for(w, c.id) {
                    m.encode(c.resp, &mut c.out);
                }
            }
        }
        let n = c.subs.as_ref().map_or(0, |s| s.count(k));
        push_header(c.resp, &mut c.out, 3);
        put::bulk(&mut c.out, k.unsubscribe_word());
        put::bulk(&mut c.out, name);
        put::int(&mut c.out, n as i64);
    }
    if c.subs.as_ref().is_some_and(|s| s.is_empty()) {
        c.subs = None;
    }
    note_counts(c);
}

/// Drops every subscription of the client without confirmations (RESET, a
/// closing connection).
pub fn forget(sh: &Shared, c: &mut Client) {
    if std::mem::take(&mut c.monitor) {
        sh.pubsub.remove_monitor(c.id);
        if let Some((w, _)) = c.home {
            drop(sh.pubsub.take_for(w, c.id));
        }
    }
    let Some(s) = c.subs.take() else {
        return;
    };
    let ps = &sh.pubsub;
    let mut reg = ps.write();
    for (k, set) in [
        (Kind::Channel, &s.channels),
        (Kind::Pattern, &s.patterns),
        (Kind::Shard, &s.shard),
    ] {
        for name in set {
            reg.remove(k, name, c.id);
            ps.subscriptions.fetch_sub(1, Ordering::AcqRel);
        }
    }
    drop(reg);
    // Messages already on their way to it are dropped with it.
    if let Some((w, _)) = c.home {
        drop(ps.take_for(w, c.id));
    }
    note_counts(c);
}

/// Whether a RESP2 client with subscriptions may run command `name`
/// (Redis's subscriber mode).
pub fn allowed_in_subscriber_mode(name: &str) -> bool {
    matches!(
        name,
        "subscribe"
            | "unsubscribe"
            | "psubscribe"
            | "punsubscribe"
            | "ssubscribe"
            | "sunsubscribe"
            | "ping"
            | "quit"
            | "reset"
    )
}

/// After every command (`cmd::execute`; `mark` is where its reply begins
/// in the client's output): publishes the keyspace events its lookups and
/// writes left pending (`expired`, `new`), then, for a subscribed client,
/// moves the messages waiting for it in its worker's inbox in front of the
/// reply (see the module's documentation).
pub fn after_command(sh: &Shared, ks: &mut crate::keyspace::Keyspace, c: &mut Client, mark: usize) {
    crate::notify::flush_pending(sh, ks);
    if c.subs.is_none() {
        return;
    }
    let Some((w, _)) = c.home else {
        return;
    };
    let mine = sh.pubsub.take_for(w, c.id);
    if mine.is_empty() {
        return;
    }
    let mut buf = Vec::new();
    for m in &mine {
        m.encode(c.resp, &mut buf);
    }
    let at = mark.min(c.out.len());
    c.out.splice(at..at, buf);
}

/// The `client-output-buffer-limit` classes clients have (indexes into
/// `config::OBUF_CLASSES`).
pub(crate) const OBUF_NORMAL: usize = 0;
pub(crate) const OBUF_PUBSUB: usize = 2;

/// The output limit class of a client: `pubsub` while it has
/// subscriptions (Redis's `getClientType`), else `normal`.
pub(crate) fn obuf_class(c: &Client) -> usize {
    // A monitor is held to the pubsub limits (Redis holds it to the replica
    // class, which Ember does not have): one that stops reading is closed
    // rather than buffer every command.
    if c.subs.is_some() || c.monitor {
        OBUF_PUBSUB
    } else {
        OBUF_NORMAL
    }
}

/// The pending output from which a client of limit `l` is checked (the
/// smaller limit set; `usize::MAX` when there is none).
pub(crate) fn obuf_check(l: &ObufLimit) -> usize {
    [l.hard, l.soft]
        .into_iter()
        .filter(|&x| x > 0)
        .min()
        .map_or(usize::MAX, |x| usize::try_from(x).unwrap_or(usize::MAX))
}

/// The worker's side: taking its inbox.
impl Worker {
    /// Publishes pending keyspace events, then appends the messages waiting
    /// in this worker's inbox to their clients' output (in each client's
    /// protocol), adding the clients to `ready` so the batch's commit
    /// releases and writes them. A client whose pending output passes its
    /// `pubsub` output buffer limit is closed.
    pub(crate) fn deliver_pubsub(&mut self, ready: &mut Vec<Token>) {
        crate::notify::flush_pending(&self.sh, &mut self.ks);
        let msgs = self.sh.pubsub.take(self.id);
        if msgs.is_empty() {
            return;
        }
        let n = ready.len();
        let mut last = None;
        for m in &msgs {
            let Some(c) = self.clients.get_mut(&m.token) else {
                continue;
            };
            if c.id != m.id || c.kill {
                continue;
            }
            m.encode(c.resp, &mut c.out);
            if last != Some(m.token) {
                ready.push(m.token);
                last = Some(m.token);
            }
        }
        ready[n..].sort_unstable();
        let mut touched: Vec<Token> = ready[n..].to_vec();
        touched.dedup();
        for t in touched {
            if let Some(mut c) = self.clients.remove(&t) {
                if c.out.len() - c.outpos >= self.obuf_check_of(&c) {
                    self.output_limit_reached(&mut c);
                }
                self.clients.insert(t, c);
            }
        }
        ready.sort_unstable();
        ready.dedup();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(id: u64, worker: usize) -> Target {
        Target {
            id,
            worker,
            token: Token(id as usize),
        }
    }

    fn taken(p: &Pubsub, w: usize) -> Vec<(u64, Option<String>, String)> {
        p.take(w)
            .into_iter()
            .map(|m| {
                (
                    m.id,
                    m.pattern
                        .as_ref()
                        .map(|p| String::from_utf8_lossy(p).into_owned()),
                    String::from_utf8_lossy(&m.m.payload).into_owned(),
                )
            })
            .collect()
    }

    #[test]
    fn publish_counts_channels_and_patterns_and_routes_by_worker() {
        let p = Pubsub::new(2, 0);
        assert_eq!(p.publish(false, b"news", b"x"), 0);
        {
            let mut r = p.write();
            r.add(Kind::Channel, b"news", t(1, 0));
            r.add(Kind::Channel, b"news", t(2, 1));
            r.add(Kind::Pattern, b"n*", t(1, 0));
            r.add(Kind::Pattern, b"n?ws", t(1, 0));
            r.add(Kind::Pattern, b"x*", t(2, 1));
            r.add(Kind::Shard, b"news", t(3, 1));
        }
        p.subscriptions.store(6, Ordering::Release);
        // Two channel subscribers, two matching patterns of client 1.
        assert_eq!(p.publish(false, b"news", b"a"), 4);
        assert_eq!(p.publish(true, b"news", b"b"), 1);
        assert_eq!(
            taken(&p, 0),
            [
                (1, None, "a".into()),
                (1, Some("n*".into()), "a".into()),
                (1, Some("n?ws".into()), "a".into()),
            ]
        );
        assert_eq!(taken(&p, 1), [(2, None, "a".into()), (3, None, "b".into())]);
        assert!(taken(&p, 1).is_empty());
        assert_eq!(p.channels(false, None), [b"news".to_vec()]);
        assert_eq!(p.channels(false, Some(b"x*")), Vec::<Vec<u8>>::new());
        assert_eq!(p.numsub(true, b"news"), 1);
        assert_eq!(p.counts(), (1, 3, 1));
        let mut r = p.write();
        r.remove(Kind::Pattern, b"n*", 1);
        r.remove(Kind::Channel, b"news", 2);
        r.remove(Kind::Channel, b"news", 1);
        drop(r);
        assert_eq!(p.counts(), (0, 2, 1));
    }

    #[test]
    fn a_clients_messages_are_taken_out_in_order() {
        let p = Pubsub::new(1, 0);
        {
            let mut r = p.write();
            r.add(Kind::Channel, b"c", t(1, 0));
            r.add(Kind::Channel, b"c", t(2, 0));
        }
        p.subscriptions.store(2, Ordering::Release);
        for i in 0..3 {
            assert_eq!(p.publish(false, b"c", i.to_string().as_bytes()), 2);
        }
        let mine: Vec<String> = p
            .take_for(0, 2)
            .into_iter()
            .map(|m| String::from_utf8_lossy(&m.m.payload).into_owned())
            .collect();
        assert_eq!(mine, ["0", "1", "2"]);
        assert_eq!(taken(&p, 0).len(), 3);
    }

    #[test]
    fn messages_encode_as_redis_sends_them() {
        let m = Msg {
            token: Token(1),
            id: 1,
            pattern: Some(Arc::from(&b"c*"[..])),
            m: Arc::new(Published {
                monitor: false,
                shard: false,
                channel: b"ch".to_vec(),
                payload: b"hi".to_vec(),
                frames: Default::default(),
            }),
        };
        let mut out = Vec::new();
        m.encode(Version::Resp2, &mut out);
        assert_eq!(
            out,
            b"*4\r\n$8\r\npmessage\r\n$2\r\nc*\r\n$2\r\nch\r\n$2\r\nhi\r\n"
        );
        out.clear();
        let s = Msg { pattern: None, ..m };
        s.encode(Version::Resp3, &mut out);
        assert_eq!(out, b">3\r\n$7\r\nmessage\r\n$2\r\nch\r\n$2\r\nhi\r\n");
        // The frame is encoded once per protocol and reused.
        out.clear();
        s.encode(Version::Resp2, &mut out);
        s.encode(Version::Resp3, &mut out);
        assert_eq!(
            out,
            b"*3\r\n$7\r\nmessage\r\n$2\r\nch\r\n$2\r\nhi\r\n>3\r\n$7\r\nmessage\r\n$2\r\nch\r\n$2\r\nhi\r\n"
        );
    }
}
