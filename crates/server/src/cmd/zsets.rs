//! Sorted-set commands. A sorted set is inline (one head value holding its
//! elements in (score, member) order: Redis's listpack, at most 128 elements
//! of at most 64 bytes) or, past that, an ordered counted B+-tree of pieces
//! (the order and the ranks) beside a linear-hashing table of pieces (member
//! to score): Redis's skiplist and dict (`engine::types::head::ZsetHead`).
//! ZADD, ZREM, ZINCRBY, ZSCORE, ZRANK and the start of every range cost
//! O(log n) pieces; a range of m elements O(log n + m). Every command runs
//! under its keys' stripe locks, readers included (`crate::coll`).

use super::strings::float_arg;
use super::{eq, int_arg, locked, maps, CmdError, Ctx, R};
use crate::blocking::{self, Try, Wait};
use crate::coll::{self, KsPieces};
use crate::keyspace::{skey, KIND_SET, KIND_ZSET};
use crate::notify::{self, event};
use crate::server::Client;
use engine::types::head::{MapHead, ZsetHead};
use engine::types::lhash::{self, Table};
use engine::types::node::Entry;
use engine::types::tree::{self, Tree};
use proto::{Reply, Version};
use std::cmp::Ordering;

/// Redis's `zset-max-listpack-entries` and `zset-max-listpack-value`.
const MAX_INLINE_ENTRIES: usize = 128;
const MAX_INLINE_VALUE: usize = 64;

/// A sorted set read under its stripe lock.
pub(crate) struct Zset {
    expire: Option<i64>,
    pub(crate) head: ZsetHead,
}

pub(crate) fn load(ctx: &mut Ctx, sk: &[u8]) -> Result<Option<Zset>, CmdError> {
    Ok(super::load_head(ctx, sk, KIND_ZSET, ZsetHead::decode)?
        .map(|(expire, head)| Zset { expire, head }))
}

/// Stages the set's new head; an emptied set is deleted.
fn save(ctx: &mut Ctx, sk: &[u8], z: &Zset) {
    super::save_head(ctx, sk, KIND_ZSET, z.expire, z.head.is_empty(), |out| {
        z.head.encode(out)
    });
}

fn new_zset() -> Zset {
    Zset {
        expire: None,
        head: ZsetHead::Inline(Vec::new()),
    }
}

fn with_tree<T>(
    ctx: &mut Ctx,
    id: u64,
    meta: &mut tree::Meta,
    f: impl FnOnce(&mut Tree<KsPieces>) -> engine::Result<T>,
) -> Result<T, CmdError> {
    let mut p = KsPieces::new(ctx.ks, id);
    let mut t = Tree::new(&mut p, meta, true);
    Ok(f(&mut t)?)
}

fn with_map<T>(
    ctx: &mut Ctx,
    id: u64,
    meta: &mut lhash::Meta,
    f: impl FnOnce(&mut Table<KsPieces>) -> engine::Result<T>,
) -> Result<T, CmdError> {
    let mut p = KsPieces::new(ctx.ks, id);
    let mut t = Table::new(&mut p, meta);
    Ok(f(&mut t)?)
}

fn decode_score(b: &[u8]) -> Result<f64, CmdError> {
    Ok(f64::from_le_bytes(b.try_into().map_err(|_| {
        CmdError::Store(crate::keyspace::KsError::Corrupt)
    })?))
}

// ---- the structure's operations ----

/// The score of member `m`.
pub(crate) fn score_of(ctx: &mut Ctx, head: &ZsetHead, m: &[u8]) -> Result<Option<f64>, CmdError> {
    match head {
        ZsetHead::Inline(v) => Ok(v.iter().find(|e| e.bytes == m).map(|e| e.score)),
        ZsetHead::Tree { id, map, .. } => {
            let mut map = *map;
            match with_map(ctx, *id, &mut map, |t| t.get(m))? {
                Some(b) => decode_score(&b).map(Some),
                None => Ok(None),
            }
        }
    }
}

/// Inserts member `m`, which is not in the set. An inline set that outgrows
/// Redis's listpack limits becomes a tree (for good, as in Redis).
fn insert(ctx: &mut Ctx, head: &mut ZsetHead, score: f64, m: &[u8]) -> Result<(), CmdError> {
    match head {
        ZsetHead::Inline(v) if v.len() >= MAX_INLINE_ENTRIES || m.len() > MAX_INLINE_VALUE => {
            // Converted first, as Redis does: the new element goes into the
            // skiplist with its score as given.
            convert(ctx, head)?;
            insert(ctx, head, score, m)
        }
        ZsetHead::Inline(v) => {
            // A listpack keeps a score as text, and reads "-0" back as 0.
            let score = if score == 0.0 { 0.0 } else { score };
            let pos = v.partition_point(|e| e.cmp_key(score, m) == Ordering::Less);
            v.insert(pos, Entry::new(score, m.to_vec()));
            Ok(())
        }
        ZsetHead::Tree { id, tree, map } => {
            with_tree(ctx, *id, tree, |t| t.insert_key(score, m))?;
            with_map(ctx, *id, map, |t| t.set(m, &score.to_le_bytes()))?;
            Ok(())
        }
    }
}

/// Converts an inline head to a tree and a table.
fn convert(ctx: &mut Ctx, head: &mut ZsetHead) -> Result<(), CmdError> {
    if let ZsetHead::Inline(v) = head {
        let items = std::mem::take(v);
        *head = bulk(ctx, items)?;
    }
    Ok(())
}

/// A tree-and-table head holding `entries` (in order, members distinct),
/// each piece written once.
fn bulk(ctx: &mut Ctx, entries: Vec<Entry>) -> Result<ZsetHead, CmdError> {
    coll::mark_pieced(ctx.sh, ctx.ks);
    let id = coll::new_id();
    let (mut tree, mut map) = (tree::Meta::new(), lhash::Meta::new(id));
    let pairs = entries
        .iter()
        .map(|e| (e.bytes.clone(), e.score.to_le_bytes().to_vec()))
        .collect();
    with_map(ctx, id, &mut map, |t| t.bulk_load(pairs))?;
    with_tree(ctx, id, &mut tree, |t| t.bulk_load(entries))?;
    Ok(ZsetHead::Tree { id, tree, map })
}

/// Removes member `m` whose score is `score`.
fn remove(ctx: &mut Ctx, head: &mut ZsetHead, score: f64, m: &[u8]) -> Result<(), CmdError> {
    match head {
        ZsetHead::Inline(v) => {
            if let Some(i) = v.iter().position(|e| e.bytes == m) {
                v.remove(i);
            }
            Ok(())
        }
        ZsetHead::Tree { id, tree, map } => {
            with_tree(ctx, *id, tree, |t| t.remove_key(score, m))?;
            with_map(ctx, *id, map, |t| t.del(m))?;
            Ok(())
        }
    }
}

/// Moves member `m` from score `old` to `new`: in a tree, a remove and an
/// insert in the order and one overwrite in the table (not a delete and an
/// insert there, which could shrink and regrow it).
fn rescore(
    ctx: &mut Ctx,
    head: &mut ZsetHead,
    old: f64,
    new: f64,
    m: &[u8],
) -> Result<(), CmdError> {
    match head {
        ZsetHead::Inline(_) => {
            remove(ctx, head, old, m)?;
            insert(ctx, head, new, m)
        }
        ZsetHead::Tree { id, tree, map } => {
            with_tree(ctx, *id, tree, |t| {
                t.remove_key(old, m)?;
                t.insert_key(new, m)
            })?;
            with_map(ctx, *id, map, |t| t.set(m, &new.to_le_bytes()))?;
            Ok(())
        }
    }
}

