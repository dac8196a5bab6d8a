//! Client-side caching (Redis's `tracking.c`): CLIENT TRACKING, CLIENT
//! CACHING, CLIENT GETREDIR, CLIENT TRACKINGINFO and the invalidation
//! messages.
//!
//! # Pieces
//! - The **registry** ([`Tracking`], in `Shared`): the tracking table (key
//!   name → the ids of the clients that may cache it; key names without
//!   their database, as Redis's table is global), the BCAST prefixes and
//!   their clients, and the tracking clients' metadata, under one mutex.
//!   As in Redis, turning tracking off leaves the client's ids in the table;
//!   they are skipped, and dropped when their key is invalidated.
//! - A client's **own state** ([`ClientTrack`], in `ClientMeta`): its mode
//!   flags (`t`, `R`, `B` of CLIENT LIST), its redirect id, its prefixes and
//!   where it is served (worker and poll token), readable by any worker.
//! - Each worker's **log** ([`Local`], in its `Keyspace`): `Keyspace::apply`
//!   adds the database keys it applied while some client tracks — one
//!   relaxed load of [`Tracking::active`] per applied batch otherwise — and
//!   [`after`] and [`flush_turn`] turn them into invalidations: at the end of the command that
//!   wrote them (`cmd::execute`, so that its client, the writer, is known for
//!   NOLOOP and gets its own invalidations after its reply, as Redis 7.0
//!   orders them) and on the worker's loop turn (writes of served blocked
//!   clients, active expiry, eviction, the memcached port).
//!
//! # Delivery
//! An invalidation is encoded as its receiver needs it (RESP3 push
//! `invalidate`, or a RESP2 Pub/Sub message on `__redis__:invalidate` to a
//! redirect client in Pub/Sub mode) and handed to the receiver's worker
//! through the Pub/Sub inboxes (`Pubsub::send_frames`), except for the
//! client running the command, whose output gets it after the reply. A key
//! is sent once to each client that read it, and forgotten.
//!
//! # Why a read is remembered before and after it runs
//! Reads do not take stripe locks. A tracking client's key is put in the
//! table before the command reads it, so a write on another worker either
//! finds it there (and invalidates) or was applied before the table saw it,
//! and then before the read (the writer checks the table after applying,
//! under the table's mutex, which the reader took after it). After the
//! command the key is put there again, as Redis remembers it, so an
//! invalidation the command itself caused (a key it found expired) or one
//! racing with it does not leave the new value untracked. A flush after
//! the command, of a write the read already saw (applied before the read,
//! flushed at the end of another worker's command or by an apply thread
//! after its commit), forgets the key and sends its invalidation behind the
//! reply: the client drops the value it just cached; Redis, whose write and
//! invalidation are one step, would not send it.
//!
//! # The relaxed load
//! The count of tracking clients is raised (under the registry's mutex,
//! sequentially consistent) by CLIENT TRACKING ON, before the client's
//! next command can remember a key; a writer loads it relaxed after its
//! write. The one window this leaves is a write whose load runs ahead of
//! its own store (a store buffer) exactly while the server's first
//! tracking client turns tracking on and reads that key: that write's
//! invalidation can be missed, and the client keeps the old value until
//! the key's next write. Once any client tracks, the count stays above zero
//! and every write looks at the table.
//!
//! # BCAST
//! Modified keys matching a prefix are kept per worker, sorted and without
//! duplicates (the last writer of each, for NOLOOP), and sent on the
//! worker's loop turn, one message per prefix and client: Redis sends them
//! once per event loop; here a worker's loop turn is the batch (the writes
//! of one loop turn of one worker go in one message per prefix).

use crate::client::{Client, ClientMeta};
use crate::cmd::{CmdError, Ctx, Flags, TABLE};
use crate::keyspace::Keyspace;
use crate::server::Shared;
use mio::Token;
use proto::reply::put;
use proto::{Reply, Version};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

