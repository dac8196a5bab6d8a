//! Server commands: INFO, CONFIG, COMMAND, TIME, persistence, SHUTDOWN.

use super::{eq, Cats, CmdError, Ctx, Spec, R, TABLE};
use crate::config::{HONOURED, NO_EFFECT};
use crate::glob::Glob;
use crate::server::{Client, Shared};
use proto::Reply;
use std::sync::atomic::Ordering;
use std::time::Duration;

pub fn info(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    let sections: Vec<String> = a[1..]
        .iter()
        .map(|s| String::from_utf8_lossy(s).to_ascii_lowercase())
        .collect();
    let text = crate::info::render(ctx, &sections)?;
    c.reply(&Reply::Verbatim {
        format: *b"txt",
        text: text.into_bytes(),
    });
    Ok(())
}

fn bulk(s: &str) -> Reply {
    Reply::Bulk(s.as_bytes().to_vec())
}

pub fn config(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    let sub = String::from_utf8_lossy(&a[1]).to_ascii_lowercase();
    match sub.as_str() {
        "get" => {
            if a.len() < 3 {
                return Err(super::arity_error("config|get"));
            }
            let cfg = ctx.sh.cfg();
            let mut out = Vec::new();
            let globs: Vec<Glob> = a[2..].iter().map(|p| Glob::new(p, true)).collect();
            let names = HONOURED
                .iter()
                .map(|(n, _)| *n)
                .chain(NO_EFFECT.iter().copied());
            for n in names {
                if globs.iter().any(|g| g.matches(n.as_bytes())) {
                    if let Some(v) = cfg.get(n) {
                        out.push((bulk(n), bulk(&v)));
                    }
                }
            }
            drop(cfg);
            c.reply(&Reply::Map(out));
        }
        "set" => {
            if a.len() < 4 || !a.len().is_multiple_of(2) {
                return Err(super::arity_error("config|set"));
            }
            let mut next = ctx.sh.cfg().clone();
            for p in a[2..].chunks(2) {
                let name = String::from_utf8_lossy(&p[0]).to_ascii_lowercase();
                let val = String::from_utf8_lossy(&p[1]).into_owned();
                match HONOURED.iter().find(|(n, _)| *n == name) {
                    Some((_, false)) => return Err(CmdError::ConfigImmutable(name)),
                    Some((_, true)) => {}
                    None if NO_EFFECT.contains(&name.as_str()) => {}
                    None => return Err(CmdError::ConfigUnknown(name)),
                }
                if let Err(why) = next.apply(&name, &[val]) {
                    return Err(CmdError::ConfigInvalid { name, why });
                }
                if name == "maxclients" {
                    // As Redis: raise the open file limit, or refuse.
                    let room = crate::server::raise_nofile_limit(next.maxclients);
                    if room < next.maxclients {
                        return Err(CmdError::ConfigMaxclients(room));
                    }
                }
            }
            let pass = a[2..]
                .chunks(2)
                .any(|p| eq(&p[0], "requirepass"))
                .then(|| next.requirepass.clone());
            ctx.sh.acl.set_log_max(next.acllog_max_len);
            ctx.sh
                .slowlog
                .configure(next.slowlog_slower_than, next.slowlog_max_len);
            ctx.sh.latency.configure(next.latency_monitor_threshold);
            ctx.sh
                .pubsub
                .notify_flags()
                .store(next.notify_keyspace_events, Ordering::Relaxed);
            ctx.sh.evict.configure(&next, Some(&ctx.sh.hk.access));
            *ctx.sh.cfg.write().unwrap_or_else(|p| p.into_inner()) = next;
            ctx.sh.cfg_epoch.fetch_add(1, Ordering::AcqRel);
            // requirepass is the default user's password (Redis's
            // `resetpass >pass`, or `nopass` when empty).
            if let Some(p) = pass {
                ctx.sh.acl.set_default_password(p.as_deref());
            }
            // This client's own settings take effect for its next command
            // through the worker's reload.
            c.ok();
        }
        "resetstat" => {
            if a.len() != 2 {
                return Err(super::arity_error("config|resetstat"));
            }
            ctx.sh.stats.reset();
            ctx.sh.acl.reset_stats();
            ctx.sh.evict.reset_stats();
            c.ok();
        }
        "rewrite" => {
            return Err(CmdError::NotSupported {
                what: "CONFIG REWRITE".into(),
                why: ": edit the configuration file",
            })
        }
        "help" => {
            let lines = [
                "CONFIG <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
                "GET <pattern>",
                "    Return parameters matching the glob-like <pattern> and their values.",
                "SET <directive> <value>",
                "    Set the configuration <directive> to <value>.",
                "RESETSTAT",
                "    Reset statistics reported by the INFO command.",
                "HELP",
                "    Print this help.",
            ];
            super::help(c, &lines);
        }
        _ => return Err(super::unknown_subcommand("CONFIG", &a[1])),
    }
    Ok(())
}

