//! Set commands. A set is a map whose values are empty (`super::maps`):
//! inline while every member is an integer and there are at most 512 of
//! them (Redis 7.0's intset: members kept in ascending numeric order), a
//! table of pieces otherwise (Redis's hashtable, never converted back).

use super::maps;
use super::{int_arg, locked, CmdError, Ctx, R};
use crate::keyspace::{skey, KIND_SET};
use crate::notify::{self, event};
use crate::server::Client;
use engine::types::head::MapHead;
use engine::types::lhash::Bucket;
use proto::Reply;
use std::collections::HashSet;

/// Redis's `set-max-intset-entries`.
const MAX_INTSET: usize = 512;

/// Adds `m`; true when it is new.
fn add(ctx: &mut Ctx, head: &mut MapHead, m: &[u8]) -> Result<bool, CmdError> {
    if let MapHead::Inline(b) = head {
        if let Some(v) = proto::int::parse_i64(m) {
            let pos =
                b.0.partition_point(|(x, _)| proto::int::parse_i64(x).unwrap_or(i64::MIN) < v);
            if b.0.get(pos).is_some_and(|(x, _)| x.as_slice() == m) {
                return Ok(false);
            }
            b.0.insert(pos, (m.to_vec(), Vec::new()));
            if b.0.len() > MAX_INTSET {
                maps::convert(ctx, head)?;
            }
            return Ok(true);
        }
    }
    maps::table_set(ctx, head, m, b"")
}

fn contains(ctx: &mut Ctx, head: &MapHead, m: &[u8]) -> Result<bool, CmdError> {
    Ok(maps::get(ctx, head, m)?.is_some())
}

fn members(ctx: &mut Ctx, head: &MapHead) -> Result<Vec<Vec<u8>>, CmdError> {
    Ok(maps::all(ctx, head)?.into_iter().map(|(m, _)| m).collect())
}

/// A new set head holding `ms` (what a *STORE writes).
fn build(ctx: &mut Ctx, ms: &[Vec<u8>]) -> Result<MapHead, CmdError> {
    let mut head = MapHead::Inline(Bucket::default());
    for m in ms {
        add(ctx, &mut head, m)?;
    }
    Ok(head)
}

fn reply_set(c: &mut Client, ms: Vec<Vec<u8>>) {
    c.reply(&Reply::Set(ms.into_iter().map(Reply::Bulk).collect()));
}

pub fn sadd(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    let n = maps::modify(ctx, c, &a[1], KIND_SET, |ctx, head| {
        let mut n = 0;
        for m in &a[2..] {
            n += add(ctx, head, m)? as i64;
        }
        Ok(n)
    })?;
    c.int(n);
    if n > 0 {
        event(ctx, notify::SET, "sadd", c.db, &a[1]);
    }
    Ok(())
}

pub fn srem(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    let (n, emptied) = maps::remove_fields(ctx, c, &a[1], KIND_SET, &a[2..])?;
    c.int(n);
    if n > 0 {
        event(ctx, notify::SET, "srem", c.db, &a[1]);
        if emptied {
            event(ctx, notify::GENERIC, "del", c.db, &a[1]);
        }
    }
    Ok(())
}

pub fn smembers(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    let ms = maps::read(ctx, c, &a[1], KIND_SET, |ctx, h| match h {
        Some(h) => members(ctx, h),
        None => Ok(Vec::new()),
    })?;
    reply_set(c, ms);
    Ok(())
}

pub fn sismember(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    let found = maps::read(ctx, c, &a[1], KIND_SET, |ctx, h| match h {
        Some(h) => contains(ctx, h, &a[2]),
        None => Ok(false),
    })?;
    c.int(found as i64);
    Ok(())
}

pub fn smismember(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    let found = maps::read(ctx, c, &a[1], KIND_SET, |ctx, h| {
        a[2..]
            .iter()
            .map(|m| match h {
                Some(h) => contains(ctx, h, m),
                None => Ok(false),
            })
            .collect::<Result<Vec<_>, _>>()
    })?;
    c.array_header(found.len());
    for f in found {
        c.int(f as i64);
    }
    Ok(())
}

pub fn scard(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    let n = maps::read(ctx, c, &a[1], KIND_SET, |_, h| Ok(h.map_or(0, |h| h.len())))?;
    c.int(n as i64);
    Ok(())
}