/// Client flags (Redis's `CLIENT_TRACKING*`).
pub const ON: u32 = 1;
pub const BCAST: u32 = 2;
pub const OPTIN: u32 = 4;
pub const OPTOUT: u32 = 8;
/// CLIENT CACHING was given for the next command (or transaction).
pub const CACHING: u32 = 16;
pub const NOLOOP: u32 = 32;
/// The redirect client was gone when an invalidation was due (flag `R`).
pub const BROKEN: u32 = 64;

/// A client's tracking state as every worker sees it.
#[derive(Default)]
pub struct ClientTrack {
    pub flags: AtomicU32,
    /// The client invalidations go to (0: this one).
    pub redir: AtomicU64,
    /// BCAST prefixes, in Redis's (sorted) order.
    prefixes: Mutex<BTreeSet<Vec<u8>>>,
    /// Its worker and poll token (None in the in-process executor).
    pub home: OnceLock<(usize, Token)>,
}

impl ClientTrack {
    fn flags(&self) -> u32 {
        self.flags.load(Ordering::Relaxed)
    }

    /// CLIENT LIST's tracking flags, in Redis's order.
    pub fn flag_chars(&self, out: &mut String) {
        let f = self.flags();
        for (bit, ch) in [(ON, 't'), (BROKEN, 'R'), (BCAST, 'B')] {
            if f & bit != 0 {
                out.push(ch);
            }
        }
    }

    /// CLIENT LIST's `redir=` and CLIENT GETREDIR: -1 while not tracking.
    pub fn redir_field(&self) -> i64 {
        if self.flags() & ON != 0 {
            self.redir.load(Ordering::Relaxed) as i64
        } else {
            -1
        }
    }

    fn prefixes(&self) -> std::sync::MutexGuard<'_, BTreeSet<Vec<u8>>> {
        self.prefixes.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[derive(Default)]
struct Inner {
    /// Key name → ids of the clients that read it.
    table: HashMap<Vec<u8>, Vec<u64>>,
    /// Ids over every key (INFO `tracking_total_items`).
    items: usize,
    /// The clients with tracking on.
    clients: HashMap<u64, Arc<ClientMeta>>,
    /// BCAST prefix → its clients.
    prefixes: BTreeMap<Vec<u8>, Vec<u64>>,
}

/// The server's tracking registry (see the module's text).
#[derive(Default)]
pub struct Tracking {
    /// Clients with tracking on: 0 makes a write's check one relaxed load.
    active: AtomicUsize,
    inner: Mutex<Inner>,
}

impl Tracking {
    /// Some client tracks (one relaxed load: see the module's text).
    #[inline]
    pub fn active(&self) -> bool {
        self.active.load(Ordering::Relaxed) > 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// INFO: tracking clients, keys, items, prefixes.
    pub fn counts(&self) -> (usize, usize, usize, usize) {
        let i = self.lock();
        (i.clients.len(), i.table.len(), i.items, i.prefixes.len())
    }
}

/// A worker's side (in its `Keyspace`): the keys its writes modified since
/// they were last flushed ([`after`], [`flush_turn`]), the BCAST keys of
/// this loop turn, and what the running command remembered.
#[derive(Default)]
pub struct Local {
    reg: Arc<Tracking>,
    /// Store keys applied while some client tracked.
    modified: Vec<Vec<u8>>,
    /// Key name → its last writer (0: none), for BCAST clients.
    bcast: BTreeMap<Vec<u8>, u64>,
    /// A flush is running: its deletions send no invalidation (the flush
    /// sends one null to everyone instead).
    quiet: bool,
    /// The running script's declared keys, remembered when it reads.
    script_keys: Option<Vec<Vec<u8>>>,
    /// Keys the running command remembered, and those of them that were
    /// new for its client.
    remembered: Vec<Vec<u8>>,
    fresh: Vec<Vec<u8>>,
    /// The client whose command runs (0 between commands).
    cur: u64,
    /// Messages for that client, written after its reply (a flush's null).
    pending_mine: Vec<u8>,
}

impl Local {
    /// Joins the server's registry (a worker's keyspace; others keep a
    /// registry of their own that nobody uses).
    pub fn set_registry(&mut self, reg: Arc<Tracking>) {
        self.reg = reg;
    }

