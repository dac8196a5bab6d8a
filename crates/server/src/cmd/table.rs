//! The command table: every command Ember serves, with the metadata Redis
//! keeps for it (arity, flags, ACL categories, key positions, docs) and its
//! handler. `COMMAND`, dispatch, the statistics and (later) ACL, MULTI and
//! replication all read it; a new command is a handler and one row here.

use super::{
    acl, admin, bits, conn, dump, geo, hashes, hll, keys, lcs, lists, multi, pubsub, scripting,
    sets, sort, streams, strings, zsets, Handler,
};
use std::collections::HashMap;
use std::sync::OnceLock;

/// A set of bits named by a table of names (flags and ACL categories).
macro_rules! bitset {
    ($(#[$m:meta])* $ty:ident { $($(#[$fm:meta])* $name:ident = $bit:literal, $text:literal;)* }) => {
        $(#[$m])*
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
        pub struct $ty(u32);

        impl $ty {
            $($(#[$fm])* pub const $name: $ty = $ty(1 << $bit);)*
            /// Every member and its name, in Redis's order.
            pub const ALL: &'static [($ty, &'static str)] = &[$(($ty::$name, $text)),*];

            pub const fn empty() -> $ty {
                $ty(0)
            }
            pub const fn with(self, other: $ty) -> $ty {
                $ty(self.0 | other.0)
            }
            pub const fn contains(self, other: $ty) -> bool {
                self.0 & other.0 == other.0
            }
            /// The names of the members, in Redis's order.
            pub fn names(self) -> impl Iterator<Item = &'static str> {
                Self::ALL
                    .iter()
                    .filter(move |(m, _)| self.contains(*m))
                    .map(|(_, n)| *n)
            }
            /// The member named `name` (any case).
            pub fn by_name(name: &str) -> Option<$ty> {
                Self::ALL
                    .iter()
                    .find(|(_, n)| n.eq_ignore_ascii_case(name))
                    .map(|(m, _)| *m)
            }
        }
    };
}

bitset! {
    /// Command flags, as `COMMAND INFO` names them (Redis 7.0's set and order).
    Flags {
        /// May modify the keyspace.
        WRITE = 0, "write";
        /// Only reads the keyspace.
        READONLY = 1, "readonly";
        /// May grow memory use: refused when the heap is full.
        DENYOOM = 2, "denyoom";
        /// An administrative command (also `@admin` and `@dangerous`).
        ADMIN = 3, "admin";
        PUBSUB = 4, "pubsub";
        /// Not allowed inside a script.
        NOSCRIPT = 5, "noscript";
        /// May block the client.
        BLOCKING = 6, "blocking";
        /// Allowed while the server loads its data.
        LOADING = 7, "loading";
        /// Allowed on a replica with stale data.
        STALE = 8, "stale";
        SKIP_MONITOR = 9, "skip_monitor";
        SKIP_SLOWLOG = 10, "skip_slowlog";
        /// Constant or logarithmic time (else `@slow`).
        FAST = 11, "fast";
        /// Allowed before authentication.
        NO_AUTH = 12, "no_auth";
        /// May replicate although it is not a write (PUBLISH, EVAL...).
        MAY_REPLICATE = 13, "may_replicate";
        /// Refused unless `enable-*-command` allows it (DEBUG).
        PROTECTED = 14, "protected";
        /// Not allowed inside MULTI.
        NO_MULTI = 15, "no_multi";
        /// Key positions depend on the arguments (beyond first/last/step).
        MOVABLEKEYS = 16, "movablekeys";
        /// Allowed while a script or function runs too long.
        ALLOW_BUSY = 17, "allow_busy";
    }
}

bitset! {
    /// ACL categories (`ACL CAT`), in Redis's order.
    Cats {
        KEYSPACE = 0, "keyspace";
        READ = 1, "read";
        WRITE = 2, "write";
        SET = 3, "set";
        SORTEDSET = 4, "sortedset";
        LIST = 5, "list";
        HASH = 6, "hash";
        STRING = 7, "string";
        BITMAP = 8, "bitmap";
        HYPERLOGLOG = 9, "hyperloglog";
        GEO = 10, "geo";
        STREAM = 11, "stream";
        PUBSUB = 12, "pubsub";
        ADMIN = 13, "admin";
        FAST = 14, "fast";
        SLOW = 15, "slow";
        BLOCKING = 16, "blocking";
        DANGEROUS = 17, "dangerous";
        CONNECTION = 18, "connection";
        TRANSACTION = 19, "transaction";
        SCRIPTING = 20, "scripting";
    }
}

/// Where a command's keys are among its arguments (the name is argument 0),
/// as `COMMAND INFO` reports them: from `first` to `last` (negative: counted
/// from the end, -1 the last argument) every `step`; `first == 0` means no
/// keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KeyPos {
    pub first: i32,
    pub last: i32,
    pub step: i32,
}

/// The key indexes after a `numkeys` argument at `at`: that many keys after
/// it (as many as there are when it claims more).
fn numkeys_at(args: &[Vec<u8>], at: usize) -> Vec<usize> {
    let n = args
        .get(at)
        .and_then(|a| proto::int::parse_i64(a))
        .filter(|&n| n > 0)
        .unwrap_or(0) as usize;
    (at + 1..args.len()).take(n).collect()
}

/// The key indexes of a request of a MOVABLEKEYS command, whose keys its
/// arguments locate: `numkeys` at index 1 and that many keys after it
/// (SINTERCARD, LMPOP, ZMPOP, ZUNION...; at index 2 for BLMPOP and BZMPOP,
/// after their timeout), or a destination at 1 and `numkeys` at 2
/// (ZUNIONSTORE...). Empty for other commands and for a `numkeys` that is
/// not a positive number (the command itself then refuses the request).
pub fn movable_keys(name: &str, args: &[Vec<u8>]) -> Vec<usize> {
    match name {
        "sintercard" | "lmpop" | "zmpop" | "zunion" | "zinter" | "zdiff" | "zintercard" => {
            numkeys_at(args, 1)
        }
        "blmpop" | "bzmpop" => numkeys_at(args, 2),
        "eval" | "evalsha" | "eval_ro" | "evalsha_ro" | "fcall" | "fcall_ro" => numkeys_at(args, 2),
        "xread" | "xreadgroup" => streams_keys(args),
        "zunionstore" | "zinterstore" | "zdiffstore" => {
            let mut keys = vec![1];
            keys.extend(numkeys_at(args, 2));
            keys
        }
        "georadius" | "georadiusbymember" => {
            // The source, then the keys after the first STORE and the first
            // STOREDIST from the options on (Redis 7.0's key specs, which
            // COMMAND GETKEYS and ACL read for these commands).
            let from = if name == "georadius" { 6 } else { 5 };
            let mut keys = vec![1];
            for word in [&b"store"[..], b"storedist"] {
                let end = args.len().saturating_sub(1);
                if let Some(i) = (from..end).find(|&i| args[i].eq_ignore_ascii_case(word)) {
                    keys.push(i + 1);
                }
            }
            keys
        }
        "sort" => {
            // The source, then the last STORE key, skipping the arguments
            // of LIMIT, GET and BY (Redis's `sortGetKeys`).
            let mut keys = vec![1];
            let mut store = None;
            let mut i = 2;
            while i < args.len() {
                let a = &args[i];
                if a.eq_ignore_ascii_case(b"limit") {
                    i += 2;
                } else if a.eq_ignore_ascii_case(b"store") && i + 1 < args.len() {
                    store = Some(i + 1);
                } else if a.eq_ignore_ascii_case(b"get") || a.eq_ignore_ascii_case(b"by") {
                    i += 1;
                }
                i += 1;
            }
            keys.extend(store);
            keys
        }
        _ => Vec::new(),
    }
}

/// XREAD's and XREADGROUP's keys: the first half of the arguments after
/// STREAMS (the first STREAMS after the options, as the command parses it).
fn streams_keys(args: &[Vec<u8>]) -> Vec<usize> {
    let Some(at) = args
        .iter()
        .skip(1)
        .position(|a| a.eq_ignore_ascii_case(b"streams"))
        .map(|p| p + 2)
    else {
        return Vec::new();
    };
    let rest = args.len() - at;
    if !rest.is_multiple_of(2) {
        return Vec::new();
    }
    (at..at + rest / 2).collect()
}

impl KeyPos {
    /// The indexes of the keys in a request of `n` arguments (arity already
    /// checked).
    pub fn indexes(&self, n: usize) -> impl Iterator<Item = usize> {
        let n = n as i32;
        let last = if self.last < 0 {
            n + self.last
        } else {
            self.last
        };
        let (first, step) = (self.first, self.step.max(1));
        (0..)
            .map(move |i| first + i * step)
            .take_while(move |&k| first > 0 && k <= last && k < n)
            .map(|k| k as usize)
    }
}

/// One command: Redis's metadata (COMMAND INFO / DOCS) and its handler.
pub struct Spec {
    pub name: &'static str,
    /// Redis arity: N = exactly N arguments with the name, -N = at least N.
    pub arity: i32,
    pub flags: Flags,
    /// The categories Redis lists for the command beyond those its flags
    /// imply (see [`Spec::categories`]).
    pub acl: Cats,
    pub keys: KeyPos,
    pub group: &'static str,
    pub since: &'static str,
    pub summary: &'static str,
    pub run: Handler,
}

impl Spec {
    /// Whether `n` arguments (the name included) satisfy the arity.
    pub fn arity_ok(&self, n: usize) -> bool {
        arity_ok(self.arity, n)
    }

    /// The command's ACL categories: its own plus those Redis derives from
    /// its flags (`write` is `@write`, `readonly` `@read`, `admin` `@admin`
    /// and `@dangerous`, `pubsub` `@pubsub`, `blocking` `@blocking`, `fast`
    /// `@fast` and every other command `@slow`).
    pub fn categories(&self) -> Cats {
        categories(self.flags, self.acl)
    }
}

