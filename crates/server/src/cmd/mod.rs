//! The command table and dispatch. Every reply and error text follows the Redis
//! command reference (and Redis 7's source where the reference is silent).

mod acl;
pub(crate) mod admin;
mod bits;
pub(crate) mod conn;
mod digest;
pub(crate) mod dump;
mod error;
mod geo;
mod hashes;
mod hll;
mod keys;
mod lcs;
mod lists;
mod maps;
pub(crate) mod multi;
mod pubsub;
pub(crate) mod scripting;
mod sets;
mod sort;
mod streams;
mod strings;
mod table;
pub mod unit;
mod zsets;

pub use table::{
    arity_ok, lookup, movable_keys, Cats, Flags, KeyPos, Spec, SubSpec, KEY_ACCESS, SUBCOMMANDS,
    TABLE,
};

pub(crate) use bits::bitfield_reads_only;
pub use conn::REDIS_COMPAT_VERSION;
pub(crate) use error::store_text;
pub use error::CmdError;
pub(crate) use keys::flush_dbs;
pub use keys::{finish_flushes, finish_swap};
pub(crate) use strings::float_arg;

use crate::clock::Stamp;
use crate::keyspace::Keyspace;
use crate::server::{Client, Shared};
use crate::stats::WorkerStats;
use std::sync::atomic::Ordering;

/// What a handler sees.
pub struct Ctx<'a> {
    pub sh: &'a Shared,
    pub ks: &'a mut Keyspace,
    pub ws: &'a WorkerStats,
    /// The command's time (Unix ms): expiry is judged against it.
    pub now: i64,
}

/// A handler's result: its reply is written to the client; a failure is
/// replied as the error's text.
pub type R = Result<(), CmdError>;

pub type Handler = fn(&mut Ctx, &mut Client, &[Vec<u8>]) -> R;

/// A container command's HELP reply: one simple string per line.
pub fn help(c: &mut Client, lines: &[&str]) {
    c.reply(&proto::Reply::Array(
        lines
            .iter()
            .map(|l| proto::Reply::Simple(l.to_string()))
            .collect(),
    ));
}

/// Runs `f`, the read-modify-write of a write command, with the stripe locks
/// of `keys` (store keys) held; then applies the writes it staged (also when
/// it failed: a read stages the removal of a key it found expired) and
/// releases the locks. Applying before the locks go is what makes commands on
/// one key linearizable; the staged batch is the command's operations (see
/// [`crate::keyspace`]). When clients are blocked, keys it wrote may wake
/// them (see [`crate::blocking`]).
pub fn locked<T>(
    ctx: &mut Ctx,
    keys: &[&[u8]],
    f: impl FnOnce(&mut Ctx) -> Result<T, CmdError>,
) -> Result<T, CmdError> {
    if ctx.ks.in_unit() {
        // The unit's runner holds the locks of the keys it declared.
        for k in keys {
            if !ctx.ks.may_touch(k) {
                return Err(crate::keyspace::KsError::Undeclared.into());
            }
        }
        let r = f(ctx);
        // Applies nothing while the unit holds its writes.
        ctx.ks.apply()?;
        return r;
    }
    let sh = ctx.sh;
    let g = sh.stripes.lock_set(keys);
    let r = f(ctx);
    let wrote = ctx.ks.has_staged();
    ctx.ks.apply()?;
    drop(g);
    if wrote && sh.blocking.any() {
        sh.blocking.signal(keys);
    }
    r
}

/// The collection of type `kind` at `sk` (stripe lock held), its head
/// decoded by `decode`, with its expiry: None when absent, WRONGTYPE for
/// another type. A key found expired is staged for removal on the way.
pub(crate) fn load_head<H>(
    ctx: &mut Ctx,
    sk: &[u8],
    kind: u8,
    decode: fn(&[u8]) -> engine::Result<H>,
) -> Result<Option<(Option<i64>, H)>, CmdError> {
    let Some(h) = ctx.ks.lookup_locked(sk, ctx.now)? else {
        return Ok(None);
    };
    if h.kind != kind {
        return Err(CmdError::WrongType);
    }
    Ok(Some((h.expire, decode(&ctx.ks.raw[h.off..])?)))
}