/// The rank (from the lowest) of member `m` whose score is `score`.
fn rank_of(ctx: &mut Ctx, head: &ZsetHead, score: f64, m: &[u8]) -> Result<Option<u64>, CmdError> {
    match head {
        ZsetHead::Inline(v) => Ok(v.iter().position(|e| e.bytes == m).map(|i| i as u64)),
        ZsetHead::Tree { id, tree, .. } => {
            let mut tree = *tree;
            with_tree(ctx, *id, &mut tree, |t| t.rank_of(score, m))
        }
    }
}

/// Elements of ranks `start..=end` (valid ranks), from `end` down when
/// `rev`.
pub(crate) fn range(
    ctx: &mut Ctx,
    head: &ZsetHead,
    start: u64,
    end: u64,
    rev: bool,
) -> Result<Vec<Entry>, CmdError> {
    match head {
        ZsetHead::Inline(v) => {
            let s = &v[start as usize..=end as usize];
            Ok(if rev {
                s.iter().rev().cloned().collect()
            } else {
                s.to_vec()
            })
        }
        ZsetHead::Tree { id, tree, .. } => {
            let mut tree = *tree;
            let mut out = Vec::with_capacity((end - start + 1).min(1 << 16) as usize);
            with_tree(ctx, *id, &mut tree, |t| {
                t.for_range(start, end, rev, |e| {
                    out.push(e.clone());
                    true
                })
            })?;
            Ok(out)
        }
    }
}

/// Every element, in order (O(n)).
pub(crate) fn all(ctx: &mut Ctx, head: &ZsetHead) -> Result<Vec<Entry>, CmdError> {
    match head.len() {
        0 => Ok(Vec::new()),
        n => range(ctx, head, 0, n - 1, false),
    }
}

/// How many elements satisfy `before`, a predicate true for a prefix of the
/// order: the rank where the rest begins.
pub(crate) fn count_before(
    ctx: &mut Ctx,
    head: &ZsetHead,
    before: impl Fn(&Entry) -> bool,
) -> Result<u64, CmdError> {
    match head {
        ZsetHead::Inline(v) => Ok(v.partition_point(before) as u64),
        ZsetHead::Tree { id, tree, .. } => {
            let mut tree = *tree;
            with_tree(ctx, *id, &mut tree, |t| t.count_before(before))
        }
    }
}

/// Removes and returns the element of rank `rank`.
fn remove_rank(ctx: &mut Ctx, head: &mut ZsetHead, rank: u64) -> Result<Entry, CmdError> {
    match head {
        ZsetHead::Inline(v) => Ok(v.remove(rank as usize)),
        ZsetHead::Tree { id, tree, map } => {
            let e = with_tree(ctx, *id, tree, |t| t.remove_rank(rank))?;
            with_map(ctx, *id, map, |t| t.del(&e.bytes))?;
            Ok(e)
        }
    }
}

/// Removes the elements of ranks `lo..hi`; returns how many.
fn remove_ranks(ctx: &mut Ctx, head: &mut ZsetHead, lo: u64, hi: u64) -> Result<u64, CmdError> {
    if hi <= lo {
        return Ok(0);
    }
    if let ZsetHead::Inline(v) = head {
        v.drain(lo as usize..hi as usize);
        return Ok(hi - lo);
    }
    for _ in lo..hi {
        remove_rank(ctx, head, lo)?;
    }
    Ok(hi - lo)
}

/// A head holding `entries` (in order, members distinct): inline when
/// Redis would make it a listpack (what a *STORE writes).
fn build(ctx: &mut Ctx, entries: Vec<Entry>) -> Result<ZsetHead, CmdError> {
    if entries.len() <= MAX_INLINE_ENTRIES
        && entries.iter().all(|e| e.bytes.len() <= MAX_INLINE_VALUE)
    {
        // As `insert`: a listpack reads "-0" back as 0.
        let mut entries = entries;
        for e in &mut entries {
            if e.score == 0.0 {
                e.score = 0.0;
            }
        }
        return Ok(ZsetHead::Inline(entries));
    }
    bulk(ctx, entries)
}

/// Stages `entries` (in order) as the new value of `dst`, replacing
/// whatever it held; an empty result deletes `dst`. Returns the size, and
/// whether `dst` held a value.
pub(crate) fn store(
    ctx: &mut Ctx,
    dst: &[u8],
    entries: Vec<Entry>,
) -> Result<(u64, bool), CmdError> {
    let existed = ctx.ks.delete(dst, ctx.now)?;
    let n = entries.len() as u64;
    if n > 0 {
        let head = build(ctx, entries)?;
        save(ctx, dst, &Zset { expire: None, head });
    }
    Ok((n, existed))
}

/// The event of a *STORE: `name` on the destination, or `del` when an
/// empty result deleted what it held.
pub(crate) fn store_events(
    ctx: &mut Ctx,
    db: u8,
    dst: &[u8],
    name: &'static str,
    (n, existed): (u64, bool),
) {
    if n > 0 {
        event(ctx, notify::ZSET, name, db, dst);
    } else if existed {
        event(ctx, notify::GENERIC, "del", db, dst);
    }
}

/// The events of a pop from `key`: `zpopmin`/`zpopmax`, then `del` when
/// it emptied it.
fn pop_events(ctx: &mut Ctx, db: u8, key: &[u8], max: bool, emptied: bool) {
    event(
        ctx,
        notify::ZSET,
        if max { "zpopmax" } else { "zpopmin" },
        db,
        key,
    );
    if emptied {
        event(ctx, notify::GENERIC, "del", db, key);
    }
}

// ---- ranges ----

/// A score range (Redis's `zrangespec`).
#[derive(Clone, Copy, Debug)]
struct ScoreRange {
    min: f64,
    max: f64,
    minex: bool,
    maxex: bool,
}

impl ScoreRange {
    /// Below the range (a prefix of the order).
    fn below(&self, s: f64) -> bool {
        if self.minex {
            s <= self.min
        } else {
            s < self.min
        }
    }
    /// Not above the range's top (a prefix of the order).
    fn not_above(&self, s: f64) -> bool {
        if self.maxex {
            s < self.max
        } else {
            s <= self.max
        }
    }
}

/// C's `strtod` on a whole range bound, as `zslParseRange` takes it:
/// leading spaces skipped, an empty string is 0, overflow gives ±inf; NaN
/// is refused.
fn strtod(b: &[u8]) -> Option<f64> {
    let start = b
        .iter()
        .position(|&c| !c.is_ascii_whitespace() && c != 0x0b);
    let b = match start {
        None if b.is_empty() => return Some(0.0),
        None => return None,
        Some(i) => &b[i..],
    };
    if let Some(f) = float_arg(b) {
        return Some(f);
    }
    let f: f64 = std::str::from_utf8(b).ok()?.parse().ok()?;
    (!f.is_nan()).then_some(f)
}

fn score_bound(b: &[u8]) -> Option<(f64, bool)> {
    match b.first() {
        Some(b'(') => strtod(&b[1..]).map(|f| (f, true)),
        _ => strtod(b).map(|f| (f, false)),
    }
}

fn score_range(min: &[u8], max: &[u8]) -> Result<ScoreRange, CmdError> {
    match (score_bound(min), score_bound(max)) {
        (Some((min, minex)), Some((max, maxex))) => Ok(ScoreRange {
            min,
            max,
            minex,
            maxex,
        }),
        _ => Err(CmdError::Msg("min or max is not a float")),
    }
}

/// A lexicographic bound (`-`, `+`, `[x`, `(x`).
#[derive(Clone, Debug)]
enum Lex {
    Min,
    Max,
    Incl(Vec<u8>),
    Excl(Vec<u8>),
}

