//! Connection commands.

use super::{eq, int_arg, CmdError, Ctx, R};
use crate::server::{Client, Shared};
use proto::{Reply, Version};
use std::sync::atomic::Ordering;

/// The Redis version Ember's command set follows (HELLO, INFO).
pub const REDIS_COMPAT_VERSION: &str = "7.2.0";

pub fn ping(_ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    if a.len() <= 2 && c.subs.is_some() && c.resp == Version::Resp2 {
        // Subscriber mode: an array, as Redis answers there.
        c.array_header(2);
        c.bulk(b"pong");
        c.bulk(a.get(1).map_or(&b""[..], |x| x));
        return Ok(());
    }
    match a.len() {
        1 => c.simple("PONG"),
        2 => c.bulk(&a[1]),
        _ => return Err(super::arity_error("ping")),
    }
    Ok(())
}

pub fn echo(_ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    c.bulk(&a[1]);
    Ok(())
}

pub fn quit(_ctx: &mut Ctx, c: &mut Client, _a: &[Vec<u8>]) -> R {
    quit_with(c)
}

pub(crate) fn quit_with(c: &mut Client) -> R {
    c.ok();
    c.close_after = true;
    Ok(())
}

pub fn select(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    let n = int_arg(&a[1])?;
    // Redis reads the index as a C int first (getIntFromObjectOrReply).
    if n < i32::MIN as i64 || n > i32::MAX as i64 {
        return Err(CmdError::IntRange);
    }
    if n < 0 || n >= ctx.sh.cfg().databases as i64 {
        return Err(CmdError::DbIndexOutOfRange);
    }
    c.db = n as u8;
    c.meta.db.store(c.db, Ordering::Relaxed);
    c.ok();
    Ok(())
}

/// Logs the connection in as `user`, or records the failure in ACL LOG
/// (`cmd` is the command as the client typed it).
fn login(sh: &Shared, c: &mut Client, cmd: &[u8], user: &[u8], pass: &[u8]) -> R {
    let acl = &sh.acl;
    match acl.authenticate(user, pass) {
        Some(u) => {
            c.set_user(acl, Some(u));
            Ok(())
        }
        None => {
            acl.log("auth", cmd, user, c.meta.line());
            Err(CmdError::WrongPass)
        }
    }
}

pub fn auth(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    auth_with(ctx.sh, c, a)
}

/// AUTH, with the shared state alone (also run while a script is busy).
pub(crate) fn auth_with(sh: &Shared, c: &mut Client, a: &[Vec<u8>]) -> R {
    let (user, pass): (&[u8], &[u8]) = match a.len() {
        // The one-argument form logs in as `default`, and is an error when
        // the default user needs no password.
        2 => {
            if sh.acl.default_nopass() {
                return Err(CmdError::AuthNotConfigured);
            }
            (b"default", &a[1])
        }
        3 => (&a[1], &a[2]),
        _ => return Err(CmdError::Syntax),
    };
    login(sh, c, &a[0], user, pass)?;
    c.ok();
    Ok(())
}

