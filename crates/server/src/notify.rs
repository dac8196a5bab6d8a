//! Keyspace notifications (`notify-keyspace-events`, Redis 7.0's events):
//! a command that changes a key publishes `<event>` on
//! `__keyspace@<db>__:<key>` (class `K`) and `<key>` on
//! `__keyevent@<db>__:<event>` (class `E`), when the event's class is on.
//!
//! A command calls [`event`] with the event's class and Redis's name for it
//! (`event(ctx, notify::STRING, "set", db, key)`), in the order Redis fires
//! them; with notifications off that is one relaxed load. The events are
//! kept in the worker's keyspace and published when the command ends, after
//! its writes were applied (`pubsub::after_command`; for a blocked client's
//! serve and active expiry, on the worker's loop turn), so they may be
//! called under the command's stripe locks too.
//!
//! Two events are found by the keyspace rather than by commands: a key
//! found expired by a lookup or by active expiry (`expired`, class `x`),
//! and a key a write created (`new`, class `n`, from the store's outcome in
//! `Keyspace::apply`). The keyspace logs them while their class is on.
//! `expired` events are published first (a lookup meets the key before
//! the command changes anything); each `new` just before the command's
//! first event on that key (MSET's `new`/`set` pairs alternate, as Redis
//! fires them), and those left after the command's events. `evicted`
//! (class `e`) is published by an eviction round (`crate::evict`), before
//! the command that needed the room runs. `keymiss` (class `m`, not in
//! `A`) is logged by the keyspace's lookups that find no key while a read
//! runs (`Keyspace::reading`: a read-only command other than OBJECT, or a
//! write command's keys that it only reads, `acl::read_keys`; Redis's
//! `lookupKeyRead`), in order with the command's other events.

use crate::cmd::Ctx;
use crate::keyspace::Keyspace;
use crate::server::Shared;
use std::io::Write;
use std::sync::atomic::Ordering;

pub const KEYSPACE: u32 = 1 << 0;
pub const KEYEVENT: u32 = 1 << 1;
pub const GENERIC: u32 = 1 << 2;
pub const STRING: u32 = 1 << 3;
pub const LIST: u32 = 1 << 4;
pub const SET: u32 = 1 << 5;
pub const HASH: u32 = 1 << 6;
pub const ZSET: u32 = 1 << 7;
pub const EXPIRED: u32 = 1 << 8;
pub const EVICTED: u32 = 1 << 9;
pub const STREAM: u32 = 1 << 10;
pub const KEY_MISS: u32 = 1 << 11;
pub const MODULE: u32 = 1 << 13;
pub const NEW: u32 = 1 << 14;
/// `A`: every class but `m` and `n`, as Redis's `NOTIFY_ALL`.
pub const ALL: u32 =
    GENERIC | STRING | LIST | SET | HASH | ZSET | EXPIRED | EVICTED | STREAM | MODULE;

/// Parses a `notify-keyspace-events` value (Redis's letters); None for a
/// character that is not one.
pub fn parse_flags(s: &str) -> Option<u32> {
    let mut f = 0;
    for c in s.chars() {
        f |= match c {
            'A' => ALL,
            'g' => GENERIC,
            '$' => STRING,
            'l' => LIST,
            's' => SET,
            'h' => HASH,
            'z' => ZSET,
            'x' => EXPIRED,
            'e' => EVICTED,
            'K' => KEYSPACE,
            'E' => KEYEVENT,
            't' => STREAM,
            'm' => KEY_MISS,
            'd' => MODULE,
            'n' => NEW,
            _ => return None,
        };
    }
    Some(f)
}

/// The flags as CONFIG GET shows them (Redis's
/// `keyspaceEventsFlagsToString`: `A` for all the classes it covers, then
/// `K`, `E`, `m`).
pub fn flags_string(f: u32) -> String {
    let mut s = String::new();
    if f & ALL == ALL {
        s.push('A');
    } else {
        for (bit, c) in [
            (GENERIC, 'g'),
            (STRING, '$'),
            (LIST, 'l'),
            (SET, 's'),
            (HASH, 'h'),
            (ZSET, 'z'),
            (EXPIRED, 'x'),
            (EVICTED, 'e'),
            (STREAM, 't'),
            (MODULE, 'd'),
            (NEW, 'n'),
        ] {
            if f & bit != 0 {
                s.push(c);
            }
        }
    }
    for (bit, c) in [(KEYSPACE, 'K'), (KEYEVENT, 'E'), (KEY_MISS, 'm')] {
        if f & bit != 0 {
            s.push(c);
        }
    }
    s
}