#[derive(Clone, Debug)]
struct LexRange {
    min: Lex,
    max: Lex,
}

impl LexRange {
    fn below(&self, m: &[u8]) -> bool {
        match &self.min {
            Lex::Min => false,
            Lex::Max => true,
            Lex::Incl(x) => m < x.as_slice(),
            Lex::Excl(x) => m <= x.as_slice(),
        }
    }
    fn not_above(&self, m: &[u8]) -> bool {
        match &self.max {
            Lex::Min => false,
            Lex::Max => true,
            Lex::Incl(x) => m <= x.as_slice(),
            Lex::Excl(x) => m < x.as_slice(),
        }
    }
}

fn lex_bound(b: &[u8]) -> Option<Lex> {
    match b {
        b"+" => Some(Lex::Max),
        b"-" => Some(Lex::Min),
        [b'[', rest @ ..] => Some(Lex::Incl(rest.to_vec())),
        [b'(', rest @ ..] => Some(Lex::Excl(rest.to_vec())),
        _ => None,
    }
}

fn lex_range(min: &[u8], max: &[u8]) -> Result<LexRange, CmdError> {
    match (lex_bound(min), lex_bound(max)) {
        (Some(min), Some(max)) => Ok(LexRange { min, max }),
        _ => Err(CmdError::Msg("min or max not valid string range item")),
    }
}

/// The ranks `lo..hi` of the elements in a score range.
fn score_ranks(ctx: &mut Ctx, head: &ZsetHead, r: &ScoreRange) -> Result<(u64, u64), CmdError> {
    let lo = count_before(ctx, head, |e| r.below(e.score))?;
    let hi = count_before(ctx, head, |e| r.not_above(e.score))?;
    Ok((lo, hi.max(lo)))
}

/// The ranks `lo..hi` of the elements in a lexicographic range (meaningful
/// when every element has the same score, as Redis documents).
fn lex_ranks(ctx: &mut Ctx, head: &ZsetHead, r: &LexRange) -> Result<(u64, u64), CmdError> {
    let lo = count_before(ctx, head, |e| r.below(&e.bytes))?;
    let hi = count_before(ctx, head, |e| r.not_above(&e.bytes))?;
    Ok((lo, hi.max(lo)))
}

/// Redis's rank-range normalisation: negative indexes count from the end;
/// None when the range is empty.
fn rank_window(start: i64, end: i64, len: u64) -> Option<(u64, u64)> {
    let len = len as i64;
    let mut start = if start < 0 { len + start } else { start };
    let mut end = if end < 0 { len + end } else { end };
    if start < 0 {
        start = 0;
    }
    if start > end || start >= len {
        return None;
    }
    if end >= len {
        end = len - 1;
    }
    Some((start as u64, end as u64))
}

/// The elements of ranks `lo..hi` after skipping `offset` and taking at
/// most `limit` (negative: all), from the top when `rev`.
fn window(
    ctx: &mut Ctx,
    head: &ZsetHead,
    (lo, hi): (u64, u64),
    offset: i64,
    limit: i64,
    rev: bool,
) -> Result<Vec<Entry>, CmdError> {
    if offset < 0 || limit == 0 {
        return Ok(Vec::new());
    }
    let avail = hi - lo;
    let offset = offset as u64;
    if offset >= avail {
        return Ok(Vec::new());
    }
    let take = if limit < 0 {
        avail - offset
    } else {
        (limit as u64).min(avail - offset)
    };
    if rev {
        let top = hi - 1 - offset;
        range(ctx, head, top + 1 - take, top, true)
    } else {
        let first = lo + offset;
        range(ctx, head, first, first + take - 1, false)
    }
}

// ---- replies ----

fn double(c: &mut Client, d: f64) {
    c.reply(&Reply::Double(d));
}

/// A list of elements, with their scores when `withscores` (RESP3: one
/// [member, score] pair per element, as Redis 7.0 replies).
fn reply_entries(c: &mut Client, entries: &[Entry], withscores: bool) {
    let v3 = c.resp == Version::Resp3;
    match (withscores, v3) {
        (false, _) => {
            c.array_header(entries.len());
            for e in entries {
                c.bulk(&e.bytes);
            }
        }
        (true, false) => {
            c.array_header(entries.len() * 2);
            for e in entries {
                c.bulk(&e.bytes);
                double(c, e.score);
            }
        }
        (true, true) => {
            c.array_header(entries.len());
            for e in entries {
                c.array_header(2);
                c.bulk(&e.bytes);
                double(c, e.score);
            }
        }
    }
}

// ---- ZADD, ZINCRBY, ZREM ----

/// ZADD key [NX|XX] [GT|LT] [CH] [INCR] score member [score member ...],
/// and ZINCRBY key increment member (ZADD INCR of one pair).
pub fn zadd(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    let zincrby = eq(&a[0], "zincrby");
    let (mut nx, mut xx, mut gt, mut lt, mut ch, mut incr) =
        (false, false, false, false, false, zincrby);
    let mut idx = 2;
    while idx < a.len() {
        let o = &a[idx];
        if eq(o, "nx") {
            nx = true;
        } else if eq(o, "xx") {
            xx = true;
        } else if eq(o, "ch") {
            ch = true;
        } else if eq(o, "incr") {
            incr = true;
        } else if eq(o, "gt") {
            gt = true;
        } else if eq(o, "lt") {
            lt = true;
        } else {
            break;
        }
        idx += 1;
    }
    let rest = &a[idx..];
    if rest.is_empty() || !rest.len().is_multiple_of(2) {
        return Err(CmdError::Syntax);
    }
    if nx && xx {
        return Err(CmdError::Msg(
            "XX and NX options at the same time are not compatible",
        ));
    }
    if ((gt || lt) && nx) || (gt && lt) {
        return Err(CmdError::Msg(
            "GT, LT, and/or NX options at the same time are not compatible",
        ));
    }
    if incr && rest.len() > 2 {
        return Err(CmdError::Msg(
            "INCR option supports a single increment-element pair",
        ));
    }
    let mut pairs = Vec::with_capacity(rest.len() / 2);
    for p in rest.chunks(2) {
        pairs.push((float_arg(&p[0]).ok_or(CmdError::NotFloat)?, &p[1]));
    }
    let sk = skey(c.db, &a[1]);
    // (added, updated, processed, last score)
    let (added, updated, processed, last) = locked(ctx, &[&sk], |ctx| {
        let found = load(ctx, &sk)?;
        if found.is_none() && xx {
            return Ok((0, 0, 0, 0.0));
        }
        let mut z = found.unwrap_or_else(new_zset);
        let (mut added, mut updated, mut processed, mut last) = (0i64, 0i64, 0i64, 0.0);
        for &(score, m) in &pairs {
            match score_of(ctx, &z.head, m)? {
                Some(cur) => {
                    if nx {
                        continue;
                    }
                    let new = if incr { cur + score } else { score };
                    if new.is_nan() {
                        return Err(CmdError::Msg("resulting score is not a number (NaN)"));
                    }
                    if (lt && new >= cur) || (gt && new <= cur) {
                        continue;
                    }
                    if new != cur {
                        rescore(ctx, &mut z.head, cur, new, m)?;
                        updated += 1;
                    }
                    processed += 1;
                    last = new;
                }
                None if !xx => {
                    insert(ctx, &mut z.head, score, m)?;
                    added += 1;
                    processed += 1;
                    last = score;
                }
                None => {}
            }
        }
        if added + updated > 0 {
            save(ctx, &sk, &z);
        }
        Ok((added, updated, processed, last))
    })?;
    if added + updated > 0 {
        event(
            ctx,
            notify::ZSET,
            if incr { "zincr" } else { "zadd" },
            c.db,
            &a[1],
        );
    }
    if incr {
        if processed > 0 {
            double(c, last);
        } else {
            c.null();
        }
    } else {
        c.int(if ch { added + updated } else { added });
    }
    Ok(())
}

