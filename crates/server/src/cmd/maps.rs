//! What hashes and sets share: a head that is inline (one value) or a table
//! of pieces (`engine::types::head::MapHead`), read and written under the
//! key's stripe lock (readers too: see `crate::coll`), random picks and
//! cursor scans. A set is a map whose values are empty.

use super::{eq, int_arg, locked, CmdError, Ctx};
use crate::coll::{self, KsPieces};
use crate::glob::Glob;
use crate::keyspace::skey;
use crate::server::Client;
use engine::types::head::MapHead;
use engine::types::lhash::{Bucket, Pair, Table};

/// A hash or set read under its stripe lock: its expiry and head.
pub(crate) struct Map {
    pub expire: Option<i64>,
    pub head: MapHead,
}

/// The map of type `kind` at `sk` (stripe lock held): None when absent;
/// WRONGTYPE for another type.
pub(crate) fn load(ctx: &mut Ctx, sk: &[u8], kind: u8) -> Result<Option<Map>, CmdError> {
    Ok(
        super::load_head(ctx, sk, kind, MapHead::decode)?
            .map(|(expire, head)| Map { expire, head }),
    )
}

/// Stages the map's new head; an emptied map is deleted.
pub(crate) fn save(ctx: &mut Ctx, sk: &[u8], kind: u8, m: &Map) {
    super::save_head(ctx, sk, kind, m.expire, m.head.is_empty(), |out| {
        m.head.encode(out)
    });
}

/// Runs `f` on the map of type `kind` at `key` (created empty when absent)
/// under its stripe lock, then stages its new head.
pub(crate) fn modify<T>(
    ctx: &mut Ctx,
    c: &Client,
    key: &[u8],
    kind: u8,
    f: impl FnOnce(&mut Ctx, &mut MapHead) -> Result<T, CmdError>,
) -> Result<T, CmdError> {
    let sk = skey(c.db, key);
    locked(ctx, &[&sk], |ctx| {
        let mut m = load(ctx, &sk, kind)?.unwrap_or(Map {
            expire: None,
            head: MapHead::Inline(Bucket::default()),
        });
        let r = f(ctx, &mut m.head)?;
        save(ctx, &sk, kind, &m);
        Ok(r)
    })
}

/// Runs `f` on the map at `key` under its stripe lock, for a reader (`None`
/// when absent).
pub(crate) fn read<T>(
    ctx: &mut Ctx,
    c: &Client,
    key: &[u8],
    kind: u8,
    f: impl FnOnce(&mut Ctx, Option<&MapHead>) -> Result<T, CmdError>,
) -> Result<T, CmdError> {
    let sk = skey(c.db, key);
    locked(ctx, &[&sk], |ctx| {
        let m = load(ctx, &sk, kind)?;
        f(ctx, m.as_ref().map(|m| &m.head))
    })
}

/// The value of field `f`.
pub(crate) fn get(ctx: &mut Ctx, head: &MapHead, f: &[u8]) -> Result<Option<Vec<u8>>, CmdError> {
    Ok(match head {
        MapHead::Inline(b) => b.find(f).map(|i| b.0[i].1.clone()),
        MapHead::Table { id, meta } => {
            let mut meta = *meta;
            Table::new(&mut KsPieces::new(ctx.ks, *id), &mut meta).get(f)?
        }
    })
}

/// Sets field `f` in the table of `head` (converting an inline head
/// first); true when it is new.
pub(crate) fn table_set(
    ctx: &mut Ctx,
    head: &mut MapHead,
    f: &[u8],
    v: &[u8],
) -> Result<bool, CmdError> {
    convert(ctx, head)?;
    match head {
        MapHead::Table { id, meta } => {
            Ok(Table::new(&mut KsPieces::new(ctx.ks, *id), meta).set(f, v)?)
        }
        MapHead::Inline(_) => Err(CmdError::Store(crate::keyspace::KsError::Corrupt)),
    }
}

/// Converts an inline head to a table (Redis's conversion to a hashtable,
/// which it never undoes).
pub(crate) fn convert(ctx: &mut Ctx, head: &mut MapHead) -> Result<(), CmdError> {
    if let MapHead::Inline(b) = head {
        coll::mark_pieced(ctx.sh, ctx.ks);
        *head = coll::to_table(ctx.ks, std::mem::take(b))?;
    }
    Ok(())
}