/// Stages a collection's new head (`encode` writes it); an emptied
/// collection is deleted instead (Redis keeps no empty collection).
pub(crate) fn save_head(
    ctx: &mut Ctx,
    sk: &[u8],
    kind: u8,
    expire: Option<i64>,
    empty: bool,
    encode: impl FnOnce(&mut Vec<u8>),
) {
    if empty {
        ctx.ks.remove_known(sk, expire.is_some());
    } else {
        let mut payload = Vec::new();
        encode(&mut payload);
        ctx.ks.put(sk, kind, expire, &payload);
    }
}

/// The arity error of a command or subcommand (`name` as Redis prints it).
pub fn arity_error(name: impl Into<std::borrow::Cow<'static, str>>) -> CmdError {
    CmdError::Arity(name.into())
}

/// The error of an unknown subcommand of container command `cmd`.
pub fn unknown_subcommand(cmd: &'static str, sub: &[u8]) -> CmdError {
    CmdError::UnknownSubcommand {
        cmd,
        sub: sub.to_vec(),
    }
}

/// Runs one request and appends its reply to the client's output. `clock`
/// is when the previous command ended (or the batch began): the command's
/// time is measured from it, and it is moved to this command's end. In a
/// transaction (after MULTI) a request is checked and queued instead (see
/// [`multi`]); a refused one makes its EXEC fail.
pub fn execute(ctx: &mut Ctx, c: &mut Client, args: &[Vec<u8>], clock: &mut Stamp) {
    let t0 = *clock;
    let Some((i, queue)) = precheck(ctx.sh, ctx.ws, c, args, t0) else {
        crate::tracking::refused(c, args);
        return;
    };
    let spec = &TABLE[i];
    // Cache mode: evict before a command that may grow the heap; -OOM
    // when nothing more can go (see `crate::evict`).
    if let Err(e) = crate::evict::before_command(ctx, c, spec, args) {
        ctx.ws.cmds[i].rejected.add(1);
        multi::reject(c, &e);
        crate::tracking::refused(c, args);
        return;
    }
    let mark = c.out.len();
    if queue {
        multi::queue(ctx, c, args);
        crate::pubsub::after_command(ctx.sh, ctx.ks, c, mark);
        return;
    }
    crate::monitor::feed_script_call(ctx.sh, c, spec, args);
    crate::tracking::before(ctx, c, i, args, true);
    // A cluster's follower sends writes (and reads, unless READONLY) to
    // the leader (see `crate::cluster`).
    let failed = match crate::cluster::forwarded(ctx.sh, c, spec) {
        Some(cl) => crate::cluster::forward(cl, ctx.sh, c, spec, args),
        // At the leader, a read first confirms its leadership (ReadIndex).
        None => match crate::cluster::read_barrier(ctx.sh, c, spec) {
            Ok(()) => {
                let f = run_spec(ctx, c, spec, args);
                // WAIT counts the followers that have this write.
                if ctx.ks.repl_index != 0 {
                    c.repl_index = std::mem::take(&mut ctx.ks.repl_index);
                }
                f
            }
            Err(text) => {
                c.err(&text);
                true
            }
        },
    };
    crate::pubsub::after_command(ctx.sh, ctx.ks, c, mark);
    crate::tracking::after(ctx, c, i);
    let t1 = Stamp::now();
    *clock = t1;
    let us = t1.micros_since(t0);
    ctx.ws.record(i, us, failed);
    slowlog(ctx.sh, c, spec, args, us);
    crate::monitor::feed(ctx.sh, c, spec, args, false);
}