/// SPOP key [count]: removes and returns random members (a set reply with a
/// count; all of them, and the key, when the count reaches the size).
pub fn spop(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    let count = match a.len() {
        2 => None,
        // Redis's getPositiveLong: a non-number gets the same error.
        3 => Some(
            proto::int::parse_i64(&a[2])
                .filter(|&l| l >= 0)
                .ok_or(CmdError::MustBePositive)? as u64,
        ),
        _ => return Err(CmdError::Syntax),
    };
    let sk = skey(c.db, &a[1]);
    let popped = locked(ctx, &[&sk], |ctx| {
        let Some(mut s) = maps::load(ctx, &sk, KIND_SET)? else {
            return Ok(None);
        };
        let want = count.unwrap_or(1);
        let picked = if want >= s.head.len() {
            members(ctx, &s.head)?
        } else {
            maps::random_distinct(ctx, &s.head, want)?
                .into_iter()
                .map(|(m, _)| m)
                .collect()
        };
        for m in &picked {
            maps::del(ctx, &mut s.head, m)?;
        }
        if !picked.is_empty() {
            maps::save(ctx, &sk, KIND_SET, &s);
        }
        Ok(Some((picked, s.head.is_empty())))
    })?;
    let popped = popped.map(|(p, emptied)| {
        if !p.is_empty() {
            event(ctx, notify::SET, "spop", c.db, &a[1]);
            if emptied {
                event(ctx, notify::GENERIC, "del", c.db, &a[1]);
            }
        }
        p
    });
    match (count, popped) {
        (None, Some(mut p)) if !p.is_empty() => c.bulk(&p.swap_remove(0)),
        (None, _) => c.null(),
        (Some(_), p) => reply_set(c, p.unwrap_or_default()),
    }
    Ok(())
}

/// SRANDMEMBER key [count]: a negative count may repeat members.
pub fn srandmember(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    if a.len() == 2 {
        match maps::read(ctx, c, &a[1], KIND_SET, |ctx, h| match h {
            Some(h) => maps::random(ctx, h),
            None => Ok(None),
        })? {
            Some((m, _)) => c.bulk(&m),
            None => c.null(),
        }
        return Ok(());
    }
    if a.len() > 3 {
        return Err(CmdError::Syntax);
    }
    let l = int_arg(&a[2])?;
    if l == i64::MIN {
        return Err(CmdError::RangeBetween {
            min: -i64::MAX,
            max: i64::MAX,
        });
    }
    let picked = maps::read(ctx, c, &a[1], KIND_SET, |ctx, h| {
        let Some(h) = h else {
            return Ok(Vec::new());
        };
        Ok(maps::random_picks(ctx, h, l)?
            .into_iter()
            .map(|(m, _)| m)
            .collect())
    })?;
    c.array_header(picked.len());
    for m in picked {
        c.bulk(&m);
    }
    Ok(())
}

pub fn smove(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    let (src, dst) = (skey(c.db, &a[1]), skey(c.db, &a[2]));
    let moved = locked(ctx, &[&src, &dst], |ctx| {
        let Some(mut s) = maps::load(ctx, &src, KIND_SET)? else {
            return Ok(None);
        };
        let d = maps::load(ctx, &dst, KIND_SET)?;
        if src == dst {
            return Ok(contains(ctx, &s.head, &a[3])?.then_some(None));
        }
        if !maps::del(ctx, &mut s.head, &a[3])? {
            return Ok(None);
        }
        maps::save(ctx, &src, KIND_SET, &s);
        let mut d = d.unwrap_or(maps::Map {
            expire: None,
            head: MapHead::Inline(Bucket::default()),
        });
        let added = add(ctx, &mut d.head, &a[3])?;
        maps::save(ctx, &dst, KIND_SET, &d);
        Ok(Some(Some((s.head.is_empty(), added))))
    })?;
    c.int(moved.is_some() as i64);
    if let Some(Some((emptied, added))) = moved {
        event(ctx, notify::SET, "srem", c.db, &a[1]);
        if emptied {
            event(ctx, notify::GENERIC, "del", c.db, &a[1]);
        }
        if added {
            event(ctx, notify::SET, "sadd", c.db, &a[2]);
        }
    }
    Ok(())
}

/// The set operations.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Op {
    Inter,
    Union,
    Diff,
}