/// CLIENT KILL, old form (`addr`) and new (ID, TYPE, ADDR, LADDR, USER,
/// SKIPME), as Redis 7.0. The connections matched on any worker are marked
/// and their workers woken; each drops its own (`Worker::kill_sweep`). The
/// calling connection closes after the reply when it matches itself.
fn client_kill(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    let mut addr: Option<&[u8]> = None;
    let mut laddr: Option<&[u8]> = None;
    let mut user: Option<String> = None;
    let mut pubsub: Option<bool> = None;
    let mut id = 0u64;
    let mut no_type = false;
    let mut skipme = true;
    if a.len() == 3 {
        addr = Some(&a[2]);
        skipme = false;
    } else if a.len() > 3 {
        let mut i = 2;
        while i < a.len() {
            let more = i + 1 < a.len();
            let o = &a[i];
            if eq(o, "id") && more {
                id = proto::int::parse_i64(&a[i + 1])
                    .filter(|&n| n >= 1)
                    .ok_or(CmdError::Msg("client-id should be greater than 0"))?
                    as u64;
            } else if eq(o, "type") && more {
                let t = &a[i + 1];
                pubsub = if eq(t, "normal") {
                    Some(false)
                } else if eq(t, "pubsub") {
                    Some(true)
                } else if eq(t, "master") || eq(t, "replica") || eq(t, "slave") {
                    // Ember has no replication links: nothing matches.
                    no_type = true;
                    None
                } else {
                    return Err(CmdError::Text(format!(
                        "ERR Unknown client type '{}'",
                        String::from_utf8_lossy(t)
                    )));
                };
            } else if eq(o, "addr") && more {
                addr = Some(&a[i + 1]);
            } else if eq(o, "laddr") && more {
                laddr = Some(&a[i + 1]);
            } else if eq(o, "user") && more {
                let Some(u) = ctx.sh.acl.user(&a[i + 1]) else {
                    return Err(CmdError::Text(format!(
                        "ERR No such user '{}'",
                        String::from_utf8_lossy(&a[i + 1])
                    )));
                };
                user = Some(String::from_utf8_lossy(&u.name).into_owned());
            } else if eq(o, "skipme") && more {
                skipme = if eq(&a[i + 1], "yes") {
                    true
                } else if eq(&a[i + 1], "no") {
                    false
                } else {
                    return Err(CmdError::Syntax);
                };
            } else {
                return Err(CmdError::Syntax);
            }
            i += 2;
        }
    } else {
        return Err(CmdError::Syntax);
    }
    let mut killed = 0;
    let mut close_this = false;
    for m in ctx
        .sh
        .clients
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .values()
    {
        let matches = !no_type
            && addr.is_none_or(|x| m.addr.as_bytes() == x)
            && laddr.is_none_or(|x| m.laddr.as_bytes() == x)
            && pubsub.is_none_or(|p| m.is_pubsub() == p)
            && (id == 0 || m.id == id)
            && user
                .as_ref()
                .is_none_or(|u| *m.user.lock().unwrap_or_else(|p| p.into_inner()) == *u)
            && !(skipme && m.id == c.id);
        if !matches || m.killed.load(Ordering::Acquire) {
            continue;
        }
        if m.id == c.id {
            close_this = true;
        } else {
            m.killed.store(true, Ordering::Release);
        }
        killed += 1;
    }
    if killed > close_this as i64 {
        ctx.sh.kill_epoch.fetch_add(1, Ordering::AcqRel);
        super::acl::wake_workers(ctx);
    }
    if a.len() == 3 {
        if killed == 0 {
            return Err(CmdError::Msg("No such client"));
        }
        c.ok();
    } else {
        c.int(killed);
    }
    if close_this {
        c.close_after = true;
    }
    Ok(())
}

fn valid_name(n: &[u8]) -> bool {
    n.iter().all(|&b| (b'!'..=b'~').contains(&b))
}

pub fn hello(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    hello_with(ctx.sh, c, a)
}

