//! Hash commands. A hash is inline (one head value, Redis's listpack: at
//! most 512 fields, each field and value at most 64 bytes, fields in
//! insertion order) or a table of pieces (Redis's hashtable); see
//! `crate::coll` and docs/design-collections.md. Every command runs under the
//! key's stripe lock, readers included (`crate::coll` says why).

use super::strings::{float_arg, format_incr_float};
use super::{eq, int_arg, maps, CmdError, Ctx, R};
use crate::keyspace::KIND_HASH;
use crate::notify::{self, event};
use crate::server::Client;
use engine::types::head::MapHead;
use engine::types::lhash::Pair;
use proto::{Reply, Version};

/// Redis's `hash-max-listpack-entries` and `hash-max-listpack-value`.
const MAX_INLINE_ENTRIES: usize = 512;
const MAX_INLINE_VALUE: usize = 64;

/// Sets a field; true when it is new. An inline hash that outgrows Redis's
/// listpack limits becomes a table (and stays one, as in Redis).
fn set_field(ctx: &mut Ctx, head: &mut MapHead, f: &[u8], v: &[u8]) -> Result<bool, CmdError> {
    if let MapHead::Inline(b) = head {
        let created = b.set(f, v);
        if b.0.len() > MAX_INLINE_ENTRIES
            || f.len() > MAX_INLINE_VALUE
            || v.len() > MAX_INLINE_VALUE
        {
            maps::convert(ctx, head)?;
        }
        return Ok(created);
    }
    maps::table_set(ctx, head, f, v)
}

fn modify<T>(
    ctx: &mut Ctx,
    c: &Client,
    key: &[u8],
    f: impl FnOnce(&mut Ctx, &mut MapHead) -> Result<T, CmdError>,
) -> Result<T, CmdError> {
    maps::modify(ctx, c, key, KIND_HASH, f)
}

fn read<T>(
    ctx: &mut Ctx,
    c: &Client,
    key: &[u8],
    f: impl FnOnce(&mut Ctx, Option<&MapHead>) -> Result<T, CmdError>,
) -> Result<T, CmdError> {
    maps::read(ctx, c, key, KIND_HASH, f)
}

pub fn hset(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    if !a.len().is_multiple_of(2) {
        return Err(super::arity_error(if eq(&a[0], "hmset") {
            "hmset"
        } else {
            "hset"
        }));
    }
    let added = modify(ctx, c, &a[1], |ctx, head| {
        let mut n = 0;
        for p in a[2..].chunks(2) {
            if set_field(ctx, head, &p[0], &p[1])? {
                n += 1;
            }
        }
        Ok(n)
    })?;
    if eq(&a[0], "hmset") {
        c.ok();
    } else {
        c.int(added);
    }
    event(ctx, notify::HASH, "hset", c.db, &a[1]);
    Ok(())
}

pub fn hsetnx(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    let set = modify(ctx, c, &a[1], |ctx, head| {
        if maps::get(ctx, head, &a[2])?.is_some() {
            return Ok(false);
        }
        set_field(ctx, head, &a[2], &a[3])
    })?;
    c.int(set as i64);
    if set {
        event(ctx, notify::HASH, "hset", c.db, &a[1]);
    }
    Ok(())
}

pub fn hget(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    match read(ctx, c, &a[1], |ctx, h| match h {
        Some(h) => maps::get(ctx, h, &a[2]),
        None => Ok(None),
    })? {
        Some(v) => c.bulk(&v),
        None => c.null(),
    }
    Ok(())
}

pub fn hmget(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    let vals = read(ctx, c, &a[1], |ctx, h| {
        a[2..]
            .iter()
            .map(|f| match h {
                Some(h) => maps::get(ctx, h, f),
                None => Ok(None),
            })
            .collect::<Result<Vec<_>, _>>()
    })?;
    c.array_header(vals.len());
    for v in vals {
        match v {
            Some(v) => c.bulk(&v),
            None => c.null(),
        }
    }
    Ok(())
}

pub fn hdel(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    let (n, emptied) = maps::remove_fields(ctx, c, &a[1], KIND_HASH, &a[2..])?;
    c.int(n);
    if n > 0 {
        event(ctx, notify::HASH, "hdel", c.db, &a[1]);
        if emptied {
            event(ctx, notify::GENERIC, "del", c.db, &a[1]);
        }
    }
    Ok(())
}

pub fn hlen(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    let n = read(ctx, c, &a[1], |_, h| Ok(h.map_or(0, |h| h.len())))?;
    c.int(n as i64);
    Ok(())
}