    /// Called by `Keyspace::apply` with the batch it applied: one relaxed
    /// load while no client tracks.
    #[inline]
    pub fn applied<'a>(&mut self, keys: impl Iterator<Item = &'a [u8]>) {
        if !self.reg.active() || self.quiet {
            return;
        }
        for k in keys {
            if k.len() > 1 && k[0] != crate::keyspace::PIECE_PREFIX {
                self.modified.push(k.to_vec());
            }
        }
    }
}

/// Where a message goes: a client's id, worker and token.
type Dest = (u64, usize, Token);

fn dest(m: &ClientMeta) -> Option<Dest> {
    m.track.home.get().map(|&(w, t)| (m.id, w, t))
}

/// Messages on their way: to the running client (after its reply) or to
/// other clients through their workers' inboxes.
#[derive(Default)]
struct Out {
    mine: Vec<u8>,
    others: Vec<(usize, Token, u64, Vec<u8>)>,
    /// Redirect clients looked up so far (one lock of the client list per
    /// redirect id and flush).
    redirs: HashMap<u64, Option<Arc<ClientMeta>>>,
}

impl Out {
    fn add(&mut self, cur: u64, d: Dest, frame: Vec<u8>) {
        if d.0 == cur {
            self.mine.extend_from_slice(&frame);
        } else {
            self.others.push((d.1, d.2, d.0, frame));
        }
    }

