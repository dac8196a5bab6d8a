//! DUMP and RESTORE in Redis's serialization format ([`crate::rdb`]).
//!
//! Both run as one unit ([`super::unit`]) on their key: DUMP reads the
//! value through the type's own read command (GET, LRANGE, SMEMBERS,
//! HGETALL, ZRANGE WITHSCORES; a stream through `streams::export`) and
//! serializes it; RESTORE decodes the
//! payload and writes the key through the type's write commands (SET,
//! RPUSH, SADD, HSET, ZADD in chunks, then PEXPIREAT; a stream is built
//! whole, its trees bulk-loaded: `streams::import`), so a restored value
//! takes the same representation as one built by a client, and the whole
//! RESTORE, REPLACE's delete included, is one batch: crash-atomic, and no
//! other client sees the key half built. IDLETIME and FREQ are accepted and
//! checked as Redis checks them; Ember keeps no access times or counters to
//! set from them.

use super::unit::{self, Locks};
use super::{eq, int_arg, CmdError, Ctx, R};
use crate::keyspace::skey;
use crate::rdb::{self, RdbError, Value};
use crate::server::Client;
use proto::Reply;

/// Elements per internal write while filling a key.
const CHUNK: usize = 512;

fn bulks(r: Reply) -> Result<Vec<Vec<u8>>, CmdError> {
    match r {
        Reply::Array(v) => v
            .into_iter()
            .map(|x| match x {
                Reply::Bulk(b) => Ok(b),
                _ => Err(CmdError::Msg("an internal read gave an unexpected reply")),
            })
            .collect(),
        _ => Err(CmdError::Msg("an internal read gave an unexpected reply")),
    }
}

/// The value at `key` (None when absent), read inside the running unit.
pub(super) fn read_value(
    ctx: &mut Ctx,
    c: &mut Client,
    key: &[u8],
) -> Result<Option<Value>, CmdError> {
    let t = match unit::internal(ctx, c, &[b"TYPE", key])? {
        Reply::Simple(t) => t,
        _ => return Err(CmdError::Msg("an internal read gave an unexpected reply")),
    };
    let v = match t.as_str() {
        "none" => return Ok(None),
        "string" => match unit::internal(ctx, c, &[b"GET", key])? {
            Reply::Bulk(b) => Value::String(b),
            _ => return Ok(None),
        },
        "list" => Value::List(bulks(unit::internal(
            ctx,
            c,
            &[b"LRANGE", key, b"0", b"-1"],
        )?)?),
        "set" => Value::Set(bulks(unit::internal(ctx, c, &[b"SMEMBERS", key])?)?),
        "hash" => {
            let flat = bulks(unit::internal(ctx, c, &[b"HGETALL", key])?)?;
            Value::Hash(
                flat.chunks_exact(2)
                    .map(|p| (p[0].clone(), p[1].clone()))
                    .collect(),
            )
        }
        "zset" => {
            let flat = bulks(unit::internal(
                ctx,
                c,
                &[b"ZRANGE", key, b"0", b"-1", b"WITHSCORES"],
            )?)?;
            let mut v = Vec::with_capacity(flat.len() / 2);
            for p in flat.chunks_exact(2) {
                let s = std::str::from_utf8(&p[1])
                    .ok()
                    .and_then(|s| s.parse::<f64>().ok())
                    .ok_or(CmdError::NotFloat)?;
                v.push((p[0].clone(), s));
            }
            Value::Zset(v)
        }
        "stream" => match super::streams::export(ctx, &skey(c.db, key))? {
            Some(sv) => Value::Stream(sv),
            None => return Ok(None),
        },
        other => {
            return Err(CmdError::NotSupported {
                what: format!("DUMP of a {other}"),
                why: "",
            })
        }
    };
    Ok(Some(v))
}

pub fn dump(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    let key = a[1].clone();
    let sk = skey(c.db, &key);
    let mut found = None;
    unit::run(ctx, c, Locks::Keys(vec![sk]), |ctx, c| {
        found = read_value(ctx, c, &key)?;
        Ok(())
    })?;
    match found {
        Some(v) => c.bulk(&rdb::dump(&v)),
        None => c.null(),
    }
    Ok(())
}

/// Writes `v` at `key` (absent) with the type's write commands, in chunks.
fn write_value(ctx: &mut Ctx, c: &mut Client, key: &[u8], v: &Value) -> Result<(), CmdError> {
    let mut run = |cmd: &[u8], items: Vec<&[u8]>| -> Result<(), CmdError> {
        let mut args: Vec<&[u8]> = vec![cmd, key];
        args.extend(items);
        unit::internal(ctx, c, &args).map(|_| ())
    };
    match v {
        Value::String(s) => run(b"SET", vec![s])?,
        Value::Stream(sv) => super::streams::import(ctx, &skey(c.db, key), sv)?,
        Value::List(items) => {
            for ch in items.chunks(CHUNK) {
                run(b"RPUSH", ch.iter().map(|x| x.as_slice()).collect())?;
            }
        }
        Value::Set(items) => {
            for ch in items.chunks(CHUNK) {
                run(b"SADD", ch.iter().map(|x| x.as_slice()).collect())?;
            }
        }
        Value::Hash(pairs) => {
            for ch in pairs.chunks(CHUNK) {
                run(
                    b"HSET",
                    ch.iter()
                        .flat_map(|(f, x)| [f.as_slice(), x.as_slice()])
                        .collect(),
                )?;
            }
        }
        Value::Zset(members) => {
            for ch in members.chunks(CHUNK) {
                let scores: Vec<String> =
                    ch.iter().map(|(_, s)| proto::format_double(*s)).collect();
                let mut items: Vec<&[u8]> = Vec::with_capacity(ch.len() * 2);
                for ((m, _), s) in ch.iter().zip(&scores) {
                    items.push(s.as_bytes());
                    items.push(m);
                }
                run(b"ZADD", items)?;
            }
        }
    }
    Ok(())
}