/// Logs a command in SLOWLOG and samples it for the latency monitor when it
/// qualifies (a load each otherwise).
#[inline]
pub(crate) fn slowlog(sh: &Shared, c: &Client, spec: &Spec, args: &[Vec<u8>], us: u64) {
    sh.latency.command(spec.flags.contains(Flags::FAST), us);
    if sh.slowlog.qualifies(us) && !spec.flags.contains(Flags::SKIP_SLOWLOG) {
        let name = c
            .meta
            .name
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        sh.slowlog.push(args, us, &c.meta.addr, &name);
    }
}

/// The checks a request passes before it runs, in Redis's order: the
/// connection's user is current, the command exists and its arity is right,
/// `protected` commands, authentication, `no_multi` in a transaction, the
/// ACL, a busy script (`-BUSY` for commands without `allow_busy`) and
/// subscriber mode. A refused request's error is replied (in MULTI it also
/// fails the EXEC) and None returned; otherwise the command's table index
/// and whether it is to be queued (MULTI) rather than run. `t0` is the
/// command's start (CLIENT LIST's `cmd` and age).
pub(crate) fn precheck(
    sh: &Shared,
    ws: &WorkerStats,
    c: &mut Client,
    args: &[Vec<u8>],
    t0: Stamp,
) -> Option<(usize, bool)> {
    let acl = &sh.acl;
    // A user changed since this connection last read it (ACL SETUSER,
    // DELUSER, LOAD, CONFIG SET requirepass): re-read it, as Redis's
    // connections see their user's changes at once. A deleted or reloaded
    // user's connections are closed without running anything more.
    if c.acl_epoch != acl.epoch() && !acl.refresh(&mut c.user, &mut c.acl_epoch) {
        c.kill = true;
        return None;
    }
    let Some(i) = lookup(&args[0]) else {
        multi::reject(c, &CmdError::UnknownCommand(args.to_vec()));
        return None;
    };
    let spec = &TABLE[i];
    if !spec.arity_ok(args.len()) {
        ws.cmds[i].rejected.add(1);
        multi::reject(c, &arity_error(spec.name));
        return None;
    }
    // Redis's protected commands: refused before authentication.
    if spec.flags.contains(Flags::PROTECTED)
        && !sh.cfg().enable_debug_command.allows(c.meta.is_local())
    {
        ws.cmds[i].rejected.add(1);
        multi::reject(c, &CmdError::DebugNotAllowed);
        return None;
    }
    if acl.auth_required(c.authed) && !spec.flags.contains(Flags::NO_AUTH) {
        ws.cmds[i].rejected.add(1);
        multi::reject(c, &CmdError::NoAuth);
        return None;
    }
    let queue = c.multi.is_some() && !multi::runs_in_multi(spec);
    if queue && spec.flags.contains(Flags::NO_MULTI) {
        ws.cmds[i].rejected.add(1);
        multi::reject(
            c,
            &CmdError::Msg("Command not allowed inside a transaction"),
        );
        return None;
    }
    // CLIENT LIST names a container's subcommand (`client|list`), as Redis.
    let id = crate::acl::resolve(i, args).unwrap_or(i);
    c.meta.last_cmd.store(id as u64 + 1, Ordering::Relaxed);
    c.meta
        .last_ms
        .store(t0.millis_since(c.meta.created), Ordering::Relaxed);
    // ACL: a user with allcommands and allkeys (the default user) costs this
    // flag test; only a restricted user's rules and key patterns are walked.
    if !c.user.unrestricted() {
        if let Err(e) = acl_check(sh, c, i, args) {
            ws.cmds[i].rejected.add(1);
            multi::reject(c, &e);
            return None;
        }
    }
    // A script running past busy-reply-threshold: only the commands
    // allowed then run (SCRIPT KILL, FUNCTION KILL, FUNCTION STATS...).
    if let Some(e) = crate::lua::busy_error(sh, spec, args) {
        ws.cmds[i].rejected.add(1);
        multi::reject(c, &CmdError::Script(e.into()));
        return None;
    }
    // A RESP2 client with subscriptions runs only the Pub/Sub commands,
    // PING, QUIT and RESET (Redis's subscriber mode).
    if c.subs.is_some()
        && c.resp == proto::Version::Resp2
        && !crate::pubsub::allowed_in_subscriber_mode(spec.name)
    {
        ws.cmds[i].rejected.add(1);
        multi::reject(
            c,
            &CmdError::SubscriberMode(crate::acl::cmd_name(id).to_string()),
        );
        return None;
    }
    Some((i, queue))
}