    fn send(self, sh: &Shared, cur: Option<&mut Client>) {
        if let Some(c) = cur {
            c.out.extend_from_slice(&self.mine);
        }
        if !self.others.is_empty() {
            sh.pubsub.send_frames(self.others);
        }
    }
}

/// The payload of an invalidation for tracking client `t`: `keys` (an
/// encoded array) or, for a flush, a null in `t`'s protocol (Redis sends
/// the tracking client's null, also to a redirect client).
enum Payload<'a> {
    Keys(&'a [u8]),
    Null,
}

/// Routes an invalidation for tracking client `t`: to its redirect client
/// (a RESP3 push, or a Pub/Sub message when that client is a RESP2
/// subscriber), or to itself in RESP3; a redirect client that is gone
/// marks `t` broken and, in RESP3, tells it so. RESP2 without a redirect
/// gets nothing (Redis's `sendTrackingMessage`).
fn route(sh: &Shared, t: &ClientMeta, p: &Payload, cur: u64, out: &mut Out) {
    let t3 = t.resp.load(Ordering::Relaxed) == 3;
    let redir = t.track.redir.load(Ordering::Relaxed);
    let found;
    let to: &ClientMeta = if redir != 0 {
        found = out
            .redirs
            .entry(redir)
            .or_insert_with(|| {
                sh.clients
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .get(&redir)
                    .cloned()
            })
            .clone();
        match &found {
            Some(r) => r,
            None => {
                t.track.flags.fetch_or(BROKEN, Ordering::Relaxed);
                if let (true, Some(d)) = (t3, dest(t)) {
                    let mut f = b">2\r\n".to_vec();
                    put::bulk(&mut f, b"tracking-redir-broken");
                    put::int(&mut f, redir as i64);
                    out.add(cur, d, f);
                }
                return;
            }
        }
    } else {
        t
    };
    let Some(d) = dest(to) else {
        return;
    };
    let mut f = Vec::new();
    if to.resp.load(Ordering::Relaxed) == 3 {
        f.extend_from_slice(b">2\r\n");
        put::bulk(&mut f, b"invalidate");
    } else if redir != 0 && to.is_pubsub() {
        put::array_header(&mut f, 3);
        put::bulk(&mut f, b"message");
        put::bulk(&mut f, b"__redis__:invalidate");
    } else {
        return;
    }
    match p {
        Payload::Keys(k) => f.extend_from_slice(k),
        Payload::Null => put::null(&mut f, if t3 { Version::Resp3 } else { Version::Resp2 }),
    }
    out.add(cur, d, f);
}

fn key_array(keys: &[&[u8]]) -> Vec<u8> {
    let mut v = Vec::new();
    put::array_header(&mut v, keys.len());
    for k in keys {
        put::bulk(&mut v, k);
    }
    v
}

/// Sends the invalidations the worker's writes since the last flush call
/// for. `cur`: the client whose command made them (NOLOOP, and its own
/// messages go after its reply). The keys that client's plain read command
/// remembered for the first time (`Local::fresh`) are not invalidated to
/// it: that command's only writes are keys it found expired, and Redis,
/// which remembers after the command, had not tracked them for it yet.
/// `turn`: the loop turn's flush, which also sends the BCAST batch.
fn flush_with(sh: &Shared, ks: &mut Keyspace, cur: Option<&mut Client>, turn: bool) {
    let l = &mut ks.track;
    if l.modified.is_empty() && (!turn || l.bcast.is_empty()) {
        return;
    }
    let cur_id = cur.as_ref().map_or(0, |c| c.id);
    let fresh = std::mem::take(&mut l.fresh);
    let modified = std::mem::take(&mut l.modified);
    let reg = l.reg.clone();
    let mut out = Out::default();
    let mut due: Vec<(Arc<ClientMeta>, Vec<u8>)> = Vec::new();
    {
        let mut guard = reg.lock();
        let inner = &mut *guard;
        let bcasting = !inner.prefixes.is_empty();
        for sk in &modified {
            let name = &sk[1..];
            if bcasting {
                l.bcast.insert(name.to_vec(), cur_id);
            }
            let Some(ids) = inner.table.remove(name) else {
                continue;
            };
            inner.items -= ids.len();
            for id in ids {
                let Some(m) = inner.clients.get(&id) else {
                    continue;
                };
                let f = m.track.flags();
                if f & ON == 0 || f & BCAST != 0 || (f & NOLOOP != 0 && id == cur_id) {
                    continue;
                }
                if id == cur_id && fresh.iter().any(|k| k == name) {
                    continue;
                }
                due.push((m.clone(), name.to_vec()));
            }
        }
    }
    for (m, name) in &due {
        route(
            sh,
            m,
            &Payload::Keys(&key_array(&[name.as_slice()])),
            cur_id,
            &mut out,
        );
    }
    if turn && !l.bcast.is_empty() {
        let keys = std::mem::take(&mut l.bcast);
        broadcast(sh, &reg, &keys, &mut out);
    }
    out.send(sh, cur);
}

/// BCAST: for each prefix with modified keys, one message per client (a
/// NOLOOP client's without the keys it wrote last).
fn broadcast(sh: &Shared, reg: &Tracking, keys: &BTreeMap<Vec<u8>, u64>, out: &mut Out) {
    let mut sends: Vec<(Arc<ClientMeta>, Vec<u8>)> = Vec::new();
    {
        let inner = reg.lock();
        for (p, ids) in &inner.prefixes {
            let matching: Vec<(&[u8], u64)> = keys
                .range(p.clone()..)
                .take_while(|(k, _)| k.starts_with(p))
                .map(|(k, w)| (k.as_slice(), *w))
                .collect();
            if matching.is_empty() {
                continue;
            }
            let all: Vec<&[u8]> = matching.iter().map(|(k, _)| *k).collect();
            let common = key_array(&all);
            for id in ids {
                let Some(m) = inner.clients.get(id) else {
                    continue;
                };
                if m.track.flags() & NOLOOP != 0 {
                    let mine: Vec<&[u8]> = matching
                        .iter()
                        .filter(|(_, w)| w != id)
                        .map(|(k, _)| *k)
                        .collect();
                    if !mine.is_empty() {
                        sends.push((m.clone(), key_array(&mine)));
                    }
                } else {
                    sends.push((m.clone(), common.clone()));
                }
            }
        }
    }
    for (m, payload) in &sends {
        route(sh, m, &Payload::Keys(payload), 0, out);
    }
}

/// The worker's loop turn (and after its tick): invalidations of writes
/// made outside a command, and the BCAST batch.
pub(crate) fn flush_turn(sh: &Shared, ks: &mut Keyspace) {
    flush_with(sh, ks, None, true);
}

/// FLUSHDB / FLUSHALL: every tracking client gets a null (all its keys are
/// invalid; the running client's after its reply), the table is emptied,
/// and the flush's deletions send nothing else while `quiet` is set.
pub(crate) fn flushing(ctx: &mut Ctx, quiet: bool) {
    ctx.ks.track.quiet = quiet;
    if !quiet || !ctx.ks.track.reg.active() {
        return;
    }
    let reg = ctx.ks.track.reg.clone();
    let clients: Vec<Arc<ClientMeta>> = {
        let mut inner = reg.lock();
        inner.table.clear();
        inner.items = 0;
        inner.clients.values().cloned().collect()
    };
    let cur = ctx.ks.track.cur;
    let mut out = Out::default();
    for m in &clients {
        route(ctx.sh, m, &Payload::Null, cur, &mut out);
    }
    ctx.ks.track.pending_mine.extend_from_slice(&out.mine);
    out.mine.clear();
    out.send(ctx.sh, None);
}

/// The keys request `args` of table entry `i` names.
fn command_keys(i: usize, args: &[Vec<u8>]) -> Vec<Vec<u8>> {
    let spec = &TABLE[i];
    let cmd = crate::acl::cmd(crate::acl::resolve(i, args).unwrap_or(i));
    let idx: Vec<usize> = if cmd.flags.contains(Flags::MOVABLEKEYS) {
        crate::cmd::movable_keys(spec.name, args)
    } else {
        cmd.keys.indexes(args.len()).collect()
    };
    idx.into_iter().map(|k| args[k].clone()).collect()
}

fn is_script(name: &str) -> bool {
    matches!(
        name,
        "eval" | "evalsha" | "eval_ro" | "evalsha_ro" | "fcall" | "fcall_ro"
    )
}

/// Before a command runs (top level: `cmd::execute`; inside EXEC or a
/// script: `unit::call`), for a client with tracking on and not in BCAST
/// mode: a script command keeps its declared keys (remembered when the
/// script runs a read-only command, as Redis 7.0 does), a read-only
/// command's keys (a script's inside one) are remembered, unless
/// OPTIN/OPTOUT and CLIENT CACHING say otherwise. Nothing for other clients
/// (one load of the client's own flags).
pub(crate) fn before(ctx: &mut Ctx, c: &Client, i: usize, args: &[Vec<u8>], top: bool) {
    if top {
        ctx.ks.track.cur = c.id;
    }
    let f = c.meta.track.flags();
    if f & ON == 0 || f & BCAST != 0 {
        return;
    }
    let spec = &TABLE[i];
    if is_script(spec.name) {
        ctx.ks.track.script_keys = Some(command_keys(i, args));
        return;
    }
    let cmd = crate::acl::cmd(crate::acl::resolve(i, args).unwrap_or(i));
    if !cmd.flags.contains(Flags::READONLY) {
        return;
    }
    if (f & OPTIN != 0 && f & CACHING == 0) || (f & OPTOUT != 0 && f & CACHING != 0) {
        return;
    }
    let keys = if crate::lua::in_script() {
        ctx.ks.track.script_keys.clone().unwrap_or_default()
    } else {
        command_keys(i, args)
    };
    if keys.is_empty() {
        return;
    }
    let reg = ctx.ks.track.reg.clone();
    let fresh = remember(ctx.sh, &reg, c, &keys, false);
    // Only a plain read at the top level may drop the invalidation of its
    // own expired key (see `flush_with`).
    if top {
        ctx.ks.track.fresh = fresh;
    }
    ctx.ks.track.remembered.extend(keys);
}

/// Puts `keys` in the table for client `c`; returns those that were not
/// there for it. With `limit` (once per command, after it), past
/// `tracking-table-max-keys` keys, keys are dropped from the table and
/// their clients invalidated, as Redis's `trackingLimitUsedSlots` does
/// before the next command.
fn remember(
    sh: &Shared,
    reg: &Tracking,
    c: &Client,
    keys: &[Vec<u8>],
    limit: bool,
) -> Vec<Vec<u8>> {
    let max = match limit.then(|| sh.cfg().tracking_table_max_keys) {
        None | Some(0) => usize::MAX,
        Some(n) => usize::try_from(n).unwrap_or(usize::MAX),
    };
    let mut fresh = Vec::new();
    let mut evicted: Vec<(Arc<ClientMeta>, Vec<u8>)> = Vec::new();
    {
        let mut guard = reg.lock();
        let inner = &mut *guard;
        for k in keys {
            let ids = inner.table.entry(k.clone()).or_default();
            if !ids.contains(&c.id) {
                ids.push(c.id);
                inner.items += 1;
                fresh.push(k.clone());
            }
        }
        while inner.table.len() > max {
            let Some(k) = inner.table.keys().next().cloned() else {
                break;
            };
            let ids = inner.table.remove(&k).unwrap_or_default();
            inner.items -= ids.len();
            for id in ids {
                if let Some(m) = inner.clients.get(&id) {
                    if m.track.flags() & (ON | BCAST) == ON {
                        evicted.push((m.clone(), k.clone()));
                    }
                }
            }
        }
    }
    if !evicted.is_empty() {
        let mut out = Out::default();
        for (m, k) in &evicted {
            route(
                sh,
                m,
                &Payload::Keys(&key_array(&[k.as_slice()])),
                0,
                &mut out,
            );
        }
        out.send(sh, None);
    }
    fresh
}

/// After a command inside a unit (`unit::call`): its remembered keys go in
/// again (see the module's text).
pub(crate) fn after_call(ctx: &mut Ctx, c: &Client) {
    if ctx.ks.track.remembered.is_empty() {
        return;
    }
    let keys = std::mem::take(&mut ctx.ks.track.remembered);
    let reg = ctx.ks.track.reg.clone();
    remember(ctx.sh, &reg, c, &keys, true);
}

/// After a top-level command (`cmd::execute`, after its reply): the
/// invalidations its writes call for (its own after its reply), its
/// remembered keys again, and CLIENT CACHING's flag cleared unless the
/// command was a CLIENT subcommand or the client is in MULTI (Redis's
/// `resetClient`).
pub(crate) fn after(ctx: &mut Ctx, c: &mut Client, i: usize) {
    if !ctx.ks.track.modified.is_empty() {
        flush_with(ctx.sh, ctx.ks, Some(c), false);
    }
    let l = &mut ctx.ks.track;
    l.fresh.clear();
    l.script_keys = None;
    l.cur = 0;
    if !l.pending_mine.is_empty() {
        c.out.extend_from_slice(&l.pending_mine);
        l.pending_mine.clear();
    }
    if !l.remembered.is_empty() {
        let keys = std::mem::take(&mut l.remembered);
        let reg = l.reg.clone();
        remember(ctx.sh, &reg, c, &keys, true);
    }
    let f = c.meta.track.flags();
    if f & CACHING != 0 && c.multi.is_none() && TABLE[i].name != "client" {
        c.meta.track.flags.fetch_and(!CACHING, Ordering::Relaxed);
    }
}

/// A request refused before it ran: CLIENT CACHING's flag goes as after a
/// command (Redis's `resetClient` runs for refused requests too).
pub(crate) fn refused(c: &Client, args: &[Vec<u8>]) {
    let t = &c.meta.track;
    if t.flags() & CACHING != 0
        && c.multi.is_none()
        && !args
            .first()
            .is_some_and(|a| a.eq_ignore_ascii_case(b"client"))
    {
        t.flags.fetch_and(!CACHING, Ordering::Relaxed);
    }
}

/// Turns tracking off (CLIENT TRACKING OFF, RESET, a closed connection):
/// its prefixes go; its ids stay in the table until their keys change.
pub(crate) fn disable(reg: &Tracking, m: &ClientMeta) {
    let t = &m.track;
    if t.flags() & ON == 0 {
        return;
    }
    let mut inner = reg.lock();
    for p in std::mem::take(&mut *t.prefixes()) {
        if let Some(ids) = inner.prefixes.get_mut(&p) {
            ids.retain(|&x| x != m.id);
            if ids.is_empty() {
                inner.prefixes.remove(&p);
            }
        }
    }
    inner.clients.remove(&m.id);
    t.flags.store(0, Ordering::Relaxed);
    reg.active.store(inner.clients.len(), Ordering::SeqCst);
}

/// Whether two prefixes would both match some key (one starts the other).
fn overlap(a: &[u8], b: &[u8]) -> bool {
    let n = a.len().min(b.len());
    a[..n] == b[..n]
}

/// CLIENT TRACKING ON|OFF [REDIRECT id] [BCAST] [PREFIX p]... [OPTIN]
/// [OPTOUT] [NOLOOP], with Redis 7.0's checks in its order.
pub(crate) fn client_tracking(
    ctx: &mut Ctx,
    c: &mut Client,
    a: &[Vec<u8>],
) -> Result<(), CmdError> {
    use crate::cmd::eq;
    let mut redir = 0i64;
    let mut opts = 0u32;
    let mut prefixes: Vec<Vec<u8>> = Vec::new();
    let mut j = 3;
    while j < a.len() {
        let more = j + 1 < a.len();
        if eq(&a[j], "redirect") && more {
            j += 1;
            if redir != 0 {
                return Err(CmdError::TrackingRedirectTwice);
            }
            redir = crate::cmd::int_arg(&a[j])?;
            let exists = u64::try_from(redir).is_ok_and(|id| {
                ctx.sh
                    .clients
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .contains_key(&id)
            });
            if !exists {
                return Err(CmdError::TrackingNoRedirectClient);
            }
        } else if eq(&a[j], "bcast") {
            opts |= BCAST;
        } else if eq(&a[j], "optin") {
            opts |= OPTIN;
        } else if eq(&a[j], "optout") {
            opts |= OPTOUT;
        } else if eq(&a[j], "noloop") {
            opts |= NOLOOP;
        } else if eq(&a[j], "prefix") && more {
            j += 1;
            prefixes.push(a[j].clone());
        } else {
            return Err(CmdError::Syntax);
        }
        j += 1;
    }
    let reg = ctx.ks.track.reg.clone();
    let t = &c.meta.track;
    if eq(&a[2], "off") {
        disable(&reg, &c.meta);
        c.ok();
        return Ok(());
    }
    if !eq(&a[2], "on") {
        return Err(CmdError::Syntax);
    }
    let f = t.flags();
    if opts & BCAST == 0 && !prefixes.is_empty() {
        return Err(CmdError::TrackingPrefixNeedsBcast);
    }
    if f & ON != 0 && (f & BCAST) != (opts & BCAST) {
        return Err(CmdError::TrackingBcastSwitch);
    }
    if opts & BCAST != 0 && opts & (OPTIN | OPTOUT) != 0 {
        return Err(CmdError::TrackingOptWithBcast);
    }
    if opts & OPTIN != 0 && opts & OPTOUT != 0 {
        return Err(CmdError::TrackingOptinAndOptout);
    }
    if (opts & OPTIN != 0 && f & OPTOUT != 0) || (opts & OPTOUT != 0 && f & OPTIN != 0) {
        return Err(CmdError::TrackingOptSwitch);
    }
    if opts & BCAST != 0 {
        let mine = t.prefixes();
        for (i, p) in prefixes.iter().enumerate() {
            if let Some(old) = mine.iter().find(|o| overlap(o, p)) {
                return Err(CmdError::TrackingPrefixOverlap {
                    prefix: p.clone(),
                    other: old.clone(),
                    existing: true,
                });
            }
            if let Some(q) = prefixes[i + 1..].iter().find(|q| overlap(p, q)) {
                return Err(CmdError::TrackingPrefixOverlap {
                    prefix: p.clone(),
                    other: q.clone(),
                    existing: false,
                });
            }
        }
    }
    if c.meta.track.home.get().is_none() {
        return Err(CmdError::NotSupported {
            what: "CLIENT TRACKING".into(),
            why: " in the in-process executor (it has no connection to deliver invalidations to)",
        });
    }
    let mut inner = reg.lock();
    let keep = t.flags() & CACHING;
    t.redir.store(redir as u64, Ordering::Relaxed);
    t.flags.store(
        ON | keep | (opts & (BCAST | OPTIN | OPTOUT | NOLOOP)),
        Ordering::Relaxed,
    );
    if opts & BCAST != 0 {
        if prefixes.is_empty() {
            prefixes.push(Vec::new());
        }
        let mut mine = t.prefixes();
        for p in prefixes {
            if mine.insert(p.clone()) {
                inner.prefixes.entry(p).or_default().push(c.id);
            }
        }
    }
    inner.clients.insert(c.id, c.meta.clone());
    reg.active.store(inner.clients.len(), Ordering::SeqCst);
    drop(inner);
    c.ok();
    Ok(())
}

/// CLIENT CACHING YES|NO.
pub(crate) fn client_caching(c: &mut Client, a: &[Vec<u8>]) -> Result<(), CmdError> {
    use crate::cmd::eq;
    let t = &c.meta.track;
    let f = t.flags();
    if f & ON == 0 {
        return Err(CmdError::TrackingCachingOff);
    }
    if eq(&a[2], "yes") {
        if f & OPTIN == 0 {
            return Err(CmdError::TrackingCachingYes);
        }
    } else if eq(&a[2], "no") {
        if f & OPTOUT == 0 {
            return Err(CmdError::TrackingCachingNo);
        }
    } else {
        return Err(CmdError::Syntax);
    }
    t.flags.fetch_or(CACHING, Ordering::Relaxed);
    c.ok();
    Ok(())
}

/// CLIENT TRACKINGINFO: flags, redirect, prefixes.
pub(crate) fn client_trackinginfo(c: &mut Client) {
    let t = &c.meta.track;
    let f = t.flags();
    let mut flags = vec![if f & ON != 0 { "on" } else { "off" }];
    for (bit, name) in [(BCAST, "bcast"), (OPTIN, "optin")] {
        if f & bit != 0 {
            flags.push(name);
        }
    }
    if f & OPTIN != 0 && f & CACHING != 0 {
        flags.push("caching-yes");
    }
    if f & OPTOUT != 0 {
        flags.push("optout");
        if f & CACHING != 0 {
            flags.push("caching-no");
        }
    }
    if f & NOLOOP != 0 {
        flags.push("noloop");
    }
    if f & BROKEN != 0 {
        flags.push("broken_redirect");
    }
    let b = |s: &str| Reply::Bulk(s.as_bytes().to_vec());
    let prefixes: Vec<Reply> = t
        .prefixes()
        .iter()
        .map(|p| Reply::Bulk(p.clone()))
        .collect();
    c.reply(&Reply::Map(vec![
        (b("flags"), Reply::Set(flags.into_iter().map(b).collect())),
        (b("redirect"), Reply::Integer(t.redir_field())),
        (b("prefixes"), Reply::Array(prefixes)),
    ]));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_overlap_when_one_starts_the_other() {
        assert!(overlap(b"a", b"ab"));
        assert!(overlap(b"ab", b"a"));
        assert!(overlap(b"", b"x"));
        assert!(overlap(b"ab", b"ab"));
        assert!(!overlap(b"ab", b"ac"));
    }

    #[test]
    fn key_arrays_are_resp_arrays() {
        assert_eq!(key_array(&[b"k", b"lm"]), b"*2\r\n$1\r\nk\r\n$2\r\nlm\r\n");
    }

    #[test]
    fn only_database_keys_are_logged_and_only_while_someone_tracks() {
        let mut l = Local::default();
        l.applied([&b"\0k"[..]].into_iter());
        assert!(l.modified.is_empty());
        l.reg.active.store(1, Ordering::SeqCst);
        l.applied([&b"\0k"[..], &b""[..], &[PIECE, 1, 2][..]].into_iter());
        assert_eq!(l.modified, [b"\0k".to_vec()]);
        l.quiet = true;
        l.applied([&b"\0j"[..]].into_iter());
        assert_eq!(l.modified.len(), 1);
    }

    const PIECE: u8 = crate::keyspace::PIECE_PREFIX;
}
