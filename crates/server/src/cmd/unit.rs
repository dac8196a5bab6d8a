//! Units: several commands run as one (a transaction's EXEC, a Lua script).
//!
//! A unit runs with the stripe locks of every key it declared held from its
//! first command to its end, so no other client sees or changes those keys
//! in between (Redis runs a transaction or a script without interleaving
//! anything). Its commands stage their writes as one command does
//! ([`crate::keyspace`]), reads see what earlier commands of the unit
//! staged, and [`run`] applies them all as **one batch** when the unit ends:
//! after a crash either every write of the unit is in the store or none is,
//! with the `bullet` and `direct` engines (their batches are crash-atomic).
//!
//! A command that touches a database key the unit did not declare (SORT's
//! BY keys, a script reading a key it did not pass in KEYS, a key in
//! another database) marks the unit escaped instead of touching it
//! unlocked: the runner drops what the unit staged and the replies it
//! produced and runs it again with every stripe locked, so the result is as
//! if it had locked everything from the start.
//!
//! Commands that need the store's applied view of every key (FLUSHDB,
//! FLUSHALL, KEYS, SCAN, RANDOMKEY, DBSIZE: [`needs_all`]) run only in a
//! unit that holds every lock; before each, the unit's writes so far are
//! applied, and the command applies its own as outside a unit. Such a unit
//! is isolated as any other, but durable as the segments between those
//! commands.

use super::{arity_error, lookup, run_spec, Ctx, R, TABLE};
use crate::client::Client;
use crate::keyspace::KsError;
use std::collections::HashSet;

/// The locks a unit runs under.
pub enum Locks {
    /// The stripes of these store keys (database byte ‖ key).
    Keys(Vec<Vec<u8>>),
    /// Every stripe (and the flush lock).
    All,
}

/// Whether a command must run in a unit that holds every lock: it reads or
/// writes keys it does not name, through the store's applied view (see the
/// module's text).
pub fn needs_all(name: &str) -> bool {
    matches!(
        name,
        "flushdb" | "flushall" | "keys" | "scan" | "randomkey" | "dbsize" | "swapdb"
    )
}

/// Runs `body` as one unit under `locks` (see the module's text; inside a
/// running unit, `body` simply runs as part of it): the
/// commands it runs with [`call`] take no locks and stage their writes,
/// which are applied as one batch when it returns; clients blocked on keys
/// it wrote are woken after. When a command escaped the declared keys,
/// `body` runs again under [`Locks::All`] after its staged writes and its
/// replies (everything appended to `c.out` since the unit began) and its
/// keyspace events are dropped and the client's database is set back. A failure to apply the
/// batch (a full heap) is the unit's error and applies nothing.
pub fn run(
    ctx: &mut Ctx,
    c: &mut Client,
    locks: Locks,
    mut body: impl FnMut(&mut Ctx, &mut Client) -> R,
) -> R {
    if ctx.ks.in_unit() {
        // Inside another unit (a script in a transaction, DUMP in a
        // script): its runner holds the locks and applies the writes; a key
        // outside them escapes it as any command's would.
        return body(ctx, c);
    }
    let sh = ctx.sh;
    let mark = c.out.len();
    let db = c.db;
    // Keyspace events the unit's commands leave for the end of the command
    // (`notify`): a run that escapes drops its own.
    let (events, expired) = (ctx.ks.events.len(), ctx.ks.expired_log.len());
    // So are its counts of keys found expired (INFO `expired_keys`).
    let expired_count = ctx.ks.expired;
    let mut locks = locks;
    loop {
        let all = matches!(locks, Locks::All);
        // FLUSHING before the stripes: a FLUSHDB elsewhere takes them in
        // that order.
        let flushing = all.then(|| {
            super::keys::FLUSHING
                .lock()
                .unwrap_or_else(|p| p.into_inner())
        });
        let (guard, keys) = match &mut locks {
            Locks::All => (sh.stripes.lock_all(), HashSet::new()),
            Locks::Keys(k) => {
                // Moved into the unit's set: a run that escapes goes on
                // under `Locks::All`.
                let keys: HashSet<Vec<u8>> = std::mem::take(k).into_iter().collect();
                let refs: Vec<&[u8]> = keys.iter().map(|k| k.as_slice()).collect();
                (sh.stripes.lock_set(&refs), keys)
            }
        };
        ctx.ks.begin_unit(all, keys);
        let r = body(ctx, c);
        let unit = ctx.ks.end_unit();
        if unit.is_some_and(|u| u.escaped) && !all {
            ctx.ks.discard_staged();
            ctx.ks.events.truncate(events);
            ctx.ks.expired_log.truncate(expired);
            ctx.ks.expired = expired_count;
            c.out.truncate(mark);
            if c.db != db {
                c.db = db;
                c.meta.db.store(db, std::sync::atomic::Ordering::Relaxed);
            }
            drop(guard);
            drop(flushing);
            locks = Locks::All;
            continue;
        }
        let woken = if sh.blocking.any() {
            ctx.ks.staged_keys()
        } else {
            Vec::new()
        };
        let applied = ctx.ks.apply();
        drop(guard);
        drop(flushing);
        if !woken.is_empty() {
            let refs: Vec<&[u8]> = woken.iter().map(|k| k.as_slice()).collect();
            sh.blocking.signal(&refs);
        }
        return match applied {
            Ok(()) => r,
            Err(e) => {
                c.out.truncate(mark);
                Err(e.into())
            }
        };
    }
}