/// HELLO, with the shared state alone (also run while a script is busy).
pub(crate) fn hello_with(sh: &Shared, c: &mut Client, a: &[Vec<u8>]) -> R {
    let mut ver = None;
    let mut i = 1;
    if a.len() > 1 {
        let v = proto::int::parse_i64(&a[1]).ok_or(CmdError::ProtoVersionNotInteger)?;
        if !(2..=3).contains(&v) {
            return Err(CmdError::NoProto);
        }
        ver = Some(v);
        i = 2;
    }
    // Options take effect in order, as Redis applies them: a failed AUTH
    // stops at once.
    while i < a.len() {
        if eq(&a[i], "auth") && i + 2 < a.len() {
            login(sh, c, &a[0], &a[i + 1], &a[i + 2])?;
            i += 3;
        } else if eq(&a[i], "setname") && i + 1 < a.len() {
            let n = &a[i + 1];
            if !valid_name(n) {
                return Err(CmdError::BadClientName);
            }
            *c.meta.name.lock().unwrap_or_else(|p| p.into_inner()) =
                String::from_utf8_lossy(n).into_owned();
            i += 2;
        } else {
            return Err(CmdError::HelloOption(a[i].clone()));
        }
    }
    if !c.authed {
        return Err(CmdError::HelloNoAuth);
    }
    if let Some(v) = ver {
        c.resp = if v == 3 {
            Version::Resp3
        } else {
            Version::Resp2
        };
        c.meta.resp.store(v as u8, Ordering::Relaxed);
    }
    let proto = if c.resp == Version::Resp3 { 3 } else { 2 };
    let s = |x: &str| Reply::Bulk(x.as_bytes().to_vec());
    c.reply(&Reply::Map(vec![
        (s("server"), s("redis")),
        (s("version"), s(REDIS_COMPAT_VERSION)),
        (s("proto"), Reply::Integer(proto)),
        (s("id"), Reply::Integer(c.id as i64)),
        (s("mode"), s("standalone")),
        (s("role"), s("master")),
        (s("modules"), Reply::Array(vec![])),
    ]));
    Ok(())
}

pub fn reset(ctx: &mut Ctx, c: &mut Client, _a: &[Vec<u8>]) -> R {
    super::multi::discard_transaction(ctx.sh, c);
    crate::pubsub::forget(ctx.sh, c);
    crate::tracking::disable(&ctx.sh.tracking, &c.meta);
    c.db = 0;
    c.resp = Version::Resp2;
    c.set_user(&ctx.sh.acl, None);
    c.meta.db.store(0, Ordering::Relaxed);
    c.meta.resp.store(2, Ordering::Relaxed);
    c.meta
        .name
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clear();
    c.simple("RESET");
    Ok(())
}