fn command_info(s: &Spec) -> Reply {
    let k = s.keys;
    let key_specs = if k.first > 0 {
        vec![Reply::Map(vec![
            (
                bulk("begin_search"),
                Reply::Map(vec![
                    (bulk("type"), bulk("index")),
                    (
                        bulk("spec"),
                        Reply::Map(vec![(bulk("index"), Reply::Integer(k.first as i64))]),
                    ),
                ]),
            ),
            (
                bulk("find_keys"),
                Reply::Map(vec![
                    (bulk("type"), bulk("range")),
                    (
                        bulk("spec"),
                        Reply::Map(vec![
                            (
                                bulk("lastkey"),
                                Reply::Integer(if k.last < 0 {
                                    k.last as i64
                                } else {
                                    (k.last - k.first) as i64
                                }),
                            ),
                            (bulk("keystep"), Reply::Integer(k.step as i64)),
                            (bulk("limit"), Reply::Integer(0)),
                        ]),
                    ),
                ]),
            ),
        ])]
    } else {
        vec![]
    };
    Reply::Array(vec![
        bulk(s.name),
        Reply::Integer(s.arity as i64),
        // Redis hides `may_replicate` and `protected` from COMMAND INFO.
        Reply::Set(
            s.flags
                .names()
                .filter(|f| !matches!(*f, "may_replicate" | "protected"))
                .map(|f| Reply::Simple(f.into()))
                .collect(),
        ),
        Reply::Integer(k.first as i64),
        Reply::Integer(k.last as i64),
        Reply::Integer(k.step as i64),
        Reply::Set(
            s.categories()
                .names()
                .map(|c| Reply::Simple(format!("@{c}")))
                .collect(),
        ),
        Reply::Set(vec![]),
        Reply::Array(key_specs),
        Reply::Array(vec![]),
    ])
}

fn command_docs(s: &Spec) -> Reply {
    Reply::Map(vec![
        (bulk("summary"), bulk(s.summary)),
        (bulk("since"), bulk(s.since)),
        (bulk("group"), bulk(s.group)),
    ])
}

