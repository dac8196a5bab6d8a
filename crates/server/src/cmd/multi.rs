//! Transactions: MULTI, EXEC, DISCARD, WATCH, UNWATCH (Redis 7.0's
//! semantics and texts, `multi.c`).
//!
//! After MULTI a request is checked as `execute` checks any (name, arity,
//! authentication, ACL) and queued, answered `+QUEUED`; a refused one is
//! answered its error and makes EXEC fail with EXECABORT. EXEC runs the
//! queue as one unit ([`super::unit`]): the stripe locks of every key the
//! queued commands name and of every watched key are held throughout, so no
//! other client's command interleaves, and the transaction's writes are
//! applied as one batch: after a crash all of them are in the store or none
//! is (Redis's AOF can keep a prefix of a MULTI block). A write by anyone to
//! a watched key after WATCH (a delete of an expired key, FLUSHDB's deletes
//! included) makes EXEC answer a null array instead, as does a watched key
//! that has expired since (see [`crate::watch`]).

use super::unit::{self, Locks};
use super::{movable_keys, CmdError, Ctx, Flags, Spec, R, TABLE};
use crate::client::{Client, Multi};
use crate::keyspace::skey;
use crate::server::Shared;
use proto::Reply;
use std::collections::HashSet;
use std::sync::atomic::Ordering;

/// Whether a command runs at once in MULTI instead of being queued.
pub(super) fn runs_in_multi(spec: &Spec) -> bool {
    matches!(
        spec.name,
        "exec" | "discard" | "multi" | "watch" | "quit" | "reset"
    )
}

/// Replies a refused request's error; in MULTI the transaction fails at
/// EXEC (Redis's `flagTransaction`).
pub(super) fn reject(c: &mut Client, e: &CmdError) {
    if let Some(m) = &mut c.multi {
        m.dirty = true;
    }
    c.err(&e.text());
}

/// Queues a checked request (`+QUEUED`). Queued arguments count against
/// `client-query-buffer-limit`: past it the transaction fails at EXEC.
pub(super) fn queue(ctx: &Ctx, c: &mut Client, args: &[Vec<u8>]) {
    let limit = ctx.sh.cfg().client_query_buffer_limit as usize;
    let Some(m) = &mut c.multi else {
        return;
    };
    // Nothing more is kept once EXEC is bound to fail (as Redis).
    if !m.dirty {
        let bytes: usize = args.iter().map(|a| a.len() + 16).sum();
        if m.bytes + bytes > limit {
            m.dirty = true;
            m.cmds = Vec::new();
            c.err(
                &CmdError::Msg(
                    "transaction discarded: the queued commands exceed client-query-buffer-limit",
                )
                .text(),
            );
            return;
        }
        m.bytes += bytes;
        m.cmds.push(args.to_vec());
        c.meta
            .multi
            .store(m.cmds.len() as u64 + 1, Ordering::Relaxed);
    }
    c.simple("QUEUED");
}

pub fn multi(_ctx: &mut Ctx, c: &mut Client, _a: &[Vec<u8>]) -> R {
    begin(c)
}

/// MULTI (also run while a script is busy).
pub(crate) fn begin(c: &mut Client) -> R {
    if c.multi.is_some() {
        return Err(CmdError::Msg("MULTI calls can not be nested"));
    }
    c.multi = Some(Multi::default());
    c.meta.multi.store(1, Ordering::Relaxed);
    c.ok();
    Ok(())
}

/// Ends a transaction (EXEC, DISCARD, RESET): its queue and its watched
/// keys are forgotten.
pub(crate) fn discard_transaction(sh: &Shared, c: &mut Client) -> Option<Multi> {
    sh.watches.unwatch_all(c.id, &mut c.watching);
    c.meta.multi.store(0, Ordering::Relaxed);
    c.multi.take()
}

pub fn discard(ctx: &mut Ctx, c: &mut Client, _a: &[Vec<u8>]) -> R {
    discard_with(ctx.sh, c)
}

/// DISCARD, with the shared state alone (also run while a script is busy).
pub(crate) fn discard_with(sh: &Shared, c: &mut Client) -> R {
    if c.multi.is_none() {
        return Err(CmdError::Msg("DISCARD without MULTI"));
    }
    discard_transaction(sh, c);
    c.ok();
    Ok(())
}

pub fn watch(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    if c.multi.is_some() {
        return Err(CmdError::Msg("WATCH inside MULTI is not allowed"));
    }
    // No point in watching more once EXEC is bound to fail.
    if !c.watching.dirty.load(Ordering::SeqCst) {
        for k in &a[1..] {
            let sk = skey(c.db, k);
            let (_, expired) = ctx.ks.lookup_raw(&sk, ctx.now)?;
            ctx.sh.watches.watch(c.id, &mut c.watching, &sk, expired);
        }
    }
    c.ok();
    Ok(())
}

pub fn unwatch(ctx: &mut Ctx, c: &mut Client, _a: &[Vec<u8>]) -> R {
    unwatch_with(ctx.sh, c)
}

/// UNWATCH, with the shared state alone (also run while a script is busy).
pub(crate) fn unwatch_with(sh: &Shared, c: &mut Client) -> R {
    sh.watches.unwatch_all(c.id, &mut c.watching);
    c.ok();
    Ok(())
}