pub fn zrem(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    let sk = skey(c.db, &a[1]);
    let (n, emptied) = locked(ctx, &[&sk], |ctx| {
        let Some(mut z) = load(ctx, &sk)? else {
            return Ok((0, false));
        };
        let mut n = 0;
        for m in &a[2..] {
            if let Some(s) = score_of(ctx, &z.head, m)? {
                remove(ctx, &mut z.head, s, m)?;
                n += 1;
            }
        }
        if n > 0 {
            save(ctx, &sk, &z);
        }
        Ok((n, z.head.is_empty()))
    })?;
    c.int(n);
    if n > 0 {
        event(ctx, notify::ZSET, "zrem", c.db, &a[1]);
        if emptied {
            event(ctx, notify::GENERIC, "del", c.db, &a[1]);
        }
    }
    Ok(())
}

// ---- reads of one key ----

/// Runs `f` on the sorted set at `key` under its stripe lock (None when
/// absent).
pub(crate) fn read<T>(
    ctx: &mut Ctx,
    c: &Client,
    key: &[u8],
    f: impl FnOnce(&mut Ctx, Option<&ZsetHead>) -> Result<T, CmdError>,
) -> Result<T, CmdError> {
    let sk = skey(c.db, key);
    locked(ctx, &[&sk], |ctx| {
        let z = load(ctx, &sk)?;
        f(ctx, z.as_ref().map(|z| &z.head))
    })
}

pub fn zcard(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    let n = read(ctx, c, &a[1], |_, h| Ok(h.map_or(0, |h| h.len())))?;
    c.int(n as i64);
    Ok(())
}

pub fn zscore(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    match read(ctx, c, &a[1], |ctx, h| match h {
        Some(h) => score_of(ctx, h, &a[2]),
        None => Ok(None),
    })? {
        Some(s) => double(c, s),
        None => c.null(),
    }
    Ok(())
}

pub fn zmscore(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    let scores = read(ctx, c, &a[1], |ctx, h| {
        a[2..]
            .iter()
            .map(|m| match h {
                Some(h) => score_of(ctx, h, m),
                None => Ok(None),
            })
            .collect::<Result<Vec<_>, _>>()
    })?;
    c.array_header(scores.len());
    for s in scores {
        match s {
            Some(s) => double(c, s),
            None => c.null(),
        }
    }
    Ok(())
}

/// ZRANK and ZREVRANK.
pub fn zrank(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    let rev = eq(&a[0], "zrevrank");
    let r = read(ctx, c, &a[1], |ctx, h| {
        let Some(h) = h else { return Ok(None) };
        let Some(s) = score_of(ctx, h, &a[2])? else {
            return Ok(None);
        };
        Ok(rank_of(ctx, h, s, &a[2])?.map(|r| if rev { h.len() - 1 - r } else { r }))
    })?;
    match r {
        Some(r) => c.int(r as i64),
        None => c.null(),
    }
    Ok(())
}

pub fn zcount(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    let r = score_range(&a[2], &a[3])?;
    let n = read(ctx, c, &a[1], |ctx, h| match h {
        Some(h) => score_ranks(ctx, h, &r).map(|(lo, hi)| hi - lo),
        None => Ok(0),
    })?;
    c.int(n as i64);
    Ok(())
}

pub fn zlexcount(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    let r = lex_range(&a[2], &a[3])?;
    let n = read(ctx, c, &a[1], |ctx, h| match h {
        Some(h) => lex_ranks(ctx, h, &r).map(|(lo, hi)| hi - lo),
        None => Ok(0),
    })?;
    c.int(n as i64);
    Ok(())
}

// ---- ZRANGE and its older forms ----

#[derive(Clone, Copy, PartialEq, Eq)]
enum By {
    Rank,
    Score,
    Lex,
}

/// A parsed range request (`zrangeGenericCommand`).
struct RangeReq {
    by: By,
    rev: bool,
    withscores: bool,
    offset: i64,
    limit: i64,
    min: Vec<u8>,
    max: Vec<u8>,
}

/// Parses `<min> <max> [options]` at `a[at..]`; `by`/`rev` are fixed by the
/// older commands (None: ZRANGE's BYSCORE/BYLEX/REV options choose).
fn parse_range(
    a: &[Vec<u8>],
    at: usize,
    store: bool,
    by: Option<By>,
    rev: Option<bool>,
) -> Result<RangeReq, CmdError> {
    let (mut rby, mut rrev) = (by, rev);
    let mut withscores = false;
    let (mut offset, mut limit) = (0i64, -1i64);
    let mut j = at + 2;
    while j < a.len() {
        let left = a.len() - j - 1;
        if !store && eq(&a[j], "withscores") {
            withscores = true;
        } else if eq(&a[j], "limit") && left >= 2 {
            offset = int_arg(&a[j + 1])?;
            limit = int_arg(&a[j + 2])?;
            j += 2;
        } else if rev.is_none() && eq(&a[j], "rev") {
            rrev = Some(true);
        } else if by.is_none() && rby.is_none() && eq(&a[j], "bylex") {
            rby = Some(By::Lex);
        } else if by.is_none() && rby.is_none() && eq(&a[j], "byscore") {
            rby = Some(By::Score);
        } else {
            return Err(CmdError::Syntax);
        }
        j += 1;
    }
    let by = rby.unwrap_or(By::Rank);
    let rev = rrev.unwrap_or(false);
    if limit != -1 && by == By::Rank {
        return Err(CmdError::Msg(
            "syntax error, LIMIT is only supported in combination with either BYSCORE or BYLEX",
        ));
    }
    if withscores && by == By::Lex {
        return Err(CmdError::Msg(
            "syntax error, WITHSCORES not supported in combination with BYLEX",
        ));
    }
    let (mut min, mut max) = (a[at].clone(), a[at + 1].clone());
    if rev && by != By::Rank {
        std::mem::swap(&mut min, &mut max);
    }
    Ok(RangeReq {
        by,
        rev,
        withscores,
        offset,
        limit,
        min,
        max,
    })
}

/// The range's bounds, parsed (before the key is looked at, as Redis).
enum Bounds {
    Rank(i64, i64),
    Score(ScoreRange),
    Lex(LexRange),
}

fn bounds(q: &RangeReq) -> Result<Bounds, CmdError> {
    Ok(match q.by {
        By::Rank => Bounds::Rank(int_arg(&q.min)?, int_arg(&q.max)?),
        By::Score => Bounds::Score(score_range(&q.min, &q.max)?),
        By::Lex => Bounds::Lex(lex_range(&q.min, &q.max)?),
    })
}

/// The elements a range request selects from `head`.
fn select(
    ctx: &mut Ctx,
    head: &ZsetHead,
    q: &RangeReq,
    b: &Bounds,
) -> Result<Vec<Entry>, CmdError> {
    match b {
        Bounds::Rank(start, end) => {
            let Some((s, e)) = rank_window(*start, *end, head.len()) else {
                return Ok(Vec::new());
            };
            if q.rev {
                let n = head.len() - 1;
                range(ctx, head, n - e, n - s, true)
            } else {
                range(ctx, head, s, e, false)
            }
        }
        Bounds::Score(r) => {
            let ranks = score_ranks(ctx, head, r)?;
            window(ctx, head, ranks, q.offset, q.limit, q.rev)
        }
        Bounds::Lex(r) => {
            let ranks = lex_ranks(ctx, head, r)?;
            window(ctx, head, ranks, q.offset, q.limit, q.rev)
        }
    }
}