pub fn hexists(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    let found = read(ctx, c, &a[1], |ctx, h| match h {
        Some(h) => Ok(maps::get(ctx, h, &a[2])?.is_some()),
        None => Ok(false),
    })?;
    c.int(found as i64);
    Ok(())
}

pub fn hstrlen(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    let n = read(ctx, c, &a[1], |ctx, h| match h {
        Some(h) => Ok(maps::get(ctx, h, &a[2])?.map_or(0, |v| v.len())),
        None => Ok(0),
    })?;
    c.int(n as i64);
    Ok(())
}

/// Every pair of the hash (O(n)).
fn pairs(ctx: &mut Ctx, c: &Client, key: &[u8]) -> Result<Vec<Pair>, CmdError> {
    read(ctx, c, key, |ctx, h| match h {
        Some(h) => maps::all(ctx, h),
        None => Ok(Vec::new()),
    })
}

pub fn hgetall(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    let all = pairs(ctx, c, &a[1])?;
    c.reply(&Reply::Map(
        all.into_iter()
            .map(|(f, v)| (Reply::Bulk(f), Reply::Bulk(v)))
            .collect(),
    ));
    Ok(())
}

pub fn hkeys(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    let all = pairs(ctx, c, &a[1])?;
    c.array_header(all.len());
    for (f, _) in all {
        c.bulk(&f);
    }
    Ok(())
}

pub fn hvals(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    let all = pairs(ctx, c, &a[1])?;
    c.array_header(all.len());
    for (_, v) in all {
        c.bulk(&v);
    }
    Ok(())
}

pub fn hincrby(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    let by = int_arg(&a[3])?;
    let n = modify(ctx, c, &a[1], |ctx, head| {
        let cur = match maps::get(ctx, head, &a[2])? {
            Some(v) => proto::int::parse_i64(&v).ok_or(CmdError::HashNotInteger)?,
            None => 0,
        };
        let n = cur.checked_add(by).ok_or(CmdError::IncrOverflow)?;
        set_field(ctx, head, &a[2], n.to_string().as_bytes())?;
        Ok(n)
    })?;
    c.int(n);
    event(ctx, notify::HASH, "hincrby", c.db, &a[1]);
    Ok(())
}

pub fn hincrbyfloat(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    let by = float_arg(&a[3]).ok_or(CmdError::NotFloat)?;
    // Checked before the key's type, as Redis does.
    if !by.is_finite() {
        return Err(CmdError::NanOrInfinityArg);
    }
    let out = modify(ctx, c, &a[1], |ctx, head| {
        let cur = match maps::get(ctx, head, &a[2])? {
            Some(v) => float_arg(&v).ok_or(CmdError::HashNotFloat)?,
            None => 0.0,
        };
        let r = cur + by;
        if !r.is_finite() {
            return Err(CmdError::NanOrInfinity);
        }
        let s = format_incr_float(r);
        set_field(ctx, head, &a[2], s.as_bytes())?;
        Ok(s)
    })?;
    c.bulk(out.as_bytes());
    event(ctx, notify::HASH, "hincrbyfloat", c.db, &a[1]);
    Ok(())
}

/// HRANDFIELD key [count [WITHVALUES]], as Redis 7.0's: a negative count
/// may repeat fields; a positive one returns distinct fields (all of them
/// when it is at least the size).
pub fn hrandfield(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    if a.len() == 2 {
        match read(ctx, c, &a[1], |ctx, h| match h {
            Some(h) => maps::random(ctx, h),
            None => Ok(None),
        })? {
            Some((f, _)) => c.bulk(&f),
            None => c.null(),
        }
        return Ok(());
    }
    let (l, withvalues) = maps::rand_count_args(a, "withvalues")?;
    let picked = read(ctx, c, &a[1], |ctx, h| {
        let Some(h) = h else {
            return Ok(Vec::new());
        };
        maps::random_picks(ctx, h, l)
    })?;
    let resp3 = c.resp == Version::Resp3;
    if withvalues && !resp3 {
        c.array_header(picked.len() * 2);
    } else {
        c.array_header(picked.len());
    }
    for (f, v) in picked {
        if withvalues && resp3 {
            c.array_header(2);
        }
        c.bulk(&f);
        if withvalues {
            c.bulk(&v);
        }
    }
    Ok(())
}

/// HSCAN key cursor [MATCH pattern] [COUNT count] (`maps::scan`).
pub fn hscan(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    let (next, found) = maps::scan(ctx, c, a, KIND_HASH)?;
    c.array_header(2);
    c.bulk(next.to_string().as_bytes());
    c.array_header(found.len() * 2);
    for (f, v) in found {
        c.bulk(&f);
        c.bulk(&v);
    }
    Ok(())
}
