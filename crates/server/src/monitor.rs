//! MONITOR (Redis's `replicationFeedMonitors`): every command a client
//! runs, after it ran, is sent to the clients in MONITOR mode as one status
//! line: `+<unix seconds>.<microseconds> [<db> <client address>] "arg" ...`
//! (`lua` as the address for a script's commands), arguments quoted as
//! Redis's `sdscatrepr` does, secrets shown as `(redacted)` as in SLOWLOG.
//! `admin` and `skip_monitor` commands are not shown; neither are requests
//! refused before running (unknown command, arity, NOAUTH, ACL). The
//! monitors may be on any worker: lines travel through the Pub/Sub
//! inboxes, so a monitor sees them in the order its worker receives them.
//! When nobody monitors, a command costs one relaxed load.

use crate::cmd::{Ctx, Flags, Spec, R};
use crate::server::{Client, Shared};
use std::io::Write;

/// Sends the line of command `args` (run by `c`, or by a script when
/// `script`) to the monitors, if any and if the command is shown.
#[inline]
pub(crate) fn feed(sh: &Shared, c: &Client, spec: &Spec, args: &[Vec<u8>], script: bool) {
    if !sh.pubsub.monitoring() || hidden(spec, args) {
        return;
    }
    sh.pubsub
        .feed_monitors(line(c.db, if script { "lua" } else { &c.meta.addr }, args));
}

/// EVAL and EVALSHA (and their `_RO` forms) show before they run, so that
/// their scripts' commands follow them, as in Redis (they are
/// `skip_monitor` for the line after).
#[inline]
pub(crate) fn feed_script_call(sh: &Shared, c: &Client, spec: &Spec, args: &[Vec<u8>]) {
    if sh.pubsub.monitoring() && matches!(spec.name, "eval" | "evalsha" | "eval_ro" | "evalsha_ro")
    {
        sh.pubsub.feed_monitors(line(c.db, &c.meta.addr, args));
    }
}

/// `admin` and `skip_monitor` commands, and a container's subcommand with
/// those flags (CONFIG GET...), are not shown.
fn hidden(spec: &Spec, args: &[Vec<u8>]) -> bool {
    let skip = |f: Flags| f.contains(Flags::ADMIN) || f.contains(Flags::SKIP_MONITOR);
    skip(spec.flags)
        || args.get(1).is_some_and(|sub| {
            crate::cmd::SUBCOMMANDS.iter().any(|s| {
                s.parent == spec.name
                    && sub.eq_ignore_ascii_case(s.name.as_bytes())
                    && skip(s.flags)
            })
        })
}

/// One MONITOR line.
fn line(db: u8, addr: &str, args: &[Vec<u8>]) -> Vec<u8> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let mut out = Vec::with_capacity(64);
    let _ = write!(
        out,
        "+{}.{:06} [{db} {addr}]",
        now.as_secs(),
        now.subsec_micros()
    );
    let hidden = crate::slowlog::redacted(args);
    for (j, a) in args.iter().enumerate() {
        out.push(b' ');
        if hidden(j) {
            out.extend_from_slice(b"\"(redacted)\"");
        } else {
            repr(&mut out, a);
        }
    }
    out.extend_from_slice(b"\r\n");
    out
}

/// A quoted, escaped string (Redis's `sdscatrepr`).
fn repr(out: &mut Vec<u8>, s: &[u8]) {
    out.push(b'"');
    for &b in s {
        match b {
            b'\\' | b'"' => out.extend_from_slice(&[b'\\', b]),
            b'\n' => out.extend_from_slice(b"\\n"),
            b'\r' => out.extend_from_slice(b"\\r"),
            b'\t' => out.extend_from_slice(b"\\t"),
            0x07 => out.extend_from_slice(b"\\a"),
            0x08 => out.extend_from_slice(b"\\b"),
            0x20..=0x7e => out.push(b),
            _ => {
                let _ = write!(out, "\\x{b:02x}");
            }
        }
    }
    out.push(b'"');
}

/// MONITOR: this connection receives every command from now on (RESET or
/// closing it ends that).
pub fn monitor(ctx: &mut Ctx, c: &mut Client, _a: &[Vec<u8>]) -> R {
    if c.deny_blocking {
        return Err(crate::cmd::CmdError::Msg(
            "MONITOR isn't allowed for DENY BLOCKING client",
        ));
    }
    if c.monitor {
        return Ok(());
    }
    let Some((worker, token)) = c.home else {
        return Err(crate::cmd::CmdError::Msg(
            "MONITOR needs a network connection",
        ));
    };
    c.monitor = true;
    ctx.sh.pubsub.add_monitor(c.id, worker, token);
    c.ok();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_quote_and_redact() {
        let l = line(
            3,
            "127.0.0.1:5",
            &[b"set".to_vec(), b"k \"q\"\n\x01".to_vec(), b"v".to_vec()],
        );
        let s = String::from_utf8(l).unwrap();
        assert!(s.starts_with('+'), "{s}");
        assert!(
            s.ends_with(" [3 127.0.0.1:5] \"set\" \"k \\\"q\\\"\\n\\x01\" \"v\"\r\n"),
            "{s}"
        );
        let l = line(0, "lua", &[b"auth".to_vec(), b"pw".to_vec()]);
        assert!(String::from_utf8(l)
            .unwrap()
            .ends_with("[0 lua] \"auth\" \"(redacted)\"\r\n"));
    }
}
