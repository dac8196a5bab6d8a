//! The command table and dispatch. Every reply and error text follows the Redis
//! command reference (and Redis 7's source where the reference is silent).

mod admin;
mod conn;
mod keys;
mod strings;

pub use conn::REDIS_COMPAT_VERSION;

use crate::clock::Stamp;
use crate::keyspace::{Keyspace, KsError};
use crate::server::{Client, Shared};
use crate::stats::WorkerStats;
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::OnceLock;

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

type Handler = fn(&mut Ctx, &mut Client, &[Vec<u8>]) -> R;

/// One command: Redis's metadata (COMMAND INFO / DOCS) and its handler.
pub struct Spec {
    pub name: &'static str,
    /// Redis arity: N = exactly N arguments with the name, -N = at least N.
    pub arity: i32,
    pub flags: &'static [&'static str],
    pub first: i32,
    pub last: i32,
    pub step: i32,
    pub group: &'static str,
    pub since: &'static str,
    pub summary: &'static str,
    pub run: Handler,
}

impl Spec {
    fn no_auth(&self) -> bool {
        self.flags.contains(&"no_auth")
    }
}

macro_rules! spec {
    ($name:literal, $arity:expr, [$($f:literal),*], $first:expr, $last:expr, $step:expr, $group:literal, $since:literal, $summary:literal, $run:path) => {
        Spec {
            name: $name,
            arity: $arity,
            flags: &[$($f),*],
            first: $first,
            last: $last,
            step: $step,
            group: $group,
            since: $since,
            summary: $summary,
            run: $run,
        }
    };
}

