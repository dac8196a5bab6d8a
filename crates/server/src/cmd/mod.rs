//! The command table and dispatch. Every reply and error text follows the Redis
//! command reference (and Redis 7's source where the reference is silent).

mod admin;
mod conn;
mod keys;
mod strings;
mod table;

pub use table::{lookup, Cats, Flags, KeyPos, Spec, TABLE};

pub use conn::REDIS_COMPAT_VERSION;

use crate::clock::Stamp;
use crate::keyspace::{Keyspace, KsError};
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
    pub requirepass: Option<&'a str>,
}

/// A handler's failure: the error reply (without `-`).
pub type R = Result<(), String>;

impl From<KsError> for String {
    fn from(e: KsError) -> String {
        e.reply_text()
    }
}

pub type Handler = fn(&mut Ctx, &mut Client, &[Vec<u8>]) -> R;

/// Redis's "unknown command" error text. Redis formats it with `%.128s` and
/// `'%.*s' `: byte counts, and each argument ends at its first NUL byte (C
/// strings); the text is built from bytes the same way, then made UTF-8.
fn unknown_command(args: &[Vec<u8>]) -> String {
    fn c_str(a: &[u8]) -> &[u8] {
        a.split(|&b| b == 0).next().unwrap_or_default()
    }
    let mut rest: Vec<u8> = Vec::new();
    for a in &args[1..] {
        if rest.len() >= 128 {
            break;
        }
        let a = c_str(a);
        let room = 128 - rest.len();
        rest.push(b'\'');
        rest.extend_from_slice(&a[..a.len().min(room)]);
        rest.extend_from_slice(b"' ");
    }
    let name = c_str(&args[0]);
    let mut msg = b"ERR unknown command '".to_vec();
    msg.extend_from_slice(&name[..name.len().min(128)]);
    msg.extend_from_slice(b"', with args beginning with: ");
    msg.extend_from_slice(&rest);
    String::from_utf8_lossy(&msg).into_owned()
}

/// Redis's error for an unknown subcommand of a container command (`cmd` in
/// capitals): the subcommand as `%.128s` prints it (bytes, up to a NUL).
pub fn unknown_subcommand(cmd: &str, sub: &[u8]) -> String {
    let sub = sub.split(|&b| b == 0).next().unwrap_or_default();
    let sub = String::from_utf8_lossy(&sub[..sub.len().min(128)]);
    format!("ERR unknown subcommand '{sub}'. Try {cmd} HELP.")
}

/// A container command's HELP reply: one simple string per line.
pub fn help(c: &mut Client, lines: &[&str]) {
    c.reply(&proto::Reply::Array(
        lines
            .iter()
            .map(|l| proto::Reply::Simple(l.to_string()))
            .collect(),
    ));
}

pub fn arity_error(name: &str) -> String {
    format!("ERR wrong number of arguments for '{name}' command")
}

/// Runs one request and appends its reply to the client's output. `clock`
/// is when the previous command ended (or the batch began): the command's
/// time is measured from it, and it is moved to this command's end.
pub fn execute(ctx: &mut Ctx, c: &mut Client, args: &[Vec<u8>], clock: &mut Stamp) {
    let t0 = *clock;
    let Some(i) = lookup(&args[0]) else {
        c.err(&unknown_command(args));
        return;
    };
    let spec = &TABLE[i];
    if !spec.arity_ok(args.len()) {
        ctx.ws.cmds[i].rejected.add(1);
        c.err(&arity_error(spec.name));
        return;
    }
    // Redis's protected commands: refused before authentication.
    if spec.flags.contains(Flags::PROTECTED)
        && !ctx.sh.cfg().enable_debug_command.allows(c.meta.is_local())
    {
        ctx.ws.cmds[i].rejected.add(1);
        c.err("ERR DEBUG command not allowed. If the enable-debug-command option is set to \"local\", you can run it from a local connection, otherwise you need to set this option in the configuration file, and then restart the server.");
        return;
    }
    if !c.authed && !spec.flags.contains(Flags::NO_AUTH) {
        ctx.ws.cmds[i].rejected.add(1);
        c.err("NOAUTH Authentication required.");
        return;
    }
    c.meta.last_cmd.store(i as u64 + 1, Ordering::Relaxed);
    c.meta
        .last_ms
        .store(t0.millis_since(c.meta.created), Ordering::Relaxed);
    let r = (spec.run)(ctx, c, args);
    let failed = r.is_err();
    if let Err(e) = r {
        c.err(&e);
    }
    let t1 = Stamp::now();
    *clock = t1;
    ctx.ws.record(i, t1.micros_since(t0), failed);
}

/// Parses an integer argument (Redis's `string2ll`).
pub fn int_arg(a: &[u8]) -> Result<i64, String> {
    engine::parse_i64(a).ok_or_else(|| "ERR value is not an integer or out of range".to_string())
}

pub fn syntax_error() -> String {
    "ERR syntax error".into()
}

pub fn eq(a: &[u8], b: &str) -> bool {
    a.eq_ignore_ascii_case(b.as_bytes())
}

pub fn wrongtype() -> String {
    "WRONGTYPE Operation against a key holding the wrong kind of value".into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_command_text_matches_redis() {
        let a: Vec<Vec<u8>> = vec![b"foo".to_vec(), b"a".to_vec(), b"b c".to_vec()];
        assert_eq!(
            unknown_command(&a),
            "ERR unknown command 'foo', with args beginning with: 'a' 'b c' "
        );
        let a: Vec<Vec<u8>> = vec![b"foo".to_vec()];
        assert_eq!(
            unknown_command(&a),
            "ERR unknown command 'foo', with args beginning with: "
        );
        let a: Vec<Vec<u8>> = vec![
            b"get\0x".to_vec(),
            b"ab\0cd".to_vec(),
            vec![b'a'; 200],
            b"z".to_vec(),
        ];
        assert_eq!(
            unknown_command(&a),
            format!(
                "ERR unknown command 'get', with args beginning with: 'ab' '{}' ",
                "a".repeat(123)
            )
        );
    }
}