/// Whether `n` arguments satisfy Redis arity `arity`: exactly `arity`, or
/// at least `-arity` when it is negative.
pub fn arity_ok(arity: i32, n: usize) -> bool {
    let n = i32::try_from(n).unwrap_or(i32::MAX);
    if arity > 0 {
        n == arity
    } else {
        n >= -arity
    }
}

/// The ACL categories of a command or subcommand with flags `f` and own
/// categories `own` (see [`Spec::categories`]).
pub fn categories(f: Flags, own: Cats) -> Cats {
    let mut c = own;
    // Redis gives @read to read-only commands outside @scripting only.
    let read = if own.contains(Cats::SCRIPTING) {
        Cats::empty()
    } else {
        Cats::READ
    };
    for (flag, cats) in [
        (Flags::WRITE, Cats::WRITE),
        (Flags::READONLY, read),
        (Flags::ADMIN, Cats::ADMIN.with(Cats::DANGEROUS)),
        (Flags::PUBSUB, Cats::PUBSUB),
        (Flags::BLOCKING, Cats::BLOCKING),
    ] {
        if f.contains(flag) {
            c = c.with(cats);
        }
    }
    c.with(if f.contains(Flags::FAST) {
        Cats::FAST
    } else {
        Cats::SLOW
    })
}

macro_rules! spec {
    ($name:literal, $arity:expr, [$($f:ident),*], [$($c:ident),*], ($first:expr, $last:expr, $step:expr), $group:literal, $since:literal, $summary:literal, $run:path) => {
        Spec {
            name: $name,
            arity: $arity,
            flags: Flags::empty()$(.with(Flags::$f))*,
            acl: Cats::empty()$(.with(Cats::$c))*,
            keys: KeyPos { first: $first, last: $last, step: $step },
            group: $group,
            since: $since,
            summary: $summary,
            run: $run,
        }
    };
}