fn range_cmd(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>], by: Option<By>, rev: Option<bool>) -> R {
    let q = parse_range(a, 2, false, by, rev)?;
    let b = bounds(&q)?;
    let out = read(ctx, c, &a[1], |ctx, h| match h {
        Some(h) => select(ctx, h, &q, &b),
        None => Ok(Vec::new()),
    })?;
    reply_entries(c, &out, q.withscores);
    Ok(())
}

pub fn zrange(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    range_cmd(ctx, c, a, None, None)
}
pub fn zrevrange(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    range_cmd(ctx, c, a, Some(By::Rank), Some(true))
}
pub fn zrangebyscore(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    range_cmd(ctx, c, a, Some(By::Score), Some(false))
}
pub fn zrevrangebyscore(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    range_cmd(ctx, c, a, Some(By::Score), Some(true))
}
pub fn zrangebylex(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    range_cmd(ctx, c, a, Some(By::Lex), Some(false))
}
pub fn zrevrangebylex(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    range_cmd(ctx, c, a, Some(By::Lex), Some(true))
}

/// ZRANGESTORE dst src min max [BYSCORE|BYLEX] [REV] [LIMIT offset count].
pub fn zrangestore(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    let q = parse_range(a, 3, true, None, None)?;
    let b = bounds(&q)?;
    let (dst, src) = (skey(c.db, &a[1]), skey(c.db, &a[2]));
    let n = locked(ctx, &[&dst, &src], |ctx| {
        let out = match load(ctx, &src)? {
            Some(z) => select(ctx, &z.head, &q, &b)?,
            None => Vec::new(),
        };
        if out.len() > MAX_INLINE_ENTRIES {
            let mut out = out;
            if q.rev {
                out.reverse();
            }
            return store(ctx, &dst, out);
        }
        // Redis starts a result this small as a listpack and adds the
        // elements in the order it emits them, converting before the first
        // member past 64 bytes: the scores added before it lose a `-0`, the
        // ones after keep it. `insert` does just that.
        let existed = ctx.ks.delete(&dst, ctx.now)?;
        let n = out.len() as u64;
        if n > 0 {
            let mut z = new_zset();
            for e in out {
                insert(ctx, &mut z.head, e.score, &e.bytes)?;
            }
            save(ctx, &dst, &z);
        }
        Ok((n, existed))
    })?;
    c.int(n.0 as i64);
    store_events(ctx, c.db, &a[1], "zrangestore", n);
    Ok(())
}

// ---- ZREMRANGEBY* ----

fn remrange(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>], by: By) -> R {
    let b = match by {
        By::Rank => Bounds::Rank(int_arg(&a[2])?, int_arg(&a[3])?),
        By::Score => Bounds::Score(score_range(&a[2], &a[3])?),
        By::Lex => Bounds::Lex(lex_range(&a[2], &a[3])?),
    };
    let sk = skey(c.db, &a[1]);
    let (n, emptied) = locked(ctx, &[&sk], |ctx| {
        let Some(mut z) = load(ctx, &sk)? else {
            return Ok((0, false));
        };
        let (lo, hi) = match &b {
            Bounds::Rank(s, e) => match rank_window(*s, *e, z.head.len()) {
                Some((s, e)) => (s, e + 1),
                None => (0, 0),
            },
            Bounds::Score(r) => score_ranks(ctx, &z.head, r)?,
            Bounds::Lex(r) => lex_ranks(ctx, &z.head, r)?,
        };
        let n = remove_ranks(ctx, &mut z.head, lo, hi)?;
        if n > 0 {
            save(ctx, &sk, &z);
        }
        Ok((n, z.head.is_empty()))
    })?;
    c.int(n as i64);
    if n > 0 {
        let name = match by {
            By::Rank => "zremrangebyrank",
            By::Score => "zremrangebyscore",
            By::Lex => "zremrangebylex",
        };
        event(ctx, notify::ZSET, name, c.db, &a[1]);
        if emptied {
            event(ctx, notify::GENERIC, "del", c.db, &a[1]);
        }
    }
    Ok(())
}

pub fn zremrangebyrank(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    remrange(ctx, c, a, By::Rank)
}
pub fn zremrangebyscore(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    remrange(ctx, c, a, By::Score)
}
pub fn zremrangebylex(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    remrange(ctx, c, a, By::Lex)
}

// ---- pops ----

/// What a pop replies (Redis's `genericZpopCommand` reply shapes).
#[derive(Clone, Copy)]
struct PopShape {
    /// Name the key first (BZPOPMIN/MAX, ZMPOP, BZMPOP).
    pub emit_key: bool,
    /// [member, score] pairs (ZMPOP, and ZPOPMIN with a count in RESP3).
    pub nested: bool,
}

/// Pops up to `count` elements (`None`: one, the plain form) from the
/// lowest (or highest, `max`) end of the first of `keys` (store keys, locks
/// held) that exists; `Ok(None)` when none does. The key's index, the
/// popped elements and whether that emptied the key otherwise.
fn pop_first(
    ctx: &mut Ctx,
    keys: &[Vec<u8>],
    max: bool,
    count: u64,
) -> Result<Option<(usize, Vec<Entry>, bool)>, CmdError> {
    for (i, sk) in keys.iter().enumerate() {
        let Some(mut z) = load(ctx, sk)? else {
            continue;
        };
        let n = count.min(z.head.len());
        let mut out = Vec::with_capacity(n as usize);
        for _ in 0..n {
            let rank = if max { z.head.len() - 1 } else { 0 };
            out.push(remove_rank(ctx, &mut z.head, rank)?);
        }
        if n > 0 {
            save(ctx, sk, &z);
        }
        return Ok(Some((i, out, z.head.is_empty())));
    }
    Ok(None)
}

/// Writes a pop's reply.
fn reply_pop(c: &mut Client, key: Option<&[u8]>, popped: &[Entry], shape: PopShape) {
    if shape.emit_key && shape.nested {
        c.array_header(2);
        c.bulk(key.unwrap_or_default());
        c.array_header(popped.len());
    } else if shape.emit_key {
        c.array_header(popped.len() * 2 + 1);
        c.bulk(key.unwrap_or_default());
    } else if shape.nested {
        c.array_header(popped.len());
    } else {
        c.array_header(popped.len() * 2);
    }
    for e in popped {
        if shape.nested {
            c.array_header(2);
        }
        c.bulk(&e.bytes);
        double(c, e.score);
    }
}

/// Tries a pop over `keys` (user keys, in `c`'s db) and replies when a key
/// has elements (ZPOPMIN, ZPOPMAX, ZMPOP; the blocking forms pop through
/// `serve_zpop`). Returns false, replying nothing, when no key exists.
fn try_pop(
    ctx: &mut Ctx,
    c: &mut Client,
    keys: &[Vec<u8>],
    max: bool,
    count: Option<u64>,
    shape: PopShape,
) -> Result<bool, CmdError> {
    let sks: Vec<Vec<u8>> = keys.iter().map(|k| skey(c.db, k)).collect();
    let refs: Vec<&[u8]> = sks.iter().map(|k| k.as_slice()).collect();
    let popped = locked(ctx, &refs, |ctx| {
        pop_first(ctx, &sks, max, count.unwrap_or(1))
    })?;
    match popped {
        None => Ok(false),
        Some((i, v, emptied)) => {
            reply_pop(c, Some(&keys[i]), &v, shape);
            if !v.is_empty() {
                pop_events(ctx, c.db, &keys[i], max, emptied);
            }
            Ok(true)
        }
    }
}