/// Event `name` of class `class` on key `key` of database `db`, published
/// when the command ends (see the module's documentation). One relaxed
/// load when notifications are off.
pub fn event(ctx: &mut Ctx, class: u32, name: &'static str, db: u8, key: &[u8]) {
    let f = ctx.sh.pubsub.notify_flags().load(Ordering::Relaxed);
    if f & class == 0 {
        return;
    }
    let mut sk = Vec::with_capacity(1 + key.len());
    sk.push(db);
    sk.extend_from_slice(key);
    ctx.ks.events.push((class, name, sk));
}

/// Publishes what the keyspace holds: `expired` events, the command's
/// events each after the `new` events up to its key's, then the `new`
/// events left.
pub fn flush_pending(sh: &Shared, ks: &mut Keyspace) {
    if ks.expired_log.is_empty() && ks.created_log.is_empty() && ks.events.is_empty() {
        return;
    }
    // A cluster's leader sends them to the other nodes too.
    crate::cluster::replicate_events(sh, ks);
    let f = sh.pubsub.notify_flags().load(Ordering::Relaxed);
    for k in std::mem::take(&mut ks.expired_log) {
        if f & EXPIRED != 0 {
            publish(sh, f, "expired", k[0], &k[1..]);
        }
    }
    let mut created = std::mem::take(&mut ks.created_log);
    let mut from = 0;
    for (class, name, sk) in std::mem::take(&mut ks.events) {
        if let Some(i) = created[from..].iter().position(|k| *k == sk) {
            for k in &created[from..=from + i] {
                if f & NEW != 0 {
                    publish(sh, f, "new", k[0], &k[1..]);
                }
            }
            from += i + 1;
        }
        if f & class != 0 {
            publish(sh, f, name, sk[0], &sk[1..]);
        }
    }
    for k in created.drain(from..) {
        if f & NEW != 0 {
            publish(sh, f, "new", k[0], &k[1..]);
        }
    }
}

/// The two messages of one event (those of the `K`/`E` classes on).
fn publish(sh: &Shared, f: u32, name: &str, db: u8, key: &[u8]) {
    let mut ch = Vec::with_capacity(16 + key.len().max(name.len()));
    if f & KEYSPACE != 0 {
        channel(&mut ch, b"__keyspace@", db, key);
        sh.pubsub.publish(false, &ch, name.as_bytes());
    }
    if f & KEYEVENT != 0 {
        channel(&mut ch, b"__keyevent@", db, name.as_bytes());
        sh.pubsub.publish(false, &ch, key);
    }
}

fn channel(out: &mut Vec<u8>, prefix: &[u8], db: u8, tail: &[u8]) {
    out.clear();
    out.extend_from_slice(prefix);
    let _ = write!(out, "{db}");
    out.extend_from_slice(b"__:");
    out.extend_from_slice(tail);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_read_and_print_as_redis() {
        for (input, shown) in [
            ("", ""),
            ("KEA", "AKE"),
            ("Kx", "xK"),
            ("AKEm", "AKEm"),
            ("AnKE", "AKE"),
            ("gn$E", "g$nE"),
            ("Eg$lshzxetd", "AE"),
            ("mKEn", "nKEm"),
        ] {
            assert_eq!(flags_string(parse_flags(input).unwrap()), shown, "{input}");
        }
        assert_eq!(parse_flags("KEA!"), None);
        assert_eq!(parse_flags("a"), None);
    }

    #[test]
    fn channels_are_named_as_redis_names_them() {
        let mut ch = Vec::new();
        channel(&mut ch, b"__keyspace@", 12, b"k:1");
        assert_eq!(ch, b"__keyspace@12__:k:1");
        channel(&mut ch, b"__keyevent@", 0, b"set");
        assert_eq!(ch, b"__keyevent@0__:set");
    }
}