/// Every command Ember serves.
#[rustfmt::skip]
pub static TABLE: &[Spec] = &[
    // connection
    spec!("ping", -1, [FAST, STALE], [CONNECTION], (0, 0, 0), "connection", "1.0.0", "Returns the server's liveliness response.", conn::ping),
    spec!("echo", 2, [FAST, STALE], [CONNECTION], (0, 0, 0), "connection", "1.0.0", "Returns the given string.", conn::echo),
    spec!("quit", -1, [FAST, STALE, NO_AUTH, NOSCRIPT, LOADING, ALLOW_BUSY], [CONNECTION], (0, 0, 0), "connection", "1.0.0", "Closes the connection.", conn::quit),
    spec!("select", 2, [FAST, STALE, LOADING], [CONNECTION], (0, 0, 0), "connection", "1.0.0", "Changes the selected database.", conn::select),
    spec!("hello", -1, [FAST, STALE, NO_AUTH, NOSCRIPT, LOADING, ALLOW_BUSY], [CONNECTION], (0, 0, 0), "connection", "6.0.0", "Handshakes with the Redis server.", conn::hello),
    spec!("auth", -2, [FAST, STALE, NO_AUTH, NOSCRIPT, LOADING, ALLOW_BUSY], [CONNECTION], (0, 0, 0), "connection", "1.0.0", "Authenticates the connection.", conn::auth),
    spec!("client", -2, [STALE, NOSCRIPT, LOADING], [], (0, 0, 0), "connection", "2.4.0", "A container for client connection commands.", conn::client),
    spec!("reset", 1, [FAST, STALE, NO_AUTH, NOSCRIPT, LOADING, ALLOW_BUSY], [CONNECTION], (0, 0, 0), "connection", "6.2.0", "Resets the connection.", conn::reset),
    // transactions
    spec!("multi", 1, [NOSCRIPT, LOADING, STALE, FAST, ALLOW_BUSY], [TRANSACTION], (0, 0, 0), "transactions", "1.2.0", "Starts a transaction.", multi::multi),
    spec!("exec", 1, [NOSCRIPT, LOADING, STALE, SKIP_SLOWLOG], [TRANSACTION], (0, 0, 0), "transactions", "1.2.0", "Executes all commands in a transaction.", multi::exec),
    spec!("discard", 1, [NOSCRIPT, LOADING, STALE, FAST, ALLOW_BUSY], [TRANSACTION], (0, 0, 0), "transactions", "2.0.0", "Discards a transaction.", multi::discard),
    spec!("watch", -2, [NOSCRIPT, LOADING, STALE, FAST, ALLOW_BUSY], [TRANSACTION], (1, -1, 1), "transactions", "2.2.0", "Monitors changes to keys to determine the execution of a transaction.", multi::watch),
    spec!("unwatch", 1, [NOSCRIPT, LOADING, STALE, FAST, ALLOW_BUSY], [TRANSACTION], (0, 0, 0), "transactions", "2.2.0", "Forgets about watched keys of a transaction.", multi::unwatch),
    // strings
    spec!("get", 2, [READONLY, FAST], [STRING], (1, 1, 1), "string", "1.0.0", "Returns the string value of a key.", strings::get),
    spec!("set", -3, [WRITE, DENYOOM], [STRING], (1, 1, 1), "string", "1.0.0", "Sets the string value of a key, ignoring its type. The key is created if it doesn't exist.", strings::set),
    spec!("setnx", 3, [WRITE, DENYOOM, FAST], [STRING], (1, 1, 1), "string", "1.0.0", "Set the string value of a key only when the key doesn't exist.", strings::setnx),
    spec!("setex", 4, [WRITE, DENYOOM], [STRING], (1, 1, 1), "string", "2.0.0", "Sets the string value and expiration time of a key. Creates the key if it doesn't exist.", strings::setex),
    spec!("psetex", 4, [WRITE, DENYOOM], [STRING], (1, 1, 1), "string", "2.6.0", "Sets both string value and expiration time in milliseconds of a key. The key is created if it doesn't exist.", strings::psetex),
    spec!("getset", 3, [WRITE, DENYOOM, FAST], [STRING], (1, 1, 1), "string", "1.0.0", "Returns the previous string value of a key after setting it to a new value.", strings::getset),
    spec!("getdel", 2, [WRITE, FAST], [STRING], (1, 1, 1), "string", "6.2.0", "Returns the string value of a key after deleting the key.", strings::getdel),
    spec!("getex", -2, [WRITE, FAST], [STRING], (1, 1, 1), "string", "6.2.0", "Returns the string value of a key after setting its expiration time.", strings::getex),
    spec!("mget", -2, [READONLY, FAST], [STRING], (1, -1, 1), "string", "1.0.0", "Atomically returns the string values of one or more keys.", strings::mget),
    spec!("mset", -3, [WRITE, DENYOOM], [STRING], (1, -1, 2), "string", "1.0.1", "Atomically creates or modifies the string values of one or more keys.", strings::mset),
    spec!("msetnx", -3, [WRITE, DENYOOM], [STRING], (1, -1, 2), "string", "1.0.1", "Atomically modifies the string values of one or more keys only when all keys don't exist.", strings::msetnx),
    spec!("append", 3, [WRITE, DENYOOM, FAST], [STRING], (1, 1, 1), "string", "2.0.0", "Appends a string to the value of a key. Creates the key if it doesn't exist.", strings::append),
    spec!("strlen", 2, [READONLY, FAST], [STRING], (1, 1, 1), "string", "2.2.0", "Returns the length of a string value.", strings::strlen),
    spec!("getrange", 4, [READONLY], [STRING], (1, 1, 1), "string", "2.4.0", "Returns a substring of the string stored at a key.", strings::getrange),
    spec!("substr", 4, [READONLY], [STRING], (1, 1, 1), "string", "1.0.0", "Returns a substring from a string value.", strings::getrange),
    spec!("setrange", 4, [WRITE, DENYOOM], [STRING], (1, 1, 1), "string", "2.2.0", "Overwrites a part of a string value with another by an offset. Creates the key if it doesn't exist.", strings::setrange),
    spec!("incr", 2, [WRITE, DENYOOM, FAST], [STRING], (1, 1, 1), "string", "1.0.0", "Increments the integer value of a key by one. Uses 0 as initial value if the key doesn't exist.", strings::incr),
    spec!("decr", 2, [WRITE, DENYOOM, FAST], [STRING], (1, 1, 1), "string", "1.0.0", "Decrements the integer value of a key by one. Uses 0 as initial value if the key doesn't exist.", strings::decr),
    spec!("incrby", 3, [WRITE, DENYOOM, FAST], [STRING], (1, 1, 1), "string", "1.0.0", "Increments the integer value of a key by a number. Uses 0 as initial value if the key doesn't exist.", strings::incrby),
    spec!("decrby", 3, [WRITE, DENYOOM, FAST], [STRING], (1, 1, 1), "string", "1.0.0", "Decrements a number from the integer value of a key. Uses 0 as initial value if the key doesn't exist.", strings::decrby),
    spec!("incrbyfloat", 3, [WRITE, DENYOOM, FAST], [STRING], (1, 1, 1), "string", "2.6.0", "Increment the floating point value of a key by a number. Uses 0 as initial value if the key doesn't exist.", strings::incrbyfloat),
    spec!("lcs", -3, [READONLY], [STRING], (1, 2, 1), "string", "7.0.0", "Finds the longest common substring.", lcs::lcs),
    // bitmaps
    spec!("setbit", 4, [WRITE, DENYOOM], [BITMAP], (1, 1, 1), "bitmap", "2.2.0", "Sets or clears the bit at offset of the string value. Creates the key if it doesn't exist.", bits::setbit),
    spec!("getbit", 3, [READONLY, FAST], [BITMAP], (1, 1, 1), "bitmap", "2.2.0", "Returns a bit value by offset.", bits::getbit),
    spec!("bitcount", -2, [READONLY], [BITMAP], (1, 1, 1), "bitmap", "2.6.0", "Counts the number of set bits (population counting) in a string.", bits::bitcount),
    spec!("bitpos", -3, [READONLY], [BITMAP], (1, 1, 1), "bitmap", "2.8.7", "Finds the first set (1) or clear (0) bit in a string.", bits::bitpos),
    spec!("bitop", -4, [WRITE, DENYOOM], [BITMAP], (2, -1, 1), "bitmap", "2.6.0", "Performs bitwise operations on multiple strings, and stores the result.", bits::bitop),
    spec!("bitfield", -2, [WRITE, DENYOOM], [BITMAP], (1, 1, 1), "bitmap", "3.2.0", "Performs arbitrary bitfield integer operations on strings.", bits::bitfield),
    spec!("bitfield_ro", -2, [READONLY, FAST], [BITMAP], (1, 1, 1), "bitmap", "6.0.0", "Performs arbitrary read-only bitfield integer operations on strings.", bits::bitfield_ro),
    // hyperloglog
    spec!("pfadd", -2, [WRITE, DENYOOM, FAST], [HYPERLOGLOG], (1, 1, 1), "hyperloglog", "2.8.9", "Adds elements to a HyperLogLog key. Creates the key if it doesn't exist.", hll::pfadd),
    spec!("pfcount", -2, [READONLY, MAY_REPLICATE], [HYPERLOGLOG], (1, -1, 1), "hyperloglog", "2.8.9", "Returns the approximated cardinality of the set(s) observed by the HyperLogLog key(s).", hll::pfcount),
    spec!("pfmerge", -2, [WRITE, DENYOOM], [HYPERLOGLOG], (1, -1, 1), "hyperloglog", "2.8.9", "Merges one or more HyperLogLog values into a single key.", hll::pfmerge),
    spec!("pfdebug", 3, [WRITE, DENYOOM, ADMIN], [HYPERLOGLOG], (2, 2, 1), "hyperloglog", "2.8.9", "Internal commands for debugging HyperLogLog values.", hll::pfdebug),
    spec!("pfselftest", 1, [ADMIN], [HYPERLOGLOG], (0, 0, 0), "hyperloglog", "2.8.9", "An internal command for testing HyperLogLog values.", hll::pfselftest),
    // lists
    spec!("lpush", -3, [WRITE, DENYOOM, FAST], [LIST], (1, 1, 1), "list", "1.0.0", "Prepends one or more elements to a list. Creates the key if it doesn't exist.", lists::lpush),
    spec!("rpush", -3, [WRITE, DENYOOM, FAST], [LIST], (1, 1, 1), "list", "1.0.0", "Appends one or more elements to a list. Creates the key if it doesn't exist.", lists::rpush),
    spec!("lpushx", -3, [WRITE, DENYOOM, FAST], [LIST], (1, 1, 1), "list", "2.2.0", "Prepends one or more elements to a list only when the list exists.", lists::lpushx),
    spec!("rpushx", -3, [WRITE, DENYOOM, FAST], [LIST], (1, 1, 1), "list", "2.2.0", "Appends an element to a list only when the list exists.", lists::rpushx),
    spec!("lpop", -2, [WRITE, FAST], [LIST], (1, 1, 1), "list", "1.0.0", "Returns the first elements in a list after removing it. Deletes the list if the last element was popped.", lists::lpop),
    spec!("rpop", -2, [WRITE, FAST], [LIST], (1, 1, 1), "list", "1.0.0", "Returns and removes the last elements of a list. Deletes the list if the last element was popped.", lists::rpop),
    spec!("llen", 2, [READONLY, FAST], [LIST], (1, 1, 1), "list", "1.0.0", "Returns the length of a list.", lists::llen),
    spec!("lindex", 3, [READONLY], [LIST], (1, 1, 1), "list", "1.0.0", "Returns an element from a list by its index.", lists::lindex),
    spec!("lset", 4, [WRITE, DENYOOM], [LIST], (1, 1, 1), "list", "1.0.0", "Sets the value of an element in a list by its index.", lists::lset),
    spec!("lrange", 4, [READONLY], [LIST], (1, 1, 1), "list", "1.0.0", "Returns a range of elements from a list.", lists::lrange),
    spec!("ltrim", 4, [WRITE], [LIST], (1, 1, 1), "list", "1.0.0", "Removes elements from both ends a list. Deletes the list if all elements were trimmed.", lists::ltrim),
    spec!("lrem", 4, [WRITE], [LIST], (1, 1, 1), "list", "1.0.0", "Removes elements from a list. Deletes the list if the last element was removed.", lists::lrem),
    spec!("linsert", 5, [WRITE, DENYOOM], [LIST], (1, 1, 1), "list", "2.2.0", "Inserts an element before or after another element in a list.", lists::linsert),
    spec!("lpos", -3, [READONLY], [LIST], (1, 1, 1), "list", "6.0.6", "Returns the index of matching elements in a list.", lists::lpos),
    spec!("lmove", 5, [WRITE, DENYOOM], [LIST], (1, 2, 1), "list", "6.2.0", "Returns an element after popping it from one list and pushing it to another. Deletes the list if the last element was moved.", lists::lmove),
    spec!("rpoplpush", 3, [WRITE, DENYOOM], [LIST], (1, 2, 1), "list", "1.2.0", "Returns the last element of a list after removing and pushing it to another list. Deletes the list if the last element was popped.", lists::rpoplpush),
    spec!("lmpop", -4, [WRITE, MOVABLEKEYS], [LIST], (0, 0, 0), "list", "7.0.0", "Returns multiple elements from a list after removing them. Deletes the list if the last element was popped.", lists::lmpop),
    spec!("blpop", -3, [WRITE, NOSCRIPT, BLOCKING], [LIST], (1, -2, 1), "list", "2.0.0", "Removes and returns the first element in a list. Blocks until an element is available otherwise. Deletes the list if the last element was popped.", lists::blpop),
    spec!("brpop", -3, [WRITE, NOSCRIPT, BLOCKING], [LIST], (1, -2, 1), "list", "2.0.0", "Removes and returns the last element in a list. Blocks until an element is available otherwise. Deletes the list if the last element was popped.", lists::brpop),
    spec!("brpoplpush", 4, [WRITE, DENYOOM, NOSCRIPT, BLOCKING], [LIST], (1, 2, 1), "list", "2.2.0", "Pops an element from a list, pushes it to another list and returns it. Block until an element is available otherwise. Deletes the list if the last element was popped.", lists::brpoplpush),
    spec!("blmove", 6, [WRITE, DENYOOM, NOSCRIPT, BLOCKING], [LIST], (1, 2, 1), "list", "6.2.0", "Pops an element from a list, pushes it to another list and returns it. Blocks until an element is available otherwise. Deletes the list if the last element was moved.", lists::blmove),
    spec!("blmpop", -5, [WRITE, BLOCKING, MOVABLEKEYS], [LIST], (0, 0, 0), "list", "7.0.0", "Pops the first element from one of multiple lists. Blocks until an element is available otherwise. Deletes the list if the last element was popped.", lists::blmpop),
    // hashes
    spec!("hset", -4, [WRITE, DENYOOM, FAST], [HASH], (1, 1, 1), "hash", "2.0.0", "Creates or modifies the value of a field in a hash.", hashes::hset),
    spec!("hmset", -4, [WRITE, DENYOOM, FAST], [HASH], (1, 1, 1), "hash", "2.0.0", "Sets the values of multiple fields.", hashes::hset),
    spec!("hsetnx", 4, [WRITE, DENYOOM, FAST], [HASH], (1, 1, 1), "hash", "2.0.0", "Sets the value of a field in a hash only when the field doesn't exist.", hashes::hsetnx),
    spec!("hget", 3, [READONLY, FAST], [HASH], (1, 1, 1), "hash", "2.0.0", "Returns the value of a field in a hash.", hashes::hget),
    spec!("hmget", -3, [READONLY, FAST], [HASH], (1, 1, 1), "hash", "2.0.0", "Returns the values of all fields in a hash.", hashes::hmget),
    spec!("hdel", -3, [WRITE, FAST], [HASH], (1, 1, 1), "hash", "2.0.0", "Deletes one or more fields and their values from a hash. Deletes the hash if no fields remain.", hashes::hdel),
    spec!("hlen", 2, [READONLY, FAST], [HASH], (1, 1, 1), "hash", "2.0.0", "Returns the number of fields in a hash.", hashes::hlen),
    spec!("hexists", 3, [READONLY, FAST], [HASH], (1, 1, 1), "hash", "2.0.0", "Determines whether a field exists in a hash.", hashes::hexists),
    spec!("hstrlen", 3, [READONLY, FAST], [HASH], (1, 1, 1), "hash", "3.2.0", "Returns the length of the value of a field.", hashes::hstrlen),
    spec!("hgetall", 2, [READONLY], [HASH], (1, 1, 1), "hash", "2.0.0", "Returns all fields and values in a hash.", hashes::hgetall),
    spec!("hkeys", 2, [READONLY], [HASH], (1, 1, 1), "hash", "2.0.0", "Returns all fields in a hash.", hashes::hkeys),
    spec!("hvals", 2, [READONLY], [HASH], (1, 1, 1), "hash", "2.0.0", "Returns all values in a hash.", hashes::hvals),
    spec!("hincrby", 4, [WRITE, DENYOOM, FAST], [HASH], (1, 1, 1), "hash", "2.0.0", "Increments the integer value of a field in a hash by a number. Uses 0 as initial value if the field doesn't exist.", hashes::hincrby),
    spec!("hincrbyfloat", 4, [WRITE, DENYOOM, FAST], [HASH], (1, 1, 1), "hash", "2.6.0", "Increments the floating point value of a field by a number. Uses 0 as initial value if the field doesn't exist.", hashes::hincrbyfloat),
    spec!("hrandfield", -2, [READONLY], [HASH], (1, 1, 1), "hash", "6.2.0", "Returns one or more random fields from a hash.", hashes::hrandfield),
    spec!("hscan", -3, [READONLY], [HASH], (1, 1, 1), "hash", "2.8.0", "Iterates over fields and values of a hash.", hashes::hscan),
    // sets
    spec!("sadd", -3, [WRITE, DENYOOM, FAST], [SET], (1, 1, 1), "set", "1.0.0", "Adds one or more members to a set. Creates the key if it doesn't exist.", sets::sadd),
    spec!("srem", -3, [WRITE, FAST], [SET], (1, 1, 1), "set", "1.0.0", "Removes one or more members from a set. Deletes the set if the last member was removed.", sets::srem),
    spec!("smembers", 2, [READONLY], [SET], (1, 1, 1), "set", "1.0.0", "Returns all members of a set.", sets::smembers),
    spec!("sismember", 3, [READONLY, FAST], [SET], (1, 1, 1), "set", "1.0.0", "Determines whether a member belongs to a set.", sets::sismember),
    spec!("smismember", -3, [READONLY, FAST], [SET], (1, 1, 1), "set", "6.2.0", "Determines whether multiple members belong to a set.", sets::smismember),
    spec!("scard", 2, [READONLY, FAST], [SET], (1, 1, 1), "set", "1.0.0", "Returns the number of members in a set.", sets::scard),
    spec!("spop", -2, [WRITE, FAST], [SET], (1, 1, 1), "set", "1.0.0", "Returns one or more random members from a set after removing them. Deletes the set if the last member was popped.", sets::spop),
    spec!("srandmember", -2, [READONLY], [SET], (1, 1, 1), "set", "1.0.0", "Get one or multiple random members from a set", sets::srandmember),
    spec!("smove", 4, [WRITE, FAST], [SET], (1, 2, 1), "set", "1.0.0", "Moves a member from one set to another.", sets::smove),
    spec!("sinter", -2, [READONLY], [SET], (1, -1, 1), "set", "1.0.0", "Returns the intersect of multiple sets.", sets::sinter),
    spec!("sinterstore", -3, [WRITE, DENYOOM], [SET], (1, -1, 1), "set", "1.0.0", "Stores the intersect of multiple sets in a key.", sets::sinterstore),
    spec!("sintercard", -3, [READONLY, MOVABLEKEYS], [SET], (0, 0, 0), "set", "7.0.0", "Returns the number of members of the intersect of multiple sets.", sets::sintercard),
    spec!("sunion", -2, [READONLY], [SET], (1, -1, 1), "set", "1.0.0", "Returns the union of multiple sets.", sets::sunion),
    spec!("sunionstore", -3, [WRITE, DENYOOM], [SET], (1, -1, 1), "set", "1.0.0", "Stores the union of multiple sets in a key.", sets::sunionstore),
    spec!("sdiff", -2, [READONLY], [SET], (1, -1, 1), "set", "1.0.0", "Returns the difference of multiple sets.", sets::sdiff),
    spec!("sdiffstore", -3, [WRITE, DENYOOM], [SET], (1, -1, 1), "set", "1.0.0", "Stores the difference of multiple sets in a key.", sets::sdiffstore),
    spec!("sscan", -3, [READONLY], [SET], (1, 1, 1), "set", "2.8.0", "Iterates over members of a set.", sets::sscan),
    // sorted sets
    spec!("zadd", -4, [WRITE, DENYOOM, FAST], [SORTEDSET], (1, 1, 1), "sorted_set", "1.2.0", "Adds one or more members to a sorted set, or updates their scores. Creates the key if it doesn't exist.", zsets::zadd),
    spec!("zincrby", 4, [WRITE, DENYOOM, FAST], [SORTEDSET], (1, 1, 1), "sorted_set", "1.2.0", "Increments the score of a member in a sorted set.", zsets::zadd),
    spec!("zrem", -3, [WRITE, FAST], [SORTEDSET], (1, 1, 1), "sorted_set", "1.2.0", "Removes one or more members from a sorted set. Deletes the sorted set if all members were removed.", zsets::zrem),
    spec!("zcard", 2, [READONLY, FAST], [SORTEDSET], (1, 1, 1), "sorted_set", "1.2.0", "Returns the number of members in a sorted set.", zsets::zcard),
    spec!("zscore", 3, [READONLY, FAST], [SORTEDSET], (1, 1, 1), "sorted_set", "1.2.0", "Returns the score of a member in a sorted set.", zsets::zscore),
    spec!("zmscore", -3, [READONLY, FAST], [SORTEDSET], (1, 1, 1), "sorted_set", "6.2.0", "Returns the score of one or more members in a sorted set.", zsets::zmscore),
    spec!("zrank", 3, [READONLY, FAST], [SORTEDSET], (1, 1, 1), "sorted_set", "2.0.0", "Returns the index of a member in a sorted set ordered by ascending scores.", zsets::zrank),
    spec!("zrevrank", 3, [READONLY, FAST], [SORTEDSET], (1, 1, 1), "sorted_set", "2.0.0", "Returns the index of a member in a sorted set ordered by descending scores.", zsets::zrank),
    spec!("zcount", 4, [READONLY, FAST], [SORTEDSET], (1, 1, 1), "sorted_set", "2.0.0", "Returns the count of members in a sorted set that have scores within a range.", zsets::zcount),
    spec!("zlexcount", 4, [READONLY, FAST], [SORTEDSET], (1, 1, 1), "sorted_set", "2.8.9", "Returns the number of members in a sorted set within a lexicographical range.", zsets::zlexcount),
    spec!("zrange", -4, [READONLY], [SORTEDSET], (1, 1, 1), "sorted_set", "1.2.0", "Returns members in a sorted set within a range of indexes.", zsets::zrange),
    spec!("zrangestore", -5, [WRITE, DENYOOM], [SORTEDSET], (1, 2, 1), "sorted_set", "6.2.0", "Stores a range of members from sorted set in a key.", zsets::zrangestore),
    spec!("zrevrange", -4, [READONLY], [SORTEDSET], (1, 1, 1), "sorted_set", "1.2.0", "Returns members in a sorted set within a range of indexes in reverse order.", zsets::zrevrange),
    spec!("zrangebyscore", -4, [READONLY], [SORTEDSET], (1, 1, 1), "sorted_set", "1.0.5", "Returns members in a sorted set within a range of scores.", zsets::zrangebyscore),
    spec!("zrevrangebyscore", -4, [READONLY], [SORTEDSET], (1, 1, 1), "sorted_set", "2.2.0", "Returns members in a sorted set within a range of scores in reverse order.", zsets::zrevrangebyscore),
    spec!("zrangebylex", -4, [READONLY], [SORTEDSET], (1, 1, 1), "sorted_set", "2.8.9", "Returns members in a sorted set within a lexicographical range.", zsets::zrangebylex),
    spec!("zrevrangebylex", -4, [READONLY], [SORTEDSET], (1, 1, 1), "sorted_set", "2.8.9", "Returns members in a sorted set within a lexicographical range in reverse order.", zsets::zrevrangebylex),
    spec!("zremrangebyrank", 4, [WRITE], [SORTEDSET], (1, 1, 1), "sorted_set", "2.0.0", "Removes members in a sorted set within a range of indexes. Deletes the sorted set if all members were removed.", zsets::zremrangebyrank),
    spec!("zremrangebyscore", 4, [WRITE], [SORTEDSET], (1, 1, 1), "sorted_set", "1.2.0", "Removes members in a sorted set within a range of scores. Deletes the sorted set if all members were removed.", zsets::zremrangebyscore),
    spec!("zremrangebylex", 4, [WRITE], [SORTEDSET], (1, 1, 1), "sorted_set", "2.8.9", "Removes members in a sorted set within a lexicographical range. Deletes the sorted set if all members were removed.", zsets::zremrangebylex),
    spec!("zpopmin", -2, [WRITE, FAST], [SORTEDSET], (1, 1, 1), "sorted_set", "5.0.0", "Returns the lowest-scoring members from a sorted set after removing them. Deletes the sorted set if the last member was popped.", zsets::zpop),
    spec!("zpopmax", -2, [WRITE, FAST], [SORTEDSET], (1, 1, 1), "sorted_set", "5.0.0", "Returns the highest-scoring members from a sorted set after removing them. Deletes the sorted set if the last member was popped.", zsets::zpop),
    spec!("bzpopmin", -3, [WRITE, NOSCRIPT, FAST, BLOCKING], [SORTEDSET], (1, -2, 1), "sorted_set", "5.0.0", "Removes and returns the member with the lowest score from one or more sorted sets. Blocks until a member is available otherwise. Deletes the sorted set if the last element was popped.", zsets::bzpop),
    spec!("bzpopmax", -3, [WRITE, NOSCRIPT, FAST, BLOCKING], [SORTEDSET], (1, -2, 1), "sorted_set", "5.0.0", "Removes and returns the member with the highest score from one or more sorted sets. Blocks until a member available otherwise.  Deletes the sorted set if the last element was popped.", zsets::bzpop),
    spec!("bzmpop", -5, [WRITE, BLOCKING, MOVABLEKEYS], [SORTEDSET], (0, 0, 0), "sorted_set", "7.0.0", "Removes and returns a member by score from one or more sorted sets. Blocks until a member is available otherwise. Deletes the sorted set if the last element was popped.", zsets::bzmpop),
    spec!("zmpop", -4, [WRITE, MOVABLEKEYS], [SORTEDSET], (0, 0, 0), "sorted_set", "7.0.0", "Returns the highest- or lowest-scoring members from one or more sorted sets after removing them. Deletes the sorted set if the last member was popped.", zsets::zmpop),
    spec!("zrandmember", -2, [READONLY], [SORTEDSET], (1, 1, 1), "sorted_set", "6.2.0", "Returns one or more random members from a sorted set.", zsets::zrandmember),
    spec!("zunion", -3, [READONLY, MOVABLEKEYS], [SORTEDSET], (0, 0, 0), "sorted_set", "6.2.0", "Returns the union of multiple sorted sets.", zsets::zunion),
    spec!("zinter", -3, [READONLY, MOVABLEKEYS], [SORTEDSET], (0, 0, 0), "sorted_set", "6.2.0", "Returns the intersect of multiple sorted sets.", zsets::zinter),
    spec!("zdiff", -3, [READONLY, MOVABLEKEYS], [SORTEDSET], (0, 0, 0), "sorted_set", "6.2.0", "Returns the difference between multiple sorted sets.", zsets::zdiff),
    spec!("zunionstore", -4, [WRITE, DENYOOM, MOVABLEKEYS], [SORTEDSET], (1, 1, 1), "sorted_set", "2.0.0", "Stores the union of multiple sorted sets in a key.", zsets::zunionstore),
    spec!("zinterstore", -4, [WRITE, DENYOOM, MOVABLEKEYS], [SORTEDSET], (1, 1, 1), "sorted_set", "2.0.0", "Stores the intersect of multiple sorted sets in a key.", zsets::zinterstore),
    spec!("zdiffstore", -4, [WRITE, DENYOOM, MOVABLEKEYS], [SORTEDSET], (1, 1, 1), "sorted_set", "6.2.0", "Stores the difference of multiple sorted sets in a key.", zsets::zdiffstore),
    spec!("zintercard", -3, [READONLY, MOVABLEKEYS], [SORTEDSET], (0, 0, 0), "sorted_set", "7.0.0", "Returns the number of members of the intersect of multiple sorted sets.", zsets::zintercard),
    spec!("zscan", -3, [READONLY], [SORTEDSET], (1, 1, 1), "sorted_set", "2.8.0", "Iterates over members and scores of a sorted set.", zsets::zscan),
    // scripting
    spec!("eval", -3, [NOSCRIPT, STALE, SKIP_MONITOR, MOVABLEKEYS], [SCRIPTING], (0, 0, 0), "scripting", "2.6.0", "Executes a server-side Lua script.", scripting::eval),
    spec!("evalsha", -3, [NOSCRIPT, STALE, SKIP_MONITOR, MOVABLEKEYS], [SCRIPTING], (0, 0, 0), "scripting", "2.6.0", "Executes a server-side Lua script by SHA1 digest.", scripting::evalsha),
    spec!("eval_ro", -3, [READONLY, NOSCRIPT, STALE, SKIP_MONITOR, MOVABLEKEYS], [SCRIPTING], (0, 0, 0), "scripting", "7.0.0", "Executes a read-only server-side Lua script.", scripting::eval_ro),
    spec!("evalsha_ro", -3, [READONLY, NOSCRIPT, STALE, SKIP_MONITOR, MOVABLEKEYS], [SCRIPTING], (0, 0, 0), "scripting", "7.0.0", "Executes a read-only server-side Lua script by SHA1 digest.", scripting::evalsha_ro),
    spec!("fcall", -3, [NOSCRIPT, STALE, SKIP_MONITOR, MOVABLEKEYS], [SCRIPTING], (0, 0, 0), "scripting", "7.0.0", "Invokes a function.", scripting::fcall),
    spec!("fcall_ro", -3, [READONLY, NOSCRIPT, STALE, SKIP_MONITOR, MOVABLEKEYS], [SCRIPTING], (0, 0, 0), "scripting", "7.0.0", "Invokes a read-only function.", scripting::fcall_ro),
    spec!("script", -2, [], [], (0, 0, 0), "scripting", "2.6.0", "A container for Lua scripts management commands.", scripting::script),
    spec!("function", -2, [], [], (0, 0, 0), "scripting", "7.0.0", "A container for function commands.", scripting::function),
    // streams
    spec!("xadd", -5, [WRITE, DENYOOM, FAST], [STREAM], (1, 1, 1), "stream", "5.0.0", "Appends a new message to a stream. Creates the key if it doesn't exist.", streams::xadd),
    spec!("xrange", -4, [READONLY], [STREAM], (1, 1, 1), "stream", "5.0.0", "Returns the messages from a stream within a range of IDs.", streams::xrange),
    spec!("xrevrange", -4, [READONLY], [STREAM], (1, 1, 1), "stream", "5.0.0", "Returns the messages from a stream within a range of IDs in reverse order.", streams::xrevrange),
    spec!("xlen", 2, [READONLY, FAST], [STREAM], (1, 1, 1), "stream", "5.0.0", "Return the number of messages in a stream.", streams::xlen),
    spec!("xread", -4, [READONLY, BLOCKING, MOVABLEKEYS], [STREAM], (0, 0, 0), "stream", "5.0.0", "Returns messages from multiple streams with IDs greater than the ones requested. Blocks until a message is available otherwise.", streams::xread),
    spec!("xreadgroup", -7, [WRITE, BLOCKING, MOVABLEKEYS], [STREAM], (0, 0, 0), "stream", "5.0.0", "Returns new or historical messages from a stream for a consumer in a group. Blocks until a message is available otherwise.", streams::xreadgroup),
    spec!("xdel", -3, [WRITE, FAST], [STREAM], (1, 1, 1), "stream", "5.0.0", "Returns the number of messages after removing them from a stream.", streams::xdel),
    spec!("xtrim", -4, [WRITE], [STREAM], (1, 1, 1), "stream", "5.0.0", "Deletes messages from the beginning of a stream.", streams::xtrim),
    spec!("xack", -4, [WRITE, FAST], [STREAM], (1, 1, 1), "stream", "5.0.0", "Returns the number of messages that were successfully acknowledged by the consumer group member of a stream.", streams::xack),
    spec!("xpending", -3, [READONLY], [STREAM], (1, 1, 1), "stream", "5.0.0", "Returns the information and entries from a stream consumer group's pending entries list.", streams::xpending),
    spec!("xclaim", -6, [WRITE, FAST], [STREAM], (1, 1, 1), "stream", "5.0.0", "Changes, or acquires, ownership of a message in a consumer group, as if the message was delivered a consumer group member.", streams::xclaim),
    spec!("xautoclaim", -6, [WRITE, FAST], [STREAM], (1, 1, 1), "stream", "6.2.0", "Changes, or acquires, ownership of messages in a consumer group, as if the messages were delivered to as consumer group member.", streams::xautoclaim),
    spec!("xsetid", -3, [WRITE, DENYOOM, FAST], [STREAM], (1, 1, 1), "stream", "5.0.0", "An internal command for replicating stream values.", streams::xsetid),
    spec!("xgroup", -2, [], [], (0, 0, 0), "stream", "5.0.0", "A container for consumer groups commands.", streams::xgroup),
    spec!("xinfo", -2, [], [], (0, 0, 0), "stream", "5.0.0", "A container for stream introspection commands.", streams::xinfo),
    // geo
    spec!("geoadd", -5, [WRITE, DENYOOM], [GEO], (1, 1, 1), "geo", "3.2.0", "Adds one or more members to a geospatial index. The key is created if it doesn't exist.", geo::geoadd),
    spec!("geodist", -4, [READONLY], [GEO], (1, 1, 1), "geo", "3.2.0", "Returns the distance between two members of a geospatial index.", geo::geodist),
    spec!("geohash", -2, [READONLY], [GEO], (1, 1, 1), "geo", "3.2.0", "Returns members from a geospatial index as geohash strings.", geo::geohash),
    spec!("geopos", -2, [READONLY], [GEO], (1, 1, 1), "geo", "3.2.0", "Returns the longitude and latitude of members from a geospatial index.", geo::geopos),
    spec!("georadius", -6, [WRITE, DENYOOM, MOVABLEKEYS], [GEO], (1, 1, 1), "geo", "3.2.0", "Queries a geospatial index for members within a distance from a coordinate, optionally stores the result.", geo::georadius),
    spec!("georadius_ro", -6, [READONLY], [GEO], (1, 1, 1), "geo", "3.2.10", "Returns members from a geospatial index that are within a distance from a coordinate.", geo::georadius_ro),
    spec!("georadiusbymember", -5, [WRITE, DENYOOM, MOVABLEKEYS], [GEO], (1, 1, 1), "geo", "3.2.0", "Queries a geospatial index for members within a distance from a member, optionally stores the result.", geo::georadiusbymember),
    spec!("georadiusbymember_ro", -5, [READONLY], [GEO], (1, 1, 1), "geo", "3.2.10", "Returns members from a geospatial index that are within a distance from a member.", geo::georadiusbymember_ro),
    spec!("geosearch", -7, [READONLY], [GEO], (1, 1, 1), "geo", "6.2.0", "Queries a geospatial index for members inside an area of a box or a circle.", geo::geosearch),
    spec!("geosearchstore", -8, [WRITE, DENYOOM], [GEO], (1, 2, 1), "geo", "6.2.0", "Queries a geospatial index for members inside an area of a box or a circle, optionally stores the result.", geo::geosearchstore),
    // keyspace
    spec!("sort", -2, [WRITE, DENYOOM, MOVABLEKEYS], [SET, SORTEDSET, LIST, DANGEROUS], (1, 1, 1), "generic", "1.0.0", "Sorts the elements in a list, a set, or a sorted set, optionally storing the result.", sort::sort),
    spec!("sort_ro", -2, [READONLY], [SET, SORTEDSET, LIST, DANGEROUS], (1, 1, 1), "generic", "7.0.0", "Returns the sorted elements of a list, a set, or a sorted set.", sort::sort_ro),
    spec!("del", -2, [WRITE], [KEYSPACE], (1, -1, 1), "generic", "1.0.0", "Deletes one or more keys.", keys::del),
    spec!("unlink", -2, [WRITE, FAST], [KEYSPACE], (1, -1, 1), "generic", "4.0.0", "Asynchronously deletes one or more keys.", keys::del),
    spec!("exists", -2, [READONLY, FAST], [KEYSPACE], (1, -1, 1), "generic", "1.0.0", "Determines whether one or more keys exist.", keys::exists),
    spec!("type", 2, [READONLY, FAST], [KEYSPACE], (1, 1, 1), "generic", "1.0.0", "Determines the type of value stored at a key.", keys::type_),
    spec!("keys", 2, [READONLY], [KEYSPACE, DANGEROUS], (0, 0, 0), "generic", "1.0.0", "Returns all key names that match a pattern.", keys::keys),
    spec!("scan", -2, [READONLY], [KEYSPACE], (0, 0, 0), "generic", "2.8.0", "Iterates over the key names in the database.", keys::scan),
    spec!("rename", 3, [WRITE], [KEYSPACE], (1, 2, 1), "generic", "1.0.0", "Renames a key and overwrites the destination.", keys::rename),
    spec!("copy", -3, [WRITE, DENYOOM], [KEYSPACE], (1, 2, 1), "generic", "6.2.0", "Copies the value of a key to a new key.", keys::copy),
    spec!("dump", 2, [READONLY], [KEYSPACE], (1, 1, 1), "generic", "2.6.0", "Returns a serialized representation of the value stored at a key.", dump::dump),
    spec!("restore", -4, [WRITE, DENYOOM], [KEYSPACE, DANGEROUS], (1, 1, 1), "generic", "2.6.0", "Creates a key from the serialized representation of a value.", dump::restore),
    spec!("move", 3, [WRITE, FAST], [KEYSPACE], (1, 1, 1), "generic", "1.0.0", "Moves a key to another database.", keys::move_),
    spec!("renamenx", 3, [WRITE, FAST], [KEYSPACE], (1, 2, 1), "generic", "1.0.0", "Renames a key only when the target key name doesn't exist.", keys::renamenx),
    spec!("dbsize", 1, [READONLY, FAST], [KEYSPACE], (0, 0, 0), "server", "1.0.0", "Returns the number of keys in the database.", keys::dbsize),
    spec!("flushdb", -1, [WRITE], [KEYSPACE, DANGEROUS], (0, 0, 0), "server", "1.0.0", "Remove all keys from the current database.", keys::flushdb),
    spec!("flushall", -1, [WRITE], [KEYSPACE, DANGEROUS], (0, 0, 0), "server", "1.0.0", "Removes all keys from all databases.", keys::flushall),
    // FAST as in Redis's table, though here the keys move (`keys::swap_dbs`).
    spec!("swapdb", 3, [WRITE, FAST], [KEYSPACE, DANGEROUS], (0, 0, 0), "server", "4.0.0", "Swaps two Redis databases.", keys::swapdb),
    spec!("randomkey", 1, [READONLY], [KEYSPACE], (0, 0, 0), "generic", "1.0.0", "Returns a random key name from the database.", keys::randomkey),
    spec!("expire", -3, [WRITE, FAST], [KEYSPACE], (1, 1, 1), "generic", "1.0.0", "Sets the expiration time of a key in seconds.", keys::expire),
    spec!("pexpire", -3, [WRITE, FAST], [KEYSPACE], (1, 1, 1), "generic", "2.6.0", "Sets the expiration time of a key in milliseconds.", keys::pexpire),
    spec!("expireat", -3, [WRITE, FAST], [KEYSPACE], (1, 1, 1), "generic", "1.2.0", "Sets the expiration time of a key to a Unix timestamp.", keys::expireat),
    spec!("pexpireat", -3, [WRITE, FAST], [KEYSPACE], (1, 1, 1), "generic", "2.6.0", "Sets the expiration time of a key to a Unix milliseconds timestamp.", keys::pexpireat),
    spec!("ttl", 2, [READONLY, FAST], [KEYSPACE], (1, 1, 1), "generic", "1.0.0", "Returns the expiration time in seconds of a key.", keys::ttl),
    spec!("pttl", 2, [READONLY, FAST], [KEYSPACE], (1, 1, 1), "generic", "2.6.0", "Returns the expiration time in milliseconds of a key.", keys::pttl),
    spec!("expiretime", 2, [READONLY, FAST], [KEYSPACE], (1, 1, 1), "generic", "7.0.0", "Returns the expiration time of a key as a Unix timestamp.", keys::expiretime),
    spec!("pexpiretime", 2, [READONLY, FAST], [KEYSPACE], (1, 1, 1), "generic", "7.0.0", "Returns the expiration time of a key as a Unix milliseconds timestamp.", keys::pexpiretime),
    spec!("persist", 2, [WRITE, FAST], [KEYSPACE], (1, 1, 1), "generic", "2.2.0", "Removes the expiration time of a key.", keys::persist),
    spec!("touch", -2, [READONLY, FAST], [KEYSPACE], (1, -1, 1), "generic", "3.2.1", "Returns the number of existing keys out of those specified after updating the time they were last accessed.", keys::touch),
    spec!("object", -2, [], [], (0, 0, 0), "generic", "2.2.3", "A container for object introspection commands.", keys::object),
    // pubsub (the shard commands' channels are not keys: no key positions)
    spec!("subscribe", -2, [PUBSUB, NOSCRIPT, LOADING, STALE], [], (0, 0, 0), "pubsub", "2.0.0", "Listens for messages published to channels.", pubsub::subscribe),
    spec!("unsubscribe", -1, [PUBSUB, NOSCRIPT, LOADING, STALE], [], (0, 0, 0), "pubsub", "2.0.0", "Stops listening to messages posted to channels.", pubsub::unsubscribe),
    spec!("psubscribe", -2, [PUBSUB, NOSCRIPT, LOADING, STALE], [], (0, 0, 0), "pubsub", "2.0.0", "Listens for messages published to channels that match one or more patterns.", pubsub::psubscribe),
    spec!("punsubscribe", -1, [PUBSUB, NOSCRIPT, LOADING, STALE], [], (0, 0, 0), "pubsub", "2.0.0", "Stops listening to messages published to channels that match one or more patterns.", pubsub::punsubscribe),
    spec!("ssubscribe", -2, [PUBSUB, NOSCRIPT, LOADING, STALE], [], (0, 0, 0), "pubsub", "7.0.0", "Listens for messages published to shard channels.", pubsub::ssubscribe),
    spec!("sunsubscribe", -1, [PUBSUB, NOSCRIPT, LOADING, STALE], [], (0, 0, 0), "pubsub", "7.0.0", "Stops listening to messages posted to shard channels.", pubsub::sunsubscribe),
    spec!("publish", 3, [PUBSUB, LOADING, STALE, FAST, MAY_REPLICATE], [], (0, 0, 0), "pubsub", "2.0.0", "Posts a message to a channel.", pubsub::publish),
    spec!("spublish", 3, [PUBSUB, LOADING, STALE, FAST, MAY_REPLICATE], [], (0, 0, 0), "pubsub", "7.0.0", "Post a message to a shard channel", pubsub::spublish),
    spec!("pubsub", -2, [], [], (0, 0, 0), "pubsub", "2.8.0", "A container for Pub/Sub commands.", pubsub::pubsub),
    // server
    spec!("monitor", 1, [ADMIN, NOSCRIPT, LOADING, STALE], [], (0, 0, 0), "server", "1.0.0", "Listens for all requests received by the server in real-time.", crate::monitor::monitor),
    spec!("latency", -2, [], [], (0, 0, 0), "server", "2.8.13", "A container for latency diagnostics commands.", admin::latency),
    spec!("slowlog", -2, [], [], (0, 0, 0), "server", "2.2.12", "A container for slow log commands.", admin::slowlog),
    spec!("wait", 3, [NOSCRIPT], [CONNECTION], (0, 0, 0), "generic", "3.0.0", "Blocks until the asynchronous replication of all preceding write commands sent by the connection is completed.", admin::wait),
    spec!("memory", -2, [], [], (0, 0, 0), "server", "4.0.0", "A container for memory diagnostics commands.", keys::memory),
    spec!("info", -1, [LOADING, STALE], [DANGEROUS], (0, 0, 0), "server", "1.0.0", "Returns information and statistics about the server.", admin::info),
    spec!("config", -2, [], [], (0, 0, 0), "server", "2.0.0", "A container for server configuration commands.", admin::config),
    spec!("command", -1, [LOADING, STALE], [CONNECTION], (0, 0, 0), "server", "2.8.13", "Returns detailed information about all commands.", admin::command),
    spec!("time", 1, [LOADING, STALE, FAST], [], (0, 0, 0), "server", "2.6.0", "Returns the server time.", admin::time),
    spec!("readonly", 1, [FAST, LOADING, STALE], [CONNECTION], (0, 0, 0), "cluster", "3.0.0", "Enables read-only queries for a connection to a Redis Cluster replica node.", crate::cluster::readonly),
    spec!("readwrite", 1, [FAST, LOADING, STALE], [CONNECTION], (0, 0, 0), "cluster", "3.0.0", "Enables read-write queries for a connection to a Reids Cluster replica node.", crate::cluster::readwrite),
    spec!("sentinel", -2, [ADMIN, NOSCRIPT, LOADING, STALE], [], (0, 0, 0), "sentinel", "2.8.4", "Answers Sentinel's discovery commands for a cluster: its leader as the master.", crate::cluster::sentinel),
    spec!("raft", -2, [ADMIN, NOSCRIPT, LOADING, STALE], [], (0, 0, 0), "server", "7.0.0", "Lists, adds and removes the members of a replicated cluster (an Ember command).", crate::cluster::raft),
    spec!("role", 1, [NOSCRIPT, LOADING, STALE, FAST], [ADMIN, DANGEROUS], (0, 0, 0), "server", "2.8.12", "Returns the replication role.", crate::cluster::role),
    spec!("lastsave", 1, [LOADING, STALE, FAST], [ADMIN, DANGEROUS], (0, 0, 0), "server", "1.0.0", "Returns the Unix timestamp of the last successful save to disk.", admin::lastsave),
    spec!("save", 1, [ADMIN, NOSCRIPT], [], (0, 0, 0), "server", "1.0.0", "Synchronously saves the database(s) to disk.", admin::save),
    spec!("bgsave", -1, [ADMIN, NOSCRIPT], [], (0, 0, 0), "server", "1.0.0", "Asynchronously saves the database(s) to disk.", admin::bgsave),
    spec!("debug", -2, [ADMIN, NOSCRIPT, LOADING, STALE, PROTECTED], [], (0, 0, 0), "server", "1.0.0", "A container for debugging commands.", admin::debug),
    spec!("acl", -2, [], [], (0, 0, 0), "server", "6.0.0", "A container for Access List Control commands.", acl::acl),
    spec!("shutdown", -1, [ADMIN, NOSCRIPT, LOADING, STALE, NO_MULTI, ALLOW_BUSY], [], (0, 0, 0), "server", "1.0.0", "Synchronously saves the database(s) to disk and shuts down the Redis server.", admin::shutdown),
];