/// ZPOPMIN / ZPOPMAX key [count].
pub fn zpop(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    let max = eq(&a[0], "zpopmax");
    if a.len() > 3 {
        return Err(CmdError::Syntax);
    }
    let count = match a.get(2) {
        None => None,
        Some(v) => Some(
            proto::int::parse_i64(v)
                .filter(|&n| n >= 0)
                .ok_or(CmdError::MustBePositive)? as u64,
        ),
    };
    let shape = PopShape {
        emit_key: false,
        nested: c.resp == Version::Resp3 && count.is_some(),
    };
    if count == Some(0) {
        // Redis checks the key's type first.
        read(ctx, c, &a[1], |_, _| Ok(()))?;
        c.array_header(0);
        return Ok(());
    }
    if !try_pop(ctx, c, &a[1..2], max, count, shape)? {
        c.array_header(0);
    }
    Ok(())
}

/// The arguments of ZMPOP/BZMPOP after the timeout: `numkeys key... MIN|MAX
/// [COUNT n]` at `a[at..]`: the keys, `max`, the count.
fn parse_mpop(a: &[Vec<u8>], at: usize) -> Result<(Vec<Vec<u8>>, bool, u64), CmdError> {
    let numkeys = proto::int::parse_i64(&a[at])
        .filter(|&n| n >= 1)
        .ok_or(CmdError::NumkeysNotPositive)? as usize;
    let where_idx = numkeys
        .checked_add(at + 1)
        .filter(|&w| w < a.len())
        .ok_or(CmdError::Syntax)?;
    let max = if eq(&a[where_idx], "min") {
        false
    } else if eq(&a[where_idx], "max") {
        true
    } else {
        return Err(CmdError::Syntax);
    };
    let mut count = None;
    let mut j = where_idx + 1;
    while j < a.len() {
        if count.is_none() && eq(&a[j], "count") && j + 1 < a.len() {
            count = Some(
                proto::int::parse_i64(&a[j + 1])
                    .filter(|&n| n >= 1)
                    .ok_or(CmdError::CountNotPositive)? as u64,
            );
            j += 2;
        } else {
            return Err(CmdError::Syntax);
        }
    }
    Ok((a[at + 1..where_idx].to_vec(), max, count.unwrap_or(1)))
}

/// ZMPOP numkeys key [key ...] MIN|MAX [COUNT count].
pub fn zmpop(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    let (keys, max, count) = parse_mpop(a, 1)?;
    let shape = PopShape {
        emit_key: true,
        nested: true,
    };
    if !try_pop(ctx, c, &keys, max, Some(count), shape)? {
        c.reply(&Reply::NullArray);
    }
    Ok(())
}

// ---- blocking pops (`crate::blocking`) ----

/// A blocking pop's serve step at the key of argument `i` (every key's
/// stripe lock held): Empty when the key is absent, Mismatch when it is not
/// a sorted set, else the pop and its reply.
fn serve_zpop(
    ctx: &mut Ctx,
    c: &mut Client,
    a: &[Vec<u8>],
    i: usize,
    max: bool,
    count: u64,
    shape: PopShape,
) -> Result<Try, CmdError> {
    let sk = skey(c.db, &a[i]);
    match ctx.ks.lookup_locked(&sk, ctx.now)? {
        None => return Ok(Try::Empty),
        Some(h) if h.kind != KIND_ZSET => return Ok(Try::Mismatch),
        Some(_) => {}
    }
    match pop_first(ctx, &[sk], max, count)? {
        Some((_, v, emptied)) if !v.is_empty() => {
            reply_pop(c, Some(&a[i]), &v, shape);
            // A serve step runs under `blocking`'s locks: its events are
            // published from here, before the writes are applied.
            pop_events(ctx, c.db, &a[i], max, emptied);
            Ok(Try::Served)
        }
        _ => Ok(Try::Empty),
    }
}

/// BZPOPMIN/BZPOPMAX reply [key, member, score], in RESP2 and RESP3.
const BZPOP_SHAPE: PopShape = PopShape {
    emit_key: true,
    nested: false,
};

fn serve_bzpopmin(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>], i: usize) -> Result<Try, CmdError> {
    serve_zpop(ctx, c, a, i, false, 1, BZPOP_SHAPE)
}

fn serve_bzpopmax(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>], i: usize) -> Result<Try, CmdError> {
    serve_zpop(ctx, c, a, i, true, 1, BZPOP_SHAPE)
}

/// BZPOPMIN / BZPOPMAX key [key ...] timeout.
pub fn bzpop(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    let last = a.len() - 1;
    let timeout_ms = blocking::timeout_arg(&a[last])?;
    let serve = if eq(&a[0], "bzpopmax") {
        serve_bzpopmax
    } else {
        serve_bzpopmin
    };
    let w = Wait {
        keys: (1..last).collect(),
        also_lock: Vec::new(),
        timeout_ms,
        kind: KIND_ZSET,
        serve,
    };
    blocking::wait(ctx, c, a, w)
}

fn serve_bzmpop(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>], i: usize) -> Result<Try, CmdError> {
    let (_, max, count) = parse_mpop(a, 2)?;
    let shape = PopShape {
        emit_key: true,
        nested: true,
    };
    serve_zpop(ctx, c, a, i, max, count, shape)
}

/// BZMPOP timeout numkeys key [key ...] MIN|MAX [COUNT count]: the other
/// arguments are checked before the timeout, as Redis does.
pub fn bzmpop(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    let (keys, _, _) = parse_mpop(a, 2)?;
    let timeout_ms = blocking::timeout_arg(&a[1])?;
    let w = Wait {
        keys: (3..3 + keys.len()).collect(),
        also_lock: Vec::new(),
        timeout_ms,
        kind: KIND_ZSET,
        serve: serve_bzmpop,
    };
    blocking::wait(ctx, c, a, w)
}

// ---- ZRANDMEMBER ----

/// Most repeated random picks one request may ask for (see `maps`).
const MAX_PICKS: u64 = 1 << 32;

/// ZRANDMEMBER key [count [WITHSCORES]].
pub fn zrandmember(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    if a.len() == 2 {
        match read(ctx, c, &a[1], |ctx, h| match h {
            Some(h) => {
                let r = maps::below(h.len());
                Ok(range(ctx, h, r, r, false)?.pop())
            }
            None => Ok(None),
        })? {
            Some(e) => c.bulk(&e.bytes),
            None => c.null(),
        }
        return Ok(());
    }
    let (l, withscores) = maps::rand_count_args(a, "withscores")?;
    let count = l.unsigned_abs();
    if l < 0 && count > MAX_PICKS {
        return Err(CmdError::ValueOutOfRange);
    }
    let picked = read(ctx, c, &a[1], |ctx, h| {
        let Some(h) = h else { return Ok(Vec::new()) };
        let size = h.len();
        if count == 0 {
            return Ok(Vec::new());
        }
        if l < 0 {
            let mut out = Vec::with_capacity(count.min(1 << 20) as usize);
            for _ in 0..count {
                let r = maps::below(size);
                out.extend(range(ctx, h, r, r, false)?);
            }
            return Ok(out);
        }
        if count >= size {
            // Redis walks a sorted set from its highest element.
            let mut v = all(ctx, h)?;
            v.reverse();
            return Ok(v);
        }
        // Distinct ranks: random picks for a small share, else every rank
        // less random ones.
        let mut ranks: Vec<u64> = if count.saturating_mul(3) <= size {
            let mut seen = std::collections::HashSet::new();
            while (seen.len() as u64) < count {
                seen.insert(maps::below(size));
            }
            seen.into_iter().collect()
        } else {
            let mut v: Vec<u64> = (0..size).collect();
            while v.len() as u64 > count {
                let i = maps::below(v.len() as u64) as usize;
                v.swap_remove(i);
            }
            v
        };
        ranks.sort_unstable();
        let mut out = Vec::with_capacity(ranks.len());
        for r in ranks {
            out.extend(range(ctx, h, r, r, false)?);
        }
        Ok(out)
    })?;
    reply_entries(c, &picked, withscores);
    Ok(())
}