/// Deletes field `f`; true when it was there.
pub(crate) fn del(ctx: &mut Ctx, head: &mut MapHead, f: &[u8]) -> Result<bool, CmdError> {
    match head {
        MapHead::Inline(b) => Ok(b.del(f)),
        MapHead::Table { id, meta } => {
            Ok(Table::new(&mut KsPieces::new(ctx.ks, *id), meta).del(f)?)
        }
    }
}

/// Deletes `fields` from the map of type `kind` at `key` (HDEL, SREM);
/// returns how many were there, and whether that emptied (deleted) it.
pub(crate) fn remove_fields(
    ctx: &mut Ctx,
    c: &Client,
    key: &[u8],
    kind: u8,
    fields: &[Vec<u8>],
) -> Result<(i64, bool), CmdError> {
    let sk = skey(c.db, key);
    locked(ctx, &[&sk], |ctx| {
        let Some(mut m) = load(ctx, &sk, kind)? else {
            return Ok((0, false));
        };
        let mut n = 0;
        for f in fields {
            n += del(ctx, &mut m.head, f)? as i64;
        }
        if n > 0 {
            save(ctx, &sk, kind, &m);
        }
        Ok((n, m.head.is_empty()))
    })
}

/// Every pair (O(n)).
pub(crate) fn all(ctx: &mut Ctx, head: &MapHead) -> Result<Vec<Pair>, CmdError> {
    Ok(coll::map_pairs(ctx.ks, head)?)
}

/// A random number below `n`.
pub(crate) fn below(n: u64) -> u64 {
    use rand::RngExt;
    rand::rng().random_range(0..n.max(1))
}

/// One random pair (a table: a random non-empty bucket, then a random pair
/// of it).
pub(crate) fn random(ctx: &mut Ctx, head: &MapHead) -> Result<Option<Pair>, CmdError> {
    Ok(match head {
        MapHead::Inline(b) if b.0.is_empty() => None,
        MapHead::Inline(b) => Some(b.0[below(b.0.len() as u64) as usize].clone()),
        MapHead::Table { id, meta } => {
            let mut meta = *meta;
            Table::new(&mut KsPieces::new(ctx.ks, *id), &mut meta).random(below)?
        }
    })
}

/// `count` distinct random pairs (all of them when `count` is at least the
/// size). As Redis: for a count that is a small part of the map, random
/// picks until enough distinct ones came up (each pick is new with
/// probability at least 2/3); otherwise every pair, less random ones.
pub(crate) fn random_distinct(
    ctx: &mut Ctx,
    head: &MapHead,
    count: u64,
) -> Result<Vec<Pair>, CmdError> {
    if count.saturating_mul(3) <= head.len() {
        let mut seen = std::collections::HashSet::new();
        let mut out = Vec::with_capacity(count as usize);
        while (out.len() as u64) < count {
            let Some(p) = random(ctx, head)? else { break };
            if seen.insert(p.0.clone()) {
                out.push(p);
            }
        }
        return Ok(out);
    }
    let mut all = all(ctx, head)?;
    while all.len() as u64 > count {
        let i = below(all.len() as u64) as usize;
        all.swap_remove(i);
    }
    Ok(all)
}

/// The count and flag of HRANDFIELD/ZRANDMEMBER `key count [flag]` (`a`
/// has at least 3 arguments), checked in Redis's order: the count's range,
/// then the flag's syntax, then the range a flagged count may have (its
/// reply is twice as long).
pub(crate) fn rand_count_args(a: &[Vec<u8>], flag: &str) -> Result<(i64, bool), CmdError> {
    let l = int_arg(&a[2])?;
    if l == i64::MIN {
        return Err(CmdError::RangeBetween {
            min: -i64::MAX,
            max: i64::MAX,
        });
    }
    let flagged = match a.len() {
        3 => false,
        4 if eq(&a[3], flag) => true,
        _ => return Err(CmdError::Syntax),
    };
    if flagged && !(-i64::MAX / 2..=i64::MAX / 2).contains(&l) {
        return Err(CmdError::ValueOutOfRange);
    }
    Ok((l, flagged))
}

/// Most repeated random picks one request may ask for: a count beyond it (Redis
/// would try to build a reply of that many elements, for hours) is refused
/// as out of range rather than stall the worker.
const MAX_PICKS: u64 = 1 << 32;