pub fn command(_ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    if a.len() == 1 {
        c.reply(&Reply::Array(TABLE.iter().map(command_info).collect()));
        return Ok(());
    }
    let sub = String::from_utf8_lossy(&a[1]).to_ascii_lowercase();
    match sub.as_str() {
        "count" => c.int(TABLE.len() as i64),
        "list" => {
            // Redis: `FILTERBY MODULE name | ACLCAT cat | PATTERN pat`, the
            // only option, so FILTERBY comes last with exactly two arguments.
            let filter = match a.len() {
                2 => None,
                5 if eq(&a[2], "filterby") => {
                    let kind = String::from_utf8_lossy(&a[3]).to_ascii_lowercase();
                    if !matches!(kind.as_str(), "module" | "aclcat" | "pattern") {
                        return Err(CmdError::Syntax);
                    }
                    Some((kind, a[4].as_slice()))
                }
                _ => return Err(CmdError::Syntax),
            };
            let keep: Box<dyn Fn(&Spec) -> bool> = match filter {
                None => Box::new(|_| true),
                // Ember has no modules.
                Some((k, _)) if k == "module" => Box::new(|_| false),
                Some((k, cat)) if k == "aclcat" => {
                    match Cats::by_name(&String::from_utf8_lossy(cat)) {
                        Some(cat) => Box::new(move |s| s.categories().contains(cat)),
                        None => Box::new(|_| false),
                    }
                }
                Some((_, pat)) => {
                    let g = Glob::new(pat, true);
                    Box::new(move |s| g.matches(s.name.as_bytes()))
                }
            };
            c.reply(&Reply::Array(
                TABLE
                    .iter()
                    .filter(|s| keep(s))
                    .map(|s| bulk(s.name))
                    .collect(),
            ));
        }
        "info" => {
            let r = if a.len() == 2 {
                TABLE.iter().map(command_info).collect()
            } else {
                a[2..]
                    .iter()
                    .map(|n| super::lookup(n).map_or(Reply::NullArray, |i| command_info(&TABLE[i])))
                    .collect()
            };
            c.reply(&Reply::Array(r));
        }
        "docs" => {
            let r = if a.len() == 2 {
                TABLE
                    .iter()
                    .map(|s| (bulk(s.name), command_docs(s)))
                    .collect()
            } else {
                a[2..]
                    .iter()
                    .filter_map(|n| {
                        super::lookup(n).map(|i| (bulk(TABLE[i].name), command_docs(&TABLE[i])))
                    })
                    .collect()
            };
            c.reply(&Reply::Map(r));
        }
        "getkeys" => {
            if a.len() < 3 {
                return Err(super::arity_error("command|getkeys"));
            }
            let Some(i) = super::lookup(&a[2]) else {
                return Err(CmdError::InvalidCommand);
            };
            let s = &TABLE[i];
            let args = &a[2..];
            if !s.arity_ok(args.len()) {
                return Err(CmdError::InvalidCommandArity);
            }
            let keys: Vec<usize> = if s.flags.contains(super::Flags::MOVABLEKEYS) {
                let k = super::movable_keys(s.name, args);
                if k.is_empty() {
                    return Err(CmdError::InvalidGetkeysArgs);
                }
                k
            } else {
                s.keys.indexes(args.len()).collect()
            };
            if s.keys.first == 0 && !s.flags.contains(super::Flags::MOVABLEKEYS) {
                return Err(CmdError::NoKeyArguments);
            }
            let keys = keys.into_iter();
            c.reply(&Reply::Array(
                keys.map(|k| Reply::Bulk(args[k].clone())).collect(),
            ));
        }
        "help" => {
            let lines = [
                "COMMAND <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
                "(no subcommand)",
                "    Return details about all commands.",
                "COUNT",
                "    Return the total number of commands in this server.",
                "LIST",
                "    Return a list of all commands in this server.",
                "INFO [<command-name> ...]",
                "    Return details about multiple commands.",
                "DOCS [<command-name> ...]",
                "    Return documentation details about multiple commands.",
                "GETKEYS <full-command>",
                "    Return the keys from a full command.",
                "HELP",
                "    Print this help.",
            ];
            super::help(c, &lines);
        }
        _ => return Err(super::unknown_subcommand("COMMAND", &a[1])),
    }
    Ok(())
}

pub fn time(_ctx: &mut Ctx, c: &mut Client, _a: &[Vec<u8>]) -> R {
    let d = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    c.reply(&Reply::Array(vec![
        bulk(&d.as_secs().to_string()),
        bulk(&d.subsec_micros().to_string()),
    ]));
    Ok(())
}

/// The heap is always the image: every acknowledged write is already saved,
/// so the last save is now.
pub fn lastsave(ctx: &mut Ctx, c: &mut Client, _a: &[Vec<u8>]) -> R {
    c.int(ctx.now / 1000);
    Ok(())
}

pub fn save(_ctx: &mut Ctx, c: &mut Client, _a: &[Vec<u8>]) -> R {
    // Nothing to write: every acknowledged write is already in the heap.
    c.ok();
    Ok(())
}

pub fn bgsave(_ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    if a.len() > 2 || (a.len() == 2 && !eq(&a[1], "schedule")) {
        return Err(CmdError::Syntax);
    }
    // As SAVE: the heap is the image, there is no snapshot to take.
    c.ok();
    Ok(())
}