/// Whether the running unit escaped its declared keys (the caller, a
/// script, may stop early: its run is dropped and repeated).
pub fn escaped(ctx: &Ctx) -> bool {
    ctx.ks.unit().is_some_and(|u| u.escaped)
}

/// Runs one request inside the running unit as `execute` runs one outside
/// (its name, arity and ACL checked, counted in the command statistics);
/// its reply, or its error, is appended to `c.out`.
pub fn call(ctx: &mut Ctx, c: &mut Client, args: &[Vec<u8>]) {
    if args.is_empty() {
        c.err(&super::CmdError::Msg("a request needs at least a command name").text());
        return;
    }
    let Some(i) = args.first().and_then(|a| lookup(a)) else {
        c.err(&super::CmdError::UnknownCommand(args.to_vec()).text());
        return;
    };
    call_at(ctx, c, i, args);
}

/// [`call`] for a request whose command the caller already looked up:
/// `TABLE[i]` is `args[0]`'s (a script's `redis.call` looks it up for its
/// own checks first).
pub fn call_at(ctx: &mut Ctx, c: &mut Client, i: usize, args: &[Vec<u8>]) {
    let t0 = crate::clock::Stamp::now();
    let spec = &TABLE[i];
    if !spec.arity_ok(args.len()) {
        ctx.ws.cmds[i].rejected.add(1);
        c.err(&arity_error(spec.name).text());
        return;
    }
    if !c.user.unrestricted() {
        if let Err(e) = super::acl_check(ctx.sh, c, i, args) {
            ctx.ws.cmds[i].rejected.add(1);
            c.err(&e.text());
            return;
        }
    }
    if crate::evict::script_refuses(ctx, spec) {
        ctx.ws.cmds[i].rejected.add(1);
        c.err(&super::CmdError::OomMaxmemory.text());
        return;
    }
    let global = needs_all(spec.name);
    if global {
        if !ctx.ks.unit().is_some_and(|u| u.all) {
            // Run again holding every lock (see `run`).
            ctx.ks.escape();
            c.err(&super::CmdError::from(KsError::Undeclared).text());
            return;
        }
        // The unit's writes so far, then the command's own, applied as
        // outside a unit.
        ctx.ks.set_hold(false);
        if let Err(e) = ctx.ks.apply() {
            ctx.ks.set_hold(true);
            c.err(&super::CmdError::from(e).text());
            return;
        }
    }
    crate::tracking::before(ctx, c, i, args, false);
    let failed = run_spec(ctx, c, spec, args);
    crate::tracking::after_call(ctx, c);
    if global {
        ctx.ks.set_hold(true);
    }
    let us = crate::clock::Stamp::now().micros_since(t0);
    ctx.ws.record(i, us, failed);
    // The commands of a transaction are logged one by one, as in Redis.
    super::slowlog(ctx.sh, c, spec, args, us);
    // A script's commands show as the script's (`lua`); a transaction's as
    // its client's.
    let script = crate::lua::in_script();
    crate::monitor::feed(ctx.sh, c, spec, args, script);
}

/// Runs a request that a command builds for itself inside its unit (RESTORE
/// filling a key, DUMP reading one) and returns its reply, which is not
/// written to the client: no ACL check (the command itself was checked),
/// no statistics (the client did not send it) and no keyspace events but
/// `keymiss`.
pub fn internal(
    ctx: &mut Ctx,
    c: &mut Client,
    args: &[&[u8]],
) -> Result<proto::Reply, super::CmdError> {
    let args: Vec<Vec<u8>> = args.iter().map(|a| a.to_vec()).collect();
    if args.is_empty() {
        return Err(super::CmdError::Msg(
            "a request needs at least a command name",
        ));
    }
    let Some(i) = args.first().and_then(|a| lookup(a)) else {
        return Err(super::CmdError::UnknownCommand(args));
    };
    let spec = &TABLE[i];
    if !spec.arity_ok(args.len()) {
        return Err(arity_error(spec.name));
    }
    let mark = c.out.len();
    let resp = c.resp;
    // Its keyspace events are not the command's (RESTORE publishes
    // `restore`, not the `rpush` that built the list).
    let events = ctx.ks.events.len();
    c.resp = proto::Version::Resp2;
    run_spec(ctx, c, spec, &args);
    c.resp = resp;
    // But its `keymiss` is (DUMP of a missing key misses it once, as
    // Redis's lookup does).
    let tail = ctx.ks.events.split_off(events);
    ctx.ks
        .events
        .extend(tail.into_iter().filter(|e| e.0 == crate::notify::KEY_MISS));
    let r = proto::reply::parse_reply(&c.out[mark..]);
    c.out.truncate(mark);
    match r {
        Ok(Some((proto::Reply::Error(e), _))) => Err(super::CmdError::Text(e)),
        Ok(Some((r, _))) => Ok(r),
        _ => Err(super::CmdError::Msg("an internal request gave no reply")),
    }
}