/// HRANDFIELD's and SRANDMEMBER's picks for count `l`: a negative count
/// may repeat pairs (every pick samples the whole map), a positive one
/// gives distinct pairs.
pub(crate) fn random_picks(ctx: &mut Ctx, head: &MapHead, l: i64) -> Result<Vec<Pair>, CmdError> {
    let count = l.unsigned_abs();
    if l >= 0 {
        return random_distinct(ctx, head, count);
    }
    if count > MAX_PICKS {
        return Err(CmdError::ValueOutOfRange);
    }
    let mut out = Vec::with_capacity(count.min(1 << 20) as usize);
    for _ in 0..count {
        out.extend(random(ctx, head)?);
    }
    Ok(out)
}

/// The MATCH and COUNT options of a collection scan (Redis's
/// `scanGenericCommand`: COUNT below 1 and unknown options are syntax
/// errors).
pub(crate) fn scan_options(opts: &[Vec<u8>]) -> Result<(Option<&[u8]>, usize), CmdError> {
    let mut pat = None;
    let mut count = 10usize;
    let mut i = 0;
    while i < opts.len() {
        let Some(v) = opts.get(i + 1) else {
            return Err(CmdError::Syntax);
        };
        if eq(&opts[i], "match") {
            pat = Some(v.as_slice());
        } else if eq(&opts[i], "count") {
            let n = int_arg(v)?;
            if n < 1 {
                return Err(CmdError::Syntax);
            }
            count = n.min(1 << 20) as usize;
        } else {
            return Err(CmdError::Syntax);
        }
        i += 2;
    }
    Ok((pat, count))
}

/// HSCAN/SSCAN `key cursor [MATCH pattern] [COUNT count]` on the map at
/// `a[1]`: an inline map is returned whole with cursor 0 (as Redis does for a
/// listpack or intset); a table is walked bucket class by bucket class
/// (`lhash::Table::scan`), at most ten steps per element asked for.
pub(crate) fn scan(
    ctx: &mut Ctx,
    c: &Client,
    a: &[Vec<u8>],
    kind: u8,
) -> Result<(u64, Vec<Pair>), CmdError> {
    let cursor = proto::int::parse_cursor(&a[2]).ok_or(CmdError::InvalidCursor)?;
    let sk = skey(c.db, &a[1]);
    locked(ctx, &[&sk], |ctx| {
        let Some(m) = load(ctx, &sk, kind)? else {
            return Ok((0, Vec::new()));
        };
        let (pat, count) = scan_options(&a[3..])?;
        let glob = pat.filter(|p| *p != b"*").map(|p| Glob::new(p, false));
        let mut out = Vec::new();
        let mut push = |f: &[u8], v: &[u8]| {
            if glob.as_ref().is_none_or(|g| g.matches(f)) {
                out.push((f.to_vec(), v.to_vec()));
            }
        };
        let next = match &m.head {
            MapHead::Inline(b) => {
                for (f, v) in &b.0 {
                    push(f, v);
                }
                0
            }
            MapHead::Table { id, meta } => {
                let mut meta = *meta;
                scan_table(ctx, *id, &mut meta, cursor, count, push)?
            }
        };
        Ok((next, out))
    })
}

/// One step of a table scan from `cursor` (`lhash::Table::scan`, bucket
/// class by bucket class): stops after `count` pairs were seen, at the end,
/// or after ten steps per pair asked for. Returns the next cursor (0: done).
pub(crate) fn scan_table(
    ctx: &mut Ctx,
    id: u64,
    meta: &mut engine::types::lhash::Meta,
    cursor: u64,
    count: usize,
    mut push: impl FnMut(&[u8], &[u8]),
) -> Result<u64, CmdError> {
    let mut p = KsPieces::new(ctx.ks, id);
    let mut t = Table::new(&mut p, meta);
    let mut cur = cursor;
    let mut steps = count.saturating_mul(10);
    let mut seen = 0usize;
    loop {
        cur = t.scan(cur, |f, v| {
            seen += 1;
            push(f, v);
        })?;
        steps -= 1;
        if cur == 0 || seen >= count || steps == 0 {
            break;
        }
    }
    Ok(cur)
}

/// OBJECT ENCODING of a map's head (`inline`: what Redis calls its small
/// encoding for the type, listpack or intset).
pub(crate) fn encoding(head: &[u8], inline: &'static str) -> &'static str {
    match MapHead::decode(head) {
        Ok(MapHead::Inline(_)) => inline,
        Ok(MapHead::Table { .. }) => "hashtable",
        Err(_) => "unknown",
    }
}