/// DEBUG (only where `enable-debug-command` allows it): SLEEP and HELP.
pub fn debug(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    if a.len() == 2 && eq(&a[1], "help") {
        let lines = [
            "DEBUG <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
            "DIGEST",
            "    Output a hex signature representing the current DB content.",
            "DIGEST-VALUE <key> [<key> ...]",
            "    Output a hex signature of the values of all the specified keys.",
            "OBJECT <key>",
            "    Show low level info about the `key` and associated value.",
            "PROTOCOL <type>",
            "    Reply with a test value of the specified type. <type> can be: string,",
            "    integer, double, bignum, null, array, set, map, attrib, push, verbatim,",
            "    true, false.",
            "RELOAD",
            "    Accepted: every write is in the heap already; there is nothing",
            "    to save and load again.",
            "SET-ACTIVE-EXPIRE <0|1>",
            "    Setting it to 0 disables expiring keys in background when they are not",
            "    accessed (otherwise the Redis behavior). Setting it to 1 reenables back the",
            "    default.",
            "SLEEP <seconds>",
            "    Stop the server for <seconds>. Decimals allowed.",
            "HELP",
            "    Print this help.",
        ];
        super::help(c, &lines);
        return Ok(());
    }
    if a.len() == 3 && eq(&a[1], "sleep") {
        // As Redis: the worker sleeps (its clients wait, as all of Redis's
        // do); a SHUTDOWN or SIGTERM meanwhile waits `shutdown-worker-timeout`
        // for it, then exits.
        let secs = strtod_prefix(&a[2]);
        if secs > 0.0 {
            std::thread::sleep(Duration::try_from_secs_f64(secs).unwrap_or(Duration::MAX));
        }
        c.ok();
        return Ok(());
    }
    if a.len() == 2 && eq(&a[1], "digest") {
        return super::digest::dataset(ctx, c);
    }
    if eq(&a[1], "digest-value") {
        return super::digest::values(ctx, c, &a[2..]);
    }
    if a.len() == 3 && eq(&a[1], "object") {
        return debug_object(ctx, c, &a[2]);
    }
    if a.len() == 3 && eq(&a[1], "protocol") {
        return debug_protocol(c, &a[2]);
    }
    if a.len() == 3 && eq(&a[1], "set-active-expire") {
        // As Redis (atoi): a leading integer, nonzero enabling; anything
        // else counts as 0.
        let on = std::str::from_utf8(&a[2])
            .ok()
            .map(|s| {
                let t = s.trim_start();
                let end = t
                    .char_indices()
                    .take_while(|&(i, ch)| {
                        ch.is_ascii_digit() || (i == 0 && (ch == '-' || ch == '+'))
                    })
                    .count();
                t[..end].parse::<i64>().unwrap_or(0)
            })
            .unwrap_or(0);
        ctx.sh
            .hk
            .active_expire
            .store(on != 0, std::sync::atomic::Ordering::Relaxed);
        c.ok();
        return Ok(());
    }
    if eq(&a[1], "reload") {
        // Redis saves an RDB and loads it back, checking that the dataset
        // survives; Ember's dataset is the heap, written before each reply.
        c.ok();
        return Ok(());
    }
    Err(CmdError::DebugUnknown(a[1].clone()))
}

/// DEBUG PROTOCOL: a test value of each RESP type, as Redis sends it (in
/// RESP2 each type's RESP2 form; a push is refused there).
// 3.141 is Redis's test value, not an approximation of π.
#[allow(clippy::approx_constant)]
fn debug_protocol(c: &mut Client, ty: &[u8]) -> R {
    let n = |i: i64| Reply::Integer(i);
    let r = match ty.to_ascii_lowercase().as_slice() {
        b"string" => Reply::Bulk(b"Hello World".to_vec()),
        b"integer" => n(12345),
        b"double" => Reply::Double(3.141),
        b"bignum" => Reply::BigNumber("1234567999999999999999999999999999999".into()),
        b"null" => Reply::Null,
        b"array" => Reply::Array((0..3).map(n).collect()),
        b"set" => Reply::Set((0..3).map(n).collect()),
        b"map" => Reply::Map((0..3).map(|i| (n(i), Reply::Boolean(i == 1))).collect()),
        b"attrib" => {
            // RESP3's attribute type (`|`), which only this reply uses:
            // written here rather than given a `Reply` variant.
            if c.resp == proto::Version::Resp3 {
                c.out.extend_from_slice(b"|1\r\n");
                c.reply(&Reply::Bulk(b"key-popularity".to_vec()));
                c.reply(&Reply::Array(vec![Reply::Bulk(b"key:123".to_vec()), n(90)]));
            }
            Reply::Bulk(b"Some real reply following the attribute".to_vec())
        }
        b"push" => {
            if c.resp != proto::Version::Resp3 {
                return Err(CmdError::Msg("RESP2 is not supported by this command"));
            }
            c.reply(&Reply::Push(vec![
                Reply::Bulk(b"server-cpu-usage".to_vec()),
                n(42),
            ]));
            Reply::Bulk(b"Some real reply following the push reply".to_vec())
        }
        b"verbatim" => Reply::Verbatim {
            format: *b"txt",
            text: b"This is a verbatim\nstring".to_vec(),
        },
        b"true" => Reply::Boolean(true),
        b"false" => Reply::Boolean(false),
        _ => {
            return Err(CmdError::Msg(
                "Wrong protocol type name. Please use one of the following: \
                 string|integer|double|bignum|null|array|set|map|attrib|push|verbatim|true|false",
            ))
        }
    };
    c.reply(&r);
    Ok(())
}