// ---- ZUNION, ZINTER, ZDIFF and their STORE forms, ZINTERCARD ----

/// An input of the set operations: a sorted set, or a set (every member
/// scoring 1, as Redis takes sets).
enum Src {
    Zset(ZsetHead),
    Set(MapHead),
}

impl Src {
    fn len(&self) -> u64 {
        match self {
            Src::Zset(h) => h.len(),
            Src::Set(h) => h.len(),
        }
    }

    fn entries(&self, ctx: &mut Ctx) -> Result<Vec<Entry>, CmdError> {
        match self {
            Src::Zset(h) => all(ctx, h),
            Src::Set(h) => Ok(maps::all(ctx, h)?
                .into_iter()
                .map(|(m, _)| Entry::new(1.0, m))
                .collect()),
        }
    }

    fn score(&self, ctx: &mut Ctx, m: &[u8]) -> Result<Option<f64>, CmdError> {
        match self {
            Src::Zset(h) => score_of(ctx, h, m),
            Src::Set(h) => Ok(maps::get(ctx, h, m)?.map(|_| 1.0)),
        }
    }
}

/// The input at `sk` (lock held): None when absent, WRONGTYPE unless a set
/// or a sorted set.
fn load_src(ctx: &mut Ctx, sk: &[u8]) -> Result<Option<Src>, CmdError> {
    let Some(h) = ctx.ks.lookup_locked(sk, ctx.now)? else {
        return Ok(None);
    };
    let v = &ctx.ks.raw[h.off..];
    match h.kind {
        KIND_ZSET => Ok(Some(Src::Zset(ZsetHead::decode(v)?))),
        KIND_SET => Ok(Some(Src::Set(MapHead::decode(v)?))),
        _ => Err(CmdError::WrongType),
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum SetOp {
    Union,
    Inter,
    Diff,
}

#[derive(Clone, Copy)]
enum Aggregate {
    Sum,
    Min,
    Max,
}

fn aggregate(agg: Aggregate, target: &mut f64, v: f64) {
    match agg {
        Aggregate::Sum => {
            *target += v;
            // inf + -inf: Redis's convention is 0.
            if target.is_nan() {
                *target = 0.0;
            }
        }
        Aggregate::Min => {
            if v < *target {
                *target = v
            }
        }
        Aggregate::Max => {
            if v > *target {
                *target = v
            }
        }
    }
}

/// A parsed ZUNION/ZINTER/ZDIFF/*STORE/ZINTERCARD request.
struct SetOpReq {
    keys: Vec<Vec<u8>>,
    /// Where the options begin.
    opts: usize,
    weights: Vec<f64>,
    agg: Aggregate,
    withscores: bool,
    limit: u64,
}

/// Parses `numkeys key...` at `a[at..]`, as `zunionInterDiffGenericCommand`
/// does before it looks at the keys; the options are parsed after the keys
/// are type-checked ([`parse_setop_options`]).
fn parse_setop(a: &[Vec<u8>], at: usize) -> Result<SetOpReq, CmdError> {
    let setnum = int_arg(&a[at])?;
    if setnum < 1 {
        return Err(CmdError::AtLeastOneKey(
            String::from_utf8_lossy(&a[0]).to_lowercase(),
        ));
    }
    if setnum > (a.len() - at - 1) as i64 {
        return Err(CmdError::Syntax);
    }
    let n = setnum as usize;
    Ok(SetOpReq {
        keys: a[at + 1..at + 1 + n].to_vec(),
        opts: at + 1 + n,
        weights: vec![1.0; n],
        agg: Aggregate::Sum,
        withscores: false,
        limit: 0,
    })
}

/// Parses `[WEIGHTS w...] [AGGREGATE SUM|MIN|MAX] [WITHSCORES]` (or
/// ZINTERCARD's `[LIMIT n]`).
fn parse_setop_options(
    a: &[Vec<u8>],
    q: &mut SetOpReq,
    op: SetOp,
    store: bool,
    card: bool,
) -> Result<(), CmdError> {
    let n = q.keys.len();
    let mut j = q.opts;
    while j < a.len() {
        let remaining = a.len() - j;
        if op != SetOp::Diff && !card && remaining > n && eq(&a[j], "weights") {
            for i in 0..n {
                q.weights[i] =
                    float_arg(&a[j + 1 + i]).ok_or(CmdError::Msg("weight value is not a float"))?;
            }
            j += 1 + n;
        } else if op != SetOp::Diff && !card && remaining >= 2 && eq(&a[j], "aggregate") {
            let v = &a[j + 1];
            q.agg = if eq(v, "sum") {
                Aggregate::Sum
            } else if eq(v, "min") {
                Aggregate::Min
            } else if eq(v, "max") {
                Aggregate::Max
            } else {
                return Err(CmdError::Syntax);
            };
            j += 2;
        } else if !store && !card && eq(&a[j], "withscores") {
            q.withscores = true;
            j += 1;
        } else if card && remaining >= 2 && eq(&a[j], "limit") {
            q.limit = proto::int::parse_i64(&a[j + 1])
                .filter(|&l| l >= 0)
                .ok_or(CmdError::LimitNegative)? as u64;
            j += 2;
        } else {
            return Err(CmdError::Syntax);
        }
    }
    Ok(())
}

/// Runs a set operation (locks held): type-checks every input at `sks`,
/// then parses the options (Redis's order of errors), then computes the
/// result in (score, member) order. ZINTERCARD's limit stops an
/// intersection early.
fn compute(
    ctx: &mut Ctx,
    a: &[Vec<u8>],
    sks: &[Vec<u8>],
    q: &mut SetOpReq,
    op: SetOp,
    (store, card): (bool, bool),
) -> Result<Vec<Entry>, CmdError> {
    let mut loaded = Vec::with_capacity(sks.len());
    for sk in sks {
        loaded.push(load_src(ctx, sk)?);
    }
    parse_setop_options(a, q, op, store, card)?;
    let mut srcs: Vec<(Option<Src>, f64)> =
        loaded.into_iter().zip(q.weights.iter().copied()).collect();
    let mut out: Vec<Entry> = match op {
        SetOp::Inter => {
            // Smallest input first (a missing one is empty: so is the result).
            srcs.sort_by_key(|(s, _)| s.as_ref().map_or(0, |s| s.len()));
            let Some((Some(first), w0)) = srcs.first() else {
                return Ok(Vec::new());
            };
            let mut out = Vec::new();
            'm: for e in first.entries(ctx)? {
                let mut score = w0 * e.score;
                if score.is_nan() {
                    score = 0.0;
                }
                for (s, w) in &srcs[1..] {
                    let Some(s) = s else { continue 'm };
                    let Some(v) = s.score(ctx, &e.bytes)? else {
                        continue 'm;
                    };
                    aggregate(q.agg, &mut score, v * w);
                }
                out.push(Entry::new(score, e.bytes));
                if q.limit > 0 && out.len() as u64 >= q.limit {
                    break;
                }
            }
            out
        }
        SetOp::Union => {
            srcs.sort_by_key(|(s, _)| s.as_ref().map_or(0, |s| s.len()));
            let mut acc: std::collections::HashMap<Vec<u8>, f64> = Default::default();
            let mut order = Vec::new();
            for (s, w) in &srcs {
                let Some(s) = s else { continue };
                for e in s.entries(ctx)? {
                    let mut score = w * e.score;
                    if score.is_nan() {
                        score = 0.0;
                    }
                    match acc.get_mut(&e.bytes) {
                        Some(t) => aggregate(q.agg, t, score),
                        None => {
                            acc.insert(e.bytes.clone(), score);
                            order.push(e.bytes);
                        }
                    }
                }
            }
            order
                .into_iter()
                .map(|m| {
                    let s = acc[&m];
                    Entry::new(s, m)
                })
                .collect()
        }
        SetOp::Diff => {
            let Some((Some(first), _)) = srcs.first() else {
                return Ok(Vec::new());
            };
            let mut out = Vec::new();
            'd: for e in first.entries(ctx)? {
                for (s, _) in srcs[1..].iter() {
                    if let Some(s) = s {
                        if s.score(ctx, &e.bytes)?.is_some() {
                            continue 'd;
                        }
                    }
                }
                out.push(e);
            }
            out
        }
    };
    out.sort_by(|x, y| x.cmp_key(y.score, &y.bytes));
    Ok(out)
}

fn setop_cmd(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>], op: SetOp) -> R {
    let mut q = parse_setop(a, 1)?;
    let sks: Vec<Vec<u8>> = q.keys.iter().map(|k| skey(c.db, k)).collect();
    let refs: Vec<&[u8]> = sks.iter().map(|k| k.as_slice()).collect();
    let out = locked(ctx, &refs, |ctx| {
        compute(ctx, a, &sks, &mut q, op, (false, false))
    })?;
    reply_entries(c, &out, q.withscores);
    Ok(())
}