/// A subcommand of a container command (CLIENT, CONFIG, OBJECT, COMMAND,
/// ACL), with the metadata Redis 7 keeps for it: ACL rules name it
/// `parent|name` and check its own categories and keys (`+config|get`,
/// `-@admin` denies `config|set` and not `config|help`). Every subcommand
/// Redis has is listed, also those Ember replies are not supported, so that
/// rules naming them are accepted as Redis accepts them.
pub struct SubSpec {
    pub parent: &'static str,
    pub name: &'static str,
    /// Redis arity, the parent's name and the subcommand's name included.
    pub arity: i32,
    pub flags: Flags,
    pub acl: Cats,
    pub keys: KeyPos,
}

impl SubSpec {
    /// The subcommand's ACL categories (see [`Spec::categories`]).
    pub fn categories(&self) -> Cats {
        categories(self.flags, self.acl)
    }

    /// Whether `n` arguments (the parent's name included) satisfy the arity.
    pub fn arity_ok(&self, n: usize) -> bool {
        arity_ok(self.arity, n)
    }
}

macro_rules! sub {
    ($parent:literal, $name:literal, $arity:expr, [$($f:ident),*], [$($c:ident),*]) => {
        sub!($parent, $name, $arity, [$($f),*], [$($c),*], (0, 0, 0))
    };
    ($parent:literal, $name:literal, $arity:expr, [$($f:ident),*], [$($c:ident),*], ($first:expr, $last:expr, $step:expr)) => {
        SubSpec {
            parent: $parent,
            name: $name,
            arity: $arity,
            flags: Flags::empty()$(.with(Flags::$f))*,
            acl: Cats::empty()$(.with(Cats::$c))*,
            keys: KeyPos { first: $first, last: $last, step: $step },
        }
    };
}