/// DEBUG OBJECT: Redis's line (`Value at:... refcount:... encoding:...
/// serializedlength:... lru:... lru_seconds_idle:...`). The address is
/// the key's hash (Ember has no object pointer); serializedlength is the
/// length of the value's RDB serialization, as Redis computes it.
fn debug_object(ctx: &mut Ctx, c: &mut Client, key: &[u8]) -> R {
    let Some(h) = ctx.ks.get_untouched(&ctx.sh.stripes, c.db, key, ctx.now)? else {
        return Err(CmdError::Msg("no such key"));
    };
    let v = &ctx.ks.raw[h.off..];
    let encoding = super::keys::encoding_of(h.kind, v);
    let shared = h.kind == crate::keyspace::KIND_STRING
        && proto::int::parse_i64(v).is_some_and(|n| (0..10_000).contains(&n));
    let refcount = if shared { i32::MAX as i64 } else { 1 };
    let sk = crate::keyspace::skey(c.db, key);
    let idle_ms = ctx
        .sh
        .hk
        .access
        .idle_ms(&sk, ctx.now)
        .unwrap_or(ctx.sh.started.elapsed().as_millis() as u64);
    let serialized = match super::dump::read_value(ctx, c, key)? {
        // The payload less its type byte and its 10-byte footer.
        Some(v) => crate::rdb::dump(&v).len().saturating_sub(11),
        None => 0,
    };
    let now_s = (ctx.now / 1000) as u64;
    let lru = now_s.saturating_sub(idle_ms / 1000) & 0xFF_FFFF;
    let addr = {
        use std::hash::{Hash, Hasher};
        let mut hs = std::collections::hash_map::DefaultHasher::new();
        sk.hash(&mut hs);
        hs.finish() & 0xFFFF_FFFF_FFF0
    };
    c.simple(&format!(
        "Value at:0x{addr:x} refcount:{refcount} encoding:{encoding} serializedlength:{serialized} lru:{lru} lru_seconds_idle:{}",
        idle_ms / 1000
    ));
    Ok(())
}

/// C's `strtod` on a C string: the longest prefix (after leading white
/// space) that reads as a number; 0 when none does.
fn strtod_prefix(a: &[u8]) -> f64 {
    let a = a.split(|&b| b == 0).next().unwrap_or_default();
    let s = String::from_utf8_lossy(&a[..a.len().min(64)]);
    let s = s.trim_start_matches([' ', '\t', '\n', '\r', '\x0b', '\x0c']);
    (1..=s.len())
        .rev()
        .filter(|&n| s.is_char_boundary(n))
        .find_map(|n| s[..n].parse::<f64>().ok())
        .unwrap_or(0.0)
}

pub fn shutdown(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    shutdown_with(ctx.sh, c, a)
}

/// SHUTDOWN, with the shared state alone (also run while a script is busy,
/// see `busy`). Every write is durable already: SAVE, NOW and FORCE change
/// nothing. While a script is busy only SHUTDOWN NOSAVE is allowed, as in
/// Redis; it stops the script and drops its writes (Redis exits without
/// them).
pub(crate) fn shutdown_with(sh: &Shared, c: &mut Client, a: &[Vec<u8>]) -> R {
    let (mut abort, mut nosave, mut save, mut other) = (false, false, false, false);
    for o in &a[1..] {
        if eq(o, "nosave") {
            nosave = true;
        } else if eq(o, "save") {
            save = true;
        } else if eq(o, "now") || eq(o, "force") {
            other = true;
        } else if eq(o, "abort") {
            abort = true;
        } else {
            return Err(CmdError::Syntax);
        }
    }
    if (abort && (nosave || save || other)) || (nosave && save) {
        return Err(CmdError::Syntax);
    }
    if abort {
        return Err(CmdError::NoShutdown);
    }
    if nosave {
        sh.scripting.abandon();
    } else if let Some(e) = crate::lua::busy_now(sh) {
        return Err(CmdError::Script(e.into()));
    }
    eprintln!("ember: SHUTDOWN requested by client id={}", c.id);
    sh.begin_shutdown();
    // Like Redis, no reply: the connection closes with the server.
    c.close_after = true;
    Ok(())
}