/// Every command Ember serves.
pub static TABLE: &[Spec] = &[
    // connection
    spec!("ping", -1, ["fast", "stale"], 0, 0, 0, "connection", "1.0.0", "Returns the server's liveliness response.", conn::ping),
    spec!("echo", 2, ["fast", "stale"], 0, 0, 0, "connection", "1.0.0", "Returns the given string.", conn::echo),
    spec!("quit", -1, ["fast", "stale", "no_auth"], 0, 0, 0, "connection", "1.0.0", "Closes the connection.", conn::quit),
    spec!("select", 2, ["fast", "stale", "loading"], 0, 0, 0, "connection", "1.0.0", "Changes the selected database.", conn::select),
    spec!("hello", -1, ["fast", "stale", "no_auth", "noscript", "loading"], 0, 0, 0, "connection", "6.0.0", "Handshakes with the Redis server.", conn::hello),
    spec!("auth", -2, ["fast", "stale", "no_auth", "noscript", "loading"], 0, 0, 0, "connection", "1.0.0", "Authenticates the connection.", conn::auth),
    spec!("client", -2, ["stale", "noscript", "loading"], 0, 0, 0, "connection", "2.4.0", "A container for client connection commands.", conn::client),
    spec!("reset", 1, ["fast", "stale", "no_auth", "noscript", "loading"], 0, 0, 0, "connection", "6.2.0", "Resets the connection.", conn::reset),
    // strings
    spec!("get", 2, ["readonly", "fast"], 1, 1, 1, "string", "1.0.0", "Returns the string value of a key.", strings::get),
    spec!("set", -3, ["write", "denyoom"], 1, 1, 1, "string", "1.0.0", "Sets the string value of a key, ignoring its type. The key is created if it doesn't exist.", strings::set),
    spec!("setnx", 3, ["write", "denyoom", "fast"], 1, 1, 1, "string", "1.0.0", "Set the string value of a key only when the key doesn't exist.", strings::setnx),
    spec!("setex", 4, ["write", "denyoom"], 1, 1, 1, "string", "2.0.0", "Sets the string value and expiration time of a key. Creates the key if it doesn't exist.", strings::setex),
    spec!("psetex", 4, ["write", "denyoom"], 1, 1, 1, "string", "2.6.0", "Sets both string value and expiration time in milliseconds of a key. The key is created if it doesn't exist.", strings::psetex),
    spec!("getset", 3, ["write", "denyoom", "fast"], 1, 1, 1, "string", "1.0.0", "Returns the previous string value of a key after setting it to a new value.", strings::getset),
    spec!("getdel", 2, ["write", "fast"], 1, 1, 1, "string", "6.2.0", "Returns the string value of a key after deleting the key.", strings::getdel),
    spec!("getex", -2, ["write", "fast"], 1, 1, 1, "string", "6.2.0", "Returns the string value of a key after setting its expiration time.", strings::getex),
    spec!("mget", -2, ["readonly", "fast"], 1, -1, 1, "string", "1.0.0", "Atomically returns the string values of one or more keys.", strings::mget),
    spec!("mset", -3, ["write", "denyoom"], 1, -1, 2, "string", "1.0.1", "Atomically creates or modifies the string values of one or more keys.", strings::mset),
    spec!("msetnx", -3, ["write", "denyoom"], 1, -1, 2, "string", "1.0.1", "Atomically modifies the string values of one or more keys only when all keys don't exist.", strings::msetnx),
    spec!("append", 3, ["write", "denyoom", "fast"], 1, 1, 1, "string", "2.0.0", "Appends a string to the value of a key. Creates the key if it doesn't exist.", strings::append),
    spec!("strlen", 2, ["readonly", "fast"], 1, 1, 1, "string", "2.2.0", "Returns the length of a string value.", strings::strlen),
    spec!("getrange", 4, ["readonly"], 1, 1, 1, "string", "2.4.0", "Returns a substring of the string stored at a key.", strings::getrange),
    spec!("substr", 4, ["readonly"], 1, 1, 1, "string", "1.0.0", "Returns a substring from a string value.", strings::getrange),
    spec!("setrange", 4, ["write", "denyoom"], 1, 1, 1, "string", "2.2.0", "Overwrites a part of a string value with another by an offset. Creates the key if it doesn't exist.", strings::setrange),
    spec!("incr", 2, ["write", "denyoom", "fast"], 1, 1, 1, "string", "1.0.0", "Increments the integer value of a key by one. Uses 0 as initial value if the key doesn't exist.", strings::incr),
    spec!("decr", 2, ["write", "denyoom", "fast"], 1, 1, 1, "string", "1.0.0", "Decrements the integer value of a key by one. Uses 0 as initial value if the key doesn't exist.", strings::decr),
    spec!("incrby", 3, ["write", "denyoom", "fast"], 1, 1, 1, "string", "1.0.0", "Increments the integer value of a key by a number. Uses 0 as initial value if the key doesn't exist.", strings::incrby),
    spec!("decrby", 3, ["write", "denyoom", "fast"], 1, 1, 1, "string", "1.0.0", "Decrements a number from the integer value of a key. Uses 0 as initial value if the key doesn't exist.", strings::decrby),
    spec!("incrbyfloat", 3, ["write", "denyoom", "fast"], 1, 1, 1, "string", "2.6.0", "Increment the floating point value of a key by a number. Uses 0 as initial value if the key doesn't exist.", strings::incrbyfloat),
    // keyspace
    spec!("del", -2, ["write"], 1, -1, 1, "generic", "1.0.0", "Deletes one or more keys.", keys::del),
    spec!("unlink", -2, ["write", "fast"], 1, -1, 1, "generic", "4.0.0", "Asynchronously deletes one or more keys.", keys::del),
    spec!("exists", -2, ["readonly", "fast"], 1, -1, 1, "generic", "1.0.0", "Determines whether one or more keys exist.", keys::exists),
    spec!("type", 2, ["readonly", "fast"], 1, 1, 1, "generic", "1.0.0", "Determines the type of value stored at a key.", keys::type_),
    spec!("keys", 2, ["readonly"], 0, 0, 0, "generic", "1.0.0", "Returns all key names that match a pattern.", keys::keys),
    spec!("scan", -2, ["readonly"], 0, 0, 0, "generic", "2.8.0", "Iterates over the key names in the database.", keys::scan),
    spec!("rename", 3, ["write"], 1, 2, 1, "generic", "1.0.0", "Renames a key and overwrites the destination.", keys::rename),
    spec!("renamenx", 3, ["write", "fast"], 1, 2, 1, "generic", "1.0.0", "Renames a key only when the target key name doesn't exist.", keys::renamenx),
    spec!("dbsize", 1, ["readonly", "fast"], 0, 0, 0, "server", "1.0.0", "Returns the number of keys in the database.", keys::dbsize),
    spec!("flushdb", -1, ["write"], 0, 0, 0, "server", "1.0.0", "Remove all keys from the current database.", keys::flushdb),
    spec!("flushall", -1, ["write"], 0, 0, 0, "server", "1.0.0", "Removes all keys from all databases.", keys::flushall),
    spec!("randomkey", 1, ["readonly"], 0, 0, 0, "generic", "1.0.0", "Returns a random key name from the database.", keys::randomkey),
    spec!("expire", -3, ["write", "fast"], 1, 1, 1, "generic", "1.0.0", "Sets the expiration time of a key in seconds.", keys::expire),
    spec!("pexpire", -3, ["write", "fast"], 1, 1, 1, "generic", "2.6.0", "Sets the expiration time of a key in milliseconds.", keys::pexpire),
    spec!("expireat", -3, ["write", "fast"], 1, 1, 1, "generic", "1.2.0", "Sets the expiration time of a key to a Unix timestamp.", keys::expireat),
    spec!("pexpireat", -3, ["write", "fast"], 1, 1, 1, "generic", "2.6.0", "Sets the expiration time of a key to a Unix milliseconds timestamp.", keys::pexpireat),
    spec!("ttl", 2, ["readonly", "fast"], 1, 1, 1, "generic", "1.0.0", "Returns the expiration time in seconds of a key.", keys::ttl),
    spec!("pttl", 2, ["readonly", "fast"], 1, 1, 1, "generic", "2.6.0", "Returns the expiration time in milliseconds of a key.", keys::pttl),
    spec!("expiretime", 2, ["readonly", "fast"], 1, 1, 1, "generic", "7.0.0", "Returns the expiration time of a key as a Unix timestamp.", keys::expiretime),
    spec!("pexpiretime", 2, ["readonly", "fast"], 1, 1, 1, "generic", "7.0.0", "Returns the expiration time of a key as a Unix milliseconds timestamp.", keys::pexpiretime),
    spec!("persist", 2, ["write", "fast"], 1, 1, 1, "generic", "2.2.0", "Removes the expiration time of a key.", keys::persist),
    spec!("touch", -2, ["readonly", "fast"], 1, -1, 1, "generic", "3.2.1", "Returns the number of existing keys out of those specified after updating the time they were last accessed.", keys::touch),
    spec!("object", -2, [], 0, 0, 0, "generic", "2.2.3", "A container for object introspection commands.", keys::object),
    // server
    spec!("info", -1, ["loading", "stale"], 0, 0, 0, "server", "1.0.0", "Returns information and statistics about the server.", admin::info),
    spec!("config", -2, [], 0, 0, 0, "server", "2.0.0", "A container for server configuration commands.", admin::config),
    spec!("command", -1, ["loading", "stale"], 0, 0, 0, "server", "2.8.13", "Returns detailed information about all commands.", admin::command),
    spec!("time", 1, ["loading", "stale", "fast"], 0, 0, 0, "server", "2.6.0", "Returns the server time.", admin::time),
    spec!("lastsave", 1, ["loading", "stale", "fast"], 0, 0, 0, "server", "1.0.0", "Returns the Unix timestamp of the last successful save to disk.", admin::lastsave),
    spec!("save", 1, ["admin", "noscript"], 0, 0, 0, "server", "1.0.0", "Synchronously saves the database(s) to disk.", admin::save),
    spec!("bgsave", -1, ["admin", "noscript"], 0, 0, 0, "server", "1.0.0", "Asynchronously saves the database(s) to disk.", admin::bgsave),
    spec!("debug", -2, ["admin", "noscript", "loading", "stale"], 0, 0, 0, "server", "1.0.0", "A container for debugging commands.", admin::debug),
    spec!("shutdown", -1, ["admin", "noscript", "loading", "stale"], 0, 0, 0, "server", "1.0.0", "Synchronously saves the database(s) to disk and shuts down the Redis server.", admin::shutdown),
];