/// Runs `op` over the sets at `keys` (stripe locks held): every key is
/// type-checked first (a missing key is an empty set), then the result is
/// computed; `limit` stops an intersection early (SINTERCARD, 0: none).
fn combine(ctx: &mut Ctx, keys: &[Vec<u8>], op: Op, limit: u64) -> Result<Vec<Vec<u8>>, CmdError> {
    let mut sets = Vec::with_capacity(keys.len());
    for sk in keys {
        sets.push(maps::load(ctx, sk, KIND_SET)?.map(|m| m.head));
    }
    match op {
        Op::Inter => {
            if sets.iter().any(|s| s.is_none()) {
                return Ok(Vec::new());
            }
            let mut heads: Vec<MapHead> = sets.into_iter().flatten().collect();
            // Walk the smallest set, probing the others.
            heads.sort_by_key(|h| h.len());
            let first = members(ctx, &heads[0])?;
            let mut out = Vec::new();
            'm: for m in first {
                for h in &heads[1..] {
                    if !contains(ctx, h, &m)? {
                        continue 'm;
                    }
                }
                out.push(m);
                if limit > 0 && out.len() as u64 >= limit {
                    break;
                }
            }
            Ok(out)
        }
        Op::Union => {
            let mut seen = HashSet::new();
            let mut out = Vec::new();
            for h in sets.iter().flatten() {
                for m in members(ctx, h)? {
                    if seen.insert(m.clone()) {
                        out.push(m);
                    }
                }
            }
            Ok(out)
        }
        Op::Diff => {
            let Some(Some(first)) = sets.first() else {
                return Ok(Vec::new());
            };
            let mut out = Vec::new();
            'd: for m in members(ctx, first)? {
                for h in sets[1..].iter().flatten() {
                    if contains(ctx, h, &m)? {
                        continue 'd;
                    }
                }
                out.push(m);
            }
            Ok(out)
        }
    }
}

fn combine_cmd(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>], op: Op) -> R {
    let keys: Vec<Vec<u8>> = a[1..].iter().map(|k| skey(c.db, k)).collect();
    let refs: Vec<&[u8]> = keys.iter().map(|k| k.as_slice()).collect();
    let out = locked(ctx, &refs, |ctx| combine(ctx, &keys, op, 0))?;
    reply_set(c, out);
    Ok(())
}

fn store_cmd(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>], op: Op) -> R {
    let dst = skey(c.db, &a[1]);
    let keys: Vec<Vec<u8>> = a[2..].iter().map(|k| skey(c.db, k)).collect();
    let mut refs: Vec<&[u8]> = keys.iter().map(|k| k.as_slice()).collect();
    refs.push(&dst);
    let (n, existed) = locked(ctx, &refs, |ctx| {
        let out = combine(ctx, &keys, op, 0)?;
        // The destination is replaced whatever it held.
        let existed = ctx.ks.delete(&dst, ctx.now)?;
        let head = build(ctx, &out)?;
        maps::save(ctx, &dst, KIND_SET, &maps::Map { expire: None, head });
        Ok((out.len(), existed))
    })?;
    c.int(n as i64);
    if n > 0 {
        let name = match op {
            Op::Inter => "sinterstore",
            Op::Union => "sunionstore",
            Op::Diff => "sdiffstore",
        };
        event(ctx, notify::SET, name, c.db, &a[1]);
    } else if existed {
        event(ctx, notify::GENERIC, "del", c.db, &a[1]);
    }
    Ok(())
}

pub fn sinter(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    combine_cmd(ctx, c, a, Op::Inter)
}
pub fn sunion(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    combine_cmd(ctx, c, a, Op::Union)
}
pub fn sdiff(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    combine_cmd(ctx, c, a, Op::Diff)
}
pub fn sinterstore(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    store_cmd(ctx, c, a, Op::Inter)
}
pub fn sunionstore(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    store_cmd(ctx, c, a, Op::Union)
}
pub fn sdiffstore(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    store_cmd(ctx, c, a, Op::Diff)
}

/// SINTERCARD numkeys key [key ...] [LIMIT limit].
pub fn sintercard(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    let numkeys = proto::int::parse_i64(&a[1])
        .filter(|&n| n >= 1)
        .ok_or(CmdError::NumkeysNotPositive)?;
    if numkeys > a.len() as i64 - 2 {
        return Err(CmdError::NumkeysTooMany);
    }
    let nk = numkeys as usize;
    let mut limit = 0u64;
    let mut j = 2 + nk;
    while j < a.len() {
        if super::eq(&a[j], "limit") && j + 1 < a.len() {
            limit = proto::int::parse_i64(&a[j + 1])
                .filter(|&n| n >= 0)
                .ok_or(CmdError::LimitNegative)? as u64;
            j += 2;
        } else {
            return Err(CmdError::Syntax);
        }
    }
    let keys: Vec<Vec<u8>> = a[2..2 + nk].iter().map(|k| skey(c.db, k)).collect();
    let refs: Vec<&[u8]> = keys.iter().map(|k| k.as_slice()).collect();
    let out = locked(ctx, &refs, |ctx| combine(ctx, &keys, Op::Inter, limit))?;
    c.int(out.len() as i64);
    Ok(())
}

/// SSCAN key cursor [MATCH pattern] [COUNT count] (`maps::scan`).
pub fn sscan(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    let (next, found) = maps::scan(ctx, c, a, KIND_SET)?;
    c.array_header(2);
    c.bulk(next.to_string().as_bytes());
    c.array_header(found.len());
    for (m, _) in found {
        c.bulk(&m);
    }
    Ok(())
}