/// The table entry of container `parent`'s subcommand `a[1]` (`upper`: the
/// name in errors), its arity checked first as Redis does.
fn sub_spec(
    parent: &str,
    upper: &'static str,
    a: &[Vec<u8>],
) -> Result<&'static super::SubSpec, CmdError> {
    let Some(spec) = super::SUBCOMMANDS
        .iter()
        .find(|s| s.parent == parent && eq(&a[1], s.name))
    else {
        return Err(super::unknown_subcommand(upper, &a[1]));
    };
    if !super::arity_ok(spec.arity, a.len()) {
        return Err(super::arity_error(format!("{parent}|{}", spec.name)));
    }
    Ok(spec)
}

pub fn slowlog(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    let log = &ctx.sh.slowlog;
    let sub = &a[1];
    sub_spec("slowlog", "SLOWLOG", a)?;
    if a.len() == 2 && eq(sub, "help") {
        super::help(
            c,
            &[
                "SLOWLOG <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
                "GET [<count>]",
                "    Return top <count> entries from the slowlog (default: 10, -1 mean all).",
                "    Entries are made of:",
                "    id, timestamp, time in microseconds, arguments array, client IP and port,",
                "    client name",
                "LEN",
                "    Return the length of the slowlog.",
                "RESET",
                "    Reset the slowlog.",
                "HELP",
                "    Prints this help.",
            ],
        );
    } else if a.len() == 2 && eq(sub, "reset") {
        log.reset();
        c.ok();
    } else if a.len() == 2 && eq(sub, "len") {
        c.int(log.len() as i64);
    } else if (a.len() == 2 || a.len() == 3) && eq(sub, "get") {
        let count = match a.get(2) {
            None => 10,
            Some(n) => match proto::int::parse_i64(n) {
                Some(-1) => usize::MAX,
                Some(n) if n >= 0 => n as usize,
                _ => return Err(CmdError::Msg("count should be greater than or equal to -1")),
            },
        };
        c.reply(&log.get(count));
    }
    Ok(())
}

/// WAIT: on a lone server no replica acknowledges: 0 at once (Redis would
/// wait out the timeout for a positive count). On a cluster's leader: how
/// many followers have the client's last write in their logs, waiting up to
/// the timeout for `numreplicas` of them (see `crate::cluster::wait`).
pub fn wait(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    let want = super::int_arg(&a[1])?;
    let timeout = proto::int::parse_i64(&a[2])
        .ok_or(CmdError::Msg("timeout is not an integer or out of range"))?;
    if timeout < 0 {
        return Err(CmdError::Msg("timeout is negative"));
    }
    let n = match ctx.sh.cluster.get() {
        Some(cl) => crate::cluster::wait(cl, c.repl_index, want, timeout),
        None => 0,
    };
    c.int(n);
    Ok(())
}

pub fn latency(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    let l = &ctx.sh.latency;
    let spec = sub_spec("latency", "LATENCY", a)?;
    match spec.name {
        "latest" => c.reply(&l.latest()),
        "history" => c.reply(&l.history(&a[2])),
        "reset" => c.int(l.reset(&a[2..]) as i64),
        "graph" if !l.has(&a[2]) => {
            return Err(CmdError::Text(format!(
                "ERR No samples available for event '{}'",
                String::from_utf8_lossy(&a[2])
            )))
        }
        "help" => super::help(
            c,
            &[
                "LATENCY <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
                "DOCTOR",
                "    Return a human readable latency analysis report.",
                "GRAPH <event>",
                "    Return an ASCII latency graph for the <event> class.",
                "HISTORY <event>",
                "    Return time-latency samples for the <event> class.",
                "LATEST",
                "    Return the latest latency samples for all events.",
                "RESET [<event> ...]",
                "    Reset latency data of one or more <event> classes.",
                "    (default: reset all data for all event classes)",
                "HISTOGRAM [COMMAND ...]",
                "    Return a cumulative distribution of latencies in the format of a histogram for the specified command names.",
                "    If no commands are specified then all histograms are replied.",
                "HELP",
                "    Prints this help.",
            ],
        ),
        other => {
            return Err(CmdError::NotSupported {
                what: format!("LATENCY {}", other.to_ascii_uppercase()),
                why: "",
            })
        }
    }
    Ok(())
}