pub fn restore(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    let (mut replace, mut absttl) = (false, false);
    let (mut idle, mut freq) = (None::<i64>, None::<i64>);
    let mut j = 4;
    while j < a.len() {
        let more = a.len() - j - 1;
        if eq(&a[j], "replace") {
            replace = true;
        } else if eq(&a[j], "absttl") {
            absttl = true;
        } else if eq(&a[j], "idletime") && more >= 1 && freq.is_none() {
            let v = int_arg(&a[j + 1])?;
            if v < 0 {
                return Err(CmdError::Msg("Invalid IDLETIME value, must be >= 0"));
            }
            idle = Some(v);
            j += 1;
        } else if eq(&a[j], "freq") && more >= 1 && idle.is_none() {
            let v = int_arg(&a[j + 1])?;
            if !(0..=255).contains(&v) {
                return Err(CmdError::Msg("Invalid FREQ value, must be >= 0 and <= 255"));
            }
            freq = Some(v);
            j += 1;
        } else {
            return Err(CmdError::Syntax);
        }
        j += 1;
    }
    let key = a[1].clone();
    let sk = skey(c.db, &key);
    let now = ctx.now;
    unit::run(ctx, c, Locks::Keys(vec![sk]), |ctx, c| {
        let exists = matches!(
            unit::internal(ctx, c, &[b"EXISTS", &key])?,
            Reply::Integer(n) if n > 0
        );
        if exists && !replace {
            return Err(CmdError::Text(
                "BUSYKEY Target key name already exists.".into(),
            ));
        }
        let ttl = int_arg(&a[2])?;
        if ttl < 0 {
            return Err(CmdError::Msg("Invalid TTL value, must be >= 0"));
        }
        let v = match rdb::restore(&a[3]) {
            Ok(v) => v,
            Err(RdbError::VersionOrChecksum) => {
                return Err(CmdError::Msg("DUMP payload version or checksum are wrong"))
            }
            Err(RdbError::BadFormat) => return Err(CmdError::Msg("Bad data format")),
        };
        let at = match ttl {
            0 => None,
            t if absttl => Some(t),
            t => Some(t.saturating_add(now)),
        };
        apply(ctx, c, &key, &v, at, replace && exists)?;
        c.ok();
        Ok(())
    })
}

/// Writes `v` at `key` (absent, or deleted first when `replaced`), expiring
/// at `at` (ms): the part of RESTORE after its checks, inside the unit. A
/// key already expired is not created (a replaced one is gone).
fn apply(
    ctx: &mut Ctx,
    c: &mut Client,
    key: &[u8],
    v: &Value,
    at: Option<i64>,
    replaced: bool,
) -> Result<bool, CmdError> {
    if replaced {
        unit::internal(ctx, c, &[b"DEL", key])?;
    }
    let db = c.db;
    if at.is_some_and(|t| t <= ctx.now) {
        if replaced {
            crate::notify::event(ctx, crate::notify::GENERIC, "del", db, key);
        }
        return Ok(false);
    }
    write_value(ctx, c, key, v)?;
    if let Some(t) = at {
        unit::internal(ctx, c, &[b"PEXPIREAT", key, t.to_string().as_bytes()])?;
    }
    crate::notify::event(ctx, crate::notify::GENERIC, "restore", db, key);
    Ok(true)
}

/// What [`put`] did with a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Put {
    Written,
    /// The key exists and `replace` was not given (RESTORE's BUSYKEY).
    Busy,
    /// Its expiry time has passed: nothing written.
    Expired,
}

/// RESTORE of a decoded value in `c`'s database, as one unit: `RESTORE key
/// ttl payload ABSTTL [REPLACE]` with `at` as the absolute TTL (None: no
/// TTL). For `ember import`.
pub(crate) fn put(
    ctx: &mut Ctx,
    c: &mut Client,
    key: &[u8],
    v: &Value,
    at: Option<i64>,
    replace: bool,
) -> Result<Put, CmdError> {
    let sk = skey(c.db, key);
    let mut done = Put::Busy;
    unit::run(ctx, c, Locks::Keys(vec![sk]), |ctx, c| {
        let exists = matches!(
            unit::internal(ctx, c, &[b"EXISTS", key])?,
            Reply::Integer(n) if n > 0
        );
        if exists && !replace {
            done = Put::Busy;
            return Ok(());
        }
        done = if apply(ctx, c, key, v, at, exists)? {
            Put::Written
        } else {
            Put::Expired
        };
        Ok(())
    })?;
    Ok(done)
}

/// The value at `key` in `c`'s database and its expiry time (ms), read as
/// one unit (None when absent). For `ember export`.
pub(crate) fn get(
    ctx: &mut Ctx,
    c: &mut Client,
    key: &[u8],
) -> Result<Option<(Value, Option<i64>)>, CmdError> {
    let sk = skey(c.db, key);
    let mut found = None;
    unit::run(ctx, c, Locks::Keys(vec![sk]), |ctx, c| {
        let Some(v) = read_value(ctx, c, key)? else {
            return Ok(());
        };
        let at = match unit::internal(ctx, c, &[b"PEXPIRETIME", key])? {
            Reply::Integer(t) if t >= 0 => Some(t),
            _ => None,
        };
        found = Some((v, at));
        Ok(())
    })?;
    Ok(found)
}