pub fn client(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    let sub = String::from_utf8_lossy(&a[1]).to_ascii_lowercase();
    let arity = |n: usize| -> R {
        if a.len() != n {
            Err(super::arity_error(format!("client|{sub}")))
        } else {
            Ok(())
        }
    };
    match sub.as_str() {
        "id" => {
            arity(2)?;
            c.int(c.id as i64);
        }
        "setname" => {
            arity(3)?;
            if !valid_name(&a[2]) {
                return Err(CmdError::BadClientName);
            }
            *c.meta.name.lock().unwrap_or_else(|p| p.into_inner()) =
                String::from_utf8_lossy(&a[2]).into_owned();
            c.ok();
        }
        "getname" => {
            arity(2)?;
            let n = c
                .meta
                .name
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone();
            if n.is_empty() {
                c.null();
            } else {
                c.bulk(n.as_bytes());
            }
        }
        "setinfo" => {
            arity(4)?;
            if !valid_name(&a[3]) {
                return Err(CmdError::BadClientField(a[2].clone()));
            }
            let v = String::from_utf8_lossy(&a[3]).into_owned();
            if eq(&a[2], "lib-name") {
                *c.meta.lib_name.lock().unwrap_or_else(|p| p.into_inner()) = v;
            } else if eq(&a[2], "lib-ver") {
                *c.meta.lib_ver.lock().unwrap_or_else(|p| p.into_inner()) = v;
            } else {
                return Err(CmdError::UnrecognizedOption(a[2].clone()));
            }
            c.ok();
        }
        "info" => {
            arity(2)?;
            let mut l = c.meta.line();
            l.push('\n');
            c.reply(&Reply::Verbatim {
                format: *b"txt",
                text: l.into_bytes(),
            });
        }
        "list" => {
            let mut ids: Option<Vec<u64>> = None;
            // TYPE normal / pubsub: clients without / with subscriptions.
            let mut pubsub: Option<bool> = None;
            let mut i = 2;
            while i < a.len() {
                if eq(&a[i], "type") && i + 1 < a.len() {
                    let t = String::from_utf8_lossy(&a[i + 1]).to_ascii_lowercase();
                    if !matches!(t.as_str(), "normal" | "master" | "replica" | "pubsub") {
                        return Err(CmdError::UnknownClientType(t));
                    }
                    match t.as_str() {
                        "normal" => pubsub = Some(false),
                        "pubsub" => pubsub = Some(true),
                        _ => ids = Some(vec![]),
                    }
                    i += 2;
                } else if eq(&a[i], "id") && i + 1 < a.len() {
                    let mut v = Vec::new();
                    for x in &a[i + 1..] {
                        let n = proto::int::parse_i64(x)
                            .filter(|&n| n > 0)
                            .ok_or(CmdError::InvalidClientId)?;
                        v.push(n as u64);
                    }
                    ids = Some(v);
                    i = a.len();
                } else {
                    return Err(CmdError::Syntax);
                }
            }
            let all: Vec<_> = ctx
                .sh
                .clients
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .values()
                .cloned()
                .collect();
            let mut s = String::new();
            for m in all {
                if ids.as_ref().is_some_and(|v| !v.contains(&m.id))
                    || pubsub.is_some_and(|p| p != m.is_pubsub())
                {
                    continue;
                }
                s.push_str(&m.line());
                s.push('\n');
            }
            c.reply(&Reply::Verbatim {
                format: *b"txt",
                text: s.into_bytes(),
            });
        }
        "unblock" => {
            // CLIENT UNBLOCK <id> [TIMEOUT|ERROR]: the reason is checked
            // before the id, as Redis does.
            if a.len() < 3 {
                return Err(super::arity_error("client|unblock"));
            }
            if a.len() > 4 {
                return Err(CmdError::SubcommandArgs {
                    cmd: "CLIENT",
                    sub: a[1].clone(),
                });
            }
            let error = match a.get(3) {
                None => false,
                Some(r) if eq(r, "timeout") => false,
                Some(r) if eq(r, "error") => true,
                Some(_) => return Err(CmdError::UnblockReason),
            };
            let id = super::int_arg(&a[2])?;
            let done = u64::try_from(id).is_ok_and(|id| {
                ctx.sh.blocking.unblock(id, error)
                    // A client waiting in a blocking command it sent to the
                    // cluster's leader through this node.
                    || ctx.sh.cluster.get().is_some_and(|cl| {
                        crate::cluster::unblock_forwarded(cl, ctx.sh, c, id, error) == Some(true)
                    })
            });
            c.int(i64::from(done));
        }
        "no-evict" | "no-touch" => {
            arity(3)?;
            if !(eq(&a[2], "on") || eq(&a[2], "off")) {
                return Err(CmdError::Syntax);
            }
            c.ok();
        }
        "help" => {
            let lines = [
                "CLIENT <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
                "CACHING (YES|NO)",
                "    Enable/disable tracking of the keys for next command in OPTIN/OPTOUT modes.",
                "GETREDIR",
                "    Return the client ID we are redirecting to when tracking is enabled.",
                "GETNAME",
                "    Return the name of the current connection.",
                "ID",
                "    Return the ID of the current connection.",
                "INFO",
                "    Return information about the current client connection.",
                "KILL <ip:port>",
                "    Kill connection made from <ip:port>.",
                "KILL <option> <value> [<option> <value> [...]]",
                "    Kill connections. Options are:",
                "    * ADDR (<ip:port>|<unixsocket>:0)",
                "      Kill connections made from the specified address",
                "    * LADDR (<ip:port>|<unixsocket>:0)",
                "      Kill connections made to specified local address",
                "    * TYPE (NORMAL|MASTER|REPLICA|PUBSUB)",
                "      Kill connections by type.",
                "    * USER <username>",
                "      Kill connections authenticated by <username>.",
                "    * SKIPME (YES|NO)",
                "      Skip killing current connection (default: yes).",
                "    * ID <client-id>",
                "      Kill connections by client id.",
                "LIST [options ...]",
                "    Return information about client connections. Options:",
                "    * TYPE (NORMAL|MASTER|REPLICA|PUBSUB)",
                "      Return clients of specified type.",
                "    * ID <client-id> [<client-id> ...]",
                "      Return clients of specified IDs only.",
                "UNPAUSE",
                "    Stop the current client pause, resuming traffic.",
                "PAUSE <timeout> [WRITE|ALL]",
                "    Suspend all, or just write, clients for <timeout> milliseconds.",
                "REPLY (ON|OFF|SKIP)",
                "    Control the replies sent to the current connection.",
                "SETNAME <name>",
                "    Assign the name <name> to the current connection.",
                "SETINFO <option> <value>",
                "    Set client meta attr. Options are:",
                "    * LIB-NAME: the client lib name.",
                "    * LIB-VER: the client lib version.",
                "UNBLOCK <clientid> [TIMEOUT|ERROR]",
                "    Unblock the specified blocked client.",
                "TRACKING (ON|OFF) [REDIRECT <id>] [BCAST] [PREFIX <prefix> [...]]",
                "         [OPTIN] [OPTOUT] [NOLOOP]",
                "    Control server assisted client side caching.",
                "TRACKINGINFO",
                "    Report tracking status for the current connection.",
                "NO-EVICT (ON|OFF)",
                "    Accepted; Ember never evicts keys.",
                "NO-TOUCH (ON|OFF)",
                "    Accepted; Ember keeps no access clock.",
                "HELP",
                "    Print this help.",
            ];
            super::help(c, &lines);
        }
        "kill" => {
            if a.len() < 3 {
                return Err(super::arity_error("client|kill"));
            }
            client_kill(ctx, c, a)?
        }
        "reply" => {
            arity(3)?;
            if eq(&a[2], "on") {
                c.reply_off = false;
                c.reply_skip_next = false;
                c.ok();
            } else if eq(&a[2], "off") {
                c.reply_off = true;
            } else if eq(&a[2], "skip") {
                if !c.reply_off {
                    c.reply_skip_next = true;
                }
            } else {
                return Err(CmdError::Syntax);
            }
        }
        "pause" => {
            if a.len() != 3 && a.len() != 4 {
                return Err(super::arity_error("client|pause"));
            }
            let all = match a.get(3) {
                None => true,
                Some(m) if eq(m, "all") => true,
                Some(m) if eq(m, "write") => false,
                Some(_) => return Err(CmdError::Msg("CLIENT PAUSE mode must be WRITE or ALL")),
            };
            let ms = proto::int::parse_i64(&a[2])
                .ok_or(CmdError::Msg("timeout is not an integer or out of range"))?;
            if ms < 0 {
                return Err(CmdError::Msg("timeout is negative"));
            }
            ctx.sh.pause.pause(ms as u64, all);
            ctx.sh.hk.pause(Some(ms as u64));
            c.ok();
        }
        "unpause" => {
            arity(2)?;
            ctx.sh.pause.unpause();
            ctx.sh.hk.pause(None);
            super::acl::wake_workers(ctx);
            c.ok();
        }
        "tracking" => {
            if a.len() < 3 {
                return Err(super::arity_error("client|tracking"));
            }
            crate::tracking::client_tracking(ctx, c, a)?
        }
        "caching" => {
            arity(3)?;
            crate::tracking::client_caching(c, a)?
        }
        "getredir" => {
            arity(2)?;
            c.int(c.meta.track.redir_field());
        }
        "trackinginfo" => {
            arity(2)?;
            crate::tracking::client_trackinginfo(c);
        }
        _ => return Err(super::unknown_subcommand("CLIENT", &a[1])),
    }
    Ok(())
}