/// Runs a checked request's handler and replaces a failed command's reply
/// with its error; true when it failed.
fn run_spec(ctx: &mut Ctx, c: &mut Client, spec: &Spec, args: &[Vec<u8>]) -> bool {
    let mark = c.out.len();
    // Read-only commands' misses are `keymiss` events (OBJECT's are not:
    // Redis looks up with LOOKUP_NONOTIFY there).
    let reading = std::mem::replace(
        &mut ctx.ks.reading,
        spec.flags.contains(Flags::READONLY) && spec.name != "object",
    );
    let misses = ctx.sh.pubsub.notify_flags().load(Ordering::Relaxed) & crate::notify::KEY_MISS;
    let read_keys = if misses != 0 && spec.flags.contains(Flags::WRITE) {
        let i = lookup(spec.name.as_bytes()).unwrap_or(0);
        let keys = crate::acl::read_keys(i, args)
            .into_iter()
            .map(|k| crate::keyspace::skey(c.db, &args[k]))
            .collect();
        std::mem::replace(&mut ctx.ks.read_keys, keys)
    } else {
        std::mem::take(&mut ctx.ks.read_keys)
    };
    let r = (spec.run)(ctx, c, args);
    ctx.ks.reading = reading;
    ctx.ks.read_keys = read_keys;
    // Every write was applied under its command's locks (see `locked`), or
    // is held by the unit the command runs in. A handler that left writes
    // staged is a bug the tests catch; a release build still applies them
    // here rather than let the next command's reads see them.
    debug_assert!(
        ctx.ks.in_unit() || !ctx.ks.has_staged(),
        "{} left writes staged",
        spec.name
    );
    let r = match ctx.ks.apply() {
        Ok(()) => r,
        Err(e) => Err(e.into()),
    };
    let failed = r.is_err();
    if let Err(e) = r {
        // A failed command's reply is its error alone.
        c.out.truncate(mark);
        c.err(&e.text());
    }
    failed
}

/// A restricted user's check of request `args` (table entry `i`): the
/// subcommand's arity (Redis checks it before the ACL), then the command and
/// its keys. A denial is recorded in ACL LOG.
fn acl_check(sh: &Shared, c: &Client, i: usize, args: &[Vec<u8>]) -> Result<(), CmdError> {
    let Some(id) = crate::acl::resolve(i, args) else {
        return Ok(());
    };
    let cmd = crate::acl::cmd(id);
    if !cmd.arity_ok(args.len()) {
        return Err(arity_error(cmd.name.clone()));
    }
    match c.user.check_id(id, args) {
        Ok(()) => Ok(()),
        Err(crate::acl::Denied::Command(id)) => {
            let name = crate::acl::cmd(id).name.clone();
            sh.acl
                .log("command", name.as_bytes(), &c.user.name, c.meta.line());
            Err(CmdError::NoPermCommand(name))
        }
        Err(crate::acl::Denied::Key(k)) => {
            sh.acl.log("key", &args[k], &c.user.name, c.meta.line());
            Err(CmdError::NoPermKey)
        }
        Err(crate::acl::Denied::Channel(k)) => {
            sh.acl.log("channel", &args[k], &c.user.name, c.meta.line());
            Err(CmdError::NoPermChannel)
        }
    }
}

/// Parses an integer argument (Redis's `string2ll`).
pub fn int_arg(a: &[u8]) -> Result<i64, CmdError> {
    proto::int::parse_i64(a).ok_or(CmdError::NotInteger)
}

pub fn eq(a: &[u8], b: &str) -> bool {
    a.eq_ignore_ascii_case(b.as_bytes())
}