/// Every subcommand of the container commands in [`TABLE`] (Redis 7's
/// flags and categories; CLIENT SETINFO and NO-TOUCH as Redis 7.2 has them).
#[rustfmt::skip]
pub static SUBCOMMANDS: &[SubSpec] = &[
    sub!("client", "caching", 3, [NOSCRIPT, LOADING, STALE], [CONNECTION]),
    sub!("client", "getname", 2, [NOSCRIPT, LOADING, STALE], [CONNECTION]),
    sub!("client", "getredir", 2, [NOSCRIPT, LOADING, STALE], [CONNECTION]),
    sub!("client", "help", 2, [LOADING, STALE], [CONNECTION]),
    sub!("client", "id", 2, [NOSCRIPT, LOADING, STALE], [CONNECTION]),
    sub!("client", "info", 2, [NOSCRIPT, LOADING, STALE], [CONNECTION]),
    sub!("client", "kill", -3, [ADMIN, NOSCRIPT, LOADING, STALE], [CONNECTION]),
    sub!("client", "list", -2, [ADMIN, NOSCRIPT, LOADING, STALE], [CONNECTION]),
    sub!("client", "no-evict", 3, [ADMIN, NOSCRIPT, LOADING, STALE], [CONNECTION]),
    sub!("client", "no-touch", 3, [NOSCRIPT, LOADING, STALE], [CONNECTION]),
    sub!("client", "pause", -3, [ADMIN, NOSCRIPT, LOADING, STALE], [CONNECTION]),
    sub!("client", "reply", 3, [NOSCRIPT, LOADING, STALE], [CONNECTION]),
    sub!("client", "setinfo", 4, [NOSCRIPT, LOADING, STALE], [CONNECTION]),
    sub!("client", "setname", 3, [NOSCRIPT, LOADING, STALE], [CONNECTION]),
    sub!("client", "tracking", -3, [NOSCRIPT, LOADING, STALE], [CONNECTION]),
    sub!("client", "trackinginfo", 2, [NOSCRIPT, LOADING, STALE], [CONNECTION]),
    sub!("client", "unblock", -3, [ADMIN, NOSCRIPT, LOADING, STALE], [CONNECTION]),
    sub!("client", "unpause", 2, [ADMIN, NOSCRIPT, LOADING, STALE], [CONNECTION]),
    sub!("pubsub", "channels", -2, [PUBSUB, LOADING, STALE], []),
    sub!("pubsub", "help", 2, [LOADING, STALE], []),
    sub!("pubsub", "numpat", 2, [PUBSUB, LOADING, STALE], []),
    sub!("pubsub", "numsub", -2, [PUBSUB, LOADING, STALE], []),
    sub!("pubsub", "shardchannels", -2, [PUBSUB, LOADING, STALE], []),
    sub!("pubsub", "shardnumsub", -2, [PUBSUB, LOADING, STALE], []),
    sub!("latency", "doctor", 2, [ADMIN, NOSCRIPT, LOADING, STALE], []),
    sub!("latency", "graph", 3, [ADMIN, NOSCRIPT, LOADING, STALE], []),
    sub!("latency", "help", 2, [LOADING, STALE], []),
    sub!("latency", "histogram", -2, [ADMIN, NOSCRIPT, LOADING, STALE], []),
    sub!("latency", "history", 3, [ADMIN, NOSCRIPT, LOADING, STALE], []),
    sub!("latency", "latest", 2, [ADMIN, NOSCRIPT, LOADING, STALE], []),
    sub!("latency", "reset", -2, [ADMIN, NOSCRIPT, LOADING, STALE], []),
    sub!("slowlog", "get", -2, [ADMIN, LOADING, STALE], []),
    sub!("slowlog", "help", 2, [LOADING, STALE], []),
    sub!("slowlog", "len", 2, [ADMIN, LOADING, STALE], []),
    sub!("slowlog", "reset", 2, [ADMIN, LOADING, STALE], []),
    sub!("memory", "doctor", 2, [], []),
    sub!("memory", "help", 2, [LOADING, STALE], []),
    sub!("memory", "malloc-stats", 2, [], []),
    sub!("memory", "purge", 2, [], []),
    sub!("memory", "stats", 2, [], []),
    sub!("memory", "usage", -3, [READONLY], [], (2, 2, 1)),
    sub!("object", "encoding", 3, [READONLY], [KEYSPACE], (2, 2, 1)),
    sub!("object", "freq", 3, [READONLY], [KEYSPACE], (2, 2, 1)),
    sub!("object", "help", 2, [LOADING, STALE], [KEYSPACE]),
    sub!("object", "idletime", 3, [READONLY], [KEYSPACE], (2, 2, 1)),
    sub!("object", "refcount", 3, [READONLY], [KEYSPACE], (2, 2, 1)),
    sub!("xgroup", "create", -5, [WRITE, DENYOOM], [STREAM], (2, 2, 1)),
    sub!("xgroup", "createconsumer", 5, [WRITE, DENYOOM], [STREAM], (2, 2, 1)),
    sub!("xgroup", "delconsumer", 5, [WRITE], [STREAM], (2, 2, 1)),
    sub!("xgroup", "destroy", 4, [WRITE], [STREAM], (2, 2, 1)),
    sub!("xgroup", "help", 2, [LOADING, STALE], [STREAM]),
    sub!("xgroup", "setid", -5, [WRITE], [STREAM], (2, 2, 1)),
    sub!("xinfo", "consumers", 4, [READONLY], [STREAM], (2, 2, 1)),
    sub!("xinfo", "groups", 3, [READONLY], [STREAM], (2, 2, 1)),
    sub!("xinfo", "help", 2, [LOADING, STALE], [STREAM]),
    sub!("xinfo", "stream", -3, [READONLY], [STREAM], (2, 2, 1)),
    sub!("config", "get", -3, [ADMIN, NOSCRIPT, LOADING, STALE], []),
    sub!("config", "help", 2, [LOADING, STALE], []),
    sub!("config", "resetstat", 2, [ADMIN, NOSCRIPT, LOADING, STALE], []),
    sub!("config", "rewrite", 2, [ADMIN, NOSCRIPT, LOADING, STALE], []),
    sub!("config", "set", -4, [ADMIN, NOSCRIPT, LOADING, STALE], []),
    sub!("command", "count", 2, [LOADING, STALE], [CONNECTION]),
    sub!("command", "docs", -2, [LOADING, STALE], [CONNECTION]),
    sub!("command", "getkeys", -4, [LOADING, STALE], [CONNECTION]),
    sub!("command", "getkeysandflags", -4, [LOADING, STALE], [CONNECTION]),
    sub!("command", "help", 2, [LOADING, STALE], [CONNECTION]),
    sub!("command", "info", -2, [LOADING, STALE], [CONNECTION]),
    sub!("command", "list", -2, [LOADING, STALE], [CONNECTION]),
    sub!("acl", "cat", -2, [NOSCRIPT, LOADING, STALE], []),
    sub!("acl", "deluser", -3, [ADMIN, NOSCRIPT, LOADING, STALE], []),
    sub!("acl", "dryrun", -4, [ADMIN, NOSCRIPT, LOADING, STALE], []),
    sub!("acl", "genpass", -2, [NOSCRIPT, LOADING, STALE], []),
    sub!("acl", "getuser", 3, [ADMIN, NOSCRIPT, LOADING, STALE], []),
    sub!("acl", "help", 2, [LOADING, STALE], []),
    sub!("acl", "list", 2, [ADMIN, NOSCRIPT, LOADING, STALE], []),
    sub!("acl", "load", 2, [ADMIN, NOSCRIPT, LOADING, STALE], []),
    sub!("acl", "log", -2, [ADMIN, NOSCRIPT, LOADING, STALE], []),
    sub!("acl", "save", 2, [ADMIN, NOSCRIPT, LOADING, STALE], []),
    sub!("acl", "setuser", -3, [ADMIN, NOSCRIPT, LOADING, STALE], []),
    sub!("acl", "users", 2, [ADMIN, NOSCRIPT, LOADING, STALE], []),
    sub!("acl", "whoami", 2, [NOSCRIPT, LOADING, STALE], []),
    sub!("script", "debug", 3, [NOSCRIPT], [SCRIPTING]),
    sub!("script", "exists", -3, [NOSCRIPT], [SCRIPTING]),
    sub!("script", "flush", -2, [NOSCRIPT], [SCRIPTING]),
    sub!("script", "help", 2, [LOADING, STALE], [SCRIPTING]),
    sub!("script", "kill", 2, [NOSCRIPT, ALLOW_BUSY], [SCRIPTING]),
    sub!("script", "load", 3, [NOSCRIPT, STALE], [SCRIPTING]),
    sub!("function", "delete", 3, [WRITE, NOSCRIPT], [SCRIPTING]),
    sub!("function", "dump", 2, [NOSCRIPT], [SCRIPTING]),
    sub!("function", "flush", -2, [WRITE, NOSCRIPT], [SCRIPTING]),
    sub!("function", "help", 2, [LOADING, STALE], [SCRIPTING]),
    sub!("function", "kill", 2, [NOSCRIPT, ALLOW_BUSY], [SCRIPTING]),
    sub!("function", "list", -2, [NOSCRIPT], [SCRIPTING]),
    sub!("function", "load", -3, [WRITE, DENYOOM, NOSCRIPT], [SCRIPTING]),
    sub!("function", "restore", -3, [WRITE, DENYOOM, NOSCRIPT], [SCRIPTING]),
    sub!("function", "stats", 2, [NOSCRIPT, ALLOW_BUSY], [SCRIPTING]),
];