/// The locks an EXEC of `cmds` takes (database `db` at its start): the
/// stripes of every key the queued commands name and of the watched keys;
/// every stripe when one of them needs every lock, changes the database
/// (SELECT, MOVE, COPY ... DB: their keys are in another database) or
/// reads keys its arguments do not name (SORT).
fn exec_locks(cmds: &[Vec<Vec<u8>>], db: u8, watched: &[Vec<u8>]) -> Locks {
    let mut keys: HashSet<Vec<u8>> = watched.iter().cloned().collect();
    for args in cmds {
        let Some(i) = super::lookup(&args[0]) else {
            continue;
        };
        let spec = &TABLE[i];
        // SORT's BY and GET keys are in its data: a rerun after the escape
        // would publish a queued PUBLISH twice, so such a queue locks all
        // from the start.
        if unit::needs_all(spec.name)
            || matches!(spec.name, "select" | "move" | "copy" | "sort" | "sort_ro")
        {
            return Locks::All;
        }
        // A container's keys are its subcommand's (XGROUP CREATE's key).
        let cmd = crate::acl::cmd(crate::acl::resolve(i, args).unwrap_or(i));
        let idx: Vec<usize> = if cmd.flags.contains(Flags::MOVABLEKEYS) {
            movable_keys(spec.name, args)
        } else {
            cmd.keys.indexes(args.len()).collect()
        };
        for k in idx {
            keys.insert(skey(db, &args[k]));
        }
    }
    Locks::Keys(keys.into_iter().collect())
}

pub fn exec(ctx: &mut Ctx, c: &mut Client, _a: &[Vec<u8>]) -> R {
    if c.multi.is_none() {
        return Err(CmdError::Msg("EXEC without MULTI"));
    }
    let watched: Vec<(Vec<u8>, bool)> = c
        .watching
        .keys
        .iter()
        .map(|(k, e)| (k.clone(), e.load(Ordering::SeqCst)))
        .collect();
    let dirty_cas = c.watching.dirty.clone();
    c.meta.multi.store(0, Ordering::Relaxed);
    let Some(m) = c.multi.take() else {
        return Ok(());
    };
    if m.dirty {
        ctx.sh.watches.unwatch_all(c.id, &mut c.watching);
        return Err(CmdError::ExecAbort);
    }
    let wkeys: Vec<Vec<u8>> = watched.iter().map(|(k, _)| k.clone()).collect();
    let locks = exec_locks(&m.cmds, c.db, &wkeys);
    c.deny_blocking = true;
    let r = unit::run(ctx, c, locks, |ctx, c| {
        // Under the locks: a write to a watched key either touched the flag
        // already or comes after the transaction.
        if dirty_cas.load(Ordering::SeqCst) || watched_key_expired(ctx, &watched)? {
            c.reply(&Reply::NullArray);
            return Ok(());
        }
        c.array_header(m.cmds.len());
        for args in &m.cmds {
            if !c.user.unrestricted() {
                if let Some(reason) = acl_changed(ctx, c, args) {
                    c.err(&format!(
                        "NOPERM ACLs rules changed between the moment the transaction was accumulated and the EXEC call. This command is no longer allowed for the following reason: {reason}"
                    ));
                    continue;
                }
            }
            unit::call(ctx, c, args);
            if unit::escaped(ctx) {
                // Run again under every lock; this run's replies are dropped.
                return Ok(());
            }
        }
        Ok(())
    });
    c.deny_blocking = false;
    ctx.sh.watches.unwatch_all(c.id, &mut c.watching);
    r
}

/// Whether a watched key that was live when watched has expired since
/// (`watched`: store keys and whether each had expired when watched).
fn watched_key_expired(ctx: &mut Ctx, watched: &[(Vec<u8>, bool)]) -> Result<bool, CmdError> {
    for (k, expired_then) in watched {
        if !expired_then && ctx.ks.lookup_raw(k, ctx.now)?.1 {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Why a restricted user may no longer run a queued request (its rules
/// changed after MULTI), in Redis's words; None when it may.
fn acl_changed(ctx: &Ctx, c: &Client, args: &[Vec<u8>]) -> Option<&'static str> {
    let i = super::lookup(&args[0])?;
    match super::acl_check(ctx.sh, c, i, args) {
        Ok(()) => None,
        Err(CmdError::NoPermKey) => Some("no permission to touch the specified keys"),
        Err(_) => Some("no permission to execute the command or subcommand"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(parts: &[&str]) -> Vec<Vec<u8>> {
        parts.iter().map(|p| p.as_bytes().to_vec()).collect()
    }

    #[test]
    fn exec_locks_name_every_key_or_all() {
        let cmds = vec![req(&["set", "a", "1"]), req(&["mset", "b", "1", "c", "2"])];
        let Locks::Keys(mut k) = exec_locks(&cmds, 0, &[skey(0, b"w")]) else {
            panic!("expected keys");
        };
        k.sort();
        assert_eq!(
            k,
            vec![skey(0, b"a"), skey(0, b"b"), skey(0, b"c"), skey(0, b"w")]
        );
        let cmds = vec![req(&["zunionstore", "d", "2", "x", "y"])];
        let Locks::Keys(k) = exec_locks(&cmds, 3, &[]) else {
            panic!("expected keys");
        };
        assert_eq!(k.len(), 3);
        for all in [
            ["flushdb"].as_slice(),
            &["select", "1"],
            &["move", "a", "1"],
        ] {
            assert!(matches!(exec_locks(&[req(all)], 0, &[]), Locks::All));
        }
    }
}