fn setop_store(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>], op: SetOp) -> R {
    let mut q = parse_setop(a, 2)?;
    let dst = skey(c.db, &a[1]);
    let sks: Vec<Vec<u8>> = q.keys.iter().map(|k| skey(c.db, k)).collect();
    let mut refs: Vec<&[u8]> = sks.iter().map(|k| k.as_slice()).collect();
    refs.push(&dst);
    let n = locked(ctx, &refs, |ctx| {
        let out = compute(ctx, a, &sks, &mut q, op, (true, false))?;
        store(ctx, &dst, out)
    })?;
    c.int(n.0 as i64);
    let name = match op {
        SetOp::Union => "zunionstore",
        SetOp::Inter => "zinterstore",
        SetOp::Diff => "zdiffstore",
    };
    store_events(ctx, c.db, &a[1], name, n);
    Ok(())
}

pub fn zunion(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    setop_cmd(ctx, c, a, SetOp::Union)
}
pub fn zinter(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    setop_cmd(ctx, c, a, SetOp::Inter)
}
pub fn zdiff(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    setop_cmd(ctx, c, a, SetOp::Diff)
}
pub fn zunionstore(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    setop_store(ctx, c, a, SetOp::Union)
}
pub fn zinterstore(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    setop_store(ctx, c, a, SetOp::Inter)
}
pub fn zdiffstore(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    setop_store(ctx, c, a, SetOp::Diff)
}

/// ZINTERCARD numkeys key [key ...] [LIMIT limit].
pub fn zintercard(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    let mut q = parse_setop(a, 1)?;
    let sks: Vec<Vec<u8>> = q.keys.iter().map(|k| skey(c.db, k)).collect();
    let refs: Vec<&[u8]> = sks.iter().map(|k| k.as_slice()).collect();
    let out = locked(ctx, &refs, |ctx| {
        compute(ctx, a, &sks, &mut q, SetOp::Inter, (false, true))
    })?;
    c.int(out.len() as i64);
    Ok(())
}

// ---- ZSCAN ----

/// ZSCAN key cursor [MATCH pattern] [COUNT count]: an inline set whole
/// (cursor 0), a large one through its member table (`maps::scan_table`);
/// scores as Redis's `d2string` writes them.
pub fn zscan(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    let cursor = proto::int::parse_cursor(&a[2]).ok_or(CmdError::InvalidCursor)?;
    let sk = skey(c.db, &a[1]);
    let (next, found, inline) = locked(ctx, &[&sk], |ctx| {
        let Some(z) = load(ctx, &sk)? else {
            return Ok((0, Vec::new(), true));
        };
        let (pat, count) = maps::scan_options(&a[3..])?;
        let glob = pat
            .filter(|p| *p != b"*")
            .map(|p| crate::glob::Glob::new(p, false));
        let keep = |m: &[u8]| glob.as_ref().is_none_or(|g| g.matches(m));
        let mut out = Vec::new();
        let next = match &z.head {
            ZsetHead::Inline(v) => {
                out.extend(v.iter().filter(|e| keep(&e.bytes)).cloned());
                0
            }
            ZsetHead::Tree { id, map, .. } => {
                let mut map = *map;
                let mut raw = Vec::new();
                let next = maps::scan_table(ctx, *id, &mut map, cursor, count, |m, s| {
                    if keep(m) {
                        raw.push((m.to_vec(), s.to_vec()));
                    }
                })?;
                for (m, s) in raw {
                    out.push(Entry::new(decode_score(&s)?, m));
                }
                next
            }
        };
        Ok((next, out, matches!(z.head, ZsetHead::Inline(_))))
    })?;
    c.array_header(2);
    c.bulk(next.to_string().as_bytes());
    c.array_header(found.len() * 2);
    for e in found {
        c.bulk(&e.bytes);
        // A listpack's score text is `d2string`'s; a skiplist's is `%.17Lg`.
        let s = if inline {
            proto::d2string(e.score)
        } else {
            proto::format_double(e.score)
        };
        c.bulk(s.as_bytes());
    }
    Ok(())
}

/// OBJECT ENCODING of a sorted set's head.
pub(crate) fn encoding(head: &[u8]) -> &'static str {
    match ZsetHead::decode(head) {
        Ok(ZsetHead::Inline(_)) => "listpack",
        Ok(ZsetHead::Tree { .. }) => "skiplist",
        Err(_) => "unknown",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rank_windows_follow_redis() {
        assert_eq!(rank_window(0, -1, 5), Some((0, 4)));
        assert_eq!(rank_window(-100, 100, 5), Some((0, 4)));
        assert_eq!(rank_window(3, 1, 5), None);
        assert_eq!(rank_window(5, 9, 5), None);
        assert_eq!(rank_window(-2, -1, 5), Some((3, 4)));
        assert_eq!(rank_window(0, -6, 5), None);
        assert_eq!(rank_window(i64::MIN, i64::MAX, 5), Some((0, 4)));
    }

    #[test]
    fn range_bounds_parse_as_strtod() {
        assert_eq!(score_bound(b"(1.5"), Some((1.5, true)));
        assert_eq!(score_bound(b"-inf"), Some((f64::NEG_INFINITY, false)));
        assert_eq!(score_bound(b""), Some((0.0, false)));
        assert_eq!(score_bound(b"("), Some((0.0, true)));
        assert_eq!(score_bound(b" 3"), Some((3.0, false)));
        assert_eq!(score_bound(b"1e400"), Some((f64::INFINITY, false)));
        assert_eq!(score_bound(b"nan"), None);
        assert_eq!(score_bound(b"1x"), None);
        assert_eq!(score_bound(b"3 "), None);
        assert!(lex_bound(b"+x").is_none());
        assert!(lex_bound(b"x").is_none());
        assert!(matches!(lex_bound(b"["), Some(Lex::Incl(v)) if v.is_empty()));
    }
}