/// The access to its keys a command needs from ACL `%R~`/`%W~` patterns
/// where its flags alone do not say it (a write command writes its keys, a
/// read-only command reads them): Redis 7's key specs. Each row is the
/// command (or `parent|sub`), then the access to its first key and to the
/// others: `R` reads the value, `W` changes the key, `-` neither (EXISTS
/// only looks whether the key is there). SET's GET option, which also
/// reads, is `acl.rs`'s one argument-dependent case.
#[rustfmt::skip]
pub static KEY_ACCESS: &[(&str, &str, &str)] = &[
    ("getdel", "RW", "RW"),
    ("eval", "RW", "RW"),
    ("evalsha", "RW", "RW"),
    ("fcall", "RW", "RW"),
    ("getset", "RW", "RW"),
    ("getex", "RW", "RW"),
    ("incr", "RW", "RW"),
    ("incrby", "RW", "RW"),
    ("decr", "RW", "RW"),
    ("decrby", "RW", "RW"),
    ("incrbyfloat", "RW", "RW"),
    ("setbit", "RW", "RW"),
    ("bitfield", "RW", "RW"),
    ("bitop", "W", "R"),
    ("pfcount", "R", "R"),
    ("pfmerge", "RW", "R"),
    ("pfdebug", "R", "R"),
    ("rename", "RW", "W"),
    ("copy", "R", "W"),
    ("move", "RW", "RW"),
    ("renamenx", "RW", "W"),
    ("exists", "-", "-"),
    ("watch", "R", "R"),
    ("restore", "W", "W"),
    ("type", "-", "-"),
    ("touch", "-", "-"),
    ("strlen", "-", "-"),
    ("object|encoding", "-", "-"),
    ("object|freq", "-", "-"),
    ("object|idletime", "-", "-"),
    ("object|refcount", "-", "-"),
    ("lpop", "RW", "RW"),
    ("rpop", "RW", "RW"),
    ("lmove", "RW", "W"),
    ("rpoplpush", "RW", "W"),
    ("lmpop", "RW", "RW"),
    ("blpop", "RW", "RW"),
    ("brpop", "RW", "RW"),
    ("blmove", "RW", "W"),
    ("brpoplpush", "RW", "W"),
    ("blmpop", "RW", "RW"),
    ("llen", "-", "-"),
    ("hincrby", "RW", "RW"),
    ("hincrbyfloat", "RW", "RW"),
    ("hlen", "-", "-"),
    ("hexists", "-", "-"),
    ("hstrlen", "-", "-"),
    ("spop", "RW", "RW"),
    ("smove", "RW", "W"),
    ("sismember", "-", "-"),
    ("scard", "-", "-"),
    ("sinterstore", "W", "R"),
    ("sunionstore", "W", "R"),
    ("sdiffstore", "W", "R"),
    ("zincrby", "RW", "RW"),
    ("zcard", "-", "-"),
    ("zrangestore", "W", "R"),
    ("zpopmin", "RW", "RW"),
    ("zpopmax", "RW", "RW"),
    ("zmpop", "RW", "RW"),
    ("bzpopmin", "RW", "RW"),
    ("bzpopmax", "RW", "RW"),
    ("bzmpop", "RW", "RW"),
    ("zunionstore", "W", "R"),
    ("zinterstore", "W", "R"),
    ("zdiffstore", "W", "R"),
    ("georadius", "R", "W"),
    ("georadiusbymember", "R", "W"),
    ("geosearchstore", "W", "R"),
    ("sort", "R", "W"),
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
    if name.len() > 24 {
        return None;
    }
    let mut low = [0u8; 24];
    let low = &mut low[..name.len()];
    low.copy_from_slice(name);
    low.make_ascii_lowercase();
    let s = std::str::from_utf8(low).ok()?;
    lookup_map().get(s).copied()
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
            let f = s.flags;
            assert!(
                !(f.contains(Flags::WRITE) && f.contains(Flags::READONLY)),
                "{}",
                s.name
            );
            // A command with keys names them within its arity.
            let k = s.keys;
            if k.first > 0 {
                assert!(
                    k.step > 0 && (k.last < 0 || k.last >= k.first),
                    "{}",
                    s.name
                );
                assert!(k.first < s.arity.abs(), "{}", s.name);
                // SORT is the one generic command Redis files under the
                // categories of the types it reads.
                assert!(
                    s.categories().contains(Cats::KEYSPACE)
                        || s.group != "generic"
                        || s.name.starts_with("sort")
                );
            } else {
                assert_eq!((k.last, k.step), (0, 0), "{}", s.name);
            }
            let c = s.categories();
            assert!(
                c.contains(Cats::FAST) != c.contains(Cats::SLOW),
                "{}",
                s.name
            );
        }
        assert_eq!(lookup(b"nosuchcommand"), None);
        assert_eq!(lookup(&[0xff; 4]), None);
    }

    fn req(words: &[&str]) -> Vec<Vec<u8>> {
        words.iter().map(|w| w.as_bytes().to_vec()).collect()
    }

    #[test]
    fn categories_and_keys_as_redis_reports_them() {
        let get = &TABLE[lookup(b"get").unwrap()];
        assert_eq!(
            get.categories().names().collect::<Vec<_>>(),
            ["read", "string", "fast"]
        );
        let flushdb = &TABLE[lookup(b"flushdb").unwrap()];
        assert_eq!(
            flushdb.categories().names().collect::<Vec<_>>(),
            ["keyspace", "write", "slow", "dangerous"]
        );
        let save = &TABLE[lookup(b"save").unwrap()];
        assert_eq!(
            save.categories().names().collect::<Vec<_>>(),
            ["admin", "slow", "dangerous"]
        );
        let mset = &TABLE[lookup(b"mset").unwrap()];
        assert_eq!(mset.keys.indexes(7).collect::<Vec<_>>(), [1, 3, 5]);
        let del = &TABLE[lookup(b"del").unwrap()];
        assert_eq!(del.keys.indexes(4).collect::<Vec<_>>(), [1, 2, 3]);
        let rename = &TABLE[lookup(b"rename").unwrap()];
        assert_eq!(rename.keys.indexes(3).collect::<Vec<_>>(), [1, 2]);
        let ping = &TABLE[lookup(b"ping").unwrap()];
        assert_eq!(ping.keys.indexes(2).count(), 0);
        // Redis gives @read to no @scripting command, read-only or not.
        let eval_ro = &TABLE[lookup(b"eval_ro").unwrap()];
        assert_eq!(
            eval_ro.categories().names().collect::<Vec<_>>(),
            ["slow", "scripting"]
        );
        let eval = req(&["EVAL", "return 1", "2", "a", "b", "c"]);
        assert_eq!(movable_keys("eval", &eval), [3, 4]);
        assert_eq!(
            movable_keys("fcall", &req(&["FCALL", "f", "0", "x"])),
            [0usize; 0]
        );
        assert_eq!(Cats::by_name("String"), Some(Cats::STRING));
        assert_eq!(Flags::by_name("nosuch"), None);
    }
}