/// FNV-1a: command names are short and not attacker-chosen keys of a growing
/// map (the table is fixed), so a keyed SipHash buys nothing here.
#[derive(Default)]
struct Fnv(u64);

impl std::hash::Hasher for Fnv {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        let mut h = if self.0 == 0 {
            0xcbf2_9ce4_8422_2325
        } else {
            self.0
        };
        for &b in bytes {
            h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
        self.0 = h;
    }
}

type NameMap = HashMap<&'static str, usize, std::hash::BuildHasherDefault<Fnv>>;

fn lookup_map() -> &'static NameMap {
    static MAP: OnceLock<NameMap> = OnceLock::new();
    MAP.get_or_init(|| TABLE.iter().enumerate().map(|(i, s)| (s.name, i)).collect())
}

/// The table index of a command name (any case).
pub fn lookup(name: &[u8]) -> Option<usize> {
    if name.len() > 16 {
        return None;
    }
    let mut low = [0u8; 16];
    let low = &mut low[..name.len()];
    low.copy_from_slice(name);
    low.make_ascii_lowercase();
    let s = std::str::from_utf8(low).ok()?;
    lookup_map().get(s).copied()
}

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
    let n = args.len() as i32;
    if (spec.arity > 0 && n != spec.arity) || (spec.arity < 0 && n < -spec.arity) {
        ctx.ws.cmds[i].rejected.add(1);
        c.err(&arity_error(spec.name));
        return;
    }
    // Redis's protected commands: refused before authentication.
    if spec.name == "debug" && !ctx.sh.cfg().enable_debug_command.allows(c.meta.is_local()) {
        ctx.ws.cmds[i].rejected.add(1);
        c.err("ERR DEBUG command not allowed. If the enable-debug-command option is set to \"local\", you can run it from a local connection, otherwise you need to set this option in the configuration file, and then restart the server.");
        return;
    }
    if !c.authed && !spec.no_auth() {
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
    fn table_is_consistent() {
        let mut seen = std::collections::HashSet::new();
        for s in TABLE {
            assert!(seen.insert(s.name), "duplicate {}", s.name);
            assert_eq!(s.name, s.name.to_ascii_lowercase());
            assert!(s.arity != 0);
            assert_eq!(
                lookup(s.name.to_uppercase().as_bytes()),
                Some(lookup(s.name.as_bytes()).unwrap())
            );
        }
        assert_eq!(lookup(b"nosuchcommand"), None);
        assert_eq!(lookup(&[0xff; 4]), None);
    }

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
